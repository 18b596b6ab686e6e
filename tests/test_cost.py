"""The bill (dscout.cost), the cluster resources (dscout.resources), hub models offline (dscout.data.models).

The smoke preset's bill is checked against numbers computed by hand from the cost model's formulas (module
docstring of dscout.cost) and its named constants; the paper preset's plan check refuses the old offline feature
cache of the depth search (35 taps of all 1.4M responses) on disk, and a job that cannot resume past its runtime.
"""

import json

import pytest
import yaml

from dscout import config as dcfg
from dscout import cost, resources
from tests.workflow import PAPER_DATA_ENV, ROOT, jobs_of, snakemake


def _cfg(*presets, patch=None):
    merged = yaml.safe_load((ROOT / "config.yaml").read_text())
    for p in presets:
        merged = dcfg.deep_merge(merged, yaml.safe_load((ROOT / "presets" / p).read_text()))
    return dcfg.validate_config(dcfg.deep_merge(merged, patch or {}))


def _row(b, rule, note_start=""):
    rows = [r for r in b.rows if r.rule == rule and r.note.startswith(note_start)]
    assert len(rows) == 1, [(r.rule, r.note) for r in b.rows]
    return rows[0]


def test_smoke_bill_matches_hand_computed_numbers():
    b = cost.bill(_cfg("smoke.yaml"), ROOT)
    assert b.device == "cpu"  # smoke: target.device auto -> the CPU constants
    c = {k: v for k, (v, _) in b.constants.items()}
    assert (c["peak_flops"], c["generate_mfu"], c["train_mfu"], c["accuracy_mfu"]) == (1.9e11, 0.33, 0.38, 0.092)
    assert (c["ar_seconds_per_token"], c["spec_seconds_per_token"]) == (0.38, 0.19)
    # tiny-random:4:32 = 4 layers, D 64, I 128, 2 heads, 1 KV head, head dim 32, vocab 49152:
    # a layer = 64*32*(2*2 + 2*1) + 3*64*128 = 12,288 + 24,576 = 36,864; matmuls = 4*36,864 + 49,152*64 = 3,293,184
    shape = cost.target_shape(_cfg("smoke.yaml"), ROOT)
    assert shape.layer_params == 36_864 and shape.matmul_params == 3_293_184
    # 12 responses of 128 + 0.25*40 = 138 tokens (below max_length 192)
    gen = _row(b, "generate_responses")
    assert gen.flops == pytest.approx(2 * 3_293_184 * 12 * 138)          # 10,907,025,408
    assert gen.wall_seconds == pytest.approx(10_907_025_408 / (1.9e11 * 0.33))
    assert gen.disk_bytes == pytest.approx(12 * 10 * 7)                   # 10 response tokens each, 7 B per token
    # DScout drafter: 1 layer, 2 taps, draft vocab 8192 (config.yaml's levers), 6 steps of 1 sequence,
    # 8 anchors x horizon 32 = 256 positions: 6*36,864*256 + 4*(8192*64)*256 + 6*(2*64*64)*138 per sequence
    per_seq = 6 * 36_864 * 256 + 4 * 524_288 * 256 + 6 * 8_192 * 138    # 600,276,992
    dscout = _row(b, "train_drafter", "dscout")
    assert dscout.flops == pytest.approx(6 * per_seq)
    assert dscout.wall_seconds == pytest.approx(6 * per_seq / (1.9e11 * 0.38))
    assert dscout.disk_bytes == pytest.approx((36_864 + 8_192) * (16 + 4))  # float32: 16 B/param state + weights
    # one cache per distinct tap set; a token of the 2-tap cache: (2 + 1) * 64 * 2 bytes (float16) + 9
    feats = [r for r in b.rows if r.rule == "target_features"]
    two = [r for r in feats if r.note.startswith("2 taps")]
    assert len(feats) == 3 and two and two[0].disk_bytes == pytest.approx(12 * 138 * 393)
    # benchmarks: 1 prompt x 12 tokens x bench_fill 0.5 (MT-Bench: two turns), AR + 7 methods; one job per repeat
    gsm = _row(b, "benchmark", "gsm8k")
    assert gsm.jobs == 2 and gsm.wall_seconds == pytest.approx(6 * (0.38 + 7 * 0.19)) == gsm.repeat_seconds
    assert _row(b, "benchmark", "mt_bench").wall_seconds == pytest.approx(12 * (0.38 + 7 * 0.19))
    # accuracy: one job per benchmark, 3 prompts of 128 + 0.5*8 tokens, lm-eval's greedy AR batches
    acc = [r for r in b.rows if r.rule == "accuracy"]
    assert [r.note for r in acc] == ["gsm8k", "humaneval"]
    assert acc[0].flops == pytest.approx(2 * 3_293_184 * 3 * 132) and acc[0].resumable == "yes"
    assert acc[0].wall_seconds == pytest.approx(acc[0].flops / (1.9e11 * 0.092))
    assert b.gpu_hours == 0 and not cost.problems(b)  # a CPU run: no GPU, no runtime limit
    assert "| **total** | 23 |" in cost.render(b)  # 1 + 1 + 4 drafters + 3 caches + 6 benchmarks x 2 repeats + 2


