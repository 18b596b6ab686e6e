"""The held-out split of the training sequences (the findings stage, ``training.holdout``)."""

from __future__ import annotations


def holdout_split(n: int, count: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """Split ``n`` training sequences into trained and held-out indices (a seeded draw, not the last rows).

    The responses file is ordered by prompt length (its generation batches), which groups the sources (the
    longest prompts are GSM8K-train word problems), so held-out rows are drawn uniformly with
    ``random.Random(seed)``: the held-out set is a sample of the whole training mix. The trainer
    (``training.holdout``) and the findings evaluation (:mod:`dscout.experiments.findings`) call this one
    function, so they agree on the split.

    Args:
        n: number of sequences (``len(training_sequences(...))``).
        count: sequences to hold out (0: none).
    Returns:
        ``(train_ids, heldout_ids)``, each sorted.
    Raises:
        ValueError: if ``count`` is negative or leaves no sequence to train on.
    """
    import random

    if count < 0 or (count and count >= n):
        raise ValueError(f"holdout {count} must lie in [0, {n - 1}] for {n} training sequences")
    held = sorted(random.Random(seed).sample(range(n), count)) if count else []
    hs = set(held)
    return [i for i in range(n) if i not in hs], held
