"""Where the local benchmark and prompt files live: one config key, one environment variable.

``data_root`` in the config (or ``DSCOUT_DATA_ROOT`` in the environment, which wins) points at a data mirror:
a folder laid out as docs/data.md lists. A source missing there is read from its hub copy
(:mod:`dscout.data.hub`); with neither, the stage stops naming the file, the hub id and how to fetch a mirror.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "DSCOUT_DATA_ROOT"


def data_root(configured: str | os.PathLike | None = None) -> Path:
    """The data folder: ``$DSCOUT_DATA_ROOT`` if set, else ``configured``, else ``../shared/data``."""
    env = os.environ.get(ENV_VAR)
    return Path(env or configured or "../shared/data")
