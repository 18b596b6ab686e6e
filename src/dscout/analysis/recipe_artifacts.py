"""Tables 1, 2 and Figures 2, 4, 7 — the recipe ablations — from either record source, with paired intervals.

One renderer for both stages that measure the recipes (docs/method.md §3):

* the **findings stage** (:mod:`dscout.analysis.findings`): teacher-forced accepted lengths at every anchor of
  held-out responses and of benchmark AR outputs; greedy decoding's rounds are their :func:`decode_walk`;
* the **recipe study** (:mod:`dscout.analysis.study`): rounds actually decoded by the engine on benchmark prompts
  (records of ``results/study/``), which are that walk by construction.

Both become rows ``{set, id, drafter, bs, accept | rounds [, source]}`` (``drafter`` = the recipe's name, e.g.
``step4_awl``), grouped into named :class:`RecordSet` s; every writer takes a list of them and renders one column
group, bar series or panel per set. **MAT** of a (recipe, bs) cell is decoding's: tokens committed / draft rounds
(bonus included), the paper's definition. **Intervals**: a paired percentile bootstrap over prompts (sequences):
every resample draws a set's prompts with replacement once and recomputes every recipe on that draw, so a
difference of two recipes keeps its pairing; 95 % = the 2.5 / 97.5 percentiles.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import paper
from .plotting import _plt, save
from .walk import decode_walk

FIG4_STEPS = [("DFlash recipe", "dflash"), ("+ fixed 32", "step1_fixed32"), ("+ mixed horizons", "step2_mixed"),
              ("+ unmasking", "step3_unmask"), ("+ AWL (DScout)", "step4_awl")]
"""Figure 4's cumulative steps: (label, recipe), each adding one factor to the previous."""
TABLE1_ROWS = [("{4,8,16,32}", "mixed_short", "mixed_short_unmask"), ("{8,16,24,32}", "step2_mixed", "step3_unmask")]
"""Table 1's rows: (horizon set, recipe all masked, recipe with intra-block unmasking)."""
TABLE2_ROWS = [("fixed 8", "fixed8", 8), ("fixed 16 (DFlash recipe)", "dflash", 16), ("fixed 32", "step1_fixed32", 32),
               ("mixed {8,16,24,32}", "step2_mixed", 32)]
"""Table 2's rows: (label, recipe, largest training horizon: the largest bs it is read at)."""
DEDICATED = {8: "fixed8", 16: "dflash", 32: "step1_fixed32"}
"""The dedicated fixed-horizon recipe of each bs the mixed checkpoint is compared with."""
EARLY_MAX = 4  # "early rejection": a round that commits 1-4 tokens (the paper's Figure 2)
DEFAULT_BOOTSTRAP = {"resamples": 1000, "seed": 0}


