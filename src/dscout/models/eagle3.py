"""The EAGLE-3 baseline drafter (config + model in one file, like a ``transformers`` modeling file).

EAGLE-3 is one of the baselines DScout is compared against; this file implements its drafter as described in
docs/method.md §6.1 (read from SafeAILab/EAGLE ``eagle/model/cnets.py``, SGLang
``python/sglang/srt/models/llama_eagle3.py`` and SpecForge ``specforge/training/vocab_mapping.py``). Our own code:

* **Feature fusion.** Three target taps are concatenated per token, ``g_t = [h^(a); h^(b); h^(c)]`` (width
  ``3 H_t``) and projected once: ``u_t = W_fc g_t`` (``fc``, no bias). Later draft steps feed the drafter's own
  outputs ``a_t`` (width ``H``), which skip ``fc``.
* **One Llama-style decoder layer** (``midlayer``). Its attention input is
  ``z_t = [RMSNorm_in(E[x]) ; RMSNorm_hid(u_t)]`` (width ``2H``, so q/k/v projections take ``2H``); the residual
  stream is ``u_t``; causal self-attention with RoPE, then post-attention RMSNorm + SwiGLU MLP. The output
  ``a_t`` (pre-final-norm) is returned together with ``logits = lm_head(RMSNorm(a_t))``.
* **Reduced vocabulary.** ``lm_head`` has ``V_d`` rows (the most frequent training tokens); buffers
  ``d2t[i] = used[i] - i`` (so ``target_id = i + d2t[i]``) and ``t2d`` (bool mask over ``V``) are saved with the
  checkpoint (EAGLE ``scandata``).
* **Shared, frozen embedding.** ``E`` is the target's input embedding, attached with :meth:`attach_target`;
  it is not a parameter of the drafter nor part of its checkpoint. ``lm_head`` is the drafter's own.

Layer ids follow the project convention (id ``l`` = output of decoder layer ``l`` = HF ``hidden_states[l + 1]``):
EAGLE-3's HF taps ``{2, L//2, L-3}`` are our ids ``{1, L//2 - 1, L - 4}`` (:func:`default_eagle3_layer_ids`).
Module names (``fc``, ``midlayer.self_attn.q_proj``, ``midlayer.hidden_norm``, ``norm``, ``lm_head``, ``d2t``,
``t2d``) follow the upstream checkpoint layout.
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

from . import common as _common
from .common import (  # noqa: F401  (build_vocab_map re-exported: its EAGLE-3 home)
    build_vocab_map, init_drafter_weights, rope_from_config, rotate_half as _rotate_half)
from .layer_ids import default_eagle3_layer_ids  # noqa: F401  (re-exported)


# ---------------------------------------------------------------------------------------------- config
class Eagle3DrafterConfig(PreTrainedConfig):
    r"""Configuration of an EAGLE-3 drafter (docs/method.md §6.1).

    Build one from a target with :meth:`from_target` (layer shape copied from the target, ``H = H_t``).

    Args:
        vocab_size: ``V``, the target vocabulary (rows of the shared embedding, length of ``t2d``).
        draft_vocab_size: ``V_d``, rows of the drafter's own ``lm_head`` (upstream 32000).
        hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim: layer shape ``H``...
        rms_norm_eps, max_position_embeddings, rope_parameters: as in the target.
        target_hidden_size: ``H_t`` (input width of ``fc`` is ``len(target_layer_ids) * H_t``).
        target_layer_ids: the tapped target layers (id l = output of decoder layer l); default
            :func:`default_eagle3_layer_ids`.
        num_target_layers: ``L`` of the target.
    """

    model_type = "dscout_eagle3_drafter"

    vocab_size: int = 49152
    draft_vocab_size: int = 32000
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    head_dim: int = 64
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    attention_bias: bool = False
    rope_parameters: dict | None = None
    target_hidden_size: int | None = None
    target_layer_ids: list[int] | None = None
    num_target_layers: int = 30
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        if self.rope_parameters is None:
            self.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        if self.target_layer_ids is None:
            self.target_layer_ids = default_eagle3_layer_ids(self.num_target_layers)
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        super().__post_init__(**kwargs)
        self.validate_drafter()

    def validate_drafter(self) -> None:
        """Check shapes and ids.

        Raises:
            ValueError: on a draft vocabulary larger than the target's, an out-of-range layer id, bad head
                counts, or a fused width equal to ``H`` (the forward tells taps from ``a_t`` by width).
        """
        if not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} outside [1, vocab_size={self.vocab_size}]")
        ids = self.target_layer_ids
        if not ids:
            raise ValueError("target_layer_ids must be non-empty")
        bad = [i for i in ids if not 0 <= i < self.num_target_layers]
        if bad:
            raise ValueError(f"target_layer_ids {bad} outside [0, {self.num_target_layers})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.fused_width == self.hidden_size:
            raise ValueError(f"fused tap width {self.fused_width} equals hidden_size; the forward could not tell "
                             "target taps from drafter states")

    @property
    def fused_width(self) -> int:
        """``t * H_t``, the input width of ``fc``."""
        return len(self.target_layer_ids) * self.target_hidden_size

    @classmethod
    def from_target(cls, target_config, draft_vocab_size: int, target_layer_ids: list[int] | None = None,
                    **overrides) -> "Eagle3DrafterConfig":
        """Drafter config whose layer shape copies ``target_config`` (an HF ``PreTrainedConfig``).

        Args:
            draft_vocab_size: ``V_d``.
            target_layer_ids: explicit taps; default :func:`default_eagle3_layer_ids`.
            overrides: any other field (e.g. ``intermediate_size``).
        """
        L = target_config.num_hidden_layers
        head_dim = getattr(target_config, "head_dim", None) or (
            target_config.hidden_size // target_config.num_attention_heads)
        rope = dict(getattr(target_config, "rope_parameters", None) or {})
        rope.setdefault("rope_type", "default")
        rope.setdefault("rope_theta", getattr(target_config, "rope_theta", 10000.0))
        fields = dict(
            vocab_size=target_config.vocab_size,
            draft_vocab_size=draft_vocab_size,
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
            target_hidden_size=target_config.hidden_size,
            target_layer_ids=list(target_layer_ids) if target_layer_ids is not None
            else default_eagle3_layer_ids(L),
            num_target_layers=L,
        )
        fields.update(overrides)
        return cls(**fields)


# ---------------------------------------------------------------------------------------------- layers
def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[b, heads, S, hd]`` with ``cos``/``sin`` ``[b, S, hd]``."""
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


