# Helpers shared by every rule: config validation, stage ids (hashes of the exact config each stage depends
# on), the per-stage JSON passed to the CLI, and the code digests that rerun a stage when its sources change.
import json
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from dscout import config as dcfg  # noqa: E402
from dscout import resources as dres  # noqa: E402
from dscout.data import fetch as dcfg_fetch  # noqa: E402
from dscout.data import models as dcfg_models  # noqa: E402
from dscout.experiments.depth_search import candidate_stage as depth_candidate_stage  # noqa: E402
from dscout.experiments.depth_search import unimodal_peak_search  # noqa: E402

validate(config, "../schemas/config.schema.yaml")
dcfg.check_references(config)
# block sizes vs horizons, mask id vs vocabulary, data files (a relative data_root: relative to this project)
dcfg.check_plan(config, "the merged config files", project_dir=workflow.basedir)

# Hub models (the target, published drafters): `download_models` (a localrule, rules/target.smk) snapshots them
# into the HF cache once, before prepare_target; every job then runs with the hub offline, reading that cache.
HUB_MODELS = dcfg_models.hub_models(config)
HUB_STAMP = "results/hub/download.json"
if HUB_MODELS:
    shell.prefix("set -euo pipefail; export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1; ")

# Every id wildcard is one path component (a readable name plus a hash); benchmarks are the registry's names; a
# concurrency level is a number. Rule-specific constraints (the temperature split of benchmark /
# benchmark_sampled) stay with their rules.
wildcard_constraints:
    tid=r"[^/]+",
    rid=r"[^/]+",
    fid=r"[^/]+",
    did=r"[^/]+",
    bid=r"[^/]+",
    aid=r"[^/]+",
    sid=r"[^/]+",
    fsid=r"[^/]+",
    benchmark="|".join(dcfg.benchmark_names()),
    c=r"\d+",


# relative to the working directory: a rule parameter, so an absolute path would rerun everything when the
# project is moved or copied
CLI = os.path.relpath(Path(workflow.basedir) / "src" / "dscout" / "cli.py")
# the data mirror: a relative data_root is relative to the project (the folder of the Snakefile and config.yaml),
# wherever snakemake runs. Jobs get the configured text when they run in the project folder (a job parameter, so
# moving or copying the project then reruns nothing), else the resolved folder relative to their working directory
# (`snakemake -d elsewhere`). $DSCOUT_DATA_ROOT, when set, wins in the jobs as here.
_IN_PROJECT = os.path.isabs(config["data_root"]) or Path.cwd().resolve() == Path(workflow.basedir).resolve()
DATA_ROOT = (config["data_root"] if _IN_PROJECT
             else os.path.relpath(dcfg_fetch.data_root(config["data_root"], workflow.basedir)))
NUM_TARGET_LAYERS = config["target"]["num_layers"]
TARGET_ID = dcfg.target_id(config)
RESPONSES_ID = dcfg.responses_id(config)
GPUS = config["training"]["num_gpus"]
try:  # local runs have a total core count (--cores); a cluster executor (the SLURM profile) has none
    CORES = workflow.cores
except WorkflowError:
    CORES = None
CLUSTER_THREADS = 8  # threads of a job on a cluster executor when threads_per_job is null (= the profile's cpus_per_task)
# threads of each heavy job: all cores by default (one job at a time: undisturbed timings)
JOB_THREADS = min(config["threads_per_job"] or CORES, CORES) if CORES else config["threads_per_job"] or CLUSTER_THREADS
# drafter trainings may run side by side with fewer threads each (no timing is measured inside them)
TRAIN_THREADS = min(config["threads_per_training_job"] or JOB_THREADS, CORES or JOB_THREADS)


STUDY = config["study"]["enabled"]
if STUDY:  # the recipe study's drafters (Tables 1, 2; Figures 4, 7) join the configured variants
    for _name, _variant in dcfg.study_drafters(config).items():
        config["drafters"].setdefault(_name, _variant)


FINDINGS = config["findings"]["enabled"]
if FINDINGS:  # the findings stage's drafters (one per ablation recipe, a held-out set) join the configured variants
    for _name, _variant in dcfg.findings_drafters(config).items():
        config["drafters"].setdefault(_name, _variant)


def _drafters_in_use():
    names = [m["drafter"] for m in config["methods"] if m.get("drafter")]
    return list(dict.fromkeys(names))


