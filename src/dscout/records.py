"""The one record type of the workflow: a decoded request, as Table 3, Table 4 and the studies read it.

Every runtime (the single-request engine, the batched engine, SGLang servers) writes the same fields, so one
analysis (:mod:`dscout.analysis.aggregate`) reads them all; a field a runtime does not measure is None. Runtime
specific fields (prefill timings, SGLang's acceptance counters, ...) follow as extras.
"""

from __future__ import annotations

REQUIRED = ("benchmark", "prompt_id", "method", "new_tokens", "decode_seconds", "accept_lengths", "output_ids")
"""Fields every record must carry (a record without them cannot be aggregated)."""

FIELDS = ("benchmark", "prompt_id", "turn", "method", "method_name", "method_key", "drafter", "block_size",
          "temperature", "repeat", "concurrency", "new_tokens", "decode_seconds", "accept_lengths", "output_ids",
          "output_text", "stop_reason", "runtime", "matches_ar", "near_tie", "correct")
"""The common fields, in the order records are written. Units: ``decode_seconds`` wall seconds of the decode
(prefill excluded); ``new_tokens`` tokens generated; ``accept_lengths`` tokens committed per draft round, bonus
included (one int per round; AR: ones)."""


def make_record(**fields) -> dict:
    """A record with every common field (None where not given) followed by the extras given.

    Defaults: ``turn`` 0, ``concurrency`` 1, ``method_name`` and ``method_key`` the method kind.

    Raises:
        ValueError: naming the required fields that are missing.
    """
    missing = [k for k in REQUIRED if fields.get(k) is None]
    if missing:
        raise ValueError(f"a record needs {', '.join(missing)}")
    defaults = {"turn": 0, "concurrency": 1, "method_name": fields["method"], "method_key": fields["method"]}
    rec = {k: fields[k] if fields.get(k) is not None else defaults.get(k) for k in FIELDS}
    rec.update({k: v for k, v in fields.items() if k not in FIELDS})
    return rec


def controller_fields(block_sizes: list[int], controller_seconds: float, draft_seconds: list[float],
                      verify_seconds: list[float], max_block_size: int) -> dict:
    """The extras of a record decoded with the online block-size controller (docs/online_controller.md).

    Returns:
        ``round_block_sizes`` (bs chosen per round), ``controller_seconds`` (its decisions and feedback),
        ``round_seconds`` (draft + verify per round: what Figure "online" compares with the latency model) and
        ``max_block_size`` (the bound it chose under); empty without a controller (no rounds chosen).
    """
    if not block_sizes:
        return {}
    return {"round_block_sizes": block_sizes, "controller_seconds": controller_seconds,
            "round_seconds": [d + v for d, v in zip(draft_seconds, verify_seconds)], "max_block_size": max_block_size}


def write_records(records: list[dict], path) -> None:
    """Write records (one JSON line each, in the given order) to ``path`` atomically: the one writer of every
    record file (benchmark, serving, server jobs; :func:`dscout.jsonl.write_jsonl`: temporary sibling + rename,
    parent folders created)."""
    from .jsonl import write_jsonl

    write_jsonl(records, path)


__all__ = ["FIELDS", "REQUIRED", "controller_fields", "make_record", "write_records"]
