"""Configuration: schema validation with defaults, the per-stage slices and their short hashes.

Every stage's output path carries a short hash of *exactly* the configuration it depends on, and a
``config.resolved.json`` is written beside it. A benchmark-only change therefore never retrains a drafter, and
a recipe change never regenerates responses. Code changes are tracked separately: :func:`code_digest` hashes the
source files a stage imports; the Snakefile passes it as a rule parameter, so editing them reruns the stage.

Stage dependency chain (each key includes its parent's key):
``target -> responses -> features(layer set) / drafter(variant) -> bench(benchmark, repeat, temperature)``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "schemas" / "config.schema.yaml"

STAGE_CODE = {
    "target": ["models/target.py"],
    "responses": ["models/target.py", "data"],
    "features": ["models/target.py", "training/features.py", "data/responses.py"],
    "train": ["models", "training", "data/responses.py"],
    "bench": ["models", "decoding", "evaluation", "records.py", "jsonl.py", "kinds.py", "data"],
    "accuracy": ["models/target.py", "evaluation/accuracy.py", "evaluation/scoring.py", "jsonl.py", "data"],
    "analysis": ["analysis", "jsonl.py", "decoding/latency.py"],
    "depth": ["models", "training", "decoding", "experiments", "kinds.py", "data"],
    "findings": ["models", "decoding", "experiments/findings.py", "analysis/findings.py", "training/blocks.py", "training/holdout.py",
                 "training/features.py", "data", "jsonl.py"],
    "findings_analysis": ["analysis"],
    "serving": ["models", "decoding", "evaluation/serving.py", "evaluation/methods.py", "evaluation/prefill_store.py",
                "backends", "records.py", "jsonl.py", "data"],
}
"""Source files (relative to ``src/dscout``) each stage runs; their digest is a rerun trigger."""


def benchmark_names() -> list[str]:
    """The benchmark registry's names (torch-free; Snakemake's ``benchmark`` wildcard takes exactly these)."""
    from .data.benchmarks import BENCHMARKS

    return list(BENCHMARKS)


def short_hash(obj, n: int = 8) -> str:
    """First ``n`` hex digits of the sha256 of the canonical JSON of ``obj``."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


def code_digest(stage: str) -> str:
    """Digest of the package sources a stage uses (see :data:`STAGE_CODE`)."""
    base = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for rel in STAGE_CODE[stage]:
        p = base / rel
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(base)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:12]


# --------------------------------------------------------------------------------------- loading
def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _set_defaults(validator_cls):
    """jsonschema validator that fills ``default`` values (as ``snakemake.utils.validate(set_default=True)``)."""
    validate_props = validator_cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, sub in properties.items():
                if "default" in sub and prop not in instance:
                    instance[prop] = copy.deepcopy(sub["default"])
        yield from validate_props(validator, properties, instance, schema)

    import jsonschema

    return jsonschema.validators.extend(validator_cls, {"properties": set_defaults})


