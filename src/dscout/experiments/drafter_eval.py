"""Held-out drafter quality without decoding: per-offset top-1 accuracy and the greedy τ it implies.

Every response position of a held-out sequence anchors one fully masked block of ``B`` tokens, exactly as a draft
round sees it (context = the target's taps strictly before the anchor, the anchor token, ``B - 1`` masks). Offset
``k``'s draft is correct when the drafter's argmax equals the target's greedy token there. Because the responses
are the target's own greedy continuations, the longest correct prefix of a block is what greedy verification
would accept from that anchor, so ``τ(bs) = 1 + E[min(prefix, bs - 1)]`` is the greedy τ of block size ``bs``
averaged over anchor positions (the engine visits only the anchors its own rounds land on; the two agree up to
that sampling). Blocks that run past the end of a response count the missing offsets as rejections.

:func:`teacher_forced_on_bench_records` does the same on a Table 3 run's own prompts and AR outputs, the measure
that follows benchmark prompts rather than the training distribution. Used by ``benchmarks/drafter_efficiency.py``
to compare training levers at equal CPU time without timing noise.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..training.blocks import block_attention_mask, build_blocks, sample_anchors


@torch.no_grad()
def offset_correctness(drafter, source, indices: list[int], block_size: int = 16,
                       dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Correctness of every fully masked block anchored on every response position of ``indices``.

    Args:
        drafter: a :class:`~dscout.models.drafter.DFlashDrafter` with its target attached.
        source: a training source (:class:`~dscout.training.features.FeatureCache`; ``len``, ``batch``).
        indices: the held-out sequence indices of ``source``.
        block_size: B of the evaluated blocks (at most the drafter's trained horizon).
        dtype: feature dtype handed to the drafter.
    Returns:
        ``[n_blocks, B - 1]`` bool: offset ``k = 1 .. B - 1`` drafted correctly (False past the sequence end).
    Raises:
        ValueError: if ``block_size`` exceeds the drafter's horizon.
    """
    if block_size > drafter.config.block_size:
        raise ValueError(f"block_size {block_size} exceeds the drafter's horizon {drafter.config.block_size}")
    was_training = drafter.training
    drafter.eval()
    rows = []
    gen = torch.Generator().manual_seed(0)  # anchor order only; every candidate is taken
    dev = drafter.fc.weight.device
    for i in indices:
        batch = source.batch([i], dtype, dev)
        anchors, keep = sample_anchors(batch.loss_mask, 1 << 20, gen)
        blocks = build_blocks(batch.input_ids, batch.loss_mask, anchors, keep, block_size,
                              drafter.config.mask_token_id, None)
        S = batch.input_ids.shape[1]
        b, N = anchors.shape
        mask = block_attention_mask(anchors, keep, S, block_size).to(dev)
        hidden = drafter(blocks.block_ids.view(b, N * block_size).to(dev),
                         blocks.positions.view(b, N * block_size).to(dev), context_taps=batch.taps,
                         context_positions=torch.arange(S, device=dev).expand(b, S), attention_mask=mask)
        hidden = hidden.view(b, N, block_size, -1)[:, :, 1:]
        pred = drafter.to_target_ids(drafter.compute_logits(hidden).argmax(-1))
        ok = (pred == blocks.labels[:, :, 1:].to(dev)) & blocks.label_mask[:, :, 1:].to(dev)
        rows.append(ok[keep.to(dev)].cpu())
    drafter.train(was_training)
    return torch.cat(rows) if rows else torch.zeros(0, block_size - 1, dtype=torch.bool)


def accuracy_and_tau(correct: torch.Tensor, block_sizes=(4, 8, 16)) -> dict:
    """Summaries of :func:`offset_correctness`: per-offset accuracy, and greedy τ per block size.

    Returns:
        ``{"offset_accuracy": [acc_1, ..., acc_{B-1}], "tau": {bs: τ}, "blocks": n}``.
    """
    acc = correct.float().mean(0).tolist() if len(correct) else []
    prefix = torch.cumprod(correct.int(), dim=1).sum(1)  # longest correct prefix per block
    taus = {int(bs): float(1 + prefix.clamp(max=bs - 1).float().mean()) for bs in block_sizes
            if bs - 1 <= correct.shape[1]}
    return {"offset_accuracy": acc, "tau": taus, "blocks": int(len(correct))}


