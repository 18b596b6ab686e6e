"""Table 3's rows on a serving runtime (``methods[].backend``): keys, plan checks, pairing with that runtime's own AR,
and a whole server job against a stub that answers like SGLang (tests/sglang_stub.py). vLLM's job on a real server
is tested in tests/test_vllm.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dscout import config as dcfg
from dscout.analysis.aggregate import summarize
from dscout.analysis.table3 import write_table3
from tests.workflow import ROOT

STUB = Path(__file__).with_name("sglang_stub.py")
VLLM_ROW = {"name": "DScout(4) · vLLM", "kind": "dscout", "drafter": "dscout", "block_size": 4, "backend": "vllm"}


def _base():
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    return dcfg.validate_config(dcfg.deep_merge(cfg, yaml.safe_load((ROOT / "presets" / "smoke.yaml").read_text())))


def test_a_server_row_gets_its_runtime_in_its_key_and_leaves_the_engine_jobs_alone():
    """A vLLM row's key leads with its runtime; our engine's stage, keys and records folder are those of the config
    without it (adding a server row reruns none of the engine's jobs); the server job's stage holds only its rows."""
    base = _base()
    n = base["target"]["num_layers"]
    both = dcfg.validate_config(dcfg.deep_merge(base, {"methods": [*base["methods"], VLLM_ROW]}))
    assert dcfg.bench_id(both, n) == dcfg.bench_id(base, n)
    stage = dcfg.bench_stage(both, n)
    assert dcfg.engine_slice(stage) == dcfg.bench_stage(base, n)
    vllm = dcfg.server_slice(stage, "vllm", both)
    assert [m["name"] for m in vllm["methods"]] == ["DScout(4) · vLLM"]
    assert vllm["runtime"] == "vllm" and vllm["names"] == both["benchmarks"]["names"]
    assert vllm["server"]["kv_cache_gb"] == both["serving"]["vllm"]["kv_cache_gb"]
    keys = dcfg.server_method_keys(stage, "vllm")
    drafter_id = vllm["methods"][0]["drafter_id"]
    assert keys == ["vllm-ar", f"vllm-dscout-bs4-{drafter_id}"]
    assert dcfg.server_method_keys(stage, "sglang") == []


@pytest.mark.parametrize("row, message", [
    ({**VLLM_ROW, "kind": "eagle3", "drafter": "eagle3", "block_size": 16, "topk": 4, "depth": 4},
     r"methods\[\d+\].topk: vLLM drafts EAGLE-3 as a chain \(top-1 per step\), not a tree: set topk: 1 "
     r"\(DScout\(4\) · vLLM, topk 4"),
    ({**VLLM_ROW, "kind": "pard2", "drafter": "pard2"},
     r"methods\[\d+\].backend: vllm serves dflash, dscout, eagle3 rows, not 'pard2'"),
    ({**VLLM_ROW, "block_size": "online"}, r"methods\[\d+\].block_size: a vllm row needs a fixed block size"),
    ({**VLLM_ROW, "backend": "sglang", "kind": "eagle3", "drafter": "eagle3", "block_size": 16},
     r"methods\[\d+\].drafter: SGLang's EAGLE-3 serves a published checkpoint; drafter 'eagle3'"),
])
def test_server_rows_a_runtime_cannot_serve_stop_the_plan(row, message):
    base = _base()
    cfg = dcfg.deep_merge(base, {"methods": [*base["methods"], row]})
    with pytest.raises(ValueError, match=message):
        dcfg.check_plan(cfg)


def test_a_vllm_eagle3_chain_row_plans():
    """vLLM serves our EAGLE-3 drafters as a chain (tests/test_vllm.py): a topk-1 row passes the plan check."""
    base = _base()
    row = {**VLLM_ROW, "name": "EAGLE-3 chain(4) · vLLM", "kind": "eagle3", "drafter": "eagle3", "topk": 1, "depth": 3}
    assert not dcfg.method_backend_problems(dcfg.validate_config(
        dcfg.deep_merge(base, {"methods": [*base["methods"], row]})))


def _rec(key, method, runtime, decode, repeat=0, bench="gsm8k", n=11):
    return {"benchmark": bench, "prompt_id": "p0", "turn": 0, "method": method,
            "method_name": "AR" if method == "ar" else key,
            "method_key": key, "drafter": None, "block_size": None, "temperature": 0.0, "repeat": repeat,
            "concurrency": 1, "new_tokens": n, "decode_seconds": decode, "accept_lengths": [1] * (n - 1),
            "output_ids": list(range(n)), "runtime": runtime}


def test_every_row_is_paired_with_ar_on_its_own_runtime(tmp_path):
    """Our engine's AR is 2x slower than vLLM's: our row's speedup divides by ours, vLLM's by vLLM's. A vLLM row without
    a vLLM AR is refused, naming the runtime. Table 3 labels the server rows with their runtime."""
    recs = [_rec("ar", "ar", "transformers", 2.0), _rec("dscout-bs4", "dscout", "transformers", 1.0),
            _rec("vllm-ar", "ar", "vllm", 1.0), _rec("vllm-dscout-bs4", "dscout", "vllm", 0.8)]
    rows = {r["method_key"]: r for r in summarize(recs) if r["benchmark"] == "gsm8k"}
    assert rows["dscout-bs4"]["speedup_mean"] == pytest.approx(2.0)
    assert rows["vllm-dscout-bs4"]["speedup_mean"] == pytest.approx(1.25)
    assert rows["vllm-ar"]["speedup_mean"] == pytest.approx(1.0) and rows["vllm-ar"]["runtime"] == "vllm"
    with pytest.raises(ValueError, match=r"no AR run on runtime 'vllm' paired with vllm-dscout-bs4"):
        summarize([r for r in recs if r["method_key"] != "vllm-ar"])
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_table3([path], str(tmp_path / "table3"), {})
    md = (tmp_path / "table3.md").read_text()
    lines = [line for line in md.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in lines[1:5]] == ["| AR", "| dscout-bs4", "| AR · vLLM",
                                                             "| vllm-dscout-bs4 · vLLM"]
    assert "1.25×" in lines[4]


def _stub_launch(extra_env=None, dying_from=None):
    """``launch`` for the servers: the stub with the exact server command line; from launch number ``dying_from``
    (0-based) on, each server exits on its second request (after the warm-up)."""
    launched = []

    def launch(cmd, log, env):
        args = cmd[cmd.index("sglang.launch_server") + 1:]
        die = {"STUB_DIE_AFTER": "1"} if dying_from is not None and len(launched) >= dying_from else {}
        launched.append(args)
        return subprocess.Popen([sys.executable, str(STUB), *args], stdout=log, stderr=subprocess.STDOUT,
                                env={**env, **(extra_env or {}), **die})
    launch.launched = launched
    return launch


@pytest.fixture(scope="module")
def tiny_target_dir(tmp_path_factory):
    """A prepared tiny-random target (tokenizer and chat template of Qwen3 from the mirror): what a server job reads."""
    from dscout.data.paths import data_root
    from dscout.models.target import prepare_target

    out = tmp_path_factory.mktemp("target")
    load_from = prepare_target("tiny-random:2:32", out, data_root(None))
    (out / "target.json").write_text(json.dumps({**json.loads((out / "target.json").read_text()),
                                                 "load_from": str(load_from)}))
    return out


def _sglang_stage(base):
    rows = [{**VLLM_ROW, "name": "DScout(4) · SGLang", "backend": "sglang"},
            {"name": "DFlash(16) · SGLang", "kind": "dflash", "drafter": "dflash", "block_size": 16,
             "backend": "sglang"}]
    cfg = dcfg.validate_config(dcfg.deep_merge(base, {"methods": [*base["methods"], *rows],
                                                      "benchmarks": {"names": ["gsm8k", "mt_bench"]}}))
    return dcfg.server_slice(dcfg.bench_stage(cfg, cfg["target"]["num_layers"]), "sglang", cfg)


def test_an_sglang_job_serves_every_method_and_keeps_finished_ones_when_a_server_dies(tiny_target_dir, tmp_path):
    """One job: SGLang's AR and two rows, each its own identified server, every benchmark one request at a time (MT-Bench
    twice: its second turn after the method's own first answer), greedy judged against SGLang's AR. A server that
    dies mid-job leaves the methods served before it in ``<out>.partial``; the rerun serves only the rest."""
    from dscout.data.paths import data_root
    from dscout.backends.server import ServerError
    from dscout.evaluation.server_bench import run_server_bench_job

    stage = _sglang_stage(_base())
    keys = {m["name"]: dcfg.method_key(m, m["drafter_id"]) for m in stage["methods"]}
    out = tmp_path / "r1.jsonl"
    partial = out.with_name(out.name + ".partial")
    drafters = {"dscout": "/drafters/dscout", "dflash": "/drafters/dflash"}
    job = {"stage": stage, "target_dir": str(tiny_target_dir), "drafters": drafters, "temperature": 0.0, "repeat": 1,
           "out": str(out), "root": data_root(None)}
    # repeat 1 rotates the order to DScout(4), DFlash(16), AR; the second server dies on its first measured request
    dying = _stub_launch(dying_from=1)
    with pytest.raises(ServerError, match=rf"Table 3 on sglang, T=0, repeat 1, method {keys['DFlash(16) · SGLang']}: "
                                          r"the server on port \d+ exited with code 3 during the request gsm8k/"):
        run_server_bench_job(**job, launch=dying)
    assert not out.exists()
    assert sorted(p.name for p in partial.iterdir()) == ["job.json", f"{keys['DScout(4) · SGLang']}.jsonl"]
    assert "--speculative-num-draft-tokens" in dying.launched[0] and "/drafters/dscout" in dying.launched[0]
    # the rerun serves the two methods left: warm-up + gsm8k (1 turn) + MT-Bench (2 turns) each
    sent = tmp_path / "sent.jsonl"
    again = _stub_launch({"STUB_LOG": str(sent)})
    recs = run_server_bench_job(**job, launch=again)
    assert len(again.launched) == 2
    assert sorted(recs) == sorted(["sglang-ar", *keys.values()])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 3 * 3 and {r["runtime"] for r in lines} == {"sglang"}
    assert all(r["matches_ar"] for r in lines if r["method"] != "ar")
    assert sorted({r["turn"] for r in lines if r["benchmark"] == "mt_bench"}) == [0, 1]
    asked = [json.loads(x) for x in sent.read_text().splitlines()]
    assert len(asked) == 2 * 4
    assert len(asked[3]) > len(asked[2])  # MT-Bench's second turn holds the first turn and the method's answer
    assert not partial.exists()
    rows = {r["method_key"]: r for r in summarize(lines) if r["benchmark"] == "average"}
    assert rows[keys["DScout(4) · SGLang"]]["runtime"] == "sglang"
    assert rows[keys["DScout(4) · SGLang"]]["mat_mean"] > 1
    # records kept under another stage (the config changed between attempts) are discarded, not mixed in
    partial.mkdir()
    (partial / "job.json").write_text(json.dumps({"stage": "an older one"}))
    (partial / "sglang-ar.jsonl").write_text(json.dumps({**lines[0], "output_text": "stale"}) + "\n")
    fresh = _stub_launch()
    run_server_bench_job(**job, launch=fresh)
    assert len(fresh.launched) == 3
    assert "stale" not in out.read_text()
