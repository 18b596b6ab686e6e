"""Training memory (issue 46): chunked LM-head terms, flex attention, chunked target lse, streamed probe features.

Each memory device must compute what the direct path computes: the chunked CE / AWL terms equal today's full-logits
ones to 1e-5 (values and gradients), the flex ``BlockMask`` path gives the dense-mask SDPA path's loss.
"""

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F

from dscout.training.head import chunked_head_cross_entropy, chunked_logsumexp, rows_per_chunk
from dscout.training.losses import acceptance_probabilities, greedy_acceptance
from dscout.training.recipes import get_recipe
from dscout.training.step import FeatureBatch, drafter_training_loss

from .conftest import tiny_drafter, tiny_target


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_head_cross_entropy_equals_the_direct_one(chunk, with_bias):
    g = torch.Generator().manual_seed(0)
    M, D, V = 50, 16, 97
    w = torch.randn(V, D, generator=g)
    b = torch.randn(V, generator=g) if with_bias else None
    h = torch.randn(M, D, generator=g, requires_grad=True)
    y = torch.randint(0, V, (M,), generator=g)
    coef = torch.rand(M, generator=g)  # a weighted sum, as the factorized objective

    ce, greedy, logq = chunked_head_cross_entropy(h, w, b, y, chunk)
    (ce * coef).sum().backward()
    got_grad, h.grad = h.grad.clone(), None

    logits = F.linear(h, w, b)
    ref = F.cross_entropy(logits.float(), y, reduction="none")
    (ref * coef).sum().backward()
    torch.testing.assert_close(ce, ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_grad, h.grad, atol=1e-5, rtol=1e-5)
    ls = torch.log_softmax(logits.detach().float(), -1)
    assert torch.equal(greedy, ls.argmax(-1))
    torch.testing.assert_close(logq, ls.max(-1).values, atol=1e-5, rtol=1e-5)
    assert not greedy.requires_grad and not logq.requires_grad


def test_chunked_head_rejects_bad_shapes_and_sizes_chunks_by_bytes():
    with pytest.raises(ValueError, match=r"\[M, D\]"):
        chunked_head_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(5, 4), None, torch.zeros(2, dtype=torch.long))
    assert rows_per_chunk(151936) == (1 << 28) // (4 * 151936)
    assert rows_per_chunk(10**12) == 1


def test_greedy_acceptance_equals_the_full_distribution_one():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(9, 31, generator=g)
    logp = torch.log_softmax(torch.randn(9, 31, generator=g), -1)
    of = lambda y: logp.gather(1, y[:, None]).squeeze(1)  # noqa: E731
    ref = acceptance_probabilities(logits, of, torch.zeros(9, dtype=torch.bool))
    ls = torch.log_softmax(logits, -1)
    torch.testing.assert_close(greedy_acceptance(ls.argmax(-1), ls.max(-1).values, of), ref, atol=1e-6, rtol=1e-6)


def test_chunked_logsumexp_is_the_targets_lse():
    t = tiny_target(dtype=torch.float32)
    ids = torch.randint(0, 60, (2, 23))
    out = t(ids)
    want = torch.logsumexp(out.logits.float(), -1)
    got = chunked_logsumexp(out.final_hidden, t.lm_head.weight, None, chunk_rows=5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    from dscout.training.features import target_features

    _, _, lse = target_features(t, ids, torch.ones_like(ids), [1])
    torch.testing.assert_close(lse, want, atol=1e-5, rtol=1e-5)


def _batch(t, d, lengths, S, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 60, (len(lengths), S), generator=g)
    m = torch.zeros(len(lengths), S, dtype=torch.long)
    for i, n in enumerate(lengths):
        m[i, 3:n] = 1
    out = t(ids, layer_ids=d.config.target_layer_ids)
    return FeatureBatch(ids, m, out.taps, out.final_hidden, torch.logsumexp(out.logits.float(), -1))


def _loss_and_grads(d, batch, recipe, **kw):
    d.zero_grad(set_to_none=True)
    loss, metrics = drafter_training_loss(d, batch, get_recipe(recipe), 6, torch.Generator().manual_seed(5),
                                          block_size=8, **kw)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}, metrics


@pytest.mark.parametrize("recipe,draft_vocab", [("dscout", None), ("dscout", 40), ("dflash", None)])
def test_chunked_update_equals_the_direct_update(recipe, draft_vocab):
    """The whole update (AWL's acceptance weights included) through the chunked head equals the full-logits one."""
    t = tiny_target(dtype=torch.float32)
    d = tiny_drafter(t, layers=1, draft_vocab_size=draft_vocab)
    if draft_vocab:
        d.set_draft_vocab(torch.arange(64, dtype=torch.float32))
    batch = _batch(t, d, [40, 33], 40)
    ref_loss, ref_grads, ref_m = _loss_and_grads(d, batch, recipe, head_chunk_rows=0)
    loss, grads, m = _loss_and_grads(d, batch, recipe, head_chunk_rows=5)
    assert ref_m["mean_weight"] < 1.0 if recipe == "dscout" else True  # AWL weights are really in play
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    assert ref_grads.keys() == grads.keys()
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], atol=1e-5, rtol=1e-5, msg=n)
    for k in ("accuracy", "mean_weight", "supervised"):
        assert m[k] == pytest.approx(ref_m[k], abs=1e-6)


def test_flex_attention_path_gives_the_sdpa_loss():
    """The flex ``BlockMask`` path (the GPU's) and the dense-mask SDPA path (the CPU's) give the same loss and
    metrics; unused anchor slots (a short second row) included. Forward only: torch has no flex backward on the CPU
    (benchmarks/gpu_check.py trains through it on a GPU)."""
    t = tiny_target(dtype=torch.float32, family="qwen3")
    d = tiny_drafter(t, layers=2)
    batch = _batch(t, d, [48, 20], 48, seed=3)
    out = {}
    for attention in ("sdpa", "flex"):
        with torch.no_grad():
            out[attention] = drafter_training_loss(d, batch, get_recipe("dscout"), 6,
                                                   torch.Generator().manual_seed(5), block_size=8,
                                                   attention=attention)
    torch.testing.assert_close(out["flex"][0], out["sdpa"][0], atol=1e-5, rtol=1e-5)
    for k in ("accuracy", "mean_weight", "supervised"):
        assert out["flex"][1][k] == pytest.approx(out["sdpa"][1][k], abs=1e-6)
    assert out["flex"][1]["mean_weight"] < 1.0  # AWL in play
    with pytest.raises(ValueError, match="attention must be"):
        drafter_training_loss(d, batch, get_recipe("dscout"), 6, torch.Generator(), attention="dense")


def test_prepare_streams_probe_features():
    """``DFlashMethod.prepare`` reduces each probe sequence's features before it reads the next: at most one probe
    batch is alive at any time (a list of 64 would hold them all; online, 64 x 35 taps x 3k tokens)."""
    from dscout.training.methods import DFlashMethod
    from dscout.training.trainer import TrainConfig

    t = tiny_target(dtype=torch.float32)
    method = DFlashMethod(TrainConfig(num_layers=1, mask_token_id=63, dtype="float32", options={}))
    d = method.build(t)
    alive: list = []
    peak = [0]

    class Source:
        def __len__(self):
            return 10

        def batch(self, idx, dtype, device):
            gc.collect()
            live = sum(r() is not None for r in alive)
            peak[0] = max(peak[0], live + 1)
            b = _batch(t, d, [30], 30, seed=idx[0])
            alive.append(weakref.ref(b.taps))
            return b

    method.prepare(Source(), t)
    assert len(alive) == 10 and peak[0] == 1
