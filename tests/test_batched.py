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
    from dscout.decoding.controller import BlockSizeController
    from dscout.decoding.latency import LatencyModel

    ar = SpeculativeEngine(target, stop_token_ids=[])
    prompts = _prompts(4, 7)
    Replay.refs = {tuple(p): p + ar.generate(p, 24).output_ids for p in prompts}
    out = BatchedSpeculativeEngine(target, Replay, stop_token_ids=[]).generate(prompts, 24, block_size=6)
    lengths = [r.accept_lengths for r in out.results]
    assert any(n > 2 for ls in lengths for n in ls) and len({tuple(ls) for ls in lengths}) > 1  # ragged
    for p, r in zip(prompts, out.results):
        assert p + r.output_ids == Replay.refs[tuple(p)]
    # with a controller that always drafts bs 6: the finished batch tells it which share of the mean excess
    # acceptance its last request got (the batch waited for it)
    free = LatencyModel(num_taps=1, num_layers=1, draft=[0.0, 0.0, 0.0, 0.0], commit=[0.0, 0.0],
                        verify=[0.05, 0.0, 0.0])
    ctl = BlockSizeController(free, 6, candidates=[6], time_weight=0.0)
    out = BatchedSpeculativeEngine(target, Replay, stop_token_ids=[], controller=ctl).generate(prompts, 24, 6)
    rounds = [len(r.accept_lengths) for r in out.results]
    last = [i for i, n in enumerate(rounds) if n == max(rounds)]
    excess = [sum(n - 1 for n in r.accept_lengths[:-1]) for r in out.results]  # accepted drafts (last round cut)
    share = (sum(excess[i] for i in last) / sum(rounds[i] for i in last)) / (sum(excess) / sum(rounds))
    assert ctl.rho == pytest.approx(min(share, 1.0), rel=0.2) and ctl.rho < 1.0


def test_serving_records_and_table4_pick_the_best_block_size(target, tmp_path):
    from dscout.analysis.table4 import table4_rows, write_table4
    from dscout.evaluation.serving import serving_records
    from dscout.records import write_records

    d = tiny_drafter(target, layers=1, block_size=16)
    factories = {"ar": ("ar", None, None), "dflash-bs16": ("dflash", "df", lambda: BlockDiffusionProposer(d)),
                 "dscout-bs4": ("dscout", "ds", lambda: BlockDiffusionProposer(d)),
                 "dscout-bs16": ("dscout", "ds", lambda: BlockDiffusionProposer(d))}
    sizes = {"dflash-bs16": 16, "dscout-bs4": 4, "dscout-bs16": 16}
    prompts = _prompts(3, 11)
    recs, stores = [], {}
    for c in (1, 3):
        stores[c] = {}
        recs += serving_records(target, factories, prompts, ["a", "b", "c"], c, 10, sizes, [0],
                                interleave="batch" if c == 1 else "round",  # both ways of sharing the machine
                                prefill_store=stores[c])
    # one prefill per c and tapped layer set (AR's, the drafters'), whatever the methods and warm-ups
    assert [len(stores[c]) for c in (1, 3)] == [2, 2]
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


def _ragged_state(target, d, lengths, seed):
    """Left-padded prompt taps [B, P, tD] with validity, the per-request taps, and random later commits."""
    g = torch.Generator().manual_seed(seed)
    taps = []
    for n in lengths:
        ids = torch.randint(1, 63, (1, n), generator=g)
        taps.append(target(ids, layer_ids=d.config.target_layer_ids).taps[0])
    P, width = max(lengths), taps[0].shape[-1]
    padded = torch.zeros(len(lengths), P, width, dtype=taps[0].dtype)
    valid = torch.zeros(len(lengths), P, dtype=torch.bool)
    for i, t in enumerate(taps):
        padded[i, P - len(t):], valid[i, P - len(t):] = t, True
    return padded, valid, taps, g