MAIN_DRAFTERS = _drafters_in_use()
STUDY_DRAFTERS = list(dcfg.study_drafters(config)) if STUDY else []
FINDINGS_DRAFTERS = list(dcfg.findings_drafters(config)) if FINDINGS else []
SERVING = config["serving"]["enabled"]
ACCURACY = config["accuracy"]["enabled"]
ACCURACY_ID = dcfg.accuracy_id(config) if ACCURACY else None
# Table 4's drafters by role (EAGLE-3 only when served through SGLang)
SERVING_ROLES = {
    role: config["serving"][f"{role}_drafter"]
    for role in ("dflash", "dscout", "eagle3")
    if SERVING and config["serving"].get(f"{role}_drafter")
}
SERVING_DRAFTERS = list(SERVING_ROLES.values())
DRAFTER_IDS = {
    n: dcfg.drafter_id(config, n, NUM_TARGET_LAYERS)
    for n in dict.fromkeys(MAIN_DRAFTERS + STUDY_DRAFTERS + SERVING_DRAFTERS + FINDINGS_DRAFTERS)
}
DRAFTER_STAGES = {DRAFTER_IDS[n]: dcfg.drafter_stage(config, n, NUM_TARGET_LAYERS) for n in DRAFTER_IDS}
# One feature cache per distinct layer set, its path named by the set (content-addressed): a drafter reads the
# cache of exactly its own taps. Adding a drafter that taps new layers adds a cache and trains that drafter,
# while every other drafter keeps its input untouched; changing a drafter's taps changes both its id and its
# cache, so one invocation schedules both. (One shared cache of the union, rewritten in place, needed ancient()
# inputs, under which Snakemake reran the cache but not the jobs that needed the new layers.)
DEPTH = config["depth_search"]["enabled"]
DEPTH_STAGE = dcfg.depth_search_stage(config, NUM_TARGET_LAYERS) if DEPTH else None
DEPTH_ID = dcfg.stage_id(config, DEPTH_STAGE) if DEPTH else None
FEATURE_STAGES = {
    dcfg.features_id(config, layers): dcfg.features_stage(config, layers)
    for layers in [st["layer_ids"] for st in DRAFTER_STAGES.values() if st["layer_ids"]]
    + ([DEPTH_STAGE["layer_ids"]] if DEPTH else [])
}


# features.mode: online -- the depth search trains each candidate in its own job (rules/depth.smk)
DEPTH_ONLINE = DEPTH and config["features"]["mode"] == "online"


def depth_points(wildcards):
    """The point.json of every candidate the lazy search trains (each one a checkpoint job): d_1, then d + 1
    only while G rose at d."""
    from dscout.experiments.depth_search import read_point

    paths = []

    def throughput(d):
        path = checkpoints.depth_candidate.get(did=wildcards.did, d=d).output.point
        paths.append(path)
        return read_point(path).throughput

    unimodal_peak_search(DEPTH_STAGE["candidates"], throughput)
    return paths


def feature_cache(layer_ids):
    """Path of the feature cache holding exactly ``layer_ids`` (any order) for the configured responses."""
    return f"results/features/{RESPONSES_ID}/{dcfg.features_id(config, layer_ids)}/index.json"


BENCH_STAGE = dcfg.bench_stage(config, NUM_TARGET_LAYERS)
BENCH_ID = dcfg.bench_id(config, NUM_TARGET_LAYERS)
TEMPS = [f"{t:g}" for t in config["temperatures"]]
REPEATS = list(range(config["repeats"]))
BENCHES = config["benchmarks"]["names"]
# our engine's rows (methods[].backend unset or engine); rows on vLLM / SGLang run in benchmark_<backend> jobs
ENGINE_BENCH_STAGE = dcfg.engine_slice(BENCH_STAGE)
METHOD_KEYS = ["ar", *(dcfg.method_key(s, s.get("drafter_id")) for s in ENGINE_BENCH_STAGE["methods"])]
# temperatures above 0 run AR and `benchmarks.sampled_methods` (null = all methods)
SAMPLED_BENCH_STAGE = dcfg.sampled_bench_stage(config, NUM_TARGET_LAYERS)
ENGINE_SAMPLED_BENCH_STAGE = dcfg.engine_slice(SAMPLED_BENCH_STAGE)
SAMPLED_METHOD_KEYS = ["ar", *(dcfg.method_key(s, s.get("drafter_id"))
                               for s in ENGINE_SAMPLED_BENCH_STAGE["methods"])]
