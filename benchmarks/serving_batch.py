"""The batch Table 4 serves at concurrency c, loaded as ``serve-cpu`` loads it (shared by the serving benchmarks)."""

from __future__ import annotations


CHAT = {"system_prompt": None, "enable_thinking": False}


def load_serving_target(target_path: str, threads: int):
    """The target as ``serve-cpu`` runs it (float32, packed linears, ``threads`` torch threads) and the chat's stop
    token ids: ``(target, stop_ids)``."""
    import torch

    from dscout.models.linear import pack_linears
    from dscout.models.target import load_prepared_target, stop_token_ids

    torch.set_num_threads(threads)
    target = load_prepared_target(target_path)
    pack_linears(target.model, extra_weights=(target.lm_head.weight,))
    return target, stop_token_ids(target, ["<|im_end|>"])


def serving_prompts(tokenizer, data_root_path: str, benchmarks: str, concurrency: int, spare: int = 0):
    """Table 4's first ``concurrency`` requests and the next ``spare`` (warm-up, never measured): the benchmarks'
    first turns, round robin over ``benchmarks`` (comma list), chat-templated without thinking.

    Returns:
        ``(pool, prompts, spare_prompts)``: the measured benchmark items and the prompt ids (``list[list[int]]``)
        of both; ``spare_prompts`` is shorter than ``spare`` when the benchmarks hold too few prompts.
    """
    from dscout.data.paths import data_root
    from dscout.data.prompts import first_turn_ids
    from dscout.evaluation.serving import serving_pool

    pool, extra = serving_pool(benchmarks.split(","), data_root(data_root_path), concurrency, spare, seed=0)
    return pool, first_turn_ids(tokenizer, pool, CHAT), first_turn_ids(tokenizer, extra, CHAT) if extra else []


def load_serving_batch(target_path: str, data_root_path: str, benchmarks: str, concurrency: int, threads: int):
    """The target (:func:`load_serving_target`) and Table 4's first ``concurrency`` requests (:func:`serving_prompts`).

    Returns:
        ``(target, pool, prompts, stop_ids)``: the benchmark items, their prompt ids (``list[list[int]]``) and the
        chat's stop token ids.
    """
    target, stops = load_serving_target(target_path, threads)
    pool, prompts, _ = serving_prompts(target.tokenizer, data_root_path, benchmarks, concurrency)
    return target, pool, prompts, stops


def emit_report(lines: list[str], out: str | None) -> None:
    """Print a benchmark's markdown report (``lines``) and write it to ``out`` when given."""
    from pathlib import Path

    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
