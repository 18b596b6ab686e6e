"""What the one trainer trains: DFlash/DScout drafters and the two baselines, behind one small interface.

A training method builds its model from the target, names the target layers it reads, computes one update's
loss from a :class:`~dscout.training.step.FeatureBatch`, and saves the result. The DeepSpeed loop, the data
order, checkpoints and logs (:mod:`dscout.training.trainer`) are shared, so every drafter of Table 3 is trained
the same way on the same regenerated responses.

=========  ===========================================  ==============================================
kind       model                                         loss
=========  ===========================================  ==============================================
dflash     :class:`~dscout.models.drafter.DFlashDrafter`  factorized DScout/DFlash loss (recipes)
eagle3     :class:`~dscout.models.eagle3.Eagle3Drafter`    training-time test, 7 steps, 0.8^k (§1.2)
pard2      :class:`~dscout.models.pard.Pard2Drafter`       0.1 CE + 1.0 KL, CAT weights, COD (§2.2)
=========  ===========================================  ==============================================
"""

from __future__ import annotations

import torch

from .recipes import get_recipe


def build_drafter(target, cfg, block_size: int):
    """A fresh DFlash drafter shaped like ``target`` for a :class:`~dscout.training.trainer.TrainConfig`
    (final norm from the target's or at ones, layers optionally initialised from the target's last layers).

    Raises:
        ValueError: for an unknown ``options.norm_init``.
    """
    from ..models.drafter import DFlashDrafter, DFlashDrafterConfig

    dcfg = DFlashDrafterConfig.from_target(
        target.config, num_hidden_layers=cfg.num_layers, mask_token_id=cfg.mask_token_id,
        target_layer_ids=cfg.target_layer_ids, num_taps=cfg.num_taps, block_size=block_size,
        draft_vocab_size=cfg.options.get("draft_vocab_size"))
    drafter = DFlashDrafter(dcfg)
    norm_init = cfg.options.get("norm_init", "target")
    if norm_init not in ("target", "ones"):
        raise ValueError(f"options.norm_init must be 'target' or 'ones', got {norm_init!r}")
    if norm_init == "target":  # the drafter's states feed the target's LM head: the target's final-norm scale
        with torch.no_grad():
            drafter.norm.weight.copy_(target.final_norm.weight)
    if cfg.init_from_target:
        _init_from_target(drafter, target)
    return drafter.to(dtype=getattr(torch, cfg.dtype), device=target.device).attach_target(target)


@torch.no_grad()
def _init_from_target(drafter, target) -> None:
    """Copy attention/MLP/norm weights of the last d target layers into the d drafter layers."""
    L, d = target.num_layers, len(drafter.layers)
    for i, layer in enumerate(drafter.layers):
        src = target.layers[L - d + i]
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(layer.self_attn, name).weight.copy_(getattr(src.self_attn, name).weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(layer.mlp, name).weight.copy_(getattr(src.mlp, name).weight)
        layer.input_layernorm.weight.copy_(src.input_layernorm.weight)
        layer.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight)


@torch.no_grad()
def _init_fc_from_last_tap(drafter, target) -> None:
    """``fc`` passes the deepest tap through and ``hidden_norm`` takes the input norm of the first copied layer.

    With the default taps and ``init_from_target`` (deepest tap ``L - d - 1``, drafter layers copied from
    ``L - d .. L - 1``) the context ``c = hidden_norm(fc(taps))`` then equals the normalised input of target layer
    ``L - d``: the first drafter layer's keys and values over the context are the target's own at step 0, and the
    other taps start at zero weight. Call after :meth:`DFlashDrafter.set_tap_scale` (``W' = diag(s)`` on that slot).
    Measured in ``reports/drafter_efficiency/`` (no gain at 150 s); option ``options.fc_init: last_tap``.

    Raises:
        ValueError: if the drafter's hidden size differs from the target's (no identity to copy).
    """
    ids = list(drafter.config.target_layer_ids)
    D = drafter.config.target_hidden_size
    if drafter.fc.weight.shape[0] != D:
        raise ValueError(f"fc_init 'last_tap' needs the drafter's hidden size ({drafter.fc.weight.shape[0]}) to equal "
                         f"the target's ({D})")
    slot = ids.index(max(ids))
    w = drafter.fc.weight
    w.zero_()
    w[:, slot * D:(slot + 1) * D] = torch.diag(drafter.tap_scale[slot * D:(slot + 1) * D].to(w))
    if drafter.fc.bias is not None:
        drafter.fc.bias.zero_()
    first = target.layers[target.num_layers - len(drafter.layers)]
    drafter.hidden_norm.weight.copy_(first.input_layernorm.weight)


