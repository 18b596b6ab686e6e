"""The online controller on simulated rounds: what its exploration costs where drafting never pays, and what its
time-feedback settings trade against each other. No timing: seeded, deterministic, seconds to run.

Real Table 3 cells on the 2-core CPU carry ±5–25 % of machine noise per repeat, so a setting that moves the result
by 1 % cannot be chosen from them. Here the real :class:`~dscout.decoding.controller.BlockSizeController` decides
every round of a simulated job of ``--rounds`` rounds (about three repeats of a Table 3 cell) and is fed back:
- accepted drafts from a chain with a first-draft acceptance ``a1`` and later ones ``a`` (acceptance comes in
  runs, as measured);
- a round time in units of one bs-1 round: the calibration prices a bs round at ``1 + 0.03 bs`` (the CPU
  default's start-up calibration: bs 2 1.06x, bs 4 1.12x a bs-1 verify), a real drafted round costs ``extra`` times
  that (measured 1.2–1.8x on this CPU, reports/online_controller/report.md), each round times a log-normal noise of
  mean 1 (``--noise``), optionally times a load burst (both classes, or drafted rounds only).
Tokens per unit time are reported against AR (a bs-1 round = 1 token per unit) and against the best fixed bs,
as the median over ``--seeds`` jobs.

    python benchmarks/controller_simulation.py --out reports/controller_simulation/report.md
"""

from __future__ import annotations

import argparse
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from dscout.decoding.controller import BlockSizeController  # noqa: E402
from dscout.provenance import ROOT, report_header  # noqa: E402

SCENARIOS = {  # name: (a1, a, extra)
    "never pays (a1 0.05)": (0.05, 0.3, 1.45),
    "rarely (a1 0.15)": (0.15, 0.4, 1.4),
    # the CPU default's drafter where drafting pays a little (HumanEval, MATH-500, MBPP at bs 4: a1 0.22-0.25, a2
    # 0.04-0.25; drafted rounds 1.14-1.18x a bs-1 round at mean bs 2-3, 2026-12-04)
    "marginal (a1 0.23, a 0.2)": (0.23, 0.2, 1.08),
    "pays (a1 0.55, a 0.6)": (0.55, 0.6, 1.3),
}
# good and bad stretches that last (mean 1 / switch rounds): acceptance clustered in time, where following the recent
# rounds pays (the CPU default's acceptance is barely clustered: P(accept | last accepted) 0.32-0.36 against
# P(accept | last rejected) 0.19-0.22 on GSM8K, HumanEval and MATH-500)
REGIMES = {  # name: ((a1, a) good, (a1, a) bad, switch probability per round, extra)
    "stretches of ~50 rounds (good a1 0.7 / bad 0.05)": ((0.7, 0.75), (0.05, 0.3), 0.02, 1.3),
    "stretches of ~20 rounds": ((0.7, 0.75), (0.05, 0.3), 0.05, 1.3),
    # the marginal drafter on a real text: stretches the drafter follows (a1 0.32) and stretches it does not (0.12)
    "marginal, stretches of ~30 rounds (a1 0.32 / 0.12)": ((0.32, 0.25), (0.12, 0.15), 0.033, 1.08),
}
BURSTS = {
    "pays + load 2.5x on all rounds 10-50": lambda r, bs: 2.5 if 10 <= r < 50 else 1.0,
    "pays + drafted rounds 3x 5-15": lambda r, bs: 3.0 if 5 <= r < 15 and bs > 1 else 1.0,
}
SETTINGS = {
    "time_relax 0.01, idle_decay 0.995, no clip (the defaults until 2026-12-04)":
        {"time_relax": 0.01, "idle_decay": 0.995, "time_clip": None},
    "time_relax 0.003, idle_decay 0.998, no clip": {"time_clip": None},
    "time_relax 0.01, idle_decay 0.998, time_clip 1.1": {"time_relax": 0.01},
    "time_relax 0.003, idle_decay 0.998, time_clip 1.1 (the defaults; recent_strength = prior_strength 2)": {},
    "the defaults, recent_strength 5": {"recent_strength": 5},
    "the defaults, recent_strength 10 (measured on the CPU default, 2026-12-04)": {"recent_strength": 10},
    "the defaults, recent_strength 20": {"recent_strength": 20},
    "the defaults, explore 0.5": {"explore": 0.5},
    "the defaults, explore 1": {"explore": 1.0},
    "the defaults, explore 1.5": {"explore": 1.5},
    "the defaults, explore 2": {"explore": 2.0},
    "the defaults, explore 1, recent_strength 5": {"explore": 1.0, "recent_strength": 5},
    "the defaults, explore 0.5, recent_strength 10": {"explore": 0.5, "recent_strength": 10},
}


class CalibratedUnits:
    """A latency model in units of one bs-1 round: a bs round is priced ``1 + slope * bs`` (drafted) or 1."""

    def __init__(self, slope: float = 0.03):
        self.slope = slope

    def round_seconds(self, bs, c, committed=None, pending=None):
        return 1.0 if bs == 1 else 1.0 + self.slope * bs

    def commit_seconds(self, m, c):
        return 0.001 * m


