"""EAGLE-3 drafting: dynamic token trees (EAGLE-2) or chains, from one autoregressive drafter layer.

Semantics (docs/method.md §6.1): the drafter consumes pairs ``(g_t, x_{t+1})`` (target feature at
position t, token at t + 1) and its output ``a_t`` predicts ``x_{t+2}``. After a verify round, target features
exist up to the last accepted position ``P - 1`` and the bonus token ``x_P`` is known, so the pair
``(g_{P-1}, x_P)`` yields the first tree level (guesses of ``x_{P+1}``). Deeper levels replace the unknown target
feature by the drafter's own output (training-time test): a node at token position ``P + d`` is expanded with
the pair ``(a of the step that produced it, its token)`` at RoPE position ``P + d - 1``, attending to the
committed context and to its own ancestors only.

Tree growth (EAGLE ``topK_genrate``): scores are cumulative draft log-probabilities; each level expands the
``topk`` best frontier nodes into ``topk`` children each, keeps all ``topk**2`` candidates, and picks the best
``topk`` as the next frontier; after ``depth`` levels the best ``num_tokens - 1`` nodes (an ancestor-closed set)
form the tree the target verifies. ``topk = 1`` gives a chain of ``depth`` drafts.
"""

from __future__ import annotations

import torch

from .proposers import Draft, TreeDraft


