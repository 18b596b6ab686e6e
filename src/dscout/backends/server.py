"""What the two serving backends (SGLang: :mod:`dscout.backends.sglang`, vLLM: :mod:`dscout.backends.vllm`) share:
a free port per server, the wait for health that notices a dead server, the stop, and a closed-loop client.

Where the servers differ, each backend keeps its own code: SGLang is driven through its native ``/generate``
(token ids in, ``meta_info`` with ``spec_verify_ct`` and the accept histogram out) and describes itself at
``/get_server_info``; vLLM through the OpenAI-compatible ``/v1/completions`` (token ids as ``prompt``,
``return_token_ids``, per-request ``metrics.speculative_decoding``) and describes itself at ``/v1/models`` plus
``/server_info`` (development mode).
"""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor


class ServerError(RuntimeError):
    """A serving job's server cannot be trusted or used: its port is taken, it died, it is not the method's
    server. The message names the job, the port (or URL) and what went wrong, and the server log when there is one."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now (the OS picks it: bind to port 0).

    Another process may still take it before the server binds: each backend's identity check then refuses the
    server that answers (its model, port or launch token is not this job's).
    """
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a process already listens on ``host:port`` (a connection is accepted)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def log_tail(log_path: str | os.PathLike | None, lines: int = 15) -> str:
    """The last ``lines`` lines of a server log, for an error message ('' without a log or when unreadable)."""
    if not log_path:
        return ""
    try:
        with open(log_path, errors="replace") as f:
            tail = f.read().splitlines()[-lines:]
    except OSError:
        return ""
    return "\n  | " + "\n  | ".join(tail) if tail else ""


def wait_for_server(base_url: str, proc: subprocess.Popen, timeout: float = 1800.0, job: str = "serving",
                    log_path: str | os.PathLike | None = None, runtime: str = "sglang") -> None:
    """Poll ``/health`` until the server answers 200.

    Raises:
        ServerError: naming the job, the URL and the server log (with its last lines), if the server process exits
            first (a port taken meanwhile, a drafter it cannot load, no room for its KV cache) or is not healthy
            after ``timeout`` seconds.
    """
    import requests

    where = f" (server log: {log_path})" if log_path else ""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise ServerError(f"{job}: the {runtime} server for {base_url} exited with code {proc.returncode} before "
                              f"becoming healthy{where}{log_tail(log_path)}")
        try:
            if requests.get(base_url + "/health", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(min(5.0, max(0.05, timeout / 300)))
    raise ServerError(f"{job}: the {runtime} server at {base_url} is not healthy after {timeout:.0f} s{where}"
                      f"{log_tail(log_path)}")


def stop_server(proc: subprocess.Popen, log=None, timeout: float = 60.0) -> None:
    """Terminate a server process (SIGTERM, then SIGKILL after ``timeout`` s) and close its log file object."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if log is not None and log is not subprocess.DEVNULL:
        log.close()


def post_json(url: str, payload: dict, timeout: float = 3600.0) -> dict:
    """POST ``payload`` as JSON; the answer's JSON (raises ``requests.HTTPError`` on a 4xx / 5xx)."""
    import requests

    r = requests.post(url, json=payload, timeout=timeout)
    r.raise_for_status()
    return r.json()


def get_json(url: str, timeout: float = 30.0) -> dict:
    """GET ``url``; the answer's JSON (raises ``requests.HTTPError`` on a 4xx / 5xx)."""
    import requests

    r = requests.get(url, timeout=timeout)
    r.raise_for_status()
    return r.json()


def closed_loop(send, requests_: list[dict], concurrency: int) -> list[tuple[dict, dict, float]]:
    """Send every request with ``concurrency`` workers, a new one starting when one finishes (a closed loop, as
    the serving benchmarks of SGLang and vLLM drive their servers).

    Args:
        send: ``request -> answer`` (one blocking HTTP call).
    Returns:
        ``(request, answer, seconds)`` per request, in input order.
    """

    def one(req):
        t0 = time.perf_counter()
        resp = send(req)
        return req, resp, time.perf_counter() - t0

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, requests_))


def records_and_summary(results: list[tuple[dict, dict, float]], convert, *, method: dict, temperature: float,
                        repeat: int, concurrency: int, wall: float, port: int) -> tuple[list[dict], dict]:
    """A measured closed loop's records (``convert(answer, ...)``: the backend's answer -> record) and its summary:
    wall seconds, completion tokens and their throughput (tokens / wall), the level, the method key and the port."""
    records = [convert(resp, benchmark=req["benchmark"], prompt_id=req["prompt_id"], turn=req.get("turn", 0),
                       method=method, temperature=temperature, repeat=repeat, concurrency=concurrency,
                       wall_seconds=secs) for req, resp, secs in results]
    tokens = sum(r["new_tokens"] for r in records)
    return records, {"wall_seconds": wall, "completion_tokens": tokens, "throughput_tok_s": tokens / wall,
                     "concurrency": concurrency, "method": method.get("key", method["kind"]), "port": port}


class ServerProcess:
    """The lifecycle both backends' server classes share (:class:`dscout.backends.vllm.VllmServer`,
    :class:`dscout.backends.sglang.SglangServer`): a port claimed, the process launched with its log, the wait for
    health and the identity check (the server stopped when either fails), stop, ``with`` support, and errors naming
    the job, the port, the phase and the log.

    A subclass sets ``runtime`` (``"vllm"`` / ``"sglang"``: in health errors), ``label`` (how errors name the
    server) and the attributes ``job``, ``port``, ``log_path``, ``health_timeout`` and ``launch``, and implements
    ``start`` with :meth:`_claim_port`, :meth:`_launch` and :meth:`_await`.
    """

    runtime = "server"
    label = "server"
    quote_log = False  # quote the log's last lines in :meth:`failed` (vLLM's tracebacks end there)
    proc = _log = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _claim_port(self) -> None:
        """A free port when none was given; a given one must be free.

        Raises:
            ServerError: the given port is in use.
        """
        if self.port is None:
            self.port = free_port()
        elif port_in_use(self.port):
            raise ServerError(f"{self.job}: port {self.port} is in use by another process: pick another "
                              "(or none: a free one)")

    def _launch(self, cmd: list[str], env: dict) -> None:
        """Start ``cmd`` with its stdout and stderr in the log (``launch`` when given: tests start a stub)."""
        if self.log_path:
            os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
        self._log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL
        self.proc = (self.launch or (lambda c, out, e: subprocess.Popen(c, stdout=out, stderr=subprocess.STDOUT,
                                                                        env=e)))(cmd, self._log, env)

    def _await(self, check_identity) -> None:
        """Wait for health, then ``check_identity()``; stop the server when either fails (and re-raise)."""
        try:
            wait_for_server(self.base_url, self.proc, timeout=self.health_timeout, job=self.job,
                            log_path=self.log_path, runtime=self.runtime)
            check_identity()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is not None:
            stop_server(self.proc, self._log)
            self.proc = self._log = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def failed(self, phase: str, err: Exception) -> ServerError:
        """A :class:`ServerError` for a failure while the server was in use (its state and log named); a server
        that dropped the connection gets a few seconds to exit, so that the error says whether it died."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        state = (f"exited with code {self.proc.poll()}" if self.proc is not None and self.proc.poll() is not None
                 else "failed")
        where = f" (server log: {self.log_path})" if self.log_path else ""
        return ServerError(f"{self.job}: the {self.label} on port {self.port} {state} during the {phase}: {err}"
                           f"{where}{log_tail(self.log_path) if self.quote_log else ''}")
