"""Training-efficiency study of the block-diffusion drafters on this CPU: which lever buys the most acceptance
per second of training?

Every variant trains through the production trainer (``dscout.training.trainer.train_drafter``, DeepSpeed on
one gloo process) from the pipeline's own feature cache, on the same training sequences, for the same CPU time
(the step count is set from a short probe of the variant's step time). The last ``--holdout`` sequences are
never trained on; on them every response position anchors one fully masked block
(:mod:`dscout.experiments.drafter_eval`), giving per-offset top-1 accuracy and the greedy τ at bs 4, 8 and 16
that those accuracies imply. ``--engine`` variants are then decoded side by side with AR through the benchmark
runner on held-out benchmark prompts (greedy, one process, nothing else running): measured τ and speedup.

Usage (after ``snakemake --cores 2 <feature cache>`` has written the target and the cache)::

    python benchmarks/drafter_efficiency.py --target results/target/<id> \
        --features results/features/<responses id>/<cache id> --out reports/drafter_efficiency \
        --budget 150 --variants base,anchors64,... --engine base,best

A lever ``steps<N>`` (in ``--combine``) trains N updates instead of the time budget (training-time scaling).
``--tf-bench results/bench/<id> --tf-drafters name,...,NAME=DIR`` adds the greedy τ that teacher forcing implies on
a Table 3 run's own prompts (its AR outputs; no timing), the measure that tracks benchmark prompts rather than the
training distribution.

Writes ``results.json`` (every number), ``report.md`` (tables), ``offsets.png`` and, for a scaling run,
``scaling.png`` to ``--out``; variants already in ``results.json`` are skipped, so an interrupted study resumes.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

BASE = dict(recipe="dscout", num_layers=2, num_anchors=12, micro_batch_size=1, lr=3e-3, warmup_ratio=0.04,
            options={})
"""The landed CPU default's DScout drafter (config.yaml before this study)."""

VARIANTS: dict[str, tuple[dict, str]] = {
    "base": ({}, "the landed default: 12 anchors/sequence, full vocabulary, CE, lr 3e-3"),
    "anchors48": ({"num_anchors": 48}, "48 anchors per sequence"),
    "anchors_all": ({"num_anchors": 512}, "every response position anchors a block"),
    "vocab8k": ({"options": {"draft_vocab_size": 8192}}, "draft vocabulary = 8192 most frequent response tokens"),
    "vocab4k": ({"options": {"draft_vocab_size": 4096}}, "draft vocabulary = 4096 most frequent response tokens"),
    "norm_ones": ({"options": {"norm_init": "ones"}}, "final norm initialised to ones (logits ~N(0, 1) at init)"),
    "distill": ({"options": {"distill_weight": 0.5}}, "0.5 CE + 0.5 cross-entropy to the target's distribution"),
    "init_target": ({"init_from_target": True}, "drafter layers initialised from the target's last layers"),
    "lr1e-3": ({"lr": 1e-3}, "learning rate 1e-3"),
    "lr1e-2": ({"lr": 1e-2}, "learning rate 1e-2"),
    "batch4": ({"micro_batch_size": 4}, "4 sequences per update"),
    "d1": ({"num_layers": 1}, "drafter depth d = 1"),
    "d3": ({"num_layers": 3}, "drafter depth d = 3"),
    "dflash_recipe": ({"recipe": "dflash"}, "the DFlash recipe (fixed B = 16, decay, all masked)"),
    "lr6e-4": ({"lr": 6e-4}, "learning rate 6e-4 (SpecForge's DFlash default)"),
    "fc_last_tap": ({"options": {"fc_init": "last_tap"}},
                    "fc passes the deepest tap through, hidden_norm = the first copied layer's input norm"),
}