def test_one_forward_batched_drafts_equal_each_request_alone(target):
    """Ragged prompts, ragged commits and ragged draft counts: the one-forward drafts (and q) of every row equal
    the drafts that row's own proposer makes alone."""
    from dscout.decoding.proposers import BatchedBlockDiffusionProposer

    d = tiny_drafter(target, layers=2, block_size=8)
    lengths = [3, 11, 6, 1]
    padded, valid, taps, g = _ragged_state(target, d, lengths, 0)
    group = BatchedBlockDiffusionProposer(d, sample_drafts=True)
    group.start(padded, valid)
    alone = [BlockDiffusionProposer(d, sample_drafts=True) for _ in lengths]
    for p, t in zip(alone, taps):
        p.start(t)
    pos = list(lengths)
    for rnd, ks in enumerate([[3, 7, 0, 5], [7, 1, 4, 7], [2, 2, 2, 0]]):
        last = torch.randint(1, 63, (len(lengths),), generator=g).tolist()
        got = group.propose(last, pos, ks, temperature=1.0, generator=torch.Generator().manual_seed(rnd))
        greedy = group.propose(last, pos, ks)  # nothing kept: drafting again changes no state
        for i, p in enumerate(alone):
            if ks[i] == 0:
                assert got[i] is None and greedy[i] is None
                continue
            ref = p.propose(last[i], pos[i], ks[i], temperature=1.0, generator=torch.Generator().manual_seed(0))
            assert torch.allclose(got[i].probs, ref.probs, atol=1e-10)
            assert greedy[i].tokens.tolist() == p.propose(last[i], pos[i], ks[i]).tokens.tolist()
        for i, p in enumerate(alone):  # ragged commits, kept until the next draft
            m = int(torch.randint(1, 5, (1,), generator=g))
            t = torch.randn(m, padded.shape[-1], generator=g, dtype=padded.dtype)
            group.commit(i, t)
            p.commit(t)
            pos[i] += m
        assert group.pending_tokens == max(p - group._next_pos[i] for i, p in enumerate(pos))


def test_a_selected_group_drafts_for_its_remaining_rows_what_the_whole_group_drafts(target):
    """Finished rows leave the drafter group (``select``) with kept taps pending: the remaining rows' q and drafts
    equal those of the group that kept every row, and row j of later calls is old row rows[j]."""
    from dscout.decoding.proposers import BatchedBlockDiffusionProposer

    d = tiny_drafter(target, layers=2, block_size=8)
    lengths = [4, 10, 7, 2]
    padded, valid, _, g = _ragged_state(target, d, lengths, 3)
    whole, cut = (BatchedBlockDiffusionProposer(d, sample_drafts=True) for _ in range(2))
    whole.start(padded, valid)
    cut.start(padded, valid)
    pos = list(lengths)
    for width in ([3, 3, 3, 3], [1, 2, 3, 4]):  # a drafted round's commits (written), then a ragged backlog (kept)
        for i, m in enumerate(width):
            t = torch.randn(m, padded.shape[-1], generator=g, dtype=padded.dtype)
            whole.commit(i, t)
            cut.commit(i, t)
        pos = [x + m for x, m in zip(pos, width)]
        if width[0] == 3:
            for p in (whole, cut):
                p.propose([5] * 4, pos, [2] * 4)  # writes the kept taps of every row
    keep = [1, 3]
    cut.select(torch.tensor(keep))
    assert cut.batch_size == 2 and cut.pending_tokens == 4  # rows 1 and 3 keep 2 and 4 taps
    for rnd, ks in enumerate([[5, 3, 0, 7], [2, 6, 1, 4]]):
        last = torch.randint(1, 63, (4,), generator=g).tolist()
        ref = whole.propose(last, pos, ks, temperature=1.0, generator=torch.Generator().manual_seed(rnd))
        got = cut.propose([last[i] for i in keep], [pos[i] for i in keep], [ks[i] for i in keep], temperature=1.0,
                          generator=torch.Generator().manual_seed(rnd))
        for j, i in enumerate(keep):
            assert torch.allclose(got[j].probs, ref[i].probs, atol=1e-6)
        assert cut._cache.layers[0].keys.shape[0] == 2 and cut._keys.shape[0] == 2
        for i in range(4):  # this round's commits, kept for the next
            t = torch.randn(2, padded.shape[-1], generator=g, dtype=padded.dtype)
            whole.commit(i, t)
            if i in keep:
                cut.commit(keep.index(i), t)
            pos[i] += 2


