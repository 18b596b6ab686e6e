"""Per-rule cluster resources: what each job asks SLURM for, from the config alone (torch-free).

The rules call :func:`job_resources` through callables (rules/common.smk ``cluster_resources``), and the bill
(:mod:`dscout.cost`) compares its runtime requests with the estimated wall times, so both read one table. On a
local executor (``--cores N``) only ``gpu`` is set, as before: runtime and memory requests mean nothing there.
A value given on the command line (``--set-resources rule:key=value``) still replaces these.

Rationale per rule (Qwen3-8B paper preset; minutes, MB):

* imports of published drafters (``pretrained:``) check a checkpoint's layout and convert it: no GPU, little memory,
  one hour; a full node for 48 h was the old request.
* every multi-GPU job (trainings, response generation) is pinned to one node (``nodes: 1``): DeepSpeed's and
  SGLang's launchers start their ranks on the node they run on.
* benchmark jobs resume per repeat: 8 h holds one repeat of the paper's largest benchmark (the bill's estimate).
* jobs that resume (trainings, depth candidates) ask for the cluster's usual limits and rely on requeues
  (``retries`` in the profile) plus the stop signal with grace (the profile's ``slurm_extra``) to save first.
"""

from __future__ import annotations

# Minutes and megabytes of each rule on the cluster. Rules not named here get the profile's default-resources.
CLUSTER_RESOURCES: dict[str, dict] = {
    "prepare_target": {"runtime": 60, "mem_mb": 32000, "cpus_per_task": 4, "gpu": 0},
    "download_models": {},  # a localrule (login node, internet)
    "write_published": {"runtime": 60, "mem_mb": 64000, "cpus_per_task": 4, "gpu": 0},
    "generate_responses": {"runtime": 1440, "mem_mb": 256000, "cpus_per_task": 32},
    "target_features": {"runtime": 600},
    "train_drafter": {"runtime": 2880, "mem_mb": 512000, "cpus_per_task": 64},
    "import_drafter": {"runtime": 60, "mem_mb": 32000, "cpus_per_task": 4, "gpu": 0},
    "depth_candidate": {"runtime": 2880, "mem_mb": 512000, "cpus_per_task": 64},
    "depth_search": {"runtime": 240},
    "benchmark": {"runtime": 480, "cpus_per_task": 16},
    "benchmark_sampled": {"runtime": 480, "cpus_per_task": 16},
    "study_benchmark": {"runtime": 480, "cpus_per_task": 16},
    "serving_benchmark": {"runtime": 240, "cpus_per_task": 16},
    "serving_vllm": {"runtime": 240, "cpus_per_task": 16},
    "benchmark_vllm": {"runtime": 480, "cpus_per_task": 16},
    "benchmark_sglang": {"runtime": 480, "cpus_per_task": 16},
}
"""Cluster requests per rule (``import_drafter`` = a ``train_drafter`` job of a ``pretrained:`` drafter)."""

DEFAULT_RUNTIME_MIN = 240
"""The profile's ``default-resources: runtime`` (profiles/slurm/profile.yaml): rules not in the table."""

MULTI_GPU_RULES = ("generate_responses", "train_drafter", "depth_candidate")
"""Rules whose job uses every GPU of ``training.num_gpus`` (one launcher, one node)."""


def job_gpus(config: dict, rule: str, imported: bool = False) -> int:
    """GPUs of one job of ``rule``: ``training.num_gpus`` for the multi-GPU rules, none for an import, else one
    (zero on a CPU config, ``num_gpus: 0``)."""
    gpus = int(config["training"]["num_gpus"])
    if imported or rule in ("prepare_target", "write_published", "download_models") or rule not in CLUSTER_RESOURCES:
        return 0
    return gpus if rule in MULTI_GPU_RULES else min(gpus, 1)


def job_resources(config: dict, rule: str, imported: bool = False, cluster: bool = True) -> dict:
    """Resources of one job of ``rule``.

    Args:
        config: the merged config (``training.num_gpus``).
        rule: the Snakemake rule name.
        imported: a ``train_drafter`` job of a ``pretrained:`` drafter (no GPU, no target load).
        cluster: False on a local executor: ``gpu`` only.
    Returns:
        ``{"gpu": n}`` plus, on a cluster, ``runtime`` (minutes), ``mem_mb``, ``cpus_per_task`` where the rule
        sets them, and ``nodes: 1`` for a job on more than one GPU.
    """
    gpu = job_gpus(config, rule, imported)
    if not cluster:
        return {"gpu": gpu}
    table = CLUSTER_RESOURCES["import_drafter" if imported and rule == "train_drafter" else rule] \
        if rule in CLUSTER_RESOURCES else {}
    out = {**{k: v for k, v in table.items() if k != "gpu"}, "gpu": gpu}
    if gpu > 1:
        out["nodes"] = 1
    return out


def runtime_minutes(config: dict, rule: str, imported: bool = False) -> int:
    """The SLURM ``runtime`` request (minutes) of one job of ``rule``."""
    return int(job_resources(config, rule, imported).get("runtime", DEFAULT_RUNTIME_MIN))
