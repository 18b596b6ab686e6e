"""Table 4: serving at concurrency c (AR, [EAGLE-3,] DFlash(16), DScout(16), DScout(32), DScout(best)), from records."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

from . import paper
from .aggregate import load_records


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def throughput_table(records: list[dict]) -> dict[int, dict[str, dict]]:
    """``c -> method key -> {throughput, mat, speedup, speedup_min, speedup_max, repeats, block_size, kind}``.

    Per repeat (records carry ``repeat``; one batch per method and repeat): throughput = committed decode tokens
    of the level's requests / the level's wall time (``batch_decode_seconds``: the batched engine's batch, or the
    SGLang client's closed loop), and the speedup = that / AR's throughput in the same repeat. Reported: the
    median over repeats of both, with the speedup's min and max (the spread). Torch-free: Table 4 renders in the
    plot env.

    Raises:
        ValueError: if a concurrency level, or one of its repeats, has no AR records.
    """
    by = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in records:
        by[r["concurrency"]][r["method_key"]][r.get("repeat") or 0].append(r)
    out = {}
    for c, methods in sorted(by.items()):
        ar_keys = {runtime_of(reps): key for key, reps in methods.items()
                   if next(iter(reps.values()))[0]["method"] == "ar"}
        if not ar_keys:
            raise ValueError(f"no AR run at concurrency {c}")
        ars = {rt: {rep: sum(r["new_tokens"] - 1 for r in rs) / max(rs[0]["batch_decode_seconds"], 1e-9)
                    for rep, rs in methods[key].items()} for rt, key in ar_keys.items()}
        row = {}
        for key, reps in methods.items():
            thr, ratios, rounds, chosen, overhead = [], [], [], [], 0.0
            runtime = runtime_of(reps)
            if runtime not in ars:
                raise ValueError(f"no AR run on runtime {runtime!r} at concurrency {c} (method {key}): a method "
                                 "is paired with AR on its own runtime")
            ar = ars[runtime]
            for rep, rs in sorted(reps.items()):
                if rep not in ar:
                    raise ValueError(f"no AR run at concurrency {c}, repeat {rep} (method {key}, runtime {runtime})")
                t = sum(r["new_tokens"] - 1 for r in rs) / max(rs[0]["batch_decode_seconds"], 1e-9)
                thr.append(t)
                ratios.append(t / ar[rep])
                rounds += [n for r in rs for n in r["accept_lengths"]]
                chosen += rs[0].get("round_block_sizes") or []  # one batch: its records share the rounds
                overhead += rs[0].get("controller_seconds") or 0.0
            first = next(iter(reps.values()))[0]
            row[key] = {"throughput": _median(thr), "speedup": _median(ratios), "speedup_min": min(ratios),
                        "speedup_max": max(ratios), "speedups": ratios, "repeats": len(ratios),
                        "mat": sum(rounds) / max(len(rounds), 1), "block_size": first["block_size"],
                        "kind": first["method"], "runtime": runtime, "throughputs": thr}
            if first["block_size"] == "online":
                row[key].update(bs_mean=sum(chosen) / max(len(chosen), 1),
                                overhead_us=1e6 * overhead / max(len(chosen), 1))
        out[c] = row
    return out


def runtime_of(reps: dict) -> str:
    """The runtime of a method's records (``batched`` / ``sglang`` / ``vllm``; records before the field: batched)."""
    return next(iter(reps.values()))[0].get("runtime") or "batched"


PEER_RUNTIMES = ("vllm",)
"""Runtimes measured beside ours as peers: their rows pair with their own AR and get their own columns."""


def table4_rows(records: list[dict]) -> list[dict]:
    """One row per concurrency: throughput of AR, speedups (medians over repeats, with spread), the selected bs and
    the gain of selection.

    DScout(best) = the DScout bs with the highest median speedup at that c; the gain of selection is
    ``G_best / G_DScout(16) - 1`` (median throughputs); online vs best is the median over repeats of the ratio of
    their throughputs in the same repeat.
    """
    rows = []
    for c, everything in throughput_table(records).items():
        m = {k: v for k, v in everything.items() if v["runtime"] not in PEER_RUNTIMES}
        peer = {k: v for k, v in everything.items() if v["runtime"] in PEER_RUNTIMES}
        dscout = {k: v for k, v in m.items() if v["kind"] == "dscout" and v["block_size"] != "online"}
        best_key = max(dscout, key=lambda k: dscout[k]["speedup"]) if dscout else None
        fixed16 = next((v for v in dscout.values() if v["block_size"] == 16), None)
        ar_key = next(k for k, v in m.items() if v["kind"] == "ar")
        row = {"concurrency": c, "ar_tokens_per_s": m[ar_key]["throughput"], "repeats": m[ar_key]["repeats"]}
        for label, bs, kind in (("dflash16", 16, "dflash"), ("dscout16", 16, "dscout"), ("dscout32", 32, "dscout"),
                                ("eagle3", None, "eagle3")):
            v = next((v for v in m.values() if v["kind"] == kind and (bs is None or v["block_size"] == bs)), None)
            row[f"{label}_speedup"] = v["speedup"] if v else None
            row[f"{label}_mat"] = v["mat"] if v else None
        best = dscout[best_key] if best_key else None
        row["best_bs"] = best["block_size"] if best else None
        row["best_speedup"] = best["speedup"] if best else None
        row["best_speedup_min"] = best["speedup_min"] if best else None
        row["best_speedup_max"] = best["speedup_max"] if best else None
        row["best_mat"] = best["mat"] if best else None
        row["selection_gain"] = best["throughput"] / fixed16["throughput"] - 1 if best and fixed16 else None
        onlines = {k: v for k, v in m.items() if v["block_size"] == "online"}
        for key in sorted(onlines, key=lambda k: (k != "dscout-online", k)) or ["dscout-online"]:
            online, label = onlines.get(key), online_label(key)
            row[f"{label}_speedup"] = online["speedup"] if online else None
            row[f"{label}_speedup_min"] = online["speedup_min"] if online else None
            row[f"{label}_speedup_max"] = online["speedup_max"] if online else None
            row[f"{label}_mat"] = online["mat"] if online else None
            row[f"{label}_bs_mean"] = online["bs_mean"] if online else None
            row[f"{label}_overhead_us_per_round"] = online["overhead_us"] if online else None
            row[f"{label}_vs_best"] = (_median([o / b for o, b in zip(online["speedups"], best["speedups"])]) - 1
                                       if online and best else None)
        row.update(peer_fields(m, peer))
        rows.append(row)
    return rows


def peer_fields(ours: dict, peer: dict) -> dict:
    """vLLM's columns of one concurrency level: its AR throughput, its best DFlash (bs, speedup over its own AR, τ),
    and ``ours_vs_vllm``: the best throughput of our engine's rows (AR included) over the best of vLLM's (AR
    included), medians over repeats; None without vLLM rows."""
    out = {"vllm_ar_tokens_per_s": None, "vllm_best_bs": None, "vllm_best_speedup": None, "vllm_best_mat": None,
           "ours_vs_vllm": None}
    if not peer:
        return out
    ar = next((v for v in peer.values() if v["kind"] == "ar"), None)
    drafts = {k: v for k, v in peer.items() if v["kind"] != "ar"}
    best = max(drafts.values(), key=lambda v: v["speedup"]) if drafts else None
    out.update(vllm_ar_tokens_per_s=ar["throughput"] if ar else None,
               vllm_best_bs=best["block_size"] if best else None, vllm_best_speedup=best["speedup"] if best else None,
               vllm_best_mat=best["mat"] if best else None)
    top_ours = max(v["throughput"] for v in ours.values())
    top_peer = max(v["throughput"] for v in peer.values())
    out["ours_vs_vllm"] = top_ours / top_peer if top_peer > 0 else None
    return out


def online_label(key: str) -> str:
    """Field prefix of an online column: ``online`` for ``dscout-online`` (section ``controller``),
    ``online_<name>`` for ``dscout-online-<name>`` (``serving.online_variants``)."""
    return "online" if key == "dscout-online" else "online_" + key[len("dscout-online-"):]


def _online_labels(rows: list[dict]) -> list[str]:
    """The online columns present in ``rows`` (``online`` first), in their field order."""
    labels = [k[: -len("_speedup")] for k in rows[0] if k.startswith("online") and k.endswith("_speedup")]
    return [l for l in labels if any(r[f"{l}_speedup"] is not None for r in rows)]


def _spread(row: dict, label: str) -> str:
    """``[min, max] `` of a speedup over the repeats (empty for one repeat)."""
    if row.get("repeats", 1) < 2 or row.get(f"{label}_speedup_min") is None:
        return ""
    return f"[{row[f'{label}_speedup_min']:.2f}, {row[f'{label}_speedup_max']:.2f}] "


def _f(x, fmt="{:.2f}"):
    return "–" if x is None else fmt.format(x)


def write_table4(record_paths, out_prefix: str, stage: dict) -> list[dict]:
    """``<prefix>.md``, ``.csv`` (concurrency is a column) and ``.tex``."""
    rows = table4_rows(load_records(record_paths))
    prefix = Path(out_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(prefix.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    eagle3 = any(r["eagle3_speedup"] is not None for r in rows)
    peer = any(r["vllm_ar_tokens_per_s"] is not None for r in rows)
    labels = _online_labels(rows)
    online = bool(labels)

    def name(label: str) -> str:
        return "DScout(online)" if label == "online" else f"DScout(online, {label[len('online_'):]})"

    head = ["c", "AR (tok/s)", *(["EAGLE-3"] if eagle3 else []), "DFlash(16)", "DScout(16)", "DScout(32)",
            "DScout(best)", "best bs", "gain of selection",
            *[h for l in labels for h in (name(l), "mean bs chosen", "online vs best" if l == "online" else f"{l[len('online_'):]} vs best",
                                          "controller µs/round")],
            *(["vLLM AR (tok/s)", "vLLM DFlash(best)", "ours / vLLM"] if peer else [])]
    cells = [[str(r["concurrency"]), _f(r["ar_tokens_per_s"], "{:.1f}"),
              *([f"{_f(r['eagle3_speedup'])}× τ{_f(r['eagle3_mat'])}"] if eagle3 else []),
              f"{_f(r['dflash16_speedup'])}× τ{_f(r['dflash16_mat'])}",
              f"{_f(r['dscout16_speedup'])}× τ{_f(r['dscout16_mat'])}",
              f"{_f(r['dscout32_speedup'])}× τ{_f(r['dscout32_mat'])}",
              f"{_f(r['best_speedup'])}× {_spread(r, 'best')}τ{_f(r['best_mat'])}", str(r["best_bs"]),
              _f(None if r["selection_gain"] is None else 100 * r["selection_gain"], "{:+.1f}%"),
              *[cell for l in labels for cell in (
                  f"{_f(r[f'{l}_speedup'])}× {_spread(r, l)}τ{_f(r[f'{l}_mat'])}",
                  _f(r[f"{l}_bs_mean"], "{:.1f}"),
                  _f(None if r[f"{l}_vs_best"] is None else 100 * r[f"{l}_vs_best"], "{:+.1f}%"),
                  _f(r[f"{l}_overhead_us_per_round"], "{:.0f}"))],
              *([_f(r["vllm_ar_tokens_per_s"], "{:.1f}"),
                 f"{_f(r['vllm_best_speedup'])}× τ{_f(r['vllm_best_mat'])} (bs {r['vllm_best_bs']})",
                 f"{_f(r['ours_vs_vllm'])}×"] if peer else [])] for r in rows]
    if stage.get("backend") == "sglang":
        how = ("SGLang servers, one per method on loopback: AR, EAGLE-3 (EAGLE3), DFlash and DScout (DFLASH), "
               "closed-loop client with c requests in flight")
    else:
        how = "CPU, this project's batched engine: the c requests of each level decoded together"
    caption = (f"Measured on {stage.get('target', 'the target')} ({how}; greedy, {stage.get('max_new_tokens', '?')} "
               f"new tokens each, prompts pooled from {', '.join(stage.get('benchmarks', []))}). Speedup = method "
               "throughput / AR throughput at the same c and repeat, the median over "
               f"{rows[0].get('repeats', 1)} repeat(s), [min, max] where there are several; DScout(best) picks bs per c from the measured throughput; "
               "computed from results/serving/ records. PARD-2 is not in this table: SGLang has no PARD algorithm "
               "(vLLM serves PARD through its parallel-drafting path, which this workflow does not run); its "
               "single-request speed is in Table 3."
               + (" DScout(online): the online block-size controller picks one bs per batch round from the batch's "
                  "recent acceptance and a latency model calibrated at start-up (docs/online_controller.md)"
                  + (f", having first served {stage['online_warmup']} untimed batch(es) of c requests from beyond the "
                     "measured pool, whose rounds it learned from (a serving system's controller has served earlier "
                     "traffic)" if stage.get("online_warmup") else ", from a cold start (calibration and prior only)")
                  + "; 'online vs best' compares it with the offline per-c choice, picked after the fact."
                  + (" DScout(online, <name>): the same controller with the settings of serving.online_variants "
                     "<name>, in the same job." if any(l != "online" for l in labels) else "")
                  if online else "")
               + (" vLLM: AR and DFlash served by vLLM (its CPU build here) on the same prompts, levels and repeats, "
                  "one server per method on loopback; DFlash(best) is its best bs per c, its speedup over vLLM's own "
                  "AR (each runtime is paired with its own AR); throughput over the decode window (prefill "
                  "excluded, as for our engine); 'ours / vLLM' = our best row's throughput over vLLM's best row's "
                  "(AR included on both sides)." if peer else ""))
    md = ["# Table 4 — serving throughput at concurrency c", "", caption, "",
          "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(c) + " |" for c in cells]
    md += ["", f"Paper (reported, SGLang on H200): DScout(best) speedups {paper.TABLE4['DScout(best) range'][0]}–"
               f"{paper.TABLE4['DScout(best) range'][1]}×, above DFlash in every setting; configuration selection adds up "
               f"to +{100 * paper.TABLE4['selection gain over DScout(16)']:.2f}% over fixed DScout(16)."]
    prefix.with_suffix(".md").write_text("\n".join(md) + "\n")
    tex = ["\\begin{table}[t]", "\\centering", "\\begin{tabular}{l" + "c" * (len(head) - 1) + "}", "\\toprule",
           " & ".join(head).replace("%", "\\%") + " \\\\", "\\midrule"]
    tex += [" & ".join(c).replace("×", "$\\times$").replace("τ", "$\\tau$").replace("%", "\\%") + " \\\\"
            for c in cells]
    tex += ["\\bottomrule", "\\end{tabular}", f"\\caption{{{caption}}}", "\\label{tab:table4}", "\\end{table}"]
    prefix.with_suffix(".tex").write_text("\n".join(tex) + "\n")
    return rows
