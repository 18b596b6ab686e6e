"""Our drafters and engine side by side with the upstream reference runtimes (installed by tests/upstream.py):
z-lab's ``dflash`` 0.1.0 (``DFlashDraftModel``, ``dflash_generate``) and AngelSlim 0.5.0's EAGLE-3 draft model.

``dflash_generate(..., return_stats=True)`` times itself with ``torch.cuda.synchronize``; on the CPU its clock
(``dflash.model._cuda_time``) is swapped for ``time.perf_counter`` for the duration of a test, nothing else of
upstream is changed. Its drafter logits are read by wrapping the loaded model's ``compute_logits``.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch

from dscout.decoding.engine import SpeculativeEngine
from dscout.decoding.proposers import BlockDiffusionProposer
from dscout.models.export import (check_dflash_checkpoint, drafter_for_target, export_dflash,
                                  load_dflash_checkpoint)
from dscout.models.pretrained import import_pretrained_drafter
from tests import upstream
from tests.conftest import tiny_drafter, tiny_target



@pytest.fixture
def dm(monkeypatch):
    """z-lab's ``dflash.model`` with its CUDA clock replaced by the CPU one (see module doc)."""
    mod = upstream.dflash_model()
    monkeypatch.setattr(mod, "_cuda_time", time.perf_counter)
    return mod


def _record_logits(obj, store: list):
    """Wrap ``obj.compute_logits`` so that every call's output is appended to ``store``."""
    inner = obj.compute_logits

    def wrapped(*args, **kwargs):
        out = inner(*args, **kwargs)
        store.append(out.detach().reshape(-1, out.shape[-1]).float().clone())
        return out

    obj.compute_logits = wrapped


def _side_by_side(dm, target, drafter, model, prompt, max_new, bs):
    """One request through our engine and through ``dflash_generate``: outputs, accept lengths, block logits."""
    ours_logits, up_logits = [], []
    _record_logits(drafter, ours_logits)
    _record_logits(model, up_logits)
    try:
        ours = SpeculativeEngine(target, BlockDiffusionProposer(drafter)).generate(prompt, max_new, block_size=bs)
        up = dm.dflash_generate(model, target.model, torch.tensor([prompt]), max_new, None, block_size=bs,
                                return_stats=True)
    finally:
        del drafter.compute_logits, model.compute_logits
    return ours, up, ours_logits, up_logits


def _compare(dm, target, drafter, model, prompts, max_new=40, block_sizes=(4, 8, 16)):
    """Greedy: upstream == ours == AR token for token, equal accept lengths, drafter logits within 1e-5; a first
    difference is allowed only at a float near-tie of the target and is returned with its logit gap."""
    from dscout.evaluation.runner import near_tie

    ar = SpeculativeEngine(target)
    ties, rounds = [], 0
    for prompt in prompts:
        ref = ar.generate(prompt, max_new).output_ids
        for bs in block_sizes:
            ours, up, lo, lu = _side_by_side(dm, target, drafter, model, prompt, max_new, bs)
            up_ids = up.output_ids[0, len(prompt):].tolist()
            for name, out in (("ours", ours.output_ids), ("dflash_generate", up_ids)):
                if out != ref:
                    tie, at, gap = near_tie(target, prompt, ref, out, 1e-4)
                    assert tie, f"{name} differs from AR at token {at} (bs {bs}, logit gap {gap})"
                    ties.append((name, bs, at, gap))
            if ours.output_ids != up_ids:
                continue  # a listed near-tie: the rounds after it are not comparable
            assert ours.accept_lengths == up.acceptance_lengths, bs
            assert len(lo) == len(lu) == len(ours.accept_lengths)
            for a, b in zip(lo, lu):
                assert a.shape == b.shape and float((a - b).abs().max()) < 1e-5
            rounds += len(lo)
    return ties, rounds


