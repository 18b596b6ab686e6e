"""benchmarks/controller_simulation.py runs the real controller on simulated rounds; its report rests on these."""

import importlib.util

from tests.workflow import ROOT


def _sim():
    spec = importlib.util.spec_from_file_location("controller_simulation",
                                                  ROOT / "benchmarks" / "controller_simulation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_simulated_controller_stays_near_ar_where_drafting_never_pays_and_drafts_where_it_does():
    sim = _sim()
    never = [sim.simulate(0.05, 0.3, 1.45, s, 200, 0.1)[0] for s in range(3)]
    pays = [sim.simulate(0.55, 0.6, 1.3, s, 200, 0.1) for s in range(3)]
    assert min(never) > 0.95  # probes cost a few per cent at most
    assert all(rate > 1.3 and drafted > 150 for rate, drafted in pays)
    rate, bs = sim.best_fixed(0.55, 0.6, 1.3, 200, 3)
    assert bs > 1 and rate > max(r for r, _ in pays) * 0.95


def test_regimes_switch_acceptance_and_a_fixed_bs_ignores_the_controller():
    sim = _sim()
    good_only = sim.simulate(0, 0, 1.3, 0, 200, 0.0, regime=((0.7, 0.75), (0.05, 0.3), 0.0), fixed=8)
    bad_only = sim.simulate(0, 0, 1.3, 0, 200, 0.0, regime=((0.05, 0.3), (0.7, 0.75), 0.0), fixed=8)
    assert good_only[1] == bad_only[1] == 200  # fixed bs 8 drafts every round
    assert good_only[0] > 1.5 > 1.0 > bad_only[0]
