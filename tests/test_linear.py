"""oneDNN pre-packed linears (the CPU decoding kernels) and imported published drafters."""

import json

import pytest
import torch

from dscout.decoding.engine import SpeculativeEngine
from dscout.decoding.proposers import BlockDiffusionProposer
from dscout.models.linear import onednn_linear_available, pack_linears, project

from .conftest import tiny_drafter, tiny_target

needs_onednn = pytest.mark.skipif(not onednn_linear_available(), reason="torch build without oneDNN linear")


@needs_onednn
def test_packed_linear_matches_plain_and_keeps_state_dict():
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 80)
    keys = set(lin.state_dict())
    x = torch.randn(2, 5, 48)
    with torch.no_grad():
        ref = lin(x)
    assert pack_linears(lin) == 1
    assert set(lin.state_dict()) == keys and type(lin) is torch.nn.Linear
    with torch.no_grad():
        torch.testing.assert_close(lin(x), ref, atol=1e-5, rtol=1e-5)
        for rows in (1, 3, 16, 40):  # any row count, not only the packing hint
            xi = torch.randn(rows, 48)
            torch.testing.assert_close(lin(xi), xi @ lin.weight.t() + lin.bias, atol=1e-5, rtol=1e-5)


@needs_onednn
def test_packed_linear_trains_and_notices_updated_weights():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    pack_linears(lin)
    x = torch.randn(4, 16)
    lin(x).sum().backward()  # with grad: the plain path, gradients reach the weight
    assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0
    with torch.no_grad():
        lin.weight.add_(1.0)  # the packed copy is now stale: it must not be used
        torch.testing.assert_close(lin(x), x @ lin.weight.t() + lin.bias)


def test_project_never_differentiates_the_head():
    w = torch.randn(10, 6, requires_grad=True)
    x = torch.randn(3, 6, requires_grad=True)
    project(x, w).sum().backward()
    assert w.grad is None and x.grad is not None


@needs_onednn
def test_greedy_speculative_equals_ar_with_packed_kernels():
    t = tiny_target(dtype=torch.float32, layers=4)
    d = tiny_drafter(t, layers=2, block_size=16).float()
    pack_linears(t.model, extra_weights=(t.lm_head.weight,))
    assert pack_linears(d) > 0
    ar = SpeculativeEngine(t, stop_token_ids=[0])
    sd = SpeculativeEngine(t, BlockDiffusionProposer(d.attach_target(t)), stop_token_ids=[0])
    g = torch.Generator().manual_seed(3)
    for _ in range(6):
        prompt = torch.randint(1, 63, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
        a = ar.generate(prompt, 32)
        for bs in (4, 8):
            assert sd.generate(prompt, 32, block_size=bs).output_ids == a.output_ids


def test_import_published_dflash_checkpoint(tmp_path):
    """A DFlash-format folder (as z-lab publishes) imported by the train_drafter job's pretrained path."""
    from dscout.models.export import export_dflash, load_dflash_checkpoint
    from dscout.models.pretrained import import_pretrained_drafter

    t = tiny_target(dtype=torch.float32, layers=6)
    d = tiny_drafter(t, layers=2, block_size=16).float()
    export_dflash(d, tmp_path / "published", dtype=torch.float32)
    summary = import_pretrained_drafter("dflash", str(tmp_path / "published"), t, tmp_path / "out")
    assert summary["pretrained"] == str(tmp_path / "published") and summary["steps"] == 0
    assert json.loads((tmp_path / "out" / "training_summary.json").read_text())["kind"] == "dflash"
    back = load_dflash_checkpoint(tmp_path / "out")
    for k, v in d.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k], v, msg=k)
    with pytest.raises(ValueError, match="cannot import"):
        import_pretrained_drafter("medusa", str(tmp_path / "published"), t, tmp_path / "x")
