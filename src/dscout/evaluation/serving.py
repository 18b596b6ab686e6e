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
                    repeats: int = 1, interleave: str = "batch", prefill_store: dict | None = None) -> list[dict]:
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
    Raises:
        ValueError: if fewer prompts than ``concurrency`` are given, ``repeats < 1`` or ``interleave`` is unknown.
    """
    if len(prompts) < concurrency:
        raise ValueError(f"concurrency {concurrency} needs {concurrency} prompts, the serving pool has {len(prompts)}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if interleave not in ("round", "batch"):
        raise ValueError(f"interleave must be 'round' or 'batch', got {interleave!r}")
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


def write_records(records: list[dict], path: str | Path) -> None:
    """Write serving records as JSONL atomically (:func:`dscout.jsonl.write_jsonl`)."""
    from ..jsonl import write_jsonl

    write_jsonl(records, path)
