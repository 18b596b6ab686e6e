"""Memory per GPU and training time of the paper preset's drafters: the memory plan and a FLOP-based update time.

Writes ``reports/memory_plan/report.md`` (provenance header: date, commit, host CPU, command, wall time):

* the memory plan (:mod:`dscout.training.memory_plan`: one real update per trained drafter on fake tensors, peak
  bytes per GPU with a breakdown) of ``presets/paper.yaml``, beside the plan-time formula
  (:mod:`dscout.training.memory_estimate`, what ``config.check_plan`` refuses with);
* the same for the micro-batch of 4 the preset named before (it does not fit 80 GB);
* seconds per update from a FLOP count of the update and two *estimated* constants (the GPU's dense bf16 peak and a
  model-FLOP utilisation), and the paper's training time on ``training.num_gpus`` GPUs at that rate. No GPU was lent
  when it was written: ``benchmarks/gpu_check.py``'s training section measures seconds per update on one.

    python benchmarks/memory_plan.py            # ~1-2 minutes on a CPU
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dscout.cost import DEVICE_CONSTANTS  # noqa: E402  (one home for the throughput constants: the bill's)

PEAK_FLOPS = DEVICE_CONSTANTS["cuda"]["peak_flops"][0]
"""Dense bf16 tensor-core peak of one H100 SXM (the cost model's constant and source)."""
MFU = DEVICE_CONSTANTS["cuda"]["train_mfu"][0]
"""Estimate: model-FLOP utilisation of a training update, the cost model's ``train_mfu`` (so the bill and this
report agree). Replace with ``gpu_check.py``'s measured seconds per update when run."""
PROMPTS = 1_400_000
"""Training sequences: Open-PerfectBlend's ~1.4M prompts (docs/method.md §3), each regenerated once."""


def update_flops(arch: dict, *, num_layers: int, num_taps: int, block_size: int, num_anchors: int, seq_len: int,
                 micro_batch_size: int, draft_vocab: int | None = None) -> dict:
    """Matmul FLOPs of one micro-step at its worst case (every anchor a fully masked block at ``block_size``).

    Forward = 2 FLOPs per weight per token; backward = 2x forward for trained weights, 1x for the frozen LM head
    (gradient to the input only) plus the chunked head's recomputation (one more forward). The target runs forward
    only. Attention: the target's causal ``2 S^2 q`` per layer, the drafter's block queries over their visible
    context (on average half of it) and their own block.
    """
    H, I, L, V = arch["hidden"], arch["inter"], arch["layers"], draft_vocab or arch["vocab"]
    q, kv = arch["heads"] * arch["head_dim"], arch["kv_heads"] * arch["head_dim"]
    layer = H * q + 2 * H * kv + q * H + 3 * H * I
    S, b = seq_len, micro_batch_size
    n = min(num_anchors, S - 2)
    T = b * n * block_size
    target = b * (2 * S * (L * layer + H * V) + L * 2 * S * S * q)  # weights + causal attention (QK^T and PV)
    d_fwd = 2 * T * num_layers * layer + 2 * b * S * (num_taps * H * H + num_layers * 2 * H * kv) \
        + num_layers * 4 * T * (S / 2 + block_size) * q
    head_fwd = 2 * b * n * (block_size - 1) * H * V
    drafter = 3 * d_fwd + 3 * head_fwd  # fwd + 2x bwd for the drafter; fwd + recompute + input-grad for the head
    return {"target": target, "drafter": drafter, "total": target + drafter}


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configfile", default="presets/paper.yaml")
    ap.add_argument("--out", default=str(ROOT / "reports" / "memory_plan" / "report.md"))
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    from dscout.config import load_config
    from dscout.training.memory_estimate import config_estimates, target_arch
    from dscout.training.memory_plan import CATEGORIES, memory_plan, plan_update, trained_drafters
    from dscout.training.recipes import get_recipe

    config = load_config(ROOT / "config.yaml", ROOT / a.configfile)
    plans = memory_plan(config, ROOT)
    est = config_estimates(config, ROOT)
    four = {**config["drafters"]["dscout"], "training": {"micro_batch_size": 4, "gradient_accumulation_steps": 1}}
    old = plan_update(config, "dscout", four, project_dir=ROOT)
    old_est = config_estimates({**config, "drafters": {"dscout": four}, "study": {"enabled": False},
                                "depth_search": {"enabled": False}}, ROOT)["dscout"]
    arch = target_arch(config["target"], ROOT)
    tr = config["training"]
    gas, world = int(tr.get("gradient_accumulation_steps") or 1), max(1, int(tr["num_gpus"]))
    per_update = gas * world * int(tr["micro_batch_size"])
    updates = math.ceil(float(tr["epochs"]) * PROMPTS / per_update)
    seconds = time.perf_counter() - t0

    from dscout.provenance import report_header

    lines = report_header("Memory per GPU and training time of the paper's drafters",
                          f"python benchmarks/memory_plan.py --configfile {a.configfile}", seconds,
                          "(no GPU: the plan runs on fake tensors)") + [
        "## Memory plan (one update per drafter, fake tensors)", "",
        f"`dscout memory-plan --configfile {a.configfile}`: target Qwen3-8B (bf16, {arch['layers']} layers), every drafter "
        f"at its worst-case micro-step ({tr['micro_batch_size']} sequence(s) x {config['responses']['max_length']} tokens, "
        f"{tr['num_anchors']} anchors, each a fully masked block at the recipe's largest horizon), ZeRO-2 over "
        f"{world} GPUs; GB = 10^9 bytes. `estimate` is the plan-time formula `config.check_plan` uses.", "",
        "| drafter | shape | recipe | B | supervised tokens | peak GB/GPU | estimate GB | "
        + " | ".join(CATEGORIES) + " | at |",
        "|---|---|---|---|---|---|---|" + "---|" * len(CATEGORIES) + "---|"]
    for p in plans:
        if isinstance(p, tuple):
            continue
        lines.append(f"| {p.name} | {p.label} | {p.recipe} | {p.shape['block_size']} | {p.shape['supervised_tokens']} | "
                     f"{p.peak_bytes / 1e9:.1f} | {est[p.name]['peak'] / 1e9:.1f} | "
                     + " | ".join(f"{p.breakdown[c] / 1e9:.1f}" for c in CATEGORIES) + f" | {p.phase} |")
    lines += ["", f"The preset's earlier micro-batch of 4 sequences (no accumulation): dscout {old.label} needs "
              f"{old.peak_bytes / 1e9:.1f} GB per GPU (estimate {old_est['peak'] / 1e9:.1f}; activations "
              f"{old.breakdown['activations'] / 1e9:.1f} GB): over 80 GB, so the preset now runs 1 sequence per "
              f"micro-step and {gas} accumulation steps (the same {per_update} sequences per update).", "",
              "## Update time and training time (estimates)", "",
              f"Constants that are estimates: GPU dense bf16 peak {PEAK_FLOPS / 1e12:.0f} TFLOP/s (H100 SXM), "
              f"model-FLOP utilisation {MFU:.2f}, {PROMPTS:,} training sequences, every one "
              f"{config['responses']['max_length']} tokens long (an upper bound: regenerated responses are shorter) "
              f"and every anchor used. "
              f"{tr['epochs']} epochs x {PROMPTS:,} / {per_update} sequences per update = {updates:,} updates.", "",
              "| drafter | shape | horizons | TFLOP per micro-step (target + drafter) | s per update (x" + str(gas)
              + " micro-steps) | updates | days on " + str(world) + " GPUs |", "|---|---|---|---|---|---|---|"]
    variants = trained_drafters(config)
    done = set()
    for p in plans:
        if isinstance(p, tuple):
            continue
        v = variants[p.name]
        horizons = get_recipe(v.get("recipe", "dscout"), **(v.get("recipe_overrides") or {})).horizons
        if (p.label, horizons) in done:  # the same update cost as a row above
            continue
        done.add((p.label, horizons))
        taps = int(p.label.split("t")[0])
        fs = [update_flops(arch, num_layers=int(v["num_layers"]), num_taps=taps, block_size=h,
                           num_anchors=int(tr["num_anchors"]), seq_len=int(config["responses"]["max_length"]),
                           micro_batch_size=int(tr["micro_batch_size"])) for h in horizons]
        f = {k: sum(x[k] for x in fs) / len(fs) for k in fs[0]}  # B is drawn uniformly per update
        s_update = gas * f["total"] / (PEAK_FLOPS * MFU)
        steps = (config["depth_search"]["max_steps"] if p.name.startswith("depth_")
                 else (v.get("training") or {}).get("max_steps") or updates)
        days = steps * s_update / 86400
        lines.append(f"| {p.name} | {p.label} | {'/'.join(map(str, horizons))} | {f['total'] / 1e12:.0f} "
                     f"({f['target'] / 1e12:.0f} + {f['drafter'] / 1e12:.0f}) | {s_update:.2f} | {steps:,} | {days:.1f} |")
    lines += ["", "Mixed-horizon recipes draw B per update: their FLOPs are the mean over their horizons (memory takes "
              "the largest). The study drafters and the depth candidates run `max_steps` updates, the main drafters "
              "the epochs. Replace the estimated update time by `benchmarks/gpu_check.py`'s measured one when a GPU "
              "runs it.", ""]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    return out


if __name__ == "__main__":
    main()
