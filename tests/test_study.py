"""The recipe study's artifacts (Tables 1, 2; Figures 4, 7) computed from records, and its plan in the config."""

import csv
import json

import pytest

from dscout import config as dcfg
from dscout.analysis.recipe_artifacts import Bootstrap, Records
from dscout.analysis.study import FIG4_STEPS, study_rows, write_fig4, write_fig7, write_table1, write_table2
from dscout.analysis.walk import decode_walk


def _records(tmp_path):
    """Synthetic study records: recipe r at bs accepts lengths that encode (r, bs), so cells are checkable."""
    recs = []
    ids = {r: f"study_{r}-2t1d-abc" for r in dcfg.STUDY_PLAN}
    for i, (r, sizes) in enumerate(dcfg.STUDY_PLAN.items()):
        for bs in sizes:
            lengths = [1 + (i % 3), bs, 2]  # MAT = (3 + i % 3 + bs) / 3
            recs.append({"benchmark": "gsm8k", "prompt_id": "p0", "turn": 0, "method": "dscout",
                         "method_key": f"dscout-bs{bs}-{ids[r]}", "method_name": f"{r}@{bs}", "drafter": ids[r],
                         "block_size": bs, "temperature": 0.0, "repeat": 0, "concurrency": 1, "new_tokens": 9,
                         "decode_seconds": 0.1, "accept_lengths": lengths, "output_ids": [1] * 9})
    recs.append({**recs[0], "method": "ar", "method_key": "ar", "drafter": None, "block_size": None,
                 "accept_lengths": [1] * 8})
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    stage = {"target": "tiny", "recipes": {v: k for k, v in ids.items()}, "shape": "d=1, t=2", "max_steps": 3,
             "benchmarks": ["gsm8k"], "num_prompts": 1, "max_new_tokens": 8}
    return path, stage


def _mat(i, bs):
    return (1 + i % 3 + bs + 2) / 3


def test_table2_cells_come_from_the_matching_checkpoint_and_bs(tmp_path):
    path, stage = _records(tmp_path)
    write_table2([path], str(tmp_path / "t2"), stage)
    rows = list(csv.reader(open(tmp_path / "t2.csv")))
    assert rows[0] == ["training horizon", "bs 8", "bs 16", "bs 24", "bs 32"]
    by = {r[0]: r[1:] for r in rows[1:]}
    order = list(dcfg.STUDY_PLAN)
    # one prompt: the interval collapses onto the estimate
    m = _mat(order.index("fixed8"), 8)
    assert by["fixed 8"][0] == f"{m:.3f} [{m:.3f}, {m:.3f}]" and by["fixed 8"][1:] == ["n/a"] * 3
    assert [c.split()[0] for c in by["fixed 16 (DFlash recipe)"][:2]] == \
        [f"{_mat(order.index('dflash'), b):.3f}" for b in (8, 16)]
    assert [c.split()[0] for c in by["mixed {8,16,24,32}"]] == \
        [f"{_mat(order.index('step2_mixed'), b):.3f}" for b in (8, 16, 24, 32)]
    gap = by["mixed − dedicated (decoded prompts)"]
    assert gap[2] == "–"  # no dedicated fixed-24 checkpoint
    want = _mat(order.index("step2_mixed"), 16) - _mat(order.index("dflash"), 16)
    assert float(gap[1].split()[0]) == pytest.approx(want, abs=1e-3)
    assert (tmp_path / "t2.md").read_text().count("|") > 20 and "\\begin{tabular}" in (tmp_path / "t2.tex").read_text()


def test_table1_and_figures(tmp_path):
    path, stage = _records(tmp_path)
    rows = write_table1([path], str(tmp_path / "t1"), stage)
    order = list(dcfg.STUDY_PLAN)
    assert rows[1][1].split()[0] == f"{_mat(order.index('step2_mixed'), 32):.3f}"
    assert rows[1][2].split()[0] == f"{_mat(order.index('step3_unmask'), 32):.3f}"
    assert "6.263" in (tmp_path / "t1.md").read_text()  # the paper's number, labelled beside ours
    mats = write_fig4([path], str(tmp_path / "f4"), stage)["decoded prompts"]
    assert len(mats) == len(FIG4_STEPS)
    assert mats[-1][0] == pytest.approx(_mat(order.index("step4_awl"), 16))
    shares = write_fig7([path], str(tmp_path / "f7"), stage)["decoded prompts"]
    assert all(abs(sum(h.values()) - 1) < 1e-9 for h in shares.values())
    for f in ("f4", "f7"):
        assert (tmp_path / f"{f}.png").stat().st_size > 0 and (tmp_path / f"{f}.pdf").stat().st_size > 0


def test_records_of_another_study_are_refused(tmp_path):
    path, stage = _records(tmp_path)
    stage["recipes"] = {}
    with pytest.raises(ValueError, match="not part of this study"):
        study_rows([json.loads(line) for line in path.read_text().splitlines()], stage["recipes"])


def test_decoded_rounds_and_teacher_forced_anchors_render_alike():
    """The study's decoded rounds and the findings stage's per-anchor lengths go through one renderer: a sequence
    given as anchors and as the rounds decoding runs over it gives the same MAT and histogram."""
    accept = [3, 1, 1, 2, 4, 1, 1, 1, 2, 1, 1]
    rounds = decode_walk(accept)
    rows = [{"set": "a", "id": "s0", "drafter": "dflash", "bs": 16, "accept": accept},
            {"set": "r", "id": "s0", "drafter": "dflash", "bs": 16, "rounds": rounds}]
    by_anchor, by_round = Records(rows, "a"), Records(rows, "r")
    for q in ("tokens", "rounds", "early"):
        assert by_anchor.sums[("dflash", 16, q)].tolist() == by_round.sums[("dflash", 16, q)].tolist()
    assert dict(by_anchor.hist[("dflash", 16)]) == dict(by_round.hist[("dflash", 16)])
    boot = Bootstrap(by_round, 10, 0)
    assert boot.mat("dflash", 16)[0] == pytest.approx(sum(rounds) / len(rounds))
    with pytest.raises(KeyError, match="no 'accepted'"):
        boot.every_anchor_mean("dflash", 16)  # decoded rounds have no per-anchor lengths


def test_study_plan_never_decodes_above_the_training_horizon():
    from dscout.training.recipes import get_recipe

    for recipe, sizes in dcfg.STUDY_PLAN.items():
        assert max(sizes) <= max(get_recipe(recipe).horizons), recipe