def test_the_online_columns_warm_up_batches_are_billed_on_the_batched_backend():
    # the CPU default's Table 4 job: AR, DFlash(16), DScout at 4 bs = 6 billed batches (the online column is inside
    # the calibrated constant); each of its serving.online_warmup batches adds one more
    cold = _row(cost.bill(_cfg(patch={"serving": {"online_warmup": 0}}), ROOT), "serving_benchmark", "c = 8")
    warm = _row(cost.bill(_cfg(patch={"serving": {"online_warmup": 2}}), ROOT), "serving_benchmark", "c = 8")
    assert warm.wall_seconds == pytest.approx(cold.wall_seconds * 8 / 6)


def test_constants_are_overridable_and_unknown_ones_are_errors():
    base = cost.bill(_cfg("smoke.yaml"), ROOT)
    faster = cost.bill(_cfg("smoke.yaml", patch={"cluster": {"throughput": {"train_mfu": 0.76}}}), ROOT)
    assert _row(faster, "train_drafter", "dscout").wall_seconds == pytest.approx(
        _row(base, "train_drafter", "dscout").wall_seconds / 2)
    assert faster.constants["train_mfu"] == (0.76, "config: cluster.throughput")
    with pytest.raises(ValueError, match="cluster.throughput.mfu: not a constant"):
        cost.bill(_cfg("smoke.yaml", patch={"cluster": {"throughput": {"mfu": 0.4}}}), ROOT)


def test_paper_bill_plans_and_the_old_depth_cache_is_refused(monkeypatch):
    for var, value in PAPER_DATA_ENV.items():  # offline, Open-PerfectBlend and the models in the plan caches
        monkeypatch.setenv(var, value)
    paper = _cfg("paper.yaml")
    b = cost.bill(paper, ROOT)
    assert {r.rule for r in b.rows} >= {"train_drafter", "depth_candidate", "benchmark", "serving_benchmark"}
    assert "target_features" not in {r.rule for r in b.rows} and not cost.problems(b)
    assert len([r for r in b.rows if r.rule == "depth_candidate"]) == 9  # up to one job per candidate
    # the old depth search read an offline cache of the whole response set: 1,420,909 responses of
    # min(3072, 128 + 0.25 * 4096) = 1152 tokens, each (35 + 1) * 4096 * 2 + 9 = 294,921 bytes (~295 KB)
    old = _cfg("paper.yaml", patch={"features": {"mode": "cache"}})
    cache = _row(cost.bill(old, ROOT), "target_features", "35 taps")
    assert cache.disk_bytes == pytest.approx(1_420_909 * 1152 * 294_921)  # ~483 TB
    dcfg.check_plan(paper, "paper", project_dir=ROOT)  # the preset itself plans
    with pytest.raises(ValueError, match=r"cost: target_features \(35 taps, 295 KB per token\): writes an estimated "
                                         r"482,752 GB, above cluster.disk_budget_gb = 2000"):
        dcfg.check_plan(old, "paper + features.mode cache", project_dir=ROOT)


def test_a_job_that_cannot_resume_past_its_runtime_is_refused():
    # one GPU instead of 8: the response regeneration takes 8x longer, past its 24 h request, and cannot resume
    one = _cfg("paper.yaml", patch={"training": {"num_gpus": 1}})
    gen = _row(cost.bill(one, ROOT), "generate_responses")
    assert gen.resumable == "no" and gen.wall_seconds > 1440 * 60
    problems = cost.problems(cost.bill(one, ROOT))
    assert any(p.startswith("generate_responses") and "exceeds its runtime request of 1440 min and the job "
               "cannot resume" in p for p in problems)
    # the trainings are as long past theirs, but resume from their checkpoints: not refused
    assert not any(p.startswith("train_drafter") for p in problems)


