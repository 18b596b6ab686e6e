"""The PARD-2 baseline drafter and loss: truncated copy, one-forward drafting, cache equivalence, training mask,
no label leak, COD, CAT weights, loss descent, save/load."""

import math

import pytest
import torch

from dscout.models.pard import FINAL, Pard2Config, Pard2Drafter, resolve_feature_layers, shift_features
from dscout.training.pard_loss import (
    build_pard_inputs,
    cat_weights,
    cod_keep,
    pard2_loss,
    pard_attention_mask,
    pard_layout,
)

from .conftest import tiny_target


@pytest.fixture(scope="module")
def tgt():
    return tiny_target(dtype=torch.float32)


def make_drafter(tgt, n=2, seed=3, random_proj=True, **kw):
    d = Pard2Drafter.from_target(tgt, num_layers=n, **kw)
    if random_proj:  # zero-initialised by default; randomise so the features matter in the tests
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            d.target_proj.weight.copy_(torch.randn(d.target_proj.weight.shape, generator=g) * 2.0)
    return d.eval()


def seq(S, seed=0, vocab=63):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, S), generator=g)  # never the mask id 63


# ---------------------------------------------------------------------- construction and features
def test_truncated_copy_equals_first_layers(tgt):
    d = Pard2Drafter.from_target(tgt, num_layers=2)
    assert len(d.lm.model.layers) == 2 and d.lm.config.num_hidden_layers == 2
    assert tgt.num_layers == 4 and tgt.model.config.num_hidden_layers == 4  # target untouched
    src = tgt.model.state_dict()
    own = d.lm.state_dict()
    assert any(n.startswith("model.layers.1.") for n in own)
    assert not any(n.startswith("model.layers.2.") for n in own)
    for n, p in own.items():
        torch.testing.assert_close(p, src[n], rtol=0, atol=0)
        assert p.data_ptr() != src[n].data_ptr()  # copies, not shared
    assert all(p.requires_grad for p in d.parameters())
    assert not any(p.requires_grad for p in tgt.model.parameters())
    assert not d.target_proj.weight.any()  # zero init: the untrained drafter is its base LM
    # without features the drafter is the target cut after layer n-1 (+ final norm + head)
    ids = seq(7)
    out = tgt.forward(ids, layer_ids=[1])
    ref = tgt.lm_head(tgt.final_norm(out.taps))
    with torch.no_grad():
        torch.testing.assert_close(d(ids), ref, rtol=1e-5, atol=1e-5)


def test_feature_layer_mapping_and_final_feature(tgt):
    assert resolve_feature_layers([-1, -8, -16, -24], 30) == [FINAL, 22, 14, 6]
    assert resolve_feature_layers([-1, -8, -16, -24], 4) == [FINAL, 0]  # clipped, deduplicated
    with pytest.raises(ValueError, match="negative"):
        resolve_feature_layers([-1, 3], 30)
    d = make_drafter(tgt)
    assert d.tap_layer_ids == [3, 0] and d.config.feature_dim == 2 * 32
    ids = seq(6)
    f, out = d.target_features(tgt, ids)
    assert f.shape == (1, 6, 64)
    torch.testing.assert_close(f[..., :32], out.final_hidden)  # -1 = final-normed output
    torch.testing.assert_close(f[..., 32:], tgt.forward(ids, layer_ids=[0]).taps)


@pytest.mark.parametrize("bad", [-1, 64])
def test_mask_token_must_be_a_vocab_row(tgt, bad):
    with pytest.raises(ValueError, match="mask_token_id"):
        Pard2Drafter.from_target(tgt, num_layers=1, mask_token_id=bad)
    with pytest.raises(ValueError, match="num_layers"):
        Pard2Drafter.from_target(tgt, num_layers=5)


def test_shift_features():
    f = torch.arange(1.0, 5.0).view(1, 4, 1)
    assert shift_features(f).flatten().tolist() == [0, 1, 2, 3]
    assert shift_features(f, 2).flatten().tolist() == [0, 0, 1, 2]
    assert shift_features(f, prev=torch.tensor([[9.0]])).flatten().tolist() == [9, 1, 2, 3]


