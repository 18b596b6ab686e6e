"""Decode-time configurations of every trained drafter, side by side with AR on held-out prompts.

The baselines get the same care as DScout: EAGLE-3 is decoded as chains (top-k 1) and trees of several shapes,
PARD-2 and the block-diffusion drafters at several block sizes, all in one process through the benchmark runner
(greedy, oneDNN-packed linears for every method, AR first for each prompt), on benchmark prompts drawn with a
seed the pipeline's Table 3 does not use. The best configuration of each drafter is what the CPU default's
``methods`` should list.

Usage (after the pipeline trained the drafters)::

    python benchmarks/decode_configs.py --target results/target/<id> \
        --drafter eagle3=results/drafters/<id> --drafter pard2=results/drafters/<id> \
        --drafter dscout=results/drafters/<id> --out reports/decode_configs

Writes ``results.json`` and ``report.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SWEEPS = {  # kind -> method rows (block_size = tokens verified per round, root included)
    "eagle3": [{"topk": 1, "depth": d, "block_size": d + 1} for d in (3, 5, 7)]
    + [{"topk": 2, "depth": 4, "block_size": 8}, {"topk": 4, "depth": 4, "block_size": 16},
       {"topk": 4, "depth": 6, "block_size": 24}],
    "pard2": [{"block_size": bs} for bs in (3, 4, 6, 8)],
    "dflash": [{"block_size": bs} for bs in (4, 8, 16)],
    "dscout": [{"block_size": bs} for bs in (4, 6, 8, 12, 16)],
}


def label(kind: str, row: dict) -> str:
    if kind == "eagle3":
        shape = "chain" if row["topk"] == 1 else f"tree k{row['topk']}"
        return f"EAGLE-3 {shape} d{row['depth']} ({row['block_size']} tokens)"
    return f"{kind}({row['block_size']})"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", action="append", required=True, help="KIND=DIR (eagle3, pard2, dflash, dscout)")
    p.add_argument("--out", default=str(ROOT / "reports/decode_configs"))
    p.add_argument("--benchmarks", default="gsm8k,humaneval,mt_bench")
    p.add_argument("--num-prompts", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--data-root", default=None)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    t_start = time.perf_counter()

    import torch

    from dscout.evaluation.methods import build_methods
    from dscout.evaluation.runner import run_benchmark
    from dscout.models.target import load_prepared_target as load_target, stop_token_ids
    from dscout.data.benchmarks import load_benchmark
    from dscout.data.paths import data_root

    torch.set_num_threads(a.threads)
    target = load_target(a.target)
    dirs = dict(kv.split("=", 1) for kv in a.drafter)
    specs = []
    for kind, d in dirs.items():
        for row in SWEEPS[kind]:
            specs.append({"name": label(kind, row), "kind": kind, "drafter": kind, **row})
    methods = build_methods(target, specs, dirs, stop_token_ids(target, ["<|im_end|>"]), cpu_packed_linear=True)
    per = {m.key: [] for m in methods}
    benches = a.benchmarks.split(",")
    for bi, bench in enumerate(benches):
        prompts = load_benchmark(bench, data_root(a.data_root), a.num_prompts, seed=1)
        recs = run_benchmark(target, methods, prompts, benchmark=bench, max_new_tokens=a.max_new_tokens,
                             temperature=0.0, repeat=0, chat={"system_prompt": None, "enable_thinking": False},
                             near_tie_epsilon=1e-3, score_outputs=False, warmup=bi == 0)
        for k, v in recs.items():
            per[k] += v

    def tpot(rs):
        return sum(r["decode_seconds"] for r in rs) / sum(r["new_tokens"] - 1 for r in rs)

    ar = tpot(per["ar"])
    rows = []
    for m in methods[1:]:
        rs = per[m.key]
        rounds = [x for r in rs for x in r["accept_lengths"]]
        rows.append({"name": m.name, "kind": m.kind, "block_size": m.block_size, "tau": sum(rounds) / len(rounds),
                     "speedup": ar / tpot(rs),
                     "draft_ms": 1000 * sum(r["draft_seconds"] for r in rs) / len(rounds),
                     "verify_ms": 1000 * sum(r["verify_seconds"] for r in rs) / len(rounds),
                     "mismatches": sum(1 for r in rs if r["matches_ar"] is False),
                     "tokens": sum(r["new_tokens"] for r in rs)})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"ar_tpot_ms": 1000 * ar, "benchmarks": benches, "num_prompts": a.num_prompts,
           "max_new_tokens": a.max_new_tokens, "drafters": dirs, "rows": rows}
    (out / "results.json").write_text(json.dumps(res, indent=1))
    lines = ["# Decode-time configurations, side by side with AR (CPU default)", "",
             f"{a.num_prompts} held-out prompt(s) (seed 1) of each of {', '.join(benches)}; {a.max_new_tokens} new "
             f"tokens per turn; greedy; one process, 2 threads, oneDNN-packed linears for all; AR TPOT {1000 * ar:.1f} "
             "ms. Draft/verify: ms per round.", "",
             "| configuration | τ | speedup vs AR | draft ms | verify ms | mismatches | tokens |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['tau']:.2f} | {r['speedup']:.2f}× | {r['draft_ms']:.1f} | "
                     f"{r['verify_ms']:.1f} | {r['mismatches']} | {r['tokens']} |")
    best = {}
    for r in rows:
        if r["kind"] not in best or r["speedup"] > best[r["kind"]]["speedup"]:
            best[r["kind"]] = r
    lines += ["", "Best per drafter: " + "; ".join(f"{k}: {v['name']} ({v['speedup']:.2f}×, τ {v['tau']:.2f})"
                                                  for k, v in best.items())]
    from dscout.provenance import report_header

    command = "python benchmarks/decode_configs.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    lines = report_header(lines[0][2:], command, time.perf_counter() - t_start) + lines[2:]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
