"""The DFlash drafter: config checks, checkpoint round trip, attention pattern, cache equivalence."""

import json

import pytest
import torch
from transformers import DynamicCache

from dscout.models.drafter import DFlashDrafter, DFlashDrafterConfig

from .conftest import tiny_drafter, tiny_target


def test_config_label_and_explicit_layer_ids(target):
    cfg = DFlashDrafterConfig.from_target(target.config, num_hidden_layers=2, target_layer_ids=[0, 1, 3],
                                          mask_token_id=5)
    assert cfg.label == "3t2d"
    assert cfg.target_layer_ids == [0, 1, 3]
    assert cfg.hidden_size == target.hidden_size and cfg.num_target_layers == 4


@pytest.mark.parametrize("bad", [-1, 64, 1000])
def test_mask_token_must_be_an_embedding_row(target, bad):
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashDrafterConfig.from_target(target.config, num_hidden_layers=1, mask_token_id=bad)


def test_layer_ids_are_checked(target):
    with pytest.raises(ValueError, match="outside"):
        DFlashDrafterConfig.from_target(target.config, num_hidden_layers=1, target_layer_ids=[1, 9],
                                        mask_token_id=3)
    with pytest.raises(ValueError, match="distinct"):
        DFlashDrafterConfig.from_target(target.config, num_hidden_layers=1, target_layer_ids=[1, 1],
                                        mask_token_id=3)


def test_save_load_round_trip_excludes_target_parts(tmp_path, target):
    d = tiny_drafter(target, layers=2)
    d.save_pretrained(tmp_path)
    from safetensors import safe_open

    files = list(tmp_path.glob("*.safetensors"))
    names = set()
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            names |= set(h.keys())
    assert not any("embed" in n or "lm_head" in n for n in names), names
    assert "fc.weight" in names and "layers.1.self_attn.k_norm.weight" in names
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["target_layer_ids"] == d.config.target_layer_ids and cfg["mask_token_id"] == 63
    d2 = DFlashDrafter.from_pretrained(tmp_path).to(target.dtype)
    with pytest.raises(RuntimeError, match="attach_target"):
        d2.embed(torch.tensor([[1]]))
    d2.attach_target(target)
    for (n1, p1), (n2, p2) in zip(d.state_dict().items(), d2.state_dict().items()):
        assert n1 == n2
        torch.testing.assert_close(p1, p2)
    assert sum(p.numel() for p in d2.parameters()) == sum(p.numel() for p in d.parameters())


def test_attach_checks_shapes(target):
    other = tiny_target(vocab=80)
    d = tiny_drafter(target)
    with pytest.raises(ValueError, match="embedding"):
        d.attach_target(other)


def _ctx(target, d, n):
    ids = torch.randint(0, 60, (1, n))
    return ids, target(ids, layer_ids=d.config.target_layer_ids).taps


def test_block_is_bidirectional_and_context_is_used(target, drafter):
    ids, taps = _ctx(target, drafter, 10)
    pos = torch.arange(10, 14).unsqueeze(0)
    blk = torch.tensor([[5, 63, 63, 63]])
    h = drafter(blk, pos, taps, torch.arange(10).unsqueeze(0))
    blk2 = blk.clone()
    blk2[0, 3] = 7  # change the *last* block token: earlier offsets must see it (non-causal)
    h2 = drafter(blk2, pos, taps, torch.arange(10).unsqueeze(0))
    assert not torch.allclose(h[0, 1], h2[0, 1])
    taps2 = taps.clone()
    taps2[0, 0] += 1.0  # and the context matters
    h3 = drafter(blk, pos, taps2, torch.arange(10).unsqueeze(0))
    assert not torch.allclose(h[0, 1], h3[0, 1])


def test_cached_context_equals_full_context(target, drafter):
    ids, taps = _ctx(target, drafter, 12)
    pos = torch.arange(12, 16).unsqueeze(0)
    blk = torch.tensor([[5, 63, 63, 63]])
    full = drafter(blk, pos, taps, torch.arange(12).unsqueeze(0))
    cache = DynamicCache()
    drafter.materialize_context(taps[:, :7], torch.arange(7).unsqueeze(0), cache)
    out = drafter(blk, pos, taps[:, 7:], torch.arange(7, 12).unsqueeze(0), past_key_values=cache)
    torch.testing.assert_close(out, full)
    assert cache.get_seq_length() == 12  # block K/V were cropped, context kept
    again = drafter(blk, pos, past_key_values=cache)
    torch.testing.assert_close(again, full)


def test_rope_positions_are_absolute(target, drafter):
    ids, taps = _ctx(target, drafter, 8)
    blk = torch.tensor([[5, 63, 63]])
    a = drafter(blk, torch.arange(8, 11).unsqueeze(0), taps, torch.arange(8).unsqueeze(0))
    b = drafter(blk, torch.arange(20, 23).unsqueeze(0), taps, torch.arange(8).unsqueeze(0))
    assert not torch.allclose(a, b)


def test_tap_scale_reparameterisation_folds_into_fc(target):
    d = tiny_drafter(target, layers=1)
    ids, taps = _ctx(target, d, 9)
    blk = torch.tensor([[5, 63, 63]])
    pos = torch.arange(9, 12).unsqueeze(0)
    scale = torch.rand(taps.shape[-1], dtype=taps.dtype) * 10 + 0.1
    d.set_tap_scale(scale)
    with torch.no_grad():
        d.fc.weight.normal_()  # "trained" W' on standardised taps
    scaled = d(blk, pos, taps, torch.arange(9).unsqueeze(0))
    d.fold_tap_scale()
    assert torch.all(d.tap_scale == 1)
    folded = d(blk, pos, taps, torch.arange(9).unsqueeze(0))
    torch.testing.assert_close(folded, scaled)
    assert "tap_scale" not in d.state_dict()
