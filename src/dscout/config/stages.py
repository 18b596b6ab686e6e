"""The per-stage configuration slices and their ids.

Every stage's output path carries a short hash of *exactly* the configuration it depends on (its slice), so a
benchmark-only change never retrains a drafter and a recipe change never regenerates responses.

Stage dependency chain (each key includes its parent's key):
``target -> responses -> features(layer set) / drafter(variant) -> bench(benchmark, repeat, temperature)``.
Torch-free.
"""

from __future__ import annotations

import copy
import hashlib
import json

from .schema import deep_merge


def benchmark_names() -> list[str]:
    """The benchmark registry's names (torch-free; Snakemake's ``benchmark`` wildcard takes exactly these)."""
    from ..data.benchmarks import BENCHMARKS

    return list(BENCHMARKS)


def short_hash(obj, n: int = 8) -> str:
    """First ``n`` hex digits of the sha256 of the canonical JSON of ``obj``."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


def target_stage(cfg: dict) -> dict:
    """What the target depends on: its source and dtype."""
    t = cfg["target"]
    return {"source": t["source"], "dtype": t["dtype"]}


def target_id(cfg: dict) -> str:
    """``<target name>-<hash of target_stage>``."""
    return f"{cfg['target']['name']}-{short_hash(target_stage(cfg))}"


def responses_stage(cfg: dict) -> dict:
    """What the regenerated responses depend on: the target, the chat and section ``responses``."""
    t = cfg["target"]
    return {"target": target_id(cfg), "chat": {"system_prompt": t.get("system_prompt"),
                                               "enable_thinking": t.get("enable_thinking")},
            "responses": cfg["responses"]}


def responses_id(cfg: dict) -> str:
    """``<target name>-<hash of responses_stage>``."""
    return f"{cfg['target']['name']}-{short_hash(responses_stage(cfg))}"


def drafter_variant(cfg: dict, name: str) -> dict:
    """A drafter variant with training defaults applied and layer ids resolved against the target depth."""
    if name not in cfg["drafters"]:
        raise KeyError(f"unknown drafter '{name}'; defined: {', '.join(cfg['drafters'])}")
    v = copy.deepcopy(cfg["drafters"][name])
    train = deep_merge(cfg["training"], v.pop("training", {}) or {})
    return {"name": name, **v, "training": train}


def resolved_layer_ids(variant: dict, num_target_layers: int) -> list[int]:
    """The target layers a drafter variant reads (id l = output of decoder layer l), resolved by its kind
    (:mod:`dscout.kinds`)."""
    from ..kinds import drafter_kind

    return drafter_kind(variant.get("kind", "dflash")).layer_ids(variant, num_target_layers)


def features_stage(cfg: dict, layer_ids: list[int]) -> dict:
    """What a feature cache depends on: the responses, its layer set (sorted) and the storage dtype."""
    return {"responses": responses_id(cfg), "layer_ids": sorted(set(layer_ids)),
            "store_dtype": cfg["features"]["store_dtype"]}


def features_id(cfg: dict, layer_ids: list[int]) -> str:
    """Directory name of the feature cache of a layer set, e.g. ``float16-l1.8.15.22.29`` (order-free)."""
    layers = ".".join(str(l) for l in sorted(set(layer_ids)))
    return f"{cfg['features']['store_dtype']}-l{layers}"


def drafter_stage(cfg: dict, name: str, num_target_layers: int) -> dict:
    """What a drafter depends on: the responses, the mask token, the feature mode, its resolved target layers and
    its variant with training defaults (an imported ``pretrained`` drafter: the target and the checkpoint only)."""
    v = drafter_variant(cfg, name)
    v.pop("name")
    if v.get("pretrained"):  # imported, not trained: depends on the target and the checkpoint only
        return {"target": target_id(cfg), "kind": v.get("kind", "dflash"), "pretrained": v["pretrained"],
                "num_layers": v["num_layers"], "layer_ids": [], "mask_token_id": cfg["target"]["mask_token_id"]}
    layer_ids = resolved_layer_ids(v, num_target_layers)
    v["training"].pop("gpu_memory_gb", None)  # a plan-time limit, not what the drafter is trained with
    feats = {k: cfg["features"][k] for k in ("mode", "store_dtype")}  # not the feature pass's batch size
    return {"responses": responses_id(cfg), "mask_token_id": cfg["target"]["mask_token_id"],
            "features": feats, "layer_ids": layer_ids, **v}


def drafter_id(cfg: dict, name: str, num_target_layers: int) -> str:
    """``<name>-<shape>-<hash of drafter_stage>``; shape ``<taps>t<layers>d`` (DFlash / DScout), ``pretrained``,
    or the kind."""
    st = drafter_stage(cfg, name, num_target_layers)
    if st.get("pretrained"):
        shape = "pretrained"
    elif st.get("kind", "dflash") == "dflash":
        shape = f"{len(st['layer_ids'])}t{st['num_layers']}d"
    else:
        shape = st["kind"]
    return f"{name}-{shape}-{short_hash(st)}"


def controller_settings(cfg: dict, overrides: dict | None = None) -> dict:
    """The settings an online controller runs with: section ``controller`` with a row's overrides on top.

    Every setting is kept, ``explore: 0`` included: since 2026-12-06 the controller's default is ``explore: 0.5``
    (:class:`~dscout.decoding.controller.BlockSizeController`), so 0 is a choice the records' ids must name.
    """
    return {**cfg["controller"], **(overrides or {})}


def controller_suffix(overrides: dict | None) -> str:
    """Method-key suffix of an online row with its own controller settings, e.g. ``-explore0.5-recent_strength10``
    (``-ctl<hash>`` when a setting is a list or the suffix would be long); empty without overrides."""
    if not overrides:
        return ""
    parts = [f"{k}{v:g}" if isinstance(v, float) else f"{k}{v}" for k, v in sorted(overrides.items())]
    suffix = "-" + "-".join(parts)
    if any(isinstance(v, (list, dict)) for v in overrides.values()) or len(suffix) > 48:
        suffix = f"-ctl{short_hash(overrides)}"
    return suffix


def method_key(spec: dict, drafter_id: str | None) -> str:
    """File-safe key of a method row, e.g. ``dscout-bs16-<drafter id>``, ``dscout-online-explore0.5-<drafter id>``
    (an online row with its own ``controller`` settings), ``vllm-dscout-bs4-<drafter id>`` (a row served by vLLM)."""
    import re

    bs = spec.get("block_size")
    key = spec["kind"] + ("-online" if bs == "online" else f"-bs{bs}" if bs else "")
    if method_backend(spec) != "engine":  # a server's row: its runtime leads the key (beside ``<backend>-ar``)
        key = f"{spec['backend']}-{key}"
    key += (f"-k{spec['topk']}" if spec.get("topk") else "") + (f"-d{spec['depth']}" if spec.get("depth") else "")
    key += "-nofeat" if spec.get("use_features") is False else ""
    key += controller_suffix(spec.get("controller_overrides"))
    if drafter_id:
        key += f"-{drafter_id}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)


SERVER_BACKENDS = {"vllm": ("dflash", "dscout", "eagle3"), "sglang": ("dflash", "dscout", "eagle3")}
"""Table 3's server runtimes (``methods[].backend``) and the method kinds each serves: vLLM's DFlash loader takes
our DFlash / DScout drafters and its EAGLE-3 loader our EAGLE-3 drafters (exported in its layout; a chain, ``topk:
1``); SGLang serves DFlash / DScout from our checkpoints and EAGLE-3 from a published one. PARD-2 and the online
controller run on our engine only."""


def method_backend(spec: dict) -> str:
    """The runtime a Table 3 row decodes on: ``engine`` (this project's, records' ``runtime: transformers``),
    ``vllm`` or ``sglang`` (a server per method, beside that server's own AR)."""
    return spec.get("backend") or "engine"


def table3_methods(cfg: dict) -> list[dict]:
    """The rows of ``methods`` with ``benchmarks.backend_stand_in`` applied: a row whose runtime has a stand-in runs on
    it (``engine``: the key is dropped, so the row is exactly an engine row). The paper_mini preset runs the paper's
    SGLang rows on our engine this way (SGLang needs a GPU)."""
    stand_in = (cfg.get("benchmarks") or {}).get("backend_stand_in") or {}
    rows = []
    for m in cfg.get("methods", []):
        backend = stand_in.get(method_backend(m), method_backend(m))
        row = {k: v for k, v in m.items() if k != "backend"}
        rows.append(row if backend == "engine" else {**row, "backend": backend})
    return rows


def engine_slice(stage: dict) -> dict:
    """A bench stage cut to the rows our engine decodes (``backend`` unset or ``engine``): what a ``benchmark`` job
    receives, so that a server row's settings never rerun the engine's jobs."""
    return {**stage, "methods": [m for m in stage["methods"] if method_backend(m) == "engine"]}


def server_slice(stage: dict, backend: str, cfg: dict) -> dict:
    """A bench stage cut to one server runtime's rows (:func:`method_backend`), with the runtime's server settings
    (vLLM: ``serving.vllm``'s KV-cache size, context length, eager mode and the target's dtype): what one
    ``benchmark_<backend>`` job receives."""
    out = {**stage, "methods": [m for m in stage["methods"] if method_backend(m) == backend], "runtime": backend,
           "names": list(cfg["benchmarks"]["names"])}
    if backend == "vllm":
        v = cfg["serving"]["vllm"]
        out["server"] = {"kv_cache_gb": v["kv_cache_gb"], "max_model_len": v["max_model_len"],
                         "enforce_eager": v["enforce_eager"], "dtype": cfg["target"].get("dtype", "float32")}
    return out


def server_method_keys(stage: dict, backend: str) -> list[str]:
    """The method keys of one server runtime's job: its AR (``<backend>-ar``), then its rows (:func:`method_key`)."""
    rows = [m for m in stage["methods"] if method_backend(m) == backend]
    return [f"{backend}-ar"] + [method_key(m, m.get("drafter_id")) for m in rows] if rows else []


def method_specs(cfg: dict, num_target_layers: int) -> list[dict]:
    """The rows of ``methods``, each with the id of the drafter it decodes with (``drafter_id``)."""
    specs = []
    for m in table3_methods(cfg):
        spec = dict(m)
        if m.get("drafter"):
            spec["drafter_id"] = drafter_id(cfg, m["drafter"], num_target_layers)
            pretrained = cfg["drafters"].get(m["drafter"], {}).get("pretrained")
            if method_backend(m) != "engine" and pretrained:  # a server loads a published drafter by its id
                spec["checkpoint"] = pretrained
        if m.get("block_size") == "online":  # its records depend on the controller's settings
            spec["controller"] = controller_settings(cfg, m.get("controller"))
            if m.get("controller"):  # the row's own settings: in its key, beside another online row
                spec["controller_overrides"] = dict(m["controller"])
        specs.append(spec)
    return specs


def bench_stage(cfg: dict, num_target_layers: int) -> dict:
    """What every Table 3 record depends on: target, prompts, decoding settings, chat, and the methods with
    their drafters' ids (a retrained drafter reruns its benchmarks)."""
    b = cfg["benchmarks"]
    t = cfg["target"]
    return {"target": target_id(cfg), "benchmarks": {k: b[k] for k in ("num_prompts", "max_new_tokens", "seed",
                                                                               "cpu_packed_linear", "score",
                                                                               "confirm_run_unsafe_code")},
            "chat": {"system_prompt": t.get("system_prompt"), "enable_thinking": t.get("enable_thinking"),
                     "stop_tokens": t.get("stop_tokens")},
            "methods": method_specs(cfg, num_target_layers), "near_tie_epsilon": cfg["near_tie_epsilon"]}


PER_BENCHMARK_DEFAULTS = {"num_prompts": 2, "max_new_tokens": 64}
"""The ``benchmarks`` keys that may be set per benchmark, with the value of a benchmark a mapping leaves out."""


def benchmark_slice(stage: dict, benchmark: str) -> dict:
    """A bench stage (:func:`bench_stage`, :func:`sampled_bench_stage`, :func:`study_stage`) cut to one benchmark:
    ``num_prompts`` and ``max_new_tokens`` become that benchmark's integers.

    It is what one benchmark job receives (its rule parameter): changing another benchmark's prompt count or token
    budget leaves this slice, hence this benchmark's records, as they are (issue 47, "exact slices").

    Raises:
        KeyError: if ``stage`` has no ``benchmarks`` section.
    """
    b = dict(stage["benchmarks"])
    for key, default in PER_BENCHMARK_DEFAULTS.items():
        if key in b and not isinstance(b[key], int):
            b[key] = b[key].get(benchmark, default)
    return {**stage, "benchmarks": b}


def bench_id(cfg: dict, num_target_layers: int) -> str:
    """The id of Table 3's records folder (``results/bench/<id>/``): a hash of our engine's bench stage
    (:func:`engine_slice`) without the per-benchmark prompt counts and token budgets (those reach each benchmark's
    jobs through :func:`benchmark_slice`, so a change there reruns that benchmark's jobs only). Server rows
    (``methods[].backend``) stay out of it: adding one adds its runtime's jobs and reruns none of the engine's."""
    stage = engine_slice(bench_stage(cfg, num_target_layers))
    shared = {k: v for k, v in stage["benchmarks"].items() if k not in PER_BENCHMARK_DEFAULTS}
    return f"{cfg['target']['name']}-{short_hash({**stage, 'benchmarks': shared})}"


def accuracy_stage(cfg: dict) -> dict:
    """What the target's accuracy records depend on: the target, the sample, the answer budget, the chat."""
    a, b, t = cfg["accuracy"], cfg["benchmarks"], cfg["target"]
    return {"target": target_id(cfg),
            "accuracy": {"num_prompts": a["num_prompts"], "max_new_tokens": a["max_new_tokens"],
                         "batch_size": a["batch_size"], "seed": b["seed"],
                         "confirm_run_unsafe_code": b["confirm_run_unsafe_code"]},
            "chat": {"system_prompt": t.get("system_prompt"), "enable_thinking": t.get("enable_thinking"),
                     "stop_tokens": t.get("stop_tokens")}}


def accuracy_id(cfg: dict) -> str:
    """``<target name>-<hash of accuracy_stage>``."""
    return f"{cfg['target']['name']}-{short_hash(accuracy_stage(cfg))}"


def stage_id(cfg: dict, stage: dict) -> str:
    """``<target name>-<hash of the stage slice>``: the folder id of a stage's outputs."""
    return f"{cfg['target']['name']}-{short_hash(stage)}"


def prepare_target_stage(cfg: dict, num_target_layers: int) -> dict:
    """What ``prepare_target`` runs with: the target's identity plus where and how it is loaded."""
    t = cfg["target"]
    return {**target_stage(cfg), "device": t["device"], "attn_implementation": t["attn_implementation"],
            "num_layers": num_target_layers}


def sampled_bench_stage(cfg: dict, num_target_layers: int) -> dict:
    """Table 3 at temperatures above 0: the bench stage restricted to ``benchmarks.sampled_methods`` (null = all),
    with ``benchmarks.sampled_max_new_tokens`` as its token budget when set.

    Raises:
        ValueError: naming sampled method names that are not rows of ``methods``.
    """
    stage = bench_stage(cfg, num_target_layers)
    sampled = cfg["benchmarks"].get("sampled_methods")
    if sampled is not None:
        unknown = sorted(set(sampled) - {m["name"] for m in cfg["methods"]})
        if unknown:
            raise ValueError(f"config benchmarks.sampled_methods: {unknown} are not method names of `methods`")
    stage = {**stage, "methods": [m for m in stage["methods"] if sampled is None or m["name"] in sampled]}
    sampled_tokens = cfg["benchmarks"].get("sampled_max_new_tokens")
    if sampled_tokens is not None:  # a shorter budget for the sampled rows (T = 0 records keep theirs)
        stage["benchmarks"] = {**stage["benchmarks"], "max_new_tokens": sampled_tokens}
    return stage


def table_stage(cfg: dict) -> dict:
    """What Table 3 and Figure 2 print beside the numbers (captions): run shape and runtime."""
    b = cfg["benchmarks"]
    return {"target": cfg["target"]["name"], "repeats": cfg["repeats"], "num_prompts": b["num_prompts"],
            "max_new_tokens": b["max_new_tokens"], "sampled_max_new_tokens": b.get("sampled_max_new_tokens"),
            "near_tie_epsilon": cfg["near_tie_epsilon"],
            "accuracy_max_new_tokens": cfg["accuracy"]["max_new_tokens"] if cfg["accuracy"]["enabled"] else None,
            "runtime": f"transformers, {cfg['target']['dtype']}"
                       + (", oneDNN packed linears" if b.get("cpu_packed_linear") else "")}


def study_table_stage(cfg: dict, study: dict | None) -> dict:
    """What Tables 1, 2 and Figures 4, 7 print beside the numbers: the study's recipes and run shape."""
    s = cfg["study"]
    recipes = {m["drafter_id"]: m["recipe"] for m in study["methods"]} if study else {}
    return {"target": cfg["target"]["name"], "recipes": recipes,
            "shape": f"d={s['num_layers']}, t={s['num_taps'] or s['num_layers']}", "max_steps": s["max_steps"],
            "benchmarks": s["benchmarks"], "num_prompts": s["num_prompts"], "max_new_tokens": s["max_new_tokens"]}


def table4_stage(cfg: dict) -> dict:
    """What Table 4 prints beside the numbers."""
    s = cfg["serving"]
    warm = {"online_warmup": s["online_warmup"]} if s.get("online") or s.get("online_variants") else {}
    return {**warm, "target": cfg["target"]["name"], "benchmarks": s["benchmarks"],
            "max_new_tokens": s["max_new_tokens"]}


STUDY_PLAN: dict[str, list[int]] = {
    # training recipe -> inference block sizes it is decoded at (never above its largest training horizon)
    "dflash": [8, 16],                  # fixed 16 with decay: the DFlash recipe (Figure 4 start; Table 2 "fixed 16")
    "fixed8": [8],                      # Table 2
    "step1_fixed32": [8, 16, 24, 32],   # Figure 4 step 1; Table 2 "fixed 32"
    "step2_mixed": [8, 16, 24, 32],     # Figure 4 step 2; Table 2 "mixed"; Table 1 {8,16,24,32} without unmasking
    "step3_unmask": [16, 32],           # Figure 4 step 3; Table 1 {8,16,24,32} with unmasking
    "step4_awl": [16],                  # Figure 4 step 4 (= the dscout recipe)
    "mixed_short": [32],                # Table 1 {4,8,16,32} without unmasking
    "mixed_short_unmask": [32],         # Table 1 {4,8,16,32} with unmasking
}
"""The recipe study of Tables 1, 2 and Figures 4, 7 (docs/method.md §3): which recipe is decoded at which bs."""


def study_drafters(cfg: dict) -> dict[str, dict]:
    """Drafter variants of the recipe study (``study_<recipe>``), all of the study's shape and step count."""
    s = cfg["study"]
    levers = dict(s.get("options") or {})  # unset: ids of older configs unchanged
    extra = {"init_from_target": True} if levers.pop("init_from_target", False) else {}
    if levers:
        extra["options"] = levers
    return {f"study_{r}": {"recipe": r, "num_layers": s["num_layers"], "num_taps": s["num_taps"],
                           "training": {"max_steps": s["max_steps"]}, **extra} for r in STUDY_PLAN}


FINDINGS_PLAN: dict[str, tuple[str, list[int]]] = {
    # findings drafter -> (training recipe, inference block sizes its teacher-forced accept lengths are read at)
    "dflash": ("dflash", [16]),                       # Figure 4 start; Table 2 "fixed 16"; vs DScout
    "dflash_long": ("dflash", [16]),                  # the DFlash recipe with compute_factor x the updates
    "fixed8": ("fixed8", [8]),                        # Table 2 "fixed 8"
    "step1_fixed32": ("step1_fixed32", [8, 16, 32]),  # Figure 4 step 1; Table 2 "fixed 32"; Figure 2
    "step2_mixed": ("step2_mixed", [8, 16, 32]),      # Figure 4 step 2; Table 2 "mixed"; Table 1; Figure 2
    "step3_unmask": ("step3_unmask", [16, 32]),       # Figure 4 step 3; Table 1 {8,16,24,32} with unmasking
    "step4_awl": ("step4_awl", [16]),                 # Figure 4 step 4 = the full DScout recipe
    "mixed_short": ("mixed_short", [32]),             # Table 1 {4,8,16,32} without unmasking
    "mixed_short_unmask": ("mixed_short_unmask", [32]),  # Table 1 {4,8,16,32} with unmasking
}
"""The findings stage (docs/findings.md): which drafters it trains and at which bs each is evaluated."""


def findings_drafters(cfg: dict) -> dict[str, dict]:
    """Drafter variants of the findings stage (``findings_<name>``): one shape, levers, data and hold-out.

    Every variant trains ``findings.max_steps`` updates on the regenerated responses minus the ``findings.holdout``
    held-out ones, except ``dflash_long`` (``ceil(compute_factor x max_steps)``: the equal-compute comparison).
    """
    import math

    s = cfg["findings"]
    levers = dict(s.get("options") or {})
    extra = {"init_from_target": True} if levers.pop("init_from_target", False) else {}
    if levers:
        extra["options"] = levers
    out = {}
    for name, (recipe, _) in FINDINGS_PLAN.items():
        steps = math.ceil(s["compute_factor"] * s["max_steps"]) if name == "dflash_long" else s["max_steps"]
        out[f"findings_{name}"] = {"recipe": recipe, "num_layers": s["num_layers"], "num_taps": s["num_taps"],
                                   "training": {"max_steps": steps, "holdout": s["holdout"]}, **extra}
    return out


def findings_stage(cfg: dict, drafter_ids: dict[str, str]) -> dict:
    """What the findings records and tables depend on: drafters, hold-out, benchmark prompts, statistics."""
    s, t = cfg["findings"], cfg["target"]
    return {"target": target_id(cfg), "responses": responses_id(cfg), "holdout": s["holdout"],
            "drafters": {n: {"id": drafter_ids[f"findings_{n}"], "recipe": r, "block_sizes": bss}
                         for n, (r, bss) in FINDINGS_PLAN.items()},
            "max_steps": s["max_steps"], "compute_factor": s["compute_factor"],
            "shape": f"{s['num_taps'] or s['num_layers']}t{s['num_layers']}d",
            "benchmarks": {"names": s["benchmarks"], "num_prompts": s["num_prompts"],
                           "max_new_tokens": s["max_new_tokens"], "seed": cfg["benchmarks"]["seed"],
                           "batch_size": cfg["responses"]["batch_size"]},
            "chat": {"system_prompt": t.get("system_prompt"), "enable_thinking": t.get("enable_thinking"),
                     "stop_tokens": t.get("stop_tokens")},
            "decode_check_prompts": s["decode_check_prompts"], "min_anchors": s["min_anchors"],
            "bootstrap": {"resamples": s["bootstrap_resamples"], "seed": s["seed"]},
            "target_name": t["name"]}


def study_methods(cfg: dict, drafter_ids: dict[str, str]) -> list[dict]:
    """Method rows of the study: one per (recipe, bs) of :data:`STUDY_PLAN`, with drafter ids and recipes."""
    rows = []
    for r, sizes in STUDY_PLAN.items():
        for bs in sizes:
            rows.append({"name": f"{r}@{bs}", "kind": "dflash" if r == "dflash" else "dscout",
                         "drafter": f"study_{r}", "drafter_id": drafter_ids[f"study_{r}"], "block_size": bs,
                         "recipe": r})
    return rows


def study_stage(cfg: dict, drafter_ids: dict[str, str]) -> dict:
    """What the study's records depend on (a bench stage with the study's prompts and methods)."""
    s, b, t = cfg["study"], cfg["benchmarks"], cfg["target"]
    return {"target": target_id(cfg),
            "benchmarks": {"num_prompts": s["num_prompts"], "max_new_tokens": s["max_new_tokens"],
                           "seed": b["seed"], "cpu_packed_linear": b["cpu_packed_linear"], "score": False},
            "chat": {"system_prompt": t.get("system_prompt"), "enable_thinking": t.get("enable_thinking"),
                     "stop_tokens": t.get("stop_tokens")},
            "methods": study_methods(cfg, drafter_ids), "near_tie_epsilon": cfg["near_tie_epsilon"]}


def depth_search_stage(cfg: dict, num_target_layers: int) -> dict:
    """What the drafter-depth search (Figure 5) depends on: responses, recipe, candidates, taps, decoding."""
    from ..models.layer_ids import default_target_layer_ids

    s, b, t = cfg["depth_search"], cfg["benchmarks"], cfg["target"]
    train = deep_merge(cfg["training"], {"max_steps": s["max_steps"]})
    train.pop("gpu_memory_gb", None)  # a plan-time limit, not what the drafters are trained with
    return {"responses": responses_id(cfg), "recipe": s["recipe"], "candidates": sorted(s["candidates"]),
            "layer_ids": default_target_layer_ids(num_target_layers, s["num_taps"]),
            "mask_token_id": t["mask_token_id"], "max_steps": s["max_steps"], "training": train,
            "block_size": s["block_size"], "benchmarks": s["benchmarks"], "num_prompts": s["num_prompts"],
            "max_new_tokens": s["max_new_tokens"], "seed": b["seed"], "cpu_packed_linear": b["cpu_packed_linear"],
            "features": {k: cfg["features"][k] for k in ("mode", "store_dtype")},
            "chat": {"system_prompt": t.get("system_prompt"), "enable_thinking": t.get("enable_thinking"),
                     "stop_tokens": t.get("stop_tokens")},
            **({"options": dict(s["options"])} if s.get("options") else {})}


def serving_pool_size(cfg: dict) -> int:
    """Table 4's measured prompt pool: ``serving.pool_factor x max(concurrency)`` on the SGLang backend (each level's
    closed loop sends the whole pool, so c = 32 keeps 32 requests in flight for more than one wave), the batched
    backend's ``max(concurrency)`` (its batch at c is the pool's first c prompts)."""
    s = cfg["serving"]
    top = max(cfg["concurrency"])
    return s.get("pool_factor", 4) * top if s["backend"] == "sglang" else top


def vllm_serving_stage(cfg: dict, drafter_ids: dict[str, str]) -> dict:
    """What Table 4's vLLM rows depend on: the batched backend's prompt pool and budget (the same prompts), the
    DFlash drafter, the concurrency levels (one job serves them all) and the servers' settings."""
    s, b, t = cfg["serving"], cfg["benchmarks"], cfg["target"]
    v = s["vllm"]
    return {"target": target_id(cfg), "target_source": t["source"], "dflash": drafter_ids[s["dflash_drafter"]],
            "benchmarks": s["benchmarks"], "pool_size": max(cfg["concurrency"]),
            "max_new_tokens": s["max_new_tokens"], "seed": b["seed"], "concurrency": sorted(cfg["concurrency"]),
            "vllm": {"block_sizes": sorted(v["block_sizes"]), "kv_cache_gb": v["kv_cache_gb"],
                     "max_model_len": v["max_model_len"], "dtype": t.get("dtype", "float32"),
                     "enforce_eager": v["enforce_eager"]},
            "chat": {"system_prompt": t.get("system_prompt"), "enable_thinking": t.get("enable_thinking"),
                     "stop_tokens": t.get("stop_tokens")}}


def serving_stage(cfg: dict, drafter_ids: dict[str, str]) -> dict:
    """What Table 4's records depend on: target, drafters, prompt pool, candidates and concurrency levels (not the
    repeat count: one job per (concurrency, repeat), so more repeats add jobs and keep the finished ones)."""
    s, b, t = cfg["serving"], cfg["benchmarks"], cfg["target"]
    extra = {}
    if s.get("online"):  # only when set, so that configs without it keep their ids
        extra["online"] = controller_settings(cfg)
    if s.get("online") or s.get("online_variants"):  # the controllers' untimed earlier traffic (batches of c)
        extra["online_warmup"] = s["online_warmup"]
    if s.get("online_variants"):  # only when set, so that configs without it keep their ids
        extra["online_variants"] = [{"name": v["name"], "controller": controller_settings(cfg, v.get("controller"))}
                                    for v in s["online_variants"]]
    if s["backend"] == "batched" and s["interleave"] != "batch":  # only when set, so that configs keep their ids
        extra["interleave"] = s["interleave"]
    if s.get("eagle3_drafter"):  # only when set, so that configs without it keep their ids
        name = s["eagle3_drafter"]
        row = next((m for m in cfg["methods"] if m["kind"] == "eagle3" and m.get("drafter") == name), {})
        extra["eagle3"] = {"drafter": drafter_ids[name], "checkpoint": cfg["drafters"][name]["pretrained"],
                           "block_size": row.get("block_size", 60), "topk": row.get("topk", 10),
                           "num_steps": row.get("depth", 7)}
    return {**extra, "target": target_id(cfg), "target_source": t["source"], "backend": s["backend"],
            "dflash": drafter_ids[s["dflash_drafter"]],
            "dscout": drafter_ids[s["dscout_drafter"]], "block_sizes": sorted(s["block_sizes"]),
            "benchmarks": s["benchmarks"], "pool_size": serving_pool_size(cfg), "max_new_tokens": s["max_new_tokens"],
            "seed": b["seed"], "cpu_packed_linear": b["cpu_packed_linear"],
            "chat": {"system_prompt": t.get("system_prompt"), "enable_thinking": t.get("enable_thinking"),
                     "stop_tokens": t.get("stop_tokens")}}


__all__ = [
    "FINDINGS_PLAN", "PER_BENCHMARK_DEFAULTS", "SERVER_BACKENDS", "STUDY_PLAN", "accuracy_id",
    "accuracy_stage", "bench_id", "bench_stage", "benchmark_names", "benchmark_slice", "controller_settings",
    "controller_suffix", "depth_search_stage", "drafter_id", "drafter_stage", "drafter_variant",
    "engine_slice", "features_id", "features_stage", "findings_drafters", "findings_stage", "method_backend",
    "method_key", "method_specs", "prepare_target_stage", "resolved_layer_ids", "responses_id",
    "responses_stage", "sampled_bench_stage", "server_method_keys", "server_slice", "serving_pool_size",
    "serving_stage", "short_hash", "stage_id", "study_drafters", "study_methods", "study_stage",
    "study_table_stage", "table3_methods", "table4_stage", "table_stage", "target_id", "target_stage",
    "vllm_serving_stage"
]
