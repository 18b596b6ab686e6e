"""One draft-verify loop for every method, so timings compare fairly.

Autoregressive decoding is this loop with no proposer: every round verifies the single last token and commits
its bonus. Speculative methods plug a proposer (:mod:`dscout.decoding.proposers`) into the same loop, so AR and
speculative runs share the target forward, the cache handling, the sampler and the timers.

One round (docs/method.md §4):

1. **draft**: the proposer drafts ``k = min(bs - 1, remaining)`` tokens after the last committed token x (z-lab
   ``dflash_generate``'s rule: the block keeps its size until fewer than ``bs - 1`` tokens remain, and a round
   that accepts all ``remaining`` drafts drops its bonus, so τ and the drafts equal the reference runtime's);
2. **verify**: one target forward over ``[x, d_1..d_k]`` with the KV cache, tapping the proposer's layers;
3. **accept**: greedy or lossless sampling (:mod:`dscout.decoding.acceptance`): ``n`` drafts + 1 bonus token;
4. **roll back** the target KV of the ``k - n`` rejected drafts (``cache.crop(-(k - n))``);
5. **commit** the taps of ``x, d_1..d_n`` to the proposer; the bonus becomes the next x. A block-diffusion
   proposer only keeps them and writes them into its cache in the next draft forward (deferred commit), so a
   round without drafts (bs 1, chosen by the online controller) costs what an AR step costs.

Per round the engine records the accepted length ``n + 1`` (bonus included, in [1, bs]), the draft seconds
and the verify seconds; per request the output ids, new tokens and decode seconds (prefill excluded; the
drafter's prompt-context write happens in the prefill phase, as DFlash's benchmark restarts its timer after
the first draft call).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from .acceptance import (accept, commit_round, greedy_tree_accept, sampling_tree_accept, target_probs,
                         tree_attention_mask, tree_depths)
from .proposers import TreeDraft


@dataclass
class GenerationResult:
    """Everything one request produced.

    Attributes:
        output_ids: generated token ids (the prompt excluded; a stop token, if hit, included last).
        accept_lengths: tokens committed per draft round (accepted drafts + bonus, cut at a stop token), one int
            per round; ``sum(accept_lengths) == len(output_ids) - 1``.
        draft_seconds, verify_seconds: per round.
        prefill_seconds: target prefill + first token + the proposer's prompt-context write.
        prefill_reused: the target's prefill came from a ``prefill_store`` (its seconds are those measured
            when it was computed).
        decode_seconds: wall time of all rounds (seconds).
        stop_reason: ``"stop_token"`` or ``"length"``.
        block_sizes: with an online controller, the bs it chose per round (else empty).
        controller_seconds: with an online controller, its wall seconds (decisions + feedback; counted in the
            rounds' draft seconds too).
    """

    output_ids: list[int]
    accept_lengths: list[int] = field(default_factory=list)
    draft_seconds: list[float] = field(default_factory=list)
    verify_seconds: list[float] = field(default_factory=list)
    prefill_seconds: float = 0.0
    prefill_reused: bool = False
    decode_seconds: float = 0.0
    stop_reason: str = "length"
    block_sizes: list[int] = field(default_factory=list)
    controller_seconds: float = 0.0

    @property
    def new_tokens(self) -> int:
        """Generated tokens, including the one sampled from the prefill logits."""
        return len(self.output_ids)

    @property
    def mean_accept_length(self) -> float:
        """τ of this request: mean tokens per round (bonus included)."""
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sample_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Argmax at temperature 0, else a sample from ``softmax(logits / T)``."""
    if temperature <= 0:
        return int(logits.argmax())
    return int(torch.multinomial(target_probs(logits, temperature), 1, generator=generator))


class SpeculativeEngine:
    """The draft-verify engine (batch size 1; see :mod:`dscout.decoding.batched` for concurrency).

    Args:
        target: a :class:`~dscout.models.target.TargetModel`.
        proposer: a proposer, or None for autoregressive decoding.
        stop_token_ids: generation stops after the first of these tokens.
        controller: optional :class:`~dscout.decoding.controller.BlockSizeController`: before each round it
            picks bs (up to the ``block_size`` passed to :meth:`generate`) from the acceptance of earlier rounds
            and the calibrated latency model; chain proposers only.
    """

    def __init__(self, target, proposer=None, stop_token_ids=(), controller=None):
        self.target = target
        self.proposer = proposer
        self.controller = controller
        self.stop_token_ids = set(int(t) for t in stop_token_ids)
        self.layer_ids = list(getattr(proposer, "layer_ids", []) or []) if proposer is not None else []

    @torch.no_grad()
    def generate(self, prompt_ids, max_new_tokens: int, block_size: int = 1, temperature: float = 0.0,
                 seed: int = 0, prefill_store: dict | None = None) -> GenerationResult:
        """Decode one request.

        Args:
            prompt_ids: prompt token ids (list or 1-D tensor).
            max_new_tokens: cap on generated tokens.
            block_size: bs, tokens verified per round (``x`` + ``bs - 1`` drafts); ignored for AR (1). With a
                controller: the largest bs it may pick.
            temperature: 0 = greedy; > 0 = lossless sampling.
            seed: seed of this request's sampling RNG.
            prefill_store: optional store shared by engines of the same target (a benchmark job's methods): a
                dict, or the byte-capped host-memory :class:`dscout.evaluation.prefill_store.PrefillStore`;
                the target's prefill of a prompt (KV cache, last logits, taps of this engine's layers) is
                computed once per ``(prompt, layers)`` and deep-copied on later calls, so a benchmark does not
                recompute identical prompt forwards. Decoding is unchanged (same tensors); the result's
                ``prefill_seconds`` is the measured time of the first computation and ``prefill_reused`` says
                whether it was reused. Prefill is outside the decode timer either way.
        Returns:
            :class:`GenerationResult`.
        Raises:
            ValueError: if ``block_size < 1`` or ``max_new_tokens < 1``.
        """
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.proposer is None:
            block_size = 1
        dev = self.target.device
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
        ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=dev).view(1, -1)
        n_prompt = ids.shape[1]
        key = (tuple(ids[0].tolist()), tuple(self.layer_ids))
        stored = prefill_store.get(key) if prefill_store is not None else None

        _sync(dev)
        t0 = time.perf_counter()
        if stored is None:
            cache = self.target.new_cache()
            out = self.target(ids, layer_ids=self.layer_ids, past_key_values=cache)
            last_logits, taps = out.logits[0, -1], (out.taps[0] if out.taps is not None else None)
        else:
            cache, last_logits, taps = copy.deepcopy(stored["cache"]), stored["logits"], stored["taps"]
        x = sample_token(last_logits, temperature, gen)
        if self.proposer is not None:
            self.proposer.start(taps, ids[0])
        _sync(dev)
        t1 = time.perf_counter()
        if prefill_store is not None and stored is None:
            prefill_store[key] = {"cache": copy.deepcopy(cache), "logits": last_logits, "taps": taps,
                                  "seconds": t1 - t0}
        res = GenerationResult(output_ids=[x], prefill_seconds=stored["seconds"] if stored else t1 - t0,
                               prefill_reused=stored is not None)
        if x in self.stop_token_ids:
            res.stop_reason = "stop_token"
            return res

        position = n_prompt  # absolute position of x
        controller = self.controller if self.proposer is not None else None
        spent = controller.overhead_seconds if controller is not None else 0.0
        first_round = True  # its time is not fed back: the first decode after a prefill pays one-off costs
        while len(res.output_ids) < max_new_tokens:
            remaining = max_new_tokens - len(res.output_ids)
            ta = time.perf_counter()
            if controller is not None:
                bs_round = controller.choose(1, limit=min(block_size, remaining + 1),
                                             pending=getattr(self.proposer, "pending_tokens", 0), left=remaining)
                res.block_sizes.append(bs_round)
            else:
                bs_round = block_size
            k = min(bs_round - 1, remaining)
            pending = getattr(self.proposer, "pending_tokens", 0) if k > 0 else 0
            draft = self.proposer.propose(x, position, k, temperature, gen) if k > 0 else None
            _sync(dev)
            tb = time.perf_counter()
            if isinstance(draft, TreeDraft):
                accepted, bonus, keep, out = self._verify_tree(x, position, draft, cache, temperature, gen)
            else:
                drafts = draft.tokens.to(dev) if draft is not None else torch.empty(0, dtype=torch.long, device=dev)
                verify_ids = torch.cat([torch.tensor([x], device=dev), drafts]).view(1, -1)
                out = self.target(verify_ids, layer_ids=self.layer_ids, past_key_values=cache)
                n_acc, bonus = accept(drafts, out.logits[0], temperature, gen,
                                      draft.probs if draft is not None else None)
                if k - n_acc > 0:
                    cache.crop(-(k - n_acc))
                accepted, keep = drafts[:n_acc].tolist(), torch.arange(n_acc + 1, device=dev)
            _sync(dev)
            tc = time.perf_counter()
            if controller is not None:
                controller.observe(k, len(accepted))
            if self.proposer is not None:  # drafter-side work: counted as draft time
                committed = torch.cat([torch.tensor([x], device=dev), torch.tensor(accepted, dtype=torch.long,
                                                                                   device=dev)])
                self.proposer.commit(out.taps[0, keep], committed)
                _sync(dev)
            td = time.perf_counter()
            n_acc = len(accepted)
            if controller is not None and not first_round:  # the measured round against the latency model
                controller.observe_time(k + 1, 1, td - ta, committed=n_acc + 1, pending=pending)
            first_round = False
            res.draft_seconds.append((tb - ta) + (td - tc))
            res.verify_seconds.append(tc - tb)
            emitted, stopped = commit_round(res.output_ids, (accepted + [bonus])[:remaining], self.stop_token_ids)
            res.accept_lengths.append(emitted)
            if stopped:
                res.stop_reason = "stop_token"
                break
            position += n_acc + 1
            x = bonus
        res.decode_seconds = time.perf_counter() - t1
        if controller is not None:
            res.controller_seconds = controller.overhead_seconds - spent
        return res

    def _verify_tree(self, x: int, position: int, draft: TreeDraft, cache, temperature: float,
                     gen: torch.Generator):
        """Verify a token tree in one target forward; keep the accepted path's KV (compacted in place).

        Returns ``(accepted tokens, bonus, kept verify offsets [m], target output)``.
        """
        dev = self.target.device
        tokens, parents = draft.tokens.to(dev), draft.parents.cpu()
        prefix = cache.get_seq_length()
        depth = tree_depths(parents)
        ids = torch.cat([torch.tensor([x], device=dev), tokens]).view(1, -1)
        pos = (position + torch.cat([torch.zeros(1, dtype=torch.long), depth])).view(1, -1).to(dev)
        n1 = ids.shape[1]
        mask = torch.ones(1, 1, n1, prefix + n1, dtype=torch.bool, device=dev)
        mask[0, 0, :, prefix:] = tree_attention_mask(parents).to(dev)
        out = self.target(ids, layer_ids=self.layer_ids, past_key_values=cache, attention_mask=mask,
                          position_ids=pos)
        logits = out.logits[0]
        if temperature <= 0:
            path, bonus = greedy_tree_accept(tokens, parents, logits)
        else:
            path, bonus = sampling_tree_accept(tokens, parents, logits, temperature, gen)
        keep = torch.tensor([0] + [j + 1 for j in path], dtype=torch.long, device=dev)
        compact_cache(cache, prefix, keep)
        return [int(tokens[j]) for j in path], bonus, keep, out


def compact_cache(cache, prefix_len: int, keep: torch.Tensor) -> None:
    """Keep the cached prefix plus the entries at offsets ``keep`` after it (accepted tree path), in order.

    Works on ``transformers`` ``DynamicCache`` layers (full attention: ``keys``/``values`` of shape
    ``[b, heads, seq, head_dim]``).
    """
    sel = prefix_len + keep
    for layer in cache.layers:
        layer.keys = torch.cat([layer.keys[..., :prefix_len, :], layer.keys[..., sel, :]], dim=-2)
        layer.values = torch.cat([layer.values[..., :prefix_len, :], layer.values[..., sel, :]], dim=-2)
