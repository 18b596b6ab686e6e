"""Raw records -> per-benchmark MAT, TPOT, speedup and accuracy, mean ± std over repeats.

Every number in the tables is computed here from the raw per-(prompt, turn, run) records only:

* TPOT of a record = ``decode_seconds / (new_tokens - 1)`` (the first token comes from the prefill, which is
  excluded from ``decode_seconds``); a run's TPOT = mean over its records (DFlash's benchmark: mean over
  prompts).
* Speedup of a (benchmark, method, temperature, repeat) = mean AR TPOT / mean method TPOT, **paired with the
  AR run of the same benchmark, temperature and repeat on the method's own runtime** (records' ``runtime``: our
  engine's ``transformers``, a ``vllm`` or ``sglang`` server): a method served by vLLM is measured against vLLM's AR.
* MAT (τ) = mean accepted length per draft round, bonus included, pooled over the run's rounds.
* Mean ± std (ddof = 1) over repeats; the six-benchmark average is taken per repeat, then over repeats.
* Greedy losslessness: ``mismatches`` counts greedy records whose output differs from AR's; those at a
  floating-point near-tie (``near_tie``) are counted separately as ``near_ties``.
"""

from __future__ import annotations

import statistics
from collections import defaultdict


def load_records(paths) -> list[dict]:
    """All records of the given JSONL files (or folders, searched recursively): :func:`dscout.jsonl.read_records`.

    Raises:
        ValueError: naming the file and row of an invalid record.
    """
    from ..jsonl import read_records

    return read_records(paths)


def record_tpot(r: dict) -> float:
    return r["decode_seconds"] / max(r["new_tokens"] - 1, 1)


def runtime_of(r: dict) -> str:
    """The runtime a record was decoded on (``transformers`` = our engine, also for records before the field)."""
    return r.get("runtime") or "transformers"


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else None


def _std(xs):
    xs = [x for x in xs if x is not None]
    return statistics.stdev(xs) if len(xs) > 1 else 0.0 if xs else None


