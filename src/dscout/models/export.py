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

z-lab's own loader (``dflash`` 0.1.0, ``DFlashDraftModel.from_pretrained``) reads the same config through
``Qwen3Config`` and ``model.safetensors``; it sizes ``fc`` as ``t * hidden_size`` and reads the taps from HF's
``output_hidden_states[l + 1]``, whose last entry is the *final-normed* state. Some of our drafters therefore have
no DFlash checkpoint that every DFlash runtime drafts with exactly as we do (:func:`dflash_format_problems`: a
reduced draft vocabulary, an ``fc`` bias, a tap of the target's last layer, a target wider than the drafter).
:func:`export_dflash` refuses them by name, and :func:`save_drafter` (what training and imports write) stores them
in our own layout instead: ``architectures: ["DScoutDrafter"]`` and the weights in ``dscout_drafter.safetensors``,
which z-lab's loader (no ``model.safetensors``), SGLang and vLLM (unknown architecture) all refuse, so no runtime
loads such a folder and drafts differently.

Our EAGLE-3 drafters have vLLM's EAGLE-3 layout as their serving format (:func:`export_vllm_eagle3`, checked by
:func:`check_vllm_eagle3_checkpoint`): vLLM drafts them as a chain, our engine's EAGLE-3 at ``topk = 1``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .common import rope_from_config as _rope
from .drafter import DFlashDrafter, DFlashDrafterConfig

LAYER_TENSORS = [
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
]
TOP_TENSORS = ["fc.weight", "hidden_norm.weight", "norm.weight"]
REQUIRED_CONFIG_KEYS = ["architectures", "model_type", "dflash_config", "num_target_layers",
                        "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                        "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
                        "max_position_embeddings", "vocab_size"]
"""Besides these: ``rope_theta`` (transformers 4 layout) or ``rope_parameters.rope_theta`` (what
``save_pretrained`` writes under transformers 5, e.g. z-lab's ``DFlashDraftModel.save_pretrained``)."""




def expected_tensor_names(num_layers: int) -> list[str]:
    """Every tensor name SGLang's DFlash loader reads for a ``num_layers``-layer drafter."""
    return TOP_TENSORS + [f"layers.{i}.{n}" for i in range(num_layers) for n in LAYER_TENSORS]


def decoder_shape_fields(cfg) -> dict:
    """The HF ``config.json`` keys of a drafter's decoder layers that every exported layout shares: sizes, heads,
    activation, norm epsilon, context length, RoPE (``rope_theta`` and ``rope_scaling``, transformers 4 layout) and
    the attention bias. ``cfg``: a :class:`DFlashDrafterConfig` or our EAGLE-3 config (same field names)."""
    rope = dict(cfg.rope_parameters or {})
    rope_scaling = None if rope.get("rope_type", "default") == "default" else {
        k: v for k, v in rope.items() if k != "rope_theta"}
    return {"hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "hidden_act": cfg.hidden_act, "rms_norm_eps": cfg.rms_norm_eps,
            "max_position_embeddings": cfg.max_position_embeddings, "rope_theta": rope.get("rope_theta", 10000.0),
            "rope_scaling": rope_scaling, "attention_bias": cfg.attention_bias}


def dflash_config_dict(cfg: DFlashDrafterConfig, dtype: str = "bfloat16") -> dict:
    """Our config in the DFlash/SGLang layout (keys listed in the module doc)."""
    d = cfg.num_hidden_layers
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": cfg.block_size,
        "dflash_config": {"target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id,
                          "block_size": cfg.block_size},
        "num_target_layers": cfg.num_target_layers,
        "num_hidden_layers": d,
        **decoder_shape_fields(cfg),
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


OWN_ARCHITECTURE = "DScoutDrafter"
"""``architectures[0]`` of a drafter saved in our own layout (no DFlash runtime knows it)."""
OWN_WEIGHTS = "dscout_drafter.safetensors"
"""Weights file of our own layout (not ``model.safetensors``: z-lab's and transformers' loaders do not find it)."""


