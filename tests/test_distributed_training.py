"""Multi-process drafter training through the exact command the `train_drafter` rule builds for the cluster.

With `training.num_gpus: 2` the rule launches `deepspeed --num_gpus 2 --master_port <free> src/dscout/cli.py
train ...`; on this CPU DeepSpeed's launcher starts two gloo ranks with the same command line it uses on GPUs
(`--local_rank=<r>` included). What DeepSpeed guarantees is that an update uses the mean gradient of the global
batch, whether its micro-batches come from ranks (all-reduce / world) or from gradient accumulation (loss / gas).
Our data order and per-update randomness are keyed by the micro-batch's slot in the global batch, not by the
process, so two ranks must train the same drafter as one process accumulating over two micro-steps.
"""

import json
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file

from dscout import config as dcfg
from tests.workflow import ROOT, jobs_of, snakemake

SMOKE = ["config.yaml", "presets/smoke.yaml"]
STEPS = 4


def _variant(work, name, training):
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"training": {"max_steps": STEPS, "checkpoint_every": 2, **training},
                                    "drafters": {"dscout": {"training": {"max_steps": STEPS}}}}))
    cfg = dcfg.load_config(*[work / p for p in SMOKE], path)
    did = dcfg.drafter_id(cfg, "dscout", cfg["target"]["num_layers"])
    return path, did


def _log(work, did):
    return [json.loads(l) for l in (work / "results" / "drafters" / did / "train_log.jsonl").read_text().splitlines()]


