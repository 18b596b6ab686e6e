"""The EAGLE-3 baseline drafter: vocab map, config, checkpoint, forward paths, cache, TTT mask and loss."""

import json

import pytest
import torch
from transformers import DynamicCache

from dscout.models.common import to_draft_ids, to_target_ids
from dscout.models.eagle3 import (
    Eagle3Drafter,
    Eagle3DrafterConfig,
    build_vocab_map,
    default_eagle3_layer_ids,
)
from dscout.training.eagle3_loss import eagle3_ttt_loss, ttt_attention_mask, ttt_unroll

from .conftest import tiny_target

V_D = 48


@pytest.fixture(scope="module")
def tgt():
    return tiny_target(dtype=torch.float32)


def make_drafter(target, seed=1, counts=None):
    torch.manual_seed(seed)
    cfg = Eagle3DrafterConfig.from_target(target.config, draft_vocab_size=V_D)
    d = Eagle3Drafter(cfg).attach_target(target)
    if counts is None:
        counts = torch.arange(target.vocab_size).flip(0).float()  # ids 0..47 most frequent
        counts[[50, 60]] += 100.0  # make the kept set non-contiguous
    d.set_vocab_map(*build_vocab_map(counts, V_D))
    return d


def make_batch(target, b=2, S=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (b, S), generator=g)
    layer_ids = default_eagle3_layer_ids(target.num_layers)
    out = target(ids, layer_ids=layer_ids)
    return ids, out.taps, out.logits


# ------------------------------------------------------------------ vocab map
def test_vocab_map_keeps_most_frequent_and_round_trips():
    g = torch.Generator().manual_seed(3)
    counts = torch.randint(0, 1000, (64,), generator=g).float()
    counts[7] = counts[9] = 5000.0  # a tie at the top
    d2t, t2d = build_vocab_map(counts, 20)
    used = torch.arange(20) + d2t
    assert d2t.dtype == torch.long and t2d.dtype == torch.bool and t2d.sum() == 20
    assert torch.all(used[1:] > used[:-1])  # ascending
    assert torch.equal(t2d.nonzero().flatten(), used)
    assert set(used.tolist()) == set(torch.sort(-counts, stable=True).indices[:20].tolist())
    assert 7 in used.tolist() and 9 in used.tolist()
    assert counts[t2d].min() >= counts[~t2d].max()
    draft = torch.arange(20)
    assert torch.equal(to_draft_ids(to_target_ids(draft, d2t), t2d), draft)
    assert torch.equal(to_target_ids(to_draft_ids(used, t2d), d2t), used)
    dropped = (~t2d).nonzero().flatten()
    assert torch.all(to_draft_ids(dropped, t2d) == -1)
    d2t_full, t2d_full = build_vocab_map(counts, 64)  # V_d == V: identity map
    assert torch.all(d2t_full == 0) and t2d_full.all()
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_vocab_map(counts, 65)


# ------------------------------------------------------------------ config
def test_default_layer_ids_and_config(tgt):
    assert default_eagle3_layer_ids(32) == [1, 15, 28]  # HF taps {2, 16, 29} (Llama-3.1-8B)
    assert [i + 1 for i in default_eagle3_layer_ids(36)] == [2, 18, 33]  # Qwen3-4B/8B
    assert [i + 1 for i in default_eagle3_layer_ids(48)] == [2, 24, 45]  # Qwen3-Coder-30B-A3B
    assert default_eagle3_layer_ids(4) == [1, 1, 0]
    with pytest.raises(ValueError, match="too shallow"):
        default_eagle3_layer_ids(3)
    cfg = Eagle3DrafterConfig.from_target(tgt.config, draft_vocab_size=V_D)
    assert cfg.model_type == "dscout_eagle3_drafter"
    assert cfg.target_layer_ids == [1, 1, 0] and cfg.num_target_layers == 4
    assert cfg.hidden_size == cfg.target_hidden_size == 32 and cfg.fused_width == 96
    assert cfg.vocab_size == 64 and cfg.draft_vocab_size == V_D and cfg.head_dim == 8
    assert cfg.num_key_value_heads == 2 and cfg.intermediate_size == 64
    with pytest.raises(ValueError, match="draft_vocab_size"):
        Eagle3DrafterConfig.from_target(tgt.config, draft_vocab_size=65)
    with pytest.raises(ValueError, match="outside"):
        Eagle3DrafterConfig.from_target(tgt.config, draft_vocab_size=8, target_layer_ids=[0, 1, 4])
    d = Eagle3Drafter(cfg)
    assert d.fc.weight.shape == (32, 96) and d.lm_head.weight.shape == (V_D, 32)
    assert d.midlayer.self_attn.q_proj.weight.shape == (32, 64)  # 2H inputs
    assert d.midlayer.self_attn.k_proj.weight.shape == (16, 64)


