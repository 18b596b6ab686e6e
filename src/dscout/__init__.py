"""dscout: factorization-guided training and inference for diffusion-drafted speculative decoding.

The package holds the parts that are this project's own: the DFlash-architecture block-diffusion drafter
(:mod:`dscout.models.drafter`), the factorized training loss (:mod:`dscout.training.losses`), the one
draft-verify engine every method runs through (:mod:`dscout.decoding.engine`) and the experiment logic
that turns raw per-prompt records into the paper's tables and figures (:mod:`dscout.analysis`).
"""

__version__ = "0.1.0"
