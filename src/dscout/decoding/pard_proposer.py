"""PARD-2 drafting: k drafts from ONE forward of a small same-family LM over the pending real tokens plus
``k - 1`` mask tokens, with the target's features added to the input embeddings (docs/method.md §6.2).

Bookkeeping per round (AMD-AGI/PARD ``pard2_infer.py`` loop, re-expressed for our engine): the drafter cache
holds real tokens only. Pending real tokens (committed since the last draft call) are fed with their *input*
features, i.e. the target feature of the token before each one; the round's root token ``x`` goes last, with
the feature of the last committed token. After verification the accepted drafts become the next pending
tokens, and the features of the committed positions are known from the verify pass.
"""

from __future__ import annotations

import torch

from .proposers import Draft


class Pard2Proposer:
    """Parallel drafting with a :class:`~dscout.models.pard.Pard2Drafter`.

    Args:
        drafter: the PARD-2 drafter (for the CPU target a layer-truncated copy of it).
        target: the :class:`~dscout.models.target.TargetModel` (its final norm turns taps into features).
        use_features: False = target-independent mode (PARD-2's ``--p2``; features zeroed).
    """

    def __init__(self, drafter, target, use_features: bool = True):
        self.drafter = drafter.eval()
        self.final_norm = target.final_norm
        self.use_features = use_features
        self.layer_ids = list(drafter.tap_layer_ids)
        self.max_block_size = 10 ** 6
        self._cache = None

    def _features(self, taps: torch.Tensor) -> torch.Tensor:
        return self.drafter.features_from_taps(taps.to(self.drafter.dtype), self.final_norm)

    @torch.no_grad()
    def start(self, context_taps: torch.Tensor, token_ids: torch.Tensor) -> None:
        feats = self._features(context_taps)
        self._cache = self.drafter.new_cache()
        self._pending_ids = token_ids.tolist()
        zero = torch.zeros_like(feats[:1])
        self._pending_feats = torch.cat([zero, feats[:-1]])  # token i's input = feature of token i - 1
        self._last_feat = feats[-1:]  # input feature of the next real token (the round's root)
        self._fed = 0

    @torch.no_grad()
    def commit(self, taps: torch.Tensor, token_ids: torch.Tensor) -> None:
        """``taps``/``token_ids``: the root x and the accepted drafts; x itself was already fed."""
        feats = self._features(taps)
        ids = token_ids.tolist()
        self._pending_ids = ids[1:]
        self._pending_feats = feats[:-1]
        self._last_feat = feats[-1:]

    @torch.no_grad()
    def propose(self, last_token: int, position: int, num_drafts: int, temperature: float = 0.0,
                generator=None) -> Draft:
        """One forward: pending real tokens + the root ``last_token`` + ``num_drafts - 1`` masks.

        Raises:
            ValueError: if the drafter cache and ``position`` disagree (bookkeeping error).
        """
        dev = self.drafter.device
        ids = self._pending_ids + [last_token]
        if self._fed + len(ids) != position + 1:
            raise ValueError(f"PARD-2 cache holds {self._fed} tokens, {len(ids)} pending, root at {position}")
        feats = torch.cat([self._pending_feats, self._last_feat]).unsqueeze(0).to(dev) if self.use_features else None
        drafts = self.drafter.draft(torch.tensor([ids], device=dev), feats, k=num_drafts, past_key_values=self._cache)
        self._fed += len(ids)
        self._pending_ids, self._pending_feats = [], self._pending_feats[:0]
        return Draft(drafts)
