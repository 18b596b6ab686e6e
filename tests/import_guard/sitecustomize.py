"""Makes third-party packages that a job's conda env lacks unimportable (test aid; on PYTHONPATH only in tests).

Two switches, both environment variables:

* ``DSCOUT_BLOCK_IMPORTS=torch,transformers`` blocks those top-level packages in every Python process
  (``snakemake -n`` must plan without torch).
* ``DSCOUT_IMPORT_GUARD=<file.json>`` maps a ``dscout`` CLI subcommand to the packages its rule's env lacks
  (``tests/envs.py`` builds it from the workflow's rules and pip's resolution of ``envs/*.yaml``); a process
  running ``src/dscout/cli.py <subcommand>`` (directly or under DeepSpeed's launcher) gets those blocked.

A blocked import raises ModuleNotFoundError naming the env, exactly what the job would meet inside that env.
"""

import importlib.abc
import json
import os
import sys


class _Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, blocked, why):
        self.blocked, self.why = set(blocked), why

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"No module named '{fullname}' ({self.why})", name=fullname)
        return None


def _subcommand(argv):
    if not argv or not argv[0].replace("\\", "/").endswith("dscout/cli.py"):
        return None
    return next((a for a in argv[1:] if not a.startswith("-")), None)


def _install():
    blocked = [m for m in os.environ.get("DSCOUT_BLOCK_IMPORTS", "").split(",") if m]
    if blocked:
        sys.meta_path.insert(0, _Blocker(blocked, "blocked by DSCOUT_BLOCK_IMPORTS"))
    guard = os.environ.get("DSCOUT_IMPORT_GUARD")
    sub = _subcommand(getattr(sys, "argv", []))
    if guard and sub:
        mapping = json.loads(open(guard).read())
        if sub in mapping:
            entry = mapping[sub]
            sys.meta_path.insert(0, _Blocker(entry["blocked"], f"not in {entry['env']}, the env of `dscout {sub}`"))


_install()
