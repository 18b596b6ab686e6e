"""The DFlash block-diffusion drafter (config + model in one file, like a ``transformers`` modeling file).

DScout keeps DFlash's architecture unchanged (docs/method.md §1); this file implements it as read in z-lab/dflash
``dflash/model.py`` and SpecForge ``specforge/modeling/draft/dflash.py`` (docs/method.md §2):

* **Target conditioning.** The outputs of ``t`` target layers (ids in ``config.target_layer_ids``) are
  concatenated per context token and fused once: ``c = RMSNorm(W_f [h^(l1); ...; h^(lt)])`` (``fc``,
  ``hidden_norm``). ``c`` is shared by every drafter layer and never goes through a layer's input norm.
* **d decoder layers** (pre-norm Qwen3 layers). Queries come from the block only; keys/values from
  ``[c ; block]`` with the same ``k_proj``/``v_proj`` (and ``k_norm``) for both parts. Attention is non-causal
  inside the block; RoPE uses absolute positions for context and block alike.
* **Shared, frozen embedding and LM head.** The target's ``embed_tokens`` embeds the block
  ``[x_anchor, MASK, ..., MASK]`` and the target's ``lm_head`` turns the drafter's final-normed states into
  logits. Neither is a parameter of the drafter nor part of its checkpoint.
* **Same-position prediction.** Block offset ``k`` predicts the token at absolute position ``anchor + k``;
  offset 0 (the anchor) is not predicted. One forward yields ``bs - 1`` drafts.

Module names match the upstream checkpoint (``fc``, ``hidden_norm``, ``layers.{i}.self_attn.q_proj`` ...,
``norm``) so that :mod:`dscout.models.export` only has to rewrite the config for SGLang's DFLASH loader.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
)

from .common import build_vocab_map, init_drafter_weights, rotate_half as _rotate_half
from .linear import project
from .target import default_target_layer_ids


class DFlashDrafterConfig(PreTrainedConfig):
    r"""Configuration of a DFlash-architecture drafter.

    Layer shapes copy the target (hidden size, heads, intermediate size, RoPE), so a drafter layer has the shape
    of a target layer (docs/method.md §2). Build one from a target with :meth:`from_target`.

    Args:
        vocab_size: the target's vocabulary size (rows of the shared embedding).
        hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim: layer shape.
        num_hidden_layers: d, the drafter depth.
        target_layer_ids: the tapped target layers (id l = output of decoder layer l, HF
            ``hidden_states[l + 1]``). Stored explicitly; the spacing rule is only a default.
        num_target_layers: L of the target (recorded for the export format and for checks).
        target_hidden_size: the target's hidden size (input width of ``fc`` is ``t * target_hidden_size``).
        mask_token_id: id of the mask token; must be an existing row of the target embedding.
        block_size: the largest block the drafter was trained for (its horizon); any inference bs up to it works.
        fc_bias: whether ``fc`` has a bias (upstream: no; the paper writes ``+ b_f``).
        draft_vocab_size: None = draft over the target's whole vocabulary (upstream DFlash); else the drafter
            predicts only these many tokens (the buffer ``draft_token_ids``, the most frequent response tokens),
            through the matching rows of the target's LM head. EAGLE-3's reduced draft vocabulary (its
            ``d2t``) applied to the DFlash head: the LM head is most of a small drafter's cost, in training and
            in every draft round. Tokens outside it are never drafted (they end acceptance), so it is lossless.
        rope_parameters: ``{"rope_type": ..., "rope_theta": ...}`` copied from the target.
    """

    model_type = "dscout_dflash_drafter"

    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_hidden_layers: int = 1
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    head_dim: int = 64
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    attention_bias: bool = False
    attention_dropout: float = 0.0
    rope_parameters: dict | None = None
    target_layer_ids: list[int] | None = None
    num_target_layers: int = 30
    target_hidden_size: int | None = None
    mask_token_id: int = 0
    block_size: int = 16
    fc_bias: bool = False
    draft_vocab_size: int | None = None
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        if self.rope_parameters is None:
            self.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        if self.target_layer_ids is None:
            self.target_layer_ids = default_target_layer_ids(self.num_target_layers, self.num_hidden_layers)
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        super().__post_init__(**kwargs)
        self.validate_drafter()

    def validate_drafter(self) -> None:
        """Check the fields that silently break acceptance when wrong (docs/method.md §2).

        Raises:
            ValueError: on an out-of-range mask id or layer id, duplicate layer ids, or bad head counts.
        """
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is not a row of the target embedding "
                             f"(vocab_size {self.vocab_size}); pick an existing (unused) token id")
        ids = self.target_layer_ids
        if not ids or len(set(ids)) != len(ids):
            raise ValueError(f"target_layer_ids must be non-empty and distinct, got {ids}")
        bad = [i for i in ids if not 0 <= i < self.num_target_layers]
        if bad:
            raise ValueError(f"target_layer_ids {bad} outside [0, {self.num_target_layers})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2, got {self.block_size}")
        if self.draft_vocab_size is not None and not 1 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must lie in (1, vocab_size = {self.vocab_size}], "
                             f"got {self.draft_vocab_size}")

    @property
    def num_taps(self) -> int:
        """t, the conditioning depth."""
        return len(self.target_layer_ids)

    @property
    def label(self) -> str:
        """The paper's ``{t}t{d}d`` name of this configuration, e.g. ``35t6d``."""
        return f"{self.num_taps}t{self.num_hidden_layers}d"

    @classmethod
    def from_target(cls, target_config, num_hidden_layers: int, mask_token_id: int,
                    target_layer_ids: list[int] | None = None, num_taps: int | None = None,
                    block_size: int = 16, **overrides) -> "DFlashDrafterConfig":
        """Drafter config whose layer shape copies ``target_config`` (an HF ``PreTrainedConfig``).

        Args:
            num_hidden_layers: d.
            target_layer_ids: explicit taps; else the spacing rule with ``num_taps`` (default d) taps.
            mask_token_id: see class doc.
            block_size: trained horizon (largest B of the recipe).
        """
        L = target_config.num_hidden_layers
        if target_layer_ids is None:
            target_layer_ids = default_target_layer_ids(L, num_taps or num_hidden_layers)
        head_dim = getattr(target_config, "head_dim", None) or (
            target_config.hidden_size // target_config.num_attention_heads)
        rope = dict(getattr(target_config, "rope_parameters", None) or {})
        rope.setdefault("rope_type", "default")
        rope.setdefault("rope_theta", getattr(target_config, "rope_theta", 10000.0))
        fields = dict(
            vocab_size=target_config.vocab_size,
            hidden_size=target_config.hidden_size,
            intermediate_size=target_config.intermediate_size,
            num_attention_heads=target_config.num_attention_heads,
            num_key_value_heads=getattr(target_config, "num_key_value_heads", None)
            or target_config.num_attention_heads,
            head_dim=head_dim,
            hidden_act=getattr(target_config, "hidden_act", "silu"),
            rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-6),
            max_position_embeddings=target_config.max_position_embeddings,
            rope_parameters=rope,
            num_hidden_layers=num_hidden_layers,
            target_layer_ids=list(target_layer_ids),
            num_target_layers=L,
            target_hidden_size=target_config.hidden_size,
            mask_token_id=mask_token_id,
            block_size=block_size,
        )
        fields.update(overrides)
        return cls(**fields)


