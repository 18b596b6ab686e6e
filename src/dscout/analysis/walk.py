"""Greedy decoding's rounds over a sequence from its teacher-forced accepted lengths (docs/method.md §3, MAT).

Torch-free and tiny on purpose: the findings stage's evaluation job imports it, so its code digest (a rerun
trigger of that job) does not move when a table's or figure's rendering does.
"""

from __future__ import annotations


def decode_walk(lengths: list[int]) -> list[int]:
    """The rounds greedy decoding runs over a sequence: accepted lengths at anchors ``0, L(0), L(0) + L(L(0)), ...``.

    Args:
        lengths: ``[N]`` accepted length ``L(a)`` (bonus included, >= 1) at every anchor ``a`` of the sequence
            (:func:`dscout.experiments.findings.accept_lengths`).
    Returns:
        accepted length per round; they sum to ``len(lengths)`` (= response tokens - 1, the engine's identity
        ``sum(accept_lengths) == len(output_ids) - 1``).
    """
    rounds, a = [], 0
    while a < len(lengths):
        rounds.append(int(lengths[a]))
        a += lengths[a]
    return rounds