def test_finished_requests_leave_the_batch_and_every_output_stays_the_same(target):
    """Requests that stop at different rounds: with ``compact`` the batch shrinks to the active rows (the KV cache
    of the target and of the drafter), and outputs, accept lengths and chosen bs equal the engine that keeps the
    finished rows as padding, and AR's per request."""
    from dscout.decoding.controller import BlockSizeController
    from dscout.decoding.latency import LatencyModel

    d = tiny_drafter(target, layers=2, block_size=8)
    prompts = _prompts(6, 11)
    free = SpeculativeEngine(target, stop_token_ids=[])
    runs = [free.generate(p, 18).output_ids for p in prompts]
    stop = runs[0][3]  # request 0 stops at its 4th token; the others wherever this token comes, or at 18
    ar = SpeculativeEngine(target, stop_token_ids=[stop])
    refs = [ar.generate(p, 18).output_ids for p in prompts]
    assert len({len(r) for r in refs}) > 1  # they finish at different rounds
    cheap = LatencyModel(num_taps=2, num_layers=2, draft=[0.003, 0.0, 0.0, 0.0], commit=[0.0, 1e-4],
                         verify=[0.05, 0.0, 0.001])
    outs = {}
    for compact in (True, False):
        for bs, ctl in ((4, None), (8, BlockSizeController(cheap, 8, prior=0.3, decay=0.7))):
            out = BatchedSpeculativeEngine(target, lambda: BlockDiffusionProposer(d), stop_token_ids=[stop],
                                           controller=ctl, compact=compact).generate(prompts, 18, block_size=bs)
            assert [r.output_ids for r in out.results] == refs
            outs[compact, bs] = out
    assert [r.accept_lengths for r in outs[True, 4].results] == [r.accept_lengths for r in outs[False, 4].results]
    for bs in (4, 8):  # (the controller prices each round at the rows it verifies: its bs may differ)
        on, off = outs[True, bs], outs[False, bs]
        assert set(off.rows) == {6} and on.rows[0] == 6 and on.rows[-1] < 6
        assert on.rows == sorted(on.rows, reverse=True)
        active = [sum(len(r.accept_lengths) > k for r in on.results) for k in range(len(on.rows))]
        assert on.rows == active  # each round verified exactly its active requests


