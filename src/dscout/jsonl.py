"""JSON lines, one reader and one writer for every record file of the workflow (torch-free).

Records (benchmark, serving, accuracy), regenerated responses and training logs are JSON lines. Writers replace
a file atomically (a temporary sibling renamed into place), so a killed job never leaves a half-written output
that a later run would take as done; appenders (resumable stages) write whole lines and flush, and the reader
ignores a torn last line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSONL file; a torn last line (a killed appender) is ignored, any other bad row is an error.

    Raises:
        ValueError: naming the file and the row of an invalid JSON line.
    """
    path = Path(path)
    rows = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            if i == len(lines):
                break
            raise ValueError(f"{path}, row {i}: not valid JSON ({err.msg})") from err
    return rows


def write_jsonl(rows, path: str | os.PathLike) -> None:
    """Write rows as JSON lines atomically (temporary sibling + rename); parent folders are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def read_records(paths) -> list[dict]:
    """Every row of the given JSONL files, or of the ``*.jsonl`` files under given folders (sorted, recursive).

    Raises:
        ValueError: naming the file and row of an invalid line (a torn last line is ignored, as in
            :func:`read_jsonl`).
    """
    files = []
    for p in paths:
        p = Path(p)
        files.extend(sorted(p.rglob("*.jsonl")) if p.is_dir() else [p])
    return [row for f in files for row in read_jsonl(f)]


__all__ = ["read_jsonl", "read_records", "write_jsonl"]
