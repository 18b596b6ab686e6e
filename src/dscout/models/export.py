"""The DFlash checkpoint format: what SGLang's ``--speculative-algorithm DFLASH`` loads, and z-lab publishes.

SGLang (>= 0.5.11, ``srt/models/dflash.py``, ``srt/speculative/dflash_utils.py``) maps
``architectures[0] == "DFlashDraftModel"`` to its draft model, loads the config with ``AutoConfig`` (so
``model_type`` must be one transformers knows: ``qwen3``), and reads

* ``dflash_config.target_layer_ids`` (id l = output of target layer l; SGLang captures "before layer l + 1",
  so ids must be <= L - 2), ``dflash_config.mask_token_id`` (< vocab size), ``block_size`` (``dflash_config``
  first, then top level; default 16), ``num_target_layers``;
* the layer shape: ``num_hidden_layers``, ``hidden_size`` (= the target's), ``num_attention_heads``,
  ``num_key_value_heads``, ``head_dim``, ``intermediate_size``, ``hidden_act`` (``silu``), ``rms_norm_eps``,
  ``max_position_embeddings``, ``rope_theta`` / ``rope_scaling``, ``attention_bias``;
* tensors ``fc.weight`` ``[hidden, t * hidden]`` (shape checked), ``hidden_norm.weight``, ``norm.weight``,
  ``layers.{i}.{input_layernorm,post_attention_layernorm}.weight``,
  ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.self_attn.{q,k}_norm.weight``,
  ``layers.{i}.mlp.{gate,up,down}_proj.weight``. ``embed_tokens`` / ``lm_head`` are ignored (the target's are
  used), and a missing tensor is **not** detected by SGLang, hence :func:`check_dflash_checkpoint`.

Our drafter's module names already follow this layout, so export writes the weights as they are and rewrites
the config; import accepts the published checkpoints (``z-lab/Qwen3-8B-DFlash-b16``: top-level ``block_size``,
``dflash_config`` with the ids and the mask id, optional ``model.`` prefixes).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .drafter import DFlashDrafter, DFlashDrafterConfig

LAYER_TENSORS = [
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
]
TOP_TENSORS = ["fc.weight", "hidden_norm.weight", "norm.weight"]
REQUIRED_CONFIG_KEYS = ["architectures", "model_type", "block_size", "dflash_config", "num_target_layers",
                        "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                        "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
                        "max_position_embeddings", "rope_theta", "vocab_size"]


def expected_tensor_names(num_layers: int) -> list[str]:
    """Every tensor name SGLang's DFlash loader reads for a ``num_layers``-layer drafter."""
    return TOP_TENSORS + [f"layers.{i}.{n}" for i in range(num_layers) for n in LAYER_TENSORS]


def dflash_config_dict(cfg: DFlashDrafterConfig, dtype: str = "bfloat16") -> dict:
    """Our config in the DFlash/SGLang layout (keys listed in the module doc)."""
    rope = dict(cfg.rope_parameters or {})
    rope_scaling = None if rope.get("rope_type", "default") == "default" else {
        k: v for k, v in rope.items() if k != "rope_theta"}
    d = cfg.num_hidden_layers
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": cfg.block_size,
        "dflash_config": {"target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id,
                          "block_size": cfg.block_size},
        "num_target_layers": cfg.num_target_layers,
        "num_hidden_layers": d,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": rope.get("rope_theta", 10000.0),
        "rope_scaling": rope_scaling,
        "attention_bias": cfg.attention_bias,
        "attention_dropout": 0.0,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * d,
        "max_window_layers": d,
        "use_sliding_window": False,
        "sliding_window": None,
        "torch_dtype": dtype,
        "dscout": {"label": cfg.label, "fc_bias": cfg.fc_bias, "target_hidden_size": cfg.target_hidden_size,
                   "draft_vocab_size": cfg.draft_vocab_size},
    }


def export_dflash(drafter: DFlashDrafter | str | os.PathLike, out_dir: str | os.PathLike,
                  dtype: torch.dtype = torch.bfloat16, for_sglang: bool = True) -> Path:
    """Write a drafter in the DFlash checkpoint format (``config.json`` + ``model.safetensors``).

    Args:
        for_sglang: refuse drafters SGLang cannot serve (a tap of the target's last layer). Our own engine
            serves them, so the trainer saves with ``for_sglang=False``.
    Raises:
        ValueError: if ``for_sglang`` and a tapped layer is the target's last one or the drafter has a reduced
            draft vocabulary (SGLang's DFlash head is the target's whole one), or if fc has a bias (the
            DFlash format has none).
    """
    if not isinstance(drafter, DFlashDrafter):
        drafter = DFlashDrafter.from_pretrained(str(drafter))
    cfg = drafter.config
    if for_sglang and max(cfg.target_layer_ids) > cfg.num_target_layers - 2:
        raise ValueError(f"target layer {max(cfg.target_layer_ids)} cannot be captured by SGLang "
                         f"(ids must be <= num_target_layers - 2 = {cfg.num_target_layers - 2})")
    if cfg.fc_bias:
        raise ValueError("the DFlash format has no fc bias; train with fc_bias=False to export")
    if for_sglang and cfg.draft_vocab_size is not None:
        raise ValueError(f"SGLang's DFlash drafter predicts the target's whole vocabulary; this one drafts over "
                         f"{cfg.draft_vocab_size} tokens (options.draft_vocab_size): train without it to serve")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in drafter.state_dict().items()}
    missing = set(expected_tensor_names(cfg.num_hidden_layers)) - set(state)
    if missing:
        raise ValueError(f"drafter state lacks tensors SGLang needs: {sorted(missing)[:5]}")
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    name = str(dtype).replace("torch.", "")
    (out / "config.json").write_text(json.dumps(dflash_config_dict(cfg, name), indent=2))
    return out


