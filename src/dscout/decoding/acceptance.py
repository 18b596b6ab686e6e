"""Verification rules for a chain of drafts: greedy and lossless speculative sampling.

For drafts ``d_1..d_k`` verified in one target forward over ``[x, d_1, ..., d_k]`` the target returns logits
``L_0..L_k``; ``L_i`` is the target's next-token distribution after ``d_i`` (``d_0 := x``).

* **Greedy** (temperature 0): accept the longest prefix with ``d_{i+1} == argmax L_i``; the bonus token is
  ``argmax L_n`` at the first mismatch (or after the last draft). The committed text equals autoregressive
  greedy decoding token for token.
* **Sampling** (temperature T > 0): the standard rule (dscout.md §1): accept ``d`` with probability
  ``min(1, p(d) / q(d))``; on rejection sample from ``norm(max(0, p - q))``; if every draft is accepted,
  sample the bonus from ``p_k``. With a deterministic (greedy) drafter ``q`` is one-hot, so ``d`` is accepted
  with probability ``p(d)`` and a rejection samples from ``p`` with ``d`` removed (dflash-reference §3.2,
  SGLang ``tree_speculative_sampling_target_only``). Either way the output follows the target distribution.
"""

from __future__ import annotations

import torch


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``softmax(logits / T)`` in float32 over the last dimension."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def greedy_accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Greedy chain verification.

    Args:
        draft_tokens: ``[k]`` drafts ``d_1..d_k``.
        target_logits: ``[k + 1, V]`` target logits after ``x, d_1, ..., d_k``.
    Returns:
        ``(n_accepted, bonus_token)``; ``0 <= n_accepted <= k``; the round commits ``n_accepted + 1`` tokens.
    """
    k = draft_tokens.shape[0]
    target_argmax = target_logits.argmax(dim=-1)
    if k == 0:
        return 0, int(target_argmax[0])
    match = (draft_tokens == target_argmax[:k]).int()
    n = int(torch.cumprod(match, dim=0).sum())
    return n, int(target_argmax[n])


def speculative_accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor, temperature: float,
                       generator: torch.Generator, draft_probs: torch.Tensor | None = None) -> tuple[int, int]:
    """Lossless chain verification at temperature ``T > 0``.

    Args:
        draft_tokens: ``[k]``.
        target_logits: ``[k + 1, V]``.
        temperature: T > 0 applied to the target logits.
        generator: RNG for the accept coins and the residual / bonus samples.
        draft_probs: ``[k, V]`` the drafter's distributions the drafts were sampled from, or None for
            deterministic drafts (one-hot q).
    Returns:
        ``(n_accepted, bonus_token)``.
    Raises:
        ValueError: if ``temperature <= 0`` (use :func:`greedy_accept`).
    """
    if temperature <= 0:
        raise ValueError("speculative_accept needs temperature > 0; use greedy_accept at temperature 0")
    p = target_probs(target_logits, temperature)
    k = draft_tokens.shape[0]
    coins = torch.rand(k, generator=generator, device=p.device) if k else None
    for i in range(k):
        d = int(draft_tokens[i])
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        p_d = float(p[i, d])
        if q_d > 0 and float(coins[i]) < min(1.0, p_d / q_d):
            continue
        if draft_probs is None:
            residual = p[i].clone()
            residual[d] = 0.0
        else:
            residual = torch.clamp(p[i] - draft_probs[i].float(), min=0.0)
        total = float(residual.sum())
        if total <= 0.0:  # p == q up to rounding: any sample from p is exact
            residual, total = p[i], 1.0
        bonus = int(torch.multinomial(residual / total, 1, generator=generator))
        return i, bonus
    bonus = int(torch.multinomial(p[k], 1, generator=generator))
    return k, bonus


def accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor, temperature: float,
           generator: torch.Generator | None = None, draft_probs: torch.Tensor | None = None) -> tuple[int, int]:
    """Dispatch: greedy at ``temperature == 0``, lossless sampling otherwise."""
    if temperature <= 0:
        return greedy_accept(draft_tokens, target_logits)
    return speculative_accept(draft_tokens, target_logits, temperature, generator, draft_probs)
