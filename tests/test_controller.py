"""The online block-size controller and its latency model: decisions, losslessness, calibration."""

import dataclasses

import pytest
import torch
from scipy.stats import chisquare

from dscout.decoding.batched import BatchedSpeculativeEngine
from dscout.decoding.controller import AcceptanceTracker, BlockSizeController
from dscout.decoding.engine import SpeculativeEngine
from dscout.decoding.latency import LatencyModel, calibrate_latency, monotone_fit
from dscout.evaluation.methods import CALIBRATION_BLOCK_SIZES, DEFAULT_CALIBRATION_CONTEXT, typical_context_tokens
from dscout.decoding.proposers import BlockDiffusionProposer

from .conftest import tiny_drafter, tiny_target
from .test_engine import P_MIN, OracleProposer, _exact_joint


def _decider(*args, baseline_round=False, **kwargs):
    """The controller without its first-round baseline measurement: these tests check its decisions from given
    statistics (test_the_first_round_measures_the_baseline checks the baseline round)."""
    return BlockSizeController(*args, baseline_round=baseline_round, **kwargs)


def cpu_like_latency(d=2):
    """Verify 60 ms + 2.5 ms per token and row, draft 4 ms + 0.3 ms per block token and layer: the CPU default's
    shape (verify dominates, a long block costs little more than a short one)."""
    return LatencyModel(num_taps=5, num_layers=d, draft=[0.002, 0.0001, 0.001, 0.0001], commit=[0.0005, 0.0002],
                        verify=[0.055, 0.005, 0.0025])


def test_tracker_counts_accepted_failed_and_censored_positions():
    t = AcceptanceTracker(max_drafts=7, decay=1.0, prior_strength=1e-9, long_decay=1.0)
    t.update(drafted=7, accepted=2)  # positions 1, 2 accepted, 3 rejected, 4..7 not reached
    assert t.trials == [1, 1, 1, 0, 0, 0, 0]
    assert t.successes == [1, 1, 0, 0, 0, 0, 0]
    t.update(drafted=3, accepted=3)  # every draft accepted: no failure observed
    assert t.trials[:4] == [2, 2, 2, 0] and t.successes[:4] == [2, 2, 1, 0]
    a = t.rates()
    assert a[0] == pytest.approx(1.0) and a[2] == pytest.approx(0.5)
    assert a[3] == pytest.approx(a[2])  # unobserved positions inherit the rate of the one before
    s = t.survival()
    assert s[2] == pytest.approx(0.5) and all(x >= y for x, y in zip(s, s[1:]))


def test_tracker_decays_old_rounds():
    t = AcceptanceTracker(max_drafts=3, decay=0.5, prior_strength=1e-9)
    for _ in range(10):
        t.update(3, 3)
    for _ in range(3):
        t.update(3, 0)
    assert t.rates()[0] < 0.2  # three recent rejections outweigh ten older accepts at decay 0.5


def test_choice_maximises_expected_tokens_per_second():
    lat = cpu_like_latency()
    ctl = _decider(lat, max_block_size=32, prior_strength=1e-9)
    for drafted, accepted in [(15, 5), (15, 2), (15, 9), (15, 0), (15, 4)]:
        ctl.observe(drafted, accepted)
    for c in (1, 8, 32):
        s = ctl.tracker.survival()
        brute = max(range(1, 33), key=lambda b: (1 + sum(s[:b - 1])) / lat.round_seconds(b, c, 1 + sum(s[:b - 1])))
        assert ctl.choose(c) == brute
    assert ctl.choose(1, limit=3) <= 3


def test_high_acceptance_grows_the_block_and_low_acceptance_shrinks_it():
    lat = cpu_like_latency()
    good = _decider(lat, 32)
    bad = _decider(lat, 32)
    for _ in range(20):
        good.observe(good.choose() - 1, 31)
        b = bad.choose()
        bad.observe(b - 1, 0)
    assert good.choose() >= 16
    assert bad.choose() <= 2
    # at high concurrency verify grows with c*bs: the same acceptance asks for shorter blocks
    mid = _decider(lat, 32, prior_strength=1e-9)
    for _ in range(20):
        mid.observe(15, 3)
    assert mid.choose(32) <= mid.choose(1)


