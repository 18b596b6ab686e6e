"""The SGLang path without a GPU: every server command line parsed by the pinned SGLang's own argument parser,
and the record conversion."""

import pytest

from dscout import config as dcfg
from dscout.analysis.aggregate import summarize
from dscout.backends.sglang import record_from_response, server_command
from dscout.evaluation.serving import sglang_serving_methods
from tests import sglang_parser
from tests.workflow import ROOT


def _paper_server_commands():
    """Every ``sglang.launch_server`` command the paper preset's Table 4 jobs build, per concurrency level."""
    cfg = dcfg.load_config(ROOT / "config.yaml", ROOT / "presets" / "paper.yaml")
    L = cfg["target"]["num_layers"]
    ids = {n: dcfg.drafter_id(cfg, n, L) for n in cfg["drafters"]}
    stage = dcfg.serving_stage(cfg, ids)
    drafters = {"dflash": f"results/drafters/{ids['dflash']}", "dscout": f"results/drafters/{ids['dscout']}"}
    out = []
    for c in cfg["concurrency"]:
        for key, method, ddir in sglang_serving_methods(stage, drafters):
            cmd = server_command(stage["target_source"], method, 30000, c, ddir)
            assert cmd[1:3] == ["-m", "sglang.launch_server"]
            out.append((c, key, method, ddir, cmd[3:]))
    return out


@pytest.fixture(scope="module")
def parsed():
    cmds = _paper_server_commands()
    return cmds, sglang_parser.parse([argv for *_, argv in cmds])


def test_every_server_command_parses_with_sglangs_parser(parsed):
    cmds, results = parsed
    kinds = {m["kind"] for _, _, m, _, _ in cmds}
    assert kinds == {"ar", "eagle3", "dflash", "dscout"}  # AR, EAGLE-3, DFlash and DScout are all served
    for (c, key, method, ddir, _), res in zip(cmds, results):
        assert "error" not in res, f"{key} at c={c}: {res['error']}"
        a = res["args"]
        assert a["host"] == "127.0.0.1" and a["port"] == 30000  # loopback only
        assert a["model_path"] == "Qwen/Qwen3-8B" and a["dtype"] == "bfloat16"
        assert a["cuda_graph_max_bs_decode"] >= max(c, 32) and a["max_running_requests"] >= c
        if method["kind"] == "ar":
            assert res["algorithm"] is None and a["speculative_draft_model_path"] is None
            continue
        assert a["speculative_draft_model_path"] == ddir
        assert a["speculative_num_draft_tokens"] == method["block_size"]
        if method["kind"] == "eagle3":
            assert res["algorithm"] == "EAGLE3" and ddir == "AngelSlim/Qwen3-8B_eagle3"
            assert a["speculative_eagle_topk"] == 10 and a["speculative_num_steps"] == 6
        else:
            assert res["algorithm"] == "DFLASH"


