"""Table 4's vLLM rows: AR and DFlash served by vLLM beside our batched engine, on the same prompts, concurrency
levels and repeats (config ``serving.vllm``).

One job per repeat: each method's server (AR, then DFlash at every ``serving.vllm.block_sizes``; the order rotates
from repeat to repeat) starts once on a free loopback port (:class:`dscout.backends.vllm.VllmServer`), answers one
warm-up request from beyond the measured pool, then serves every concurrency level c in turn: the pool's first c
prompts sent together (the batched engine's batch at c), greedy, the serving stage's token budget. A level's time is
its **decode window**, from vLLM's per-request timings (queue + time to first token + generation time, all requests
sent at once): the last request's last token minus the first request's first token, so prefill stays outside it as
in the batched engine's ``batch_decode_seconds``; the closed loop's wall time is kept as ``batch_wall_seconds``.
Records carry ``runtime: "vllm"`` and method keys ``vllm-ar`` / ``vllm-dflash-bs<k>``: Table 4 pairs them with vLLM's
own AR of the same repeat (:mod:`dscout.analysis.table4`).
"""

from __future__ import annotations

import gc
import os
from pathlib import Path


def vllm_methods(stage: dict) -> list[tuple[str, dict]]:
    """``(key, method)`` of the vLLM rows: AR, DFlash(bs) for every ``stage["vllm"]["block_sizes"]``."""
    rows = [("vllm-ar", {"kind": "ar"})]
    rows += [(f"vllm-dflash-bs{bs}", {"kind": "dflash", "block_size": bs, "drafter_id": stage["dflash"]})
             for bs in stage["vllm"]["block_sizes"]]
    return [(k, {**m, "key": k, "name": k}) for k, m in rows]


def decode_window_seconds(answers: list[dict]) -> float | None:
    """The decode window of requests sent together: ``max(queue + ttft + generation) - min(queue + ttft)`` over the
    answers' ``metrics`` (ms), in seconds; None when a request lacks the timings (a server without
    ``--enable-per-request-metrics``)."""
    starts, ends = [], []
    for a in answers:
        m = a.get("metrics") or {}
        q, ttft, gen = m.get("queue_time_ms"), m.get("time_to_first_token_ms"), m.get("generation_time_ms")
        if ttft is None or gen is None:
            return None
        first = (q or 0.0) + ttft
        starts.append(first)
        ends.append(first + gen)
    return (max(ends) - min(starts)) / 1000.0 if starts else None


def vllm_serving_records(python: str, target_dir: str, drafter_dir: str | None, stage: dict,
                         prompts: list[list[int]], ids: list[str], warmup: list[int], levels: list[int], repeat: int,
                         stops: list[int], log_dir: str | os.PathLike) -> list[dict]:
    """Records of every vLLM row at every level of ``levels`` for one repeat (module doc).

    Args:
        python: vLLM's interpreter (:func:`dscout.backends.vllm_env.ensure_vllm_env` on the CPU).
        target_dir: the target folder vLLM loads.
        drafter_dir: the DFlash drafter in vLLM's layout (:func:`dscout.models.export.export_vllm_dflash`).
        prompts: the measured pool's chat-templated ids (level c sends the first c); ``ids`` their ``benchmark/id``.
        warmup: one prompt outside the pool, sent once per server before anything is measured.
        log_dir: where each server's log goes (``<key>.server.log``; named in every error).
    Raises:
        ServerError: a server that does not start, is not the method's, or fails a request (the method's job and
            its log named).
    """
    from ..backends.vllm import VllmServer, record_from_completion

    v = stage["vllm"]
    methods = vllm_methods(stage)
    shift = repeat % len(methods)
    records = []
    for key, method in methods[shift:] + methods[:shift]:
        job = f"vLLM serving {key}, repeat {repeat}"
        with VllmServer(python, target_dir, method, None if method["kind"] == "ar" else drafter_dir,
                        concurrency=max(levels), kv_cache_gb=v["kv_cache_gb"],
                        dtype=v.get("dtype", "float32"), max_model_len=v["max_model_len"],
                        enforce_eager=v.get("enforce_eager", True),
                        log_path=Path(log_dir) / f"{key}.server.log", job=job) as srv:
            srv.run([{"input_ids": warmup}], 1, stage["max_new_tokens"], 0.0, stops, phase="warm-up")
            for c in levels:
                reqs = [{"input_ids": p, "prompt_id": i} for p, i in zip(prompts[:c], ids[:c])]
                results, wall = srv.run(reqs, c, stage["max_new_tokens"], 0.0, stops,
                                        phase=f"closed loop at c={c}")
                window = decode_window_seconds([resp for _, resp, _ in results])
                for req, resp, secs in results:
                    rec = record_from_completion(resp, benchmark=req["prompt_id"].split("/")[0],
                                                 prompt_id=req["prompt_id"], turn=0, method=method,
                                                 temperature=0.0, repeat=repeat, concurrency=c, wall_seconds=secs)
                    rec.update(batch_decode_seconds=window if window is not None else wall,
                               batch_wall_seconds=wall, decode_window_exact=window is not None,
                               server_port=srv.port)
                    records.append(rec)
    return records


