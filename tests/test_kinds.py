"""The drafter-kind registry: every entry resolves, and each dispatch site goes through it."""

from pathlib import Path

import pytest

from dscout import config as dcfg
from dscout.kinds import BLOCK_DIFFUSION, DRAFTER_KINDS, METHOD_KINDS, drafter_kind, load, method_kind


@pytest.mark.parametrize("name", sorted(DRAFTER_KINDS))
def test_every_entry_resolves_to_callables(name):
    k = DRAFTER_KINDS[name]
    for ref in (k.training_method, k.proposer, k.pretrained):
        assert callable(load(ref)), ref
    ids = k.layer_ids({"kind": name, "num_layers": 2, "num_taps": 3}, 30)
    assert ids and all(0 <= i < 30 for i in ids)


def test_method_kinds_map_to_their_drafter_kind():
    assert BLOCK_DIFFUSION == {"dflash", "dscout"}
    assert {m: k.name for m, k in METHOD_KINDS.items()} == {"dflash": "dflash", "dscout": "dflash",
                                                           "eagle3": "eagle3", "pard2": "pard2"}
    with pytest.raises(KeyError, match="valid: dflash, eagle3, pard2"):
        drafter_kind("medusa")
    with pytest.raises(KeyError, match="unknown method kind 'medusa'"):
        method_kind("medusa")


def test_layer_ids_of_the_default_drafters_come_from_the_registry():
    cfg = dcfg.load_config(Path(__file__).resolve().parents[1] / "config.yaml")
    got = {n: dcfg.resolved_layer_ids(dcfg.drafter_variant(cfg, n), 30) for n in cfg["drafters"]}
    assert got == {"dflash": [1, 8, 14, 20, 27], "dscout": [1, 8, 14, 20, 27], "eagle3": [1, 14, 26],
                   "pard2": [29, 22, 14, 6]}


def test_a_new_kind_is_one_entry(monkeypatch):
    """A registered kind is planned, trained and decoded through the entry alone (here: a copy of dflash)."""
    import dscout.kinds as kinds

    entry = kinds.DrafterKind("dflash_copy", ("dflash_copy",), kinds._block_diffusion_layers,
                              DRAFTER_KINDS["dflash"].training_method, DRAFTER_KINDS["dflash"].proposer,
                              DRAFTER_KINDS["dflash"].pretrained, None)
    monkeypatch.setitem(kinds.DRAFTER_KINDS, "dflash_copy", entry)
    monkeypatch.setitem(kinds.METHOD_KINDS, "dflash_copy", entry)
    assert dcfg.resolved_layer_ids({"kind": "dflash_copy", "num_layers": 1, "num_taps": 2}, 4) == [1, 2]
    from dscout.backends.sglang import server_command

    with pytest.raises(KeyError, match="has no SGLang server"):
        server_command("m", {"kind": "dflash_copy", "block_size": 4}, 1, 1, "d")
    assert "DFLASH" in server_command("m", {"kind": "dscout", "block_size": 4}, 1, 1, "d")
