"""A reduced draft vocabulary on the DFlash head: drafts map back to target ids, decoding stays lossless, the
training loss and the held-out evaluation see the same tokens, and the checkpoint keeps the vocabulary."""

import pytest
import torch
from scipy.stats import chisquare

from dscout.decoding.engine import SpeculativeEngine
from dscout.decoding.proposers import BlockDiffusionProposer

from .conftest import tiny_drafter, tiny_target


def _reduced(target, size, seed=1, **kw):
    d = tiny_drafter(target, draft_vocab_size=size, seed=seed, **kw)
    counts = torch.zeros(target.vocab_size)
    counts[torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(seed))[:size]] = 1.0
    d.set_draft_vocab(counts)
    return d


def test_draft_vocab_is_the_most_frequent_tokens_and_maps_both_ways(target):
    d = tiny_drafter(target, draft_vocab_size=5)
    counts = torch.zeros(target.vocab_size)
    counts[[40, 3, 17, 9, 22, 30]] = torch.tensor([9.0, 8.0, 7.0, 6.0, 5.0, 4.0])  # 30 is the sixth
    d.set_draft_vocab(counts)
    assert d.draft_token_ids.tolist() == [3, 9, 17, 22, 40]
    assert d.to_target_ids(torch.tensor([[0, 4]])).tolist() == [[3, 40]]
    assert d.to_draft_ids(torch.tensor([40, 30, 3])).tolist() == [4, -1, 0]
    logits = d.compute_logits(torch.randn(2, target.config.hidden_size, dtype=target.dtype))
    full = target.lm_head(torch.zeros(1, target.config.hidden_size, dtype=target.dtype))
    assert logits.shape == (2, 5) and full.shape[-1] == target.vocab_size


@pytest.mark.parametrize("bs", [4, 16])
def test_greedy_equals_autoregressive_with_a_reduced_draft_vocabulary(bs, target):
    d = _reduced(target, 24)
    ar = SpeculativeEngine(target, stop_token_ids=[0])
    sd = SpeculativeEngine(target, BlockDiffusionProposer(d), stop_token_ids=[0])
    g = torch.Generator().manual_seed(bs)
    vocab = set(d.draft_token_ids.tolist())
    for _ in range(8):
        prompt = torch.randint(1, 63, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g).tolist()
        a, s = ar.generate(prompt, 40), sd.generate(prompt, 40, block_size=bs)
        assert s.output_ids == a.output_ids
        # every accepted draft is a draft-vocabulary token (the bonus of a round need not be)
        pos = 1
        for n in s.accept_lengths:
            assert all(t in vocab for t in s.output_ids[pos: pos + n - 1])
            pos += n


def test_sampling_with_a_reduced_draft_vocabulary_preserves_the_target_distribution():
    t = tiny_target(vocab=8, layers=2, init=0.3, seed=3)
    d = tiny_drafter(t, layers=1, block_size=8, mask_token_id=7, draft_vocab_size=4)
    d.set_draft_vocab(torch.tensor([5.0, 0, 4, 0, 3, 0, 2, 0]))  # tokens 0, 2, 4, 6
    eng = SpeculativeEngine(t, BlockDiffusionProposer(d, sample_drafts=True))
    prompt, N = [1, 2, 3], 2000
    outs = torch.tensor([eng.generate(prompt, 3, block_size=4, temperature=1.0, seed=s).output_ids
                         for s in range(N)])
    seqs = torch.tensor([prompt])
    probs = torch.ones(1, dtype=torch.float64)
    for _ in range(3):  # exact joint of three tokens
        p = torch.softmax(t(seqs).logits[:, -1].double(), -1)
        probs = (probs.unsqueeze(1) * p).reshape(-1)
        seqs = torch.cat([seqs.repeat_interleave(8, 0), torch.arange(8).repeat(seqs.shape[0]).unsqueeze(1)], 1)
    exact = probs.view(8, 8, 8)
    for pos in range(3):
        marg = exact.sum(tuple(i for i in range(3) if i != pos)).numpy()
        counts = torch.bincount(outs[:, pos], minlength=8).double().numpy()
        assert chisquare(counts, marg * N).pvalue > 1e-3, pos


def _two_token_drafter_and_sequence(target, length):
    """A drafter over the 2-token vocabulary {5, 6} and one sequence: 10 prompt tokens, then a response of 5s and
    6s (about half the drafts right). Returns ``(drafter, ids [1, S], loss_mask [1, S], taps, generator)``."""
    d = tiny_drafter(target, draft_vocab_size=2, layer_ids=[1, 2])
    d.draft_token_ids.copy_(torch.tensor([5, 6]))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 62, (1, length), generator=g)
    ids[0, 10:] = torch.randint(5, 7, (length - 10,), generator=g)
    loss_mask = torch.zeros(1, length, dtype=torch.long)
    loss_mask[0, 10:] = 1
    return d, ids, loss_mask, target(ids, layer_ids=[1, 2]).taps.to(target.dtype), g


