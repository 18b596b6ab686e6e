"""Write small random drafter checkpoints in the *published* layouts, for the miniature paper run.

The paper preset imports EAGLE-3 (AngelSlim/Qwen3-8B_eagle3) and PARD-2 (amd/PARD2-Qwen3-8B) from the hub through
``drafters.<name>.pretrained``. presets/paper_mini.yaml runs that same import code offline, from local folders
that this module writes in those checkpoints' layouts for the miniature target (random weights, seed fixed):

* EAGLE-3 (``LlamaForCausalLMEagle3``, as yuhuili's and AngelSlim's exports): ``config.json`` with the keys
  ``architectures``, ``hidden_size``, ``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads``,
  ``head_dim``, ``rms_norm_eps``, ``rope_theta``, ``vocab_size``, ``draft_vocab_size``, ``num_hidden_layers`` (1),
  ``max_position_embeddings``, ``target_hidden_size``; ``model.safetensors`` with ``fc.weight``, ``midlayer.*``,
  ``norm.weight``, ``lm_head.weight`` ``[V_d, H]``, ``d2t`` ``[V_d]`` int64 (target id = i + d2t[i]) and ``t2d``
  ``[V]`` bool.
* PARD-2 (amd/PARD2-*): an HF causal LM of the target's class (``config.json`` + ``model.safetensors``) whose
  config carries ``pard_token``, ``pard2_target_layers``, ``pard2_scale``, plus ``warp_model.bin`` holding the
  single ``[H, F]`` projection of the target features.

:func:`check_published_layout` is the other direction: a plan-time check that a local folder has the files and
tensors its kind's importer reads, so a wrong folder stops the plan instead of the import job.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

EAGLE3_TENSORS = ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d")
"""Tensors every published EAGLE-3 checkpoint holds (optionally prefixed ``model.``), besides ``midlayer.*``."""


def write_published_eagle3(target, out_dir: str | os.PathLike, draft_vocab_size: int = 512, seed: int = 0) -> Path:
    """A random EAGLE-3 checkpoint for ``target`` in the published layout (see the module docstring).

    The draft vocabulary keeps the ``draft_vocab_size`` smallest ids plus the target's end-of-turn id (so the
    drafter can propose the stop token), as EAGLE's ``scandata`` maps would keep frequent ids.

    Args:
        target: :class:`~dscout.models.target.TargetModel`.
        out_dir: the folder to write.
        draft_vocab_size: ``V_d``.
    Returns:
        ``out_dir``.
    """
    import torch
    from safetensors.torch import save_file

    from .eagle3 import Eagle3Drafter, Eagle3DrafterConfig, build_vocab_map

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = Eagle3DrafterConfig.from_target(target.config, draft_vocab_size=draft_vocab_size)
    model = Eagle3Drafter(cfg)
    counts = torch.zeros(target.vocab_size)
    counts[:draft_vocab_size] = 1.0
    eos = target.model.generation_config.eos_token_id
    for e in (eos if isinstance(eos, list) else [eos]):
        if e is not None:
            counts[e] = 2.0
    d2t, t2d = build_vocab_map(counts, draft_vocab_size)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if not k.startswith("rotary_emb")}
    state["d2t"], state["t2d"] = d2t, t2d
    save_file(state, str(out / "model.safetensors"))
    tc = target.config
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": float(cfg.rope_parameters["rope_theta"]), "vocab_size": tc.vocab_size,
        "draft_vocab_size": draft_vocab_size, "num_hidden_layers": 1,
        "max_position_embeddings": cfg.max_position_embeddings, "target_hidden_size": tc.hidden_size,
        "hidden_act": "silu", "torch_dtype": "float32"}, indent=1))
    return out


def write_published_pard2(target, out_dir: str | os.PathLike, num_layers: int = 2, mask_token_id: int | None = None,
                          seed: int = 0) -> Path:
    """A PARD-2 checkpoint for ``target`` in the published layout (see the module docstring): the drafter LM is a
    ``num_layers``-layer copy of the target (PARD-2 drafters are small models of the target's family), its
    features projection random.

    Args:
        target: :class:`~dscout.models.target.TargetModel`.
        out_dir: the folder to write.
        num_layers: drafter LM depth.
        mask_token_id: ``pard_token`` (default: the target's ``vocab_size - 1``).
    Returns:
        ``out_dir``.
    """
    import torch

    from .pard import Pard2Drafter

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    d = Pard2Drafter.from_target(target, num_layers, mask_token_id=mask_token_id)
    hc = d.lm.config
    hc.pard_token = d.config.mask_token_id
    hc.pard2_target_layers = list(d.config.target_layer_ids)
    hc.pard2_scale = d.config.feat_scale
    d.lm.save_pretrained(str(out))
    torch.save({"proj.weight": d.target_proj.weight.detach().cpu().contiguous()}, out / "warp_model.bin")
    return out


def _safetensors_names(path: Path) -> list[str]:
    """Tensor names in a ``.safetensors`` file, read from its JSON header (no torch needed: plan time)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return [k for k in header if k != "__metadata__"]


def check_published_layout(kind: str, folder: str | os.PathLike) -> list[str]:
    """Problems that stop ``kind``'s importer from reading the local checkpoint ``folder`` (empty: it reads).

    Checked without torch (Snakemake plans with the standard library and its own dependencies):

    * ``eagle3``: ``config.json`` with ``draft_vocab_size``; ``*.safetensors`` holding ``fc.weight``,
      ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d`` (optionally prefixed ``model.``) and ``midlayer.*``
      or ``layers.0.*`` tensors (``pytorch_model.bin`` is accepted unread);
    * ``pard2``: ``config.json`` with ``pard_token`` and ``warp_model.bin`` (in the folder or ``pard_model/``);
    * ``dflash``: ``config.json`` with ``dflash_config`` or ``target_layer_ids``.

    Args:
        kind: drafter kind (``eagle3``, ``pard2``, ``dflash``; others are not checked).
        folder: the ``pretrained:`` folder.
    Returns:
        human-readable problems, each naming the file and the missing key or tensor.
    """
    folder = Path(folder)
    conf_path = folder / "config.json"
    if kind == "pard2" and not conf_path.is_file() and (folder / "pard_model" / "config.json").is_file():
        conf_path = folder / "pard_model" / "config.json"
    if not conf_path.is_file():
        return [f"{conf_path}: missing (a published {kind} checkpoint has a config.json)"]
    try:
        conf = json.loads(conf_path.read_text())
    except ValueError as err:
        return [f"{conf_path}: not JSON ({err})"]
    problems = []
    if kind == "eagle3":
        if "draft_vocab_size" not in conf:
            problems.append(f"{conf_path}: no key draft_vocab_size (an EAGLE-3 config; is this a {conf.get('architectures')} checkpoint?)")
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            if not (folder / "pytorch_model.bin").is_file():
                problems.append(f"{folder}: no *.safetensors or pytorch_model.bin weights file")
            return problems
        names = {n[len("model."):] if n.startswith("model.") else n for f in files for n in _safetensors_names(f)}
        for t in EAGLE3_TENSORS:
            if t not in names:
                problems.append(f"{files[0] if len(files) == 1 else folder}: no tensor '{t}' (EAGLE-3 layout: "
                                f"{', '.join(EAGLE3_TENSORS)}, midlayer.*)")
        if not any(n.startswith(("midlayer.", "layers.0.")) for n in names):
            problems.append(f"{folder}: no 'midlayer.*' (or 'layers.0.*') tensors: not an EAGLE-3 decoder layer")
    elif kind == "pard2":
        if "pard_token" not in conf:
            problems.append(f"{conf_path}: no key pard_token (a PARD-2 drafter config names its mask token)")
        if not any((folder / sub / "warp_model.bin").is_file() for sub in ("", "pard_model")):
            problems.append(f"{folder}: no file warp_model.bin (PARD-2's target-feature projection)")
    elif kind == "dflash":
        if "dflash_config" not in conf and "target_layer_ids" not in conf:
            problems.append(f"{conf_path}: no key dflash_config (a DFlash drafter config names its target layers)")
    return problems
