"""The findings stage: teacher-forced accept lengths = greedy decoding's rounds (checked against the live engine),
resumable records, the held-out split, and the paired bootstrap with computed verdicts."""

import json

import numpy as np
import pytest
import torch

from dscout.analysis import findings as fa
from dscout.experiments.findings import accept_lengths, correct_prefixes, decode_check, evaluate_drafter, sequence_taps
from dscout.training.holdout import holdout_split
from dscout.training.trainer import TrainConfig, train_drafter

from .conftest import greedy_sequences, tiny_target


def test_accept_lengths_and_the_decode_walk():
    # bs 4: L = min(1 + min(prefix, 3), end - a) with end - a = 6, 5, ..., 1
    L = accept_lengths(torch.tensor([2, 0, 0, 5, 1, 0]), 4)
    assert L == [3, 1, 1, 3, 2, 1]
    assert fa.decode_walk(L) == [3, 3]  # anchors 0 and 3; the rounds commit every response token after the first
    assert sum(fa.decode_walk([1] * 7)) == 7 and fa.decode_walk([]) == []


def test_holdout_split_is_a_seeded_draw_over_the_whole_mix():
    train, held = holdout_split(200, 30)
    assert len(held) == 30 and sorted(set(train) | set(held)) == list(range(200)) and not set(train) & set(held)
    assert held == holdout_split(200, 30)[1] and held != holdout_split(200, 30, seed=1)[1]
    assert min(held) < 100 < max(held)  # not the last rows (the file is ordered by prompt length)
    assert holdout_split(5, 0) == (list(range(5)), [])
    with pytest.raises(ValueError, match="holdout 5"):
        holdout_split(5, 5)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny float32 target, its own greedy continuations, and a DScout-recipe drafter trained on them with a
    held-out set (online features), loaded back from its checkpoint as the findings stage loads it."""
    from dscout.models.export import drafter_for_target

    t = tiny_target(dtype=torch.float32, seed=5, init=0.3)
    seqs = greedy_sequences(t)
    cfg = TrainConfig(recipe="dscout", num_layers=1, target_layer_ids=[1, 3], mask_token_id=63, num_anchors=8,
                      micro_batch_size=2, lr=5e-3, max_steps=80, checkpoint_every=0, seed=3, holdout=6)
    work = tmp_path_factory.mktemp("findings")
    out = train_drafter(t, cfg, work / "d", work / "w", sequences=seqs)
    return t, seqs, drafter_for_target(out, t), out


def test_training_never_sees_the_held_out_sequences(trained):
    _, seqs, _, out = trained
    train, held = holdout_split(len(seqs), 6)
    seen = {i for line in (out / "train_log.jsonl").read_text().splitlines() for i in json.loads(line)["sample_ids"]}
    assert seen <= set(train) and len(seen) > len(train) // 2 and not seen & set(held)
    assert json.loads((out / "training_summary.json").read_text())["num_sequences"] == len(seqs) - 6


@pytest.mark.parametrize("bs", [4, 8, 16])
def test_teacher_forced_walk_equals_live_greedy_decoding(trained, bs):
    """The engine's rounds (greedy, output = AR) equal the walk over teacher-forced accept lengths."""
    t, seqs, drafter, _ = trained
    _, held = holdout_split(len(seqs), 6)
    rounds = []
    for i in held[:3]:
        c = decode_check(t, drafter, seqs[i]["input_ids"][:5], bs, 40)
        assert c["output_equal"] and c["equal"], c
        assert c["compared"] == c["full_block_rounds"] > 0
        rounds += c["engine_rounds"]
    assert max(rounds) > 1 and min(rounds) == 1  # the drafter accepts some drafts and not all: the check can fail


def test_correct_prefixes_count_only_leading_correct_offsets(trained):
    """Against a per-anchor reference: the drafter's block at one anchor, drafted alone."""
    t, seqs, drafter, _ = trained
    s = seqs[0]
    taps = sequence_taps(t, s["input_ids"], list(drafter.config.target_layer_ids))
    many = correct_prefixes(drafter, s["input_ids"], s["loss_mask"], taps, 8, anchors_per_pass=16)
    one = correct_prefixes(drafter, s["input_ids"], s["loss_mask"], taps, 8, anchors_per_pass=1)
    assert torch.equal(many, one) and len(many) == sum(s["loss_mask"]) - 1
    assert int(many.max()) > 0
    with pytest.raises(ValueError, match="horizon"):
        correct_prefixes(drafter, s["input_ids"], s["loss_mask"], taps, 64)