# ------------------------------------------------------------------ checkpoint
def test_save_load_round_trip_without_embedding(tmp_path, tgt):
    d = make_drafter(tgt)
    d.save_pretrained(tmp_path)
    from safetensors import safe_open

    names = set()
    for f in tmp_path.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            names |= set(h.keys())
    assert not any("embed" in n for n in names), names
    assert {"fc.weight", "lm_head.weight", "d2t", "t2d", "midlayer.hidden_norm.weight",
            "midlayer.self_attn.q_proj.weight", "norm.weight"} <= names
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "dscout_eagle3_drafter" and cfg["draft_vocab_size"] == V_D
    d2 = Eagle3Drafter.from_pretrained(tmp_path)
    ids, taps, _ = make_batch(tgt, b=1, S=6)
    pos = torch.arange(6).unsqueeze(0)
    with pytest.raises(RuntimeError, match="attach_target"):
        d2(ids, taps, pos)
    d2.attach_target(tgt)
    assert sum(p.numel() for p in d2.parameters()) == sum(p.numel() for p in d.parameters())
    assert not any(p is tgt.embed_tokens.weight for p in d2.parameters())
    sd1, sd2 = d.state_dict(), d2.state_dict()
    assert sd1.keys() == sd2.keys()
    for n in sd1:
        assert torch.equal(sd1[n], sd2[n]), n
    assert torch.equal(d2.t2d, d.t2d) and d2.t2d[50] and d2.t2d[60] and not d2.t2d[47]
    with torch.no_grad():
        torch.testing.assert_close(d2(ids, taps, pos)[1], d(ids, taps, pos)[1])


# ------------------------------------------------------------------ forward
def test_fc_path_equals_hidden_path_and_width_is_checked(tgt):
    d = make_drafter(tgt)
    ids, taps, _ = make_batch(tgt, b=2, S=7)
    pos = torch.arange(7).unsqueeze(0).expand(2, 7)
    with torch.no_grad():
        a1, l1 = d(ids, taps, pos)
        a2, l2 = d(ids, d.fc(taps), pos)
    assert a1.shape == (2, 7, 32) and l1.shape == (2, 7, V_D)
    torch.testing.assert_close(a1, a2)
    torch.testing.assert_close(l1, l2)
    torch.testing.assert_close(l1, d.lm_head(d.norm(a1)))
    with pytest.raises(ValueError, match="neither"):
        d(ids, taps[..., :40], pos)


def test_forward_is_causal(tgt):
    d = make_drafter(tgt)
    ids, taps, _ = make_batch(tgt, b=1, S=8)
    pos = torch.arange(8).unsqueeze(0)
    ids2, taps2 = ids.clone(), taps.clone()
    ids2[0, 5:] = (ids2[0, 5:] + 1) % tgt.vocab_size
    taps2[0, 5:] += 1.0
    with torch.no_grad():
        a1, l1 = d(ids, taps, pos)
        a2, l2 = d(ids2, taps2, pos)
    torch.testing.assert_close(a1[:, :5], a2[:, :5])
    torch.testing.assert_close(l1[:, :5], l2[:, :5])
    assert not torch.allclose(l1[:, 5:], l2[:, 5:])


def test_cache_extends_step_by_step_and_crops(tgt):
    d = make_drafter(tgt)
    ids, taps, _ = make_batch(tgt, b=1, S=8)
    pos = torch.arange(8).unsqueeze(0)
    with torch.no_grad():
        _, full = d(ids, taps, pos)
        cache = DynamicCache()
        _, l_pre = d(ids[:, :5], taps[:, :5], pos[:, :5], past_key_values=cache)
        steps = [d(ids[:, t:t + 1], taps[:, t:t + 1], pos[:, t:t + 1], past_key_values=cache)[1]
                 for t in range(5, 8)]
        torch.testing.assert_close(torch.cat([l_pre] + steps, dim=1), full)
        assert cache.get_seq_length() == 8
        cache.crop(-2)  # drop positions 6, 7
        assert cache.get_seq_length() == 6
        _, again = d(ids[:, 6:8], taps[:, 6:8], pos[:, 6:8], past_key_values=cache)
        torch.testing.assert_close(again, full[:, 6:8])


# ------------------------------------------------------------------ TTT
def test_ttt_mask_pattern():
    m = ttt_attention_mask(4, 2)
    expected = torch.tensor([
        [1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0],
        [1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0],
        [1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1],
    ], dtype=torch.bool)
    assert m.dtype == torch.bool and torch.equal(m, expected)
    assert torch.equal(ttt_attention_mask(4, 0), torch.ones(4, 4, dtype=torch.bool).tril())
    assert ttt_attention_mask(4, 1).shape == (4, 8)


