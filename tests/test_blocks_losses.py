"""Anchor sampling, the multi-block mask (no label leaks), the three loss factors and the recipes."""

import math

import pytest
import torch

from dscout.training.blocks import (block_attention_mask, build_blocks, reveal_positions,
                                    sample_anchors)
from dscout.training.losses import (acceptance_probabilities, acceptance_weights, factorized_objective,
                                    positional_decay_weights, target_logprob_from_cache)
from dscout.training.recipes import ABLATION_STEPS, RECIPES, get_recipe
from dscout.training.step import FeatureBatch, drafter_training_loss

from .conftest import tiny_drafter, tiny_target


def _mask(lengths, prompt=3, S=None):
    S = S or max(lengths)
    m = torch.zeros(len(lengths), S, dtype=torch.long)
    for i, n in enumerate(lengths):
        m[i, prompt:n] = 1
    return m


def test_anchors_are_response_tokens_sorted_and_distinct():
    m = _mask([20, 12, 30], S=30)
    g = torch.Generator().manual_seed(0)
    anchors, keep = sample_anchors(m, 8, g)
    assert anchors.shape == keep.shape == (3, 8)
    for b in range(3):
        a = anchors[b][keep[b]]
        assert torch.all(a[1:] > a[:-1])
        assert torch.all(m[b, a] == 1) and torch.all(m[b, a + 1] == 1)
    # the short sequence has only 8 candidates (positions 3..10): all used
    assert int(keep[1].sum()) == 8
    with pytest.raises(ValueError):
        sample_anchors(torch.zeros(2, 10, dtype=torch.long), 4, g)


def test_same_seed_same_anchors():
    m = _mask([40, 33])
    a1 = sample_anchors(m, 6, torch.Generator().manual_seed(3))
    a2 = sample_anchors(m, 6, torch.Generator().manual_seed(3))
    assert torch.equal(a1[0], a2[0]) and torch.equal(a1[1], a2[1])


def test_blocks_labels_are_same_position_and_masked_inputs():
    ids = torch.arange(100, 130).unsqueeze(0)
    m = _mask([30])
    anchors = torch.tensor([[5, 20]])
    keep = torch.tensor([[True, True]])
    blk = build_blocks(ids, m, anchors, keep, 8, mask_token_id=1)
    assert blk.labels[0, 0].tolist() == list(range(105, 113))  # offset k -> token at anchor + k
    assert blk.block_ids[0, 0].tolist() == [105] + [1] * 7
    # second block runs past the end (20 + 8 > 30 is false here); truncate one that does
    blk2 = build_blocks(ids, m, torch.tensor([[26]]), torch.tensor([[True]]), 8, mask_token_id=1)
    assert blk2.label_mask[0, 0].tolist() == [False, True, True, True] + [False] * 4


def test_mask_context_strictly_before_anchor_and_own_block_only():
    anchors = torch.tensor([[4, 6, 11]])
    keep = torch.tensor([[True, True, False]])
    M = block_attention_mask(anchors, keep, seq_len=16, block_size=4)[0, 0]
    assert M.shape == (12, 16 + 12)
    for n, a in enumerate([4, 6, 11]):
        rows = M[n * 4:(n + 1) * 4]
        if n < 2:
            assert rows[:, :a].all() and not rows[:, a:16].any()
        else:
            assert not rows[:, :16].any()  # unused block: no context
        blk = rows[:, 16:]
        assert blk[:, n * 4:(n + 1) * 4].all()
        assert int(blk.sum()) == 16  # nothing of other blocks


def test_no_label_leaks_into_any_query(target):
    """Changing every token from a block's anchor on (inputs, taps and labels) must not move its outputs,
    except through the anchor token itself, which the block legitimately reads."""
    d = tiny_drafter(target, layers=2)
    S, B = 24, 6
    ids = torch.randint(0, 60, (1, S))
    m = _mask([S])
    anchors, keep = torch.tensor([[5, 7, 12]]), torch.tensor([[True, True, True]])
    taps = target(ids, layer_ids=d.config.target_layer_ids).taps

    def run(ids, taps):
        blk = build_blocks(ids, m, anchors, keep, B, mask_token_id=63)
        mask = block_attention_mask(anchors, keep, S, B)
        return d(blk.block_ids.view(1, -1), blk.positions.view(1, -1), taps,
                 torch.arange(S).unsqueeze(0), attention_mask=mask).view(1, 3, B, -1)

    base = run(ids, taps)
    ids2 = ids.clone()
    ids2[0, 8:] = (ids2[0, 8:] + 1) % 60  # everything after the 2nd anchor's own token changes
    taps2 = target(ids2, layer_ids=d.config.target_layer_ids).taps
    out = run(ids2, taps2)
    torch.testing.assert_close(out[0, 0], base[0, 0])  # anchor 5: sees context < 5 and its anchor only
    torch.testing.assert_close(out[0, 1], base[0, 1])  # anchor 7: context < 7
    assert not torch.allclose(out[0, 2], base[0, 2])   # anchor 12: context 8..11 changed -> moves


def test_reveal_positions_pattern():
    g = torch.Generator().manual_seed(0)
    r = reveal_positions((4, 200, 16), p_full=0.5, beta_a=3.0, beta_b=1.0, generator=g)
    assert r[..., 0].all()
    partial = r[..., 1:].any(-1)
    frac_full = 1 - partial.float().mean().item()
    assert 0.4 < frac_full < 0.6
    assert (~r[..., 1:]).sum(-1).min() >= 1  # at least one masked (supervised) offset per block
    none = reveal_positions((2, 50, 8), p_full=1.0, beta_a=3.0, beta_b=1.0, generator=g)
    assert not none[..., 1:].any()