def validate_config(config: dict, source: str = "config") -> dict:
    """Validate ``config`` against ``schemas/config.schema.yaml`` and fill defaults (in place; returned).

    Raises:
        ValueError: naming the offending key path, e.g. ``training.lr: 'fast' is not of type 'number'`` or
            ``benchmarks: Additional properties are not allowed ('nmae' was unexpected)``.
    """
    import jsonschema

    schema = load_schema()
    cls = _set_defaults(jsonschema.validators.validator_for(schema))
    errors = sorted(cls(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for e in errors[:10]:
            path = ".".join(str(p) for p in e.absolute_path) or "(top level)"
            lines.append(f"  {path}: {e.message}")
        raise ValueError(f"invalid configuration ({source}):\n" + "\n".join(lines))
    _check_references(config)
    return config


def _check_references(config: dict) -> None:
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
    _check_controller_overrides(
        [(f"methods[{i}].controller", m.get("controller")) for i, m in enumerate(config.get("methods", []))]
        + [(f"serving.online_variants[{j}].controller", v.get("controller")) for j, v in enumerate(variants)])


def _check_controller_overrides(places: list[tuple[str, dict | None]]) -> None:
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


def _max_horizon(variant: dict) -> int | None:
    """Largest training horizon of a trained DFlash/DScout variant (None for other kinds or imports)."""
    if variant.get("kind", "dflash") != "dflash" or variant.get("pretrained"):
        return None
    from .training.recipes import get_recipe  # torch-free

    overrides = variant.get("recipe_overrides") or {}
    return get_recipe(variant.get("recipe", "dflash"), **overrides).max_horizon


def check_plan(config: dict, source: str = "config", project_dir: str | os.PathLike | None = None) -> None:
    """Semantic checks that the schema cannot express, run before any job (the Snakefile calls this at plan time).

    Each is a mistake that would otherwise surface inside a job, after earlier stages spent their time:

    * a method's (or the serving table's, or the depth search's) block size above the largest training horizon
      of its DFlash/DScout drafter (a drafter decodes at any bs up to the horizon it was trained at);
    * ``target.mask_token_id`` outside ``[0, target.vocab_size)`` (the mask must be an existing embedding row);
    * ``target.enable_thinking`` set for a Qwen3 target whose (locally readable) chat template has no such switch;
    * a drafter's ``target_layer_ids`` outside ``[0, target.num_layers)``;
    * a bf16 DeepSpeed config (``bf16.enabled``) for a target whose ``dtype`` is not bfloat16 (the job would stop
      at the first matmul of bf16 drafter weights with the target's states);
    * a local ``pretrained:`` folder whose files / tensors are not its kind's published layout
      (:func:`dscout.models.published.check_published_layout`);
    * one training update of a drafter whose estimated peak memory per GPU exceeds ``training.gpu_memory_gb``
      (:func:`dscout.training.memory_estimate.memory_problems`, torch-free);
    * a benchmark / prompt source that a stage of this config reads with neither a mirror file under
      ``data_root`` nor a reachable hub copy (the message says how to fetch one); with ``HF_HUB_OFFLINE`` /
      ``HF_DATASETS_OFFLINE`` set, the hub copy must be in datasets' cache (where ``load_dataset`` looks offline);
    * with ``HF_HUB_OFFLINE`` set, a hub model (target, published drafter) missing from the HF cache, naming the
      jobs that load it (:func:`dscout.data.models.offline_model_problems`);
    * a job the bill (:func:`dscout.cost.plan_cost_problems`) estimates past its SLURM runtime that cannot resume,
      or whose disk output exceeds ``cluster.disk_budget_gb``.

    Args:
        config: the merged, schema-validated config.
        source: how messages name the config (e.g. its files).
        project_dir: the folder a relative ``data_root`` is relative to (the Snakefile's, ``workflow.basedir``);
            None = the current directory.

    Raises:
        ValueError: listing every problem, each naming its config key (e.g. ``methods[2].block_size``).
    """
    from .data.benchmarks import get_benchmark
    from .data.hub import datasets_cache_dir, hub_offline, hub_reachable, offline_cached
    from .data.paths import ENV_VAR, data_root
    from .kinds import BLOCK_DIFFUSION
    from .data.prompts import prompt_source
    from .cost import plan_cost_problems
    from .data.models import offline_model_problems

    problems: list[str] = []
    t = config["target"]
    vocab = t.get("vocab_size")
    if vocab is not None and not 0 <= t["mask_token_id"] < vocab:
        problems.append(f"target.mask_token_id: {t['mask_token_id']} is outside the vocabulary [0, {vocab}) "
                        "(target.vocab_size); pick an existing, unused embedding row")
    drafters = config.get("drafters", {})
    problems += _template_problems(t, data_root(config.get("data_root"), project_dir))
    n_layers = t.get("num_layers")
    from .models.published import check_published_layout  # torch-free
    from .training.memory_estimate import memory_problems  # torch-free

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

    for name, v in drafters.items():
        pre = v.get("pretrained")
        if pre and Path(pre).is_dir():  # a local checkpoint: its layout must be its kind's (hub ids: the job)
            problems += [f"drafters.{name}.pretrained: {p}"
                         for p in check_published_layout(v.get("kind", "dflash"), pre)]
        outside = [l for l in (v.get("target_layer_ids") or []) if n_layers is not None and not 0 <= l < n_layers]
        if outside:
            problems.append(f"drafters.{name}.target_layer_ids: {outside} outside the target's layers "
                            f"[0, {n_layers}) (target.num_layers)")

    def horizon_check(key: str, drafter: str, bs: int) -> None:
        v = drafters.get(drafter)
        if v is None:
            problems.append(f"{key}: drafter '{drafter}' is not a key of 'drafters'")
            return
        h = _max_horizon(v)
        if h is not None and bs > h:
            problems.append(f"{key}: block size {bs} exceeds the largest training horizon {h} of drafter "
                            f"'{drafter}' (recipe '{v.get('recipe', 'dflash')}'); decode at bs <= {h} or train "
                            "it with a longer horizon (recipe_overrides.horizons)")

    for i, m in enumerate(config.get("methods", [])):
        if m.get("block_size") == "online":
            if m["kind"] not in BLOCK_DIFFUSION:
                problems.append(f"methods[{i}].block_size: 'online' needs a block-diffusion drafter (kind "
                                f"{' or '.join(sorted(BLOCK_DIFFUSION))}); '{m['kind']}' has no mixed horizons to pick from")
        elif m.get("drafter") and m.get("block_size") and m["kind"] in BLOCK_DIFFUSION:
            horizon_check(f"methods[{i}].block_size", m["drafter"], m["block_size"])
    problems += method_backend_problems(config)
    s = config.get("serving", {})
    if s.get("enabled") and s.get("online") and s.get("backend") == "sglang":
        problems.append("serving.online: the online block-size controller runs in this project's batched engine; "
                        "SGLang has no per-round block-size hook (docs/online_controller.md): set serving.online: "
                        "false or serving.backend: batched")
    if s.get("enabled") and s.get("online_variants") and s.get("backend") == "sglang":
        problems.append("serving.online_variants: the online block-size controller runs in this project's batched "
                        "engine; SGLang has no per-round block-size hook: drop them or set serving.backend: batched")
    if s.get("enabled"):
        horizon_check("serving.dflash_drafter", s["dflash_drafter"], 16)
        for bs in s.get("block_sizes", []):
            horizon_check("serving.block_sizes", s["dscout_drafter"], bs)
        e3 = s.get("eagle3_drafter")
        if e3 and e3 not in drafters:
            problems.append(f"serving.eagle3_drafter: '{e3}' is not a key of 'drafters'")
        elif e3 and (s.get("backend") != "sglang" or not drafters[e3].get("pretrained")
                     or drafters[e3].get("kind") != "eagle3"):
            problems.append(f"serving.eagle3_drafter: '{e3}' must be a published EAGLE-3 checkpoint (kind eagle3, "
                            "pretrained: <hub id>) served with serving.backend: sglang (the batched CPU engine "
                            "serves no trees)")
    d = config.get("depth_search", {})
    if d.get("enabled"):
        h = _max_horizon({"recipe": d["recipe"]})
        if d["block_size"] > h:
            problems.append(f"depth_search.block_size: {d['block_size']} exceeds the largest training horizon "
                            f"{h} of recipe '{d['recipe']}'")

    acc, b_cfg = config.get("accuracy", {}), config.get("benchmarks", {})
    if acc.get("enabled") and not b_cfg.get("confirm_run_unsafe_code"):
        for n in [n for n in acc.get("benchmarks", []) if n in ("humaneval", "mbpp")]:
            problems.append(f"accuracy.benchmarks: {n} is scored by running model-written code, which needs "
                            "benchmarks.confirm_run_unsafe_code: true (opt-in, as lm-eval's --confirm_run_unsafe_code)")
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
    if unreadable:
        where = "$" + ENV_VAR if os.environ.get(ENV_VAR) else "config key data_root"
        lines = "; ".join(f"{key}: {what} ({'no hub copy' if hub is None else hub.describe()}) needs {root / rel}"
                          for rel, (key, hub, what) in unreadable)
        why = (f"HF_HUB_OFFLINE is set and datasets' cache ({datasets_cache_dir()}) holds no copy of them"
               if offline and from_hub else "the hub cannot be reached" if from_hub else "no hub copy")
        problems.append(f"data_root: {len(unreadable)} source(s) have no mirror file under {root} (from {where}) "
                        f"and {why} — {lines}. "
                        "Run `dscout fetch-data --out DIR` (or `snakemake --cores 1 fetch_data`) on a machine "
                        "with internet and point data_root / $" + ENV_VAR + " at DIR (layout: docs/data.md).")
    problems += memory_problems(config, project_dir)  # one update per drafter within training.gpu_memory_gb
    problems += plan_cost_problems(config, project_dir)  # the bill: runtime / disk refusals (dscout.cost)
    problems += offline_model_problems(config)  # HF_HUB_OFFLINE: hub models must be in the HF cache
    if problems:
        raise ValueError(f"invalid configuration ({source}):\n" + "\n".join(f"  {p}" for p in problems))


def _is_qwen3_target(t: dict) -> bool:
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


def _template_problems(t: dict, root: Path) -> list[str]:
    """Plan-time check of the target's chat template against ``target.enable_thinking``.

    A Qwen3 target applies ``enable_thinking: false`` through its chat template (the empty think block of the
    assistant turn, Qwen/Qwen3-8B ``tokenizer_config.json``); a template without the switch would silently
    ignore it and every stage would tokenize another conversation. Checked where the template is readable
    before any job: a ``tiny-qwen3`` source (the mirrored tokenizer under ``data_root``) or a local folder.
    """
    if t.get("enable_thinking") is None or not _is_qwen3_target(t):
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


def deep_merge(base: dict, override: dict) -> dict:
    """Recursive dict merge (override wins; lists replaced)."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_config(*paths: str | Path, overrides: dict | None = None) -> dict:
    """Load and merge YAML files (later ones win), apply overrides, validate, fill defaults."""
    cfg: dict = {}
    for p in paths:
        cfg = deep_merge(cfg, yaml.safe_load(Path(p).read_text()) or {})
    if overrides:
        cfg = deep_merge(cfg, overrides)
    return validate_config(cfg, source=", ".join(str(p) for p in paths))


# --------------------------------------------------------------------------------------- stage slices
def target_stage(cfg: dict) -> dict:
    t = cfg["target"]
    return {"source": t["source"], "dtype": t["dtype"]}


def target_id(cfg: dict) -> str:
    return f"{cfg['target']['name']}-{short_hash(target_stage(cfg))}"


def responses_stage(cfg: dict) -> dict:
    t = cfg["target"]
    return {"target": target_id(cfg), "chat": {"system_prompt": t.get("system_prompt"),
                                               "enable_thinking": t.get("enable_thinking")},
            "responses": cfg["responses"]}


def responses_id(cfg: dict) -> str:
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
    from .kinds import drafter_kind

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


SERVER_BACKENDS = {"vllm": ("dflash", "dscout"), "sglang": ("dflash", "dscout", "eagle3")}
"""Table 3's server runtimes (``methods[].backend``) and the method kinds each serves: vLLM's DFlash loader takes
our DFlash / DScout drafters (EAGLE-3 drafters in vLLM's layout are not exported yet); SGLang serves DFlash / DScout
from our checkpoints and EAGLE-3 from a published one. PARD-2 and the online controller run on our engine only."""


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


def method_backend_problems(cfg: dict) -> list[str]:
    """Plan-time problems of Table 3's server rows (``methods[i].backend``), each naming its key.

    A server row needs a kind its runtime serves (:data:`SERVER_BACKENDS`), a fixed block size (the online
    controller picks bs per round in our engine only) and a drafter; SGLang's EAGLE-3 loads a published checkpoint
    (``pretrained:``). Temperatures above 0 on vLLM / SGLang follow ``benchmarks.sampled_methods`` as every row.
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
    return problems


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
    return {"target": cfg["target"]["name"], "benchmarks": s["benchmarks"], "max_new_tokens": s["max_new_tokens"]}


def write_resolved(path: str | Path, stage_config: dict) -> None:
    """Write ``config.resolved.json`` (the stage's exact config plus provenance) next to an output."""
    import platform

    import torch
    import transformers

    from . import __version__

    out = {"stage_config": stage_config, "dscout_version": __version__, "torch": torch.__version__,
           "transformers": transformers.__version__, "python": platform.python_version(),
           "git": _git_hash()}
    Path(path).write_text(json.dumps(out, indent=1, default=str))


def _git_hash() -> str | None:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# ------------------------------------------------------------------------------------------ recipe study
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
    from .models.layer_ids import default_target_layer_ids

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
