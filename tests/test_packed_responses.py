"""Packed, memory-mapped responses (dscout.data.packed) and the ids-only resume scan (dscout.jsonl.scan_ids)."""

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from dscout.data.packed import PackedResponses, load_training_sequences, pack_responses, packed_dir
from dscout.data.responses import training_sequences
from dscout.jsonl import read_jsonl, scan_ids


def _rows(n=60, seed=0):
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        p = [rnd.randrange(0, 500) for _ in range(rnd.randrange(1, 30))]
        r = [rnd.randrange(0, 500) for _ in range(rnd.randrange(0, 60))]
        rid = i if i % 7 == 0 else f"src-{i}"  # ids as the JSONL has them: strings, sometimes numbers
        rows.append({"id": rid, "source": "s", "prompt": "x", "prompt_ids": p, "response_ids": r,
                     "response": "y", "finish_reason": "stop"})
    return rows


def _write(path, rows, torn_tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + torn_tail)
    return path


@pytest.fixture
def responses(tmp_path):
    d = tmp_path / "responses"
    d.mkdir()
    return _write(d / "responses.jsonl", _rows(), torn_tail='{"id": "torn", "prompt_ids": [1, 2')


@pytest.mark.parametrize("max_length,min_resp", [(48, 16), (20, 4), (1000, 0)])
def test_packed_sequences_equal_the_list_path(responses, max_length, min_resp):
    pack_responses(responses)
    packed = load_training_sequences(responses, max_length, min_resp)
    ref = training_sequences(read_jsonl(responses), max_length, min_resp)
    assert len(packed) == len(ref) and 0 < len(ref) <= 60
    assert list(packed) == ref
    assert packed[3:7] == ref[3:7] and packed[-1] == ref[-1]
    ids, mask = packed.arrays(5)
    assert ids.tolist() == ref[5]["input_ids"] and mask.tolist() == ref[5]["loss_mask"]
    with pytest.raises(IndexError):
        packed[len(ref)]


def test_packed_files_are_mapped_not_read(responses):
    out = pack_responses(responses)
    assert out == packed_dir(responses)
    p = PackedResponses(out)
    assert isinstance(p.tokens, np.memmap) and p.offsets.base is not None  # np.load(mmap_mode="r")
    assert json.loads((out / "index.json").read_text())["rows"] == len(p) == 60  # the torn line is not a row
    assert p.row_id(0) == 0 and p.row_id(1) == "src-1"


@pytest.mark.parametrize("responses_only", [False, True])
def test_bulk_token_counts_equal_per_sequence_counts(responses, responses_only):
    pack_responses(responses)
    seqs = load_training_sequences(responses, 40, 4)
    subset = [0, 3, 4, 9]
    for sub in (None, subset):
        want = np.zeros(500, dtype=np.int64)
        for i in (range(len(seqs)) if sub is None else sub):
            ids, mask = seqs.arrays(i)
            np.add.at(want, ids[mask.astype(bool)] if responses_only else ids, 1)
        got = seqs.token_counts(500, responses_only, sub, chunk_tokens=64)  # many chunks
        assert np.array_equal(got, want)
        grown = seqs.token_counts(None, responses_only, sub)  # as long as the largest id counted + 1
        assert len(grown) == np.flatnonzero(want).max() + 1 and np.array_equal(grown, want[:len(grown)])
    with pytest.raises(ValueError, match="vocabulary size 10"):
        seqs.token_counts(10)


def test_trainer_sources_read_packed_sequences_in_bulk(responses):
    """The online source's token counts (mask-token warning, draft vocabulary) from the packed file equal those
    from the list of sequences, for all sequences and for a held-out subset."""
    from dscout.training.methods import response_token_counts
    from dscout.training.trainer import SubsetSource, _OnlineSource, count_token

    pack_responses(responses)
    packed = _OnlineSource(None, load_training_sequences(responses, 40, 4), [0])
    listed = _OnlineSource(None, training_sequences(read_jsonl(responses), 40, 4), [0])
    for a, b in ((packed, listed), (SubsetSource(packed, [1, 5, 2]), SubsetSource(listed, [1, 5, 2]))):
        assert a.token_counts(500) is not None and b.token_counts(500) is None
        for i in range(len(a)):
            assert all(torch.equal(x, y) for x, y in zip(a.tokens(i), b.tokens(i)))
        for tok in (7, 499, 10_000):
            assert count_token(a, tok) == count_token(b, tok)
        assert torch.equal(response_token_counts(a, 500), response_token_counts(b, 500))


