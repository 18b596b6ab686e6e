"""Benchmark and prompt data through ``datasets.load_dataset``: mirror, hub (a local dataset repository built here,
loaded by the very call that reads the hub), ``fetch-data`` writing a mirror, and the offline message."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset

from dscout.config import check_plan, load_config
from dscout.data.benchmarks import benchmark_rows, get_benchmark, load_benchmark
from dscout.data.hub import DataUnavailable, hub_reachable, load_mirror_rows
from dscout.data.prompts import load_training_prompts
from tests.workflow import DATA, copy_project, snakemake

ROOT = Path(__file__).resolve().parents[1]


def _mirror_rows(rel: str, n: int) -> list[dict]:
    return load_mirror_rows(DATA / rel)[:n]


def _hub_repository(base: Path, repo: str, configs: dict[str, dict[str, list[dict]]]) -> None:
    """A dataset repository laid out as on the hub: parquet files per (config, split) and a README declaring them."""
    lines = ["---", "configs:"]
    for config, splits in configs.items():
        lines += [f"- config_name: {config}", "  data_files:"]
        for split, rows in splits.items():
            rel = f"{config}/{split}-00000-of-00001.parquet"
            (base / repo / config).mkdir(parents=True, exist_ok=True)
            Dataset.from_list(rows).to_parquet(str(base / repo / rel))
            lines += [f"  - split: {split}", f"    path: {rel}"]
    (base / repo / "README.md").write_text("\n".join(lines + ["---", f"# {repo} (test copy)", ""]))


@pytest.fixture
def hub_dir(tmp_path, monkeypatch):
    """Local copies of three hub datasets under the working directory, named by their hub ids."""
    gsm_test = _mirror_rows("gsm8k/test.jsonl", 12)
    gsm_train = _mirror_rows("gsm8k/train.jsonl", 7)
    _hub_repository(tmp_path, "openai/gsm8k", {"main": {"test": gsm_test, "train": gsm_train}})
    # MT-Bench's hub copy names FastChat's fields differently (prompt / prompt_id)
    mt = [{"prompt": r["turns"], "prompt_id": r["question_id"], "category": r["category"],
           "reference": r.get("reference") or []} for r in _mirror_rows("mt_bench/question.jsonl", 6)]
    _hub_repository(tmp_path, "HuggingFaceH4/mt_bench_prompts", {"default": {"train": mt}})
    # LiveCodeBench is read by release files (test.jsonl ... test5.jsonl) that carry test cases we drop
    lcb = _mirror_rows("livecodebench/codegen_release_v5_880problems_from_submissions_O1-Mini-2024-09-12_N1.json", 10)
    repo = tmp_path / "livecodebench" / "code_generation_lite"
    repo.mkdir(parents=True)
    fields = ("question_title", "question_content", "platform", "question_id", "contest_id", "contest_date",
              "starter_code", "difficulty")
    for i, name in enumerate(["test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl"]):
        with open(repo / name, "w") as f:
            for r in lcb[2 * i:2 * i + 2]:
                f.write(json.dumps({**{k: r[k] for k in fields}, "public_test_cases": "[]",
                                    "private_test_cases": "eJw=", "metadata": "{}"}, default=str) + "\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_without_a_mirror_benchmarks_load_from_their_hub_copy(hub_dir):
    """No mirror file: load_dataset('openai/gsm8k', 'main', split='test') reads the (local) hub repository."""
    no_mirror = hub_dir / "no-mirror"
    rows, origin = benchmark_rows("gsm8k", no_mirror)
    assert origin.startswith("hub:openai/gsm8k") and rows == _mirror_rows("gsm8k/test.jsonl", 12)
    via_hub = load_benchmark("gsm8k", no_mirror, 5, seed=3)
    first_twelve = {q.prompt_id: q for q in load_benchmark("gsm8k", DATA, None)
                    if int(q.prompt_id.split("-")[1]) < 12}  # the repository holds the mirror's first 12 rows
    assert len(via_hub) == 5 and all(first_twelve[p.prompt_id] == p for p in via_hub)
    mt = load_benchmark("mt_bench", no_mirror, None)
    assert len(mt) == 6 and all(len(p.turns) == 2 for p in mt)  # hub fields mapped onto FastChat's
    assert {p.prompt_id for p in mt} == {f"mt-{r['question_id']}" for r in _mirror_rows("mt_bench/question.jsonl", 6)}
    lcb = load_benchmark("livecodebench", no_mirror, None)
    assert len(lcb) == 10


def test_fetch_data_writes_a_mirror_that_reads_back_the_same_prompts(hub_dir):
    """`dscout fetch-data` (the CLI the fetch_data rule runs) writes mirror files; reading them gives the hub's prompts."""
    mirror = hub_dir / "mirror"
    cmd = [sys.executable, str(ROOT / "src" / "dscout" / "cli.py"), "fetch-data", "--out", str(mirror),
           "--benchmarks", "gsm8k", "mt_bench", "livecodebench", "--sources", "gsm8k_train"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    for rel in ("gsm8k/test.jsonl", "gsm8k/train.jsonl", "mt_bench/question.jsonl",
                "livecodebench/codegen_release_v5_880problems_from_submissions_O1-Mini-2024-09-12_N1.json"):
        assert (mirror / rel).is_file(), rel
    assert not list(mirror.rglob("*.part"))  # written atomically
    no_mirror = hub_dir / "no-mirror"
    for name in ("gsm8k", "mt_bench", "livecodebench"):
        assert load_benchmark(name, mirror, None) == load_benchmark(name, no_mirror, None), name
        assert benchmark_rows(name, mirror)[1] == str(mirror / get_benchmark(name).local_file)
    assert (load_training_prompts(mirror, [{"name": "gsm8k_train", "count": -1}])
            == load_training_prompts(no_mirror, [{"name": "gsm8k_train", "count": -1}]))
    # a second fetch keeps what exists (an interrupted fetch resumes)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "0 mirror files written" in r.stdout


def test_offline_without_a_mirror_says_how_to_fetch(tmp_path, monkeypatch):
    """No mirror, hub unreachable: a fast, explicit error at load time and at plan time (config alone)."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert not hub_reachable()
    with pytest.raises(DataUnavailable, match=r"gsm8k/test.jsonl.*openai/gsm8k.*dscout fetch-data"):
        load_benchmark("gsm8k", tmp_path / "empty")
    monkeypatch.setenv("DSCOUT_DATA_ROOT", str(tmp_path / "empty"))
    cfg = load_config(ROOT / "config.yaml")
    with pytest.raises(ValueError, match=r"data_root: 9 source\(s\) have no mirror file.*fetch_data"):
        check_plan(cfg, "config.yaml")


def test_fetch_data_target_writes_the_mirror_a_config_needs(hub_dir):
    """`snakemake fetch_data` (the login-node target) fetches exactly the files the config reads into data_root."""
    copy_project(hub_dir)
    (hub_dir / "small.yaml").write_text(
        "benchmarks: {names: [gsm8k, mt_bench]}\n"
        "responses: {sources: [{name: gsm8k_train, count: 4}]}\n"
        "study: {enabled: false}\ndepth_search: {enabled: false}\nserving: {enabled: false}\n"
        "accuracy: {enabled: false}\n")
    mirror = hub_dir / "fetched"
    snakemake("fetch_data", "--cores", "1", "--configfile", "config.yaml", "small.yaml", cwd=hub_dir,
              env={"DSCOUT_DATA_ROOT": str(mirror)})
    got = sorted(str(p.relative_to(mirror)) for p in mirror.rglob("*") if p.is_file())
    assert got == ["gsm8k/test.jsonl", "gsm8k/train.jsonl", "mt_bench/question.jsonl"]
    assert load_benchmark("mt_bench", mirror, None) == load_benchmark("mt_bench", hub_dir / "no-mirror", None)
    r = snakemake("fetch_data", "-n", "--configfile", "config.yaml", "small.yaml", cwd=hub_dir,
                  env={"DSCOUT_DATA_ROOT": str(mirror)})
    assert "Nothing to be done" in r.stdout + r.stderr


def test_offline_plan_check_reads_datasets_cache(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1 (cluster compute nodes): a source without a mirror file must be in datasets' cache, where
    load_dataset looks offline; the check refuses, naming the files and the cache, when it is not. The cache layout
    is checked against datasets' own offline lookup (CachedDatasetModuleFactory)."""
    from datasets.load import CachedDatasetModuleFactory

    from dscout.data.benchmarks import BENCHMARKS
    from dscout.data.hub import offline_cached

    cache = tmp_path / "datasets-cache"
    cache.mkdir()
    monkeypatch.setenv("DSCOUT_DATA_ROOT", str(tmp_path / "no-mirror"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    cfg = load_config(ROOT / "config.yaml")
    with pytest.raises(ValueError, match=rf"HF_HUB_OFFLINE is set and datasets' cache \({cache}\) holds no copy "
                                         r".*benchmark gsm8k \(openai/gsm8k.*needs .*gsm8k/test.jsonl"):
        check_plan(cfg, "config.yaml")
    gsm8k = BENCHMARKS["gsm8k"].hub
    with pytest.raises(FileNotFoundError):
        CachedDatasetModuleFactory(gsm8k.path, cache_dir=str(cache)).get_module()
    assert not offline_cached(gsm8k, cache)
    # what `load_dataset(...)` leaves in the cache: <namespace>___<name>/<config>/<version>/<hash>/
    (cache / "openai___gsm8k" / "main" / "0.0.0" / "a1b2c3").mkdir(parents=True)
    CachedDatasetModuleFactory(gsm8k.path, cache_dir=str(cache)).get_module()  # datasets finds it offline ...
    assert offline_cached(gsm8k, cache)  # ... and so does the plan check
    assert not offline_cached(type(gsm8k)(gsm8k.path, "socratic", "test"), cache)  # another config is not there
    with pytest.raises(ValueError) as err:
        check_plan(cfg, "config.yaml")
    assert "gsm8k/test.jsonl" not in str(err.value) and "math500" in str(err.value)


def test_no_mirror_and_a_reachable_hub_plans(tmp_path, monkeypatch):
    """Without a mirror, a machine that reaches the hub plans (the sources load from their hub copies): the hub is
    simulated by a listening socket on loopback, which is all the plan check's probe opens."""
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        monkeypatch.setenv("DSCOUT_DATA_ROOT", str(tmp_path / "no-mirror"))
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
            monkeypatch.delenv(var, raising=False)
        assert hub_reachable()
        check_plan(load_config(ROOT / "config.yaml"), "config.yaml")  # raises on any problem
    assert not hub_reachable()  # the same config without the hub stops, naming the files
    with pytest.raises(ValueError, match=r"the hub cannot be reached .*gsm8k/test.jsonl"):
        check_plan(load_config(ROOT / "config.yaml"), "config.yaml")
