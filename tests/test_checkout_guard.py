"""The guard that keeps the suite out of a user's run outputs (tests/conftest.py compares the checkout's
results/ and .snakemake/ before and after the whole suite)."""

from tests import checkout_guard
from tests.workflow import ROOT, plan_copy


def test_snapshot_sees_every_kind_of_change(tmp_path):
    (tmp_path / "results" / "a").mkdir(parents=True)
    (tmp_path / "results" / "a" / "x.jsonl").write_text("1\n")
    (tmp_path / "results" / "y.json").write_text("{}")
    (tmp_path / ".snakemake").mkdir()
    (tmp_path / ".snakemake" / "log").write_text("run")
    (tmp_path / "elsewhere.txt").write_text("not guarded")
    before = checkout_guard.snapshot(tmp_path)
    assert set(before) == {"results/a/x.jsonl", "results/y.json", ".snakemake/log"}
    (tmp_path / "elsewhere.txt").write_text("changed, but outside the guarded folders")
    assert checkout_guard.differences(before, checkout_guard.snapshot(tmp_path)) == []
    (tmp_path / "results" / "a" / "x.jsonl").write_text("2\n")  # same size, other bytes
    (tmp_path / "results" / "y.json").unlink()
    (tmp_path / ".snakemake" / "lock").write_text("")
    assert checkout_guard.differences(before, checkout_guard.snapshot(tmp_path)) == [
        "added   .snakemake/lock", "removed results/y.json", "changed results/a/x.jsonl"]


def test_planning_happens_in_a_copy_not_the_checkout():
    copy = plan_copy()
    assert copy != ROOT and not copy.is_relative_to(ROOT)
    assert (copy / "Snakefile").read_text() == (ROOT / "Snakefile").read_text()
