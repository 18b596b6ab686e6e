"""Tree verification (EAGLE-3 style): masks, retrieve indices, greedy longest path, lossless sampling walk,
and the engine's tree path against AR (KV of the accepted path compacted)."""

import pytest
import torch
from scipy.stats import chisquare

from dscout.decoding.acceptance import (greedy_tree_accept, retrieve_indices, sampling_tree_accept,
                                        tree_attention_mask, tree_depths)
from dscout.decoding.engine import SpeculativeEngine
from dscout.decoding.proposers import TreeDraft

from .conftest import tiny_target

#        root
#       /    \
#     n0(5)  n1(7)
#     /  \      \
#  n2(9) n3(4)  n4(2)
#    |
#  n5(8)
PARENTS = torch.tensor([-1, -1, 0, 0, 1, 2])
TOKENS = torch.tensor([5, 7, 9, 4, 2, 8])


def test_hand_built_tree_mask_depths_and_paths():
    assert tree_depths(PARENTS).tolist() == [1, 1, 2, 2, 2, 3]
    m = tree_attention_mask(PARENTS).int()
    expect = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0],   # root
        [1, 1, 0, 0, 0, 0, 0],   # n0
        [1, 0, 1, 0, 0, 0, 0],   # n1
        [1, 1, 0, 1, 0, 0, 0],   # n2 -> n0
        [1, 1, 0, 0, 1, 0, 0],   # n3 -> n0
        [1, 0, 1, 0, 0, 1, 0],   # n4 -> n1
        [1, 1, 0, 1, 0, 0, 1],   # n5 -> n2 -> n0
    ])
    assert torch.equal(m, expect)
    # one row per leaf (n3, n4, n5) in verify order (root 0, node j at j + 1), padded with -1
    assert retrieve_indices(PARENTS).tolist() == [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]]
    with pytest.raises(ValueError):
        tree_depths(torch.tensor([1, -1]))


def _logits_for(argmax_per_row, V=12):
    logits = torch.full((len(argmax_per_row), V), -4.0)
    for i, t in enumerate(argmax_per_row):
        logits[i, t] = 4.0
    return logits


def test_greedy_picks_the_longest_accepted_path():
    # target argmax per verify row (root, n0..n5): root->5 (n0), n0->9 (n2), n2->8 (n5), n5->3 (bonus)
    path, bonus = greedy_tree_accept(TOKENS, PARENTS, _logits_for([5, 9, 0, 8, 0, 0, 3]))
    assert path == [0, 2, 5] and bonus == 3
    # the other branch: root->7 (n1), n1->2 (n4), n4->11 bonus
    path, bonus = greedy_tree_accept(TOKENS, PARENTS, _logits_for([7, 0, 2, 0, 0, 11, 0]))
    assert path == [1, 4] and bonus == 11
    path, bonus = greedy_tree_accept(TOKENS, PARENTS, _logits_for([6, 0, 0, 0, 0, 0, 0]))
    assert path == [] and bonus == 6


def test_sampling_walk_first_token_follows_target():
    torch.manual_seed(0)
    V, N = 12, 20000
    logits = torch.randn(7, V)
    p = torch.softmax(logits[0], -1)
    g = torch.Generator().manual_seed(3)
    counts = torch.zeros(V)
    for _ in range(N):
        path, bonus = sampling_tree_accept(TOKENS, PARENTS, logits, 1.0, g)
        counts[int(TOKENS[path[0]]) if path else bonus] += 1
    assert chisquare(counts.numpy(), (p * N).numpy()).pvalue > 1e-3


