"""Which target layers a drafter reads: the tap rules of every drafter kind, free of torch.

Snakemake imports this module when it plans the workflow (a drafter's stage id depends on its layer set), so it
must import nothing beyond the standard library: a login node plans with Snakemake alone. The model modules
(:mod:`dscout.models.target`, :mod:`dscout.models.eagle3`, :mod:`dscout.models.pard`) re-export these names.

Layer ids follow the project convention: id ``l`` is the output of decoder layer ``l`` (0-based), i.e. HF
``hidden_states[l + 1]``, before the final norm.
"""

from __future__ import annotations

PARD2_TARGET_LAYERS = (-1, -8, -16, -24)
"""Upstream PARD-2 feature layers (HF ``hidden_states`` indices; -1 = final-normed output)."""

FINAL = -1
"""Marker in :attr:`Pard2Config.feature_layers` for the target's final-normed output."""

def default_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """The DFlash spacing rule for which target layers to tap (upstream DFlash and SGLang, see Source below).

    One tap: ``[L // 2]``. Otherwise ``round(1 + i * (L - 4) / (t - 1))`` for ``i = 0..t-1``: evenly spaced
    from layer 1 to layer L-3 (0-based). Upstream ties t to the drafter depth; here t is free, and
    ``num_taps >= L - 2`` means "all usable layers": the t layers right below the last one (``L - 1`` taps =
    layers 0..L-2; SGLang cannot capture the last layer's output).

    Args:
        num_target_layers: L, the target's decoder-layer count.
        num_taps: t, how many layers to tap.
    Returns:
        ``t`` sorted, distinct layer ids.
    Raises:
        ValueError: if ``num_taps`` < 1 or exceeds ``num_target_layers``.
    Source: ``build_target_layer_ids`` in z-lab/dflash ``dflash/model.py`` and SGLang ``dflash_utils.py``.
    """
    L, t = num_target_layers, num_taps
    if t < 1 or t > L - 1:
        raise ValueError(f"cannot tap {t} layers of a {L}-layer target (at most L - 1 = {L - 1}: the last "
                         "layer's output is never captured by SGLang, which reads states before layer l + 1)")
    if t == 1:
        return [L // 2]
    if t >= L - 2:  # "all layers": no room for the 1..L-3 spacing; the deepest t layers below the last
        return list(range(L - 1 - t, L - 1))
    ids = [int(round(1 + i * (L - 4) / (t - 1))) for i in range(t)]
    if len(set(ids)) != t:
        raise ValueError(f"spacing rule gives duplicate layers for t={t}, L={L}: {ids}")
    return ids

def default_eagle3_layer_ids(num_target_layers: int) -> list[int]:
    """EAGLE-3's three tapped layers in our id convention: ``[1, L//2 - 1, L - 4]``.

    These are HF ``hidden_states`` indices ``{2, L//2, L-3}`` shifted by one (EAGLE-3 as released;
    SpecForge default ``[1, L//2-1, L-4]``). For very shallow targets ids may repeat (L = 4 gives ``[1, 1, 0]``).

    Raises:
        ValueError: if ``num_target_layers`` < 4 (the last id would be negative).
    """
    L = int(num_target_layers)
    if L < 4:
        raise ValueError(f"EAGLE-3 taps layer L - 4; a {L}-layer target is too shallow (need L >= 4)")
    return [1, L // 2 - 1, L - 4]

def resolve_feature_layers(target_layer_ids, num_target_layers: int) -> list[int]:
    """Map upstream HF ``hidden_states`` indices onto our target's taps.

    Args:
        target_layer_ids: negative HF ``hidden_states`` indices, e.g. ``[-1, -8, -16, -24]``.
        num_target_layers: L, the target's decoder-layer count.
    Returns:
        One entry per distinct feature, in the given order: :data:`FINAL` (-1) for the final-normed output,
        else the 0-based decoder layer whose output is tapped (``L + id``, clipped to 0).
    Raises:
        ValueError: on an empty list or a non-negative id.
    """
    ids = [int(i) for i in target_layer_ids]
    if not ids:
        raise ValueError("target_layer_ids must not be empty")
    out: list[int] = []
    for i in ids:
        if i >= 0:
            raise ValueError(f"target_layer_ids are negative HF hidden_states indices (-1 = final-normed "
                             f"output), got {i}")
        lid = FINAL if i == -1 else max(0, num_target_layers + i)
        if lid not in out:
            out.append(lid)
    return out
