"""The drafter-depth search: lazy unimodal peak search and the linear latency fit (docs/method.md §5)."""

import pytest

from dscout.experiments.depth_search import fit_latency, unimodal_peak_search


def test_search_stops_at_the_first_drop_and_counts_evaluations():
    G = {1: 10.0, 2: 12.0, 3: 12.5, 4: 11.0, 5: 9.0, 6: 7.0}
    calls = []
    peak, evaluated = unimodal_peak_search([6, 5, 4, 3, 2, 1], lambda d: calls.append(d) or G[d])
    assert peak == 3 and calls == [1, 2, 3, 4]  # d = 5, 6 never trained
    assert list(evaluated) == [1, 2, 3, 4]


def test_search_evaluates_everything_when_throughput_keeps_rising():
    peak, evaluated = unimodal_peak_search([1, 2, 3], lambda d: float(d))
    assert peak == 3 and len(evaluated) == 3
    peak, evaluated = unimodal_peak_search([1, 2, 3], lambda d: -float(d))
    assert peak == 1 and len(evaluated) == 2
    with pytest.raises(ValueError):
        unimodal_peak_search([], float)


def test_latency_fit_recovers_a_linear_model():
    t_fix, t_layer = fit_latency([1, 2, 4, 6], [0.050 + 0.004 * d for d in (1, 2, 4, 6)])
    assert t_fix == pytest.approx(0.050) and t_layer == pytest.approx(0.004)
    with pytest.raises(ValueError):
        fit_latency([2, 2], [0.1, 0.2])


# --------------------------------------------------------------------------- online features: one job per candidate
def _online_project(tmp_path, throughputs: dict[int, float]):
    """A copy of the project planning the smoke depth search (d in {1, 2, 3}) on online features, with the target,
    the responses and the candidates ``throughputs`` (d -> G) already done (their point.json written)."""
    import json

    import yaml

    from dscout import config as dcfg
    from tests.workflow import copy_project

    (tmp_path / "project").mkdir()
    dest = copy_project(tmp_path / "project")
    (dest / "online.yaml").write_text(yaml.safe_dump({"features": {"mode": "online"}}))
    files = ["presets/smoke.yaml", "presets/smoke_artifacts.yaml", "online.yaml"]
    cfg = dcfg.load_config(dest / "config.yaml", *[dest / f for f in files])
    did = dcfg.stage_id(cfg, dcfg.depth_search_stage(cfg, cfg["target"]["num_layers"]))
    res = dest / "results"
    for f in (res / "target" / dcfg.target_id(cfg) / "target.json",
              res / "responses" / dcfg.responses_id(cfg) / "responses.jsonl"):
        f.parent.mkdir(parents=True)
        f.write_text("{}")
    for d, g in throughputs.items():
        dd = res / "depth" / did / f"d{d}"
        dd.mkdir(parents=True)
        (dd / "training_summary.json").write_text("{}")
        (dd / "point.json").write_text(json.dumps({"depth": d, "tau": 1.5, "round_seconds": 0.1, "draft_seconds": 0.04,
                                                   "verify_seconds": 0.06, "throughput": g, "train_seconds": 1.0}))
    return dest, files, did


@pytest.mark.parametrize("throughputs, next_candidate", [({1: 10.0, 2: 9.0}, None),   # G fell at d = 2: stop
                                                         ({1: 10.0, 2: 11.0}, "3"),   # G rose: train d = 3
                                                         ({}, "1")])                  # nothing yet: d = 1 first
def test_online_search_asks_for_candidate_d_plus_1_only_while_throughput_rose(tmp_path, throughputs, next_candidate):
    """Planning with online features: each candidate is its own job (a checkpoint), requested lazily; no feature
    cache of the response set is scheduled."""
    import re

    from tests.workflow import jobs_of, snakemake

    dest, files, did = _online_project(tmp_path, throughputs)
    r = snakemake("-n", "--cores", "1", f"results/depth/{did}/search.json", "--configfile", *files, cwd=dest)
    jobs = jobs_of(r.stdout)
    assert "target_features" not in jobs
    asked = re.findall(r"training and measuring candidate d = (\d+)", r.stdout)
    if next_candidate is None:
        assert jobs == {"depth_search": 1} and not asked
        assert f"--points results/depth/{did}/d1/point.json results/depth/{did}/d2/point.json " in r.stdout
    else:
        assert asked == [next_candidate] and jobs["depth_candidate"] == 1


