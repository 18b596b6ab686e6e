"""Regenerated responses packed once into memory-mapped token files, for training start-up at 1.4M rows.

A rank that parses the responses JSONL into Python lists holds every row as objects (tens of GB at ~1.4B tokens),
once per rank. The packed copy is the layout of Megatron-LM's ``MMapIndexedDataset`` (a flat token file plus an
index of offsets): written once, next to the JSONL, by the job that generates the responses; every rank (and every
training job) maps the same files read-only, so the page cache holds one copy per node and start-up reads no
per-row Python object. Training sequences (:func:`dscout.data.responses.training_sequences`: truncation to
``max_length``, rows with fewer than ``min_response_tokens`` response tokens dropped) are a selection computed with
numpy over the index, and rows are read when a batch needs them.

Layout of ``<dir>/`` (little-endian, numpy ``.npy`` for the index arrays):

* ``tokens.bin``: int32 ``prompt_ids + response_ids`` of every row, concatenated;
* ``offsets.npy``: int64 ``[n + 1]``, row ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``;
* ``prompt_lengths.npy``: int32 ``[n]``, the prompt tokens at the start of each row;
* ``ids.bin`` + ``id_offsets.npy``: the rows' ids as UTF-8 JSON values, same scheme;
* ``index.json``: format, row and token counts, and the size of the JSONL it was packed from (a stale copy is
  refused); written last, so its presence means a complete pack.
"""

from __future__ import annotations

import json
import os
from array import array
from pathlib import Path

import numpy as np

FORMAT = "dscout-packed-responses/1"
TOKEN_DTYPE = np.dtype("<i4")  # Qwen3's 151,669 ids need more than 16 bits


def packed_dir(responses_jsonl: str | os.PathLike) -> Path:
    """Where the packed copy of ``.../responses.jsonl`` lives: ``.../packed/`` beside it."""
    return Path(responses_jsonl).parent / "packed"


def _int_list(row: dict, field: str, path: Path, line: int) -> list:
    v = row.get(field)
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        raise ValueError(f"{path}, row {line}: field '{field}' must be a list of token ids (integers)")
    return v


