"""The bounded prefill store (issue 47): host memory, a byte cap, first turns only, outputs unchanged."""

import pytest
import torch

from dscout.data.benchmarks import BenchmarkPrompt
from dscout.decoding.engine import SpeculativeEngine
from dscout.decoding.proposers import BlockDiffusionProposer
from dscout.evaluation import runner
from dscout.evaluation.prefill_store import PrefillStore, entry_bytes
from dscout.evaluation.runner import Method, run_benchmark

from .conftest import tiny_drafter


def _prefill(target, prompt, layer_ids=(0, 1)):
    cache = target.new_cache()
    out = target(torch.tensor([prompt]), layer_ids=list(layer_ids), past_key_values=cache)
    return {"cache": cache, "logits": out.logits[0, -1], "taps": out.taps[0], "seconds": 0.1}


def test_entries_live_on_the_host_within_the_cap_least_recently_used_out_first(target):
    entries = [_prefill(target, [1 + i, 2, 3, 4, 5]) for i in range(3)]
    size = entry_bytes(entries[0])
    assert size == entry_bytes(entries[1]) > 0
    store = PrefillStore(2 * size + size // 2)  # room for two entries
    store["a"] = entries[0]
    store["b"] = entries[1]
    assert len(store) == 2 and store.bytes == 2 * size
    assert store.get("a") is not None  # a is now the most recently used
    store["c"] = entries[2]
    assert "b" not in store and "a" in store and "c" in store and store.bytes == 2 * size and store.evicted == 1
    held = store._entries["a"][0]
    assert all(layer.keys.device.type == "cpu" for layer in held["cache"].layers)
    assert held["logits"].device.type == "cpu" and held["taps"].device.type == "cpu"
    # a copy comes back: decoding into it leaves the stored prefill as it was
    got = store.get("c")
    assert got["cache"] is not held["cache"] and got["cache"].get_seq_length() == 5
    got["cache"].crop(-2)
    assert store.get("c")["cache"].get_seq_length() == 5
    torch.testing.assert_close(store.get("c")["logits"], entries[2]["logits"])
    tiny = PrefillStore(size - 1)  # an entry larger than the cap is not kept
    tiny["x"] = _prefill(target, [1, 2, 3, 4, 5])
    assert len(tiny) == 0 and tiny.refused == 1 and tiny.bytes == 0
    with pytest.raises(ValueError, match="prefill store cap"):
        PrefillStore(-1)


def test_qwen3_8b_prefills_leave_the_gpu_and_come_back_within_the_cap():
    """The paper's shape on fake CUDA tensors: a 2,048-token Qwen3-8B prompt (36 layers, 8 KV heads x 128, bf16;
    taps of 5 layers x 4096) holds 36 x 2 x 8 x 128 x 2048 x 2 B = 302 MB of cache, 386 MB in all; a 1.25 GiB cap
    keeps three."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import DynamicCache

    def prefill(mode):
        cache = DynamicCache()
        for layer in range(36):
            kv = torch.empty(1, 8, 2048, 128, dtype=torch.bfloat16, device="cuda")
            cache.update(kv, kv.clone(), layer)
        return {"cache": cache, "logits": torch.empty(151936, device="cuda"),
                "taps": torch.empty(2048, 5 * 4096, dtype=torch.bfloat16, device="cuda"), "seconds": 0.5}

    with warnings.catch_warnings(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
        warnings.simplefilter("ignore")  # deepcopy of fake tensors reads their (absent) data pointers
        size = entry_bytes(prefill(mode))
        assert size == 36 * 2 * 8 * 128 * 2048 * 2 + 151936 * 4 + 2048 * 5 * 4096 * 2
        store = PrefillStore(5 * 2**28)
        for i in range(4):
            store[f"p{i}"] = prefill(mode)
        assert list(store._entries) == ["p1", "p2", "p3"] and store.bytes == 3 * size <= 5 * 2**28
        held = store._entries["p3"][0]
        assert {layer.keys.device.type for layer in held["cache"].layers} == {"cpu"}
        assert held["logits"].device.type == held["taps"].device.type == "cpu"
        back = store.get("p3")
        assert {layer.keys.device.type for layer in back["cache"].layers} == {"cuda"}
        assert back["logits"].device.type == back["taps"].device.type == "cuda"
        assert back["cache"].get_seq_length() == 2048


class _Recorder(SpeculativeEngine):
    """Records which prefill store each generate call received."""

    def __init__(self, log, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log = log

    def generate(self, ids, *args, prefill_store=None, **kwargs):
        self.log.append((len(ids), prefill_store is not None))
        return super().generate(ids, *args, prefill_store=prefill_store, **kwargs)


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def test_the_runner_shares_first_turn_prefills_only_and_outputs_equal_fresh_prefills(target, monkeypatch):
    """MT-Bench's turn 2 carries each method's own turn-1 answer: stored, it would only fill the store."""
    monkeypatch.setattr(runner, "chat_prompt_ids",
                        lambda tok, msgs, *a: [3 + len(m["content"]) % 50 for m in msgs])
    monkeypatch.setattr(target, "tokenizer", _Tok(), raising=False)
    d = tiny_drafter(target, layers=2, block_size=8)
    log = []
    methods = [Method("ar", "ar", "AR", _Recorder(log, target, None, [0])),
               Method("x4", "dscout", "X(4)", _Recorder(log, target, BlockDiffusionProposer(d), [0]), 4, "d")]
    prompts = [BenchmarkPrompt("mt", "p0", ["first question", "and a second one"], None)]
    kw = dict(benchmark="mt", max_new_tokens=6, temperature=0.0, repeat=0, chat={}, near_tie_epsilon=1e-3,
              score_outputs=False, warmup=False)
    store = PrefillStore(2**30)
    shared = run_benchmark(target, methods, prompts, prefill_store=store, **kw)
    assert [used for _, used in log] == [True, True, False, False]  # turn 0 of both methods, then turn 1 without
    assert len(store) == 2  # one first-turn prefill per tapped layer set (AR's: none tapped; X(4)'s)
    reused = [r["prefill_reused"] for k in ("ar", "x4") for r in shared[k]]
    assert reused == [False, False, False, False]
    again = run_benchmark(target, methods, prompts, prefill_store=store, **kw)  # a second pass: turn 0 reused
    assert [r["prefill_reused"] for k in ("ar", "x4") for r in again[k]] == [True, False, True, False]
    fresh = run_benchmark(target, methods, prompts, prefill_store=None, **kw)
    for k in ("ar", "x4"):
        assert [r["output_ids"] for r in again[k]] == [r["output_ids"] for r in fresh[k]]
