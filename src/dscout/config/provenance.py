"""Provenance of a stage's outputs: the digest of the code it runs (a rerun trigger) and the
``config.resolved.json`` written beside its outputs (its exact configuration, versions, commit).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .schema import ROOT

PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""``src/dscout``: what :data:`STAGE_CODE` paths are relative to (and what :func:`code_digest` hashes them as)."""

STAGE_CODE = {
    "target": ["models/target.py"],
    "responses": ["models/target.py", "data"],
    "features": ["models/target.py", "training/features.py", "data/responses.py"],
    "train": ["models", "training", "data/responses.py"],
    "bench": ["models", "decoding", "evaluation", "records.py", "jsonl.py", "kinds.py", "data"],
    "accuracy": ["models/target.py", "evaluation/accuracy.py", "evaluation/scoring.py", "jsonl.py", "data"],
    "analysis": ["analysis", "jsonl.py", "decoding/latency.py"],
    "depth": ["models", "training", "decoding", "experiments", "kinds.py", "data"],
    "findings": ["models", "decoding", "experiments/findings.py", "analysis/walk.py", "training/blocks.py", "training/holdout.py",
                 "training/features.py", "data", "jsonl.py"],
    "findings_analysis": ["analysis"],
    "serving": ["models", "decoding", "evaluation/serving.py", "evaluation/methods.py", "evaluation/prefill_store.py",
                "backends", "records.py", "jsonl.py", "data"],
}
"""Source files (relative to ``src/dscout``) each stage runs; their digest is a rerun trigger."""


def code_digest(stage: str) -> str:
    """Digest of the package sources a stage uses (see :data:`STAGE_CODE`): 12 hex digits of the sha256 of each
    file's path relative to ``src/dscout`` and its bytes, folders expanded to their ``*.py`` files, sorted.

    Raises:
        KeyError: ``stage`` is not a key of :data:`STAGE_CODE`.
    """
    base = PACKAGE_DIR
    h = hashlib.sha256()
    for rel in STAGE_CODE[stage]:
        p = base / rel
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(base)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:12]


def write_resolved(path: str | Path, stage_config: dict) -> None:
    """Write ``config.resolved.json`` (the stage's exact config plus provenance) next to an output."""
    import platform

    import torch
    import transformers

    from .. import __version__

    out = {"stage_config": stage_config, "dscout_version": __version__, "torch": torch.__version__,
           "transformers": transformers.__version__, "python": platform.python_version(),
           "git": git_hash()}
    Path(path).write_text(json.dumps(out, indent=1, default=str))


def git_hash() -> str | None:
    """The full hash of the project's ``HEAD`` (None outside a git checkout or without git)."""
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


__all__ = ["PACKAGE_DIR", "STAGE_CODE", "code_digest", "git_hash", "write_resolved"]
