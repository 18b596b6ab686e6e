"""Training blocks: anchor sampling, block inputs and the multi-block attention mask.

Many blocks of one sequence are trained in a single drafter forward (docs/method.md §3). Block ``n``
starts at an anchor ``a_n`` (a known-correct response token) and covers positions ``a_n .. a_n + B - 1``;
offset ``k`` of the block predicts the token at ``a_n + k`` (same position, no shift). A block query sees

* context key ``j`` iff ``j < a_n`` (strict: at inference the anchor's own target state is not yet known),
* every key of its own block (bidirectional),
* nothing else: no other block, so overlapping anchors cannot leak labels (SpecForge #470).

The historical SpecForge bugs this layout avoids (docs/method.md §3): causal in-block mask (#427), labels
shifted by one and the anchor's own context visible (#473), visibility decided by block index (#470).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TrainingBlocks:
    """All blocks of a micro-batch, flattened per sequence to ``Q = N * B`` block tokens.

    Attributes:
        anchors: ``[b, N]`` anchor positions (0 where unused).
        keep: ``[b, N]`` bool, False for unused anchor slots.
        positions: ``[b, N, B]`` absolute position ``a_n + k`` of every block token.
        labels: ``[b, N, B]`` the token at that position (the target-generated text), clamped in range.
        label_mask: ``[b, N, B]`` bool: a real, supervised response token at ``k >= 1`` of a kept block.
        revealed: ``[b, N, B]`` bool: position given to the drafter as context (anchor always; more under
            intra-block unmasking). Revealed positions are never in the loss.
        block_ids: ``[b, N, B]`` drafter input: the label where revealed, the mask token elsewhere.
        block_size: B.
    """

    anchors: torch.Tensor
    keep: torch.Tensor
    positions: torch.Tensor
    labels: torch.Tensor
    label_mask: torch.Tensor
    revealed: torch.Tensor
    block_ids: torch.Tensor
    block_size: int

    @property
    def num_blocks(self) -> int:
        return self.anchors.shape[1]


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw anchor positions uniformly without replacement among response tokens.

    A candidate anchor ``a`` is a response token whose successor is a response token too
    (``m[a] = m[a+1] = 1``, the SpecForge-HEAD rule), so every block has at least one supervised position;
    positions beyond the sequence are dropped later by the inclusion mask, whatever the horizon.

    Args:
        loss_mask: ``[b, S]`` 1 on response (assistant) tokens.
        num_anchors: upper bound N on anchors per sequence.
        generator: torch RNG (per-step seeded, so a resumed run draws the same anchors).
    Returns:
        ``anchors [b, N]`` sorted ascending per row (0 in unused slots) and ``keep [b, N]`` bool, where
        ``N = min(num_anchors, max_b count_b)``.
    Raises:
        ValueError: if no sequence of the batch has a candidate anchor (too-short responses).
    """
    m = loss_mask.bool()
    cand = m[:, :-1] & m[:, 1:]
    counts = cand.sum(1)
    n = int(min(num_anchors, int(counts.max()) if counts.numel() else 0))
    if n <= 0:
        raise ValueError("no sequence in this batch has two consecutive response tokens to anchor a block")
    b, s1 = cand.shape
    keys = torch.rand(b, s1, generator=generator)
    keys = torch.where(cand, keys, torch.full_like(keys, 2.0))  # non-candidates sort last
    picked = keys.argsort(dim=1)[:, :n]
    keep = torch.gather(cand, 1, picked)
    picked = torch.where(keep, picked, torch.full_like(picked, s1 + 1))  # unused slots sort last
    anchors, order = picked.sort(dim=1)
    keep = torch.gather(keep, 1, order)
    anchors = torch.where(keep, anchors, torch.zeros_like(anchors))
    return anchors, keep


