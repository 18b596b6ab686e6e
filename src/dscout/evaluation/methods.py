"""From the config's ``methods`` list to engines: one :class:`~dscout.evaluation.runner.Method` per row, AR first."""

from __future__ import annotations

from ..config import method_key
from ..decoding.engine import SpeculativeEngine
from ..decoding.proposers import BlockDiffusionProposer
from .runner import Method

def load_proposer(spec: dict, drafter_dir: str, target):
    """Load the trained drafter of a method row and wrap it as the engine's proposer (by the drafter-kind
    registry, :mod:`dscout.kinds`).

    Args:
        spec: the method row (``kind``; EAGLE-3 ``topk``/``depth``; PARD-2 ``use_features``).
    Raises:
        KeyError: for a method kind without a proposer here.
    """
    from ..kinds import load, method_kind

    return load(method_kind(spec["kind"]).proposer)(spec, drafter_dir, target)


def block_diffusion_proposer(spec: dict, drafter_dir: str, target):
    """DFlash / DScout rows: the DFlash-format checkpoint behind :class:`BlockDiffusionProposer`."""
    from ..models.export import drafter_for_target

    return BlockDiffusionProposer(drafter_for_target(drafter_dir, target))


def eagle3_proposer(spec: dict, drafter_dir: str, target):
    """EAGLE-3 rows: the drafter drafting a tree of ``topk`` children per node, ``depth`` levels."""
    from ..decoding.eagle3_proposer import Eagle3Proposer
    from ..models.eagle3 import Eagle3Drafter
    from ..models.strict import load_strict

    drafter = load_strict(Eagle3Drafter, drafter_dir, "EAGLE-3 drafter")
    drafter = drafter.to(target.device, target.dtype).attach_target(target)
    return Eagle3Proposer(drafter, topk=spec.get("topk", 10), depth=spec.get("depth", 7))


def pard2_proposer(spec: dict, drafter_dir: str, target):
    """PARD-2 rows: parallel drafting of ``k`` tokens per forward, with the target's features by default."""
    from ..decoding.pard_proposer import Pard2Proposer
    from ..models.pard import Pard2Drafter

    drafter = Pard2Drafter.load(drafter_dir, target=target, dtype=target.dtype, device=target.device)
    return Pard2Proposer(drafter, target, use_features=spec.get("use_features", True))


def build_methods(target, specs: list[dict], drafter_dirs: dict[str, str], stop_ids: list[int],
                  cpu_packed_linear: bool = False) -> list[Method]:
    """AR plus one method per spec (``{name, kind, drafter, block_size, drafter_id}``).

    ``drafter_dirs`` maps the config's drafter names to trained drafter folders. Proposers of the same drafter
    are shared between rows that differ only in block size. With ``cpu_packed_linear`` the target and every
    drafter run their linear layers through oneDNN pre-packed weights (:func:`dscout.models.linear.pack_linears`;
    a no-op off the CPU or outside float32), so AR and all methods share the same kernels.
    """
    if cpu_packed_linear:
        from ..models.linear import pack_linears

        pack_linears(target.model, extra_weights=(target.lm_head.weight,))
    methods = [Method("ar", "ar", "AR", SpeculativeEngine(target, None, stop_ids))]
    cache = {}
    for spec in specs:
        name = spec.get("drafter")
        if name not in drafter_dirs:
            raise KeyError(f"method '{spec['name']}' needs drafter '{name}', which was not passed (--drafter)")
        key = (name, spec.get("topk"), spec.get("depth"), spec.get("use_features"))
        if key not in cache:
            cache[key] = load_proposer(spec, drafter_dirs[name], target)
            if cpu_packed_linear:
                pack_linears(cache[key].drafter)
        did = spec.get("drafter_id", name)
        methods.append(Method(method_key(spec, did), spec["kind"], spec["name"],
                              SpeculativeEngine(target, cache[key], stop_ids), spec.get("block_size"), did))
    return methods
