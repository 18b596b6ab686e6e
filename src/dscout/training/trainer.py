"""Drafter training on DeepSpeed: one code path for a CPU process (gloo) and the multi-GPU launcher (nccl).

The DeepSpeed JSON in ``configs/deepspeed/`` is the source of truth for precision, ZeRO stage, gradient
clipping and the warmup + cosine schedule (``WarmupCosineLR``); ``"auto"`` fields are filled here from the
run's step count. The optimizer is AdamW (torch, fp32 master weights), as in SpecForge's DFlash recipe
(docs/method.md §3: lr 6e-4, warmup 4 %, cosine to 0, clip 1.0).

Resumability: DeepSpeed checkpoints (model, optimizer, scheduler and the step) are saved every
``checkpoint_every`` steps under ``work_dir/checkpoints``; a restarted run loads the latest and continues.
SIGTERM (what SLURM sends at preemption or at the time limit, and what DeepSpeed's launcher forwards to its ranks)
and SIGINT end the current step, save a checkpoint at it (every rank agrees on the step through the per-step
gather) and exit with ``128 + signal`` (:class:`TrainingInterrupted`), so a requeued job loses nothing.
Data order and randomness are keyed by the *slot* of a micro-batch within the global batch of one update, not
by the process that runs it: an update of ``world`` ranks x ``gradient_accumulation_steps`` micro-steps has
``P = world * gas`` slots, slot ``p = rank * gas + micro``; its sequences and its RNG (anchors, reveal pattern) are
pure functions of ``(seed, step, p)``, and the horizon B of the update is a pure function of ``(seed, step)``
(:func:`update_horizon`: one B for every rank and micro-step, so no rank waits for a longer one). Hence

* a resumed run reaches the same final step with the same data order as an uninterrupted one, and
* ``N`` ranks with ``gas = 1`` and one rank with ``gas = N`` draw the same global batch and, since DeepSpeed
  averages gradients over ranks (all-reduce / world) and over micro-steps (loss / gas) alike, make the same
  update up to float summation order (``tests/test_distributed_training.py`` runs both through the rule's
  command).

Launch: single CPU process: ``dscout train ...`` (RANK/WORLD_SIZE default to 0/1, gloo). GPUs:
``deepspeed --num_gpus N src/dscout/cli.py train ...`` (nccl; on a CPU the same launcher starts N gloo ranks).
Each rank resolves its device from ``LOCAL_RANK`` before loading the target (:mod:`dscout.models.placement`,
called by the CLI): target, drafter, optimizer state and batches live on ``cuda:<LOCAL_RANK>``; the summary's
``placement`` records what every rank used.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shutil
import signal
import socket
import threading
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from .features import FeatureCache, online_batch
from ..kinds import drafter_kind
from .methods import training_method


@dataclass
class TrainConfig:
    """Hyperparameters of one drafter training run (see ``schemas/config.schema.yaml`` for the docs; the defaults
    here are the schema's). Workflow stages build it with :meth:`from_stage`.

    Attributes:
        recipe: recipe name (:data:`dscout.training.recipes.RECIPES`).
        recipe_overrides: field overrides of the recipe (e.g. ``{"horizons": [4, 8, 16, 32]}``).
        num_layers: d, drafter depth.
        target_layer_ids: explicit taps; None = the spacing rule with ``num_taps`` taps.
        num_taps: t when ``target_layer_ids`` is None (None = d).
        mask_token_id: drafter mask token (an existing target embedding row).
        num_anchors: blocks per sequence per update.
        micro_batch_size: sequences per rank per micro-step.
        gradient_accumulation_steps: micro-steps per update (DeepSpeed ``gradient_accumulation_steps``).
        lr, warmup_ratio, weight_decay: AdamW + warmup/cosine schedule.
        max_steps: updates to run (None: ``epochs`` over the data).
        epochs: passes over the data when ``max_steps`` is None.
        seed: data order and per-update RNG seed.
        deepspeed_config: path of the DeepSpeed JSON.
        checkpoint_every: steps between resumable checkpoints (0 = only at the end).
        dtype: ``float32`` (CPU) or ``bfloat16`` (GPU); must agree with the DeepSpeed JSON.
        init_from_target: initialise each drafter layer from a target layer (else random, as SpecForge).
        kind: ``dflash`` (DFlash/DScout recipes), ``eagle3`` or ``pard2`` (:mod:`dscout.training.methods`).
        autocast: ``bfloat16``: the drafter's forward and loss run under ``torch.autocast`` in bfloat16 (weights,
            gradients and the optimizer stay float32); meant for CPUs with bfloat16 matmul units (AMX, AVX-512
            BF16), not timed on this project's hosts (tests/test_trainer.py checks that it reaches the loss and
            keeps float32 weights); None = plain ``dtype``.
        holdout: sequences never trained on (:func:`dscout.training.holdout.holdout_split`, seed 0), kept for
            held-out evaluation (the findings stage); 0 = train on all.
        options: kind-specific settings. DFlash/DScout: ``draft_vocab_size`` (None = the target's vocabulary),
            ``distill_weight`` (0: CE on the target's tokens only), ``norm_init`` (``target``: copy the
            target's final-norm weight, ``ones``). EAGLE-3: ``draft_vocab_size``, ``ttt_steps``. PARD-2:
            ``draft_k``, ``feature_layers``, ``feat_drop_p``, ``cod_r``, ``cod_rmin``.
    """

    recipe: str = "dscout"
    recipe_overrides: dict = field(default_factory=dict)
    num_layers: int = 1
    target_layer_ids: list[int] | None = None
    num_taps: int | None = None
    mask_token_id: int = 0
    num_anchors: int = 512
    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    weight_decay: float = 0.0
    max_steps: int | None = None
    epochs: float = 6.0
    seed: int = 42
    deepspeed_config: str = "configs/deepspeed/cpu.json"
    checkpoint_every: int = 100
    dtype: str = "float32"
    init_from_target: bool = False
    kind: str = "dflash"
    options: dict = field(default_factory=dict)
    holdout: int = 0
    autocast: str | None = None

    @classmethod
    def from_stage(cls, stage: dict, target_dtype, **overrides) -> "TrainConfig":
        """The config of a drafter stage (:func:`dscout.config.drafter_stage`: ``recipe``, ``num_layers``,
        ``layer_ids``, ``mask_token_id``, ``training`` {...}, ``init_from_target``, ``kind``, ``options``).

        Args:
            target_dtype: the target's torch dtype (bfloat16 -> ``bfloat16`` training, else ``float32``).
            overrides: fields that replace the stage's (the depth search sets ``num_layers``, ``max_steps``).
        """
        import torch

        tr = stage["training"]
        fields = dict(
            recipe=stage.get("recipe", "dscout"), recipe_overrides=stage.get("recipe_overrides") or {},
            num_layers=stage["num_layers"], target_layer_ids=stage["layer_ids"],
            mask_token_id=stage["mask_token_id"], num_anchors=tr["num_anchors"],
            micro_batch_size=tr["micro_batch_size"],
            gradient_accumulation_steps=tr.get("gradient_accumulation_steps") or 1, lr=tr["lr"],
            warmup_ratio=tr["warmup_ratio"], weight_decay=tr["weight_decay"], max_steps=tr["max_steps"],
            epochs=tr["epochs"], seed=tr["seed"], deepspeed_config=tr["deepspeed_config"],
            checkpoint_every=tr["checkpoint_every"],
            dtype="bfloat16" if target_dtype == torch.bfloat16 else "float32",
            init_from_target=bool(stage.get("init_from_target", False)), kind=stage.get("kind") or "dflash",
            options=dict(stage.get("options") or {}), holdout=int(tr.get("holdout") or 0),
            autocast=tr.get("autocast"))
        fields.update(overrides)
        return cls(**fields)


@contextlib.contextmanager
def flush_denormals():
    """Flush subnormal floats to zero on the CPU while training (IEEE behaviour restored after).

    AWL's weights are products of per-offset acceptance probabilities (docs/method.md §3): deep offsets reach
    1e-40 and below, and the backward pass through those rows runs on subnormal floats, which x86 CPUs handle in
    microcode. Measured on the CPU default (SmolLM2-135M, d = 2, one thread): DScout steps 761 -> 241 ms, DFlash
    253 -> 205 ms, EAGLE-3 683 -> 505 ms, PARD-2 unchanged. A value below 1.2e-38 adds nothing to a float32
    update; GPUs are unaffected (the call only sets the CPU's FTZ/DAZ flags).

    Yields:
        whether the CPU supports flushing (``torch.set_flush_denormal``'s answer).
    """
    supported = torch.set_flush_denormal(True)
    try:
        yield supported
    finally:
        if supported:
            torch.set_flush_denormal(False)


class TrainingInterrupted(SystemExit):
    """Raised when a stop signal ended training after a checkpoint was saved; exits with ``128 + signal``.

    Attributes:
        step: the number of finished updates, saved in the checkpoint ``step<step>`` the next run resumes from.
        signum: the signal received (``signal.SIGTERM`` or ``signal.SIGINT``).
    """

    def __init__(self, step: int, signum: int):
        super().__init__(128 + signum)
        self.step, self.signum = step, signum

    def __str__(self) -> str:
        return (f"training stopped by {signal.Signals(self.signum).name} after step {self.step}: checkpoint "
                f"step{self.step} saved, a rerun resumes from it")


class StopSignals:
    """Records SIGTERM / SIGINT instead of dying at once, while training runs (the previous handlers are restored).

    The training loop reads :attr:`signum` after every update, saves a checkpoint at that update and exits
    (PyTorch Lightning's SLURM requeue does the same on its signal). Outside the main thread (where Python cannot
    install handlers) it records nothing and the process keeps the default behaviour.

    Attributes:
        signum: the first stop signal received, None while none was.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> tuple[int, int]:
    """Initialise torch.distributed through DeepSpeed (gloo on CPU, nccl on GPUs); returns (rank, world)."""
    import deepspeed

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def sample_indices(step: int, slot: int, slots: int, micro_batch: int, n: int, seed: int) -> list[int]:
    """Data order: the sequence indices of micro-batch ``slot`` (of ``slots``) in update ``step``.

    A fresh permutation of the ``n`` sequences per epoch from ``seed``; the global batch of one update takes
    ``slots * micro_batch`` consecutive entries of it, so slots (ranks and micro-steps) draw disjoint sequences.
    """
    out = []
    for i in range(micro_batch):
        g = (step * slots + slot) * micro_batch + i
        epoch, j = divmod(g, n)
        out.append(int(_epoch_permutation(seed, epoch, n)[j]))
    return out


@functools.lru_cache(maxsize=2)
def _epoch_permutation(seed: int, epoch: int, n: int) -> torch.Tensor:
    """``[n]`` the data order of one epoch (kept: at 1.4M sequences a permutation costs ~10 ms, once per epoch
    instead of once per sequence drawn)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


def update_horizon(method, seed: int, step: int) -> int | None:
    """The horizon B every rank and micro-step of update ``step`` trains (None: the method draws none).

    Drawn by ``method.update_horizon`` (:meth:`dscout.training.methods.DFlashMethod.update_horizon`: uniform over
    the recipe's horizons, docs/method.md §3) from a generator seeded by ``(seed, step)`` alone, apart from the
    per-slot streams (anchors, reveal pattern): all ranks draw the same B without communicating, so no rank waits
    at the gradient all-reduce for another that drew a longer horizon, and ``N`` ranks still draw what one process
    accumulating ``N`` micro-steps draws. A resumed run draws the same B for the same step.
    """
    draw = getattr(method, "update_horizon", None)
    if draw is None:
        return None
    return int(draw(torch.Generator().manual_seed((1 << 62) + seed * 1_000_003 + step)))


def _ds_config(path: str, cfg: TrainConfig, total_steps: int, world: int) -> dict:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"DeepSpeed config {p} not found (key training.deepspeed_config)")
    ds = json.loads(p.read_text())
    ds["train_micro_batch_size_per_gpu"] = cfg.micro_batch_size
    ds["gradient_accumulation_steps"] = cfg.gradient_accumulation_steps
    ds.pop("train_batch_size", None)
    sched = ds.get("scheduler", {}).get("params", {})
    if sched.get("total_num_steps") == "auto":
        sched["total_num_steps"] = max(total_steps, 1)
    if sched.get("warmup_num_steps") == "auto":
        sched["warmup_num_steps"] = max(int(round(cfg.warmup_ratio * total_steps)), 1)
    return ds


class _OnlineSource:
    def __init__(self, target, sequences, layer_ids):
        self.target, self.sequences, self.layer_ids = target, sequences, layer_ids

    def __len__(self):
        return len(self.sequences)

    def tokens(self, i):
        if hasattr(self.sequences, "arrays"):  # packed sequences (dscout.data.packed): read from the mapped file
            ids, mask = self.sequences.arrays(i)
            return torch.from_numpy(ids.astype("int64")), torch.from_numpy(mask)
        s = self.sequences[i]
        return torch.tensor(s["input_ids"]), torch.tensor(s["loss_mask"])

    def token_counts(self, vocab_size: int | None, responses_only: bool = False, subset=None):
        """``[vocab_size]`` token counts from the packed file in bulk; None for a list of sequences."""
        if not hasattr(self.sequences, "token_counts"):
            return None
        return torch.from_numpy(self.sequences.token_counts(vocab_size, responses_only, subset))

    def batch(self, indices, dtype, device):
        b = online_batch(self.target, [self.sequences[i] for i in indices], self.layer_ids)
        b.taps, b.final_hidden = b.taps.to(dtype), b.final_hidden.to(dtype)
        return b


class SubsetSource:
    """Some sequences of a training source (``FeatureCache`` or online), renumbered ``0 .. len(ids) - 1``."""

    def __init__(self, source, ids: list[int]):
        bad = [i for i in ids if not 0 <= i < len(source)]
        if bad or not ids:
            raise ValueError(f"sequence ids {bad[:5]} are not in the source ({len(source)} sequences)"
                             if bad else "empty sequence subset")
        self.source, self.ids = source, list(ids)

    def __len__(self):
        return len(self.ids)

    def tokens(self, i):
        return self.source.tokens(self.ids[i])

    def token_counts(self, vocab_size: int | None, responses_only: bool = False, subset=None):
        """Bulk token counts of the source's (packed) sequences in this subset; None when the source has none."""
        counts = getattr(self.source, "token_counts", None)
        ids = self.ids if subset is None else [self.ids[i] for i in subset]
        return None if counts is None else counts(vocab_size, responses_only, ids)

    def batch(self, indices, dtype, device):
        return self.source.batch([self.ids[i] for i in indices], dtype, device)


def train_drafter(target, cfg: TrainConfig, out_dir: str | os.PathLike, work_dir: str | os.PathLike,
                  feature_cache: str | os.PathLike | None = None, sequences: list[dict] | None = None,
                  sequence_ids: list[int] | None = None) -> Path:
    """Train a drafter and save it with ``save_pretrained`` to ``out_dir`` (resumable).

    Args:
        target: the frozen :class:`~dscout.models.target.TargetModel`.
        cfg: :class:`TrainConfig`.
        out_dir: where the final drafter goes: the DFlash checkpoint format (``config.json`` with
            ``dflash_config`` + ``model.safetensors``, see :mod:`dscout.models.export`) + ``training_summary.json``.
        work_dir: scratch folder for checkpoints and the per-step log ``train_log.jsonl``.
        feature_cache: a cache from :func:`~dscout.training.features.build_feature_cache` (CPU default), or
        sequences: tokenised sequences (``input_ids``, ``loss_mask``) for online target features: a list of
            dicts or, at scale, :class:`dscout.data.packed.PackedSequences` (memory-mapped; tokens are read per
            batch and counted in bulk, no per-row object at start-up).
        sequence_ids: train on these sequences of the source only (the rest held out); None = all.
    Returns:
        ``out_dir``.
    Raises:
        ValueError: if neither ``feature_cache`` nor ``sequences`` is given.
        TrainingInterrupted: (a ``SystemExit`` with code ``128 + signal``) after SIGTERM / SIGINT, once the
            checkpoint of the update in progress is saved.
    """
    import deepspeed

    method = training_method(cfg)
    rank, world = init_distributed()
    torch.manual_seed(cfg.seed)
    drafter = method.build(target)
    if feature_cache is not None:
        source = FeatureCache(feature_cache, method.layer_ids)
    elif sequences is not None:
        source = _OnlineSource(target, sequences, method.layer_ids)
    else:
        raise ValueError("train_drafter needs a feature_cache or sequences")
    if sequence_ids is None and cfg.holdout:
        from .holdout import holdout_split

        sequence_ids = holdout_split(len(source), cfg.holdout)[0]
    if sequence_ids is not None:
        source = SubsetSource(source, sequence_ids)
    n = len(source)
    uses_mask = drafter_kind(cfg.kind).uses_mask_token
    mask_hits = count_token(source, cfg.mask_token_id) if uses_mask and rank == 0 else 0
    if mask_hits:
        warnings.warn(f"the mask token id {cfg.mask_token_id} (target.mask_token_id) occurs {mask_hits} times in "
                      "the training sequences: the drafter cannot tell those real tokens from masked slots; pick "
                      "an id that never occurs (an unused special token)", stacklevel=2)
    method.prepare(source, target)
    gas = cfg.gradient_accumulation_steps
    slots = world * gas
    total = cfg.max_steps or max(1, math.ceil(cfg.epochs * n / (cfg.micro_batch_size * slots)))
    ds_cfg = _ds_config(cfg.deepspeed_config, cfg, total, world)
    # the fused AdamW kernel updates each parameter in one pass over its memory, where the default (per-tensor)
    # implementation makes ~10 (lerp, mul, addcmul, sqrt, div, addcdiv): on a CPU it took 17 % of an update
    # (reports/training_update_cost/report.md)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay, fused=target.device.type == "cpu")
    engine, _, _, sched = deepspeed.initialize(model=drafter, optimizer=opt, config=ds_cfg)
    # one rank without ZeRO: the gradient all-reduce is the identity, yet it cost 9 % of a CPU update (ZeRO
    # partitions and reduces its gradients in that path: it keeps it)
    if world == 1 and engine.zero_optimization_stage() == 0:
        engine.enable_backward_allreduce = False
    model = engine.module

    work = Path(work_dir)
    ckpt_dir = work / "checkpoints"
    log_path = work / "train_log.jsonl"
    work.mkdir(parents=True, exist_ok=True)
    start = 0
    if (ckpt_dir / "latest").exists():
        _, client = engine.load_checkpoint(str(ckpt_dir))
        start = int(client["step"])
    if rank == 0:  # keep the log consistent with the checkpoint we resumed from (one writer: rank 0)
        kept = []
        if log_path.exists():
            kept = [l for l in log_path.read_text().splitlines() if l.strip() and json.loads(l)["step"] < start]
        log_path.write_text("".join(l + "\n" for l in kept))

    dtype = getattr(torch, cfg.dtype)
    device = target.device
    t_start = time.perf_counter()
    bar = tqdm(range(start, total), initial=start, total=total, desc=f"train {cfg.kind if cfg.kind != 'dflash' else cfg.recipe}",
               disable=rank != 0, unit="step", mininterval=2.0)
    model.train()
    save_seconds: list[float] = []
    with flush_denormals(), StopSignals() as stop, open(log_path, "a") as log:
        for step in bar:
            t0 = time.perf_counter()
            idx, losses, horizons = [], [], []
            # the horizon B of this update: one draw per update, the same on every rank and micro-step
            horizon = update_horizon(method, cfg.seed, step)
            for micro in range(gas):
                slot = rank * gas + micro
                ids = sample_indices(step, slot, slots, cfg.micro_batch_size, n, cfg.seed)
                batch = source.batch(ids, dtype, device)
                gen = torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * 64 + slot)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.autocast == "bfloat16"):
                    loss, metrics = method.loss(model, batch, gen, target,
                                                **({} if horizon is None else {"block_size": horizon}))
                engine.backward(loss)  # DeepSpeed scales by 1 / gas and all-reduces (mean) at the boundary
                engine.step()  # applies the update after the last micro-step only
                # the log names sequences of the whole source (a held-out subset is renumbered inside)
                idx += [source.ids[i] for i in ids] if isinstance(source, SubsetSource) else ids
                losses.append(float(loss.detach()))
                horizons.append(metrics.get("block_size"))
            # one collective per step: (sample ids, losses, stop signal, horizons) of every rank
            gathered = _gather((idx, losses, stop.signum, horizons), world)
            per_rank = [g[0] for g in gathered]
            all_losses = [x for g in gathered for x in g[1]]
            signum = next((g[2] for g in gathered if g[2] is not None), None)  # the same decision on every rank
            rec = {"step": step, "epoch": (step * slots * cfg.micro_batch_size) / n,
                   "loss": sum(all_losses) / len(all_losses),  # the global batch's mean (what the update uses)
                   "lr": float(sched.get_last_lr()[0]) if sched is not None else cfg.lr,
                   "sample_ids": sum(per_rank, []), "sample_ids_per_rank": per_rank,
                   "seconds": time.perf_counter() - t0, **metrics,
                   "block_size_per_slot": [b for g in gathered for b in g[3]]}  # B of every micro-batch
            if rank == 0:
                log.write(json.dumps(rec) + "\n")
                log.flush()
                bar.set_postfix(loss=f"{rec['loss']:.3f}", acc=f"{rec.get('accuracy') or 0:.3f}")
            done = step + 1
            if signum is not None and done < total:  # stopped (SLURM preemption / time limit): keep this step
                secs = _save_checkpoint(engine, ckpt_dir, done)
                if rank == 0:  # the grace before the kill must cover this (the profile's --signal=TERM@600)
                    print(f"checkpoint at step {done} saved in {secs:.1f} s after signal {signum}", file=sys.stderr,
                          flush=True)
                bar.close()
                raise TrainingInterrupted(done, signum)
            if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < total:
                save_seconds.append(_save_checkpoint(engine, ckpt_dir, done))
    bar.close()
    seconds = time.perf_counter() - t_start
    # where each rank's tensors live (dscout.models.placement: rank r of a node on cuda:r)
    placement = _gather(_placement(rank, device, model, opt), world)
    out = Path(out_dir)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        summary = {**method.save(model, out), "kind": cfg.kind,
                   "train_config": asdict(cfg), "steps": total, "resumed_from_step": start,
                   "train_seconds_this_run": seconds,
                   # wall seconds of each checkpoint save of this run: the stop signal's grace must exceed them
                   "checkpoint_save_seconds": save_seconds,
                   "train_seconds": sum(json.loads(l)["seconds"] for l in log_path.read_text().splitlines()
                                        if l.strip()),
                   "drafter_parameters": sum(p.numel() for p in model.parameters()),
                   "num_sequences": n, "world_size": world, "mask_token_occurrences": mask_hits,
                   "placement": placement,
                   # what DeepSpeed actually ran (not only what the JSON asked for)
                   "deepspeed": {"zero_stage": int(engine.zero_optimization_stage()),
                                 "bf16": bool(engine.bfloat16_enabled()),
                                 "param_dtype": str(next(model.parameters()).dtype).replace("torch.", "")}}
        (out / "training_summary.json").write_text(json.dumps(summary, indent=1))
        shutil.copy(log_path, out / "train_log.jsonl")
    return out


def _placement(rank: int, device: torch.device, model, opt) -> dict:
    """This rank's placement record: its ``LOCAL_RANK``, the device of its batches and target, and the devices of
    the drafter's weights and of the optimizer state (per-parameter tensors; AdamW's scalar step counter stays on
    the CPU by design and is left out)."""
    from ..models.placement import local_rank_from_env

    state = {str(t.device) for st in opt.state.values() for t in st.values() if torch.is_tensor(t) and t.dim() > 0}
    return {"rank": rank, "local_rank": local_rank_from_env(), "device": str(device),
            "drafter": sorted({str(p.device) for p in model.parameters()}), "optimizer_state": sorted(state)}


def count_token(source, token_id: int) -> int:
    """Occurrences of ``token_id`` in every training sequence of ``source`` (prompt and response tokens)."""
    bulk = getattr(source, "token_counts", None)
    counts = bulk(None) if bulk is not None else None
    if counts is not None:  # packed sequences: one numpy pass over the mapped file
        return int(counts[token_id]) if 0 <= token_id < len(counts) else 0
    return sum(int((source.tokens(i)[0] == token_id).sum()) for i in range(len(source)))


def _gather(obj, world: int) -> list:
    """``obj`` of every rank, in rank order (all_gather_object; no communication for one process)."""
    if world == 1:
        return [obj]
    out: list = [None] * world
    torch.distributed.all_gather_object(out, obj)
    return out


def _save_checkpoint(engine, ckpt_dir: Path, step: int) -> float:
    """Save the DeepSpeed checkpoint of ``step`` (all ranks), keep only the newest; returns the save's wall
    seconds (what the stop signal's grace period must cover)."""
    t0 = time.perf_counter()
    engine.save_checkpoint(str(ckpt_dir), tag=f"step{step}", client_state={"step": step})
    seconds = time.perf_counter() - t0
    if torch.distributed.get_rank() == 0:  # keep only the newest checkpoint
        for d in ckpt_dir.glob("step*"):
            if d.is_dir() and d.name != f"step{step}":
                shutil.rmtree(d, ignore_errors=True)
    return seconds