class DFlashDrafterAttention(nn.Module):
    """Block queries over ``[context ; block]`` keys, non-causal (docs/method.md §2).

    Shapes: block ``z`` ``[b, Q, D]`` (after the layer's input norm), context ``c`` ``[b, C, D]`` (fused
    features, *not* input-normed). Output ``[b, Q, D]``.
    """

    def __init__(self, config: DFlashDrafterConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def _kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        k = (k * cos.unsqueeze(1)) + (_rotate_half(k) * sin.unsqueeze(1))
        return k, v

    def forward(self, z: torch.Tensor, c: torch.Tensor | None, block_rope, context_rope,
                attention_mask: torch.Tensor | None = None, past_key_values=None) -> torch.Tensor:
        b, q_len, _ = z.shape
        cos_b, sin_b = block_rope
        q = self.q_norm(self.q_proj(z).view(b, q_len, self.num_heads, self.head_dim)).transpose(1, 2)
        q = (q * cos_b.unsqueeze(1)) + (_rotate_half(q) * sin_b.unsqueeze(1))
        k_blk, v_blk = self._kv(z, cos_b, sin_b)
        if c is not None and c.shape[1] > 0:
            k_ctx, v_ctx = self._kv(c, *context_rope)
            k, v = torch.cat([k_ctx, k_blk], dim=2), torch.cat([v_ctx, v_blk], dim=2)
        else:
            k, v = k_blk, v_blk
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):  # a flex BlockMask
            from .flex import flex_attend

            out = flex_attend(q, k, v, attention_mask, self.scaling, self.num_heads != self.num_kv_heads)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attention_mask, is_causal=False, scale=self.scaling,
                enable_gqa=self.num_heads != self.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class DFlashDrafterLayer(nn.Module):
    """Pre-norm residual Qwen3 layer with :class:`DFlashDrafterAttention` (docs/method.md §2)."""

    def __init__(self, config: DFlashDrafterConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashDrafterAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, z, c, block_rope, context_rope, attention_mask=None, past_key_values=None):
        z = z + self.self_attn(self.input_layernorm(z), c, block_rope, context_rope, attention_mask, past_key_values)
        return z + self.mlp(self.post_attention_layernorm(z))


