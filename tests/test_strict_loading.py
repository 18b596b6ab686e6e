"""Every drafter and target load refuses a checkpoint with a missing or unexpected tensor, naming it."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from dscout.models.eagle3 import Eagle3Drafter, Eagle3DrafterConfig
from dscout.models.strict import load_strict
from dscout.models.target import TargetModel

from .conftest import tiny_target


def _break(path, drop: str | None = None, add: str | None = None):
    f = next(path.rglob("model.safetensors"))
    sd = load_file(str(f))
    if drop:
        key = next(k for k in sd if drop in k)
        sd.pop(key)
    if add:
        sd[add] = torch.zeros(2)
    save_file(sd, str(f), metadata={"format": "pt"})
    return key if drop else add


def test_eagle3_drafter_without_its_lm_head_is_refused(tmp_path):
    t = tiny_target(layers=4, dtype=torch.float32)
    d = Eagle3Drafter(Eagle3DrafterConfig.from_target(t.config, draft_vocab_size=32))
    d.save_pretrained(str(tmp_path))
    assert isinstance(load_strict(Eagle3Drafter, tmp_path, "EAGLE-3 drafter"), Eagle3Drafter)  # intact: loads
    _break(tmp_path, drop="lm_head.weight")
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\]"):
        load_strict(Eagle3Drafter, tmp_path, "EAGLE-3 drafter")


def test_eagle3_drafter_with_a_foreign_tensor_is_refused(tmp_path):
    t = tiny_target(layers=4, dtype=torch.float32)
    Eagle3Drafter(Eagle3DrafterConfig.from_target(t.config, draft_vocab_size=32)).save_pretrained(str(tmp_path))
    _break(tmp_path, add="midlayer.extra.weight")
    with pytest.raises(ValueError, match=r"unexpected \['midlayer.extra.weight'\]"):
        load_strict(Eagle3Drafter, tmp_path, "EAGLE-3 drafter")


def test_pard2_drafter_without_a_q_proj_is_refused(tmp_path):
    from dscout.models.pard import Pard2Drafter

    t = tiny_target(layers=4, dtype=torch.float32)
    d = Pard2Drafter.from_target(t, 2, mask_token_id=3, target_layer_ids=[-1, -2], draft_k=4)
    d.save(tmp_path)
    Pard2Drafter.load(tmp_path, target=t, dtype=torch.float32)  # intact: loads
    key = _break(tmp_path, drop="layers.1.self_attn.q_proj")
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        Pard2Drafter.load(tmp_path, target=t, dtype=torch.float32)


def test_target_without_a_layer_tensor_is_refused(tmp_path):
    tiny_target(layers=4, dtype=torch.float32).model.save_pretrained(str(tmp_path))
    key = _break(tmp_path, drop="layers.2.mlp.up_proj")
    with pytest.raises(ValueError, match=r"missing \[.*" + key.replace(".", r"\.")):
        TargetModel.load(tmp_path, dtype=torch.float32, device="cpu")
