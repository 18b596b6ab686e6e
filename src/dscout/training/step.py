"""One training update's loss: blocks -> drafter forward -> factorized objective.

Kept free of DeepSpeed so it can be tested on its own; :mod:`dscout.training.trainer` wraps it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .blocks import TrainingBlocks, block_attention_mask, build_blocks, reveal_positions, sample_anchors
from .losses import (
    acceptance_probabilities,
    acceptance_weights,
    block_cross_entropy,
    distill_cross_entropy,
    expected_accept_length,
    factorized_objective,
    greedy_acceptance,
    positional_decay_weights,
    target_logprob_from_cache,
)
from .head import chunked_head_cross_entropy
from .recipes import Recipe


@dataclass
class FeatureBatch:
    """Target-side inputs of one micro-batch (from the feature cache or an online target forward).

    Attributes:
        input_ids: ``[b, S]`` prompt + response tokens, right-padded.
        loss_mask: ``[b, S]`` 1 on response tokens.
        taps: ``[b, S, t * D]`` concatenated target layer outputs (the drafter's context features).
        final_hidden: ``[b, S, D]`` target final-normed states (AWL only; may be None otherwise).
        lse: ``[b, S]`` log-sum-exp of target logits (AWL only; may be None otherwise).
    """

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    taps: torch.Tensor
    final_hidden: torch.Tensor | None = None
    lse: torch.Tensor | None = None


@dataclass
class BlockPlan:
    """The host-side (CPU) half of an update: which blocks, which rows carry loss, in what order.

    Everything data-dependent (anchor draws, reveal patterns, which block tokens are supervised) is decided here on
    small CPU integer tensors, so the device half (:func:`blocks_loss`) only gathers with index tensors of known
    length: no boolean-mask indexing and no host sync on the GPU, and it runs on fake tensors (the memory plan).

    Attributes:
        blocks: :class:`~dscout.training.blocks.TrainingBlocks` (CPU).
        seq_len: S.
        index: ``[M]`` long, flat index ``(row * N + block) * B + offset`` of each supervised block token.
        labels: ``[M]`` the target's token at each of them.
        rows: ``[M]`` the batch row; positions: ``[M]`` the absolute position.
        fully_masked: ``[b, N]`` bool, kept blocks with no revealed offset (the τ proxy's blocks).
    """

    blocks: TrainingBlocks
    seq_len: int
    index: torch.Tensor
    labels: torch.Tensor
    rows: torch.Tensor
    positions: torch.Tensor
    fully_masked: torch.Tensor

    @property
    def num_supervised(self) -> int:
        return int(self.index.numel())


def plan_blocks(input_ids: torch.Tensor, loss_mask: torch.Tensor, recipe: Recipe, num_anchors: int,
                generator: torch.Generator, mask_token_id: int, block_size: int | None = None) -> BlockPlan:
    """Draw one update's horizon, anchors and reveal pattern and list its supervised block tokens (on the CPU).

    Args:
        input_ids, loss_mask: ``[b, S]`` (any device; copied to the CPU).
        recipe, num_anchors, generator, block_size: as :func:`drafter_training_loss`.
        mask_token_id: the drafter's mask token.
    Returns:
        :class:`BlockPlan`.
    Raises:
        ValueError: if no sequence has two consecutive response tokens (:func:`sample_anchors`).
    Source: docs/method.md §3 (inclusion and prediction factors).
    """
    ids, lm = input_ids.cpu(), loss_mask.cpu()
    B = block_size or recipe.draw_horizon(generator)
    anchors, keep = sample_anchors(lm, num_anchors, generator)
    b, N = anchors.shape
    revealed = (reveal_positions((b, N, B), recipe.p_full, recipe.beta_a, recipe.beta_b, generator)
                if recipe.unmask else None)
    blocks = build_blocks(ids, lm, anchors, keep, B, mask_token_id, revealed)
    inc = blocks.label_mask
    return BlockPlan(blocks=blocks, seq_len=ids.shape[1], index=inc.reshape(-1).nonzero().squeeze(1),
                     labels=blocks.labels[inc], rows=torch.arange(b).view(b, 1, 1).expand(b, N, B)[inc],
                     positions=blocks.positions[inc],
                     fully_masked=~blocks.revealed[..., 1:].any(-1) & blocks.keep)


def drafter_training_loss(drafter, batch: FeatureBatch, recipe: Recipe, num_anchors: int,
                          generator: torch.Generator, block_size: int | None = None, distill_weight: float = 0.0,
                          attention: str = "auto", head_chunk_rows: int | None = None
                          ) -> tuple[torch.Tensor, dict]:
    """Loss of one update under ``recipe`` (docs/method.md §3): :func:`plan_blocks` then :func:`blocks_loss`.

    Args:
        drafter: a :class:`~dscout.models.drafter.DFlashDrafter` with the target attached.
        batch: :class:`FeatureBatch`.
        recipe: the three factor switches.
        num_anchors: blocks per sequence (upper bound).
        generator: RNG for horizon, anchors and reveal pattern (seed it per step for resumable runs).
        block_size: force B (else drawn from ``recipe.horizons``).
        distill_weight, attention, head_chunk_rows: see :func:`blocks_loss`.
    Returns:
        ``(loss, metrics)`` with metrics ``block_size``, ``accuracy`` (argmax == label over supervised
        offsets), ``tau_proxy`` (1 + mean correct prefix on training blocks), ``supervised`` (count), and
        ``mean_weight``.
    Raises:
        ValueError: if AWL or distillation is asked for without ``final_hidden``/``lse`` in the batch.
    """
    plan = plan_blocks(batch.input_ids, batch.loss_mask, recipe, num_anchors, generator,
                       drafter.config.mask_token_id, block_size)
    return blocks_loss(drafter, batch, plan, recipe, distill_weight=distill_weight, attention=attention,
                       head_chunk_rows=head_chunk_rows)


def blocks_loss(drafter, batch: FeatureBatch, plan: BlockPlan, recipe: Recipe, distill_weight: float = 0.0,
                attention: str = "auto", head_chunk_rows: int | None = None, metrics: bool = True
                ) -> tuple[torch.Tensor, dict]:
    """The device half of an update: drafter forward over the planned blocks and the factorized objective.

    Args:
        drafter: a :class:`~dscout.models.drafter.DFlashDrafter` with the target attached.
        batch: :class:`FeatureBatch` (``taps`` ``[b, S, t * D]`` on the training device; ``final_hidden``
            ``[b, S, D]`` and ``lse`` ``[b, S]`` for AWL / distillation).
        plan: :class:`BlockPlan` of this batch.
        recipe: the three factor switches (weighting is read here).
        distill_weight: lambda of the per-offset prediction loss ``(1 - lambda) CE(y) + lambda H(P, Q)``, with
            ``H(P, Q)`` the cross-entropy of the drafter against the target's full next-token distribution at
            that position (renormalised over the draft vocabulary), computed from the cached final states
            through the shared LM head. 0 = the paper's CE on the target's tokens only. An efficiency
            lever applied to every recipe alike (it changes the prediction factor's signal, not I or w).
        attention: ``sdpa`` (the dense ``[b, 1, Q, K]`` boolean mask, SDPA), ``flex`` (a ``BlockMask`` and
            ``flex_attention``: no materialised scores, :mod:`dscout.models.flex`), ``auto`` = flex on CUDA,
            sdpa elsewhere. Both give the same loss (tests/test_training_memory.py).
        head_chunk_rows: the LM-head terms (CE, AWL's greedy token and ``log Q``) through
            :func:`~dscout.training.head.chunked_head_cross_entropy` with this many rows per chunk; None = 256 MiB
            of float32 logits per chunk; 0 = the direct path (all supervised rows' logits at once; always used
            with ``distill_weight > 0``, which needs the full distributions).
        metrics: compute the logged metrics (host syncs); False returns only ``block_size`` and ``supervised``
            (the memory plan, on fake tensors that hold no values).
    Returns:
        ``(loss, metrics)`` as :func:`drafter_training_loss`.
    Raises:
        ValueError: for an unknown ``attention``, or AWL / distillation without ``final_hidden``/``lse``.
    Source: docs/method.md §3 (the objective ``sum(I w CE) / (sum(I w) + eps)``).
    """
    blocks = plan.blocks
    b, N = blocks.anchors.shape
    B, S = blocks.block_size, plan.seq_len
    dev = batch.taps.device
    if attention not in ("auto", "sdpa", "flex"):
        raise ValueError(f"attention must be 'auto', 'sdpa' or 'flex', got {attention!r}")
    if attention == "flex" or (attention == "auto" and dev.type == "cuda"):
        from ..models import flex

        mask = flex.block_mask(blocks.anchors.to(dev), blocks.keep.to(dev), S, B)
    else:
        mask = block_attention_mask(blocks.anchors, blocks.keep, S, B).to(dev)
    hidden = drafter(blocks.block_ids.view(b, N * B).to(dev), blocks.positions.view(b, N * B).to(dev),
                     context_taps=batch.taps, context_positions=torch.arange(S, device=dev).expand(b, S),
                     attention_mask=mask)
    # The LM head over the vocabulary dominates the step: compute logits only where the loss needs them
    # (supervised offsets). Anchors, revealed offsets and positions past the sequence carry no loss, and
    # AWL treats them as alpha = 1 (known tokens), or they come after every supervised offset.
    index = plan.index.to(dev)
    h_sel = hidden.reshape(b * N * B, -1).index_select(0, index)  # [M, D]
    draft_labels = drafter.to_draft_ids(plan.labels.to(dev))  # -1: outside a reduced draft vocabulary
    in_vocab = draft_labels >= 0
    if head_chunk_rows == 0 or distill_weight > 0:  # direct: every supervised row's logits at once
        logits = drafter.compute_logits(h_sel)  # [M, V_d]
        ce = block_cross_entropy(logits, draft_labels.clamp(min=0)) * in_vocab
        greedy, max_logq = None, None
    else:  # chunked: at most one chunk of float32 logits alive, in the forward and the backward
        w_head, b_head = drafter.head_rows()
        ce, greedy, max_logq = chunked_head_cross_entropy(h_sel, w_head, b_head, draft_labels.clamp(min=0),
                                                          head_chunk_rows)
        ce = ce * in_vocab
    needs_target = recipe.weighting == "awl" or distill_weight > 0
    if needs_target and (batch.final_hidden is None or batch.lse is None):
        raise ValueError("AWL and distillation need the target's final hidden states and log-sum-exp in the batch")
    if needs_target:  # batch row and absolute position of each supervised offset
        rows, positions = plan.rows.to(dev), plan.positions.to(dev)
    if distill_weight > 0:  # the target's logits at the position = its LM head over its state one step back
        prev = (positions - 1).clamp(min=0, max=S - 1)
        with torch.no_grad():
            target_logits = drafter.compute_logits(batch.final_hidden[rows, prev].to(hidden.dtype))
        ce = (1.0 - distill_weight) * ce + distill_weight * distill_cross_entropy(logits, target_logits)
    if recipe.weighting == "none":
        weights = torch.ones_like(ce)
    elif recipe.weighting == "decay":
        weights = positional_decay_weights(B, recipe.decay_gamma).to(dev).repeat(b * N).index_select(0, index)
    else:
        logprob_of = target_logprob_from_cache(batch.final_hidden, batch.lse, drafter._parts()[1].weight,
                                               rows, positions)
        if greedy is None:
            alpha_sel = acceptance_probabilities(logits, lambda y: logprob_of(drafter.to_target_ids(y)),
                                                 torch.zeros_like(ce, dtype=torch.bool))
        else:
            alpha_sel = greedy_acceptance(greedy, max_logq, lambda y: logprob_of(drafter.to_target_ids(y)))
        alpha = torch.ones(b * N * B, device=dev).index_copy(0, index, alpha_sel.reshape(-1).float())
        weights = acceptance_weights(alpha.view(b, N, B)).reshape(-1).index_select(0, index)
    loss = factorized_objective(ce, torch.ones_like(ce), weights)
    n_sup = plan.num_supervised
    if not metrics:
        return loss, {"block_size": B, "supervised": n_sup}
    with torch.no_grad():
        hit = ((logits.argmax(-1) if greedy is None else greedy) == draft_labels) & in_vocab
        correct = torch.zeros(b * N * B, dtype=torch.bool, device=dev).index_copy(0, index, hit).view(b, N, B)
        inclusion = blocks.label_mask.to(dev)
        acc = float(hit.sum()) / max(n_sup, 1)
        fully_masked = plan.fully_masked.to(dev)
        tau = expected_accept_length(correct[fully_masked], inclusion[fully_masked]) \
            if bool(plan.fully_masked.any()) else float("nan")
        mean_w = float(weights.sum()) / max(n_sup, 1)
    return loss, {"block_size": B, "accuracy": acc, "tau_proxy": tau, "supervised": n_sup,
                  "mean_weight": mean_w}
