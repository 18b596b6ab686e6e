"""The findings table (computed verdicts) from the findings stage's per-anchor records; its Tables 1, 2 and
Figures 2, 4, 7 are rendered by :mod:`dscout.analysis.recipe_artifacts`, the same code as the recipe study's.

Records (:mod:`dscout.experiments.findings`): per drafter, set (``heldout`` = held-out regenerated responses of the
training mix, ``bench`` = AR outputs of Table 3's benchmark prompts), sequence and bs, the greedy accepted length
``L(a)`` at every anchor. **MAT** of a (drafter, bs) on a set is greedy decoding's: tokens committed / draft rounds
over the rounds decoding runs on each sequence (:func:`decode_walk`), the paper's definition. The mean of ``L``
over *every* anchor is reported beside it but not used for verdicts: it weights an easy stretch of text by its
length while decoding crosses it in a few rounds, so it overstates decoding's MAT (an arithmetic instead of a
harmonic mean over positions; on the CPU default's DScout drafter, 1.87 against 1.43 at bs 16).

**Intervals.** The paired percentile bootstrap over prompts of :mod:`dscout.analysis.recipe_artifacts`: a difference
between two recipes keeps its pairing (both drafters are read on the same sequences).

**Verdicts** (computed, :func:`verdict`): every finding's statistic is signed so that the paper's direction is
positive; ``reproduced`` when the interval lies above 0, ``refuted`` when below, else ``unresolved``; also
``unresolved`` when the set has fewer than ``min_anchors`` anchors, or when the equal-compute comparison has no
DFlash drafter that trained at least as long as the DScout one.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from . import paper
from .recipe_artifacts import (DEDICATED, EARLY_MAX, FIG4_STEPS, TABLE1_ROWS, TABLE2_ROWS, Bootstrap,  # noqa: F401
                               Records, RecordSet, interval, record_sets, write_fig2 as _fig2, write_fig4 as _fig4,
                               write_fig7 as _fig7, write_table1 as _table1, write_table2 as _table2)
from .walk import decode_walk  # noqa: F401  (re-exported: the findings' definition of decoding's rounds)

TABLE2_BS = [8, 16, 32]
SETS = ("heldout", "bench")
SET_LABELS = [("heldout", "held-out"), ("bench", "benchmarks")]


def verdict(ci_low: float, ci_high: float, enough: bool = True) -> str:
    """``reproduced`` if the interval lies above 0, ``refuted`` if below, else (or without enough data)
    ``unresolved``. The statistic must be signed so that the paper's direction is positive."""
    if not enough or not np.isfinite(ci_low) or not np.isfinite(ci_high):
        return "unresolved"
    if ci_low > 0:
        return "reproduced"
    if ci_high < 0:
        return "refuted"
    return "unresolved"


def _training(rows: list[dict]) -> dict[str, dict]:
    return {r["drafter"]: r for r in rows if r.get("set") == "training"}


def _equal_compute_dflash(rows: list[dict]) -> tuple[str | None, str]:
    """The DFlash-recipe drafter whose measured training seconds reach the DScout drafter's (the shorter one)."""
    tr = _training(rows)
    if "step4_awl" not in tr:
        return None, "no training record of the DScout drafter"
    need = tr["step4_awl"]["train_seconds"]
    for name in ("dflash", "dflash_long"):
        if name in tr and tr[name]["train_seconds"] >= need:
            return name, (f"{name}: DFlash recipe {tr[name]['steps']} updates in {tr[name]['train_seconds']:.0f} s vs DScout "
                          f"{tr['step4_awl']['steps']} updates in {need:.0f} s")
    got = ", ".join(f"{n} {tr[n]['train_seconds']:.0f} s" for n in ("dflash", "dflash_long") if n in tr)
    return None, f"no DFlash-recipe drafter trained as long as DScout ({need:.0f} s; {got})"


