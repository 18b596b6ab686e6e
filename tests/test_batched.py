"""The batched engine (Table 4 on the CPU): ragged acceptance across requests, per-request output equal to AR."""

import pytest
import torch

from dscout.decoding.batched import BatchedSpeculativeEngine
from dscout.decoding.engine import SpeculativeEngine
from dscout.decoding.proposers import BlockDiffusionProposer

from .conftest import tiny_drafter


def _prompts(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 63, (int(torch.randint(2, 14, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.mark.parametrize("bs", [1, 4, 8])
def test_batched_greedy_output_equals_ar_per_request(bs, target):
    d = tiny_drafter(target, layers=2, block_size=16)
    ar = SpeculativeEngine(target, stop_token_ids=[0])
    batched = BatchedSpeculativeEngine(target, (lambda: BlockDiffusionProposer(d)) if bs > 1 else None,
                                       stop_token_ids=[0])
    prompts = _prompts(5, bs)
    out = batched.generate(prompts, 20, block_size=bs)
    for p, r in zip(prompts, out.results):
        assert r.output_ids == ar.generate(p, 20).output_ids
        assert all(1 <= n <= max(bs, 1) for n in r.accept_lengths)
    assert out.throughput > 0 and len(out.draft_seconds) == len(out.verify_seconds)


class Replay:
    """Drafts the AR continuation of its own request, corrupting a draft with probability 0.3: ragged acceptance."""

    layer_ids = [1]
    refs: dict = {}
    made = 0

    def __init__(self):
        Replay.made += 1
        self.g = torch.Generator().manual_seed(Replay.made)

    def start(self, taps, ids):
        self.ref = Replay.refs[tuple(ids.tolist())]
        self.pos = taps.shape[0]

    def commit(self, taps, ids):
        self.pos += taps.shape[0]

    def propose(self, last, position, k, temperature=0.0, generator=None):
        from dscout.decoding.proposers import Draft

        assert position == self.pos
        toks = [self.ref[position + j] if position + j < len(self.ref) else 0 for j in range(1, k + 1)]
        toks = [(t + 1) % 64 if torch.rand(1, generator=self.g).item() < 0.3 else t for t in toks]
        return Draft(torch.tensor(toks))


def test_ragged_long_acceptances_keep_every_request_exact(target):
    ar = SpeculativeEngine(target, stop_token_ids=[])
    prompts = _prompts(4, 7)
    Replay.refs = {tuple(p): p + ar.generate(p, 24).output_ids for p in prompts}
    out = BatchedSpeculativeEngine(target, Replay, stop_token_ids=[]).generate(prompts, 24, block_size=6)
    lengths = [r.accept_lengths for r in out.results]
    assert any(n > 2 for ls in lengths for n in ls) and len({tuple(ls) for ls in lengths}) > 1  # ragged
    for p, r in zip(prompts, out.results):
        assert p + r.output_ids == Replay.refs[tuple(p)]


def test_serving_records_and_table4_pick_the_best_block_size(target, tmp_path):
    from dscout.analysis.table4 import table4_rows, write_table4
    from dscout.evaluation.serving import serving_records, write_records

    d = tiny_drafter(target, layers=1, block_size=16)
    factories = {"ar": ("ar", None, None), "dflash-bs16": ("dflash", "df", lambda: BlockDiffusionProposer(d)),
                 "dscout-bs4": ("dscout", "ds", lambda: BlockDiffusionProposer(d)),
                 "dscout-bs16": ("dscout", "ds", lambda: BlockDiffusionProposer(d))}
    sizes = {"dflash-bs16": 16, "dscout-bs4": 4, "dscout-bs16": 16}
    prompts = _prompts(3, 11)
    recs = []
    for c in (1, 3):
        recs += serving_records(target, factories, prompts, ["a", "b", "c"], c, 10, sizes, [0])
    assert {r["concurrency"] for r in recs} == {1, 3} and sum(r["concurrency"] == 3 for r in recs) == 3 * 4
    ar = {(r["concurrency"], r["prompt_id"]): r["output_ids"] for r in recs if r["method"] == "ar"}
    assert all(r["output_ids"] == ar[(r["concurrency"], r["prompt_id"])] for r in recs)  # lossless per request
    write_records(recs, tmp_path / "serving.jsonl")
    rows = write_table4([tmp_path / "serving.jsonl"], str(tmp_path / "t4"), {"target": "tiny"})
    assert [r["concurrency"] for r in rows] == [1, 3]
    for r in rows:
        assert r["best_bs"] in (4, 16) and r["best_speedup"] >= r["dscout16_speedup"] and r["selection_gain"] >= 0
    assert "concurrency" in (tmp_path / "t4.csv").read_text().splitlines()[0]
    with pytest.raises(ValueError, match="needs 5 prompts"):
        serving_records(target, factories, prompts, ["a", "b", "c"], 5, 10, sizes, [0])
    assert table4_rows(recs)[0]["ar_tokens_per_s"] > 0
