"""Mistakes that only the combination of config values shows stop the plan before any job, naming the key."""

import copy
import re
from pathlib import Path

import pytest
import yaml

from dscout import config as dcfg
from tests.workflow import DATA, PAPER_DATA_ENV, ROOT, copy_project, snakemake


def _base():
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    return dcfg.validate_config(dcfg.deep_merge(cfg, yaml.safe_load((ROOT / "presets" / "smoke.yaml").read_text())))


@pytest.mark.parametrize("patch, message", [
    ({"methods": [{"name": "DFlash(32)", "kind": "dflash", "drafter": "dflash", "block_size": 32}]},
     r"methods\[0\].block_size: block size 32 exceeds the largest training horizon 16 of drafter 'dflash'"),
    ({"target": {"mask_token_id": 49152}}, r"target.mask_token_id: 49152 is outside the vocabulary \[0, 49152\)"),
    ({"data_root": "/nonexistent/data"}, r"data_root: \d+ source\(s\) have no mirror file under /nonexistent/data .*dscout fetch-data"),
    ({"serving": {"enabled": True, "block_sizes": [8, 64]}},
     r"serving.block_sizes: block size 64 exceeds the largest training horizon 32 of drafter 'dscout'"),
    ({"serving": {"enabled": True, "eagle3_drafter": "eagle3"}}, r"serving.eagle3_drafter: 'eagle3' must be a published"),
    ({"depth_search": {"enabled": True, "recipe": "dflash", "block_size": 24}},
     r"depth_search.block_size: 24 exceeds the largest training horizon 16"),
    ({"methods": [{"name": "E(online)", "kind": "eagle3", "drafter": "eagle3", "block_size": "online"}]},
     r"methods\[0\].block_size: 'online' needs a block-diffusion drafter"),
    ({"serving": {"enabled": True, "online": True, "backend": "sglang"}},
     r"serving.online: the online block-size controller runs in this project's batched engine; SGLang has no"),
    ({"serving": {"enabled": True, "backend": "sglang", "online_variants": [{"name": "z1", "controller": {}}]}},
     r"serving.online_variants: the online block-size controller runs in this project's batched engine"),
])
def test_check_plan_names_the_key(patch, message, monkeypatch):
    if "data_root" in patch:
        monkeypatch.delenv("DSCOUT_DATA_ROOT", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # no hub either, even on a machine that has one
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # (offline, the check would read datasets' cache)
            monkeypatch.delenv(var, raising=False)
    cfg = dcfg.deep_merge(_base(), patch)
    with pytest.raises(ValueError, match=message):
        dcfg.check_plan(cfg)


def test_shipped_configs_pass_the_plan_checks(monkeypatch):
    for presets in ([], ["smoke.yaml"], ["smoke.yaml", "smoke_artifacts.yaml"], ["paper.yaml"]):
        cfg = dcfg.load_config(ROOT / "config.yaml", *[ROOT / "presets" / p for p in presets])
        if presets == ["paper.yaml"]:
            for k, v in PAPER_DATA_ENV.items():
                monkeypatch.setenv(k, v)
        dcfg.check_plan(cfg)  # raises on any problem


def test_missing_benchmark_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("DSCOUT_DATA_ROOT", str(tmp_path))  # exists, but holds nothing
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # and the hub cannot be reached
    with pytest.raises(ValueError, match=r"benchmarks.names: benchmark gsm8k \(openai/gsm8k.*needs .*gsm8k/test.jsonl"):
        dcfg.check_plan(copy.deepcopy(_base()))


@pytest.mark.parametrize("bad", [
    "methods: [{name: 'DScout(64)', kind: dscout, drafter: dscout, block_size: 64}]\n",
    "target: {mask_token_id: 60000}\n",
    "data_root: /nonexistent/data\n",
])
def test_snakemake_stops_before_any_job(bad, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(bad)
    env = {"DSCOUT_DATA_ROOT": "", "HF_ENDPOINT": "http://127.0.0.1:9"} if "data_root" in bad else None
    r = snakemake("-n", "--cores", "2", "--configfile", "presets/smoke.yaml", str(path), check=False, env=env)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "invalid configuration" in out and "Job stats" not in out
    assert ("methods[0].block_size" in out) or ("target.mask_token_id" in out) or ("data_root" in out)


def test_smoke_preset_trains_every_drafter_a_handful_of_steps():
    """Per-drafter overrides win over the global training block, so the smoke preset sets them explicitly."""
    cfg = dcfg.load_config(ROOT / "config.yaml", ROOT / "presets" / "smoke.yaml")
    for name in cfg["drafters"]:
        assert dcfg.drafter_variant(cfg, name)["training"]["max_steps"] <= 6, name


def test_a_relative_data_root_is_relative_to_the_project(tmp_path, monkeypatch):
    """config.yaml's ``../shared/data`` means beside the project (the folder of config.yaml), wherever Snakemake
    runs: a copy of the project with a mirror beside it plans from another working directory; a copy without one
    stops with the absolute path it looked at."""
    from dscout.data.paths import data_root

    monkeypatch.delenv("DSCOUT_DATA_ROOT", raising=False)
    assert data_root("../shared/data", tmp_path / "proj") == tmp_path / "shared" / "data"
    assert data_root("/abs/data", tmp_path / "proj") == Path("/abs/data")
    monkeypatch.setenv("DSCOUT_DATA_ROOT", str(tmp_path / "elsewhere"))  # the variable wins
    assert data_root("../shared/data", tmp_path / "proj") == tmp_path / "elsewhere"

    beside, alone, other = tmp_path / "a" / "proj", tmp_path / "b" / "proj", tmp_path / "other"
    for p in (beside, alone, other):
        p.mkdir(parents=True)
    copy_project(beside)
    copy_project(alone)
    (tmp_path / "a" / "shared").mkdir()
    (tmp_path / "a" / "shared" / "data").symlink_to(DATA)
    env = {"DSCOUT_DATA_ROOT": "", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "", "HF_DATASETS_OFFLINE": ""}
    ok = snakemake("-n", "--cores", "1", "-s", str(beside / "Snakefile"), "-d", str(other),
                   "--configfile", str(beside / "presets" / "smoke.yaml"), cwd=other, env=env)
    assert "Job stats" in ok.stdout + ok.stderr
    r = snakemake("-n", "--cores", "1", "--configfile", "presets/smoke.yaml", cwd=alone, env=env, check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Job stats" not in out
    assert f"have no mirror file under {tmp_path / 'b' / 'shared' / 'data'} (from config key data_root)" in out


def test_readme_test_command_is_what_ci_runs():
    """.ci/run installs with README step 1, runs a main job in the checkout (the smoke preset standing in for the
    CPU default: the one difference) and then README step 2 verbatim, with no environment variable of its own:
    CI runs what the README tells a user to run, beside a populated results/."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) == 2, commands
    setup, tests = commands
    install, _, main_job = setup.rpartition(" && ")
    assert main_job == "snakemake --cores all"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert install in ci and tests in ci
    smoke = ". .venv/bin/activate && " + main_job + " --configfile presets/smoke.yaml"
    assert ci.index(install) < ci.index(smoke) < ci.index(tests)
    code = [line for line in ci if line and not line.startswith("#")]
    assert [line for line in code if line not in (install, smoke, tests)] == ["set -euo pipefail",
                                                                             'cd "$(dirname "$0")/.."'], code
    assert not [line for line in code if line.startswith("export") or re.match(r"^[A-Z_]+=", line)], code


ONLINE = {"name": "DScout(online)", "kind": "dscout", "drafter": "dscout", "block_size": "online"}


@pytest.mark.parametrize("rows, serving, message", [
    ([ONLINE, {**ONLINE, "name": "again"}], {},
     r"methods\[1\]: row 'again' decodes exactly as methods\[0\] \('DScout\(online\)'\)"),
    ([{**ONLINE, "controller": {"explor": 1}}], {}, r"methods\[0\].controller: 'explor' is not a setting of section"),
    ([{**ONLINE, "controller": {"explore": -1}}], {}, r"methods\[0\].controller.explore: -1 is less than the minimum"),
    ([{**ONLINE, "block_size": 8, "controller": {"explore": 1}}], {},
     r"methods\[0\].controller: only a row with block_size: online has a controller"),
    ([ONLINE], {"online_variants": [{"name": "a"}, {"name": "a", "controller": {"decay": 0.5}}]},
     r"serving.online_variants\[1\].name: 'a' is used twice"),
    ([ONLINE], {"online_variants": [{"name": "a", "controller": {"decay": 2}}]},
     r"serving.online_variants\[0\].controller.decay: 2 is greater than the maximum"),
])
def test_online_rows_with_their_own_controller_are_checked_before_any_job(rows, serving, message):
    """A row's (or a Table 4 variant's) own controller settings are settings of section controller with values its
    schema allows; two rows that would decode identically (same records path) are refused, naming both."""
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    with pytest.raises(ValueError, match=message):
        dcfg.validate_config(dcfg.deep_merge(cfg, {"methods": rows, "serving": serving}))


def test_an_online_row_with_its_own_settings_gets_its_own_key_and_id_and_leaves_the_others_alone():
    """Two online rows of one drafter: the second's key names its settings, its spec holds section controller
    with them on top; the first row, and every other row, keeps the spec (so the records path) it had alone;
    the defaults (explore 0.5, recent_strength 10) are in every online spec, and setting them explicitly changes no id,
    while the pre-2026-12-06 controller (explore 0) gets ids of its own."""
    base = _base()
    n = base["target"]["num_layers"]
    alone = {s["name"]: s for s in dcfg.method_specs(base, n)}
    row = {"name": "DScout(online, z)", "kind": "dscout", "drafter": "dscout", "block_size": "online",
           "controller": {"explore": 0.0, "recent_strength": 2}}
    both = dcfg.validate_config(dcfg.deep_merge(base, {"methods": [*base["methods"], row]}))
    specs = {s["name"]: s for s in dcfg.method_specs(both, n)}
    for name, spec in alone.items():
        assert specs[name] == spec
    z = specs["DScout(online, z)"]
    assert z["controller"] == {**dcfg.controller_settings(base), "explore": 0.0, "recent_strength": 2}
    key = dcfg.method_key(z, z["drafter_id"])
    assert key.startswith("dscout-online-explore0-recent_strength2-")
    assert key != dcfg.method_key(specs["DScout(online)"], z["drafter_id"])
    assert specs["DScout(online)"]["controller"]["explore"] == 0.5  # the defaults
    assert specs["DScout(online)"]["controller"]["recent_strength"] == 10
    assert dcfg.controller_suffix({"calibration_block_sizes": [1, 2]}).startswith("-ctl")
    with_zero = dcfg.deep_merge(base, {"controller": {"explore": 0.0}})
    assert dcfg.bench_id(with_zero, n) != dcfg.bench_id(base, n)
    assert dcfg.bench_id(dcfg.deep_merge(base, {"controller": {"explore": 0.5}}), n) == dcfg.bench_id(base, n)
