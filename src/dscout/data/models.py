"""Hub models a config names (the target, published drafters) and their snapshots in the Hugging Face cache.

``snakemake download_models`` (a localrule: the login node has internet) snapshots every hub model of the config
into the HF cache once (``huggingface_hub.snapshot_download``) and every hub dataset a stage reads without a mirror
file into datasets' cache (``load_dataset``), then writes ``results/hub/download.json``. Every other job depends on
it (through ``prepare_target``) and runs with ``HF_HUB_OFFLINE=1`` / ``HF_DATASETS_OFFLINE=1``
(rules/common.smk), reading those caches only. Torch-free: the plan check calls :func:`offline_model_problems`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def tiny_random_attention(source: str) -> tuple[int, int, int]:
    """``(heads, kv_heads, head_dim)`` of a ``tiny-random[:layers[:head_dim]]`` target (64 wide).

    ``head_dim`` defaults to 16 (4 query heads, 2 KV heads: the smoke target since its start); 32 or 64 give
    64 // head_dim query heads and half as many KV heads (at least 1). vLLM's CPU attention needs a head size that
    is a multiple of 32, hence the option (the smoke preset's ``tiny-random:4:32``).

    Raises:
        ValueError: naming the source when ``head_dim`` does not divide 64 or is not a power of two >= 16.
    """
    parts = str(source).split(":")
    head_dim = int(parts[2]) if len(parts) > 2 and parts[2] else 16
    if head_dim not in (16, 32, 64):
        raise ValueError(f"target source '{source}': head_dim must be 16, 32 or 64 (the tiny target is 64 wide)")
    heads = 64 // head_dim
    return heads, max(1, heads // 2), head_dim


def is_hub_id(source: str | None) -> bool:
    """Whether ``source`` is a hub repository id (``org/name``), not a local folder or a project source
    (``gguf:``, ``tiny-random``, ``tiny-qwen3``, ``results/published/...``)."""
    if not source or ":" in source or source.startswith(("tiny-", "results/", ".", "/")):
        return False
    return source.count("/") == 1 and not Path(source).exists()


def hub_models(config: dict) -> dict[str, list[str]]:
    """``repo id -> the rules whose jobs load it`` for every hub model of ``config`` (target, pretrained drafters)."""
    out: dict[str, list[str]] = {}
    src = config["target"]["source"]
    if is_hub_id(src):
        out[src] = ["prepare_target", "generate_responses", "train_drafter", "benchmark"]
    for name, v in config.get("drafters", {}).items():
        if is_hub_id(v.get("pretrained")):
            out.setdefault(v["pretrained"], []).append(f"train_drafter (drafter '{name}')")
            if config.get("serving", {}).get("eagle3_drafter") == name:
                out[v["pretrained"]].append("serving_benchmark")
    return out


def hub_cache_dir() -> Path:
    """The HF hub cache a job reads (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def model_cached(repo_id: str, cache_dir: str | os.PathLike | None = None) -> bool:
    """Whether a snapshot of ``repo_id`` with a ``config.json`` is in the hub cache (what an offline
    ``from_pretrained`` needs first; the layout of ``huggingface_hub``'s cache: ``models--org--name/refs/main``
    naming a folder under ``snapshots/``)."""
    base = Path(cache_dir or hub_cache_dir()) / ("models--" + repo_id.replace("/", "--"))
    ref = base / "refs" / "main"
    if not ref.is_file():
        return False
    return (base / "snapshots" / ref.read_text().strip() / "config.json").is_file()


def offline_model_problems(config: dict) -> list[str]:
    """With ``HF_HUB_OFFLINE`` set, one line per hub model missing from the cache, naming the jobs that load it.

    Source: the plan check of ``dscout.config.check_plan`` (a job would otherwise fail inside
    ``from_pretrained`` with the hub unreachable)."""
    from .hub import hub_offline

    if not hub_offline():
        return []
    cache = hub_cache_dir()
    return [f"hub model {repo}: the jobs of {', '.join(rules)} load it, HF_HUB_OFFLINE is set and the HF cache "
            f"({cache}) holds no snapshot of it; run `snakemake --cores 1 download_models` on a machine with "
            "internet (same HF_HOME / HF_HUB_CACHE), or unset HF_HUB_OFFLINE"
            for repo, rules in hub_models(config).items() if not model_cached(repo, cache)]


def download_plan(config: dict) -> dict:
    """What :func:`download` fetches for ``config``: ``{"models": [repo ids], "benchmarks": [...], "sources":
    [...]}`` (the stages' benchmark and prompt-source names; those with a mirror file are skipped there)."""
    from .fetch import needed_sources

    benches, sources = needed_sources(config)
    return {"models": sorted(hub_models(config)), "benchmarks": benches, "sources": sources}


def download(plan: dict, out: str | os.PathLike, data_root: str | os.PathLike | None = None) -> dict:
    """Snapshot every hub model of ``plan`` (:func:`download_plan`) into the HF cache and load every hub dataset
    it reads without a mirror file under ``data_root`` (into datasets' cache); write ``out`` (JSON: repo ->
    snapshot folder, the datasets loaded).

    Raises:
        RuntimeError: naming the repository when a download fails.
    """
    from huggingface_hub import snapshot_download

    from .benchmarks import get_benchmark
    from .hub import load_hub_rows
    from .paths import data_root as resolve
    from .prompts import prompt_source

    models = {}
    for repo in plan["models"]:
        try:
            models[repo] = snapshot_download(repo)
        except Exception as err:  # noqa: BLE001 - re-raised with the repository named
            raise RuntimeError(f"download_models: snapshot of hub model {repo} failed: {err}") from err
    root = resolve(data_root)
    hubs = [(get_benchmark(n).local_file, get_benchmark(n).hub) for n in plan["benchmarks"]]
    hubs += [(prompt_source(s).local_file, prompt_source(s).hub) for s in plan["sources"]]
    datasets = []
    for rel, hub in hubs:
        if hub is None or (root / rel).exists():
            continue
        try:
            load_hub_rows(hub)
        except Exception as err:  # noqa: BLE001
            raise RuntimeError(f"download_models: hub dataset {hub.describe()} failed: {err}") from err
        datasets.append(hub.describe())
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"models": models, "datasets": datasets}, indent=1))
    return {"models": models, "datasets": datasets}
