"""Training start-up on a 1.4M-row responses file: the JSONL parsed into lists (before) against the packed,
memory-mapped copy (after, :mod:`dscout.data.packed`), and the resume scan of response regeneration.

Writes a synthetic responses JSONL (``--rows`` rows, prompt and response lengths drawn uniformly from the given
ranges, ids ``src-<i>``) in a temporary folder (deleted afterwards, never committed), packs it once (what the
``generate_responses`` job does at its end) and then measures, each in a fresh Python process (one rank's
start-up), wall time and peak resident memory (``VmHWM``; ``RssAnon`` = the process's own memory, ``RssFile`` = pages
of mapped files, shared by every rank of a node through the page cache):

* ``open``: the training sequences ready (``max_length``/``min_response_tokens`` applied) and the first
  micro-batch's rows read;
* ``open + mask count``: the same plus rank 0's count of the mask token over every sequence (the trainer's
  start-up warning);
* ``resume scan``: the ids of the rows already written (before: every row parsed and the file rewritten).

Usage: ``python benchmarks/responses_startup.py --rows 1400000 --out reports/responses_startup/report.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PHASES = {
    "baseline: python + torch imported": "pass",
    "before: open": """
from dscout.data.responses import training_sequences
from dscout.jsonl import read_jsonl
seqs = training_sequences(read_jsonl(PATH), MAXLEN, MINRESP)
first = [seqs[i]["input_ids"] for i in range(4)]
""",
    "after: open": """
from dscout.data.packed import load_training_sequences
seqs = load_training_sequences(PATH, MAXLEN, MINRESP)
first = [seqs.arrays(i)[0] for i in range(4)]
""",
    "before: open + mask count": """
from dscout.data.responses import training_sequences
from dscout.jsonl import read_jsonl
from dscout.training.trainer import _OnlineSource, count_token
seqs = training_sequences(read_jsonl(PATH), MAXLEN, MINRESP)
hits = count_token(_OnlineSource(None, seqs, [0]), 3)
""",
    "after: open + mask count": """
from dscout.data.packed import load_training_sequences
from dscout.training.trainer import _OnlineSource, count_token
seqs = load_training_sequences(PATH, MAXLEN, MINRESP)
hits = count_token(_OnlineSource(None, seqs, [0]), 3)
""",
    "before: resume scan": """
from dscout.jsonl import read_jsonl, write_jsonl
done = {r["id"] for r in read_jsonl(PATH)}
write_jsonl(read_jsonl(PATH), PATH)
""",
    "after: resume scan": """
from dscout.jsonl import scan_ids
done = scan_ids(PATH)
""",
}

PROBE = """
import time, sys
import torch  # a rank has torch loaded before it reads data: both paths start from here
t0 = time.perf_counter()
PATH, MAXLEN, MINRESP = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
{body}
seconds = time.perf_counter() - t0
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
kb = lambda k: int(status[k].split()[0])
import json
print(json.dumps({{"seconds": seconds, "peak_mb": kb("VmHWM") / 1024, "anon_mb": kb("RssAnon") / 1024,
                   "file_mb": kb("RssFile") / 1024}}))
"""


def write_synthetic(path: Path, rows: int, prompt: tuple[int, int], response: tuple[int, int], seed: int) -> int:
    """Write ``rows`` response rows (the :mod:`dscout.data.responses` format); returns the token count."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = 0
    with open(path, "w") as f:
        for start in range(0, rows, 10_000):
            m = min(10_000, rows - start)
            pl = rng.integers(prompt[0], prompt[1] + 1, m)
            rl = rng.integers(response[0], response[1] + 1, m)
            flat = rng.integers(0, 151_000, int(pl.sum() + rl.sum())).tolist()
            k = 0
            for j in range(m):
                p, r = flat[k:k + pl[j]], flat[k + pl[j]:k + pl[j] + rl[j]]
                k += pl[j] + rl[j]
                f.write(json.dumps({"id": f"src-{start + j}", "source": "src", "prompt": "q", "prompt_ids": p,
                                    "response_ids": r, "response": "a", "finish_reason": "stop"}) + "\n")
            tokens += int(pl.sum() + rl.sum())
    return tokens


