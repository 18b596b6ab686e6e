"""Finished requests leaving Table 4's batch (``compact``), against keeping them as padding: side by side.

Speculative requests of one batch finish after different numbers of rounds; without compaction the batch's last
rounds verify (and append to the cache of) every finished row as padding. This serves the same c requests with AR
and DScout at fixed block sizes (and optionally DFlash), the engines' ``compact`` alternating off / on / on / off
..., one prefill shared by all, and reports per setting each method's decode seconds, rounds, mean rows per round
and throughput ratio to the AR batch of the same pass (AR's requests all finish in the same round, so compaction
cannot change AR beyond noise). Outputs must equal AR's in every batch.

    python benchmarks/batch_compaction.py --target results/target/<id> --dscout results/drafters/<id> \
        --concurrency 8,16,32 --passes 4 --out reports/batch_compaction/report.md
"""

from __future__ import annotations

import argparse
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
    p.add_argument("--dflash", default=None, help="also DFlash at bs 16 (its drafter dir)")
    p.add_argument("--data-root", default="../shared/data")
    p.add_argument("--benchmarks", default="gsm8k,math500,humaneval,mbpp,livecodebench,mt_bench")
    p.add_argument("--concurrency", default="8,16,32", help="comma list")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--block-sizes", default="2,4")
    p.add_argument("--passes", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "reports" / "batch_compaction" / "report.md"))
    a = p.parse_args(argv)
    t0 = time.perf_counter()

    from dscout.decoding.batched import BatchedSpeculativeEngine
    from dscout.decoding.proposers import BlockDiffusionProposer
    from dscout.models.export import drafter_for_target
    from dscout.provenance import report_header
    from serving_batch import emit_report, load_serving_batch

    levels = [int(c) for c in a.concurrency.split(",")]
    target, _, pool, stops = load_serving_batch(a.target, a.data_root, a.benchmarks, max(levels), a.threads)
    ds = drafter_for_target(a.dscout, target, packed=True)
    methods = {f"dscout-bs{b}": (ds, int(b)) for b in a.block_sizes.split(",")}
    if a.dflash:
        methods["dflash-bs16"] = (drafter_for_target(a.dflash, target, packed=True), 16)
    med = statistics.median
    lines = ["# Finished requests leaving the batch (`compact`), side by side", "",
             f"{a.max_new_tokens} new tokens per request, greedy, {a.passes} passes per c with `compact` alternating "
             f"off / on / on / off, {a.threads} threads, float32 with packed linears; target {a.target}, DScout "
             f"{a.dscout}{', DFlash ' + a.dflash if a.dflash else ''}. Outputs equal AR's in every batch. Ratio = "
             "AR's decode seconds of the same pass / the method's (same tokens).", "",
             "| c | method | compact | decode s | rounds | mean rows per round | throughput / AR |",
             "|---|---|---|---|---|---|---|"]
    for c in levels:
        prompts = pool[:c]
        store: dict = {}
        engines = {}
        for compact in (False, True):
            engines["ar", compact] = (BatchedSpeculativeEngine(target, None, stops, compact=compact), 1)
            for name, (d, bs) in methods.items():
                engines[name, compact] = (BatchedSpeculativeEngine(
                    target, (lambda d=d: BlockDiffusionProposer(d)), stops, compact=compact), bs)
        for (name, compact), (eng, bs) in engines.items():  # prefills and warm-up, untimed
            eng.generate(prompts, 1 + bs, bs, prefill_store=store)
        res: dict = {}
        for k in range(a.passes):
            compact = bool((k + k // 2) % 2)  # off on on off off on ...
            eng, _ = engines["ar", compact]
            o_ar = eng.generate(prompts, a.max_new_tokens, prefill_store=store)
            ref = [r.output_ids for r in o_ar.results]
            res.setdefault(("ar", compact), []).append((o_ar.decode_seconds, len(o_ar.rows),
                                                        statistics.mean(o_ar.rows), 1.0))
            for name in methods:
                eng, bs = engines[name, compact]
                o = eng.generate(prompts, a.max_new_tokens, bs, prefill_store=store)
                assert [r.output_ids for r in o.results] == ref, f"{name} output != AR at c = {c}"
                res.setdefault((name, compact), []).append((o.decode_seconds, len(o.rows), statistics.mean(o.rows),
                                                            o_ar.decode_seconds / o.decode_seconds))
            print(f"c = {c} pass {k} compact={compact}: " + ", ".join(
                f"{n} {v[-1][0]:.2f} s {v[-1][3]:.3f}x" for (n, cp), v in res.items() if cp == compact), flush=True)
        for name in ["ar", *methods]:
            for compact in (False, True):
                v = res.get((name, compact))
                if not v:
                    continue
                ratios = [x[3] for x in v]
                lines.append(f"| {c} | {name} | {'on' if compact else 'off'} | {med(x[0] for x in v):.2f} | "
                             f"{med(x[1] for x in v):.0f} | {med(x[2] for x in v):.1f} | {med(ratios):.3f} "
                             f"[{min(ratios):.3f}, {max(ratios):.3f}] |")
    command = "python benchmarks/batch_compaction.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    lines = report_header(lines[0][2:], command, time.perf_counter() - t0) + lines[2:]
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    emit_report(lines, a.out)


if __name__ == "__main__":
    sys.exit(main())
