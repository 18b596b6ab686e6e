"""An online block-size controller for a mixed-horizon drafter (docs/method.md §5, "beyond the paper").

A mixed-horizon checkpoint drafts well at any bs up to its largest training horizon, so bs can change from one
round to the next. Before each round the controller picks

    bs* = argmax_bs  E[L(bs)] / T(bs, c),     E[L(bs)] = 1 + sum_{k=1}^{bs-1} S(k),

where ``S(k) = a_1 ... a_k`` is the survival product of the per-position conditional acceptance rates
``a_j = P(draft j accepted | drafts 1..j-1 accepted)`` (so ``E[L]`` is the expected number of tokens a round
commits: accepted drafts + the bonus) and ``T`` is the calibrated round time of
:class:`~dscout.decoding.latency.LatencyModel`.

Deferred commits and the catch-up. A round at bs 1 does no drafter work: its committed tokens are kept and written
into the drafter's cache by the next draft forward. In steady drafting that write is one round's tokens (priced
in ``T(bs, c)`` with ``E[L]``); after skipped rounds it is the backlog of ``m`` kept tokens per request, a one-off
cost ``T_commit(m, c) - T_commit(E[L], c)``. Resuming drafting pays it once and then drafts for the rest of the
generation, so the controller spreads it over the tokens that remain (at most ``catchup_horizon``): a draft round
is worth ``E[L] / (T(bs, c) + extra * E[L] / H)`` with ``H = min(tokens left, catchup_horizon)``. A long backlog
near the end of a generation therefore keeps it at bs 1, while a backlog early on, or a clear gain from drafting,
does not (charging the whole backlog to one round would make every skipped round a reason to skip the next one).
Two time scales of acceptance. The recent counts (``decay`` per round, ~10 rounds) follow the text being written;
they are shrunk towards a long-run estimate of the same drafter on the same job (``long_decay`` per drafted round,
~100 rounds), not towards a fixed guess. While the controller does not draft, the recent counts fade by ``decay``
per round, so its estimate returns to the long-run rate within ~20 rounds, and the long-run counts fade slowly
(``idle_decay`` per round without drafts) towards the prior. So a drafter that pays on average resumes drafting
soon after a bad stretch, and a drafter that never pays (τ ≈ 1) is probed only every ~100+ rounds. With one time
scale, a fast decay makes the controller probe about every other round where no draft is ever accepted, and the
idle rounds' slow decay on that one scale leaves it stuck at bs 1 after a bad stretch where drafting pays
(measurements: reports/online_controller/report.md).

Exploration under uncertainty (``explore``). With point estimates a few unlucky probes decide a job: when a fresh
controller's first probes are all rejected, the long-run ``a_1`` of a drafter just above break-even falls below it
and the controller stays at bs 1 for the rest of the job. With ``explore = z`` the long-run rate the recent one is
shrunk towards is its Beta posterior's mean plus ``z`` standard deviations,
``m + z sqrt(m (1 - m) / (n + prior_strength + 1))``: wide after a few trials, negligible after a few hundred, so
the controller keeps probing until the interval clears break-even and then follows the mean. The price is a few
more probes where drafting never pays (reports/controller_simulation/report.md).

Measured round times. The calibrated model is fitted once, at start-up, on a fresh short context; the rounds of a
real run can cost more (a longer cache, the batched engine's masked slots of rejected drafts, machine load). After
each round the engine reports its wall time (:meth:`BlockSizeController.observe_time`) and the controller keeps a
running ratio of measured to predicted seconds, one for rounds that draft and one for rounds that do not; a
candidate's predicted time is scaled by its class's ratio; a class without a measured round yet borrows the other
class's ratio (a ratio learned only at bs 1 would otherwise make drafting look cheap by comparison), and a class
not chosen drifts slowly towards the other's (``time_relax``): a class is measured only when chosen, so a few slow
drafted rounds (machine noise) would otherwise price drafting out for the rest of the job. How fast it drifts,
and how fast idle rounds forget the long-run acceptance, set what exploring costs where drafting never pays (each
probe costs more than a bs-1 round); the defaults were chosen on simulated jobs (benchmarks/controller_simulation.py,
reports/controller_simulation/report.md). Each round's ratio is clipped to within ``time_clip`` of the current one,
so a stretch of slow rounds moves it little while a lasting change is still followed. Untimed warm-up generations
run inside :meth:`BlockSizeController.frozen`: their first calls are slow and teach nothing. No model of where the
extra cost comes from is needed,
and a ratio that drifts is followed (exponential average, ``time_weight`` per round).

Acceptance statistics (:class:`AcceptanceTracker`): a round that drafted ``k`` tokens and accepted ``n``
observes positions ``1..min(n + 1, k)``: successes at ``1..n``, a failure at ``n + 1`` when ``n < k``;
later positions are censored. Counts decay by ``decay`` per round (recent rounds count most), and each
position's rate is shrunk towards the rate of the position before it (``prior_strength`` pseudo-rounds), so a
position that recent rounds did not reach inherits its neighbour's rate: the controller keeps trying longer
blocks when acceptance is high and shrinks them when it drops.

Losslessness does not depend on the controller: it only chooses how many drafts the next round verifies from
what earlier rounds committed, and every round is verified exactly (greedy = AR; sampling keeps the target
distribution).
"""

