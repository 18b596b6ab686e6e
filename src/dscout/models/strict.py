"""Loading ``transformers`` checkpoints strictly: a missing, unexpected or mis-shaped tensor is an error.

``PreTrainedModel.from_pretrained`` prints a load report and keeps freshly initialised weights for tensors the
checkpoint lacks; for a drafter or a target that silently turns a truncated download or a renamed tensor into a
random model whose numbers still look plausible. Every load in this project goes through :func:`load_strict`
(the DFlash drafter's own loader, :func:`dscout.models.export.load_dflash_checkpoint`, refuses likewise).
"""

from __future__ import annotations


def check_loading_info(info: dict, what: str, allow_missing: tuple[str, ...] = ()) -> None:
    """Raise ValueError naming every missing / unexpected / mismatched tensor of a load report.

    Args:
        info: the ``loading_info`` dict ``from_pretrained(..., output_loading_info=True)`` returns.
        what: the checkpoint, for the message (e.g. ``"EAGLE-3 drafter results/drafters/x"``).
        allow_missing: tensor names that may be absent (tied weights rebuilt from another tensor).
    """
    missing = sorted(set(info.get("missing_keys") or ()) - set(allow_missing))
    unexpected = sorted(info.get("unexpected_keys") or ())
    mismatched = sorted(str(m[0]) if isinstance(m, (tuple, list)) else str(m)
                        for m in (info.get("mismatched_keys") or ()))
    if missing or unexpected or mismatched:
        parts = [f"missing {missing}" if missing else "", f"unexpected {unexpected}" if unexpected else "",
                 f"wrong shape {mismatched}" if mismatched else ""]
        raise ValueError(f"incomplete or foreign checkpoint for {what}: " + "; ".join(p for p in parts if p))


def load_strict(loader, path, what: str, **kwargs):
    """``loader.from_pretrained(path, **kwargs)`` that refuses an incomplete checkpoint (see module doc).

    Args:
        loader: a ``PreTrainedModel`` subclass or ``AutoModelForCausalLM``.
        path: folder or hub id.
        what: how to name the checkpoint in the error.
    Raises:
        ValueError: naming the missing / unexpected / mis-shaped tensors.
    """
    model, info = loader.from_pretrained(str(path), output_loading_info=True, **kwargs)
    tied = tuple(getattr(model, "_tied_weights_keys", None) or ()) if getattr(
        model.config, "tie_word_embeddings", False) else ()
    check_loading_info(info, f"{what} ({path})", allow_missing=tied)
    return model