def test_table3_server_commands_of_the_paper_preset_parse_with_sglangs_parser():
    """The paper preset's Table 3 rows on SGLang (DFlash, DScout at bs 16 and 32, EAGLE-3(60)) and SGLang's AR: each
    server line as the benchmark_sglang job builds it, parsed by the pinned SGLang; PARD-2 and DScout(online) stay on
    our engine beside its AR."""
    from dscout.evaluation.server_bench import server_methods, sglang_drafter_path

    cfg = dcfg.load_config(ROOT / "config.yaml", ROOT / "presets" / "paper.yaml")
    L = cfg["target"]["num_layers"]
    stage = dcfg.bench_stage(cfg, L)
    engine = [m["name"] for m in dcfg.engine_slice(stage)["methods"]]
    assert engine == ["DScout(online)", "PARD-2(8)"]
    methods = server_methods(dcfg.server_slice(stage, "sglang", cfg), "sglang")
    assert [m["key"].split("-")[:3] for m in methods] == [["sglang", "ar"], ["sglang", "dflash", "bs16"],
                                                        ["sglang", "dscout", "bs16"], ["sglang", "dscout", "bs32"],
                                                        ["sglang", "eagle3", "bs60"]]
    drafters = {n: f"results/drafters/{dcfg.drafter_id(cfg, n, L)}" for n in ("dflash", "dscout")}
    cmds = [server_command("Qwen/Qwen3-8B", m, 30000, 1, sglang_drafter_path(m, drafters))[3:] for m in methods]
    for m, res in zip(methods, sglang_parser.parse(cmds)):
        assert "error" not in res, f"{m['key']}: {res['error']}"
        a = res["args"]
        assert a["port"] == 30000 and a["model_path"] == "Qwen/Qwen3-8B"
        if m["kind"] == "ar":
            assert res["algorithm"] is None
        elif m["kind"] == "eagle3":
            assert res["algorithm"] == "EAGLE3" and a["speculative_draft_model_path"] == "AngelSlim/Qwen3-8B_eagle3"
            assert (a["speculative_num_draft_tokens"], a["speculative_eagle_topk"], a["speculative_num_steps"]) == \
                (60, 10, 6)
        else:
            assert res["algorithm"] == "DFLASH" and a["speculative_num_draft_tokens"] == m["block_size"]
            assert a["speculative_draft_model_path"] == drafters[m["drafter"]]


def test_sglangs_parser_rejects_what_it_does_not_know():
    """The check can fail: the flag this project used before SGLang 0.5.2x split it is refused, PARD is unknown."""
    base = ["--model-path", "Qwen/Qwen3-8B"]
    old, pard = sglang_parser.parse([base + ["--cuda-graph-max-bs", "32"],
                                     base + ["--speculative-algorithm", "PARD"]])
    assert "ambiguous option" in old["error"] or "unrecognized" in old["error"]
    assert "PARD" in pard["error"]
    with pytest.raises(KeyError, match="no SGLang server"):
        server_command("Qwen/Qwen3-8B", {"kind": "pard2", "block_size": 8}, 30000, 1)


def _resp(n, verify=None, hist=None, latency=2.0):
    meta = {"completion_tokens": n, "e2e_latency": latency}
    if verify:
        meta.update(spec_verify_ct=verify, spec_accept_length=n / verify)
    if hist is not None:
        meta["spec_correct_drafts_histogram"] = hist
    return {"output_ids": list(range(n)), "text": "x", "meta_info": meta}


def test_records_from_sglang_answers_feed_the_same_aggregation():
    kw = dict(benchmark="gsm8k", prompt_id="p", turn=0, temperature=0.0, repeat=0, concurrency=8, wall_seconds=2.1)
    ar = record_from_response(_resp(101, latency=4.0), method={"kind": "ar", "key": "ar"}, **kw)
    # 10 rounds: 2 with 0 correct drafts, 3 with 4, 5 with 15 -> lengths 1, 5, 16
    ds = record_from_response(_resp(101, verify=10, hist=[2, 0, 0, 0, 3] + [0] * 10 + [5], latency=1.0),
                              method={"kind": "dscout", "key": "dscout-bs16", "block_size": 16}, **kw)
    assert ds["accept_lengths"] == [1, 1, 5, 5, 5] + [16] * 5 and ds["accept_lengths_exact"]
    mean_only = record_from_response(_resp(50, verify=10), method={"kind": "dflash", "key": "d", "block_size": 16},
                                     **kw)
    assert mean_only["accept_lengths"] == [5] * 10 and not mean_only["accept_lengths_exact"]
    rows = summarize([ar, ds])
    cell = next(r for r in rows if r["method_key"] == "dscout-bs16" and r["benchmark"] == "gsm8k")
    assert abs(cell["speedup_mean"] - 4.0) < 1e-9 and abs(cell["mat_mean"] - 9.7) < 1e-9
    assert cell["concurrency"] == 8


