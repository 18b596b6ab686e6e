"""Benchmark runner: prompts -> raw per-(prompt, turn, run) records, every method through the one engine.

AR and every speculative method are run side by side, prompt by prompt, in one process (the order of methods,
AR included, rotates from prompt to prompt), so slow drift of a shared CPU hits all methods alike; speedups are then
computed from these records only (:mod:`dscout.analysis.aggregate`).

Record schema (one JSON object per line): ``benchmark``, ``prompt_id``,
``turn``, ``method``, ``method_name``, ``drafter``, ``block_size`` (null for AR), ``temperature``, ``repeat``,
``concurrency``, ``new_tokens``, ``decode_seconds``, ``prefill_seconds``, ``prefill_reused``, ``draft_seconds``, ``verify_seconds``,
``accept_lengths``, ``output_ids``, ``output_text``, ``stop_reason``, ``matches_ar``, ``near_tie``,
``first_mismatch``, ``correct``, ``seed``, ``runtime``.
"""

from __future__ import annotations

import contextlib

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..data.benchmarks import BenchmarkPrompt
from ..data.prompts import chat_prompt_ids
from ..decoding.engine import SpeculativeEngine
from ..records import controller_fields, make_record
from .scoring import score


@dataclass
class Method:
    """One row of the benchmark: a labelled proposer at a block size.

    Attributes:
        key: file-safe unique key (``ar``, ``dscout-<drafter id>-bs16`` ...).
        kind: record ``method`` field: ``ar``, ``dflash``, ``dscout``, ``eagle3``, ``pard2``.
        name: display label, e.g. ``DScout(32)``.
        engine: the :class:`SpeculativeEngine` (with or without proposer).
        block_size: verify tokens per round (None for AR; ``"online"``: the engine's controller picks it).
        drafter: drafter id (None for AR).
    """

    key: str
    kind: str
    name: str
    engine: SpeculativeEngine
    block_size: int | str | None = None
    drafter: str | None = None

    @property
    def max_block_size(self) -> int:
        """The bs passed to the engine: the row's bs, 1 for AR, the drafter's horizon for ``online`` rows."""
        if self.block_size == "online":
            return self.engine.proposer.max_block_size
        return self.block_size or 1


def _seed(*parts) -> int:
    return int(hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:8], 16)


@torch.no_grad()
def near_tie_threshold(top1: float, dtype: torch.dtype, epsilon: float) -> float:
    """The top-2 logit gap below which a greedy mismatch counts as a floating-point near-tie.

    ``epsilon`` (config ``near_tie_epsilon``) sized for float32 is below the resolution of a bfloat16 target's
    logits: bf16 keeps 8 significant bits, so a logit near 10 is only known to 1/16, and a block verify and a
    one-token AR step (different reduction orders) may round two close logits either way. The threshold is
    therefore at least two units in the last place of the top logit in the target's dtype
    (``torch.finfo(dtype).eps * 2**floor(log2|top1|)``), and ``epsilon`` where that is larger (float32).

    Args:
        top1: the largest logit (any unit the logits have).
        dtype: the dtype the target computed its logits in.
        epsilon: the configured floor.
    Returns:
        the threshold (same unit as the logits).
    """
    if not dtype.is_floating_point or top1 == 0 or not math.isfinite(top1):
        return epsilon
    ulp = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(abs(top1)))
    return max(epsilon, 2.0 * ulp)


def near_tie(target, context_ids: list[int], a: list[int], b: list[int], epsilon: float
             ) -> tuple[bool, int | None, float | None]:
    """Is the first difference between outputs ``a`` and ``b`` a floating-point near-tie of the target?

    At the first differing position the target's top-2 logits (given the common prefix) must differ by less
    than ``epsilon``, or by at most the resolution of the target's dtype (:func:`near_tie_threshold`). Returns ``(is_near_tie, first_mismatch_index, top1 - top2 logit gap)`` — the gap is stored
    in the record so a reader can re-judge with another epsilon; ``(False, None, None)`` when a == b.
    """
    n = min(len(a), len(b))
    i = next((k for k in range(n) if a[k] != b[k]), None)
    if i is None:
        if len(a) == len(b):
            return False, None, None
        i = n  # one stopped earlier: the stop token itself is the difference
    ids = torch.tensor([context_ids + a[:i]], device=target.device)
    logits = target(ids).logits[0, -1].float()
    top2 = torch.topk(logits, 2).values
    gap = float(top2[0] - top2[1])
    return gap < near_tie_threshold(float(top2[0]), target.dtype, epsilon), i, gap


