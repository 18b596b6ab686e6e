"""From the config's ``methods`` list to engines: one :class:`~dscout.bench.runner.Method` per row, AR first."""

from __future__ import annotations

from ..config import method_key
from ..decoding.engine import SpeculativeEngine
from ..decoding.proposers import BlockDiffusionProposer
from .runner import Method

PROPOSER_KINDS = {"dflash", "dscout"}


def load_proposer(kind: str, drafter_dir: str, target):
    """Load a trained drafter of ``kind`` and wrap it as a proposer.

    Raises:
        KeyError: for a method kind without a proposer here.
    """
    if kind in PROPOSER_KINDS:
        from ..models.export import load_dflash_checkpoint

        drafter = load_dflash_checkpoint(drafter_dir, dtype=target.dtype).to(target.device)
        return BlockDiffusionProposer(drafter.attach_target(target))
    raise KeyError(f"no proposer for method kind '{kind}' (known: {', '.join(sorted(PROPOSER_KINDS))})")


def build_methods(target, specs: list[dict], drafter_dirs: dict[str, str], stop_ids: list[int]) -> list[Method]:
    """AR plus one method per spec (``{name, kind, drafter, block_size, drafter_id}``).

    ``drafter_dirs`` maps the config's drafter names to trained drafter folders. Proposers of the same drafter
    are shared between rows that differ only in block size.
    """
    methods = [Method("ar", "ar", "AR", SpeculativeEngine(target, None, stop_ids))]
    cache = {}
    for spec in specs:
        name = spec.get("drafter")
        if name not in drafter_dirs:
            raise KeyError(f"method '{spec['name']}' needs drafter '{name}', which was not passed (--drafter)")
        if name not in cache:
            cache[name] = load_proposer(spec["kind"], drafter_dirs[name], target)
        did = spec.get("drafter_id", name)
        methods.append(Method(method_key(spec, did), spec["kind"], spec["name"],
                              SpeculativeEngine(target, cache[name], stop_ids), spec.get("block_size"), did))
    return methods