def per_run(records: list[dict]) -> dict[tuple, dict]:
    """Per (benchmark, method_key, temperature, concurrency, repeat): TPOT, MAT, accuracy, counts."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["benchmark"], r["method_key"], r["temperature"], r.get("concurrency", 1), r["repeat"])].append(r)
    runs = {}
    for key, rs in groups.items():
        rounds = [n for r in rs for n in r["accept_lengths"]]
        correct = [r["correct"] for r in rs if r.get("correct") is not None]
        runs[key] = {
            "method": rs[0]["method"], "method_name": rs[0].get("method_name", rs[0]["method"]),
            "runtime": runtime_of(rs[0]), "drafter": rs[0].get("drafter"), "block_size": rs[0].get("block_size"),
            "tpot": statistics.mean(record_tpot(r) for r in rs),
            "mat": sum(rounds) / len(rounds) if rounds else None,
            "accept_lengths": rounds,
            "record_mats": [sum(r["accept_lengths"]) / len(r["accept_lengths"]) for r in rs if r["accept_lengths"]],
            "accuracy": sum(correct) / len(correct) if correct else None,
            "n_records": len(rs),
            "new_tokens": sum(r["new_tokens"] for r in rs),
            "mismatches": sum(1 for r in rs if r.get("matches_ar") is False and not r.get("near_tie")),
            "near_ties": sum(1 for r in rs if r.get("matches_ar") is False and r.get("near_tie")),
        }
    return runs


def summarize(records: list[dict]) -> list[dict]:
    """One row per (benchmark, method_key, temperature, concurrency) plus ``benchmark = "average"`` rows.

    Row fields: ``speedup_mean/std``, ``mat_mean/std`` (over repeats), ``mat_prompt_std`` (τ's spread over the
    cell's requests: prompts x turns x repeats), ``tpot_ms_mean/std``, ``accuracy``, ``repeats``,
    ``n_records``, ``mismatches``, ``near_ties`` and the method's identity fields.

    Raises:
        ValueError: if a method run has no AR run on its runtime with the same benchmark, temperature, concurrency
            and repeat.
    """
    runs = per_run(records)
    ar = {(b, t, c, rep, v["runtime"]): v["tpot"] for (b, k, t, c, rep), v in runs.items() if v["method"] == "ar"}
    for (b, k, t, c, rep), v in runs.items():
        if (b, t, c, rep, v["runtime"]) not in ar:
            raise ValueError(f"no AR run on runtime {v['runtime']!r} paired with {k} on {b}, T={t}, c={c}, "
                             f"repeat {rep}: every method is paired with AR on its own runtime")
        v["speedup"] = ar[(b, t, c, rep, v["runtime"])] / v["tpot"]
    by_cell: dict[tuple, list[dict]] = defaultdict(list)
    for (b, k, t, c, rep), v in runs.items():
        by_cell[(b, k, t, c)].append({**v, "repeat": rep})
    rows = []
    for (b, k, t, c), vs in sorted(by_cell.items(), key=lambda kv: (kv[0][2], kv[0][3], kv[0][1], kv[0][0])):
        rows.append(_row(b, k, t, c, vs))
    # six-benchmark (or however many were run) average, per repeat then over repeats
    by_method: dict[tuple, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for (b, k, t, c, rep), v in runs.items():
        by_method[(k, t, c)][rep].append(v)
    for (k, t, c), reps in sorted(by_method.items()):
        per_rep = []
        for rep, vs in sorted(reps.items()):
            per_rep.append({**vs[0], "speedup": _mean([v["speedup"] for v in vs]), "mat": _mean([v["mat"] for v in vs]),
                            "tpot": _mean([v["tpot"] for v in vs]),
                            "accuracy": _mean([v["accuracy"] for v in vs]),
                            "n_records": sum(v["n_records"] for v in vs),
                            "mismatches": sum(v["mismatches"] for v in vs),
                            "near_ties": sum(v["near_ties"] for v in vs),
                            "accept_lengths": [n for v in vs for n in v["accept_lengths"]],
                            "record_mats": [m for v in vs for m in v["record_mats"]],
                            "benchmarks": len(vs), "repeat": rep})
        rows.append(_row("average", k, t, c, per_rep))
    return rows


def _row(bench, key, temp, conc, vs):
    return {
        "benchmark": bench, "method_key": key, "method": vs[0]["method"], "method_name": vs[0]["method_name"],
        "runtime": vs[0].get("runtime", "transformers"), "drafter": vs[0]["drafter"], "block_size": vs[0]["block_size"], "temperature": temp, "concurrency": conc,
        "speedup_mean": _mean([v["speedup"] for v in vs]), "speedup_std": _std([v["speedup"] for v in vs]),
        "mat_mean": _mean([v["mat"] for v in vs]), "mat_std": _std([v["mat"] for v in vs]),
        "mat_prompt_std": _std([m for v in vs for m in v.get("record_mats", [])]),
        "tpot_ms_mean": 1e3 * _mean([v["tpot"] for v in vs]), "tpot_ms_std": 1e3 * _std([v["tpot"] for v in vs]),
        "accuracy": _mean([v["accuracy"] for v in vs]), "repeats": len(vs),
        "n_records": sum(v["n_records"] for v in vs), "mismatches": sum(v["mismatches"] for v in vs),
        "near_ties": sum(v["near_ties"] for v in vs),
    }


def accept_length_histogram(records: list[dict]) -> dict[str, dict[int, float]]:
    """Per method key: share of draft rounds that accepted each length (Figure 2)."""
    counts: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for r in records:
        if r["method"] == "ar":
            continue
        for n in r["accept_lengths"]:
            counts[r["method_key"]][n] += 1
    out = {}
    for k, c in counts.items():
        total = sum(c.values())
        out[k] = {n: v / total for n, v in sorted(c.items())}
    return out
