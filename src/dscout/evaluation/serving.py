"""Table 4 on the CPU: serving at concurrency c with the batched engine, and DScout(best) selection by measured G.

For each concurrency c the same c requests (the first c prompts of the serving pool) are decoded as one batch by
every method: AR, DFlash at bs 16 and DScout at every candidate bs. One record per request, in the project's
record schema with ``concurrency = c`` and the batch's wall time (``batch_decode_seconds``); throughput of a
method at c = committed decode tokens of the batch / batch decode seconds. DScout(best) is the candidate bs with
the highest measured throughput at that c (docs/method.md §5: the best bs depends on task and concurrency).
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from ..decoding.batched import BatchedSpeculativeEngine
from ..records import controller_fields, make_record


def serving_records(target, proposer_factories: dict[str, tuple[str, str, object]], prompts: list[list[int]],
                    prompt_ids: list[str], concurrency: int, max_new_tokens: int, block_sizes: dict[str, int],
                    stop_ids: list[int], repeat: int = 0, controllers: dict | None = None,
                    repeats: int = 1, interleave: str = "batch", prefill_store: dict | None = None,
                    controller_warmup: list[list[int]] | dict[str, list[list[int]]] | None = None) -> list[dict]:
    """Decode ``prompts[:concurrency]`` as one batch per method and repeat; one record per request and repeat.

    ``interleave="round"``: in each repeat the methods' batches advance together, one engine step (the
    prefill, then one draft-verify round) per method in turn, the turn order rotated by one every step; each
    method's decode seconds are its own rounds' (:meth:`~dscout.decoding.batched.BatchedSpeculativeEngine.steps`).
    Drift of the machine slower than one such cycle (about a second at c = 32 on 2 cores) then slows every method
    alike, where whole batches one after another put each method in its own time slot (measured 2026-12-06: ±5 %
    per Table 4 cell on 2 cores). But measured side by side at c = 32 (``benchmarks/interleave_cost.py``), round by
    round took 1.9x as long for DScout at bs 2 while AR's time did not move: it is opt-in. ``interleave="batch"``
    (default): method after method, whole batches, the order
    rotated by one each repeat. Either way Table 4 takes each repeat's ratio to AR's and reports the median and spread
    over repeats. An online controller keeps its
    statistics (acceptance, measured round-time ratios) from one repeat to the next, as a serving system's
    controller lives across the batches it serves: the first repeat starts from the calibration alone. The batch's
    prefill runs once per tapped layer set (AR's, the drafters') and is copied for every method and repeat, as a
    serving system's prefix cache would serve the same prompts (``prefill_store`` of
    :meth:`~dscout.decoding.batched.BatchedSpeculativeEngine.generate`); it is outside the decode seconds.

    Args:
        proposer_factories: method key -> ``(kind, drafter id, factory)``; kind ``ar`` has factory None.
        block_sizes: method key -> bs (for a key in ``controllers``: the largest bs its controller may pick).
        repeat: the first repeat's index (records carry ``repeat``, ``repeat + 1``, ...).
        controllers: method key -> :class:`~dscout.decoding.controller.BlockSizeController`: that method picks
            one bs per batch round online; its records say ``block_size: "online"`` and carry the bs chosen per
            round and the controller's seconds.
        repeats: batches per method (>= 1).
        interleave: ``round`` | ``batch`` (above).
        prefill_store: the prefix cache to use (and fill); None = a new one for this call. A caller that serves
            the same batch in several calls (``benchmarks/interleave_cost.py``) passes one dict to all of them.
        controller_warmup: prompts from beyond the measured pool (never measured) that each online method serves
            first, untimed, in batches of ``concurrency`` and ``max_new_tokens`` each, its controller learning
            (acceptance, round-time ratios, the makespan share) as it would from earlier traffic, as a serving
            system's controller has served batches before the one a benchmark times. Without it a job's controller
            starts from its calibration and prior: at 16 tokens per request a batch runs ~14 rounds, too few for the
            prior's exploration to pay back (CPU default, c = 8-32: DScout(online) 0.89-0.95x of AR where drafting
            never paid; reports/controller_warmup/report.md). None or empty = that cold start. A dict gives
            each online method key its own prompts; a key not in it starts cold (the two side by side in one job:
            ``benchmarks/controller_warmup.py``).
    Raises:
        ValueError: if fewer prompts than ``concurrency`` are given, ``repeats < 1``, ``interleave`` is unknown or
            ``controller_warmup`` holds fewer than ``concurrency`` prompts.
    """
    if len(prompts) < concurrency:
        raise ValueError(f"concurrency {concurrency} needs {concurrency} prompts, the serving pool has {len(prompts)}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if interleave not in ("round", "batch"):
        raise ValueError(f"interleave must be 'round' or 'batch', got {interleave!r}")
    warm = controller_warmup if isinstance(controller_warmup, dict) else \
        {key: controller_warmup for key in (controllers or {})} if controller_warmup else {}
    warm_batches = {}
    for key, ps in warm.items():
        if ps and len(ps) < concurrency:
            raise ValueError(f"controller_warmup ({key}): concurrency {concurrency} needs at least {concurrency} "
                             f"warm-up prompts, got {len(ps)}")
        warm_batches[key] = [ps[i: i + concurrency] for i in range(0, len(ps or []) - concurrency + 1, concurrency)]
    batch_prompts = prompts[:concurrency]
    # the batch's prefill is computed once per tapped layer set and copied for every method and repeat (a prefix
    # cache): at c = 32 one prefill took longer than AR's whole decode of the batch (2 cores), it ran once per
    # method and repeat (plus the warm-ups), and it is outside Table 4's decode seconds either way
    prefills: dict = {} if prefill_store is None else prefill_store
    engines = {}
    for key, (kind, drafter, factory) in proposer_factories.items():
        controller = (controllers or {}).get(key)
        engine = BatchedSpeculativeEngine(target, factory, stop_ids, controller=controller)
        # warm-up, untimed, at the batch's own shapes (c rows; a fixed bs gets one round of its full width): the
        # first forward of a new shape pays oneDNN's kernel creation, and the target is shared, so a warm-up of one
        # short row left those costs to whichever method's first timed batch ran first at this c
        bs = block_sizes.get(key, 1)
        engine.generate(batch_prompts, 1 + (min(bs, 4) if controller is not None else bs), block_size=bs,
                        prefill_store=prefills)
        if controller is not None:  # the warm-up's rounds out of the statistics and the overhead
            controller.reset()
            for batch in warm_batches.get(key, []):  # earlier traffic: the controller learns; not timed, not recorded
                engine.generate(batch, max_new_tokens, block_size=bs)
        engines[key] = engine
    keys = list(proposer_factories)
    records = []
    bar = tqdm(total=repeats * len(keys), desc=f"serving c={concurrency}", unit="batch", mininterval=5.0)
    for r in range(repeats):
        shift = (repeat + r) % len(keys)  # by the absolute repeat: one job per repeat rotates too
        order = keys[shift:] + keys[:shift]
        if interleave == "round":
            outs = _lockstep({key: engines[key].steps(batch_prompts, max_new_tokens, block_sizes.get(key, 1),
                                                      prefill_store=prefills) for key in order})
        for key in order:
            kind, drafter, _ = proposer_factories[key]
            controller = (controllers or {}).get(key)
            bs = block_sizes.get(key, 1)
            if interleave == "round":
                out = outs[key]
            else:
                out = engines[key].generate(batch_prompts, max_new_tokens, block_size=bs, prefill_store=prefills)
            online = controller_fields(out.block_sizes, out.controller_seconds, out.draft_seconds,
                                       out.verify_seconds, bs)
            bs_field = None if kind == "ar" else "online" if controller is not None else bs
            for pid, res in zip(prompt_ids, out.results):
                records.append(make_record(
                    benchmark="serving", prompt_id=pid, method=kind, method_key=key, method_name=key,
                    drafter=drafter, block_size=bs_field, temperature=0.0, repeat=repeat + r,
                    concurrency=concurrency, new_tokens=res.new_tokens, decode_seconds=out.decode_seconds,
                    accept_lengths=res.accept_lengths, output_ids=res.output_ids, stop_reason=res.stop_reason,
                    runtime="batched", batch_decode_seconds=out.decode_seconds, batch_throughput=out.throughput,
                    **online))
            bar.update()
    bar.close()
    return records


def _lockstep(steps: dict) -> dict:
    """Advance generators one step each in turn (the order rotated by one per cycle) until all have returned.

    Args:
        steps: key -> generator (``BatchedSpeculativeEngine.steps``), not yet started.
    Returns:
        key -> the generator's return value (its :class:`~dscout.decoding.batched.BatchResult`).
    """
    live, done, cycle = dict(steps), {}, 0
    while live:
        keys = list(live)
        k = cycle % len(keys)
        for key in keys[k:] + keys[:k]:
            try:
                next(live[key])
            except StopIteration as stop:
                done[key] = stop.value
                del live[key]
        cycle += 1
    return done


def serving_pool(benchmarks: list[str], root, pool_size: int, spare: int, seed: int) -> tuple[list, list]:
    """Table 4's request pool: the benchmarks' prompts round robin (one of each benchmark in turn), the first
    ``pool_size`` measured, the next ``spare`` kept for warm-up requests (never measured).

    Args:
        benchmarks: benchmark names (``serving.benchmarks``).
        root: the data root (:func:`dscout.data.paths.data_root`).
        pool_size: measured requests; each benchmark is asked for ``pool_size + spare`` prompts.
        seed: the benchmarks' sampling seed.
    Returns:
        ``(pool, spare_items)``: :class:`~dscout.data.benchmarks.BenchmarkPrompt` lists; ``spare_items`` is
        shorter than ``spare`` when the benchmarks hold too few prompts (the caller says what to change).
    """
    from ..data.benchmarks import load_benchmark

    lists = [load_benchmark(n, root, pool_size + spare, seed=seed) for n in benchmarks]
    items = [item for group in zip(*lists) for item in group]  # round robin over benchmarks
    return items[:pool_size], items[pool_size: pool_size + spare]


def sglang_serving_methods(stage: dict, drafters: dict[str, str]) -> list[tuple[str, dict, str | None]]:
    """Table 4's SGLang servers: ``(key, method, drafter path or hub id)`` for AR, [EAGLE-3,] DFlash(16), DScout(bs).

    EAGLE-3 is served from its published checkpoint (SGLang's EAGLE3 loads the hub id); DFlash and DScout from
    the drafters this workflow trained (DFLASH checkpoint layout).

    Args:
        stage: :func:`dscout.config.serving_stage`.
        drafters: ``{"dflash": dir, "dscout": dir}``, the trained drafters' folders.
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


def batched_serving_methods(target, stage: dict, drafters: dict[str, str], concurrency: int,
                            prompts: list[list[int]], latency_prefix: str | Path) -> tuple[dict, dict, dict]:
    """Table 4's methods on the batched engine: AR, DFlash(16), DScout at each ``block_sizes`` bs and the online
    controller variants (calibrated here, at this ``concurrency``, on ``target``).

    Loads both drafters (packed linears when ``stage["cpu_packed_linear"]``, which also packs the target's).
    Each controller's latency model is written to ``<latency_prefix>.latency-<key>.json``.

    Returns:
        ``(factories, block_sizes, controllers)`` as :func:`serving_records` takes them: key -> ``(kind,
        drafter id, proposer factory or None)``, key -> the bs (the controller's upper bound for online keys),
        online key -> its controller.
    """
    from ..decoding.proposers import BlockDiffusionProposer
    from ..models.export import drafter_for_target
    from ..models.linear import pack_linears

    st = stage
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
        from .methods import online_controller, typical_context_tokens

        probe = BlockDiffusionProposer(loaded["dscout"])
        ctl = online_controller(target, probe, settings, concurrency=concurrency,
                                context_tokens=typical_context_tokens([len(p) for p in prompts], st["max_new_tokens"]))
        ctl.latency.to_json(Path(latency_prefix).with_suffix(f".latency-{key}.json"))
        factories[key] = ("dscout", st["dscout"], lambda: BlockDiffusionProposer(loaded["dscout"]))
        sizes[key] = probe.max_block_size
        controllers[key] = ctl
    return factories, sizes, controllers


def run_serving_job(stage: dict, *, target_dir: str, drafters: dict[str, str], concurrency: int, repeat: int,
                    out: str, root, prefill_store_gb: float = 2.0) -> list[dict]:
    """One ``serving_benchmark`` job: Table 4's records at one (concurrency level, repeat), written to ``out``
    (JSONL) with the stage beside it (``<out>.resolved.json``).

    ``stage["backend"] == "sglang"``: one server per method (:func:`sglang_serving_methods`, the order rotated by
    ``repeat``), each a closed loop at ``concurrency`` after ``concurrency`` warm-up requests from beyond the
    measured pool (:func:`dscout.backends.sglang.serve_benchmark`); this process loads the tokenizer only.
    Otherwise the batched engine on this machine (:func:`batched_serving_methods`, :func:`serving_records`).

    Args:
        stage: :func:`dscout.config.serving_stage`.
        target_dir: the prepared target (``target.json``).
        drafters: ``{"dflash": dir, "dscout": dir}``.
        root: the data root.
        prefill_store_gb: host-memory cap (GiB) of the batched backend's shared batch prefills.
    Returns:
        the records written.
    Raises:
        SystemExit: the benchmarks hold too few prompts for the pool and the warm-up (SGLang's, the controllers').
    """
    from ..config import write_resolved
    from ..data.prompts import first_turn_ids
    from ..models.target import load_prepared_target, server_model_path, stop_token_ids
    from ..records import write_records
    from .prefill_store import PrefillStore

    st = stage
    sglang = st.get("backend") == "sglang"
    if sglang:  # the servers own the GPU: the client needs the tokenizer only
        from types import SimpleNamespace

        from transformers import AutoTokenizer

        model_path = server_model_path(target_dir)  # a materialised target (tiny-qwen3, gguf): its folder
        target = SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(model_path))
    else:
        target = load_prepared_target(target_dir)
    chat = st["chat"]
    # SGLang: c warm-up requests per server from beyond the measured pool (never measured); batched: the online
    # controllers' earlier traffic, ``online_warmup`` batches of c from there (serving_records' controller_warmup)
    online = bool(st.get("online") or st.get("online_variants"))
    warm_n = concurrency if sglang else concurrency * int(st.get("online_warmup", 0)) if online else 0
    pool, spare = serving_pool(st["benchmarks"], root, st["pool_size"], warm_n, st["seed"])
    if len(spare) < warm_n:
        raise SystemExit(f"dscout serve (c={concurrency}, repeat {repeat}): the benchmarks {st['benchmarks']} "
                         f"hold {len(pool) + len(spare)} prompts, {st['pool_size']} measured + {warm_n} warm-up "
                         "needed (lower serving.pool_factor or serving.online_warmup, or add benchmarks)")
    prompts = first_turn_ids(target.tokenizer, pool, chat)
    ids = [f"{it.benchmark}/{it.prompt_id}" for it in pool]
    stops = stop_token_ids(target, chat.get("stop_tokens") or [])
    if sglang:  # one server per method, closed loop at concurrency c (GPU cluster)
        from ..backends import sglang as sglang_backend

        reqs = [{"benchmark": it.benchmark, "prompt_id": pid, "turn": 0, "input_ids": p}
                for it, pid, p in zip(pool, ids, prompts)]
        warm = [{"benchmark": it.benchmark, "prompt_id": f"{it.benchmark}/{it.prompt_id}", "turn": 0,
                 "input_ids": p} for it, p in zip(spare, first_turn_ids(target.tokenizer, spare, chat))]
        methods = sglang_serving_methods(st, drafters)
        shift = repeat % len(methods)  # the servers' order rotates from repeat to repeat (AR included)
        records = []
        for key, method, ddir in methods[shift:] + methods[:shift]:
            recs, summary = sglang_backend.serve_benchmark(
                model_path, {**method, "key": key}, reqs, concurrency=concurrency, temperature=0.0,
                max_new_tokens=st["max_new_tokens"], repeat=repeat, drafter_dir=ddir, warmup_requests=warm,
                job=f"serving_benchmark c={concurrency} repeat {repeat} ({key}, output {out})",
                log_path=Path(out).with_suffix(f".{key}.server.log"))
            for r in recs:  # Table 4 reads throughput = tokens / wall of the whole closed loop
                r.update(method_key=key, method_name=key, batch_decode_seconds=summary["wall_seconds"],
                         drafter=method.get("drafter_id"), server_port=summary["port"])
            records += recs
    else:
        factories, sizes, controllers = batched_serving_methods(target, st, drafters, concurrency, prompts, out)
        records = serving_records(target, factories, prompts, ids, concurrency, st["max_new_tokens"], sizes, stops,
                                  controllers=controllers, repeat=repeat, repeats=1,
                                  interleave=st.get("interleave", "batch"),
                                  prefill_store=PrefillStore(int(prefill_store_gb * 2**30)),
                                  controller_warmup=first_turn_ids(target.tokenizer, spare, chat) if warm_n else None)
    write_records(records, out)
    write_resolved(Path(out).with_suffix(".resolved.json"), st)
    return records