FINDINGS = [
    # (key, finding, paper, unit)
    ("awl_largest_step", "AWL is the largest single step of the cumulative ablation (bs 16)",
     "+0.491 MAT vs +0.151 / +0.155 / +0.171 for the other steps", "MAT: AWL step - largest other step"),
    ("full_recipe_gain", "the full DScout recipe adds MAT over the DFlash recipe (bs 16, same updates)",
     f"+{100 * paper.FIGURE4_TOTAL_GAIN:.1f} %", "% MAT"),
    ("unmask_helps_8_32", "unmasking helps with horizons {8,16,24,32} (bs 32)",
     "+0.035 MAT (6.228 -> 6.263)", "MAT: with - without unmasking"),
    ("unmask_hurts_4_32", "unmasking hurts with horizons {4,8,16,32} (bs 32)",
     "-0.031 MAT (6.228 -> 6.197)", "MAT: without - with unmasking"),
    *[(f"mixed_vs_dedicated_bs{bs}", f"the mixed-horizon checkpoint is at or above the dedicated fixed-{bs} drafter "
       f"at bs {bs}", "at or above at every bs (Table 2)", f"MAT: mixed - fixed {bs}") for bs in TABLE2_BS],
    ("early_rejections", "mixed horizons cut early rejections (rounds accepting 1-4 tokens) against fixed 32 (bs 32)",
     "fewer early rejections (Figure 2)", "percentage points of rounds: fixed 32 - mixed"),
    ("dscout_vs_dflash_equal_compute", "DScout ahead of DFlash at equal training compute (bs 16)",
     "DScout ahead (Tables 3, 4)", "MAT: DScout - DFlash recipe with at least DScout's training seconds"),
]


def _statistic(key: str, bs_: Bootstrap, dflash_eq: str | None) -> np.ndarray | None:
    m = bs_.mat
    if key == "awl_largest_step":
        mats = [m(r, 16) for _, r in FIG4_STEPS]
        steps = [b - a for a, b in zip(mats, mats[1:])]
        return steps[-1] - np.max(np.vstack(steps[:-1]), axis=0)
    if key == "full_recipe_gain":
        return 100 * (m("step4_awl", 16) / m("dflash", 16) - 1)
    if key == "unmask_helps_8_32":
        return m("step3_unmask", 32) - m("step2_mixed", 32)
    if key == "unmask_hurts_4_32":
        return m("mixed_short", 32) - m("mixed_short_unmask", 32)
    if key.startswith("mixed_vs_dedicated_bs"):
        bs = int(key.rsplit("bs", 1)[1])
        return m("step2_mixed", bs) - m(DEDICATED[bs], bs)
    if key == "early_rejections":
        return 100 * (bs_.share("step1_fixed32", 32, "early") - bs_.share("step2_mixed", 32, "early"))
    if key == "dscout_vs_dflash_equal_compute":
        return None if dflash_eq is None else m("step4_awl", 16) - m(dflash_eq, 16)
    raise KeyError(key)


def load(record_paths) -> list[dict]:
    """Every row of the findings records (one JSONL per drafter)."""
    rows = []
    for p in record_paths:
        with open(p) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def _bootstraps(rows: list[dict], stage: dict) -> dict[str, Bootstrap]:
    b = stage["bootstrap"]
    return {s: Bootstrap(Records(rows, s), b["resamples"], b["seed"]) for s in SETS}


def findings_rows(rows: list[dict], stage: dict) -> list[dict]:
    """One row per finding: estimate and 95 % interval on the held-out set and on the benchmark prompts, verdicts.

    Returns:
        dicts with ``finding, paper, estimate, ci_low, ci_high, verdict, unit, anchors, prompts, bench_estimate,
        bench_ci_low, bench_ci_high, bench_verdict, bench_anchors, bench_prompts, note``.
    """
    boots = _bootstraps(rows, stage)
    dflash_eq, eq_note = _equal_compute_dflash(rows)
    out = []
    for key, finding, paper_text, unit in FINDINGS:
        row = {"finding": finding, "paper": paper_text}
        note = eq_note if key == "dscout_vs_dflash_equal_compute" else ""
        for s, prefix in (("heldout", ""), ("bench", "bench_")):
            boot = boots[s]
            anchors = boot.records.anchors()
            enough = anchors >= stage["min_anchors"]
            try:
                values = _statistic(key, boot, dflash_eq)
            except KeyError as e:  # a drafter or bs missing from the records
                values, note = None, str(e)
            est, lo, hi = interval(values) if values is not None else (np.nan, np.nan, np.nan)
            row.update({f"{prefix}estimate": est, f"{prefix}ci_low": lo, f"{prefix}ci_high": hi,
                        f"{prefix}verdict": verdict(lo, hi, enough and values is not None),
                        f"{prefix}anchors": anchors, f"{prefix}prompts": len(boot.records.prompts)})
            if not enough:
                note = (note + "; " if note else "") + f"{s}: {anchors} anchors < min_anchors {stage['min_anchors']}"
        row["unit"] = unit
        row["note"] = note
        out.append(row)
    return out


