"""Measured, not assumed: train a DScout drafter on the CPU target's own responses, then decode real GSM8K
prompts with AR and with speculative decoding in one run, and print τ, TPOT and the speedup.

This is a benchmark script, not a test: it takes minutes and its numbers depend on the machine. It writes
``<out>/core_speedup.json`` (every per-prompt number) and ``<out>/core_speedup.png`` (TPOT per method).

    python benchmarks/core_speedup.py --out results/core_speedup            # the CPU default (~25 min)
    python benchmarks/core_speedup.py --out /tmp/cs --train-prompts 64 --steps 30 --eval-prompts 3  # quick

Stages are cached in ``--out`` (target, responses, features, drafter): rerunning skips what exists.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/core_speedup")
    ap.add_argument("--data-root", default=None, help="shared/data folder (default: $DSCOUT_DATA_ROOT or ../shared/data)")
    ap.add_argument("--target", default="gguf:smollm2")
    ap.add_argument("--train-prompts", type=int, default=480)
    ap.add_argument("--train-sources", default="gsm8k_train:480",
                    help="training prompt mix 'source:count,...' (in-domain GSM8K-train by default; '' = "
                         "--train-prompts split half GSM8K-train, half alpaca + code)")
    ap.add_argument("--response-tokens", type=int, default=160)
    ap.add_argument("--recipe", default="dscout")
    ap.add_argument("--horizons", default="4,8,12,16",
                    help="the recipe's training horizons, scaled to what a 135M target's drafter can reach")
    ap.add_argument("--layers", type=int, default=2, help="drafter depth d")
    ap.add_argument("--taps", type=int, default=5, help="conditioning depth t")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--anchors", type=int, default=12)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--block-sizes", default="3,4,6,8")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--kernels", choices=["packed", "stock"], default="packed",
                    help="packed = oneDNN pre-packed linears for target and drafter (dscout.models.linear); "
                         "stock = plain F.linear. AR and speculative decoding always share the same kernels.")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from dscout.data.benchmarks import load_benchmark
    from dscout.data.paths import data_root
    from dscout.data.prompts import chat_prompt_ids, load_training_prompts
    from dscout.data.responses import generate_responses, read_jsonl, training_sequences
    from dscout.decoding.engine import SpeculativeEngine
    from dscout.decoding.proposers import BlockDiffusionProposer
    from dscout.models.export import load_dflash_checkpoint
    from dscout.models.target import TargetModel, default_target_layer_ids, prepare_target
    from dscout.training.features import build_feature_cache
    from dscout.training.trainer import TrainConfig, train_drafter

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = data_root(args.data_root)
    times = {}

    t0 = time.perf_counter()
    tdir = out / "target"
    if not (tdir / "config.json").exists():
        prepare_target(args.target, tdir)
    target = TargetModel.load(tdir)
    times["prepare_target_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    n_math = args.train_prompts // 2
    rest = args.train_prompts - n_math
    sources = {"gsm8k_train": n_math, "alpaca_gpt4_demo": rest // 2, "code_alpaca": rest - rest // 2}
    if args.train_sources:
        sources = {k: int(v) for k, v in (kv.split(":") for kv in args.train_sources.split(","))}
    prompts = load_training_prompts(root, sources, seed=0)
    resp_path = out / ("responses.jsonl" if not args.train_sources else
                       f"responses_{args.train_sources.replace(':', '').replace(',', '_')}.jsonl")
    generate_responses(target, prompts, resp_path, max_new_tokens=args.response_tokens)
    seqs = training_sequences(read_jsonl(resp_path), max_length=512)
    times["generate_responses_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    layer_ids = default_target_layer_ids(target.num_layers, args.taps)
    fdir = out / (f"features_{args.taps}t" + (f"_{resp_path.stem}" if args.train_sources else ""))
    if not (fdir / "index.json").exists():
        build_feature_cache(target, seqs, layer_ids, fdir)
    times["feature_cache_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    hz = [int(h) for h in args.horizons.split(",")] if args.horizons else None
    ddir = out / (f"drafter_{fdir.name}_{args.recipe}_{args.taps}t{args.layers}d_{args.steps}steps_{args.anchors}a_lr{args.lr}"
                  + (f"_h{'-'.join(map(str, hz))}" if hz else ""))
    if not (ddir / "config.json").exists():
        cfg = TrainConfig(recipe=args.recipe, recipe_overrides={"horizons": hz} if hz else {}, num_layers=args.layers, target_layer_ids=layer_ids,
                          mask_token_id=16, num_anchors=args.anchors, micro_batch_size=1, lr=args.lr,
                          max_steps=args.steps, checkpoint_every=100)
        train_drafter(target, cfg, ddir, out / "work" / ddir.name, feature_cache=fdir)
    summary = json.loads((ddir / "training_summary.json").read_text())
    times["train_s"] = time.perf_counter() - t0
    drafter = load_dflash_checkpoint(ddir).attach_target(target).eval()

    if args.kernels == "packed":
        from dscout.models.linear import pack_linears

        pack_linears(target.model, extra_weights=(target.lm_head.weight,))
        pack_linears(drafter)
    items = load_benchmark("gsm8k", root, args.eval_prompts, seed=0)
    stop = [target.tokenizer.convert_tokens_to_ids("<|im_end|>"), target.tokenizer.eos_token_id]
    ar = SpeculativeEngine(target, stop_token_ids=stop)
    spec = SpeculativeEngine(target, BlockDiffusionProposer(drafter), stop_token_ids=stop)
    block_sizes = [int(b) for b in args.block_sizes.split(",")]
    ar.generate([1, 2, 3], 4)  # warm-up
    per = {"ar": []} | {f"bs{b}": [] for b in block_sizes}
    mismatches = 0
    for it in items:
        ids = chat_prompt_ids(target.tokenizer, [{"role": "user", "content": it.turns[0]}])
        a = ar.generate(ids, args.max_new_tokens)
        per["ar"].append({"tpot": a.decode_seconds / max(a.new_tokens - 1, 1), "tokens": a.new_tokens})
        for b in block_sizes:
            s = spec.generate(ids, args.max_new_tokens, block_size=b)
            mismatches += s.output_ids != a.output_ids
            per[f"bs{b}"].append({"tpot": s.decode_seconds / max(s.new_tokens - 1, 1), "tokens": s.new_tokens,
                                  "tau": s.mean_accept_length, "accept_lengths": s.accept_lengths,
                                  "draft_s": sum(s.draft_seconds), "verify_s": sum(s.verify_seconds)})
    ar_tpot = statistics.mean(r["tpot"] for r in per["ar"])
    rows = []
    print(f"\ntarget SmolLM2-135M-Instruct (CPU, {torch.get_num_threads()} threads, {args.kernels} kernels); drafter {summary['label']} "
          f"({summary['drafter_parameters'] / 1e6:.1f}M params, recipe {args.recipe}, {summary['steps']} steps, "
          f"{summary.get('train_seconds', times['train_s']):.0f} s of training); GSM8K test prompts: {len(items)}, max {args.max_new_tokens} new tokens")
    print(f"{'method':<10}{'tau':>8}{'TPOT ms':>10}{'speedup':>9}")
    print(f"{'AR':<10}{1.0:>8.2f}{ar_tpot * 1e3:>10.1f}{1.0:>9.2f}")
    for b in block_sizes:
        rs = per[f"bs{b}"]
        tau = statistics.mean(r["tau"] for r in rs)
        tpot = statistics.mean(r["tpot"] for r in rs)
        rows.append({"block_size": b, "tau": tau, "tpot_s": tpot, "speedup": ar_tpot / tpot})
        print(f"{'DScout(' + str(b) + ')':<10}{tau:>8.2f}{tpot * 1e3:>10.1f}{ar_tpot / tpot:>9.2f}")
    print(f"greedy outputs differing from AR: {mismatches} of {len(items) * len(block_sizes)}")
    print("stage seconds:", {k: round(v, 1) for k, v in times.items()})
    result = {"ar_tpot_s": ar_tpot, "methods": rows, "mismatches": mismatches, "stage_seconds": times,
              "drafter": summary, "per_prompt": per, "threads": torch.get_num_threads(),
              "kernels": args.kernels}
    (out / "core_speedup.json").write_text(json.dumps(result, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.2))
        names = ["AR"] + [f"DScout({r['block_size']})" for r in rows]
        vals = [ar_tpot * 1e3] + [r["tpot_s"] * 1e3 for r in rows]
        ax.bar(names, vals, color=["grey"] + ["tab:blue"] * len(rows))
        for i, r in enumerate(rows, 1):
            ax.text(i, vals[i], f"τ={r['tau']:.2f}\n{r['speedup']:.2f}×", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("TPOT (ms / token)")
        ax.set_title("SmolLM2-135M on CPU, GSM8K, greedy")
        fig.tight_layout()
        fig.savefig(out / "core_speedup.png", dpi=120)
    except ImportError:
        pass
    return result


if __name__ == "__main__":
    main()
