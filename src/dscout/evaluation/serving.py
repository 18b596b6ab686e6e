"""Table 4 on the CPU: serving at concurrency c with the batched engine, and DScout(best) selection by measured G.

For each concurrency c the same c requests (the first c prompts of the serving pool) are decoded as one batch by
every method: AR, DFlash at bs 16 and DScout at every candidate bs. One record per request, in the project's
record schema with ``concurrency = c`` and the batch's wall time (``batch_decode_seconds``); throughput of a
method at c = committed decode tokens of the batch / batch decode seconds. DScout(best) is the candidate bs with
the highest measured throughput at that c (docs/method.md §5: the best bs depends on task and concurrency).
"""

from __future__ import annotations

from pathlib import Path

from ..decoding.batched import BatchedSpeculativeEngine
from ..records import controller_fields, make_record


def serving_records(target, proposer_factories: dict[str, tuple[str, str, object]], prompts: list[list[int]],
                    prompt_ids: list[str], concurrency: int, max_new_tokens: int, block_sizes: dict[str, int],
                    stop_ids: list[int], repeat: int = 0, controllers: dict | None = None) -> list[dict]:
    """Decode ``prompts[:concurrency]`` as one batch per method; one record per request.

    Args:
        proposer_factories: method key -> ``(kind, drafter id, factory)``; kind ``ar`` has factory None.
        block_sizes: method key -> bs (for a key in ``controllers``: the largest bs its controller may pick).
        controllers: method key -> :class:`~dscout.decoding.controller.BlockSizeController`: that method picks
            one bs per batch round online; its records say ``block_size: "online"`` and carry the bs chosen per
            round and the controller's seconds.
    Raises:
        ValueError: if fewer prompts than ``concurrency`` are given.
    """
    if len(prompts) < concurrency:
        raise ValueError(f"concurrency {concurrency} needs {concurrency} prompts, the serving pool has {len(prompts)}")
    batch_prompts = prompts[:concurrency]
    records = []
    for key, (kind, drafter, factory) in proposer_factories.items():
        controller = (controllers or {}).get(key)
        engine = BatchedSpeculativeEngine(target, factory, stop_ids, controller=controller)
        bs = block_sizes.get(key, 1)
        engine.generate([batch_prompts[0][:8]], 2, block_size=bs)  # warm-up
        if controller is not None:  # the warm-up's round out of the statistics and the overhead
            controller.reset()
        out = engine.generate(batch_prompts, max_new_tokens, block_size=bs)
        online = controller_fields(out.block_sizes, out.controller_seconds, out.draft_seconds, out.verify_seconds, bs)
        bs_field = None if kind == "ar" else "online" if controller is not None else bs
        for pid, r in zip(prompt_ids, out.results):
            records.append(make_record(
                benchmark="serving", prompt_id=pid, method=kind, method_key=key, method_name=key, drafter=drafter,
                block_size=bs_field, temperature=0.0, repeat=repeat, concurrency=concurrency,
                new_tokens=r.new_tokens, decode_seconds=out.decode_seconds, accept_lengths=r.accept_lengths,
                output_ids=r.output_ids, stop_reason=r.stop_reason, runtime="batched",
                batch_decode_seconds=out.decode_seconds, batch_throughput=out.throughput, **online))
    return records


def write_records(records: list[dict], path: str | Path) -> None:
    """Write serving records as JSONL atomically (:func:`dscout.jsonl.write_jsonl`)."""
    from ..jsonl import write_jsonl

    write_jsonl(records, path)
