"""Figure "online": the block size the online controller chose over a generation, acceptance beside it, and the
calibrated latency model against the measured round times (PNG + PDF)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..decoding.latency import LatencyModel
from .aggregate import load_records
from .plotting import _plt, save


def write_fig_online(record_paths, latency_paths, out_prefix: str, stage: dict) -> dict:
    """Left: bs chosen per round and tokens committed per round over the online generation (T = 0, repeat 0) in
    which the controller chose the most distinct bs (ties: the longest).
    Right: predicted vs measured round time of every online round (one point per round), per benchmark.

    Args:
        record_paths: Table 3 records (files or folders); the online rows (``block_size == "online"``) are used.
        latency_paths: the ``r<k>/latency-<method key>.json`` files the benchmark jobs saved (one per benchmark,
            repeat and online row; each job's rounds are compared with the model that job calibrated).
    Returns:
        ``{"rounds": n, "median_abs_error": fraction, "mean_bs": ...}`` (also written as ``<prefix>.json``).
    Raises:
        ValueError: if the records hold no online rows at temperature 0.
    """
    plt = _plt()
    recs = [r for r in load_records(record_paths) if r.get("block_size") == "online" and r["temperature"] == 0]
    if not recs:
        raise ValueError("no temperature-0 records of a `block_size: online` method")
    latency = {}
    for p in latency_paths:  # results/bench/<id>/<benchmark>/t0/r<k>/latency-<key>.json: one per repeat's job
        p = Path(p)
        repeat = int(p.parent.name[1:]) if p.parent.name[1:].isdigit() else 0
        bench = p.parent.parent.parent.name if p.parent.name[1:].isdigit() else p.parent.parent.name
        latency[bench, p.stem[len("latency-"):], repeat] = LatencyModel.from_json(p)
    # the generation where the controller moved most: most distinct bs chosen, then most rounds
    longest = max((r for r in recs if r["repeat"] == 0),
                  key=lambda r: (len(set(r["round_block_sizes"])), len(r["accept_lengths"])))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10.5, 3.6), gridspec_kw={"width_ratios": [1.5, 1]})
    xs = list(range(1, len(longest["accept_lengths"]) + 1))
    ax.bar(xs, longest["accept_lengths"], color="tab:green", alpha=0.55, label="tokens committed (accepted + bonus)")
    ax.step(xs, longest["round_block_sizes"], where="mid", color="tab:blue", label="bs chosen")
    ax.set_xlabel("draft round")
    ax.set_ylabel("tokens")
    ax.set_title(f"{longest['method_name']} on {longest['benchmark']} / {longest['prompt_id']} "
                 f"(τ {sum(longest['accept_lengths']) / len(xs):.2f})", fontsize=9)
    ax.legend(fontsize=8)
    errors, mean_bs = [], []
    for bench in sorted({r["benchmark"] for r in recs}):
        pred, meas = [], []
        for r in (r for r in recs if (bench, r["method_key"], r["repeat"]) in latency and r["benchmark"] == bench):
            model = latency[bench, r["method_key"], r["repeat"]]  # each online row of each job calibrated its own
            for bs, n, secs in zip(r["round_block_sizes"], r["accept_lengths"], r.get("round_seconds") or []):
                pred.append(1e3 * model.round_seconds(bs, 1, committed=n))
                meas.append(1e3 * secs)
            mean_bs += r["round_block_sizes"]
        errors += [abs(p - m) / m for p, m in zip(pred, meas) if m > 0]
        if pred:
            bx.scatter(pred, meas, s=6, alpha=0.5, label=bench)
    lim = bx.get_xlim()[1] if errors else 1.0
    bx.plot([0, lim], [0, lim], color="grey", lw=0.8)
    med = statistics.median(errors) if errors else None
    bx.set_xlabel("latency model T(bs, c=1) (ms)")
    bx.set_ylabel("measured round time (ms)")
    bx.set_title("calibrated model vs measured rounds" + (f": median |error| {100 * med:.0f}%" if med else ""),
                 fontsize=9)
    bx.legend(fontsize=7, markerscale=2)
    fig.suptitle(f"Online block-size controller, {stage.get('target', 'target')}, temperature 0", fontsize=10)
    save(fig, out_prefix)
    plt.close(fig)
    summary = {"rounds": len(mean_bs), "median_abs_error": med,
               "mean_bs": sum(mean_bs) / max(len(mean_bs), 1)}
    Path(out_prefix).with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