def test_bad_rows_name_file_row_and_field(tmp_path):
    rows = _rows(5)
    rows[2]["response_ids"] = [1, "x"]
    with pytest.raises(ValueError, match=r"responses.jsonl, row 3: field 'response_ids'"):
        pack_responses(_write(tmp_path / "responses.jsonl", rows))
    rows[2]["response_ids"] = [1, 2**31]
    with pytest.raises(ValueError, match=r"row 3: fields 'prompt_ids'/'response_ids' hold a token id outside"):
        pack_responses(_write(tmp_path / "responses.jsonl", rows))
    bad = tmp_path / "broken.jsonl"
    bad.write_text(json.dumps(_rows(1)[0]) + "\n{not json\n" + json.dumps(_rows(1)[0]) + "\n")
    with pytest.raises(ValueError, match=r"broken.jsonl, row 2: not valid JSON"):
        pack_responses(bad, tmp_path / "p")
    assert not (tmp_path / "p" / "index.json").exists()  # no index: nothing takes the pack as complete


def test_missing_or_stale_pack_is_refused(responses):
    with pytest.raises(FileNotFoundError, match=r"packed.*index.json missing.*python -m dscout.data.packed"):
        load_training_sequences(responses, 40, 4)
    # the module's command line packs by hand
    r = subprocess.run([sys.executable, "-m", "dscout.data.packed", str(responses)], capture_output=True, text=True)
    assert r.returncode == 0 and "packed 60 rows" in r.stdout, r.stderr
    assert len(load_training_sequences(responses, 40, 4)) > 0
    with open(responses, "a") as f:  # rows appended after packing
        f.write(json.dumps(_rows(1)[0]) + "\n")
    with pytest.raises(ValueError, match=r"index.json: packed from \d+ bytes of responses.jsonl, which now has"):
        load_training_sequences(responses, 40, 4)


def test_scan_ids_reads_ids_and_cuts_a_torn_last_line(responses):
    size = responses.stat().st_size
    ids = scan_ids(responses)
    assert ids == {r["id"] for r in _rows()}  # ints stay ints; the torn row's id is not done
    assert responses.stat().st_size < size and responses.read_text().endswith("}\n")
    with open(responses, "a") as f:  # an appender continues on a clean line
        f.write(json.dumps({"id": "next", "prompt_ids": [1], "response_ids": [2]}) + "\n")
    assert [r["id"] for r in read_jsonl(responses)][-2:] == ["src-59", "next"]
    assert scan_ids(responses) == ids | {"next"}
    assert scan_ids(responses.with_name("absent.jsonl")) == set()


def test_scan_ids_rows_written_in_another_key_order_and_bad_rows(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"prompt_ids": [1], "id": "a"}\n{"id": "b", "x": 1}\n{"id": "c"}\n')
    assert scan_ids(path) == {"a", "b", "c"}  # the complete last line is kept
    path.write_text('{"id": "a"}\n{"x": 1}\n{"id": "c"}\n')
    with pytest.raises(ValueError, match=r"r.jsonl, row 2: no field 'id'"):
        scan_ids(path)
    path.write_text('{"id": "a"}\n{"prompt": \n{"id": "c"}\n')
    with pytest.raises(ValueError, match=r"r.jsonl, row 2: not valid JSON"):
        scan_ids(path)


def test_regeneration_resumes_after_a_torn_row_from_the_ids(tmp_path, monkeypatch):
    """A killed generation left two rows and a torn one: the rerun decodes the ids only (the last line alone is
    parsed whole), cuts the torn line, generates the missing prompt, and the file packs cleanly."""
    from dscout import jsonl
    from dscout.data.responses import generate_responses
    from dscout.models.target import TargetModel, prepare_target
    from tests.workflow import DATA

    if not (DATA / "tokenizers" / "qwen3" / "tokenizer_config.json").exists():
        pytest.skip("Qwen3's tokenizer is not in the data mirror")
    target = TargetModel.load(prepare_target("tiny-qwen3:2", tmp_path / "t", DATA))
    prompts = [{"id": f"q{i}", "source": "s", "prompt": f"What is {i} plus {i}?"} for i in range(3)]
    out = tmp_path / "r" / "responses.jsonl"
    out.parent.mkdir()
    generate_responses(target, [dict(p) for p in prompts[:2]], out, max_new_tokens=4)
    first = out.read_text()
    out.write_text(first + first[:25])  # the torn start of a third row
    parsed = []
    loads = jsonl.json.loads
    monkeypatch.setattr(jsonl.json, "loads", lambda s, *a, **k: parsed.append(s) or loads(s, *a, **k))
    generate_responses(target, [dict(p) for p in prompts], out, max_new_tokens=4)
    monkeypatch.undo()
    assert parsed == []  # the ids were decoded without parsing a row (the torn line has no newline)
    rows = read_jsonl(out)
    assert sorted(r["id"] for r in rows) == ["q0", "q1", "q2"] and out.read_text().startswith(first)
    pack_responses(out)
    assert list(load_training_sequences(out, 64, 1)) == training_sequences(rows, 64, 1)