def dflash_format_problems(cfg: DFlashDrafterConfig) -> list[str]:
    """Why a drafter has no DFlash checkpoint that z-lab's ``DFlashDraftModel``, SGLang and vLLM would draft with
    exactly as our engine does; empty = it has one.

    Each entry names the field and the reason:

    * ``draft_vocab_size``: a reduced draft vocabulary; the DFlash format drafts with the target's whole LM head,
      so a runtime would load the weights and draft over the full vocabulary;
    * ``fc_bias``: the format's ``fc`` has no bias (the bias would be dropped);
    * a tap of the target's last layer (id ``L - 1``): HF's ``output_hidden_states[L]``, which z-lab's runtime
      reads for it, is the final-normed state (our taps are pre-norm), and SGLang cannot capture it at all;
    * ``target_hidden_size != hidden_size``: upstream sizes ``fc`` as ``t * hidden_size``.
    """
    problems = []
    if cfg.draft_vocab_size is not None:
        problems.append(f"draft_vocab_size={cfg.draft_vocab_size}: the DFlash format drafts over the target's "
                        f"whole vocabulary ({cfg.vocab_size} tokens), a runtime would draft differently")
    if cfg.fc_bias:
        problems.append("fc_bias=True: the DFlash format's fc has no bias")
    if max(cfg.target_layer_ids) > cfg.num_target_layers - 2:
        problems.append(f"target layer {max(cfg.target_layer_ids)} is the target's last layer: it cannot be "
                        f"captured by SGLang (ids must be <= num_target_layers - 2 = {cfg.num_target_layers - 2}) and "
                        "z-lab's runtime would read its final-normed state")
    if cfg.target_hidden_size != cfg.hidden_size:
        problems.append(f"target_hidden_size={cfg.target_hidden_size} differs from hidden_size={cfg.hidden_size}: "
                        "upstream sizes fc as t * hidden_size")
    return problems


