"""The GPU path: SGLang for response regeneration and for the serving benchmark (cluster only).

Written against SGLang 0.5.23 (``envs/serve.yaml``; DFLASH exists since 0.5.11):

* **Regeneration** — the offline ``sglang.Engine`` (data-parallel over the job's GPUs, ``dp_size``) fed with the
  exact chat-template token ids (Qwen3 ``enable_thinking=False``); rows in the same format as the CPU path
  (:mod:`dscout.data.responses`), written chunk by chunk so a killed job resumes.
* **Serving benchmark** — one ``sglang.launch_server`` per method on loopback, each on a free port (AR: no
  speculative flags; DFlash / DScout: ``--speculative-algorithm DFLASH --speculative-draft-model-path <drafter>
  --speculative-num-draft-tokens <bs>``; EAGLE-3(60): ``EAGLE3`` with 7 steps, top-k 10, 60 draft tokens). Before
  anything is sent the server's own ``/get_server_info`` (SGLang's ``ServerArgs``) must name the method's model,
  port, algorithm, block size and drafter, so a job never measures another job's server on a shared node. Then
  ``c`` warm-up requests (prompts outside the measured pool), a ``/flush_cache``, and a closed-loop client with
  ``c`` workers over the measured pool. Per request SGLang reports ``completion_tokens``, ``e2e_latency``, ``spec_verify_ct`` and
  ``spec_accept_length`` (= completion tokens / verify rounds, bonus included; docs/method.md §6.3); the
  records use the project's schema so Tables 3 and 4 are computed by the same code on both paths.

Nothing here runs on the CPU default; ``tests/test_serving.py`` parses every server command line with the pinned
SGLang's own argument parser (its wheel installed without dependencies, plus what ``server_args`` imports) and
checks the record conversion; ``tests/test_sglang_trust.py`` drives the serving path against a stub server on
loopback that answers like SGLang (``tests/sglang_stub.py``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from tqdm import tqdm

from .server import ServerError, free_port, port_in_use, stop_server, wait_for_server  # noqa: F401 (re-exported)
from .server import closed_loop as _closed_loop
from .server import ServerProcess, get_json, records_and_summary
from .server import post_json as _post


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


def closed_loop(base_url: str, requests_: list[dict], concurrency: int, sampling: dict) -> list[tuple[dict, dict, float]]:
    """Send every request to SGLang's native ``/generate`` with ``concurrency`` workers (:func:`server.closed_loop`)."""
    return _closed_loop(lambda req: _post(base_url + "/generate", {"input_ids": req["input_ids"],
                                                            "sampling_params": sampling}), requests_, concurrency)


def expected_identity(target: str, method: dict, drafter_dir: str | None, port: int) -> dict:
    """The fields of SGLang's ``/get_server_info`` (its ``ServerArgs``, ``python/sglang/srt/server_args.py``) that
    must equal this method's: ``model_path``, ``port``, ``speculative_algorithm`` (None for AR, ``DFLASH`` for
    DFlash / DScout, ``EAGLE3``), ``speculative_num_draft_tokens`` (the bs; EAGLE-3: its verify tokens) and
    ``speculative_draft_model_path`` (the drafter), as :func:`server_command` launched it."""
    ident = {"model_path": str(target), "port": int(port)}
    if method["kind"] == "ar":
        ident["speculative_algorithm"] = None
        return ident
    flags = server_command(target, method, port, 1, drafter_dir)
    ident["speculative_algorithm"] = flags[flags.index("--speculative-algorithm") + 1]
    ident["speculative_num_draft_tokens"] = int(flags[flags.index("--speculative-num-draft-tokens") + 1])
    ident["speculative_draft_model_path"] = str(drafter_dir)
    return ident


def check_server_identity(info: dict, expected: dict, *, port: int, job: str) -> None:
    """Refuse a server whose own description is not the method's.

    Args:
        info: the server's ``/get_server_info`` answer.
        expected: :func:`expected_identity`.
        port: the port asked (named in the error).
        job: the serving job's label (named in the error).
    Raises:
        ServerError: naming the job, the port and every field that differs (``field: server says X, expected Y``).
    """
    def norm(key, value):
        if key == "speculative_algorithm" and isinstance(value, str) and value.upper() in ("", "NONE"):
            return None
        if key in ("speculative_num_draft_tokens", "port") and value is not None:
            try:
                return int(value)
            except (TypeError, ValueError):
                return value
        if key in ("model_path", "speculative_draft_model_path") and isinstance(value, str):
            return os.path.normpath(value)
        return value

    wrong = [f"{k}: server says {info.get(k)!r}, expected {v!r}" for k, v in expected.items()
             if norm(k, info.get(k, "<missing>")) != norm(k, v)]
    if wrong:
        raise ServerError(f"{job}: the server on port {port} is not this method's server ("
                          + "; ".join(wrong) + "): refusing to measure it")


def server_info(base_url: str, timeout: float = 30.0) -> dict:
    """The server's own description: SGLang's ``GET /get_server_info`` (its ``ServerArgs`` as a dict, plus the
    scheduler's info, ``internal_states`` and ``version``)."""
    return get_json(base_url + "/get_server_info", timeout=timeout)


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


