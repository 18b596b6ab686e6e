"""Plan-time checks of a merged, validated configuration: the mistakes the schema cannot express, found before any
job runs (the Snakefile calls :func:`check_references` through :func:`dscout.config.schema.validate_config` and
:func:`check_plan` at plan time).

Each ``*_problems(config, project_dir)`` function is one check: it returns its problems (one line each, naming the
config key, e.g. ``methods[2].block_size``) and raises nothing; :func:`check_plan` runs them in order and raises
one ``ValueError`` listing them all. Torch-free.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .schema import load_schema
from .stages import SERVER_BACKENDS, drafter_variant, method_backend, method_key, table3_methods


def check_references(config: dict) -> None:
    """Cross-references inside ``methods`` and ``serving.online_variants`` (run by ``validate_config``).

    Checks: a row's ``drafter`` is a key of ``drafters``; only an online row (``block_size: online``) has a
    ``controller``; no two rows decode alike (the same :func:`~dscout.config.stages.method_key`); no variant name
    is used twice; every controller override is a setting of section ``controller`` (:func:`check_controller_overrides`).

    Raises:
        ValueError: at the first problem, naming its key path.
    """
    drafters = config.get("drafters", {})
    keys: dict[str, int] = {}
    for i, m in enumerate(config.get("methods", [])):
        if m.get("drafter") and m["drafter"] not in drafters:
            raise ValueError(f"methods[{i}].drafter: '{m['drafter']}' is not a key of 'drafters' "
                             f"({', '.join(drafters) or 'none defined'})")
        if "controller" in m and m.get("block_size") != "online":
            raise ValueError(f"methods[{i}].controller: only a row with block_size: online has a controller "
                             f"(row '{m['name']}' has block_size {m.get('block_size')})")
        key = method_key({**m, "controller_overrides": m.get("controller")}, m.get("drafter"))
        if key in keys:
            raise ValueError(f"methods[{i}]: row '{m['name']}' decodes exactly as methods[{keys[key]}] "
                             f"('{config['methods'][keys[key]]['name']}'): same kind, drafter, block size and "
                             "settings; give one of them its own settings (e.g. controller) or drop it")
        keys[key] = i
    variants = (config.get("serving") or {}).get("online_variants") or []
    names = [v["name"] for v in variants]
    for j, name in enumerate(names):
        if name in names[:j]:
            raise ValueError(f"serving.online_variants[{j}].name: '{name}' is used twice")
    check_controller_overrides(
        [(f"methods[{i}].controller", m.get("controller")) for i, m in enumerate(config.get("methods", []))]
        + [(f"serving.online_variants[{j}].controller", v.get("controller")) for j, v in enumerate(variants)])


def check_controller_overrides(places: list[tuple[str, dict | None]]) -> None:
    """Each override (``methods[i].controller``, ``serving.online_variants[j].controller``) names settings of
    section ``controller`` with values its schema allows (checked without filling defaults: a row's settings are
    only the ones it changes).

    Raises:
        ValueError: naming the key path and the setting.
    """
    import jsonschema

    schema = load_schema()
    props = schema["properties"]["controller"]["properties"]
    cls = jsonschema.validators.validator_for(schema)
    for where, overrides in places:
        for k, v in (overrides or {}).items():
            if k not in props:
                raise ValueError(f"{where}: '{k}' is not a setting of section controller ({', '.join(props)})")
            sub = {kk: vv for kk, vv in props[k].items() if kk not in ("default", "description")}
            err = next(iter(cls(sub).iter_errors(v)), None)
            if err is not None:
                raise ValueError(f"{where}.{k}: {err.message}")


def max_horizon(variant: dict) -> int | None:
    """Largest training horizon (tokens per block) of a trained DFlash/DScout variant, from its recipe and
    ``recipe_overrides`` (:func:`dscout.training.recipes.get_recipe`); None for other kinds or imports."""
    if variant.get("kind", "dflash") != "dflash" or variant.get("pretrained"):
        return None
    from ..training.recipes import get_recipe  # torch-free

    overrides = variant.get("recipe_overrides") or {}
    return get_recipe(variant.get("recipe", "dflash"), **overrides).max_horizon


def _horizon_problems(drafters: dict, key: str, drafter: str, bs: int) -> list[str]:
    """A block size ``bs`` (at config key ``key``) above the largest training horizon of ``drafter``."""
    v = drafters.get(drafter)
    if v is None:
        return [f"{key}: drafter '{drafter}' is not a key of 'drafters'"]
    h = max_horizon(v)
    if h is not None and bs > h:
        return [f"{key}: block size {bs} exceeds the largest training horizon {h} of drafter "
                f"'{drafter}' (recipe '{v.get('recipe', 'dflash')}'); decode at bs <= {h} or train "
                "it with a longer horizon (recipe_overrides.horizons)"]
    return []


def mask_token_problems(config: dict, project_dir: str | os.PathLike | None = None) -> list[str]:
    """``target.mask_token_id`` outside ``[0, target.vocab_size)`` (the mask must be an existing embedding row)."""
    t = config["target"]
    vocab = t.get("vocab_size")
    if vocab is not None and not 0 <= t["mask_token_id"] < vocab:
        return [f"target.mask_token_id: {t['mask_token_id']} is outside the vocabulary [0, {vocab}) "
                "(target.vocab_size); pick an existing, unused embedding row"]
    return []


def is_qwen3_target(t: dict) -> bool:
    """Whether ``target`` is a Qwen3 model: a ``tiny-qwen3`` source, a hub id / folder naming Qwen3, or a local
    folder whose ``config.json`` says ``model_type: qwen3*``."""
    src = str(t.get("source", ""))
    if src.startswith("tiny-qwen3") or "qwen3" in src.lower() or "qwen3" in str(t.get("name", "")).lower():
        return True
    cfg = Path(src) / "config.json"
    if cfg.is_file():
        try:
            return str(json.loads(cfg.read_text()).get("model_type", "")).startswith("qwen3")
        except ValueError:
            return False
    return False


def template_problems(t: dict, root: Path) -> list[str]:
    """Plan-time check of the target's chat template against ``target.enable_thinking``.

    A Qwen3 target applies ``enable_thinking: false`` through its chat template (the empty think block of the
    assistant turn, Qwen/Qwen3-8B ``tokenizer_config.json``); a template without the switch would silently
    ignore it and every stage would tokenize another conversation. Checked where the template is readable
    before any job: a ``tiny-qwen3`` source (the mirrored tokenizer under ``data_root``) or a local folder.

    Args:
        t: section ``target``.
        root: the data root (:func:`dscout.data.paths.data_root`).
    """
    if t.get("enable_thinking") is None or not is_qwen3_target(t):
        return []
    src = str(t.get("source", ""))
    if src.startswith("tiny-qwen3"):
        folder = root / "tokenizers" / "qwen3"
        if not (folder / "tokenizer_config.json").is_file():
            return [f"target.source: {src} reads Qwen3's tokenizer and chat template from {folder} "
                    "(tokenizer.json, tokenizer_config.json of Qwen/Qwen3-8B; layout docs/data.md): not found"]
    elif Path(src).is_dir():
        folder = Path(src)
    else:
        return []  # a hub id: the template is read by the prepare_target job
    template = ""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text()
    elif (folder / "tokenizer_config.json").is_file():
        tmpl = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template") or ""
        template = tmpl if isinstance(tmpl, str) else json.dumps(tmpl)
    if "enable_thinking" not in template:
        return [f"target.enable_thinking: {t['enable_thinking']} is set for Qwen3 target '{src}', but its chat "
                f"template ({folder}) has no enable_thinking switch, so the setting would be silently ignored "
                "at every stage; use Qwen3's own template or set target.enable_thinking: null"]
    return []


def chat_template_problems(config: dict, project_dir: str | os.PathLike | None = None) -> list[str]:
    """``target.enable_thinking`` set for a Qwen3 target whose (locally readable) chat template has no such switch
    (:func:`template_problems`, the template read under the config's data root)."""
    from ..data.paths import data_root

    return template_problems(config["target"], data_root(config.get("data_root"), project_dir))


def deepspeed_dtype_problems(config: dict, project_dir: str | os.PathLike | None = None) -> list[str]:
    """A bf16 DeepSpeed config (``bf16.enabled``) for a target whose ``dtype`` is not bfloat16 (the job would stop at
    the first matmul of bf16 drafter weights with the target's states), or a DeepSpeed config that is not JSON.

    Reported once (the first trained drafter with a bf16 config); a relative ``training.deepspeed_config`` is read
    from ``project_dir`` (None = the current directory); a missing file is the job's to report.
    """
    problems: list[str] = []
    t = config["target"]
    drafters = config.get("drafters", {})
    for name in drafters:
        if drafters[name].get("pretrained"):
            continue
        ds_path = (drafter_variant(config, name)["training"] or {}).get("deepspeed_config")
        ds_file = Path(ds_path) if ds_path and Path(ds_path).is_absolute() else Path(project_dir or ".") / str(ds_path)
        if ds_path and ds_file.is_file():
            try:
                bf16 = bool(json.loads(ds_file.read_text()).get("bf16", {}).get("enabled"))
            except ValueError as err:
                problems.append(f"drafters.{name}: training.deepspeed_config {ds_path} is not JSON ({err})")
                continue
            if bf16 and t.get("dtype") != "bfloat16":
                problems.append(f"training.deepspeed_config: {ds_path} trains drafter '{name}' in bf16 (bf16.enabled) "
                                f"but target.dtype is {t.get('dtype')}: the drafter's bf16 weights would meet "
                                f"{t.get('dtype')} target states inside the job; set target.dtype: bfloat16 or "
                                "use a DeepSpeed config without bf16 (configs/deepspeed/cpu.json)")
                break
    return problems


def drafter_problems(config: dict, project_dir: str | os.PathLike | None = None) -> list[str]:
    """Per drafter, in order: a local ``pretrained:`` folder whose files / tensors are not its kind's published
    layout (:func:`dscout.models.published.check_published_layout`; a hub id is checked by its job), and
    ``target_layer_ids`` outside ``[0, target.num_layers)``."""
    from ..models.published import check_published_layout  # torch-free

    problems: list[str] = []
    n_layers = config["target"].get("num_layers")
    for name, v in config.get("drafters", {}).items():
        pre = v.get("pretrained")
        if pre and Path(pre).is_dir():  # a local checkpoint: its layout must be its kind's (hub ids: the job)
            problems += [f"drafters.{name}.pretrained: {p}"
                         for p in check_published_layout(v.get("kind", "dflash"), pre)]
        outside = [l for l in (v.get("target_layer_ids") or []) if n_layers is not None and not 0 <= l < n_layers]
        if outside:
            problems.append(f"drafters.{name}.target_layer_ids: {outside} outside the target's layers "
                            f"[0, {n_layers}) (target.num_layers)")
    return problems


def method_block_size_problems(config: dict, project_dir: str | os.PathLike | None = None) -> list[str]:
    """Table 3's rows: ``block_size: online`` on a kind without mixed horizons (not block diffusion), and a fixed
    block size above the largest training horizon of the row's DFlash/DScout drafter (a drafter decodes at any bs
    up to the horizon it was trained at)."""
    from ..kinds import BLOCK_DIFFUSION

    problems: list[str] = []
    drafters = config.get("drafters", {})
    for i, m in enumerate(config.get("methods", [])):
        if m.get("block_size") == "online":
            if m["kind"] not in BLOCK_DIFFUSION:
                problems.append(f"methods[{i}].block_size: 'online' needs a block-diffusion drafter (kind "
                                f"{' or '.join(sorted(BLOCK_DIFFUSION))}); '{m['kind']}' has no mixed horizons to pick from")
        elif m.get("drafter") and m.get("block_size") and m["kind"] in BLOCK_DIFFUSION:
            problems += _horizon_problems(drafters, f"methods[{i}].block_size", m["drafter"], m["block_size"])
    return problems


def method_backend_problems(cfg: dict, project_dir: str | os.PathLike | None = None) -> list[str]:
    """Plan-time problems of Table 3's server rows (``methods[i].backend``), each naming its key.

    A server row needs a kind its runtime serves (:data:`~dscout.config.stages.SERVER_BACKENDS`), a fixed block size
    (the online controller picks bs per round in our engine only) and a drafter; SGLang's EAGLE-3 loads a published
    checkpoint (``pretrained:``); vLLM's EAGLE-3 drafts a chain (``topk: 1``: our engine's EAGLE-3 at
    ``min(depth, block_size - 1)`` drafts). Temperatures above 0 on vLLM / SGLang follow
    ``benchmarks.sampled_methods`` as every row.
    """
    problems = []
    drafters = cfg.get("drafters", {})
    for i, m in enumerate(table3_methods(cfg)):
        backend = method_backend(m)
        if backend == "engine":
            continue
        kinds = SERVER_BACKENDS[backend]
        if m["kind"] not in kinds:
            problems.append(f"methods[{i}].backend: {backend} serves {', '.join(kinds)} rows, not '{m['kind']}' "
                            f"({m['name']}): run it on our engine (backend: engine)")
        if not isinstance(m.get("block_size"), int):
            problems.append(f"methods[{i}].block_size: a {backend} row needs a fixed block size, got "
                            f"{m.get('block_size')!r} (the online controller runs on our engine only)")
        if not m.get("drafter"):
            problems.append(f"methods[{i}].drafter: a {backend} row needs a drafter")
        elif (backend == "sglang" and m["kind"] == "eagle3"
              and not drafters.get(m["drafter"], {}).get("pretrained")):
            problems.append(f"methods[{i}].drafter: SGLang's EAGLE-3 serves a published checkpoint; drafter "
                            f"'{m['drafter']}' has no pretrained: <hub id>")
        if backend == "vllm" and m["kind"] == "eagle3" and m.get("topk") != 1:
            problems.append(f"methods[{i}].topk: vLLM drafts EAGLE-3 as a chain (top-1 per step), not a tree: "
                            f"set topk: 1 ({m['name']}, topk {m.get('topk')!r}; our engine's default is a tree of "
                            "topk 10)")
    return problems


def serving_problems(config: dict, project_dir: str | os.PathLike | None = None) -> list[str]:
    """Table 4 (``serving.enabled``): the online controller (``online``, ``online_variants``) on the SGLang backend
    (it runs in our batched engine only); DFlash's bs 16 and DScout's ``block_sizes`` above their drafters' largest
    training horizons; an ``eagle3_drafter`` that is not a published EAGLE-3 checkpoint served by SGLang."""
    problems: list[str] = []
    drafters = config.get("drafters", {})
    s = config.get("serving", {})
    if s.get("enabled") and s.get("online") and s.get("backend") == "sglang":
        problems.append("serving.online: the online block-size controller runs in this project's batched engine; "
                        "SGLang has no per-round block-size hook (docs/online_controller.md): set serving.online: "
                        "false or serving.backend: batched")
    if s.get("enabled") and s.get("online_variants") and s.get("backend") == "sglang":
        problems.append("serving.online_variants: the online block-size controller runs in this project's batched "
                        "engine; SGLang has no per-round block-size hook: drop them or set serving.backend: batched")
    if s.get("enabled"):
        problems += _horizon_problems(drafters, "serving.dflash_drafter", s["dflash_drafter"], 16)
        for bs in s.get("block_sizes", []):
            problems += _horizon_problems(drafters, "serving.block_sizes", s["dscout_drafter"], bs)
        e3 = s.get("eagle3_drafter")
        if e3 and e3 not in drafters:
            problems.append(f"serving.eagle3_drafter: '{e3}' is not a key of 'drafters'")
        elif e3 and (s.get("backend") != "sglang" or not drafters[e3].get("pretrained")
                     or drafters[e3].get("kind") != "eagle3"):
            problems.append(f"serving.eagle3_drafter: '{e3}' must be a published EAGLE-3 checkpoint (kind eagle3, "
                            "pretrained: <hub id>) served with serving.backend: sglang (the batched CPU engine "
                            "serves no trees)")
    return problems


def depth_search_problems(config: dict, project_dir: str | os.PathLike | None = None) -> list[str]:
    """Figure 5's search (``depth_search.enabled``): its ``block_size`` above its recipe's largest training horizon."""
    d = config.get("depth_search", {})
    if d.get("enabled"):
        h = max_horizon({"recipe": d["recipe"]})
        if d["block_size"] > h:
            return [f"depth_search.block_size: {d['block_size']} exceeds the largest training horizon "
                    f"{h} of recipe '{d['recipe']}'"]
    return []


def accuracy_problems(config: dict, project_dir: str | os.PathLike | None = None) -> list[str]:
    """Task accuracy (``accuracy.enabled``) on a benchmark scored by running model-written code (humaneval, mbpp)
    without ``benchmarks.confirm_run_unsafe_code: true`` (opt-in, as lm-eval's ``--confirm_run_unsafe_code``)."""
    problems: list[str] = []
    acc, b_cfg = config.get("accuracy", {}), config.get("benchmarks", {})
    if acc.get("enabled") and not b_cfg.get("confirm_run_unsafe_code"):
        for n in [n for n in acc.get("benchmarks", []) if n in ("humaneval", "mbpp")]:
            problems.append(f"accuracy.benchmarks: {n} is scored by running model-written code, which needs "
                            "benchmarks.confirm_run_unsafe_code: true (opt-in, as lm-eval's --confirm_run_unsafe_code)")
    return problems


def data_source_problems(config: dict, project_dir: str | os.PathLike | None = None) -> list[str]:
    """A benchmark / prompt source that a stage of this config reads with neither a mirror file under ``data_root``
    nor a reachable hub copy (the message says how to fetch one); with ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``
    set, the hub copy must be in datasets' cache (where ``load_dataset`` looks offline). One problem for all."""
    from ..data.benchmarks import get_benchmark
    from ..data.hub import datasets_cache_dir, hub_offline, hub_reachable, offline_cached
    from ..data.paths import ENV_VAR, data_root
    from ..data.prompts import prompt_source

    d, s = config.get("depth_search", {}), config.get("serving", {})
    root = data_root(config.get("data_root"), project_dir)
    needed: dict[str, tuple] = {}  # mirror file -> (config key, hub copy, what)
    b = config.get("benchmarks", {})
    for key, names in (("benchmarks.names", b.get("names", [])),
                       ("study.benchmarks", config.get("study", {}).get("benchmarks", [])
                        if config.get("study", {}).get("enabled") else []),
                       ("depth_search.benchmarks", d.get("benchmarks", []) if d.get("enabled") else []),
                       ("serving.benchmarks", s.get("benchmarks", []) if s.get("enabled") else []),
                       ("accuracy.benchmarks", config.get("accuracy", {}).get("benchmarks", [])
                        if config.get("accuracy", {}).get("enabled") else [])):
        for n in names:
            bench = get_benchmark(n)
            needed.setdefault(bench.local_file, (key, bench.hub, f"benchmark {n}"))
    for i, src in enumerate(config.get("responses", {}).get("sources", [])):
        ps = prompt_source(src["name"])
        needed.setdefault(ps.local_file, (f"responses.sources[{i}]", ps.hub, f"prompt source {ps.name}"))
    missing = {rel: v for rel, v in needed.items() if not (root / rel).exists()}
    from_hub = {rel: v for rel, v in missing.items() if v[1] is not None and not Path(v[1].path).is_dir()}
    offline = hub_offline()
    if offline:  # load_dataset reads only its cache: each hub copy must be there
        hub_ok = {rel for rel, v in from_hub.items() if offline_cached(v[1])}
    else:
        hub_ok = set(from_hub) if from_hub and hub_reachable() else set()
    unreadable = [(rel, v) for rel, v in missing.items() if v[1] is None or (rel in from_hub and rel not in hub_ok)]
    if not unreadable:
        return []
    where = "$" + ENV_VAR if os.environ.get(ENV_VAR) else "config key data_root"
    lines = "; ".join(f"{key}: {what} ({'no hub copy' if hub is None else hub.describe()}) needs {root / rel}"
                      for rel, (key, hub, what) in unreadable)
    why = (f"HF_HUB_OFFLINE is set and datasets' cache ({datasets_cache_dir()}) holds no copy of them"
           if offline and from_hub else "the hub cannot be reached" if from_hub else "no hub copy")
    return [f"data_root: {len(unreadable)} source(s) have no mirror file under {root} (from {where}) "
            f"and {why} — {lines}. "
            "Run `dscout fetch-data --out DIR` (or `snakemake --cores 1 fetch_data`) on a machine "
            "with internet and point data_root / $" + ENV_VAR + " at DIR (layout: docs/data.md)."]


def training_memory_problems(config: dict, project_dir: str | os.PathLike | None = None) -> list[str]:
    """One training update of a drafter whose estimated peak memory per GPU exceeds ``training.gpu_memory_gb``
    (:func:`dscout.training.memory_estimate.memory_problems`, torch-free)."""
    from ..training.memory_estimate import memory_problems as problems

    return problems(config, project_dir)


def bill_problems(config: dict, project_dir: str | os.PathLike | None = None) -> list[str]:
    """A job the bill (:func:`dscout.cost.plan_cost_problems`) estimates past its SLURM runtime that cannot resume,
    or whose disk output exceeds ``cluster.disk_budget_gb``."""
    from ..cost import plan_cost_problems

    return plan_cost_problems(config, project_dir)


def hub_model_problems(config: dict, project_dir: str | os.PathLike | None = None) -> list[str]:
    """With ``HF_HUB_OFFLINE`` set, a hub model (target, published drafter) missing from the HF cache, naming the
    jobs that load it (:func:`dscout.data.models.offline_model_problems`)."""
    from ..data.models import offline_model_problems as problems

    return problems(config)


PLAN_CHECKS = (mask_token_problems, chat_template_problems, deepspeed_dtype_problems, drafter_problems,
               method_block_size_problems, method_backend_problems, serving_problems, depth_search_problems,
               accuracy_problems, data_source_problems, training_memory_problems, bill_problems, hub_model_problems)
"""The checks :func:`check_plan` runs, in this order (the order of the problems it lists)."""


def check_plan(config: dict, source: str = "config", project_dir: str | os.PathLike | None = None) -> None:
    """Semantic checks that the schema cannot express, run before any job (the Snakefile calls this at plan time).

    Each is a mistake that would otherwise surface inside a job, after earlier stages spent their time: every
    function of :data:`PLAN_CHECKS`, in order (mask token, chat template, DeepSpeed dtype, drafters' layouts and
    layers, Table 3's block sizes and server rows, Table 4, the depth search, accuracy on code benchmarks, data
    sources, training memory, the bill, offline hub models).

    Args:
        config: the merged, schema-validated config.
        source: how messages name the config (e.g. its files).
        project_dir: the folder a relative ``data_root`` is relative to (the Snakefile's, ``workflow.basedir``);
            None = the current directory.

    Raises:
        ValueError: listing every problem, each naming its config key (e.g. ``methods[2].block_size``).
    """
    problems: list[str] = []
    for check in PLAN_CHECKS:
        problems += check(config, project_dir)
    if problems:
        raise ValueError(f"invalid configuration ({source}):\n" + "\n".join(f"  {p}" for p in problems))


__all__ = [
    "PLAN_CHECKS", "accuracy_problems", "bill_problems", "chat_template_problems", "check_controller_overrides",
    "check_plan", "check_references", "data_source_problems", "deepspeed_dtype_problems", "depth_search_problems",
    "drafter_problems", "hub_model_problems", "is_qwen3_target", "mask_token_problems", "max_horizon",
    "method_backend_problems", "method_block_size_problems", "serving_problems", "template_problems",
    "training_memory_problems",
]
