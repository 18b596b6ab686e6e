"""PARD-2 through the one engine: one forward yields k drafts; greedy output equals AR token for token."""

import pytest
import torch

from dscout.decoding.engine import SpeculativeEngine
from dscout.decoding.pard_proposer import Pard2Proposer
from dscout.models.pard import Pard2Drafter

from .conftest import tiny_target


@pytest.mark.parametrize("use_features", [True, False])
@pytest.mark.parametrize("bs", [2, 4, 8])
def test_pard2_greedy_equals_autoregressive(bs, use_features):
    t = tiny_target()
    torch.manual_seed(0)
    d = Pard2Drafter.from_target(t, num_layers=2, mask_token_id=63, target_layer_ids=[-1, -2], draft_k=8)
    with torch.no_grad():
        d.target_proj.weight.normal_(std=0.5)  # features matter (the default init is zero)
    ar = SpeculativeEngine(t, stop_token_ids=[0])
    spec = SpeculativeEngine(t, Pard2Proposer(d, t, use_features=use_features), stop_token_ids=[0])
    g = torch.Generator().manual_seed(bs)
    accepted = []
    for _ in range(5):
        prompt = torch.randint(1, 63, (6,), generator=g).tolist()
        a = ar.generate(prompt, 30)
        s = spec.generate(prompt, 30, block_size=bs)
        assert s.output_ids == a.output_ids
        assert all(1 <= n <= bs for n in s.accept_lengths)
        accepted += s.accept_lengths
    # a truncated copy of the target agrees with it often: some drafts are accepted
    assert max(accepted) > 1


def test_one_forward_yields_k_drafts():
    t = tiny_target()
    d = Pard2Drafter.from_target(t, num_layers=2, mask_token_id=63, target_layer_ids=[-1, -2], draft_k=8)
    p = Pard2Proposer(d, t)
    prompt = torch.tensor([5, 6, 7, 8])
    out = t(prompt.view(1, -1), layer_ids=p.layer_ids)
    p.start(out.taps[0], prompt)
    calls = []
    hook = d.lm.model.register_forward_hook(lambda *a: calls.append(1))
    draft = p.propose(9, 4, 5)
    hook.remove()
    assert draft.tokens.shape == (5,) and len(calls) == 1
