"""DScout(online) against AR and the fixed block sizes, read from a Table 3 / Table 4 run's raw records.

Usage (after ``snakemake results/tables/table3.md results/tables/table4.md`` with a ``DScout(online)`` method
row and ``serving.online: true``)::

    python benchmarks/online_controller_report.py --bench results/bench/<id> --serving results/serving/<id> \
        --out reports/online_controller/run_<name>.md

The file opens with a provenance header (``dscout.provenance.report_header``: date, commit, host CPU, this command,
this script's wall time; the run's own wall time is in its records). A raw run report sits beside
``reports/online_controller/report.md``, which says what the runs found (newest first).

Per benchmark (Table 3, c = 1, T = 0) and per concurrency (Table 4): each repeat's throughput ratio to AR's in the
same repeat, reported as the median over repeats with [min, max]; the best fixed bs is the one with the highest
median; "online vs best" is the median over repeats of the online/best ratio. Per round: the bs the controller
chose (share of rounds at bs 1), its acceptance (τ), its cost split where the records carry it (``round_seconds``
of the online rounds at bs 1 against drafted rounds; controller µs per round) and the cost of a round of every
fixed bs (batch wall time / rounds). Greedy outputs are compared with AR's (mismatches must be 0).

Torch-free: it reads JSONL only.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import statistics
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from dscout.analysis.table4 import table4_rows, throughput_table  # noqa: E402
from dscout.provenance import report_header  # noqa: E402


def _load(paths):
    return [json.loads(line) for p in paths for line in open(p) if line.strip()]


def _spread(xs):
    return statistics.median(xs), min(xs), max(xs)


def _fmt(m, lo, hi):
    return f"{m:.2f} [{lo:.2f}, {hi:.2f}]"


def bench_rows(bench_dir: str) -> list[dict]:
    """Per benchmark and online row: median [min, max] over repeats of its speedup vs AR; the best fixed bs; the
    online row's choices and τ; with several online rows, each one's per-repeat ratio to the first (same job)."""
    rows = []
    for bdir in sorted(glob.glob(os.path.join(bench_dir, "*", "t0"))):
        recs = _load(glob.glob(os.path.join(bdir, "r*", "*.jsonl")))
        by = defaultdict(lambda: defaultdict(list))  # method -> repeat -> records
        names = {}
        for r in recs:
            key = r["method_key"] if r["block_size"] == "online" else "ar" if r["method"] == "ar" else \
                f"{r['method']}-bs{r['block_size']}"
            names[key] = r.get("method_name", key)
            by[key][r["repeat"]].append(r)
        online_keys = sorted((k for k in by if k.startswith("dscout-online") or k.startswith("dflash-online")),
                             key=lambda k: (len(k), k))  # the row without its own settings first
        if "ar" not in by or not online_keys:
            continue
        ar_out = {(r["prompt_id"], r.get("turn", 0), r["repeat"]): r["output_ids"] for rs in by["ar"].values()
                  for r in rs}

        def tps(rs):
            return sum(r["new_tokens"] for r in rs) / sum(r["decode_seconds"] for r in rs)

        ratio = {k: [tps(v[rep]) / tps(by["ar"][rep]) for rep in sorted(v)] for k, v in by.items()}
        fixed = [k for k in ratio if k.startswith("dscout-bs")]
        best = max(fixed, key=lambda k: statistics.median(ratio[k]))
        for key in online_keys:
            on = [r for rs in by[key].values() for r in rs]
            chosen = [b for r in on for b in r.get("round_block_sizes") or []]
            secs = [s for r in on for s in r.get("round_seconds") or []]
            at1 = [s for r in on for b, s in zip(r["round_block_sizes"], r["round_seconds"]) if b == 1]
            drafted = [s for r in on for b, s in zip(r["round_block_sizes"], r["round_seconds"]) if b > 1]
            mism = sum(r["output_ids"] != ar_out.get((r["prompt_id"], r.get("turn", 0), r["repeat"]))
                       for k in ("ar", key, best) for v in by[k].values() for r in v)
            rounds = [n for r in on for n in r["accept_lengths"]]
            vs = [o / b for o, b in zip(ratio[key], ratio[best])]
            first = online_keys[0]
            rows.append({"benchmark": os.path.basename(os.path.dirname(bdir)), "method": names[key],
                         "online": _spread(ratio[key]), "best": best, "best_speedup": _spread(ratio[best]),
                         "bs16": _spread(ratio["dscout-bs16"]) if "dscout-bs16" in ratio else None,
                         "online_vs_best": statistics.median(vs) - 1, "bs_mean": sum(chosen) / max(len(chosen), 1),
                         "bs1_share": sum(b == 1 for b in chosen) / max(len(chosen), 1),
                         "tau": sum(rounds) / max(len(rounds), 1),
                         "ms_bs1": 1e3 * statistics.median(at1) if at1 else None,
                         "ms_drafted": 1e3 * statistics.median(drafted) if drafted else None,
                         "controller_us": 1e6 * sum(r.get("controller_seconds") or 0 for r in on) / max(len(secs), 1),
                         "repeats": len(ratio[key]), "mismatches": mism,
                         "vs_first": (_spread([x / y for x, y in zip(ratio[key], ratio[first])])
                                      if key != first else None)})
    return rows


def _serving_files(serving_dir: str) -> dict[int, list[str]]:
    """Concurrency -> its record files: ``c<c>/r<k>.jsonl`` (one job per repeat) or an older run's ``c<c>.jsonl``."""
    import re

    out = defaultdict(list)
    for path in glob.glob(os.path.join(serving_dir, "c*.jsonl")) + glob.glob(os.path.join(serving_dir, "c*", "r*.jsonl")):
        m = re.search(r"/c(\d+)(?:\.jsonl|/r\d+\.jsonl)$", path)
        if m:
            out[int(m.group(1))].append(path)
    return out


