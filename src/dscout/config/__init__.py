"""Configuration: schema validation with defaults, plan-time checks, the per-stage slices and their short hashes,
and the provenance written beside every output.

Every stage's output path carries a short hash of *exactly* the configuration it depends on, and a
``config.resolved.json`` is written beside it. A benchmark-only change therefore never retrains a drafter, and
a recipe change never regenerates responses. Code changes are tracked separately: :func:`code_digest` hashes the
source files a stage imports; the Snakefile passes it as a rule parameter, so editing them reruns the stage.

Stage dependency chain (each key includes its parent's key):
``target -> responses -> features(layer set) / drafter(variant) -> bench(benchmark, repeat, temperature)``.

Modules (every public name is re-exported here: ``from dscout import config as dcfg; dcfg.bench_id(...)``):

* :mod:`dscout.config.schema`: loading, merging, validation against ``schemas/config.schema.yaml``, defaults;
* :mod:`dscout.config.checks`: the plan checks, one function per check, run in order by :func:`check_plan`;
* :mod:`dscout.config.stages`: the stage slices and ids (what each job receives and where its outputs go);
* :mod:`dscout.config.provenance`: :func:`code_digest` (a rerun trigger) and :func:`write_resolved`.
"""

from __future__ import annotations

from .checks import *  # noqa: F401,F403
from .checks import __all__ as _checks
from .provenance import *  # noqa: F401,F403
from .provenance import __all__ as _provenance
from .schema import *  # noqa: F401,F403
from .schema import __all__ as _schema
from .stages import *  # noqa: F401,F403
from .stages import __all__ as _stages

__all__ = sorted({*_schema, *_checks, *_stages, *_provenance})