def test_revealed_offsets_are_inputs_and_out_of_loss():
    ids = torch.arange(100, 140).unsqueeze(0)
    m = _mask([40])
    revealed = torch.zeros(1, 1, 8, dtype=torch.bool)
    revealed[0, 0, [0, 2, 5]] = True
    blk = build_blocks(ids, m, torch.tensor([[10]]), torch.tensor([[True]]), 8, 1, revealed)
    assert blk.block_ids[0, 0].tolist() == [110, 1, 112, 1, 1, 115, 1, 1]
    assert blk.label_mask[0, 0].tolist() == [False, True, False, True, True, False, True, True]


def test_decay_weights():
    w = positional_decay_weights(16)
    assert w[0] == 0 and w[1] == 1
    assert math.isclose(float(w[8]), math.exp(-7 / 7), rel_tol=1e-6)
    assert math.isclose(float(positional_decay_weights(8)[2]), math.exp(-1 / 4), rel_tol=1e-6)


def test_awl_weights_are_exclusive_prefix_products():
    alpha = torch.tensor([[1.0, 0.5, 0.4, 0.9, 0.1]], requires_grad=True)
    w = acceptance_weights(alpha)
    assert not w.requires_grad
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 0.5, 0.2, 0.18]]))


def test_acceptance_probability_from_cache_matches_target(target):
    ids = torch.randint(0, 60, (1, 20))
    out = target(ids)
    lse = torch.logsumexp(out.logits, -1)
    positions = torch.tensor([5, 6, 7, 8])
    logprob_of = target_logprob_from_cache(out.final_hidden, lse, target.lm_head.weight,
                                           torch.zeros(4, dtype=torch.long), positions)
    draft_logits = torch.randn(4, 64, dtype=torch.float64)
    revealed = torch.tensor([True, False, False, False])
    alpha = acceptance_probabilities(draft_logits, logprob_of, revealed)
    y = draft_logits.argmax(-1)
    p = torch.softmax(out.logits[0, 4:8].float(), -1)  # target dist of tokens at 5..8 is row 4..7
    q = torch.softmax(draft_logits.float(), -1)
    for k in range(1, 4):
        yk = int(y[k])
        expect = min(1.0, float(p[k, yk]) / float(q[k, yk]))
        assert math.isclose(float(alpha[k]), expect, rel_tol=1e-4, abs_tol=1e-7)
    assert alpha[0] == 1.0


def test_objective_normalises_by_included_weight():
    ce = torch.tensor([2.0, 4.0, 6.0, 8.0], requires_grad=True)
    inc = torch.tensor([1, 1, 0, 1])
    w = torch.tensor([1.0, 0.5, 1.0, 0.0])
    loss = factorized_objective(ce, inc, w)
    assert math.isclose(float(loss), (2 + 2) / (1.5 + 1e-6), rel_tol=1e-6)
    loss.backward()
    assert ce.grad[2] == 0 and ce.grad[3] == 0


def test_recipes_registry_and_ablation_order():
    assert get_recipe("dflash").horizons == (16,) and get_recipe("dflash").weighting == "decay"
    d = get_recipe("dscout")
    assert d.horizons == (8, 16, 24, 32) and d.weighting == "awl" and d.unmask
    assert get_recipe("step4_awl") == d
    assert ABLATION_STEPS[0] == "dflash" and ABLATION_STEPS[-1] == "step4_awl"
    # each step changes exactly one thing relative to the previous one
    for a, b in zip(ABLATION_STEPS, ABLATION_STEPS[1:]):
        ra, rb = RECIPES[a].to_dict(), RECIPES[b].to_dict()
        assert sum(ra[k] != rb[k] for k in ra) == 1, (a, b)
    with pytest.raises(KeyError, match="valid recipes"):
        get_recipe("nope")
    assert get_recipe("dscout", horizons=[4, 8]).horizons == (4, 8)
    g = torch.Generator().manual_seed(0)
    seen = {d.draw_horizon(g) for _ in range(200)}
    assert seen == {8, 16, 24, 32}


@pytest.mark.parametrize("recipe", ["dflash", "dscout", "step3_unmask", "mixed_short"])
def test_training_loss_runs_and_backpropagates(recipe):
    t = tiny_target(dtype=torch.float32)
    d = tiny_drafter(t, layers=1)
    ids = torch.randint(0, 60, (2, 40))
    m = _mask([40, 35], S=40)
    out = t(ids, layer_ids=d.config.target_layer_ids)
    batch = FeatureBatch(ids, m, out.taps, out.final_hidden, torch.logsumexp(out.logits, -1))
    loss, metrics = drafter_training_loss(d, batch, get_recipe(recipe), 8, torch.Generator().manual_seed(0))
    loss.backward()
    assert torch.isfinite(loss) and metrics["supervised"] > 0
    assert d.fc.weight.grad is not None and d.fc.weight.grad.abs().sum() > 0
    assert t.lm_head.weight.grad is None and t.embed_tokens.weight.grad is None


def test_distillation_cross_entropy_is_minimised_by_the_target_distribution():
    from dscout.training.losses import distill_cross_entropy

    g = torch.Generator().manual_seed(0)
    target_logits = torch.randn(3, 7, generator=g, dtype=torch.float64)
    q = target_logits.clone().requires_grad_(True)
    h = distill_cross_entropy(q, target_logits)
    p = torch.softmax(target_logits, -1)
    assert torch.allclose(h, -(p * p.log()).sum(-1).float(), atol=1e-6)  # H(P, P) = entropy of P
    h.sum().backward()
    assert q.grad.abs().max() < 1e-6  # stationary at Q = P
    other = distill_cross_entropy(target_logits + torch.randn(3, 7, generator=g, dtype=torch.float64), target_logits)
    assert (other > h.detach()).all()