def test_deferred_commit_drafts_equal_committing_every_round(target):
    """Resuming after k rounds without drafts (their taps kept, not written) drafts what committing every round
    does, and the skipped rounds do no drafter work; for the one-request and the batched proposer."""
    from dscout.decoding.proposers import BatchedBlockDiffusionProposer

    d = tiny_drafter(target, layers=2, block_size=8)
    lengths = [5, 9]
    padded, valid, taps, g = _ragged_state(target, d, lengths, 1)
    eager = BlockDiffusionProposer(d, sample_drafts=True, defer_commits=False)
    lazy = BlockDiffusionProposer(d, sample_drafts=True)
    beager = BatchedBlockDiffusionProposer(d, sample_drafts=True, defer_commits=False)
    blazy = BatchedBlockDiffusionProposer(d, sample_drafts=True)
    eager.start(taps[0])
    lazy.start(taps[0])
    beager.start(padded, valid)
    blazy.start(padded, valid)
    def commit_all(taps):  # one round's committed taps [2 requests, n, width]: single proposers get request 0's
        eager.commit(taps[0])
        lazy.commit(taps[0])
        for p in (beager, blazy):
            for i in range(2):
                p.commit(i, taps[i])
            p.end_round()

    pos, kept = list(lengths), 0
    for k_skipped in (0, 1, 4, 9):
        written, bwritten = lazy._cache.get_seq_length(), blazy._cache.get_seq_length()
        for _ in range(k_skipped):  # rounds at bs 1: one committed token per request
            commit_all(torch.randn(2, 1, padded.shape[-1], generator=g, dtype=padded.dtype))
            pos = [x + 1 for x in pos]
        assert lazy._cache.get_seq_length() == written and blazy._cache.get_seq_length() == bwritten  # no work
        assert lazy.pending_tokens == blazy.pending_tokens == kept + k_skipped
        a = eager.propose(7, pos[0], 5, 1.0, torch.Generator().manual_seed(0))
        b = lazy.propose(7, pos[0], 5, 1.0, torch.Generator().manual_seed(0))
        assert torch.allclose(a.probs, b.probs, atol=1e-10) and a.tokens.tolist() == b.tokens.tolist()
        assert lazy.pending_tokens == 0 and lazy._cache.get_seq_length() == eager._cache.get_seq_length()
        ra, rb = beager.propose([7, 9], pos, [5, 3]), blazy.propose([7, 9], pos, [5, 3])
        assert [x.tokens.tolist() for x in ra] == [x.tokens.tolist() for x in rb] and blazy.pending_tokens == 0
        # the drafting round commits x + 2 accepted drafts: kept until the next draft
        commit_all(torch.randn(2, 3, padded.shape[-1], generator=g, dtype=padded.dtype))
        pos, kept = [x + 3 for x in pos], 3


def _count_drafter_calls(d):
    calls = {"n": 0}
    forward, materialize = d.forward, d.materialize_context

    def counted_forward(*a, **k):
        calls["n"] += 1
        return forward(*a, **k)

    def counted_materialize(*a, **k):
        calls["n"] += 1
        return materialize(*a, **k)

    d.forward, d.materialize_context = counted_forward, counted_materialize
    return calls


def test_rounds_without_drafts_do_no_drafter_work_and_stay_exact(target):
    """The controller priced out of drafting (a costly drafter): every round is bs 1 and the drafter is never
    called after the prompt; the batched engine with the controller and a real drafter stays equal to AR."""
    from dscout.decoding.controller import BlockSizeController
    from dscout.decoding.latency import LatencyModel

    d = tiny_drafter(target, layers=1, block_size=8)
    costly = LatencyModel(num_taps=2, num_layers=1, draft=[1.0, 0.0, 0.0, 0.0], commit=[0.0, 1e-4],
                          verify=[0.05, 0.001, 0.001])
    prompts = _prompts(4, 5)
    ar = SpeculativeEngine(target, stop_token_ids=[0])
    refs = [ar.generate(p, 16).output_ids for p in prompts]
    calls = _count_drafter_calls(d)
    out = BatchedSpeculativeEngine(target, lambda: BlockDiffusionProposer(d), stop_token_ids=[0],
                                   controller=BlockSizeController(costly, 8)).generate(prompts, 16, block_size=8)
    assert set(out.block_sizes) == {1} and calls["n"] == 1  # the prompts' write, in the prefill
    assert [r.output_ids for r in out.results] == refs
    calls["n"] = 0
    one = SpeculativeEngine(target, BlockDiffusionProposer(d), stop_token_ids=[0],
                            controller=BlockSizeController(costly, 8)).generate(prompts[0], 16, block_size=8)
    assert set(one.block_sizes) == {1} and calls["n"] == 1 and one.output_ids == refs[0]
    del d.forward, d.materialize_context
    # a controller that drafts sometimes: catch-ups after skipped rounds, still AR token for token
    cheap = LatencyModel(num_taps=2, num_layers=1, draft=[0.003, 0.0, 0.0, 0.0], commit=[0.0, 1e-4],
                         verify=[0.05, 0.0, 0.001])
    for batched_draft in (True, False):
        ctl = BlockSizeController(cheap, 8, prior=0.3, decay=0.7)
        out = BatchedSpeculativeEngine(target, lambda: BlockDiffusionProposer(d), stop_token_ids=[0], controller=ctl,
                                       batched_draft=batched_draft).generate(prompts, 16, block_size=8)
        assert [r.output_ids for r in out.results] == refs
        assert len(out.drafter_seconds) == len(out.block_sizes) == len(out.catchup_tokens)


