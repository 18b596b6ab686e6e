"""The SLURM profile for real: the smoke preset submitted through `profiles/slurm` to a one-node SLURM.

`scripts/local_slurm.sh` installs (Debian packages) and starts munged, slurmctld and slurmd on this machine; the
workflow then runs with `--profile profiles/slurm`, the local partition and account given through the profile's
documented command-line override (nothing in the profile is edited). One drafter-training job is cancelled with
`scancel` while it runs: the profile's retries resubmit it and the run completes without redoing finished work.
The outputs must equal the local smoke run's (same drafter weights, same records). The daemons are stopped by
the process ids the script recorded.

This machine has no conda, so `--sdm env-modules` stands in for the profile's `conda` (the envs themselves are
checked by tests/test_envs.py). Accounting is off on the test cluster, so job states come from squeue
(`--slurm-status-command squeue`; MinJobAge keeps finished jobs visible).
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from tests.workflow import DATA, DIST_VARS, ROOT, copy_project, jobs_of, smoke_outputs

SCRIPT = ROOT / "scripts" / "local_slurm.sh"


def _profile_overrides() -> list[str]:
    """Command-line values that replace the profile's cluster-specific ones (the README's documented override)."""
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "profile.yaml").read_text())
    small = ["mem_mb=1000", "cpus_per_task=1", "runtime=60"]
    # the rules' own cluster requests (src/dscout/resources.py) are cut down the same way
    from dscout.resources import CLUSTER_RESOURCES

    rules = dict.fromkeys([*profile["set-resources"], *(r for r in CLUSTER_RESOURCES if r != "import_drafter")])
    return ["--default-resources", "slurm_partition=local", "slurm_account=local", *small,
            "--set-resources", *[f"{rule}:{kv}" for rule in rules for kv in small]]


@pytest.fixture(scope="module")
def local_slurm(tmp_path_factory):
    if os.geteuid() != 0 and not shutil.which("slurmctld"):
        pytest.skip("a local SLURM needs root to install and start (scripts/local_slurm.sh)")
    subprocess.run([str(SCRIPT), "install"], check=True, capture_output=True, timeout=900)
    state = tmp_path_factory.mktemp("slurm")
    r = subprocess.run([str(SCRIPT), "start", str(state)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr + "".join(p.read_text() for p in state.glob("*.log"))
    yield state
    subprocess.run([str(SCRIPT), "stop", str(state)], check=True, timeout=120)
    for name in ("slurmd", "slurmctld", "munged"):
        assert not (state / f"{name}.pid").exists()


def _squeue() -> list[tuple[str, str, str]]:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%T|%k"], capture_output=True, text=True).stdout
    return [tuple(line.split("|", 2)) for line in out.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def slurm_run(local_slurm, tmp_path_factory):
    work = copy_project(tmp_path_factory.mktemp("slurm_smoke"))
    args = [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", "--configfile", "presets/smoke.yaml",
            "--sdm", "env-modules", *_profile_overrides(), "--slurm-status-command", "squeue",
            "--slurm-init-seconds-before-status-checks", "5", "--latency-wait", "5"]
    env = {**os.environ, "DSCOUT_DATA_ROOT": str(DATA), "PYTHONUNBUFFERED": "1"}
    for var in ("SLURM_CONF", *DIST_VARS):
        env.pop(var, None)
    log = open(work / "snakemake.out", "w")
    proc = subprocess.Popen(args, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    cancelled, finished_before = None, {}
    deadline = time.time() + 1500
    try:
        while proc.poll() is None and time.time() < deadline:
            if cancelled is None:
                running = [j for j, state, comment in _squeue()
                           if state == "RUNNING" and comment.startswith("rule_train_drafter")]
                # a drafter starts as soon as the cache of its own taps exists, and Snakemake touches a job's
                # outputs when it registers the job as finished: cancel once it has registered every cache
                text = (work / "snakemake.out").read_text()
                caches = jobs_of(text).get("target_features", 0)
                if running and caches and text.count("(Rule: target_features)") >= caches:
                    finished_before = {p: p.stat().st_mtime for stage in ("target", "responses", "features")
                                       for p in (work / "results" / stage).rglob("*") if p.is_file()}
                    subprocess.run(["scancel", running[0]], check=True)
                    cancelled = running[0]
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    out = (work / "snakemake.out").read_text()
    return work, proc.returncode, out, cancelled, finished_before


def test_smoke_preset_completes_through_the_slurm_profile(slurm_run):
    work, rc, out, _, _ = slurm_run
    assert rc == 0, out[-5000:]
    submitted = out.count("has been submitted with SLURM jobid")
    assert submitted >= 12  # every non-local rule went through sbatch (table3/fig2/table4 are localrules)
    assert (work / "results" / "tables" / "table3.md").exists()


def test_cancelled_job_is_retried_without_redoing_finished_work(slurm_run):
    work, rc, out, cancelled, finished_before = slurm_run
    assert cancelled is not None, "no train_drafter job was seen running"
    assert rc == 0 and "Trying to restart job" in out
    assert finished_before  # target, responses and features were done when the job was cancelled
    for path, mtime in finished_before.items():
        assert path.stat().st_mtime == mtime, f"{path} was rewritten after the cancel"


def test_slurm_outputs_equal_the_local_smoke_run(slurm_run, local_smoke_outputs):
    work, rc, out, _, _ = slurm_run
    assert rc == 0, out[-3000:]
    mine = smoke_outputs(work)
    assert mine["weights"] and len(mine["records"]) >= 60
    for path, digest in mine["weights"].items():
        assert digest == local_smoke_outputs["weights"].get(path), path
    for path, rows in mine["records"].items():
        assert rows == local_smoke_outputs["records"].get(path), path


def test_deepspeed_launcher_runs_two_ranks_inside_a_slurm_allocation(slurm_run, tmp_path):
    """`training.num_gpus: 2`: the job asks SLURM for 2 GPUs (device-less GRES slots here) and one task; inside
    the allocation the rule's `deepspeed --num_gpus 2` launcher starts both ranks (gloo on this CPU)."""
    from dscout import config as dcfg

    work, rc, _, _, _ = slurm_run
    assert rc == 0
    extra = work / "two_ranks.yaml"
    extra.write_text(yaml.safe_dump({"training": {"num_gpus": 2},
                                     "drafters": {"dscout": {"training": {"max_steps": 4}}}}))
    cfg = dcfg.load_config(work / "config.yaml", work / "presets" / "smoke.yaml", extra)
    did = dcfg.drafter_id(cfg, "dscout", cfg["target"]["num_layers"])
    overrides = _profile_overrides()
    overrides[overrides.index("--set-resources") + 1:] = ["train_drafter:cpus_per_task=2",
                                                          "train_drafter:mem_mb=2000", "train_drafter:runtime=60"]
    env = {**os.environ, "DSCOUT_DATA_ROOT": str(DATA)}
    for var in ("SLURM_CONF", *DIST_VARS):
        env.pop(var, None)
    r = subprocess.run([sys.executable, "-m", "snakemake", f"results/drafters/{did}/training_summary.json",
                        "--profile", "profiles/slurm", "--configfile", "presets/smoke.yaml", str(extra),
                        "--sdm", "env-modules", *overrides, "--slurm-status-command", "squeue",
                        "--slurm-init-seconds-before-status-checks", "5", "--latency-wait", "5"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    import re

    jobid = re.findall(r"submitted with SLURM jobid (\d+)", out)[-1]
    job = subprocess.run(["scontrol", "show", "job", jobid], capture_output=True, text=True).stdout
    assert "TresPerJob=gres:gpu:2" in job, job  # the job asked SLURM for 2 GPUs (sbatch --gpus=2)
    summary = json.loads((work / "results" / "drafters" / did / "training_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4
    log = (work / "results" / "logs" / "train_drafter" / f"{did}.log").read_text()
    assert "--local_rank=1" in log