def test_job_resources_imports_nodes_and_profile_agree():
    paper = _cfg("paper.yaml")
    imp = resources.job_resources(paper, "train_drafter", imported=True)
    assert imp["gpu"] == 0 and imp["mem_mb"] <= 32000 and "nodes" not in imp
    trained = resources.job_resources(paper, "train_drafter")
    assert trained["gpu"] == 8 and trained["nodes"] == 1 and trained["runtime"] == 2880
    assert resources.job_resources(paper, "depth_candidate")["nodes"] == 1
    assert resources.job_resources(paper, "benchmark") == {"runtime": 480, "cpus_per_task": 16, "gpu": 1}
    assert resources.job_resources(paper, "train_drafter", cluster=False) == {"gpu": 8}
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "profile.yaml").read_text())
    for rule, res in profile["set-resources"].items():  # the bill reads the same requests as the profile sets
        for key, value in res.items():
            assert resources.CLUSTER_RESOURCES[rule][key] == value, (rule, key)
    assert "--signal=TERM@600" in profile["default-resources"]["slurm_extra"]


_JOB_RESOURCES = """
import json
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings, StorageSettings
with SnakemakeApi(OutputSettings()) as api:  # a cluster executor's planning: no total core count, 64 jobs
    wf = api.workflow(snakefile=Path("Snakefile"), resource_settings=ResourceSettings(cores=None, nodes=64),
                      config_settings=ConfigSettings(configfiles=[Path("presets/paper.yaml")]),
                      storage_settings=StorageSettings(), workdir=Path("."))
    dag = wf.dag(dag_settings=DAGSettings())
    dag.execute_workflow(executor="dryrun")
    jobs = [{"rule": j.rule.name, "wildcards": dict(j.wildcards),
             "resources": {k: v for k, v in j.resources.items() if not k.startswith("_")}}
            for j in dag.workflow_api._workflow.dag.jobs]
    print("JOBS" + json.dumps(jobs, default=str))
    from snakemake.shell import shell
    print("PREFIX" + shell._process_prefix)  # what every job's shell command starts with
"""


def test_paper_plan_asks_each_job_for_resources_that_fit(tmp_path):
    """The resources each planned job of the paper preset gets on a cluster executor (Snakemake's own evaluation
    of the rules' callables): imports with no GPU and 32 GB, multi-GPU jobs on one node, no feature cache."""
    import subprocess
    import sys

    from tests.workflow import plan_copy, snakemake_env

    script = tmp_path / "job_resources.py"
    script.write_text(_JOB_RESOURCES)
    r = subprocess.run([sys.executable, str(script)], cwd=plan_copy(), capture_output=True, text=True,
                       env=snakemake_env(PAPER_DATA_ENV), timeout=600)
    line = next((l for l in r.stdout.splitlines() if l.startswith("JOBS")), None)
    assert line, r.stdout[-3000:] + r.stderr[-3000:]
    jobs = json.loads(line[4:])
    by_rule = {}
    for j in jobs:
        by_rule.setdefault(j["rule"], []).append(j)
    assert "target_features" not in by_rule and len(by_rule["depth_candidate"]) == 1
    imports = [j["resources"] for j in by_rule["train_drafter"] if "pretrained" in j["wildcards"]["did"]]
    trained = [j["resources"] for j in by_rule["train_drafter"] if "pretrained" not in j["wildcards"]["did"]]
    assert len(imports) == 2 and all(r["gpu"] == 0 and r["mem_mb"] == 32000 and r["runtime"] == 60 for r in imports)
    assert len(trained) == 10 and all(r["gpu"] == 8 and r["nodes"] == 1 and r["runtime"] == 2880 for r in trained)
    cand = by_rule["depth_candidate"][0]
    assert cand["wildcards"]["d"] == "1" and cand["resources"]["gpu"] == 8 and cand["resources"]["nodes"] == 1
    assert by_rule["generate_responses"][0]["resources"]["nodes"] == 1
    assert by_rule["prepare_target"][0]["resources"]["gpu"] == 0
    # the hub models are downloaded once by a localrule; every job then runs with the hub offline
    assert len(by_rule["download_models"]) == 1
    prefix = next(l for l in r.stdout.splitlines() if l.startswith("PREFIX"))
    assert "export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1" in prefix


