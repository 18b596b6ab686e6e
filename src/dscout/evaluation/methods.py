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
    from ..kinds import method_kind, resolve

    return resolve(method_kind(spec["kind"]), "proposer")(spec, drafter_dir, target)


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
                  cpu_packed_linear: bool = False, context_tokens: int | None = None) -> list[Method]:
    """AR plus one method per spec (``{name, kind, drafter, block_size, drafter_id}``).

    ``context_tokens`` is the job's typical context, where an online row calibrates its latency model unless its
    ``controller`` settings name a length.

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
        controller = online_controller(target, cache[key], spec.get("controller") or {},
                                       context_tokens=context_tokens) \
            if spec.get("block_size") == "online" else None
        methods.append(Method(method_key(spec, did), spec["kind"], spec["name"],
                              SpeculativeEngine(target, cache[key], stop_ids, controller=controller),
                              spec.get("block_size"), did))
    return methods


CALIBRATION_BLOCK_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
"""bs values the latency model is timed at (1 = a target step without drafts: the cost of not drafting)."""

DEFAULT_CALIBRATION_CONTEXT = 128
"""Calibration context (tokens) when neither the config nor the job gives one."""


def typical_context_tokens(prompt_lengths: list[int], max_new_tokens: int) -> int:
    """The context a job's rounds attend to on average: median prompt length + half the new-token budget.

    Args:
        prompt_lengths: chat-prompt lengths of the job's prompts (tokens, first turn).
        max_new_tokens: the job's new-token budget per turn.
    Returns:
        tokens (``DEFAULT_CALIBRATION_CONTEXT`` when there are no prompts).
    """
    if not prompt_lengths:
        return DEFAULT_CALIBRATION_CONTEXT
    lengths = sorted(prompt_lengths)
    return max(1, lengths[len(lengths) // 2] + max_new_tokens // 2)


def online_controller(target, proposer, settings: dict, concurrency: int = 1, context_tokens: int | None = None):
    """Calibrate the latency model of ``proposer`` on this machine and build the online bs controller.

    Args:
        proposer: a :class:`~dscout.decoding.proposers.BlockDiffusionProposer`; bs may range up to its drafter's
            largest training horizon.
        settings: the config's ``controller`` section (decay, long_decay, idle_decay, prior_strength, recent_strength,
            explore, prior, time_weight, time_relax, time_clip, catchup_horizon, makespan, calibration_*).
        concurrency: the c the verify term is calibrated at (besides 1).
        context_tokens: the job's typical context (:func:`typical_context_tokens`), used when
            ``settings["calibration_context_tokens"]`` is unset.
    Returns:
        :class:`~dscout.decoding.controller.BlockSizeController` (its ``latency`` is the calibrated model).
    """
    from ..decoding.controller import BlockSizeController
    from ..decoding.latency import calibrate_latency

    horizon = proposer.max_block_size
    sizes = [b for b in settings.get("calibration_block_sizes", CALIBRATION_BLOCK_SIZES) if b <= horizon] or [horizon]
    latency = calibrate_latency(target, proposer, sizes, concurrency=sorted({1, concurrency}),
                                context_tokens=settings.get("calibration_context_tokens") or context_tokens
                                or DEFAULT_CALIBRATION_CONTEXT,
                                repeats=settings.get("calibration_repeats", 5))
    knobs = ("decay", "prior_strength", "prior", "catchup_horizon", "long_decay", "idle_decay", "time_weight",
             "time_relax", "time_clip", "recent_strength", "explore", "makespan")  # unset ones take BlockSizeController's defaults (the schema's)
    return BlockSizeController(latency, horizon, **{k: settings[k] for k in knobs if k in settings})
