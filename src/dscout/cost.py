"""The bill before the first job: per rule, jobs, GPU-hours, wall time per job against its SLURM runtime, GPU and
host memory, disk written — from a written-down cost model (torch-free: planning runs with torch blocked).

The model (all estimates; the constants are named in :data:`DEVICE_CONSTANTS`, overridable per config under
``cluster.throughput``, and each says where its value comes from):

* **Shapes.** Parameters per decoder layer ``P_layer = D · h · (2 H + 2 H_kv) + 3 · D · I`` (q, o, k, v and the
  gated MLP; D hidden, h head dim, H / H_kv attention / KV heads, I intermediate); the target's matmul
  parameters ``P_target = L · P_layer + V · D`` (LM head included, embedding excluded).
* **FLOPs.** A forward costs ``2 · P`` per token, a training step ``6 · P`` per token for trained weights and
  ``4 · P`` for frozen ones a gradient flows through (the drafter's shared LM head). A drafter trains on
  ``num_anchors`` blocks of ``B`` positions per sequence (B: the recipe's largest horizon) and fuses the
  ``t`` taps of every context token (``fc``: ``t · D → D``).
* **Tokens.** From the preset: responses (``responses.sources`` counts; ``-1`` = the source's published size),
  each ``prompt_tokens + response_fill · responses.max_new_tokens`` long, capped at ``responses.max_length``;
  training steps (``max_steps``, else ``epochs · sequences / (micro_batch · ranks · accumulation)``);
  benchmark tokens (prompts × max tokens × repeats × methods, MT-Bench's two turns counted).
* **Wall time.** FLOPs / (GPUs × peak × utilisation) for the compute-bound jobs (generation, features,
  training); decode jobs at a measured seconds per token (one request at a time).
* **Bytes.** A feature-cache token holds its ``t`` taps and the final hidden state in ``features.store_dtype``
  plus 9 bytes (id, mask, log-sum-exp; :mod:`dscout.training.features`); a ZeRO-2 checkpoint holds 14 bytes per
  trained parameter in bf16 (weights 2, fp32 master 4, Adam moments 8), 16 in float32.

A rule that resumes (trainings, depth candidates, the cache-mode depth search; the benchmark rules per repeat)
may run past its runtime request: the profile's ``retries`` requeue it and it continues. One that cannot resume
must finish inside its request: :func:`plan_cost_problems` refuses it before any job, as it refuses a job whose
disk output exceeds ``cluster.disk_budget_gb``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .resources import runtime_minutes

# ----------------------------------------------------------------------------------------------- constants
DEVICE_CONSTANTS: dict[str, dict[str, tuple[float, str]]] = {
    "cuda": {
        "peak_flops": (989e12, "public: NVIDIA H100 SXM datasheet, dense BF16 tensor-core FLOP/s"),
        "train_mfu": (0.35, "estimate: model-FLOP utilisation of DeepSpeed ZeRO-2 bf16 training at 8B scale"),
        "generate_mfu": (0.20, "estimate: SGLang offline batch generation, decode-dominated"),
        "features_mfu": (0.40, "estimate: batched bf16 target forward (prefill-like)"),
        "accuracy_mfu": (0.20, "estimate: as generate_mfu (batched greedy AR through lm-eval)"),
        "ar_seconds_per_token": (0.0386, "measured: reports/gpu_check/report.md, AR through the engine, "
                                         "Qwen3-8B shape, one H200, HF eager"),
        "spec_seconds_per_token": (0.0110, "measured: reports/gpu_check/report.md, replay bs 16 TPOT (tau 6.05)"),
        "serving_seconds_per_token": (0.0027, "estimate: reports/gpu_check/report.md's measured 8 ms of GPU work "
                                              "per target forward (SGLang's CUDA graphs remove the launches) / tau 3"),
        "server_startup_seconds": (300.0, "estimate: one SGLang server start with CUDA graphs"),
        "vllm_startup_seconds": (300.0, "estimate: one vLLM server start with torch.compile and CUDA graphs"),
        "host_bytes_per_second": (1e9, "estimate: shared-filesystem write rate of one job"),
    },
    "cpu": {  # calibrated against the CPU default run in reports/bill_calibration/report.md (AVX-512 host)
        "peak_flops": (1.9e11, "public arithmetic: 2 cores x 2 FMA ports x 8 float32 lanes (AVX2) x 2 FLOP x ~3 GHz"),
        "train_mfu": (0.38, "measured: the CPU default's 12 drafter trainings, mean (1 thread each, two at a time)"),
        "generate_mfu": (0.33, "measured: the CPU default's response generation (batch 32)"),
        "features_mfu": (0.79, "measured: the CPU default's 3 feature caches, mean"),
        "accuracy_mfu": (0.092, "measured: the CPU default's accuracy jobs (lm-eval's greedy AR batches), mean"),
        "ar_seconds_per_token": (0.38, "measured: least-squares fit over the CPU default's 26 benchmark jobs; "
                                       "seconds per billed token, job start-up and prefill included"),
        "spec_seconds_per_token": (0.19, "measured: the same fit, per billed token of each method beside AR"),
        "serving_seconds_per_token": (0.095, "measured: the CPU default's Table 4 jobs (our batched engine), mean"),
        "server_startup_seconds": (0.0, "the batched engine starts in-process"),
        "vllm_startup_seconds": (60.0, "measured: tests' vLLM servers (CPU build, eager) start, answer one warm-up "
                                       "and stop in 40-100 s on 2 cores"),
        "host_bytes_per_second": (3.1e7, "measured: the CPU default's prepare_target (the GGUF conversion, not a "
                                         "disk write rate)"),
    },
}
"""Throughput constants per device (``target.device``: ``cuda``, else ``cpu``): value and source."""

TOKEN_CONSTANTS: dict[str, tuple[float, str]] = {
    "prompt_tokens": (128.0, "estimate: mean prompt length of an instruction set after the chat template"),
    "response_fill": (0.25, "estimate: mean response length as a fraction of responses.max_new_tokens"),
    "bench_fill": (0.5, "estimate: mean decoded length as a fraction of a benchmark's max_new_tokens (EOS)"),
    "import_seconds": (60.0, "estimate: read, check and re-save one published drafter checkpoint"),
    "import_bytes": (2e9, "estimate: one published drafter (EAGLE-3 / PARD-2 of an 8B target) in bf16"),
    "response_bytes_per_token": (7.0, "estimate: a token id in the responses JSONL (digits + separator)"),
}
"""Token-count and size constants (estimates), overridable under ``cluster.throughput`` like the device ones."""

SOURCE_ROWS = {"open_perfectblend": 1_420_909}
"""Published row counts of prompt sources read whole (``count: -1``): mlabonne/open-perfectblend's train split
(its dataset card; the paper's "1.4M prompts", docs/method.md §3)."""

KNOWN_SHAPES = {
    # source -> (layers, hidden, intermediate, heads, kv heads, head dim, vocab)
    "Qwen/Qwen3-8B": (36, 4096, 12288, 32, 8, 128, 151936),        # its config.json on the hub
    "gguf:smollm2": (30, 576, 1536, 9, 3, 64, 49152),               # SmolLM2-135M-Instruct's config.json
    "tiny-random": (None, 64, 128, 4, 2, 16, 49152),                # dscout.models.target._tiny_random_target
    "tiny-qwen3": (None, 64, 128, 4, 2, 32, 151936),                # dscout.models.target._tiny_qwen3_target
}
"""Model shapes by ``target.source`` (None layers: the source's ``:layers`` suffix, else ``target.num_layers``)."""

RESUMABLE = {"train_drafter", "depth_candidate", "depth_search", "target_features", "accuracy"}
"""Rules whose job continues from where a killed attempt stopped (checkpoints, the feature cache's shards,
the depth search's finished candidates)."""
RESUMABLE_PER_REPEAT = {"benchmark", "benchmark_sampled", "study_benchmark", "serving_benchmark", "serving_vllm",
                        "benchmark_vllm", "benchmark_sglang"}
"""Rules that resume per repeat: each repeat must fit the runtime request (issue 47)."""


@dataclass
class Shape:
    """A decoder's shape: ``layers``, ``hidden``, ``intermediate``, ``heads``, ``kv_heads``, ``head_dim``, ``vocab``."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @property
    def layer_params(self) -> int:
        """Matmul parameters of one decoder layer (attention q/k/v/o + gated MLP)."""
        return self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads) + 3 * self.hidden * self.intermediate

    @property
    def matmul_params(self) -> int:
        """Parameters a forward multiplies by per token: every layer plus the LM head (embedding excluded)."""
        return self.layers * self.layer_params + self.vocab * self.hidden


@dataclass
class Row:
    """One rule of the bill. Seconds, bytes; ``gpu_memory_gb`` None = not estimated (the memory plan's column)."""

    rule: str
    jobs: int
    gpus_per_job: int
    wall_seconds: float                 # per job (the longest repeat's share times repeats for per-repeat rules)
    runtime_minutes: int | None         # the SLURM request; None for a localrule
    resumable: str                      # "yes", "per repeat", "no"
    disk_bytes: float                   # per job
    host_memory_bytes: float            # per job (estimate)
    repeat_seconds: float | None = None  # per repeat, for the per-repeat rules
    gpu_memory_gb: float | None = None
    note: str = ""
    flops: float = 0.0                  # per job

    @property
    def gpu_hours(self) -> float:
        return self.jobs * self.gpus_per_job * self.wall_seconds / 3600.0

    @property
    def attempts(self) -> int:
        """SLURM attempts one job needs at its runtime request (a resuming job continues in the next one)."""
        if not self.runtime_minutes:
            return 1
        return max(1, math.ceil(self.wall_seconds / (self.runtime_minutes * 60.0)))


@dataclass
class Bill:
    """The bill: its rows, the constants used (name -> (value, source)) and the config's disk budget."""

    rows: list[Row]
    constants: dict[str, tuple[float, str]]
    disk_budget_gb: float | None
    device: str
    extra: dict = field(default_factory=dict)

    @property
    def gpu_hours(self) -> float:
        return sum(r.gpu_hours for r in self.rows)

    @property
    def disk_bytes(self) -> float:
        return sum(r.jobs * r.disk_bytes for r in self.rows)


# ----------------------------------------------------------------------------------------------- shapes
def target_shape(config: dict, project_dir: str | Path | None = None) -> Shape:
    """The target's shape from :data:`KNOWN_SHAPES` or a local source folder's ``config.json``.

    Raises:
        ValueError: naming ``target.source`` when neither gives the shape.
    """
    t = config["target"]
    src = str(t["source"])
    base = src.split(":")[0] if src.startswith(("tiny-random", "tiny-qwen3")) else src
    if base in KNOWN_SHAPES:
        layers, *rest = KNOWN_SHAPES[base]
        if layers is None:
            layers = int(src.split(":")[1]) if ":" in src else int(t["num_layers"])
        if base == "tiny-random":
            from .data.models import tiny_random_attention

            rest[2:5] = tiny_random_attention(src)
        return Shape(layers, *rest)
    folder = Path(src) if Path(src).is_absolute() else Path(project_dir or ".") / src
    if (folder / "config.json").is_file():
        c = json.loads((folder / "config.json").read_text())
        c = c.get("text_config", c)
        heads = c["num_attention_heads"]
        return Shape(c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], heads,
                     c.get("num_key_value_heads") or heads, c.get("head_dim") or c["hidden_size"] // heads,
                     c["vocab_size"])
    raise ValueError(f"target.source: no shape known for '{src}' (the bill knows {', '.join(KNOWN_SHAPES)} and "
                     "local folders with a config.json)")


def drafter_params(shape: Shape, num_layers: int, num_taps: int, draft_vocab: int | None) -> dict[str, int]:
    """Trained parameters of a DFlash-format drafter of ``num_layers`` layers over ``num_taps`` taps: its layers
    and the fusion ``fc`` (t·D → D); ``head``: the frozen shared LM head's rows a gradient flows through."""
    return {"layers": num_layers * shape.layer_params, "fc": num_taps * shape.hidden * shape.hidden,
            "head": (draft_vocab or shape.vocab) * shape.hidden}


# ----------------------------------------------------------------------------------------------- the model
def _constants(config: dict) -> tuple[str, dict[str, tuple[float, str]]]:
    device = "cuda" if str(config["target"].get("device", "auto")).startswith("cuda") else "cpu"
    consts = {**DEVICE_CONSTANTS[device], **TOKEN_CONSTANTS}
    for k, v in ((config.get("cluster") or {}).get("throughput") or {}).items():
        if k not in consts:
            raise ValueError(f"cluster.throughput.{k}: not a constant of the cost model ({', '.join(consts)})")
        consts[k] = (float(v), "config: cluster.throughput")
    return device, consts


def response_count(config: dict) -> int:
    """Rows of the responses set (``responses.sources`` counts; ``-1`` = :data:`SOURCE_ROWS`).

    Raises:
        ValueError: naming ``responses.sources[i].count`` for a whole source of unknown size.
    """
    n = 0
    for i, s in enumerate(config["responses"]["sources"]):
        if s.get("count", -1) == -1:
            if s["name"] not in SOURCE_ROWS:
                raise ValueError(f"responses.sources[{i}].count: -1 reads all of '{s['name']}', whose size the "
                                 f"bill does not know ({', '.join(SOURCE_ROWS)})")
            n += SOURCE_ROWS[s["name"]]
        else:
            n += int(s["count"])
    return n


def _bench_tokens(num_prompts, max_new, names) -> float:
    """Decoded tokens of one method over ``names`` (per-benchmark maps or one number; MT-Bench: two turns)."""
    tot = 0.0
    for n in names:
        p = num_prompts.get(n, 1) if isinstance(num_prompts, dict) else num_prompts
        m = max_new.get(n, 64) if isinstance(max_new, dict) else max_new
        tot += p * m * (2 if n == "mt_bench" else 1)
    return tot


def bill(config: dict, project_dir: str | Path | None = None) -> Bill:
    """The bill of ``config`` (merged, schema-validated; the study/findings/depth drafters need not be merged in).

    Raises:
        ValueError: for a target shape or a source size the model does not know, or an unknown constant.
    """
    from . import config as dcfg

    device, C = _constants(config)
    c = {k: v[0] for k, v in C.items()}
    shape = target_shape(config, project_dir)
    t, r, tr = config["target"], config["responses"], config["training"]
    ranks = max(int(tr["num_gpus"]), 1)  # processes of a multi-GPU job (one on a CPU)
    gpus, gpu1 = int(tr["num_gpus"]), min(int(tr["num_gpus"]), 1)  # GPUs of a multi-GPU / single-GPU job
    wbytes = 2 if t.get("dtype") in ("bfloat16", "float16") else 4
    target_bytes = (shape.layers * shape.layer_params + 2 * shape.vocab * shape.hidden) * wbytes
    peak = c["peak_flops"]
    n_resp = response_count(config)
    seq_len = min(float(r["max_length"]), c["prompt_tokens"] + c["response_fill"] * r["max_new_tokens"])
    resp_tokens = n_resp * c["response_fill"] * r["max_new_tokens"]
    rows: list[Row] = []

    def add(rule, jobs, gpus, wall, disk=0.0, host=0.0, flops=0.0, note="", imported=False, repeat=None):
        if jobs <= 0:
            return
        res = "per repeat" if rule in RESUMABLE_PER_REPEAT else "yes" if rule in RESUMABLE else "no"
        rows.append(Row(rule, jobs, gpus, wall, runtime_minutes(config, rule, imported), res, disk, host,
                        repeat, None, note, flops))

    add("prepare_target", 1, 0, target_bytes / c["host_bytes_per_second"], host=target_bytes,
        note="weights read once (hub cache or materialised)")
    gen_flops = 2.0 * shape.matmul_params * n_resp * (c["prompt_tokens"] + c["response_fill"] * r["max_new_tokens"])
    add("generate_responses", 1, gpus, gen_flops / (ranks * peak * c["generate_mfu"]),
        disk=resp_tokens * c["response_bytes_per_token"], host=target_bytes, flops=gen_flops,
        note=f"{n_resp:,} responses")

    # drafters: the main ones, the study's and the depth search's candidates
    import copy

    config = copy.deepcopy(config)  # the study's and findings' drafters join the configured ones (rules/common.smk)
    for stage, drafters_of in (("study", dcfg.study_drafters), ("findings", dcfg.findings_drafters)):
        if config.get(stage, {}).get("enabled"):
            for name, variant in drafters_of(config).items():
                config["drafters"].setdefault(name, variant)
    drafters = dict(config["drafters"])
    feature_sets: dict[tuple, int] = {}
    ckpt_bpp = 14 if t.get("dtype") == "bfloat16" else 16

    def train_cost(num_layers, num_taps, opts, recipe, training):
        p = drafter_params(shape, num_layers, num_taps, (opts or {}).get("draft_vocab_size"))
        horizon = dcfg.max_horizon({"recipe": recipe}) or 16
        seqs_per_step = training["micro_batch_size"] * ranks * (training.get("gradient_accumulation_steps") or 1)
        steps = training["max_steps"] or math.ceil(training["epochs"] * n_resp / seqs_per_step)
        seqs = steps * seqs_per_step
        positions = training["num_anchors"] * horizon
        per_seq = (6.0 * p["layers"] * positions + 4.0 * p["head"] * positions + 6.0 * p["fc"] * seq_len)
        if config["features"]["mode"] == "online":
            per_seq += 2.0 * shape.matmul_params * seq_len
        flops = seqs * per_seq
        trained = p["layers"] + p["fc"]
        return flops, trained * ckpt_bpp + trained * wbytes, steps

    for name, v in drafters.items():
        if v.get("pretrained"):
            add("train_drafter", 1, 0, c["import_seconds"], disk=c["import_bytes"], host=2 * c["import_bytes"],
                imported=True,
                note=f"{name}: published checkpoint imported (no target load)")
            continue
        variant = dcfg.drafter_variant(config, name)
        layer_ids = dcfg.resolved_layer_ids(variant, shape.layers)  # EAGLE-3: its 3 taps; PARD-2: none
        flops, disk, steps = train_cost(v["num_layers"], len(layer_ids), v.get("options"), v.get("recipe", "dflash"),
                                        variant["training"])
        add("train_drafter", 1, gpus, flops / (ranks * peak * c["train_mfu"]), disk=disk, host=ranks * target_bytes,
            flops=flops, note=f"{name}: {steps:,} steps")
        if config["features"]["mode"] == "cache" and layer_ids:
            feature_sets[tuple(sorted(layer_ids))] = 1

    d = config.get("depth_search", {})
    if d.get("enabled"):
        from .models.layer_ids import default_target_layer_ids

        taps = default_target_layer_ids(shape.layers, d["num_taps"])
        train = dcfg.deep_merge(tr, {"max_steps": d["max_steps"], "epochs": 1.0})
        costs = [train_cost(dd, len(taps), d.get("options"), d["recipe"], train) for dd in sorted(d["candidates"])]
        eval_s = (_bench_tokens(d["num_prompts"], d["max_new_tokens"], d["benchmarks"])
                  * c["spec_seconds_per_token"])
        sweep_s = (len(d["candidates"]) + 2) * d["max_new_tokens"] * c["spec_seconds_per_token"]
        if config["features"]["mode"] == "online":
            for dd, (flops, disk, steps) in zip(sorted(d["candidates"]), costs):
                add("depth_candidate", 1, gpus, flops / (ranks * peak * c["train_mfu"]) + eval_s, disk=disk,
                    host=ranks * target_bytes, flops=flops, note=f"d = {dd}: {steps:,} steps (lazy: up to)")
            add("depth_search", 1, gpu1, sweep_s, host=target_bytes, note="latency sweep only")
        else:
            feature_sets[tuple(sorted(taps))] = 1
            flops = sum(x[0] for x in costs)
            add("depth_search", 1, gpu1,
                flops / (peak * c["train_mfu"]) + len(costs) * eval_s + sweep_s,
                disk=sum(x[1] for x in costs), host=target_bytes, flops=flops,
                note=f"{len(costs)} candidates trained one after another in one job (up to)")
    store = {"float16": 2, "bfloat16": 2, "float32": 4}[config["features"].get("store_dtype", "float16")]
    train_tokens = n_resp * seq_len
    for layer_set in feature_sets:
        per_token = (len(layer_set) + 1) * shape.hidden * store + 9
        flops = 2.0 * shape.matmul_params * train_tokens
        add("target_features", 1, gpu1,
            max(flops / (peak * c["features_mfu"]),
                train_tokens * per_token / c["host_bytes_per_second"]),
            disk=train_tokens * per_token, host=target_bytes, flops=flops,
            note=f"{len(layer_set)} taps, {per_token / 1e3:,.0f} KB per token")

    # benchmarks: AR + every method side by side, one job per (benchmark, temperature, repeat)
    b = config["benchmarks"]
    methods = dcfg.table3_methods(config)
    repeats = int(config["repeats"])
    for temp in config["temperatures"]:
        rule = "benchmark" if float(temp) == 0 else "benchmark_sampled"
        ms = methods if float(temp) == 0 or b.get("sampled_methods") is None else \
            [m for m in methods if m["name"] in b["sampled_methods"]]
        max_new = b["max_new_tokens"] if float(temp) == 0 or b.get("sampled_max_new_tokens") is None \
            else b["sampled_max_new_tokens"]
        engine = [m for m in ms if dcfg.method_backend(m) == "engine"]
        for name in b["names"]:
            tok = _bench_tokens(b["num_prompts"], max_new, [name]) * c["bench_fill"]
            rep = tok * (c["ar_seconds_per_token"] + len(engine) * c["spec_seconds_per_token"])
            add(rule, repeats, gpu1, rep, repeat=rep, host=target_bytes, note=f"{name}, T = {temp:g}")
        for backend in dcfg.SERVER_BACKENDS:  # one job per (temperature, repeat): AR + the rows, every benchmark
            served = [m for m in ms if dcfg.method_backend(m) == backend]
            if served:
                n = 1 + len(served)
                tok = _bench_tokens(b["num_prompts"], max_new, b["names"]) * c["bench_fill"] * n
                start = c["vllm_startup_seconds"] if backend == "vllm" else c["server_startup_seconds"]
                rep = tok * c["serving_seconds_per_token"] + n * start
                add(f"benchmark_{backend}", repeats, gpu1, rep, repeat=rep, host=target_bytes,
                    note=f"{backend}: AR + {len(served)} rows, T = {temp:g}")
    acc = config.get("accuracy") or {}
    if acc.get("enabled"):  # one job per benchmark: batched greedy AR over num_prompts (lm-eval)
        for name in acc["benchmarks"]:
            acc_flops = 2.0 * shape.matmul_params * acc["num_prompts"] * (
                c["prompt_tokens"] + c["bench_fill"] * acc["max_new_tokens"])
            add("accuracy", 1, gpu1, acc_flops / (peak * c["accuracy_mfu"]), host=target_bytes, flops=acc_flops,
                note=name)
    s = config.get("study", {})
    if s.get("enabled"):
        n_methods = len(dcfg.study_drafters(config))
        for name in s["benchmarks"]:
            tok = _bench_tokens(s["num_prompts"], s["max_new_tokens"], [name]) * c["bench_fill"]
            rep = tok * (c["ar_seconds_per_token"] + n_methods * c["spec_seconds_per_token"])
            add("study_benchmark", 1, gpu1, rep, repeat=rep, host=target_bytes, note=name)
    sv = config.get("serving", {})
    if sv.get("enabled"):
        n_methods = 1 + 1 + len(sv["block_sizes"]) + (1 if sv.get("eagle3_drafter") else 0)
        if sv["backend"] != "sglang":  # each online column's untimed warm-up batches (serving.online_warmup); the
            # online column itself is inside the calibrated per-token constant (its run had one, without warm-up)
            columns = bool(sv.get("online")) + len(sv.get("online_variants") or [])
            n_methods += columns * int(sv.get("online_warmup", 0))
        # one job per (concurrency, repeat); SGLang measures a pool of pool_factor x max(concurrency) prompts
        pool = max(config["concurrency"]) * (int(sv.get("pool_factor", 4)) if sv["backend"] == "sglang" else 1)
        for conc in config["concurrency"]:
            tok = pool * len(sv["benchmarks"]) * sv["max_new_tokens"] * n_methods * c["bench_fill"]
            rep = tok * c["serving_seconds_per_token"] / conc + n_methods * c["server_startup_seconds"]
            add("serving_benchmark", repeats, gpu1, rep, repeat=rep, host=target_bytes, note=f"c = {conc}")
        if (sv.get("vllm") or {}).get("enabled"):  # one job per repeat: AR + DFlash(bs) servers, every level
            n_vllm = 1 + len(sv["vllm"]["block_sizes"])
            tok = max(config["concurrency"]) * sv["max_new_tokens"] * n_vllm * c["bench_fill"]
            rep = (sum(tok * c["serving_seconds_per_token"] / conc for conc in config["concurrency"])
                   + n_vllm * c["vllm_startup_seconds"])
            add("serving_vllm", repeats, gpu1, rep, repeat=rep, host=target_bytes, note="vLLM, every c")
    rows = _with_gpu_memory(rows, config, project_dir)
    return Bill(rows, C, (config.get("cluster") or {}).get("disk_budget_gb"), device)


def _with_gpu_memory(rows: list[Row], config: dict, project_dir: str | Path | None = None) -> list[Row]:
    """Fill ``gpu_memory_gb`` of the training rows from the training memory estimate
    (:func:`dscout.training.memory_estimate.config_estimates`, the torch-free formula ``check_plan`` uses; the
    fake-tensor run is ``dscout memory-plan``): ``train_drafter`` the drafter its note names, ``depth_candidate``
    the deepest candidate. Other rows (and a target whose shape is not readable at plan time) stay "n/a"; the
    per-rule line shows the largest job's."""
    from .training.memory_estimate import config_estimates

    estimates = config_estimates(config, project_dir)
    depth = next((v for k, v in estimates.items() if k.startswith("depth_d")), None)
    for r in rows:
        est = None
        if r.rule == "train_drafter":  # the note names the drafter (an imported one has no estimate)
            est = estimates.get(r.note.split(":", 1)[0])
        elif r.rule == "depth_candidate":
            est = depth
        r.gpu_memory_gb = None if est is None else est["peak"] / 1e9
    return rows


# ----------------------------------------------------------------------------------------------- checks, rendering
def _merged_rows(b: Bill) -> list[tuple[Row, float]]:
    """One row per rule with its GPU-hours: jobs and GPU-hours summed; wall time, disk, memory: the largest job's."""
    out: dict[str, Row] = {}
    hours: dict[str, float] = {}
    for r in b.rows:
        hours[r.rule] = hours.get(r.rule, 0.0) + r.gpu_hours
        if r.rule not in out:
            out[r.rule] = Row(**{**r.__dict__, "note": ""})
            continue
        m = out[r.rule]
        m.jobs += r.jobs
        m.gpus_per_job = max(m.gpus_per_job, r.gpus_per_job)
        m.wall_seconds = max(m.wall_seconds, r.wall_seconds)
        m.repeat_seconds = max(m.repeat_seconds or 0, r.repeat_seconds or 0) or None
        m.disk_bytes = max(m.disk_bytes, r.disk_bytes)
        m.host_memory_bytes = max(m.host_memory_bytes, r.host_memory_bytes)
        m.runtime_minutes = max(m.runtime_minutes or 0, r.runtime_minutes or 0)
        if m.gpu_memory_gb is not None or r.gpu_memory_gb is not None:
            m.gpu_memory_gb = max(m.gpu_memory_gb or 0, r.gpu_memory_gb or 0)
    return [(row, hours[rule]) for rule, row in out.items()]


def problems(b: Bill, check_runtime: bool = True) -> list[str]:
    """What the plan check refuses: a job that cannot resume and whose estimated wall time exceeds its runtime
    request (a per-repeat rule: one repeat), and a job whose disk output exceeds ``cluster.disk_budget_gb``."""
    out = []
    for r in b.rows:
        runtime_s = (r.runtime_minutes or 0) * 60.0
        if check_runtime and r.runtime_minutes:
            if r.resumable == "no" and r.wall_seconds > runtime_s:
                out.append(f"{r.rule} ({r.note}): estimated {_hours(r.wall_seconds)} exceeds its runtime request "
                           f"of {r.runtime_minutes} min and the job cannot resume; raise its runtime "
                           f"(src/dscout/resources.py, or --set-resources {r.rule}:runtime=MIN) or shrink the stage")
            elif r.resumable == "per repeat" and (r.repeat_seconds or 0) > runtime_s:
                out.append(f"{r.rule} ({r.note}): one repeat is estimated at {_hours(r.repeat_seconds)}, above its "
                           f"runtime request of {r.runtime_minutes} min (the job resumes per repeat only)")
        if b.disk_budget_gb is not None and r.disk_bytes > b.disk_budget_gb * 1e9:
            out.append(f"{r.rule} ({r.note}): writes an estimated {r.disk_bytes / 1e9:,.0f} GB, above "
                       f"cluster.disk_budget_gb = {b.disk_budget_gb:g}")
    return out


def plan_cost_problems(config: dict, project_dir: str | Path | None = None) -> list[str]:
    """:func:`problems` of the config's bill, for :func:`dscout.config.check_plan` (one line each).

    The runtime refusals apply to GPU configs (``target.device: cuda``: the SLURM profile's jobs); a CPU run has
    no runtime limit. A config whose target shape or source size the model does not know is not checked here
    (``dscout plan-cost`` says why)."""
    try:
        b = bill(config, project_dir)
    except (ValueError, KeyError):
        return []
    return [f"cost: {p}" for p in problems(b, check_runtime=b.device == "cuda")]


def _hours(seconds: float | None) -> str:
    s = seconds or 0.0
    return f"{s / 3600:,.1f} h" if s >= 3600 else f"{s / 60:,.1f} min" if s >= 60 else f"{s:,.1f} s"


def _size(nbytes: float) -> str:
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if nbytes >= div:
            return f"{nbytes / div:,.1f} {unit}"
    return f"{nbytes / 1e3:,.1f} KB" if nbytes else "0"


def render(b: Bill) -> str:
    """The bill as Markdown: one row per rule, totals, problems, and the constants with their sources."""
    lines = ["| rule | jobs | GPUs/job | GPU-hours | wall per job (est.) | runtime request | attempts | resumes | "
             "GPU memory | host memory (est.) | disk written per job |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r, gh in _merged_rows(b):
        mem = f"{r.gpu_memory_gb:,.1f} GB" if r.gpu_memory_gb is not None else "n/a"
        runtime = f"{r.runtime_minutes} min" if r.runtime_minutes and b.device == "cuda" else "none (local run)"
        lines.append(f"| {r.rule} | {r.jobs} | {r.gpus_per_job} | {gh:,.1f} | {_hours(r.wall_seconds)} | {runtime} | "
                     f"{r.attempts if b.device == 'cuda' else 1} | {r.resumable} | {mem} | {_size(r.host_memory_bytes)} | {_size(r.disk_bytes)} |")
    lines.append(f"| **total** | {sum(r.jobs for r in b.rows)} | | {b.gpu_hours:,.1f} | | | | | | | "
                 f"{_size(b.disk_bytes)} |")
    ps = problems(b, check_runtime=b.device == "cuda")
    lines += ["", f"Device constants: `{b.device}`. Refused by the plan check: "
              + ("none" if not ps else "")]
    lines += [f"- {p}" for p in ps]
    lines += ["", "| constant | value | source |", "|---|---:|---|"]
    lines += [f"| {k} | {v:g} | {src} |" for k, (v, src) in b.constants.items()]
    return "\n".join(lines) + "\n"


def plan_cost(config_files: list[str | Path] | None = None, config: dict | None = None,
              project_dir: str | Path | None = None) -> str:
    """The rendered bill of ``config`` or of ``config_files`` merged in order (``config.yaml`` first, as the
    Snakefile does); what ``dscout plan-cost`` and ``snakemake cost`` print.

    Raises:
        ValueError: for a config the schema rejects, or a shape / size the model does not know.
    """
    from . import config as dcfg

    if config is None:
        import yaml

        merged: dict = {}
        for f in config_files or []:
            merged = dcfg.deep_merge(merged, yaml.safe_load(Path(f).read_text()) or {})
        config = dcfg.validate_config(merged, " ".join(str(f) for f in config_files or []))
    return render(bill(config, project_dir))
