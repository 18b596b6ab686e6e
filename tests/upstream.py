"""The upstream reference runtimes, installed for the tests only (used by tests/test_upstream.py and
benchmarks/upstream_parity.py).

* ``dflash==0.1.0`` (z-lab, MIT): ``dflash/model.py`` holds ``DFlashDraftModel`` and ``dflash_generate``. It
  imports only torch and transformers; its own pins (transformers 5.15) differ from ours, so it is installed
  without dependencies, as a new user on our pinned transformers 5.23 would run it.
* ``angelslim==0.5.0`` (Tencent): the EAGLE-3 draft model behind ``AngelSlim/Qwen3-8B_eagle3``
  (``compressor/speculative/inference/models/eagle3/draft/{base_model,llama3_eagle3}.py``) and its config
  (``.../eagle3/configuration_eagle3_model.py``). Importing them through the package runs every parent
  ``__init__``, which pulls in the whole compression toolkit (its quantizers, its target models, its ``utils``);
  instead the parent packages are registered as empty namespace modules (:data:`ANGELSLIM_STUBBED_PACKAGES`)
  and only those three files are executed. Their own imports are then all satisfied by our environment
  (torch, transformers, safetensors, huggingface_hub): nothing else had to be stubbed.

Both are installed once with ``pip install --no-deps --only-binary=:all: --target .cache/upstream/<name>``
(git-ignored), the way tests/sglang_parser.py installs SGLang's parser.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

from tests.envs import ROOT, pip_target_once

DFLASH = "dflash==0.1.0"
ANGELSLIM = "angelslim==0.5.0"
EAGLE3_PACKAGE = "angelslim.compressor.speculative.inference.models.eagle3"
ANGELSLIM_STUBBED_PACKAGES = ["angelslim", "angelslim.compressor", "angelslim.compressor.speculative",
                              "angelslim.compressor.speculative.inference",
                              "angelslim.compressor.speculative.inference.models", EAGLE3_PACKAGE,
                              EAGLE3_PACKAGE + ".draft"]
"""Parent packages of the EAGLE-3 files registered empty (their ``__init__`` would import the whole toolkit)."""


def site(pin: str) -> Path:
    """Folder holding ``pin`` installed without dependencies (installed on first use)."""
    folder = ROOT / ".cache" / "upstream" / pin.replace("==", "-")
    return pip_target_once(folder, [pin], pin)


def dflash_model():
    """z-lab's ``dflash.model`` module (``DFlashDraftModel``, ``dflash_generate``)."""
    path = str(site(DFLASH))
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module("dflash.model")


def angelslim_eagle3():
    """AngelSlim's EAGLE-3 modules: ``(draft module llama3_eagle3, config module configuration_eagle3_model)``."""
    root = site(ANGELSLIM)
    for name in ANGELSLIM_STUBBED_PACKAGES:
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(root / name.replace(".", "/"))]
            sys.modules[name] = pkg
    mods = []
    for name in ("configuration_eagle3_model", "draft.base_model", "draft.llama3_eagle3"):
        full = f"{EAGLE3_PACKAGE}.{name}"
        if full not in sys.modules:
            file = root / (full.replace(".", "/") + ".py")
            spec = importlib.util.spec_from_file_location(full, file)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[full] = mod
            spec.loader.exec_module(mod)
        mods.append(sys.modules[full])
    return mods[2], mods[0]