def run_benchmark(target, methods: list[Method], prompts: list[BenchmarkPrompt], *, benchmark: str,
                  max_new_tokens: int, temperature: float, repeat: int, chat: dict, near_tie_epsilon: float,
                  score_outputs: bool = True, execute_code: bool = False, warmup: bool = True,
                  runtime: str = "transformers", prefill_store: dict | None = None) -> dict[str, list[dict]]:
    """Run every method on every prompt (and turn), in an order that rotates through all of them (AR included)
    from prompt to prompt and from repeat to repeat; greedy outputs are judged against AR's once the turn has run. Returns records per
    method key.

    Args:
        target: the :class:`~dscout.models.target.TargetModel`.
        methods: AR must be among them (key ``ar``): matches and near-ties are judged against it.
        prompts: benchmark items (MT-Bench items have two turns; turn 2 sees the model's own turn-1 answer).
        max_new_tokens: per turn.
        temperature: 0 = greedy.
        repeat: repeat index (sampling seeds depend on it).
        chat: ``{"system_prompt", "enable_thinking"}``.
        near_tie_epsilon: see :func:`near_tie`.
        prefill_store: shared across the methods (a :class:`~dscout.evaluation.prefill_store.PrefillStore` on host
            memory with a byte cap, or a dict): each identical first-turn prompt prefill (per tapped layer set) is
            computed once (:meth:`SpeculativeEngine.generate`); later turns never use it. Records say
            ``prefill_reused``. Decode timings and outputs are unaffected.
    Raises:
        ValueError: if no AR method is given.
    """
    if not any(m.kind == "ar" for m in methods):
        raise ValueError("run_benchmark needs the AR baseline among the methods")
    tok = target.tokenizer
    records: dict[str, list[dict]] = {m.key: [] for m in methods}
    if warmup:  # one short untimed generation per method: first-call allocations out of the timings
        ids = chat_prompt_ids(tok, [{"role": "user", "content": "Hello"}], chat.get("system_prompt"),
                              chat.get("enable_thinking"))
        for m in methods:
            ctl = getattr(m.engine, "controller", None)  # the online controller learns nothing from it
            with ctl.frozen() if ctl is not None else contextlib.nullcontext():
                m.engine.generate(ids, 8, block_size=m.max_block_size, temperature=temperature)
    ar = next(m for m in methods if m.kind == "ar")
    others = [m for m in methods if m.kind != "ar"]
    bar = tqdm(prompts, desc=f"{benchmark} r{repeat} T={temperature}", unit="prompt", mininterval=5.0)
    for pi, item in enumerate(bar):
        # AR rotates too (a method always run first meets the machine fresher), and by repeat as well as by prompt
        # (a benchmark of one prompt would otherwise keep one order)
        everyone, shift = [ar] + others, (pi + repeat) % (1 + len(others))
        order = everyone[shift:] + everyone[:shift]
        history = {m.key: [] for m in methods}  # each method continues its own conversation
        for turn, user_text in enumerate(item.turns):
            ar_out, turn_records = None, []
            for m in order:
                msgs = history[m.key] + [{"role": "user", "content": user_text}]
                ids = chat_prompt_ids(tok, msgs, chat.get("system_prompt"), chat.get("enable_thinking"))
                seed = _seed(benchmark, item.prompt_id, turn, repeat)
                # first turns only: a later turn's context holds the method's own answer, shared with nobody
                r = m.engine.generate(ids, max_new_tokens, block_size=m.max_block_size, temperature=temperature,
                                      seed=seed, prefill_store=prefill_store if turn == 0 else None)
                online = controller_fields(r.block_sizes, r.controller_seconds, r.draft_seconds, r.verify_seconds,
                                           m.max_block_size)
                text = tok.decode(r.output_ids, skip_special_tokens=True)
                rec = make_record(
                    benchmark=benchmark, prompt_id=item.prompt_id, turn=turn, method=m.kind, method_name=m.name,
                    method_key=m.key, drafter=m.drafter, block_size=m.block_size, temperature=temperature,
                    repeat=repeat, concurrency=1, new_tokens=r.new_tokens, decode_seconds=r.decode_seconds,
                    accept_lengths=r.accept_lengths, output_ids=r.output_ids, output_text=text,
                    stop_reason=r.stop_reason, runtime=runtime, prompt_tokens=len(ids),
                    prefill_seconds=r.prefill_seconds, prefill_reused=r.prefill_reused,
                    draft_seconds=sum(r.draft_seconds), verify_seconds=sum(r.verify_seconds), seed=seed,
                    first_mismatch=None, top2_logit_gap=None, **online)
                if m.kind == "ar":
                    ar_out = r.output_ids
                if score_outputs and turn == len(item.turns) - 1:
                    rec["correct"] = score(benchmark, text, item.reference, execute_code)
                records[m.key].append(rec)
                turn_records.append((m, ids, rec))
                history[m.key] = msgs + [{"role": "assistant", "content": text}]
            if temperature == 0:  # every method of the turn against AR's output, once all have run
                for m, ids, rec in turn_records:
                    if m.kind == "ar":
                        continue
                    rec["matches_ar"] = rec["output_ids"] == ar_out
                    if not rec["matches_ar"]:
                        rec["near_tie"], rec["first_mismatch"], rec["top2_logit_gap"] = near_tie(
                            target, ids, ar_out, rec["output_ids"], near_tie_epsilon)
    return records