def _write(drafter: DFlashDrafter, out: Path, dtype: torch.dtype, weights: str, config: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in drafter.state_dict().items()}
    missing = set(expected_tensor_names(drafter.config.num_hidden_layers)) - set(state)
    if missing:
        raise ValueError(f"drafter state lacks tensors SGLang needs: {sorted(missing)[:5]}")
    for stale in (out / "model.safetensors", out / OWN_WEIGHTS):  # a re-save in the other layout
        if stale.name != weights and stale.exists():
            stale.unlink()
    save_file(state, str(out / weights), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def export_dflash(drafter: DFlashDrafter | str | os.PathLike, out_dir: str | os.PathLike,
                  dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write a drafter in the DFlash checkpoint format (``config.json`` + ``model.safetensors``), the one
    SGLang, vLLM and z-lab's ``DFlashDraftModel.from_pretrained`` read.

    Raises:
        ValueError: naming every :func:`dflash_format_problems` entry (e.g. a reduced draft vocabulary, a tap
            SGLang "cannot be captured"): such a checkpoint would load upstream and draft differently.
    """
    if not isinstance(drafter, DFlashDrafter):
        drafter = load_dflash_checkpoint(drafter)
    problems = dflash_format_problems(drafter.config)
    if problems:
        hint = (" (a reduced draft vocabulary has vLLM's variant of the format: export_vllm_dflash)"
                if drafter.config.draft_vocab_size is not None else "")
        raise ValueError("this drafter has no DFlash checkpoint format (upstream runtimes would load it and draft "
                         "differently): " + "; ".join(problems) + hint)
    name = str(dtype).replace("torch.", "")
    return _write(drafter, Path(out_dir), dtype, "model.safetensors", dflash_config_dict(drafter.config, name))


VLLM_FORMAT = "vllm-dflash-draft-vocab"
"""``dscout.format`` of a checkpoint in vLLM's reduced-vocabulary DFlash variant (:func:`export_vllm_dflash`)."""


def vllm_format_problems(cfg: DFlashDrafterConfig) -> list[str]:
    """Why a drafter has no checkpoint that vLLM's DFlash (``qwen3_dflash.py``) drafts with exactly as our engine
    does: :func:`dflash_format_problems` less the reduced vocabulary, which vLLM reads (``draft_vocab_size``,
    its own ``lm_head`` rows and a ``d2t`` offset map, as for EAGLE-3)."""
    return [p for p in dflash_format_problems(cfg) if not p.startswith("draft_vocab_size=")]


def export_vllm_dflash(drafter: DFlashDrafter | str | os.PathLike, out_dir: str | os.PathLike, target=None,
                       dtype: torch.dtype = torch.float32) -> Path:
    """Write a drafter in the layout vLLM's DFlash loader reads (``vllm/model_executor/models/qwen3_dflash.py``).

    A full-vocabulary drafter is written exactly as :func:`export_dflash` (vLLM, SGLang and z-lab read it alike).
    A reduced draft vocabulary (``draft_vocab_size = V_d``, the CPU default's drafters) becomes vLLM's own variant:
    ``config.json`` gains ``draft_vocab_size``, and ``model.safetensors`` gains ``lm_head.weight`` ``[V_d, D]`` (the
    target's LM-head rows of the drafted tokens, frozen as in training) and ``d2t`` ``[V_d]`` (target id minus
    draft index, EAGLE-3's offset convention: vLLM scatters draft logit ``i`` to target id ``i + d2t[i]``). SGLang
    and z-lab's loader have no such variant (they would draft over the whole vocabulary with the target's head):
    ``dscout.format`` names it (:data:`VLLM_FORMAT`) and :func:`check_dflash_checkpoint` refuses it for them.

    Args:
        drafter: a :class:`DFlashDrafter` (attached to its target when its vocabulary is reduced) or a checkpoint
            folder (then ``target`` is needed for a reduced vocabulary).
        target: the :class:`~dscout.models.target.TargetModel` whose head rows a reduced vocabulary uses.
        dtype: stored dtype (float32 by default: the CPU runtime's, for token-exact comparisons).
    Raises:
        ValueError: naming every :func:`vllm_format_problems` entry, or a reduced vocabulary without a target.
    """
    if not isinstance(drafter, DFlashDrafter):
        drafter = load_dflash_checkpoint(drafter)
        if target is not None:
            drafter = drafter.to(target.dtype).attach_target(target)
    cfg = drafter.config
    problems = vllm_format_problems(cfg)
    if problems:
        raise ValueError("this drafter has no vLLM DFlash checkpoint (vLLM would load it and draft differently): "
                         + "; ".join(problems))
    if cfg.draft_vocab_size is None:
        return export_dflash(drafter, out_dir, dtype)
    try:
        head, bias = drafter.head_rows()
    except RuntimeError as err:
        raise ValueError("a reduced draft vocabulary is exported with the target's LM-head rows: attach the target "
                         "(drafter.attach_target) or pass target=") from err
    if bias is not None:
        raise ValueError("the target's LM head has a bias; vLLM's DFlash head has none")
    ids = drafter.draft_token_ids.detach().cpu().long()
    name = str(dtype).replace("torch.", "")
    config = dflash_config_dict(cfg, name)
    config["draft_vocab_size"] = cfg.draft_vocab_size
    config["dscout"]["format"] = VLLM_FORMAT
    out = Path(out_dir)
    _write(drafter, out, dtype, "model.safetensors", config)
    state = {k: v.detach().to(dtype).contiguous() for k, v in drafter.state_dict().items() if k != "draft_token_ids"}
    state["lm_head.weight"] = head.detach().to(dtype).cpu().contiguous()
    state["d2t"] = (ids - torch.arange(cfg.draft_vocab_size)).contiguous()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def save_drafter(drafter: DFlashDrafter, out_dir: str | os.PathLike, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Save a trained or imported drafter for our engine: the DFlash format when it has one (:func:`export_dflash`),
    else our own layout (module doc), which every upstream loader refuses. :func:`load_dflash_checkpoint` reads both.
    """
    problems = dflash_format_problems(drafter.config)
    if not problems:
        return export_dflash(drafter, out_dir, dtype)
    config = dflash_config_dict(drafter.config, str(dtype).replace("torch.", ""))
    config.update(architectures=[OWN_ARCHITECTURE], model_type=DFlashDrafterConfig.model_type,
                  not_dflash_format=problems)
    return _write(drafter, Path(out_dir), dtype, OWN_WEIGHTS, config)


def check_dflash_checkpoint(path: str | os.PathLike, for_sglang: bool = True) -> list[str]:
    """Problems SGLang would hit (or silently ignore) with the checkpoint at ``path``; empty = loadable.

    ``for_sglang=False`` checks for our own loader instead: it skips the one check that only SGLang needs (no tap
    of the target's last layer) and accepts our own layout (:func:`save_drafter`).
    """
    path = Path(path)
    problems = []
    cfg = json.loads((path / "config.json").read_text())
    for k in REQUIRED_CONFIG_KEYS:
        if k not in cfg:
            problems.append(f"config.json lacks '{k}'")
    arch = (cfg.get("architectures") or [None])[0]
    if (cfg.get("dscout") or {}).get("format") == VLLM_FORMAT:
        problems.append(f"vLLM's reduced-vocabulary DFlash variant ({VLLM_FORMAT}: draft_vocab_size "
                        f"{cfg.get('draft_vocab_size')} with lm_head rows and d2t): SGLang, z-lab's loader and ours "
                        "would draft over the whole vocabulary; serve it with vLLM, or load the drafter's own folder")
    if arch == OWN_ARCHITECTURE and for_sglang:
        problems.append("saved in dscout's own layout, not the DFlash format: "
                        + "; ".join(cfg.get("not_dflash_format") or []))
    elif arch not in ("DFlashDraftModel", OWN_ARCHITECTURE):
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
    if _rope(cfg) is None:
        problems.append("config.json has neither 'rope_theta' nor 'rope_parameters.rope_theta'")
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
        width = (cfg.get("dscout") or {}).get("target_hidden_size") or cfg["hidden_size"]
        want = (cfg["hidden_size"], len(ids) * width)
        if shapes["fc.weight"] != want:
            problems.append(f"fc.weight has shape {shapes['fc.weight']}, SGLang expects {want}")
    return problems


def check_vllm_checkpoint(path: str | os.PathLike) -> list[str]:
    """Problems vLLM's DFlash loader would hit, or silently ignore, with the folder at ``path``; empty = loadable.

    vLLM loads a DFlash folder whose tensors are missing without a word (the drafter then drafts from its
    initialisation), so the serving backend checks before it launches a server: :func:`check_dflash_checkpoint`'s
    SGLang checks, with vLLM's reduced-vocabulary variant (:data:`VLLM_FORMAT`) accepted when it carries its
    ``lm_head.weight`` ``[draft_vocab_size, hidden]`` and ``d2t`` ``[draft_vocab_size]``.
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        return [f"no config.json in {path}"]
    problems = [p for p in check_dflash_checkpoint(path, for_sglang=True) if VLLM_FORMAT not in p]
    cfg = json.loads((path / "config.json").read_text())
    if (cfg.get("dscout") or {}).get("format") == VLLM_FORMAT:
        shapes = {}
        for f in path.glob("*.safetensors"):
            with safe_open(str(f), framework="pt") as h:
                shapes.update({n: tuple(h.get_slice(n).get_shape()) for n in h.keys()})
        vd = cfg.get("draft_vocab_size")
        for name, want in (("lm_head.weight", (vd, cfg.get("hidden_size"))), ("d2t", (vd,))):
            if shapes.get(name) != want:
                problems.append(f"{name} has shape {shapes.get(name)}, vLLM's variant needs {want}")
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
    rope = _rope(c)
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


# ---------------------------------------------------------------------------------------------- EAGLE-3 for vLLM
VLLM_EAGLE3_FORMAT = "vllm-eagle3"
"""``dscout.format`` of an EAGLE-3 drafter exported for vLLM (:func:`export_vllm_eagle3`)."""
VLLM_EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
"""``architectures[0]`` vLLM maps to ``Eagle3LlamaForCausalLM`` (``vllm/model_executor/models/registry.py``)."""


def vllm_eagle3_layer_ids(target_layer_ids) -> tuple[list[int], list[list[int]]]:
    """Our EAGLE-3 taps as vLLM's ``eagle_aux_hidden_state_layer_ids`` and which of our taps each one carries.

    vLLM's aux id ``j`` is the residual stream entering decoder layer ``j`` (``j = L``: after the last layer, before
    the final norm), i.e. our id ``j - 1``; the target captures each id once and concatenates them in increasing
    order (``EagleModelMixin._set_aux_hidden_state_layers``: ``sorted(set(ids))``).

    Returns:
        ``(ids, groups)``: vLLM's sorted distinct ids, and for each the positions in ``target_layer_ids`` of our
        taps it stands for (several when a layer is tapped twice: the default taps of a 4- to 6-layer target).
    """
    ours = [int(i) for i in target_layer_ids]
    ids = sorted(set(ours))
    return [i + 1 for i in ids], [[p for p, l in enumerate(ours) if l == i] for i in ids]


def vllm_eagle3_problems(cfg) -> list[str]:
    """Why an :class:`~dscout.models.eagle3.Eagle3DrafterConfig` has no checkpoint vLLM's EAGLE-3 drafter
    (``llama_eagle3.py``) computes as our engine does; empty = it has one.

    * ``hidden_act`` other than ``silu``: vLLM's ``LlamaMLP`` has no other activation;
    * ``target_hidden_size != hidden_size``: vLLM shares the target's input embedding only when its width is the
      drafter's, and would otherwise embed with an uninitialised table (ours always reads the target's).

    The rest maps exactly: one ``rms_norm_eps`` for every norm, the target's RoPE (``rope_theta`` /
    ``rope_scaling``, read as vLLM reads the target's), q/k/v/o biases (``attention_bias``), any taps (the last
    layer's output included: vLLM captures it before the final norm, as our taps are).
    """
    problems = []
    if cfg.hidden_act != "silu":
        problems.append(f"hidden_act={cfg.hidden_act!r}: vLLM's EAGLE-3 layer (LlamaMLP) supports silu only")
    if cfg.target_hidden_size != cfg.hidden_size:
        problems.append(f"target_hidden_size={cfg.target_hidden_size} differs from hidden_size={cfg.hidden_size}: "
                        "vLLM would embed tokens with the drafter's own (absent) table, not the target's")
    return problems


def vllm_eagle3_config_dict(cfg, dtype: str = "float32") -> dict:
    """The ``config.json`` of :func:`export_vllm_eagle3` (keys in its doc)."""
    aux, _ = vllm_eagle3_layer_ids(cfg.target_layer_ids)
    return {
        "architectures": [VLLM_EAGLE3_ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": 1,
        **decoder_shape_fields(cfg),
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": aux,
        "num_aux_hidden_states": len(aux),
        "torch_dtype": dtype,
        "dscout": {"format": VLLM_EAGLE3_FORMAT, "target_layer_ids": list(cfg.target_layer_ids),
                   "num_target_layers": cfg.num_target_layers},
    }


def export_vllm_eagle3(drafter, out_dir: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
    """Write an EAGLE-3 drafter in the layout vLLM's ``--speculative-config '{"method": "eagle3", ...}'`` loads
    (``vllm/model_executor/models/llama_eagle3.py``, config handling in ``vllm/transformers_utils/configs/eagle.py``
    and the target's tap capture in ``vllm/model_executor/models/interfaces.py``, vLLM 0.32.0).

    ``config.json``: ``architectures: ["LlamaForCausalLMEagle3"]``, ``model_type: llama`` and the layer shape
    (``hidden_size`` H, ``intermediate_size``, heads, ``head_dim``, ``rms_norm_eps``, ``rope_theta`` /
    ``rope_scaling``, ``attention_bias``, ``num_hidden_layers: 1``), ``vocab_size`` V (the target's),
    ``draft_vocab_size`` V_d, ``target_hidden_size``, and the taps as vLLM's ``eagle_aux_hidden_state_layer_ids``
    (our id + 1: vLLM's id j is the residual stream entering layer j, :func:`vllm_eagle3_layer_ids`) with
    ``num_aux_hidden_states``; ``dscout`` keeps our ids. ``model.safetensors`` (names as upstream EAGLE-3
    checkpoints: vLLM renames ``midlayer.`` to ``layers.0.``):

    * ``fc.weight`` ``[H, n * H_t]`` with ``n`` the distinct tapped layers, column blocks in increasing layer order
      (vLLM concatenates the captured states in that order). Our ``fc`` reads the taps in ``target_layer_ids``'
      order and may read a layer twice (the default taps of a 4- to 6-layer target, e.g. ``[1, 1, 0]``): its blocks
      are permuted, and a twice-read layer's blocks summed (``W_a h + W_b h = (W_a + W_b) h``: the same map up to
      rounding; vLLM captures a layer once);
    * ``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight`` ``[H]``,
      ``midlayer.self_attn.{q,k,v}_proj.weight`` ``[heads * head_dim, 2H]``, ``o_proj`` ``[H, heads * head_dim]``,
      ``midlayer.mlp.{gate,up}_proj.weight`` ``[I, H]``, ``down_proj`` ``[H, I]`` (biases when ``attention_bias``);
    * ``norm.weight`` ``[H]``, ``lm_head.weight`` ``[V_d, H]`` (the drafter's own head);
    * ``d2t`` ``[V_d]`` int64 (target id = ``i + d2t[i]``) and ``t2d`` ``[V]`` bool (vLLM skips it), only when
      ``V_d < V`` (vLLM has no map parameter for a full draft vocabulary, where ours is the identity).

    No ``embed_tokens``: vLLM then shares the target's embedding, as ours does. vLLM drafts a chain of
    ``num_speculative_tokens`` greedy (top-1) drafts, each step fed the previous step's pre-norm output: our
    :class:`~dscout.decoding.eagle3_proposer.Eagle3Proposer` at ``topk = 1``. A tree (``topk > 1``) has no vLLM
    counterpart; the serving backend refuses it (:func:`dscout.backends.vllm.speculative_config`).

    Args:
        drafter: an :class:`~dscout.models.eagle3.Eagle3Drafter` or its folder (``save_pretrained``).
        dtype: stored dtype (float32 by default: the CPU runtime's, for token-exact comparisons).
    Raises:
        ValueError: naming every :func:`vllm_eagle3_problems` entry (a checkpoint vLLM would load and draft with
            differently), or a full draft vocabulary whose map is not the identity.
    """
    from .eagle3 import Eagle3Drafter

    if not isinstance(drafter, Eagle3Drafter):
        from .strict import load_strict

        drafter = load_strict(Eagle3Drafter, drafter, "EAGLE-3 drafter")
    cfg = drafter.config
    problems = vllm_eagle3_problems(cfg)
    if problems:
        raise ValueError("this EAGLE-3 drafter has no vLLM EAGLE-3 checkpoint (vLLM would load it and draft "
                         "differently): " + "; ".join(problems))
    sd = {k: v.detach().cpu() for k, v in drafter.state_dict().items()}
    Vd, V, Ht = cfg.draft_vocab_size, cfg.vocab_size, cfg.target_hidden_size
    _, groups = vllm_eagle3_layer_ids(cfg.target_layer_ids)
    fc = sd["fc.weight"].double()
    blocks = [sum(fc[:, p * Ht:(p + 1) * Ht] for p in g) for g in groups]
    state = {"fc.weight": torch.cat(blocks, dim=1)}
    for n, t in sd.items():
        if n.startswith("midlayer.") or n in ("norm.weight", "lm_head.weight"):
            state[n] = t
    if Vd < V:
        state["d2t"], state["t2d"] = sd["d2t"].long(), sd["t2d"].bool()
    elif sd["d2t"].any():
        raise ValueError("a full draft vocabulary with a non-identity d2t map: vLLM reads no map for it")
    state = {n: (t.to(dtype) if t.is_floating_point() else t).contiguous() for n, t in state.items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.safetensors"):
        stale.unlink()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = vllm_eagle3_config_dict(cfg, str(dtype).replace("torch.", ""))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def check_vllm_eagle3_checkpoint(path: str | os.PathLike) -> list[str]:
    """Problems vLLM's EAGLE-3 loader would hit, or silently ignore, with the folder at ``path``; empty = loadable.

    vLLM loads an EAGLE-3 folder whose tensors are missing without a word (the drafter then drafts from its
    initialisation) and falls back to the target's default taps when the config names none, so the serving backend
    checks before it launches a server: the architecture, the taps, every tensor of :func:`export_vllm_eagle3` and
    its shape.
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        return [f"no config.json in {path}"]
    c = json.loads((path / "config.json").read_text())
    problems = []
    if (c.get("architectures") or [None])[0] != VLLM_EAGLE3_ARCHITECTURE:
        problems.append(f"architectures[0] must be '{VLLM_EAGLE3_ARCHITECTURE}'")
    for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "vocab_size", "draft_vocab_size", "rms_norm_eps", "eagle_aux_hidden_state_layer_ids"):
        if k not in c:
            problems.append(f"config.json lacks '{k}' (vLLM would fall back to a default)")
    if problems:
        return problems
    if c.get("hidden_act", "silu") != "silu":
        problems.append("hidden_act must be silu")
    aux = c["eagle_aux_hidden_state_layer_ids"]
    if list(aux) != sorted(set(aux)):
        problems.append(f"eagle_aux_hidden_state_layer_ids {aux} must be increasing (vLLM concatenates the captured "
                        "states in increasing layer order, each once)")
    H, I, Vd, V = c["hidden_size"], c["intermediate_size"], c["draft_vocab_size"], c["vocab_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    want = {"fc.weight": (H, len(aux) * c.get("target_hidden_size", H)), "norm.weight": (H,),
            "lm_head.weight": (Vd, H), "midlayer.input_layernorm.weight": (H,), "midlayer.hidden_norm.weight": (H,),
            "midlayer.post_attention_layernorm.weight": (H,), "midlayer.self_attn.q_proj.weight": (q, 2 * H),
            "midlayer.self_attn.k_proj.weight": (kv, 2 * H), "midlayer.self_attn.v_proj.weight": (kv, 2 * H),
            "midlayer.self_attn.o_proj.weight": (H, q), "midlayer.mlp.gate_proj.weight": (I, H),
            "midlayer.mlp.up_proj.weight": (I, H), "midlayer.mlp.down_proj.weight": (H, I)}
    if Vd < V:
        want["d2t"] = (Vd,)
    shapes = {}
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            for n in h.keys():
                key = n[len("model."):] if n.startswith("model.") else n
                shapes[key.replace("layers.0.", "midlayer.")] = tuple(h.get_slice(n).get_shape())
    for n, s in want.items():
        if n not in shapes:
            problems.append(f"missing tensor {n}")
        elif shapes[n] != s:
            problems.append(f"{n} has shape {shapes[n]}, vLLM expects {s}")
    return problems
