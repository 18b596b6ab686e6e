"""Our engine side by side with z-lab's reference runtime (``dflash`` 0.1.0, ``dflash_generate``) on the CPU
default target, SmolLM2-135M-Instruct.

One full-vocabulary DScout drafter is trained briefly by the pipeline (``reports/upstream_parity/pipeline.yaml``
over ``config.yaml``: 48 response sequences, 200 updates; equality and time per token are measured, not quality),
exported with :func:`dscout.models.export.export_dflash` and loaded by ``DFlashDraftModel.from_pretrained``. One
prompt of each of the six benchmarks is then decoded greedily at bs 4 and 16 by both runtimes in the same process,
one after the other (ours first, then upstream's, per prompt and repeat), each runtime on its own copy of the
target as it runs in practice: ours as the benchmark stage runs it (the target's and the drafter's linear layers on
oneDNN pre-packed weights, :func:`dscout.models.linear.pack_linears`, the kernels AR uses too), upstream's as
``dflash_generate`` is called on a plain transformers model:

* τ (mean committed tokens per draft round) and every round's accept length, from both runtimes (must be equal);
* time per output token, as ``dflash_generate`` defines it (decode wall time, prefill excluded, over every output
  token): upstream's from its own ``return_stats`` (its CUDA clock swapped for ``time.perf_counter`` on this
  CPU), ours from :class:`~dscout.decoding.engine.GenerationResult` the same way. Our decode timer starts after the
  drafter has written the prompt's context K/V (its prefill phase); upstream's first draft call does that write
  inside its decode timer, so ``e2e`` columns also give prefill + decode wall time over output tokens for both;
* where our time goes per round (draft, verify, the rest).

Usage (one command; trains the drafter first if ``results/`` lacks it)::

    python benchmarks/upstream_parity.py --out reports/upstream_parity

Writes ``results.json`` and ``report.md`` (provenance header, then the tables) to ``--out``. Run it on a quiet machine: the report
records the load average and the other processes' CPU share seen at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

OVERLAY = "reports/upstream_parity/pipeline.yaml"
BENCHMARKS = ["gsm8k", "math500", "humaneval", "mbpp", "livecodebench", "mt_bench"]


def busy_processes() -> list[str]:
    """Other processes using CPU now (``ps``: %CPU > 5), for the report."""
    r = subprocess.run(["ps", "-eo", "pid,pcpu,etime,comm", "--sort=-pcpu"], capture_output=True, text=True)
    me = os.getpid()
    rows = []
    for line in r.stdout.splitlines()[1:]:
        parts = line.split(None, 3)
        if len(parts) == 4 and int(parts[0]) != me and float(parts[1]) > 5:
            rows.append(f"{parts[3]} {parts[1]}%")
    return rows[:8]


def train_drafter(cores: int) -> Path:
    """Run the pipeline up to the drafter (a no-op when ``results/`` has it); returns its folder."""
    from dscout import config as dcfg

    cfg = dcfg.load_config(ROOT / "config.yaml", ROOT / OVERLAY)
    did = dcfg.drafter_id(cfg, "dscout_fv", cfg["target"]["num_layers"])
    out = ROOT / "results" / "drafters" / did
    subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(cores), "--configfile", OVERLAY, "--",
                    str(out.relative_to(ROOT) / "training_summary.json")], cwd=ROOT, check=True)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "reports" / "upstream_parity"))
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--block-sizes", default="4,16")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cores", type=int, default=2, help="Snakemake cores for training the drafter")
    ap.add_argument("--no-packed", dest="packed", action="store_false",
                    help="run our engine on plain (unpacked) weights too, as upstream's")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    import torch

    from dscout import config as dcfg
    from dscout.models.target import stop_token_ids
    from dscout.data import paths as dcfg_paths
    from dscout.data.benchmarks import load_benchmark
    from dscout.data.prompts import chat_prompt_ids
    from dscout.decoding.engine import SpeculativeEngine
    from dscout.decoding.proposers import BlockDiffusionProposer
    from dscout.models.export import export_dflash, load_dflash_checkpoint
    from dscout.models.linear import pack_linears
    from dscout.models.target import TargetModel
    from tests import upstream

    busy_before, load_before = busy_processes(), os.getloadavg()
    drafter_dir = train_drafter(args.cores)
    summary = json.loads((drafter_dir / "training_summary.json").read_text())
    torch.set_num_threads(args.threads)
    dm = upstream.dflash_model()
    dm._cuda_time = time.perf_counter  # its return_stats clock calls torch.cuda.synchronize

    target_dir = next((ROOT / "results" / "target").glob("smollm2-*"))
    target = TargetModel.load(target_dir)  # ours (packed below, after the export)
    plain_target = TargetModel.load(target_dir)  # upstream's
    stops = stop_token_ids(target, ["<|im_end|>"])
    drafter = load_dflash_checkpoint(drafter_dir).attach_target(target).eval()
    export = ROOT / "results" / "upstream_parity" / "export"
    export_dflash(drafter, export, dtype=torch.float32)
    model, info = dm.DFlashDraftModel.from_pretrained(str(export), output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
    model = model.eval()
    data_root = dcfg_paths.data_root(dcfg.load_config(ROOT / "config.yaml")["data_root"], ROOT)
    prompts = []
    for b in BENCHMARKS:
        p = load_benchmark(b, data_root, 1, seed=1)[0]
        prompts.append((b, chat_prompt_ids(target.tokenizer, [{"role": "user", "content": p.turns[0]}])))
    if args.packed:  # as the bench stage runs every method, AR included (evaluation/methods.build_methods)
        pack_linears(target.model, extra_weights=(target.lm_head.weight,))
        pack_linears(drafter)
    engine = SpeculativeEngine(target, BlockDiffusionProposer(drafter), stop_token_ids=stops)

    def ours(ids, bs):
        t0 = time.perf_counter()
        r = engine.generate(ids, args.max_new_tokens, block_size=bs)
        return r, time.perf_counter() - t0

    def theirs(ids, bs):
        t0 = time.perf_counter()
        r = dm.dflash_generate(model, plain_target.model, torch.tensor([ids]), args.max_new_tokens, stops,
                               block_size=bs, return_stats=True)
        return r, time.perf_counter() - t0

    ours(prompts[0][1], 4), theirs(prompts[0][1], 4)  # warm-up (oneDNN kernels, caches)
    rows = []
    for bs in [int(b) for b in args.block_sizes.split(",")]:
        for bench, ids in prompts:
            for rep in range(args.repeats):
                a, wa = ours(ids, bs)
                b, wb = theirs(ids, bs)
                up_ids = b.output_ids[0, len(ids):].tolist()
                n = len(a.output_ids)
                rows.append({
                    "bs": bs, "benchmark": bench, "repeat": rep, "prompt_tokens": len(ids), "output_tokens": n,
                    "same_output": a.output_ids == up_ids, "same_rounds": a.accept_lengths == b.acceptance_lengths,
                    "tau_ours": sum(a.accept_lengths) / len(a.accept_lengths),
                    "tau_upstream": sum(b.acceptance_lengths) / len(b.acceptance_lengths),
                    "tpot_ms_ours": 1000 * a.decode_seconds / n,
                    "tpot_ms_upstream": 1000 * b.time_per_output_token,
                    "e2e_ms_per_token_ours": 1000 * wa / n, "e2e_ms_per_token_upstream": 1000 * wb / n,
                    "draft_ms_per_round": 1000 * sum(a.draft_seconds) / len(a.accept_lengths),
                    "verify_ms_per_round": 1000 * sum(a.verify_seconds) / len(a.accept_lengths),
                    "rounds": len(a.accept_lengths)})
                print(json.dumps(rows[-1]), flush=True)
    busy_after, load_after = busy_processes(), os.getloadavg()
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    res = {"drafter": str(drafter_dir.relative_to(ROOT)), "training": {
        k: summary.get(k) for k in ("steps", "train_seconds", "wall_seconds", "label", "recipe")},
        "target": str(target_dir.relative_to(ROOT)), "max_new_tokens": args.max_new_tokens,
        "threads": args.threads, "repeats": args.repeats, "ours_packed_linears": args.packed,
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__, "loadavg_before": load_before, "loadavg_after": load_after,
        "busy_before": busy_before, "busy_after": busy_after, "rows": rows}
    (out / "results.json").write_text(json.dumps(res, indent=1))
    write_report(res, out / "report.md",
                 "python benchmarks/upstream_parity.py " + shlex.join(sys.argv[1:] if argv is None else argv),
                 time.perf_counter() - t_start)


def write_report(res: dict, path: Path, command: str = "", wall_seconds: float | None = None) -> None:
    """The committed report: per bs, τ of both runtimes and ms per output token of both (provenance header when
    ``command`` is given)."""
    lines = ["# Our engine vs z-lab's `dflash_generate` on SmolLM2-135M-Instruct (CPU)", "",
             f"Drafter `{res['drafter']}` (full vocabulary, trained by the pipeline: {res['training']}); "
             f"greedy, max {res['max_new_tokens']} new tokens, one prompt per benchmark, {res['repeats']} repeats, "
             f"{res['threads']} thread(s), torch {res['torch']}. Same process, ours then upstream's per prompt and "
             "repeat, each on its own copy of the target: ours "
             f"{'with oneDNN pre-packed linear weights, as the bench stage runs every method' if res.get('ours_packed_linears') else 'on plain weights'}"
             ", upstream's on the plain transformers model. Regenerate: `python benchmarks/upstream_parity.py`; where the time goes: "
             "`analysis.md`.", "",
             "| bs | benchmark | τ ours | τ upstream | same tokens & rounds | ms/token ours | ms/token upstream | "
             "e2e ms/token ours | e2e ms/token upstream | draft ms/round | verify ms/round |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict = {}
    for r in res["rows"]:
        groups.setdefault((r["bs"], r["benchmark"]), []).append(r)
    totals: dict = {}
    for (bs, bench), rs in groups.items():
        def mean(k):
            return sum(r[k] for r in rs) / len(rs)
        same = all(r["same_output"] and r["same_rounds"] for r in rs)
        lines.append(f"| {bs} | {bench} | {mean('tau_ours'):.3f} | {mean('tau_upstream'):.3f} | "
                     f"{'yes' if same else 'NO'} | {mean('tpot_ms_ours'):.2f} | {mean('tpot_ms_upstream'):.2f} | "
                     f"{mean('e2e_ms_per_token_ours'):.2f} | {mean('e2e_ms_per_token_upstream'):.2f} | "
                     f"{mean('draft_ms_per_round'):.2f} | {mean('verify_ms_per_round'):.2f} |")
        totals.setdefault(bs, []).extend(rs)
    lines += ["", "| bs | τ ours | τ upstream | ms/token ours | ms/token upstream | ours / upstream |", "|---|---|---|---|---|---|"]
    for bs, rs in totals.items():
        tok = sum(r["output_tokens"] for r in rs)
        o = sum(r["tpot_ms_ours"] * r["output_tokens"] for r in rs) / tok
        u = sum(r["tpot_ms_upstream"] * r["output_tokens"] for r in rs) / tok
        ro = sum(r["tau_ours"] * r["rounds"] for r in rs) / sum(r["rounds"] for r in rs)
        ru = sum(r["tau_upstream"] * r["rounds"] for r in rs) / sum(r["rounds"] for r in rs)
        lines.append(f"| {bs} | {ro:.3f} | {ru:.3f} | {o:.2f} | {u:.2f} | {o / u:.3f} |")
    lines += ["", f"Load average before / after: {res['loadavg_before']} / {res['loadavg_after']}; other busy "
              f"processes before: {res['busy_before']}; after: {res['busy_after']}.", ""]
    if command:
        from dscout.provenance import report_header

        lines = report_header(lines[0][2:], command, wall_seconds or 0.0) + lines[2:]
    path.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
