"""Pieces both drafter families share (the DFlash/DScout drafter in :mod:`dscout.models.drafter`, the EAGLE-3
drafter in :mod:`dscout.models.eagle3`): weight initialisation, the reduced draft vocabulary map and RoPE's
half rotation. Both modules import from here; neither imports the other.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """RoPE's half rotation ``[x1, x2] -> [-x2, x1]`` over the last dimension (any shape)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@torch.no_grad()
def init_drafter_weights(module: nn.Module, std: float) -> None:
    """SpecForge-style init of one drafter submodule: linears ~ N(0, std) with zero bias, RMSNorm = 1, RoPE
    frequencies recomputed (shared by the DFlash and EAGLE-3 drafters' ``_init_weights``)."""
    if isinstance(module, nn.Linear):
        module.weight.normal_(mean=0.0, std=std)
        if module.bias is not None:
            module.bias.zero_()
    elif isinstance(module, Qwen3RMSNorm):
        module.weight.fill_(1.0)
    elif isinstance(module, Qwen3RotaryEmbedding):
        inv_freq, _ = module.compute_default_rope_parameters(module.config) \
            if module.rope_type == "default" else (module.inv_freq, None)
        module.inv_freq.copy_(inv_freq)
        module.original_inv_freq.copy_(inv_freq)


def build_vocab_map(token_counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduced draft vocabulary from token frequencies (EAGLE ``scandata``; docs/method.md §6.1).

    Keeps the ``V_d`` most frequent ids (ties broken towards the smaller id), sorted ascending as ``used``.

    Args:
        token_counts: ``[V]`` counts of each target id over the loss-masked training tokens.
        draft_vocab_size: ``V_d``.
    Returns:
        ``(d2t, t2d)``: ``d2t`` ``[V_d]`` int64 offsets with ``target_id = i + d2t[i]``; ``t2d`` ``[V]`` bool,
        True at the kept ids.
    Raises:
        ValueError: if ``token_counts`` is not 1-D or ``draft_vocab_size`` is outside ``[1, V]``.
    """
    if token_counts.dim() != 1:
        raise ValueError(f"token_counts must be 1-D [V], got shape {tuple(token_counts.shape)}")
    V = token_counts.shape[0]
    if not 1 <= draft_vocab_size <= V:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} outside [1, {V}]")
    counts = token_counts.detach().to("cpu", torch.float64)
    order = torch.sort(-counts, stable=True).indices  # descending counts, smaller id first on ties
    used = torch.sort(order[:draft_vocab_size]).values
    d2t = used - torch.arange(draft_vocab_size, dtype=torch.long)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d


def to_target_ids(draft_ids: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """Map draft-vocab ids (any shape) to target ids: ``i + d2t[i]`` (the table form of
    :meth:`dscout.protocols.ReducedVocabDrafter.to_target_ids`)."""
    d2t = d2t.to(draft_ids.device)
    return draft_ids + d2t[draft_ids]


def to_draft_ids(target_ids: torch.Tensor, t2d: torch.Tensor) -> torch.Tensor:
    """Map target ids (any shape) to draft-vocab ids; ids outside the draft vocabulary map to ``-1`` (the table form
    of :meth:`dscout.protocols.ReducedVocabDrafter.to_draft_ids`)."""
    t2d = t2d.to(target_ids.device)
    index = torch.cumsum(t2d.long(), 0) - 1  # draft index of each kept target id
    return torch.where(t2d[target_ids], index[target_ids], torch.full_like(target_ids, -1))


def rope_from_config(cfg: dict) -> dict | None:
    """RoPE settings ``{"rope_type", "rope_theta", ...}`` of a checkpoint's ``config.json`` (a dict), from either
    layout: transformers 4 (top-level ``rope_theta`` + ``rope_scaling``, as published DFlash / EAGLE-3 checkpoints
    have it) or transformers 5 (``rope_parameters``, what ``save_pretrained`` writes now). None when neither
    gives a base."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        rope = dict(params)
    elif "rope_theta" in cfg:
        rope = {"rope_theta": cfg["rope_theta"], **(cfg.get("rope_scaling") or {})}
    else:
        return None
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type")
    rope.setdefault("rope_type", "default")
    rope["rope_theta"] = float(rope["rope_theta"])
    return rope
