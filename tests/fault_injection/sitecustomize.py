"""Fault injection for the trainer's stop / resume tests (test aid; on PYTHONPATH only in the tests that use it).

The trainer has no test hooks: these patch :mod:`dscout.training.trainer` from outside. In the test process a test
calls :func:`pause_before_update` (with ``monkeypatch.setattr``) or :func:`crash_before_update`; in a job that a test
starts (Snakemake, DeepSpeed's launcher and its ranks) this file, as ``sitecustomize``, patches the trainer when it
is first imported, if ``DSCOUT_TEST_PAUSE_AFTER_STEP=<step>`` and ``DSCOUT_TEST_PAUSE_FILE=<absolute path>`` are set.
"""

import importlib.abc
import json
import os
import sys
import time
from pathlib import Path


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", "0"))


def pause_before_update(trainer, step: int, paused_file, setattr=setattr, timeout: float = 120.0) -> None:
    """Patch ``trainer`` (the module) so that rank 0, when update ``step`` (0-based) begins, writes ``paused_file``
    (its process id and its parent's, i.e. DeepSpeed's launcher under ``deepspeed``) and waits up to ``timeout``
    seconds for a stop signal, so a test can send a real signal from outside while that update runs; the update
    then completes and its gather carries the signal (the checkpoint is ``step + 1``, not a checkpoint step).
    The other ranks go on to the update's collectives and wait there for rank 0, as ranks do that a signal has not
    reached yet (DeepSpeed's launcher signals its ranks one after another).

    Args:
        trainer: :mod:`dscout.training.trainer`.
        setattr: ``monkeypatch.setattr`` in a test (undone after it); the builtin in a job.
    """
    live = []
    enter, horizon = trainer.StopSignals.__enter__, trainer.update_horizon

    def stop_signals_enter(self):
        live.append(self)
        return enter(self)

    def update_horizon(method, seed, s):
        if s == step and live and _rank() == 0:
            Path(paused_file).write_text(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "step": s}))
            deadline = time.monotonic() + timeout
            while live[-1].signum is None and time.monotonic() < deadline:
                time.sleep(0.02)
        return horizon(method, seed, s)

    setattr(trainer.StopSignals, "__enter__", stop_signals_enter)
    setattr(trainer, "update_horizon", update_horizon)


def crash_before_update(trainer, step: int, setattr=setattr) -> None:
    """Patch ``trainer`` so that update ``step`` raises ``RuntimeError("simulated crash ...")`` before it runs, as a
    kill after update ``step - 1`` would (no checkpoint of it is saved: a rerun resumes from the last periodic one)."""
    horizon = trainer.update_horizon

    def update_horizon(method, seed, s):
        if s == step:
            raise RuntimeError(f"simulated crash after step {s - 1}")
        return horizon(method, seed, s)

    setattr(trainer, "update_horizon", update_horizon)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` right after module ``name`` is first executed (found by the other finders)."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def run(module):
                    exec_module(module)
                    self.then(module)

                spec.loader.exec_module = run
                return spec
        return None


def _install():
    step, paused = os.environ.get("DSCOUT_TEST_PAUSE_AFTER_STEP"), os.environ.get("DSCOUT_TEST_PAUSE_FILE")
    if step and paused:
        sys.meta_path.insert(0, _AfterImport("dscout.training.trainer",
                                             lambda trainer: pause_before_update(trainer, int(step), paused)))


_install()