COLUMNS = ["finding", "paper", "estimate", "ci_low", "ci_high", "verdict", "unit", "anchors", "prompts",
           "bench_estimate", "bench_ci_low", "bench_ci_high", "bench_verdict", "bench_anchors", "bench_prompts", "note"]


def _fmt(x) -> str:
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:+.3f}"


def _caption(stage: dict, rows: list[dict] | None = None) -> str:
    b = stage["benchmarks"]
    text = (f"Target {stage['target_name']}; one {stage['shape']} drafter per recipe, {stage['max_steps']} updates each "
            f"on the regenerated responses minus {stage['holdout']} held-out ones (same data, levers and seed). "
            f"MAT = greedy decoding's tokens per draft round (bonus included), from teacher-forced accept lengths at every anchor (docs/findings.md); held-out = the "
            f"held-out responses of the training mix; benchmarks = greedy AR outputs of the first "
            f"{b['num_prompts']} prompts of {', '.join(b['names'])} (first turn, {b['max_new_tokens']} tokens). "
            f"[a, b] = 95 % paired bootstrap interval over prompts ({stage['bootstrap']['resamples']} resamples).")
    if rows is not None:
        checks = [r for r in rows if r.get("set") == "decode_check"]
        if checks:
            n_eq = sum(r["equal"] for r in checks)
            n_rounds = sum(r["compared"] for r in checks)
            text += (f" Live greedy decoding check: {n_eq}/{len(checks)} prompts with the engine's rounds equal to "
                     f"the teacher-forced walk ({n_rounds} full-block rounds compared).")
    return text


def write_findings(record_paths, out_prefix: str, stage: dict) -> list[dict]:
    """``<prefix>.csv`` (one row per finding, the columns of :data:`COLUMNS`) and ``<prefix>.md``."""
    rows = load(record_paths)
    table = findings_rows(rows, stage)
    prefix = Path(out_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(prefix.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in table:
            w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})
    boot = _bootstraps(rows, stage)["heldout"]
    has = boot.records.has("step4_awl", 16)
    full = interval(boot.mat("step4_awl", 16)) if has else (np.nan,) * 3
    every = interval(boot.every_anchor_mean("step4_awl", 16)) if has else (np.nan,) * 3
    rounds = int(boot.total("step4_awl", 16, "rounds")[0]) if has else 0
    md = ["# Findings — the paper's training-side claims on this run", "", _caption(stage, rows), "",
          f"Full DScout recipe at bs 16, held-out: decoding MAT {full[0]:.3f} [{full[1]:.3f}, {full[2]:.3f}] "
          f"({rounds} decoding rounds); mean accepted length over every anchor {every[0]:.3f} "
          f"[{every[1]:.3f}, {every[2]:.3f}] ({boot.records.anchors()} anchors over {len(boot.records.prompts)} "
          "responses).", "", *_by_source_lines(rows, stage), "",
          "| finding | paper | held-out estimate [95 % CI] | verdict | benchmarks estimate [95 % CI] | verdict | unit |",
          "|---|---|---|---|---|---|---|"]
    for r in table:
        md.append(f"| {r['finding']} | {r['paper']} | {_fmt(r['estimate'])} [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]"
                  f" | **{r['verdict']}** | {_fmt(r['bench_estimate'])} [{_fmt(r['bench_ci_low'])}, "
                  f"{_fmt(r['bench_ci_high'])}] | **{r['bench_verdict']}** | {r['unit']} |")
    notes = [f"- {r['finding']}: {r['note']}" for r in table if r["note"]]
    md += ["", "Verdicts are computed: reproduced / refuted only where the interval excludes 0 (each statistic is "
           "signed so that the paper's direction is positive), unresolved otherwise or below "
           f"{stage['min_anchors']} anchors.", *(["", "Notes:", *notes] if notes else [])]
    prefix.with_suffix(".md").write_text("\n".join(md) + "\n")
    return table