class _OnlineSource:
    """The :func:`offset_correctness` source protocol over sequences whose taps the target computes on demand."""

    def __init__(self, target, sequences: list[dict], layer_ids: list[int]):
        self.target, self.sequences, self.layer_ids = target, sequences, layer_ids

    def batch(self, indices: list[int], dtype: torch.dtype, device):
        from ..training.features import online_batch

        b = online_batch(self.target, [self.sequences[i] for i in indices], self.layer_ids)
        b.taps = b.taps.to(device, dtype)
        return b


def bench_record_sequences(target, bench_dir, data_root) -> dict[str, list[dict]]:
    """Prompt + AR output of every temperature-0 prompt (and turn) of a benchmark run, as training-style sequences.

    ``bench_dir`` is ``results/bench/<id>``: each ``<benchmark>/t0`` gives the prompts (``r0/config.resolved.json``:
    counts, seed, chat settings) and ``r0/ar.jsonl`` the AR outputs. A later turn sees the earlier turns' decoded
    answers, as in :func:`dscout.evaluation.runner.run_benchmark`.

    Returns:
        ``{benchmark: [{"input_ids": prompt + output, "loss_mask": 0 on the prompt, 1 on the output}]}``.
    Raises:
        ValueError: a rebuilt prompt whose length differs from its record's ``prompt_tokens`` (names the file,
            prompt and turn), or a run without temperature-0 records.
    """
    from ..data.benchmarks import stage_prompts
    from ..data.prompts import chat_prompt_ids

    tok = target.tokenizer
    out = {}
    for t0 in sorted(Path(bench_dir).glob("*/t0")):
        resolved = t0 / "r0" / "config.resolved.json"  # one job per repeat; older runs kept it in t0/
        resolved = resolved if resolved.exists() else t0 / "config.resolved.json"
        stage = json.loads(resolved.read_text())["stage_config"]
        bench, b, chat = t0.parent.name, stage["benchmarks"], stage["chat"]
        prompts = stage_prompts(b, bench, data_root)
        path = t0 / "r0" / "ar.jsonl"
        recs = {(r["prompt_id"], r["turn"]): r for r in map(json.loads, path.read_text().splitlines())}
        seqs = []
        for p in prompts:
            history = []
            for turn, text in enumerate(p.turns):
                r = recs[(p.prompt_id, turn)]
                output = json.loads(r["output_ids"]) if isinstance(r["output_ids"], str) else r["output_ids"]
                messages = history + [{"role": "user", "content": text}]
                ids = chat_prompt_ids(tok, messages, chat.get("system_prompt"), chat.get("enable_thinking"))
                if len(ids) != r["prompt_tokens"]:
                    raise ValueError(f"{path}: prompt {p.prompt_id} turn {turn} rebuilds to {len(ids)} tokens, the "
                                     f"record says prompt_tokens = {r['prompt_tokens']} (other data or template?)")
                seqs.append({"input_ids": ids + output, "loss_mask": [0] * len(ids) + [1] * len(output)})
                history = messages + [{"role": "assistant", "content": tok.decode(output, skip_special_tokens=True)}]
        out[bench] = seqs
    if not out:
        raise ValueError(f"{bench_dir}: no <benchmark>/t0 records")
    return out


def teacher_forced_on_bench_records(target, drafter, bench_dir, data_root, block_sizes=(4, 8, 16)) -> dict:
    """Per-benchmark :func:`accuracy_and_tau` of ``drafter`` on a Table 3 run's prompts, without timing.

    Every position of each AR output anchors one fully masked block of ``min(16, drafter horizon)`` tokens (the
    target's taps computed now over prompt + output, :func:`bench_record_sequences`). Greedy τ(bs) read this way is
    what the engine would accept averaged over all anchors, not only the ones its rounds land on.

    Returns:
        ``{benchmark: {"offset_accuracy", "tau", "blocks"}}``.
    """
    per_bench = bench_record_sequences(target, bench_dir, data_root)
    B = min(16, drafter.config.block_size)
    out = {}
    for bench, seqs in per_bench.items():
        source = _OnlineSource(target, seqs, list(drafter.config.target_layer_ids))
        correct = offset_correctness(drafter, source, list(range(len(seqs))), block_size=B)
        out[bench] = accuracy_and_tau(correct, [bs for bs in block_sizes if bs <= B])
    return out
