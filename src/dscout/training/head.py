"""The LM-head terms of a training update without a full ``[tokens, vocab]`` float32 tensor.

The drafter's loss needs, per supervised block token, the cross-entropy against the label (docs/method.md §3,
the prediction factor ``l^(k)``), and AWL needs the drafter's greedy token ``y`` and its log-probability
``log Q(y)`` (the acceptance term ``alpha = min(1, P(y) / Q(y))``). Computed the direct way, the logits of every
supervised token exist at once in float32: at the paper's shapes (4 sequences x 512 anchors x B = 32, 151,936-token
vocabulary) ~65k rows x 152k x 4 bytes = 40 GB, plus their softmax for the backward. Here the rows go through
the (frozen) head in chunks: the forward keeps only per-row scalars (log-sum-exp, label logit, argmax, max
log-probability), and the backward recomputes each chunk's logits to form ``softmax - onehot`` — the approach of
fused/chunked linear-cross-entropy kernels (e.g. Liger-Kernel's ``FusedLinearCrossEntropy``, Apple's Cut
Cross-Entropy), written here in plain torch so it runs on the CPU and the GPU alike.

The target's log-sum-exp over its full vocabulary (AWL's ``log P(y) = <h, W[y]> - lse``) is chunked over
positions the same way (:func:`chunked_logsumexp`).
"""

from __future__ import annotations

import torch

from ..models.linear import project

CHUNK_BYTES = 1 << 28
"""Float32 bytes of one chunk's logits (256 MiB): rows per chunk = ``CHUNK_BYTES // (4 * V)``."""


def rows_per_chunk(vocab: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows of ``[rows, vocab]`` float32 logits that fit ``chunk_bytes`` (at least 1)."""
    return max(1, int(chunk_bytes) // (4 * int(vocab)))


class _ChunkedHeadCE(torch.autograd.Function):
    """``ce[i] = lse(h_i W^T + b) - (h_i W^T + b)[label_i]`` in float32, chunked over rows; gradient to ``h`` only."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk):
        M = hidden.shape[0]
        ce = torch.empty(M, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(ce)
        argmax = torch.empty(M, dtype=torch.long, device=hidden.device)
        max_logq = torch.empty_like(ce)
        logits_one = None
        for s in range(0, M, chunk):
            logits = project(hidden[s:s + chunk], weight, bias).float()  # [c, V] float32, one chunk only
            if M <= chunk:
                logits_one = logits
            l = torch.logsumexp(logits, dim=-1)
            mx, am = logits.max(dim=-1)
            lse[s:s + chunk] = l
            ce[s:s + chunk] = l - logits.gather(1, labels[s:s + chunk, None]).squeeze(1)
            argmax[s:s + chunk] = am
            max_logq[s:s + chunk] = mx - l
            del logits
        if M <= chunk:  # one chunk: keep its softmax for the backward (as autograd would), no recomputation
            probs = torch.exp(logits_one - lse[:, None]) if M else torch.empty(0, device=hidden.device)
            ctx.save_for_backward(probs, weight, labels)
        else:
            ctx.save_for_backward(hidden, weight, bias if bias is not None else torch.empty(0), labels, lse)
        ctx.has_bias, ctx.chunk, ctx.one, ctx.h_dtype = bias is not None, chunk, M <= chunk, hidden.dtype
        ctx.mark_non_differentiable(argmax, max_logq)
        return ce, argmax, max_logq

    @staticmethod
    def backward(ctx, grad_ce, _grad_argmax, _grad_max_logq):
        if ctx.one:
            probs, weight, labels = ctx.saved_tensors
            w = weight.detach()
            g = probs.clone()
            g[torch.arange(g.shape[0], device=g.device), labels] -= 1.0
            g *= grad_ce[:, None]
            return (g.to(w.dtype) @ w).to(ctx.h_dtype), None, None, None, None
        hidden, weight, bias, labels, lse = ctx.saved_tensors
        bias = bias if ctx.has_bias else None
        grad_h = torch.empty_like(hidden)
        w = weight.detach()
        for s in range(0, hidden.shape[0], ctx.chunk):
            g = torch.exp(project(hidden[s:s + ctx.chunk], weight, bias).float() - lse[s:s + ctx.chunk, None])
            g[torch.arange(g.shape[0], device=g.device), labels[s:s + ctx.chunk]] -= 1.0  # softmax - onehot
            g *= grad_ce[s:s + ctx.chunk, None]
            grad_h[s:s + ctx.chunk] = (g.to(w.dtype) @ w).to(hidden.dtype)
            del g
        return grad_h, None, None, None, None


def chunked_head_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                               labels: torch.Tensor, chunk_rows: int | None = None
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cross-entropy of the (frozen) LM head over ``hidden``, the greedy token and its log-probability.

    Equal to ``F.cross_entropy(project(hidden, weight, bias).float(), labels, reduction="none")`` (the forward and
    the gradient with respect to ``hidden``), without holding more than ``chunk_rows`` rows of float32 logits at a
    time in either pass: the backward recomputes each chunk's logits (one more head matmul per chunk).

    Args:
        hidden: ``[M, D]`` drafter final-normed states of the supervised block tokens (with gradient).
        weight: ``[V, D]`` head rows (the target's LM head or a reduced draft vocabulary's rows); no gradient.
        bias: ``[V]`` or None.
        labels: ``[M]`` long in ``[0, V)``.
        chunk_rows: rows per chunk; None = :func:`rows_per_chunk` of ``V`` (256 MiB of float32 logits).
    Returns:
        ``ce [M]`` float32 (differentiable with respect to ``hidden``), ``argmax [M]`` long (the drafter's
        greedy token ``y``, in head-row indices), ``max_logq [M]`` float32 (``log Q(y)``); the last two carry no
        gradient.
    Raises:
        ValueError: if ``hidden`` is not 2-D or ``labels`` does not have one entry per row.
    Source: docs/method.md §3 (prediction factor, AWL's ``Q(y)``); the chunking is a memory device only.
    """
    if hidden.dim() != 2 or labels.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be [M, D] and labels [M], got {tuple(hidden.shape)} and {tuple(labels.shape)}")
    chunk = int(chunk_rows or rows_per_chunk(weight.shape[0]))
    return _ChunkedHeadCE.apply(hidden, weight, bias, labels, chunk)


def chunked_logsumexp(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      chunk_rows: int | None = None) -> torch.Tensor:
    """``logsumexp(project(hidden, weight, bias).float(), -1)`` without the full ``[..., V]`` logits.

    Args:
        hidden: ``[..., D]`` (e.g. the target's final-normed states ``[b, S, D]``).
        weight: ``[V, D]``; bias: ``[V]`` or None.
        chunk_rows: positions per chunk; None = :func:`rows_per_chunk` of ``V``.
    Returns:
        ``[...]`` float32, no gradient.
    Source: the target's ``lse`` of docs/method.md §3 (AWL: ``log P(y) = <h, W[y]> - lse``).
    """
    flat = hidden.reshape(-1, hidden.shape[-1])
    chunk = int(chunk_rows or rows_per_chunk(weight.shape[0]))
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=hidden.device)
    with torch.no_grad():
        for s in range(0, flat.shape[0], chunk):
            out[s:s + chunk] = torch.logsumexp(project(flat[s:s + chunk], weight, bias).float(), dim=-1)
    return out.view(hidden.shape[:-1])
