"""The SGLang path's pure parts (no GPU, no SGLang): server command lines and record conversion."""

from dscout.analysis.aggregate import summarize
from dscout.bench.serving import record_from_response, server_command


def test_server_commands_per_method():
    ar = server_command("Qwen/Qwen3-8B", {"kind": "ar"}, 30000, 8)
    assert "--speculative-algorithm" not in ar and ar[ar.index("--port") + 1] == "30000"
    assert ar[ar.index("--host") + 1] == "127.0.0.1"  # loopback only
    ds = server_command("Qwen/Qwen3-8B", {"kind": "dscout", "block_size": 32}, 30001, 16, "results/drafters/x")
    assert ds[ds.index("--speculative-algorithm") + 1] == "DFLASH"
    assert ds[ds.index("--speculative-num-draft-tokens") + 1] == "32"
    assert ds[ds.index("--speculative-draft-model-path") + 1] == "results/drafters/x"
    assert ds[ds.index("--cuda-graph-max-bs") + 1] == "32"  # >= 32 so batches never fall back to eager
    e3 = server_command("Qwen/Qwen3-8B", {"kind": "eagle3", "block_size": 60}, 30002, 1, "AngelSlim/Qwen3-8B_eagle3")
    assert e3[e3.index("--speculative-eagle-topk") + 1] == "10" and e3[e3.index("--speculative-num-steps") + 1] == "7"


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
