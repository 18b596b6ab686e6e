"""The PARD-2 training objective: parallel mask blocks, COD, CAT-weighted CE + KL (docs/method.md §6.2).

Our own implementation of the recipe read in AMD-AGI/PARD ``pard/pard_train.py`` / ``pard/pard2_train.py``:

* **Layout.** A sequence of length S becomes k blocks of S slots: block 0 = the real tokens, blocks
  b = 1..k-1 = mask tokens; every block uses position ids 0..S-1. Slot (b, j) sees the real tokens at positions
  ``<= j - b``, the masks ``(b', j - (b - b'))`` for ``1 <= b' < b``, and itself — exactly what the j-b+1 real
  tokens plus b masks of an inference call see — and predicts ``x_{j+1}``, the (b+1)-th token after its real
  prefix. Slots with ``j < b`` have no real prefix and carry no loss.
* **Features.** Slot (b, j) gets the target feature ``f_{j-1-b}`` (the right shift by one, plus b more: masks
  carry the last real token's feature); zeros before the start. With probability ``feat_drop_p`` a whole
  sample's features are zeroed (dual mode).
* **COD** (conditional drop). Block 0 is kept whole; block b keeps ``floor(S * max(r^b, r_min))`` slots drawn
  among those whose ancestor ``(b-1, j-1)`` is kept. Kept slots then keep their whole ancestor chain, so the
  slice of the full layout gives every kept slot the same output as the full layout. One draw per batch.
* **Loss.** ``L = 0.1 * CE_w + 1.0 * KL_w(p_T || q_D)`` at temperature 1, both weighted means over the
  supervised slots. CAT weight of slot (b, j) predicting ``x_t`` (t = j + 1):
  ``w = prod_{s=1..b} p_T(x_{t-s} | x_{<t-s})``, the chance that greedy verification reaches that slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

EPS = 1e-6


def pard_layout(seq_len: int, k: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block and column index of every slot of the full training layout (block-major).

    Returns:
        ``(blocks, cols)``, each ``[k * S]`` long: slot ``i`` is ``(blocks[i], cols[i])``; its position id is
        ``cols[i]``.
    """
    blocks = torch.arange(k, device=device).repeat_interleave(seq_len)
    cols = torch.arange(seq_len, device=device).repeat(k)
    return blocks, cols


