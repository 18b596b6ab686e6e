"""Where the local benchmark and prompt files live: one config key, one environment variable.

``data_root`` in the config (or ``DSCOUT_DATA_ROOT`` in the environment, which wins) points at a data mirror:
a folder laid out as docs/data.md lists. A source missing there is read from its hub copy
(:mod:`dscout.data.hub`); with neither, the stage stops naming the file, the hub id and how to fetch a mirror.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "DSCOUT_DATA_ROOT"
DEFAULT = "../shared/data"


def data_root(configured: str | os.PathLike | None = None, project_dir: str | os.PathLike | None = None) -> Path:
    """The data folder, as an absolute path.

    ``$DSCOUT_DATA_ROOT`` wins when set (a relative value is relative to the current directory, as any path given
    in the shell); else ``configured`` (the config key ``data_root``), else ``../shared/data``. A relative
    configured path is relative to ``project_dir``: the project, i.e. the folder holding ``config.yaml`` and the
    Snakefile (``workflow.basedir``), wherever Snakemake runs and wherever the project (or a copy) lies; without
    ``project_dir`` (a stage's ``--data-root`` argument) it is relative to the current directory.

    Args:
        configured: the ``data_root`` value, or None.
        project_dir: the folder a relative ``configured`` value is relative to; None = the current directory.
    Returns:
        the absolute path (it need not exist).
    """
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).absolute()
    path = Path(configured or DEFAULT)
    if not path.is_absolute() and project_dir is not None:
        path = Path(project_dir) / path
    return Path(os.path.normpath(path.absolute()))
