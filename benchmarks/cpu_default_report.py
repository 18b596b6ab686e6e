"""The CPU default end to end: a finished run's wall time, per-rule job times, and Tables 3 and 4.

Question: what does README step 1's main job (`snakemake --cores all` on the CPU default) take from an empty
``results/``, and what do its Tables 3 and 4 read? Reads a project folder where the run finished: the Snakemake log
of the run (``.snakemake/log/``: its file name is the start, its last write the end), ``results/timings/<rule>/``
(Snakemake's per-job benchmark files) and ``results/tables/table{3,4}.md``; writes
``reports/cpu_default_run/report.md``. Reads files only; runs in seconds. The run itself must have had the machine
to itself for its times to mean anything.

    python benchmarks/cpu_default_report.py --project PATH [--log .snakemake/log/<file>] [--command "..."]
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bill_calibration import measured_seconds  # noqa: E402


def run_window(log: Path) -> tuple[datetime.datetime, float]:
    """``(start, wall seconds)`` of the Snakemake run whose log is ``log`` (named ``<ISO start>.snakemake.log``).

    Raises:
        ValueError: when the file name does not start with Snakemake's timestamp.
    """
    m = re.match(r"(\d{4}-\d{2}-\d{2}T\d{6})", log.name)
    if not m:
        raise ValueError(f"{log}: not a Snakemake log (expected <YYYY-MM-DDTHHMMSS...>.snakemake.log)")
    start = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H%M%S")
    end = datetime.datetime.fromtimestamp(log.stat().st_mtime)  # the log's names are local time, as is mtime
    return start, (end - start).total_seconds()


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", required=True, help="a folder where the CPU default finished")
    ap.add_argument("--log", help="the run's Snakemake log (default: the newest under .snakemake/log/)")
    ap.add_argument("--command", default="snakemake --cores all",
                    help="the command the run was (for the header)")
    ap.add_argument("--note", default="", help="one paragraph on how the run was made (printed under the header)")
    ap.add_argument("--out", default=str(ROOT / "reports" / "cpu_default_run" / "report.md"))
    a = ap.parse_args(argv)
    from dscout.provenance import report_header

    project = Path(a.project).resolve()
    logs = sorted((project / ".snakemake" / "log").glob("*.snakemake.log"))
    log = Path(a.log) if a.log else (logs[-1] if logs else None)
    if log is None:
        raise SystemExit(f"{project}/.snakemake/log/: no Snakemake log (did the run happen there?)")
    text = log.read_text(errors="replace")
    if "steps (100%) done" not in text:
        raise SystemExit(f"{log}: the run did not finish (no '100% done' line)")
    start, wall = run_window(log)
    jobs = re.search(r"(\d+) of \1 steps \(100%\) done", text)
    per_rule = measured_seconds(project)
    lines = report_header("The CPU default, measured end to end", a.command, wall,
                          host_note="(the run's host)", cwd=project)
    lines += [f"Run started {start:%Y-%m-%d %H:%M} (host clock) in a fresh clone, from an empty `results/`; "
              f"{jobs.group(1) if jobs else '?'} jobs. Per-job times are Snakemake's `benchmark:` files "
              "(`results/timings/`); with `--cores all` on 2 cores two jobs often overlap, so a rule's job times add "
              "up to more than its share of the wall time.", ""]
    if a.note:
        lines += [a.note, ""]
    lines += ["## Job times per rule", "", "| rule | jobs | total (s) | mean (s) | largest (s) |",
              "|---|---:|---:|---:|---:|"]
    for rule, xs in sorted(per_rule.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| {rule} | {len(xs)} | {sum(xs):,.0f} | {sum(xs) / len(xs):,.1f} | {max(xs):,.1f} |")
    lines.append(f"| all | {sum(len(x) for x in per_rule.values())} | "
                 f"{sum(sum(x) for x in per_rule.values()):,.0f} | | |")
    for name, title in (("table3", "Table 3"), ("table4", "Table 4")):
        f = project / "results" / "tables" / f"{name}.md"
        if f.exists():
            body = f.read_text().strip().splitlines()
            if body and body[0].startswith("#"):
                body = body[1:]
            body = ["#" + l if l.startswith("#") else l for l in body]  # its sections under this one
            lines += ["", f"## {title} of this run", "", *body]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(out)
    return out


if __name__ == "__main__":
    main()