def test_paper_preset_plans_with_the_slurm_profile_and_its_resources():
    r = snakemake("-n", "--configfile", "presets/paper.yaml", "--profile", "profiles/slurm", "--sdm", "env-modules",
                  env=PAPER_DATA_ENV)
    jobs = jobs_of(r.stdout)
    assert "target_features" not in jobs and jobs["depth_candidate"] == 1 and jobs["download_models"] == 1


def test_offline_plan_names_the_job_and_the_missing_model(tmp_path, monkeypatch):
    from dscout.data.models import hub_models, model_cached, offline_model_problems

    paper = _cfg("paper.yaml")
    assert set(hub_models(paper)) == {"Qwen/Qwen3-8B", "AngelSlim/Qwen3-8B_eagle3", "amd/PARD2-Qwen3-8B"}
    assert hub_models(_cfg("smoke.yaml")) == {}  # tiny-random, trained drafters: nothing to download
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    problems = offline_model_problems(paper)
    assert len(problems) == 3
    assert any("hub model amd/PARD2-Qwen3-8B: the jobs of train_drafter (drafter 'pard2') load it" in p
               and "snakemake --cores 1 download_models" in p for p in problems)
    entry = tmp_path / "models--amd--PARD2-Qwen3-8B"
    (entry / "snapshots" / "abc").mkdir(parents=True)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("abc")
    assert not model_cached("amd/PARD2-Qwen3-8B")  # no config.json in the snapshot yet
    (entry / "snapshots" / "abc" / "config.json").write_text("{}")
    assert model_cached("amd/PARD2-Qwen3-8B") and len(offline_model_problems(paper)) == 2
    with pytest.raises(ValueError, match="hub model Qwen/Qwen3-8B: the jobs of prepare_target"):
        dcfg.check_plan(paper, "paper", project_dir=ROOT)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert offline_model_problems(paper) == []


def test_download_models_snapshots_every_hub_model_once(tmp_path, monkeypatch):
    """The download job: one snapshot per hub model; datasets with a mirror file are not fetched."""
    import huggingface_hub

    from dscout.data.models import download, download_plan
    from tests.workflow import DATA

    plan = download_plan(_cfg("paper.yaml"))
    assert plan["models"] == ["AngelSlim/Qwen3-8B_eagle3", "Qwen/Qwen3-8B", "amd/PARD2-Qwen3-8B"]
    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo: calls.append(repo) or f"/cache/{repo}")
    plan["sources"] = []  # Open-PerfectBlend has no mirror file here (the hub copy would be loaded)
    rec = download(plan, tmp_path / "download.json", DATA)
    assert calls == plan["models"] and rec["datasets"] == []  # every benchmark is in this machine's mirror
    assert json.loads((tmp_path / "download.json").read_text())["models"]["Qwen/Qwen3-8B"] == "/cache/Qwen/Qwen3-8B"
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo: (_ for _ in ()).throw(OSError("offline")))
    with pytest.raises(RuntimeError, match="download_models: snapshot of hub model AngelSlim/Qwen3-8B_eagle3 failed"):
        download(plan, tmp_path / "again.json", DATA)


def test_paper_plan_downloads_the_models_before_the_first_job():
    r = snakemake("-n", "-p", "--configfile", "presets/paper.yaml", env=PAPER_DATA_ENV)
    out = r.stdout
    assert 0 <= out.index("Snapshotting the hub models") < out.index("Preparing target")
    # the download itself runs online (the variables the jobs export are overridden for its command)
    assert "HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0 python src/dscout/cli.py download-models" in out


def test_readme_bill_is_the_paper_presets_bill():
    """README "The bill" shows what `dscout plan-cost` prints for the paper preset (regenerate it with
    `python src/dscout/cli.py plan-cost --configfile config.yaml presets/paper.yaml` after a change of the model)."""
    table = cost.render(cost.bill(_cfg("paper.yaml"), ROOT)).split("\n\n")[0].strip()
    readme = (ROOT / "README.md").read_text()
    assert "### The bill" in readme and table in readme
