"""DeepSpeed trainer on CPU (gloo, one process): resumes after a kill with the same data order and result."""

import json

import pytest
import torch

from dscout.models.export import load_dflash_checkpoint
from dscout.training.features import FeatureCache, build_feature_cache
from dscout.training.trainer import TrainConfig, sample_indices, train_drafter

from .conftest import greedy_sequences, tiny_target


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny float32 target, its own greedy responses as training data, and their feature cache."""
    t = tiny_target(dtype=torch.float32, seed=5, init=0.3)
    seqs = greedy_sequences(t)
    cache = tmp_path_factory.mktemp("features")
    build_feature_cache(t, seqs, [1, 2, 3], cache, shard_size=10, batch_size=4)
    return t, seqs, cache


def _cfg(**kw):
    base = dict(recipe="dscout", num_layers=1, target_layer_ids=[1, 3], mask_token_id=63, num_anchors=8,
                micro_batch_size=2, lr=3e-3, max_steps=8, checkpoint_every=3, seed=11)
    base.update(kw)
    return TrainConfig(**base)


def _log(path):
    return [json.loads(l) for l in path.read_text().splitlines()]


def test_feature_cache_round_trip(setup):
    t, seqs, cache = setup
    fc = FeatureCache(cache, [3, 1])
    assert len(fc) == 24
    item = fc.get(13)
    assert item["input_ids"].tolist() == seqs[13]["input_ids"]
    out = t(torch.tensor([seqs[13]["input_ids"]]), layer_ids=[3, 1])
    torch.testing.assert_close(item["taps"].float(), out.taps[0], atol=2e-3, rtol=2e-3)  # stored as float16
    torch.testing.assert_close(item["lse"], torch.logsumexp(out.logits[0], -1), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="not in the feature cache"):
        FeatureCache(cache, [0])


def test_data_order_is_a_function_of_step():
    a = [sample_indices(s, 0, 1, 3, 10, seed=1) for s in range(8)]
    b = [sample_indices(s, 0, 1, 3, 10, seed=1) for s in range(8)]
    assert a == b
    first_epoch = sum(a[:4], [])[:10]
    assert sorted(first_epoch) == list(range(10))  # a permutation per epoch


def test_resume_after_kill_reaches_same_state(setup, tmp_path, monkeypatch):
    from dscout.training import trainer
    from tests.fault_injection.sitecustomize import crash_before_update

    t, _, cache = setup
    ref = train_drafter(t, _cfg(), tmp_path / "ref", tmp_path / "ref_work", feature_cache=cache)
    with monkeypatch.context() as mp, pytest.raises(RuntimeError, match="simulated crash after step 4"):
        crash_before_update(trainer, 5, mp.setattr)  # killed after update 4 (checkpoint_every 3: saved at 3)
        train_drafter(t, _cfg(), tmp_path / "run", tmp_path / "run_work", feature_cache=cache)
    assert (tmp_path / "run_work" / "checkpoints" / "latest").exists()
    assert not (tmp_path / "run" / "config.json").exists()
    out = train_drafter(t, _cfg(), tmp_path / "run", tmp_path / "run_work", feature_cache=cache)
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["resumed_from_step"] == 3 and summary["steps"] == 8
    la, lb = _log(ref / "train_log.jsonl"), _log(out / "train_log.jsonl")
    assert [r["step"] for r in lb] == list(range(8))
    assert [r["sample_ids"] for r in la] == [r["sample_ids"] for r in lb]
    assert [r["block_size"] for r in la] == [r["block_size"] for r in lb]
    for ra, rb in zip(la, lb):
        assert abs(ra["loss"] - rb["loss"]) < 1e-4
    da, db = load_dflash_checkpoint(ref), load_dflash_checkpoint(out)
    for (n, pa), (_, pb) in zip(da.state_dict().items(), db.state_dict().items()):
        torch.testing.assert_close(pa, pb, atol=1e-5, rtol=1e-4, msg=n)


def test_training_lowers_the_loss(setup, tmp_path):
    t, _, cache = setup
    out = train_drafter(t, _cfg(recipe="dflash", max_steps=150, checkpoint_every=0, lr=5e-3), tmp_path / "d",
                        tmp_path / "w", feature_cache=cache)
    log = _log(out / "train_log.jsonl")
    first = sum(r["loss"] for r in log[:10]) / 10
    last = sum(r["loss"] for r in log[-10:]) / 10
    assert last < first * 0.85, (first, last)
    lr = [r["lr"] for r in log]
    assert max(lr) <= 5e-3 + 1e-12 and lr[-1] < lr[len(lr) // 2]  # warmup + cosine decay


@pytest.mark.parametrize("kind, options, layer_ids", [
    ("eagle3", {"draft_vocab_size": 32, "ttt_steps": 3}, [1, 2, 3]),
    ("pard2", {"draft_k": 4, "feature_layers": [-1, -2]}, None),
])
def test_baselines_train_through_the_same_loop(setup, tmp_path, kind, options, layer_ids):
    t, seqs, cache = setup
    cfg = _cfg(kind=kind, options=options, target_layer_ids=layer_ids, num_layers=2, max_steps=6,
               checkpoint_every=0)
    if kind == "pard2":  # its taps (final + layer L-2) are not all in the fixture cache: online features
        out = train_drafter(t, cfg, tmp_path / kind, tmp_path / "w", sequences=seqs)
    else:
        out = train_drafter(t, cfg, tmp_path / kind, tmp_path / "w", feature_cache=cache)
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["kind"] == kind and summary["steps"] == 6
    log = _log(out / "train_log.jsonl")
    assert len(log) == 6 and all(r["loss"] == r["loss"] for r in log)  # finite (not NaN)


def test_training_steps_flush_subnormals_then_restore_ieee(setup, tmp_path, monkeypatch):
    """AWL weights underflow to subnormals, which x86 CPUs compute in microcode (3x slower DScout steps): the
    training loop flushes them to zero while it runs and leaves IEEE behaviour in place after."""
    from dscout.training import methods, trainer

    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormal floats")
    subnormal = torch.tensor([1e-42])
    seen = []
    original = methods.DFlashMethod.loss

    def spying_loss(self, *args, **kw):
        seen.append(float(subnormal * 1.0))
        return original(self, *args, **kw)

    monkeypatch.setattr(methods.DFlashMethod, "loss", spying_loss)
    t, _, cache = setup
    trainer.train_drafter(t, _cfg(max_steps=3, checkpoint_every=0), tmp_path / "d", tmp_path / "w",
                          feature_cache=cache)
    assert seen == [0.0, 0.0, 0.0]  # every training step ran with subnormals flushed
    assert float(subnormal * 1.0) > 0.0  # and the process is back to IEEE arithmetic


def test_fc_last_tap_init_gives_the_targets_own_context_at_step_0(setup):
    """`options.fc_init: last_tap`: after prepare, c = hidden_norm(fc(taps)) is the normalised input the target's
    layer L - d sees (the deepest tap passed through, the first copied layer's input norm); the default random
    fc is not. A wrong slot, a missing tap-scale factor or the wrong norm fails it."""
    t, _, cache = setup  # 4 layers, taps {1, 2, 3} cached; d = 1 copies layer 3, whose input is tap 2
    norm = t.layers[3].input_layernorm.weight
    saved = norm.detach().clone()
    with torch.no_grad():  # a non-trivial norm scale (a fresh one is all ones), restored below
        norm.copy_(torch.linspace(0.5, 2.0, norm.numel()).to(norm))
    try:
        _check_fc_init(t, cache)
    finally:
        with torch.no_grad():
            norm.copy_(saved)


def _check_fc_init(t, cache):
    from dscout.training.methods import DFlashMethod

    for fc_init, expect_equal in (("last_tap", True), ("random", False)):
        cfg = _cfg(target_layer_ids=[1, 2], init_from_target=True, dtype="float32",
                   options={"fc_init": fc_init})
        method = DFlashMethod(cfg)
        drafter = method.build(t)
        source = FeatureCache(cache, [1, 2])
        method.prepare(source, t)
        taps = source.batch([0, 1], torch.float32).taps  # [b, S, 2 * D]
        D = taps.shape[-1] // 2
        with torch.no_grad():
            c = drafter.fuse_context(taps)
            want = t.layers[3].input_layernorm(taps[..., D:])
        assert torch.allclose(c, want, atol=1e-4) is expect_equal, fc_init
    method = DFlashMethod(_cfg(dtype="float32", options={"fc_init": "identity"}))
    method.build(t)
    with pytest.raises(ValueError, match="fc_init"):
        method.prepare(FeatureCache(cache, [1, 3]), t)


def test_bfloat16_autocast_trains_with_float32_weights(setup, tmp_path):
    """``training.autocast: bfloat16``: the loss is computed in bfloat16 (it differs from the float32 run's at the
    same step, by rounding only), the drafter still learns, and what is saved stays float32 (weights, gradients and
    optimizer are never cast). A flag that did not reach ``torch.autocast`` gives identical losses and fails here."""
    t, _, cache = setup
    kw = dict(recipe="dflash", max_steps=60, checkpoint_every=0, lr=5e-3)
    ref = train_drafter(t, _cfg(**kw), tmp_path / "f32", tmp_path / "w32", feature_cache=cache)
    out = train_drafter(t, _cfg(**kw, autocast="bfloat16"), tmp_path / "bf16", tmp_path / "wbf", feature_cache=cache)
    la, lb = _log(ref / "train_log.jsonl"), _log(out / "train_log.jsonl")
    assert [r["sample_ids"] for r in la] == [r["sample_ids"] for r in lb]  # same data, same order
    assert la[0]["loss"] != lb[0]["loss"]  # bfloat16 matmuls round differently ...
    assert abs(la[0]["loss"] - lb[0]["loss"]) < 0.05 * la[0]["loss"]  # ... but compute the same loss
    first = sum(r["loss"] for r in lb[:10]) / 10
    last = sum(r["loss"] for r in lb[-10:]) / 10
    assert last < first * 0.9, (first, last)
    drafter = load_dflash_checkpoint(out)
    assert {p.dtype for p in drafter.parameters()} == {torch.float32}


def test_one_horizon_per_update_for_every_micro_step(setup, tmp_path):
    """The mixed recipe's B is drawn once per update from (seed, step): both micro-steps of an update train it
    (as both ranks of a two-rank run do, tests/test_distributed_training.py), and it changes across updates."""
    from dscout.training.methods import training_method
    from dscout.training.trainer import update_horizon

    t, _, cache = setup
    cfg = _cfg(gradient_accumulation_steps=2, max_steps=6, checkpoint_every=0)
    out = train_drafter(t, cfg, tmp_path / "o", tmp_path / "w", feature_cache=cache)
    log = _log(out / "train_log.jsonl")
    want = [update_horizon(training_method(cfg), cfg.seed, s) for s in range(6)]
    assert [r["block_size_per_slot"] for r in log] == [[b, b] for b in want]
    assert len(set(want)) > 1 and set(want) <= {8, 16, 24, 32}
    assert update_horizon(training_method(_cfg(kind="eagle3")), 1, 0) is None  # no horizon to draw


def test_online_training_reads_packed_responses(setup, tmp_path):
    """Online features from the packed, memory-mapped responses train the same drafter as from a list of
    sequences (the path of `dscout train` without a feature cache)."""
    from dscout.data.packed import load_training_sequences, pack_responses

    t, seqs, _ = setup
    path = tmp_path / "responses.jsonl"
    with open(path, "w") as f:
        for s in seqs:
            p = s["loss_mask"].index(1)
            f.write(json.dumps({"id": s["id"], "prompt_ids": s["input_ids"][:p],
                                "response_ids": s["input_ids"][p:]}) + "\n")
    pack_responses(path)
    packed = load_training_sequences(path, max_length=10_000, min_response_tokens=0)
    assert list(packed) == seqs
    cfg = _cfg(max_steps=3, checkpoint_every=0)
    a = load_dflash_checkpoint(train_drafter(t, cfg, tmp_path / "a", tmp_path / "wa", sequences=seqs))
    b = load_dflash_checkpoint(train_drafter(t, cfg, tmp_path / "b", tmp_path / "wb", sequences=packed))
    for (n, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb), n
