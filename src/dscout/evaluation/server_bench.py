"""Table 3's server rows: methods decoded by vLLM or SGLang (``methods[].backend``), each beside that runtime's own AR.

One job per (runtime, temperature, repeat) serves every benchmark of the bench stage: for each method of the
runtime (its AR first in repeat 0; the order rotates from repeat to repeat, as our engine's jobs rotate theirs), one
server starts on a free loopback port and is identified before use (:class:`dscout.backends.vllm.VllmServer`,
:class:`dscout.backends.sglang.SglangServer`), answers one untimed warm-up request, then decodes the stage's
prompts **one request at a time** (concurrency 1, as Table 3): each benchmark's prompts in order, every turn of an
MT-Bench item after the method's own previous answer (the conversation is rebuilt with the chat template, exactly as
:func:`dscout.evaluation.runner.run_benchmark` builds it), with the same token budget, stop ids and per-prompt
sampling seed as our engine's jobs.

Records carry ``runtime`` (``vllm`` / ``sglang``) and the row's key (``<runtime>-dscout-bs4-<drafter id>``; AR:
``<runtime>-ar``): :func:`dscout.analysis.aggregate.summarize` pairs each row with AR of the same runtime,
benchmark, temperature and repeat. Timing: vLLM's per-request ``generation_time_ms`` (prefill excluded, as our
engine's ``decode_seconds``); SGLang's ``e2e_latency`` (prefill included: its speedups are conservative by the
prefill's share). Greedy outputs are judged against the runtime's AR (``matches_ar``); the near-tie judgement needs
the target's logits, which a server does not return, so ``near_tie`` stays None and every difference counts.

The job does not score task accuracy (``correct`` stays None): a lossless row's accuracy is AR's, which our engine's
jobs score (lm-eval's metrics live in the training env, not in a server's env).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from tqdm import tqdm

from ..data.benchmarks import BenchmarkPrompt
from ..data.prompts import chat_prompt_ids
from .runner import _seed


def server_methods(stage: dict, runtime: str) -> list[dict]:
    """The methods of one runtime's job: its AR (key ``<runtime>-ar``), then the stage's rows of that runtime (each
    with its ``key``: :func:`dscout.config.method_key`), as the method dicts the servers take (EAGLE-3's ``depth``
    as the server's ``num_steps``)."""
    from ..config import method_backend, method_key

    rows = [{"kind": "ar", "key": f"{runtime}-ar", "name": "AR"}]
    for m in stage["methods"]:
        if method_backend(m) != runtime:
            continue
        row = {**m, "key": method_key(m, m.get("drafter_id"))}
        if m["kind"] == "eagle3":
            row.setdefault("num_steps", m.get("depth"))
        rows.append(row)
    return rows


def sglang_drafter_path(method: dict, drafters: dict[str, str]) -> str | None:
    """What SGLang loads as a row's drafter: a published drafter's hub id (``checkpoint``), else the trained folder
    (``drafters[name]``, DFlash's checkpoint layout); None for AR."""
    if method.get("checkpoint"):
        return method["checkpoint"]
    return drafters[method["drafter"]] if method.get("drafter") else None


def rotated(methods: list, repeat: int) -> list:
    """The methods in this repeat's order: rotated by ``repeat`` (AR first in repeat 0)."""
    shift = repeat % len(methods)
    return methods[shift:] + methods[:shift]


def server_bench_records(open_server: Callable[[dict], AbstractContextManager], methods: list[dict],
                         prompts: dict[str, list[BenchmarkPrompt]], budgets: dict[str, int], *, tokenizer,
                         chat: dict, temperature: float, repeat: int, stop_token_ids: list[int],
                         on_method_done: Callable[[str, list[dict]], None] | None = None) -> dict[str, list[dict]]:
    """Decode every benchmark's prompts with every method's server, one request at a time (module doc).

    Args:
        open_server: ``method -> context manager`` yielding a started, identified server with ``ask(input_ids,
            max_new_tokens, temperature, stop_token_ids, seed) -> answer``, ``to_record(answer, **fields)`` and
            ``failed(phase, err) -> ServerError``.
        methods: :func:`server_methods`, or those of them still to run (greedy outputs are judged against the
            runtime's AR by the caller, once every method has run: :func:`judge_against_ar`).
        prompts: benchmark -> its prompts (:func:`dscout.data.benchmarks.stage_prompts`).
        budgets: benchmark -> new tokens per turn.
        tokenizer: the target's (chat template).
        chat: ``{"system_prompt", "enable_thinking"}``.
        on_method_done: called with each method's key and records as soon as its server is done (a later server's
            failure then loses no finished method).
    Returns:
        records per method key.
    Raises:
        ServerError: a server that does not start, is not the method's, or fails a request (job, port and log named).
    """
    system, thinking = chat.get("system_prompt"), chat.get("enable_thinking")
    warm = chat_prompt_ids(tokenizer, [{"role": "user", "content": "Hello"}], system, thinking)
    records: dict[str, list[dict]] = {}
    for m in rotated(methods, repeat):
        recs = []
        with open_server(m) as srv:
            try:  # one untimed request: the server's first-call allocations out of the timings
                srv.ask(warm, 8, temperature, stop_token_ids, None)
            except Exception as err:
                raise srv.failed("warm-up", err) from err
            for bench, items in prompts.items():
                for item in tqdm(items, desc=f"{m['key']} {bench} r{repeat} T={temperature}", unit="prompt",
                                 mininterval=5.0):
                    history = []
                    for turn, user_text in enumerate(item.turns):
                        msgs = history + [{"role": "user", "content": user_text}]
                        ids = chat_prompt_ids(tokenizer, msgs, system, thinking)
                        seed = _seed(bench, item.prompt_id, turn, repeat)
                        t0 = time.perf_counter()
                        try:
                            answer = srv.ask(ids, budgets[bench], temperature, stop_token_ids, seed)
                        except Exception as err:
                            raise srv.failed(f"request {bench}/{item.prompt_id} turn {turn}", err) from err
                        rec = srv.to_record(answer, benchmark=bench, prompt_id=item.prompt_id, turn=turn, method=m,
                                            temperature=temperature, repeat=repeat, concurrency=1,
                                            wall_seconds=time.perf_counter() - t0)
                        rec.update(prompt_tokens=len(ids), seed=seed, server_port=srv.port)
                        recs.append(rec)
                        history = msgs + [{"role": "assistant", "content": rec["output_text"]}]
        records[m["key"]] = recs
        if on_method_done is not None:
            on_method_done(m["key"], recs)
    return records


def judge_against_ar(records: dict[str, list[dict]], ar_key: str) -> None:
    """Set ``matches_ar`` (and ``first_mismatch``) of every greedy record against AR's record of the same
    (benchmark, prompt, turn) on the same runtime; ``near_tie`` None (a server returns no logits to judge it)."""
    ar = {(r["benchmark"], r["prompt_id"], r["turn"]): r["output_ids"] for r in records[ar_key]}
    for key, recs in records.items():
        if key == ar_key:
            continue
        for r in recs:
            ref = ar.get((r["benchmark"], r["prompt_id"], r["turn"]))
            if ref is None:
                continue
            r["matches_ar"] = r["output_ids"] == ref
            if not r["matches_ar"]:
                out = r["output_ids"]
                r["first_mismatch"] = next((i for i in range(min(len(out), len(ref))) if out[i] != ref[i]),
                                           min(len(out), len(ref)))


def vllm_interpreter(vllm_python: str | None, vllm_env: str) -> str:
    """The interpreter a vLLM server runs with: the one given (the cluster's ``envs/vllm.yaml``), else this process's
    when it has vLLM, else the project's CPU venv (``DSCOUT_VLLM_ENV`` wins over ``vllm_env``; built from its lock
    when missing: :func:`dscout.backends.vllm_env.ensure_vllm_env`)."""
    import importlib.util
    import os
    import sys

    if vllm_python:
        return vllm_python
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    from ..backends.vllm_env import ensure_vllm_env

    return str(ensure_vllm_env(os.environ.get("DSCOUT_VLLM_ENV") or vllm_env))


def run_server_bench_job(stage: dict, *, target_dir: str, drafters: dict[str, str], temperature: float,
                         repeat: int, out: str, root, vllm_python: str | None = None,
                         vllm_env: str = ".venv-vllm", launch=None) -> dict[str, list[dict]]:
    """One ``benchmark_vllm`` / ``benchmark_sglang`` job (module doc): every method of ``stage["runtime"]`` on every
    benchmark of ``stage["names"]``, written to ``out`` (one JSONL, every method's records).

    Resumable per method: each method's records go to ``<out>.partial/<key>.jsonl`` when its server is done, and a
    rerun of the same job (same stage, temperature and repeat: ``<out>.partial/job.json``) serves only the methods
    without such a file; ``out`` is written once all are done.

    Args:
        stage: :func:`dscout.config.server_slice` of the bench stage.
        target_dir: the prepared target (``target.json``): servers load its ``load_from``.
        drafters: drafter name (``methods[].drafter``) -> its trained folder. vLLM gets each exported in its layout
            beside ``out`` (:func:`dscout.backends.vllm.export_drafter`: DFlash / DScout, EAGLE-3); SGLang the
            folder, or a published drafter's hub id (``checkpoint``).
        launch: ``(command, log file, env) -> Popen`` for the servers (tests start a stub); default Popen.
    Raises:
        ServerError: a server that does not start, is not the method's, or fails a request (job, port and log named);
            the methods finished before it stay in ``<out>.partial/``.
    """
    import shutil
    from pathlib import Path
    from types import SimpleNamespace

    from ..config import benchmark_slice, write_resolved
    from ..data.benchmarks import stage_prompts
    from ..jsonl import read_jsonl, write_jsonl
    from ..models.target import load_prepared_target, server_model_path, stop_token_ids

    import json

    runtime = stage["runtime"]
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    this_job = json.dumps({"stage": stage, "temperature": temperature, "repeat": repeat}, sort_keys=True)
    if partial.is_dir() and (not (partial / "job.json").is_file() or (partial / "job.json").read_text() != this_job):
        shutil.rmtree(partial)  # records of another stage (a changed config): never mixed into this job's
    partial.mkdir(parents=True, exist_ok=True)
    (partial / "job.json").write_text(this_job)
    logs = out.with_name(out.stem + ".logs")
    model = server_model_path(target_dir)
    model = str(Path(model).resolve()) if Path(model).exists() else model
    prompts, budgets = {}, {}
    for bench in stage["names"]:
        b = benchmark_slice(stage, bench)["benchmarks"]
        prompts[bench], budgets[bench] = stage_prompts(b, bench, root), b["max_new_tokens"]
    methods = server_methods(stage, runtime)
    done = {m["key"]: read_jsonl(partial / f"{m['key']}.jsonl") for m in methods
            if (partial / f"{m['key']}.jsonl").is_file()}
    todo = [m for m in methods if m["key"] not in done]
    job = f"Table 3 on {runtime}, T={temperature:g}, repeat {repeat}"
    if runtime == "vllm":
        from ..backends.vllm import VllmServer, export_drafter

        # on the CPU (the servers own the GPU), for the drafters' export only; then only its tokenizer is kept
        loaded = load_prepared_target(target_dir, device="cpu")
        tokenizer = loaded.tokenizer
        target = SimpleNamespace(tokenizer=tokenizer)
        exports = {}
        for m in todo:
            name = m.get("drafter")
            if name and name not in exports:  # vLLM's layout of the drafter (DFlash, a reduced vocabulary too; EAGLE-3)
                exports[name] = (out.parent / f"{out.stem}.vllm-{name}").resolve()
                export_drafter(m["kind"], drafters[name], loaded, exports[name])
        del loaded
        gc.collect()
        python = vllm_interpreter(vllm_python, vllm_env) if todo else None
        srv = stage["server"]

        def open_server(m):
            return VllmServer(python, model, m, str(exports[m["drafter"]]) if m.get("drafter") else None,
                              kv_cache_gb=srv["kv_cache_gb"], dtype=srv["dtype"], max_model_len=srv["max_model_len"],
                              enforce_eager=srv["enforce_eager"], log_path=logs / f"{m['key']}.server.log",
                              job=f"{job}, method {m['key']}", launch=launch)
    else:  # SGLang owns the GPU: the client needs the tokenizer only
        from transformers import AutoTokenizer

        from ..backends.sglang import SglangServer

        tokenizer = AutoTokenizer.from_pretrained(model)
        target = SimpleNamespace(tokenizer=tokenizer)

        def open_server(m):
            logs.mkdir(parents=True, exist_ok=True)
            return SglangServer(model, m, sglang_drafter_path(m, drafters), log_path=logs / f"{m['key']}.server.log",
                                job=f"{job}, method {m['key']}", launch=launch)

    stops = stop_token_ids(target, stage["chat"].get("stop_tokens") or [])
    records = dict(done)
    if todo:
        fresh = server_bench_records(open_server, todo, prompts, budgets,
                                     tokenizer=tokenizer, chat=stage["chat"], temperature=temperature, repeat=repeat,
                                     stop_token_ids=stops,
                                     on_method_done=lambda key, recs: write_jsonl(recs, partial / f"{key}.jsonl"))
        records.update(fresh)
    if temperature == 0:
        judge_against_ar(records, f"{runtime}-ar")
    write_jsonl([r for m in methods for r in records[m["key"]]], out)
    write_resolved(out.with_suffix(".resolved.json"), stage)
    shutil.rmtree(partial, ignore_errors=True)
    return records
