"""Proposers: what drafts a round's tokens. The engine owns verification; a proposer only drafts.

A proposer has three calls, made by :class:`~dscout.decoding.engine.SpeculativeEngine`:

* ``start(context_taps, token_ids)`` after the target prefill, with the prompt's target taps ``[n, t * D]``
  and its token ids ``[n]``;
* ``propose(last_token, position, num_drafts, temperature, generator) -> Draft | TreeDraft``;
* ``commit(taps, token_ids)`` after verification, with the taps ``[m, t * D]`` and ids ``[m]`` of the ``m``
  committed positions (the round's input token and the accepted drafts; not the bonus, whose state the next
  verify computes).

``layer_ids`` tells the engine which target layers to tap (empty for proposers that need no features).

A proposer that can draft a whole batch in one forward also has ``batched()``, returning a
:class:`BatchedBlockDiffusionProposer`-like object (``start(taps [B, P, t * D], valid [B, P])``,
``propose(last_tokens, positions, num_drafts)``, ``commit(row, taps)``, ``end_round()``, ``pending_tokens``), which
:class:`~dscout.decoding.batched.BatchedSpeculativeEngine` then uses instead of one proposer per request.
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


class BatchedBlockDiffusionProposer:
    """DFlash/DScout block-diffusion drafting for ``B`` requests at once: one drafter forward per round.

    The ``B`` requests share one drafter ``DynamicCache`` of batch ``B``; ragged contexts are **padded**: every
    write appends the same number of slots to every row, and a boolean key mask ``[B, S]`` marks the slots that
    hold a committed token of that row. Padding slots keep whatever K/V they got and are masked out of every
    later attention; RoPE positions come from each row's own context length. So each row's block attends to
    exactly the keys (and positions) it would attend to alone, and its drafts equal the single-request drafts up
    to floating-point reassociation. (Packing the rows into one sequence with a block-diagonal mask avoids the
    padding but makes attention cost ``(B * Q) x (sum of contexts)``, B times the padded layout's; measured in
    ``benchmarks/batched_drafting.py``.)

    **Deferred commits.** :meth:`commit` only keeps a request's committed taps (no drafter work). The kept taps
    are written into the cache by the next :meth:`propose`, fused into its forward as new context
    (:meth:`DFlashDrafter.forward` writes ``context_taps`` K/V and drops the block's), or by :meth:`flush`. A
    round that does not draft therefore costs the drafter nothing; resuming after ``k`` such rounds writes the
    ``k`` rounds' taps in one pass (the catch-up), with the same K/V as writing them round by round: a context
    token's K/V depend only on its own taps and position (docs/method.md §2).
    With ``defer_commits=False`` every :meth:`end_round` writes the round's taps (one batched pass), as before.

    Args:
        drafter: a :class:`~dscout.models.drafter.DFlashDrafter` with its target attached.
        sample_drafts: at temperature > 0, sample drafts from the drafter's distribution (q handed to the
            verifier) instead of drafting greedily (upstream default: greedy, still lossless).
        defer_commits: keep committed taps until the next draft (default) or write them every round.
    """

    def __init__(self, drafter, sample_drafts: bool = False, defer_commits: bool = True):
        self.drafter = drafter.eval()
        self.sample_drafts = sample_drafts
        self.defer_commits = defer_commits
        self.layer_ids = list(drafter.config.target_layer_ids)
        self.max_block_size = int(drafter.config.block_size)
        self.mask_token_id = int(drafter.config.mask_token_id)
        self._cache = None
        self._keys = None  # [B, S] bool: which cache slots hold a committed context token, None = all of them
        self._next_pos: list[int] = []
        self._pending: list[list[torch.Tensor]] = []

    @property
    def batch_size(self) -> int:
        return len(self._next_pos)

    @property
    def pending_tokens(self) -> int:
        """Committed tokens not yet written into the drafter cache, most over the rows (the catch-up width)."""
        return max((sum(t.shape[0] for t in p) for p in self._pending), default=0)

    def context_length(self, row: int = 0) -> int:
        """Tokens of ``row`` written into the drafter cache or waiting to be (= the position of its next token)."""
        return self._next_pos[row] + sum(t.shape[0] for t in self._pending[row])

    @torch.no_grad()
    def start(self, context_taps: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """Reset and write the prompts' context K/V into a fresh cache, one pass.

        Args:
            context_taps: ``[B, P, t * D]`` target taps of the (left-padded) prompts.
            valid: ``[B, P]`` bool, True at real prompt tokens (default: all); positions count real tokens only.
        """
        B, P = context_taps.shape[:2]
        dev = context_taps.device
        self._cache = DynamicCache()
        self._pending = [[] for _ in range(B)]
        if valid is None:
            self._keys = None
            self._next_pos = [P] * B
            pos = torch.arange(P, device=dev).expand(B, P)
        else:
            valid = valid.to(dev, torch.bool)
            self._keys = None if bool(valid.all()) else valid.clone()
            self._next_pos = valid.sum(-1).tolist()
            pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
        if P:
            self.drafter.materialize_context(context_taps, pos, self._cache)

    def commit(self, row: int, taps: torch.Tensor) -> None:
        """Keep the committed positions' taps ``[m, t * D]`` of request ``row`` for the next write (no drafter work)."""
        if taps.shape[0]:
            self._pending[row].append(taps)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows ``rows`` (``[n]`` long, ascending), in that order: finished requests leave the
        batch (the drafter cache, its key mask, positions and kept taps are cut to the ``n`` rows; row ``j`` of
        later calls is old row ``rows[j]``). The remaining rows' drafts are unchanged: rows never attend each other.
        """
        keep = rows.tolist()
        if self._cache is not None:
            self._cache.batch_select_indices(rows)
        if self._keys is not None:
            self._keys = self._keys[rows.to(self._keys.device)]
        self._next_pos = [self._next_pos[i] for i in keep]
        self._pending = [self._pending[i] for i in keep]

    def end_round(self) -> None:
        """Called once per round after every :meth:`commit`: writes the round's taps unless commits are deferred."""
        if not self.defer_commits:
            self.flush()

    def _take_pending(self, dev):
        """Pad the kept taps to ``[B, M, t * D]``; return them, their positions ``[B, M]`` and validity ``[B, M]``."""
        counts = [sum(t.shape[0] for t in p) for p in self._pending]
        M = max(counts, default=0)
        if M == 0:
            return None, None, None, counts
        ref = next(t for p in self._pending for t in p)
        taps = ref.new_zeros(len(counts), M, ref.shape[-1])
        for i, p in enumerate(self._pending):
            if counts[i]:
                taps[i, :counts[i]] = torch.cat(p) if len(p) > 1 else p[0]
        starts = torch.tensor(self._next_pos, device=dev).view(-1, 1)
        pos = starts + torch.arange(M, device=dev).view(1, -1)
        valid = torch.arange(M, device=dev).view(1, -1) < torch.tensor(counts, device=dev).view(-1, 1)
        return taps.to(dev), pos, valid, counts

    def _append_keys(self, valid: torch.Tensor, cached: int) -> None:
        if self._keys is None and bool(valid.all()):
            return
        if self._keys is None:
            self._keys = torch.ones(valid.shape[0], cached, dtype=torch.bool, device=valid.device)
        self._keys = torch.cat([self._keys, valid], dim=1)

    def _advance(self, counts: list[int]) -> None:
        self._next_pos = [n + m for n, m in zip(self._next_pos, counts)]
        self._pending = [[] for _ in counts]

    @torch.no_grad()
    def flush(self) -> None:
        """Write every row's kept taps into the cache now, one batched pass (no-op when none are kept)."""
        dev = self.drafter.fc.weight.device
        taps, pos, valid, counts = self._take_pending(dev)
        if taps is None:
            return
        cached = self._cache.get_seq_length()
        self.drafter.materialize_context(taps, pos, self._cache)
        self._append_keys(valid, cached)
        self._advance(counts)

    @torch.no_grad()
    def propose(self, last_tokens: list[int], positions: list[int], num_drafts: list[int], temperature: float = 0.0,
                generator: torch.Generator | None = None) -> list[Draft | None]:
        """Draft ``num_drafts[i]`` tokens after ``last_tokens[i]`` (at absolute ``positions[i]``) for every row, in
        one drafter forward that also writes the rows' kept taps (the catch-up).

        Row i's block is ``[x_i, MASK * num_drafts[i]]``; shorter blocks are padded and masked (the block attends
        non-causally to itself, so a padded mask token would change the drafts otherwise). Rows with 0 drafts
        get None (their kept taps are still written).

        Returns:
            per row, a :class:`Draft` (``[k]`` tokens; ``probs`` ``[k, V]`` when sampling drafts) or None.
        Raises:
            ValueError: if a block exceeds the drafter's trained horizon or a row's context does not end right
                before its position (a bookkeeping error).
        """
        B = self.batch_size
        if not (len(last_tokens) == len(positions) == len(num_drafts) == B):
            raise ValueError(f"propose needs one token, position and draft count per row ({B} rows)")
        Q = 1 + max(num_drafts)
        if Q > self.max_block_size:
            raise ValueError(f"block size {Q} exceeds the drafter's trained horizon {self.max_block_size}")
        for i in range(B):
            if num_drafts[i] > 0 and positions[i] != self.context_length(i):
                raise ValueError(f"row {i}: drafter context ends at {self.context_length(i)}, "
                                 f"block starts at {positions[i]}")
        if Q == 1:
            return [None] * B
        dev = self.drafter.fc.weight.device
        taps, ctx_pos, ctx_valid, counts = self._take_pending(dev)
        M = 0 if taps is None else taps.shape[1]
        ids = torch.full((B, Q), self.mask_token_id, dtype=torch.long, device=dev)
        ids[:, 0] = torch.tensor(last_tokens, device=dev)
        pos = torch.tensor(positions, device=dev).view(-1, 1) + torch.arange(Q, device=dev).view(1, -1)
        sizes = torch.tensor([1 + k for k in num_drafts], device=dev).view(-1, 1)
        blk_valid = torch.arange(Q, device=dev).view(1, -1) < sizes  # [B, Q]; 0 drafts: the anchor alone
        cached = self._cache.get_seq_length()
        mask = None
        if self._keys is not None or (ctx_valid is not None and not bool(ctx_valid.all())) or not bool(blk_valid.all()):
            parts = [self._keys if self._keys is not None else torch.ones(B, cached, dtype=torch.bool, device=dev)]
            if ctx_valid is not None:
                parts.append(ctx_valid)
            parts.append(blk_valid)
            mask = torch.cat(parts, dim=1)[:, None, None, :].expand(B, 1, Q, -1)
        hidden = self.drafter(ids, pos, context_taps=taps, context_positions=ctx_pos, attention_mask=mask,
                              past_key_values=self._cache)
        if M:
            self._append_keys(ctx_valid, cached)
            self._advance(counts)
        rows = [i for i in range(B) if num_drafts[i] > 0]
        K = max(num_drafts)
        logits = self.drafter.compute_logits(hidden[rows, 1:K + 1] if len(rows) < B else hidden[:, 1:K + 1]).float()
        out: list[Draft | None] = [None] * B
        picks = None if temperature > 0 and self.sample_drafts else self.drafter.to_target_ids(logits.argmax(-1))
        for j, i in enumerate(rows):
            k = num_drafts[i]
            if picks is not None:
                out[i] = Draft(picks[j, :k])
                continue
            probs = torch.softmax(logits[j, :k] / temperature, dim=-1)
            draw = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            if self.drafter.config.draft_vocab_size is not None:  # q over the target's vocabulary: 0 elsewhere
                full = probs.new_zeros(probs.shape[0], self.drafter.config.vocab_size)
                full[:, self.drafter.draft_token_ids] = probs
                probs = full
            out[i] = Draft(self.drafter.to_target_ids(draw), probs)
        return out