def pard_attention_mask(blocks: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """PARD's training mask over slots ``(blocks, cols)`` (any subset of the full layout).

    Query (b, j) may attend to key (0, i) iff ``i <= j - b``, and to key (b', j') with ``b' >= 1`` iff
    ``b' <= b`` and ``j' - b' == j - b`` (the masks of its own chain, itself included).

    Args:
        blocks, cols: ``[N]`` slot coordinates.
    Returns:
        ``[N, N]`` bool, True = may attend (rows = queries).
    """
    bq, jq = blocks[:, None], cols[:, None]
    bk, jk = blocks[None, :], cols[None, :]
    anchor = jq - bq  # the last real position a query sees
    real = (bk == 0) & (jk <= anchor)
    chain = (bk >= 1) & (bk <= bq) & (jk - bk == anchor)
    return real | chain


@dataclass
class PardInputs:
    """The drafter inputs of one PARD training layout (full or COD-sliced), N slots.

    Attributes:
        input_ids: ``[b, N]`` real tokens (block 0) and mask tokens.
        in_feats: ``[b, N, F]`` aligned input features (slot (b, j) carries ``f_{j-1-b}``), or None.
        blocks, cols: ``[N]`` slot coordinates; ``cols`` are the position ids.
        attention_mask: ``[N, N]`` bool (True = may attend).
    """

    input_ids: torch.Tensor
    in_feats: torch.Tensor | None
    blocks: torch.Tensor
    cols: torch.Tensor
    attention_mask: torch.Tensor


def build_pard_inputs(input_ids: torch.Tensor, feats: torch.Tensor | None, k: int, mask_token_id: int,
                      keep: torch.Tensor | None = None) -> PardInputs:
    """Lay a batch out as PARD blocks (see module doc).

    Args:
        input_ids: ``[b, S]``.
        feats: ``[b, S, F]`` unshifted per-token target features, or None.
        k: number of blocks.
        mask_token_id: the mask id.
        keep: ``[N]`` indices into the full ``k * S`` layout (e.g. from :func:`cod_keep`); None = all.
    Raises:
        ValueError: if ``feats`` does not match ``input_ids``.
    """
    bsz, S = input_ids.shape
    dev = input_ids.device
    blocks, cols = pard_layout(S, k, dev)
    if keep is not None:
        keep = keep.to(dev)
        blocks, cols = blocks[keep], cols[keep]
    real = input_ids[:, cols]
    ids = torch.where(blocks[None] == 0, real, torch.full_like(real, mask_token_id))
    in_feats = None
    if feats is not None:
        if feats.shape[:2] != (bsz, S):
            raise ValueError(f"feats {tuple(feats.shape)} must be [b, S, F] with [b, S] = {(bsz, S)}")
        src = cols - 1 - blocks
        in_feats = feats[:, src.clamp(min=0)] * (src >= 0).to(feats.dtype)[None, :, None]
    return PardInputs(ids, in_feats, blocks, cols, pard_attention_mask(blocks, cols))


def cod_keep(seq_len: int, k: int, r: float | None = 0.7, r_min: float = 0.1,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Conditional drop: indices (into the full layout, sorted) of the slots to keep.

    Block 0 keeps all S slots; block b keeps ``floor(S * max(r^b, r_min))`` slots (fewer if fewer qualify),
    sampled uniformly among columns j whose ancestor (b-1, j-1) is kept. ``r=None`` keeps every slot.

    Returns:
        ``[N]`` long indices, block-major ascending.
    """
    if r is None:
        return torch.arange(k * seq_len)
    kept = [torch.arange(seq_len)]
    for b in range(1, k):
        prev = kept[-1]
        cands = prev[prev + 1 < seq_len] + 1  # columns j whose (b-1, j-1) is kept
        n = min(int(math.floor(seq_len * max(r ** b, r_min))), cands.numel())
        pick = torch.randperm(cands.numel(), generator=generator)[:n]
        kept.append(cands[pick].sort().values)
    return torch.cat([b * seq_len + c for b, c in enumerate(kept)])


def gold_probs(target_logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``g[:, i] = p_T(x_i | x_{<i})`` from ``softmax(target_logits[:, i-1])``; ``g[:, 0] = 1``.

    Args:
        target_logits: ``[b, S, V]`` (position i predicts token i + 1).
        input_ids: ``[b, S]``.
    Returns:
        ``[b, S]`` float32.
    """
    logp = torch.log_softmax(target_logits[:, :-1].float(), dim=-1)
    g = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1).exp()
    return torch.cat([torch.ones_like(g[:, :1]), g], dim=1)


def cat_weights(target_logits: torch.Tensor, input_ids: torch.Tensor, blocks: torch.Tensor,
                cols: torch.Tensor) -> torch.Tensor:
    """CAT weights of slots (blocks, cols): ``w = prod_{s=1..b} p_T(x_{t-s} | x_{<t-s})`` with ``t = j + 1``.

    Slots with ``j < b`` (no real prefix) get 0.

    Args:
        target_logits: ``[b, S, V]``; input_ids: ``[b, S]``; blocks, cols: ``[N]``.
    Returns:
        ``[b, N]`` float32, no gradient.
    """
    g = gold_probs(target_logits.detach(), input_ids)
    w = torch.ones(input_ids.shape[0], blocks.numel(), dtype=torch.float32, device=input_ids.device)
    for s in range(1, int(blocks.max()) + 1 if blocks.numel() else 1):
        use = blocks >= s
        idx = (cols + 1 - s).clamp(min=0)  # position of the gold token x_{t-s}
        w = w * torch.where(use[None], g[:, idx], torch.ones_like(w))
    return w * (cols >= blocks)[None].float()


def pard2_loss(drafter, input_ids: torch.Tensor, loss_mask: torch.Tensor, feats: torch.Tensor | None,
               target_logits: torch.Tensor, k: int, cod_r: float | None = 0.7, cod_rmin: float = 0.1,
               feat_drop_p: float = 0.1, generator: torch.Generator | None = None,
               ce_weight: float = 0.1, kl_weight: float = 1.0) -> tuple[torch.Tensor, dict]:
    """One PARD-2 training loss (see module doc).

    Args:
        drafter: a :class:`~dscout.models.pard.Pard2Drafter`.
        input_ids: ``[b, S]`` tokens (prompt + response).
        loss_mask: ``[b, S]`` 1 on supervised tokens (responses): slot (b, j) is trained iff ``loss_mask[j+1]``.
        feats: ``[b, S, F]`` per-token target features, **unshifted** (``feats[:, t]`` = feature of ``x_t``,
            e.g. from ``drafter.target_features``); None = target-independent training.
        target_logits: ``[b, S, V]`` the target's logits at every position (teacher and CAT weights).
        k: blocks (1 real + k - 1 mask blocks) = drafts per forward trained.
        cod_r, cod_rmin: COD retention (``cod_r=None`` keeps every slot).
        feat_drop_p: probability of zeroing a sample's features.
        generator: CPU ``torch.Generator`` for COD and feature dropout.
        ce_weight, kl_weight: the loss mix (0.1, 1.0 upstream).
    Returns:
        ``(loss, metrics)``; metrics hold floats ``ce``, ``kl``, ``acc`` (weighted top-1 vs gold), ``slots``
        (kept slots), ``weight`` (sum of weights) and ``acc_b{b}`` (unweighted top-1 per block).
    Raises:
        ValueError: on ``k < 1`` or mismatched shapes.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    bsz, S = input_ids.shape
    if target_logits.shape[:2] != (bsz, S) or loss_mask.shape != (bsz, S):
        raise ValueError(f"input_ids {tuple(input_ids.shape)}, loss_mask {tuple(loss_mask.shape)} and "
                         f"target_logits {tuple(target_logits.shape)} must share [b, S]")
    if feats is not None and feat_drop_p > 0:
        drop = torch.rand(bsz, generator=generator) < feat_drop_p
        feats = feats * (~drop).to(feats.device, feats.dtype)[:, None, None]
    keep = cod_keep(S, k, cod_r, cod_rmin, generator)
    batch = build_pard_inputs(input_ids, feats, k, drafter.config.mask_token_id, keep)
    blocks, cols = batch.blocks, batch.cols
    hidden = drafter.hidden(batch.input_ids, batch.in_feats, position_ids=cols,
                            attention_mask=batch.attention_mask)  # [b, N, H]

    label_pos = (cols + 1).clamp(max=S - 1)
    valid = (cols >= blocks) & (cols + 1 < S)
    valid = valid[None] & loss_mask[:, label_pos].bool()  # [b, N]
    w = cat_weights(target_logits, input_ids, blocks, cols) * valid.float()  # [b, N]
    denom = w.sum().clamp_min(EPS)

    # The LM head over the vocabulary dominates the step: only supervised slots get logits (the others have
    # weight 0, so the loss and its gradient are the same as over the full layout).
    rows = torch.arange(bsz, device=input_ids.device)[:, None].expand(bsz, blocks.numel())[valid]
    slot_cols, slot_blocks = cols[None].expand_as(valid)[valid], blocks[None].expand_as(valid)[valid]
    logits = drafter.compute_logits(hidden[valid]).float()  # [M, V]
    w_sel = w[valid]
    logq = torch.log_softmax(logits, dim=-1)
    labels = input_ids[rows, (slot_cols + 1).clamp(max=S - 1)]
    ce = -logq.gather(-1, labels[:, None]).squeeze(-1)
    logp = torch.log_softmax(target_logits[rows, slot_cols].float().detach(), dim=-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    ce_w = (w_sel * ce).sum() / denom
    kl_w = (w_sel * kl).sum() / denom
    loss = ce_weight * ce_w + kl_weight * kl_w

    with torch.no_grad():
        hit = (logits.argmax(-1) == labels).float()
        metrics = {"ce": ce_w.item(), "kl": kl_w.item(), "acc": ((w_sel * hit).sum() / denom).item(),
                   "slots": int(blocks.numel()), "weight": w.sum().item()}
        for b in range(k):
            sel = slot_blocks == b
            if sel.any():
                metrics[f"acc_b{b}"] = hit[sel].mean().item()
    return loss, metrics