def test_the_vllm_jobs_read_the_target_on_the_cpu_and_let_it_go_before_a_server_starts(tmp_path, monkeypatch):
    """Table 4's and Table 3's vLLM jobs load the target only to write the drafter in vLLM's layout: on the CPU
    whatever ``target.device`` says (on a cluster node the server reserves most of the GPU when it starts, and the
    target's weights there would leave it short), and released before the first server starts."""
    import gc
    import json
    import weakref
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from dscout.backends import vllm as vllm_backend
    from dscout.evaluation import server_bench, vllm_serving
    from dscout.models import target as target_mod
    from tests.workflow import DATA

    tok = AutoTokenizer.from_pretrained(str(DATA / "tokenizers" / "qwen3"))
    tdir = tmp_path / "target"
    tdir.mkdir()
    (tdir / "target.json").write_text(json.dumps({"load_from": str(tdir), "stage": {"device": "cuda",
                                                                                      "dtype": "float32"}}))
    loads, alive = [], []

    class Loaded:  # what TargetModel.load returns here: a weak reference tells whether it was let go
        def __init__(self):
            self.tokenizer, self.dtype = tok, "float32"

    def load(path, dtype, device, attn_implementation=None):
        loads.append(device)
        m = Loaded()
        alive.append(weakref.ref(m))
        return m

    def at_server_start(*a, **k):  # the first server: the loaded target is gone by now
        gc.collect()
        assert all(r() is None for r in alive), "the target is still held when a vLLM server starts"
        return []

    monkeypatch.setattr(target_mod.TargetModel, "load", staticmethod(load))
    monkeypatch.setattr(target_mod, "process_device", lambda name: pytest.fail("the configured device was used"))
    monkeypatch.setattr(vllm_backend, "export_drafter", lambda kind, d, target, out: out)
    monkeypatch.setattr(server_bench, "vllm_interpreter", lambda python, env: "python")
    monkeypatch.setattr(vllm_serving, "vllm_serving_records", at_server_start)
    stage = {"benchmarks": ["gsm8k", "humaneval"], "pool_size": 2, "seed": 0, "concurrency": [1, 2],
             "chat": {"system_prompt": None, "enable_thinking": False, "stop_tokens": ["<|im_end|>"]},
             "max_new_tokens": 4, "vllm": {"block_sizes": [4]}}
    vllm_serving.run_vllm_serving_job(stage, target_dir=str(tdir), drafter_dir=str(tmp_path / "drafter"), repeat=0,
                                      out=str(tmp_path / "serving" / "r0.jsonl"), root=DATA)
    assert loads == ["cpu"]
    # Table 3's vLLM rows (one server per method): the same, and the servers get the tokenizer only
    opened = []

    def records(open_server, todo, prompts, budgets, **k):
        gc.collect()
        assert all(r() is None for r in alive), "the target is still held when a vLLM server starts"
        opened.extend(m["key"] for m in todo)
        return {m["key"]: [] for m in todo}

    monkeypatch.setattr(server_bench, "server_bench_records", records)
    monkeypatch.setattr(server_bench, "judge_against_ar", lambda recs, key: None)
    monkeypatch.setattr(server_bench, "server_methods", lambda stage, runtime: [
        {"key": "vllm-ar", "kind": "ar"}, {"key": "vllm-dscout-bs4", "kind": "dscout", "drafter": "dscout"}])
    import dscout.config
    import dscout.data.benchmarks

    monkeypatch.setattr(dscout.data.benchmarks, "stage_prompts", lambda b, bench, root: [])
    monkeypatch.setattr(dscout.config, "benchmark_slice", lambda stage, bench: {"benchmarks": {"max_new_tokens": 4}})
    bench_stage = {"runtime": "vllm", "names": ["gsm8k"], "chat": stage["chat"],
                   "server": {"kv_cache_gb": 1, "dtype": "float32", "max_model_len": 512, "enforce_eager": True}}
    server_bench.run_server_bench_job(bench_stage, temperature=0.0, repeat=0, target_dir=str(tdir),
                                      drafters={"dscout": str(tmp_path / "d")},
                                      out=str(tmp_path / "bench" / "r0.jsonl"), root=DATA)
    assert loads == ["cpu", "cpu"] and opened == ["vllm-ar", "vllm-dscout-bs4"]