def accepted(k: int, a1: float, a: float, rng: random.Random) -> int:
    """Drafts accepted of ``k``: the first with probability ``a1``, each later one (after an accept) ``a``."""
    n = 0
    while n < k and rng.random() < (a1 if n == 0 else a):
        n += 1
    return n


def true_cost(bs: int, extra: float) -> float:
    """A real round: the calibrated price, times ``extra`` when it drafts."""
    return CalibratedUnits().round_seconds(bs, 1) * (extra if bs > 1 else 1.0)


def simulate(a1, a, extra, seed, rounds, noise, burst=None, max_bs=8, regime=None, fixed=None, **settings):
    """One job: (tokens per unit time, drafted rounds). ``regime`` = ((a1, a) good, (a1, a) bad, switch): the
    acceptance of each round comes from a two-state chain instead (``a1``, ``a`` unused); ``fixed``: that bs in
    every round instead of the controller."""
    rng = random.Random(seed)
    ctl = BlockSizeController(CalibratedUnits(), max_block_size=max_bs, **settings)
    tokens = spent = 0.0
    drafted = 0
    good = True
    for r in range(rounds):
        if regime is not None:
            if rng.random() < regime[2]:
                good = not good
            a1, a = regime[0] if good else regime[1]
        bs = fixed or ctl.choose(1)
        n = accepted(bs - 1, a1, a, rng) if bs > 1 else 0
        t = true_cost(bs, extra) * rng.lognormvariate(-noise * noise / 2, noise) * (burst(r, bs) if burst else 1.0)
        ctl.observe(bs - 1, n)
        ctl.observe_time(bs, 1, t, committed=n + 1.0)
        tokens += n + 1
        spent += t
        drafted += bs > 1
    return tokens / spent, drafted


def best_fixed(a1, a, extra, rounds, seeds, max_bs=8):
    def rate(bs):
        out = []
        for s in range(seeds):
            rng = random.Random(s)
            tok = sum(accepted(bs - 1, a1, a, rng) + 1 for _ in range(rounds))
            out.append(tok / (rounds * true_cost(bs, extra)))
        return statistics.median(out)
    return max((rate(b), b) for b in range(1, max_bs + 1))


def best_fixed_regime(good, bad, switch, extra, rounds, seeds, noise, max_bs=8):
    return max((statistics.median(simulate(0, 0, extra, s, rounds, noise, regime=(good, bad, switch), fixed=b)[0]
                                  for s in range(seeds)), b) for b in range(1, max_bs + 1))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=380)
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--noise", type=float, default=0.1, help="sigma of the log-normal round-time noise")
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "controller_simulation" / "report.md",
                   help="report.md; '' = print only")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    cols = list(SCENARIOS) + list(BURSTS) + list(REGIMES)
    lines = ["# Simulated controller jobs: DScout(online) against AR and fixed bs", "",
             f"Simulated jobs of {args.rounds} rounds, median of {args.seeds} seeds, round-time noise "
             f"sigma {args.noise}: DScout(online) tokens per unit time / AR (drafted rounds per job, mean).", "",
             "| setting | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    best = {}
    for name, (a1, a, extra) in SCENARIOS.items():
        best[name] = best_fixed(a1, a, extra, args.rounds, args.seeds)
    pays = SCENARIOS["pays (a1 0.55, a 0.6)"]
    for label, settings in SETTINGS.items():
        cells = []
        for name, (a1, a, extra) in SCENARIOS.items():
            runs = [simulate(a1, a, extra, s, args.rounds, args.noise, **settings) for s in range(args.seeds)]
            cells.append(f"{statistics.median(r[0] for r in runs):.3f} ({statistics.mean(r[1] for r in runs):.0f})")
        for burst in BURSTS.values():
            runs = [simulate(*pays, s, args.rounds, args.noise, burst=burst, **settings) for s in range(args.seeds)]
            cells.append(f"{statistics.median(r[0] for r in runs):.3f} ({statistics.mean(r[1] for r in runs):.0f})")
        for good, bad, switch, extra in REGIMES.values():
            runs = [simulate(0, 0, extra, s, args.rounds, args.noise, regime=(good, bad, switch), **settings)
                    for s in range(args.seeds)]
            cells.append(f"{statistics.median(r[0] for r in runs):.3f} ({statistics.mean(r[1] for r in runs):.0f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    regime_best = [best_fixed_regime(*v, args.rounds, args.seeds, args.noise) for v in REGIMES.values()]
    lines.append("| best fixed bs | " + " | ".join(f"{r:.3f} (bs {b})" for r, b in best.values())
                 + " | – | – | " + " | ".join(f"{r:.3f} (bs {b})" for r, b in regime_best) + " |")
    command = "python benchmarks/controller_simulation.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    lines = report_header(lines[0][2:], command, time.perf_counter() - t0, "(simulated rounds: no timing)") + lines[2:]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out and str(args.out) not in ("", "."):
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
