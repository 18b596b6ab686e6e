"""Named training recipes: compositions of the three loss factors (docs/method.md §3).

=================  ==========================  ==============  =========================
recipe             inclusion (horizons)        weighting       prediction
=================  ==========================  ==============  =========================
dflash             fixed B = 16                decay (g=7)     all masked
fixed8/16/32       fixed B = 8/16/32           decay           all masked
step1_fixed32      fixed B = 32                decay           all masked
step2_mixed        mixed {8, 16, 24, 32}       decay           all masked
step3_unmask       mixed {8, 16, 24, 32}       decay           intra-block unmasking
step4_awl = dscout mixed {8, 16, 24, 32}       AWL             intra-block unmasking
=================  ==========================  ==============  =========================

The four ``step*`` recipes are the cumulative ablation of the paper's Figure 4. The paper states that AWL is the
fourth and largest step (+0.151, +0.155, +0.171, +0.491 MAT); the order of the first three is our reading of
its factor table (inclusion, then prediction, then weighting), with "longer horizon" as the first inclusion
step since the DFlash recipe names B = 16 "or 32". The ``mixed_*`` recipes are Table 1's horizon sets.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported lazily: the recipe table is read at plan time
    import torch


WEIGHTINGS = ("none", "decay", "awl")


@dataclass(frozen=True)
class Recipe:
    """One training recipe.

    Attributes:
        horizons: training horizons; one value = fixed horizon, several = mixed (B drawn uniformly per update).
        weighting: ``none`` | ``decay`` | ``awl``.
        decay_gamma: gamma of the decay weighting (None: 7 at B=16, see ``losses.decay_gamma``).
        unmask: intra-block unmasking on/off.
        p_full: probability that a block stays fully masked when unmasking is on.
        beta_a, beta_b: Beta distribution of the mask rate when a block is partly revealed.
    """

    horizons: tuple[int, ...] = (16,)
    weighting: str = "decay"
    decay_gamma: float | None = None
    unmask: bool = False
    p_full: float = 0.5
    beta_a: float = 3.0
    beta_b: float = 1.0

    def __post_init__(self):
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got '{self.weighting}'")
        if not self.horizons or min(self.horizons) < 2:
            raise ValueError(f"horizons must be a non-empty set of block sizes >= 2, got {self.horizons}")
        if not 0.0 <= self.p_full <= 1.0:
            raise ValueError(f"p_full must lie in [0, 1], got {self.p_full}")
        if self.beta_a <= 0 or self.beta_b <= 0:
            raise ValueError("beta_a and beta_b must be positive")

    @property
    def max_horizon(self) -> int:
        """The largest B: the drafter's ``block_size`` (any inference bs up to it is valid)."""
        return max(self.horizons)

    @property
    def mixed(self) -> bool:
        return len(self.horizons) > 1

    def draw_horizon(self, generator: "torch.Generator") -> int:
        """Inclusion factor: the horizon B of one update, uniform over ``horizons``."""
        if len(self.horizons) == 1:
            return self.horizons[0]
        import torch  # lazy: the recipe table is read at plan time, where torch may be absent

        i = int(torch.randint(len(self.horizons), (1,), generator=generator))
        return self.horizons[i]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["horizons"] = list(self.horizons)
        return d


MIXED = (8, 16, 24, 32)

RECIPES: dict[str, Recipe] = {
    "dflash": Recipe(horizons=(16,), weighting="decay"),
    "fixed8": Recipe(horizons=(8,), weighting="decay"),
    "fixed16": Recipe(horizons=(16,), weighting="decay"),
    "fixed32": Recipe(horizons=(32,), weighting="decay"),
    "step1_fixed32": Recipe(horizons=(32,), weighting="decay"),
    "step2_mixed": Recipe(horizons=MIXED, weighting="decay"),
    "step3_unmask": Recipe(horizons=MIXED, weighting="decay", unmask=True),
    "step4_awl": Recipe(horizons=MIXED, weighting="awl", unmask=True),
    "dscout": Recipe(horizons=MIXED, weighting="awl", unmask=True),
    "mixed": Recipe(horizons=MIXED, weighting="decay"),
    "mixed_short": Recipe(horizons=(4, 8, 16, 32), weighting="decay"),
    "mixed_unmask": Recipe(horizons=MIXED, weighting="decay", unmask=True),
    "mixed_short_unmask": Recipe(horizons=(4, 8, 16, 32), weighting="decay", unmask=True),
}

ABLATION_STEPS = ("dflash", "step1_fixed32", "step2_mixed", "step3_unmask", "step4_awl")
"""Figure 4's cumulative order: the DFlash recipe, then each DScout step."""


def get_recipe(name: str, **overrides) -> Recipe:
    """Look up a named recipe, optionally overriding fields (e.g. ``horizons=(4, 8)``).

    Raises:
        KeyError: for an unknown name, listing the valid ones.
    """
    if name not in RECIPES:
        raise KeyError(f"unknown recipe '{name}'; valid recipes: {', '.join(sorted(RECIPES))}")
    overrides = {k: (tuple(v) if k == "horizons" else v) for k, v in overrides.items() if v is not None}
    return replace(RECIPES[name], **overrides) if overrides else RECIPES[name]


__all__ = ["Recipe", "RECIPES", "ABLATION_STEPS", "get_recipe"]