# ------------------------------------------------------------------------------ ours -> upstream
def _smoke_target_and_prompts(work):
    from dscout.models.target import TargetModel

    target = TargetModel.load(next((work / "results" / "target").iterdir()))
    rows = [json.loads(line) for line in next((work / "results" / "responses").iterdir()).joinpath(
        "responses.jsonl").read_text().splitlines()]
    return target, [r["prompt_ids"] + r["response_ids"][:5] for r in rows[:2]]


@pytest.mark.parametrize("name", ["dflash_fv", "dscout_fv"])
def test_our_trained_drafters_draft_the_same_in_zlabs_runtime(full_vocab_run, name, dm, tmp_path):
    work, dirs = full_vocab_run
    target, prompts = _smoke_target_and_prompts(work)
    drafter = load_dflash_checkpoint(dirs[name]).attach_target(target).eval()
    out = export_dflash(drafter, tmp_path / "export", dtype=torch.float32)
    model, info = dm.DFlashDraftModel.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert model.target_layer_ids == drafter.config.target_layer_ids
    assert model.mask_token_id == drafter.config.mask_token_id
    ties, rounds = _compare(dm, target, drafter, model.eval(), prompts)
    assert rounds > 0 and len(ties) <= 1, ties


# ------------------------------------------------------------------------------ upstream -> ours
def test_a_dflash_checkpoint_saved_by_zlabs_class_imports_and_drafts_identically(dm, tmp_path):
    from transformers import Qwen3Config

    target = tiny_target(dtype=torch.float32, layers=6, family="qwen3", vocab=64)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                      rope_theta=1e6, num_target_layers=6, initializer_range=0.2,
                      dflash_config={"target_layer_ids": [1, 3], "mask_token_id": 63, "block_size": 16})
    torch.manual_seed(5)
    model = dm.DFlashDraftModel(cfg).eval()
    model.save_pretrained(str(tmp_path / "zlab"))
    summary = import_pretrained_drafter("dflash", str(tmp_path / "zlab"), target, tmp_path / "ours")
    assert summary["label"] == "2t2d"
    drafter = drafter_for_target(tmp_path / "ours", target)
    assert drafter.config.target_layer_ids == [1, 3] and drafter.config.block_size == 16
    assert drafter.config.mask_token_id == 63 and drafter.config.rope_parameters["rope_theta"] == 1e6
    ties, rounds = _compare(dm, target, drafter, model, [[3, 4, 5, 6, 7], [9, 2, 40, 40, 17, 8, 1]], max_new=24)
    assert rounds > 0 and not ties


