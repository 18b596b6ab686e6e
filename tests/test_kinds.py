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


@pytest.mark.parametrize("name", sorted(DRAFTER_KINDS))
def test_every_built_in_kind_implements_the_protocols(name):
    """Each entry's training method, drafter and proposer classes have every method of dscout.protocols."""
    from dscout.kinds import check_kind, check_part
    from dscout.protocols import Drafter, Proposer, TrainingMethod, missing_members

    k = DRAFTER_KINDS[name]
    check_kind(k)  # raises TypeError on a missing member
    assert k.drafter_class and k.proposer_class  # every built-in kind names its classes: all are checked
    assert missing_members(check_part(k, "training_method"), TrainingMethod) == []
    assert missing_members(check_part(k, "drafter_class"), Drafter) == []
    assert missing_members(check_part(k, "proposer_class"), Proposer) == []


def test_drafters_with_a_draft_vocabulary_share_one_vocabulary_map():
    """DFlash (options.draft_vocab_size) and EAGLE-3 map draft indices with the same two names."""
    from dscout.kinds import check_part
    from dscout.protocols import ReducedVocabDrafter, missing_members

    for name in ("dflash", "eagle3"):
        assert missing_members(check_part(DRAFTER_KINDS[name], "drafter_class"), ReducedVocabDrafter) == []


class _HalfMethod:
    """A training method without ``loss`` and ``save``."""

    kind = "broken"

    def __init__(self, cfg):
        self.cfg = cfg

    def build(self, target):
        return None

    def prepare(self, source, target):
        pass


def test_registering_a_kind_whose_class_misses_protocol_members_names_them(monkeypatch):
    """register() refuses an entry whose training method lacks loss and save, naming kind, class and members,
    and leaves the registry as it was; resolve() refuses such an entry slipped in by hand the same way."""
    import dscout.kinds as kinds

    monkeypatch.setattr(kinds, "DRAFTER_KINDS", dict(DRAFTER_KINDS))
    monkeypatch.setattr(kinds, "METHOD_KINDS", dict(METHOD_KINDS))
    good = DRAFTER_KINDS["dflash"]
    broken = kinds.DrafterKind("broken", ("broken",), kinds._block_diffusion_layers, f"{__name__}:_HalfMethod",
                               good.proposer, good.pretrained, None)
    msg = r"drafter kind 'broken': its training method tests.test_kinds:_HalfMethod does not implement " \
          r"dscout.protocols.TrainingMethod: missing loss, save"
    with pytest.raises(TypeError, match=msg):
        kinds.register(broken)
    assert "broken" not in kinds.DRAFTER_KINDS and "broken" not in kinds.METHOD_KINDS
    kinds.DRAFTER_KINDS["broken"] = broken
    with pytest.raises(TypeError, match=msg):
        kinds.resolve("broken", "training_method")
    # a drafter class without compute_logits is named the same way
    no_logits = kinds.DrafterKind("broken2", ("broken2",), kinds._block_diffusion_layers, good.training_method,
                                  good.proposer, good.pretrained, None, drafter_class=f"{__name__}:_HalfMethod")
    with pytest.raises(TypeError, match=r"'broken2': its drafter tests.test_kinds:_HalfMethod does not implement "
                                        r"dscout.protocols.Drafter: missing compute_logits, embed"):
        kinds.register(no_logits)


def test_a_complete_kind_registers_and_resolves(monkeypatch):
    import dscout.kinds as kinds

    monkeypatch.setattr(kinds, "DRAFTER_KINDS", dict(DRAFTER_KINDS))
    monkeypatch.setattr(kinds, "METHOD_KINDS", dict(METHOD_KINDS))
    good = DRAFTER_KINDS["dflash"]
    copy = kinds.register(kinds.DrafterKind("dflash_copy2", ("dflash_copy2",), kinds._block_diffusion_layers,
                                            good.training_method, good.proposer, good.pretrained, None,
                                            drafter_class=good.drafter_class, proposer_class=good.proposer_class))
    assert kinds.method_kind("dflash_copy2") is copy
    assert kinds.resolve("dflash_copy2", "training_method") is load(good.training_method)
    with pytest.raises(ValueError, match="registered already"):
        kinds.register(copy)