def serving_breakdown(serving_dir: str) -> list[dict]:
    """Per c and method: ms per batch round (median over repeats), τ; for online the bs-1 / drafted split."""
    out = []
    for c, paths in sorted(_serving_files(serving_dir).items()):
        recs = _load(paths)
        by = defaultdict(lambda: defaultdict(list))
        for r in recs:
            by[r["method_key"]][r.get("repeat") or 0].append(r)
        for key, reps in by.items():
            per_round = [rs[0]["batch_decode_seconds"] / max(len(r["accept_lengths"]) for r in rs)
                         for rs in reps.values()]
            al = [n for rs in reps.values() for r in rs for n in r["accept_lengths"]]
            row = {"c": recs[0]["concurrency"], "method": key, "ms_per_round": 1e3 * statistics.median(per_round),
                   "tau": sum(al) / len(al)}
            if any(rs[0].get("round_block_sizes") for rs in reps.values()):
                pairs = [(b, s) for rs in reps.values() for b, s in zip(rs[0]["round_block_sizes"],
                                                                       rs[0]["round_seconds"])]
                per_rep = [[b for b in rs[0]["round_block_sizes"]] for _, rs in sorted(reps.items())]
                row.update(bs1_share=[sum(b == 1 for b in bs) / len(bs) for bs in per_rep],
                           ms_bs1=1e3 * statistics.median([s for b, s in pairs if b == 1] or [float("nan")]),
                           ms_drafted=1e3 * statistics.median([s for b, s in pairs if b > 1] or [float("nan")]),
                           controller_us=1e6 * sum(rs[0].get("controller_seconds") or 0 for rs in reps.values())
                           / len(pairs))
            out.append(row)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", help="results/bench/<id> of a Table 3 run with DScout(online)")
    ap.add_argument("--serving", help="results/serving/<id> of a Table 4 run with serving.online")
    ap.add_argument("--out", help="write the markdown here, e.g. reports/online_controller/run_<name>.md "
                    "(default: stdout only)")
    ap.add_argument("--title", default="DScout(online) against AR and the fixed block sizes: raw-record report")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    md = [f"Records: {', '.join(p for p in (a.bench, a.serving) if p)}.", ""]
    if a.bench:
        rows = bench_rows(a.bench)
        several = len({r["method"] for r in rows}) > 1
        md += ["## Table 3 (c = 1, T = 0): speedup vs AR, median [min, max] over repeats", "",
               "| benchmark | online row | speedup | best fixed bs | its speedup | DScout(16) | online vs best | "
               "mean bs | bs 1 share | τ online | ms/round bs 1 · drafted | controller µs/round | repeats | "
               "mismatches |" + (" vs the first online row (same repeat) |" if several else ""),
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if several else "")]
        for r in rows:
            md.append(f"| {r['benchmark']} | {r['method']} | {_fmt(*r['online'])} | {r['best'].split('-bs')[1]} | "
                      f"{_fmt(*r['best_speedup'])} | {_fmt(*r['bs16']) if r['bs16'] else '–'} | "
                      f"{100 * r['online_vs_best']:+.1f}% | {r['bs_mean']:.1f} | {100 * r['bs1_share']:.0f}% | "
                      f"{r['tau']:.2f} | {r['ms_bs1'] or float('nan'):.1f} · {r['ms_drafted'] or float('nan'):.1f} | "
                      f"{r['controller_us']:.0f} | {r['repeats']} | {r['mismatches']} |"
                      + ((f" {_fmt(*r['vs_first'])} |" if r["vs_first"] else " – |") if several else ""))
        md.append("")
    if a.serving:
        recs = _load([p for paths in _serving_files(a.serving).values() for p in paths])
        md += ["## Table 4 (batched engine): throughput vs AR, median [min, max] over repeats", "",
               "| c | online column · speedup | DScout(best) | best bs | online vs best | mean bs online | repeats |",
               "|---|---|---|---|---|---|---|"]
        rows4 = table4_rows(recs)
        for label in [k[: -len("_speedup")] for k in rows4[0] if k.startswith("online") and k.endswith("_speedup")]:
            for r in rows4:
                if r[f"{label}_speedup"] is None:
                    continue
                name = "DScout(online)" if label == "online" else f"DScout(online, {label[len('online_'):]})"
                md.append(f"| {r['concurrency']} | {name} "
                          f"{_fmt(r[f'{label}_speedup'], r[f'{label}_speedup_min'], r[f'{label}_speedup_max'])}"
                          f" | {_fmt(r['best_speedup'], r['best_speedup_min'], r['best_speedup_max'])} | {r['best_bs']} | "
                          f"{100 * r[f'{label}_vs_best']:+.1f}% | {r[f'{label}_bs_mean']:.1f} | {r['repeats']} |")
        table = throughput_table(recs)
        pairs = [(c, k) for c, m in table.items() for k in sorted(m) if k.startswith("dscout-online-")
                 and "dscout-online" in m]
        if pairs:  # each variant against DScout(online) in the same repeat (same job, same machine conditions)
            md += ["", "Each online variant against DScout(online), per-repeat throughput ratio, median [min, max]:", "",
                   "| c | variant | ratio |", "|---|---|---|"]
            for c, k in pairs:
                x = [a / b for a, b in zip(table[c][k]["speedups"], table[c]["dscout-online"]["speedups"])]
                md.append(f"| {c} | {k[len('dscout-online-'):]} | {_fmt(*_spread(x))} |")
        md += ["", "Per batch round (median over repeats; the online rounds split by the bs chosen):", "",
               "| c | method | ms/round | τ | online: bs 1 share per repeat | ms at bs 1 · drafted | controller µs |",
               "|---|---|---|---|---|---|---|"]
        for r in serving_breakdown(a.serving):
            extra = ("| " + " / ".join(f"{100 * x:.0f}%" for x in r["bs1_share"]) +
                     f" | {r['ms_bs1']:.1f} · {r['ms_drafted']:.1f} | {r['controller_us']:.0f} |"
                     if "bs1_share" in r else "| – | – | – |")
            md.append(f"| {r['c']} | {r['method']} | {r['ms_per_round']:.1f} | {r['tau']:.2f} {extra}")
        md.append("")
    command = "python benchmarks/online_controller_report.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    md = report_header(a.title, command, time.perf_counter() - t_start) + md
    text = "\n".join(md) + "\n"
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
