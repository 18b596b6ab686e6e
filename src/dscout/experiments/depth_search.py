"""Drafter-depth search: throughput G_d = τ_d / T_d is unimodal in d, so train candidates lazily (docs/method.md §5).

Under two mild assumptions — diminishing MAT gains (Δ_{d+1} ≤ Δ_d) and linear round latency
T_d = T_fix + d · T_layer — G_d rises then falls: once G_{d+1} < G_d it never turns positive again. The search
therefore trains d = d_1 < d_2 < ... in order and stops at the first decrease, instead of training every
candidate. Latency does not depend on the weights, so T_d is measured for *every* candidate with untrained
drafters of the same shape (cheap) and fitted by least squares; τ_d needs a trained drafter.

Units: seconds per draft round (draft + verify), tokens per round (τ, bonus included), tokens per second (G).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable


@dataclass
class DepthPoint:
    """One evaluated drafter depth.

    Attributes:
        depth: d, decoder layers of the drafter.
        tau: MAT τ (tokens per round, bonus included) of the trained drafter.
        round_seconds: T_d, mean seconds per round (draft + verify).
        draft_seconds, verify_seconds: their parts per round.
        throughput: G_d = total new tokens / total decode seconds (= τ_d / T_d), tokens per second.
        train_seconds: wall time spent training this candidate (0 when reused from disk).
    """

    depth: int
    tau: float
    round_seconds: float
    draft_seconds: float
    verify_seconds: float
    throughput: float
    train_seconds: float = 0.0


def unimodal_peak_search(candidates: list[int], evaluate: Callable[[int], float]) -> tuple[int, dict[int, float]]:
    """Find the argmax of a unimodal function over increasing ``candidates``, evaluating lazily.

    Evaluates ``candidates`` in increasing order and stops at the first one whose value is below its
    predecessor's (the peak is that predecessor). Evaluates every candidate only if values never decrease.

    Args:
        candidates: distinct depths (sorted here).
        evaluate: d -> G_d (higher is better); called at most once per candidate.
    Returns:
        ``(peak, evaluated)`` with ``evaluated`` the values computed, in evaluation order.
    Raises:
        ValueError: if ``candidates`` is empty.
    Source: docs/method.md §5 (unimodality of G_d in d).
    """
    cands = sorted(set(candidates))
    if not cands:
        raise ValueError("no candidate depths")
    evaluated: dict[int, float] = {}
    best = cands[0]
    for d in cands:
        evaluated[d] = evaluate(d)
        if evaluated[d] < evaluated[best]:
            break
        best = d
    return best, evaluated


def fit_latency(depths: list[int], seconds: list[float]) -> tuple[float, float]:
    """Least-squares fit of T_d = T_fix + d · T_layer; returns ``(T_fix, T_layer)`` in seconds.

    Raises:
        ValueError: with fewer than two distinct depths.
    """
    if len(set(depths)) < 2:
        raise ValueError("need at least two distinct depths to fit T_fix and T_layer")
    md, mt = statistics.mean(depths), statistics.mean(seconds)
    slope = (sum((d - md) * (t - mt) for d, t in zip(depths, seconds))
             / sum((d - md) ** 2 for d in depths))
    return mt - slope * md, slope


def round_flops(target, drafter_config, block_size: int, tau: float = 1.0) -> dict[str, float]:
    """Multiply-add FLOPs (2 per MAC) of one draft round, from parameter counts (attention over the context
    ignored; it is the same for every configuration compared here).

    Target verify: ``2 · P_target · bs`` (embedding excluded, LM head included). Drafter: its layers over the
    ``bs`` block positions, the LM head over the ``bs - 1`` drafts, and the fusion ``fc`` (t·D_target -> D) over
    the ``tau`` newly committed context tokens.

    Returns:
        ``{"target": ..., "drafter": ..., "fc": ...}`` FLOPs.
    """
    cfg = target.config
    emb = cfg.vocab_size * cfg.hidden_size
    p_target = sum(p.numel() for p in target.model.parameters()) - emb
    if getattr(cfg, "tie_word_embeddings", False):
        p_target += emb  # the tied head still runs
    dc = drafter_config
    per_layer = (dc.hidden_size * dc.head_dim * (dc.num_attention_heads * 2 + dc.num_key_value_heads * 2)
                 + 3 * dc.hidden_size * dc.intermediate_size)
    fc = len(dc.target_layer_ids) * dc.target_hidden_size * dc.hidden_size
    return {"target": 2.0 * p_target * block_size,
            "drafter": 2.0 * (per_layer * dc.num_hidden_layers * block_size + emb * (block_size - 1)),
            "fc": 2.0 * fc * tau}


def measure(target, drafter, prompts: list[list[int]], block_size: int, max_new_tokens: int,
            stop_ids: list[int]) -> dict:
    """Greedy-decode ``prompts`` with ``drafter`` at ``block_size``; τ, per-round seconds and throughput."""
    from ..decoding.engine import SpeculativeEngine
    from ..decoding.proposers import BlockDiffusionProposer

    engine = SpeculativeEngine(target, BlockDiffusionProposer(drafter), stop_ids)
    engine.generate(prompts[0][:8], 4, block_size=block_size)  # warm-up
    rounds, tokens, seconds, draft, verify = [], 0, 0.0, [], []
    for p in prompts:
        r = engine.generate(p, max_new_tokens, block_size=block_size)
        rounds += r.accept_lengths
        tokens += r.new_tokens - 1
        seconds += r.decode_seconds
        draft += r.draft_seconds
        verify += r.verify_seconds
    n = max(len(rounds), 1)
    return {"tau": sum(rounds) / n, "round_seconds": seconds / n, "draft_seconds": sum(draft) / n,
            "verify_seconds": sum(verify) / n, "throughput": tokens / max(seconds, 1e-9)}


def run_depth_search(target, feature_cache: str, stage: dict, prompts: list[list[int]], stop_ids: list[int],
                     out_dir: str | Path) -> dict:
    """The search of :func:`unimodal_peak_search` over ``stage["candidates"]``, training each candidate once.

    Args:
        stage: ``recipe``, ``candidates``, ``layer_ids``, ``mask_token_id``, ``block_size``, ``max_new_tokens``
            and ``training`` (the trainer's hyperparameters).
        out_dir: candidates land in ``out_dir/d<d>/`` (reused when present: the search resumes), work files in
            ``out_dir/work/``; ``search.json`` is written last.
    Returns:
        The ``search.json`` content: trained points, the latency sweep over all candidates, the fit, the peak,
        and how many drafters the search trained against the exhaustive sweep.
    """
    import torch

    from ..models.drafter import DFlashDrafter, DFlashDrafterConfig
    from ..models.export import drafter_for_target
    from ..models.linear import pack_linears
    from ..training.trainer import TrainConfig, train_drafter

    out = Path(out_dir)
    tr = stage["training"]
    bs = stage["block_size"]
    if stage.get("cpu_packed_linear"):
        pack_linears(target.model, extra_weights=(target.lm_head.weight,))

    # latency of every candidate: random drafters of the same shape (weights do not change the cost)
    vocab = (stage.get("options") or {}).get("draft_vocab_size")  # the draft head's width is part of the shape
    sweep = {}
    for d in sorted(stage["candidates"]):
        torch.manual_seed(0)
        cfg = DFlashDrafterConfig.from_target(target.config, num_hidden_layers=d, target_layer_ids=stage["layer_ids"],
                                              mask_token_id=stage["mask_token_id"], block_size=bs,
                                              draft_vocab_size=vocab)
        rnd = DFlashDrafter(cfg).to(target.dtype).attach_target(target).eval()
        if stage.get("cpu_packed_linear"):
            pack_linears(rnd)
        m = measure(target, rnd, prompts[:1], bs, stage["max_new_tokens"], stop_ids)
        sweep[d] = {"round_seconds": m["round_seconds"], "draft_seconds": m["draft_seconds"],
                    "verify_seconds": m["verify_seconds"]}
    t_fix, t_layer = fit_latency(list(sweep), [v["round_seconds"] for v in sweep.values()])

    # conditioning depth t: the configured taps vs all usable layers, same drafter depth (Figure 3, left)
    from ..models.target import default_target_layer_ids

    d_ref = sorted(stage["candidates"])[0]
    taps_sweep = {}
    for t_ids in (stage["layer_ids"], default_target_layer_ids(target.num_layers, target.num_layers - 1)):
        torch.manual_seed(0)
        cfg = DFlashDrafterConfig.from_target(target.config, num_hidden_layers=d_ref, target_layer_ids=t_ids,
                                              mask_token_id=stage["mask_token_id"], block_size=bs,
                                              draft_vocab_size=vocab)
        rnd = DFlashDrafter(cfg).to(target.dtype).attach_target(target).eval()
        if stage.get("cpu_packed_linear"):
            pack_linears(rnd)
        m = measure(target, rnd, prompts[:1], bs, stage["max_new_tokens"], stop_ids)
        taps_sweep[len(t_ids)] = {"round_seconds": m["round_seconds"], "draft_seconds": m["draft_seconds"],
                                  "flops_per_round": round_flops(target, cfg, bs, tau=1.0)}

    points: dict[int, DepthPoint] = {}

    def evaluate(d: int) -> float:
        ddir = out / f"d{d}"
        t0 = time.perf_counter()
        if not (ddir / "training_summary.json").exists():
            opts = dict(stage.get("options") or {})
            init = bool(opts.pop("init_from_target", False))
            cfg = TrainConfig.from_stage({"recipe": stage["recipe"], "num_layers": d, "layer_ids": stage["layer_ids"],
                                          "mask_token_id": stage["mask_token_id"], "training": tr,
                                          "init_from_target": init, "options": opts},
                                         target.dtype, max_steps=stage["max_steps"], epochs=1.0)
            train_drafter(target, cfg, ddir, out / "work" / f"d{d}", feature_cache=feature_cache)
        train_s = time.perf_counter() - t0
        drafter = drafter_for_target(ddir, target, packed=bool(stage.get("cpu_packed_linear")))
        m = measure(target, drafter, prompts, bs, stage["max_new_tokens"], stop_ids)
        points[d] = DepthPoint(depth=d, train_seconds=train_s, **m)
        return m["throughput"]

    peak, _ = unimodal_peak_search(stage["candidates"], evaluate)
    result = {"peak_depth": peak, "trained": len(points), "exhaustive": len(sweep),
              "points": [asdict(p) for p in points.values()], "latency_sweep": sweep,
              "latency_fit": {"t_fix_s": t_fix, "t_layer_s": t_layer}, "block_size": bs,
              "taps_sweep": taps_sweep, "taps_sweep_depth": d_ref,
              "recipe": stage["recipe"], "layer_ids": stage["layer_ids"]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "search.json").write_text(json.dumps(result, indent=1))
    return result
