"""Tables rendered from :func:`dscout.analysis.aggregate.summarize` rows: Markdown, CSV and LaTeX.

Each table shows our measured numbers and, in a separate clearly labelled block, what the paper reports
(:mod:`dscout.analysis.paper`), since our CPU target and the paper's GPU targets differ.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from . import paper
from ..jsonl import read_jsonl
from .aggregate import load_records, per_run, summarize

BENCH_LABELS = {"gsm8k": "GSM8K", "math500": "MATH-500", "humaneval": "HumanEval", "mbpp": "MBPP",
                "livecodebench": "LCB", "mt_bench": "MT-Bench", "average": "Avg"}
CSV_FIELDS = ["benchmark", "method_name", "runtime", "method", "method_key", "drafter", "block_size", "temperature",
              "concurrency", "speedup_mean", "speedup_std", "mat_mean", "mat_std", "tpot_ms_mean", "tpot_ms_std",
              "accuracy", "repeats", "n_records", "mismatches", "near_ties"]


def _fmt(mean, std, suffix=""):
    if mean is None:
        return "–"
    return f"{mean:.2f}±{std:.2f}{suffix}" if std else f"{mean:.2f}{suffix}"


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def _method_order(rows):
    """Our engine's rows first, then each server runtime's; within a runtime its AR first."""
    first = {}
    for r in rows:
        first.setdefault(r["method_key"], r)
    return sorted(first, key=lambda k: (first[k].get("runtime", "transformers") != "transformers",
                                        first[k].get("runtime", ""), first[k]["method"] != "ar", k))


RUNTIME_LABELS = {"vllm": "vLLM", "sglang": "SGLang"}
"""Runtimes named in a row's label (our engine's rows, ``transformers``, carry none)."""


def row_label(rows: list[dict], key: str) -> str:
    """A method key's row label: its name, plus the runtime it ran on when that is a server (``AR · vLLM``)."""
    first = next(r for r in rows if r["method_key"] == key)
    runtime = RUNTIME_LABELS.get(first.get("runtime"))
    if not runtime:
        return first["method_name"]
    name = "AR" if first["method"] == "ar" else first["method_name"]
    return name if runtime in name else f"{name} · {runtime}"


def markdown_grid(rows: list[dict], benches: list[str], cell) -> list[str]:
    """A method x benchmark Markdown grid; ``cell(row)`` formats one entry."""
    head = "| Method | " + " | ".join(BENCH_LABELS.get(b, b) for b in benches) + " |"
    lines = [head, "|" + "---|" * (len(benches) + 1)]
    idx = {(r["method_key"], r["benchmark"]): r for r in rows}
    for k in _method_order(rows):
        name = row_label(rows, k)
        cells = [cell(idx[(k, b)]) if (k, b) in idx else "–" for b in benches]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def latex_grid(rows: list[dict], benches: list[str], cell, caption: str, label: str) -> str:
    idx = {(r["method_key"], r["benchmark"]): r for r in rows}
    out = ["\\begin{table}[t]", "\\centering", "\\small",
           "\\begin{tabular}{l" + "c" * len(benches) + "}", "\\toprule",
           "Method & " + " & ".join(BENCH_LABELS.get(b, b) for b in benches) + " \\\\", "\\midrule"]
    for k in _method_order(rows):
        name = row_label(rows, k)
        cells = [cell(idx[(k, b)]).replace("±", "$\\pm$").replace("×", "$\\times$").replace("τ", "$\\tau$")
                 if (k, b) in idx else "--" for b in benches]
        out.append(name + " & " + " & ".join(cells) + " \\\\")
    out += ["\\bottomrule", "\\end{tabular}", f"\\caption{{{caption}}}", f"\\label{{{label}}}", "\\end{table}"]
    return "\n".join(out) + "\n"


def table3_cell(r: dict) -> str:
    if r["method"] == "ar":
        return f"1.00× ({r['tpot_ms_mean']:.0f} ms)"
    spread = r.get("mat_prompt_std")
    tau = f"τ{r['mat_mean']:.2f}" + (f" (±{spread:.2f})" if spread is not None and spread == spread else "") \
        if r["mat_mean"] is not None else "τ–"
    return f"{_fmt(r['speedup_mean'], r['speedup_std'], '×')} {tau}"


