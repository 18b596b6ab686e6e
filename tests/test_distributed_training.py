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
    args = ["--cores", "2", "--configfile", "presets/smoke.yaml"]  # targets go before it (it takes a list)
    # 1) two ranks, killed after step 2 (a checkpoint was written at step 2 by both ranks)
    crashed = snakemake(target2, *args, str(two.name), cwd=work, check=False,
                        env={"DSCOUT_CRASH_AFTER_STEP": "2"})
    # 2) the same command again: resumes from that checkpoint
    resumed = snakemake(target2, *args, str(two.name), cwd=work)
    assert set(jobs_of(resumed.stdout + resumed.stderr)) == {"train_drafter"}, resumed.stdout[-3000:]
    # 3) one process, gradient accumulation over two micro-steps: the same global batch per update
    snakemake(f"results/drafters/{did1}/training_summary.json", *args, str(one.name), cwd=work)
    return work, did2, did1, crashed, resumed


def test_rule_launches_deepspeed_with_two_ranks(runs):
    work, did2, _, crashed, _ = runs
    log = (work / "results" / "logs" / "train_drafter" / f"{did2}.log").read_text()
    assert "deepspeed.launcher.launch" in log or "--local_rank=1" in log  # the launcher started the ranks
    assert crashed.returncode != 0  # the simulated kill failed the job ...
    assert (work / "results" / "checkpoints" / "drafters" / did2 / "checkpoints" / "step2").is_dir()  # ... kept


def test_two_ranks_draw_disjoint_data_and_resume(runs):
    work, did2, _, _, _ = runs
    summary = json.loads((work / "results" / "drafters" / did2 / "training_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == STEPS
    assert summary["resumed_from_step"] == 2
    log = _log(work, did2)
    assert [r["step"] for r in log] == list(range(STEPS))
    for rec in log:
        r0, r1 = rec["sample_ids_per_rank"]
        assert len(r0) == len(r1) == 1 and not set(r0) & set(r1)


def test_two_ranks_equal_one_process_accumulating_two_micro_steps(runs):
    work, did2, did1, _, _ = runs
    log2, log1 = _log(work, did2), _log(work, did1)
    assert [r["sample_ids"] for r in log2] == [r["sample_ids"] for r in log1]  # same global batches
    for a, b in zip(log2, log1):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
    # the weights file: model.safetensors (DFlash format) or dscout_drafter.safetensors (a reduced draft vocabulary)
    w2 = load_file(str(next((work / "results" / "drafters" / did2).glob("*.safetensors"))))
    w1 = load_file(str(next((work / "results" / "drafters" / did1).glob("*.safetensors"))))
    assert w2.keys() == w1.keys()
    for k in w2:
        assert (w2[k] - w1[k]).abs().max() <= 1e-5 + 1e-5 * w1[k].abs().max(), k


def test_cli_accepts_the_launchers_local_rank_argument():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "src" / "dscout" / "cli.py"), "--local_rank=1", "train", "-h"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
