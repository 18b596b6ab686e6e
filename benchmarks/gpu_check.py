"""GPU check of the draft-verify engines: AR vs speculative speed, τ and per-round costs on one GPU, offline.

Sized for <= 8 minutes on one H200 with nothing downloadable: the target is a *randomly initialised*
Qwen3-8B-shaped model (36 layers, hidden 4096, GQA 32/8, vocab 151936; bf16), built on the GPU in seconds and
"peaked" (:func:`build_target`: greedy output is a fixed permutation of the input token by a wide margin, every
kernel and shape unchanged), so timings hold and speculative output must equal AR's exactly even in bf16.
Drafting modes share the engines' loops:

* ``ar``: the baseline (same code path, no proposer);
* ``dflash``: a random 35t6d DFlash drafter (the paper's DScout shape) at each block size: real draft cost,
  τ ≈ 1 (random weights);
* ``replay``: the same drafter runs every round (real draft and catch-up cost), but its drafts are replaced by AR's
  own continuation, each corrupted with probability ``--flip``, so acceptance is long and realistic
  (τ(bs) ≈ Σ_k (1 − flip)^k): a measured end-to-end speedup at that τ;
* ``online-*`` (Table 4 section): the online bs controller, latency model calibrated on this GPU, over each drafter.

Section 1 decodes one request at a time (Table 3's engine); section 2 runs Table 4's batched engine at each
concurrency c with the round-time breakdown (verify, drafter, other); section 3 (training) runs real updates of the
35t6d DScout drafter (AWL, online features of a random Qwen3-8B-shaped target, flex attention, chunked LM-head
terms, DeepSpeed ZeRO-2 bf16 on one GPU) at the paper's micro-step (1 x 3072 tokens, 512 anchors, B = 32) and prints
the measured peak memory and seconds per update beside the memory plan's estimate of the same update
(``--train-steps 0`` skips it, ``--only-training`` runs it alone). On one GPU ZeRO-2 has nothing to shard over: the
plan puts that update at 71 GB (21 GB of it fp32 master weights and AdamW moments that 8 GPUs would split), inside
an H100's 80 GB; ``--train-micro-batch``, ``--train-seq-len`` and ``--train-anchors`` shrink it. Prints the tables and writes
``$OUT/gpu_check.json`` (or ``--out``) after each section. On the CPU, ``--shape tiny`` runs the same code in
seconds (the test suite does this so the script cannot rot).

    python benchmarks/gpu_check.py                      # on the GPU machine
    python benchmarks/gpu_check.py --shape tiny --device cpu --dtype float32 --concurrency 1,3
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
    """Drafts the continuation of a reference sequence, each draft corrupted with probability ``flip``, while
    paying the real drafter's cost: every call goes through ``inner`` (a block-diffusion proposer with the same
    bookkeeping: context, deferred commits, catch-up), and only its draft tokens are replaced.

    Args:
        inner: :class:`~dscout.decoding.proposers.BlockDiffusionProposer` (or its batched form, for one row).
        reference: prompt + AR output ids of this request; position p's token is ``reference[p]``.
        vocab: target vocabulary size (a corrupted draft is the next id).
        flip: per-draft corruption probability (accept lengths ~ geometric: τ(bs) ≈ sum_k (1 - flip)^k).
    """

    def __init__(self, inner, reference: list[int], vocab: int, flip: float, seed: int = 0):
        self.inner, self.ref, self.vocab, self.flip = inner, reference, vocab, flip
        self.layer_ids = inner.layer_ids
        self.max_block_size = inner.max_block_size
        self.g = torch.Generator().manual_seed(seed)

    @property
    def pending_tokens(self) -> int:
        return self.inner.pending_tokens

    def start(self, context_taps, token_ids=None):
        self.inner.start(context_taps, token_ids)

    def commit(self, taps, token_ids=None):
        self.inner.commit(taps, token_ids)

    def replay(self, position: int, num_drafts: int, device) -> torch.Tensor:
        toks = []
        for j in range(1, num_drafts + 1):
            t = self.ref[position + j] if position + j < len(self.ref) else 0
            if torch.rand(1, generator=self.g).item() < self.flip:
                t = (t + 1) % self.vocab
            toks.append(t)
        return torch.tensor(toks, device=device)

    def propose(self, last_token, position, num_drafts, temperature=0.0, generator=None):
        from dscout.decoding.proposers import Draft

        d = self.inner.propose(last_token, position, num_drafts, temperature, generator)  # the real cost
        return Draft(self.replay(position, num_drafts, d.tokens.device))


class BatchedReplay:
    """The batched form of :class:`ReplayProposer`: one real batched drafter forward per round (catch-up
    included), then each row's drafts replaced by its reference's continuation (corrupted with ``flip``)."""

    def __init__(self, group, references: list[list[int]], vocab: int, flip: float, seed: int = 0):
        self.group = group
        self.rows = [ReplayProposer(group, r, vocab, flip, seed + i) for i, r in enumerate(references)]

    @property
    def pending_tokens(self) -> int:
        return self.group.pending_tokens

    def start(self, context_taps, valid=None):
        self.group.start(context_taps, valid)

    def commit(self, row, taps):
        self.group.commit(row, taps)

    def end_round(self):
        self.group.end_round()

    def select(self, rows):
        """Keep batch rows ``rows`` (``[n]`` long, ascending) as the engine compacts finished requests away: the
        drafter group and the per-row references are cut alike, so row ``j`` keeps replaying its own reference."""
        self.group.select(rows)
        self.rows = [self.rows[i] for i in rows.tolist()]

    def propose(self, last_tokens, positions, num_drafts, temperature=0.0, generator=None):
        from dscout.decoding.proposers import Draft

        ds = self.group.propose(last_tokens, positions, num_drafts, temperature, generator)
        return [None if d is None else Draft(self.rows[i].replay(positions[i], num_drafts[i], d.tokens.device))
                for i, d in enumerate(ds)]


def replay_factory(drafter, references, vocab, flip):
    """``() -> proposer`` for the batched engine: its ``batched()`` is a :class:`BatchedReplay` over the batch."""
    from dscout.decoding.proposers import BlockDiffusionProposer

    def make():
        inner = BlockDiffusionProposer(drafter)
        prop = ReplayProposer(inner, references[0], vocab, flip)
        prop.batched = lambda: BatchedReplay(inner.batched(), references, vocab, flip)
        return prop

    return make


def build_target(shape: str, dtype: torch.dtype, device: str, peaked: bool = True):
    """A randomly initialised Qwen3 of ``shape`` on ``device``.

    ``peaked``: the residual branches (attention ``o_proj``, MLP ``down_proj``) are scaled by 1e-3 and the LM head
    is the input embedding under a random permutation π, so the greedy next token of x is π(x) by a wide margin
    (logit ≈ 82 against ≈ 6 for the runner-up at Qwen3-8B's shape). Every kernel and shape is the model's own; only
    the values change, so timings hold while greedy output is deterministic in bf16 and speculative == AR is an exact
    check (with plain random weights bf16 near-ties make batched and single-row argmaxes differ within a few dozen
    tokens, and a replayed reference then stops matching).
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from dscout.models.target import TargetModel

    torch.manual_seed(0)
    cfg = Qwen3Config(**SHAPES[shape], initializer_range=0.02, attn_implementation="sdpa")
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(dtype)
    if peaked:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.mul_(1e-3)
                layer.mlp.down_proj.weight.mul_(1e-3)
            emb = model.model.embed_tokens.weight
            perm = torch.randperm(emb.shape[0], generator=torch.Generator().manual_seed(1)).to(emb.device)
            model.lm_head.weight[perm] = emb
    return TargetModel(model)


def _tpot(res) -> float:
    return res.decode_seconds / max(res.new_tokens - 1, 1)


@torch.no_grad()
def _hf_step_seconds(target, prompt: list[int], steps: int) -> float:
    """Seconds per greedy step of a plain transformers loop (``model(x, past_key_values=cache)``, no engine): the
    floor our AR engine is compared with."""
    from transformers import DynamicCache

    m, dev = target.model, target.device
    cache = DynamicCache()
    x = m(torch.tensor([prompt], device=dev), past_key_values=cache).logits[:, -1:].argmax(-1)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        x = m(x, past_key_values=cache).logits[:, -1:].argmax(-1)
    int(x)  # waits for the last step
    return (time.perf_counter() - t0) / steps


def single_request(args, target, drafter, rows: dict) -> int:
    """AR vs random-drafter DFlash vs costed replay, one request at a time; returns greedy mismatches vs AR."""
    from dscout.decoding.engine import SpeculativeEngine
    from dscout.decoding.proposers import BlockDiffusionProposer

    ar = SpeculativeEngine(target, stop_token_ids=[])
    spec = SpeculativeEngine(target, BlockDiffusionProposer(drafter), stop_token_ids=[])
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, target.vocab_size - 2, (args.prompt_len,), generator=g).tolist()
               for _ in range(args.prompts)]
    ar.generate(prompts[0], args.new_tokens)  # warm-up (kernels, allocator, every length the timed runs meet)
    spec.generate(prompts[0], args.new_tokens, block_size=4)
    rows["hf-loop"] = [{"tpot": _hf_step_seconds(target, prompts[0], args.new_tokens), "tau": 1.0}]
    mismatches = 0
    for p in prompts:
        a = ar.generate(p, args.new_tokens)
        rows.setdefault("ar", []).append({"tpot": _tpot(a), "tau": 1.0, "verify_s": statistics.mean(a.verify_seconds)})
        ref = p + a.output_ids
        for bs in args.block_sizes:
            s = spec.generate(p, args.new_tokens, block_size=bs)
            mismatches += s.output_ids != a.output_ids
            rows.setdefault(f"dflash-bs{bs}", []).append(
                {"tpot": _tpot(s), "tau": s.mean_accept_length, "draft_s": statistics.mean(s.draft_seconds),
                 "verify_s": statistics.mean(s.verify_seconds)})
            rp = SpeculativeEngine(target, ReplayProposer(BlockDiffusionProposer(drafter), ref, target.vocab_size,
                                                          args.flip), [])
            r = rp.generate(p, args.new_tokens, block_size=bs)
            mismatches += r.output_ids != a.output_ids
            rows.setdefault(f"replay-bs{bs}", []).append(
                {"tpot": _tpot(r), "tau": r.mean_accept_length, "draft_s": statistics.mean(r.draft_seconds),
                 "verify_s": statistics.mean(r.verify_seconds)})
    return mismatches