def test_evaluation_resumes_after_a_kill(trained, tmp_path):
    t, seqs, drafter, _ = trained
    items = [{"set": "heldout", "source": "x", **s} for s in seqs[:3]]
    ref = evaluate_drafter(t, drafter, items, [4, 8], tmp_path / "ref.jsonl", meta={"drafter": "d"}, progress=False)
    lines = ref.read_text().splitlines()
    (tmp_path / "run.jsonl").write_text(lines[0] + "\n" + lines[1][:20])  # one row, then a torn line
    run = evaluate_drafter(t, drafter, items, [4, 8], tmp_path / "run.jsonl", meta={"drafter": "d"}, progress=False)
    key = lambda r: (r["id"], r["bs"])  # noqa: E731
    assert sorted(map(json.loads, run.read_text().splitlines()), key=key) == sorted(map(json.loads, lines), key=key)


def test_stored_evaluation_taps_give_the_same_records_and_guard_their_layers(trained, tmp_path):
    """findings-taps computes each evaluated sequence's taps once for all drafters; an evaluation reading them
    writes exactly the records of one computing its own; a file of other layers or other sequences is refused."""
    from dscout.experiments.findings import load_sequence_taps, write_sequence_taps

    t, seqs, drafter, _ = trained
    layers = list(drafter.config.target_layer_ids)
    items = [{"set": "heldout", "source": "x", **s} for s in seqs[:3]]
    path = write_sequence_taps(t, items, layers, tmp_path / "taps.safetensors", progress=False)
    taps = load_sequence_taps(path, layers)
    assert sorted(taps) == sorted(str(s["id"]) for s in items)
    own = evaluate_drafter(t, drafter, items, [4, 8], tmp_path / "own.jsonl", progress=False)
    read = evaluate_drafter(t, drafter, items, [4, 8], tmp_path / "read.jsonl", progress=False, taps=taps)
    assert read.read_text() == own.read_text()
    with pytest.raises(ValueError, match="taps.safetensors: taps of target layers"):
        load_sequence_taps(path, layers[:1])
    wrong = {str(items[0]["id"]): taps[str(items[0]["id"])][:-1]}
    with pytest.raises(ValueError, match="rows for"):
        evaluate_drafter(t, drafter, items[:1], [4], tmp_path / "wrong.jsonl", progress=False, taps=wrong)
    with pytest.raises(ValueError, match="repeat"):
        write_sequence_taps(t, items[:1] * 2, layers, tmp_path / "dup.safetensors", progress=False)


# ---------------------------------------------------------------------------------------------- statistics
STAGE = {"min_anchors": 100, "bootstrap": {"resamples": 500, "seed": 0}}


def _rows(mats: dict[str, float], n_prompts=20, length=60, noise=0.0, seed=0, sets=("heldout", "bench")):
    """Records where drafter d accepts ~``mats[d]`` tokens per round at every bs of its plan (random per prompt)."""
    from dscout.config import FINDINGS_PLAN

    rng = np.random.default_rng(seed)
    rows = []
    for s in sets:
        for p in range(n_prompts):
            shift = rng.normal(0, noise)  # a per-prompt difficulty shared by every drafter (pairing)
            for name, (_, bss) in FINDINGS_PLAN.items():
                for bs in bss:
                    L = np.clip(np.rint(rng.normal(mats.get(name, 1.0) + shift, 0.3, size=length)), 1, bs).astype(int)
                    L = np.minimum(L, np.arange(length, 0, -1))
                    rows.append({"drafter": name, "set": s, "id": f"{s}-{p}", "bs": bs, "accept": L.tolist()})
    for name, sec in (("dflash", 10.0), ("dflash_long", 13.0), ("step4_awl", 11.0)):
        rows.append({"drafter": name, "set": "training", "steps": 1, "train_seconds": sec, "num_sequences": 1})
    return rows


def _by_key(table):
    keys = [k for k, *_ in fa.FINDINGS]
    return dict(zip(keys, table))


def test_verdicts_follow_the_intervals():
    up = {"dflash": 2.0, "dflash_long": 2.1, "step1_fixed32": 2.1, "step2_mixed": 2.2, "step3_unmask": 2.35,
          "step4_awl": 3.0, "fixed8": 2.0, "mixed_short": 2.3, "mixed_short_unmask": 2.2}
    t = _by_key(fa.findings_rows(_rows(up, noise=0.5), STAGE))
    for key in ("awl_largest_step", "full_recipe_gain", "unmask_helps_8_32", "unmask_hurts_4_32",
                "mixed_vs_dedicated_bs8", "mixed_vs_dedicated_bs16", "dscout_vs_dflash_equal_compute"):
        assert t[key]["verdict"] == "reproduced" and t[key]["ci_low"] > 0, (key, t[key])
        assert t[key]["bench_verdict"] == "reproduced"
    assert t["full_recipe_gain"]["estimate"] == pytest.approx(50, abs=8)  # 3.0 / 2.0 - 1 in %
    assert "dflash_long" in t["dscout_vs_dflash_equal_compute"]["note"]  # 13 s >= 11 s; dflash's 10 s is not
    # reversed: refuted; equal: unresolved (the interval straddles or touches 0)
    down = {**up, "step3_unmask": 2.05, "mixed_short_unmask": 2.45, "step2_mixed": 2.2, "step1_fixed32": 2.2}
    t = _by_key(fa.findings_rows(_rows(down, noise=0.5, seed=1), STAGE))
    assert t["unmask_helps_8_32"]["verdict"] == "refuted" and t["unmask_hurts_4_32"]["verdict"] == "refuted"
    assert t["mixed_vs_dedicated_bs32"]["verdict"] == "unresolved"
    assert t["mixed_vs_dedicated_bs32"]["ci_low"] <= 0 <= t["mixed_vs_dedicated_bs32"]["ci_high"]


