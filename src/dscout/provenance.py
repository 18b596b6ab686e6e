"""The provenance header every measurement report opens with: date, commit, host CPU, exact command, wall time.

Torch-free (benchmark scripts and report writers call it before or after their heavy work).
"""

from __future__ import annotations

import datetime
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def git_commit(cwd: str | Path = ROOT) -> str:
    """Short hash of ``HEAD`` in ``cwd`` (``unknown`` outside a git checkout), ``+dirty`` with local changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def host_cpu() -> str:
    """The CPU model (``/proc/cpuinfo``), with the number of logical CPUs, and ``avx512_bf16`` when present."""
    import os

    name, flags = platform.processor() or "unknown", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line
    except OSError:
        pass
    bf16 = ", avx512_bf16" if " avx512_bf16" in flags else (", avx2" if " avx2" in flags else "")
    return f"{name} ({os.cpu_count()} CPUs{bf16})"


def report_header(title: str, command: str, wall_seconds: float, host_note: str = "",
                  cwd: str | Path = ROOT) -> list[str]:
    """Markdown lines: ``# title`` and the provenance list (UTC date, commit, host CPU [+ note], command, wall time)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [f"# {title}", "", f"- date: {now}", f"- commit: {git_commit(cwd)}",
            f"- host CPU: {host_cpu()}{' ' + host_note if host_note else ''}", f"- command: `{command}`",
            f"- wall time: {wall_seconds:.0f} s", ""]