# ---------------------------------------------------------------------- inference
def test_one_forward_yields_k_drafts_and_cache_keeps_real_tokens(tgt):
    d = make_drafter(tgt)
    ids = seq(5)
    f, _ = d.target_features(tgt, ids)
    calls = []
    h = d.lm.model.register_forward_pre_hook(lambda *a: calls.append(1))
    cache = d.new_cache()
    try:
        drafts = d.draft(ids, shift_features(f), k=6, past_key_values=cache)
    finally:
        h.remove()
    assert len(calls) == 1 and drafts.shape == (6,) and drafts.dtype == torch.long
    assert cache.get_seq_length() == 5  # the 5 mask slots were cropped
    assert d.draft(ids, shift_features(f), k=1).shape == (1,)
    with pytest.raises(ValueError, match="k must"):
        d.draft(ids, None, k=0)


def test_cached_drafting_equals_uncached(tgt):
    d = make_drafter(tgt)
    ids = seq(11, seed=1)
    f, _ = d.target_features(tgt, ids)
    fin = shift_features(f)  # input features of every token
    k = 5
    cache = d.new_cache()
    start = 0
    for end in (4, 5, 8, 11):  # rounds committing 4, 1, 3, 3 real tokens
        got = d.draft_logits(ids[:, start:end], fin[:, start:end], k, past_key_values=cache)
        ref = d.draft_logits(ids[:, :end], fin[:, :end], k)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        assert torch.equal(got.argmax(-1), ref.argmax(-1))
        assert cache.get_seq_length() == end
        start = end


def test_dual_mode_features_matter_and_can_be_dropped(tgt):
    d = make_drafter(tgt)
    ids = seq(6, seed=2)
    f, _ = d.target_features(tgt, ids)
    with_f = d.draft_logits(ids, shift_features(f), 4)
    none = d.draft_logits(ids, None, 4)
    zero = d.draft_logits(ids, torch.zeros_like(f), 4)
    torch.testing.assert_close(none, zero)
    assert not torch.allclose(with_f, none)


