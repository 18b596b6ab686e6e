"""The batch Table 4 serves at concurrency c, loaded as ``serve-cpu`` loads it (shared by the serving benchmarks)."""

from __future__ import annotations


def load_serving_batch(target_path: str, data_root_path: str, benchmarks: str, concurrency: int, threads: int):
    """The target (float32, packed linears, ``threads`` torch threads) and Table 4's first ``concurrency`` requests:
    the benchmarks' first turns, round robin over ``benchmarks`` (comma list), chat-templated without thinking.

    Returns:
        ``(target, pool, prompts, stop_ids)``: the benchmark items, their prompt ids (``list[list[int]]``) and the
        chat's stop token ids.
    """
    import torch

    from dscout.data.paths import data_root
    from dscout.data.prompts import first_turn_ids
    from dscout.evaluation.serving import serving_pool
    from dscout.models.linear import pack_linears
    from dscout.models.target import load_prepared_target, stop_token_ids

    torch.set_num_threads(threads)
    target = load_prepared_target(target_path)
    pack_linears(target.model, extra_weights=(target.lm_head.weight,))
    pool, _ = serving_pool(benchmarks.split(","), data_root(data_root_path), concurrency, 0, seed=0)
    prompts = first_turn_ids(target.tokenizer, pool, {"system_prompt": None, "enable_thinking": False})
    return target, pool, prompts, stop_token_ids(target, ["<|im_end|>"])


def emit_report(lines: list[str], out: str | None) -> None:
    """Print a benchmark's markdown report (``lines``) and write it to ``out`` when given."""
    from pathlib import Path

    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).write_text(text)