def test_serving_repeats_rotate_the_methods_and_the_controller_keeps_its_statistics(target, tmp_path):
    """Three repeats: each method decodes the batch once per repeat, in an order rotated by one per repeat; the
    online controller is reset once (after the warm-up) and carries its acceptance and round-time statistics from
    one repeat to the next; Table 4 reports the median speedup over the repeats inside its [min, max]."""
    from dscout.analysis.table4 import table4_rows
    from dscout.decoding.controller import BlockSizeController
    from dscout.evaluation.serving import serving_records

    from .test_controller import cpu_like_latency

    d = tiny_drafter(target, layers=1, block_size=8)
    ctl = BlockSizeController(cpu_like_latency(), 8)
    resets = []
    reset = ctl.reset
    ctl.reset = lambda: (resets.append(1), reset())
    factories = {"ar": ("ar", None, None), "dscout-bs4": ("dscout", "ds", lambda: BlockDiffusionProposer(d)),
                 "dscout-online": ("dscout", "ds", lambda: BlockDiffusionProposer(d))}
    sizes = {"dscout-bs4": 4, "dscout-online": 8}
    prompts = _prompts(3, 5)
    recs = serving_records(target, factories, prompts, ["a", "b", "c"], 3, 9, sizes, [], repeats=3,
                           controllers={"dscout-online": ctl})
    assert len(recs) == 3 * 3 * 3 and len(resets) == 1
    order = [recs[i]["method_key"] for i in range(0, len(recs), 3)]  # one batch = 3 consecutive records
    assert order == ["ar", "dscout-bs4", "dscout-online", "dscout-bs4", "dscout-online", "ar",
                     "dscout-online", "ar", "dscout-bs4"]
    assert [recs[i]["repeat"] for i in range(0, len(recs), 9)] == [0, 1, 2]
    ar = {(r["repeat"], r["prompt_id"]): r["output_ids"] for r in recs if r["method"] == "ar"}
    assert all(r["output_ids"] == ar[(r["repeat"], r["prompt_id"])] for r in recs)
    online_rounds = sum(len(recs[i]["round_block_sizes"]) for i in range(0, len(recs), 3)
                        if recs[i]["method_key"] == "dscout-online")
    # every repeat's rounds fed the same statistics, but for the first round of each batch (one-off costs)
    assert sum(ctl.timed.values()) == online_rounds - 3
    with pytest.raises(ValueError, match="repeats"):
        serving_records(target, factories, prompts, ["a", "b", "c"], 3, 9, sizes, [], repeats=0)
    with pytest.raises(ValueError, match="interleave"):
        serving_records(target, factories, prompts, ["a", "b", "c"], 3, 9, sizes, [], interleave="method")
    row = table4_rows(recs)[0]
    assert row["repeats"] == 3
    assert row["online_speedup_min"] <= row["online_speedup"] <= row["online_speedup_max"]
    assert row["best_speedup_min"] <= row["best_speedup"] <= row["best_speedup_max"]


