"""Shared helpers of the workflow tests: a copy of the project to run Snakemake in, and the Snakemake call."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def project_data_root() -> Path:
    """The data mirror this checkout's workflow reads: ``$DSCOUT_DATA_ROOT``, else config.yaml's ``data_root``
    relative to the project (the same rule as the Snakefile's)."""
    import yaml

    from dscout.data.paths import data_root

    return data_root(yaml.safe_load((ROOT / "config.yaml").read_text())["data_root"], ROOT)


DATA = project_data_root()
# The paper preset trains on Open-PerfectBlend, which a cluster reads from the hub or, offline, from datasets'
# cache; this machine has neither. Planning the paper preset here says "offline, and datasets' cache holds it":
# HF_HUB_OFFLINE=1 with a cache folder that has Open-PerfectBlend's entry where load_dataset looks for it offline
# (<cache>/mlabonne___open-perfectblend/<config>/<version>/<hash>/; tests/test_data_hub.py checks the layout
# against datasets' own lookup). The entry is empty: planning reads no rows.
PAPER_DATASETS_CACHE = ROOT / ".cache" / "paper-plan-datasets-cache"
(PAPER_DATASETS_CACHE / "mlabonne___open-perfectblend" / "default" / "0.0.0" / "plan-only").mkdir(parents=True,
                                                                                                   exist_ok=True)
# Offline, the plan check also wants every hub model of the preset in the HF hub cache (what `download_models`
# leaves there): a cache folder with a plan-only snapshot entry (refs/main + snapshots/<ref>/config.json) of each.
PAPER_HUB_CACHE = ROOT / ".cache" / "paper-plan-hub-cache"
for _repo in ("Qwen/Qwen3-8B", "AngelSlim/Qwen3-8B_eagle3", "amd/PARD2-Qwen3-8B"):
    _entry = PAPER_HUB_CACHE / ("models--" + _repo.replace("/", "--"))
    (_entry / "snapshots" / "plan-only").mkdir(parents=True, exist_ok=True)
    (_entry / "refs").mkdir(exist_ok=True)
    (_entry / "refs" / "main").write_text("plan-only")
    (_entry / "snapshots" / "plan-only" / "config.json").write_text("{}")
PAPER_DATA_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(PAPER_DATASETS_CACHE),
                  "HF_HUB_CACHE": str(PAPER_HUB_CACHE)}
PROJECT_FILES = ["Snakefile", "config.yaml", "rules", "schemas", "src", "configs", "presets", "envs", "report",
                 "profiles"]


def snakemake_env(extra: dict | None = None) -> dict:
    """The environment of a Snakemake call in a copy of the project: this checkout's data mirror (a copy lies
    elsewhere, so the project-relative default would not find it) and CPU vLLM venv, no rendezvous variables of an
    in-process training test, then ``extra``."""
    env = {**os.environ, "DSCOUT_DATA_ROOT": str(DATA), "PYTHONUNBUFFERED": "1",
           # one CPU vLLM venv for every copy of the project (the checkout's, built once by whoever needs it first)
           "DSCOUT_VLLM_ENV": str(ROOT / ".venv-vllm"), **(extra or {})}
    for var in DIST_VARS:  # an in-process training test leaves its rendezvous here; jobs must pick their own
        env.pop(var, None)
    return env


_PLAN_COPY: Path | None = None


def plan_copy() -> Path:
    """A copy of the project (made once per test process, in a temporary folder) where the suite plans, lints and
    dry-runs: never the checkout, whose ``results/`` and ``.snakemake/`` belong to the user (after README step 1
    they hold a finished run, and a plan there finds nothing to do). Tests that write into it copy it themselves."""
    global _PLAN_COPY
    if _PLAN_COPY is None:
        import tempfile

        _PLAN_COPY = copy_project(Path(tempfile.mkdtemp(prefix="dscout-plan-")))
    return _PLAN_COPY