class DFlashMethod:
    """Block-diffusion drafter with a named recipe (docs/method.md §3)."""

    kind = "dflash"

    def __init__(self, cfg):
        self.cfg = cfg
        self.recipe = get_recipe(cfg.recipe, **cfg.recipe_overrides)

    def build(self, target):
        self.model = build_drafter(target, self.cfg, self.recipe.max_horizon)
        self.layer_ids = list(self.model.config.target_layer_ids)
        return self.model

    def prepare(self, source, target) -> None:
        """Condition ``fc`` on standardised taps (folded back before saving; recomputed on resume); pick the
        draft vocabulary (the most frequent response tokens) when ``options.draft_vocab_size`` asks for one."""
        from .features import tap_rms

        # streamed: one probe sequence's features at a time (online they are a target forward each)
        probe = (source.batch([i], torch.float32, target.device) for i in range(min(len(source), 64)))
        self.model.set_tap_scale(tap_rms(probe))
        fc_init = self.cfg.options.get("fc_init", "random")
        if fc_init not in ("random", "last_tap"):
            raise ValueError(f"options.fc_init must be 'random' or 'last_tap', got {fc_init!r}")
        if fc_init == "last_tap":  # here, not in build(): W' depends on the tap scale (a resume loads W' after)
            _init_fc_from_last_tap(self.model, target)
        if self.model.config.draft_vocab_size is not None:
            self.model.set_draft_vocab(response_token_counts(source, target.vocab_size))

    def update_horizon(self, generator: torch.Generator) -> int:
        """The horizon B of one update (inclusion factor, docs/method.md §3): uniform over the recipe's
        ``horizons``, drawn from ``generator``. The trainer seeds that generator from ``(seed, step)`` only, so every
        rank and every micro-step of an update trains the same B (a rank that drew 32 would make the others wait
        at the gradient all-reduce)."""
        return self.recipe.draw_horizon(generator)

    def loss(self, model, batch, generator, target, block_size: int | None = None):
        from .step import drafter_training_loss

        return drafter_training_loss(model, batch, self.recipe, self.cfg.num_anchors, generator,
                                     block_size=block_size,
                                     distill_weight=float(self.cfg.options.get("distill_weight", 0.0)))

    def save(self, model, out_dir) -> dict:
        from ..models.export import dflash_format_problems, save_drafter

        model.fold_tap_scale()  # the checkpoint is a plain DFlash drafter ...
        save_drafter(model, out_dir, dtype=next(model.parameters()).dtype)  # ... in the DFlash format when it has one
        c = model.config
        return {"label": c.label, "recipe": self.cfg.recipe, "recipe_resolved": self.recipe.to_dict(),
                "sglang_servable": not dflash_format_problems(c)}


def response_token_counts(source, vocab_size: int) -> torch.Tensor:
    """``[V]`` float counts of every response token (loss-mask positions) over the training sequences (in bulk
    from a packed source's mapped file when it offers ``token_counts``, :mod:`dscout.data.packed`)."""
    bulk = getattr(source, "token_counts", None)
    counts = bulk(vocab_size, responses_only=True) if bulk is not None else None
    if counts is not None:
        return counts.float()
    counts = torch.zeros(vocab_size)
    for i in range(len(source)):
        ids, mask = source.tokens(i)
        counts += torch.bincount(ids[mask.bool()], minlength=vocab_size).float()
    return counts


def _target_logits(batch, target, only_supervised: bool = False) -> torch.Tensor:
    """The target's logits ``[b, S, V]`` from the cached final-normed states (no gradient).

    With ``only_supervised`` the LM head runs on the positions where ``batch.loss_mask`` is 1 only and the other
    rows are 0 (for losses that weight those rows by the loss mask: EAGLE-3's TTT loss).
    """
    with torch.no_grad():
        head = target.lm_head
        h = batch.final_hidden.to(head.weight.dtype)
        if not only_supervised:
            return torch.nn.functional.linear(h, head.weight).float()
        sel = batch.loss_mask.bool()
        out = torch.zeros(*h.shape[:2], head.weight.shape[0], dtype=torch.float32, device=h.device)
        out[sel] = torch.nn.functional.linear(h[sel], head.weight).float()
        return out