def test_ttt_step1_matches_inference_with_own_hidden(tgt):
    """Step 1 at position t == an inference draft step: cache of step-0 keys <= t, hidden a^(0)_t."""
    d = make_drafter(tgt)
    ids, taps, _ = make_batch(tgt, b=1, S=9)
    with torch.no_grad():
        (a0, l0), (a1, l1) = ttt_unroll(d, ids, taps, steps=2)
        n = 8
        _, plain = d(ids[:, 1:], taps[:, :n], torch.arange(n).unsqueeze(0))
        torch.testing.assert_close(l0, plain)  # step 0 = plain causal forward
        for t in (0, 3, 6):
            cache = DynamicCache()
            d(ids[:, 1:t + 2], taps[:, :t + 1], torch.arange(t + 1).unsqueeze(0), past_key_values=cache)
            _, lt = d(ids[:, t + 2:t + 3], a0[:, t:t + 1], torch.tensor([[t + 1]]), past_key_values=cache)
            torch.testing.assert_close(lt[:, 0], l1[:, t])


def test_ttt_loss_backprop_and_masks(tgt):
    d = make_drafter(tgt)
    ids, taps, logits = make_batch(tgt, b=2, S=10)
    loss_mask = torch.ones(2, 10)
    loss_mask[:, :3] = 0
    loss, metrics = eagle3_ttt_loss(d, ids, loss_mask, taps, logits, steps=7)
    assert torch.isfinite(loss) and loss.item() > 0
    assert len(metrics["step_loss"]) == 7 and len(metrics["step_accuracy"]) == 7
    weighted = sum(0.8 ** k * l for k, l in enumerate(metrics["step_loss"]))
    assert abs(weighted - loss.item()) < 1e-4
    # supervised counts: positions t with t+1+k < S, loss_mask and target argmax in the draft vocab
    keep = loss_mask * d.t2d[logits.argmax(-1)].float()
    assert metrics["step_supervised"] == [int(keep[:, 1 + k:].sum()) for k in range(7)]
    loss.backward()
    emb = tgt.embed_tokens.weight
    assert emb.grad is None and not emb.requires_grad
    for p in (d.fc.weight, d.midlayer.self_attn.q_proj.weight, d.midlayer.mlp.down_proj.weight,
              d.midlayer.hidden_norm.weight, d.lm_head.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0
    assert not any("embed" in n for n, _ in d.named_parameters())
    with pytest.raises(ValueError, match="steps"):
        eagle3_ttt_loss(d, ids, loss_mask, taps, logits, steps=0)


def test_ttt_loss_memorises_a_tiny_batch(tgt):
    ids, taps, logits = make_batch(tgt, b=2, S=12, seed=5)
    counts = torch.bincount(ids.flatten(), minlength=tgt.vocab_size).float()
    counts += torch.bincount(logits.argmax(-1).flatten(), minlength=tgt.vocab_size).float()
    d = make_drafter(tgt, counts=counts)
    loss_mask = torch.ones(2, 12)
    steps = 3
    # Soft CE is bounded below by the (masked) entropy of the restricted target: measure the gap (a KL).
    p = logits[..., d.t2d].softmax(-1)
    ent = -(p * p.log()).sum(-1)
    keep = d.t2d[logits.argmax(-1)].float()
    floor = sum(0.8 ** k * float((ent * keep)[:, 1 + k:].sum() / keep[:, 1 + k:].sum()) for k in range(steps))
    opt = torch.optim.AdamW(d.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.0)
    first = None
    for _ in range(30):
        loss, metrics = eagle3_ttt_loss(d, ids, loss_mask, taps, logits, steps=steps)
        first = first if first is not None else (loss.item(), metrics["step_accuracy"][0])
        opt.zero_grad()
        loss.backward()
        opt.step()
    last, m_last = eagle3_ttt_loss(d, ids, loss_mask, taps, logits, steps=steps)
    assert first[0] - floor > 0.3
    assert last.item() - floor < 0.4 * (first[0] - floor), (first, last.item(), floor)
    assert m_last["step_accuracy"][0] > first[1] + 0.3


def test_public_eagle3_layout_loads(tmp_path):
    """A checkpoint in the published LlamaForCausalLMEagle3 layout ('model.' prefix, 'layers.0.' names)."""
    import json as _json

    from safetensors.torch import save_file

    from dscout.models.eagle3 import Eagle3Drafter, Eagle3DrafterConfig, load_public_eagle3

    t = tiny_target(dtype=torch.float32, layers=6)
    cfg = Eagle3DrafterConfig.from_target(t.config, draft_vocab_size=32)
    ref = Eagle3Drafter(cfg)
    state = {"model." + k.replace("midlayer.", "layers.0."): v for k, v in ref.state_dict().items()
             if not k.startswith("rotary_emb")}
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(_json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_parameters["rope_theta"], "vocab_size": 64, "draft_vocab_size": 32,
        "num_hidden_layers": 1}))
    d = load_public_eagle3(str(tmp_path), t.config, dtype=torch.float32)
    assert d.config.target_layer_ids == [1, 2, 2]
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(d.state_dict()[k], v, msg=k)
