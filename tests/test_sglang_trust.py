"""Servers you can trust (issue 47): a free port per server, the server's own description checked before anything is
measured, warm-up prompts outside the measured ones, and clear errors naming the job and the port. Against a stub
HTTP server on loopback that answers like SGLang (tests/sglang_stub.py)."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dscout.backends.sglang import (ServerError, check_server_identity, expected_identity, free_port,
                                    serve_benchmark)

STUB = Path(__file__).with_name("sglang_stub.py")
DSCOUT = {"kind": "dscout", "block_size": 16, "drafter_id": "dscout-x", "key": "dscout-bs16"}


def _stub_launch(extra_env=None):
    """``launch`` for serve_benchmark: the stub with the exact server command line (after ``-m sglang.launch_server``)."""

    def launch(cmd, log, env):
        args = cmd[cmd.index("sglang.launch_server") + 1:]
        return subprocess.Popen([sys.executable, str(STUB), *args], stdout=log, stderr=subprocess.STDOUT,
                                env={**env, **(extra_env or {})})

    return launch


def _requests(n, start=0):
    return [{"benchmark": "gsm8k", "prompt_id": f"p{i}", "turn": 0, "input_ids": [i, 1, 2]}
            for i in range(start, start + n)]


def test_a_free_port_per_server_the_identity_checked_and_warm_up_prompts_not_measured(tmp_path):
    sent = tmp_path / "sent.txt"
    measured, warm = _requests(6), _requests(2, start=100)
    recs, summary = serve_benchmark("/models/qwen3-8b", DSCOUT, measured, concurrency=2, temperature=0.0,
                                    max_new_tokens=5, repeat=3, drafter_dir="/drafters/dscout-x",
                                    warmup_requests=warm, launch=_stub_launch({"STUB_LOG": str(sent)}),
                                    health_timeout=30, log_path=tmp_path / "server.log")
    assert summary["port"] != 30000 and len(recs) == 6
    assert {r["prompt_id"] for r in recs} == {f"p{i}" for i in range(6)}  # the warm-up's prompts are not records
    assert all(r["repeat"] == 3 and r["concurrency"] == 2 and r["block_size"] == 16 for r in recs)
    firsts = [json.loads(line)[0] for line in sent.read_text().splitlines()]
    assert sorted(firsts[:2]) == [100, 101] and sorted(firsts[2:]) == list(range(6))  # warm-up first, apart
    # no fixed port: the next server gets a free one too
    _, again = serve_benchmark("/models/qwen3-8b", {"kind": "ar", "key": "ar"}, measured[:2], concurrency=1,
                               temperature=0.0, max_new_tokens=3, repeat=0, drafter_dir=None,
                               launch=_stub_launch(), health_timeout=30)
    assert again["port"] > 0


@pytest.mark.parametrize("lie, field", [({"speculative_num_draft_tokens": 8}, "speculative_num_draft_tokens"),
                                        ({"model_path": "/models/other"}, "model_path"),
                                        ({"speculative_algorithm": "EAGLE3"}, "speculative_algorithm")])
def test_a_server_that_is_not_the_methods_is_refused_naming_the_port_and_the_mismatch(tmp_path, lie, field):
    with pytest.raises(ServerError) as err:
        serve_benchmark("/models/qwen3-8b", DSCOUT, _requests(2), concurrency=1, temperature=0.0,
                        max_new_tokens=3, repeat=0, drafter_dir="/drafters/dscout-x", job="serving c=1 r0",
                        launch=_stub_launch({"STUB_LIE": json.dumps(lie)}), health_timeout=30)
    msg = str(err.value)
    assert "serving c=1 r0" in msg and f"{field}: server says {next(iter(lie.values()))!r}" in msg
    assert "port " in msg and "refusing" in msg


def test_another_jobs_server_on_the_picked_port_is_refused_not_measured(tmp_path):
    """The issue's failure: four serving jobs on one node, and one job's client accepted another's healthy server."""
    foreign = {}

    def launch(cmd, log, env):  # another job's AR server grabs the port before ours binds; ours never comes up
        port = cmd[cmd.index("--port") + 1]
        foreign["proc"] = subprocess.Popen([sys.executable, str(STUB), "--model-path", "/models/qwen3-8b", "--port",
                                            port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    try:
        with pytest.raises(ServerError, match=r"port \d+ is not this method's server \(speculative_algorithm: "
                                              r"server says None, expected 'DFLASH'"):
            serve_benchmark("/models/qwen3-8b", DSCOUT, _requests(2), concurrency=1, temperature=0.0,
                            max_new_tokens=3, repeat=0, drafter_dir="/drafters/dscout-x", launch=launch,
                            health_timeout=30)
    finally:
        foreign["proc"].kill()


def test_a_port_in_use_and_a_server_dying_in_the_warm_up_are_named_errors(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ServerError, match=f"serving dscout-bs16 at c=1, repeat 0: port {port} is in use"):
            serve_benchmark("/models/qwen3-8b", DSCOUT, _requests(2), concurrency=1, temperature=0.0,
                            max_new_tokens=3, repeat=0, drafter_dir="/drafters/dscout-x", port=port,
                            launch=_stub_launch(), health_timeout=30)
    with pytest.raises(ServerError, match=r"serving dscout-bs16 at c=2, repeat 1: the server on port \d+ .*during "
                                          r"the warm-up.*server log: .*server.log"):
        serve_benchmark("/models/qwen3-8b", DSCOUT, _requests(4), concurrency=2, temperature=0.0,
                        max_new_tokens=3, repeat=1, drafter_dir="/drafters/dscout-x",
                        warmup_requests=_requests(2, start=50), launch=_stub_launch({"STUB_DIE_AFTER": "1"}),
                        health_timeout=30, log_path=tmp_path / "server.log")
    with pytest.raises(ServerError, match=r"the server on port \d+ .*during the measured closed loop"):
        serve_benchmark("/models/qwen3-8b", DSCOUT, _requests(4), concurrency=1, temperature=0.0,
                        max_new_tokens=3, repeat=1, drafter_dir="/drafters/dscout-x",
                        warmup_requests=_requests(1, start=50), launch=_stub_launch({"STUB_DIE_AFTER": "3"}),
                        health_timeout=30)


def test_the_expected_identity_is_the_launched_command_lines():
    ident = expected_identity("/m", {"kind": "eagle3", "block_size": 60, "topk": 10, "num_steps": 7}, "/e", 4321)
    assert ident == {"model_path": "/m", "port": 4321, "speculative_algorithm": "EAGLE3",
                     "speculative_num_draft_tokens": 60, "speculative_draft_model_path": "/e"}
    assert expected_identity("/m", {"kind": "ar"}, None, 1) == {"model_path": "/m", "port": 1,
                                                                "speculative_algorithm": None}
    check_server_identity({"model_path": "/m/", "port": "1", "speculative_algorithm": None},
                          {"model_path": "/m", "port": 1, "speculative_algorithm": None}, port=1, job="j")
    with pytest.raises(ServerError, match="port: server says 2, expected 1"):
        check_server_identity({"model_path": "/m", "port": 2, "speculative_algorithm": None},
                              {"model_path": "/m", "port": 1, "speculative_algorithm": None}, port=1, job="j")


def test_a_serving_job_on_the_sglang_backend_end_to_end_against_the_stub(tmp_path, monkeypatch):
    """`dscout serve-cpu`'s job (:func:`dscout.evaluation.serving.run_serving_job`) as the paper preset's
    serving_benchmark job runs it, with the stub in SGLang's place:
    a pool of pool_factor x max(concurrency) measured prompts, c warm-up prompts from beyond it, every server on
    its own checked port, the repeat's index in every record."""
    import functools

    from dscout import config as dcfg
    from dscout.evaluation.serving import run_serving_job, sglang_serving_methods
    from dscout.backends import sglang
    from tests.workflow import DATA, ROOT

    cfg = dcfg.load_config(ROOT / "config.yaml", ROOT / "presets" / "paper.yaml")
    cfg["serving"]["max_new_tokens"] = 4
    L = cfg["target"]["num_layers"]
    ids = {n: dcfg.drafter_id(cfg, n, L) for n in cfg["drafters"]}
    stage = dcfg.serving_stage(cfg, ids)
    assert stage["pool_size"] == 4 * 32 == dcfg.serving_pool_size(cfg) and "repeats" not in stage
    stage["pool_size"] = 6  # a small pool: the job's logic, not the paper's size
    target = tmp_path / "target"
    target.mkdir()
    (target / "target.json").write_text(json.dumps({"load_from": str(DATA / "tokenizers" / "qwen3")}))
    sent = tmp_path / "sent.txt"
    monkeypatch.setenv("STUB_LOG", str(sent))
    monkeypatch.setattr(sglang, "serve_benchmark", functools.partial(sglang.serve_benchmark, launch=_stub_launch(),
                                                                     health_timeout=30))
    out = tmp_path / "c2" / "r1.jsonl"
    out.parent.mkdir()
    run_serving_job(json.loads(json.dumps(stage)), target_dir=str(target),
                    drafters={"dflash": "/d/dflash", "dscout": "/d/dscout"}, concurrency=2, repeat=1, out=str(out),
                    root=DATA)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    keys = [k for k, *_ in sglang_serving_methods(stage, {"dflash": "/d/dflash", "dscout": "/d/dscout"})]
    assert sorted({r["method_key"] for r in recs}) == sorted(keys) and len(recs) == 6 * len(keys)
    assert {r["repeat"] for r in recs} == {1} and {r["concurrency"] for r in recs} == {2}
    measured = {r["prompt_id"] for r in recs}
    assert len(measured) == 6
    # per server: 2 warm-up requests, prompts outside the measured pool, then the 6 measured ones (the same for all)
    lines = sent.read_text().splitlines()
    assert len(lines) == len(keys) * (2 + 6)
    servers = [lines[i:i + 8] for i in range(0, len(lines), 8)]
    pool = set(servers[0][2:])
    assert len(pool) == 6 and all(set(s[2:]) == pool and len(set(s[:2])) == 2 and not set(s[:2]) & pool
                                  for s in servers)
    assert [json.loads(line)["method_key"] for line in out.read_text().splitlines()][0] == keys[1]  # rotated by 1
    assert all(r["server_port"] > 0 for r in recs)
