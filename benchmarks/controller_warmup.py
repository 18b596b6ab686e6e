"""Does Table 4's DScout(online) need earlier traffic? A controller warmed on one batch against a cold one, one job.

Table 4 on the CPU runs one job per (concurrency, repeat), and a job's online controller used to start from its
calibration and prior: at 16 tokens per request a batch is ~14 rounds, and the prior's exploration (optimism about
an unseen drafter) drafts through most of them where drafting loses to AR. ``serving.online_warmup`` lets the
controller first serve batches of c requests from beyond the measured pool, untimed, as a serving system's
controller has served earlier traffic. This study measures both in the same job, side by side: per concurrency level
and repeat, one :func:`dscout.evaluation.serving.serving_records` call decodes the same c measured requests with AR,
DScout at ``--block-size`` and two DScout(online) columns whose controllers start from the same calibration (one
latency model per level, copied): ``warm`` first serves ``--warmup-batches`` batches of c spare prompts, ``cold``
does not. Reported per level: each column's throughput over AR's in the same call (median [min, max] over
repeats) and the mean bs the controllers chose.

    python benchmarks/controller_warmup.py --target results/target/<id> --dscout results/drafters/<id> \
        --concurrency 1,8,16,32 --repeats 3 --out reports/controller_warmup/report.md

Nothing else may run meanwhile (2 cores).
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--dscout", required=True, help="the DScout drafter's folder")
    p.add_argument("--data-root", default="../shared/data")
    p.add_argument("--benchmarks", default="gsm8k,humaneval", help="the serving pool's benchmarks (Table 4's)")
    p.add_argument("--concurrency", default="1,8,16,32")
    p.add_argument("--repeats", type=int, default=3, help="calls per level (fresh controllers each: one job each)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--block-size", type=int, default=4, help="the fixed-bs DScout column")
    p.add_argument("--warmup-batches", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "reports" / "controller_warmup" / "report.md"),
                   help="report.md (and its .json beside it); '' = print only")
    a = p.parse_args(argv)
    t_start = time.perf_counter()

    from dscout.decoding.proposers import BlockDiffusionProposer
    from dscout.evaluation.methods import online_controller, typical_context_tokens
    from dscout.evaluation.serving import serving_records
    from dscout.models.export import drafter_for_target
    from serving_batch import emit_report, load_serving_target, serving_prompts

    target, stops = load_serving_target(a.target, a.threads)
    dscout = drafter_for_target(a.dscout, target, packed=True)
    levels = [int(x) for x in a.concurrency.split(",") if x]
    keys = ["ar", f"dscout-bs{a.block_size}", "online-warm", "online-cold"]
    ratio = {c: {k: [] for k in keys} for c in levels}
    mean_bs = {c: {k: [] for k in keys[2:]} for c in levels}
    ar_tps = {c: [] for c in levels}
    for c in levels:
        pool, prompts, warm = serving_prompts(target.tokenizer, a.data_root, a.benchmarks, c, c * a.warmup_batches)
        if len(warm) < c * a.warmup_batches:
            raise SystemExit(f"--benchmarks {a.benchmarks} hold too few prompts for c = {c} and its warm-up")
        ids = [f"{it.benchmark}/{it.prompt_id}" for it in pool]
        probe = BlockDiffusionProposer(dscout)
        base = online_controller(target, probe, {"calibration_repeats": 3}, concurrency=c,
                                 context_tokens=typical_context_tokens([len(x) for x in prompts], a.max_new_tokens))
        factory = ("dscout", "dscout", lambda: BlockDiffusionProposer(dscout))
        factories = {"ar": ("ar", None, None), keys[1]: factory, "online-warm": factory, "online-cold": factory}
        sizes = {keys[1]: a.block_size, "online-warm": probe.max_block_size, "online-cold": probe.max_block_size}
        prefills: dict = {}
        for r in range(a.repeats):
            controllers = {"online-warm": copy.deepcopy(base), "online-cold": copy.deepcopy(base)}
            t0 = time.perf_counter()
            recs = serving_records(target, factories, prompts, ids, c, a.max_new_tokens, sizes, stops, repeat=r,
                                   controllers=controllers, prefill_store=prefills,
                                   controller_warmup={"online-warm": warm})
            tput = {k: next(x for x in recs if x["method_key"] == k)["batch_throughput"] for k in keys}
            ar_tps[c].append(tput["ar"])
            for k in keys:
                ratio[c][k].append(tput[k] / tput["ar"])
            for k in keys[2:]:
                chosen = next(x for x in recs if x["method_key"] == k)["round_block_sizes"]
                mean_bs[c][k].append(sum(chosen) / len(chosen))
            print(f"c {c} repeat {r}: {time.perf_counter() - t0:.1f} s; " + ", ".join(
                f"{k} {ratio[c][k][-1]:.3f}" for k in keys), flush=True)
    med = statistics.median

    def cell(xs):
        return f"{med(xs):.3f}× [{min(xs):.3f}, {max(xs):.3f}]" if len(xs) > 1 else f"{xs[0]:.3f}×"

    lines = ["# Table 4's DScout(online): a controller warmed on earlier traffic against a cold start", "",
             f"Target {a.target}, DScout {a.dscout}; prompts pooled from {a.benchmarks} (Table 4's pool; warm-up "
             f"prompts from beyond it), {a.max_new_tokens} new tokens per request, greedy, {a.threads} threads, "
             f"float32 with packed linears; {a.repeats} calls per level, each with fresh controllers copied from "
             f"one calibration per level; warm = {a.warmup_batches} untimed batch(es) of c first. Cells: "
             "throughput / AR's in the same call, median [min, max] over the calls; bs = the mean bs chosen.", "",
             f"| c | AR (tok/s) | DScout({a.block_size}) | online, warm | bs | online, cold | bs |",
             "|---|---|---|---|---|---|---|"]
    for c in levels:
        lines.append(f"| {c} | {med(ar_tps[c]):.1f} | {cell(ratio[c][keys[1]])} | {cell(ratio[c]['online-warm'])} | "
                     f"{med(mean_bs[c]['online-warm']):.1f} | {cell(ratio[c]['online-cold'])} | "
                     f"{med(mean_bs[c]['online-cold']):.1f} |")
    from dscout.provenance import report_header

    command = "python benchmarks/controller_warmup.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    emit_report(report_header(lines[0][2:], command, time.perf_counter() - t_start) + lines[2:], a.out)
    if a.out:
        Path(a.out).with_suffix(".json").write_text(json.dumps(
            {"ratio_to_ar": ratio, "ar_tokens_per_s": ar_tps, "mean_bs": mean_bs}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
