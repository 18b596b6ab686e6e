"""Target taps: id l = output of decoder layer l = HF hidden_states[l + 1], before the final norm."""

import pytest
import torch

from dscout.models.target import default_target_layer_ids

from .conftest import tiny_target


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_taps_follow_hidden_states_plus_one(family):
    t = tiny_target(family=family, layers=4)
    ids = torch.randint(0, 64, (2, 9))
    hf = t.model(ids, output_hidden_states=True).hidden_states  # L + 1 entries, [0] = embeddings
    out = t(ids, layer_ids=[0, 1, 2])
    d = t.hidden_size
    for j, lid in enumerate([0, 1, 2]):
        torch.testing.assert_close(out.taps[..., j * d:(j + 1) * d], hf[lid + 1])
    # layer 0's output is not the embedding (the classic off-by-one)
    assert not torch.allclose(out.taps[..., :d], hf[0])


def test_last_layer_tap_is_before_final_norm():
    t = tiny_target(layers=4)
    ids = torch.randint(0, 64, (1, 7))
    hf = t.model(ids, output_hidden_states=True).hidden_states
    out = t(ids, layer_ids=[3])
    # HF's last entry is the final-normed state; our tap of the last layer is the raw residual stream
    torch.testing.assert_close(hf[4], out.final_hidden)
    assert not torch.allclose(out.taps, hf[4])
    torch.testing.assert_close(t.model.model.norm(out.taps), out.final_hidden)


def test_tap_order_follows_layer_ids_and_range_is_checked():
    t = tiny_target(layers=4)
    ids = torch.randint(0, 64, (1, 5))
    a = t(ids, layer_ids=[2, 0]).taps
    b = t(ids, layer_ids=[0, 2]).taps
    d = t.hidden_size
    torch.testing.assert_close(a[..., :d], b[..., d:])
    with pytest.raises(IndexError, match="outside"):
        t(ids, layer_ids=[4])


def test_logits_and_cache_match_full_forward():
    t = tiny_target()
    ids = torch.randint(0, 64, (1, 12))
    full = t(ids).logits
    cache = t.new_cache()
    a = t(ids[:, :8], past_key_values=cache).logits
    b = t(ids[:, 8:], past_key_values=cache).logits
    torch.testing.assert_close(torch.cat([a, b], 1), full)


def test_embedding_and_head_are_frozen():
    t = tiny_target()
    assert not t.embed_tokens.weight.requires_grad
    assert not t.lm_head.weight.requires_grad
    assert t.embed_tokens.weight.shape == (64, 32)


def test_default_layer_rule_matches_upstream():
    # docs/method.md §2: Qwen3-4B/8B (36 layers), 5 draft layers -> [1, 9, 17, 25, 33]
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(24, 5) == [1, 6, 11, 16, 21]
    assert default_target_layer_ids(36, 1) == [18]
    assert default_target_layer_ids(30, 28) == list(range(1, 29))
    with pytest.raises(ValueError):
        default_target_layer_ids(4, 5)


def test_all_layer_taps_stop_below_the_last_layer():
    assert default_target_layer_ids(36, 35) == list(range(0, 35))  # the paper's 35t on Qwen3-8B
    with pytest.raises(ValueError, match="at most"):
        default_target_layer_ids(36, 36)