class Eagle3Attention(nn.Module):
    """Llama attention whose q/k/v projections read ``2H`` inputs (no q/k norm, like upstream).

    Shapes: ``z`` ``[b, S, 2H]`` -> ``[b, S, H]``.
    """

    def __init__(self, config: Eagle3DrafterConfig):
        super().__init__()
        self.layer_idx = 0
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        bias, H = config.attention_bias, config.hidden_size
        self.q_proj = nn.Linear(2 * H, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(2 * H, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(2 * H, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, H, bias=bias)

    def forward(self, z: torch.Tensor, rope, attention_mask: torch.Tensor | None, past_key_values=None
                ) -> torch.Tensor:
        """Args: ``z`` ``[b, S, 2H]``; ``rope`` = (cos, sin) ``[b, S, hd]``; ``attention_mask`` bool
        ``[b, 1, S, K]`` over ``[cached ; new]`` keys or None (causal); ``past_key_values`` any object with
        ``update(k, v, layer_idx) -> (k, v)`` (e.g. a ``DynamicCache``)."""
        b, S, _ = z.shape
        cos, sin = rope
        q = _rope(self.q_proj(z).view(b, S, self.num_heads, self.head_dim).transpose(1, 2), cos, sin)
        k = _rope(self.k_proj(z).view(b, S, self.num_kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        v = self.v_proj(z).view(b, S, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        K = k.shape[2]
        is_causal = False
        if attention_mask is None:
            if K == S:
                is_causal = True
            else:  # new queries are the last S keys: causal with an offset
                qpos = torch.arange(K - S, K, device=z.device).unsqueeze(1)
                attention_mask = (torch.arange(K, device=z.device).unsqueeze(0) <= qpos)[None, None]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attention_mask, is_causal=is_causal, scale=self.scaling,
            enable_gqa=self.num_heads != self.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, S, -1))


class Eagle3DecoderLayer(nn.Module):
    """The "midlayer": ``a = u' + MLP(norm(u'))`` with ``u' = u + Attn([norm_in(e) ; norm_hid(u)])``."""

    def __init__(self, config: Eagle3DrafterConfig):
        super().__init__()
        self.self_attn = Eagle3Attention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, embeds: torch.Tensor, u: torch.Tensor, rope, attention_mask=None, past_key_values=None
                ) -> torch.Tensor:
        """``embeds``, ``u``: ``[b, S, H]`` -> ``a`` ``[b, S, H]``."""
        z = torch.cat([self.input_layernorm(embeds), self.hidden_norm(u)], dim=-1)
        h = u + self.self_attn(z, rope, attention_mask, past_key_values)
        return h + self.mlp(self.post_attention_layernorm(h))


# ---------------------------------------------------------------------------------------------- model
class Eagle3Drafter(PreTrainedModel):
    """The EAGLE-3 drafter: ``fc`` + one decoder layer + final norm + reduced-vocabulary ``lm_head``.

    The target's input embedding is attached with :meth:`attach_target`; it is frozen, excluded from
    ``parameters()`` and from the checkpoint. ``d2t``/``t2d`` are persistent buffers (identity map until
    :meth:`set_vocab_map` is called).
    """

    config_class = Eagle3DrafterConfig
    base_model_prefix = "eagle3"
    _no_split_modules = ["Eagle3DecoderLayer"]

    def __init__(self, config: Eagle3DrafterConfig):
        super().__init__(config)
        self.fc = nn.Linear(config.fused_width, config.hidden_size, bias=False)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        Vd, V = config.draft_vocab_size, config.vocab_size
        self.register_buffer("d2t", torch.zeros(Vd, dtype=torch.long), persistent=True)
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[:Vd] = True
        self.register_buffer("t2d", t2d, persistent=True)
        self.__dict__["_target_embed"] = None  # shared, frozen, not registered
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module):
        init_drafter_weights(module, self.config.initializer_range)

    # ------------------------------------------------------------------ vocabulary
    @torch.no_grad()
    def set_vocab_map(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """Install a map from :func:`build_vocab_map`.

        Raises:
            ValueError: if the shapes disagree with ``draft_vocab_size``/``vocab_size`` or the map is inconsistent.
        """
        Vd, V = self.config.draft_vocab_size, self.config.vocab_size
        if tuple(d2t.shape) != (Vd,) or tuple(t2d.shape) != (V,):
            raise ValueError(f"vocab map shapes d2t {tuple(d2t.shape)}, t2d {tuple(t2d.shape)} do not match "
                             f"draft_vocab_size {Vd}, vocab_size {V}")
        used = torch.arange(Vd) + d2t.cpu().long()
        if not torch.equal(t2d.cpu().bool().nonzero().flatten(), used):
            raise ValueError("d2t and t2d disagree (t2d must be True exactly at i + d2t[i])")
        self.d2t.copy_(d2t.to(self.d2t.device))
        self.t2d.copy_(t2d.to(self.t2d.device))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocab ids -> target ids (any shape)."""
        return _common.to_target_ids(draft_ids, self.d2t)

    def to_draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft-vocab ids (any shape), ``-1`` where not in the draft vocabulary."""
        return _common.to_draft_ids(target_ids, self.t2d)

    # ------------------------------------------------------------------ target parts
    def attach_target(self, target) -> "Eagle3Drafter":
        """Share a target's (frozen) input embedding. ``target`` is a :class:`TargetModel`.

        Raises:
            ValueError: if the target's vocabulary/hidden size or layer count disagrees with this config.
        """
        emb = target.embed_tokens
        if emb.weight.shape != (self.config.vocab_size, self.config.hidden_size):
            raise ValueError(f"target embedding {tuple(emb.weight.shape)} does not match drafter "
                             f"(vocab {self.config.vocab_size}, hidden {self.config.hidden_size})")
        if target.num_layers != self.config.num_target_layers:
            raise ValueError(f"drafter expects a {self.config.num_target_layers}-layer target, "
                             f"got {target.num_layers} layers")
        self.__dict__["_target_embed"] = emb
        return self

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Embed target token ids ``[b, S]`` with the target's frozen embedding -> ``[b, S, H]``.

        Raises:
            RuntimeError: if no target is attached.
        """
        emb = self.__dict__.get("_target_embed")
        if emb is None:
            raise RuntimeError("call drafter.attach_target(target) first: the input embedding is the target's")
        return F.embedding(ids, emb.weight.detach())

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """``u = fc(g)``: ``[b, S, t * H_t]`` -> ``[b, S, H]``."""
        return self.fc(taps.to(self.fc.weight.dtype))

    def compute_logits(self, a: torch.Tensor) -> torch.Tensor:
        """``lm_head(norm(a))``: ``[..., H]`` -> draft-vocab logits ``[..., V_d]``."""
        return self.lm_head(self.norm(a))

    @staticmethod
    def new_cache():
        """A fresh ``transformers.DynamicCache`` for incremental drafting (one layer, ``layer_idx`` 0)."""
        from transformers import DynamicCache

        return DynamicCache()

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, past_key_values=None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """One drafter pass (training and inference).

        Args:
            input_ids: ``[b, S]`` target token ids (position t carries token ``x_{t+1}`` next to feature ``g_t``).
            hidden: ``[b, S, t * H_t]`` fused target taps (go through ``fc``) or ``[b, S, H]`` the drafter's own
                earlier outputs ``a`` (used as is).
            position_ids: ``[b, S]`` RoPE positions.
            attention_mask: boolean ``[b, 1, S, K]`` (True = may attend) over keys ``[cached ; new]``, or None
                for causal attention (offset by the cached length when a cache is given).
            past_key_values: a ``DynamicCache`` (or anything with ``update(k, v, layer_idx)``); the new K/V are
                appended at ``layer_idx`` 0 and stay there (crop with ``cache.crop(-n)``).
        Returns:
            ``(a, logits)``: ``a`` ``[b, S, H]`` pre-final-norm outputs; ``logits`` ``[b, S, V_d]``.
        Raises:
            ValueError: if ``hidden`` has neither width.
        """
        w = hidden.shape[-1]
        if w == self.config.fused_width:
            u = self.fuse(hidden)
        elif w == self.config.hidden_size:
            u = hidden.to(self.fc.weight.dtype)
        else:
            raise ValueError(f"hidden width {w} is neither the fused tap width {self.config.fused_width} nor "
                             f"hidden_size {self.config.hidden_size}")
        e = self.embed(input_ids).to(u.dtype)
        rope = self.rotary_emb(u, position_ids)
        a = self.midlayer(e, u, rope, attention_mask, past_key_values)
        return a, self.compute_logits(a)


def load_public_eagle3(path: str, target_config, dtype: torch.dtype = torch.bfloat16) -> "Eagle3Drafter":
    """Load a published EAGLE-3 checkpoint (``LlamaForCausalLMEagle3`` layout) into :class:`Eagle3Drafter`.

    Covers the layouts of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B and the SpecForge/AngelSlim exports
    (docs/method.md §6.1): config keys ``hidden_size``, ``intermediate_size``, ``num_attention_heads``,
    ``num_key_value_heads``, ``rms_norm_eps``, ``rope_theta``, ``vocab_size``, ``draft_vocab_size``; tensors
    ``fc``, ``midlayer.*`` (or ``layers.0.*``), ``norm``, ``lm_head``, ``d2t``, ``t2d``, optionally prefixed
    ``model.``. The taps are EAGLE-3's defaults for the target (HF {2, L/2, L-3} = our ids {1, L/2-1, L-4}).

    Args:
        path: local folder or hub id (the cluster has the hub; nothing is downloaded on the CPU default).
        target_config: the target's HF config (layer count and hidden size).
    Raises:
        ValueError: on a tensor that does not map onto the drafter, or a missing one.
    """
    import json
    import os

    from safetensors.torch import load_file

    if not os.path.isdir(path):
        from huggingface_hub import snapshot_download

        path = snapshot_download(path)
    c = json.loads(open(os.path.join(path, "config.json")).read())
    L = target_config.num_hidden_layers
    cfg = Eagle3DrafterConfig(
        vocab_size=c["vocab_size"], draft_vocab_size=c.get("draft_vocab_size", c["vocab_size"]),
        hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
        num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
        head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
        rms_norm_eps=c.get("rms_norm_eps", 1e-6), max_position_embeddings=c.get("max_position_embeddings", 8192),
        rope_parameters=rope_from_config(c) or {"rope_type": "default", "rope_theta": 10000.0},
        target_hidden_size=c.get("target_hidden_size") or target_config.hidden_size,
        target_layer_ids=default_eagle3_layer_ids(L), num_target_layers=L)
    model = Eagle3Drafter(cfg)
    state = {}
    files = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    for f in files:
        state.update(load_file(os.path.join(path, f)))
    if not files and os.path.exists(os.path.join(path, "pytorch_model.bin")):
        state = torch.load(os.path.join(path, "pytorch_model.bin"), map_location="cpu", weights_only=True)
    mapped = {}
    for name, t in state.items():
        n = name[len("model."):] if name.startswith("model.") else name
        n = n.replace("layers.0.", "midlayer.")
        if n.startswith("embed_tokens"):
            continue  # the target's embedding is used
        mapped[n] = t
    own = model.state_dict()
    unknown = [n for n in mapped if n not in own]
    if unknown:
        raise ValueError(f"{path}: tensors that do not map onto the EAGLE-3 drafter: {unknown[:5]}")
    missing = [n for n in own if n not in mapped and not n.startswith("rotary_emb")]
    if missing:
        raise ValueError(f"{path}: missing tensors {missing[:5]}")
    model.load_state_dict({**own, **mapped})
    return model.to(dtype)
