"""A batched draft-verify engine: c requests decoded together, ragged acceptance, one target verify per round.

Table 4 measures serving at concurrency c. On the cluster SGLang does it; on the CPU this engine does the same
work in one process: every round the active requests draft ``bs - 1`` tokens each, in **one** drafter forward over
the c blocks (:class:`~dscout.decoding.proposers.BatchedBlockDiffusionProposer`: padded ragged contexts, one shared
drafter cache with a key mask), then **one** target forward verifies all requests' blocks ``[c, bs]`` together.
Proposers without a batched form (oracles, replays) draft request after request (``batched_draft=False`` forces
that loop for block-diffusion proposers too: the pre-batching engine, kept for measurement).

The drafter's commits are deferred: after verification each request's committed taps are only kept, and the next
draft forward writes every request's kept taps first (one batched catch-up). A round in which the controller
chooses bs 1 therefore does no drafter work at all: it costs one target step, as AR.

Ragged acceptance without per-row cache surgery: the shared ``DynamicCache`` grows by ``bs`` slots per round for
every row, and a boolean key mask marks which slots hold committed tokens. Rejected drafts (and padding of
finished requests or shorter blocks) stay in the cache but are masked out of every later attention, and each
row's RoPE positions come from its own committed length, so each request sees exactly the keys and positions it
would see alone. Greedy output per request therefore equals AR up to floating-point near-ties (the verify of a
row runs in a wider matrix product). Greedy only (Table 4 is greedy).

Finished requests leave the batch (``compact``): the rows of requests that finished in a round are cut out of
both caches and the key mask after it (one ``index_select`` each), so a request that needs more rounds than the
others runs its last rounds in a smaller batch instead of verifying the finished rows as padding.

Timings: per round, the drafting of all requests with the controller and bookkeeping (``draft_seconds``), the
drafter's own calls in it (``drafter_seconds``: drafts + catch-up) and the shared verify (``verify_seconds``);
per batch, the decode seconds: the sum of the rounds' wall times (:meth:`BatchedSpeculativeEngine.steps` lets a
caller interleave engines round by round; the time between an engine's rounds is not its own). Throughput =
committed tokens / decode seconds.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from .acceptance import commit_round, greedy_accept
from .engine import GenerationResult, _sync


@dataclass
class BatchResult:
    """One batch of requests decoded together.

    Attributes:
        results: per request, in input order (``decode_seconds`` = the batch's decode wall time).
        draft_seconds, verify_seconds: per round, for the whole batch.
        decode_seconds: wall time of the decode loop (prefill excluded).
        prefill_seconds: the batched prefill (its first computation's, when it came from a ``prefill_store``).
        prefill_reused: the prefill was a copy of a stored one (``prefill_store``).
        block_sizes: per round, the bs an online controller chose (empty without one).
        controller_seconds: the controller's wall seconds (inside the rounds' draft seconds).
        drafter_seconds: per round, the drafter calls alone (one forward: catch-up + drafts; 0 without drafts).
        catchup_tokens: per round, the kept tokens per request (most over the rows) written before drafting.
        rows: per round, the batch rows the round verified (the active requests when finished ones leave the
            batch, ``compact``; always the batch size otherwise).
    """

    results: list[GenerationResult]
    draft_seconds: list[float] = field(default_factory=list)
    verify_seconds: list[float] = field(default_factory=list)
    decode_seconds: float = 0.0
    prefill_seconds: float = 0.0
    prefill_reused: bool = False
    block_sizes: list[int] = field(default_factory=list)
    controller_seconds: float = 0.0
    drafter_seconds: list[float] = field(default_factory=list)
    catchup_tokens: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.results)

    @property
    def throughput(self) -> float:
        """Committed decode tokens per second over the batch (tokens from the prefill excluded)."""
        return sum(r.new_tokens - 1 for r in self.results) / max(self.decode_seconds, 1e-9)


class BatchedSpeculativeEngine:
    """Greedy speculative (or AR, with ``proposer_factory=None``) decoding of several requests at once.

    Args:
        target: :class:`~dscout.models.target.TargetModel`.
        proposer_factory: ``() -> proposer``; one fresh proposer per request (chain drafts only), or None for AR.
        stop_token_ids: token ids that end a request.
        controller: optional :class:`~dscout.decoding.controller.BlockSizeController`: one bs per batch round,
            chosen from the pooled acceptance of the batch's requests and the latency model at the number of
            active requests c (``block_size`` of :meth:`generate` is then the largest bs it may pick); it is told
            the kept (not yet written) drafter tokens, whose catch-up a draft round pays.
        batched_draft: draft the batch in one forward when the proposer has a batched form (default); False
            drafts request after request.
        compact: finished requests leave the batch (default): after a round in which some request finished, the
            target's KV cache, the key mask and the drafter's cache keep only the active rows (one
            ``index_select`` of each), so later rounds verify and draft ``n`` rows, not ``c``. A serving system
            does the same (SGLang filters finished requests out of its running batch). Speculative requests finish
            after different numbers of rounds, and without it the batch's last rounds verified every finished row
            as padding: at c = 8 with bs 2 the batch ran 28 rounds where its requests needed 22.8 on average. False
            keeps every row to the end (the engine until 2026-12-06, for measurement).
    """

    def __init__(self, target, proposer_factory=None, stop_token_ids: list[int] | tuple[int, ...] = (),
                 controller=None, batched_draft: bool = True, compact: bool = True):
        self.target = target
        self.proposer_factory = proposer_factory
        self.controller = controller if proposer_factory is not None else None
        self.stop_token_ids = set(stop_token_ids)
        probe = proposer_factory() if proposer_factory else None
        self.layer_ids = list(probe.layer_ids) if probe is not None else []
        self.batched_draft = batched_draft and callable(getattr(probe, "batched", None))
        self.compact = bool(compact)

    @staticmethod
    def _compact(cache, keys: torch.Tensor, group, rows: list[int], active: list[bool]):
        """Drop the finished requests' rows from the target cache, the key mask ``[n, S]`` and the drafter group.

        Returns:
            ``(keys, rows)`` of the remaining active rows, in batch order.
        """
        keep = [j for j, i in enumerate(rows) if active[i]]
        idx = torch.tensor(keep, dtype=torch.long, device=keys.device)
        cache.batch_select_indices(idx)
        if group is not None:
            group.select(idx)
        return keys[idx], [rows[j] for j in keep]

    def generate(self, prompts: list[list[int]], max_new_tokens: int, block_size: int = 1,
                 prefill_store: dict | None = None) -> BatchResult:
        """Decode ``prompts`` together; returns per-request results in input order.

        Args:
            prefill_store: optional dict shared by engines of the same target (Table 4's methods and repeats):
                the batch's prefill (KV cache, last logits, taps of this engine's layers) is computed once per
                ``(prompts, layers)`` and deep-copied on later calls, as
                :meth:`dscout.decoding.engine.SpeculativeEngine.generate` does for one request. Decoding is
                unchanged (the same tensors); the prefill is outside the decode seconds either way.
        Raises:
            ValueError: for an empty batch, an empty prompt or ``max_new_tokens < 1``.
        """
        steps = self.steps(prompts, max_new_tokens, block_size, prefill_store=prefill_store)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    @torch.no_grad()  # on a generator function torch enters the context around each resume: nothing leaks
    def steps(self, prompts: list[list[int]], max_new_tokens: int, block_size: int = 1,
              prefill_store: dict | None = None):
        """:meth:`generate` one step at a time: a generator that yields after the prefill and after every round.

        The caller may run other work between steps (Table 4 interleaves the methods' engines round by round,
        :func:`dscout.evaluation.serving.serving_records`, so that the machine's drift hits every method alike):
        ``decode_seconds`` is the sum of this engine's own round times, never the time spent outside it.

        Args:
            prefill_store: as in :meth:`generate`.
        Returns (as the generator's ``StopIteration.value``): the :class:`BatchResult`.
        Raises:
            ValueError: for an empty batch, an empty prompt or ``max_new_tokens < 1`` (at the first step).
        """
        return (yield from self._steps(prompts, max_new_tokens, block_size, prefill_store))

    def _steps(self, prompts: list[list[int]], max_new_tokens: int, block_size: int, prefill_store: dict | None):
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("need at least one non-empty prompt")
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        bs = 1 if self.proposer_factory is None else max(block_size, 1)
        dev = self.target.device
        B = len(prompts)
        P = max(len(p) for p in prompts)
        ids = torch.zeros(B, P, dtype=torch.long, device=dev)
        valid = torch.zeros(B, P, dtype=torch.bool, device=dev)
        for i, p in enumerate(prompts):  # left padding
            ids[i, P - len(p):] = torch.tensor(p, device=dev)
            valid[i, P - len(p):] = True
        pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
        key = (tuple(tuple(p) for p in prompts), tuple(self.layer_ids))
        stored = prefill_store.get(key) if prefill_store is not None else None
        _sync(dev)
        t0 = time.perf_counter()
        if stored is None:
            cache = self.target.new_cache()
            mask = (valid[:, None, None, :] & torch.ones(P, P, dtype=torch.bool, device=dev).tril()[None, None])
            mask |= torch.eye(P, dtype=torch.bool, device=dev)[None, None]  # padded queries see themselves
            out = self.target(ids, layer_ids=self.layer_ids, past_key_values=cache, attention_mask=mask,
                              position_ids=pos, last_logits_only=True)
            last_logits, taps = out.logits[:, -1], out.taps
        else:
            cache, last_logits, taps = copy.deepcopy(stored["cache"]), stored["logits"], stored["taps"]
        group = self.proposer_factory().batched() if self.batched_draft else None  # all requests, one forward
        if group is not None:
            group.start(taps, valid)
            proposers = [None] * B
        else:
            proposers = [self.proposer_factory() for _ in range(B)] if self.proposer_factory else [None] * B
        results, last, length, active = [], [], [], []
        for i, p in enumerate(prompts):
            x = int(last_logits[i].argmax())
            if proposers[i] is not None:
                proposers[i].start(taps[i, P - len(p):], ids[i, P - len(p):])
            results.append(GenerationResult(output_ids=[x]))
            last.append(x)
            length.append(len(p))  # absolute position of x
            active.append(x not in self.stop_token_ids and max_new_tokens > 1)
            if x in self.stop_token_ids:
                results[-1].stop_reason = "stop_token"
        _sync(dev)
        t1 = time.perf_counter()
        if prefill_store is not None and stored is None:  # kept before any round extends the cache
            prefill_store[key] = {"cache": copy.deepcopy(cache), "logits": last_logits, "taps": taps,
                                  "seconds": t1 - t0}
        batch = BatchResult(results=results, prefill_seconds=stored["seconds"] if stored else t1 - t0,
                            prefill_reused=stored is not None)
        yield  # the prefill is one step
        busy = 0.0  # this engine's own decode seconds (its rounds), whatever runs between the steps
        keys = valid  # [n, S]: which cache slots hold committed tokens, per batch row
        rows = list(range(B))  # batch row j decodes request rows[j]
        if self.compact and not all(active):  # finished at the prefill's token: out before the first round
            keys, rows = self._compact(cache, keys, group, rows, active)
        spent = self.controller.overhead_seconds if self.controller is not None else 0.0
        first_round = True  # its time is not fed back: the first decode after a prefill pays one-off costs
        drafted, accepted = [0] * B, [0] * B  # per request: rounds with drafts, drafts accepted
        while any(active[i] for i in rows):
            ta = time.perf_counter()
            n_rows = len(rows)
            bs_round = bs
            if self.controller is not None:
                left = max(max_new_tokens - len(results[i].output_ids) for i in rows if active[i])
                kept = group.pending_tokens if group is not None else max(
                    (getattr(proposers[i], "pending_tokens", 0) for i in rows if proposers[i] is not None),
                    default=0)
                # priced at the rows the verify runs over (= the active requests when finished ones leave)
                bs_round = self.controller.choose(n_rows, limit=min(bs, left + 1), pending=kept, left=left)
                batch.block_sizes.append(bs_round)
            ks = [min(bs_round - 1, max_new_tokens - len(results[i].output_ids)) if active[i] else 0 for i in rows]
            empty = torch.empty(0, dtype=torch.long, device=dev)
            tp = time.perf_counter()
            if group is not None:
                catchup = group.pending_tokens if max(ks) > 0 else 0
                ds = group.propose([last[i] for i in rows], [length[i] for i in rows], ks) if max(ks) > 0 \
                    else [None] * n_rows
                drafts = [d.tokens.to(dev) if d is not None else empty for d in ds]
            else:
                catchup = 0
                drafts = []
                for j, i in enumerate(rows):
                    k, prop = ks[j], proposers[i]
                    if k > 0 and prop is not None:
                        catchup = max(catchup, getattr(prop, "pending_tokens", 0))
                    d = prop.propose(last[i], length[i], k) if k > 0 and prop is not None else None
                    drafts.append(d.tokens.to(dev) if d is not None else empty)
            _sync(dev)  # CUDA launches are asynchronous: the drafter's kernels belong to its seconds
            batch.drafter_seconds.append(time.perf_counter() - tp)
            batch.catchup_tokens.append(catchup)
            tb = time.perf_counter()
            width = 1 + max(len(d) for d in drafts)
            vids = torch.zeros(n_rows, width, dtype=torch.long, device=dev)
            new_valid = torch.zeros(n_rows, width, dtype=torch.bool, device=dev)
            vpos = torch.zeros(n_rows, width, dtype=torch.long, device=dev)
            for j, i in enumerate(rows):
                row = torch.cat([torch.tensor([last[i]], device=dev), drafts[j]])
                vids[j, :len(row)] = row
                new_valid[j, :len(row)] = active[i]
                vpos[j] = length[i] + torch.arange(width, device=dev)
            S = keys.shape[1]
            causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
            mask = torch.cat([keys[:, None, None, :].expand(n_rows, 1, width, S),
                              (new_valid[:, None, None, :] & causal[None, None])], dim=-1)
            mask[..., S:] |= torch.eye(width, dtype=torch.bool, device=dev)[None, None]
            out = self.target(vids, layer_ids=self.layer_ids, past_key_values=cache, attention_mask=mask,
                              position_ids=vpos)
            _sync(dev)
            tc = time.perf_counter()
            committed_slots = torch.zeros(n_rows, width, dtype=torch.bool, device=dev)
            observed = []
            for j, i in enumerate(rows):
                if not active[i]:
                    continue
                k = len(drafts[j])
                n, bonus = greedy_accept(torch.as_tensor(drafts[j], device=dev), out.logits[j, : k + 1])
                observed.append((k, n))
                if k > 0:
                    drafted[i] += 1
                    accepted[i] += n
                committed_slots[j, : n + 1] = True
                if group is not None:
                    group.commit(j, out.taps[j, : n + 1])
                elif proposers[i] is not None:
                    proposers[i].commit(out.taps[j, : n + 1], vids[j, : n + 1])
                res = results[i]
                emitted, stopped = commit_round(res.output_ids, (drafts[j][:n].tolist() + [bonus])[
                    :max_new_tokens - len(res.output_ids)], self.stop_token_ids)
                res.accept_lengths.append(emitted)
                if stopped:
                    res.stop_reason = "stop_token"
                length[i] += n + 1
                last[i] = bonus
                if res.stop_reason == "stop_token" or len(res.output_ids) >= max_new_tokens:
                    active[i] = False
            keep = max((n + 1 for _, n in observed), default=1)
            if keep < width:  # slots rejected in every row: out of the cache, so later verifies do not attend them
                cache.crop(keep - width)
                committed_slots = committed_slots[:, :keep]
            keys = torch.cat([keys, committed_slots], dim=1)
            if group is not None:
                group.end_round()
            if self.compact and any(active[i] for i in rows) and not all(active[i] for i in rows):
                keys, rows = self._compact(cache, keys, group, rows, active)
            if self.controller is not None:
                self.controller.observe_batch(observed)
            _sync(dev)
            td = time.perf_counter()
            if self.controller is not None and observed and not first_round:  # measured round vs latency model
                self.controller.observe_time(max(ks) + 1, n_rows, td - ta,
                                             committed=sum(n + 1 for _, n in observed) / len(observed),
                                             pending=catchup)
            first_round = False
            batch.draft_seconds.append((tb - ta) + (td - tc))
            batch.verify_seconds.append(tc - tb)
            batch.rows.append(n_rows)
            busy += time.perf_counter() - ta
            if any(active[i] for i in rows):
                yield
        batch.decode_seconds = busy
        if self.controller is not None:
            if B > 1:  # which share of the batch's acceptance its last request got (the batch waited for it)
                rounds = [len(r.accept_lengths) for r in results]
                final = [i for i, n in enumerate(rounds) if n == max(rounds)]  # finished in the batch's last round
                self.controller.observe_makespan((sum(drafted[i] for i in final), sum(accepted[i] for i in final)),
                                                 (sum(drafted), sum(accepted)))
            batch.controller_seconds = self.controller.overhead_seconds - spent
        for r in results:
            r.decode_seconds = batch.decode_seconds
            r.prefill_seconds = batch.prefill_seconds
        return batch