def check_dflash_checkpoint(path: str | os.PathLike, for_sglang: bool = True) -> list[str]:
    """Problems SGLang would hit (or silently ignore) with the checkpoint at ``path``; empty = loadable.

    ``for_sglang=False`` skips the one check that only SGLang needs (no tap of the target's last layer).
    """
    path = Path(path)
    problems = []
    cfg = json.loads((path / "config.json").read_text())
    for k in REQUIRED_CONFIG_KEYS:
        if k not in cfg:
            problems.append(f"config.json lacks '{k}'")
    if cfg.get("architectures", [None])[0] != "DFlashDraftModel":
        problems.append("architectures[0] must be 'DFlashDraftModel'")
    dc = cfg.get("dflash_config", {})
    ids = dc.get("target_layer_ids", cfg.get("target_layer_ids"))
    L = dc.get("num_target_layers", cfg.get("num_target_layers"))
    if ids is None:
        problems.append("no target_layer_ids (SGLang would guess them from the spacing rule)")
    elif for_sglang and L is not None and max(ids) > L - 2:
        problems.append(f"target layer {max(ids)} > num_target_layers - 2")
    mask = dc.get("mask_token_id", cfg.get("mask_token_id"))
    if mask is None or not 0 <= mask < cfg.get("vocab_size", 0):
        problems.append(f"mask_token_id {mask} is not a row of the target embedding")
    if cfg.get("hidden_act") != "silu":
        problems.append("hidden_act must be silu")
    names, shapes = set(), {}
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            for n in h.keys():
                key = n[len("model."):] if n.startswith("model.") else n
                names.add(key)
                shapes[key] = tuple(h.get_slice(n).get_shape())
    for n in expected_tensor_names(cfg.get("num_hidden_layers", 0)):
        if n not in names:
            problems.append(f"missing tensor {n}")
    if "fc.weight" in shapes and ids is not None:
        want = (cfg["hidden_size"], len(ids) * cfg["hidden_size"])
        if shapes["fc.weight"] != want:
            problems.append(f"fc.weight has shape {shapes['fc.weight']}, SGLang expects {want}")
    return problems


def load_dflash_checkpoint(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> DFlashDrafter:
    """Load a DFlash-format checkpoint (ours exported, or a published z-lab one) as a :class:`DFlashDrafter`.

    Raises:
        ValueError: listing what :func:`check_dflash_checkpoint` finds wrong.
    """
    path = Path(path)
    problems = check_dflash_checkpoint(path, for_sglang=False)
    if problems:
        raise ValueError(f"{path} is not a loadable DFlash checkpoint: " + "; ".join(problems))
    c = json.loads((path / "config.json").read_text())
    dc = c.get("dflash_config", {})
    rope = {"rope_type": "default", "rope_theta": float(c.get("rope_theta", 1e6))}
    if c.get("rope_scaling"):
        rope.update(c["rope_scaling"])
    extra = c.get("dscout", {})
    cfg = DFlashDrafterConfig(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
        num_hidden_layers=c["num_hidden_layers"], num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"], head_dim=c["head_dim"], hidden_act=c["hidden_act"],
        rms_norm_eps=c["rms_norm_eps"], max_position_embeddings=c["max_position_embeddings"],
        rope_parameters=rope, attention_bias=c.get("attention_bias", False),
        target_layer_ids=dc.get("target_layer_ids", c.get("target_layer_ids")),
        num_target_layers=dc.get("num_target_layers", c["num_target_layers"]),
        target_hidden_size=extra.get("target_hidden_size", c["hidden_size"]),
        mask_token_id=dc.get("mask_token_id", c.get("mask_token_id")),
        block_size=dc.get("block_size", c.get("block_size", 16)),
        draft_vocab_size=extra.get("draft_vocab_size"))
    model = DFlashDrafter(cfg)
    state = {}
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            for n in h.keys():
                key = n[len("model."):] if n.startswith("model.") else n
                if key in model.state_dict():
                    state[key] = h.get_tensor(n)
    model.load_state_dict(state, strict=True)
    return model.to(dtype)


def drafter_for_target(path: str | os.PathLike, target, packed: bool = False) -> DFlashDrafter:
    """Load a DFlash-format checkpoint for decoding with ``target``: in the target's dtype and on its device,
    attached to its frozen embedding and head, in eval mode, with oneDNN-packed linears when ``packed`` (the
    CPU float32 setting ``benchmarks.cpu_packed_linear``; :func:`dscout.models.linear.pack_linears`).

    Raises:
        ValueError: for a checkpoint :func:`check_dflash_checkpoint` rejects.
    """
    drafter = load_dflash_checkpoint(path, dtype=target.dtype).to(target.device).attach_target(target).eval()
    if packed:
        from .linear import pack_linears

        pack_linears(drafter)
    return drafter