class Eagle3Method:
    """EAGLE-3: fused three taps, one decoder layer, reduced vocabulary, training-time test."""

    kind = "eagle3"

    def __init__(self, cfg):
        self.cfg = cfg
        self.opts = {"draft_vocab_size": 8192, "ttt_steps": 7, **cfg.options}

    def build(self, target):
        from ..models.eagle3 import Eagle3Drafter, Eagle3DrafterConfig

        dv = min(int(self.opts["draft_vocab_size"]), target.vocab_size)
        config = Eagle3DrafterConfig.from_target(target.config, draft_vocab_size=dv,
                                                 target_layer_ids=self.cfg.target_layer_ids)
        self.model = Eagle3Drafter(config).to(dtype=getattr(torch, self.cfg.dtype), device=target.device)
        self.model.attach_target(target)
        self.layer_ids = list(config.target_layer_ids)
        return self.model

    def prepare(self, source, target) -> None:
        """The draft vocabulary: the most frequent response tokens of the training data (d2t / t2d)."""
        from ..models.common import build_vocab_map

        d2t, t2d = build_vocab_map(response_token_counts(source, target.vocab_size),
                                   self.model.config.draft_vocab_size)
        self.model.set_vocab_map(d2t, t2d)

    def loss(self, model, batch, generator, target):
        from .eagle3_loss import eagle3_ttt_loss

        loss, m = eagle3_ttt_loss(model, batch.input_ids, batch.loss_mask, batch.taps,
                                  _target_logits(batch, target, only_supervised=True),
                                  steps=int(self.opts["ttt_steps"]))
        return loss, {"accuracy": m["step_accuracy"][0], "step_accuracy": m["step_accuracy"], "block_size": None}

    def save(self, model, out_dir) -> dict:
        model.save_pretrained(str(out_dir))
        return {"label": "eagle3-1layer", "draft_vocab_size": model.config.draft_vocab_size}


class Pard2Method:
    """PARD-2: a layer-truncated copy of the target with target features, mask-token parallel drafting."""

    kind = "pard2"

    def __init__(self, cfg):
        self.cfg = cfg
        self.opts = {"draft_k": 8, "feature_layers": [-1, -8, -16, -24], "feat_drop_p": 0.1, "cod_r": 0.7,
                     "cod_rmin": 0.1, **cfg.options}

    def build(self, target):
        from ..models.pard import Pard2Drafter

        self.model = Pard2Drafter.from_target(target, self.cfg.num_layers, mask_token_id=self.cfg.mask_token_id,
                                              target_layer_ids=list(self.opts["feature_layers"]),
                                              draft_k=int(self.opts["draft_k"]))
        self.model = self.model.to(dtype=getattr(torch, self.cfg.dtype))
        self.layer_ids = list(self.model.tap_layer_ids)
        self._final_norm = target.final_norm
        return self.model

    def prepare(self, source, target) -> None:
        pass

    def loss(self, model, batch, generator, target):
        from .pard_loss import pard2_loss

        with torch.no_grad():
            feats = model.features_from_taps(batch.taps, self._final_norm)
        loss, m = pard2_loss(model, batch.input_ids, batch.loss_mask, feats, _target_logits(batch, target),
                             k=int(self.opts["draft_k"]), cod_r=self.opts["cod_r"], cod_rmin=self.opts["cod_rmin"],
                             feat_drop_p=float(self.opts["feat_drop_p"]), generator=generator)
        return loss, {"accuracy": m.get("acc"), "block_size": int(self.opts["draft_k"]),
                      **{k: v for k, v in m.items() if k.startswith("acc_b")}}

    def save(self, model, out_dir) -> dict:
        model.save(out_dir)
        return {"label": f"pard2-{self.cfg.num_layers}layer-truncated-target",
                "note": "no smaller same-family model exists for the CPU target: the drafter is a "
                        "layer-truncated copy of the target"}


def training_method(cfg):
    """The method object for ``cfg.kind``, from the drafter-kind registry (:mod:`dscout.kinds`).

    Raises:
        KeyError: listing the valid kinds.
        TypeError: the kind's entry does not implement :mod:`dscout.protocols` (kind, class and members named).
    """
    from ..kinds import resolve

    return resolve(cfg.kind, "training_method")(cfg)