def probe(body: str, path: Path, max_length: int, min_resp: int) -> dict:
    """Run ``body`` in a fresh interpreter; its wall time and memory (see the module docstring)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run([sys.executable, "-c", PROBE.format(body=body), str(path), str(max_length), str(min_resp)],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_400_000)
    ap.add_argument("--prompt-tokens", type=int, nargs=2, default=[8, 24], metavar=("MIN", "MAX"))
    ap.add_argument("--response-tokens", type=int, nargs=2, default=[16, 48], metavar=("MIN", "MAX"))
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--min-response-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tmp", default=None, help="folder for the synthetic file (default: a system temp folder)")
    ap.add_argument("--out", default=str(ROOT / "reports" / "responses_startup" / "report.md"),
                    help="report.md path ('' = print only)")
    a = ap.parse_args()
    t_all = time.perf_counter()
    sys.path.insert(0, str(ROOT / "src"))
    from dscout.data.packed import pack_responses

    tmp = Path(tempfile.mkdtemp(prefix="responses-startup-", dir=a.tmp))
    try:
        path = tmp / "responses.jsonl"
        t0 = time.perf_counter()
        tokens = write_synthetic(path, a.rows, tuple(a.prompt_tokens), tuple(a.response_tokens), a.seed)
        write_s = time.perf_counter() - t0
        size_mb = path.stat().st_size / 2**20
        pack = probe(f"from dscout.data.packed import pack_responses\npack_responses(PATH)", path, 0, 0)
        packed_mb = sum(f.stat().st_size for f in (tmp / "packed").iterdir()) / 2**20
        results = {name: probe(body, path, a.max_length, a.min_response_tokens) for name, body in PHASES.items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - t_all
    from dscout.provenance import report_header

    lines = report_header(
        "Training start-up on a 1.4M-row responses file: JSONL lists (before) vs packed memory-mapped (after)",
        "python benchmarks/responses_startup.py " + shlex.join(sys.argv[1:]), wall,
        "(shared with other jobs: times are indicative)") + [
        f"Input: {a.rows:,} synthetic rows, {tokens:,} tokens (prompt {a.prompt_tokens[0]}-{a.prompt_tokens[1]}, "
        f"response {a.response_tokens[0]}-{a.response_tokens[1]} tokens per row, uniform), JSONL {size_mb:,.0f} MiB "
        f"(written in {write_s:.0f} s); max_length {a.max_length}, min_response_tokens {a.min_response_tokens}. "
        f"Packed once (the generate_responses job's last step): {pack['seconds']:.0f} s, peak RSS "
        f"{pack['peak_mb']:,.0f} MiB, {packed_mb:,.0f} MiB of files.",
        "",
        "Each row is one fresh process (one rank's start-up) with torch imported before the clock starts (the "
        "baseline row: what every rank holds anyway). Peak = VmHWM; anon = the process's own memory at the end; "
        "file = mapped file pages at the end (page cache, shared by the ranks of a node).",
        "",
        "| phase | seconds | peak RSS MiB | anon MiB | file MiB |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(f"| {name} | {r['seconds']:.1f} | {r['peak_mb']:,.0f} | {r['anon_mb']:,.0f} | "
                     f"{r['file_mb']:,.0f} |")
    before, after = results["before: open"], results["after: open"]
    per_token_kb = (before["peak_mb"] - after["peak_mb"]) * 1024 / tokens
    lines += ["", f"Before, a rank holds about {per_token_kb * 1024:.0f} bytes per token as Python objects: at the "
              f"paper's ~1.4B tokens that is ~{per_token_kb * 1.4e9 / 2**20:,.0f} GiB per rank (x 8 ranks), "
              "against a start-up that maps the same files in every rank after."]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
