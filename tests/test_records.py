"""What a benchmark record keeps beyond the outputs: the logit gap behind a near-tie verdict, and mask-token
occurrences counted in the training data."""

import pytest
import torch

from dscout.evaluation.runner import near_tie
from dscout.decoding.engine import SpeculativeEngine
from dscout.training.trainer import count_token


def test_near_tie_returns_the_top2_gap_at_the_first_mismatch(target):
    prompt = [5, 6, 7]
    a = SpeculativeEngine(target).generate(prompt, 8).output_ids
    b = a[:3] + [(a[3] + 1) % 64] + a[4:]
    with torch.no_grad():
        logits = target(torch.tensor([prompt + a[:3]])).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    tie, idx, gap = near_tie(target, prompt, a, b, epsilon=1e-3)
    assert idx == 3 and abs(gap - float(top[0] - top[1])) < 1e-9 and tie == (gap < 1e-3)
    assert near_tie(target, prompt, a, b, epsilon=gap + 1e-6)[0]  # a reader can re-judge from the stored gap
    assert near_tie(target, prompt, a, a, epsilon=1.0) == (False, None, None)


class _Source:
    def __init__(self, seqs):
        self.seqs = seqs

    def __len__(self):
        return len(self.seqs)

    def tokens(self, i):
        return torch.tensor(self.seqs[i]), torch.ones(len(self.seqs[i]))


def test_mask_token_occurrences_are_counted():
    src = _Source([[1, 16, 3], [16, 16, 5], [7]])
    assert count_token(src, 16) == 3 and count_token(src, 99) == 0


def test_every_record_carries_the_common_fields():
    from dscout.records import FIELDS, make_record

    rec = make_record(benchmark="gsm8k", prompt_id="p", method="ar", new_tokens=3, decode_seconds=0.1,
                      accept_lengths=[1, 1], output_ids=[5, 6, 7], matches_ar=False, prefill_seconds=0.2)
    assert list(rec)[:len(FIELDS)] == list(FIELDS) and rec["prefill_seconds"] == 0.2
    assert rec["turn"] == 0 and rec["concurrency"] == 1 and rec["method_key"] == "ar" and rec["matches_ar"] is False
    with pytest.raises(ValueError, match="needs decode_seconds, accept_lengths"):
        make_record(benchmark="gsm8k", prompt_id="p", method="ar", new_tokens=3, output_ids=[1])


def test_online_controller_fields_only_with_rounds_chosen():
    from dscout.records import controller_fields

    assert controller_fields([], 0.0, [], [], 32) == {}
    f = controller_fields([2, 4], 1e-4, [0.01, 0.02], [0.06, 0.07], 32)
    assert f["round_block_sizes"] == [2, 4] and f["max_block_size"] == 32
    assert f["round_seconds"] == pytest.approx([0.07, 0.09]) and f["controller_seconds"] == 1e-4
