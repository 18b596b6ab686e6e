"""DFlash checkpoint format: a tiny drafter round-trips through what SGLang's DFLASH loader reads."""

import json

import pytest
import torch

from dscout.decoding.engine import SpeculativeEngine
from dscout.decoding.proposers import BlockDiffusionProposer
from dscout.models.export import (check_dflash_checkpoint, expected_tensor_names, export_dflash,
                                  load_dflash_checkpoint)

from .conftest import tiny_drafter, tiny_target


def test_export_has_every_key_and_tensor_sglang_reads(tmp_path):
    t = tiny_target(layers=6)
    d = tiny_drafter(t, layers=2, layer_ids=[1, 3, 4], block_size=16)
    out = export_dflash(d, tmp_path / "ckpt", dtype=torch.float32)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"] == {"target_layer_ids": [1, 3, 4], "mask_token_id": 63, "block_size": 16}
    assert cfg["block_size"] == 16 and cfg["num_target_layers"] == 6 and cfg["num_hidden_layers"] == 2
    assert check_dflash_checkpoint(out) == []
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), framework="pt") as h:
        names = set(h.keys())
        assert tuple(h.get_slice("fc.weight").get_shape()) == (32, 3 * 32)
    assert set(expected_tensor_names(2)) <= names
    assert not any("embed" in n or "lm_head" in n for n in names)


def test_round_trip_keeps_the_drafter_and_its_outputs(tmp_path):
    t = tiny_target()
    d = tiny_drafter(t, layers=2, layer_ids=[0, 2], block_size=8)
    out = export_dflash(d, tmp_path / "ckpt", dtype=torch.float64)
    d2 = load_dflash_checkpoint(out, dtype=torch.float64).attach_target(t)
    for (n, a), (_, b) in zip(d.state_dict().items(), d2.state_dict().items()):
        torch.testing.assert_close(a, b, msg=n)
    a = SpeculativeEngine(t, BlockDiffusionProposer(d)).generate([3, 4, 5, 6], 24, block_size=8)
    b = SpeculativeEngine(t, BlockDiffusionProposer(d2)).generate([3, 4, 5, 6], 24, block_size=8)
    assert a.output_ids == b.output_ids and a.accept_lengths == b.accept_lengths


def test_published_layout_with_model_prefix_and_top_level_block_size(tmp_path):
    """z-lab's checkpoints keep block_size at the top level and may prefix tensors with 'model.'."""
    t = tiny_target()
    d = tiny_drafter(t, layers=1, layer_ids=[1, 2], block_size=16)
    out = export_dflash(d, tmp_path / "z", dtype=torch.float32)
    cfg = json.loads((out / "config.json").read_text())
    cfg["dflash_config"].pop("block_size")
    (out / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file, save_file

    st = load_file(str(out / "model.safetensors"))
    save_file({"model." + k: v for k, v in st.items()}, str(out / "model.safetensors"))
    d2 = load_dflash_checkpoint(out)
    assert d2.config.block_size == 16 and d2.config.target_layer_ids == [1, 2]


def test_unloadable_checkpoints_are_reported(tmp_path):
    t = tiny_target(layers=4)
    d = tiny_drafter(t, layers=1, layer_ids=[1, 3])
    with pytest.raises(ValueError, match="cannot be captured"):
        export_dflash(d, tmp_path / "bad")
    d = tiny_drafter(t, layers=1, layer_ids=[1, 2])
    out = export_dflash(d, tmp_path / "ok")
    cfg = json.loads((out / "config.json").read_text())
    del cfg["dflash_config"]["mask_token_id"]
    (out / "config.json").write_text(json.dumps(cfg))
    assert any("mask_token_id" in p for p in check_dflash_checkpoint(out))
    with pytest.raises(ValueError, match="not a loadable"):
        load_dflash_checkpoint(out)
