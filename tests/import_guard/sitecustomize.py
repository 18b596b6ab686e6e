"""Makes third-party packages that a job's conda env lacks unimportable (test aid; on PYTHONPATH only in tests).

Two switches, both environment variables:

* ``DSCOUT_BLOCK_IMPORTS=torch,transformers`` blocks those top-level packages in every Python process
  (``snakemake -n`` must plan without torch).
* ``DSCOUT_IMPORT_GUARD=<file.json>`` maps a ``dscout`` CLI subcommand to the packages its rule's env lacks
  (``tests/envs.py`` builds it from the workflow's rules and pip's resolution of ``envs/*.yaml``); a process
  running ``src/dscout/cli.py <subcommand>`` (directly or under DeepSpeed's launcher) gets those blocked.

A blocked package looks absent (ModuleNotFoundError on import, None from find_spec): what the job would meet
inside that env.
"""

import importlib.abc
import json
import os
import sys


class _Hidden(importlib.abc.MetaPathFinder):
    """Wraps a finder so that blocked top-level packages look absent: ``import`` raises ModuleNotFoundError and
    ``importlib.util.find_spec`` returns None, exactly as in an env without them (libraries probe optional
    packages with find_spec)."""

    def __init__(self, finder, blocked):
        self.finder, self.blocked = finder, blocked

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.blocked:
            return None
        return self.finder.find_spec(fullname, path, target)

    def invalidate_caches(self):
        if hasattr(self.finder, "invalidate_caches"):
            self.finder.invalidate_caches()

    def find_distributions(self, *args, **kwargs):  # importlib.metadata: no metadata of a blocked package either
        find = getattr(self.finder, "find_distributions", None)
        for dist in find(*args, **kwargs) if find else ():
            name = (dist.metadata["Name"] or "").lower().replace("-", "_")
            if name not in self.blocked:
                yield dist

    def __getattr__(self, name):  # find_distributions (importlib.metadata) and the like: the wrapped finder's
        return getattr(self.finder, name)


def _hide(blocked):
    blocked = set(blocked)
    sys.meta_path[:] = [f if not hasattr(f, "find_spec") else _Hidden(f, blocked) for f in sys.meta_path]
    for name in list(sys.modules):
        if name.split(".")[0] in blocked:
            del sys.modules[name]


def _subcommand(argv):
    if not argv or not argv[0].replace("\\", "/").endswith("dscout/cli.py"):
        return None
    return next((a for a in argv[1:] if not a.startswith("-")), None)


def _install():
    blocked = [m for m in os.environ.get("DSCOUT_BLOCK_IMPORTS", "").split(",") if m]
    guard = os.environ.get("DSCOUT_IMPORT_GUARD")
    sub = _subcommand(getattr(sys, "argv", []))
    if guard and sub:
        mapping = json.loads(open(guard).read())
        if sub in mapping:
            blocked += mapping[sub]["blocked"]
            os.environ["DSCOUT_IMPORT_GUARD_ENV"] = mapping[sub]["env"]  # for error messages of the job's log
    if blocked:
        _hide(blocked)


_install()