def _stopped_by_sigterm(work, did, target, args, after_step, signal_launcher):
    """Run the rule's command through Snakemake, pause the training after ``after_step`` (test hook), send a real
    SIGTERM from outside — to DeepSpeed's launcher (which forwards it to its ranks) or to the training process —
    and return the finished Snakemake call."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.workflow import snakemake_env

    paused = work / "results" / "checkpoints" / "drafters" / did / "paused.json"
    paused.unlink(missing_ok=True)
    # the pause is patched into the job's trainer from outside (tests/fault_injection, its sitecustomize)
    hook = str(ROOT / "tests" / "fault_injection")
    pythonpath = os.pathsep.join(p for p in (hook, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", target, *args], cwd=work, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=snakemake_env({"DSCOUT_TEST_PAUSE_AFTER_STEP": str(after_step),
                                               "DSCOUT_TEST_PAUSE_FILE": str(paused.resolve()),
                                               "PYTHONPATH": pythonpath}))
    deadline = time.monotonic() + 600
    while not paused.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "training ended before its pause"
        time.sleep(0.2)
    time.sleep(0.2)  # the file is written before the wait loop starts
    info = json.loads(paused.read_text())
    os.kill(info["ppid"] if signal_launcher else info["pid"], signal.SIGTERM)
    out, _ = proc.communicate(timeout=600)
    proc.stdout_text = out
    return proc


@pytest.fixture(scope="module")
def runs(smoke_run, tmp_path_factory):
    # a copy of the smoke run (copy2 keeps mtimes and .snakemake's records): its target, responses and feature
    # caches are up to date, so only the trainings below run
    work = tmp_path_factory.mktemp("ranks") / "work"
    shutil.copytree(smoke_run[0], work, symlinks=True)
    two, did2 = _variant(work, "two_ranks", {"num_gpus": 2})
    one, did1 = _variant(work, "one_rank_gas2", {"num_gpus": 0, "gradient_accumulation_steps": 2})
    assert did1 != did2
    target2 = f"results/drafters/{did2}/training_summary.json"
    target1 = f"results/drafters/{did1}/training_summary.json"
    args = ["--cores", "2", "--configfile", "presets/smoke.yaml"]  # targets go before it (it takes a list)
    # 1) two ranks, SIGTERM to the launcher after the first update (not a checkpoint step: checkpoint_every 2)
    stopped2 = _stopped_by_sigterm(work, did2, target2, [*args, str(two.name)], 0, signal_launcher=True)
    ckpt2 = sorted(p.name for p in (work / "results/checkpoints/drafters" / did2 / "checkpoints").glob("step*"))
    # 2) the same command again: resumes from the checkpoint the signal wrote
    resumed = snakemake(target2, *args, str(two.name), cwd=work)
    assert set(jobs_of(resumed.stdout + resumed.stderr)) == {"train_drafter"}, resumed.stdout[-3000:]
    # 3) one process, gradient accumulation over two micro-steps (the same global batch per update), SIGTERM to the
    #    training process after its third update, resumed; then the same run uninterrupted, from scratch
    stopped1 = _stopped_by_sigterm(work, did1, target1, [*args, str(one.name)], 2, signal_launcher=False)
    ckpt1 = sorted(p.name for p in (work / "results/checkpoints/drafters" / did1 / "checkpoints").glob("step*"))
    stopped1.job_log = (work / "results" / "logs" / "train_drafter" / f"{did1}.log").read_text()
    snakemake(target1, *args, str(one.name), cwd=work)
    interrupted = load_file(str(next((work / "results" / "drafters" / did1).glob("*.safetensors"))))
    summary1 = json.loads((work / "results" / "drafters" / did1 / "training_summary.json").read_text())
    shutil.rmtree(work / "results" / "drafters" / did1)
    shutil.rmtree(work / "results" / "checkpoints" / "drafters" / did1)
    snakemake(target1, *args, str(one.name), cwd=work)
    return dict(work=work, did2=did2, did1=did1, stopped2=stopped2, stopped1=stopped1, ckpt1=ckpt1, ckpt2=ckpt2,
                interrupted1=interrupted, summary1=summary1)


def test_rule_launches_deepspeed_with_two_ranks(runs):
    work, did2, stopped = runs["work"], runs["did2"], runs["stopped2"]
    log = (work / "results" / "logs" / "train_drafter" / f"{did2}.log").read_text()
    assert "deepspeed.launcher.launch" in log or "--local_rank=1" in log  # the launcher started the ranks
    assert stopped.returncode != 0  # the signal failed the job ...
    # ... after both ranks saved the update in progress (step 1 is no checkpoint_every step)
    assert runs["ckpt2"] == ["step1"]


def test_two_ranks_draw_disjoint_data_and_resume(runs):
    work, did2 = runs["work"], runs["did2"]
    summary = json.loads((work / "results" / "drafters" / did2 / "training_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == STEPS
    assert summary["resumed_from_step"] == 1
    log = _log(work, did2)
    assert [r["step"] for r in log] == list(range(STEPS))
    for rec in log:
        r0, r1 = rec["sample_ids_per_rank"]
        assert len(r0) == len(r1) == 1 and not set(r0) & set(r1)


def test_each_rank_places_its_tensors_on_its_local_rank(runs):
    """What each rank resolved (dscout.models.placement): DeepSpeed's launcher gave the ranks LOCAL_RANK 0 and 1;
    on this CPU (target.device auto) both use the CPU for target, drafter, optimizer state and batches
    (tests/test_placement.py checks that the same rule gives cuda:0 / cuda:1 for a cuda config)."""
    work, did2 = runs["work"], runs["did2"]
    summary = json.loads((work / "results" / "drafters" / did2 / "training_summary.json").read_text())
    assert summary["placement"] == [
        {"rank": r, "local_rank": r, "device": "cpu", "drafter": ["cpu"], "optimizer_state": ["cpu"]} for r in (0, 1)]


def test_every_rank_trains_the_same_horizon_in_an_update(runs):
    """B is drawn once per update from a generator every rank shares: both ranks (and both micro-steps of the one
    process) use the same B in every update, and the mixed recipe still draws different B across updates."""
    work, did2, did1 = runs["work"], runs["did2"], runs["did1"]
    log2, log1 = _log(work, did2), _log(work, did1)
    per_update = []
    for a, b in zip(log2, log1):
        assert len(a["block_size_per_slot"]) == 2 and len(set(a["block_size_per_slot"])) == 1, a
        assert a["block_size_per_slot"] == b["block_size_per_slot"]
        per_update.append(a["block_size_per_slot"][0])
    assert set(per_update) <= {8, 16, 24, 32} and len(set(per_update)) > 1, per_update


def test_sigterm_saves_the_current_step_and_the_rerun_ends_identical(runs):
    """SIGTERM to the training process (SLURM's preemption / time-limit signal) writes a checkpoint at the update
    in progress and exits non-zero; the rerun resumes there and ends with the weights of an uninterrupted run."""
    work, did1 = runs["work"], runs["did1"]
    stopped = runs["stopped1"]
    assert stopped.returncode != 0
    assert "training stopped by SIGTERM after step 3: checkpoint step3 saved" in stopped.job_log
    assert runs["ckpt1"] == ["step3"]  # not a checkpoint_every (2) step: saved because of the signal
    assert runs["summary1"]["resumed_from_step"] == 3 and runs["summary1"]["steps"] == STEPS
    fresh = json.loads((work / "results" / "drafters" / did1 / "training_summary.json").read_text())
    assert fresh["resumed_from_step"] == 0
    again = load_file(str(next((work / "results" / "drafters" / did1).glob("*.safetensors"))))
    assert again.keys() == runs["interrupted1"].keys()
    for k in again:
        assert torch.equal(again[k], runs["interrupted1"][k]), k


def test_two_ranks_equal_one_process_accumulating_two_micro_steps(runs):
    work, did2, did1 = runs["work"], runs["did2"], runs["did1"]
    log2, log1 = _log(work, did2), _log(work, did1)
    assert [r["sample_ids"] for r in log2] == [r["sample_ids"] for r in log1]  # same global batches
    for a, b in zip(log2, log1):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
    # the weights file: model.safetensors (DFlash format) or dscout_drafter.safetensors (a reduced draft vocabulary)
    w2 = load_file(str(next((work / "results" / "drafters" / did2).glob("*.safetensors"))))
    w1 = load_file(str(next((work / "results" / "drafters" / did1).glob("*.safetensors"))))
    assert w2.keys() == w1.keys()
    for k in w2:  # bitwise: gradients of 2 slots averaged by the all-reduce (/ 2) or by accumulation (loss / 2)
        assert torch.equal(w2[k], w1[k]), (k, (w2[k] - w1[k]).abs().max())


def test_cli_accepts_the_launchers_local_rank_argument():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "src" / "dscout" / "cli.py"), "--local_rank=1", "train", "-h"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
