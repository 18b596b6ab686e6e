"""Import a published drafter checkpoint into ``results/drafters/<id>/`` in place of training it.

The cluster preset benchmarks the baselines from their public releases, as the paper did (docs/method.md
§6): z-lab DFlash drafters, EAGLE-3 drafters (yuhuili / AngelSlim / SpecForge
layout) and PARD-2 drafters (amd/PARD2-*). Each is converted once into the folder layout our engine loads
for that kind, with a ``training_summary.json`` that records the source instead of training statistics.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


def _local(source: str) -> str:
    """A local folder as is; otherwise a hub id fetched with ``huggingface_hub`` (cluster only)."""
    if os.path.isdir(source):
        return source
    from huggingface_hub import snapshot_download

    return snapshot_download(source)


def target_skeleton(path: str | os.PathLike, dtype: torch.dtype = torch.float32):
    """The target's shape without its weights: a :class:`~dscout.models.target.TargetModel` built from
    ``config.json`` alone on PyTorch's ``meta`` device (no weight read, no memory, no GPU).

    An import (:func:`import_pretrained_drafter`) only checks a checkpoint against the target's vocabulary, hidden
    size and layer count and converts it in the target's dtype, so its job needs no target load (rules: an import
    asks for no GPU and little memory, src/dscout/resources.py).

    Raises:
        OSError: naming ``path`` when it holds no readable ``config.json`` (a hub id: not in the HF cache offline).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from .target import TargetModel

    try:
        config = AutoConfig.from_pretrained(str(path))
    except OSError as err:
        raise OSError(f"cannot read the target's config.json from '{path}': {err}") from err
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return TargetModel(model)


def import_pretrained_drafter(kind: str, source: str, target, out_dir: str | os.PathLike) -> dict:
    """Convert a published checkpoint of ``kind`` into ``out_dir`` and return its summary.

    Args:
        kind: ``dflash`` (DFlash format, served by SGLang as is), ``eagle3`` or ``pard2``.
        source: local folder or hub id.
        target: the :class:`~dscout.models.target.TargetModel` the drafter was trained for; its shape is checked.
        out_dir: the drafter folder (written: the kind's weights + ``training_summary.json``, last).
    Raises:
        ValueError: for an unknown kind, or a checkpoint that does not match the target (vocabulary, hidden
            size or layer count).
    """
    from ..kinds import DRAFTER_KINDS, resolve

    if kind not in DRAFTER_KINDS:
        raise ValueError(f"cannot import a '{kind}' drafter (known: {', '.join(DRAFTER_KINDS)})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    drafter, label = resolve(kind, "pretrained")(_local(source), target, out)
    summary = {"kind": kind, "pretrained": source, "label": label, "steps": 0,
               "drafter_parameters": sum(p.numel() for p in drafter.parameters())}
    (out / "training_summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def import_dflash(path: str, target, out: Path):
    """A DFlash-format checkpoint (z-lab ``DFlashDraftModel.save_pretrained``): re-saved in the same format (SGLang
    serves it as is; :func:`~dscout.models.export.save_drafter`)."""
    from .export import load_dflash_checkpoint, save_drafter

    drafter = load_dflash_checkpoint(path, dtype=torch.float32).attach_target(target)
    save_drafter(drafter, out, dtype=target.dtype)
    return drafter, f"{len(drafter.config.target_layer_ids)}t{drafter.config.num_hidden_layers}d"


def import_eagle3(path: str, target, out: Path):
    """An EAGLE-3 checkpoint (yuhuili / AngelSlim / SpecForge layout), saved as our Eagle3Drafter folder."""
    from .eagle3 import load_public_eagle3

    drafter = load_public_eagle3(path, target.config, dtype=target.dtype).attach_target(target)
    drafter.save_pretrained(str(out))
    return drafter, "eagle3"


def import_pard2(path: str, target, out: Path):
    """A PARD-2 checkpoint (amd/PARD2-*), saved as our Pard2Drafter folder."""
    from .pard import Pard2Drafter

    drafter = Pard2Drafter.from_pretrained(path, target=target, dtype=target.dtype)
    drafter.save(out)
    return drafter, "pard2"
