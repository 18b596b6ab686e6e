"""The draft-verify engine: lossless greedy output, distribution-preserving sampling, round bookkeeping."""

import pytest
import torch
from scipy.stats import chisquare

from dscout.decoding.acceptance import greedy_accept, speculative_accept
from dscout.decoding.engine import SpeculativeEngine
from dscout.decoding.proposers import BlockDiffusionProposer, Draft

from .conftest import tiny_drafter, tiny_target

P_MIN = 1e-3  # tolerance of the statistical tests: reject "same distribution" only below this p-value


class OracleProposer:
    """Drafts the AR continuation, corrupting each draft with probability ``flip``: exercises long accepts,
    partial accepts and rollbacks at every position of the block."""

    layer_ids = [1]

    def __init__(self, reference: list[int], vocab: int, flip: float, seed: int = 0):
        self.ref, self.vocab, self.flip = reference, vocab, flip
        self.g = torch.Generator().manual_seed(seed)

    def start(self, taps, ids=None):
        self.pos = taps.shape[0]

    def commit(self, taps, ids=None):
        self.pos += taps.shape[0]

    def propose(self, last_token, position, k, temperature=0.0, generator=None):
        assert position == self.pos
        toks = []
        for j in range(1, k + 1):
            t = self.ref[position + j] if position + j < len(self.ref) else 0
            if torch.rand(1, generator=self.g).item() < self.flip:
                t = (t + 1) % self.vocab
            toks.append(t)
        return Draft(torch.tensor(toks))


@pytest.mark.parametrize("bs", [4, 8, 16, 32])
def test_greedy_equals_autoregressive_with_block_diffusion_drafter(bs, target):
    d = tiny_drafter(target, layers=2, block_size=32)
    ar = SpeculativeEngine(target, stop_token_ids=[0])
    sd = SpeculativeEngine(target, BlockDiffusionProposer(d), stop_token_ids=[0])
    g = torch.Generator().manual_seed(bs)
    for _ in range(12):
        prompt = torch.randint(1, 63, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g).tolist()
        a = ar.generate(prompt, 48)
        s = sd.generate(prompt, 48, block_size=bs)
        assert s.output_ids == a.output_ids
        assert all(1 <= n <= bs for n in s.accept_lengths)
        assert len(s.accept_lengths) == len(s.draft_seconds) == len(s.verify_seconds)


@pytest.mark.parametrize("bs", [4, 8, 16, 32])
@pytest.mark.parametrize("flip", [0.0, 0.1, 0.4])
def test_greedy_equals_autoregressive_with_long_acceptances(bs, flip, target):
    ar = SpeculativeEngine(target)
    g = torch.Generator().manual_seed(7)
    lengths = []
    for i in range(6):
        prompt = torch.randint(1, 63, (9,), generator=g).tolist()
        a = ar.generate(prompt, 70)
        spec = SpeculativeEngine(target, OracleProposer(prompt + a.output_ids, 64, flip, seed=i))
        s = spec.generate(prompt, 70, block_size=bs)
        assert s.output_ids == a.output_ids
        assert all(1 <= n <= bs for n in s.accept_lengths)
        assert sum(s.accept_lengths) + 1 >= len(s.output_ids)  # every token after the first came from a round
        lengths += s.accept_lengths
    if flip == 0.0:
        assert max(lengths) == bs  # perfect drafts: whole blocks accepted
    else:
        assert min(lengths) < bs


def test_ar_is_the_engine_without_proposer(target):
    ar = SpeculativeEngine(target)
    r = ar.generate([5, 6, 7], 20)
    assert r.accept_lengths == [1] * (len(r.output_ids) - 1)
    # greedy AR equals HF generate
    out = target.model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=20, do_sample=False,
                                pad_token_id=0, eos_token_id=None)
    assert out[0, 3:].tolist() == r.output_ids


def test_stop_token_and_length(target):
    ar = SpeculativeEngine(target)
    r = ar.generate([5, 6, 7], 30)
    stop = r.output_ids[10]
    first = r.output_ids.index(stop)
    d = tiny_drafter(target)
    for eng in (SpeculativeEngine(target, stop_token_ids=[stop]),
                SpeculativeEngine(target, BlockDiffusionProposer(d), stop_token_ids=[stop])):
        s = eng.generate([5, 6, 7], 30, block_size=8)
        assert s.output_ids == r.output_ids[:first + 1] and s.stop_reason == "stop_token"
        s = eng.generate([5, 6, 7], 5, block_size=8)
        assert len(s.output_ids) == min(5, first + 1)


def test_block_size_above_horizon_is_refused(target):
    d = tiny_drafter(target, block_size=8)
    with pytest.raises(ValueError, match="horizon"):
        SpeculativeEngine(target, BlockDiffusionProposer(d)).generate([1, 2, 3], 20, block_size=16)


