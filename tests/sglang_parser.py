"""SGLang's own server-argument parser on a machine without a GPU (used by tests/test_serving.py).

The pinned ``sglang`` wheel (``envs/serve.yaml``) installs without its dependencies; ``sglang.srt.server_args``
then imports only a handful of packages at module level (triton among them). Those are installed beside it with
``pip --no-deps --target`` at exactly the versions pip resolves for the serve env (:mod:`tests.envs`), into
``.cache/sglang-parser/``. ``parse`` runs ``ServerArgs.add_cli_args`` + ``parse_args`` (what
``python -m sglang.launch_server`` does first) in a subprocess, so nothing of SGLang leaks into the test process.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from tests.envs import ROOT, pip_target_once, resolved_versions

IMPORTED_BY_SERVER_ARGS = ["sglang", "orjson", "pybase64", "triton", "starlette", "msgspec", "pyzmq", "ipython",
                           "aiohttp", "multidict", "yarl", "propcache", "aiohappyeyeballs", "aiosignal",
                           "frozenlist"]
"""Distributions ``sglang.srt.server_args`` imports at module level (found by importing it in a bare venv)."""


def parser_site() -> Path:
    """Folder holding sglang + its import-time needs at the serve env's resolved versions (installed once)."""
    versions = resolved_versions("serve")
    pins = [f"{n}=={versions[n]}" for n in IMPORTED_BY_SERVER_ARGS]
    site = ROOT / ".cache" / "sglang-parser" / hashlib.sha256(" ".join(pins).encode()).hexdigest()[:12]
    return pip_target_once(site, pins, "SGLang's parser")


_RUNNER = r'''
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
out = []
for argv in json.load(sys.stdin):
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
    except SystemExit as e:
        out.append({"error": err.getvalue().strip() or f"exit {e.code}"})
        continue
    algo = ns.speculative_algorithm
    if algo is not None:
        try:
            algo = SpeculativeAlgorithm.from_string(algo).name
        except Exception as e:
            out.append({"error": f"unknown speculative algorithm: {e}"})
            continue
    out.append({"args": {k: v for k, v in vars(ns).items() if isinstance(v, (str, int, float, bool, type(None)))},
                "algorithm": algo})
print(json.dumps(out))
'''


def parse(argvs: list[list[str]]) -> list[dict]:
    """Parse each argument list (what follows ``-m sglang.launch_server``) with SGLang's parser.

    Returns one dict per list: ``{"args": parsed namespace (scalars), "algorithm": canonical name}`` or
    ``{"error": the parser's message}``.
    """
    site = parser_site()
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(ROOT / ".cache"),
           "TRITON_CACHE_DIR": str(ROOT / ".cache" / "triton")}
    r = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(argvs), capture_output=True, text=True,
                       env=env, timeout=600)
    if r.returncode != 0:
        raise AssertionError(f"SGLang's parser did not run:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])