def _by_source_lines(rows: list[dict], stage: dict, drafters=("step4_awl", "dflash"), bs: int = 16) -> list[str]:
    """The held-out bs-16 measures split by training source: the mix's sources differ several-fold in how far a
    drafter drafts (GSM8K-train answers repeat their word problem; Alpaca prose does not), so a held-out figure
    means little without its mix. Returns markdown lines (none when the rows carry no ``source``)."""
    sources = sorted({r["source"] for r in rows if r.get("set") == "heldout" and r.get("source")})
    if not sources:
        return []
    b = stage["bootstrap"]
    out = [f"Held-out at bs {bs} by source (decoding MAT / every-anchor mean, [95 % CI over that source's "
           "responses]):", "", "| source | responses | anchors | " + " | ".join(drafters) + " |",
           "|---|---|---|" + "---|" * len(drafters)]
    for src in sources:
        boot = Bootstrap(Records(rows, "heldout", src), b["resamples"], b["seed"])
        cells = []
        for d in drafters:
            if not boot.records.has(d, bs):
                cells.append("n/a")
                continue
            m, e = interval(boot.mat(d, bs)), interval(boot.every_anchor_mean(d, bs))
            cells.append(f"{m[0]:.2f} [{m[1]:.2f}, {m[2]:.2f}] / {e[0]:.2f} [{e[1]:.2f}, {e[2]:.2f}]")
        out.append(f"| {src} | {len(boot.records.prompts)} | {boot.records.anchors()} | " + " | ".join(cells) + " |")
    return out


def _sets(record_paths, stage: dict) -> list[RecordSet]:
    return record_sets(load(record_paths), SET_LABELS, stage["bootstrap"])


def write_table1(record_paths, out_prefix: str, stage: dict) -> list[list]:
    """Table 1 from the findings records (held-out and benchmark columns): :func:`recipe_artifacts.write_table1`."""
    return _table1(_sets(record_paths, stage), out_prefix, _caption(stage), "Verdicts: results/tables/findings.md.")


def write_table2(record_paths, out_prefix: str, stage: dict) -> list[list]:
    """Table 2 from the findings records (MAT on the held-out set): :func:`recipe_artifacts.write_table2`."""
    return _table2(_sets(record_paths, stage), out_prefix, _caption(stage), TABLE2_BS,
                   "Verdicts: results/tables/findings.md.")


def write_fig4(record_paths, out_prefix: str, stage: dict) -> dict:
    """Figure 4 from the findings records: :func:`recipe_artifacts.write_fig4`."""
    return _fig4(_sets(record_paths, stage), out_prefix,
                 f"{stage['target_name']}, {stage['shape']}, {stage['max_steps']} updates, teacher-forced")


def write_fig2(record_paths, out_prefix: str, stage: dict) -> dict:
    """Figure 2 from the findings records (held-out and benchmark panels): :func:`recipe_artifacts.write_fig2`."""
    return _fig2(_sets(record_paths, stage), out_prefix)


def write_fig7(record_paths, out_prefix: str, stage: dict) -> dict:
    """Figure 7 from the findings records (held-out and benchmark panels): :func:`recipe_artifacts.write_fig7`."""
    return _fig7(_sets(record_paths, stage), out_prefix)


WRITERS = {"findings": write_findings, "table1": write_table1, "table2": write_table2, "fig2": write_fig2,
           "fig4": write_fig4, "fig7": write_fig7}