def test_pairing_resolves_what_prompt_difficulty_would_hide():
    """A small, consistent gain under a large per-prompt spread: resolved because both drafters share the draw."""
    mats = {"step2_mixed": 2.1, "fixed8": 2.0, "dflash": 2.0, "step1_fixed32": 2.0}
    t = _by_key(fa.findings_rows(_rows(mats, noise=1.0, length=200), STAGE))
    row = t["mixed_vs_dedicated_bs16"]
    assert row["verdict"] == "reproduced"
    boot = fa.Bootstrap(fa.Records(_rows(mats, noise=1.0, length=200), "heldout"), 500, 0)
    spread = np.percentile(boot.mat("dflash", 16)[1:], 97.5) - np.percentile(boot.mat("dflash", 16)[1:], 2.5)
    assert row["ci_high"] - row["ci_low"] < spread / 3  # the difference's interval is far narrower


def test_too_few_anchors_or_no_equal_compute_drafter_stay_unresolved():
    up = {"step4_awl": 3.0, "dflash": 2.0, "dflash_long": 2.0}
    rows = _rows(up, n_prompts=3, length=20)  # 60 anchors < 100
    t = _by_key(fa.findings_rows(rows, STAGE))
    assert {r["verdict"] for r in t.values()} == {"unresolved"}
    assert "60 anchors < min_anchors 100" in t["full_recipe_gain"]["note"]
    rows = [r for r in _rows(up) if not (r.get("set") == "training" and r["drafter"] == "dflash_long")]
    t = _by_key(fa.findings_rows(rows, STAGE))
    assert t["full_recipe_gain"]["verdict"] == "reproduced"
    row = t["dscout_vs_dflash_equal_compute"]
    assert row["verdict"] == "unresolved" and "no DFlash-recipe drafter trained as long" in row["note"]


def test_renders_write_every_artifact(tmp_path):
    up = {"dflash": 2.0, "step4_awl": 3.0, "step2_mixed": 2.5, "step1_fixed32": 2.2}
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(up)))
    stage = {**STAGE, "target_name": "t", "shape": "5t2d", "max_steps": 9, "holdout": 4,
             "benchmarks": {"names": ["gsm8k"], "num_prompts": 2, "max_new_tokens": 9}}
    table = fa.write_findings([path], str(tmp_path / "tables/findings"), stage)
    assert "by source" not in (tmp_path / "tables/findings.md").read_text()  # these rows name no source
    csv_rows = (tmp_path / "tables/findings.csv").read_text().splitlines()
    assert csv_rows[0].split(",")[:6] == ["finding", "paper", "estimate", "ci_low", "ci_high", "verdict"]
    assert len(csv_rows) == 1 + len(fa.FINDINGS) == 1 + len(table)
    for which in ("table1", "table2"):
        fa.WRITERS[which]([path], str(tmp_path / f"tables/{which}"), stage)
        assert "[" in (tmp_path / f"tables/{which}.md").read_text()
    for which in ("fig2", "fig4", "fig7"):
        fa.WRITERS[which]([path], str(tmp_path / f"figures/{which}"), stage)
        assert (tmp_path / f"figures/{which}.png").stat().st_size > 0


def test_the_held_out_measures_split_by_source():
    """A mix whose sources differ: each source's line carries its own responses, anchors and interval."""
    rows = _rows({"step4_awl": 3.0, "dflash": 2.0}, n_prompts=20)
    easy = {f"heldout-{p}" for p in range(10)}
    for r in rows:
        if r.get("set") == "heldout":
            r["source"] = "easy" if r["id"] in easy else "hard"
            if r["source"] == "hard":
                r["accept"] = [1] * len(r["accept"])
    lines = fa._by_source_lines(rows, STAGE)
    body = {l.split(" | ")[0].strip("| "): l.split(" | ") for l in lines if l.startswith("| easy") or
            l.startswith("| hard")}
    assert body["easy"][1] == body["hard"][1] == "10"
    assert body["hard"][3].startswith("1.00 [1.00, 1.00] / 1.00")
    assert float(body["easy"][3].split()[0]) > 2.5 and float(body["easy"][4].split()[0]) > 1.6
