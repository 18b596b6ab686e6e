"""The drafter-kind registry: the one place that knows the kinds of drafters and the methods they serve.

A *drafter kind* is what ``drafters.<name>.kind`` names (``dflash``, ``eagle3``, ``pard2``); a *method kind* is what
a row of ``methods`` names (``dflash``, ``dscout``, ``eagle3``, ``pard2``; block-diffusion drafters of either recipe
serve ``dflash`` and ``dscout`` rows). Each entry supplies:

* the target layers a variant reads (torch-free: Snakemake plans with it),
* its training method (:mod:`dscout.training.methods`),
* its proposer loader (how the engine drafts with a trained folder),
* its importer of a published checkpoint (:mod:`dscout.models.pretrained`),
* its SGLang server flags, or None when SGLang cannot serve it.

Heavy parts are named as ``"module:attribute"`` and imported on use, so this module imports nothing but the
standard library and :mod:`dscout.models.layer_ids`. Adding a baseline = one module with those four pieces and one
entry, :func:`register`-ed. The classes an entry names are checked against the interfaces of
:mod:`dscout.protocols` (:func:`check_kind`) when it is registered and whenever a part is :func:`resolve`-d: a
missing method is an error naming the kind, the class and the members, not an ``AttributeError`` inside a job.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from .models.layer_ids import default_eagle3_layer_ids, default_target_layer_ids, resolve_feature_layers


def _block_diffusion_layers(variant: dict, num_target_layers: int) -> list[int]:
    if variant.get("target_layer_ids"):
        return list(variant["target_layer_ids"])
    return default_target_layer_ids(num_target_layers, variant.get("num_taps") or variant["num_layers"])


def _eagle3_layers(variant: dict, num_target_layers: int) -> list[int]:
    if variant.get("target_layer_ids"):
        return list(variant["target_layer_ids"])
    return default_eagle3_layer_ids(num_target_layers)


PARD2_FEATURE_LAYERS = [-1, -8, -16, -24]


def _pard2_layers(variant: dict, num_target_layers: int) -> list[int]:
    feats = (variant.get("options") or {}).get("feature_layers", PARD2_FEATURE_LAYERS)
    return [num_target_layers - 1 if l == -1 else l for l in resolve_feature_layers(feats, num_target_layers)]


def _dflash_server_flags(method: dict, drafter_dir: str) -> list[str]:
    return ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(drafter_dir),
            "--speculative-num-draft-tokens", str(method["block_size"])]


def _eagle3_server_flags(method: dict, drafter_dir: str) -> list[str]:
    return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(drafter_dir),
            "--speculative-num-steps", str(method.get("num_steps", 7)),
            "--speculative-eagle-topk", str(method.get("topk", 10)),
            "--speculative-num-draft-tokens", str(method.get("block_size", 60))]


@dataclass(frozen=True)
class DrafterKind:
    """One kind of drafter and everything the workflow does with it.

    Attributes:
        name: the drafter kind (config ``drafters.<name>.kind``).
        method_kinds: the method kinds (rows of ``methods``) it serves.
        layer_ids: ``(variant, num_target_layers) -> target layer ids`` it reads (id l = output of decoder layer l).
        training_method: ``"module:Class"`` of its training method (built with the train config).
        proposer: ``"module:function"`` ``(method row, drafter folder, target) -> proposer`` for the engine.
        pretrained: ``"module:function"`` ``(source folder, target, out folder) -> (drafter, label)``: imports a
            published checkpoint into our folder layout.
        server_flags: ``(method row, drafter folder) -> SGLang flags``, or None (not servable by SGLang).
        uses_mask_token: whether it drafts through mask tokens (``target.mask_token_id`` must then never occur
            in the training sequences).
        drafter_class: ``"module:Class"`` of its drafter model (:class:`dscout.protocols.Drafter`), or None
            (unchecked).
        proposer_class: ``"module:Class"`` of the proposer its ``proposer`` returns
            (:class:`dscout.protocols.Proposer`), or None (unchecked).
    """

    name: str
    method_kinds: tuple[str, ...]
    layer_ids: Callable[[dict, int], list[int]]
    training_method: str
    proposer: str
    pretrained: str
    server_flags: Callable[[dict, str], list[str]] | None
    uses_mask_token: bool = True
    drafter_class: str | None = None
    proposer_class: str | None = None


DRAFTER_KINDS: dict[str, DrafterKind] = {k.name: k for k in (
    DrafterKind("dflash", ("dflash", "dscout"), _block_diffusion_layers,
                "dscout.training.methods:DFlashMethod", "dscout.evaluation.methods:block_diffusion_proposer",
                "dscout.models.pretrained:import_dflash", _dflash_server_flags,
                drafter_class="dscout.models.drafter:DFlashDrafter",
                proposer_class="dscout.decoding.proposers:BlockDiffusionProposer"),
    DrafterKind("eagle3", ("eagle3",), _eagle3_layers,
                "dscout.training.methods:Eagle3Method", "dscout.evaluation.methods:eagle3_proposer",
                "dscout.models.pretrained:import_eagle3", _eagle3_server_flags, uses_mask_token=False,
                drafter_class="dscout.models.eagle3:Eagle3Drafter",
                proposer_class="dscout.decoding.eagle3_proposer:Eagle3Proposer"),
    DrafterKind("pard2", ("pard2",), _pard2_layers,
                "dscout.training.methods:Pard2Method", "dscout.evaluation.methods:pard2_proposer",
                "dscout.models.pretrained:import_pard2", None,
                drafter_class="dscout.models.pard:Pard2Drafter",
                proposer_class="dscout.decoding.pard_proposer:Pard2Proposer"),
)}

METHOD_KINDS: dict[str, DrafterKind] = {m: k for k in DRAFTER_KINDS.values() for m in k.method_kinds}
"""Method kind (a row of ``methods``) -> the drafter kind that serves it (``ar`` has none)."""

BLOCK_DIFFUSION = frozenset(DRAFTER_KINDS["dflash"].method_kinds)
"""Method kinds decoded by a block-diffusion drafter (bs bounded by the drafter's largest training horizon)."""


def drafter_kind(name: str) -> DrafterKind:
    """Registry lookup by drafter kind. Raises KeyError listing the valid kinds."""
    if name not in DRAFTER_KINDS:
        raise KeyError(f"unknown drafter kind '{name}'; valid: {', '.join(DRAFTER_KINDS)}")
    return DRAFTER_KINDS[name]


def method_kind(name: str) -> DrafterKind:
    """The drafter kind serving a method kind. Raises KeyError listing the valid method kinds."""
    if name not in METHOD_KINDS:
        raise KeyError(f"unknown method kind '{name}'; valid: {', '.join(METHOD_KINDS)}")
    return METHOD_KINDS[name]


def load(ref: str):
    """Import ``"module:attribute"``."""
    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr)


