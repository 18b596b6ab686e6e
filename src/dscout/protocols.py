"""The interfaces every drafter kind implements, as :class:`typing.Protocol` classes (torch-free to import).

A drafter kind (:mod:`dscout.kinds`) names three classes: its drafter model (:class:`Drafter`), its proposer
(:class:`Proposer`, what the engine drafts with) and its training method (:class:`TrainingMethod`, what the one
trainer trains). :func:`dscout.kinds.check_kind` checks a kind's classes against these when the kind is registered
or one of its parts is resolved; :func:`missing_members` is the check.

Shapes: ``b`` batch, ``S`` / ``Q`` sequence / block length, ``D`` the drafter's hidden size, ``t`` the number of
target layers tapped, ``D_t`` the target's hidden size, ``V`` the target's vocabulary, ``V_d`` the draft vocabulary
(``V`` unless the drafter has a reduced one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: importing this module needs no torch
    import torch

    from .decoding.proposers import Draft, TreeDraft
    from .training.step import FeatureBatch


@runtime_checkable
class Drafter(Protocol):
    """A drafter model (:class:`~dscout.models.drafter.DFlashDrafter`, :class:`~dscout.models.eagle3.Eagle3Drafter`,
    :class:`~dscout.models.pard.Pard2Drafter`): a ``torch.nn.Module`` whose forward is kind-specific; these two
    calls are shared by every kind's proposer and loss."""

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids ``[b, S]`` (target vocabulary) -> input embeddings ``[b, S, D]`` (the target's frozen
        embedding for DFlash and EAGLE-3)."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Drafter states ``[..., D]`` -> logits ``[..., V_d]`` over the draft vocabulary (map indices back to
        target ids with :meth:`ReducedVocabDrafter.to_target_ids` where ``V_d < V``)."""
        ...


@runtime_checkable
class ReducedVocabDrafter(Drafter, Protocol):
    """A drafter that may draft over a subset of the target's vocabulary (DFlash with ``options.draft_vocab_size``,
    EAGLE-3): the one vocabulary map every caller uses."""

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary indices (any shape, long) -> target token ids (same shape); identity for the full
        vocabulary."""
        ...

    def to_draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target token ids (any shape, long) -> draft-vocabulary indices (same shape), ``-1`` where a token is not
        in the draft vocabulary."""
        ...


@runtime_checkable
class Proposer(Protocol):
    """What drafts a round's tokens for :class:`~dscout.decoding.engine.SpeculativeEngine` (which owns
    verification): :class:`~dscout.decoding.proposers.BlockDiffusionProposer`,
    :class:`~dscout.decoding.eagle3_proposer.Eagle3Proposer`, :class:`~dscout.decoding.pard_proposer.Pard2Proposer`.

    Attributes:
        layer_ids: the target layers whose outputs (taps) the engine passes in, in order (id l = output of decoder
            layer l); empty for a proposer that needs no features.
    """

    layer_ids: list[int]

    def start(self, context_taps: torch.Tensor, token_ids: torch.Tensor) -> None:
        """After the target's prefill: the prompt's taps ``[n, t * D_t]`` and token ids ``[n]``; resets any state of
        an earlier request."""
        ...

    def propose(self, last_token: int, position: int, num_drafts: int, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> Draft | TreeDraft:
        """Draft up to ``num_drafts`` tokens after ``last_token``, which sits at absolute ``position`` (0-based
        token index): a chain (:class:`~dscout.decoding.proposers.Draft`, with the distributions sampled from at
        ``temperature > 0``) or a tree (:class:`~dscout.decoding.proposers.TreeDraft`)."""
        ...

    def commit(self, taps: torch.Tensor, token_ids: torch.Tensor) -> None:
        """After verification: the taps ``[m, t * D_t]`` and ids ``[m]`` of the ``m`` committed positions (the round's
        input token and the accepted drafts; not the bonus token, whose state the next verify computes)."""
        ...


@runtime_checkable
class TrainingMethod(Protocol):
    """What :func:`dscout.training.trainer.train_drafter` trains (:mod:`dscout.training.methods`): built from the
    train config (``Method(cfg)``, :class:`~dscout.training.trainer.TrainConfig`), then ``build`` -> ``prepare`` ->
    ``loss`` per micro-step -> ``save``. An optional ``update_horizon(generator) -> int`` draws the horizon of an
    update (block-diffusion recipes).

    Attributes:
        kind: the drafter kind it trains (``drafters.<name>.kind``).
        layer_ids: the target layers whose taps each batch carries, set by :meth:`build`.
    """

    kind: str
    layer_ids: list[int]

    def build(self, target) -> torch.nn.Module:
        """A fresh drafter shaped for ``target`` (a :class:`~dscout.models.target.TargetModel`, or its meta-device
        skeleton), on the target's device in the configured dtype; sets :attr:`layer_ids`."""
        ...

    def prepare(self, source, target) -> None:
        """One pass over the training data before the first update (tap scales, draft vocabulary); ``source`` is the
        trainer's batch source (``len`` sequences, ``batch(indices, dtype, device)``). Rerun on resume, before the
        checkpoint is loaded."""
        ...

    def loss(self, model, batch: FeatureBatch, generator: torch.Generator, target) -> tuple[torch.Tensor, dict]:
        """One micro-step: the scalar loss (mean over supervised positions) and metrics (``accuracy``: top-1 agreement
        in [0, 1] or None, ``block_size``: tokens per block or None, kind-specific extras). ``generator`` seeds the
        step's random choices (anchors, masks)."""
        ...

    def save(self, model, out_dir) -> dict:
        """Write the trained drafter to ``out_dir`` in its kind's checkpoint layout; returns the fields the training
        summary records (``label``, ...)."""
        ...


def protocol_members(protocol: type) -> list[str]:
    """The methods a protocol requires (its public callables, bases included), sorted; data attributes (set on
    instances) are documented, not checked."""
    names = set()
    for klass in protocol.__mro__:
        if klass is object or klass is Protocol or not getattr(klass, "_is_protocol", False):
            continue
        names |= {n for n, v in vars(klass).items() if callable(v) and not n.startswith("_")}
    return sorted(names)


def missing_members(obj, protocol: type) -> list[str]:
    """The methods of ``protocol`` that ``obj`` (a class or an instance) lacks or has as non-callables, sorted."""
    return [n for n in protocol_members(protocol) if not callable(getattr(obj, n, None))]


__all__ = ["Drafter", "Proposer", "ReducedVocabDrafter", "TrainingMethod", "missing_members", "protocol_members"]
