"""GPU check of the draft-verify engine: AR vs speculative TPOT, τ and per-round costs on one GPU, offline.

Sized for <= 8 minutes on one H200 with nothing downloadable: the target is a *randomly initialised*
Qwen3-8B-shaped model (36 layers, hidden 4096, GQA 32/8, vocab 151936; bf16), built on the GPU in seconds, so
only timings mean something. Three drafting modes share the engine's one loop:

* ``ar``: the baseline (same code path, no proposer);
* ``dflash``: a random 35t6d DFlash drafter (the paper's DScout shape) at each block size: real draft cost,
  τ ≈ 1 (random weights), checks greedy output == AR on the GPU;
* ``replay``: a proposer replaying AR's own output with each draft corrupted with probability ``--flip``, so
  acceptance is long and realistic (τ ≈ paper range): measures verify + rollback cost at that τ. Its draft
  cost is ~0; the projected speedup adds the measured DFlash draft seconds per round.

Prints one table and writes ``$OUT/gpu_check.json`` (or ``--out``). On the CPU, ``--shape tiny`` runs the
same code in seconds (the test suite does this so the script cannot rot).

    python benchmarks/gpu_check.py                      # on the GPU machine
    python benchmarks/gpu_check.py --shape tiny --device cpu --dtype float32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

SHAPES = {
    # Qwen/Qwen3-8B config.json
    "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
}


class ReplayProposer:
    """Drafts the continuation of a reference sequence, each draft corrupted with probability ``flip``."""

    def __init__(self, reference: list[int], vocab: int, flip: float, layer_ids: list[int], seed: int = 0):
        self.ref, self.vocab, self.flip, self.layer_ids = reference, vocab, flip, layer_ids
        self.g = torch.Generator().manual_seed(seed)

    def start(self, context_taps, token_ids=None):
        self.pos = context_taps.shape[-2]

    def commit(self, taps, token_ids=None):
        self.pos += taps.shape[-2]

    def propose(self, last_token, position, num_drafts, temperature=0.0, generator=None):
        from dscout.decoding.proposers import Draft

        toks = []
        for j in range(1, num_drafts + 1):
            t = self.ref[position + j] if position + j < len(self.ref) else 0
            if torch.rand(1, generator=self.g).item() < self.flip:
                t = (t + 1) % self.vocab
            toks.append(t)
        return Draft(torch.tensor(toks))


def build_target(shape: str, dtype: torch.dtype, device: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from dscout.models.target import TargetModel

    torch.manual_seed(0)
    cfg = Qwen3Config(**SHAPES[shape], initializer_range=0.02, attn_implementation="sdpa")
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(dtype)
    return TargetModel(model)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--block-sizes", default="8,16,32")
    ap.add_argument("--drafter-layers", type=int, default=6, help="drafter depth d")
    ap.add_argument("--taps", type=int, default=None, help="conditioning depth t (default: L - 1 = all usable)")
    ap.add_argument("--flip", type=float, default=0.12, help="replay proposer: per-draft corruption probability")
    ap.add_argument("--out", default=os.environ.get("OUT", "results/gpu_check"))
    args = ap.parse_args(argv)

    from dscout.decoding.engine import SpeculativeEngine
    from dscout.decoding.proposers import BlockDiffusionProposer
    from dscout.models.drafter import DFlashDrafter, DFlashDrafterConfig
    from dscout.models.target import default_target_layer_ids

    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    target = build_target(args.shape, dtype, args.device)
    L = target.num_layers
    taps = default_target_layer_ids(L, args.taps or L - 1)
    dcfg = DFlashDrafterConfig.from_target(target.config, num_hidden_layers=args.drafter_layers,
                                           target_layer_ids=taps, mask_token_id=target.vocab_size - 1,
                                           block_size=max(int(b) for b in args.block_sizes.split(",")))
    with torch.device(args.device):
        drafter = DFlashDrafter(dcfg).to(dtype)
    drafter.attach_target(target).eval()
    build_s = time.perf_counter() - t0
    stop: list[int] = []
    ar = SpeculativeEngine(target, stop_token_ids=stop)
    spec = SpeculativeEngine(target, BlockDiffusionProposer(drafter), stop_token_ids=stop)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, target.vocab_size - 2, (args.prompt_len,), generator=g).tolist()
               for _ in range(args.prompts)]
    ar.generate(prompts[0][:16], 8)  # warm-up (kernels, allocator)
    spec.generate(prompts[0][:16], 8, block_size=4)
    block_sizes = [int(b) for b in args.block_sizes.split(",")]

    rows = {"ar": []}
    mismatches = 0
    for p in prompts:
        a = ar.generate(p, args.new_tokens)
        rows["ar"].append({"tpot": a.decode_seconds / max(a.new_tokens - 1, 1), "tau": 1.0})
        ref = p + a.output_ids
        for bs in block_sizes:
            s = spec.generate(p, args.new_tokens, block_size=bs)
            mismatches += s.output_ids != a.output_ids
            rows.setdefault(f"dflash-bs{bs}", []).append(
                {"tpot": s.decode_seconds / max(s.new_tokens - 1, 1), "tau": s.mean_accept_length,
                 "draft_s": statistics.mean(s.draft_seconds), "verify_s": statistics.mean(s.verify_seconds)})
            rp = SpeculativeEngine(target, ReplayProposer(ref, target.vocab_size, args.flip, taps), stop)
            r = rp.generate(p, args.new_tokens, block_size=bs)
            mismatches += r.output_ids != a.output_ids
            rows.setdefault(f"replay-bs{bs}", []).append(
                {"tpot": r.decode_seconds / max(r.new_tokens - 1, 1), "tau": r.mean_accept_length,
                 "verify_s": statistics.mean(r.verify_seconds)})

    ar_tpot = statistics.mean(x["tpot"] for x in rows["ar"])
    dev_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"\n{args.shape} random target ({L} layers, {args.dtype}) on {dev_name}; drafter "
          f"{len(taps)}t{args.drafter_layers}d (random); {args.prompts} prompts x {args.prompt_len} tokens, "
          f"{args.new_tokens} new; build {build_s:.1f} s")
    print(f"{'method':<16}{'tau':>7}{'TPOT ms':>10}{'speedup':>9}{'draft ms':>10}{'verify ms':>11}{'proj.':>7}")
    summary = {}
    for name, rs in rows.items():
        tau = statistics.mean(x["tau"] for x in rs)
        tpot = statistics.mean(x["tpot"] for x in rs)
        draft = statistics.mean(x.get("draft_s", 0.0) for x in rs)
        verify = statistics.mean(x.get("verify_s", 0.0) for x in rs)
        proj = None
        if name.startswith("replay"):  # replay tau with the real drafter's draft cost at this bs
            d = statistics.mean(x["draft_s"] for x in rows["dflash-" + name.split("-")[1]])
            proj = tau * ar_tpot / (d + verify)
        summary[name] = {"tau": tau, "tpot_s": tpot, "speedup": ar_tpot / tpot, "draft_s": draft,
                         "verify_s": verify, "projected_speedup": proj}
        print(f"{name:<16}{tau:>7.2f}{tpot * 1e3:>10.2f}{ar_tpot / tpot:>9.2f}{draft * 1e3:>10.2f}"
              f"{verify * 1e3:>11.2f}{'' if proj is None else f'{proj:.2f}':>7}")
    print(f"greedy outputs differing from AR: {mismatches} of {len(prompts) * len(block_sizes) * 2} "
          "(random bf16 weights: a difference is a near-tie unless it repeats)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"shape": args.shape, "device": dev_name, "dtype": args.dtype, "ar_tpot_s": ar_tpot,
              "methods": summary, "mismatches": mismatches, "drafter": f"{len(taps)}t{args.drafter_layers}d",
              "build_seconds": build_s, "args": vars(args)}
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
