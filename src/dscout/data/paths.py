"""Where the local benchmark and prompt files live: one config key, one environment variable.

``data_root`` in the config (or ``DSCOUT_DATA_ROOT`` in the environment, which wins) points at a folder laid
out like ``../shared/data`` (see its ``SOURCES.md``). Nothing is ever downloaded at run time; a missing file
stops the stage with a message naming the file and the key to set.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "DSCOUT_DATA_ROOT"


def data_root(configured: str | os.PathLike | None = None) -> Path:
    """The data folder: ``$DSCOUT_DATA_ROOT`` if set, else ``configured``, else ``../shared/data``."""
    env = os.environ.get(ENV_VAR)
    return Path(env or configured or "../shared/data")


def data_file(root: str | os.PathLike, relative: str) -> Path:
    """``root / relative``, checked.

    Raises:
        FileNotFoundError: naming the file, the ``data_root`` config key and the environment variable.
    """
    path = Path(root) / relative
    if not path.exists():
        raise FileNotFoundError(
            f"data file {path} not found. Point the config key 'data_root' (or the environment variable "
            f"{ENV_VAR}) at the folder that holds '{relative}' (the project's shared/data).")
    return path