# rows decoded with the online block-size controller: their jobs also save the calibrated latency model
ONLINE_METHOD_KEYS = [dcfg.method_key(s, s.get("drafter_id")) for s in BENCH_STAGE["methods"]
                      if s.get("block_size") == "online"]
SAMPLED_ONLINE_METHOD_KEYS = [dcfg.method_key(s, s.get("drafter_id")) for s in SAMPLED_BENCH_STAGE["methods"]
                              if s.get("block_size") == "online"]


def server_bench_stage(backend, temp):
    """The stage of one ``benchmark_<backend>`` job at temperature ``temp`` (a TEMPS string):
    :func:`dscout.config.server_slice` of the bench stage at that temperature."""
    return dcfg.server_slice(BENCH_STAGE if float(temp) == 0 else SAMPLED_BENCH_STAGE, backend, config)


def server_bench_records():
    """Every ``benchmark_<backend>`` job's output: one per (server runtime with rows, temperature, repeat)."""
    return [f"results/bench_server/{BENCH_ID}/{backend}/t{temp}/r{repeat}.jsonl"
            for backend in dcfg.SERVER_BACKENDS for temp in TEMPS
            if dcfg.server_method_keys(BENCH_STAGE if float(temp) == 0 else SAMPLED_BENCH_STAGE, backend)
            for repeat in REPEATS]


def server_drafter_args(wildcards, input):
    """``--drafter NAME=DIR`` of the drafters a server job's rows decode with."""
    return " ".join(f"--drafter {n}={Path(input[n]).parent}" for n in input.keys() if n != "target")


def server_drafter_inputs(wildcards):
    """The trained (or imported) drafters of one server job's rows."""
    names = {m["drafter"] for m in server_bench_stage(wildcards.backend, wildcards.temp)["methods"]}
    return {n: f"{drafter_dir(n)}/training_summary.json" for n in sorted(names)}


def method_keys_at(temp):
    """Method keys benchmarked at temperature ``temp`` (a TEMPS string)."""
    return METHOD_KEYS if float(temp) == 0 else SAMPLED_METHOD_KEYS
SERVING_STAGE = dcfg.serving_stage(config, DRAFTER_IDS) if SERVING else None
SERVING_ID = dcfg.stage_id(config, SERVING_STAGE) if SERVING else None
VLLM_SERVING = SERVING and config["serving"]["vllm"]["enabled"]
VLLM_SERVING_STAGE = dcfg.vllm_serving_stage(config, DRAFTER_IDS) if VLLM_SERVING else None
VLLM_SERVING_ID = dcfg.stage_id(config, VLLM_SERVING_STAGE) if VLLM_SERVING else None
STUDY_STAGE = dcfg.study_stage(config, DRAFTER_IDS) if STUDY else None
STUDY_ID = dcfg.stage_id(config, STUDY_STAGE) if STUDY else None
STUDY_METHOD_KEYS = ["ar", *(dcfg.method_key(m, m["drafter_id"]) for m in STUDY_STAGE["methods"])] if STUDY else []
FINDINGS_STAGE = dcfg.findings_stage(config, DRAFTER_IDS) if FINDINGS else None
FINDINGS_ID = dcfg.stage_id(config, FINDINGS_STAGE) if FINDINGS else None


def cluster_resources(rule_name, imported=None):
    """The ``resources:`` of ``rule_name`` (``**cluster_resources(...)`` in a rule): callables over the job's
    wildcards reading :func:`dscout.resources.job_resources`, so an import (``imported(wildcards)`` true) asks for
    no GPU and little memory, and a multi-GPU job for one node. On a local executor only ``gpu`` is set; on a
    cluster executor also runtime (minutes), mem_mb, cpus_per_task and nodes. ``--set-resources`` still wins."""
    cluster = CORES is None
    keys = ["gpu"] + (["runtime", "mem_mb", "cpus_per_task", "nodes"] if cluster else [])
    fallback = {"nodes": 1}

    def value(key):
        def fn(wildcards):
            res = dres.job_resources(config, rule_name, bool(imported and imported(wildcards)), cluster)
            return res.get(key, fallback.get(key))

        return fn

    # a key the rule never sets (e.g. mem_mb of target_features) is left to the profile's default-resources
    table = {**dres.CLUSTER_RESOURCES.get(rule_name, {}), **dres.CLUSTER_RESOURCES.get("import_drafter", {})} \
        if imported else dres.CLUSTER_RESOURCES.get(rule_name, {})
    return {k: value(k) for k in keys if k in ("gpu", "nodes") or k in table}