def run_vllm_serving_job(stage: dict, *, target_dir: str, drafter_dir: str, repeat: int, out: str, root,
                         vllm_python: str | None = None, vllm_env: str = ".venv-vllm") -> list[dict]:
    """One ``serving_vllm`` job: Table 4's vLLM rows for one repeat at every concurrency level of ``stage``, the
    DFlash drafter exported in vLLM's layout next to ``out`` (``r<repeat>.vllm-dflash``), vLLM's env built or
    reused (:func:`dscout.evaluation.server_bench.vllm_interpreter`), then every server at every level
    (:func:`vllm_serving_records`); ``out`` (JSONL) and ``<out>.resolved.json`` written.

    Args:
        stage: :func:`dscout.config.vllm_serving_stage`.
        target_dir: the prepared target (``target.json``).
        drafter_dir: the trained DFlash drafter's folder.
        root: the data root.
        vllm_python: an interpreter that has vLLM; None = the CPU venv ``vllm_env``.
    Returns:
        the records written.
    Raises:
        SystemExit: the benchmarks hold no prompt beyond the measured pool (the warm-up request).
    """
    from ..config import write_resolved
    from ..data.prompts import first_turn_ids
    from ..backends.vllm import export_drafter
    from ..models.target import load_prepared_target, server_model_path, stop_token_ids
    from ..records import write_records
    from .server_bench import vllm_interpreter
    from .serving import serving_pool

    st = stage
    target = load_prepared_target(target_dir, device="cpu")  # for the export only: the server owns the GPU
    # round robin over benchmarks, as serve-cpu; one warm-up request from beyond the measured pool
    pool, spare = serving_pool(st["benchmarks"], root, st["pool_size"], 1, st["seed"])
    if not spare:
        raise SystemExit(f"dscout serve-vllm (repeat {repeat}): the benchmarks {st['benchmarks']} hold "
                         f"{len(pool)} prompts, {st['pool_size']} measured + 1 warm-up needed")
    prompts = first_turn_ids(target.tokenizer, pool, st["chat"])
    warmup = first_turn_ids(target.tokenizer, spare[:1], st["chat"])[0]
    ids = [f"{it.benchmark}/{it.prompt_id}" for it in pool]
    stops = stop_token_ids(target, st["chat"].get("stop_tokens") or [])
    out = Path(out)
    export = out.parent / f"r{repeat}.vllm-dflash"  # vLLM's layout of the DFlash drafter (reduced vocabulary too)
    export_drafter("dflash", drafter_dir, target, export)
    del target  # the weights leave host memory before the servers load their own copy
    gc.collect()
    python = vllm_interpreter(vllm_python, vllm_env)
    model = server_model_path(target_dir)  # what a server loads: the materialised folder, or the hub id
    model = str(Path(model).resolve()) if Path(model).exists() else model
    records = vllm_serving_records(python, model, str(export.resolve()), st, prompts, ids, warmup,
                                   st["concurrency"], repeat, stops, out.parent / f"r{repeat}.logs")
    write_records(records, out)
    write_resolved(out.with_suffix(".resolved.json"), st)
    return records