def pack_responses(responses_jsonl: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> Path:
    """Pack a responses JSONL (rows ``{"id", "prompt_ids", "response_ids", ...}``) into memory-mappable files.

    Streams the file (memory: the index, 12 bytes a row, not the rows); a torn last line (a killed appender) is
    ignored, as :func:`dscout.jsonl.read_jsonl` does. Files are written under temporary names and renamed, the
    ``index.json`` last, so a killed pack leaves no index a reader would take as complete.

    Args:
        responses_jsonl: the rows (:mod:`dscout.data.responses` format).
        out_dir: the packed folder; default :func:`packed_dir`.
    Returns:
        the packed folder.
    Raises:
        ValueError: naming the file, row and field of a row that is not JSON, lacks an id, or whose
            ``prompt_ids`` / ``response_ids`` are not lists of token ids in ``[0, 2**31)``.
    """
    src = Path(responses_jsonl)
    out = Path(out_dir) if out_dir is not None else packed_dir(src)
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.json").unlink(missing_ok=True)
    offsets, prompt_lens, id_offsets = array("q", [0]), array("i"), array("q", [0])
    n_tokens = n_id_bytes = 0
    tmp = {name: out / f"{name}.tmp" for name in ("tokens.bin", "ids.bin")}
    with open(src, "rb") as f, open(tmp["tokens.bin"], "wb") as tok_f, open(tmp["ids.bin"], "wb") as id_f:
        size = os.fstat(f.fileno()).st_size
        pos = 0
        for line_no, line in enumerate(f, 1):
            pos += len(line)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as err:
                if pos == size:  # a torn last line
                    break
                raise ValueError(f"{src}, row {line_no}: not valid JSON ({err})") from err
            if not isinstance(row, dict) or "id" not in row:
                raise ValueError(f"{src}, row {line_no}: field 'id' missing")
            p = _int_list(row, "prompt_ids", src, line_no)
            r = _int_list(row, "response_ids", src, line_no)
            try:
                toks = np.asarray(p + r, dtype=np.int64)
            except OverflowError:
                toks = np.array([-1])
            if toks.size and (toks.min() < 0 or toks.max() > np.iinfo(TOKEN_DTYPE).max):
                raise ValueError(f"{src}, row {line_no}: fields 'prompt_ids'/'response_ids' hold a token id outside "
                                 f"[0, {np.iinfo(TOKEN_DTYPE).max}]")
            tok_f.write(toks.astype(TOKEN_DTYPE).tobytes())
            n_tokens += toks.size
            offsets.append(n_tokens)
            prompt_lens.append(len(p))
            rid = json.dumps(row["id"]).encode()
            id_f.write(rid)
            n_id_bytes += len(rid)
            id_offsets.append(n_id_bytes)
    for name, path in tmp.items():
        os.replace(path, out / name)
    for name, arr, dtype in (("offsets", offsets, "<i8"), ("prompt_lengths", prompt_lens, "<i4"),
                             ("id_offsets", id_offsets, "<i8")):
        with open(out / f"{name}.npy.tmp", "wb") as fh:
            np.save(fh, np.frombuffer(arr, dtype=np.int64 if arr.typecode == "q" else np.int32).astype(dtype))
        os.replace(out / f"{name}.npy.tmp", out / f"{name}.npy")
    index = {"format": FORMAT, "rows": len(prompt_lens), "tokens": n_tokens, "token_dtype": TOKEN_DTYPE.str,
             "source": src.name, "source_bytes": src.stat().st_size}
    (out / "index.json.tmp").write_text(json.dumps(index, indent=1))
    os.replace(out / "index.json.tmp", out / "index.json")
    return out


class PackedResponses:
    """The packed rows, memory-mapped read-only (opening reads the small ``index.json`` and maps the arrays).

    Args:
        path: the packed folder, or the responses JSONL it was packed from (then :func:`packed_dir`).
    Raises:
        FileNotFoundError: if the folder holds no complete pack (names the folder and how to make one).
        ValueError: for another format, or a pack of a different (e.g. since appended) JSONL.
    """

    def __init__(self, path: str | os.PathLike):
        path = Path(path)
        jsonl = path if path.suffix == ".jsonl" else None
        self.dir = packed_dir(path) if jsonl is not None else path
        index_path = self.dir / "index.json"
        if not index_path.exists():
            raise FileNotFoundError(f"{self.dir}: no packed responses (index.json missing); make them with "
                                    f"`python -m dscout.data.packed {jsonl or '<responses.jsonl>'}`")
        self.index = json.loads(index_path.read_text())
        if self.index.get("format") != FORMAT:
            raise ValueError(f"{index_path}: field 'format' is {self.index.get('format')!r}, expected {FORMAT!r}")
        if jsonl is not None and jsonl.exists() and jsonl.stat().st_size != self.index["source_bytes"]:
            raise ValueError(f"{index_path}: packed from {self.index['source_bytes']} bytes of {jsonl.name}, which "
                             f"now has {jsonl.stat().st_size}: pack it again")
        n = int(self.index["rows"])
        self.offsets = np.load(self.dir / "offsets.npy", mmap_mode="r")
        self.prompt_lengths = np.load(self.dir / "prompt_lengths.npy", mmap_mode="r")
        self._id_offsets = np.load(self.dir / "id_offsets.npy", mmap_mode="r")
        self.tokens = (np.memmap(self.dir / "tokens.bin", dtype=TOKEN_DTYPE, mode="r")
                       if self.index["tokens"] else np.zeros(0, TOKEN_DTYPE))
        self._ids = np.memmap(self.dir / "ids.bin", dtype=np.uint8, mode="r") if n else np.zeros(0, np.uint8)
        if len(self.offsets) != n + 1 or len(self.prompt_lengths) != n or len(self.tokens) != self.index["tokens"]:
            raise ValueError(f"{self.dir}: index.json says {n} rows / {self.index['tokens']} tokens, the files hold "
                             f"{len(self.offsets) - 1} / {len(self.tokens)}: pack it again")

    def __len__(self) -> int:
        return len(self.prompt_lengths)

    def row_tokens(self, i: int) -> np.ndarray:
        """``[len]`` int32 view (no copy) of row ``i``: prompt then response tokens."""
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    def row_id(self, i: int):
        """The id of row ``i`` (as in the JSONL)."""
        return json.loads(bytes(self._ids[self._id_offsets[i]:self._id_offsets[i + 1]]))

    def sequences(self, max_length: int, min_response_tokens: int = 16) -> "PackedSequences":
        """The training sequences of :func:`dscout.data.responses.training_sequences` over these rows."""
        return PackedSequences(self, max_length, min_response_tokens)


class PackedSequences:
    """Training sequences over :class:`PackedResponses`: a drop-in for ``training_sequences``' list of dicts.

    The selection is computed with numpy at construction (``[n]`` arrays, no per-row object): a row is
    ``(prompt_ids + response_ids)[:max_length]`` and is kept when at least ``min_response_tokens`` response tokens
    remain (the rule of :func:`dscout.data.responses.training_sequences`). Items are built on access.

    Attributes:
        rows: ``[m]`` int64, the packed row of each sequence.
        lengths: ``[m]`` int64, tokens per sequence (after truncation).
    """

    def __init__(self, packed: PackedResponses, max_length: int, min_response_tokens: int = 16):
        self.packed = packed
        total = np.diff(np.asarray(packed.offsets))
        length = np.minimum(total, max_length)
        keep = length - np.asarray(packed.prompt_lengths, dtype=np.int64) >= min_response_tokens
        self.rows = np.flatnonzero(keep)
        self.lengths = length[self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def arrays(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, loss_mask)`` of sequence ``i``: ``[L]`` int32 view of the mapped tokens, ``[L]`` int64."""
        r = int(self.rows[i])
        L = int(self.lengths[i])
        ids = self.packed.tokens[self.packed.offsets[r]:self.packed.offsets[r] + L]
        mask = np.zeros(L, dtype=np.int64)
        mask[int(self.packed.prompt_lengths[r]):] = 1
        return ids, mask

    def token_counts(self, vocab_size: int | None, responses_only: bool = False, subset=None,
                     chunk_tokens: int = 1 << 22) -> np.ndarray:
        """``[vocab_size]`` int64 occurrences of every token id over the sequences (after truncation), with numpy
        over the mapped token file in chunks of about ``chunk_tokens`` tokens (no per-row Python object).

        Args:
            vocab_size: the length of the result; None = the largest id counted + 1.
            responses_only: count loss-mask (response) positions only.
            subset: sequence indices to count (None = all).
        Raises:
            ValueError: if a token id is ``>= vocab_size``.
        """
        p = self.packed
        offsets = np.asarray(p.offsets)
        n_rows = len(p)
        selected = np.zeros(n_rows, dtype=bool)
        limit = np.zeros(n_rows, dtype=np.int64)  # tokens kept per packed row (0: not a training sequence)
        chosen = self.rows if subset is None else self.rows[np.asarray(subset, dtype=np.int64)]
        selected[chosen] = True
        limit[self.rows] = self.lengths
        start = np.where(responses_only, np.asarray(p.prompt_lengths, dtype=np.int64), 0)
        counts = np.zeros(vocab_size or 0, dtype=np.int64)
        a = 0
        while a < n_rows:
            b = int(np.searchsorted(offsets, offsets[a] + chunk_tokens, side="right")) - 1
            b = min(max(b, a + 1), n_rows)
            sel = np.flatnonzero(selected[a:b]) + a
            if len(sel):
                toks = np.asarray(p.tokens[offsets[a]:offsets[b]])
                lens = np.diff(offsets[a:b + 1])
                row = np.repeat(np.arange(a, b), lens)
                pos = np.arange(len(toks)) - np.repeat(offsets[a:b] - offsets[a], lens)
                keep = selected[row] & (pos < limit[row]) & (pos >= start[row])
                kept = toks[keep]
                top = int(kept.max()) if len(kept) else -1
                if vocab_size is not None and top >= vocab_size:
                    raise ValueError(f"{p.dir}: token id {top} >= the vocabulary size {vocab_size}")
                add = np.bincount(kept, minlength=len(counts))
                if len(add) > len(counts):
                    add[:len(counts)] += counts
                    counts = add
                else:
                    counts += add
            a = b
        return counts

    def _item(self, i: int) -> dict:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"sequence {i} of {len(self)}")
        ids, mask = self.arrays(i)
        return {"id": self.packed.row_id(int(self.rows[i])), "input_ids": ids.tolist(), "loss_mask": mask.tolist()}

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._item(j) for j in range(*i.indices(len(self)))]
        return self._item(int(i))

    def __iter__(self):
        return (self._item(i) for i in range(len(self)))


def load_training_sequences(responses: str | os.PathLike, max_length: int, min_response_tokens: int = 16
                            ) -> PackedSequences:
    """The training sequences of a responses JSONL, read from its packed copy (:class:`PackedSequences`).

    Raises:
        FileNotFoundError, ValueError: as :class:`PackedResponses` (no pack, or a stale one).
    """
    return PackedResponses(responses).sequences(max_length, min_response_tokens)


def main(argv=None) -> None:
    """``python -m dscout.data.packed responses.jsonl [out_dir]``: pack a responses file by hand."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m dscout.data.packed", description=main.__doc__)
    ap.add_argument("responses")
    ap.add_argument("out_dir", nargs="?", default=None)
    a = ap.parse_args(argv)
    out = pack_responses(a.responses, a.out_dir)
    print(f"packed {json.loads((out / 'index.json').read_text())['rows']} rows into {out}")


if __name__ == "__main__":
    main()
