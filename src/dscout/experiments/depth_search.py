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


def _random_drafter(target, stage: dict, depth: int, layer_ids: list[int]):
    """An untrained drafter of the search's shape (``depth`` layers over ``layer_ids``): its round latency equals a
    trained one's, weights do not change the cost."""
    import torch

    from ..models.drafter import DFlashDrafter, DFlashDrafterConfig
    from ..models.linear import pack_linears

    torch.manual_seed(0)
    vocab = (stage.get("options") or {}).get("draft_vocab_size")  # the draft head's width is part of the shape
    cfg = DFlashDrafterConfig.from_target(target.config, num_hidden_layers=depth, target_layer_ids=layer_ids,
                                          mask_token_id=stage["mask_token_id"], block_size=stage["block_size"],
                                          draft_vocab_size=vocab)
    rnd = DFlashDrafter(cfg).to(target.dtype).attach_target(target).eval()
    if stage.get("cpu_packed_linear"):
        pack_linears(rnd)
    return cfg, rnd


def latency_sweeps(target, stage: dict, prompts: list[list[int]], stop_ids: list[int]) -> dict:
    """The weight-free half of the search: T_d of every candidate and the conditioning-depth sweep.

    Every candidate's round latency is measured with an untrained drafter of its shape on ``prompts[:1]`` and
    fitted by :func:`fit_latency`; the configured taps are compared with all usable layers at the smallest
    candidate depth (Figure 3, left). The target is expected packed already when ``stage["cpu_packed_linear"]``.

    Returns:
        ``{"latency_sweep": {d: {round_seconds, draft_seconds, verify_seconds}}, "latency_fit": {t_fix_s,
        t_layer_s}, "taps_sweep": {t: {round_seconds, draft_seconds, flops_per_round}}, "taps_sweep_depth": d}``
        (seconds per round; FLOPs per round).
    Source: docs/method.md §5 (T_d = T_fix + d · T_layer).
    """
    from ..models.target import default_target_layer_ids

    bs = stage["block_size"]
    sweep = {}
    for d in sorted(stage["candidates"]):
        _, rnd = _random_drafter(target, stage, d, stage["layer_ids"])
        m = measure(target, rnd, prompts[:1], bs, stage["max_new_tokens"], stop_ids)
        sweep[d] = {"round_seconds": m["round_seconds"], "draft_seconds": m["draft_seconds"],
                    "verify_seconds": m["verify_seconds"]}
    t_fix, t_layer = fit_latency(list(sweep), [v["round_seconds"] for v in sweep.values()])

    # conditioning depth t: the configured taps vs all usable layers, same drafter depth (Figure 3, left)
    d_ref = sorted(stage["candidates"])[0]
    taps_sweep = {}
    for t_ids in (stage["layer_ids"], default_target_layer_ids(target.num_layers, target.num_layers - 1)):
        cfg, rnd = _random_drafter(target, stage, d_ref, t_ids)
        m = measure(target, rnd, prompts[:1], bs, stage["max_new_tokens"], stop_ids)
        taps_sweep[len(t_ids)] = {"round_seconds": m["round_seconds"], "draft_seconds": m["draft_seconds"],
                                  "flops_per_round": round_flops(target, cfg, bs, tau=1.0)}
    return {"latency_sweep": sweep, "latency_fit": {"t_fix_s": t_fix, "t_layer_s": t_layer},
            "taps_sweep": taps_sweep, "taps_sweep_depth": d_ref}


def candidate_stage(stage: dict, depth: int) -> dict:
    """The training stage of candidate ``depth`` (:func:`dscout.config.drafter_stage`'s shape, what ``dscout train``
    and :meth:`TrainConfig.from_stage` read): the search's recipe, taps, options and hyperparameters, ``depth``
    layers, ``stage["max_steps"]`` steps and one epoch (the steps bound the candidate, not the epochs).

    Raises:
        ValueError: if ``depth`` is not one of ``stage["candidates"]``.
    """
    if depth not in stage["candidates"]:
        raise ValueError(f"depth {depth} is not a candidate of the depth search {stage['candidates']}")
    opts = dict(stage.get("options") or {})
    init = bool(opts.pop("init_from_target", False))
    training = {**stage["training"], "max_steps": stage["max_steps"], "epochs": 1.0}
    return {"responses": stage.get("responses"), "recipe": stage["recipe"], "num_layers": depth,
            "layer_ids": stage["layer_ids"], "mask_token_id": stage["mask_token_id"], "features": stage.get("features"),
            "training": training, "init_from_target": init, "options": opts}


