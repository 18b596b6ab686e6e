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
entry in :data:`DRAFTER_KINDS`.
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
    """

    name: str
    method_kinds: tuple[str, ...]
    layer_ids: Callable[[dict, int], list[int]]
    training_method: str
    proposer: str
    pretrained: str
    server_flags: Callable[[dict, str], list[str]] | None
    uses_mask_token: bool = True


DRAFTER_KINDS: dict[str, DrafterKind] = {k.name: k for k in (
    DrafterKind("dflash", ("dflash", "dscout"), _block_diffusion_layers,
                "dscout.training.methods:DFlashMethod", "dscout.evaluation.methods:block_diffusion_proposer",
                "dscout.models.pretrained:import_dflash", _dflash_server_flags),
    DrafterKind("eagle3", ("eagle3",), _eagle3_layers,
                "dscout.training.methods:Eagle3Method", "dscout.evaluation.methods:eagle3_proposer",
                "dscout.models.pretrained:import_eagle3", _eagle3_server_flags, uses_mask_token=False),
    DrafterKind("pard2", ("pard2",), _pard2_layers,
                "dscout.training.methods:Pard2Method", "dscout.evaluation.methods:pard2_proposer",
                "dscout.models.pretrained:import_pard2", None),
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


__all__ = ["BLOCK_DIFFUSION", "DRAFTER_KINDS", "DrafterKind", "METHOD_KINDS", "drafter_kind", "load", "method_kind"]