def clear_repeat_dirs(out_dir: str | os.PathLike, repeats: int | None = None) -> list[Path]:
    """Remove the per-repeat record folders ``r<k>/`` with ``k >= repeats`` that a previous run left in ``out_dir``.

    Snakemake deletes only the files a job declares: after a rerun with fewer repeats, an earlier run's ``r7/``
    would stay beside the new records, and anything reading the folder (a benchmark script's report, a user's
    glob) would mix two runs. The folders of the configured repeats (``k < repeats``) are other jobs' outputs (one
    job per repeat): never touched here, so a finished repeat survives any rerun (issue 47).

    Args:
        out_dir: ``results/bench/<id>/<benchmark>/t<T>``.
        repeats: the configured repeat count; None = every ``r<k>/`` (the folder is about to be rewritten whole).
    Returns:
        the folders removed.
    """
    import re
    import shutil

    removed = [d for d in Path(out_dir).glob("r*") if d.is_dir() and re.fullmatch(r"r\d+", d.name)
               and (repeats is None or int(d.name[1:]) >= repeats)]
    for d in removed:  # jobs of other repeats may clear the same folder at the same time
        shutil.rmtree(d, ignore_errors=True)
    return removed


def repeat_complete(repeat_dir: str | os.PathLike, method_keys: list[str]) -> bool:
    """Whether ``repeat_dir`` holds a finished repeat: a non-empty, parseable JSONL file per method key (records
    are written atomically, one file per method, once the whole repeat has run)."""
    import json

    for key in method_keys:
        path = Path(repeat_dir) / f"{key}.jsonl"
        try:
            lines = path.read_text().splitlines()
            if not lines or any(json.loads(line).get("repeat") is None for line in lines):
                return False
        except (OSError, ValueError):
            return False
    return True