def test_training_loss_ignores_out_of_vocabulary_labels_and_evaluation_agrees(target):
    """Labels outside the draft vocabulary carry no CE and count as wrong; the held-out evaluator and the
    training step's accuracy agree on fully masked blocks."""
    from dscout.experiments.drafter_eval import accuracy_and_tau, offset_correctness
    from dscout.training.recipes import get_recipe
    from dscout.training.step import FeatureBatch, drafter_training_loss

    d, ids, loss_mask, taps, _ = _two_token_drafter_and_sequence(target, 40)
    batch = FeatureBatch(ids, loss_mask, taps)

    class Source:
        def __len__(self):
            return 1

        def batch(self, indices, dtype, device):
            return batch

    loss, m = drafter_training_loss(d, batch, get_recipe("dflash"), 1000, torch.Generator().manual_seed(1))
    assert torch.isfinite(loss)
    correct = offset_correctness(d, Source(), [0], block_size=16, dtype=target.dtype)
    assert correct.shape == (29, 15)  # anchors 10..38 (a response token followed by one)
    assert int(correct.sum()) == round(m["accuracy"] * m["supervised"]) and m["accuracy"] > 0
    assert accuracy_and_tau(correct, block_sizes=(4,))["tau"][4] >= 1.0
    # a drafter whose vocabulary holds none of the labels is never right, and the loss has no CE term left
    d.draft_token_ids.copy_(torch.tensor([62, 63]))
    loss0, m0 = drafter_training_loss(d, batch, get_recipe("dflash"), 1000, torch.Generator().manual_seed(1))
    assert m0["accuracy"] == 0.0 and float(loss0) == 0.0


def test_reduced_vocabulary_survives_the_checkpoint_and_is_refused_for_sglang(target, tmp_path):
    from dscout.models.export import check_dflash_checkpoint, export_dflash, load_dflash_checkpoint, save_drafter

    d = _reduced(target, 20)
    save_drafter(d, tmp_path, dtype=torch.float32)
    back = load_dflash_checkpoint(tmp_path, dtype=torch.float64).attach_target(target)
    assert back.config.draft_vocab_size == 20 and torch.equal(back.draft_token_ids, d.draft_token_ids)
    assert not (tmp_path / "model.safetensors").exists()  # our own layout: no DFlash runtime finds weights
    assert any("draft_vocab_size=20" in p for p in check_dflash_checkpoint(tmp_path))
    with pytest.raises(ValueError, match="whole vocabulary"):
        export_dflash(d, tmp_path / "sglang", dtype=torch.float32)


def test_distillation_weight_mixes_the_target_distribution_into_the_loss(target):
    """distill_weight = 1 trains on H(P, Q) only: the loss equals the mean cross-entropy against the target's
    (draft-vocabulary) distribution recomputed by hand from the cached final states."""
    from dscout.training.losses import distill_cross_entropy
    from dscout.training.recipes import get_recipe
    from dscout.training.step import FeatureBatch, drafter_training_loss

    d, ids, loss_mask, taps, g = _two_token_drafter_and_sequence(target, 30)
    final = torch.randn(1, 30, target.config.hidden_size, generator=g, dtype=target.dtype)
    batch = FeatureBatch(ids, loss_mask, taps, final, torch.zeros(1, 30))
    recipe = get_recipe("dflash", weighting="none")
    loss, _ = drafter_training_loss(d, batch, recipe, 1000, torch.Generator().manual_seed(1), distill_weight=1.0)
    ce_only, _ = drafter_training_loss(d, batch, recipe, 1000, torch.Generator().manual_seed(1))
    # by hand: every supervised offset of every block (anchors 10..28, offsets up to the sequence end)
    from dscout.training.blocks import block_attention_mask, build_blocks, sample_anchors

    anchors, keep = sample_anchors(loss_mask, 1000, torch.Generator().manual_seed(1))
    blocks = build_blocks(ids, loss_mask, anchors, keep, 16, d.config.mask_token_id, None)
    mask = block_attention_mask(anchors, keep, 30, 16)
    n = anchors.shape[1]
    hidden = d(blocks.block_ids.view(1, n * 16), blocks.positions.view(1, n * 16), context_taps=batch.taps,
               context_positions=torch.arange(30).view(1, 30), attention_mask=mask)
    sel = blocks.label_mask.view(1, n * 16)
    prev = blocks.positions[blocks.label_mask] - 1
    want = distill_cross_entropy(d.compute_logits(hidden[sel]), d.compute_logits(final[0, prev])).mean()
    assert torch.isclose(loss.float(), want.float(), rtol=1e-5) and not torch.isclose(loss, ce_only)
