"""Every benchmark and prompt source loads through ``datasets.load_dataset``: from a local mirror or the hub.

A *mirror* is a folder laid out file by file like the hub copies we need (``gsm8k/test.jsonl``,
``humaneval/HumanEval.jsonl.gz``, ...; ``docs/data.md`` lists them). Resolution for one source:

1. the mirror file exists under ``data_root`` -> ``load_dataset("json", data_files=<file>, split="train")``
   (datasets' own JSON builder: JSON lines, a JSON array, gzip by extension);
2. otherwise the hub -> ``load_dataset(<hub id>, <config>, split=<split>, data_files=..., revision=...)``,
   the ids and splits upstream harnesses load (a local directory with the hub id's name, e.g. a cloned dataset
   repository ``openai/gsm8k/`` under the working directory, is loaded by the same call, as datasets does);
3. neither (no mirror file, hub unreachable) -> :class:`DataUnavailable` naming the file, the hub id and both
   remedies (``dscout fetch-data`` on a machine with internet, or ``data_root`` / ``$DSCOUT_DATA_ROOT``).

:func:`fetch` writes a mirror from the hub (for a login node whose compute nodes are offline); the mirror it
writes is read back by step 1 above into the same rows.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

from .paths import ENV_VAR


class DataUnavailable(FileNotFoundError):
    """A source has neither a mirror file nor a reachable hub copy (the message says how to get one)."""


@dataclass(frozen=True)
class HubSource:
    """Where a dataset lives on the Hugging Face hub.

    Attributes:
        path: hub dataset id (``openai/gsm8k``).
        name: dataset configuration (``main``), or None.
        split: split to read (``test``).
        data_files: files of the repository to read instead of its configurations (repositories without a
            usable configuration, e.g. LiveCodeBench's release files), or None.
        revision: a git revision of the dataset repository to pin, or None (the default branch).
    """

    path: str
    name: str | None = None
    split: str = "train"
    data_files: tuple[str, ...] | None = None
    revision: str | None = None

    def describe(self) -> str:
        """``openai/gsm8k (main, test)``: how messages name the source."""
        parts = [p for p in (self.name, self.split) if p]
        files = f", files {', '.join(self.data_files)}" if self.data_files else ""
        return f"{self.path} ({', '.join(parts)}{files})"


def hub_offline() -> bool:
    """True where the user switched the hub off (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``): cache only."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def datasets_cache_dir() -> Path:
    """Where ``datasets`` keeps prepared datasets: ``$HF_DATASETS_CACHE``, else ``$HF_HOME/datasets``, else
    ``$XDG_CACHE_HOME/huggingface/datasets`` (default ``~/.cache/huggingface/datasets``); datasets' own rule
    (``datasets.config.HF_DATASETS_CACHE``), restated here so the plan check needs no import of datasets."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "datasets"


def _snake_case(name: str) -> str:
    """datasets' ``camelcase_to_snakecase`` of a dataset name (``OpenPerfectBlend`` -> ``open_perfect_blend``)."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z\d])([A-Z])", r"\1_\2", name).lower()


def offline_cached(hub: HubSource, cache_dir: str | os.PathLike | None = None) -> bool:
    """Whether ``load_dataset`` can read ``hub`` with the hub switched off: a prepared copy in datasets' cache.

    Offline, datasets resolves a hub id through its cache only (``CachedDatasetModuleFactory`` in
    ``datasets/load.py``): ``<cache>/<namespace>___<name>/<config>/<version>/<hash>/``. With a config name, that
    config's folder must hold a version.

    Args:
        hub: the source's hub copy.
        cache_dir: datasets' cache; None = :func:`datasets_cache_dir`.
    """
    parts = hub.path.split("/")
    parts[-1] = _snake_case(parts[-1])
    root = Path(cache_dir or datasets_cache_dir()) / "___".join(parts)
    config = hub.name or "*"
    return any(p.is_dir() for p in root.glob(f"{config}/*/*"))


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub endpoint (``$HF_ENDPOINT``, default huggingface.co:443) opens.

    A quick probe, so an offline machine fails in milliseconds with our message instead of after datasets'
    retries (~25 s per file).
    """
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def _is_local_repository(hub: HubSource) -> bool:
    return Path(hub.path).is_dir()


def unavailable_message(mirror_file: Path, hub: HubSource | None, what: str) -> str:
    """The error text for a source with no mirror file and no hub copy."""
    how_hub = (f"the hub copy {hub.describe()} cannot be reached from this machine"
               if hub is not None else "it has no hub copy that this project loads")
    return (f"{what}: no mirror file {mirror_file} and {how_hub}. Either run `dscout fetch-data --out DIR` "
            f"(or `snakemake --cores 1 fetch_data`) on a machine with internet and copy DIR here, or point the "
            f"config key 'data_root' (or ${ENV_VAR}) at a folder that holds '{mirror_file.name}' under the "
            "layout listed in docs/data.md.")


def load_mirror_rows(path: Path) -> list[dict]:
    """Rows of a mirror file through datasets' JSON builder (JSON lines, JSON array, ``.gz``).

    Raises:
        ValueError: naming the file when datasets cannot parse it (invalid JSON, mixed types).
    """
    from datasets import load_dataset

    try:
        ds = load_dataset("json", data_files=str(path), split="train")
    except Exception as err:  # datasets wraps parse errors in several types
        raise ValueError(f"{path}{_first_bad_row(path)}: not readable as JSON lines or a JSON array by datasets' "
                         f"JSON builder ({type(err).__name__}: {str(err)[:300]})") from err
    return ds.to_list()


def _first_bad_row(path: Path) -> str:
    """``, row N`` for the first JSON-lines row that does not parse (diagnostics only), else ``""``."""
    if not (path.name.endswith(".jsonl") or path.name.endswith(".jsonl.gz")):
        return ""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    json.loads(line)
                except json.JSONDecodeError as err:
                    return f", row {i} ({err.msg})"
    return ""


def load_hub_rows(hub: HubSource) -> list[dict]:
    """Rows of a hub dataset (or of a local dataset repository named like it), in the repository's order.

    Raises:
        DataUnavailable: when the hub cannot be reached (and the source is not in the local cache).
    """
    from datasets import load_dataset

    kwargs = {"split": hub.split}
    if hub.data_files:
        kwargs["data_files"] = list(hub.data_files)
    if hub.revision:
        kwargs["revision"] = hub.revision
    if not _is_local_repository(hub) and not hub_offline() and not hub_reachable():
        raise DataUnavailable(f"the hub ({os.environ.get('HF_ENDPOINT', 'https://huggingface.co')}) is not "
                              f"reachable for {hub.describe()}")
    try:
        ds = load_dataset(hub.path, hub.name, **kwargs)
    except (ConnectionError, OSError) as err:
        raise DataUnavailable(f"{hub.describe()}: {err}") from err
    return ds.to_list()


def load_rows(root: str | os.PathLike, relative: str, hub: HubSource | None, what: str,
              from_hub: Callable[[dict], dict] | None = None) -> tuple[list[dict], str]:
    """Rows of one source, mirror first, then the hub; hub rows are mapped to the mirror's fields.

    Args:
        root: the mirror folder (``data_root``); it need not exist.
        relative: the source's file under ``root`` (``gsm8k/test.jsonl``).
        hub: the source's hub copy, or None for a mirror-only source.
        what: how error messages name the source (``benchmark gsm8k``).
        from_hub: maps a hub row to the mirror's field names (MT-Bench's hub copy names them differently).
    Returns:
        (rows, origin): the rows as dicts, and a label of where they came from (file path or hub id) for
        error messages and provenance.
    Raises:
        DataUnavailable: neither the mirror file nor the hub copy can be read (the message says how to fix it).
        ValueError: a mirror file that datasets cannot parse (file named).
    """
    path = Path(root) / relative
    if path.exists():
        return load_mirror_rows(path), str(path)
    if hub is None:
        raise DataUnavailable(unavailable_message(path, hub, what))
    try:
        rows = load_hub_rows(hub)
    except DataUnavailable as err:
        raise DataUnavailable(unavailable_message(path, hub, what) + f" ({err})") from err
    if from_hub is not None:
        rows = [from_hub(r) for r in rows]
    return rows, f"hub:{hub.describe()}"


def _json_value(o):
    """JSON for values datasets' readers produce beyond JSON's types (timestamps parsed from ISO dates)."""
    if hasattr(o, "isoformat"):
        return o.isoformat()
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def write_mirror_file(path: Path, rows: list[dict]) -> None:
    """Write rows in the format the file name says (``.jsonl``, ``.jsonl.gz``, ``.json`` array), atomically.

    The file appears only once complete (a temporary sibling is renamed), so an interrupted fetch never leaves
    a truncated mirror file that a later run would read.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    name = path.name
    if name.endswith(".jsonl.gz"):
        with gzip.open(tmp, "wt", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False, default=_json_value) + "\n")
    elif name.endswith(".jsonl"):
        with open(tmp, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False, default=_json_value) + "\n")
    elif name.endswith(".json"):
        tmp.write_text(json.dumps(rows, ensure_ascii=False, indent=1, default=_json_value), encoding="utf-8")
    else:
        raise ValueError(f"{path}: unknown mirror format (expected .jsonl, .jsonl.gz or .json)")
    os.replace(tmp, path)


__all__ = ["DataUnavailable", "HubSource", "hub_offline", "hub_reachable", "load_hub_rows", "load_mirror_rows",
           "load_rows", "unavailable_message", "write_mirror_file"]
