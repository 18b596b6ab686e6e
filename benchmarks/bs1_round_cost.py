"""Does a round without drafts cost what an AR step costs? One process, engines interleaved, nothing else running.

Five engines decode the same prompts greedily, in an order that reverses every pass (ABCDE EDCBA ...), so drift of
the machine hits all alike:
  ar            plain AR (no taps, no drafter);
  ar_taps       AR that also captures the drafter's target layers (forward hooks, the taps tensor);
  bs1_forced    DScout(online)'s engine with a controller that may only choose bs 1: taps kept for a deferred
                commit, controller and time feedback, never a draft;
  online        DScout(online) as Table 3 runs it;
  bs4           DScout at fixed bs 4.
And the batched engine at each ``--concurrency``: AR against a controller that may only choose bs 1.
Per engine: ms per token (median over passes) and each pass's ratio to AR's in the same pass (median [min, max]).

    python benchmarks/bs1_round_cost.py --target results/target/<id> --drafter results/drafters/<dscout id> \
        --out reports/bs1_round_cost/report.md
"""

from __future__ import annotations

import argparse
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
    p.add_argument("--drafter", required=True)
    p.add_argument("--data-root", default="../shared/data")
    p.add_argument("--benchmarks", default="livecodebench,humaneval,gsm8k")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--passes", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--concurrency", default="16",
                   help="batched engine: AR against a bs-1-only controller at these c (comma list; '' = none)")
    p.add_argument("--batch-new-tokens", type=int, default=16)
    p.add_argument("--skip-single", action="store_true", help="only the batched part (no c = 1 engines)")
    p.add_argument("--out", default=str(ROOT / "reports" / "bs1_round_cost" / "report.md"),
                   help="report.md (and its .json beside it); '' = print only")
    a = p.parse_args(argv)
    t0 = time.perf_counter()

    import torch

    from dscout.models.target import load_prepared_target as load_target, stop_token_ids
    from dscout.data.benchmarks import stage_prompts
    from dscout.data.paths import data_root
    from dscout.data.prompts import chat_prompt_ids
    from dscout.decoding.batched import BatchedSpeculativeEngine
    from dscout.decoding.controller import BlockSizeController
    from dscout.decoding.proposers import BlockDiffusionProposer
    from dscout.decoding.engine import SpeculativeEngine
    from dscout.evaluation.methods import build_methods

    torch.set_num_threads(a.threads)
    target = load_target(a.target)
    stops = stop_token_ids(target, ["<|im_end|>"])
    specs = [{"name": "DScout(online)", "kind": "dscout", "drafter": "dscout", "block_size": "online",
              "controller": {"calibration_repeats": 3}},
             {"name": "DScout(4)", "kind": "dscout", "drafter": "dscout", "block_size": 4}]
    prompts = []
    for b in a.benchmarks.split(","):
        item = stage_prompts({"num_prompts": {b: 1}, "seed": 0}, b, data_root(a.data_root))[0]
        prompts.append((b, chat_prompt_ids(target.tokenizer, [{"role": "user", "content": item.turns[0]}], None,
                                           False)))
    ctx = int(statistics.median(len(ids) for _, ids in prompts)) + a.max_new_tokens // 2  # an even count gives a float median
    methods = build_methods(target, specs, {"dscout": a.drafter}, stops, cpu_packed_linear=True, context_tokens=ctx)
    ar, online, bs4 = (m.engine for m in methods)
    ar_taps = SpeculativeEngine(target, None, stops)
    ar_taps.layer_ids = list(online.layer_ids)
    only1 = BlockSizeController(online.controller.latency, online.controller.max_block_size, candidates=[1])
    forced = SpeculativeEngine(target, online.proposer, stops, controller=only1)
    engines = {"ar": (ar, 1), "ar_taps": (ar_taps, 1), "bs1_forced": (forced, 32), "online": (online, 32),
               "bs4": (bs4, 4)}
    for name, (eng, bs) in engines.items():  # warm-up, untimed; the online controller learns nothing from it
        ctl = eng.controller
        if ctl is not None:
            with ctl.frozen():
                eng.generate(prompts[0][1], 8, block_size=bs)
        else:
            eng.generate(prompts[0][1], 8, block_size=bs)
    ms = {n: [] for n in engines}
    ratio = {n: [] for n in engines}
    names = list(engines)
    bs1_share = []
    for k in range(0 if a.skip_single else a.passes):
        order = names if k % 2 == 0 else names[::-1]
        per = {n: [0.0, 0] for n in names}
        for _, ids in prompts:
            for n in order:
                eng, bs = engines[n]
                r = eng.generate(ids, a.max_new_tokens, block_size=bs)
                per[n][0] += r.decode_seconds
                per[n][1] += r.new_tokens
                if n == "online":
                    bs1_share.append(sum(x == 1 for x in r.block_sizes) / max(len(r.block_sizes), 1))
        for n in names:
            ms[n].append(1000 * per[n][0] / per[n][1])
            ratio[n].append(ms["ar"][-1] / ms[n][-1])
        print(f"pass {k}: " + ", ".join(f"{n} {ms[n][-1]:.1f} ms/tok" for n in names), flush=True)
    lines = ["# A round without drafts against an AR step (one process, interleaved)", ""]
    if not a.skip_single:
        lines += [
             f"Prompts: the first of {a.benchmarks} ({a.max_new_tokens} new tokens each, greedy), {a.passes} passes "
             f"in alternating order, {a.threads} threads, float32 with packed linears; target {a.target}, drafter "
             f"{a.drafter}. Throughput / AR's in the same pass: median [min, max].", "",
             "| engine | ms per token (median) | throughput / AR |", "|---|---|---|"]
        for n in names:
            med = statistics.median(ratio[n])
            lines.append(f"| {n} | {statistics.median(ms[n]):.1f} | {med:.3f} [{min(ratio[n]):.3f}, "
                         f"{max(ratio[n]):.3f}] |")
        lines += ["", f"DScout(online) chose bs 1 in {100 * statistics.mean(bs1_share):.0f} % of its rounds "
                  f"(mean over generations)."]
    batched = {}
    for c in [int(x) for x in a.concurrency.split(",") if x]:
        pool = [prompts[i % len(prompts)][1] for i in range(c)]
        drafter = online.proposer.drafter
        only1 = BlockSizeController(online.controller.latency, online.controller.max_block_size, candidates=[1])
        pair = {"ar": BatchedSpeculativeEngine(target, None, stops),
                "bs1_forced": BatchedSpeculativeEngine(target, lambda: BlockDiffusionProposer(drafter), stops,
                                                       controller=only1)}
        for eng in pair.values():
            eng.generate(pool, 4, block_size=1)  # warm-up at the batch's own shape (allocator, oneDNN kernels)
        sec = {n: [] for n in pair}
        split = {n: {"verify": [], "other": [], "first_round": []} for n in pair}  # seconds per batch
        for k in range(a.passes):
            for n in (list(pair) if k % 2 == 0 else list(pair)[::-1]):
                out = pair[n].generate(pool, a.batch_new_tokens, block_size=1 if n == "ar" else 32)
                sec[n].append(out.decode_seconds)
                split[n]["first_round"].append(out.verify_seconds[0] + out.draft_seconds[0])
                split[n]["verify"].append(sum(out.verify_seconds[1:]))
                split[n]["other"].append(sum(out.draft_seconds[1:]))
            print(f"c = {c} pass {k}: " + ", ".join(
                f"{n} {sec[n][-1]:.2f} s (first round {split[n]['first_round'][-1]:.3f}, later verify "
                f"{split[n]['verify'][-1]:.3f}, later rest {split[n]['other'][-1]:.3f})" for n in pair), flush=True)
        r = [x / y for x, y in zip(sec["ar"], sec["bs1_forced"])]
        batched[c] = {"seconds": sec, "ratio_to_ar": r, "split": split}
        lines += ["", f"Batched engine, c = {c} ({a.batch_new_tokens} new tokens per request, {a.passes} passes "
                  f"alternating): a batch of bs-1 rounds with the online machinery (taps kept, controller, time "
                  f"feedback) against AR's: throughput / AR {statistics.median(r):.3f} [{min(r):.3f}, {max(r):.3f}]; "
                  f"batch seconds median AR {statistics.median(sec['ar']):.2f}, "
                  f"bs-1-only {statistics.median(sec['bs1_forced']):.2f}. Split (median seconds per batch): "
                  + "; ".join(f"{n}: first round {statistics.median(split[n]['first_round']):.3f}, later rounds' "
                              f"verify {statistics.median(split[n]['verify']):.3f}, later rounds' rest "
                              f"{statistics.median(split[n]['other']):.3f}" for n in pair) + "."]
    from dscout.provenance import report_header

    command = "python benchmarks/bs1_round_cost.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    lines = report_header(lines[0][2:], command, time.perf_counter() - t0) + lines[2:]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
        Path(a.out).with_suffix(".json").write_text(json.dumps({"ms_per_token": ms, "ratio_to_ar": ratio,
                                                                "bs1_share": bs1_share, "batched": batched}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