def _rel(path) -> str:
    """``path`` relative to the repository when inside it (results.json is committed: no machine paths)."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def lever(name: str) -> tuple[dict, str]:
    """One lever by name: an entry of ``VARIANTS``, or ``steps<N>`` (train N updates instead of the time budget)."""
    m = re.fullmatch(r"steps(\d+)", name)
    if m:
        return {"max_steps": int(m.group(1))}, f"{m.group(1)} updates (not the time budget)"
    if name not in VARIANTS:
        raise SystemExit(f"unknown lever {name!r}: one of {', '.join(VARIANTS)} or steps<N>")
    return VARIANTS[name]


def combine(*names: str) -> tuple[dict, str]:
    """A variant that applies several levers at once (options merged)."""
    cfg, notes = {}, []
    for n in names:
        over, note = lever(n)
        opts = {**cfg.get("options", {}), **over.get("options", {})}
        cfg.update(over)
        cfg["options"] = opts
        notes.append(n)
    return cfg, " + ".join(notes)


def train_config(overrides: dict, layer_ids: list[int], mask_token_id: int, max_steps: int, seed: int):
    from dscout.training.trainer import TrainConfig

    spec = {**BASE, **{k: v for k, v in overrides.items() if k not in ("data_fraction", "max_steps")}}
    return TrainConfig(recipe=spec["recipe"], num_layers=spec["num_layers"], target_layer_ids=layer_ids,
                       mask_token_id=mask_token_id, num_anchors=spec["num_anchors"],
                       micro_batch_size=spec["micro_batch_size"], lr=spec["lr"], warmup_ratio=spec["warmup_ratio"],
                       max_steps=max_steps, seed=seed, checkpoint_every=0,
                       deepspeed_config=str(ROOT / "configs/deepspeed/cpu.json"),
                       init_from_target=spec.get("init_from_target", False), options=spec.get("options", {}))


def step_seconds(target, cfg, features, train_ids, probe_steps: int = 6) -> float:
    """Median seconds per update of ``cfg`` over a short probe run (first two steps dropped)."""
    from dscout.training.trainer import train_drafter

    with tempfile.TemporaryDirectory() as tmp:
        train_drafter(target, replace(cfg, max_steps=probe_steps), Path(tmp) / "out", Path(tmp) / "work",
                      feature_cache=features, sequence_ids=train_ids)
        secs = sorted(json.loads(l)["seconds"] for l in (Path(tmp) / "work/train_log.jsonl").read_text().splitlines()[2:])
    return secs[len(secs) // 2]


def run_variant(name, overrides, note, target, features, layer_ids, mask_id, train_ids, held_ids, budget, seed,
                work_root):
    from dscout.experiments.drafter_eval import accuracy_and_tau, offset_correctness
    from dscout.models.export import load_dflash_checkpoint
    from dscout.training.features import FeatureCache
    from dscout.training.trainer import train_drafter

    frac = overrides.get("data_fraction", 1.0)
    ids = train_ids[: max(1, int(round(frac * len(train_ids))))]
    probe = train_config(overrides, layer_ids, mask_id, 6, seed)
    sec = step_seconds(target, probe, features, ids)
    steps = overrides.get("max_steps") or max(10, int(budget / sec))
    cfg = replace(probe, max_steps=steps)
    out, work = work_root / name / "drafter", work_root / name / "work"
    shutil.rmtree(work_root / name, ignore_errors=True)
    t0 = time.perf_counter()
    train_drafter(target, cfg, out, work, feature_cache=features, sequence_ids=ids)
    wall = time.perf_counter() - t0
    summary = json.loads((out / "training_summary.json").read_text())
    log = [json.loads(l) for l in (out / "train_log.jsonl").read_text().splitlines()]
    drafter = load_dflash_checkpoint(out, dtype=target.dtype).attach_target(target)
    source = FeatureCache(features, list(drafter.config.target_layer_ids))
    sizes = (2, 3, 4, 8, 16)
    heldout = accuracy_and_tau(offset_correctness(drafter, source, held_ids, block_size=16), sizes)
    trainacc = accuracy_and_tau(offset_correctness(drafter, source, ids[:6], block_size=16), sizes)  # overfitting
    return {"name": name, "note": note, "overrides": overrides, "steps": steps, "probe_step_seconds": sec,
            "train_seconds": summary["train_seconds"], "wall_seconds": wall,
            "train_sequences": len(ids), "first_loss": log[0]["loss"],
            "final_loss": sum(r["loss"] for r in log[-20:]) / min(20, len(log)),
            "heldout": heldout, "train_subset": trainacc, "drafter_dir": _rel(out)}


def engine_eval(target, results: dict, names: list[str], data_root: str, num_prompts: int, max_new: int,
                benchmarks: list[str], block_sizes=(2, 3, 4, 8, 16)) -> dict:
    """τ and speedup vs AR through the benchmark runner (greedy, packed linears, every method side by side)."""
    from dscout.evaluation.methods import build_methods
    from dscout.evaluation.runner import run_benchmark
    from dscout.models.target import stop_token_ids
    from dscout.data.benchmarks import load_benchmark

    specs = [{"name": f"{n}@{bs}", "kind": "dscout", "drafter": n, "block_size": bs}
             for n in names for bs in block_sizes]
    dirs = {n: str(ROOT / results[n]["drafter_dir"]) for n in names}  # stored relative to the repository
    stops = stop_token_ids(target, ["<|im_end|>"])
    methods = build_methods(target, specs, dirs, stops, cpu_packed_linear=True)
    per = {m.key: [] for m in methods}
    for bi, bench in enumerate(benchmarks):
        prompts = load_benchmark(bench, data_root, num_prompts, seed=1)
        recs = run_benchmark(target, methods, prompts, benchmark=bench, max_new_tokens=max_new, temperature=0.0,
                             repeat=0, chat={"system_prompt": None, "enable_thinking": False},
                             near_tie_epsilon=1e-3, score_outputs=False, warmup=bi == 0)
        for k, v in recs.items():
            per[k] += v
    ar_tpot = sum(r["decode_seconds"] for r in per["ar"]) / sum(r["new_tokens"] - 1 for r in per["ar"])
    out = {"ar_tpot_ms": 1000 * ar_tpot, "benchmarks": benchmarks, "num_prompts": num_prompts,
           "max_new_tokens": max_new, "rows": {}}
    for m in methods[1:]:
        rs = per[m.key]
        rounds = [a for r in rs for a in r["accept_lengths"]]
        tpot = sum(r["decode_seconds"] for r in rs) / sum(r["new_tokens"] - 1 for r in rs)
        out["rows"][m.name] = {
            "tau": sum(rounds) / len(rounds), "speedup": ar_tpot / tpot,
            "draft_ms_per_round": 1000 * sum(r["draft_seconds"] for r in rs) / len(rounds),
            "verify_ms_per_round": 1000 * sum(r["verify_seconds"] for r in rs) / len(rounds),
            "mismatches": sum(1 for r in rs if r["matches_ar"] is False),
            "decoded_tokens": sum(r["new_tokens"] for r in rs)}
    return out


def teacher_forced_on_records(target, drafter_dirs: dict[str, str], bench_dir: Path, data_root: str) -> dict:
    """:func:`dscout.experiments.drafter_eval.teacher_forced_on_bench_records` for each drafter folder."""
    from dscout.experiments.drafter_eval import teacher_forced_on_bench_records
    from dscout.models.export import load_dflash_checkpoint

    out = {}
    for name, path in drafter_dirs.items():
        drafter = load_dflash_checkpoint(path, dtype=target.dtype).attach_target(target)
        out[name] = teacher_forced_on_bench_records(target, drafter, bench_dir, data_root, (2, 4, 8, 16))
        print(f"  teacher-forced {name}: " + ", ".join(f"{b} {_tau(s, 4):.2f}" for b, s in out[name].items()),
              flush=True)
    return out


def _tau(summary: dict, bs: int) -> float:
    """τ at ``bs`` from a summary whose keys may have gone through JSON (strings)."""
    return {int(k): v for k, v in summary["tau"].items()}[bs]


def write_report(res: dict, out: Path, command: str = "", wall_seconds: float | None = None) -> None:
    """``report.md`` (provenance header when ``command`` is given, then the tables) and the figures in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    v = res["variants"]
    lines = ["# Drafter training efficiency on the CPU default (SmolLM2-135M target)", "",
             f"Each variant trains for {res['budget_seconds']:.0f} s of CPU (2 cores, one process; a ``steps<N>`` "
             "variant for N updates instead, its training time in the column `train s`) through the "
             f"production trainer on {res['train_sequences']} sequences; {res['heldout_sequences']} sequences held "
             f"out, {res.get('evaluated_sequences', res['heldout_sequences'])} of them evaluated with every "
             "response position anchoring a fully masked block of 16. τ(bs) = 1 + mean "
             "longest correct prefix (greedy). The held-out sequences are the last of the responses file, which "
             "is ordered by prompt length (generation batches): the longest prompts, GSM8K-train word problems in "
             "the CPU default; the 6 training sequences its first (short Alpaca instructions): "
             "compare variants within a column, not the two columns.", "",
             "| variant | levers | steps | s/step | train s | acc@1 | acc@2 | acc@4 | acc@8 | acc@15 | τ(4) | τ(8) | τ(16) |"
             " τ(16) on 6 training sequences |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in v.items():
        a, t = r["heldout"]["offset_accuracy"], {int(k): x for k, x in r["heldout"]["tau"].items()}
        lines.append(f"| {name} | {r['note']} | {r['steps']} | {r['probe_step_seconds']:.2f} | "
                     f"{r['train_seconds']:.0f} | {a[0]:.3f} | "
                     f"{a[1]:.3f} | {a[3]:.3f} | {a[7]:.3f} | {a[14]:.3f} | {t[4]:.2f} | {t[8]:.2f} | "
                     f"{t[16]:.2f} | {_tau(r['train_subset'], 16):.2f} |")
    for key, e in res.get("engine", {}).items():
        lines += ["", f"## Decoded side by side with AR ({key})", "",
                  f"{e['num_prompts']} held-out prompt(s) per benchmark of {', '.join(e['benchmarks'])}, "
                  f"{e['max_new_tokens']} new tokens, greedy, oneDNN-packed linears for every method; AR TPOT "
                  f"{e['ar_tpot_ms']:.1f} ms.", "",
                  "| drafter@bs | τ | speedup vs AR | draft ms/round | verify ms/round | mismatches vs AR | tokens |",
                  "|---|---|---|---|---|---|---|"]
        for n, r in e["rows"].items():
            lines.append(f"| {n} | {r['tau']:.2f} | {r['speedup']:.2f}× | {r['draft_ms_per_round']:.1f} | "
                         f"{r['verify_ms_per_round']:.1f} | {r['mismatches']} | {r['decoded_tokens']} |")
    tf = res.get("teacher_forced", {})
    if tf:
        benches = sorted({b for e in tf.values() for b in e["benchmarks"]})
        lines += ["", "## Teacher-forced on a Table 3 run's prompts (no timing)", "",
                  "Every position of the run's AR output (repeat 0, T = 0) anchors a fully masked block; the "
                  "target's taps are computed over prompt + AR output. Greedy τ(4) / τ(16) per benchmark.", "",
                  "| drafter | " + " | ".join(benches) + " | mean | acc@1 (mean) |",
                  "|---|" + "---|" * (len(benches) + 2)]
        for n, entry in tf.items():
            cells = [f"{_tau(entry['benchmarks'][b], 4):.2f} / {_tau(entry['benchmarks'][b], 16):.2f}" for b in benches]
            m4 = sum(_tau(entry["benchmarks"][b], 4) for b in benches) / len(benches)
            m16 = sum(_tau(entry["benchmarks"][b], 16) for b in benches) / len(benches)
            a1 = sum(entry["benchmarks"][b]["offset_accuracy"][0] for b in benches) / len(benches)
            lines.append(f"| {n} | " + " | ".join(cells) + f" | {m4:.2f} / {m16:.2f} | {a1:.3f} |")
    if command:
        from dscout.provenance import report_header

        lines = report_header(lines[0][2:], command, wall_seconds or 0.0) + lines[2:]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in v.items():
        acc = r["heldout"]["offset_accuracy"]
        ax[0].plot(range(1, len(acc) + 1), acc, marker=".", label=name)
        ax[1].plot([4, 8, 16], [_tau(r["heldout"], b) for b in (4, 8, 16)], marker="o", label=name)
    ax[0].set(xlabel="block offset k", ylabel="held-out top-1 accuracy", title="accuracy per offset")
    ax[1].set(xlabel="block size bs", ylabel="greedy τ (held-out)", title="τ implied by the accuracies")
    ax[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "offsets.png", dpi=110)
    steps_set = {"max_steps" in r["overrides"] for r in v.values()}
    if res.get("teacher_forced") and steps_set == {True, False}:  # budget-timed runs give each recipe's s/step
        scaling_figure(res, out / "scaling.png")


def scaling_figure(res: dict, path: Path) -> None:
    """τ against training time per recipe: held-out τ(16) and the teacher-forced τ(4) on a Table 3 run's prompts.

    Time = updates × the recipe's seconds per update in its budget-timed run (the probe of the variant without
    ``steps<N>``), so a run slowed by other work on the machine does not move its point.
    """
    import matplotlib.pyplot as plt

    v, tf = res["variants"], res["teacher_forced"]
    timed = {r["overrides"].get("recipe", "dscout"): r for r in v.values() if "max_steps" not in r["overrides"]}
    per_step = {recipe: r["probe_step_seconds"] for recipe, r in timed.items()}

    def same_levers(r, recipe):  # the timed run's levers, only the number of updates differs
        return {k: x for k, x in r["overrides"].items() if k != "max_steps"} == timed[recipe]["overrides"]

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for recipe in sorted(per_step):
        pts = sorted((r["steps"] * per_step[recipe], _tau(r["heldout"], 16), n) for n, r in v.items()
                     if r["overrides"].get("recipe", "dscout") == recipe and same_levers(r, recipe))
        ax[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=recipe)
        tpts = [(x, sum(_tau(s, 4) for s in tf[n]["benchmarks"].values()) / len(tf[n]["benchmarks"]))
                for x, _, n in pts if n in tf]
        ax[1].plot([p[0] for p in tpts], [p[1] for p in tpts], marker="o", label=recipe)
    ax[0].set(xscale="log", xlabel="training CPU seconds (2 cores)", ylabel="held-out τ(16)",
              title="held-out responses (training distribution)")
    ax[1].set(xscale="log", xlabel="training CPU seconds (2 cores)", ylabel="τ(4), mean of 6 benchmarks",
              title="Table 3 prompts (teacher-forced)")
    for a in ax:
        a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--features", required=True)
    p.add_argument("--out", default=str(ROOT / "reports/drafter_efficiency"))
    p.add_argument("--work", default=str(ROOT / "results/studies/drafter_efficiency"))
    p.add_argument("--budget", type=float, default=150.0, help="CPU seconds of training per variant")
    p.add_argument("--holdout", type=int, default=24, help="last sequences never trained on")
    p.add_argument("--eval-sequences", type=int, default=16, help="held-out sequences evaluated")
    p.add_argument("--variants", default="base")
    p.add_argument("--combine", action="append", default=[], help="NAME=lever1+lever2 (a combined variant)")
    p.add_argument("--engine", default="", help="comma-separated variants decoded against AR")
    p.add_argument("--engine-prompts", type=int, default=1)
    p.add_argument("--engine-tokens", type=int, default=96)
    p.add_argument("--engine-benchmarks", default="gsm8k,humaneval,mt_bench")
    p.add_argument("--data-root", default=None)
    p.add_argument("--tf-bench", default=None,
                   help="results/bench/<id> of a Table 3 run: teacher-forced τ of the drafters on its prompts")
    p.add_argument("--tf-drafters", default="",
                   help="comma-separated variants and/or NAME=DIR drafter folders for --tf-bench")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--mask-token-id", type=int, default=16, help="config target.mask_token_id")
    a = p.parse_args(argv)
    t_start = time.perf_counter()

    import torch

    from dscout.data.paths import data_root
    from dscout.models.target import load_prepared_target as load_target
    from dscout.training.features import FeatureCache

    torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res_path = out / "results.json"
    res = json.loads(res_path.read_text()) if res_path.exists() else {"variants": {}, "engine": {}}
    target = load_target(a.target)
    cache = FeatureCache(a.features)
    layer_ids = list(cache.index["layer_ids"])
    n = len(cache)
    held = list(range(n - a.holdout, n))[: a.eval_sequences]
    train_ids = list(range(n - a.holdout))
    mask_id = a.mask_token_id
    res.update(budget_seconds=a.budget, train_sequences=len(train_ids), heldout_sequences=a.holdout,
               evaluated_sequences=len(held),
               features=a.features, layer_ids=layer_ids)
    variants = dict(VARIANTS)
    for spec in a.combine:
        name, levers = spec.split("=", 1)
        variants[name] = combine(*levers.split("+"))
    for name in [v for v in a.variants.split(",") if v]:
        if name in res["variants"]:
            print(f"[skip] {name}: already measured")
            continue
        over, note = variants[name]
        print(f"[train] {name}: {note}", flush=True)
        res["variants"][name] = run_variant(name, over, note, target, a.features, layer_ids, mask_id, train_ids,
                                            held, a.budget, a.seed, Path(a.work))
        r = res["variants"][name]
        print(f"  {r['steps']} steps, held-out acc@1 {r['heldout']['offset_accuracy'][0]:.3f}, "
              f"τ(16) {_tau(r['heldout'], 16):.2f}", flush=True)
        res_path.write_text(json.dumps(res, indent=1))
    if a.engine:
        names = a.engine.split(",")
        res["engine"][",".join(names)] = engine_eval(target, res["variants"], names, data_root(a.data_root),
                                                     a.engine_prompts, a.engine_tokens,
                                                     a.engine_benchmarks.split(","))
        res_path.write_text(json.dumps(res, indent=1))
    if a.tf_bench:
        dirs = {}
        for item in [x for x in a.tf_drafters.split(",") if x]:
            name, _, path = item.partition("=")
            dirs[name] = path or str(ROOT / res["variants"][name]["drafter_dir"])
        tf = teacher_forced_on_records(target, dirs, Path(a.tf_bench), data_root(a.data_root))
        res.setdefault("teacher_forced", {}).update(
            {n: {"bench_dir": _rel(a.tf_bench), "drafter_dir": _rel(dirs[n]), "benchmarks": v} for n, v in tf.items()})
        res_path.write_text(json.dumps(res, indent=1))
    write_report(res, out, "python benchmarks/drafter_efficiency.py " + shlex.join(sys.argv[1:] if argv is None else argv),
                 time.perf_counter() - t_start)


if __name__ == "__main__":
    main()