def evaluate_candidate(target, drafter_dir: str | Path, stage: dict, prompts: list[list[int]], stop_ids: list[int],
                       train_seconds: float = 0.0) -> DepthPoint:
    """τ_d, T_d and G_d of the trained candidate in ``drafter_dir`` (its ``config.json`` gives d), greedy on
    ``prompts`` at the search's block size. ``train_seconds``: wall seconds its training took (0 = reused)."""
    from ..models.export import drafter_for_target

    drafter = drafter_for_target(drafter_dir, target, packed=bool(stage.get("cpu_packed_linear")))
    m = measure(target, drafter, prompts, stage["block_size"], stage["max_new_tokens"], stop_ids)
    return DepthPoint(depth=int(drafter.config.num_hidden_layers), train_seconds=train_seconds, **m)


def search_result(stage: dict, sweeps: dict, points: list[DepthPoint]) -> dict:
    """``search.json``'s content from the latency sweeps (:func:`latency_sweeps`) and the trained points, in
    training order; the peak is :func:`unimodal_peak_search`'s over the points' throughput.

    Raises:
        ValueError: if ``points`` are not the lazy search's prefix (a point after the first throughput drop, or a
            gap in the candidates).
    """
    by_depth = {p.depth: p for p in points}
    peak, evaluated = unimodal_peak_search(stage["candidates"],
                                           lambda d: by_depth[d].throughput if d in by_depth else float("nan"))
    if list(evaluated) != sorted(by_depth) or any(v != v for v in evaluated.values()):
        raise ValueError(f"trained depths {sorted(by_depth)} are not the lazy search's order over "
                         f"{sorted(stage['candidates'])} (evaluated {list(evaluated)})")
    return {"peak_depth": peak, "trained": len(points), "exhaustive": len(sweeps["latency_sweep"]),
            "points": [asdict(p) for p in points], "latency_sweep": sweeps["latency_sweep"],
            "latency_fit": sweeps["latency_fit"], "block_size": stage["block_size"],
            "taps_sweep": sweeps["taps_sweep"], "taps_sweep_depth": sweeps["taps_sweep_depth"],
            "recipe": stage["recipe"], "layer_ids": stage["layer_ids"]}


def run_depth_search(target, feature_cache: str, stage: dict, prompts: list[list[int]], stop_ids: list[int],
                     out_dir: str | Path) -> dict:
    """The search of :func:`unimodal_peak_search` over ``stage["candidates"]``, training each candidate once, in
    this one process from an offline feature cache (``features.mode: cache``; with ``online`` features each
    candidate is its own training job, see rules/depth.smk, and :func:`search_result` assembles their points).

    Args:
        stage: ``recipe``, ``candidates``, ``layer_ids``, ``mask_token_id``, ``block_size``, ``max_new_tokens``
            and ``training`` (the trainer's hyperparameters).
        out_dir: candidates land in ``out_dir/d<d>/`` (reused when present: the search resumes), work files in
            ``out_dir/work/``; ``search.json`` is written last.
    Returns:
        The ``search.json`` content: trained points, the latency sweep over all candidates, the fit, the peak,
        and how many drafters the search trained against the exhaustive sweep.
    """
    from ..models.linear import pack_linears
    from ..training.trainer import TrainConfig, train_drafter

    out = Path(out_dir)
    if stage.get("cpu_packed_linear"):
        pack_linears(target.model, extra_weights=(target.lm_head.weight,))
    sweeps = latency_sweeps(target, stage, prompts, stop_ids)
    points: list[DepthPoint] = []

    def evaluate(d: int) -> float:
        ddir = out / f"d{d}"
        t0 = time.perf_counter()
        if not (ddir / "training_summary.json").exists():
            cfg = TrainConfig.from_stage(candidate_stage(stage, d), target.dtype)
            train_drafter(target, cfg, ddir, out / "work" / f"d{d}", feature_cache=feature_cache)
        points.append(evaluate_candidate(target, ddir, stage, prompts, stop_ids, time.perf_counter() - t0))
        return points[-1].throughput

    unimodal_peak_search(stage["candidates"], evaluate)
    result = search_result(stage, sweeps, points)
    out.mkdir(parents=True, exist_ok=True)
    (out / "search.json").write_text(json.dumps(result, indent=1))
    return result


