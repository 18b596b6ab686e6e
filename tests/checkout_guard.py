"""The checkout's own run outputs, fingerprinted: the suite must leave a user's ``results/`` and ``.snakemake/``
exactly as it found them (tests plan and run in copies of the project, never in the checkout)."""

from __future__ import annotations

import hashlib
from pathlib import Path

GUARDED = ("results", ".snakemake")


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """``{relative path: (size in bytes, blake2b hex digest)}`` of every file under ``root/results`` and
    ``root/.snakemake`` (symlinks by their target text); empty when neither exists."""
    out: dict[str, tuple[int, str]] = {}
    for name in GUARDED:
        base = root / name
        if not base.exists():
            continue
        for path in sorted(base.rglob("*")):
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = (0, "-> " + str(path.readlink()))
            elif path.is_file():
                with open(path, "rb") as f:
                    out[rel] = (path.stat().st_size, hashlib.file_digest(f, "blake2b").hexdigest())
    return out


def differences(before: dict, after: dict, limit: int = 20) -> list[str]:
    """Readable lines for what was added, removed or changed between two :func:`snapshot` results."""
    lines = [f"added   {p}" for p in sorted(after.keys() - before.keys())]
    lines += [f"removed {p}" for p in sorted(before.keys() - after.keys())]
    lines += [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return lines[:limit] + ([f"... and {len(lines) - limit} more"] if len(lines) > limit else [])