class DFlashDrafter(PreTrainedModel):
    """The block-diffusion drafter: ``t`` fused target taps + ``d`` non-causal layers (see module doc).

    The target's embedding and LM head are attached with :meth:`attach_target`; they are frozen, excluded
    from ``parameters()`` and from the checkpoint.
    """

    config_class = DFlashDrafterConfig
    base_model_prefix = "drafter"
    _no_split_modules = ["DFlashDrafterLayer"]

    def __init__(self, config: DFlashDrafterConfig):
        super().__init__(config)
        in_dim = config.num_taps * config.target_hidden_size
        self.fc = nn.Linear(in_dim, config.hidden_size, bias=config.fc_bias)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashDrafterLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        # Training-time reparameterisation of fc (see set_tap_scale); ones outside training, never saved.
        self.register_buffer("tap_scale", torch.ones(in_dim), persistent=False)
        if config.draft_vocab_size is not None:  # reduced draft vocabulary: target ids of the drafted tokens
            self.register_buffer("draft_token_ids", torch.arange(config.draft_vocab_size))
        self.__dict__["_head_rows"] = None  # (weight rows, bias rows, ids version) of the reduced LM head
        self._tap_scaled = False
        self.__dict__["_target_parts"] = None  # (embed_tokens, lm_head): shared, frozen, not registered
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module):
        init_drafter_weights(module, self.config.initializer_range)

    # ------------------------------------------------------------------ target parts
    def attach_target(self, target) -> "DFlashDrafter":
        """Share a target's (frozen) embedding and LM head. ``target`` is a :class:`TargetModel`.

        Raises:
            ValueError: if the target's vocabulary or hidden size disagrees with this config.
        """
        emb, head = target.embed_tokens, target.lm_head
        if emb.weight.shape != (self.config.vocab_size, self.config.hidden_size):
            raise ValueError(f"target embedding {tuple(emb.weight.shape)} does not match drafter "
                             f"(vocab {self.config.vocab_size}, hidden {self.config.hidden_size})")
        if target.num_layers != self.config.num_target_layers:
            raise ValueError(f"drafter expects a {self.config.num_target_layers}-layer target, "
                             f"got {target.num_layers} layers")
        self.__dict__["_target_parts"] = (emb, head)
        return self

    def _parts(self):
        parts = self.__dict__.get("_target_parts")
        if parts is None:
            raise RuntimeError("call drafter.attach_target(target) first: embedding and LM head are the target's")
        return parts

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Embed block token ids ``[b, Q]`` with the target's frozen embedding -> ``[b, Q, D]``."""
        emb = self._parts()[0]
        return F.embedding(ids, emb.weight.detach())

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target LM head over drafter states ``[..., D]`` -> logits ``[..., V_d]`` (head frozen).

        ``V_d`` is the draft vocabulary: the target's ``V`` by default, ``config.draft_vocab_size`` rows of the
        head (``draft_token_ids``) with a reduced one; map argmax indices back with :meth:`to_target_ids`.
        """
        w, b = self.head_rows()
        return project(hidden, w, b)

    def head_rows(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The (frozen) LM-head rows of the draft vocabulary: weight ``[V_d, D]`` and bias ``[V_d]`` or None
        (the target's head itself for the full vocabulary). :meth:`compute_logits` is ``project`` over them."""
        head = self._parts()[1]
        bias = head.bias.detach() if getattr(head, "bias", None) is not None else None
        if self.config.draft_vocab_size is None:
            return head.weight, bias
        return self._reduced_head(head, bias)

    def _reduced_head(self, head, bias):
        ids = self.draft_token_ids
        cached = self.__dict__.get("_head_rows")
        key = (ids._version, ids.data_ptr(), head.weight._version, head.weight.data_ptr(), ids.device)
        if cached is None or cached[2] != key:  # the gathered rows are reused until the ids or the head change
            cached = (head.weight.detach()[ids].contiguous(), bias[ids] if bias is not None else None, key)
            self.__dict__["_head_rows"] = cached
        if not self.training:  # decoding: oneDNN-packed rows, as the target's own head (models/linear.py)
            from .linear import pack_weight

            pack_weight(cached[0])
        return cached[0], cached[1]

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary indices (any shape) to target token ids (identity for the full vocabulary)."""
        if self.config.draft_vocab_size is None:
            return draft_ids
        return self.draft_token_ids.to(draft_ids.device)[draft_ids]

    def to_draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Map target token ids (any shape) to draft-vocabulary indices; -1 for tokens outside it."""
        if self.config.draft_vocab_size is None:
            return target_ids
        lookup = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=target_ids.device)
        lookup[self.draft_token_ids.to(target_ids.device)] = torch.arange(self.config.draft_vocab_size,
                                                                          device=target_ids.device)
        return lookup[target_ids]

    @torch.no_grad()
    def set_draft_vocab(self, token_counts: torch.Tensor) -> None:
        """Fill ``draft_token_ids`` with the ``draft_vocab_size`` most frequent tokens of ``token_counts`` ``[V]``
        (EAGLE-3's selection, :func:`~dscout.models.common.build_vocab_map`: ties towards the smaller id, sorted
        by id). No-op for a full-vocabulary drafter."""
        if self.config.draft_vocab_size is None:
            return
        d2t, _ = build_vocab_map(token_counts, self.config.draft_vocab_size)
        used = d2t + torch.arange(self.config.draft_vocab_size)
        self.draft_token_ids.copy_(used.to(self.draft_token_ids.device))

    def fuse_context(self, taps: torch.Tensor) -> torch.Tensor:
        """``c = hidden_norm(fc(taps))``: ``[b, C, t * D_target]`` -> ``[b, C, D]`` (docs/method.md §2)."""
        x = taps.to(self.fc.weight.dtype)
        if self._tap_scaled:
            x = x / self.tap_scale
        return self.hidden_norm(self.fc(x))

    @torch.no_grad()
    def set_tap_scale(self, scale: torch.Tensor) -> None:
        """Train ``fc`` on per-dimension standardised taps: ``fc(x) = W' (x / s)`` with ``W = W' / s``.

        Target residual streams are badly scaled (per-dimension RMS differing by 100x, attention-sink outliers);
        with Adam's per-parameter steps the large input dimensions then swamp the rest. Training ``W'`` on
        ``x / s`` conditions the problem without changing the model class: :meth:`fold_tap_scale` writes
        ``W = W' / s`` back, so the saved checkpoint is a plain DFlash drafter.

        Call it on a fresh initialisation (``W'`` keeps its init scale) or before loading weights trained with
        the same scale (a resumed run recomputes the same scale from the same data).

        Args:
            scale: ``[t * D_target]`` positive per-dimension scale (e.g. the RMS of the taps over the data).
        """
        self.tap_scale.copy_(scale.to(self.tap_scale))
        self._tap_scaled = True

    @torch.no_grad()
    def fold_tap_scale(self) -> None:
        """Fold the training scale into ``fc`` (``W = W' / s``) and reset it to ones."""
        self.fc.weight.div_(self.tap_scale)
        self.tap_scale.fill_(1.0)
        self._tap_scaled = False

    @torch.no_grad()
    def materialize_context(self, context_taps: torch.Tensor, context_positions: torch.Tensor,
                            past_key_values) -> None:
        """Write context K/V straight into the cache, without a block (SGLang's "materialize" step).

        A context token's K/V in every layer depend only on its fused feature ``c`` (context never enters the
        residual stream), so they can be computed once per committed token.

        Args:
            context_taps: ``[b, C, t * D_target]``.
            context_positions: ``[b, C]`` absolute positions.
            past_key_values: a ``DynamicCache``; extended by C positions in every layer.
        """
        c = self.fuse_context(context_taps)
        rope = self.rotary_emb(c, context_positions)
        for layer in self.layers:
            k, v = layer.self_attn._kv(c, *rope)
            past_key_values.update(k, v, layer.self_attn.layer_idx)

    # ------------------------------------------------------------------ forward
    def forward(self, block_ids: torch.Tensor, block_positions: torch.Tensor,
                context_taps: torch.Tensor | None = None, context_positions: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, past_key_values=None,
                block_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """One non-causal drafter pass over one or many blocks.

        Args:
            block_ids: ``[b, Q]`` block tokens (anchor, masks, revealed tokens); ignored if ``block_embeds``.
            block_positions: ``[b, Q]`` absolute positions of the block tokens.
            context_taps: ``[b, C, t * D_target]`` raw concatenated target taps of context tokens (new ones
                only, when a cache holds the older ones).
            context_positions: ``[b, C]`` their absolute positions.
            attention_mask: boolean ``[b, 1, Q, K]`` (True = may attend) over keys
                ``[cached ; context ; block]``, or a flex ``BlockMask`` of the same rule (training on a GPU,
                :mod:`dscout.models.flex`: no materialised scores); ``None`` = every query sees every key
                (inference).
            past_key_values: a ``transformers`` ``DynamicCache`` holding earlier context K/V. On return it
                holds the new context K/V too, but **not** the block's (cropped back).
            block_embeds: ``[b, Q, D]`` precomputed block embeddings (optional).
        Returns:
            ``[b, Q, D]`` final-normed drafter states; apply :meth:`compute_logits` for logits.
        """
        z = self.embed(block_ids) if block_embeds is None else block_embeds
        z = z.to(self.fc.weight.dtype)
        block_rope = self.rotary_emb(z, block_positions)
        c, context_rope = None, None
        if context_taps is not None and context_taps.shape[1] > 0:
            c = self.fuse_context(context_taps)
            context_rope = self.rotary_emb(c, context_positions)
        for layer in self.layers:
            z = layer(z, c, block_rope, context_rope, attention_mask, past_key_values)
        if past_key_values is not None:
            past_key_values.crop(-z.shape[1])  # keep context K/V only (docs/method.md §4 step 2)
        return self.norm(z)