PARTS = {  # DrafterKind field -> (what it is, the protocol its object implements, or None: a callable)
    "training_method": ("training method", "TrainingMethod"),
    "proposer": ("proposer loader", None),
    "pretrained": ("pretrained importer", None),
    "drafter_class": ("drafter", "Drafter"),
    "proposer_class": ("proposer", "Proposer"),
}
"""The ``"module:attribute"`` parts of a :class:`DrafterKind` and how :func:`check_part` checks each."""


def check_part(kind: DrafterKind, part: str):
    """Import one part of ``kind`` (a field of :data:`PARTS`) and check it: callable, and a class that has every
    method of its protocol (:mod:`dscout.protocols`).

    Returns:
        the imported object; None when the part is unset (``drafter_class`` / ``proposer_class`` None).
    Raises:
        TypeError: naming the kind, the part, the ``"module:attribute"`` and the missing protocol members.
        ImportError, AttributeError: the module or attribute does not exist (the message names it).
    """
    from . import protocols

    ref = getattr(kind, part)
    if ref is None:
        return None
    what, proto_name = PARTS[part]
    obj = load(ref)
    if not callable(obj):
        raise TypeError(f"drafter kind '{kind.name}': its {what} {ref} is not callable")
    if proto_name is not None:
        missing = protocols.missing_members(obj, getattr(protocols, proto_name))
        if missing:
            raise TypeError(f"drafter kind '{kind.name}': its {what} {ref} does not implement "
                            f"dscout.protocols.{proto_name}: missing {', '.join(missing)}")
    return obj


_CHECKED: set = set()  # entries that passed check_kind (a DrafterKind is frozen, hence hashable)


def check_kind(kind: DrafterKind) -> None:
    """Check every part of ``kind`` (:func:`check_part`; imports its modules, torch included), once per entry.

    Raises:
        TypeError: naming the kind, the class and its missing members.
    """
    if kind in _CHECKED:
        return
    for part in PARTS:
        check_part(kind, part)
    _CHECKED.add(kind)


def register(kind: DrafterKind) -> DrafterKind:
    """Add ``kind`` to :data:`DRAFTER_KINDS` and its method kinds to :data:`METHOD_KINDS`, after :func:`check_kind`.

    Raises:
        TypeError: a part does not implement its protocol (nothing is registered).
        ValueError: the drafter kind or one of its method kinds is registered already.
    """
    if kind.name in DRAFTER_KINDS:
        raise ValueError(f"drafter kind '{kind.name}' is registered already")
    taken = [m for m in kind.method_kinds if m in METHOD_KINDS]
    if taken:
        raise ValueError(f"drafter kind '{kind.name}': method kinds {taken} are served by "
                         f"{sorted({METHOD_KINDS[m].name for m in taken})} already")
    check_kind(kind)
    DRAFTER_KINDS[kind.name] = kind
    for m in kind.method_kinds:
        METHOD_KINDS[m] = kind
    return kind


def resolve(name: str | DrafterKind, part: str):
    """Part ``part`` of drafter kind ``name`` (a name, or an entry: :func:`method_kind`'s), a field of :data:`PARTS`,
    imported, after the whole entry passed
    :func:`check_kind`: what every dispatch site calls (the trainer, the engine's method builder, the pretrained
    importer), so a kind with a missing method fails there, by name, before any work.

    Raises:
        KeyError: an unknown kind (the valid ones listed).
        TypeError: a part of the entry does not implement its protocol.
    """
    kind = name if isinstance(name, DrafterKind) else drafter_kind(name)
    check_kind(kind)
    ref = getattr(kind, part)
    return None if ref is None else load(ref)


__all__ = ["BLOCK_DIFFUSION", "DRAFTER_KINDS", "DrafterKind", "METHOD_KINDS", "PARTS", "check_kind", "check_part",
           "drafter_kind", "load", "method_kind", "register", "resolve"]
