"""Accept lengths record what a round committed: a stop token inside an accepted block ends the round there.

τ, Figures 2, 3 and 7 are computed from ``accept_lengths``; every token after the first comes from exactly one
round, so ``sum(accept_lengths) == len(output_ids) - 1`` must hold for every stop position and token budget, in the
single-request and the batched engine alike.
"""

import pytest
import torch

from dscout.decoding.batched import BatchedSpeculativeEngine
from dscout.decoding.engine import SpeculativeEngine

from .test_engine import OracleProposer

PROMPT = [5, 6, 7, 9]


def _reference(target, n=40):
    return SpeculativeEngine(target, stop_token_ids=[]).generate(PROMPT, n).output_ids


def _first_occurrences(ref):
    """Output indices j >= 1 whose token occurs for the first time at j (a stop there ends the output at j)."""
    return [j for j in range(1, len(ref)) if ref.index(ref[j]) == j]


@pytest.mark.parametrize("bs", [4, 16])
def test_single_request_engine_counts_committed_tokens(bs, target):
    ref = _reference(target)
    checked = 0
    for j in _first_occurrences(ref):
        for budget in (j + 1, j + 3, len(ref)):
            eng = SpeculativeEngine(target, OracleProposer(PROMPT + ref, 64, flip=0.0), stop_token_ids=[ref[j]])
            r = eng.generate(PROMPT, budget, block_size=bs)
            assert r.output_ids == ref[: min(j + 1, budget)]
            assert sum(r.accept_lengths) == len(r.output_ids) - 1, (j, budget, r.accept_lengths)
            assert all(1 <= n <= bs for n in r.accept_lengths)
            checked += 1
    assert checked >= 6


class _Oracle:
    """Batched-engine proposer drafting the exact AR continuation (whole blocks accepted)."""

    layer_ids = [1]
    ref: list = []

    def start(self, taps, ids):
        self.pos = taps.shape[0]

    def commit(self, taps, ids):
        self.pos += taps.shape[0]

    def propose(self, last, position, k, temperature=0.0, generator=None):
        from dscout.decoding.proposers import Draft

        return Draft(torch.tensor([_Oracle.ref[position + i] if position + i < len(_Oracle.ref) else 0
                                   for i in range(1, k + 1)]))


def test_batched_engine_counts_committed_tokens(target):
    ref = _reference(target)
    _Oracle.ref = PROMPT + ref
    for j in _first_occurrences(ref)[:8]:
        for budget in (j + 2, len(ref)):
            out = BatchedSpeculativeEngine(target, _Oracle, stop_token_ids=[ref[j]]).generate([PROMPT], budget,
                                                                                              block_size=16)
            r = out.results[0]
            assert r.output_ids == ref[: min(j + 1, budget)]
            assert sum(r.accept_lengths) == len(r.output_ids) - 1, (j, budget, r.accept_lengths)
