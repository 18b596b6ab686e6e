"""Batched drafting on the CPU: the draft cost per round against concurrency (request-by-request loop, one padded
forward, one packed forward) and serving at c = 1, 8, 16, 32 with AR, DScout at fixed bs and DScout(online),
side by side in one process.

Usage (after a target and a DScout drafter exist, e.g. the quick drafter of
``reports/batched_drafting/quick_drafter.yaml`` or the CPU default's)::

    python benchmarks/batched_drafting.py --target results/target/<id> --drafter results/drafters/<id> \
        --out reports/batched_drafting

Part 1 (draft cost): for each c and bs, one draft round's drafter work on ragged contexts (lengths spread over
``[ctx/2, ctx]``) with ``--committed`` new tokens per request since the last round:

* ``loop``: the engine before batching: one drafter forward per request, then each request's commit written
  on its own (``BlockDiffusionProposer(defer_commits=False)``);
* ``padded``: :class:`~dscout.decoding.proposers.BatchedBlockDiffusionProposer`: one forward over the c blocks
  that first writes the c requests' kept taps (padded rows, key mask) -- what the engine uses;
* ``packed``: the alternative layout: the c contexts and blocks in one sequence of batch 1 with a block-diagonal
  mask (no padding, but every block query scores every request's keys).

Part 2 (serving): the first c prompts of the serving pool (GSM8K and HumanEval, round robin, chat template),
greedy, every method ``--repeats`` times in a rotating order; per repeat the throughput ratio to AR of the same
repeat; medians with min-max spread. Also the pre-batching engine (loop drafts, eager commits) at
``--old-block-sizes``, and per round the time split of the online runs (verify, drafter, controller, rest).
Every method's output is checked against AR (greedy: token for token).

Writes ``results.json``, ``report.md`` and ``draft_cost.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def draft_cost(target, drafter, cs, bss, ctx, committed, repeats, seed=0):
    """Median seconds of one round's drafter work per (layout, c, bs)."""
    import torch
    from transformers import DynamicCache

    from dscout.decoding.proposers import BatchedBlockDiffusionProposer, BlockDiffusionProposer

    g = torch.Generator().manual_seed(seed)
    cmax = max(cs)
    ids = torch.randint(1, min(target.vocab_size, 32000), (cmax, ctx), generator=g)
    taps = target(ids, layer_ids=drafter.config.target_layer_ids).taps  # [cmax, ctx, tD]
    new = torch.randn(cmax, committed, taps.shape[-1], generator=g, dtype=taps.dtype) * taps.std()
    lengths = [ctx - (i * 37) % (ctx // 2) for i in range(cmax)]
    rows = []
    for c in cs:
        P = max(lengths[:c])
        padded = taps.new_zeros(c, P, taps.shape[-1])
        valid = torch.zeros(c, P, dtype=torch.bool)
        for i in range(c):
            padded[i, P - lengths[i]:] = taps[i, :lengths[i]]
            valid[i, P - lengths[i]:] = True
        for bs in bss:
            last = [int(ids[i, -1]) for i in range(c)]
            loop = [BlockDiffusionProposer(drafter, defer_commits=False) for _ in range(c)]
            for i, p in enumerate(loop):
                p.start(taps[i, :lengths[i]])
            pos = list(lengths[:c])

            def run_loop():
                for i, p in enumerate(loop):
                    p.propose(last[i], pos[i], bs - 1)
                    p.commit(new[i])
                    pos[i] += committed

            group = BatchedBlockDiffusionProposer(drafter)
            group.start(padded, valid)
            gpos = list(lengths[:c])

            def run_padded():
                for i in range(c):
                    group.commit(i, new[i])
                    gpos[i] += committed
                group.propose(last, gpos, [bs - 1] * c)

            # packed: one sequence; segment i holds request i's context, then its kept taps, then its block
            cache = DynamicCache()
            seg = torch.cat([torch.full((lengths[i],), i) for i in range(c)])
            drafter.materialize_context(torch.cat([taps[i, :lengths[i]] for i in range(c)]).unsqueeze(0),
                                        torch.cat([torch.arange(lengths[i]) for i in range(c)]).unsqueeze(0), cache)
            state = {"seg": seg, "pos": list(lengths[:c])}

            def run_packed():
                ctx_seg = torch.arange(c).repeat_interleave(committed)
                ctx_pos = torch.cat([state["pos"][i] + torch.arange(committed) for i in range(c)])
                blk_seg = torch.arange(c).repeat_interleave(bs)
                blk_pos = torch.cat([state["pos"][i] + committed + torch.arange(bs) for i in range(c)])
                keys = torch.cat([state["seg"], ctx_seg, blk_seg])
                mask = (blk_seg[:, None] == keys[None, :])[None, None]
                blk = torch.full((1, c * bs), drafter.config.mask_token_id)
                blk[0, ::bs] = torch.tensor(last)
                hidden = drafter(blk, blk_pos.unsqueeze(0), context_taps=new[:c].reshape(1, c * committed, -1),
                                 context_positions=ctx_pos.unsqueeze(0), attention_mask=mask, past_key_values=cache)
                keep = torch.ones(c * bs, dtype=torch.bool)
                keep[::bs] = False
                drafter.compute_logits(hidden[0, keep]).argmax(-1)
                state["seg"] = torch.cat([state["seg"], ctx_seg])
                state["pos"] = [p + committed for p in state["pos"]]

            fns = {"loop": run_loop, "padded": run_padded, "packed": run_packed}
            times = {k: [] for k in fns}
            with torch.no_grad():
                for fn in fns.values():  # warm-up
                    fn()
                for _ in range(repeats):  # interleaved, so that a slow spell of a shared machine hits every layout
                    for k, fn in fns.items():
                        t0 = time.perf_counter()
                        fn()
                        times[k].append(time.perf_counter() - t0)
            for k, ts in times.items():
                rows.append({"layout": k, "c": c, "bs": bs, "seconds": statistics.median(ts), "all_seconds": ts})
                print(f"draft cost c={c:2d} bs={bs:2d} {k:6s} {1e3 * statistics.median(ts):8.1f} ms", flush=True)
    return rows


def serving(target, drafter, prompts, stops, cs, bss, old_bss, repeats, max_new_tokens, settings):
    import torch

    from dscout.decoding.batched import BatchedSpeculativeEngine
    from dscout.decoding.proposers import BlockDiffusionProposer
    from dscout.evaluation.methods import online_controller, typical_context_tokens

    out = []
    for c in cs:
        batch = prompts[:c]
        t0 = time.perf_counter()
        ctl = online_controller(target, BlockDiffusionProposer(drafter), settings, concurrency=c,
                                context_tokens=typical_context_tokens([len(p) for p in batch], max_new_tokens))
        calib = time.perf_counter() - t0
        new = lambda: BlockDiffusionProposer(drafter)  # noqa: E731
        old = lambda: BlockDiffusionProposer(drafter, defer_commits=False)  # noqa: E731
        methods = {"ar": (BatchedSpeculativeEngine(target, None, stops), 1)}
        for b in bss:
            methods[f"bs{b}"] = (BatchedSpeculativeEngine(target, new, stops), b)
        for b in old_bss:
            methods[f"old-bs{b}"] = (BatchedSpeculativeEngine(target, old, stops, batched_draft=False), b)
        methods["online"] = (BatchedSpeculativeEngine(target, new, stops, controller=ctl), drafter.config.block_size)
        names = list(methods)
        for name in names:  # warm-up, untimed
            eng, b = methods[name]
            eng.generate([batch[0][:8]], 2, block_size=b)
        runs = {n: [] for n in names}
        for r in range(repeats):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                eng, b = methods[name]
                if eng.controller is not None:
                    eng.controller.reset()
                with torch.no_grad():
                    res = eng.generate(batch, max_new_tokens, block_size=b)
                runs[name].append(res)
        ref = [x.output_ids for x in runs["ar"][0].results]
        row = {"c": c, "calibration_seconds": calib, "methods": {}}
        for name in names:
            thr = [x.throughput for x in runs[name]]
            ratios = [x.throughput / a.throughput for x, a in zip(runs[name], runs["ar"])]
            mism = sum(o.output_ids != e for x in runs[name] for o, e in zip(x.results, ref))
            last = runs[name][-1]
            n_rounds = [len(x.verify_seconds) for x in runs[name]]
            per_round = {
                "verify_ms": 1e3 * statistics.median(sum(x.verify_seconds) / len(x.verify_seconds) for x in runs[name]),
                "drafter_ms": 1e3 * statistics.median(sum(x.drafter_seconds) / len(x.drafter_seconds)
                                                      for x in runs[name]),
                "controller_ms": 1e3 * statistics.median(x.controller_seconds / len(x.verify_seconds)
                                                         for x in runs[name]),
                "round_ms": 1e3 * statistics.median(x.decode_seconds / len(x.verify_seconds) for x in runs[name]),
            }
            row["methods"][name] = {
                "tokens_per_s": statistics.median(thr), "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios), "ratio_max": max(ratios), "ratios": ratios, "mismatches": mism,
                "rounds": statistics.median(n_rounds), "per_round": per_round,
                "mean_bs": (sum(last.block_sizes) / len(last.block_sizes)) if last.block_sizes else None,
                "bs_share": ({str(b): last.block_sizes.count(b) / len(last.block_sizes)
                              for b in sorted(set(last.block_sizes))} if last.block_sizes else None),
                "tau": statistics.mean(r.mean_accept_length for r in last.results),
            }
        fixed = [n for n in names if n.startswith("bs")]
        best = max(fixed, key=lambda n: row["methods"][n]["ratio_median"])
        row["best_fixed"] = best
        on, bb = row["methods"]["online"]["ratios"], row["methods"][best]["ratios"]
        row["online_vs_best"] = statistics.median(o / b for o, b in zip(on, bb))
        row["latency_model"] = {"draft": ctl.latency.draft, "commit": ctl.latency.commit,
                                "verify": ctl.latency.verify}
        out.append(row)
        print(json.dumps({"c": c, "best": best, **{n: (round(m["ratio_median"], 3), m["mismatches"], m["mean_bs"])
                                                   for n, m in row["methods"].items()}}), flush=True)
    return out


def report(res) -> str:
    lines = ["# Batched drafting: measured", "", f"Setup: {res['setup']}", "",
             "## Draft cost per round (ms; drafter work only)", "",
             "| c | bs | loop (per request) | one padded forward | one packed forward |", "|---|---|---|---|---|"]
    by = {(r["layout"], r["c"], r["bs"]): r["seconds"] for r in res["draft_cost"]}
    for c in res["args"]["concurrency"]:
        for bs in res["args"]["draft_block_sizes"]:
            lines.append(f"| {c} | {bs} | {1e3 * by[('loop', c, bs)]:.1f} | {1e3 * by[('padded', c, bs)]:.1f} | "
                         f"{1e3 * by[('packed', c, bs)]:.1f} |")
    lines += ["", "## Serving (throughput / AR, median over repeats [min, max])", "",
              "| c | " + " | ".join(res["serving"][0]["methods"]) + " | best fixed | online / best |",
              "|---" * (len(res["serving"][0]["methods"]) + 3) + "|"]
    for row in res["serving"]:
        cells = [f"{m['ratio_median']:.2f} [{m['ratio_min']:.2f}, {m['ratio_max']:.2f}]" for m in row["methods"].values()]
        lines.append(f"| {row['c']} | " + " | ".join(cells) + f" | {row['best_fixed']} | {row['online_vs_best']:.3f} |")
    lines += ["", "## Per round (ms, median over repeats) and the online controller's choices", "",
              "| c | method | round | verify | drafter | controller | mean bs | tau | mismatches |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in res["serving"]:
        for name in ("ar", row["best_fixed"], "online") + tuple(n for n in row["methods"] if n.startswith("old")):
            m = row["methods"][name]
            p = m["per_round"]
            lines.append(f"| {row['c']} | {name} | {p['round_ms']:.1f} | {p['verify_ms']:.1f} | {p['drafter_ms']:.2f} | "
                         f"{p['controller_ms']:.3f} | {m['mean_bs'] if m['mean_bs'] is None else round(m['mean_bs'], 2)} "
                         f"| {m['tau']:.2f} | {m['mismatches']} |")
    return "\n".join(lines) + "\n"


def figure(res, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no figure")
        return
    bss = res["args"]["draft_block_sizes"]
    fig, axes = plt.subplots(1, len(bss), figsize=(4.2 * len(bss), 3.3), squeeze=False)
    style = {"loop": ("tab:red", "request by request (before)"), "padded": ("tab:blue", "one padded forward (now)"),
             "packed": ("tab:green", "one packed forward")}
    for ax, bs in zip(axes[0], bss):
        for layout, (col, lab) in style.items():
            pts = sorted((r["c"], 1e3 * r["seconds"]) for r in res["draft_cost"] if r["layout"] == layout
                         and r["bs"] == bs)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=col, label=lab)
        ax.set_xlabel("concurrency c")
        ax.set_ylabel("drafter ms per round")
        ax.set_title(f"bs {bs}, {res['args']['committed']} new tokens per request")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--out", default=str(ROOT / "reports" / "batched_drafting"))
    ap.add_argument("--data-root", default=None,
                    help="the data mirror (default: $DSCOUT_DATA_ROOT, else config.yaml's data_root beside the project)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16, 32])
    ap.add_argument("--block-sizes", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--old-block-sizes", type=int, nargs="+", default=[3])
    ap.add_argument("--draft-block-sizes", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--committed", type=int, default=2, help="new tokens per request per round (part 1)")
    ap.add_argument("--context", type=int, default=160, help="context tokens (part 1)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--note", default="", help="what else ran on the machine (goes into the report)")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    if a.data_root is None:
        import os

        import yaml

        from dscout.data.paths import data_root

        configured = yaml.safe_load((ROOT / "config.yaml").read_text())["data_root"]
        a.data_root = os.path.relpath(data_root(configured, ROOT))

    import torch

    from dscout.models.target import load_prepared_target as load_target, stop_token_ids
    from dscout.data.benchmarks import load_benchmark
    from dscout.data.prompts import chat_prompt_ids
    from dscout.models.export import drafter_for_target
    from dscout.models.linear import pack_linears

    torch.set_num_threads(a.threads)
    target = load_target(a.target)
    pack_linears(target.model, extra_weights=(target.lm_head.weight,))
    if json.loads((Path(a.drafter) / "config.json").read_text()).get("model_type") == "dscout_dflash_drafter":
        from dscout.models.drafter import DFlashDrafter  # an untrained / in-repo checkpoint (save_pretrained)
        from dscout.models.linear import pack_linears as pack

        drafter = DFlashDrafter.from_pretrained(a.drafter).to(target.dtype).attach_target(target).eval()
        pack(drafter)
    else:
        drafter = drafter_for_target(a.drafter, target, packed=True)
    cmax = max(a.concurrency)
    lists = [load_benchmark(n, a.data_root, cmax, seed=0) for n in ("gsm8k", "humaneval")]
    pool = [it for grp in zip(*lists) for it in grp][:cmax]
    prompts = [chat_prompt_ids(target.tokenizer, [{"role": "user", "content": it.turns[0]}], None, False)
               for it in pool]
    stops = stop_token_ids(target, ["<|im_end|>"])
    t0 = time.perf_counter()
    with torch.no_grad():
        cost = draft_cost(target, drafter, a.concurrency, a.draft_block_sizes, a.context, a.committed, 7)
    t1 = time.perf_counter()
    settings = {"calibration_block_sizes": [1, 2, 3, 4, 6, 8, 12, 16], "calibration_repeats": 3}
    serve = serving(target, drafter, prompts, stops, a.concurrency, a.block_sizes, a.old_block_sizes, a.repeats,
                    a.max_new_tokens, settings)
    t2 = time.perf_counter()
    res = {"args": vars(a), "setup": (f"target {a.target}, drafter {a.drafter} ({drafter.config.label}, horizon "
                                      f"{drafter.config.block_size}), {a.threads} threads, {a.repeats} repeats, "
                                      f"{a.max_new_tokens} new tokens per request. {a.note}").strip(),
           "draft_cost": cost, "serving": serve, "seconds": {"draft_cost": t1 - t0, "serving": t2 - t1}}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    from dscout.provenance import report_header

    body = report(res).split("\n")
    command = "python benchmarks/batched_drafting.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    text = "\n".join(report_header(body[0][2:], command, time.perf_counter() - t_start) + body[2:])
    (out / "report.md").write_text(text)
    figure(res, out / "draft_cost.png")
    print(text)


if __name__ == "__main__":
    main()