# ---------------------------------------------------------------------------------------------- acceptance
def test_greedy_accept_prefix_and_bonus():
    logits = torch.full((4, 10), -5.0)
    for i, t in enumerate([3, 4, 9, 1]):
        logits[i, t] = 5.0
    assert greedy_accept(torch.tensor([3, 4, 9]), logits) == (3, 1)
    assert greedy_accept(torch.tensor([3, 5, 9]), logits) == (1, 4)
    assert greedy_accept(torch.tensor([0, 4, 9]), logits) == (0, 3)


@pytest.mark.parametrize("with_q", [False, True])
def test_speculative_accept_first_token_follows_target(with_q):
    """Unit form of losslessness: the token committed at the first draft slot ~ p, whatever q is."""
    torch.manual_seed(0)
    V, N = 6, 20000
    logits = torch.randn(3, V)
    p = torch.softmax(logits[0], -1)
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(V)
    q = torch.softmax(torch.randn(2, V) * 2, -1)
    for _ in range(N):
        if with_q:
            drafts = torch.multinomial(q, 1, generator=g).squeeze(-1)
            n, bonus = speculative_accept(drafts, logits, 1.0, g, q)
        else:
            drafts = torch.tensor([2, 4])
            n, bonus = speculative_accept(drafts, logits, 1.0, g)
        counts[int(drafts[0]) if n >= 1 else bonus] += 1
    assert chisquare(counts.numpy(), (p * N).numpy()).pvalue > P_MIN


def _exact_joint(target, prompt, n_tokens, temperature):
    """Exact target probabilities of every continuation of length ``n_tokens`` (small vocab)."""
    V = target.vocab_size
    seqs = torch.tensor([prompt])
    probs = torch.ones(1, dtype=torch.float64)
    for _ in range(n_tokens):
        logits = target(seqs).logits[:, -1].double()
        p = torch.softmax(logits / temperature, -1)  # [n, V]
        probs = (probs.unsqueeze(1) * p).reshape(-1)
        seqs = torch.cat([seqs.repeat_interleave(V, 0), torch.arange(V).repeat(seqs.shape[0]).unsqueeze(1)], 1)
    return probs.view(*([V] * n_tokens))


@pytest.mark.parametrize("sample_drafts", [False, True])
def test_sampling_preserves_target_distribution(sample_drafts):
    """End to end at temperature 1: the first four committed tokens follow the target's distribution.
    Checked on each position's marginal and on the joint of tokens 2-3 (chi-square, p > 1e-3, fixed seeds)."""
    t = tiny_target(vocab=8, layers=2, init=0.3, seed=3)
    d = tiny_drafter(t, layers=1, block_size=8, mask_token_id=7)
    prompt = [1, 2, 3]
    exact = _exact_joint(t, prompt, 4, 1.0)
    eng = SpeculativeEngine(t, BlockDiffusionProposer(d, sample_drafts=sample_drafts))
    N = 2000
    outs = torch.tensor([eng.generate(prompt, 4, block_size=4, temperature=1.0, seed=s).output_ids
                         for s in range(N)])
    assert outs.shape == (N, 4)
    for pos in range(4):
        dims = tuple(i for i in range(4) if i != pos)
        marg = exact.sum(dims).numpy()
        counts = torch.bincount(outs[:, pos], minlength=8).double().numpy()
        assert chisquare(counts, marg * N).pvalue > P_MIN, pos
    joint = exact.sum((0, 3)).reshape(-1)
    keep = joint * N >= 5  # chi-square needs expected counts >= 5; pool the rest
    counts = torch.bincount(outs[:, 1] * 8 + outs[:, 2], minlength=64).double()
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)]).numpy()
    exp = torch.cat([joint[keep] * N, (joint[~keep] * N).sum().view(1)]).numpy()
    assert chisquare(obs, exp).pvalue > P_MIN


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_prefill_store_reuses_the_prompt_forward_without_changing_outputs(temperature, target):
    """A shared prefill store (benchmark repeats and methods) gives exactly the outputs of fresh prefills,
    computes each (prompt, tapped layers) once and leaves the stored cache untouched by decoding."""
    d = tiny_drafter(target, layers=2, block_size=16)
    ar = SpeculativeEngine(target, stop_token_ids=[0])
    sd = SpeculativeEngine(target, BlockDiffusionProposer(d), stop_token_ids=[0])
    store = {}
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, 63, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g).tolist()
               for _ in range(4)]
    for repeat in range(2):
        for p in prompts:
            for eng, bs in ((ar, 1), (sd, 8)):
                fresh = eng.generate(p, 24, block_size=bs, temperature=temperature, seed=repeat)
                reused = eng.generate(p, 24, block_size=bs, temperature=temperature, seed=repeat,
                                      prefill_store=store)
                assert reused.output_ids == fresh.output_ids
                assert reused.accept_lengths == fresh.accept_lengths
                assert reused.prefill_reused == (repeat > 0)  # computed once, then reused
    assert len(store) == 2 * len(prompts)  # one entry per prompt and tapped layer set (AR taps none)
    for (ids, layers), entry in store.items():
        assert entry["cache"].get_seq_length() == len(ids)
