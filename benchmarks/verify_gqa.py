"""Table 4's verify with and without grouped-head attention under a mask, side by side in one process.

transformers' SDPA path copies the KV cache to every query head (``repeat_kv``) when a mask is given and a block of
more than one token is verified: the batched engine's drafted rounds. ``TRANSFORMERS_SDPA_FORCE_GQA=1`` (set by
:class:`dscout.models.target.TargetModel` on the CPU) lets the CPU kernel attend the grouped heads itself. This
serves the same c requests with AR and DScout at bs 2 (Table 4's DScout(best) at high c), the switch alternating
off / on / on / off ..., one prefill shared by all, and reports each batch's decode seconds, verify seconds and
throughput ratio to AR's of the same pass; the outputs must equal AR's in every batch.

    python benchmarks/verify_gqa.py --target results/target/<id> --dscout results/drafters/<id> --concurrency 32 \
        --passes 4 --out reports/verify_gqa/report.md
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--dscout", required=True)
    p.add_argument("--data-root", default="../shared/data")
    p.add_argument("--benchmarks", default="gsm8k,math500,humaneval,mbpp,livecodebench,mt_bench")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--block-size", type=int, default=2)
    p.add_argument("--passes", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "reports" / "verify_gqa" / "report.md"))
    a = p.parse_args(argv)
    t0 = time.perf_counter()

    from dscout.decoding.batched import BatchedSpeculativeEngine
    from dscout.decoding.proposers import BlockDiffusionProposer
    from dscout.models.export import drafter_for_target
    from dscout.provenance import report_header
    from serving_batch import emit_report, load_serving_batch

    target, _, prompts, stops = load_serving_batch(a.target, a.data_root, a.benchmarks, a.concurrency, a.threads)
    d = drafter_for_target(a.dscout, target, packed=True)
    store: dict = {}
    ar = BatchedSpeculativeEngine(target, None, stops)
    spec = BatchedSpeculativeEngine(target, lambda: BlockDiffusionProposer(d), stops)
    ar.generate(prompts, 2, prefill_store=store)  # prefills and warm-up, untimed
    spec.generate(prompts, 1 + a.block_size, a.block_size, prefill_store=store)
    res = {s: {"ar": [], "spec": [], "spec_verify": [], "ratio": []} for s in ("0", "1")}
    for k in range(a.passes):
        switch = "01"[(k + k // 2) % 2]  # off on on off off on ...
        os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = switch
        o_ar = ar.generate(prompts, a.max_new_tokens, prefill_store=store)
        o_sp = spec.generate(prompts, a.max_new_tokens, a.block_size, prefill_store=store)
        assert [r.output_ids for r in o_sp.results] == [r.output_ids for r in o_ar.results], "output != AR"
        r = res[switch]
        r["ar"].append(o_ar.decode_seconds)
        r["spec"].append(o_sp.decode_seconds)
        r["spec_verify"].append(sum(o_sp.verify_seconds))
        r["ratio"].append(o_ar.decode_seconds / o_sp.decode_seconds)  # same tokens: throughput ratio
        print(f"pass {k} (force_gqa={switch}): AR {o_ar.decode_seconds:.2f} s, bs {a.block_size} "
              f"{o_sp.decode_seconds:.2f} s (verify {r['spec_verify'][-1]:.2f} s), {r['ratio'][-1]:.3f}x AR",
              flush=True)
    med = statistics.median
    lines = ["# Table 4's verify with grouped-head attention under a mask (one process, switch alternating)", "",
             f"c = {a.concurrency}, {a.max_new_tokens} new tokens per request, greedy, DScout at bs {a.block_size} "
             f"against AR, {a.passes} passes, {a.threads} threads, float32 with packed linears; target {a.target}, "
             f"drafter {a.dscout}. Outputs equal AR's in every pass.", "",
             "| TRANSFORMERS_SDPA_FORCE_GQA | AR decode s | DScout decode s | of which verify s | DScout / AR "
             "throughput |", "|---|---|---|---|---|"]
    for s, name in (("0", "0 (repeat_kv: the cache copied per head)"), ("1", "1 (grouped heads in the kernel)")):
        r = res[s]
        if r["ar"]:
            lines.append(f"| {name} | {med(r['ar']):.2f} | {med(r['spec']):.2f} | {med(r['spec_verify']):.2f} | "
                         f"{med(r['ratio']):.3f} [{min(r['ratio']):.3f}, {max(r['ratio']):.3f}] |")
    command = "python benchmarks/verify_gqa.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    lines = report_header(lines[0][2:], command, time.perf_counter() - t0) + lines[2:]
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    emit_report(lines, a.out)


if __name__ == "__main__":
    sys.exit(main())
