"""Shared fixtures: tiny randomly initialised targets and drafters built in the test (no downloads)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from tests import checkout_guard
from tests.workflow import ROOT, copy_project, import_guard_env, smoke_outputs, snakemake

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)  # tiny models: threading costs more than it gives

# The suite runs on two pytest-xdist workers (pyproject: -n 2). A session or module fixture is set up once per worker
# that runs a test needing it, so the modules whose tests reach one of the end-to-end runs share a worker: the smoke
# DAG and what copies or compares with it (its artifacts extension and the findings stage, the two-rank trainings,
# the full-vocabulary drafters, the vLLM servers) on one, the paper_mini DAG and the SLURM run on the other, and the unit tests, one
# test at a time, fill in around them. (xdist's own `--dist loadgroup` cannot do this with pytest 9: it renames
# nodeids through an attribute pytest 9 no longer reads, so every test became its own group.)
END_TO_END_GROUPS = {"test_pipeline.py": "smoke", "test_distributed_training.py": "smoke", "test_slurm.py": "paper_mini",
                     "test_upstream.py": "smoke", "test_vllm.py": "smoke", "test_paper_mini.py": "paper_mini"}
# The SLURM run (~3.5 min) sits on the paper_mini worker, whose chain is the shorter one. It compares with the smoke
# run's outputs, which the smoke worker's run writes to a folder both workers see (`smoke_outputs`), so the suite
# runs the smoke DAG once.
HEAVY_FIXTURES = {"smoke_run": {"smoke"}, "local_smoke_outputs": {"paper_mini"}, "slurm_run": {"paper_mini"},
                  "local_slurm": {"paper_mini"}, "runs": {"smoke"}, "full_vocab_run": {"smoke"},
                  "smoke_artifacts_run": {"smoke"}, "paper_mini_run": {"paper_mini"}}


def pytest_sessionstart(session):
    """The controller fingerprints the checkout's results/ and .snakemake/ before any test runs."""
    if not hasattr(session.config, "workerinput"):
        session.config._checkout_before = checkout_guard.snapshot(ROOT)


def pytest_sessionfinish(session, exitstatus):
    """... and fails the run if the suite added, removed or changed anything there (a user's finished run)."""
    before = getattr(session.config, "_checkout_before", None)
    if before is None:
        return
    changed = checkout_guard.differences(before, checkout_guard.snapshot(ROOT))
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = ("FAILED checkout guard: the suite touched the checkout's results/ or .snakemake/ "
                   "(tests must plan and run in copies):\n  " + "\n  ".join(changed))
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(message, red=True)
        else:
            print(message)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def end_to_end_group(nodeid: str) -> str:
    """The xdist work unit of a test: its module's end-to-end group, else the test alone."""
    return END_TO_END_GROUPS.get(nodeid.split("::", 1)[0].rsplit("/", 1)[-1], nodeid)


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class EndToEndGroups(LoadScopeScheduling):
        """Work units as :func:`end_to_end_group`; the largest first (xdist's loadscope reorder)."""

        def _split_scope(self, nodeid):
            return end_to_end_group(nodeid)

    return EndToEndGroups(config, log)


def pytest_collection_modifyitems(config, items):
    """A test outside the grouped modules that needs an end-to-end run would repeat it on the other worker."""
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            if name in HEAVY_FIXTURES and end_to_end_group(item.nodeid) not in HEAVY_FIXTURES[name]:
                raise pytest.UsageError(f"{item.nodeid} needs fixture {name} of the end-to-end group(s) "
                                        f"{sorted(HEAVY_FIXTURES[name])}: list its module in tests/conftest.py "
                                        "END_TO_END_GROUPS")


def tiny_llama_config(vocab=64, layers=4, init=0.2, **kw) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       initializer_range=init, **kw)


def tiny_target(vocab=64, layers=4, seed=0, dtype=torch.float64, family="llama", init=0.2):
    """A tiny random target wrapped as :class:`TargetModel` (float64: greedy ties are practically impossible)."""
    from dscout.models.target import TargetModel

    torch.manual_seed(seed)
    if family == "qwen3":
        cfg = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                          initializer_range=init)
        model = Qwen3ForCausalLM(cfg)
    else:
        model = LlamaForCausalLM(tiny_llama_config(vocab, layers, init))
    return TargetModel(model.to(dtype))


def tiny_drafter(target, layers=2, block_size=32, seed=1, layer_ids=None, mask_token_id=None,
                 draft_vocab_size=None):
    from dscout.models.drafter import DFlashDrafter, DFlashDrafterConfig

    torch.manual_seed(seed)
    cfg = DFlashDrafterConfig.from_target(
        target.config, num_hidden_layers=layers, target_layer_ids=layer_ids,
        mask_token_id=target.vocab_size - 1 if mask_token_id is None else mask_token_id, block_size=block_size,
        draft_vocab_size=draft_vocab_size)
    return DFlashDrafter(cfg).to(target.dtype).attach_target(target)


