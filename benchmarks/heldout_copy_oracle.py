"""How easy are a set of held-out responses to draft, without a drafter? A prompt-lookup oracle per response.

For every response anchor: the longest prefix (at most 15 tokens) of what follows that also followed an earlier
occurrence of the anchor's last 2 tokens in the context (prompt + response so far); τ(16) = 1 + its mean over the
anchors (the every-anchor mean of docs/findings.md). Also the share of response 4-grams seen earlier. Compares the
drafter-efficiency study's held-out rows (the last of the responses file) with the findings stage's seeded draw
(reports/drafter_efficiency/findings.md).

    python benchmarks/heldout_copy_oracle.py results/responses/<id>/responses.jsonl
"""
import json
import statistics as st
import sys

from dscout.data.responses import training_sequences
from dscout.training.holdout import holdout_split

if len(sys.argv) != 2:
    sys.exit(__doc__)
rows = [json.loads(l) for l in open(sys.argv[1])]
seqs = training_sequences(rows, 448, 16)
n = len(seqs)

def copy_tau(ids, start, B=16, ng=2):
    pref = []
    for a in range(start, len(ids)):
        best = 0
        key = tuple(ids[a - ng + 1:a + 1])
        for j in range(ng - 1, a):
            if tuple(ids[j - ng + 1:j + 1]) == key:
                L = 0
                while L < B - 1 and a + 1 + L < len(ids) and ids[j + 1 + L] == ids[a + 1 + L]:
                    L += 1
                best = max(best, L)
        pref.append(best)
    return 1 + st.mean(pref), len(pref)

def rep4(ids, start):
    seen, rep, tot = set(), 0, 0
    for i in range(len(ids) - 3):
        g = tuple(ids[i:i + 4])
        if i >= start:
            tot += 1; rep += g in seen
        seen.add(g)
    return rep / max(tot, 1)

per = []
for s in seqs:
    start = s["loss_mask"].index(1)
    t, k = copy_tau(s["input_ids"], start)
    per.append((s["id"], t, k, rep4(s["input_ids"], start)))

def summary(name, idx):
    t = [per[i][1] for i in idx]; w = [per[i][2] for i in idx]; r = [per[i][3] for i in idx]
    anchor_mean = sum(a * b for a, b in zip(t, w)) / sum(w)
    print(f"{name:45s} n={len(idx):3d} anchors={sum(w):5d} copy-tau16 every-anchor {anchor_mean:.2f}  "
          f"median-seq {st.median(t):.2f}  max {max(t):.2f}  repeated-4gram share {st.mean(r):.2f}")

_, held = holdout_split(n, 32, 0)
summary("efficiency study: last 16 (evaluated)", list(range(n - 24, n))[:16])
summary("efficiency study: last 24 (held out)", list(range(n - 24, n)))
summary("findings: seeded 32 (held out)", held)
for src in ["gsm8k_train", "alpaca_gpt4_demo", "code_alpaca"]:
    summary(f"findings held-out, {src}", [i for i in held if per[i][0].startswith(src)])
    summary(f"all {src}", [i for i in range(n) if per[i][0].startswith(src)])
print("order of sources:", [per[i][0].rsplit('-', 1)[0] for i in (0, n // 2, n - 1)], "n =", n)
print("last 16:", [(per[i][0], round(per[i][1], 2)) for i in list(range(n - 24, n))[:16]])
