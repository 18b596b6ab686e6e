"""The report scripts that read a finished run (benchmarks/cpu_default_report.py, bill_calibration.py) on a
made-up project folder: what they read, and the errors they give when the run is not there."""

from __future__ import annotations

import datetime
import importlib.util
import os
import sys

import pytest

from tests.workflow import ROOT


def _script(name):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _timing(path, seconds):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"s\th:m:s\n{seconds}\t0:00:00\n")


def test_cpu_default_report_reads_the_run_log_timings_and_tables(tmp_path):
    report = _script("cpu_default_report")
    log = tmp_path / ".snakemake" / "log" / "2026-12-07T221019.123456.snakemake.log"
    log.parent.mkdir(parents=True)
    log.write_text("Building DAG of jobs...\n3 of 3 steps (100%) done\n")
    end = datetime.datetime(2026, 12, 7, 22, 20, 19).timestamp()  # the log's name and mtime are local time
    os.utime(log, (end, end))
    timings = tmp_path / "results" / "timings"
    _timing(timings / "benchmark" / "x-gsm8k-t0-r0.tsv", 100.0)
    _timing(timings / "benchmark" / "x-gsm8k-t1-r0.tsv", 20.0)
    _timing(timings / "train_drafter" / "d.tsv", 50.0)
    (tmp_path / "results" / "tables").mkdir(parents=True)
    (tmp_path / "results" / "tables" / "table3.md").write_text("# Table 3\n\n## Temperature 0\n\n| a |\n")
    out = report.main(["--project", str(tmp_path), "--out", str(tmp_path / "r.md")])
    text = out.read_text()
    assert text.startswith("# The CPU default, measured end to end")
    assert "3 jobs" in text and "| benchmark | 1 | 100 |" in text and "| benchmark_sampled | 1 | 20 |" in text
    assert "## Table 3 of this run" in text and "### Temperature 0" in text and "Table 4" not in text
    start_dt, wall = report.run_window(log)
    assert start_dt.strftime("%Y-%m-%dT%H%M%S") == "2026-12-07T221019" and wall == pytest.approx(600)
    assert "- wall time: 600 s" in text
    log.write_text("Building DAG of jobs...\n1 of 3 steps (33%) done\n")
    with pytest.raises(SystemExit, match="did not finish"):
        report.main(["--project", str(tmp_path), "--out", str(tmp_path / "r.md")])
    with pytest.raises(ValueError, match="not a Snakemake log"):
        report.run_window(tmp_path / "results" / "tables" / "table3.md")
