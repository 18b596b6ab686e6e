"""Shared matplotlib setup of every figure: headless backend, PNG + PDF output."""

from __future__ import annotations

from pathlib import Path


def _plt():
    """matplotlib.pyplot with the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, out_prefix: str | Path) -> None:
    """Write ``<prefix>.png`` (130 dpi) and ``<prefix>.pdf``; parent folders are created."""
    prefix = Path(out_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(prefix.with_suffix(".png"), dpi=130, bbox_inches="tight")
    fig.savefig(prefix.with_suffix(".pdf"), bbox_inches="tight")