class BlockDiffusionProposer:
    """DFlash/DScout block-diffusion drafting for one request: ``bs - 1`` drafts from one drafter forward.

    Per round (docs/method.md §4): the context taps committed since the last draft are fused and their K/V
    written to the drafter's cache, in the same forward as the block ``[x, MASK * (bs - 1)]`` at positions
    ``P .. P + bs - 1``, which attends to all cached context and to itself; the block's K/V are dropped again;
    drafts are the argmax (or a sample) at offsets ``1 .. bs - 1``. Commits are deferred (see
    :class:`BatchedBlockDiffusionProposer`, of which this is the one-row case): a round without drafts (bs 1
    chosen by the online controller) does no drafter work.

    Args:
        drafter: a :class:`~dscout.models.drafter.DFlashDrafter` with its target attached.
        sample_drafts: at temperature > 0, sample drafts from the drafter's distribution (and hand q to the
            verifier) instead of drafting greedily (upstream default: greedy, still lossless).
        defer_commits: False writes every commit at once (the pre-deferral behaviour; same drafts).
    """

    def __init__(self, drafter, sample_drafts: bool = False, defer_commits: bool = True):
        self._rows = BatchedBlockDiffusionProposer(drafter, sample_drafts, defer_commits)
        self.drafter = self._rows.drafter
        self.sample_drafts = sample_drafts
        self.defer_commits = defer_commits
        self.layer_ids = self._rows.layer_ids
        self.max_block_size = self._rows.max_block_size
        self.mask_token_id = self._rows.mask_token_id

    def batched(self) -> BatchedBlockDiffusionProposer:
        """A fresh proposer drafting every request of a batch in one forward (same drafter and options)."""
        return BatchedBlockDiffusionProposer(self.drafter, self.sample_drafts, self.defer_commits)

    @property
    def _cache(self):
        return self._rows._cache

    @property
    def pending_tokens(self) -> int:
        """Committed tokens whose K/V the next draft writes first (the catch-up)."""
        return self._rows.pending_tokens

    @torch.no_grad()
    def start(self, context_taps: torch.Tensor, token_ids: torch.Tensor | None = None) -> None:
        """Reset and write the prompt's context K/V (``[n, t * D]``) into a fresh drafter cache."""
        self._rows.start(context_taps.unsqueeze(0))

    @torch.no_grad()
    def commit(self, taps: torch.Tensor, token_ids: torch.Tensor | None = None) -> None:
        """Add the committed positions' taps ``[m, t * D]`` to the drafter context (token ids unused); kept until
        the next :meth:`propose` unless ``defer_commits`` is False."""
        self._rows.commit(0, taps)
        self._rows.end_round()

    def flush(self) -> None:
        """Write the kept taps now."""
        self._rows.flush()

    @torch.no_grad()
    def propose(self, last_token: int, position: int, num_drafts: int, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> Draft:
        """Draft ``num_drafts`` tokens after ``last_token`` (which sits at absolute ``position``).

        Raises:
            ValueError: if ``num_drafts + 1`` exceeds the drafter's trained block size, or if the context
                does not end right before ``position`` (a bookkeeping error).
        """
        if num_drafts + 1 > self.max_block_size:
            raise ValueError(f"block size {num_drafts + 1} exceeds the drafter's trained horizon {self.max_block_size}")
        if position != self._rows.context_length(0):
            raise ValueError(f"drafter context ends at {self._rows.context_length(0)}, block starts at {position}")
        if num_drafts < 1:
            return Draft(torch.empty(0, dtype=torch.long, device=self.drafter.fc.weight.device))
        return self._rows.propose([last_token], [position], [num_drafts], temperature, generator)[0]