class Eagle3Proposer:
    """Tree (or chain) drafting with an :class:`~dscout.models.eagle3.Eagle3Drafter`.

    Args:
        drafter: the EAGLE-3 drafter with its target attached.
        topk: children per expanded node (10 for "EAGLE-3(60)"; 1 = chain).
        depth: tree levels (draft forward passes), SGLang's ``--speculative-num-steps``.
    The number of verified tokens (root included) is the engine's block size (60 for EAGLE-3(60)).
    """

    def __init__(self, drafter, topk: int = 10, depth: int = 7):
        self.drafter = drafter.eval()
        self.topk, self.depth = int(topk), int(depth)
        self.layer_ids = list(drafter.config.target_layer_ids)
        self.max_block_size = 10 ** 6  # the tree size is the engine's choice
        self._cache = None
        self._tokens: list[int] = []
        self._pending: list[torch.Tensor] = []  # target features whose pair was not fed yet
        self._fed = 0  # pairs in the drafter cache (= positions 0 .. _fed - 1)

    @torch.no_grad()
    def start(self, context_taps: torch.Tensor, token_ids: torch.Tensor) -> None:
        self._cache = self.drafter.new_cache()
        self._tokens = [int(t) for t in token_ids.tolist()]
        self._pending = list(context_taps)
        self._fed = 0

    @torch.no_grad()
    def commit(self, taps: torch.Tensor, token_ids: torch.Tensor) -> None:
        self._tokens.extend(int(t) for t in token_ids.tolist())
        self._pending.extend(list(taps))

    @torch.no_grad()
    def _feed_pending(self, last_token: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed every pending pair (g_t, x_{t+1}); return the last pair's ``(a, log-probs over V_d)``."""
        dev = self.drafter.fc.weight.device
        n = len(self._pending)
        t0 = self._fed
        nxt = [self._tokens[t + 1] if t + 1 < len(self._tokens) else last_token for t in range(t0, t0 + n)]
        feats = torch.stack(self._pending).unsqueeze(0).to(dev)
        ids = torch.tensor([nxt], device=dev)
        pos = torch.arange(t0, t0 + n, device=dev).unsqueeze(0)
        a, logits = self.drafter(ids, feats, pos, past_key_values=self._cache)
        self._fed += n
        self._pending = []
        return a[0, -1], torch.log_softmax(logits[0, -1].float(), -1)

    @torch.no_grad()
    def propose(self, last_token: int, position: int, num_drafts: int, temperature: float = 0.0,
                generator=None):
        """Draft a tree of at most ``num_drafts`` nodes for the tokens after ``last_token`` (at ``position``).

        Raises:
            ValueError: if the bookkeeping is off (``position`` must be the number of committed tokens).
        """
        if position != len(self._tokens):
            raise ValueError(f"EAGLE-3 context has {len(self._tokens)} tokens, block starts at {position}")
        d = self.drafter
        dev = d.fc.weight.device
        a_root, logp = self._feed_pending(last_token)
        context = self._cache.get_seq_length()
        k = max(1, min(self.topk, num_drafts))
        depth = max(1, min(self.depth, num_drafts))
        # nodes: token (target id), parent, score, producing hidden
        tokens, parents, scores, hiddens = [], [], [], []
        top = torch.topk(logp, k)
        for s, i in zip(top.values.tolist(), d.to_target_ids(top.indices).tolist()):
            tokens.append(int(i))
            parents.append(-1)
            scores.append(s)
            hiddens.append(a_root)
        frontier = list(range(len(tokens)))
        fed_nodes: list[int] = []  # tree nodes whose pair is in the cache, in cache order
        for level in range(1, depth):
            if not frontier:
                break
            f = len(frontier)
            ids = torch.tensor([[tokens[n] for n in frontier]], device=dev)
            hid = torch.stack([hiddens[n] for n in frontier]).unsqueeze(0)
            pos = torch.full((1, f), position + level - 1, device=dev)
            # each frontier node sees the committed context, its fed ancestors and itself
            mask = torch.zeros(1, 1, f, context + len(fed_nodes) + f, dtype=torch.bool, device=dev)
            mask[..., :context] = True
            for qi, n in enumerate(frontier):
                anc, p = set(), parents[n]
                while p >= 0:
                    anc.add(p)
                    p = parents[p]
                for ci, m in enumerate(fed_nodes):
                    if m in anc:
                        mask[0, 0, qi, context + ci] = True
                mask[0, 0, qi, context + len(fed_nodes) + qi] = True
            a, logits = d(ids, hid, pos, attention_mask=mask, past_key_values=self._cache)
            fed_nodes.extend(frontier)
            lp = torch.log_softmax(logits[0].float(), -1)
            cand = []
            for qi, n in enumerate(frontier):
                t = torch.topk(lp[qi], k)
                for s, i in zip(t.values.tolist(), d.to_target_ids(t.indices).tolist()):
                    cand.append((scores[n] + s, n, int(i), a[0, qi]))
            start = len(tokens)
            for s, n, tok, h in cand:
                tokens.append(tok)
                parents.append(n)
                scores.append(s)
                hiddens.append(h)
            order = sorted(range(start, len(tokens)), key=lambda j: -scores[j])
            frontier = order[:k]
        if fed_nodes:
            self._cache.crop(-len(fed_nodes))  # drop the tree's pairs: only committed context stays
        keep = self._select(scores, parents, num_drafts)
        remap = {old: new for new, old in enumerate(keep)}
        out_tokens = torch.tensor([tokens[j] for j in keep], dtype=torch.long)
        out_parents = torch.tensor([remap[parents[j]] if parents[j] >= 0 else -1 for j in keep], dtype=torch.long)
        if self.topk == 1:  # a chain: verify it with the chain rule (cheaper bookkeeping, same result)
            return Draft(out_tokens)
        return TreeDraft(out_tokens, out_parents)

    @staticmethod
    def _select(scores: list[float], parents: list[int], budget: int) -> list[int]:
        """Best ``budget`` nodes by score, closed under ancestors, in topological order (parents first)."""
        chosen: set[int] = set()
        for j in sorted(range(len(scores)), key=lambda j: -scores[j]):
            if len(chosen) >= budget:
                break
            path, p = [], j
            while p >= 0 and p not in chosen:
                path.append(p)
                p = parents[p]
            if len(chosen) + len(path) <= budget:
                chosen.update(path)
        return sorted(chosen)  # children always come after their parents in creation order