def summarize_accuracy(paths) -> list[dict]:
    """Per benchmark: ``{benchmark, n, accuracy, finished, median_tokens}`` from the accuracy jobs' JSONL files.

    ``finished`` is the share of answers that ended with a stop token (not cut by the token budget).
    """
    out = []
    for p in paths:
        rows = read_jsonl(p)
        if not rows:
            continue
        toks = sorted(r["new_tokens"] for r in rows)
        out.append({"benchmark": rows[0]["benchmark"], "n": len(rows),
                    "accuracy": sum(bool(r["correct"]) for r in rows) / len(rows),
                    "finished": sum(r["finish_reason"] == "stop" for r in rows) / len(rows),
                    "median_tokens": toks[len(toks) // 2]})
    return out


def accuracy_lines(sub: list[dict], temperature: float) -> list[str]:
    """Markdown: task accuracy per method on the timed prompts and, at T=0, the check that it equals AR's."""
    acc = [r for r in sub if r["accuracy"] is not None and r["benchmark"] != "average"]
    if not acc:
        return []
    benches = [b for b in BENCH_LABELS if any(r["benchmark"] == b for r in acc)]
    lines = [f"Task accuracy on the timed prompts (lm-eval metrics; {', '.join(BENCH_LABELS[b] for b in benches)}):",
             "", "| Method | " + " | ".join(BENCH_LABELS[b] for b in benches) + " |",
             "|---|" + "---|" * len(benches)]
    idx = {(r["method_key"], r["benchmark"]): r for r in acc}
    for k in _method_order(acc):
        name = next(r["method_name"] for r in acc if r["method_key"] == k)
        lines.append(f"| {name} | " + " | ".join(f"{100 * idx[(k, b)]['accuracy']:.0f}%" if (k, b) in idx else "–"
                                                 for b in benches) + " |")
    if temperature == 0:
        ar = {r["benchmark"]: r["accuracy"] for r in acc if r["method"] == "ar"}
        diff = [f"{r['method_name']} on {BENCH_LABELS[r['benchmark']]}" for r in acc
                if r["method"] != "ar" and r["benchmark"] in ar and abs(r["accuracy"] - ar[r["benchmark"]]) > 1e-9]
        lines += ["", "Every method's accuracy equals AR's (greedy outputs are identical): "
                  + ("**yes**." if not diff else "**no** — " + ", ".join(diff) + ".")]
    return lines + [""]


def online_lines(sub: list[dict], records: list[dict], temperature: float) -> list[str]:
    """Markdown: each online-controller row against the fixed-bs rows of the same drafter, per benchmark.

    The oracle is the fixed bs with the best measured speedup on that benchmark, picked after the fact; the
    controller's goal (docs/online_controller.md) is to be within 3% of it and above bs 16. Also: the mean bs the
    controller chose and its overhead per round (decisions + feedback, microseconds).
    """
    online = [r for r in sub if r["block_size"] == "online"]
    if not online:
        return []
    lines = []
    for key in dict.fromkeys(r["method_key"] for r in online):
        rows = {r["benchmark"]: r for r in sorted(online, key=lambda r: list(BENCH_LABELS).index(r["benchmark"])
                                                   if r["benchmark"] in BENCH_LABELS else len(BENCH_LABELS))
                if r["method_key"] == key}
        name, drafter = next(iter(rows.values()))["method_name"], next(iter(rows.values()))["drafter"]
        recs = [r for r in records if r["method_key"] == key and r["temperature"] == temperature]
        rounds = [b for r in recs for b in r.get("round_block_sizes") or []]
        overhead = sum(r.get("controller_seconds") or 0.0 for r in recs)
        lines += [f"{name} against the fixed block sizes of the same drafter (oracle = the best fixed bs per "
                  "benchmark, picked after the fact):", "",
                  "| Benchmark | online | mean bs chosen | oracle (bs) | online / oracle | bs 16 | online / bs 16 |",
                  "|---|---|---|---|---|---|---|"]
        within, above = [], []
        for b, r in rows.items():
            fixed = [x for x in sub if x["benchmark"] == b and x["drafter"] == drafter  # on the same runtime
                     and isinstance(x["block_size"], int) and x.get("runtime") == r.get("runtime")]
            best = max(fixed, key=lambda x: x["speedup_mean"] or 0.0) if fixed else None
            b16 = next((x for x in fixed if x["block_size"] == 16), None)
            chosen = [c for x in recs if b in (x["benchmark"], "average") for c in x.get("round_block_sizes") or []]
            ratio = r["speedup_mean"] / best["speedup_mean"] if best and best["speedup_mean"] else None
            ratio16 = r["speedup_mean"] / b16["speedup_mean"] if b16 and b16["speedup_mean"] else None
            if b != "average":
                within.append(ratio is not None and ratio >= 0.97)
                above.append(ratio16 is not None and ratio16 > 1.0)
            lines.append(f"| {BENCH_LABELS.get(b, b)} | {r['speedup_mean']:.2f}× τ{r['mat_mean']:.2f} | "
                         f"{sum(chosen) / max(len(chosen), 1):.1f} | "
                         + (f"{best['speedup_mean']:.2f}× ({best['block_size']})" if best else "–") + " | "
                         + (f"{100 * (ratio - 1):+.1f}%" if ratio is not None else "–") + " | "
                         + (f"{b16['speedup_mean']:.2f}×" if b16 else "–") + " | "
                         + (f"{100 * (ratio16 - 1):+.1f}%" if ratio16 is not None else "–") + " |")
        lines += ["", f"Within 3% of the oracle on every benchmark: **{'yes' if within and all(within) else 'no'}** "
                      f"({sum(within)}/{len(within)}); above bs 16 everywhere: "
                      f"**{'yes' if above and all(above) else 'no'}** ({sum(above)}/{len(above)}). Controller "
                      f"overhead: {1e6 * overhead / max(len(rounds), 1):.0f} µs per round over {len(rounds)} rounds.",
                  ""]
    return lines


def write_table3(record_paths, out_prefix: str, stage: dict, accuracy_paths=()) -> list[dict]:
    """``<prefix>.md``, ``.csv``, ``.tex`` and ``.json`` of Table 3 from the raw records.

    Args:
        record_paths: JSONL files or folders of benchmark records.
        out_prefix: e.g. ``results/tables/table3``.
        stage: ``{"target": ..., "repeats": ..., "num_prompts": ..., "max_new_tokens": ..., "runtime": ...}``
            for the caption.
    """
    records = load_records(record_paths)
    rows = summarize(records)
    prefix = Path(out_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    write_csv(rows, prefix.with_suffix(".csv"))
    temps = sorted({r["temperature"] for r in rows})
    benches = [b for b in BENCH_LABELS if any(r["benchmark"] == b for r in rows)]
    target = stage.get("target", "target")
    lines = ["# Table 3 — speedup over AR and mean accepted tokens (τ)", "",
             f"Measured here: target **{target}** ({stage.get('runtime', 'transformers, CPU')}), "
             f"concurrency 1, mean ± std over {stage.get('repeats', '?')} repeats; prompts per benchmark: "
             f"{stage.get('num_prompts', '?')}; max new tokens per turn: {stage.get('max_new_tokens', '?')}"
             + (f" (temperatures above 0: {stage['sampled_max_new_tokens']})"
                if stage.get("sampled_max_new_tokens") is not None else "") + ". "
             "Speedup = AR TPOT / method TPOT, paired with the AR run of the same repeat on the method's own "
             "runtime (rows marked vLLM / SGLang were served by that runtime, beside its own AR) (± its std over "
             "repeats); τ = mean accepted tokens per round, (± its std over the cell's requests: the spread "
             "across prompts). Every number is computed from the raw records in `results/bench/` (our engine) and "
             "`results/bench_server/` (server rows). AR cells show its TPOT.", ""]
    tex = []
    for t in temps:
        sub = [r for r in rows if r["temperature"] == t and r["concurrency"] == 1]
        lines += [f"## Temperature {t:g}", ""] + markdown_grid(sub, benches, table3_cell) + [""]
        ours = [r for r in sub if r["benchmark"] == "average" and r.get("runtime", "transformers") == "transformers"]
        served = [r for r in sub if r["benchmark"] == "average" and r.get("runtime", "transformers") != "transformers"]
        mism = sum(r["mismatches"] for r in ours)
        ties = sum(r["near_ties"] for r in ours)
        toks = [v["new_tokens"] for (b, k, tt, c, rep), v in per_run(records).items() if tt == t and c == 1]
        if toks:
            lines += [f"Decoded tokens per (benchmark, method, repeat): min {min(toks)}, median "
                      f"{sorted(toks)[len(toks) // 2]}.", ""]
        if t == 0:
            lines += [f"Greedy outputs differing from AR: **{mism}** (bugs) + {ties} at a floating-point "
                      f"near-tie (top-2 logit gap < ε = {stage.get('near_tie_epsilon', '?')}).", ""]
            for runtime in sorted({r["runtime"] for r in served}):
                n = sum(r["mismatches"] for r in served if r["runtime"] == runtime)
                lines += [f"{RUNTIME_LABELS.get(runtime, runtime)} rows: greedy outputs differing from "
                          f"{RUNTIME_LABELS.get(runtime, runtime)}'s own AR: **{n}** (a server returns no logits, so "
                          "near-ties are not told apart there).", ""]
        lines += online_lines(sub, records, t)
        lines += accuracy_lines(sub, t)
        tex.append(latex_grid(sub, benches, table3_cell,
                              f"Speedup over AR and $\\tau$ on {target}, temperature {t:g} (measured).",
                              f"tab:table3-t{t:g}"))
    target_acc = summarize_accuracy(accuracy_paths)
    if target_acc:
        lines += ["## Task accuracy of the target (greedy AR, larger sample)", "",
                  "Every lossless method's accuracy at temperature 0 (its outputs are AR's). lm-eval metrics: GSM8K "
                  "exact match (flexible-extract), MATH-500 math_verify, HumanEval / MBPP pass@1.", "",
                  "| Benchmark | prompts | accuracy | answers finished | median answer tokens |", "|---|---|---|---|---|"]
        lines += [f"| {BENCH_LABELS.get(r['benchmark'], r['benchmark'])} | {r['n']} | {100 * r['accuracy']:.1f}% | "
                  f"{100 * r['finished']:.0f}% | {r['median_tokens']} |" for r in target_acc]
        lines += ["", f"Answer budget: {stage.get('accuracy_max_new_tokens', '?')} new tokens; an unfinished answer "
                  "was cut by it.", ""]
    lines += ["## Paper (reported, not measured here)", "",
              "Six-benchmark average, temperature 0, concurrency 1, SGLang on GPUs (docs/method.md §7):", "",
              "| Target | DScout(32) | DFlash(16) | EAGLE-3(60) | PARD-2 |", "|---|---|---|---|---|"]
    for tgt, m in paper.TABLE3.items():
        cells = []
        for k in ("DScout(32)", "DFlash(16)", "EAGLE-3(60)", "PARD-2"):
            s, mat = m[k]
            cells.append(f"{s:.2f}×" + (f" (τ {mat:.2f})" if mat else ""))
        lines.append(f"| {tgt} | " + " | ".join(cells) + " |")
    lines += ["", "Per task on Qwen3-8B: GSM8K DScout 5.65× / τ 10.08 vs DFlash 5.01× / 8.19; MT-Bench DScout(16) "
              "2.40× / 3.89 vs DFlash 2.36× / 3.71. Temperature 1: DScout 3.12× vs DFlash 3.02×.", ""]
    prefix.with_suffix(".md").write_text("\n".join(lines))
    prefix.with_suffix(".tex").write_text("\n".join(tex))
    prefix.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    return rows