def test_online_controllers_learn_from_warm_up_traffic_that_is_never_timed_or_recorded(target, monkeypatch):
    """serving_records(controller_warmup=...): each online method first serves the warm-up prompts in batches of c
    (untimed, its controller learning: acceptance and round times), then the measured batch; methods without a
    controller never see them, no record names them, and every output still equals AR."""
    from dscout.decoding.controller import BlockSizeController
    from dscout.evaluation.serving import serving_records

    from .test_controller import cpu_like_latency

    d = tiny_drafter(target, layers=1, block_size=8)
    ctl = BlockSizeController(cpu_like_latency(), 8)
    observed = []
    observe = ctl.observe_batch
    monkeypatch.setattr(ctl, "observe_batch", lambda rounds: (observed.append(len(rounds)), observe(rounds)))
    calls = []
    generate = BatchedSpeculativeEngine.generate

    def spy(self, prompts, *a, **k):
        calls.append((self.controller is not None, [tuple(p) for p in prompts]))
        return generate(self, prompts, *a, **k)

    monkeypatch.setattr(BatchedSpeculativeEngine, "generate", spy)
    factories = {"ar": ("ar", None, None), "dscout-bs4": ("dscout", "ds", lambda: BlockDiffusionProposer(d)),
                 "dscout-online": ("dscout", "ds", lambda: BlockDiffusionProposer(d))}
    sizes = {"dscout-bs4": 4, "dscout-online": 8}
    prompts, warm = _prompts(3, 5), _prompts(7, 11)[3:]  # 4 warm-up prompts: one batch of 3 (the 4th is left)
    recs = serving_records(target, factories, prompts, ["a", "b", "c"], 3, 9, sizes, [],
                           controllers={"dscout-online": ctl}, controller_warmup=warm)
    warm_set = {tuple(p) for p in warm}
    warm_calls = [(online, batch) for online, batch in calls if warm_set & set(batch)]
    assert warm_calls == [(True, [tuple(p) for p in warm[:3]])]
    assert len(recs) == 3 * 3 and {r["prompt_id"] for r in recs} == {"a", "b", "c"}
    measured_rounds = len(next(r for r in recs if r["method_key"] == "dscout-online")["round_block_sizes"])
    assert len(observed) > measured_rounds  # the warm-up batch's rounds were learned from too (after the reset)
    assert sum(ctl.timed.values()) > measured_rounds - 1
    ar = {r["prompt_id"]: r["output_ids"] for r in recs if r["method"] == "ar"}
    assert all(r["output_ids"] == ar[r["prompt_id"]] for r in recs)
    # a dict warms only the keys it names: the other controller starts cold (both side by side in one job)
    cold = BlockSizeController(cpu_like_latency(), 8)
    calls.clear()
    serving_records(target, {**factories, "dscout-online-cold": factories["dscout-online"]}, prompts,
                    ["a", "b", "c"], 3, 9, {**sizes, "dscout-online-cold": 8}, [],
                    controllers={"dscout-online": ctl, "dscout-online-cold": cold},
                    controller_warmup={"dscout-online": warm})
    assert len([1 for _, batch in calls if warm_set & set(batch)]) == 1
    with pytest.raises(ValueError, match=r"controller_warmup \(dscout-online\): concurrency 3 needs at least 3"):
        serving_records(target, factories, prompts, ["a", "b", "c"], 3, 9, sizes, [],
                        controllers={"dscout-online": ctl}, controller_warmup=warm[:2])