from __future__ import annotations

import contextlib
import time


class AcceptanceTracker:
    """Decayed per-position acceptance counts on two time scales, with hierarchical shrinkage.

    Args:
        max_drafts: largest number of drafts per round (horizon - 1).
        decay: per-round multiplier of the recent counts (drafted or not), in (0, 1].
        prior_strength: pseudo-rounds pulling each long-run rate towards its prior: the long-run ``a_1`` towards
            ``prior`` and a long-run ``a_j`` towards the long-run ``a_{j-1}`` (a position no round has reached
            inherits the rate of the one before).
        recent_strength: pseudo-rounds pulling a recent ``a_j`` towards the long-run ``a_j`` (None = ``prior_strength``).
        prior: acceptance rate assumed before any observation at position 1.
        idle_decay: per-round multiplier of the long-run counts on rounds without drafts.
        long_decay: per-round multiplier of the long-run counts on drafted rounds.
        explore: optimism under uncertainty, in posterior standard deviations: the long-run ``a_j`` the recent rates
            are shrunk towards is raised by ``explore * sqrt(a (1 - a) / (n_j + prior_strength + 1))`` (``n_j`` its
            decayed long-run trials), the upper side of its Beta posterior. A few rejected probes then leave a wide
            interval and the controller keeps probing until the interval clears break-even; with many trials the
            bonus vanishes and the estimate is the mean (0 = point estimates, the behaviour before this setting existed).
    Raises:
        ValueError: for ``max_drafts < 1``, a decay outside (0, 1] or a negative ``recent_strength``/``explore``.
    """

    def __init__(self, max_drafts: int, decay: float = 0.9, prior_strength: float = 2.0, prior: float = 0.5,
                 idle_decay: float = 0.998, long_decay: float = 0.99, recent_strength: float | None = None,
                 explore: float = 0.0):
        if max_drafts < 1:
            raise ValueError("max_drafts must be >= 1")
        if not all(0 < f <= 1 for f in (decay, idle_decay, long_decay)):
            raise ValueError("decay, idle_decay and long_decay must be in (0, 1]")
        self.max_drafts, self.decay, self.prior_strength, self.prior = max_drafts, decay, prior_strength, prior
        self.idle_decay, self.long_decay = idle_decay, long_decay
        self.recent_strength = prior_strength if recent_strength is None else recent_strength
        if self.recent_strength < 0:
            raise ValueError("recent_strength must be >= 0")
        if explore < 0:
            raise ValueError("explore must be >= 0")
        self.explore = float(explore)
        self.reset()

    def reset(self) -> None:
        """Forget every observation (both time scales)."""
        self.successes = [0.0] * self.max_drafts
        self.trials = [0.0] * self.max_drafts
        self.long_successes = [0.0] * self.max_drafts
        self.long_trials = [0.0] * self.max_drafts

    def update(self, drafted: int, accepted: int) -> None:
        """Record one round: ``drafted`` drafts verified, the first ``accepted`` of them accepted."""
        self.update_batch([(drafted, accepted)])

    def update_batch(self, rounds: list[tuple[int, int]]) -> None:
        """Record one batch round: ``(drafted, accepted)`` per request. The recent counts decay once by ``decay``;
        the long-run counts by ``long_decay``, or by ``idle_decay`` when no request drafted."""
        fl = self.long_decay if any(d > 0 for d, _ in rounds) else self.idle_decay
        for j in range(self.max_drafts):
            self.successes[j] *= self.decay
            self.trials[j] *= self.decay
            self.long_successes[j] *= fl
            self.long_trials[j] *= fl
        for drafted, accepted in rounds:
            for j in range(min(accepted + 1, drafted, self.max_drafts)):
                self.trials[j] += 1.0
                self.long_trials[j] += 1.0
                if j < accepted:
                    self.successes[j] += 1.0
                    self.long_successes[j] += 1.0

    def long_rates(self) -> list[float]:
        """The long-run ``[a_1, ..., a_K]`` (``a_1`` shrunk towards ``prior``, ``a_j`` towards ``a_{j-1}``)."""
        out, prev = [], self.prior
        for s, n in zip(self.long_successes, self.long_trials):
            prev = (s + self.prior_strength * prev) / (n + self.prior_strength)
            out.append(prev)
        return out

    def optimistic_long_rates(self) -> list[float]:
        """The long-run rates each raised by ``explore`` posterior standard deviations (capped at 1): what the
        recent rates are shrunk towards. Equal to :meth:`long_rates` when ``explore`` is 0."""
        means = self.long_rates()
        if not self.explore:
            return means
        z, k = self.explore, self.prior_strength
        return [min(1.0, m + z * (m * (1.0 - m) / (n + k + 1.0)) ** 0.5) for m, n in zip(means, self.long_trials)]

    def rates(self) -> list[float]:
        """``[a_1, ..., a_K]``, conditional acceptance per draft position from the recent rounds, each shrunk
        towards the long-run rate of the same position.

        Not towards the recent rate of the position before: acceptance comes in runs (a draft that follows an
        accepted one is accepted far more often than the first), so where the first draft is rarely accepted the
        recent rounds almost never reach position 2, and borrowing ``a_1`` there prices every longer block as if
        its drafts were as hard as the first (CPU default, HumanEval: recent ``a_1`` 0.15 gave ``a_2`` 0.15
        against a long-run ``a_2`` of 0.39, and the controller stopped drafting where bs 4 was 4 % faster).
        """
        k = self.recent_strength
        return [(s + k * p) / (n + k) for s, n, p in zip(self.successes, self.trials, self.optimistic_long_rates())]

    def survival(self) -> list[float]:
        """``[S(1), ..., S(K)]`` with ``S(k) = a_1 ... a_k``: the probability that a round accepts >= k drafts."""
        out, s = [], 1.0
        for a in self.rates():
            s *= a
            out.append(s)
        return out


