"""Teacher-forced accept lengths of the findings stage: every anchor of a target-generated sequence, and the rounds
that greedy decoding would run over it.

**Why teacher forcing gives greedy decoding's accept lengths.** Take a sequence whose response is the target's own
greedy continuation of its prompt (regenerated responses, or AR outputs of benchmark prompts). In greedy
speculative decoding the committed text *is* that continuation (output = AR), so when a draft round starts after
response token ``a`` (the anchor) the drafter sees exactly the target's taps of ``prompt + response[:a+1]`` and
drafts a fully masked block after ``response[a]``; verification accepts the longest prefix of drafts equal to
``response[a+1:]``. Teacher forcing builds the same block at every anchor from one target forward over the whole
sequence, so the accepted length at anchor ``a`` is

    L(a) = min(1 + min(prefix(a), bs - 1), end - a),

``prefix(a)`` the number of leading drafted offsets equal to the response, ``end`` the index of the last response
token (the ``end - a`` cap is the engine's cut at the stop token / the last allowed token). Decoding visits the
anchors ``a_0 = 0, a_{i+1} = a_i + L(a_i)`` (:func:`decode_walk`): its rounds are these ``L`` values, one per
visited anchor. Two things differ from a live engine, both outside the compared rounds: the engine drafts a shorter
block when fewer than ``bs - 1`` tokens of its ``max_new_tokens`` remain (we keep full blocks), and its target taps
come from the incremental KV cache instead of one forward (float rounding; a draft that flips on it is a near-tie).
:func:`decode_check` runs the live engine beside it and compares the rounds (``tests/test_findings.py`` too).

MAT over *every* anchor (``mean L(a)``) is not decoding's MAT: decoding crosses an easy stretch in a few rounds
while every anchor of it counts once, so that mean overstates MAT (an arithmetic instead of a harmonic mean over
positions). The findings use the walk's tokens / rounds (:mod:`dscout.analysis.findings`) and list the other mean
beside it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..analysis.walk import decode_walk
from ..training.blocks import block_attention_mask, build_blocks


def accept_lengths(prefix: torch.Tensor, bs: int) -> list[int]:
    """``L(a)`` of every anchor of one sequence from its correct-prefix lengths.

    Args:
        prefix: ``[n]`` int, leading correct drafted offsets at anchors ``a = 0 .. n - 1`` (anchor ``a`` = response
            token ``a``; ``n`` = response tokens - 1, so ``end = n``).
        bs: inference block size (tokens verified per round, the anchor included).
    Returns:
        ``[L(0), ..., L(n - 1)]``, each in ``[1, bs]`` (tokens committed per round, bonus included).
    """
    n = int(prefix.numel())
    room = torch.arange(n, 0, -1)  # end - a
    return torch.minimum(1 + prefix.clamp(max=bs - 1), room).tolist()


@torch.no_grad()
def correct_prefixes(drafter, input_ids: list[int], loss_mask: list[int], taps: torch.Tensor, block_size: int,
                     anchors_per_pass: int = 16) -> torch.Tensor:
    """Leading correct drafted offsets of a fully masked block of ``block_size`` at every response anchor.

    Args:
        drafter: a :class:`~dscout.models.drafter.DFlashDrafter` (its target attached: embeddings, head).
        input_ids, loss_mask: one sequence (prompt + response; mask 1 on the response, contiguous at the end).
        taps: ``[1, S, t * D]`` the target's taps of the drafter's layers over the sequence (float).
        block_size: bs of the drafted blocks (at most the drafter's trained horizon).
        anchors_per_pass: anchors drafted per drafter forward (memory: the pass attends over its own blocks).
    Returns:
        ``[n]`` int64: ``prefix(a)`` for the anchors ``a = 0 .. n - 1`` (response token ``a``), ``n`` = response
        tokens - 1. Offsets past the sequence end count as wrong.
    Raises:
        ValueError: if ``block_size`` exceeds the drafter's horizon or the response is not contiguous at the end.
    """
    if block_size > drafter.config.block_size:
        raise ValueError(f"block_size {block_size} exceeds the drafter's horizon {drafter.config.block_size}")
    mask = torch.tensor(loss_mask, dtype=torch.long)
    p = int((mask == 0).sum())
    if not (bool((mask[p:] == 1).all()) and bool((mask[:p] == 0).all())):
        raise ValueError("the loss mask must be 0 on the prompt and 1 on the response (contiguous at the end)")
    ids = torch.tensor(input_ids, dtype=torch.long).unsqueeze(0)
    S = ids.shape[1]
    dev = drafter.fc.weight.device
    all_anchors = torch.arange(p, S - 1)
    out = []
    was_training = drafter.training
    drafter.eval()
    for chunk in all_anchors.split(anchors_per_pass):
        anchors = chunk.unsqueeze(0)
        keep = torch.ones_like(anchors, dtype=torch.bool)
        blocks = build_blocks(ids, mask.unsqueeze(0), anchors, keep, block_size, drafter.config.mask_token_id, None)
        N = anchors.shape[1]
        attn = block_attention_mask(anchors, keep, S, block_size).to(dev)
        hidden = drafter(blocks.block_ids.view(1, N * block_size).to(dev),
                         blocks.positions.view(1, N * block_size).to(dev), context_taps=taps.to(dev),
                         context_positions=torch.arange(S, device=dev).unsqueeze(0), attention_mask=attn)
        hidden = hidden.view(1, N, block_size, -1)[:, :, 1:]
        pred = drafter.to_target_ids(drafter.compute_logits(hidden).argmax(-1))
        ok = (pred == blocks.labels[:, :, 1:].to(dev)) & blocks.label_mask[:, :, 1:].to(dev)
        out.append(torch.cumprod(ok[0].int(), dim=1).sum(1).cpu())
    drafter.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def sequence_taps(target, input_ids: list[int], layer_ids: list[int]) -> torch.Tensor:
    """``[1, S, t * D]`` float32 taps of ``layer_ids`` from one target forward over the sequence."""
    from ..training.features import online_batch

    b = online_batch(target, [{"input_ids": input_ids, "loss_mask": [0] * len(input_ids)}], layer_ids)
    return b.taps.float()


def evaluate_drafter(target, drafter, sequences: list[dict], block_sizes: list[int], out_path: str | os.PathLike,
                     meta: dict | None = None, progress: bool = True, taps: dict | None = None) -> Path:
    """Write one record per (sequence, bs): the accepted length at every anchor (resumable JSONL).

    Args:
        sequences: ``[{"set", "source", "id", "input_ids", "loss_mask"}]`` (``set``: ``heldout`` | ``bench``).
        block_sizes: the bs values to evaluate (each its own full block).
        out_path: JSONL; rows already there (same set, id, bs) are kept and skipped, so a killed job resumes.
        meta: fields copied into every row (drafter name, recipe).
        taps: ``str(sequence id)`` -> ``[S, t * D]`` taps of the drafter's layers (:func:`load_sequence_taps`), shared
            by the stage's drafters; None (or an id missing) = one target forward per sequence here.
    Returns:
        ``out_path``. Row: ``{**meta, "set", "source", "id", "bs", "accept": [L(0), ...]}``.
    Raises:
        ValueError: if a stored taps tensor does not have one row per token of its sequence.
    """
    from tqdm import tqdm

    from ..jsonl import read_jsonl

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out_path.exists():
        rows = [r for r in read_jsonl(out_path) if "accept" in r]  # drops a torn last line
        done = {(r["set"], r["id"], r["bs"]) for r in rows}
        out_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    layer_ids = list(drafter.config.target_layer_ids)
    todo = [s for s in sequences if any((s["set"], s["id"], bs) not in done for bs in block_sizes)]
    with open(out_path, "a") as f:
        for s in tqdm(todo, desc="teacher-forced anchors", unit="seq", disable=not progress, mininterval=5.0):
            if taps is not None and str(s["id"]) in taps:
                seq_taps = taps[str(s["id"])].unsqueeze(0)
                if seq_taps.shape[1] != len(s["input_ids"]):
                    raise ValueError(f"stored taps of sequence {s['id']!r} have {seq_taps.shape[1]} rows for "
                                     f"{len(s['input_ids'])} tokens: the taps file is not of these sequences")
            else:
                seq_taps = sequence_taps(target, s["input_ids"], layer_ids)
            for bs in block_sizes:
                if (s["set"], s["id"], bs) in done:
                    continue
                prefix = correct_prefixes(drafter, s["input_ids"], s["loss_mask"], seq_taps, bs)
                row = {**(meta or {}), "set": s["set"], "source": s["source"], "id": s["id"], "bs": bs,
                       "accept": accept_lengths(prefix, bs)}
                f.write(json.dumps(row) + "\n")
            f.flush()
    return out_path


def decode_check(target, drafter, prompt_ids: list[int], bs: int, max_new_tokens: int, stop_token_ids=()) -> dict:
    """Live greedy decoding against the teacher-forced walk on one prompt.

    Decodes AR (the engine without a proposer) and with the drafter at ``bs``; teacher-forces the drafter on
    prompt + AR output; compares the engine's rounds with :func:`decode_walk` over every round that drafted a full
    block (the engine shortens the block once fewer than ``bs - 1`` of ``max_new_tokens`` remain).

    Returns:
        ``{"bs", "output_equal", "engine_rounds", "walk_rounds", "compared", "equal"}``: ``compared`` rounds were
        checked, ``equal`` says whether they all agree.
    """
    from ..decoding.engine import SpeculativeEngine
    from ..decoding.proposers import BlockDiffusionProposer

    ar = SpeculativeEngine(target, None, stop_token_ids).generate(prompt_ids, max_new_tokens)
    spec = SpeculativeEngine(target, BlockDiffusionProposer(drafter), stop_token_ids).generate(
        prompt_ids, max_new_tokens, block_size=bs)
    ids = list(prompt_ids) + list(ar.output_ids)
    mask = [0] * len(prompt_ids) + [1] * len(ar.output_ids)
    taps = sequence_taps(target, ids, list(drafter.config.target_layer_ids))
    walk = decode_walk(accept_lengths(correct_prefixes(drafter, ids, mask, taps, bs), bs))
    compared, a = 0, 0
    for e, w in zip(spec.accept_lengths, walk):
        if max_new_tokens - (a + 1) < bs - 1:  # the engine's tail block is shorter than bs
            break
        if e != w:
            break
        compared += 1
        a += e
    full = sum(1 for i in range(len(walk)) if max_new_tokens - (sum(walk[:i]) + 1) >= bs - 1)
    return {"bs": bs, "output_equal": list(spec.output_ids) == list(ar.output_ids),
            "engine_rounds": list(spec.accept_lengths), "walk_rounds": walk, "compared": compared,
            "full_block_rounds": full, "equal": compared == full and list(spec.output_ids) == list(ar.output_ids)}


def write_sequence_taps(target, sequences: list[dict], layer_ids: list[int], path: str | os.PathLike,
                        progress: bool = True) -> Path:
    """The taps of every evaluated sequence, computed once for all of the stage's drafters (safetensors).

    :func:`evaluate_drafter` needs the target's taps of each sequence; the stage's drafters share their layers,
    so one job computes them (:func:`sequence_taps`, float32: the same tensors each evaluation computed itself)
    and every evaluation loads them (:func:`load_sequence_taps`) instead of running the target again.

    Args:
        sequences: ``[{"id", "input_ids", ...}]``, ids unique.
        layer_ids: the tapped target layers (stored in the file's metadata).
        path: the ``.safetensors`` file, written atomically.
    Returns:
        ``path``; tensor ``str(id)`` = ``[S, t * D]`` float32.
    Raises:
        ValueError: if two sequences share an id.
    """
    from safetensors.torch import save_file
    from tqdm import tqdm

    ids = [str(s["id"]) for s in sequences]
    if len(set(ids)) != len(ids):
        raise ValueError(f"sequence ids repeat: {sorted({i for i in ids if ids.count(i) > 1})[:5]}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {str(s["id"]): sequence_taps(target, s["input_ids"], layer_ids)[0].contiguous()
               for s in tqdm(sequences, desc="evaluation taps", unit="seq", disable=not progress, mininterval=5.0)}
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"layer_ids": json.dumps(list(layer_ids))})
    os.replace(tmp, path)
    return path


def load_sequence_taps(path: str | os.PathLike, layer_ids: list[int]) -> dict[str, torch.Tensor]:
    """Taps written by :func:`write_sequence_taps`, checked against the drafter's layers.

    Raises:
        ValueError: naming the file, if its layers are not ``layer_ids``.
    """
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as f:
        stored = json.loads((f.metadata() or {}).get("layer_ids", "null"))
    if stored != list(layer_ids):
        raise ValueError(f"{path}: taps of target layers {stored}, the drafter reads layers {list(layer_ids)}")
    return load_file(str(path))


def findings_items(stage: dict, responses: str | os.PathLike, responses_stage: dict,
                   bench_outputs: str | os.PathLike) -> list[dict]:
    """The findings stage's evaluated sequences: the held-out responses (``stage["holdout"]``,
    :func:`dscout.training.holdout.holdout_split`), then the benchmark prompts' AR outputs.

    Args:
        stage: :func:`dscout.config.findings_stage`.
        responses: the regenerated responses (JSONL; its packed copy is memory-mapped).
        responses_stage: their training slice (``max_length``, ``min_response_tokens``: the ``--responses-stage``
            of the rules).
        bench_outputs: the ``findings-outputs`` job's JSONL.
    Returns:
        dicts with ``set`` (``heldout`` / ``bench``), ``source``, ``id``, ``input_ids``, ``loss_mask``.
    """
    from ..data.packed import load_training_sequences
    from ..data.responses import training_sequences
    from ..jsonl import read_jsonl
    from ..training.holdout import holdout_split

    r = responses_stage
    seqs = load_training_sequences(responses, max_length=r["max_length"], min_response_tokens=r["min_response_tokens"])
    _, held = holdout_split(len(seqs), stage["holdout"])
    items = [{"set": "heldout", "source": seqs[i]["id"].rsplit("-", 1)[0], **seqs[i]} for i in held]
    bench_rows = {row["id"]: row for row in read_jsonl(bench_outputs)}
    for s in training_sequences(list(bench_rows.values()), max_length=1 << 30, min_response_tokens=2):
        items.append({"set": "bench", "source": bench_rows[s["id"]]["source"], **s})
    return items


def run_findings_eval_job(stage: dict, name: str, *, target_dir: str, drafter_dir: str, responses: str,
                          responses_stage: dict, bench_outputs: str, out: str | os.PathLike,
                          taps: str | None = None) -> None:
    """One ``findings_eval`` job: teacher-forced accept lengths of findings drafter ``name`` on
    :func:`findings_items` (:func:`evaluate_drafter`), the live-decoding check on the first
    ``stage["decode_check_prompts"]`` of them (:func:`decode_check`, 64 new tokens at the largest bs) and one
    ``training`` row from its ``training_summary.json``; ``out`` (JSONL) is written last, and a partial file beside
    it (``.partial.jsonl``) resumes a killed job.

    Args:
        stage: :func:`dscout.config.findings_stage`; ``name`` a key of its ``drafters``.
        target_dir: the prepared target (``target.json``).
        drafter_dir: the trained drafter's folder.
        taps: the stage's evaluation taps (:func:`write_sequence_taps`); None = computed here.
    """
    from ..jsonl import read_jsonl
    from ..models.export import drafter_for_target
    from ..models.target import load_prepared_target, stop_token_ids

    st = stage
    plan = st["drafters"][name]
    target = load_prepared_target(target_dir)
    items = findings_items(st, responses, responses_stage, bench_outputs)
    drafter = drafter_for_target(drafter_dir, target)
    summary = json.loads((Path(drafter_dir) / "training_summary.json").read_text())
    out = Path(out)
    partial = out.with_suffix(".partial.jsonl")
    meta = {"drafter": name, "recipe": plan["recipe"], "drafter_id": plan["id"]}
    taps = load_sequence_taps(taps, list(drafter.config.target_layer_ids)) if taps else None
    evaluate_drafter(target, drafter, items, plan["block_sizes"], partial, meta=meta, taps=taps)
    checks = []
    stops = stop_token_ids(target, st["chat"]["stop_tokens"] or [])
    for s in items[: st["decode_check_prompts"]]:
        prompt = s["input_ids"][: len(s["input_ids"]) - sum(s["loss_mask"])]
        checks.append({**meta, "set": "decode_check", "id": s["id"],
                       **decode_check(target, drafter, prompt, max(plan["block_sizes"]), 64, stops)})
    rows = list(read_jsonl(partial)) + checks
    rows.append({**meta, "set": "training", "steps": summary["steps"], "train_seconds": summary["train_seconds"],
                 "num_sequences": summary["num_sequences"]})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    partial.unlink()