def _angelslim_checkpoint(folder, target, draft_vocab, topk, depth, total):
    """A tiny EAGLE-3 drafter built and saved in AngelSlim's layout by AngelSlim's own classes."""
    from safetensors.torch import save_file

    from dscout.models.common import build_vocab_map

    draft_mod, config_mod = upstream.angelslim_eagle3()
    tc = target.config
    fields = dict(vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
                  draft_vocab_size=draft_vocab, target_hidden_size=tc.hidden_size)
    cfg = config_mod.Eagle3Config(rope_theta=1e6, architectures=["LlamaForCausalLMEagle3"], **fields)
    # AngelSlim 0.5.0's draft reads config.rope_theta and config.rope_scaling["type"] (transformers 4); under our
    # transformers 5.23 Eagle3Config moves both into rope_parameters and rope_scaling["type"] raises KeyError.
    # The draft class is therefore built from the same fields in transformers 4's shape (its config file is the
    # one Eagle3Config writes).
    legacy = SimpleNamespace(**fields, rope_theta=1e6, rope_scaling=None, pretraining_tp=1, pad_token_id=None,
                             hidden_act="silu", head_dim=tc.hidden_size // 4)
    torch.manual_seed(7)
    model = draft_mod.Llama3Eagle3Drafter(legacy, total_tokens=total, depth=depth, top_k=topk).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
        model.embed_tokens.weight.copy_(target.embed_tokens.weight)
    counts = torch.rand(tc.vocab_size)
    d2t, t2d = build_vocab_map(counts, draft_vocab)
    model.d2t.copy_(d2t)
    model.t2d.copy_(t2d)
    folder.mkdir()
    cfg.to_json_file(str(folder / "config.json"))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    return model


def _paths(tokens: list[int], ancestors: list[list[int]]) -> set[tuple[int, ...]]:
    """Each tree node as the token path from the root (its ancestors' tokens in depth order, then its own)."""
    return {tuple(tokens[a] for a in anc) + (tokens[i],) for i, anc in enumerate(ancestors)}


def test_an_eagle3_checkpoint_saved_by_angelslims_class_imports_with_the_same_logits_and_trees(tmp_path):
    from dscout.decoding.eagle3_proposer import Eagle3Proposer
    from dscout.evaluation.methods import eagle3_proposer

    target = tiny_target(dtype=torch.float32, layers=8, family="qwen3", vocab=64)
    topk, depth, total = 3, 3, 12  # AngelSlim's depth counts the levels after the first
    model = _angelslim_checkpoint(tmp_path / "angelslim", target, 40, topk, depth, total)
    import_pretrained_drafter("eagle3", str(tmp_path / "angelslim"), target, tmp_path / "ours")
    proposer = eagle3_proposer({"topk": topk, "depth": depth + 1}, str(tmp_path / "ours"), target)
    ours = proposer.drafter
    assert torch.equal(ours.d2t, model.d2t) and torch.equal(ours.t2d, model.t2d)
    for prompt in ([3, 4, 5, 6, 7, 8], [11, 2, 60, 60, 9, 31, 5, 5, 1]):
        ids = torch.tensor([prompt])
        out = target(ids, layer_ids=ours.config.target_layer_ids)
        x = int(out.logits[0, -1].argmax())
        n = len(prompt)
        # first step: every pair (g_t, x_{t+1}) of the prompt
        pair_ids = torch.tensor([prompt[1:] + [x]])
        model.reset()  # AngelSlim keeps the last tree's mask on the module until the next reset
        with torch.no_grad():
            hidden, _, _ = model(out.taps, input_ids=pair_ids)
            up_logits = model.lm_head(model.norm(hidden))
            _, our_logits = ours(pair_ids, out.taps, torch.arange(n).unsqueeze(0))
        assert float((up_logits - our_logits).abs().max()) < 1e-5
        # the tree: AngelSlim's topK_genrate against our proposer with the same budget
        model.init_tree()
        model.reset_kv()
        tokens, _, mask, _, _ = model.topK_genrate(out.taps, torch.tensor([prompt + [x]]))
        tokens, mask = tokens[0, 1:].tolist(), mask[0, 0, 1:, 1:].bool()
        up_tree = _paths(tokens, [[j for j in range(len(tokens)) if mask[i, j] and j != i]
                                  for i in range(len(tokens))])
        fresh = Eagle3Proposer(ours, topk=topk, depth=depth + 1)
        fresh.start(out.taps[0], ids[0])
        tree = fresh.propose(x, n, total - 1)
        par = tree.parents.tolist()
        anc = []
        for i in range(len(par)):
            chain, p = [], par[i]
            while p >= 0:
                chain.append(p)
                p = par[p]
            anc.append(chain[::-1])
        assert len(tree.tokens) == total - 1 and _paths(tree.tokens.tolist(), anc) == up_tree


# ------------------------------------------------------------------------------ sampling
def test_sampled_first_tokens_follow_the_target_in_both_runtimes(dm, tmp_path):
    """Temperature 1: the first two committed tokens (the prefill's sample and the first draft-verify round's)
    from our engine, from ``dflash_generate`` and from AR sampling all follow the target's exact joint
    distribution (chi-square, 2,000 draws each, p > 0.01), and ours and upstream's agree with each other."""
    from scipy.stats import chi2_contingency, chisquare

    V = 8
    target = tiny_target(dtype=torch.float32, layers=4, vocab=V, init=0.3, seed=3)
    drafter = tiny_drafter(target, layers=1, layer_ids=[1, 2], block_size=8, mask_token_id=V - 1).float()
    export_dflash(drafter, tmp_path / "d", dtype=torch.float32)
    model = dm.DFlashDraftModel.from_pretrained(str(tmp_path / "d")).eval()
    prompt = [1, 2, 3, 4]
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([prompt])).logits[0, -1].double(), -1)
        p2 = torch.stack([torch.softmax(target(torch.tensor([prompt + [a]])).logits[0, -1].double(), -1)
                          for a in range(V)])
    expected = (p1[:, None] * p2).flatten()  # joint of (first, second) token
    draws = 2000
    counts = {k: torch.zeros(V * V) for k in ("ours", "dflash", "ar")}
    spec = SpeculativeEngine(target, BlockDiffusionProposer(drafter, sample_drafts=True))
    ar = SpeculativeEngine(target)
    store = {}
    torch.manual_seed(0)
    for i in range(draws):
        a = spec.generate(prompt, 2, block_size=4, temperature=1.0, seed=i, prefill_store=store).output_ids
        b = dm.dflash_generate(model, target.model, torch.tensor([prompt]), 2, None, temperature=1.0,
                               block_size=4)[0, len(prompt):].tolist()
        c = ar.generate(prompt, 2, temperature=1.0, seed=10 ** 6 + i).output_ids
        for k, out in (("ours", a), ("dflash", b), ("ar", c)):
            counts[k][out[0] * V + out[1]] += 1
    keep = expected * draws >= 5  # pool the rare cells
    exp = torch.cat([expected[keep], expected[~keep].sum().view(1)]) * draws
    for k, c in counts.items():
        obs = torch.cat([c[keep], c[~keep].sum().view(1)])
        p = chisquare(obs.numpy(), exp.numpy()).pvalue
        assert p > 0.01, (k, p)
    table = torch.stack([counts["ours"], counts["dflash"]])
    table = table[:, table.sum(0) > 0]
    assert chi2_contingency(table.numpy()).pvalue > 0.01
    # the check can fail: a sampler that always commits the target's argmax is far from the distribution
    greedy = torch.zeros(V * V)
    greedy[int(p1.argmax()) * V + int(p2[p1.argmax()].argmax())] = draws
    assert chisquare(torch.cat([greedy[keep], greedy[~keep].sum().view(1)]).numpy(), exp.numpy()).pvalue < 1e-6