def sampling_params(max_new_tokens: int, temperature: float, stop_token_ids=(), seed: int | None = None) -> dict:
    """SGLang's ``sampling_params`` of one request: the token budget, greedy as top-k 1 at T = 0, the method's stop
    ids (our engine's stopping rule) and a per-request sampling seed when given."""
    sampling = {"temperature": temperature, "max_new_tokens": max_new_tokens}
    if temperature == 0:
        sampling["top_k"] = 1
    if stop_token_ids:
        sampling["stop_token_ids"] = list(stop_token_ids)
    if seed is not None:
        sampling["sampling_seed"] = int(seed)
    return sampling


class SglangServer(ServerProcess):
    """One SGLang server of one method on loopback, identified before use (as :class:`dscout.backends.vllm.VllmServer`).

    ``with SglangServer(target, method, drafter_dir) as srv: srv.generate(ids, sampling)``. :meth:`start` picks a
    free port (or checks the given one is free), launches :func:`server_command`, waits for health and checks
    ``/get_server_info`` against :func:`expected_identity`; :meth:`stop` terminates the server.

    Args:
        launch: ``(command, log file, env) -> subprocess.Popen`` (tests start a stub); default Popen.
    Raises (from :meth:`start`):
        ServerError: naming the job and the port: the port is in use, the server exits or is unhealthy, or it is
            not the method's server.
    """

    def __init__(self, target: str, method: dict, drafter_dir: str | None = None, *, concurrency: int = 1,
                 port: int | None = None, log_path: str | os.PathLike | None = None, job: str | None = None,
                 health_timeout: float = 1800.0, launch=None):
        self.target, self.method, self.drafter_dir = target, method, drafter_dir
        self.concurrency, self.port, self.log_path = concurrency, port, log_path
        self.job = job or f"SGLang server of {method.get('key', method['kind'])}"
        self.health_timeout, self.launch = health_timeout, launch

    runtime, label = "sglang", "server"

    def start(self) -> "SglangServer":
        self._claim_port()
        self._launch(server_command(self.target, self.method, self.port, self.concurrency, self.drafter_dir),
                     {**os.environ, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"})
        self._await(lambda: check_server_identity(
            server_info(self.base_url), expected_identity(self.target, self.method, self.drafter_dir, self.port),
            port=self.port, job=self.job))
        return self

    def generate(self, input_ids: list[int], sampling: dict) -> dict:
        """One blocking native ``/generate`` call; the answer's JSON."""
        return _post(self.base_url + "/generate", {"input_ids": list(input_ids), "sampling_params": sampling})

    def flush_cache(self) -> None:
        _post(self.base_url + "/flush_cache", {})

    def ask(self, input_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
            stop_token_ids: list[int] | tuple[int, ...] = (), seed: int | None = None) -> dict:
        """One request (:func:`sampling_params`): the server interface of Table 3's server jobs
        (:mod:`dscout.evaluation.server_bench`), as :meth:`dscout.backends.vllm.VllmServer.complete`."""
        return self.generate(input_ids, sampling_params(max_new_tokens, temperature, stop_token_ids, seed))

    to_record = staticmethod(record_from_response)


def serve_benchmark(target: str, method: dict, requests_: list[dict], *, concurrency: int, temperature: float,
                    max_new_tokens: int, repeat: int, drafter_dir: str | None, port: int | None = None,
                    log_path: str | os.PathLike | None = None, warmup_requests: list[dict] | None = None,
                    job: str | None = None, health_timeout: float = 1800.0,
                    launch=None) -> tuple[list[dict], dict]:
    """Launch the method's server on a free port, check it is the method's, warm up, flush, run the closed loop;
    return records and the run summary.

    ``requests_`` items: ``{"benchmark", "prompt_id", "turn", "input_ids"}`` (chat-templated ids), all measured.
    ``warmup_requests`` (same shape; default: none) run first at the same concurrency and are never measured: the
    caller passes prompts outside the measured pool. Before anything is sent, the server's ``/get_server_info``
    must name this job's model, port, speculative algorithm, block size and drafter (:func:`check_server_identity`):
    two serving jobs on one node each get their own port, and a server of another job is refused, not measured.
    The summary holds the output-token throughput (``completion tokens / wall time``), which Table 4 divides
    by the AR server's at the same concurrency and repeat.

    Args:
        port: None = a free one (:func:`free_port`); a given port must be free.
        job: label of the serving job in errors (default: method key and concurrency).
        launch: ``(command, log file, env) -> subprocess.Popen`` (tests start a stub server); default Popen.
    Raises:
        ServerError: naming the job and the port: the port is in use, the server exits (or is unhealthy) before
            or during the warm-up, or it is not the method's server.
    """
    key = method.get("key", method["kind"])
    job = job or f"serving {key} at c={concurrency}, repeat {repeat}"
    sampling = sampling_params(max_new_tokens, temperature)
    with SglangServer(target, method, drafter_dir, concurrency=concurrency, port=port, log_path=log_path, job=job,
                      health_timeout=health_timeout, launch=launch) as srv:
        if warmup_requests:
            try:  # warm-up, not counted
                closed_loop(srv.base_url, warmup_requests, concurrency, sampling)
            except Exception as err:
                raise srv.failed("warm-up", err) from err
        try:
            srv.flush_cache()
            t0 = time.perf_counter()
            results = closed_loop(srv.base_url, requests_, concurrency, sampling)
            wall = time.perf_counter() - t0
        except Exception as err:
            raise srv.failed("measured closed loop", err) from err
        port = srv.port
    return records_and_summary(results, record_from_response, method=method, temperature=temperature, repeat=repeat,
                               concurrency=concurrency, wall=wall, port=port)
