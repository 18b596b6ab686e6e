"""The factorized DScout training loss ``L_k = I_k * w^(k) * l^(k)`` (docs/method.md §3).

Each factor is a switch of the recipe (:mod:`dscout.training.recipes`):

* **inclusion** ``I_k``: which block offsets are supervised. Fixed horizon B, or mixed horizons with B drawn
  per update (the draw happens in the trainer; here I is the mask of supervised offsets for that B).
* **weighting** ``w^(k)``: ``none``; DFlash's positional decay ``exp(-(k-1)/gamma)`` (SpecForge
  ``specforge/core/dflash.py``); or the acceptance-weighted loss (AWL) ``w_k = sg[prod_{j<k} alpha_j]`` with
  ``alpha_j = min(1, P_j(y_j) / Q_j(y_j))``, ``y_j`` the drafter's own prediction, ``P`` the frozen target's
  distribution at that position, ``Q`` the drafter's.
* **prediction** ``l^(k)``: cross-entropy of the drafter at offset k against the target-generated token, under
  the block's mask pattern (all masked, or intra-block unmasking; revealed offsets carry no loss).

The objective is ``sum(I * w * CE) / (sum(I * w) + 1e-6)`` over all blocks of the micro-batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

EPS = 1e-6
"""The epsilon of the normalised objective (docs/method.md §3)."""

_SPECFORGE_GAMMA = {8: 4.0, 10: 5.0, 16: 7.0}


def decay_gamma(block_size: int) -> float:
    """DFlash's decay constant for horizon B: 7 at B=16, 5 at B=10, 4 at B=8 (SpecForge help text).

    Other horizons scale linearly from B=16 (``7 * B / 16``); this extension is ours.
    """
    return _SPECFORGE_GAMMA.get(block_size, 7.0 * block_size / 16.0)


def positional_decay_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """DFlash weights ``exp(-(k - 1) / gamma)`` for offsets ``k = 0..B-1`` (offset 0 gets 0: never trained).

    Returns:
        ``[B]`` float32.
    Source: SpecForge ``OnlineDFlashModel.forward`` (docs/method.md §3, "paper Eq. 4").
    """
    g = decay_gamma(block_size) if gamma is None else gamma
    k = torch.arange(block_size, dtype=torch.float32)
    w = torch.exp(-(k - 1) / g)
    w[0] = 0.0
    return w


def acceptance_probabilities(draft_logits: torch.Tensor, target_logprob_of: callable,
                             revealed: torch.Tensor) -> torch.Tensor:
    """Per-offset acceptance probability ``alpha_k = min(1, P_k(y_k) / Q_k(y_k))``, no gradient.

    ``y_k`` is the drafter's greedy prediction at offset k, ``Q_k(y_k)`` its probability under the drafter,
    and ``P_k(y_k)`` the frozen target's probability of ``y_k`` at the same absolute position. Revealed offsets
    (the anchor, and context revealed by intra-block unmasking) are known tokens and get ``alpha = 1``.

    Args:
        draft_logits: ``[..., B, V]`` drafter logits for each block offset.
        target_logprob_of: callable mapping token ids ``[..., B]`` to the target's log-probabilities of those
            ids at the offsets' positions ``[..., B]`` (see :func:`target_logprob_from_cache`).
        revealed: ``[..., B]`` bool.
    Returns:
        ``[..., B]`` float32 in [0, 1].
    """
    with torch.no_grad():
        logq = torch.log_softmax(draft_logits.float(), dim=-1)
        logq_max, y = logq.max(dim=-1)
        alpha = greedy_acceptance(y, logq_max, target_logprob_of)
        return torch.where(revealed, torch.ones_like(alpha), alpha)


def greedy_acceptance(y: torch.Tensor, logq_y: torch.Tensor, target_logprob_of: callable) -> torch.Tensor:
    """``alpha = min(1, P(y) / Q(y)) = exp(min(0, log P(y) - log Q(y)))`` for the drafter's greedy tokens.

    The core of :func:`acceptance_probabilities` for callers that already hold ``y`` and ``log Q(y)`` (the chunked
    LM head, :func:`dscout.training.head.chunked_head_cross_entropy`), so no ``[..., V]`` tensor is needed.

    Args:
        y: ``[...]`` the drafter's greedy token ids; logq_y: ``[...]`` their log-probability under the drafter.
        target_logprob_of: maps ``y`` to the target's log-probability of it ``[...]``.
    Returns:
        ``[...]`` float32 in [0, 1], no gradient.
    Source: docs/method.md §3 (AWL's acceptance term).
    """
    with torch.no_grad():
        return torch.exp(torch.clamp(target_logprob_of(y) - logq_y.float(), max=0.0))


def acceptance_weights(alpha: torch.Tensor) -> torch.Tensor:
    """AWL weights ``w_k = prod_{j=1}^{k-1} alpha_j`` (``w_1 = 1``; offset 0 gets 0), detached.

    This is the probability that verification reaches offset k: the prefix survival ``S(k-1)`` of docs/method.md §1.

    Args:
        alpha: ``[..., B]`` per-offset acceptance probabilities (offset 0 ignored).
    Returns:
        ``[..., B]``.
    """
    a = alpha.detach().clone()
    a[..., 0] = 1.0
    surv = torch.cumprod(a, dim=-1)  # surv[k] = prod_{j<=k} alpha_j (alpha_0 := 1)
    w = torch.ones_like(a)
    w[..., 1:] = surv[..., :-1]
    w[..., 0] = 0.0
    return w


def target_logprob_from_cache(final_hidden: torch.Tensor, lse: torch.Tensor, lm_head_weight: torch.Tensor,
                              rows: torch.Tensor, positions: torch.Tensor) -> callable:
    """Build ``target_logprob_of`` for :func:`acceptance_probabilities` from cached target states.

    The target's distribution over the token at absolute position ``p`` is its next-token distribution at
    ``p - 1``: ``log P(y) = <h_{p-1}, W[y]> - lse_{p-1}``, with ``h`` the final-normed hidden state and ``lse``
    the log-sum-exp of that row's logits; both are cached once, so AWL needs no full-vocabulary target pass.

    Args:
        final_hidden: ``[b, S, D]`` target final-normed hidden states.
        lse: ``[b, S]`` log-sum-exp of the target logits at each position.
        lm_head_weight: ``[V, D]`` the target LM head.
        rows: ``[M]`` batch row of each queried offset.
        positions: ``[M]`` absolute position of each queried offset.
    Returns:
        a function mapping token ids ``[M]`` to ``log P`` ``[M]``.
    """
    prev = (positions - 1).clamp(min=0, max=final_hidden.shape[1] - 1)
    h = final_hidden[rows, prev].float()
    l = lse[rows, prev].float()

    def logprob_of(y: torch.Tensor) -> torch.Tensor:
        w = lm_head_weight.detach()[y.reshape(-1)].float()
        return ((h * w).sum(-1) - l).view_as(y)

    return logprob_of


def factorized_objective(ce: torch.Tensor, inclusion: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum(I * w * CE) / (sum(I * w) + eps)`` (docs/method.md §3, the training objective).

    Args:
        ce: ``[...]`` per-position cross-entropy (with gradient).
        inclusion: ``[...]`` 0/1 (bool allowed).
        weights: ``[...]`` non-negative, no gradient.
    Returns:
        scalar loss.
    """
    iw = inclusion.to(ce.dtype) * weights.detach().to(ce.dtype)
    return (iw * ce).sum() / (iw.sum() + EPS)


def block_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-position cross-entropy ``[...]`` of logits ``[..., V]`` against labels ``[...]`` (float32)."""
    return F.cross_entropy(logits.float().flatten(0, -2), labels.flatten(), reduction="none").view_as(labels)


def distill_cross_entropy(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy ``H(P, Q) = -sum_y P(y) log Q(y)`` of the drafter against the target, per position.

    ``P`` is the target's next-token distribution at the position restricted to the draft vocabulary and
    renormalised (softmax of its logits over those rows), ``Q`` the drafter's softmax: knowledge distillation
    on the target's logits (Hinton et al., 2015), as EAGLE-3 trains its drafter. ``P`` carries no gradient.

    Args:
        draft_logits: ``[M, V_d]`` drafter logits.
        target_logits: ``[M, V_d]`` the target's logits over the same vocabulary entries.
    Returns:
        ``[M]`` float32 (with gradient through ``draft_logits``).
    """
    p = torch.softmax(target_logits.detach().float(), dim=-1)
    return -(p * torch.log_softmax(draft_logits.float(), dim=-1)).sum(-1)


def expected_accept_length(correct: torch.Tensor, inclusion: torch.Tensor) -> float:
    """Greedy acceptance proxy on training blocks: ``1 + E[longest correct prefix]`` over fully-masked blocks.

    ``correct[..., k]`` is argmax == label at offset k. Offsets outside ``inclusion`` end the prefix, so the
    number is a lower bound of the τ the drafter would get at this block size. Used for logging only.
    """
    c = (correct & inclusion.bool()).float()
    c[..., 0] = 1.0
    run = torch.cumprod(c, dim=-1)[..., 1:].sum(-1)
    return float(1.0 + run.mean()) if run.numel() else math.nan