def _packed_target(target, stage: dict) -> None:
    if stage.get("cpu_packed_linear"):
        from ..models.linear import pack_linears

        pack_linears(target.model, extra_weights=(target.lm_head.weight,))


def write_depth_point(target, drafter_dir: str | Path, stage: dict, prompts: list[list[int]], stop_ids: list[int],
                      out: str | Path) -> DepthPoint:
    """Measure one trained candidate (online features: its own job, after ``dscout train``) and write
    ``point.json`` (a :class:`DepthPoint`; ``train_seconds`` from the training's ``config.resolved.json``).

    Raises:
        FileNotFoundError: if ``drafter_dir`` holds no ``training_summary.json`` (the training did not finish).
    """
    ddir = Path(drafter_dir)
    if not (ddir / "training_summary.json").exists():
        raise FileNotFoundError(f"{ddir}/training_summary.json: the candidate's training did not finish")
    resolved = ddir / "config.resolved.json"
    train_s = (json.loads(resolved.read_text())["stage_config"].get("wall_seconds", 0.0)
               if resolved.exists() else 0.0)
    _packed_target(target, stage)
    point = evaluate_candidate(target, ddir, stage, prompts, stop_ids, float(train_s))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(asdict(point), indent=1))
    return point


def read_point(path: str | Path) -> DepthPoint:
    """A candidate's ``point.json`` (:func:`write_depth_point`).

    Raises:
        ValueError: naming the file and the field when a field is missing or not a number.
    """
    raw = json.loads(Path(path).read_text())
    fields = {}
    for name in DepthPoint.__dataclass_fields__:
        if name not in raw or not isinstance(raw[name], (int, float)):
            raise ValueError(f"{path}: field '{name}' is missing or not a number (a depth-search point.json)")
        fields[name] = raw[name]
    fields["depth"] = int(fields["depth"])
    return DepthPoint(**fields)


def assemble_depth_search(target, stage: dict, prompts: list[list[int]], stop_ids: list[int],
                          point_files: list[str | Path], out: str | Path) -> dict:
    """``search.json`` from the candidate jobs' points (online features) and this job's latency sweeps.

    The points are those the lazy search trained (rules/depth.smk asks for candidate d + 1 only while G rose at
    d); :func:`search_result` checks that they are that prefix. Returns what it writes to ``out``.
    """
    points = sorted((read_point(p) for p in point_files), key=lambda p: p.depth)
    _packed_target(target, stage)
    result = search_result(stage, latency_sweeps(target, stage, prompts, stop_ids), points)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1))
    return result


def depth_search_inputs(stage: dict, target_dir: str, root) -> tuple:
    """What every depth-search job decodes with: the prepared target, the first turns of ``stage["num_prompts"]``
    prompts of each of ``stage["benchmarks"]`` (chat-templated with ``stage["chat"]``) and the stop token ids.

    Returns:
        ``(target, prompts, stop_ids)``: prompts as ``list[list[int]]``.
    """
    from ..data.benchmarks import load_benchmark
    from ..data.prompts import first_turn_ids
    from ..models.target import load_prepared_target, stop_token_ids

    target = load_prepared_target(target_dir)
    chat = stage["chat"]
    items = [it for name in stage["benchmarks"]
             for it in load_benchmark(name, root, stage["num_prompts"], seed=stage["seed"])]
    prompts = first_turn_ids(target.tokenizer, items, chat)
    stops = stop_token_ids(target, chat.get("stop_tokens") or [])
    return target, prompts, stops