def reveal_positions(shape: tuple[int, int, int], p_full: float, beta_a: float, beta_b: float,
                     generator: torch.Generator) -> torch.Tensor:
    """Intra-block unmasking: which block offsets are revealed as context (docs/method.md §3, prediction factor).

    With probability ``p_full`` a block stays fully masked (only the anchor is known). Otherwise a mask rate
    ``r ~ Beta(beta_a, beta_b)`` is drawn, ``max(1, round(r * (B - 1)))`` of the ``B - 1`` non-anchor offsets
    stay masked (a uniform random subset) and the complementary subset is revealed.

    Args:
        shape: ``(b, N, B)``.
        generator: torch RNG.
    Returns:
        ``[b, N, B]`` bool, True = revealed; offset 0 (the anchor) is always True.
    """
    b, n, B = shape
    revealed = torch.zeros(shape, dtype=torch.bool)
    revealed[..., 0] = True
    if B < 2:
        return revealed
    full = torch.rand(b, n, generator=generator) < p_full
    # Beta(a, b) from two Gammas, drawn with the same generator for reproducibility.
    ga = torch._standard_gamma(torch.full((b, n), float(beta_a)), generator=generator)
    gb = torch._standard_gamma(torch.full((b, n), float(beta_b)), generator=generator)
    rate = ga / (ga + gb)
    n_masked = torch.clamp(torch.round(rate * (B - 1)), min=1, max=B - 1).long()
    keys = torch.rand(b, n, B - 1, generator=generator)
    ranks = keys.argsort(-1).argsort(-1)  # random permutation rank of each offset
    masked = ranks < n_masked.unsqueeze(-1)
    revealed[..., 1:] = ~masked & ~full.unsqueeze(-1)
    return revealed


def build_blocks(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, keep: torch.Tensor,
                 block_size: int, mask_token_id: int, revealed: torch.Tensor | None = None) -> TrainingBlocks:
    """Assemble block inputs and labels for the anchors (docs/method.md §3).

    Args:
        input_ids: ``[b, S]`` training sequence (prompt + target-generated response, right-padded).
        loss_mask: ``[b, S]`` 1 on response tokens.
        anchors, keep: from :func:`sample_anchors`.
        block_size: B for this update.
        mask_token_id: the drafter's mask token.
        revealed: ``[b, N, B]`` from :func:`reveal_positions`, or None (all non-anchor offsets masked).
    Returns:
        :class:`TrainingBlocks`.
    """
    b, S = input_ids.shape
    N = anchors.shape[1]
    k = torch.arange(block_size)
    positions = anchors.unsqueeze(-1) + k  # [b, N, B]
    in_range = positions < S
    pos_c = positions.clamp(max=S - 1)
    flat = pos_c.view(b, -1)
    labels = torch.gather(input_ids, 1, flat).view(b, N, block_size)
    real = torch.gather(loss_mask.bool(), 1, flat).view(b, N, block_size) & in_range
    label_mask = real & keep.unsqueeze(-1) & (k >= 1)
    if revealed is None:
        revealed = torch.zeros(b, N, block_size, dtype=torch.bool)
        revealed[..., 0] = True
    else:
        revealed = revealed.clone()
        revealed[..., 1:] &= real[..., 1:]  # reveal only real response tokens
        revealed[..., 0] = True
    block_ids = torch.where(revealed, labels, torch.full_like(labels, mask_token_id))
    return TrainingBlocks(anchors=anchors, keep=keep, positions=positions, labels=labels,
                          label_mask=label_mask & ~revealed, revealed=revealed, block_ids=block_ids,
                          block_size=block_size)


def block_attention_mask(anchors: torch.Tensor, keep: torch.Tensor, seq_len: int, block_size: int
                         ) -> torch.Tensor:
    """Dense boolean mask for many blocks in one forward (docs/method.md §3).

    Keys are ``[S context tokens ; N * B block tokens]``. A query of block ``n`` may see context key ``j``
    iff ``j < a_n`` (and the block is kept), and every key of block ``n``; nothing else. Unused blocks see
    only themselves (their rows would otherwise be empty and give NaN; they carry no loss).

    Args:
        anchors, keep: ``[b, N]``.
        seq_len: S.
        block_size: B.
    Returns:
        ``[b, 1, N * B, S + N * B]`` bool, True = may attend.
    """
    b, N = anchors.shape
    B = block_size
    ctx = torch.arange(seq_len).view(1, 1, seq_len) < anchors.unsqueeze(-1)  # [b, N, S]
    ctx = ctx & keep.unsqueeze(-1)
    ctx = ctx.unsqueeze(2).expand(b, N, B, seq_len).reshape(b, N * B, seq_len)
    blk_id = torch.arange(N * B) // B
    same = (blk_id.view(-1, 1) == blk_id.view(1, -1)).unsqueeze(0).expand(b, -1, -1)
    return torch.cat([ctx, same], dim=-1).unsqueeze(1)
