"""Multi-block training attention without materialised scores: ``flex_attention`` with a block mask.

The dense boolean ``[b, 1, Q, K]`` mask of :func:`dscout.training.blocks.block_attention_mask` rules out
SDPA's flash and memory-efficient kernels when heads are grouped (GQA), leaving the math kernel, which
materialises ``[b, heads, Q, K]`` scores per layer (at the paper's shapes, 4 x 32 x 16k x 19.5k bf16 = 80 GB).
``flex_attention`` takes the same visibility rule as a *mask function* evaluated inside a fused kernel, and a
:class:`~torch.nn.attention.flex_attention.BlockMask` that skips the 128 x 128 tiles no query of which may see
(SpecForge trains DFlash this way, ``specforge/core/dflash.py``). The rule is the one of docs/method.md §3: a
block query at offset ``q`` of block ``n = q // B`` sees context key ``j < a_n`` (when the block is kept) and
every key of its own block.

On a GPU the kernel is the ``torch.compile``d ``flex_attention`` (Triton); elsewhere the eager one (a reference
implementation that does materialise scores: it exists so a CPU test can compare both paths).
"""

from __future__ import annotations

import functools

import torch


def block_mask(anchors: torch.Tensor, keep: torch.Tensor, seq_len: int, block_size: int):
    """The multi-block visibility rule as a ``BlockMask`` over keys ``[S context ; N * B block]``.

    Args:
        anchors: ``[b, N]`` anchor positions; keep: ``[b, N]`` bool (False = unused slot, sees only itself).
        seq_len: S, the context length.
        block_size: B.
    Returns:
        a :class:`torch.nn.attention.flex_attention.BlockMask` for queries ``N * B`` and keys ``S + N * B`` on
        ``anchors``'s device (compiled construction on CUDA, so no dense mask is built there either).
    Source: docs/method.md §3 (the same rule as :func:`dscout.training.blocks.block_attention_mask`).
    """
    from torch.nn.attention.flex_attention import create_block_mask

    b, N = anchors.shape
    B, S = int(block_size), int(seq_len)
    anchors = anchors.to(torch.int64)
    keep = keep.to(torch.bool)

    def visible(bi, hi, q, kv):
        n = q // B
        ctx = (kv < S) & (kv < anchors[bi, n]) & keep[bi, n]
        own = (kv >= S) & ((kv - S) // B == n)
        return ctx | own

    return create_block_mask(visible, B=b, H=None, Q_LEN=N * B, KV_LEN=S + N * B, device=anchors.device,
                             _compile=anchors.device.type == "cuda")


@functools.cache
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    # dynamic=None: the first shape compiles static, a changed one (sequence length and B vary per update)
    # recompiles once with symbolic sizes instead of once per shape
    return torch.compile(flex_attention)


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, scale: float, enable_gqa: bool
                ) -> torch.Tensor:
    """Attention of ``q [b, H, Q, hd]`` over ``k, v [b, H_kv, K, hd]`` under a ``BlockMask``: ``[b, H, Q, hd]``.

    The compiled kernel on CUDA (scores stay in on-chip tiles; it keeps the output and a ``[b, H, Q]`` float32
    log-sum-exp for the backward); the eager reference elsewhere.
    """
    if q.device.type == "cuda":
        return _compiled()(q, k, v, block_mask=mask, scale=scale, enable_gqa=enable_gqa)
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    with warnings.catch_warnings():  # "flex_attention called without torch.compile": the CPU reference, on purpose
        warnings.simplefilter("ignore", UserWarning)
        return flex_attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=enable_gqa)


def is_block_mask(mask) -> bool:
    """Whether ``mask`` is a flex ``BlockMask`` (else a dense boolean mask or None)."""
    from torch.nn.attention.flex_attention import BlockMask

    return isinstance(mask, BlockMask)