def _batch_row(b, ar_tps: float | None) -> dict:
    rounds = max(len(b.verify_seconds), 1)
    taus = [r.mean_accept_length for r in b.results]
    drafted = [x for x in b.block_sizes if x > 1]
    return {"throughput": b.throughput, "speedup": (b.throughput / ar_tps) if ar_tps else 1.0,
            "tau": statistics.mean(taus), "rounds": rounds,
            "round_ms": 1e3 * b.decode_seconds / rounds,
            "verify_ms": 1e3 * statistics.mean(b.verify_seconds or [0.0]),
            "drafter_ms": 1e3 * statistics.mean(b.drafter_seconds or [0.0]),
            "other_ms": 1e3 * (statistics.mean(b.draft_seconds or [0.0]) - statistics.mean(b.drafter_seconds or [0.0])),
            "controller_us_per_round": 1e6 * b.controller_seconds / rounds,
            "drafted_round_share": (len(drafted) / len(b.block_sizes)) if b.block_sizes else None,
            "mean_bs": statistics.mean(b.block_sizes) if b.block_sizes else None}


def serving(args, target, drafter, out_json) -> dict:
    """Table 4's batched engine at each concurrency c: AR, random-drafter DFlash (real draft cost, τ ≈ 1), costed
    replay (real draft cost, realistic τ) at fixed bs, and the online controller over both drafters."""
    from dscout.decoding.batched import BatchedSpeculativeEngine
    from dscout.decoding.proposers import BlockDiffusionProposer
    from dscout.evaluation.methods import online_controller

    out = {}
    g = torch.Generator().manual_seed(1)
    for c in args.concurrency:
        lens = torch.randint(args.prompt_len // 2, args.prompt_len + 1, (c,), generator=g).tolist()
        prompts = [torch.randint(0, target.vocab_size - 2, (n,), generator=g).tolist() for n in lens]
        ar = BatchedSpeculativeEngine(target, None, [])
        ar.generate([p[:16] for p in prompts], 4)  # warm-up at this c
        a = ar.generate(prompts, args.serve_new_tokens)  # the references the replay drafts from
        refs = [p + r.output_ids for p, r in zip(prompts, a.results)]
        cell = {}
        mism = 0
        warm = [p[:args.prompt_len // 4] for p in prompts]
        for bs in args.serve_block_sizes:  # warm-up of each fixed-bs engine's shapes (allocator, GEMM heuristics)
            BatchedSpeculativeEngine(target, lambda: BlockDiffusionProposer(drafter), []).generate(warm, 16, bs)
        a = ar.generate(prompts, args.serve_new_tokens)  # AR again, after the others' warm-up: the timed baseline
        cell["ar"] = _batch_row(a, None)
        ar_tps = a.throughput
        for bs in args.serve_block_sizes:
            rand = BatchedSpeculativeEngine(target, lambda: BlockDiffusionProposer(drafter), [])
            b = rand.generate(prompts, args.serve_new_tokens, block_size=bs)
            mism += sum(x.output_ids != y.output_ids for x, y in zip(b.results, a.results))
            cell[f"dflash-bs{bs}"] = _batch_row(b, ar_tps)
            rep = BatchedSpeculativeEngine(target, replay_factory(drafter, refs, target.vocab_size, args.flip), [])
            b = rep.generate(prompts, args.serve_new_tokens, block_size=bs)
            mism += sum(x.output_ids != y.output_ids for x, y in zip(b.results, a.results))
            cell[f"replay-bs{bs}"] = _batch_row(b, ar_tps)
        max_bs = max(args.serve_block_sizes)
        for name, factory in (("online-dflash", lambda: BlockDiffusionProposer(drafter)),
                              ("online-replay", replay_factory(drafter, refs, target.vocab_size, args.flip))):
            t0 = time.perf_counter()
            ctl = online_controller(target, BlockDiffusionProposer(drafter),
                                    {"calibration_block_sizes": [b for b in (1, 2, 3, 4, 6, 8, 12, 16) if b <= max_bs],
                                     "calibration_repeats": 3}, concurrency=c, context_tokens=args.prompt_len)
            calib_s = time.perf_counter() - t0
            eng = BatchedSpeculativeEngine(target, factory, [], controller=ctl)
            eng.generate(prompts, args.serve_new_tokens // 2, block_size=max_bs)  # learns; then the measured batch
            b = eng.generate(prompts, args.serve_new_tokens, block_size=max_bs)
            mism += sum(x.output_ids != y.output_ids for x, y in zip(b.results, a.results))
            cell[name] = _batch_row(b, ar_tps) | {"calibration_s": calib_s}
        cell["mismatches"] = mism
        out[c] = cell
        print(f"\nc = {c}: {'method':<16}{'tok/s':>9}{'x AR':>7}{'tau':>6}{'round ms':>10}{'verify':>8}"
              f"{'drafter':>9}{'other':>7}{'drafted':>9}")
        for k, r in cell.items():
            if k == "mismatches":
                continue
            share = "" if r["drafted_round_share"] is None else f"{r['drafted_round_share']:.0%}"
            print(f"{'':7}{k:<16}{r['throughput']:>9.1f}{r['speedup']:>7.2f}{r['tau']:>6.2f}{r['round_ms']:>10.2f}"
                  f"{r['verify_ms']:>8.2f}{r['drafter_ms']:>9.2f}{r['other_ms']:>7.2f}{share:>9}")
        print(f"{'':7}greedy outputs differing from AR: {mism}")
        out_json["serving"] = out
        _write(args, out_json)
    return out


def measured_peak(device: str, run) -> tuple[int, object]:
    """Peak bytes allocated while ``run()`` executes (and its result): ``torch.cuda.max_memory_allocated`` on a GPU,
    the CPU allocator's own events (the profiler's memory events) on the CPU; counted from zero, so what was
    allocated before (the weights) is added at its current size."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        out = run()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(), out
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = run()
    live = peak = 0
    for _, n in sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                       if e.name() == "[memory]"):
        live += n
        peak = max(peak, live)
    return peak, out


def training(args, result) -> dict:
    """Real updates of the DScout drafter (AWL, online features of the random target, DeepSpeed ZeRO-2 bf16 on a
    GPU, the CPU JSON elsewhere) at ``--train-*`` shapes (default: the paper's micro-step), beside the memory
    plan's estimate of the same update on one rank (:func:`dscout.training.memory_plan.plan_update`)."""
    import deepspeed
    from transformers import Qwen3Config

    from dscout.config import load_config
    from dscout.models.target import default_target_layer_ids
    from dscout.training.features import online_batch
    from dscout.training.memory_plan import plan_update, worst_case_inputs
    from dscout.training.methods import DFlashMethod
    from dscout.training.step import blocks_loss
    from dscout.training.trainer import TrainConfig, _ds_config, init_distributed

    root = Path(__file__).resolve().parents[1]
    gpu = args.device.startswith("cuda")
    dtype = torch.bfloat16 if gpu else torch.float32
    target = build_target(args.shape, dtype, args.device, peaked=False)
    L, V = target.num_layers, target.vocab_size
    taps = default_target_layer_ids(L, args.taps or L - 1)
    ds_json = root / "configs" / "deepspeed" / ("zero2_bf16.json" if gpu else "cpu.json")
    tr = {"micro_batch_size": args.train_micro_batch, "num_anchors": args.train_anchors, "num_gpus": 1,
          "deepspeed_config": str(ds_json), "lr": 6e-4}
    config = load_config(root / "config.yaml", overrides={
        "target": {"name": "gpu-check", "source": "gpu-check", "num_layers": L, "vocab_size": V,
                   "mask_token_id": V - 1, "dtype": "bfloat16" if gpu else "float32"},
        "responses": {"max_length": args.train_seq_len}, "training": tr,
        "drafters": {"dscout": {"recipe": "dscout", "num_layers": args.drafter_layers, "target_layer_ids": taps,
                                "options": {"draft_vocab_size": None}}}})
    est = plan_update(config, "dscout", gpu=gpu, project_dir=root, world=1,
                      hf_config=Qwen3Config(**SHAPES[args.shape], attn_implementation="sdpa"))
    cfg = TrainConfig(recipe="dscout", num_layers=args.drafter_layers, target_layer_ids=taps, mask_token_id=V - 1,
                      num_anchors=args.train_anchors, micro_batch_size=args.train_micro_batch,
                      dtype=str(dtype).replace("torch.", ""), deepspeed_config=str(ds_json),
                      options={"draft_vocab_size": None})
    init_distributed()
    method = DFlashMethod(cfg)
    drafter = method.build(target)
    drafter.set_tap_scale(torch.ones(drafter.tap_scale.shape))
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=cfg.lr, fused=not gpu)
    engine, _, _, _ = deepspeed.initialize(model=drafter, optimizer=opt, config=_ds_config(str(ds_json), cfg, 100, 1))
    if engine.zero_optimization_stage() == 0:
        engine.enable_backward_allreduce = False
    sequences, plan = worst_case_inputs(args.train_micro_batch, args.train_seq_len, args.train_anchors,
                                        method.recipe, V, V - 1)
    seconds: list[float] = []

    def update():
        t0 = time.perf_counter()
        batch = online_batch(target, sequences, method.layer_ids)
        batch.taps, batch.final_hidden = batch.taps.to(dtype), batch.final_hidden.to(dtype)
        loss, m = blocks_loss(engine.module, batch, plan, method.recipe)
        engine.backward(loss)
        engine.step()
        if gpu:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
        return float(loss.detach())

    losses = [update()]  # the first builds AdamW's state (and compiles flex attention on a GPU)
    before = torch.cuda.memory_allocated() if gpu else 0
    peak, more = measured_peak(args.device, lambda: [update() for _ in range(max(1, args.train_steps - 1))])
    if not gpu:  # the CPU events count from the start of the measured updates: add what was live before
        before = sum(t.numel() * t.element_size() for t in list(target.model.parameters())
                     + list(drafter.parameters()) + list(drafter.buffers()))
        before += sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
                      if torch.is_tensor(v))
        peak += before
    later = seconds[1:]
    out = {"drafter": est.label, "recipe": "dscout (AWL)", "shape": est.shape, "world": 1,
           "zero_stage": est.zero_stage, "estimated_peak_bytes": est.peak_bytes, "estimated_breakdown": est.breakdown,
           "measured_peak_bytes": int(peak), "peak_ratio": est.peak_bytes / max(peak, 1),
           "first_update_seconds": seconds[0], "seconds_per_update": statistics.median(later),
           "losses": losses + more, "supervised_tokens": plan.num_supervised}
    print(f"\ntraining: {est.label} DScout (AWL, online features), {args.train_micro_batch} x {args.train_seq_len} "
          f"tokens, {plan.blocks.anchors.shape[1]} anchors x B {plan.blocks.block_size}, ZeRO-{est.zero_stage} on 1 "
          f"{'GPU' if gpu else 'CPU'}")
    print(f"  peak memory: measured {peak / 1e9:.2f} GB, memory plan {est.peak_bytes / 1e9:.2f} GB "
          f"(ratio {out['peak_ratio']:.3f}); seconds per update {out['seconds_per_update']:.3f} "
          f"(first {seconds[0]:.1f})")
    result["training"] = out
    _write(args, result)
    del engine, drafter, opt, target
    if gpu:
        torch.cuda.empty_cache()
    return out


def _write(args, result) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--block-sizes", default="4,8,16")
    ap.add_argument("--concurrency", default="1,8,16,32", help="Table 4 section: c values ('' skips it)")
    ap.add_argument("--serve-block-sizes", default="4,8")
    ap.add_argument("--serve-new-tokens", type=int, default=96)
    ap.add_argument("--drafter-layers", type=int, default=6, help="drafter depth d")
    ap.add_argument("--taps", type=int, default=None, help="conditioning depth t (default: L - 1 = all usable)")
    ap.add_argument("--flip", type=float, default=0.15, help="replay proposer: per-draft corruption probability")
    ap.add_argument("--cudnn-sdpa", action="store_true", help="keep cuDNN's attention backend enabled")
    ap.add_argument("--no-peaked", dest="peaked", action="store_false", help="plain random weights (build_target)")
    ap.add_argument("--train-steps", type=int, default=3, help="training section: updates (0 skips it)")
    ap.add_argument("--train-seq-len", type=int, default=3072, help="training section: tokens per sequence")
    ap.add_argument("--train-anchors", type=int, default=512, help="training section: anchors per sequence")
    ap.add_argument("--train-micro-batch", type=int, default=1, help="training section: sequences per update")
    ap.add_argument("--only-training", action="store_true", help="run the training section alone")
    ap.add_argument("--out", default=os.environ.get("OUT", "results/gpu_check"))
    args = ap.parse_args(argv)
    args.block_sizes = [int(b) for b in args.block_sizes.split(",")]
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    args.serve_block_sizes = [int(b) for b in args.serve_block_sizes.split(",")]

    from dscout.models.drafter import DFlashDrafter, DFlashDrafterConfig
    from dscout.models.target import default_target_layer_ids

    dtype = getattr(torch, args.dtype)
    if args.device.startswith("cuda") and not args.cudnn_sdpa:
        # cuDNN's attention builds an execution plan per new (query, key) length the first time it meets it; a
        # decode meets a new key length every step, so whichever method ran first paid the plans (2026-12-04 run:
        # the same AR decode took 86, 47 and 39 ms per token in three passes). PyTorch's own kernels have no plans.
        torch.backends.cuda.enable_cudnn_sdp(False)
    if args.only_training:
        result = {"shape": args.shape, "device": torch.cuda.get_device_name() if args.device.startswith("cuda")
                  else "cpu", "args": {k: v for k, v in vars(args).items()}}
        training(args, result)
        return result
    t0 = time.perf_counter()
    target = build_target(args.shape, dtype, args.device, args.peaked)
    L = target.num_layers
    taps = default_target_layer_ids(L, args.taps or L - 1)
    dcfg = DFlashDrafterConfig.from_target(target.config, num_hidden_layers=args.drafter_layers,
                                           target_layer_ids=taps, mask_token_id=target.vocab_size - 1,
                                           block_size=max(args.block_sizes + args.serve_block_sizes))
    with torch.device(args.device):
        drafter = DFlashDrafter(dcfg).to(dtype)
    drafter.attach_target(target).eval()
    build_s = time.perf_counter() - t0
    dev_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    result = {"shape": args.shape, "device": dev_name, "dtype": args.dtype, "peaked": args.peaked,
              "drafter": f"{len(taps)}t{args.drafter_layers}d", "build_seconds": build_s,
              "args": {k: v for k, v in vars(args).items()}}

    rows: dict = {}
    mismatches = single_request(args, target, drafter, rows)
    ar_tpot = statistics.mean(x["tpot"] for x in rows["ar"])
    print(f"\n{args.shape} random target ({L} layers, {args.dtype}{', peaked' if args.peaked else ''}) on {dev_name}; "
          f"drafter {len(taps)}t{args.drafter_layers}d (random); {args.prompts} prompts x {args.prompt_len} tokens, "
          f"{args.new_tokens} new; build {build_s:.1f} s")
    print(f"{'method':<16}{'tau':>7}{'TPOT ms':>10}{'speedup':>9}{'draft ms':>10}{'verify ms':>11}")
    summary = {}
    for name, rs in rows.items():
        tau = statistics.mean(x["tau"] for x in rs)
        tpot = statistics.mean(x["tpot"] for x in rs)
        draft = statistics.mean(x.get("draft_s", 0.0) for x in rs)
        verify = statistics.mean(x.get("verify_s", 0.0) for x in rs)
        summary[name] = {"tau": tau, "tpot_s": tpot, "speedup": ar_tpot / tpot, "draft_s": draft, "verify_s": verify}
        print(f"{name:<16}{tau:>7.2f}{tpot * 1e3:>10.2f}{ar_tpot / tpot:>9.2f}{draft * 1e3:>10.2f}{verify * 1e3:>11.2f}")
    print(f"greedy outputs differing from AR: {mismatches} of {args.prompts * len(args.block_sizes) * 2}")
    result |= {"ar_tpot_s": ar_tpot, "methods": summary, "mismatches": mismatches}
    _write(args, result)
    if args.concurrency:
        serving(args, target, drafter, result)
    if args.train_steps:  # last: the decoding sections' target and drafter are freed first
        del target, drafter
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        training(args, result)
    return result


if __name__ == "__main__":
    main()