def stage_json(obj):
    """Canonical JSON of a stage slice (a rule parameter, so that a change reruns the job)."""
    return json.dumps(obj, sort_keys=True)


def code(stage):
    return dcfg.code_digest(stage)


# ----------------------------------------------------------------------------- paths
TARGET_DIR = f"results/target/{TARGET_ID}"
RESPONSES = f"results/responses/{RESPONSES_ID}/responses.jsonl"


def drafter_dir(name):
    return f"results/drafters/{DRAFTER_IDS[name]}"


def accuracy_records():
    """The accuracy jobs' scored answers (one file per benchmark), Table 3's optional second input."""
    if not ACCURACY:
        return []
    return expand("results/accuracy/{aid}/{benchmark}.jsonl", aid=ACCURACY_ID,
                  benchmark=config["accuracy"]["benchmarks"])


def bench_records():
    return [
        path
        for temp in TEMPS
        for path in expand(
            "results/bench/{bench_id}/{benchmark}/t{temp}/r{repeat}/{method}.jsonl",
            bench_id=BENCH_ID,
            benchmark=BENCHES,
            temp=temp,
            repeat=REPEATS,
            method=method_keys_at(temp),
        )
    ]


def serving_records_input(wildcards):
    if not SERVING:
        raise ValueError("Table 4 comes from the serving benchmark: set `serving: {enabled: true}`")
    ours = expand("results/serving/{sid}/c{c}/r{repeat}.jsonl", sid=SERVING_ID, c=config["concurrency"],
                  repeat=REPEATS)
    vllm = expand("results/serving/{sid}/vllm/r{repeat}.jsonl", sid=VLLM_SERVING_ID, repeat=REPEATS)
    return ours + (vllm if VLLM_SERVING else [])


def serving_drafter_inputs(wildcards):
    return {role: f"{drafter_dir(n)}/training_summary.json" for role, n in SERVING_ROLES.items()}


def depth_search_output(wildcards):
    if not DEPTH:
        raise ValueError("Figure 5 comes from the drafter-depth search: set `depth_search: {enabled: true}`")
    return f"results/depth/{DEPTH_ID}/search.json"


def study_records_input(wildcards):
    if not STUDY:
        raise ValueError("Tables 1, 2 and Figures 4, 7 come from the recipe study: set `study: {enabled: true}`")
    return study_records()


def study_records():
    return expand(
        "results/study/{sid}/{benchmark}/t0/r0/{method}.jsonl",
        sid=STUDY_ID,
        benchmark=config["study"]["benchmarks"],
        method=STUDY_METHOD_KEYS,
    )


def findings_records_input(wildcards):
    if not FINDINGS:
        raise ValueError("the findings table, its Tables 1, 2 and Figures 2, 4, 7 come from the findings stage: set "
                         "`findings: {enabled: true}` (presets/cpu_findings.yaml)")
    return expand("results/findings/{fsid}/records/{name}.jsonl", fsid=FINDINGS_ID, name=list(dcfg.FINDINGS_PLAN))


def findings_layer_ids():
    """The target layers every findings drafter reads (one shape for the stage: one evaluation taps file)."""
    layers = {tuple(DRAFTER_STAGES[DRAFTER_IDS[n]]["layer_ids"]) for n in FINDINGS_DRAFTERS}
    if len(layers) != 1:
        raise ValueError(f"the findings drafters read different target layers {sorted(layers)}: one shape expected")
    return list(layers.pop())


def findings_drafter_input(wildcards):
    if f"findings_{wildcards.name}" not in DRAFTER_IDS:
        raise ValueError(f"'{wildcards.name}' is not a findings drafter ({', '.join(dcfg.FINDINGS_PLAN)})")
    return f"{drafter_dir(f'findings_{wildcards.name}')}/training_summary.json"


def findings_outputs():
    if not FINDINGS:
        return []
    return ([f"results/tables/findings.{e}" for e in ("md", "csv")]
            + [f"results/tables/findings_{t}.{e}" for t in ("table1", "table2") for e in ("md", "csv", "tex")]
            + [f"results/figures/findings_{f}.{e}" for f in ("fig2", "fig4", "fig7") for e in ("png", "pdf")])