@pytest.mark.parametrize("flip", [0.0, 0.2, 0.7])
def test_greedy_output_equals_ar_with_the_controller(flip, target):
    ar = SpeculativeEngine(target)
    g = torch.Generator().manual_seed(11)
    chosen = []
    for i in range(5):
        prompt = torch.randint(1, 63, (9,), generator=g).tolist()
        a = ar.generate(prompt, 60)
        ctl = _decider(cpu_like_latency(), 32)
        spec = SpeculativeEngine(target, OracleProposer(prompt + a.output_ids, 64, flip, seed=i), controller=ctl)
        s = spec.generate(prompt, 60, block_size=32)
        assert s.output_ids == a.output_ids
        assert len(s.block_sizes) == len(s.accept_lengths)
        assert all(1 <= n <= b for n, b in zip(s.accept_lengths, s.block_sizes))
        chosen += s.block_sizes
    if flip == 0.0:
        assert max(chosen) >= 16  # perfect drafts: the controller grows the block
    if flip == 0.7:
        assert sorted(chosen)[len(chosen) // 2] <= 3  # mostly rejected: it keeps the block short


def test_greedy_output_equals_ar_with_the_controller_and_a_block_diffusion_drafter(target):
    d = tiny_drafter(target, layers=2, block_size=16)
    ar = SpeculativeEngine(target, stop_token_ids=[0])
    sd = SpeculativeEngine(target, BlockDiffusionProposer(d), stop_token_ids=[0],
                           controller=_decider(cpu_like_latency(), 16, prior=0.9))
    g = torch.Generator().manual_seed(5)
    for _ in range(6):
        prompt = torch.randint(1, 63, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g).tolist()
        assert sd.generate(prompt, 40, block_size=16).output_ids == ar.generate(prompt, 40).output_ids


def test_sampling_with_the_controller_preserves_the_target_distribution():
    """Temperature 1, the controller choosing bs each round: the first four tokens follow the target (chi-square)."""
    t = tiny_target(vocab=8, layers=2, init=0.3, seed=3)
    d = tiny_drafter(t, layers=1, block_size=8, mask_token_id=7)
    prompt = [1, 2, 3]
    exact = _exact_joint(t, prompt, 4, 1.0)
    eng = SpeculativeEngine(t, BlockDiffusionProposer(d), controller=_decider(cpu_like_latency(1), 8,
                                                                                         prior=0.7))
    N = 2000
    outs, sizes = [], set()
    for s in range(N):
        r = eng.generate(prompt, 4, block_size=8, temperature=1.0, seed=s)
        outs.append(r.output_ids)
        sizes.update(r.block_sizes)
    outs = torch.tensor(outs)
    assert len(sizes) > 1  # the controller did change bs between rounds
    for pos in range(4):
        dims = tuple(i for i in range(4) if i != pos)
        counts = torch.bincount(outs[:, pos], minlength=8).double().numpy()
        assert chisquare(counts, exact.sum(dims).numpy() * N).pvalue > P_MIN, pos


def test_batched_engine_with_the_controller_keeps_every_request_exact(target):
    from .test_batched import Replay, _prompts

    prompts = _prompts(6, 3)
    ar = SpeculativeEngine(target, stop_token_ids=[0])
    refs = {tuple(p): p + ar.generate(p, 30).output_ids for p in prompts}
    Replay.refs = refs
    ctl = _decider(cpu_like_latency(), 16)
    batched = BatchedSpeculativeEngine(target, Replay, stop_token_ids=[0], controller=ctl)
    out = batched.generate(prompts, 30, block_size=16)
    for p, r in zip(prompts, out.results):
        assert r.output_ids == refs[tuple(p)][len(p):]
    assert len(out.block_sizes) == len(out.verify_seconds) and max(out.block_sizes) <= 16
    assert len(set(out.block_sizes)) > 1 and out.controller_seconds > 0


def test_calibration_fits_every_term_and_round_trips(tmp_path, target):
    d = tiny_drafter(target, layers=2, block_size=16)
    lat = calibrate_latency(target, BlockDiffusionProposer(d), [1, 2, 4, 8, 16], concurrency=[1, 4],
                            context_tokens=24, repeats=2)
    parts = {s["part"] for s in lat.samples}
    assert parts == {"draft", "verify"}  # the catch-up is measured inside draft forwards (deferred commits)
    drafts = [s for s in lat.samples if s["part"] == "draft"]
    assert {s["layers"] for s in drafts if s["c"] == 1} == {1, 2}  # the d slices
    assert {(s["bs"], s["c"]) for s in drafts if not s["pending"]} == {(b, c) for b in (2, 4, 8, 16) for c in (1, 4)}
    assert {(s["c"], s["pending"]) for s in drafts if s["pending"]} == {(1, 16), (1, 23), (4, 16), (4, 23)}
    assert lat.commit[0] == 0.0  # the catch-up rides in the draft forward: no fixed cost of its own
    assert {(s["bs"], s["c"]) for s in lat.samples if s["part"] == "verify"} == {(b, c) for b in (1, 2, 4, 8, 16)
                                                                                   for c in (1, 4)}
    assert lat.context_tokens == 24
    assert lat.num_layers == 2 and lat.num_taps == len(d.config.target_layer_ids)
    assert lat.round_seconds(8, 4) > 0 and lat.draft_seconds(1) == 0.0
    assert lat.round_seconds(1, 4) == lat.verify_seconds(1, 4)  # no drafts: a target step
    lat.to_json(tmp_path / "latency.json")
    back = LatencyModel.from_json(tmp_path / "latency.json")
    assert back.round_seconds(8, 4) == pytest.approx(lat.round_seconds(8, 4))
    assert len(back.samples) == len(lat.samples)


def test_fit_recovers_a_known_latency_model():
    """Batched draft samples (1..d layers at c 1, every c at d layers, forwards that first write kept tokens) and
    verify samples give back the model's draft, catch-up and verify terms."""
    true = dataclasses.replace(cpu_like_latency(d=3), commit=[0.0, 0.0002])
    samples = []
    for bs in (2, 4, 8, 16, 32):
        for j in (1, 2, 3):
            samples.append({"part": "draft", "bs": bs, "c": 1, "layers": j, "tokens": bs, "pending": 0,
                            "seconds": true.draft_seconds(bs, j)})
        for c in (1, 8, 32):
            samples.append({"part": "verify", "bs": bs, "c": c, "layers": None, "tokens": c * bs,
                            "seconds": true.verify_seconds(bs, c)})
            samples.append({"part": "draft", "bs": bs, "c": c, "layers": 3, "tokens": c * bs, "pending": 0,
                            "seconds": true.draft_seconds(bs, 3, c)})
    for c in (1, 8):
        for m in (32, 128):
            samples.append({"part": "draft", "bs": 2, "c": c, "layers": 3, "tokens": 2 * c, "pending": m,
                            "seconds": true.draft_seconds(2, 3, c) + true.commit_seconds(m, c)})
    fit = LatencyModel.fit(samples, 5, 3)
    for bs in (3, 12, 24):
        for c in (1, 16):
            assert fit.round_seconds(bs, c, 4.0) == pytest.approx(true.round_seconds(bs, c, 4.0), rel=1e-6)
            assert fit.round_seconds(bs, c, 4.0, pending=50) == pytest.approx(true.round_seconds(bs, c, 4.0, 50),
                                                                              rel=1e-6)
    assert fit.commit == pytest.approx([0.0, 0.0002], abs=1e-9)
    # one forward for the batch: the fixed cost is paid once per round, not c times
    assert fit.draft_seconds(8, concurrency=16) < 16 * fit.draft_seconds(8)
    assert fit.round_seconds(1, 16) == pytest.approx(true.verify_seconds(1, 16))  # bs 1: no drafter term
    with pytest.raises(ValueError, match="verify"):
        LatencyModel.fit([s for s in samples if s["part"] != "verify"], 5, 3)
    with pytest.raises(ValueError, match="commit"):
        LatencyModel.fit([s for s in samples if not s.get("pending")], 5, 3)
    # a legacy calibration (separate commit samples) still fits its commit term
    legacy = [s for s in samples if not s.get("pending")]
    legacy += [{"part": "commit", "bs": None, "c": 1, "layers": 3, "tokens": m, "seconds": true.commit_seconds(m)}
               for m in (1, 16, 32)]
    assert LatencyModel.fit(legacy, 5, 3).commit == pytest.approx([0.0, 0.0002], abs=1e-9)


def test_catchup_backlog_is_priced_and_spread_over_the_tokens_left():
    """After skipped rounds the first draft writes the backlog: the controller pays it when enough tokens remain
    for drafting to earn it back, not near the end, and a backlog never changes the choice when it is small."""
    lat = dataclasses.replace(cpu_like_latency(), commit=[0.0, 0.002])  # 2 ms per kept token and request
    ctl = _decider(lat, 16, prior_strength=1e-9)
    for _ in range(10):
        ctl.observe(7, 5)  # good acceptance: drafting pays in steady state
    steady = ctl.choose(4)
    assert steady > 1 and ctl.choose(4, pending=3) == steady  # one round's commit is in T(bs, c) already
    assert ctl.choose(4, pending=200, left=128) > 1  # 200 kept tokens x 4 requests: worth it over 64 tokens
    assert ctl.choose(4, pending=200, left=6) == 1  # ... not for the last 6
    e = 1 + sum(ctl.tracker.survival()[: steady - 1])
    extra = lat.commit_seconds(200, 4) - lat.commit_seconds(e, 4)
    rate = e / (lat.round_seconds(steady, 4, committed=e) + extra * e / 64)
    assert (rate > 1 / lat.round_seconds(1, 4)) == (ctl.choose(4, pending=200) > 1)


def test_verify_uses_the_measured_table_at_a_calibrated_concurrency():
    """A verify that costs the same for 2-4 tokens and steps up at 6 (memory-bound, then a kernel step), with a
    noise dip at 8: the model follows the measured points made non-decreasing at the calibrated c, the fitted line
    elsewhere."""
    measured = {2: 0.060, 4: 0.060, 6: 0.080, 8: 0.072, 16: 0.090}
    samples = [{"part": "verify", "bs": b, "c": 1, "layers": None, "tokens": b, "seconds": t} for b, t in measured.items()]
    samples += [{"part": "draft", "bs": b, "c": 1, "layers": 1, "tokens": b, "seconds": 0.004} for b in (2, 16)]
    samples += [{"part": "commit", "bs": None, "c": 1, "layers": 1, "tokens": m, "seconds": 0.001} for m in (1, 16)]
    lat = LatencyModel.fit(samples, 5, 1)
    assert lat.verify_seconds(3) == pytest.approx(0.060) and lat.verify_seconds(12) == pytest.approx(0.083)
    # the dip (6: 0.080, 8: 0.072) is pooled to its mean: bs 8 is never "cheaper" than bs 6
    assert lat.verify_seconds(6) == pytest.approx(0.076) == lat.verify_seconds(7) == lat.verify_seconds(8)
    assert lat.verify_seconds(1) <= lat.verify_seconds(2)  # extrapolated below the table with the line's slope
    costs = [lat.verify_seconds(b) for b in range(1, 33)]
    assert costs == sorted(costs)  # above the table too: from its last point, never the line below it
    assert lat.verify_seconds(24) >= lat.verify_seconds(16) == pytest.approx(0.090)
    v0, v1, v2 = lat.verify
    assert lat.verify_seconds(4, 8) == pytest.approx(v0 + 8 * v1 + 32 * v2)  # c = 8 was not calibrated: the line
    back = LatencyModel(**dataclasses.asdict(lat))
    assert back.verify_seconds(6) == pytest.approx(0.076)
    assert back.verify_table["1"]["8"] == 0.072  # the raw measurements are kept as measured


def test_monotone_fit_pools_decreasing_neighbours():
    assert monotone_fit([(1, 1.0), (2, 2.0), (4, 3.0)]) == [(1, 1.0), (2, 2.0), (4, 3.0)]
    fitted = monotone_fit([(2, 0.09), (4, 0.11), (8, 0.09), (16, 0.13), (24, 0.12), (32, 0.11)])
    assert [b for b, _ in fitted] == [2, 4, 8, 16, 24, 32]
    assert [round(t, 6) for _, t in fitted] == [0.09, 0.1, 0.1, 0.12, 0.12, 0.12]
    assert monotone_fit([]) == []


def test_calibration_context_is_the_jobs_typical_context():
    assert typical_context_tokens([700, 20, 90], 128) == 90 + 64  # median prompt + half the budget
    assert typical_context_tokens([], 64) == DEFAULT_CALIBRATION_CONTEXT
    assert 1 in CALIBRATION_BLOCK_SIZES  # the cost of not drafting is measured, not extrapolated


@pytest.mark.parametrize("idle_decay, long_decay, most", [(0.995, 0.99, 0.15), (0.9, 0.9, 1.0)])
def test_rounds_without_drafts_forget_slowly_so_a_useless_drafter_is_rarely_probed(idle_decay, long_decay, most):
    """No draft is ever accepted (τ = 1): with the long-run counts fading slowly the controller probes in few
    rounds; with every count decaying by 0.9 on every round (the first controller) it probed far more often."""
    ctl = _decider(cpu_like_latency(), max_block_size=16, idle_decay=idle_decay, long_decay=long_decay)
    probes = 0
    for _ in range(200):
        b = ctl.choose(1)
        probes += b > 1
        ctl.observe(b - 1, 0)
    share = probes / 200
    if idle_decay == 0.995:
        assert 0 < share <= most  # it still probes now and then (never stuck for good)
    else:
        assert share > 0.2  # 0.24 here, against 0.06 with the defaults


def test_a_drafter_that_pays_on_average_resumes_after_a_bad_stretch():
    """100 good rounds (the first draft accepted in half of them), then rejections until the controller stops
    drafting: its long-run estimate still holds the drafter's usual rate, so it resumes within a few idle rounds
    (the previous controller, one time scale fading slowly while idle, stayed at bs 1: 127 of 127 rounds of a
    GSM8K repeat where bs 4 pays). If the rejections go on, the long-run estimate follows and probes thin out.
    The defaults (recent_strength 10, explore 0.5) trust a short bad run less than the old point estimates
    (recent_strength = prior_strength, explore 0): a sudden total collapse costs them more drafted rounds before
    they stop (measured: 70 against 21), the price of not stopping on a few unlucky rounds where drafting pays."""

    def collapse(**kw):
        ctl = _decider(cpu_like_latency(), max_block_size=8, **kw)
        for i in range(100):
            ctl.observe(7, (0, 1, 0, 2)[i % 4])
        assert ctl.choose(1) > 1
        failures = 0
        while ctl.choose(1) > 1 and failures < 150:
            ctl.observe(ctl.choose(1) - 1, 0)
            failures += 1
        return ctl, failures

    _, failures_old = collapse(recent_strength=None, explore=0.0)
    ctl, failures = collapse()
    assert 3 <= failures_old < 30 and failures_old < failures < 100
    idle = 0
    while ctl.choose(1) == 1 and idle < 100:
        ctl.observe(0, 0)
        idle += 1
    assert idle <= 5
    probes = []
    for _ in range(200):  # the drafter never pays again
        b = ctl.choose(1)
        probes.append(b > 1)
        ctl.observe(b - 1, 0)
    assert sum(probes[-100:]) <= 25 and sum(probes[-100:]) < sum(probes[:100])


def test_recent_strength_sets_how_far_a_short_bad_run_moves_the_estimate_and_nothing_else():
    """A long run at a first-draft acceptance of 0.25, then three rejected rounds: with the recent rates shrunk by 2
    pseudo-rounds the estimate drops far below the long-run rate (the CPU default then stopped drafting in 35-54 %
    of HumanEval / MATH-500 / MBPP rounds where bs 4 pays 7-16 %); with 10 it stays close. The long-run rates do not
    depend on it, and None keeps the old behaviour (recent shrunk by ``prior_strength``)."""
    from dscout.decoding.controller import AcceptanceTracker

    def tracked(**kw):
        t = AcceptanceTracker(3, **kw)
        for i in range(200):
            t.update(3, 1 if i % 4 == 0 else 0)
        for _ in range(3):
            t.update(3, 0)
        return t

    weak, strong, default = tracked(recent_strength=2), tracked(recent_strength=10), tracked()
    assert weak.long_rates() == strong.long_rates() == default.long_rates()
    long_a1 = strong.long_rates()[0]
    assert 0.2 < long_a1 < 0.3
    assert weak.rates()[0] < 0.75 * long_a1 < strong.rates()[0] < long_a1
    assert default.rates() == weak.rates()  # None = prior_strength (2)
    with pytest.raises(ValueError):
        AcceptanceTracker(3, recent_strength=-1)


def test_explore_keeps_probing_after_a_few_unlucky_probes_and_fades_with_trials():
    """The cold start measured on MBPP: a fresh controller's first four probes were all rejected (probability 0.32
    at a first-draft acceptance of 0.25), its long-run a_1 fell from the prior 0.5 to about 0.17, below the
    break-even near 0.18, and it stopped drafting for hundreds of rounds. With ``explore`` the estimate is the upper
    side of the long-run posterior: after four rejections it stays above that break-even, after hundreds of rounds
    at 0.25 the bonus is small, and 0 is exactly the point estimate."""
    from dscout.decoding.controller import AcceptanceTracker

    def probed(n_rejected, **kw):
        t = AcceptanceTracker(3, **kw)
        for _ in range(n_rejected):
            t.update(3, 0)
        for _ in range(30):  # rounds without drafts: the recent counts fade, the estimate returns to the long run
            t.update(0, 0)
        return t

    plain, bold = probed(4), probed(4, explore=0.5)
    assert plain.long_rates() == bold.long_rates()  # the counts themselves do not depend on it
    assert plain.rates()[0] < 0.18 < bold.rates()[0] < plain.long_rates()[0] + 0.15
    assert bold.optimistic_long_rates()[0] > bold.long_rates()[0]

    def long_run(**kw):
        t = AcceptanceTracker(3, **kw)
        for i in range(400):
            t.update(3, 1 if i % 4 == 0 else 0)
        return t

    steady, steady_bold = long_run(), long_run(explore=0.5)
    bonus_early = bold.optimistic_long_rates()[0] - bold.long_rates()[0]
    bonus_late = steady_bold.optimistic_long_rates()[0] - steady_bold.long_rates()[0]
    assert 0 < bonus_late < 0.5 * bonus_early
    assert abs(steady_bold.rates()[0] - steady.rates()[0]) < 0.05
    assert AcceptanceTracker(3, explore=0.0).rates() == AcceptanceTracker(3).rates()
    assert all(r <= 1.0 for r in probed(0, explore=50.0).optimistic_long_rates())
    with pytest.raises(ValueError):
        AcceptanceTracker(3, explore=-0.1)


def test_measured_round_times_correct_an_underpriced_latency_model():
    lat = cpu_like_latency()
    ctl = _decider(lat, max_block_size=16, prior_strength=1e-9, time_relax=0.0)  # the ratios alone
    for _ in range(30):
        ctl.observe(7, 3)
    b = ctl.choose(8)
    assert b > 1  # by the model drafting pays at c = 8 ...
    s = ctl.tracker.survival()
    e = 1 + sum(s[: b - 1])
    for _ in range(40):  # ... but drafted rounds measure 3x their prediction, AR rounds as predicted
        ctl.observe_time(b, 8, 3 * lat.round_seconds(b, 8, committed=e, pending=e), committed=e)
        ctl.observe_time(1, 8, lat.round_seconds(1, 8))
    assert ctl.time_ratio[True] == pytest.approx(3.0, rel=0.05) and ctl.time_ratio[False] == pytest.approx(1.0, abs=0.01)
    assert ctl.choose(8) == 1
    off = _decider(lat, max_block_size=16, prior_strength=1e-9, time_weight=0.0)
    for _ in range(30):
        off.observe(7, 3)
    off.observe_time(b, 8, 100.0)
    assert off.choose(8) == b and off.time_ratio[True] == 1.0
    ctl.reset()
    assert ctl.time_ratio == {False: 1.0, True: 1.0}


def test_a_class_without_measured_rounds_borrows_the_other_ratio():
    """Only bs 1 rounds measured, 2x slower than the model: drafting must not look 2x cheaper by comparison."""
    lat = cpu_like_latency()
    ctl = _decider(lat, max_block_size=16, prior_strength=1e-9)
    for _ in range(30):
        ctl.observe(0, 0)  # not drafting: no acceptance evidence beyond the prior
    before = ctl.choose(32)
    for _ in range(40):
        ctl.observe_time(1, 32, 2 * lat.round_seconds(1, 32))
    assert ctl.timed == {False: 40, True: 0} and ctl.time_ratio[False] == pytest.approx(2.0, rel=0.05)
    assert ctl.choose(32) == before  # both classes scaled alike until a drafted round is measured


def test_a_frozen_controller_chooses_but_learns_nothing():
    """Warm-up generations run frozen: a 4x slow first drafted round must not price drafting out."""
    lat = cpu_like_latency()
    ctl = _decider(lat, max_block_size=8)
    before = (ctl.choose(1), list(ctl.tracker.trials), dict(ctl.time_ratio), ctl.overhead_seconds)
    with ctl.frozen():
        b = ctl.choose(1)
        ctl.observe(b - 1, 0)
        ctl.observe_time(b, 1, 4 * lat.round_seconds(b, 1))
    assert (ctl.choose(1), list(ctl.tracker.trials), dict(ctl.time_ratio)) == before[:3]
    assert ctl.overhead_seconds >= before[3] and not ctl._frozen
    ctl.observe_time(b, 1, 4 * lat.round_seconds(b, 1))  # outside the block it learns
    assert ctl.time_ratio[True] > 1


def test_a_class_not_chosen_drifts_back_so_drafting_is_tried_again():
    """Drafted rounds measured 3x their price (noise) stop drafting; every bs 1 round then pulls the drafting
    ratio towards the measured bs 1 ratio, so drafting that pays by the acceptance is tried again; without the
    drift (time_relax 0) it is priced out for good."""
    lat = cpu_like_latency()
    for relax, again in ((0.01, True), (0.0, False)):
        ctl = _decider(lat, max_block_size=8, prior_strength=1e-9, time_relax=relax)
        for i in range(40):
            ctl.observe(7, (0, 1, 0, 2)[i % 4])
        b = ctl.choose(1)
        assert b > 1
        for _ in range(30):
            ctl.observe_time(1, 1, lat.round_seconds(1, 1))
            ctl.observe_time(b, 1, 3 * lat.round_seconds(b, 1, committed=1.6, pending=1.6), committed=1.6)
        assert ctl.choose(1) == 1
        rounds = 0
        while ctl.choose(1) == 1 and rounds < 400:
            ctl.observe_time(1, 1, lat.round_seconds(1, 1))
            rounds += 1
        assert (rounds < 400) == again, rounds


def test_a_rarely_reached_position_takes_its_long_run_rate_not_the_first_positions():
    """Acceptance in runs: the first draft is accepted in 1 of 5 rounds, the second in 3 of 5 rounds that reach
    it. After a stretch of first-draft rejections the recent a_2 must stay near the long-run 0.6, not fall to
    the recent a_1."""
    t = AcceptanceTracker(max_drafts=4)
    for i in range(200):
        first = i % 5 == 0
        second = first and (i // 5) % 5 < 3
        t.update(3, 0 if not first else (2 if second else 1))
    for _ in range(10):
        t.update(3, 0)
    long, recent = t.long_rates(), t.rates()
    assert long[1] == pytest.approx(0.6, abs=0.1) and long[0] < 0.2
    assert recent[0] < 0.15 and recent[1] > 0.45


def test_the_first_round_measures_the_baseline_and_a_confirmed_first_measurement_sets_the_ratio():
    """Good acceptance, but no round without drafts timed yet: the first round does not draft. Once it is
    timed (1.2x the model) drafting starts; one drafted round at 2.7x the model is not enough to move the drafting
    ratio (it might be a one-off slow call), a second one confirms it and is taken as measured, not averaged with a
    default, and drafting continues only if it still pays at those prices."""
    lat = cpu_like_latency()
    ctl = BlockSizeController(lat, max_block_size=8, prior_strength=1e-9)
    for _ in range(20):
        ctl.observe(7, 1)  # a_1 = 1, a_2 = 0: E[L(bs >= 3)] = 2
    assert ctl.choose(8) == 1 and ctl.choose(8) == 1  # until FIRST_ROUNDS bs 1 rounds are timed
    for slow in (1.5, 1.2, 1.1):
        assert ctl.choose(8) == 1
        ctl.observe_time(1, 8, slow * lat.round_seconds(1, 8))
    assert ctl.time_ratio[False] == pytest.approx(1.2)  # their (lower) median
    b = ctl.choose(8)
    assert b > 1
    slow = 2.7 * lat.round_seconds(b, 8, committed=2.0, pending=2.0)
    ctl.observe_time(b, 8, slow, committed=2.0)
    assert ctl.time_ratio[True] == pytest.approx(1.2) and ctl.choose(8) == b  # the borrowed ratio still
    ctl.observe_time(b, 8, slow, committed=2.0)
    assert ctl.time_ratio[True] == pytest.approx(2.7, rel=0.01)
    e = 2.0
    pays = e / (lat.round_seconds(b, 8, committed=e) * 2.7) > 1 / (lat.round_seconds(1, 8) * 1.2)
    assert (ctl.choose(8) > 1) == pays
    assert BlockSizeController(lat, 8, time_weight=0.0).choose(8) > 1  # no feedback: no baseline round
    assert BlockSizeController(lat, 8, candidates=[2, 4]).choose(8) in (2, 4)  # bs 1 not a candidate


def test_one_slow_first_drafted_round_does_not_price_drafting_out():
    """Table 4 at c = 1 (2026-12-06): the job's first drafted round took 108 ms, the next ones 60-67 ms. Taken
    as measured, its 1.8x set the drafting ratio and kept the controller at bs 1 for the next three generations
    where bs 4 pays 1.21x AR. Now the drafting ratio stays near the rounds that followed, and drafting goes on."""
    lat = cpu_like_latency()
    ctl = BlockSizeController(lat, max_block_size=8, prior_strength=1e-9)
    for _ in range(20):
        ctl.observe(7, 1)
    for _ in range(BlockSizeController.FIRST_ROUNDS):
        ctl.observe_time(1, 1, lat.round_seconds(1, 1))
    b = ctl.choose(1)
    assert b > 1
    ctl.observe_time(b, 1, 1.8 * lat.round_seconds(b, 1, committed=2.0, pending=2.0), committed=2.0)
    for _ in range(5):
        ctl.observe_time(b, 1, 1.05 * lat.round_seconds(b, 1, committed=2.0, pending=2.0), committed=2.0)
    assert ctl.time_ratio[True] == pytest.approx(1.05, abs=0.02) and ctl.choose(1) == b
    # the old rule (the first measurement sets the ratio) would have priced it out
    old = BlockSizeController(lat, max_block_size=8, prior_strength=1e-9)
    old.tracker, old.timed, old.time_ratio = ctl.tracker, {False: 1, True: 1}, {False: 1.0, True: 1.8}
    assert old.choose(1) == 1


def test_a_batch_round_prices_its_fixed_part_by_the_request_the_batch_waits_for():
    """By the mean acceptance (E[L(2)] = 1.5) bs 2 pays at c = 8; but in the finished batches the last request
    accepted none of its drafts, and a round's fixed part buys the batch's end only that request's progress. With
    ``makespan`` the controller then does not draft at c = 8; at c = 1, before any batch finished, without drafts
    or accepted drafts in a batch, frozen, or with ``makespan`` off, the price is the plain T(bs, c)."""
    lat = cpu_like_latency()
    chosen = {}
    for makespan in (True, False):
        ctl = _decider(lat, max_block_size=8, prior_strength=1e-9, makespan=makespan)
        for _ in range(30):
            ctl.observe_batch([(7, 1)] * 4 + [(7, 0)] * 4)
        before = ctl.choose(8)
        ctl.observe_makespan((0, 0), (100, 40))  # the last request never drafted: nothing learnt
        ctl.observe_makespan((20, 5), (0, 0))
        with ctl.frozen():
            ctl.observe_makespan((20, 0), (160, 80))
        assert ctl.rho is None and ctl.choose(8) == before == 2
        ctl.observe_makespan((20, 0), (160, 80))
        assert ctl.rho == 0.0
        chosen[makespan] = ctl.choose(8), ctl.choose(1)
    assert chosen[False][0] == 2 and chosen[True][0] == 1
    assert chosen[True][1] == chosen[False][1] == 2  # one request: nothing to wait for
    one = lat.round_seconds(2, 1, committed=1.5)
    fixed = one - (lat.round_seconds(2, 8, committed=1.5) - one) / 7
    assert 0 < fixed < one  # the split the price uses: a real per-round part
    ctl = _decider(lat, max_block_size=8, makespan_weight=0.5)
    ctl.observe_makespan((10, 2), (80, 32))  # share 0.2 / 0.4
    ctl.observe_makespan((10, 6), (80, 16))  # share 3: clipped to 1
    assert ctl.rho == pytest.approx(0.75)
    ctl.reset()
    assert ctl.rho is None


class _CountingController(BlockSizeController):
    """Records the bs of every observe_time call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.timed_rounds = []

    def observe_time(self, bs, concurrency, seconds, committed=None, pending=0.0):
        self.timed_rounds.append(bs)
        super().observe_time(bs, concurrency, seconds, committed=committed, pending=pending)


def test_both_engines_feed_back_every_round_but_the_first_of_a_generation(target):
    """The first decode round after a prefill pays one-off costs (cache growth, first masks): its time would set a
    class's ratio (Table 4 at c = 16: a 153 ms first round against ~102 ms AR rounds priced not drafting out).
    Every later round is fed back, and the baseline round then falls on the second round."""
    from .test_batched import Replay, _prompts

    d = tiny_drafter(target, layers=2, block_size=8)
    ctl = _CountingController(cpu_like_latency(), 8, prior=0.9)
    eng = SpeculativeEngine(target, BlockDiffusionProposer(d), stop_token_ids=[0], controller=ctl)
    r = eng.generate([5, 6, 7, 8], 20, block_size=8)
    assert len(ctl.timed_rounds) == len(r.block_sizes) - 1 >= 2
    assert r.block_sizes[:2] == [1, 1] and ctl.timed_rounds[0] == 1  # round 2 times the no-draft baseline
    assert max(r.block_sizes) > 1  # then it drafts
    r2 = eng.generate([9, 10, 11], 12, block_size=8)  # a second generation: its first round is skipped too
    assert len(ctl.timed_rounds) == len(r.block_sizes) + len(r2.block_sizes) - 2

    prompts = _prompts(4, 3)
    ar = SpeculativeEngine(target, stop_token_ids=[0])
    Replay.refs = {tuple(p): p + ar.generate(p, 20).output_ids for p in prompts}
    ctl = _CountingController(cpu_like_latency(), 8, prior=0.9)
    out = BatchedSpeculativeEngine(target, Replay, stop_token_ids=[0], controller=ctl).generate(prompts, 20,
                                                                                               block_size=8)
    assert len(ctl.timed_rounds) == len(out.block_sizes) - 1 >= 2
    assert out.block_sizes[:2] == [1, 1]


def test_a_stretch_of_slow_rounds_moves_the_time_ratio_by_a_bounded_step():
    """Load spikes: five drafted rounds at 1.4x the model among rounds at 1.0x. Clipped (the default 1.1), the
    drafted class's ratio rises by at most ~1 % per round and drafting continues where it pays by ~9 %;
    unclipped, the same rounds raise it to ~1.16 and price drafting out (the CPU default's GSM8K job: 73 and 115
    of a repeat's rounds at bs 1 where bs 4 beat AR by 16 %). A lasting change is still followed."""
    lat = cpu_like_latency()
    for clip, keeps_drafting in ((1.1, True), (None, False)):
        ctl = _decider(lat, max_block_size=4, prior_strength=1e-9, time_clip=clip, candidates=[1, 4])
        for i in range(60):
            ctl.observe(3, 0 if i % 3 else 1)  # a_1 = 1/3, a_2 = 0: E[L(4)] = 1.33, bs 4 priced 1.22x a bs-1 round
        e = 4 / 3
        ctl.observe_time(1, 1, lat.round_seconds(1, 1))
        for _ in range(10):
            ctl.observe_time(4, 1, lat.round_seconds(4, 1, committed=e, pending=e), committed=e)
        assert ctl.choose(1) == 4
        for _ in range(5):  # the stretch of slow drafted rounds
            ctl.observe_time(4, 1, 1.4 * lat.round_seconds(4, 1, committed=e, pending=e), committed=e)
        assert (ctl.time_ratio[True] <= 1.06) == (clip is not None)
        assert (ctl.choose(1) == 4) == keeps_drafting
    ctl = _decider(lat, max_block_size=4, time_clip=1.1)
    for _ in range(80):  # a lasting 1.5x: followed within tens of rounds
        ctl.observe_time(4, 1, 1.5 * lat.round_seconds(4, 1, committed=1.0, pending=1.0), committed=1.0)
    assert ctl.time_ratio[True] == pytest.approx(1.5, rel=0.02)



def test_the_schemas_controller_defaults_are_the_controllers():
    """`online_controller` passes only the keys a config sets: a config without them gets the class's defaults,
    which must be the ones the schema documents (and fills in)."""
    import inspect

    import yaml

    from tests.workflow import ROOT

    schema = yaml.safe_load((ROOT / "schemas" / "config.schema.yaml").read_text())
    props = schema["properties"]["controller"]["properties"]
    params = inspect.signature(BlockSizeController.__init__).parameters
    for k in ("decay", "prior_strength", "prior", "catchup_horizon", "long_decay", "idle_decay", "time_weight",
              "time_relax", "time_clip", "recent_strength", "explore"):
        assert params[k].default == props[k]["default"], k
