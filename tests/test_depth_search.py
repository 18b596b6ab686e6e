"""The drafter-depth search: lazy unimodal peak search and the linear latency fit (docs/method.md §5)."""

import pytest

from dscout.experiments.depth_search import fit_latency, unimodal_peak_search


def test_search_stops_at_the_first_drop_and_counts_evaluations():
    G = {1: 10.0, 2: 12.0, 3: 12.5, 4: 11.0, 5: 9.0, 6: 7.0}
    calls = []
    peak, evaluated = unimodal_peak_search([6, 5, 4, 3, 2, 1], lambda d: calls.append(d) or G[d])
    assert peak == 3 and calls == [1, 2, 3, 4]  # d = 5, 6 never trained
    assert list(evaluated) == [1, 2, 3, 4]


def test_search_evaluates_everything_when_throughput_keeps_rising():
    peak, evaluated = unimodal_peak_search([1, 2, 3], lambda d: float(d))
    assert peak == 3 and len(evaluated) == 3
    peak, evaluated = unimodal_peak_search([1, 2, 3], lambda d: -float(d))
    assert peak == 1 and len(evaluated) == 2
    with pytest.raises(ValueError):
        unimodal_peak_search([], float)


def test_latency_fit_recovers_a_linear_model():
    t_fix, t_layer = fit_latency([1, 2, 4, 6], [0.050 + 0.004 * d for d in (1, 2, 4, 6)])
    assert t_fix == pytest.approx(0.050) and t_layer == pytest.approx(0.004)
    with pytest.raises(ValueError):
        fit_latency([2, 2], [0.1, 0.2])