def test_inference_matches_training_layout(tgt):
    """Draft j of an inference call = training slot (j, P-1+j): the mask reproduces inference exactly."""
    d = make_drafter(tgt)
    S, k, P = 9, 4, 5
    ids = seq(S, seed=4)
    f, _ = d.target_features(tgt, ids)
    inf = d.draft_logits(ids[:, :P], shift_features(f)[:, :P], k)
    b = build_pard_inputs(ids, f, k, d.config.mask_token_id)
    with torch.no_grad():
        train = d(b.input_ids, b.in_feats, position_ids=b.cols, attention_mask=b.attention_mask)[0]
    slots = [j * S + (P - 1 + j) for j in range(k)]
    torch.testing.assert_close(train[slots].float(), inf, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- training layout
def test_training_mask_pattern_exact():
    S, k = 4, 3
    blocks, cols = pard_layout(S, k)
    assert blocks.tolist() == [0] * 4 + [1] * 4 + [2] * 4 and cols.tolist() == [0, 1, 2, 3] * 3
    rows = [  # keys: (0,0..3) (1,0..3) (2,0..3)
        "1000 0000 0000",  # (0,0)
        "1100 0000 0000",  # (0,1)
        "1110 0000 0000",  # (0,2)
        "1111 0000 0000",  # (0,3)
        "0000 1000 0000",  # (1,0): no real prefix, itself only
        "1000 0100 0000",  # (1,1): x0 + itself
        "1100 0010 0000",  # (1,2)
        "1110 0001 0000",  # (1,3)
        "0000 0000 1000",  # (2,0)
        "0000 1000 0100",  # (2,1): (1,0) + itself
        "1000 0100 0010",  # (2,2): x0, (1,1), itself
        "1100 0010 0001",  # (2,3): x0 x1, (1,2), itself
    ]
    want = torch.tensor([[c == "1" for c in r.replace(" ", "")] for r in rows])
    assert torch.equal(pard_attention_mask(blocks, cols), want)


def test_training_inputs_ids_positions_features():
    ids = torch.tensor([[10, 11, 12, 13]])
    f = torch.arange(1.0, 5.0).view(1, 4, 1)  # feature of x_t = t + 1
    b = build_pard_inputs(ids, f, 3, mask_token_id=63)
    assert b.input_ids.tolist() == [[10, 11, 12, 13] + [63] * 8]
    assert b.cols.tolist() == [0, 1, 2, 3] * 3
    # slot (b, j) carries f_{j-1-b}
    assert b.in_feats.flatten().tolist() == [0, 1, 2, 3, 0, 0, 1, 2, 0, 0, 0, 1]


def test_no_label_leak(tgt):
    d = make_drafter(tgt)
    S, k, j = 10, 4, 5
    ids = seq(S, seed=5)
    f = torch.randn(1, S, d.config.feature_dim, generator=torch.Generator().manual_seed(0))
    ids2, f2 = ids.clone(), f.clone()
    ids2[0, j] = (ids[0, j] + 7) % 63
    f2[0, j] += 1.0
    outs = []
    for x, ff in ((ids, f), (ids2, f2)):
        b = build_pard_inputs(x, ff, k, d.config.mask_token_id)
        with torch.no_grad():
            outs.append(d(b.input_ids, b.in_feats, position_ids=b.cols, attention_mask=b.attention_mask)[0])
    blocks, cols = pard_layout(S, k)
    before = cols - blocks < j  # real-token view ends before position j
    torch.testing.assert_close(outs[0][before], outs[1][before], rtol=0, atol=0)
    changed = (outs[0] - outs[1]).abs().amax(-1) > 1e-6
    assert changed[~before].all()  # and the change does reach every slot that sees x_j


def test_cod_keeps_ancestors_and_matches_full_layout(tgt):
    S, k = 12, 5
    g = torch.Generator().manual_seed(0)
    keep = cod_keep(S, k, r=0.7, r_min=0.1, generator=g)
    blocks, cols = pard_layout(S, k)
    kb, kc = blocks[keep], cols[keep]
    kept = set(zip(kb.tolist(), kc.tolist()))
    assert sum(1 for bb, _ in kept if bb == 0) == S
    for b in range(1, k):
        n = sum(1 for bb, _ in kept if bb == b)
        cands = sum(1 for bb, c in kept if bb == b - 1 and c + 1 < S)
        assert n == min(math.floor(S * max(0.7 ** b, 0.1)), cands)
    assert all((bb - 1, c - 1) in kept for bb, c in kept if bb > 0)
    assert cod_keep(S, k, r=None).tolist() == list(range(S * k))
    # slicing the layout does not change what a kept slot computes
    d = make_drafter(tgt)
    ids = seq(S, seed=6)
    f, _ = d.target_features(tgt, ids)
    outs = []
    for kp in (None, keep):
        b = build_pard_inputs(ids, f, k, d.config.mask_token_id, kp)
        with torch.no_grad():
            outs.append(d(b.input_ids, b.in_feats, position_ids=b.cols, attention_mask=b.attention_mask)[0])
    torch.testing.assert_close(outs[0][keep], outs[1], rtol=1e-5, atol=1e-5)


def test_cat_weights_hand_computed():
    p = torch.tensor([[0.2, 0.5, 0.3], [0.1, 0.3, 0.6], [0.25, 0.25, 0.5], [0.4, 0.4, 0.2]])
    logits = p.log()[None]  # [1, 4, 3]
    ids = torch.tensor([[0, 1, 2, 1]])
    # gold probs: p(x1|x0) = .5, p(x2|x<2) = .6, p(x3|x<3) = .25
    blocks, cols = pard_layout(4, 4)
    w = cat_weights(logits, ids, blocks, cols).view(4, 4)
    want = torch.tensor([[1, 1, 1, 1],
                         [0, .5, .6, .25],
                         [0, 0, .6 * .5, .25 * .6],
                         [0, 0, 0, .25 * .6 * .5]])
    torch.testing.assert_close(w, want)


# ---------------------------------------------------------------------- loss
def _batch(tgt, d, b=2, S=12, seed=7):
    ids = torch.randint(0, 63, (b, S), generator=torch.Generator().manual_seed(seed))
    f, out = d.target_features(tgt, ids)
    mask = torch.ones(b, S, dtype=torch.long)
    mask[:, :3] = 0  # a "prompt"
    return ids, mask, f, out.logits


def test_loss_finite_backprops_and_dropout(tgt):
    d = make_drafter(tgt, random_proj=False).train()
    ids, mask, f, tl = _batch(tgt, d)
    loss, m = pard2_loss(d, ids, mask, f, tl, k=4, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(loss) and m["slots"] < 4 * 12
    torch.testing.assert_close(loss.item(), 0.1 * m["ce"] + m["kl"], rtol=1e-5, atol=1e-6)
    loss.backward()
    assert d.target_proj.weight.grad is not None and d.target_proj.weight.grad.abs().sum() > 0
    assert d.lm.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    # feature dropout with p=1 is the target-independent loss
    a, _ = pard2_loss(d, ids, mask, f, tl, k=4, cod_r=None, feat_drop_p=1.0)
    b, _ = pard2_loss(d, ids, mask, None, tl, k=4, cod_r=None)
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="k must"):
        pard2_loss(d, ids, mask, f, tl, k=0)


def test_loss_decreases_with_adamw(tgt):
    torch.manual_seed(0)
    d = make_drafter(tgt, n=1, random_proj=False).train()
    ids, mask, f, tl = _batch(tgt, d, seed=8)
    opt = torch.optim.AdamW(d.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss, _ = pard2_loss(d, ids, mask, f, tl, k=4, cod_r=None, feat_drop_p=0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.6 * losses[0], losses


def test_save_load_round_trip(tmp_path, tgt):
    d = make_drafter(tgt, mask_token_id=60, draft_k=5, feat_scale=0.05)
    d.save(tmp_path / "pard")
    d2 = Pard2Drafter.load(tmp_path / "pard", tgt).eval()
    assert d2.config == d.config and isinstance(d2.config, Pard2Config)
    s1, s2 = d.state_dict(), d2.state_dict()
    assert s1.keys() == s2.keys()
    for n in s1:
        torch.testing.assert_close(s1[n], s2[n], rtol=0, atol=0)
    ids = seq(6, seed=9)
    f, _ = d.target_features(tgt, ids)
    torch.testing.assert_close(d2.draft_logits(ids, shift_features(f)), d.draft_logits(ids, shift_features(f)))
    assert d2.draft(ids, shift_features(f)).shape == (5,)
    with pytest.raises(FileNotFoundError):
        Pard2Drafter.load(tmp_path / "nothing")


def test_loss_over_supervised_slots_equals_full_layout_formula(tgt):
    """The loss computes logits only on supervised slots; it must equal 0.1 CE + KL weighted over every slot of
    the full layout (weight 0 elsewhere), gradient included."""
    d = make_drafter(tgt)
    ids, mask, f, tl = _batch(tgt, d)
    k, S = 4, ids.shape[1]
    got, _ = pard2_loss(d, ids, mask, f, tl, k=k, cod_r=None, feat_drop_p=0.0)
    batch = build_pard_inputs(ids, f, k, d.config.mask_token_id)
    logq = torch.log_softmax(d(batch.input_ids, batch.in_feats, position_ids=batch.cols,
                               attention_mask=batch.attention_mask).float(), -1)  # [b, k S, V]
    label_pos = (batch.cols + 1).clamp(max=S - 1)
    valid = ((batch.cols >= batch.blocks) & (batch.cols + 1 < S))[None] & mask[:, label_pos].bool()
    w = cat_weights(tl, ids, batch.blocks, batch.cols) * valid
    ce = -logq.gather(-1, ids[:, label_pos][..., None]).squeeze(-1)
    logp = torch.log_softmax(tl[:, batch.cols].float(), -1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    want = (0.1 * (w * ce).sum() + (w * kl).sum()) / w.sum()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    params = [p for p in d.parameters() if p.requires_grad]
    for a, b in zip(torch.autograd.grad(got, params, allow_unused=True),
                    torch.autograd.grad(want, params, allow_unused=True)):
        if a is not None:
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
