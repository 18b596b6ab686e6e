"""Table 4: serving at concurrency c (AR, DFlash(16), DScout(16), DScout(32), DScout(best)), from raw records."""

from __future__ import annotations

import csv
from pathlib import Path

from . import paper
from .aggregate import load_records


def table4_rows(records: list[dict]) -> list[dict]:
    """One row per concurrency: throughput of AR, speedups, the selected bs and the gain of selection.

    DScout(best) = the DScout bs with the highest measured throughput at that c; the gain of selection is
    ``G_best / G_DScout(16) - 1``.
    """
    from ..batched.serving import throughput_table

    rows = []
    for c, m in throughput_table(records).items():
        dscout = {k: v for k, v in m.items() if v["kind"] == "dscout"}
        best_key = max(dscout, key=lambda k: dscout[k]["throughput"]) if dscout else None
        fixed16 = next((v for v in dscout.values() if v["block_size"] == 16), None)
        row = {"concurrency": c, "ar_tokens_per_s": m["ar"]["throughput"]}
        for label, bs, kind in (("dflash16", 16, "dflash"), ("dscout16", 16, "dscout"), ("dscout32", 32, "dscout")):
            v = next((v for v in m.values() if v["kind"] == kind and v["block_size"] == bs), None)
            row[f"{label}_speedup"] = v["speedup"] if v else None
            row[f"{label}_mat"] = v["mat"] if v else None
        row["best_bs"] = dscout[best_key]["block_size"] if best_key else None
        row["best_speedup"] = dscout[best_key]["speedup"] if best_key else None
        row["best_mat"] = dscout[best_key]["mat"] if best_key else None
        row["selection_gain"] = (dscout[best_key]["throughput"] / fixed16["throughput"] - 1
                                 if best_key and fixed16 else None)
        rows.append(row)
    return rows


def _f(x, fmt="{:.2f}"):
    return "–" if x is None else fmt.format(x)


def write_table4(record_paths, out_prefix: str, stage: dict) -> list[dict]:
    """``<prefix>.md``, ``.csv`` (concurrency is a column) and ``.tex``."""
    rows = table4_rows(load_records(record_paths))
    prefix = Path(out_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(prefix.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    head = ["c", "AR (tok/s)", "DFlash(16)", "DScout(16)", "DScout(32)", "DScout(best)", "best bs",
            "gain of selection"]
    cells = [[str(r["concurrency"]), _f(r["ar_tokens_per_s"], "{:.1f}"),
              f"{_f(r['dflash16_speedup'])}× τ{_f(r['dflash16_mat'])}",
              f"{_f(r['dscout16_speedup'])}× τ{_f(r['dscout16_mat'])}",
              f"{_f(r['dscout32_speedup'])}× τ{_f(r['dscout32_mat'])}",
              f"{_f(r['best_speedup'])}× τ{_f(r['best_mat'])}", str(r["best_bs"]),
              _f(None if r["selection_gain"] is None else 100 * r["selection_gain"], "{:+.1f}%")] for r in rows]
    caption = (f"Measured on {stage.get('target', 'the target')} (CPU, batched engine: the c requests of each level "
               f"decoded together, greedy, {stage.get('max_new_tokens', '?')} new tokens each, prompts pooled from "
               f"{', '.join(stage.get('benchmarks', []))}). Speedup = method throughput / AR throughput at the same "
               "c; DScout(best) picks bs per c from the measured throughput; computed from results/serving/ records.")
    md = ["# Table 4 — serving throughput at concurrency c", "", caption, "",
          "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(c) + " |" for c in cells]
    md += ["", f"Paper (reported, SGLang on H200): DScout(best) speedups {paper.TABLE4['DScout(best) range'][0]}–"
               f"{paper.TABLE4['DScout(best) range'][1]}×, above DFlash in every setting; configuration selection adds up "
               f"to +{100 * paper.TABLE4['selection gain over DScout(16)']:.2f}% over fixed DScout(16)."]
    prefix.with_suffix(".md").write_text("\n".join(md) + "\n")
    tex = ["\\begin{table}[t]", "\\centering", "\\begin{tabular}{l" + "c" * (len(head) - 1) + "}", "\\toprule",
           " & ".join(head).replace("%", "\\%") + " \\\\", "\\midrule"]
    tex += [" & ".join(c).replace("×", "$\\times$").replace("τ", "$\\tau$").replace("%", "\\%") + " \\\\"
            for c in cells]
    tex += ["\\bottomrule", "\\end{tabular}", f"\\caption{{{caption}}}", "\\label{tab:table4}", "\\end{table}"]
    prefix.with_suffix(".tex").write_text("\n".join(tex) + "\n")
    return rows