class OracleTreeProposer:
    """A tree whose first branch follows the AR continuation (corrupted with probability ``flip``) and whose
    other nodes are wrong siblings: exercises tree masks, positions and KV compaction."""

    layer_ids = [1]

    def __init__(self, ref, vocab, flip, seed=0):
        self.ref, self.vocab, self.flip = ref, vocab, flip
        self.g = torch.Generator().manual_seed(seed)

    def start(self, taps, ids):
        self.pos = taps.shape[0]
        assert ids.shape[0] == taps.shape[0]

    def commit(self, taps, ids):
        assert ids.tolist() == self.ref[self.pos:self.pos + len(ids)]  # committed tokens are the reference
        self.pos += taps.shape[0]

    def propose(self, last_token, position, k, temperature=0.0, generator=None):
        assert position == self.pos
        tokens, parents = [], []
        prev = -1
        for j in range(1, k + 1):  # main chain
            t = self.ref[position + j] if position + j < len(self.ref) else 0
            if torch.rand(1, generator=self.g).item() < self.flip:
                t = (t + 1) % self.vocab
            tokens.append(t)
            parents.append(prev)
            # a wrong sibling next to each chain node
            tokens.append((t + 3) % self.vocab)
            parents.append(prev)
            prev = len(tokens) - 2
        return TreeDraft(torch.tensor(tokens), torch.tensor(parents))


@pytest.mark.parametrize("depth", [1, 3, 7])
@pytest.mark.parametrize("flip", [0.0, 0.3])
def test_engine_tree_path_equals_autoregressive(depth, flip):
    t = tiny_target()
    ar = SpeculativeEngine(t)
    g = torch.Generator().manual_seed(depth)
    for i in range(4):
        prompt = torch.randint(1, 63, (7,), generator=g).tolist()
        a = ar.generate(prompt, 40)
        spec = SpeculativeEngine(t, OracleTreeProposer(prompt + a.output_ids, 64, flip, seed=i))
        s = spec.generate(prompt, 40, block_size=depth + 1)
        assert s.output_ids == a.output_ids
        assert all(1 <= n <= depth + 1 for n in s.accept_lengths)
        if flip == 0.0 and depth > 1:
            assert max(s.accept_lengths) == depth + 1


def _eagle3(t, draft_vocab=48, seed=2):
    from dscout.models.eagle3 import Eagle3Drafter, Eagle3DrafterConfig, build_vocab_map

    torch.manual_seed(seed)
    cfg = Eagle3DrafterConfig.from_target(t.config, draft_vocab_size=draft_vocab, target_layer_ids=[0, 1, 2])
    d = Eagle3Drafter(cfg).to(t.dtype)
    counts = torch.rand(t.vocab_size)
    d.set_vocab_map(*build_vocab_map(counts, draft_vocab))
    return d.attach_target(t)


@pytest.mark.parametrize("topk, depth, tokens", [(1, 4, 5), (3, 3, 10), (4, 5, 16)])
def test_eagle3_tree_and_chain_drafting_is_lossless(topk, depth, tokens):
    from dscout.decoding.eagle3_proposer import Eagle3Proposer

    t = tiny_target()
    d = _eagle3(t)
    ar = SpeculativeEngine(t, stop_token_ids=[0])
    spec = SpeculativeEngine(t, Eagle3Proposer(d, topk=topk, depth=depth), stop_token_ids=[0])
    g = torch.Generator().manual_seed(topk)
    for _ in range(5):
        prompt = torch.randint(1, 63, (6,), generator=g).tolist()
        a = ar.generate(prompt, 30)
        s = spec.generate(prompt, 30, block_size=tokens)
        assert s.output_ids == a.output_ids
        assert all(1 <= n <= depth + 1 for n in s.accept_lengths)


def test_eagle3_tree_shape_and_budget():
    from dscout.decoding.eagle3_proposer import Eagle3Proposer

    t = tiny_target()
    p = Eagle3Proposer(_eagle3(t), topk=3, depth=4)
    prompt = torch.tensor([3, 4, 5, 6])
    out = t(prompt.view(1, -1), layer_ids=p.layer_ids)
    p.start(out.taps[0], prompt)
    draft = p.propose(9, 4, 11)
    assert isinstance(draft, TreeDraft) and draft.tokens.shape[0] == 11
    depths = tree_depths(draft.parents)
    assert int(depths.max()) <= 4 and int((draft.parents == -1).sum()) <= 3
    assert p._cache.get_seq_length() == 4  # the tree's pairs were cropped: committed context only
