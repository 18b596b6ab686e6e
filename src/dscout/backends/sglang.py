"""The GPU path: SGLang for response regeneration and for the serving benchmark (cluster only).

Written against SGLang 0.5.23 (``envs/serve.yaml``; DFLASH exists since 0.5.11):

* **Regeneration** — the offline ``sglang.Engine`` (data-parallel over the job's GPUs, ``dp_size``) fed with the
  exact chat-template token ids (Qwen3 ``enable_thinking=False``); rows in the same format as the CPU path
  (:mod:`dscout.data.responses`), written chunk by chunk so a killed job resumes.
* **Serving benchmark** — one ``sglang.launch_server`` per method on loopback (AR: no speculative flags; DFlash /
  DScout: ``--speculative-algorithm DFLASH --speculative-draft-model-path <drafter>
  --speculative-num-draft-tokens <bs>``; EAGLE-3(60): ``EAGLE3`` with 7 steps, top-k 10, 60 draft tokens), a
  ``/flush_cache`` and ``c`` warm-up requests, then a closed-loop client with ``c`` workers over the real
  prompts. Per request SGLang reports ``completion_tokens``, ``e2e_latency``, ``spec_verify_ct`` and
  ``spec_accept_length`` (= completion tokens / verify rounds, bonus included; docs/method.md §6.3); the
  records use the project's schema so Tables 3 and 4 are computed by the same code on both paths.

Nothing here runs on the CPU default; ``tests/test_serving.py`` parses every server command line with the pinned
SGLang's own argument parser (its wheel installed without dependencies, plus what ``server_args`` imports) and
checks the record conversion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm


# ------------------------------------------------------------------------------------------- regeneration
def generate_responses_sglang(stage: dict, prompts: list[dict], out_path: str | os.PathLike, num_gpus: int = 1,
                              chunk: int = 4096) -> Path:
    """Regenerate training responses with the SGLang offline engine (resumable, data-parallel)."""
    import sglang as sgl  # GPU machines only
    from transformers import AutoTokenizer

    from ..data.prompts import chat_prompt_ids
    from ..jsonl import scan_ids

    model = stage["target_source"] if "target_source" in stage else stage["target_load_from"]
    r = stage["responses"]
    tok = AutoTokenizer.from_pretrained(model)
    out_path = Path(out_path)
    done = scan_ids(out_path)  # ids only; a torn last line (a killed run) is cut off before appending
    todo = [p for p in prompts if p["id"] not in done]
    engine = sgl.Engine(model_path=model, dp_size=max(num_gpus, 1), tp_size=1, dtype="bfloat16",
                        mem_fraction_static=0.85)
    params = {"temperature": r["temperature"], "max_new_tokens": r["max_new_tokens"]}
    if r["temperature"] == 0:
        params["top_k"] = 1
    try:
        with open(out_path, "a") as f:
            for i in tqdm(range(0, len(todo), chunk), desc="responses (sglang)", unit="chunk"):
                part = todo[i:i + chunk]
                ids = [chat_prompt_ids(tok, [{"role": "user", "content": p["prompt"]}],
                                       stage["chat"]["system_prompt"], stage["chat"]["enable_thinking"])
                       for p in part]
                outs = engine.generate(input_ids=ids, sampling_params=params)
                for p, pid, o in zip(part, ids, outs):
                    fin = (o.get("meta_info", {}).get("finish_reason") or {}).get("type", "length")
                    f.write(json.dumps({"id": p["id"], "source": p.get("source"), "prompt": p["prompt"],
                                        "prompt_ids": pid, "response_ids": o["output_ids"],
                                        "response": o.get("text", ""),
                                        "finish_reason": "stop" if fin == "stop" else "length"}) + "\n")
                f.flush()
    finally:
        engine.shutdown()
    return out_path


# ------------------------------------------------------------------------------------------- serving
def server_command(target: str, method: dict, port: int, concurrency: int, drafter_dir: str | None = None,
                   attention_backend: str = "flashinfer", mem_fraction: float = 0.75) -> list[str]:
    """The ``sglang.launch_server`` command of one method (docs/method.md §6.3).

    Args:
        method: ``{"kind": ar|dflash|dscout|eagle3, "block_size": bs, ...}``; EAGLE-3 also reads
            ``num_steps`` (7), ``topk`` (10) and ``block_size`` as the number of verify tokens (60).
    """
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", target, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "bfloat16", "--tp-size", "1", "--mem-fraction-static", str(mem_fraction),
           "--attention-backend", attention_backend, "--max-running-requests", str(max(concurrency, 32)),
           # decode batches up to this size replay CUDA graphs (SGLang >= 0.5.2x splits the old --cuda-graph-max-bs
           # into -decode / -prefill); >= 32 so no concurrency level of Table 4 falls back to eager decoding
           "--cuda-graph-max-bs-decode", str(max(concurrency, 32)), "--trust-remote-code"]
    kind = method["kind"]
    if kind != "ar":
        from ..kinds import method_kind

        flags = method_kind(kind).server_flags
        if flags is None:
            raise KeyError(f"method kind '{kind}' has no SGLang server (use the transformers runtime)")
        cmd += flags(method, drafter_dir)
    return cmd


def _post(url: str, payload: dict, timeout: float = 3600.0) -> dict:
    import requests

    r = requests.post(url, json=payload, timeout=timeout)
    r.raise_for_status()
    return r.json()


def wait_for_server(base_url: str, proc: subprocess.Popen, timeout: float = 1800.0) -> None:
    """Poll ``/health`` until the server answers. Raises RuntimeError if it exits or times out."""
    import requests

    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"sglang server exited with code {proc.returncode} before becoming healthy")
        try:
            if requests.get(base_url + "/health", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(5)
    raise RuntimeError(f"sglang server at {base_url} not healthy after {timeout:.0f} s")


def record_from_response(resp: dict, *, benchmark: str, prompt_id: str, turn: int, method: dict, temperature: float,
                         repeat: int, concurrency: int, wall_seconds: float) -> dict:
    """One SGLang ``/generate`` answer -> a record of the project's schema.

    ``accept_lengths`` is rebuilt from SGLang's per-request histogram of correct drafts per verify round when
    present (``spec_correct_drafts_histogram`` in 0.5.23, ``spec_accept_histogram`` in 0.5.11: entry i = rounds
    with i correct drafts, so accept length i + 1); otherwise each of the ``spec_verify_ct`` rounds gets the
    request's mean ``spec_accept_length`` (rounded) and ``accept_lengths_exact`` is False.
    """
    meta = resp.get("meta_info", {})
    n = int(meta.get("completion_tokens", len(resp.get("output_ids", []))))
    verify = meta.get("spec_verify_ct")
    hist = meta.get("spec_correct_drafts_histogram") or meta.get("spec_accept_histogram")
    exact = hist is not None
    if method["kind"] == "ar":
        lengths, exact = [1] * max(n - 1, 0), True
    elif hist is not None:
        lengths = [i + 1 for i, c in enumerate(hist) for _ in range(int(c))]
    elif verify:
        lengths = [int(round(float(meta.get("spec_accept_length", 1.0))))] * int(verify)
    else:
        lengths = []
    from ..records import make_record

    return make_record(
        benchmark=benchmark, prompt_id=prompt_id, turn=turn, method=method["kind"],
        method_name=method.get("name", method["kind"]), method_key=method.get("key", method["kind"]),
        drafter=method.get("drafter_id"), block_size=method.get("block_size"), temperature=temperature,
        repeat=repeat, concurrency=concurrency, new_tokens=n,
        decode_seconds=float(meta.get("e2e_latency", wall_seconds)), accept_lengths=lengths,
        output_ids=resp.get("output_ids", []), output_text=resp.get("text", ""), runtime="sglang",
        wall_seconds=wall_seconds, accept_lengths_exact=exact, spec_accept_length=meta.get("spec_accept_length"),
        spec_verify_ct=verify)


def closed_loop(base_url: str, requests_: list[dict], concurrency: int, sampling: dict) -> list[tuple[dict, dict, float]]:
    """Send every request with ``concurrency`` workers (a new one starts when one finishes)."""

    def one(req):
        t0 = time.perf_counter()
        resp = _post(base_url + "/generate", {"input_ids": req["input_ids"], "sampling_params": sampling})
        return req, resp, time.perf_counter() - t0

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, requests_))


def serve_benchmark(target: str, method: dict, requests_: list[dict], *, concurrency: int, temperature: float,
                    max_new_tokens: int, repeat: int, drafter_dir: str | None, port: int = 30000,
                    log_path: str | os.PathLike | None = None) -> tuple[list[dict], dict]:
    """Launch the method's server, warm up, flush, run the closed loop; return records and the run summary.

    ``requests_`` items: ``{"benchmark", "prompt_id", "turn", "input_ids"}`` (chat-templated ids).
    The summary holds the output-token throughput (``completion tokens / wall time``), which Table 4 divides
    by the AR server's at the same concurrency.
    """
    base = f"http://127.0.0.1:{port}"
    log = open(log_path, "w") if log_path else subprocess.DEVNULL
    env = {**os.environ, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
    proc = subprocess.Popen(server_command(target, method, port, concurrency, drafter_dir), stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    sampling = {"temperature": temperature, "max_new_tokens": max_new_tokens}
    if temperature == 0:
        sampling["top_k"] = 1
    try:
        wait_for_server(base, proc)
        closed_loop(base, requests_[:concurrency], concurrency, sampling)  # warm-up, not counted
        _post(base + "/flush_cache", {})
        t0 = time.perf_counter()
        results = closed_loop(base, requests_, concurrency, sampling)
        wall = time.perf_counter() - t0
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    records = [record_from_response(resp, benchmark=req["benchmark"], prompt_id=req["prompt_id"],
                                    turn=req.get("turn", 0), method=method, temperature=temperature,
                                    repeat=repeat, concurrency=concurrency, wall_seconds=secs)
               for req, resp, secs in results]
    tokens = sum(r["new_tokens"] for r in records)
    return records, {"wall_seconds": wall, "completion_tokens": tokens, "throughput_tok_s": tokens / wall,
                     "concurrency": concurrency, "method": method.get("key", method["kind"])}
