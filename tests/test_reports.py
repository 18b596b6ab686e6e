"""Measurements live in reports/, each with its provenance header, indexed; benchmark scripts write them through
one function and are indexed too."""

from __future__ import annotations

import re

from dscout.provenance import report_header
from tests.workflow import ROOT

FIELDS = ("date", "commit", "host CPU", "command", "wall time")


def header_problems(text: str) -> list[str]:
    """What a report's opening lacks: a ``# title`` first, then the five provenance fields within its first lines."""
    lines = text.splitlines()
    problems = [] if lines and lines[0].startswith("# ") else ["no '# title' on the first line"]
    head = lines[1:10]
    for field in FIELDS:
        if not any(re.match(rf"- {re.escape(field)}: \S", line) for line in head):
            problems.append(f"no '- {field}:' line in the header")
    return problems


def test_the_header_writer_passes_the_check_and_the_check_can_fail():
    lines = report_header("A study", "python benchmarks/x.py --y", 12.3)
    assert header_problems("\n".join(lines)) == []
    assert "- wall time: 12 s" in lines
    assert header_problems("# A study\n\nsome numbers\n") == [f"no '- {f}:' line in the header" for f in FIELDS]


def test_every_report_opens_with_its_provenance():
    reports = sorted(p for p in (ROOT / "reports").rglob("*.md") if p.name != "README.md" or p.parent.name != "reports")
    assert len(reports) >= 15
    bad = {str(p.relative_to(ROOT)): header_problems(p.read_text()) for p in reports}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_reports_index_lists_every_study_folder():
    index = (ROOT / "reports" / "README.md").read_text()
    studies = sorted(p.name for p in (ROOT / "reports").iterdir() if p.is_dir())
    missing = [s for s in studies if f"]({s}/report.md)" not in index]
    assert missing == [], f"reports/README.md does not link: {missing}"
    for s in studies:
        assert (ROOT / "reports" / s / "report.md").exists(), f"reports/{s}/ has no report.md"


def test_report_writing_scripts_use_the_one_header_writer_and_are_indexed():
    index = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert [s.name for s in scripts if s.name not in index] == []
    writers = [s for s in scripts if re.search(r"reports[/\"' ,]+", s.read_text()) and "report.md" in s.read_text()]
    assert len(writers) >= 8
    assert [s.name for s in writers if "report_header" not in s.read_text()] == []