# ------------------------------------------------------------------------------ refused formats
def test_the_cpu_defaults_reduced_vocabulary_drafter_is_refused_by_every_dflash_loader(smoke_run, dm, tmp_path):
    """The smoke run's DScout drafter drafts over 8192 tokens (our CPU default): it is saved in our own layout,
    our loader reads it, and no path hands a DFlash runtime a checkpoint that loads and drafts differently."""
    work, _ = smoke_run
    from dscout import config as dcfg

    cfg = dcfg.load_config(work / "config.yaml", work / "presets" / "smoke.yaml")
    folder = work / "results" / "drafters" / dcfg.drafter_id(cfg, "dscout", cfg["target"]["num_layers"])
    ours = load_dflash_checkpoint(folder)
    assert ours.config.draft_vocab_size == 8192
    with pytest.raises(OSError):  # z-lab's loader finds no weights it knows
        dm.DFlashDraftModel.from_pretrained(str(folder))
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["DScoutDrafter"]  # SGLang/vLLM
    assert any("draft_vocab_size=8192" in p for p in check_dflash_checkpoint(folder))
    with pytest.raises(ValueError, match="draft_vocab_size=8192"):
        export_dflash(ours, tmp_path / "export")
    with pytest.raises(ValueError, match="draft_vocab_size=8192"):
        export_dflash(str(folder), tmp_path / "export2")
    assert not (tmp_path / "export").exists() and not (tmp_path / "export2").exists()
    # ... and a drafter tapping the target's last layer (z-lab's runtime would read its final-normed state)
    t = tiny_target(dtype=torch.float32, layers=4)
    with pytest.raises(ValueError, match="last layer"):
        export_dflash(tiny_drafter(t, layers=1, layer_ids=[1, 3]), tmp_path / "x")