def test_search_result_checks_the_points_are_the_lazy_prefix():
    from dscout.experiments.depth_search import DepthPoint, search_result

    stage = {"candidates": [1, 2, 3, 4], "block_size": 4, "recipe": "dscout", "layer_ids": [1, 2]}
    sweeps = {"latency_sweep": {d: {} for d in (1, 2, 3, 4)}, "latency_fit": {}, "taps_sweep": {},
              "taps_sweep_depth": 1}

    def pt(d, g):
        return DepthPoint(depth=d, tau=1.0, round_seconds=0.1, draft_seconds=0.0, verify_seconds=0.1, throughput=g)

    res = search_result(stage, sweeps, [pt(1, 5.0), pt(2, 6.0), pt(3, 5.5)])
    assert res["peak_depth"] == 2 and res["trained"] == 3 and res["exhaustive"] == 4
    with pytest.raises(ValueError, match="not the lazy search's order"):  # d = 2 missing
        search_result(stage, sweeps, [pt(1, 5.0), pt(3, 5.5)])
    with pytest.raises(ValueError, match="not the lazy search's order"):  # d = 3 trained after G fell at d = 2
        search_result(stage, sweeps, [pt(1, 5.0), pt(2, 4.0), pt(3, 5.5)])


def test_point_files_name_the_bad_field(tmp_path):
    import json

    from dscout.experiments.depth_search import read_point

    p = tmp_path / "point.json"
    p.write_text(json.dumps({"depth": 2, "tau": 1.2, "round_seconds": 0.1, "draft_seconds": 0.04,
                             "verify_seconds": 0.06, "throughput": "fast", "train_seconds": 1.0}))
    with pytest.raises(ValueError, match=r"point.json: field 'throughput' is missing or not a number"):
        read_point(p)


def test_candidate_stage_trains_what_the_single_job_search_trained():
    """The candidate job's stage (dscout train) gives the TrainConfig the cache-mode search builds in-process."""
    from dscout import config as dcfg
    from dscout.experiments.depth_search import candidate_stage
    from dscout.training.trainer import TrainConfig
    from tests.workflow import ROOT

    cfg = dcfg.load_config(ROOT / "config.yaml")
    stage = dcfg.depth_search_stage(cfg, cfg["target"]["num_layers"])
    opts = dict(stage["options"])
    init = bool(opts.pop("init_from_target", False))
    before = TrainConfig.from_stage({"recipe": stage["recipe"], "num_layers": 3, "layer_ids": stage["layer_ids"],
                                     "mask_token_id": stage["mask_token_id"], "training": stage["training"],
                                     "init_from_target": init, "options": opts},
                                    "float32", max_steps=stage["max_steps"], epochs=1.0)
    assert TrainConfig.from_stage(candidate_stage(stage, 3), "float32") == before
    with pytest.raises(ValueError, match="depth 9 is not a candidate"):
        candidate_stage(stage, 9)