class BlockSizeController:
    """Picks bs before each round to maximise expected committed tokens per second.

    In a batch (``concurrency > 1``, ``makespan``) a round's time has a part paid once per round (the
    target's and drafter's fixed cost; the 2-point split of ``T(bs, 1)`` and ``T(bs, c)``) and a part per request.
    Finished requests leave the batch, so the per-request part buys every request's expected progress ``E[L]``,
    but the per-round part is paid until the **last** request finishes: it buys only that request's progress. The
    controller learns from each finished batch (:meth:`observe_makespan`) the share ``rho`` of the mean excess
    acceptance ``E[L] - 1`` that its last request got, and prices a round ``T + fixed * (E[L] / E[L_last] - 1)``
    with ``E[L_last] = 1 + rho (E[L] - 1)``; before a batch has finished, or with one request, this is ``T``.
    Measured on the CPU default (Table 4, c = 8, bs 2, finished requests leaving the batch): the requests needed
    22.8 rounds on average but the batch ran 28 (its last request, HumanEval/68, accepted 4 drafts in 28 rounds),
    so rounds that paid 1.1x by the mean acceptance ran the batch at 0.95x AR.

    Args:
        latency: a :class:`~dscout.decoding.latency.LatencyModel` of this target/drafter on this machine.
        max_block_size: the drafter's largest training horizon (upper bound of bs).
        candidates: bs values to consider (default every bs from 1 to ``max_block_size``; 1 = no drafts).
        decay, prior_strength, prior, idle_decay, long_decay, recent_strength, explore: see
            :class:`AcceptanceTracker`.
        catchup_horizon: tokens over which a resumed drafting regime pays off a catch-up backlog (module doc).
        time_weight: weight of the newest round in the measured / predicted time ratios (0 = no time feedback).
        time_relax: per measured round of one class, the share by which the other class's ratio moves towards it
            (a class is only measured when chosen: without this, a few slow drafted rounds would price drafting
            out for good).
        time_clip: each measured round's ratio is clipped to within this factor of its class's current ratio before
            averaging (None = off), so a round moves the ratio by at most ``time_weight * (time_clip - 1)`` of itself:
            a stretch of slow rounds (this CPU's load spikes: 60–75 ms drafted rounds among 53 ms ones) no longer
            prices drafting out for the rest of a job, while a lasting change is still followed within tens of
            rounds. Found on the CPU default's GSM8K job (9 repeats): five slow drafted rounds raised the drafted
            class's ratio from 1.01 to 1.15 while its rounds' median stayed 1.00x the model, and the controller then
            ran 73, 115 and 36 of a repeat's rounds at bs 1 where bs 4 is 16 % faster than AR.
        baseline_round: with time feedback on, the first rounds (until ``FIRST_ROUNDS`` rounds without drafts have
            been timed) do not draft: they measure the baseline the drafted rounds' measured times are compared with. Without it a
            drafting class measured alone lends its ratio to not drafting, and the comparison the feedback exists
            for is not made (Table 4 at c = 16: drafted in 92 % of the second batch's rounds at 0.69x AR). The
            engines feed back no time for the first round of a generation (one-off costs after the prefill), so
            the baseline starts with the first fed-back round.
        makespan: price the per-round part of a batch round by its last request's expected progress (above).
        makespan_weight: weight of the newest finished batch in ``rho``.
    Attributes:
        overhead_seconds: wall seconds spent in :meth:`choose` and the feedback (the controller's cost per run).
        FIRST_ROUNDS: a class's first measured rounds (with the ratio it borrowed) set its ratio by their lower
            median; the clipped average follows from then on. The baseline (``baseline_round``) is this many timed
            rounds without drafts.
    """

    FIRST_ROUNDS = 3

    def __init__(self, latency, max_block_size: int, candidates: list[int] | None = None, decay: float = 0.9,
                 prior_strength: float = 2.0, prior: float = 0.5, catchup_horizon: int = 64,
                 idle_decay: float = 0.998, time_weight: float = 0.1, long_decay: float = 0.99,
                 time_relax: float = 0.003, baseline_round: bool = True, time_clip: float | None = 1.1,
                 recent_strength: float | None = 10.0, explore: float = 0.5, makespan: bool = True,
                 makespan_weight: float = 0.5):
        if max_block_size < 1:
            raise ValueError("max_block_size must be >= 1")
        self.latency = latency
        self.max_block_size = max_block_size
        self.candidates = sorted({b for b in (candidates or range(1, max_block_size + 1)) if 1 <= b <= max_block_size})
        self.tracker = AcceptanceTracker(max(max_block_size - 1, 1), decay, prior_strength, prior, idle_decay,
                                         long_decay, recent_strength, explore)
        self.makespan = bool(makespan)
        self.makespan_weight = float(makespan_weight)
        self.rho = None  # share of the mean excess acceptance the last request of a batch gets (None: no batch yet)
        self.overhead_seconds = 0.0
        self.catchup_horizon = max(int(catchup_horizon), 1)
        self.time_weight = float(time_weight)
        self.time_relax = float(time_relax)
        self.baseline_round = bool(baseline_round)
        self.time_clip = float(time_clip) if time_clip else None
        self.time_ratio = {False: 1.0, True: 1.0}  # measured / predicted round seconds: (drafting?) -> ratio
        self.timed = {False: 0, True: 0}  # measured rounds per class
        self._first = {False: [], True: []}  # a class's first measured ratios (and the one it borrowed)
        self._frozen = False

    def reset(self) -> None:
        """Forget every observation and the overhead so far (e.g. after an untimed warm-up)."""
        self.tracker.reset()
        self.rho = None
        self.overhead_seconds = 0.0
        self.time_ratio = {False: 1.0, True: 1.0}
        self.timed = {False: 0, True: 0}
        self._first = {False: [], True: []}

    def choose(self, concurrency: int = 1, limit: int | None = None, pending: int = 0,
               left: int | None = None) -> int:
        """The bs of the next round for ``concurrency`` active requests.

        Args:
            limit: largest useful bs (e.g. tokens left to generate); default ``max_block_size``.
            pending: kept tokens per request (most over the requests) a draft this round must write first.
            left: tokens left to generate (most over the requests), the horizon a catch-up is spread over
                (capped at ``catchup_horizon``; default the cap).
        Returns:
            bs in ``candidates`` (at most ``limit``; the smallest candidate if none fits).
        """
        t0 = time.perf_counter()
        if (self.baseline_round and self.time_weight > 0 and self.timed[False] < self.FIRST_ROUNDS
                and not self._frozen and self.candidates[0] == 1):
            # the first round of a job does not draft: it measures what not drafting costs here, the baseline every
            # drafted round's measured time is compared with (an AR step: nothing is lost but the drafts)
            self.overhead_seconds += time.perf_counter() - t0
            return self.candidates[0]
        hi = self.max_block_size if limit is None else min(limit, self.max_block_size)
        pool = [b for b in self.candidates if b <= hi] or self.candidates[:1]
        expected = self._expected(self.tracker, pool[-1])
        lat, c = self.latency, concurrency
        split = self.makespan and c > 1 and self.rho is not None and self.rho < 1.0
        horizon = float(self.catchup_horizon if left is None else max(min(left, self.catchup_horizon), 1))
        best, best_rate = pool[0], -1.0
        ratio = {k: self.time_ratio[k if self.timed[k] else not k] for k in (False, True)}
        for bs in pool:
            e = expected[bs - 1]
            t = lat.round_seconds(bs, c, committed=e)
            if bs > 1 and pending > e:  # a backlog: one-off catch-up, spread over the tokens it pays for
                t += (lat.commit_seconds(pending, c) - lat.commit_seconds(e, c)) * e / max(horizon, e)
            if split and bs > 1:  # the per-round part buys the progress of the request the batch ends with
                one = lat.round_seconds(bs, 1, committed=e)
                fixed = min(max(one - (t - one) / (c - 1), 0.0), t)
                t += fixed * (e / (1.0 + self.rho * (e - 1.0)) - 1.0)
            rate = e / (t * ratio[bs > 1])
            if rate > best_rate:
                best, best_rate = bs, rate
        self.overhead_seconds += time.perf_counter() - t0
        return best

    @staticmethod
    def _expected(tracker, largest: int) -> list[float]:
        """``[E[L(1)], ..., E[L(largest)]]`` from a tracker's survival products (one pass)."""
        out = [1.0]
        for x in tracker.survival()[: largest - 1]:
            out.append(out[-1] + x)
        return out

    @contextlib.contextmanager
    def frozen(self):
        """Within the block the controller chooses as usual but learns nothing and counts no overhead: for untimed
        warm-up generations, whose first calls run slow (allocations, kernel selection) and would otherwise teach it
        that drafting costs up to 4x its price (a time ratio only updates when its class is chosen again, so one
        such round kept the CPU default's GSM8K job at bs 1 for its first 63 rounds)."""
        saved, self._frozen = self._frozen, True
        spent = self.overhead_seconds
        try:
            yield self
        finally:
            self._frozen, self.overhead_seconds = saved, spent

    def observe_time(self, bs: int, concurrency: int, seconds: float, committed: float | None = None,
                     pending: float = 0.0) -> None:
        """Feed back one round's measured wall time (seconds) against the latency model's prediction for it.

        Args:
            bs: the round's block size (1 = no drafts).
            concurrency: requests in the round.
            seconds: its wall time (draft, verify, commit and bookkeeping).
            committed: tokens it committed per request (mean), the steady-state catch-up the model prices.
            pending: kept tokens per request its draft wrote first (a backlog after skipped rounds).
        """
        if self.time_weight <= 0 or seconds <= 0 or self._frozen:
            return
        t0 = time.perf_counter()
        lat = self.latency
        predicted = lat.round_seconds(bs, concurrency, committed=committed,
                                      pending=max(pending, committed or 0.0) if bs > 1 else None)
        if predicted > 0:
            ratio = min(max(seconds / predicted, 0.25), 4.0)
            key = bs > 1
            if self.timed[key] >= self.FIRST_ROUNDS:
                r = self.time_ratio[key]
                if self.time_clip:  # one round moves the estimate by at most time_weight x (clip - 1) of itself
                    ratio = min(max(ratio, r / self.time_clip), r * self.time_clip)
                self.time_ratio[key] += self.time_weight * (ratio - r)
            else:
                # a class's first rounds: the lower median of its measured ratios and, if the other class was
                # measured first, the ratio it borrowed from it. One slow round (a first call at a new shape: 108 ms
                # against 64 ms for the next drafted rounds, Table 4 at c = 1) then does not price drafting out,
                # while a second round that confirms it does; the baseline (bs 1) is the lower median of its first
                # FIRST_ROUNDS rounds, not one round (an early bs-1 round at c = 8 took 88 ms against AR's 81 ms
                # average, and that one round made every drafted round look 8 % cheaper than it was)
                if not self.timed[key]:
                    self._first[key] = [self.time_ratio[not key]] if self.timed[not key] else []
                self._first[key].append(ratio)
                self.time_ratio[key] = sorted(self._first[key])[(len(self._first[key]) - 1) // 2]
            self.timed[key] += 1
            if self.timed[not key]:  # the class not chosen drifts towards this one until measured again
                self.time_ratio[not key] += self.time_relax * (self.time_ratio[key] - self.time_ratio[not key])
        self.overhead_seconds += time.perf_counter() - t0

    def observe(self, drafted: int, accepted: int) -> None:
        """Feed back one request's round: ``drafted`` drafts, ``accepted`` of them accepted."""
        self.observe_batch([(drafted, accepted)])

    def observe_batch(self, rounds: list[tuple[int, int]]) -> None:
        """Feed back one batch round: ``(drafted, accepted)`` per active request (decay once per round)."""
        if self._frozen:
            return
        t0 = time.perf_counter()
        self.tracker.update_batch(rounds)
        self.overhead_seconds += time.perf_counter() - t0

    def observe_makespan(self, last: tuple[int, int], everyone: tuple[int, int]) -> None:
        """Feed back a finished batch: ``(drafted rounds, accepted drafts)`` of the request(s) that finished in its
        last round, and of all its requests. Updates ``rho``, the share of the mean excess acceptance per drafted
        round that the last request got (clipped to [0, 1]); a batch without drafted rounds or accepted drafts
        teaches nothing."""
        if self._frozen or last[0] <= 0 or everyone[0] <= 0 or everyone[1] <= 0:
            return
        share = min(max((last[1] / last[0]) / (everyone[1] / everyone[0]), 0.0), 1.0)
        self.rho = share if self.rho is None else self.rho + self.makespan_weight * (share - self.rho)


__all__ = ["AcceptanceTracker", "BlockSizeController"]
