"""The bill against a finished run: each rule's estimated wall time per job beside what its jobs took.

Question: how far is `dscout plan-cost`'s estimate of each rule (``src/dscout/cost.py``: FLOP counts and named
throughput constants) from the run it plans? Reads a project folder where a preset has run (its
``results/timings/<rule>/*.tsv``, Snakemake's per-job benchmark files), recomputes the bill of the same config,
and writes ``reports/bill_calibration/report.md``: per rule the jobs planned and timed, the estimate per job, the
measured mean and largest job, their ratio, and which constant the rule's estimate scales with. Reads files
only; runs in seconds.

    python benchmarks/bill_calibration.py --project PATH [--configfile presets/x.yaml ...]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SCALES_WITH = {
    "prepare_target": "host_bytes_per_second",
    "generate_responses": "generate_mfu",
    "target_features": "features_mfu",
    "train_drafter": "train_mfu",
    "benchmark": "ar_seconds_per_token, spec_seconds_per_token",
    "benchmark_sampled": "ar_seconds_per_token, spec_seconds_per_token",
    "study_benchmark": "ar_seconds_per_token, spec_seconds_per_token",
    "benchmark_vllm": "serving_seconds_per_token, vllm_startup_seconds",
    "serving_benchmark": "serving_seconds_per_token",
    "serving_vllm": "serving_seconds_per_token, vllm_startup_seconds",
    "accuracy": "accuracy_mfu",
    "depth_search": "train_mfu, spec_seconds_per_token",
}
"""The constants each rule's estimate is proportional to (``cost.bill``)."""


def measured_seconds(project: Path) -> dict[str, list[float]]:
    """``rule -> [seconds per job]`` from ``results/timings/<rule>/*.tsv`` (Snakemake's ``s`` column); the
    ``benchmark`` rule's jobs at a temperature above 0 count as the bill's ``benchmark_sampled``."""
    out: dict[str, list[float]] = defaultdict(list)
    for f in sorted((project / "results" / "timings").glob("*/*.tsv")):
        with open(f) as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        if rows and rows[0].get("s"):
            rule = f.parent.name
            if rule == "benchmark" and not f.stem.rsplit("-r", 1)[0].endswith("-t0"):
                rule = "benchmark_sampled"  # one Snakemake rule, two rows of the bill (T = 0 and T > 0)
            out[rule].append(float(rows[0]["s"]))
    return out


def estimated_seconds(config: dict, project: Path) -> dict[str, tuple[int, float]]:
    """``rule -> (jobs, mean estimated seconds per job)`` of the config's bill."""
    from dscout import cost

    b = cost.bill(config, project)
    jobs: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    for r in b.rows:
        jobs[r.rule] += r.jobs
        total[r.rule] += r.jobs * r.wall_seconds
    return {rule: (jobs[rule], total[rule] / jobs[rule]) for rule in jobs}


def rows(config: dict, project: Path) -> list[dict]:
    """One dict per rule that was planned or timed: planned/timed jobs, estimate, measured mean and max, ratio."""
    est, meas = estimated_seconds(config, project), measured_seconds(project)
    out = []
    for rule in list(est) + [r for r in meas if r not in est]:
        n, e = est.get(rule, (0, None))
        xs = meas.get(rule, [])
        mean = sum(xs) / len(xs) if xs else None
        out.append({"rule": rule, "planned": n, "timed": len(xs), "estimate_s": e, "mean_s": mean,
                    "max_s": max(xs) if xs else None,
                    "ratio": (mean / e) if mean is not None and e else None,
                    "scales_with": SCALES_WITH.get(rule, "")})
    return out


def _s(x) -> str:
    return "–" if x is None else f"{x:,.1f}"


def _ratio(x) -> str:
    return "–" if x is None else f"{x:.2f}"


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", required=True, help="a folder where the config has run (results/timings/)")
    ap.add_argument("--configfile", nargs="*", default=[], help="presets merged over config.yaml, as for the run")
    ap.add_argument("--note", default="", help="one paragraph on the run (printed under the header)")
    ap.add_argument("--out", default=str(ROOT / "reports" / "bill_calibration" / "report.md"))
    a = ap.parse_args(argv)
    t0 = time.time()
    from dscout import config as dcfg
    from dscout.provenance import report_header

    project = Path(a.project).resolve()
    config = dcfg.load_config(project / "config.yaml", *[project / f for f in a.configfile])
    table = rows(config, project)
    cmd = "python benchmarks/bill_calibration.py --project <run> " + " ".join(
        f"--configfile {f}" for f in a.configfile)
    lines = report_header("The bill against a finished run", cmd.strip(), time.time() - t0,
                          host_note="(the host of the run, if it ran here)")
    if a.note:
        lines += [a.note, ""]
    lines += ["Estimated wall time per job (`cost.bill`, the CPU constants) against the run's Snakemake "
              "benchmark files; ratio = measured mean / estimate (above 1: the bill is low). Where `cost.py` "
              "gives a constant's source as measured on the CPU default, the constant was fitted to such a run, so "
              "on the run it was fitted to its rule's ratio is near 1 by construction; the other rules check the "
              "model.", "",
              "| rule | jobs planned | jobs timed | estimate per job (s) | measured mean (s) | largest (s) | ratio | "
              "scales with |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {r['rule']} | {r['planned']} | {r['timed']} | {_s(r['estimate_s'])} | {_s(r['mean_s'])} | "
              f"{_s(r['max_s'])} | {_ratio(r['ratio'])} | {r['scales_with']} |"
              for r in table]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return out


if __name__ == "__main__":
    main()
