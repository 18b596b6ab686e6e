"""Held-out drafter quality without decoding: per-offset top-1 accuracy and the greedy τ it implies.

Every response position of a held-out sequence anchors one fully masked block of ``B`` tokens, exactly as a draft
round sees it (context = the target's taps strictly before the anchor, the anchor token, ``B - 1`` masks). Offset
``k``'s draft is correct when the drafter's argmax equals the target's greedy token there. Because the responses
are the target's own greedy continuations, the longest correct prefix of a block is what greedy verification
would accept from that anchor, so ``τ(bs) = 1 + E[min(prefix, bs - 1)]`` is the greedy τ of block size ``bs``
averaged over anchor positions (the engine visits only the anchors its own rounds land on; the two agree up to
that sampling). Blocks that run past the end of a response count the missing offsets as rejections.

Used by ``benchmarks/drafter_efficiency.py`` to compare training levers at equal CPU time without timing noise.
"""

from __future__ import annotations

import torch

from ..training.blocks import block_attention_mask, build_blocks, sample_anchors


@torch.no_grad()
def offset_correctness(drafter, source, indices: list[int], block_size: int = 16,
                       dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Correctness of every fully masked block anchored on every response position of ``indices``.

    Args:
        drafter: a :class:`~dscout.models.drafter.DFlashDrafter` with its target attached.
        source: a training source (:class:`~dscout.training.features.FeatureCache`; ``len``, ``batch``).
        indices: the held-out sequence indices of ``source``.
        block_size: B of the evaluated blocks (at most the drafter's trained horizon).
        dtype: feature dtype handed to the drafter.
    Returns:
        ``[n_blocks, B - 1]`` bool: offset ``k = 1 .. B - 1`` drafted correctly (False past the sequence end).
    Raises:
        ValueError: if ``block_size`` exceeds the drafter's horizon.
    """
    if block_size > drafter.config.block_size:
        raise ValueError(f"block_size {block_size} exceeds the drafter's horizon {drafter.config.block_size}")
    was_training = drafter.training
    drafter.eval()
    rows = []
    gen = torch.Generator().manual_seed(0)  # anchor order only; every candidate is taken
    dev = drafter.fc.weight.device
    for i in indices:
        batch = source.batch([i], dtype, dev)
        anchors, keep = sample_anchors(batch.loss_mask, 1 << 20, gen)
        blocks = build_blocks(batch.input_ids, batch.loss_mask, anchors, keep, block_size,
                              drafter.config.mask_token_id, None)
        S = batch.input_ids.shape[1]
        b, N = anchors.shape
        mask = block_attention_mask(anchors, keep, S, block_size).to(dev)
        hidden = drafter(blocks.block_ids.view(b, N * block_size).to(dev),
                         blocks.positions.view(b, N * block_size).to(dev), context_taps=batch.taps,
                         context_positions=torch.arange(S, device=dev).expand(b, S), attention_mask=mask)
        hidden = hidden.view(b, N, block_size, -1)[:, :, 1:]
        pred = drafter.to_target_ids(drafter.compute_logits(hidden).argmax(-1))
        ok = (pred == blocks.labels[:, :, 1:].to(dev)) & blocks.label_mask[:, :, 1:].to(dev)
        rows.append(ok[keep.to(dev)].cpu())
    drafter.train(was_training)
    return torch.cat(rows) if rows else torch.zeros(0, block_size - 1, dtype=torch.bool)


def accuracy_and_tau(correct: torch.Tensor, block_sizes=(4, 8, 16)) -> dict:
    """Summaries of :func:`offset_correctness`: per-offset accuracy, and greedy τ per block size.

    Returns:
        ``{"offset_accuracy": [acc_1, ..., acc_{B-1}], "tau": {bs: τ}, "blocks": n}``.
    """
    acc = correct.float().mean(0).tolist() if len(correct) else []
    prefix = torch.cumprod(correct.int(), dim=1).sum(1)  # longest correct prefix per block
    taus = {int(bs): float(1 + prefix.clamp(max=bs - 1).float().mean()) for bs in block_sizes
            if bs - 1 <= correct.shape[1]}
    return {"offset_accuracy": acc, "tau": taus, "blocks": int(len(correct))}
