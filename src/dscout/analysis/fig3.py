"""Figure 3: the inference configuration as G = τ / T, one panel per dimension (docs/method.md §5).

* conditioning depth t: FLOPs per round and measured round latency with the configured taps vs all usable target
  layers (same drafter depth; latency does not depend on the weights, so untrained drafters measure it);
* drafter depth d: τ_d and T_d of the depth search's trained candidates;
* block size bs: τ and T per round of the DScout drafter at each bs of the main run's records.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from .aggregate import load_records
from .plotting import _plt, save


def bs_factors(records: list[dict], method: str = "dscout") -> dict[int, dict[str, float]]:
    """Per fixed inference bs of ``method`` (greedy): τ (tokens/round), T (s/round) and G (tokens/s), pooled."""
    acc = defaultdict(lambda: {"tokens": 0, "rounds": 0, "seconds": 0.0})
    for r in records:
        if r["method"] != method or r["temperature"] != 0 or not r["accept_lengths"] \
                or not isinstance(r["block_size"], int):  # online rows have no single bs
            continue
        a = acc[int(r["block_size"])]
        a["tokens"] += sum(r["accept_lengths"])
        a["rounds"] += len(r["accept_lengths"])
        a["seconds"] += r["decode_seconds"]
    return {bs: {"tau": a["tokens"] / a["rounds"], "T": a["seconds"] / a["rounds"],
                 "G": a["tokens"] / a["seconds"]} for bs, a in sorted(acc.items()) if a["rounds"]}


def _twin(ax, xs, taus, ts, xlabel):
    ax.plot(xs, taus, "o-", color="tab:blue", label="τ (tokens / round)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("τ (tokens / round)", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(xs, [1e3 * t for t in ts], "s--", color="tab:red", label="T (ms / round)")
    ax2.set_ylabel("T (ms / round)", color="tab:red")
    for x, tau, t in zip(xs, taus, ts):
        ax.annotate(f"G={tau / t:.1f}/s", (x, tau), textcoords="offset points", xytext=(0, 7), ha="center",
                    fontsize=7)
    ax.set_xticks(xs)


def write_fig3(search_json: str | Path, record_paths, out_prefix: str, stage: dict) -> dict:
    """Render Figure 3 from the depth search's ``search.json`` and the main benchmark records."""
    plt = _plt()
    res = json.loads(Path(search_json).read_text())
    bs = bs_factors(load_records(record_paths))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    # (a) conditioning depth t
    ax = axes[0]
    taps = {int(k): v for k, v in res["taps_sweep"].items()}
    ts = sorted(taps)
    flops = [sum(taps[t]["flops_per_round"].values()) for t in ts]
    ax.bar([str(t) for t in ts], [1e3 * taps[t]["round_seconds"] for t in ts], color=["tab:blue", "tab:purple"])
    extra = 100 * (flops[-1] - flops[0]) / flops[0]
    dt = 100 * (taps[ts[-1]]["round_seconds"] - taps[ts[0]]["round_seconds"]) / taps[ts[0]]["round_seconds"]
    ax.set_xlabel("conditioning depth t (tapped target layers)")
    ax.set_ylabel("T (ms / round)")
    ax.set_title(f"all layers: +{extra:.2f}% FLOPs/round, T {dt:+.1f}%\n(paper: 9→35 layers +2.75% FLOPs, "
                 "<1% throughput)", fontsize=8)
    # (b) drafter depth d
    pts = sorted(res["points"], key=lambda p: p["depth"])
    _twin(axes[1], [p["depth"] for p in pts], [p["tau"] for p in pts], [p["round_seconds"] for p in pts],
          "drafter depth d (layers)")
    axes[1].set_title(f"depth search (bs {res['block_size']}): peak d = {res['peak_depth']}", fontsize=8)
    # (c) block size bs
    if bs:
        xs = list(bs)
        _twin(axes[2], xs, [bs[b]["tau"] for b in xs], [bs[b]["T"] for b in xs], "inference block size bs")
        best = max(xs, key=lambda b: bs[b]["G"])
        axes[2].set_title(f"DScout drafter, main run: best bs = {best}", fontsize=8)
    fig.suptitle(f"Figure 3 — throughput G = τ / T per configuration dimension, {stage.get('target', '')} on CPU",
                 fontsize=10)
    fig.tight_layout()
    save(fig, out_prefix)
    plt.close(fig)
    return {"taps": taps, "depth": pts, "block_size": bs}
