"""Memory plan: one real training update per drafter a config trains, run on fake tensors, peak bytes per GPU.

``dscout memory-plan --configfile presets/paper.yaml`` answers "does one update fit the GPU?" on any machine: it
builds the target (the preset's architecture, e.g. Qwen3-8B) and each drafter with *fake* tensors
(``torch._subclasses.fake_tensor.FakeTensorMode``: shapes, dtypes and strides, no storage), and runs the update's
own code on them: the target's online forward (:func:`dscout.training.features.online_batch`), the drafter's
forward and backward (:func:`dscout.training.step.blocks_loss`, the trainer's loss) and the optimizer step with
ZeRO's sharding over ``training.num_gpus`` (below). A :class:`MemoryTracker` (a ``TorchDispatchMode``) sees every
tensor an op returns, counts its storage once (rounded up to the CUDA caching allocator's 512-byte blocks on a GPU)
and drops it when Python frees the storage (a weakref callback), so its running total is what
``torch.cuda.max_memory_allocated`` reports on a GPU (allocator fragmentation and the CUDA context, ~0.5-1 GB, are
not in it: the fit check keeps 10 % headroom for them).

Shapes are the worst case of an update: ``micro_batch_size`` sequences of ``responses.max_length`` tokens, all of
them response tokens (a 1-token prompt), ``num_anchors`` blocks each at the recipe's largest horizon B, every
block fully masked (the most supervised tokens: intra-block unmasking only reveals some).

What stands in for the GPU (the plan's tensors live on a fake CPU device: this CPU-only torch cannot run the
fake-CUDA kernels transformers' mask construction calls):

* the fused attention kernel: ``flex_attention`` (:mod:`dscout.models.flex`) is modelled by its contract: it
  returns the output and keeps a ``[b, H, Q]`` float32 log-sum-exp for the backward, whose results are ``dq, dk,
  dv``; the ``BlockMask`` tables (``[b, 1, Q/128, K/128]`` int32, four of them) are allocated at their size.
* ZeRO (DeepSpeed ``stage_1_and_2.py``): stage 2 keeps the bf16 weights whole on each rank, gradients go through
  ``overlap_comm ? 2 : 1`` reduce buckets of ``reduce_bucket_size`` elements into this rank's bf16 gradient
  partition (``P / N``), and the optimizer holds the fp32 master partition and AdamW's two fp32 moments of it;
  the step makes an fp32 copy of the gradient partition. Stage 0 (the CPU JSON) keeps every gradient and AdamW's
  state for all parameters. Communication buffers beyond the buckets are not modelled.

Errors: a target whose architecture is not known (:func:`target_config`) raises ``ValueError`` naming
``target.source``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "logits")
"""Breakdown of a peak: target + drafter weights; gradients (and ZeRO's reduce buckets / partition); optimizer
state (fp32 master and AdamW moments); activations (the target's online features, the drafter's saved
activations and backward temporaries); logits (the chunked LM-head terms' float32 chunks and the target's lse)."""

from .memory_estimate import KNOWN_TARGETS, known_target  # noqa: E402  (the torch-free table)


def target_config(target: dict, project_dir: str | Path | None = None):
    """The ``transformers`` config of a config's ``target`` block (no weights are read).

    Known sources (:data:`KNOWN_TARGETS`, matched by name or ``name:layers`` prefix), else a local folder's
    ``config.json``, else the hub id's config from the local Hugging Face cache.

    Args:
        target: the ``target`` block (``source``, ``num_layers``, ``vocab_size``, ``attn_implementation``).
        project_dir: what a relative local source is relative to.
    Returns:
        a ``PreTrainedConfig`` with ``num_hidden_layers`` and ``vocab_size`` from the block.
    Raises:
        ValueError: naming ``target.source`` when its architecture cannot be found without a download.
    """
    from transformers import AutoConfig, LlamaConfig, Qwen3Config

    src = str(target["source"])
    known = known_target(src)
    if known:
        family, kw = known
        cls = Qwen3Config if family == "qwen3" else LlamaConfig
        cfg = cls(vocab_size=int(target["vocab_size"]), num_hidden_layers=int(target["num_layers"]), **kw)
    else:
        local = Path(src) if Path(src).is_absolute() else Path(project_dir or ".") / src
        try:
            cfg = AutoConfig.from_pretrained(str(local) if (local / "config.json").exists() else src,
                                             local_files_only=True)
        except Exception as err:  # noqa: BLE001 - any failure means: not readable offline
            raise ValueError(f"target.source: '{src}' is neither a known architecture ({', '.join(KNOWN_TARGETS)}) "
                             f"nor a readable config.json (local folder or Hugging Face cache): {err}") from err
    cfg._attn_implementation = target.get("attn_implementation") or "sdpa"
    return cfg


class MemoryTracker(TorchDispatchMode):
    """Live and peak bytes of tensor storages, by category, over the ops run inside it (fake or real tensors).

    Every tensor an op returns is looked up by its storage; a storage seen for the first time is counted (its
    ``nbytes`` rounded up to ``granularity``) under the current category and uncounted when it is freed (a
    weakref callback on the ``UntypedStorage``, which torch keeps as one Python object per storage). Views and
    in-place results share a storage and count once. Tensors made outside are counted with :meth:`adopt`.

    Args:
        granularity: allocation rounding in bytes (512: the CUDA caching allocator's block; 1 on a CPU).
    Attributes:
        live: bytes per category now; peak: the largest total; at_peak: ``live`` at that moment; phase_at_peak.
    """

    def __init__(self, granularity: int = 1):
        super().__init__()
        self.granularity = max(1, int(granularity))
        self.live = dict.fromkeys(CATEGORIES, 0)
        self.peak, self.at_peak, self.phase_at_peak = 0, dict(self.live), ""
        self._info = WeakIdKeyDictionary()
        self._category, self._phase = "activations", ""

    @contextlib.contextmanager
    def category(self, name: str, phase: str | None = None):
        """Count storages made inside under ``name`` (one of :data:`CATEGORIES`); ``phase`` names the moment."""
        if name not in CATEGORIES:
            raise ValueError(f"unknown memory category {name!r} (one of {', '.join(CATEGORIES)})")
        old = self._category, self._phase
        self._category, self._phase = name, phase if phase is not None else self._phase
        try:
            yield
        finally:
            self._category, self._phase = old

    @contextlib.contextmanager
    def phase(self, name: str):
        old, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = old

    def _nbytes(self, st) -> int:
        n = int(st.nbytes())
        return -(-n // self.granularity) * self.granularity if n else 0

    def _freed(self, entry, _ref) -> None:
        self.live[entry[1]] -= entry[0]

    def track(self, t: torch.Tensor, category: str | None = None) -> None:
        """Count ``t``'s storage (once) under ``category`` (default: the current one); a known storage given a
        category moves to it."""
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        st = t.untyped_storage()
        cat = category or self._category
        entry = self._info.get(st)
        if entry is not None:
            if category is not None and entry[1] != category:
                self.live[entry[1]] -= entry[0]
                entry[1] = category
                self.live[category] += entry[0]
            return
        entry = [self._nbytes(st), cat, None]
        entry[2] = weakref.ref(st, lambda r, e=entry: self._freed(e, r))
        self._info[st] = entry
        self.live[cat] += entry[0]
        self._update_peak()

    def adopt(self, tensors, category: str) -> None:
        """Count tensors made outside the tracker (e.g. weights) under ``category``."""
        for t in tensors:
            self.track(t, category)

    def _update_peak(self) -> None:
        total = sum(self.live.values())
        if total > self.peak:
            self.peak, self.at_peak, self.phase_at_peak = total, dict(self.live), self._phase

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, self.track, out)
        return out


# ------------------------------------------------------------------------------------------ GPU stand-ins
class _KernelBlockMask:
    """What a flex ``BlockMask`` holds for the kernel (its four int32 tile tables), allocated at their size."""

    def __init__(self, b: int, q_len: int, kv_len: int, device):
        qt, kt = math.ceil(q_len / 128), math.ceil(kv_len / 128)
        self.tables = [torch.empty(b, 1, qt, kt, dtype=torch.int32, device=device) for _ in range(2)] + \
                      [torch.empty(b, 1, qt, dtype=torch.int32, device=device) for _ in range(2)]


class _FusedAttention(torch.autograd.Function):
    """Memory model of a fused attention kernel (flex / flash): output + float32 lse forward, dq/dk/dv backward."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        delta = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)  # rowsum(dO * O)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        del delta
        return dq, dk, dv


@contextlib.contextmanager
def fused_attention_model():
    """Replace :mod:`dscout.models.flex`'s mask and kernel by their memory models while the plan runs."""
    from ..models import flex

    saved = flex.block_mask, flex.flex_attend

    def block_mask(anchors, keep, seq_len, block_size):
        b, n = anchors.shape
        return _KernelBlockMask(b, n * block_size, seq_len + n * block_size, anchors.device)

    def attend(q, k, v, mask, scale, enable_gqa):
        return _FusedAttention.apply(q, k, v)

    flex.block_mask, flex.flex_attend = block_mask, attend
    try:
        yield
    finally:
        flex.block_mask, flex.flex_attend = saved


@contextlib.contextmanager
def _logits_category(tracker: MemoryTracker):
    """Count the LM-head chunks (drafter CE / AWL terms and the target's lse) as ``logits``."""
    from . import head

    fn, fwd, bwd = head.chunked_logsumexp, head._ChunkedHeadCE.forward, head._ChunkedHeadCE.backward

    def wrap(f):
        def inner(*a, **k):
            with tracker.category("logits"):
                return f(*a, **k)
        return inner

    head.chunked_logsumexp = wrap(fn)
    head._ChunkedHeadCE.forward = staticmethod(wrap(fwd))
    head._ChunkedHeadCE.backward = staticmethod(wrap(bwd))
    try:
        yield
    finally:
        head.chunked_logsumexp = fn
        head._ChunkedHeadCE.forward, head._ChunkedHeadCE.backward = staticmethod(fwd), staticmethod(bwd)


# ------------------------------------------------------------------------------------------ the plan
@dataclasses.dataclass
class UpdatePlan:
    """Peak memory of one training update of one drafter, on one GPU (rank).

    Attributes:
        name: the drafter (e.g. ``dscout``, ``study_step4_awl``); label: ``{t}t{d}d``; recipe.
        shape: the update's shapes (micro-batch, sequence length, anchors, B, supervised tokens).
        world, zero_stage, dtype: the sharding and precision modelled.
        peak_bytes: the peak; breakdown: bytes per :data:`CATEGORIES` at the peak; phase: when it occurs.
        drafter_parameters, target_parameters: counts.
        seconds: wall time of the plan itself.
    """

    name: str
    label: str
    recipe: str
    shape: dict
    world: int
    zero_stage: int
    dtype: str
    peak_bytes: int
    breakdown: dict
    phase: str
    drafter_parameters: int
    target_parameters: int
    seconds: float

    def fits(self, gpu_gb: float, headroom: float = 0.10) -> bool:
        """Whether the peak leaves ``headroom`` (a fraction) of a ``gpu_gb`` GB (10^9 bytes) GPU free."""
        return self.peak_bytes <= (1.0 - headroom) * gpu_gb * 1e9


def trained_drafters(config: dict) -> dict[str, dict]:
    """Every drafter variant ``config`` trains, by name: ``drafters`` (not ``pretrained``), the recipe study's
    (``study_<recipe>``) and the depth search's deepest candidate (``depth_d<d>``; memory grows with d)."""
    from ..config import study_drafters

    out = {n: dict(v) for n, v in config.get("drafters", {}).items() if not v.get("pretrained")}
    if config.get("study", {}).get("enabled"):
        out.update(study_drafters(config))
    d = config.get("depth_search", {})
    if d.get("enabled"):
        dd = max(d["candidates"])
        out[f"depth_d{dd}"] = {"recipe": d["recipe"], "num_layers": dd, "num_taps": d["num_taps"],
                               **({"options": dict(d["options"])} if d.get("options") else {})}
    return out


def _deepspeed_settings(training: dict, project_dir) -> dict:
    path = Path(training["deepspeed_config"])
    path = path if path.is_absolute() else Path(project_dir or ".") / path
    if not path.is_file():
        raise FileNotFoundError(f"training.deepspeed_config: {path} not found")
    ds = json.loads(path.read_text())
    z = ds.get("zero_optimization") or {}
    return {"stage": int(z.get("stage", 0)), "bf16": bool((ds.get("bf16") or {}).get("enabled")),
            "bucket": int(float(z.get("reduce_bucket_size", 5e8))), "overlap": bool(z.get("overlap_comm", False))}


def worst_case_inputs(micro_batch_size: int, seq_len: int, num_anchors: int, recipe, vocab_size: int,
                      mask_token_id: int, seed: int = 0) -> tuple[list[dict], object]:
    """The largest update of a recipe: ``micro_batch_size`` sequences of ``seq_len`` tokens, all response tokens
    but the first, ``num_anchors`` fully masked blocks each at the recipe's largest horizon.

    Returns:
        ``(sequences, plan)``: token dicts (``input_ids``, ``loss_mask``) for
        :func:`~dscout.training.features.online_batch` and their :class:`~dscout.training.step.BlockPlan`.
    """
    from .step import plan_blocks

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, max(1, min(vocab_size, mask_token_id)), (micro_batch_size, seq_len), generator=g)
    loss_mask = torch.ones(micro_batch_size, seq_len, dtype=torch.long)
    loss_mask[:, 0] = 0
    plan = plan_blocks(ids, loss_mask, dataclasses.replace(recipe, unmask=False), num_anchors, g, mask_token_id,
                       block_size=recipe.max_horizon)
    return [{"input_ids": ids[i].tolist(), "loss_mask": loss_mask[i].tolist()} for i in range(micro_batch_size)], plan


def plan_update(config: dict, name: str, variant: dict | None = None, *, gpu: bool = True,
                project_dir: str | Path | None = None, world: int | None = None, hf_config=None) -> UpdatePlan:
    """Run one update of drafter ``name`` of ``config`` on fake tensors and return its peak memory per rank.

    Args:
        config: a merged, validated config (:func:`dscout.config.load_config`).
        name: the drafter; variant: its variant (default ``config["drafters"][name]``; study/depth variants from
            :func:`trained_drafters`).
        gpu: model the GPU (512-byte allocator blocks, the fused attention kernel, ``foreach`` AdamW); False = the
            CPU path of the same code (dense-mask SDPA, fused CPU AdamW, no rounding): the calibration mode.
        project_dir: folder the DeepSpeed JSON path is relative to.
        world: ranks sharing ZeRO's partitions (default ``max(1, training.num_gpus)``).
        hf_config: the target's ``transformers`` config (default :func:`target_config` of ``config["target"]``).
    Returns:
        :class:`UpdatePlan`.
    Raises:
        ValueError: for a drafter kind other than ``dflash`` (EAGLE-3 / PARD-2 training is not planned), or an
            unknown target architecture (:func:`target_config`).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoModelForCausalLM

    from ..config import deep_merge
    from ..models.target import TargetModel
    from .features import online_batch
    from .methods import DFlashMethod
    from .recipes import get_recipe
    from .step import blocks_loss
    from .trainer import TrainConfig

    t0 = time.perf_counter()
    v = dict(variant if variant is not None else config["drafters"][name])
    kind = v.get("kind", "dflash")
    if kind != "dflash":
        raise ValueError(f"drafters.{name}: the memory plan runs DFlash/DScout updates only (kind {kind!r})")
    tr = deep_merge(config["training"], v.get("training") or {})
    ds = _deepspeed_settings(tr, project_dir)
    world = int(world or max(1, int(tr.get("num_gpus") or 0)))
    dtype = torch.bfloat16 if config["target"].get("dtype") == "bfloat16" else torch.float32
    recipe = get_recipe(v.get("recipe", "dscout"), **(v.get("recipe_overrides") or {}))
    B = recipe.max_horizon
    mbs, S, n_anchors = int(tr["micro_batch_size"]), int(config["responses"]["max_length"]), int(tr["num_anchors"])
    options = dict(v.get("options") or {})
    cfg = TrainConfig(recipe=v.get("recipe", "dscout"), recipe_overrides=v.get("recipe_overrides") or {},
                      num_layers=int(v["num_layers"]), target_layer_ids=v.get("target_layer_ids"),
                      num_taps=v.get("num_taps"), mask_token_id=int(config["target"]["mask_token_id"]),
                      num_anchors=n_anchors, micro_batch_size=mbs, dtype=str(dtype).replace("torch.", ""),
                      init_from_target=False, options=options)
    tcfg = hf_config if hf_config is not None else target_config(config["target"], project_dir)

    sequences, plan = worst_case_inputs(mbs, S, n_anchors, recipe, int(config["target"]["vocab_size"]),
                                        cfg.mask_token_id)

    tracker = MemoryTracker(granularity=512 if gpu else 1)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(tcfg, dtype=dtype)
    method = DFlashMethod(cfg)
    meta_drafter = _meta_drafter(method, tcfg, dtype)
    with FakeTensorMode(allow_non_fake_inputs=True):
        target = TargetModel(hf.to_empty(device="cpu"))
        drafter = meta_drafter.to_empty(device="cpu").attach_target(target)
        method.model = drafter
        drafter.set_tap_scale(torch.ones(drafter.tap_scale.shape))  # the trainer's standardised taps (prepare)
        params = [p for p in drafter.parameters() if p.requires_grad]
        n_params = sum(p.numel() for p in params)
        state = _ZeroState(params, ds, world, dtype, gpu, tr)
        tracker.adopt(list(hf.parameters()) + list(hf.buffers()) + list(drafter.parameters())
                      + list(drafter.buffers()), "weights")
        state.adopt(tracker)
        drafter.train()
        with tracker, _logits_category(tracker), (fused_attention_model() if gpu else contextlib.nullcontext()):
            with tracker.phase("target forward (online features)"):
                batch = online_batch(target, sequences, method.layer_ids)
                batch.taps, batch.final_hidden = batch.taps.to(dtype), batch.final_hidden.to(dtype)
            with tracker.phase("drafter forward"):
                loss, _ = blocks_loss(drafter, batch, plan, method.recipe, attention="flex" if gpu else "sdpa",
                                      metrics=False)
            with tracker.phase("drafter backward"):
                loss.backward()
            with tracker.phase("optimizer step"):
                state.step(tracker)
            del loss, batch
    return UpdatePlan(name=name, label=drafter.config.label, recipe=cfg.recipe,
                      shape={"micro_batch_size": mbs, "seq_len": S, "num_anchors": int(plan.blocks.anchors.shape[1]),
                             "block_size": B, "supervised_tokens": plan.num_supervised,
                             "awl": recipe.weighting == "awl"},
                      world=world, zero_stage=ds["stage"], dtype=str(dtype).replace("torch.", ""),
                      peak_bytes=int(tracker.peak), breakdown=dict(tracker.at_peak), phase=tracker.phase_at_peak,
                      drafter_parameters=int(n_params), target_parameters=int(sum(p.numel() for p in hf.parameters())),
                      seconds=time.perf_counter() - t0)


def _meta_drafter(method, target_config, dtype):
    """:func:`~dscout.training.methods.build_drafter`'s drafter on the meta device, in ``dtype`` (no
    initialisation: values do not matter here; a module of fake tensors cannot be converted by ``.to``)."""
    from ..models.drafter import DFlashDrafter, DFlashDrafterConfig

    c = method.cfg
    dcfg = DFlashDrafterConfig.from_target(
        target_config, num_hidden_layers=c.num_layers, mask_token_id=c.mask_token_id,
        target_layer_ids=c.target_layer_ids, num_taps=c.num_taps, block_size=method.recipe.max_horizon,
        draft_vocab_size=c.options.get("draft_vocab_size"))
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            drafter = DFlashDrafter(dcfg)
    finally:
        torch.set_default_dtype(default)
    method.layer_ids = list(dcfg.target_layer_ids)
    return drafter


class _ZeroState:
    """The optimizer side of an update as DeepSpeed keeps it on one rank (see the module doc)."""

    def __init__(self, params, ds: dict, world: int, dtype, gpu: bool, tr: dict):
        self.params, self.ds, self.world = params, ds, world
        n = sum(p.numel() for p in params)
        self.sharded = ds["stage"] >= 1
        if self.sharded:
            part = -(-n // world)
            self.master = torch.empty(part, dtype=torch.float32)
            self.grad_partition = torch.empty(part, dtype=dtype) if ds["stage"] >= 2 else None
            k = min(ds["bucket"], n)
            self.buckets = [torch.empty(k, dtype=dtype) for _ in range(2 if ds["overlap"] else 1)]
            self.opt_params = [self.master]
            self._hooks = [p.register_post_accumulate_grad_hook(self._reduce) for p in params]
            self._fill = 0
        else:
            self.master, self.grad_partition, self.buckets = None, None, []
            self.opt_params = params
        kw = {"foreach": True} if gpu else {"fused": True}
        self.opt = torch.optim.AdamW(self.opt_params, lr=float(tr.get("lr", 6e-4)),
                                     weight_decay=float(tr.get("weight_decay", 0.0)), **kw)
        for p in self.opt_params:  # the moments exist from the first update on: plan a later one
            self.opt.state[p]["step"] = torch.tensor(0.0)
            self.opt.state[p]["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            self.opt.state[p]["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def adopt(self, tracker: MemoryTracker) -> None:
        tracker.adopt([s for st in self.opt.state.values() for s in st.values()], "optimizer")
        if self.master is not None:
            tracker.adopt([self.master], "optimizer")
        if self.grad_partition is not None:
            tracker.adopt([self.grad_partition], "gradients")
        tracker.adopt(self.buckets, "gradients")
        self.tracker = tracker

    def _reduce(self, p) -> None:
        """A finished gradient goes into the reduce bucket (then its partition slice) and is freed, as ZeRO-2."""
        if p.grad is None:
            return
        flat = p.grad.reshape(-1)
        size = self.buckets[0].numel()
        for s in range(0, flat.numel(), size):
            n = min(size, flat.numel() - s)
            self.buckets[0][:n].copy_(flat[s:s + n])
        p.grad = None

    def step(self, tracker: MemoryTracker) -> None:
        if self.sharded:
            with tracker.category("optimizer"):
                src = self.grad_partition if self.grad_partition is not None else self.master
                self.master.grad = src.float()  # the fp32 gradient of this rank's partition
                torch.nn.utils.clip_grad_norm_([self.master], 1.0)
                self.opt.step()
                self.master.grad = None
        else:
            tracker.adopt([p.grad for p in self.params if p.grad is not None], "gradients")
            with tracker.category("optimizer"):
                torch.nn.utils.clip_grad_norm_(self.params, 1.0)
                self.opt.step()


def memory_plan(config: dict, project_dir: str | Path | None = None, gpu: bool = True,
                names: list[str] | None = None) -> list:
    """:func:`plan_update` for every drafter ``config`` trains (:func:`trained_drafters`); kinds other than
    dflash are listed as ``(name, reason)`` instead of a plan. ``names`` restricts the list."""
    from ..config import deep_merge
    from .recipes import get_recipe

    out, seen = [], {}
    for name, v in trained_drafters(config).items():
        if names and name not in names:
            continue
        kind = v.get("kind", "dflash")
        if kind != "dflash":
            out.append((name, f"kind {kind}: not planned (its update is not the block-diffusion one)"))
            continue
        recipe = get_recipe(v.get("recipe", "dscout"), **(v.get("recipe_overrides") or {}))
        # what the memory of an update depends on: drafters that agree on it share one run
        key = json.dumps([v["num_layers"], v.get("num_taps"), v.get("target_layer_ids"), recipe.max_horizon,
                          recipe.weighting == "awl", (v.get("options") or {}).get("draft_vocab_size"),
                          deep_merge(config["training"], v.get("training") or {}) | {"max_steps": None}],
                         sort_keys=True, default=str)
        if key in seen:
            out.append(dataclasses.replace(seen[key], name=name, recipe=v.get("recipe", "dscout")))
            continue
        seen[key] = plan_update(config, name, v, gpu=gpu, project_dir=project_dir)
        out.append(seen[key])
    return out


def format_plan(plans: list, gpu_gb: float) -> str:
    """A markdown table of :func:`memory_plan`'s result: peak GB (10^9 bytes) per GPU, breakdown, fit."""
    head = ("| drafter | shape | recipe | mbs x S, anchors x B | supervised | peak GB/GPU | " + " | ".join(CATEGORIES)
            + f" | at | fits {gpu_gb:g} GB (10 % headroom) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for p in plans:
        if isinstance(p, tuple):
            lines.append(f"| {p[0]} | - | - | - | - | - | " + " | ".join("-" for _ in CATEGORIES) + f" | {p[1]} | - |")
            continue
        s = p.shape
        lines.append(f"| {p.name} | {p.label} | {p.recipe} | {s['micro_batch_size']} x {s['seq_len']}, "
                     f"{s['num_anchors']} x {s['block_size']} | {s['supervised_tokens']} | {p.peak_bytes / 1e9:.2f} | "
                     + " | ".join(f"{p.breakdown[c] / 1e9:.2f}" for c in CATEGORIES)
                     + f" | {p.phase} | {'yes' if p.fits(gpu_gb) else 'NO'} |")
    return "\n".join(lines)


def run_memory_plan(configfiles: list[str] | None = None, stage: str | None = None, out: str | None = None,
                    gpu_gb: float | None = None, names: list[str] | None = None,
                    project_dir: str | Path | None = None) -> list:
    """``dscout memory-plan``: plan every trained drafter of a config, print the table, optionally write it.

    Args:
        configfiles: files merged over the project's ``config.yaml`` (as ``snakemake --configfile``), or
        stage: the merged config as JSON (what the ``memory_plan`` rule passes).
        out: a ``.md`` path for the table (a ``.json`` of the plans is written beside it).
        gpu_gb: the GPU's memory (default ``training.gpu_memory_gb``, else 80).
        names: only these drafters.
        project_dir: the project folder (default: the one holding this package's ``config.yaml``).
    Returns:
        :func:`memory_plan`'s list.
    Raises:
        SystemExit: (code 1, after printing and writing) when a drafter does not fit ``gpu_gb`` with 10 % headroom.
    """
    from ..config import load_config, validate_config

    root = Path(project_dir) if project_dir else Path(__file__).resolve().parents[3]
    if stage is not None:
        config = validate_config(json.loads(stage), source="--stage")
    else:
        config = load_config(root / "config.yaml", *(configfiles or []))
    gb = float(gpu_gb or (config.get("training") or {}).get("gpu_memory_gb") or 80)
    plans = memory_plan(config, project_dir=root, names=names)
    table = format_plan(plans, gb)
    world = next((p.world for p in plans if not isinstance(p, tuple)), 1)
    note = (f"One update per drafter at its worst case (every anchor a fully masked block at the largest horizon), "
            f"ZeRO over {world} GPU(s); GB = 10^9 bytes; fits = peak <= 90 % of {gb:g} GB.")
    print(table + "\n\n" + note)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(table + "\n\n" + note + "\n")
        Path(out).with_suffix(".json").write_text(json.dumps(
            [dataclasses.asdict(p) if not isinstance(p, tuple) else {"name": p[0], "skipped": p[1]} for p in plans],
            indent=1))
    over = [p.name for p in plans if not isinstance(p, tuple) and not p.fits(gb)]
    if over:
        raise SystemExit(f"memory plan: {', '.join(over)} do(es) not fit {gb:g} GB with 10 % headroom")
    return plans