def test_table4_shows_each_online_variant_beside_dscout_online(tmp_path):
    """serving.online_variants: each ``dscout-online-<name>`` column is reported like DScout(online) (median
    speedup over repeats with its spread, mean bs, paired ratio to DScout(best)) under its own label."""
    from dscout.analysis.table4 import table4_rows, write_table4
    from dscout.records import write_records
    from dscout.records import make_record

    # tokens per batch / seconds: AR 10 tok/s; bs 4: 12; online: 11 / 13 / 12 (repeats); variant: 14 in every repeat
    seconds = {"ar": [1.0] * 3, "dscout-bs4": [10 / 12] * 3, "dscout-online": [10 / 11, 10 / 13, 10 / 12],
               "dscout-online-z1": [10 / 14] * 3}
    recs = []
    for key, secs in seconds.items():
        for rep, s in enumerate(secs):
            bs = None if key == "ar" else "online" if "online" in key else 4
            recs.append(make_record(
                benchmark="serving", prompt_id="p", method="ar" if key == "ar" else "dscout", method_key=key,
                drafter=None, block_size=bs, temperature=0.0, repeat=rep, concurrency=1, new_tokens=11,
                decode_seconds=s, accept_lengths=[1] * 10, output_ids=[0] * 11, stop_reason="length",
                batch_decode_seconds=s, **({"round_block_sizes": [2] * 10, "controller_seconds": 0.0}
                                           if bs == "online" else {})))
    row = table4_rows(recs)[0]
    assert row["best_bs"] == 4 and row["best_speedup"] == pytest.approx(1.2)
    assert row["online_speedup"] == pytest.approx(1.2) and row["online_speedup_min"] == pytest.approx(1.1)
    assert row["online_z1_speedup"] == pytest.approx(1.4) and row["online_z1_vs_best"] == pytest.approx(1.4 / 1.2 - 1)
    assert row["online_z1_bs_mean"] == 2
    write_records(recs, tmp_path / "c1.jsonl")
    write_table4([tmp_path / "c1.jsonl"], str(tmp_path / "t4"), {"target": "tiny"})
    md = (tmp_path / "t4.md").read_text()
    assert "DScout(online, z1)" in md and "z1 vs best" in md and "+16.7%" in md and "serving.online_variants" in md
    assert "online_z1_speedup" in (tmp_path / "t4.csv").read_text().splitlines()[0]


def test_lockstep_steps_each_generator_in_turn_with_the_order_rotated_per_cycle():
    from dscout.evaluation.serving import _lockstep

    log = []

    def gen(name, n):  # n + 1 steps: n yields, then the return
        for i in range(n):
            log.append(f"{name}{i + 1}")
            yield
        log.append(f"{name}{n + 1}")
        return name.upper()

    out = _lockstep({"a": gen("a", 2), "b": gen("b", 0), "c": gen("c", 1)})
    assert out == {"a": "A", "b": "B", "c": "C"}
    # cycle 0 from a: a1 b1(b returns) c1; cycle 1 from the 2nd live key (c): c2(returns) a2; cycle 2: a3
    assert log == ["a1", "b1", "c1", "c2", "a2", "a3"]


def test_interleaved_engines_match_generate_and_time_only_their_own_rounds(target):
    """Round-by-round interleaving (serving.interleave: round): each engine's output equals its own generate() and AR's,
    and its decode seconds are the sum of its rounds (draft + verify), not the time other work took between its
    steps (here another 'engine' that sleeps 0.2 s per step)."""
    import time

    from dscout.evaluation.serving import _lockstep

    d = tiny_drafter(target, layers=1, block_size=8)
    prompts = _prompts(3, 11)
    ar = BatchedSpeculativeEngine(target, None, stop_token_ids=[0])
    spec = BatchedSpeculativeEngine(target, lambda: BlockDiffusionProposer(d), stop_token_ids=[0])
    alone = spec.generate(prompts, 12, block_size=4)

    def sleeper(steps):
        for _ in range(steps):
            time.sleep(0.2)
            yield

    outs = _lockstep({"ar": ar.steps(prompts, 12), "bs4": spec.steps(prompts, 12, 4), "sleep": sleeper(6)})
    ref = ar.generate(prompts, 12)
    assert [r.output_ids for r in outs["ar"].results] == [r.output_ids for r in ref.results]
    assert [r.output_ids for r in outs["bs4"].results] == [r.output_ids for r in alone.results]
    assert [r.accept_lengths for r in outs["bs4"].results] == [r.accept_lengths for r in alone.results]
    for key in ("ar", "bs4"):
        b = outs[key]
        rounds = sum(b.draft_seconds) + sum(b.verify_seconds)
        assert rounds <= b.decode_seconds <= rounds + 0.01 * len(b.verify_seconds)
        assert b.decode_seconds < 0.2 * 5  # the sleeper's seconds (1.2 s) are not this engine's
    with pytest.raises(ValueError, match="non-empty"):
        next(ar.steps([], 4))


