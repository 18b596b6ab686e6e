"""Closed-form memory estimate of one drafter update, for plan time (no torch: Snakemake plans without it).

:mod:`dscout.training.memory_plan` runs the update itself on fake tensors and is the reference;
this module writes the same bill as a formula in the config's numbers, so that ``config.check_plan`` can refuse a
config whose update cannot fit ``training.gpu_memory_gb`` before any job starts. tests/test_memory_plan.py holds
it within 15 % of the fake-tensor plan on every paper drafter (and on a micro-batch that does not fit).

Per rank, with ``e`` bytes per training element (2 in bf16), ``T = micro_batch_size x N x B`` block tokens,
``C = micro_batch_size x max_length`` context tokens, drafter depth ``d``, taps ``t``:

* weights: the target's and the drafter's parameters (and the drafter's tap-scale buffer), ``e`` bytes each;
* gradients / optimizer: ZeRO as the plan models it (stage 2: ``e P / N`` gradient partition plus the reduce
  buckets; ``12 P / N`` fp32 master and AdamW moments; stage 0: ``e P`` gradients and ``2 e P`` moments);
* activations: per drafter layer, ``T`` block tokens each keeping ``8 H + 4 I + 8 q + 10 kv`` elements for the
  backward (two RMSNorms at float32, Q/K norms and RoPE on ``q = heads x head_dim`` and ``kv = kv_heads x
  head_dim``, the SwiGLU's four ``I``-wide tensors) and the ``C`` context tokens' keys and values
  (``6 kv`` elements); once: the online taps (``t H`` per context token, twice: read and standardised), the fused
  context (``5 H``), the target's final states (``H``);
* logits: one chunk of float32 LM-head logits (256 MiB) and its softmax.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

KNOWN_TARGETS = {
    # config.json of the released checkpoints; the tiny random targets of dscout.models.target.prepare_target
    "Qwen/Qwen3-8B": ("qwen3", dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
                                    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                                    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    "gguf:smollm2": ("llama", dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                                   num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                                   rms_norm_eps=1e-5, tie_word_embeddings=True)),
    "tiny-random": ("llama", dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True)),
    "tiny-qwen3": ("qwen3", dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                                 rope_theta=1000000.0, tie_word_embeddings=False)),
}
"""Architectures of the targets the presets name, by ``target.source`` (``tiny-*`` by prefix)."""

LOGIT_CHUNK_BYTES = 1 << 28  # dscout.training.head.CHUNK_BYTES (kept equal by a test)


def known_target(source: str):
    """``(family, fields)`` of a known target source, or None."""
    src = str(source)
    known = KNOWN_TARGETS.get(src) or (KNOWN_TARGETS.get(src.split(":")[0]) if src.startswith("tiny-") else None)
    if known and src.startswith("tiny-random"):
        from ..data.models import tiny_random_attention

        heads, kv_heads, head_dim = tiny_random_attention(src)
        known = (known[0], {**known[1], "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                            "head_dim": head_dim})
    return known


def target_arch(target: dict, project_dir: str | Path | None = None) -> dict | None:
    """The shape fields of a config's target (known table, else a local ``config.json``); None when unknown.

    Returns:
        dict with ``hidden``, ``inter``, ``heads``, ``kv_heads``, ``head_dim``, ``layers``, ``vocab``, ``tied``,
        ``qk_norm`` (Qwen3's per-head norms).
    """
    known = known_target(target["source"])
    if known:
        family, f = known
    else:
        local = Path(str(target["source"]))
        local = local if local.is_absolute() else Path(project_dir or ".") / local
        if not (local / "config.json").is_file():
            return None
        f = json.loads((local / "config.json").read_text())
        family = "qwen3" if "qwen3" in str(f.get("model_type", "")) else "llama"
    heads = int(f["num_attention_heads"])
    return {"hidden": int(f["hidden_size"]), "inter": int(f["intermediate_size"]), "heads": heads,
            "kv_heads": int(f.get("num_key_value_heads") or heads),
            "head_dim": int(f.get("head_dim") or f["hidden_size"] // heads),
            "layers": int(target["num_layers"]), "vocab": int(target["vocab_size"]),
            "tied": bool(f.get("tie_word_embeddings", False)), "qk_norm": family == "qwen3"}


def _layer_params(a: dict) -> int:
    H, q, kv = a["hidden"], a["heads"] * a["head_dim"], a["kv_heads"] * a["head_dim"]
    return H * q + 2 * H * kv + q * H + 3 * H * a["inter"] + 2 * H + (2 * a["head_dim"] if a["qk_norm"] else 0)


def estimate_update(arch: dict, *, num_layers: int, num_taps: int, block_size: int, awl: bool,
                    micro_batch_size: int, seq_len: int, num_anchors: int, world: int, zero_stage: int,
                    bf16: bool, reduce_bucket: int = 500_000_000, overlap_comm: bool = False,
                    draft_vocab_size: int | None = None) -> dict:
    """Bytes per rank of one update at its worst case (every anchor a fully masked block of ``block_size``).

    Args:
        arch: :func:`target_arch`'s fields.
        num_layers, num_taps: d and t of the drafter; block_size: the recipe's largest horizon; awl: AWL's
            target terms are kept.
        micro_batch_size, seq_len, num_anchors: ``training.micro_batch_size``, ``responses.max_length``,
            ``training.num_anchors``.
        world, zero_stage, bf16, reduce_bucket, overlap_comm: the DeepSpeed sharding and precision.
        draft_vocab_size: a reduced draft vocabulary's size (None = the target's).
    Returns:
        ``{"weights", "gradients", "optimizer", "activations", "logits", "peak"}`` in bytes.
    Source: the module doc's bill; the reference is :func:`dscout.training.memory_plan.plan_update`.
    """
    e = 2 if bf16 else 4
    H, I, L, V = arch["hidden"], arch["inter"], arch["layers"], arch["vocab"]
    q, kv = arch["heads"] * arch["head_dim"], arch["kv_heads"] * arch["head_dim"]
    p_target = V * H * (1 if arch["tied"] else 2) + L * _layer_params(arch) + H
    p_drafter = num_taps * H * H + 2 * H + num_layers * _layer_params(arch)
    weights = (p_target + p_drafter + num_taps * H) * e
    if zero_stage >= 1:
        part = math.ceil(p_drafter / max(1, world))
        gradients = (e * part if zero_stage >= 2 else 0) + (2 if overlap_comm else 1) * min(reduce_bucket, p_drafter) * e
        optimizer = 12 * part
    else:
        gradients, optimizer = e * p_drafter, 2 * e * p_drafter
    n = min(num_anchors, max(seq_len - 2, 0))
    T = micro_batch_size * n * block_size
    C = micro_batch_size * seq_len
    per_token = 8 * H + 4 * I + 8 * q + 10 * kv
    activations = e * (num_layers * (T * per_token + C * 6 * kv) + C * (2 * num_taps * H + 5 * H + H))
    if awl:
        activations += C * (e * H + 4)
    vocab = draft_vocab_size or V
    m = micro_batch_size * n * (block_size - 1)
    logits = min(LOGIT_CHUNK_BYTES, 4 * m * vocab) * 2
    out = {"weights": weights, "gradients": gradients, "optimizer": optimizer, "activations": activations,
           "logits": logits}
    out["peak"] = sum(out.values())
    return out


def config_estimates(config: dict, project_dir: str | Path | None = None) -> dict[str, dict]:
    """:func:`estimate_update` for every DFlash/DScout drafter ``config`` trains (its ``drafters`` not
    ``pretrained``, the study's, the depth search's deepest), by name; {} when the target is unknown here.

    Raises:
        ValueError: naming ``training.deepspeed_config`` when it is not readable JSON.
    """
    from ..config import deep_merge, study_drafters
    from .recipes import get_recipe

    arch = target_arch(config["target"], project_dir)
    if arch is None:
        return {}
    variants = {n: v for n, v in config.get("drafters", {}).items() if not v.get("pretrained")}
    if config.get("study", {}).get("enabled"):
        variants.update(study_drafters(config))
    d = config.get("depth_search", {})
    if d.get("enabled"):
        variants[f"depth_d{max(d['candidates'])}"] = {"recipe": d["recipe"], "num_layers": max(d["candidates"]),
                                                      "num_taps": d["num_taps"]}
    out = {}
    for name, v in variants.items():
        if v.get("kind", "dflash") != "dflash":
            continue
        tr = deep_merge(config["training"], v.get("training") or {})
        path = Path(tr["deepspeed_config"])
        path = path if path.is_absolute() else Path(project_dir or ".") / path
        if not path.is_file():  # the training job names a missing file; nothing to estimate from here
            continue
        try:
            ds = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"training.deepspeed_config: {path} is not readable JSON ({err})") from err
        z = ds.get("zero_optimization") or {}
        recipe = get_recipe(v.get("recipe", "dscout"), **(v.get("recipe_overrides") or {}))
        taps = len(v["target_layer_ids"]) if v.get("target_layer_ids") else int(v.get("num_taps") or v["num_layers"])
        out[name] = estimate_update(
            arch, num_layers=int(v["num_layers"]), num_taps=taps, block_size=recipe.max_horizon,
            awl=recipe.weighting == "awl", micro_batch_size=int(tr["micro_batch_size"]),
            seq_len=int(config["responses"]["max_length"]), num_anchors=int(tr["num_anchors"]),
            world=max(1, int(tr.get("num_gpus") or 0)), zero_stage=int(z.get("stage", 0)),
            bf16=bool((ds.get("bf16") or {}).get("enabled")), reduce_bucket=int(float(z.get("reduce_bucket_size", 5e8))),
            overlap_comm=bool(z.get("overlap_comm", False)),
            draft_vocab_size=(v.get("options") or {}).get("draft_vocab_size"))
    return out


def memory_problems(config: dict, project_dir: str | Path | None = None) -> list[str]:
    """Plan-time check: every trained drafter's estimated update must fit ``training.gpu_memory_gb`` (default 80).

    Returns:
        one message per drafter over the limit, naming the keys to change; [] when all fit (or the target's
        architecture is not readable at plan time: the ``memory_plan`` target then gives the figures).
    """
    limit = float((config.get("training") or {}).get("gpu_memory_gb") or 80)
    out = []
    for name, est in config_estimates(config, project_dir).items():
        if est["peak"] > limit * 1e9:
            out.append(f"training.gpu_memory_gb: one update of drafter '{name}' needs an estimated "
                       f"{est['peak'] / 1e9:.0f} GB per GPU (weights {est['weights'] / 1e9:.0f}, activations "
                       f"{est['activations'] / 1e9:.0f}, optimizer {est['optimizer'] / 1e9:.0f}, gradients "
                       f"{est['gradients'] / 1e9:.0f}) but the GPUs have {limit:g} GB: lower "
                       "training.micro_batch_size (raise training.gradient_accumulation_steps to keep the batch), "
                       "training.num_anchors or responses.max_length (`dscout memory-plan` runs the update on "
                       "fake tensors for the exact figure)")
    return out