def run_bench_job(stage: dict, *, target_dir: str, benchmark: str, temperature: float, repeats: int,
                  repeat: int | None, out_dir: str | os.PathLike, root, drafter_dirs: dict[str, str],
                  prefill_store_gb: float = 2.0) -> None:
    """One ``benchmark`` job: AR and every method of ``stage`` side by side on one benchmark at one temperature,
    for one repeat (``repeat``) or every repeat not yet complete (``repeat`` None), each repeat's records in
    ``<out_dir>/r<k>/<method key>.jsonl`` with ``config.resolved.json`` (and each online controller's latency
    model, ``latency-<key>.json``) beside them.

    Folders ``r<k>`` with ``k >= repeats`` are removed first (:func:`clear_repeat_dirs`); a repeat's own folder is
    rewritten whole; with ``repeat`` None, complete repeats (:func:`repeat_complete`) are kept, never redone.

    Args:
        stage: a bench stage (:func:`dscout.config.bench_stage`, ``sampled_bench_stage``, ``study_stage``), cut
            here to ``benchmark`` (:func:`dscout.config.benchmark_slice`).
        target_dir: the prepared target (``target.json``).
        temperature: sampling temperature (0: greedy).
        repeats: the configured repeat count (folders ``r0 .. r<repeats - 1>``).
        root: the data root (:func:`dscout.data.paths.data_root`).
        drafter_dirs: drafter name -> its trained folder.
        prefill_store_gb: host-memory cap (GiB) of the first-turn prefills shared across methods and repeats.
    """
    import shutil
    import sys

    from ..config import benchmark_slice, write_resolved
    from ..data.benchmarks import stage_prompts
    from ..models.target import load_prepared_target, stop_token_ids
    from ..records import write_records
    from .methods import build_methods, typical_context_tokens
    from .prefill_store import PrefillStore

    st = benchmark_slice(stage, benchmark)  # the job's own benchmark (a no-op on a sliced stage)
    b = st["benchmarks"]
    todo = [repeat] if repeat is not None else list(range(repeats))
    out = Path(out_dir)
    clear_repeat_dirs(out, repeats)  # folders beyond the configured repeats only
    target = load_prepared_target(target_dir)
    max_new = b["max_new_tokens"]
    prompts = stage_prompts(b, benchmark, root)
    stops = stop_token_ids(target, st["chat"].get("stop_tokens") or [])
    first_turns = [chat_prompt_ids(target.tokenizer, [{"role": "user", "content": p.turns[0]}],
                                   st["chat"].get("system_prompt"), st["chat"].get("enable_thinking"))
                   for p in prompts]
    methods = build_methods(target, st["methods"], drafter_dirs, stops,
                            cpu_packed_linear=b.get("cpu_packed_linear", False),
                            context_tokens=typical_context_tokens([len(x) for x in first_turns], max_new))
    if repeat is None:  # one process for all repeats: resume, never redo or delete a finished repeat
        done = [k for k in todo if repeat_complete(out / f"r{k}", [m.key for m in methods])]
        if done:
            print(f"dscout bench {benchmark}: repeats {done} are complete in {out}: kept", file=sys.stderr)
        todo = [k for k in todo if k not in done]
    # identical first-turn prefills are computed once across the methods (and the repeats of this process), kept
    # on host memory within the byte cap
    prefills = PrefillStore(int(prefill_store_gb * 2**30))
    for i, k in enumerate(todo):
        rdir = out / f"r{k}"
        if rdir.is_dir():  # this job's own folder: a half-written earlier attempt, or records of other methods
            shutil.rmtree(rdir)
        rdir.mkdir(parents=True)
        for m in methods:  # the online controller's latency model, calibrated at start-up, is saved with the run
            if m.engine.controller is not None:
                m.engine.controller.latency.to_json(rdir / f"latency-{m.key}.json")
        records = run_benchmark(target, methods, prompts, benchmark=benchmark, max_new_tokens=max_new,
                                temperature=temperature, repeat=k, chat=st["chat"],
                                near_tie_epsilon=st["near_tie_epsilon"], score_outputs=b.get("score", True),
                                execute_code=b.get("confirm_run_unsafe_code", False),
                                warmup=i == 0, prefill_store=prefills)
        write_resolved(rdir / "config.resolved.json", st)
        for m in methods:  # written once the whole repeat has run (each file atomically)
            write_records(records[m.key], rdir / f"{m.key}.jsonl")
    if repeat is None:  # the per-repeat jobs of one folder each keep theirs in r<k>/ (no shared file to race on)
        write_resolved(out / "config.resolved.json", st)
