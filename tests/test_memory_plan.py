"""The memory plan (`dscout memory-plan`): calibrated against a real update on the CPU, and the paper's drafters
fit an 80 GB GPU with 10 % headroom."""

import os

import pytest
import torch

from dscout.config import load_config
from dscout.training.memory_estimate import config_estimates, memory_problems
from dscout.training.memory_plan import (CATEGORIES, MemoryTracker, format_plan, memory_plan, plan_update,
                                         target_config, trained_drafters, worst_case_inputs)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _calibration_config():
    return load_config(os.path.join(ROOT, "config.yaml"), overrides={
        "target": {"name": "calib", "source": "tiny-qwen3:3", "num_layers": 3, "vocab_size": 3000,
                   "mask_token_id": 2999, "dtype": "float32", "device": "cpu"},
        "responses": {"max_length": 160},
        "training": {"deepspeed_config": "configs/deepspeed/cpu.json", "micro_batch_size": 2, "num_anchors": 40,
                     "num_gpus": 0},
        "drafters": {"calib": {"recipe": "dscout", "num_layers": 2, "num_taps": 2,
                               "options": {"draft_vocab_size": None, "norm_init": "target"}}},
    })


def _measured_update_peak(config, name):
    """Bytes above the weights at the peak of two real updates (the second has AdamW's state), from the
    allocator's own events (the profiler's memory events), with DeepSpeed's engine doing backward and step as in
    the trainer."""
    import deepspeed
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from dscout.models.target import TargetModel
    from dscout.training.features import online_batch
    from dscout.training.methods import DFlashMethod
    from dscout.training.step import blocks_loss
    from dscout.training.trainer import TrainConfig, _ds_config, init_distributed

    v = config["drafters"][name]
    tr = config["training"]
    init_distributed()
    torch.manual_seed(0)
    target = TargetModel(AutoModelForCausalLM.from_config(target_config(config["target"]), dtype=torch.float32))
    cfg = TrainConfig(recipe=v["recipe"], num_layers=v["num_layers"], num_taps=v["num_taps"],
                      mask_token_id=config["target"]["mask_token_id"], num_anchors=tr["num_anchors"],
                      micro_batch_size=tr["micro_batch_size"], deepspeed_config=os.path.join(ROOT, tr["deepspeed_config"]),
                      options=dict(v["options"]))
    method = DFlashMethod(cfg)
    drafter = method.build(target)
    drafter.set_tap_scale(torch.ones(drafter.tap_scale.shape))
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-4, fused=True)
    engine, _, _, _ = deepspeed.initialize(model=drafter, optimizer=opt,
                                           config=_ds_config(cfg.deepspeed_config, cfg, 10, 1))
    engine.enable_backward_allreduce = False
    sequences, plan = worst_case_inputs(tr["micro_batch_size"], config["responses"]["max_length"],
                                        tr["num_anchors"], method.recipe, config["target"]["vocab_size"],
                                        cfg.mask_token_id)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(2):
            batch = online_batch(target, sequences, method.layer_ids)
            loss, _ = blocks_loss(engine.module, batch, plan, method.recipe, attention="sdpa")
            engine.backward(loss)
            engine.step()
            del batch, loss
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, n in events:
        live += n
        peak = max(peak, live)
    return peak


def test_memory_plan_is_within_15_percent_of_a_real_update_on_the_cpu():
    """Calibration: the plan (fake tensors, dispatch-level storage accounting) against the same update run for
    real, measured by the CPU allocator's profiler events (independent of the plan's counting). Compared above
    the weights, whose bytes are trivially equal: the update's own memory (AdamW state, online features,
    activations, logits) is what the estimate must get right."""
    config = _calibration_config()
    est = plan_update(config, "calib", gpu=False, project_dir=ROOT)
    measured = _measured_update_peak(config, "calib")
    estimated = est.peak_bytes - est.breakdown["weights"]
    assert est.breakdown["activations"] > est.breakdown["optimizer"] > 0  # a shape where activations matter
    assert abs(estimated - measured) <= 0.15 * measured, (estimated, measured, est)