def test_a_shared_prefill_is_computed_once_per_layer_set_and_decodes_as_a_fresh_one(target):
    """prefill_store (Table 4's prefix cache): AR and two DScout engines over the same batch, twice each, run the
    target's prefill once per tapped layer set (2, not 6); every reuse decodes exactly as a fresh prefill (outputs
    and accept lengths), reports the first computation's seconds and says it was reused; a stored cache is never
    extended by a decode (a third DScout batch from it still matches)."""
    d = tiny_drafter(target, layers=2, block_size=8)
    prompts = _prompts(4, 21)
    ar = BatchedSpeculativeEngine(target, None, stop_token_ids=[0])
    bs2 = BatchedSpeculativeEngine(target, lambda: BlockDiffusionProposer(d), stop_token_ids=[0])
    bs4 = BatchedSpeculativeEngine(target, lambda: BlockDiffusionProposer(d), stop_token_ids=[0])
    fresh = {"ar": ar.generate(prompts, 10), "bs2": bs2.generate(prompts, 10, 2), "bs4": bs4.generate(prompts, 10, 4)}
    prefill_widths = []
    forward = type(target).forward

    def counting(self, input_ids, *args, **kwargs):
        if kwargs.get("last_logits_only"):
            prefill_widths.append(input_ids.shape[1])
        return forward(self, input_ids, *args, **kwargs)

    store = {}
    try:
        type(target).__call__ = counting
        runs = [(k, e.generate(prompts, 10, bs, prefill_store=store))
                for _ in range(2) for k, e, bs in (("ar", ar, 1), ("bs2", bs2, 2), ("bs4", bs4, 4))]
        again = bs4.generate(prompts, 10, 4, prefill_store=store)
    finally:
        type(target).__call__ = forward
    assert len(prefill_widths) == 2 and len(store) == 2
    for key, out in runs + [("bs4", again)]:
        assert [r.output_ids for r in out.results] == [r.output_ids for r in fresh[key].results]
        assert [r.accept_lengths for r in out.results] == [r.accept_lengths for r in fresh[key].results]
    assert [out.prefill_reused for _, out in runs] == [False, False, True, True, True, True]
    assert runs[4][1].prefill_seconds == runs[1][1].prefill_seconds  # bs4 reused bs2's prefill, and its seconds
    for entry in store.values():
        assert entry["cache"].get_seq_length() == max(len(p) for p in prompts)


def test_a_masked_multi_token_verify_attends_grouped_heads_without_copying_the_cache(target, monkeypatch):
    """On the CPU the target's verify of a block under a mask (the batched engine's every drafted round) must not
    expand the KV cache to every query head (transformers' repeat_kv copies the whole cache per layer): the
    output equals AR's either way, and with the switch forced off repeat_kv runs (so this test can fail)."""
    import transformers.integrations.sdpa_attention as sdpa

    assert target.config.num_key_value_heads < target.config.num_attention_heads  # grouped heads to share
    calls = []
    real = sdpa.repeat_kv
    monkeypatch.setattr(sdpa, "repeat_kv", lambda x, n: calls.append(n) or real(x, n))
    d = tiny_drafter(target, layers=1, block_size=8)
    prompts = _prompts(3, 5)
    ar = [SpeculativeEngine(target, stop_token_ids=[0]).generate(p, 12).output_ids for p in prompts]
    spec = BatchedSpeculativeEngine(target, lambda: BlockDiffusionProposer(d), stop_token_ids=[0])
    assert [r.output_ids for r in spec.generate(prompts, 12, block_size=4).results] == ar
    assert calls == []
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "0")
    assert [r.output_ids for r in spec.generate(prompts, 12, block_size=4).results] == ar
    assert calls and set(calls) == {target.config.num_attention_heads // target.config.num_key_value_heads}