def snakemake(*args, cwd=None, check=True, timeout=900, env=None):
    """``python -m snakemake ARGS`` in ``cwd`` (default: :func:`plan_copy`, never the checkout); raises
    AssertionError with the output tail if it fails."""
    cwd = plan_copy() if cwd is None else cwd
    r = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, capture_output=True, text=True,
                       env=snakemake_env(env), timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return r


def copy_project(dest: Path) -> Path:
    """Copy what a run needs (not results/, not the venv) into ``dest``; returns ``dest``."""
    for name in PROJECT_FILES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        elif src.exists():
            shutil.copy(src, dest / name)
    return dest


def jobs_of(dry_run_output: str) -> dict[str, int]:
    """Job counts from the 'Job stats' table of a (dry) run."""
    counts, inside = {}, False
    for line in dry_run_output.splitlines():
        if line.startswith("job ") and "count" in line:
            inside = True
            continue
        if inside:
            parts = line.split()
            if not parts or parts[0].startswith("---"):
                continue
            if parts[0] == "total":
                break
            counts[parts[0]] = int(parts[1])
    return counts


def import_guard_env(work: Path, configfiles: list[str]) -> dict[str, str]:
    """Environment variables that make each job's missing packages unimportable (see tests/import_guard).

    The mapping (CLI subcommand -> packages its rule's env lacks) is computed from the workflow's rules and pip's
    resolution of ``envs/*.yaml`` for ``configfiles``, and written to ``work/import_guard.json``.
    """
    import json

    from tests.envs import guard_mapping

    mapping = guard_mapping(["config.yaml", *configfiles], cwd=work)
    path = work / "import_guard.json"
    path.write_text(json.dumps(mapping, indent=1))
    return {"DSCOUT_IMPORT_GUARD": str(path), "PYTHONPATH": str(ROOT / "tests" / "import_guard")}


def dag_outputs(configfiles: list[str], env: dict | None = None) -> list[str]:
    """``rule<TAB>output`` of every job of the default target, sorted (``snakemake --summary`` in an empty folder).

    Every id is a hash of the stage's configuration, so equal lists mean the same jobs with the same ids.
    """
    import tempfile

    with tempfile.TemporaryDirectory() as empty:
        args = ["--summary", "-c1", "-s", str(ROOT / "Snakefile"), "-d", empty]
        args += ["--configfile", *[str(ROOT / c) for c in ["config.yaml", *configfiles]]]
        r = snakemake(*args, env=env)
    rows = [line.split("\t") for line in r.stdout.splitlines()[1:] if "\t" in line]
    return sorted(f"{row[2]}\t{row[0]}" for row in rows)


SNAPSHOTS = {"default": [], "paper": ["presets/paper.yaml"]}


if __name__ == "__main__":  # python -m tests.workflow: rewrite tests/snapshots/ after an intended change of the DAG
    (ROOT / "tests" / "snapshots").mkdir(exist_ok=True)
    for name, files in SNAPSHOTS.items():
        rows = dag_outputs(files, env=PAPER_DATA_ENV if name == "paper" else None)
        (ROOT / "tests" / "snapshots" / f"dag_{name}.tsv").write_text("\n".join(rows) + "\n")
        print(name, len(rows), "jobs outputs")


def smoke_outputs(work: Path) -> dict:
    """What another run of the smoke DAG is compared with: ``{"weights": {path: sha256}, "records": {path: [[output
    ids, accept lengths, correct], ...]}}`` for every drafter weight file and greedy benchmark record file, paths
    relative to ``work``."""
    weights = {str(w.relative_to(work)): hashlib.sha256(w.read_bytes()).hexdigest()
               for w in sorted((work / "results" / "drafters").rglob("*.safetensors"))}
    records = {}
    for f in sorted((work / "results" / "bench").rglob("*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        records[str(f.relative_to(work))] = [[r["output_ids"], r["accept_lengths"], r["correct"]] for r in rows]
    return {"weights": weights, "records": records}
