"""Imports of published drafters need the target's shape only: the train_drafter job of a `pretrained:` drafter
loads a weightless skeleton of the target (meta device), so it asks SLURM for no GPU and little memory."""

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import tiny_drafter, tiny_target


def _tensors(folder):
    return {f.relative_to(folder).as_posix(): load_file(str(f)) for f in sorted(folder.rglob("*.safetensors"))}


@pytest.mark.parametrize("kind", ["dflash", "eagle3", "pard2"])
def test_import_through_the_target_skeleton_equals_the_full_load(kind, tmp_path):
    from dscout.models.export import export_dflash
    from dscout.models.pretrained import import_pretrained_drafter, target_skeleton
    from dscout.models.published import write_published_eagle3, write_published_pard2

    t = tiny_target(dtype=torch.float32, layers=6)
    t.model.save_pretrained(str(tmp_path / "target"))
    pub = tmp_path / "published"
    if kind == "dflash":
        export_dflash(tiny_drafter(t, layers=2, block_size=16).float(), pub, dtype=torch.float32)
    elif kind == "eagle3":
        write_published_eagle3(t, pub, draft_vocab_size=32)
    else:
        write_published_pard2(t, pub, num_layers=2)
    skeleton = target_skeleton(tmp_path / "target", torch.float32)
    assert skeleton.device.type == "meta" and skeleton.num_layers == 6 and skeleton.vocab_size == t.vocab_size
    full = import_pretrained_drafter(kind, str(pub), t, tmp_path / "full")
    shape_only = import_pretrained_drafter(kind, str(pub), skeleton, tmp_path / "skeleton")
    assert full == shape_only
    a, b = _tensors(tmp_path / "full"), _tensors(tmp_path / "skeleton")
    assert a.keys() == b.keys() and a
    for name in a:
        for k in a[name]:
            torch.testing.assert_close(b[name][k], a[name][k], msg=f"{name}:{k}")


def test_skeleton_of_a_missing_target_names_the_folder(tmp_path):
    from dscout.models.pretrained import target_skeleton

    with pytest.raises(OSError, match="cannot read the target's config.json from '.*nowhere'"):
        target_skeleton(tmp_path / "nowhere")