def greedy_sequences(target, n=24, prompt_len=5, new_tokens=40, seed=0) -> list[dict]:
    """``n`` training-style sequences: random prompts and the target's own greedy continuations (AR engine)."""
    from dscout.decoding.engine import SpeculativeEngine

    ar = SpeculativeEngine(target)
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for i in range(n):
        prompt = torch.randint(1, target.vocab_size - 2, (prompt_len,), generator=g).tolist()
        out = ar.generate(prompt, new_tokens).output_ids
        seqs.append({"id": i, "input_ids": prompt + out, "loss_mask": [0] * prompt_len + [1] * len(out)})
    return seqs


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def drafter(target):
    return tiny_drafter(target)


def shared_folder(tmp_path_factory) -> Path:
    """A folder every pytest-xdist worker of this session sees (the session's own base folder without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _run_smoke(work: Path):
    # every job runs with the packages its rule's conda env lacks made unimportable (tests/import_guard)
    return snakemake("--cores", "2", "--configfile", "presets/smoke.yaml", cwd=work, timeout=900,
                     env=import_guard_env(work, ["presets/smoke.yaml", "presets/smoke_artifacts.yaml"]))


def _publish_smoke_outputs(shared: Path, work: Path) -> dict:
    outputs = smoke_outputs(work)
    tmp = shared / f"smoke-outputs.{os.getpid()}.json"
    tmp.write_text(json.dumps(outputs))
    os.replace(tmp, shared / "smoke-outputs.json")
    return outputs


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """The smoke preset run end to end in a copy of the project (results/ stays out of the checkout). Its outputs
    are published for the other worker (:func:`local_smoke_outputs`) before any test adds to the run."""
    shared = shared_folder(tmp_path_factory)
    with FileLock(str(shared / "smoke-outputs.lock")):  # the other worker waits for these outputs, not reruns them
        work = copy_project(tmp_path_factory.mktemp("smoke"))
        r = _run_smoke(work)
        # right away (before the artifacts extension adds temperature-1 records): a second run schedules nothing
        r.second_run = snakemake("-n", "--cores", "2", "--configfile", "presets/smoke.yaml", cwd=work)
        if r.returncode == 0:
            _publish_smoke_outputs(shared, work)
    return work, r


@pytest.fixture(scope="session")
def local_smoke_outputs(tmp_path_factory) -> dict:
    """:func:`smoke_outputs` of a local run of the smoke DAG: the smoke worker's (waiting while it runs), or, when
    no worker has run it (its tests not selected), a run of its own."""
    shared = shared_folder(tmp_path_factory)
    with FileLock(str(shared / "smoke-outputs.lock")):
        published = shared / "smoke-outputs.json"
        if published.exists():
            return json.loads(published.read_text())
        work = copy_project(tmp_path_factory.mktemp("smoke_local"))
        r = _run_smoke(work)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        return _publish_smoke_outputs(shared, work)


FULL_VOCAB_DRAFTERS = """\
drafters:   # the smoke preset's DFlash and DScout drafters with the target's whole vocabulary as draft head
  dflash_fv: {recipe: dflash, num_layers: 1, num_taps: 2, init_from_target: true, options: {norm_init: ones},
              training: {max_steps: 300}}
  dscout_fv: {recipe: dscout, num_layers: 1, num_taps: 2, init_from_target: true, options: {norm_init: ones},
              training: {max_steps: 300}}
methods:
  - {name: DFlash-fv(16), kind: dflash, drafter: dflash_fv, block_size: 16}
  - {name: DScout-fv(16), kind: dscout, drafter: dscout_fv, block_size: 16}
benchmarks: {sampled_methods: null}
"""


@pytest.fixture(scope="session")
def full_vocab_run(smoke_run, tmp_path_factory):
    """The smoke run plus a DFlash- and a DScout-recipe drafter with a full-vocabulary head, trained by the
    pipeline (300 steps each, ~30 s) in a copy of it."""
    work = tmp_path_factory.mktemp("fullvocab") / "work"
    shutil.copytree(smoke_run[0], work, symlinks=True)
    (work / "fullvocab.yaml").write_text(FULL_VOCAB_DRAFTERS)
    from dscout import config as dcfg

    cfg = dcfg.load_config(work / "config.yaml", work / "presets" / "smoke.yaml", work / "fullvocab.yaml")
    L = cfg["target"]["num_layers"]
    dirs = {n: work / "results" / "drafters" / dcfg.drafter_id(cfg, n, L) for n in ("dflash_fv", "dscout_fv")}
    snakemake("--cores", "2", "--configfile", "presets/smoke.yaml", "fullvocab.yaml", "--",
              *[str(d.relative_to(work) / "training_summary.json") for d in dirs.values()], cwd=work)
    return work, dirs
