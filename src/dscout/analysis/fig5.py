"""Figure 5: throughput versus drafter depth, from the depth search's ``search.json`` (docs/method.md §5)."""

from __future__ import annotations

import json
from pathlib import Path

from . import paper
from .plotting import _plt, save


def write_fig5(search_json: str | Path, out_prefix: str, stage: dict) -> dict:
    """Left: G_d (tokens/s) of the trained candidates, peak marked, untrained ones flagged; right: measured round
    latency T_d of every candidate with the fit T_fix + d·T_layer.

    Raises:
        FileNotFoundError: if ``search_json`` is missing (run the ``depth_search`` rule).
    """
    res = json.loads(Path(search_json).read_text())
    plt = _plt()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9.5, 3.5))
    pts = sorted(res["points"], key=lambda p: p["depth"])
    ds = [p["depth"] for p in pts]
    ax.plot(ds, [p["throughput"] for p in pts], "o-", color="tab:blue", label="G_d = τ_d / T_d (trained)")
    for p in pts:
        ax.annotate(f"τ={p['tau']:.2f}", (p["depth"], p["throughput"]), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=7)
    peak = next(p for p in pts if p["depth"] == res["peak_depth"])
    ax.plot([peak["depth"]], [peak["throughput"]], "*", ms=14, color="tab:red", label=f"peak d = {peak['depth']}")
    skipped = [d for d in map(int, res["latency_sweep"]) if d not in ds]
    if skipped:
        ax.plot(skipped, [min(p["throughput"] for p in pts)] * len(skipped), "x", color="grey",
                label="not trained (search stopped)")
    ax.set_xlabel("drafter depth d (layers)")
    ax.set_ylabel("throughput G (tokens / s)")
    ax.set_title(f"search trained {res['trained']} of {res['exhaustive']} candidates (bs {res['block_size']})",
                 fontsize=9)
    ax.legend(fontsize=7)
    sweep = {int(d): v for d, v in res["latency_sweep"].items()}
    xs = sorted(sweep)
    ax2.plot(xs, [1e3 * sweep[d]["round_seconds"] for d in xs], "o", color="tab:green", label="measured T_d")
    fit = res["latency_fit"]
    ax2.plot(xs, [1e3 * (fit["t_fix_s"] + d * fit["t_layer_s"]) for d in xs], "-", color="black",
             label=f"fit: {1e3 * fit['t_fix_s']:.1f} + d·{1e3 * fit['t_layer_s']:.2f} ms")
    ax2.plot(xs, [1e3 * sweep[d]["draft_seconds"] for d in xs], "s--", color="tab:orange", ms=4,
             label="draft part")
    ax2.set_xlabel("drafter depth d (layers)")
    ax2.set_ylabel("round latency T_d (ms)")
    ax2.legend(fontsize=7)
    ax2.set_title("T_d = T_fix + d·T_layer", fontsize=9)
    fig.suptitle(f"Figure 5 — throughput vs drafter depth on {stage.get('target', 'the target')} (CPU, "
                 f"{res['recipe']} recipe, {stage.get('max_steps', '?')} steps per candidate); paper: peak d = "
                 f"{paper.DEPTH_PEAK['bs>=16']} at bs ≥ 16, {paper.DEPTH_PEAK['bs=8']} at bs 8 (Qwen3-8B, H200)",
                 fontsize=9)
    save(fig, out_prefix)
    plt.close(fig)
    return res
