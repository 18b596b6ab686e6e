"""Does Table 4 round by round cost time? ``serving.interleave: round`` against ``batch``, side by side, one process.

The same c requests are served by Table 4's methods (AR, DFlash at bs 16, DScout at each ``--block-sizes``,
optionally DScout(online)) through :func:`dscout.evaluation.serving.serving_records` itself, one repeat per call,
the two interleave modes alternating call by call (ABBA: batch, round, round, batch, ...), so that the machine's
drift hits both modes alike. Per mode and method: the batch's decode seconds (median over its calls) and, per
call, each method's throughput ratio to AR's in the same call (median [min, max]): the number Table 4 reports.
Each call also reports its wall time, warm-ups included, and the process's peak resident memory at the end. The
calls share one prefill store (the batch is prefilled once per tapped layer set), as Table 4's repeats do.

    python benchmarks/interleave_cost.py --target results/target/<id> --dscout results/drafters/<id> \
        --dflash results/drafters/<id> --concurrency 32 --calls 8 --out reports/interleave_cost/report.md

Nothing else may run meanwhile (2 cores).
"""

from __future__ import annotations

import argparse
import json
import resource
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
    p.add_argument("--dflash", default=None, help="the DFlash drafter's folder (omitted: no DFlash column)")
    p.add_argument("--data-root", default="../shared/data")
    p.add_argument("--benchmarks", default="gsm8k,math500,humaneval,mbpp,livecodebench,mt_bench")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--block-sizes", default="2,4")
    p.add_argument("--online", action="store_true", help="add DScout(online) with the default controller")
    p.add_argument("--calls", type=int, default=8, help="serving calls in all, half per mode (ABBA order)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "reports" / "interleave_cost" / "report.md"),
                   help="report.md (and its .json beside it); '' = print only")
    a = p.parse_args(argv)
    t_start = time.perf_counter()

    from dscout.decoding.proposers import BlockDiffusionProposer
    from dscout.evaluation.serving import serving_records
    from dscout.models.export import drafter_for_target
    from serving_batch import load_serving_batch

    target, pool, prompts, stops = load_serving_batch(a.target, a.data_root, a.benchmarks, a.concurrency,
                                                      a.threads)
    ids = [f"{it.benchmark}/{it.prompt_id}" for it in pool]
    dscout = drafter_for_target(a.dscout, target, packed=True)
    factories, sizes = {"ar": ("ar", None, None)}, {}
    if a.dflash:
        dflash = drafter_for_target(a.dflash, target, packed=True)
        factories["dflash-bs16"] = ("dflash", "dflash", lambda: BlockDiffusionProposer(dflash))
        sizes["dflash-bs16"] = 16
    for bs in [int(x) for x in a.block_sizes.split(",") if x]:
        factories[f"dscout-bs{bs}"] = ("dscout", "dscout", lambda: BlockDiffusionProposer(dscout))
        sizes[f"dscout-bs{bs}"] = bs
    controllers = {}
    if a.online:
        from dscout.evaluation.methods import online_controller, typical_context_tokens

        probe = BlockDiffusionProposer(dscout)
        controllers["dscout-online"] = online_controller(
            target, probe, {}, concurrency=a.concurrency,
            context_tokens=typical_context_tokens([len(x) for x in prompts], a.max_new_tokens))
        factories["dscout-online"] = ("dscout", "dscout", lambda: BlockDiffusionProposer(dscout))
        sizes["dscout-online"] = probe.max_block_size
    keys = list(factories)
    modes = ["batch", "round"]
    seconds = {m: {k: [] for k in keys} for m in modes}
    ratio = {m: {k: [] for k in keys} for m in modes}
    wall = {m: [] for m in modes}
    prefills: dict = {}  # one prefill per layer set for every call (outside the decode seconds either way)
    for call in range(a.calls):
        mode = modes[(call + call // 2) % 2]  # batch round round batch batch round ...
        t0 = time.perf_counter()
        recs = serving_records(target, factories, prompts, ids, a.concurrency, a.max_new_tokens, sizes, stops,
                               repeat=call, controllers=controllers, repeats=1, interleave=mode,
                               prefill_store=prefills)
        wall[mode].append(time.perf_counter() - t0)
        batch = {r["method_key"]: r["batch_decode_seconds"] for r in recs}
        tokens = {k: sum(r["new_tokens"] for r in recs if r["method_key"] == k) for k in keys}
        for k in keys:
            seconds[mode][k].append(batch[k])
            ratio[mode][k].append((tokens[k] / batch[k]) / (tokens["ar"] / batch["ar"]))
        print(f"call {call} ({mode}): wall {wall[mode][-1]:.1f} s; " + ", ".join(
            f"{k} {batch[k]:.2f} s ({ratio[mode][k][-1]:.3f} AR)" for k in keys), flush=True)
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    med = statistics.median
    lines = ["# Table 4 round by round against whole batches (one process, modes alternating ABBA)", "",
             f"c = {a.concurrency}, {a.max_new_tokens} new tokens per request, greedy, {a.calls} calls "
             f"({a.calls // 2} per mode), {a.threads} threads, float32 with packed linears; target {a.target}, "
             f"DScout {a.dscout}, DFlash {a.dflash}. Peak resident memory {rss_gb:.1f} GB.", "",
             "| method | batch: decode s | round: decode s | round / batch | batch: throughput / AR | "
             "round: throughput / AR |", "|---|---|---|---|---|---|"]
    for k in keys:
        sb, sr = med(seconds["batch"][k]), med(seconds["round"][k])
        rb, rr = ratio["batch"][k], ratio["round"][k]
        lines.append(f"| {k} | {sb:.2f} | {sr:.2f} | {sr / sb:.3f} | {med(rb):.3f} [{min(rb):.3f}, {max(rb):.3f}] | "
                     f"{med(rr):.3f} [{min(rr):.3f}, {max(rr):.3f}] |")
    lines += ["", f"Wall per call (warm-ups included), median: batch {med(wall['batch']):.1f} s, "
              f"round {med(wall['round']):.1f} s."]
    from dscout.provenance import report_header

    command = "python benchmarks/interleave_cost.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    lines = report_header(lines[0][2:], command, time.perf_counter() - t_start) + lines[2:]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
        Path(a.out).with_suffix(".json").write_text(json.dumps(
            {"seconds": seconds, "ratio_to_ar": ratio, "wall": wall, "peak_rss_gb": rss_gb}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