class Records:
    """Per-prompt sums of one set (optionally one ``source`` of it), shaped for the paired bootstrap.

    Args:
        rows: dicts with ``set``, ``id`` (the prompt / sequence: the bootstrap's unit), ``drafter`` (recipe),
            ``bs`` and either ``accept`` (teacher-forced accepted length at every anchor) or ``rounds`` (the
            accepted length of every decoded round); other rows are ignored.
        set_name: the ``set`` to keep.
        source: keep only rows of this ``source`` (None = all).

    Attributes:
        prompts: the set's ids, sorted.
        sums: ``(drafter, bs, quantity) -> [P]`` float array; quantities: ``tokens`` (committed by the rounds),
            ``rounds``, ``anchors`` (= tokens), ``early`` (rounds with L <= 4), ``long`` (rounds with L > 16), and
            for anchor rows only ``accepted`` (sum of L over every anchor).
        hist: ``(drafter, bs) -> {L: rounds}`` (Figures 2, 7).
    """

    def __init__(self, rows: list[dict], set_name: str, source: str | None = None):
        rows = [r for r in rows if r.get("set") == set_name and (source is None or r.get("source") == source)]
        self.prompts = sorted({r["id"] for r in rows})
        index = {p: i for i, p in enumerate(self.prompts)}
        P = len(self.prompts)
        self.sums: dict[tuple, np.ndarray] = defaultdict(lambda: np.zeros(P))
        self.hist: dict[tuple, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        for r in rows:
            key, i = (r["drafter"], int(r["bs"])), index[r["id"]]
            if "accept" in r:
                walk = decode_walk(r["accept"])
                self.sums[key + ("accepted",)][i] += sum(r["accept"])
            else:
                walk = [int(x) for x in r["rounds"]]
            self.sums[key + ("anchors",)][i] += sum(walk)
            self.sums[key + ("tokens",)][i] += sum(walk)
            self.sums[key + ("rounds",)][i] += len(walk)
            self.sums[key + ("early",)][i] += sum(1 for x in walk if x <= EARLY_MAX)
            self.sums[key + ("long",)][i] += sum(1 for x in walk if x > 16)
            for x in walk:
                self.hist[key][x] += 1
        self.keys = {k[:2] for k in self.sums}

    def anchors(self) -> int:
        """Anchors (= committed tokens) per drafter-bs cell: the smallest over cells (all read the same sequences)."""
        return int(min((self.sums[k + ("anchors",)].sum() for k in self.keys), default=0))

    def has(self, drafter: str, bs: int) -> bool:
        return (drafter, bs) in self.keys


class Bootstrap:
    """Totals of every per-prompt quantity under the point estimate (row 0) and ``R`` paired resamples.

    Args:
        records: one set's :class:`Records`.
        resamples: R.
        seed: numpy seed of the resampling.
    """

    def __init__(self, records: Records, resamples: int, seed: int):
        P = len(records.prompts)
        rng = np.random.default_rng(seed)
        draws = rng.integers(0, P, size=(resamples, P)) if P else np.zeros((resamples, 0), dtype=int)
        counts = np.zeros((resamples, P))
        for r in range(resamples):
            counts[r] = np.bincount(draws[r], minlength=P)
        self.weights = np.vstack([np.ones((1, P)), counts])  # row 0: the sample itself
        self.records = records

    def total(self, drafter: str, bs: int, quantity: str) -> np.ndarray:
        """``[1 + R]`` totals of ``quantity`` of (drafter, bs). Raises KeyError if that cell or quantity is absent."""
        if not self.records.has(drafter, bs):
            raise KeyError(f"no records of drafter {drafter} at bs {bs}")
        if (drafter, bs, quantity) not in self.records.sums:
            raise KeyError(f"records of drafter {drafter} at bs {bs} carry no '{quantity}' (decoded rounds have no "
                           "per-anchor lengths)")
        return self.weights @ self.records.sums[(drafter, bs, quantity)]

    def mat(self, drafter: str, bs: int) -> np.ndarray:
        """Greedy decoding's MAT, tokens / rounds: ``[1 + R]``."""
        return self.total(drafter, bs, "tokens") / np.maximum(self.total(drafter, bs, "rounds"), 1)

    def every_anchor_mean(self, drafter: str, bs: int) -> np.ndarray:
        """Mean accepted length over every anchor (anchor rows only; not decoding's MAT): ``[1 + R]``."""
        return self.total(drafter, bs, "accepted") / np.maximum(self.total(drafter, bs, "anchors"), 1)

    def share(self, drafter: str, bs: int, quantity: str) -> np.ndarray:
        """Share of rounds counted by ``quantity`` (``early``, ``long``): ``[1 + R]``."""
        return self.total(drafter, bs, quantity) / np.maximum(self.total(drafter, bs, "rounds"), 1)


@dataclass(frozen=True)
class RecordSet:
    """One set of sequences a recipe is read on: ``label`` heads its columns and panels."""

    label: str
    boot: Bootstrap


def record_sets(rows: list[dict], sets: list[tuple[str, str]], bootstrap: dict | None = None) -> list[RecordSet]:
    """``[(set name, label)]`` -> :class:`RecordSet` s over ``rows`` (``bootstrap``: ``{resamples, seed}``)."""
    b = bootstrap or DEFAULT_BOOTSTRAP
    return [RecordSet(label, Bootstrap(Records(rows, name), b["resamples"], b["seed"])) for name, label in sets]


def interval(values: np.ndarray) -> tuple[float, float, float]:
    """``(estimate, ci_low, ci_high)`` from ``[1 + R]`` bootstrap values (row 0 = the estimate; 95 % percentile)."""
    lo, hi = np.percentile(values[1:], [2.5, 97.5]) if len(values) > 1 else (np.nan, np.nan)
    return float(values[0]), float(lo), float(hi)


def cell(boot: Bootstrap, drafter: str, bs: int) -> str:
    """``"MAT [lo, hi]"`` of a cell, ``n/a`` when it was not read."""
    if not boot.records.has(drafter, bs):
        return "n/a"
    e, lo, hi = interval(boot.mat(drafter, bs))
    return f"{e:.3f} [{lo:.3f}, {hi:.3f}]"


def diff(values: np.ndarray | None) -> str:
    """``"+d [lo, hi]"`` of a paired difference, ``–`` when it cannot be formed."""
    if values is None:
        return "–"
    e, lo, hi = interval(values)
    return f"{e:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def write_rows(prefix: Path, header: list[str], rows: list[list], title: str, caption: str,
               paper_lines: list[str]) -> None:
    """``<prefix>.csv``, ``<prefix>.md`` (title, caption, table, the paper's lines) and ``<prefix>.tex``."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(prefix.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    md = [f"# {title}", "", caption, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    md += ["", *paper_lines]
    prefix.with_suffix(".md").write_text("\n".join(md) + "\n")
    esc = lambda s: str(s).replace("{", "\\{").replace("}", "\\}")  # noqa: E731
    tex = ["\\begin{table}[t]", "\\centering", "\\begin{tabular}{l" + "c" * (len(header) - 1) + "}", "\\toprule",
           " & ".join(esc(h) for h in header) + " \\\\", "\\midrule"]
    tex += [" & ".join(esc(c) for c in row) + " \\\\" for row in rows]
    tex += ["\\bottomrule", "\\end{tabular}", f"\\caption{{{title}. {caption}}}",
            f"\\label{{tab:{prefix.name}}}", "\\end{table}"]
    prefix.with_suffix(".tex").write_text("\n".join(tex) + "\n")


def write_table1(sets: list[RecordSet], out_prefix: str, caption: str, footer: str = "") -> list[list]:
    """Table 1: MAT at bs 32 with and without intra-block unmasking per horizon set, three columns per set
    (all masked, unmasking, paired difference), and the paper's means beside them.

    Returns:
        the table's rows (as written to the CSV).
    """
    rows = []
    for label, off, on in TABLE1_ROWS:
        row = [label]
        for s in sets:
            b = s.boot
            ok = b.records.has(off, 32) and b.records.has(on, 32)
            row += [cell(b, off, 32), cell(b, on, 32), diff(b.mat(on, 32) - b.mat(off, 32) if ok else None)]
        p_off, p_on = paper.TABLE1_MEAN_MAT_BS32[label]
        rows.append(row + [f"{p_off:.3f} → {p_on:.3f}"])
    header = ["horizons"] + [f"{s.label}: {c}" for s in sets for c in ("all masked", "unmasking", "Δ")] + \
        ["paper (Qwen3-8B)"]
    write_rows(Path(out_prefix), header, rows, "Table 1 — intra-block unmasking x horizon set (MAT at bs 32)", caption,
               ["Paper: unmasking lowers mean MAT with {4,8,16,32} (6.228 → 6.197) and raises it with {8,16,24,32} "
                "(→ 6.263)." + (f" {footer}" if footer else "")])
    return rows


def write_table2(sets: list[RecordSet], out_prefix: str, caption: str, block_sizes: list[int],
                 footer: str = "") -> list[list]:
    """Table 2: MAT per training horizon (rows: one checkpoint each) x inference bs (columns) on the first set, a
    checkpoint read only at bs up to its largest horizon (``n/a`` above); then per set the paired difference
    mixed − dedicated fixed-bs checkpoint at each bs that has one (``–`` otherwise)."""
    first = sets[0].boot
    rows = [[label] + [(cell(first, r, bs) if bs <= h else "n/a") for bs in block_sizes]
            for label, r, h in TABLE2_ROWS]
    for s in sets:
        b = s.boot
        rows.append([f"mixed − dedicated ({s.label})"] +
                    [diff(b.mat("step2_mixed", bs) - b.mat(DEDICATED[bs], bs))
                     if bs in DEDICATED and b.records.has("step2_mixed", bs) and b.records.has(DEDICATED[bs], bs)
                     else "–" for bs in block_sizes])
    header = ["training horizon"] + [f"bs {bs}" for bs in block_sizes]
    write_rows(Path(out_prefix), header, rows, f"Table 2 — training horizon x inference block size (MAT, "
               f"{sets[0].label})", caption + " A fixed-horizon drafter is read only at bs up to its horizon (n/a "
               "above).", ["Paper: the mixed {8,16,24,32} checkpoint is at or above a dedicated fixed-horizon model "
                           "at every bs." + (f" {footer}" if footer else "")])
    return rows


def write_fig4(sets: list[RecordSet], out_prefix: str, subtitle: str) -> dict[str, list[tuple]]:
    """Figure 4: the cumulative recipe ablation at bs 16, MAT with 95 % intervals per set (one bar series each),
    beside the paper's increments.

    Returns:
        set label -> ``[(estimate, ci_low, ci_high)]`` per step of :data:`FIG4_STEPS` (NaN where not read).
    """
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    out = {}
    width = 0.8 / max(len(sets), 1)
    colors = ("tab:blue", "tab:green", "tab:purple")
    for j, s in enumerate(sets):
        b = s.boot
        vals = [interval(b.mat(r, 16)) if b.records.has(r, 16) else (np.nan,) * 3 for _, r in FIG4_STEPS]
        out[s.label] = vals
        xs = np.arange(len(vals)) + (j - (len(sets) - 1) / 2) * width
        est = np.array([v[0] for v in vals])
        err = np.array([[v[0] - v[1] for v in vals], [v[2] - v[0] for v in vals]])
        axes[0].bar(xs, est, width=width, color=colors[j % len(colors)], yerr=np.nan_to_num(err), capsize=3,
                    label=s.label)
        for x, v, prev in zip(xs, est, np.r_[np.nan, est[:-1]]):
            if np.isfinite(v):
                axes[0].text(x, v, f"{v:.2f}" + (f"\n{v - prev:+.2f}" if np.isfinite(prev) else ""), ha="center",
                             va="bottom", fontsize=6)
    axes[0].set_xticks(range(len(FIG4_STEPS)), [lab for lab, _ in FIG4_STEPS], rotation=20, ha="right", fontsize=8)
    axes[0].set_ylabel("MAT at bs 16 (tokens / round)")
    axes[0].legend(fontsize=7, loc="lower right")
    axes[0].set_title(f"Ours: {subtitle}, 95 % CI", fontsize=9)
    inc = paper.FIGURE4_INCREMENTS
    axes[1].bar(range(len(inc)), inc, color="tab:orange")
    for i, v in enumerate(inc):
        axes[1].text(i, v, f"+{v:.3f}", ha="center", va="bottom", fontsize=8)
    axes[1].set_xticks(range(len(inc)), [lab for lab, _ in FIG4_STEPS[1:]], rotation=20, ha="right", fontsize=8)
    axes[1].set_ylabel("MAT increment")
    axes[1].set_title(f"Paper (reported): Qwen3-8B 9t9d, bs 16, +{100 * paper.FIGURE4_TOTAL_GAIN:.1f}% total",
                      fontsize=9)
    fig.suptitle("Figure 4 — cumulative recipe ablation (each step adds one factor to the previous; greedy MAT)",
                 fontsize=10)
    save(fig, out_prefix)
    plt.close(fig)
    return out


def _hist_plot(ax, records: Records, cells: list[tuple[str, str, int]], max_len: int) -> dict[str, dict[int, float]]:
    shares = {}
    width = 0.8 / max(len(cells), 1)
    for i, (label, drafter, bs) in enumerate(cells):
        h = records.hist.get((drafter, bs))
        if not h:
            continue
        n = sum(h.values())
        shares[label] = {x: h.get(x, 0) / n for x in range(1, max_len + 1)}
        early = sum(v for x, v in shares[label].items() if x <= EARLY_MAX)
        xs = np.arange(1, max_len + 1) + (i - (len(cells) - 1) / 2) * width
        ax.bar(xs, [100 * shares[label][x] for x in range(1, max_len + 1)], width=width,
               label=f"{label}: 1–{EARLY_MAX} tokens {100 * early:.1f}%, full block {100 * shares[label][bs]:.1f}%")
    ax.set_ylabel("share of decoding rounds (%)")
    ax.legend(fontsize=7)
    return shares


def write_fig2(sets: list[RecordSet], out_prefix: str) -> dict[str, dict]:
    """Figure 2: accept-length distribution of greedy rounds at bs 32, mixed horizons vs fixed 32, a panel per set.

    Returns:
        set label -> curve label -> ``{L: share of rounds}``.
    """
    plt = _plt()
    fig, axes = plt.subplots(1, len(sets), figsize=(5.5 * len(sets), 3.6), sharey=True, squeeze=False)
    out = {}
    for ax, s in zip(axes[0], sets):
        out[s.label] = _hist_plot(ax, s.boot.records, [("fixed 32", "step1_fixed32", 32),
                                                        ("mixed {8,16,24,32}", "step2_mixed", 32)], 32)
        ax.set_xlabel("accepted length per round at bs 32 (tokens, bonus included)")
        ax.set_title(s.label, fontsize=9)
    fig.suptitle("Figure 2 — mixed vs fixed-32 training: accept lengths of greedy decoding; paper: mixed cuts rounds "
                 "of 1–4 tokens", fontsize=9)
    save(fig, out_prefix)
    plt.close(fig)
    return out


def write_fig7(sets: list[RecordSet], out_prefix: str) -> dict[str, dict]:
    """Figure 7: accept-length distribution per training recipe at bs 16, a panel per set.

    Returns:
        set label -> step label -> ``{L: share of rounds}``.
    """
    plt = _plt()
    fig, axes = plt.subplots(len(sets), 1, figsize=(9, 3.2 * len(sets)), sharex=True, squeeze=False)
    out = {}
    for ax, s in zip(axes[:, 0], sets):
        out[s.label] = _hist_plot(ax, s.boot.records, [(lab, r, 16) for lab, r in FIG4_STEPS], 16)
        ax.set_title(s.label, fontsize=9)
    axes[-1, 0].set_xlabel("accepted length per round at bs 16 (tokens, bonus included)")
    fig.suptitle("Figure 7 — accept-length distribution per training recipe; paper: DFlash(16) accepts the full "
                 f"block in {100 * paper.DFLASH_FULL_BLOCK_SHARE_BS16:.1f}% of rounds", fontsize=9)
    save(fig, out_prefix)
    plt.close(fig)
    return out