def final_outputs():
    out = [
        "results/tables/table3.md",
        "results/tables/table3.csv",
        "results/tables/table3.tex",
        "results/figures/fig2.png",
        "results/figures/fig2.pdf",
    ]
    if ONLINE_METHOD_KEYS and "0" in TEMPS:
        out += ["results/figures/fig_online.png", "results/figures/fig_online.pdf"]
    if DEPTH:
        out += [f"results/figures/{f}.{e}" for f in ("fig3", "fig5") for e in ("png", "pdf")]
    if SERVING:
        out += [f"results/tables/table4.{ext}" for ext in ("md", "csv", "tex")]
    out += findings_outputs()
    if STUDY:
        out += [f"results/tables/{t}.{ext}" for t in ("table1", "table2") for ext in ("md", "csv", "tex")]
        out += [f"results/figures/{f}.{ext}" for f in ("fig4", "fig7") for ext in ("png", "pdf")]
    return out


# ----------------------------------------------------------------------------- rule parameters
def features_stage_json(wildcards):
    return stage_json(FEATURE_STAGES[wildcards.fid])


def _imported(wildcards):
    return bool(DRAFTER_STAGES.get(wildcards.did, {}).get("pretrained"))


PUBLISHED_DIR = "results/published"  # local published-layout checkpoints a run writes itself (presets/paper_mini.yaml)
PUBLISHED_PREFIX = f"{PUBLISHED_DIR}/"
PUBLISHED = {v["pretrained"][len(PUBLISHED_PREFIX):]: {"kind": v.get("kind", "dflash"), "num_layers": v["num_layers"],
                                                        "mask_token_id": config["target"]["mask_token_id"]}
             for v in config["drafters"].values()
             if str(v.get("pretrained") or "").startswith(PUBLISHED_PREFIX)}


def published_of_drafter(wildcards):
    p = str(DRAFTER_STAGES.get(wildcards.did, {}).get("pretrained") or "")
    return [f"{p}/config.json"] if p.startswith(PUBLISHED_PREFIX) else []


def responses_of_drafter(wildcards):
    return [] if _imported(wildcards) else RESPONSES


def features_of_drafter(wildcards):
    if config["features"]["mode"] != "cache" or _imported(wildcards):
        return []
    return feature_cache(DRAFTER_STAGES[wildcards.did]["layer_ids"])


def features_arg(wildcards, input):
    if config["features"]["mode"] != "cache" or _imported(wildcards):
        return ""
    return f"--features {Path(input.features).parent}"


FREE_PORT = "$(python -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1])')"


def launcher(wildcards):
    """DeepSpeed's launcher over the job's ranks (GPUs; gloo processes on a CPU); plain python for one process.

    The rendezvous port is a free one picked when the job starts, so two trainings on one node never collide.
    """
    if GPUS > 0 and not _imported(wildcards):
        return f"deepspeed --num_gpus {GPUS} --master_port {FREE_PORT}"
    return "python"


def responses_arg(wildcards, input):
    return "" if _imported(wildcards) else f"--responses {input.responses}"


def drafter_stage_json(wildcards):
    if wildcards.did not in DRAFTER_STAGES:
        raise ValueError(f"drafter id {wildcards.did} is not defined by the current config")
    return stage_json(DRAFTER_STAGES[wildcards.did])


def drafter_inputs(wildcards):
    return {n: f"{drafter_dir(n)}/training_summary.json" for n in MAIN_DRAFTERS}


def study_drafter_inputs(wildcards):
    return {n: f"{drafter_dir(n)}/training_summary.json" for n in STUDY_DRAFTERS}


def online_latency_files():
    """The latency models the temperature-0 benchmark jobs of online rows calibrated (Figure "online"): one per
    (benchmark, repeat, online row), each job calibrating its own."""
    return expand("results/bench/{bid}/{benchmark}/t0/r{repeat}/latency-{method}.json", bid=BENCH_ID,
                  benchmark=BENCHES, repeat=REPEATS, method=ONLINE_METHOD_KEYS)


def bench_out_dir(wildcards):
    return f"results/bench/{wildcards.bid}/{wildcards.benchmark}/t{wildcards.temp}"


def drafter_args(wildcards, input):
    return " ".join(f"--drafter {n}={Path(input[n]).parent}" for n in MAIN_DRAFTERS)


def study_drafter_args(wildcards, input):
    return " ".join(f"--drafter {n}={Path(input[n]).parent}" for n in STUDY_DRAFTERS)


def study_table_stage_json():
    return stage_json(dcfg.study_table_stage(config, STUDY_STAGE))


def table_stage_json():
    return stage_json(dcfg.table_stage(config))
