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


def scan_ids(path: str | os.PathLike, key: str = "id", truncate_torn: bool = True) -> set:
    """The ``key`` values of a JSONL file's rows, read without building the rows (resuming an appender).

    A row written by ``json.dumps`` with ``key`` first starts with ``{"<key>": <value>``: only that value is
    decoded; other rows are parsed whole. The file is read line by line (memory: the ids). The last line is parsed
    whole: if it is torn (a killed appender: no newline, or not valid JSON) it is cut off the file (with
    ``truncate_torn``) so an appender continues on a clean line, and its id is not returned.

    Args:
        path: the JSONL file (a missing file has no ids).
        key: the field to collect.
        truncate_torn: cut a torn last line off the file in place.
    Returns:
        the set of values (JSON-decoded: strings stay strings, numbers stay numbers).
    Raises:
        ValueError: naming the file and row of a row that is not JSON or lacks ``key`` (a torn last line excepted).
    """
    path = Path(path)
    if not path.exists():
        return set()
    prefix = b'{"' + key.encode() + b'": '
    decoder = json.JSONDecoder()
    ids, pos, torn_at = set(), 0, None
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for i, line in enumerate(f, 1):
            start, pos = pos, pos + len(line)
            if not line.strip():
                continue
            last = pos == size
            try:
                if line.startswith(prefix) and not last:
                    text = line.decode()
                    ids.add(decoder.raw_decode(text, len(prefix))[0])
                    continue
                if last and not line.endswith(b"\n"):
                    raise ValueError("no newline")
                row = json.loads(line)
            except ValueError as err:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
                if last:
                    torn_at = start
                    break
                raise ValueError(f"{path}, row {i}: not valid JSON ({err})") from err
            if not isinstance(row, dict) or key not in row:
                raise ValueError(f"{path}, row {i}: no field '{key}'")
            ids.add(row[key])
    if torn_at is not None and truncate_torn:
        os.truncate(path, torn_at)
    return ids


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


__all__ = ["read_jsonl", "read_records", "scan_ids", "write_jsonl"]