@pytest.mark.slow
def test_smoke_depth_search_on_online_features_end_to_end(tmp_path):
    """The online path run for real (smoke target, d in {1, 2}): each candidate trains in its own job through
    `dscout train` and measures itself (`dscout depth-point`); the search job assembles search.json from the points
    with the same content as the single-job search (tests/test_pipeline.py); no feature cache is written."""
    import json
    import re

    import yaml

    from tests.workflow import copy_project, import_guard_env, jobs_of, snakemake

    (tmp_path / "project").mkdir()
    work = copy_project(tmp_path / "project")
    # a checkpoint at step 2 of 3: the trainer times its save (training_summary.json)
    (work / "online.yaml").write_text(yaml.safe_dump({"features": {"mode": "online"}, "training": {"checkpoint_every": 2},
                                                      "depth_search": {"candidates": [1, 2]}}))
    files = ["presets/smoke.yaml", "presets/smoke_artifacts.yaml", "online.yaml"]
    r = snakemake("results/figures/fig5.png", "--cores", "2", "--configfile", *files, cwd=work, timeout=900,
                  env=import_guard_env(work, files))
    out = r.stdout + r.stderr  # (the job table at the start lists d = 1 only: the checkpoint adds d = 2 later)
    assert len(re.findall(r"Finished jobid: \d+ \(Rule: depth_candidate\)", out)) == 2
    assert "target_features" not in out and "depth_candidate" in jobs_of(out)
    assert not (work / "results" / "features").exists()
    search_path = next((work / "results" / "depth").glob("*/search.json"))
    search = json.loads(search_path.read_text())
    assert set(search) == {"peak_depth", "trained", "exhaustive", "points", "latency_sweep", "latency_fit",
                           "block_size", "taps_sweep", "taps_sweep_depth", "recipe", "layer_ids"}
    assert search["exhaustive"] == 2 and search["trained"] == 2 and search["peak_depth"] in (1, 2)
    assert set(search["taps_sweep"]) == {"2", "3"} and search["recipe"] == "dscout" and search["block_size"] == 4
    for p in search["points"]:  # each point is its candidate job's measurement, trained by that job
        d = p["depth"]
        assert p == json.loads((search_path.parent / f"d{d}" / "point.json").read_text())
        summary = json.loads((search_path.parent / f"d{d}" / "training_summary.json").read_text())
        assert summary["train_config"]["num_layers"] == d and summary["steps"] == 3
        assert p["tau"] >= 1 and p["throughput"] > 0 and p["train_seconds"] > 0
        assert len(summary["checkpoint_save_seconds"]) == 1 and summary["checkpoint_save_seconds"][0] > 0
    assert (work / "results" / "figures" / "fig5.png").stat().st_size > 0


@pytest.mark.filterwarnings("ignore:the mask token id")  # a 64-token toy vocabulary has no unused id
def test_cache_mode_search_trains_lazily_resumes_and_agrees_with_the_point_files(tmp_path):
    """The CPU default's single-job search (features.mode: cache) on a tiny target: candidates train from the
    feature cache, a second call reuses them (same τ), and the online path's assembly of the same points gives the
    same peak and count."""
    import json

    import torch

    from dscout.experiments.depth_search import DepthPoint, run_depth_search, search_result
    from dscout.training.features import build_feature_cache
    from tests.conftest import greedy_sequences, tiny_target
    from tests.workflow import ROOT

    t = tiny_target(dtype=torch.float32, seed=5, init=0.3)
    seqs = greedy_sequences(t, n=8, new_tokens=24)
    build_feature_cache(t, seqs, [1, 2], tmp_path / "features", shard_size=8, batch_size=4)
    training = {"num_anchors": 4, "micro_batch_size": 2, "lr": 3e-3, "warmup_ratio": 0.0, "weight_decay": 0.0,
                "max_steps": 2, "epochs": 6, "seed": 1, "checkpoint_every": 0,
                "deepspeed_config": str(ROOT / "configs" / "deepspeed" / "cpu.json")}
    stage = {"recipe": "dscout", "candidates": [2, 1], "layer_ids": [1, 2], "mask_token_id": 63, "block_size": 4,
             "max_new_tokens": 8, "max_steps": 2, "training": training, "options": {}}
    prompts = [s["input_ids"][:5] for s in seqs[:2]]
    first = run_depth_search(t, str(tmp_path / "features"), stage, prompts, [0], tmp_path / "search")
    assert json.loads((tmp_path / "search" / "search.json").read_text()) == json.loads(json.dumps(first))
    assert first["exhaustive"] == 2 and first["trained"] == len(first["points"]) >= 1
    assert [p["depth"] for p in first["points"]] == [1, 2][:first["trained"]]
    summary = json.loads((tmp_path / "search" / "d1" / "training_summary.json").read_text())
    assert summary["steps"] == 2 and summary["train_config"]["epochs"] == 1.0  # steps bound a candidate
    again = run_depth_search(t, str(tmp_path / "features"), stage, prompts, [0], tmp_path / "search")
    assert [p["tau"] for p in again["points"]][:1] == [p["tau"] for p in first["points"]][:1]  # d = 1 reused
    assert again["points"][0]["train_seconds"] < first["points"][0]["train_seconds"]
    points = [DepthPoint(**p) for p in first["points"]]
    online = search_result(stage, {k: first[k] for k in ("latency_sweep", "latency_fit", "taps_sweep",
                                                          "taps_sweep_depth")}, points)
    assert online == first
