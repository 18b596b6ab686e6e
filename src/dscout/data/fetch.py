"""Write a data mirror from the hub: the files a compute node without internet reads through ``data_root``.

``dscout fetch-data --out DIR`` (or the Snakemake target ``fetch_data``, which fetches what the config needs into
``data_root``) loads each source with ``datasets.load_dataset`` from its hub copy and writes it under the mirror
file name the loaders look for (``docs/data.md``); reading the mirror back yields the same rows.
"""

from __future__ import annotations

import os
from pathlib import Path

from .benchmarks import BENCHMARKS, get_benchmark
from .hub import load_hub_rows, write_mirror_file
from .paths import data_root  # noqa: F401 (the effective mirror folder, used by rules)
from .prompts import PROMPT_SOURCES, prompt_source  # noqa: F401 (prompt_source: used by rules)


def needed_sources(config: dict) -> tuple[list[str], list[str]]:
    """(benchmark names, prompt-source names) that a config's stages read, each once, in config order."""
    names: list[str] = list(config.get("benchmarks", {}).get("names", []))
    for group in ("study", "depth_search", "serving", "accuracy"):
        g = config.get(group, {})
        if g.get("enabled"):
            names += g.get("benchmarks", [])
    sources = [s["name"] for s in config.get("responses", {}).get("sources", [])]
    return list(dict.fromkeys(names)), list(dict.fromkeys(sources))


def mirror_files(config: dict) -> list[str]:
    """The mirror files (relative to ``data_root``) that a config reads."""
    benchmarks, sources = needed_sources(config)
    return ([get_benchmark(n).local_file for n in benchmarks]
            + [prompt_source(s).local_file for s in sources if prompt_source(s).hub is not None])


def fetch_mirror(out: str | os.PathLike, benchmarks: list[str] | None = None, sources: list[str] | None = None,
                 force: bool = False) -> list[Path]:
    """Fetch sources from the hub into a mirror folder.

    Args:
        out: the mirror folder (created); layout of ``data_root``.
        benchmarks: benchmark names (None: all six).
        sources: training-prompt source names (None: every source with a hub copy).
        force: refetch files that already exist (default: keep them, so an interrupted fetch resumes).
    Returns:
        The files written.
    Raises:
        DataUnavailable: the hub cannot be reached (files fetched before stay).
        KeyError: an unknown name; ValueError: a mirror-only source asked for by name.
    """
    from tqdm import tqdm

    out = Path(out)
    jobs = []
    for name in BENCHMARKS if benchmarks is None else benchmarks:
        b = get_benchmark(name)
        jobs.append((f"benchmark {name}", b.hub, b.local_file, b.from_hub))
    for name in [n for n, s in PROMPT_SOURCES.items() if s.hub is not None] if sources is None else sources:
        s = prompt_source(name)
        if s.hub is None:
            raise ValueError(f"prompt source '{name}' has no hub copy: copy {s.local_file} into the mirror by hand")
        jobs.append((f"prompt source {name}", s.hub, s.local_file, None))
    written = []
    for what, hub, rel, from_hub in tqdm(jobs, desc="fetch", unit="source"):
        path = out / rel
        if path.exists() and not force:
            tqdm.write(f"{what}: {path} exists, kept")
            continue
        rows = load_hub_rows(hub)
        if from_hub is not None:
            rows = [from_hub(r) for r in rows]
        write_mirror_file(path, rows)
        tqdm.write(f"{what}: {len(rows)} rows from {hub.describe()} -> {path}")
        written.append(path)
    return written


__all__ = ["fetch_mirror", "mirror_files", "needed_sources"]
