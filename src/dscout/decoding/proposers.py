"""Proposers: what drafts a round's tokens. The engine owns verification; a proposer only drafts.

A proposer has three calls, made by :class:`~dscout.decoding.engine.SpeculativeEngine`:

* ``start(context_taps, token_ids)`` after the target prefill, with the prompt's target taps ``[n, t * D]``
  and its token ids ``[n]``;
* ``propose(last_token, position, num_drafts, temperature, generator) -> Draft | TreeDraft``;
* ``commit(taps, token_ids)`` after verification, with the taps ``[m, t * D]`` and ids ``[m]`` of the ``m``
  committed positions (the round's input token and the accepted drafts; not the bonus, whose state the next
  verify computes).

``layer_ids`` tells the engine which target layers to tap (empty for proposers that need no features).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass
class TreeDraft:
    """A token tree (EAGLE-style): node i has token ``tokens[i]`` and parent ``parents[i]`` (-1 = the round's
    root token, otherwise an earlier node). Verified in one target forward with a tree attention mask.

    Attributes:
        tokens: ``[n]``; parents: ``[n]`` long, topologically ordered.
    """

    tokens: torch.Tensor
    parents: torch.Tensor


@dataclass
class Draft:
    """A chain of drafts.

    Attributes:
        tokens: ``[k]`` draft token ids.
        probs: ``[k, V]`` the distributions they were sampled from, or None when drafted greedily
            (verification then treats q as one-hot).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None


class BlockDiffusionProposer:
    """DFlash/DScout block-diffusion drafting: ``bs - 1`` drafts from one drafter forward.

    Per round (docs/method.md §4): pending context taps are fused and their K/V written to the drafter's
    cache; the block ``[x, MASK * (bs - 1)]`` at positions ``P .. P + bs - 1`` attends to all cached context and to
    itself; the block's K/V are dropped again; drafts are the argmax (or a sample) at offsets ``1 .. bs - 1``.

    Args:
        drafter: a :class:`~dscout.models.drafter.DFlashDrafter` with its target attached.
        sample_drafts: at temperature > 0, sample drafts from the drafter's distribution (and hand q to the
            verifier) instead of drafting greedily (upstream default: greedy, still lossless).
    """

    def __init__(self, drafter, sample_drafts: bool = False):
        self.drafter = drafter.eval()
        self.sample_drafts = sample_drafts
        self.layer_ids = list(drafter.config.target_layer_ids)
        self.max_block_size = int(drafter.config.block_size)
        self.mask_token_id = int(drafter.config.mask_token_id)
        self._cache = None
        self._next_pos = 0

    @torch.no_grad()
    def start(self, context_taps: torch.Tensor, token_ids: torch.Tensor | None = None) -> None:
        """Reset and write the prompt's context K/V (``[n, t * D]``) into a fresh drafter cache."""
        self._cache = DynamicCache()
        self._next_pos = 0
        self._materialize(context_taps)

    @torch.no_grad()
    def commit(self, taps: torch.Tensor, token_ids: torch.Tensor | None = None) -> None:
        """Add the committed positions' taps ``[m, t * D]`` to the drafter context (token ids unused)."""
        self._materialize(taps)

    def _materialize(self, taps: torch.Tensor) -> None:
        m = taps.shape[0]
        if m == 0:
            return
        pos = torch.arange(self._next_pos, self._next_pos + m, device=taps.device).unsqueeze(0)
        self.drafter.materialize_context(taps.unsqueeze(0), pos, self._cache)
        self._next_pos += m

    @torch.no_grad()
    def propose(self, last_token: int, position: int, num_drafts: int, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> Draft:
        """Draft ``num_drafts`` tokens after ``last_token`` (which sits at absolute ``position``).

        Raises:
            ValueError: if ``num_drafts + 1`` exceeds the drafter's trained block size, or if the context
                does not end right before ``position`` (a bookkeeping error).
        """
        bs = num_drafts + 1
        if bs > self.max_block_size:
            raise ValueError(f"block size {bs} exceeds the drafter's trained horizon {self.max_block_size}")
        if position != self._next_pos:
            raise ValueError(f"drafter context ends at {self._next_pos}, block starts at {position}")
        dev = self.drafter.fc.weight.device
        ids = torch.full((1, bs), self.mask_token_id, dtype=torch.long, device=dev)
        ids[0, 0] = last_token
        pos = torch.arange(position, position + bs, device=dev).unsqueeze(0)
        hidden = self.drafter(ids, pos, past_key_values=self._cache)
        logits = self.drafter.compute_logits(hidden[0, 1:]).float()  # over the draft vocabulary
        if temperature > 0 and self.sample_drafts:
            probs = torch.softmax(logits / temperature, dim=-1)
            picks = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            if self.drafter.config.draft_vocab_size is not None:  # q over the target's vocabulary: 0 elsewhere
                full = probs.new_zeros(probs.shape[0], self.drafter.config.vocab_size)
                full[:, self.drafter.draft_token_ids] = probs
                probs = full
            return Draft(self.drafter.to_target_ids(picks), probs)
        return Draft(self.drafter.to_target_ids(logits.argmax(-1)))
