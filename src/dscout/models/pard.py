"""The PARD-2 baseline drafter: a causal LM that drafts k tokens in ONE forward with mask tokens.

Read from the PARD/PARD-2 description in docs/method.md §6.2 (AMD-AGI/PARD ``pard/pard2_train.py``,
``pard/pard2_infer.py``; arXiv 2605.08632). Our own implementation, not a port of upstream code:

* **Parallel drafting (PARD-1).** The input is the real tokens not yet in the draft cache followed by
  ``k - 1`` copies of a mask token; ordinary causal attention; the last ``k`` logits are the ``k`` drafts (the
  last real token predicts the next token, the j-th mask predicts the (j+1)-th). The mask slots are cropped
  from the draft cache after the call, so the cache only ever holds real tokens.
* **Target alignment (PARD-2).** Every input embedding gets a projected target feature:
  ``e_t = E[x_t] + s * W_p f_{t-1}`` with ``s = feat_scale`` (0.02), ``W_p = target_proj`` (``[H, F]``, no bias)
  and ``f`` the concatenation of target hidden states at HF ``hidden_states`` indices ``[-1, -8, -16, -24]``
  (-1 = the final-normed output). Features are **shifted right by one** (position 0 gets zeros); mask tokens get
  the same feature as the last real token (the feature of the token before it).
* **Dual mode.** Training zeroes a whole sample's features with a small probability, so the same weights also
  draft target-independently (``feats=None``).

Drafter body. Upstream fine-tunes a small same-family LM (Qwen3-0.6B, Llama-3.2-1B). Our CPU target
SmolLM2-135M has no smaller sibling, so :meth:`Pard2Drafter.from_target` builds a **layer-truncated copy of
the target**: its first ``n`` decoder layers + the target's final norm, embedding and LM head, all trainable
copies (the target stays frozen and untouched). On the cluster the released drafter (``amd/PARD2-Qwen3-8B``)
is loaded by hub id with :meth:`Pard2Drafter.from_pretrained` (untested here).

Target layer ids. Upstream ids index HF ``hidden_states`` (length L + 1): ``-1`` is the final-normed output,
``-k`` (k > 1) is the output of decoder layer ``L - k`` (0-based), i.e. our :class:`~dscout.models.target.
TargetModel` tap ``L - k``. For targets shallower than 24 layers the ids are clipped to layer 0 and duplicates
dropped (a 4-layer target gives ``[final, tap 0]``). The final-normed feature is computed as
``target.final_norm(tap L-1)``, so every feature comes from ordinary taps.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from .linear import project
from .strict import load_strict
from .layer_ids import FINAL, PARD2_TARGET_LAYERS, resolve_feature_layers  # noqa: F401  (re-exported)


CONFIG_FILE = "pard2_config.json"
LM_DIR = "lm"
PROJ_FILE = "target_proj.safetensors"


@dataclass
class Pard2Config:
    """What a PARD-2 drafter needs beyond its HF LM config (stored as JSON next to the LM).

    Attributes:
        num_layers: n, decoder layers of the drafter LM.
        mask_token_id: the mask (``pard_token``) id; an existing row of the (shared) vocabulary.
        target_layer_ids: upstream HF ``hidden_states`` indices of the target features.
        num_target_layers: L of the target the features come from.
        target_hidden_size: H_t, width of one target feature.
        hidden_size: H, the drafter LM's width (output of ``target_proj``).
        vocab_size: V, the drafter's (= target's) vocabulary size.
        feat_scale: s in ``E[x] + s * W_p f``.
        draft_k: drafts per forward used by default (``k - 1`` mask tokens).
        feature_layers: resolved features (see :func:`resolve_feature_layers`); derived, stored for reference.
    """

    num_layers: int
    mask_token_id: int
    num_target_layers: int
    target_hidden_size: int
    hidden_size: int
    vocab_size: int
    target_layer_ids: list[int] = field(default_factory=lambda: list(PARD2_TARGET_LAYERS))
    feat_scale: float = 0.02
    draft_k: int = 8
    feature_layers: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        self.feature_layers = resolve_feature_layers(self.target_layer_ids, self.num_target_layers)
        self.validate()

    def validate(self) -> None:
        """Raises:
            ValueError: on a mask id outside the vocabulary, ``draft_k < 1`` or ``num_layers < 1``.
        """
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is not a row of the vocabulary "
                             f"(vocab_size {self.vocab_size})")
        if self.draft_k < 1:
            raise ValueError(f"draft_k must be >= 1, got {self.draft_k}")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")

    @property
    def feature_dim(self) -> int:
        """F = (number of features) * H_t, the input width of ``target_proj``."""
        return len(self.feature_layers) * self.target_hidden_size

    @property
    def tap_layer_ids(self) -> list[int]:
        """Target taps to request (one per feature; the final-normed feature taps layer L-1)."""
        return [self.num_target_layers - 1 if lid == FINAL else lid for lid in self.feature_layers]

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Pard2Config":
        d = json.loads(Path(path).read_text())
        d.pop("feature_layers", None)  # derived
        return cls(**d)


def shift_features(feats: torch.Tensor, shift: int = 1, prev: torch.Tensor | None = None) -> torch.Tensor:
    """PARD-2's right shift: position t gets ``f_{t - shift}`` (zeros, or ``prev``, before the start).

    Args:
        feats: ``[b, S, F]`` per-token target features (``feats[:, t]`` = feature of token t).
        shift: how far to shift (1 for real tokens; 1 + b for mask block b in training).
        prev: ``[b, F]`` the feature of the token right before ``feats[:, 0]`` (only for ``shift == 1``);
            None = sequence start (zeros).
    Returns:
        ``[b, S, F]`` input features aligned with the tokens.
    """
    b, S, F = feats.shape
    out = feats.new_zeros(b, S, F)
    if shift < S:
        out[:, shift:] = feats[:, : S - shift]
    if prev is not None and shift == 1 and S > 0:
        out[:, 0] = prev
    return out


def _truncated_config(hf_config, num_layers: int):
    """A copy of an HF config with ``num_hidden_layers = num_layers`` (per-layer lists truncated too)."""
    cfg = copy.deepcopy(hf_config)
    cfg.num_hidden_layers = num_layers
    for name in ("layer_types",):
        val = getattr(cfg, name, None)
        if isinstance(val, (list, tuple)):
            setattr(cfg, name, list(val)[:num_layers])
    return cfg


class Pard2Drafter(nn.Module):
    """PARD-2 drafter: an HF causal LM (``self.lm``) + ``target_proj`` (see module doc).

    Args:
        config: the :class:`Pard2Config`.
        lm: an HF ``*ForCausalLM`` with ``config.num_layers`` decoder layers at ``lm.model.layers``.
    Raises:
        ValueError: if the LM's width or vocabulary disagrees with ``config``.
    """

    def __init__(self, config: Pard2Config, lm: nn.Module):
        super().__init__()
        if lm.config.hidden_size != config.hidden_size:
            raise ValueError(f"drafter LM width {lm.config.hidden_size} != config hidden_size {config.hidden_size}")
        vocab = lm.get_input_embeddings().weight.shape[0]
        if vocab != config.vocab_size:
            raise ValueError(f"drafter LM vocabulary {vocab} != config vocab_size {config.vocab_size}")
        self.config = config
        self.lm = lm
        w = lm.get_input_embeddings().weight
        self.target_proj = nn.Linear(config.feature_dim, config.hidden_size, bias=False,
                                     device=w.device, dtype=w.dtype)
        # Zero init (our choice): the untrained drafter equals its base LM, features enter gradually.
        nn.init.zeros_(self.target_proj.weight)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_target(cls, target, num_layers: int, mask_token_id: int | None = None,
                    target_layer_ids=PARD2_TARGET_LAYERS, feat_scale: float = 0.02,
                    draft_k: int = 8) -> "Pard2Drafter":
        """A layer-truncated, trainable copy of the target as the drafter LM (CPU stand-in for PARD2-*).

        Copies the target's embedding, first ``num_layers`` decoder layers, final norm and LM head into a new
        HF model of the target's class (same dtype and device); the target is not modified.

        Args:
            target: a :class:`~dscout.models.target.TargetModel` (``target.model`` is the HF causal LM).
            num_layers: n, 1 <= n <= L.
            mask_token_id: mask id (an existing vocabulary row); default ``vocab_size - 1``.
            target_layer_ids: upstream HF ``hidden_states`` indices of the features.
            feat_scale: s.
            draft_k: default drafts per forward.
        Raises:
            ValueError: if ``num_layers`` is outside ``[1, L]`` or the mask id is not a vocabulary row.
        """
        hf = target.model
        L = target.num_layers
        if not 1 <= num_layers <= L:
            raise ValueError(f"num_layers {num_layers} outside [1, {L}] (target depth)")
        V = target.vocab_size
        cfg = Pard2Config(num_layers=num_layers, mask_token_id=V - 1 if mask_token_id is None else mask_token_id,
                          num_target_layers=L, target_hidden_size=target.hidden_size,
                          hidden_size=target.hidden_size, vocab_size=V, target_layer_ids=list(target_layer_ids),
                          feat_scale=feat_scale, draft_k=draft_k)
        lm = type(hf)(_truncated_config(hf.config, num_layers))
        src = hf.state_dict()
        keep = {}
        for name in lm.state_dict():
            if name not in src:
                raise KeyError(f"truncated drafter parameter {name} has no counterpart in the target")
            keep[name] = src[name]
        lm.load_state_dict(keep, strict=True)
        lm = lm.to(device=target.device, dtype=target.dtype)
        for p in lm.parameters():
            p.requires_grad_(True)
        return cls(cfg, lm)

    @classmethod
    def from_pretrained(cls, path_or_id: str, target=None, dtype: torch.dtype = torch.bfloat16,
                        device: str = "cpu") -> "Pard2Drafter":
        """Load a released PARD-2 drafter (e.g. ``amd/PARD2-Qwen3-8B``) by hub id or local folder (tested on a
        local folder in that layout: tests/test_paper_mini.py).

        Expects the upstream export layout (docs/method.md §6.2): an HF causal LM whose config carries
        ``pard_token``, ``pard2_target_layers``, ``pard2_scale`` (optionally in subfolder ``pard_model/``),
        and ``warp_model.bin`` holding the ``[H, F]`` target projection (its single 2-D tensor is taken,
        whatever its key).

        Raises:
            OSError: if no model or no ``warp_model.bin`` is found.
        """
        from transformers import AutoModelForCausalLM

        local = Path(path_or_id)
        sub = "pard_model" if (local / "pard_model").is_dir() else None

        def _file(name: str) -> str:
            if local.is_dir():
                for cand in (local / name, local / "pard_model" / name):
                    if cand.exists():
                        return str(cand)
                raise OSError(f"{name} not found under {local}")
            from huggingface_hub import hf_hub_download

            return hf_hub_download(path_or_id, name)

        kwargs = {"dtype": dtype}
        if sub:
            kwargs["subfolder"] = sub
        lm = load_strict(AutoModelForCausalLM, path_or_id, "PARD-2 drafter LM", **kwargs).to(device)
        hc = lm.config
        warp = torch.load(_file("warp_model.bin"), map_location="cpu", weights_only=True)
        mats = [v for v in (warp.values() if isinstance(warp, dict) else [warp]) if v.ndim == 2]
        if len(mats) != 1:
            raise OSError(f"warp_model.bin of {path_or_id}: expected one 2-D projection, got {len(mats)}")
        W = mats[0]
        layer_ids = list(getattr(hc, "pard2_target_layers", PARD2_TARGET_LAYERS))
        L = target.num_layers if target is not None else getattr(hc, "pard2_target_num_layers", 36)
        # the features' width per layer is the target's hidden size; dividing the projection by the *listed*
        # layers is wrong for a target shallower than the list (ids that coincide are taken once: [-1, 0] at L=8)
        ht = target.hidden_size if target is not None else W.shape[1] // len(layer_ids)
        cfg = Pard2Config(num_layers=hc.num_hidden_layers, mask_token_id=int(getattr(hc, "pard_token")),
                          num_target_layers=L, target_hidden_size=ht, hidden_size=hc.hidden_size,
                          vocab_size=lm.get_input_embeddings().weight.shape[0], target_layer_ids=layer_ids,
                          feat_scale=float(getattr(hc, "pard2_scale", 0.02)))
        if cfg.feature_dim != W.shape[1]:
            raise ValueError(f"warp projection width {W.shape[1]} != features {cfg.feature_layers} x {ht} "
                             "(target too shallow for distinct feature layers?)")
        d = cls(cfg, lm)
        with torch.no_grad():
            d.target_proj.weight.copy_(W.to(d.target_proj.weight))
        return d

    # ------------------------------------------------------------------ save / load
    def save(self, out_dir: str | os.PathLike) -> Path:
        """Write ``pard2_config.json``, the LM (``lm/``, HF format) and ``target_proj.safetensors``."""
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.config.save(out / CONFIG_FILE)
        hc = self.lm.config  # upstream-style fields, for reference
        hc.pard_token = self.config.mask_token_id
        hc.pard2_target_layers = list(self.config.target_layer_ids)
        hc.pard2_scale = self.config.feat_scale
        hc.pard2_target_dim = self.config.feature_dim
        self.lm.save_pretrained(str(out / LM_DIR))
        save_file({"weight": self.target_proj.weight.detach().contiguous().cpu()}, str(out / PROJ_FILE))
        return out

    @classmethod
    def load(cls, path: str | os.PathLike, target=None, dtype: torch.dtype | None = None,
             device: str | torch.device | None = None) -> "Pard2Drafter":
        """Load a drafter written by :meth:`save`.

        Args:
            path: the folder.
            target: optional :class:`TargetModel`; its dtype/device are the defaults and its shape is checked.
        Raises:
            FileNotFoundError: if ``path`` holds no ``pard2_config.json``.
            ValueError: if ``target`` does not match the stored feature shape or vocabulary.
        """
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM

        path = Path(path)
        if not (path / CONFIG_FILE).exists():
            raise FileNotFoundError(f"{path / CONFIG_FILE} missing: not a PARD-2 drafter folder")
        cfg = Pard2Config.load(path / CONFIG_FILE)
        if target is not None:
            if (target.num_layers, target.hidden_size, target.vocab_size) != (
                    cfg.num_target_layers, cfg.target_hidden_size, cfg.vocab_size):
                raise ValueError(f"target (L={target.num_layers}, H={target.hidden_size}, V={target.vocab_size}) "
                                 f"does not match drafter config (L={cfg.num_target_layers}, "
                                 f"H={cfg.target_hidden_size}, V={cfg.vocab_size})")
            dtype = dtype or target.dtype
            device = device or target.device
        dtype = dtype or torch.float32
        lm = load_strict(AutoModelForCausalLM, path / LM_DIR, "PARD-2 drafter LM", dtype=dtype)
        if device is not None:
            lm = lm.to(device)
        d = cls(cfg, lm)
        w = load_file(str(path / PROJ_FILE))["weight"]
        with torch.no_grad():
            d.target_proj.weight.copy_(w.to(d.target_proj.weight))
        return d

    # ------------------------------------------------------------------ features
    @property
    def tap_layer_ids(self) -> list[int]:
        """Target layers to tap (pass to ``TargetModel.forward(layer_ids=...)``)."""
        return self.config.tap_layer_ids

    def features_from_taps(self, taps: torch.Tensor, final_norm: nn.Module) -> torch.Tensor:
        """Turn target taps at :attr:`tap_layer_ids` into PARD-2 features.

        Args:
            taps: ``[..., t * H_t]`` target taps in :attr:`tap_layer_ids` order.
            final_norm: the target's final norm (``TargetModel.final_norm``); applied to the final feature's tap.
        Returns:
            ``[..., F]`` features (``F = t * H_t``), in ``target_layer_ids`` order.
        """
        ht = self.config.target_hidden_size
        parts = taps.split(ht, dim=-1)
        if len(parts) != len(self.config.feature_layers):
            raise ValueError(f"taps width {taps.shape[-1]} != {len(self.config.feature_layers)} x {ht}")
        return torch.cat([final_norm(p) if lid == FINAL else p
                          for p, lid in zip(parts, self.config.feature_layers)], dim=-1)

    @torch.no_grad()
    def target_features(self, target, input_ids: torch.Tensor, past_key_values=None):
        """Run ``target`` over ``input_ids`` ``[b, S]``; return (features ``[b, S, F]``, :class:`TargetOutput`)."""
        out = target.forward(input_ids, layer_ids=self.tap_layer_ids, past_key_values=past_key_values)
        return self.features_from_taps(out.taps, target.final_norm), out

    # ------------------------------------------------------------------ forward
    @property
    def device(self) -> torch.device:
        return self.target_proj.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.target_proj.weight.dtype

    def embed(self, input_ids: torch.Tensor, in_feats: torch.Tensor | None) -> torch.Tensor:
        """``e = E[x] + s * W_p f``: ids ``[b, S]``, aligned input features ``[b, S, F]`` or None -> ``[b, S, H]``."""
        e = self.lm.get_input_embeddings()(input_ids)
        if in_feats is not None:
            e = e + self.config.feat_scale * self.target_proj(in_feats.to(self.dtype))
        return e

    def hidden(self, input_ids: torch.Tensor, in_feats: torch.Tensor | None = None,
               position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
               past_key_values=None) -> torch.Tensor:
        """Final-normed drafter states.

        Args:
            input_ids: ``[b, S]`` tokens (real and mask).
            in_feats: ``[b, S, F]`` input features already aligned (shifted), or None = target-independent.
            position_ids: ``[b, S]`` or ``[S]``; default ``past .. past + S - 1``.
            attention_mask: boolean ``[S, K]`` or ``[b, 1, S, K]`` (True = may attend) over keys
                ``[cached ; new]``; None = causal.
            past_key_values: a ``transformers`` cache, extended in place.
        Returns:
            ``[b, S, H]``.
        """
        b, S = input_ids.shape
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + S, device=input_ids.device)
        if position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0).expand(b, -1)
        mask = None
        if attention_mask is not None:
            if attention_mask.dim() == 2:
                attention_mask = attention_mask[None, None]
            # additive float mask: works for both the sdpa and the eager attention paths of HF models
            mask = torch.zeros(attention_mask.shape, dtype=self.dtype, device=input_ids.device)
            mask = mask.masked_fill(~attention_mask.bool(), torch.finfo(self.dtype).min)
            mask = mask.expand(b, 1, *mask.shape[-2:])
        out = self.lm.model(inputs_embeds=self.embed(input_ids, in_feats), attention_mask=mask,
                            position_ids=position_ids, past_key_values=past_key_values,
                            use_cache=past_key_values is not None)
        return out.last_hidden_state

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The drafter's LM head: ``[..., H]`` -> ``[..., V]``."""
        head = self.lm.get_output_embeddings()
        return project(hidden, head.weight, getattr(head, "bias", None))

    def forward(self, input_ids: torch.Tensor, in_feats: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                past_key_values=None) -> torch.Tensor:
        """Logits ``[b, S, V]``; arguments as in :meth:`hidden`."""
        return self.compute_logits(self.hidden(input_ids, in_feats, position_ids, attention_mask, past_key_values))

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def draft_logits(self, prefix_ids: torch.Tensor, feats: torch.Tensor | None, k: int | None = None,
                     past_key_values=None) -> torch.Tensor:
        """ONE forward over the pending real tokens + ``k - 1`` masks; the last ``k`` logits.

        Args:
            prefix_ids: ``[1, P]`` real tokens not yet in the draft cache (P >= 1), at positions
                ``past .. past + P - 1`` where ``past`` is the cache length.
            feats: ``[1, P, F]`` their **input** features, already shifted: ``feats[:, i]`` is the target feature
                of the token right before ``prefix_ids[:, i]`` (zeros for the sequence's first token; see
                :func:`shift_features`). In a decode loop these are exactly the features of the tokens the
                target committed since the last call — the last real token's own feature is not known yet.
                None = target-independent mode.
            k: drafts (default ``config.draft_k``).
            past_key_values: a ``DynamicCache`` holding earlier real tokens, or None. On return it holds the
                P real tokens too (the ``k - 1`` mask slots are cropped).
        Returns:
            ``[k, V]`` logits: row 0 from the last real token, row j from the j-th mask.
        Raises:
            ValueError: if ``k < 1``, ``P < 1`` or ``feats`` does not match ``prefix_ids``.
        """
        k = self.config.draft_k if k is None else int(k)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if prefix_ids.dim() != 2 or prefix_ids.shape[0] != 1 or prefix_ids.shape[1] < 1:
            raise ValueError(f"prefix_ids must be [1, P] with P >= 1, got {tuple(prefix_ids.shape)}")
        P = prefix_ids.shape[1]
        masks = torch.full((1, k - 1), self.config.mask_token_id, dtype=prefix_ids.dtype, device=prefix_ids.device)
        ids = torch.cat([prefix_ids, masks], dim=1)
        in_feats = None
        if feats is not None:
            if feats.shape[:2] != (1, P) or feats.shape[-1] != self.config.feature_dim:
                raise ValueError(f"feats must be [1, {P}, {self.config.feature_dim}], got {tuple(feats.shape)}")
            # masks repeat the last real token's input feature
            in_feats = torch.cat([feats, feats[:, -1:].expand(1, k - 1, -1)], dim=1)
        h = self.hidden(ids, in_feats, past_key_values=past_key_values)
        if past_key_values is not None and k > 1:
            past_key_values.crop(-(k - 1))
        return self.compute_logits(h[0, -k:]).float()

    @torch.no_grad()
    def draft(self, prefix_ids: torch.Tensor, feats: torch.Tensor | None, k: int | None = None,
              past_key_values=None) -> torch.Tensor:
        """Greedy drafts ``[k]`` from one forward; arguments as in :meth:`draft_logits`."""
        return self.draft_logits(prefix_ids, feats, k, past_key_values).argmax(-1)

    def new_cache(self):
        """A fresh ``transformers.DynamicCache`` for the drafter LM."""
        from transformers import DynamicCache

        return DynamicCache(config=self.lm.config)