def test_paper_drafters_fit_an_80_gb_gpu_with_10_percent_headroom():
    config = load_config(os.path.join(ROOT, "config.yaml"), os.path.join(ROOT, "presets", "paper.yaml"))
    names = set(trained_drafters(config))
    assert {"dflash", "dscout", "study_step4_awl", "depth_d9"} <= names
    plans = memory_plan(config, ROOT)
    by = {p.name: p for p in plans}
    assert by["dscout"].label == "35t6d" and by["dflash"].label == "5t5d" and by["study_step4_awl"].label == "9t9d"
    assert by["dscout"].shape == {"micro_batch_size": 1, "seq_len": 3072, "num_anchors": 512, "block_size": 32,
                                  "supervised_tokens": by["dscout"].shape["supervised_tokens"], "awl": True}
    assert by["dscout"].zero_stage == 2 and by["dscout"].world == 8
    estimates = config_estimates(config, ROOT)
    for p in plans:
        assert p.fits(80, headroom=0.10), format_plan(plans, 80)
        assert p.peak_bytes == pytest.approx(sum(p.breakdown.values()))
        # the Qwen3-8B target's bf16 weights alone (8.19e9 parameters) are in every plan
        assert p.breakdown["weights"] > 2 * 8.19e9
        # the plan-time formula (config.check_plan) tracks the update it stands for, on the safe side
        est = estimates[p.name]["peak"]
        assert p.peak_bytes <= est <= 1.15 * p.peak_bytes, (p.name, est, p.peak_bytes)
    # the micro-batch of 4 the preset named before did not fit: the plan must be able to say NO
    four = {**config["drafters"]["dscout"], "training": {"micro_batch_size": 4, "gradient_accumulation_steps": 1}}
    big = plan_update(config, "dscout", four, project_dir=ROOT)
    assert not big.fits(80) and big.peak_bytes > 2 * by["dscout"].peak_bytes
    big_est = config_estimates({**config, "drafters": {"dscout": four}, "study": {"enabled": False},
                                "depth_search": {"enabled": False}}, ROOT)["dscout"]["peak"]
    assert big.peak_bytes <= big_est <= 1.15 * big.peak_bytes


def test_check_plan_refuses_an_update_above_gpu_memory_gb():
    """Before any job, without torch: the paper preset passes at 80 GB; its old micro-batch of 4, or 40 GB GPUs,
    are refused with a message naming the key, the drafter and the estimate."""
    from dscout.config import check_plan, deep_merge

    config = load_config(os.path.join(ROOT, "config.yaml"), os.path.join(ROOT, "presets", "paper.yaml"))
    assert memory_problems(config, ROOT) == []
    four = deep_merge(config, {"training": {"micro_batch_size": 4, "gradient_accumulation_steps": 1}})
    problems = memory_problems(four, ROOT)
    assert any(p.startswith("training.gpu_memory_gb: one update of drafter 'dscout' needs an estimated 1")
               and "training.micro_batch_size" in p for p in problems), problems
    small = deep_merge(config, {"training": {"gpu_memory_gb": 40}})
    assert {p.split("'")[1] for p in memory_problems(small, ROOT)} >= {"dscout", "depth_d9", "study_step4_awl"}
    with pytest.raises(ValueError, match=r"training.gpu_memory_gb: one update of drafter 'dscout' needs"):
        check_plan(four, project_dir=ROOT)
    # a plan-time limit: it is not part of what a drafter's id hashes
    from dscout.config import drafter_id

    assert drafter_id(small, "dscout", 36) == drafter_id(config, "dscout", 36)
    from dscout.training import head, memory_estimate

    assert memory_estimate.LOGIT_CHUNK_BYTES == head.CHUNK_BYTES


def test_memory_plan_target_prints_the_table(tmp_path):
    """``snakemake memory_plan`` for a preset: the rule's job runs ``dscout memory-plan`` and prints its table."""
    from tests.workflow import copy_project, snakemake

    work = copy_project(tmp_path)
    r = snakemake("--cores", "1", "memory_plan", "--configfile", "presets/smoke.yaml", cwd=work)
    out = r.stdout + r.stderr
    assert "| dscout | 2t1d | dscout | 1 x 192, 8 x 32 |" in out and "kind eagle3: not planned" in out, out[-3000:]
    written = list((work / "results" / "memory_plan").glob("*.md"))
    assert len(written) == 1 and "| dflash | 2t1d |" in written[0].read_text()


def test_tracker_counts_storages_once_and_frees_them():
    tr = MemoryTracker(granularity=512)
    with tr:
        a = torch.empty(1000, dtype=torch.float32)  # 4000 B -> 4096 B in 512-byte blocks
        v = a.view(10, 100)  # a view: same storage
        b = a + 1
        del b
        peak_before = tr.peak
        with tr.category("logits"):
            c = torch.empty(100)
    assert peak_before == 2 * 4096
    assert tr.live["activations"] == 4096 and tr.live["logits"] == 512
    del a, v, c
    assert sum(tr.live.values()) == 0
    with pytest.raises(ValueError, match="unknown memory category"):
        with tr.category("nope"):
            pass
    assert set(CATEGORIES) == set(tr.at_peak)


def test_unknown_target_architecture_is_named():
    with pytest.raises(ValueError, match="target.source: 'org/unknown-model'"):
        target_config({"source": "org/unknown-model", "num_layers": 2, "vocab_size": 10})
