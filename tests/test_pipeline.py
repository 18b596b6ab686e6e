"""The Snakemake workflow: config validation, stage hashing, the paper preset's dry run, and the smoke DAG end to
end in a temporary directory (records -> Table 3 and Figure 2, nothing rescheduled on a second run)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dscout import config as dcfg

from tests.workflow import DATA, PAPER_DATA_ENV, ROOT, SNAPSHOTS, dag_outputs, import_guard_env, jobs_of as _jobs, snakemake


def load(*presets):
    return dcfg.load_config(ROOT / "config.yaml", *[ROOT / "presets" / p for p in presets])


# ------------------------------------------------------------------------------------------- config
def test_default_and_presets_validate():
    for presets in ([], ["smoke.yaml"], ["paper.yaml"]):
        cfg = load(*presets)
        assert cfg["repeats"] >= 1 and cfg["methods"]


@pytest.mark.parametrize("patch, key", [
    ({"training": {"lr": "fast"}}, "training.lr"),
    ({"benchmarks": {"nmae": 3}}, "benchmarks"),
    ({"target": {"dtype": "int3"}}, "target.dtype"),
    ({"methods": [{"name": "x", "kind": "dscout", "drafter": "nope", "block_size": 8}]}, "methods[0].drafter"),
])
def test_bad_config_names_the_key(patch, key):
    with pytest.raises(ValueError, match=key.replace("[", r"\[").replace("]", r"\]")):
        dcfg.validate_config(dcfg.deep_merge(yaml.safe_load((ROOT / "config.yaml").read_text()), patch))


def test_study_and_depth_search_drafters_get_the_main_drafters_levers():
    """The efficiency levers apply to every block-diffusion drafter alike: recipe comparisons stay fair."""
    cfg = load()
    main = dcfg.drafter_variant(cfg, "dscout")
    for name, variant in dcfg.study_drafters(cfg).items():
        assert variant["options"] == main["options"], name
        assert variant.get("init_from_target") == main["init_from_target"] is True
    stage = dcfg.depth_search_stage(cfg, cfg["target"]["num_layers"])
    assert stage["options"] == {**main["options"], "init_from_target": True}
    plain = dcfg.deep_merge(cfg, {"study": {"options": None}})
    plain["study"].pop("options")
    assert all("options" not in v and "init_from_target" not in v for v in dcfg.study_drafters(plain).values())


def test_snakemake_rejects_unknown_key_before_any_job(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("training: {learning_rate: 0.1}\n")
    r = snakemake("-n", "--configfile", str(bad), check=False)
    assert r.returncode != 0
    assert "learning_rate" in r.stdout + r.stderr


def test_stage_ids_depend_on_exactly_their_slice():
    base = load()
    L = base["target"]["num_layers"]
    ids = lambda c: (dcfg.responses_id(c), dcfg.drafter_id(c, "dscout", L), dcfg.bench_id(c, L))
    r0, d0, b0 = ids(base)
    bench_change = dcfg.deep_merge(base, {"benchmarks": {"seed": 99}})
    assert ids(bench_change)[:2] == (r0, d0) and ids(bench_change)[2] != b0  # no retraining
    recipe_change = dcfg.deep_merge(base, {"drafters": {"dscout": {"recipe": "dflash"}}})
    r1, d1, _ = ids(recipe_change)
    assert r1 == r0 and d1 != d0  # no regeneration, but a new drafter
    resp_change = dcfg.deep_merge(base, {"responses": {"max_new_tokens": 7}})
    assert ids(resp_change)[0] != r0 and ids(resp_change)[1] != d0
    assert dcfg.drafter_id(base, "dflash", L).startswith("dflash-5t2d-")


def test_sampled_token_budget_changes_only_the_sampled_runs():
    base = load()
    L = base["target"]["num_layers"]
    shorter = dcfg.deep_merge(base, {"benchmarks": {"sampled_max_new_tokens": 7}})
    assert dcfg.bench_id(shorter, L) == dcfg.bench_id(base, L)  # the temperature-0 records stay
    assert dcfg.bench_stage(shorter, L)["benchmarks"]["max_new_tokens"] == base["benchmarks"]["max_new_tokens"]
    assert dcfg.sampled_bench_stage(shorter, L)["benchmarks"]["max_new_tokens"] == 7
    unset = dcfg.deep_merge(base, {"benchmarks": {"sampled_max_new_tokens": None}})
    assert dcfg.sampled_bench_stage(unset, L)["benchmarks"]["max_new_tokens"] == base["benchmarks"]["max_new_tokens"]


def test_one_benchmarks_prompt_count_or_budget_changes_that_benchmarks_slice_only():
    """Exact slices (issue 47): the folder id leaves the per-benchmark counts out, each job gets its own."""
    base = load()
    L = base["target"]["num_layers"]
    more = dcfg.deep_merge(base, {"benchmarks": {"num_prompts": {"gsm8k": 2}, "max_new_tokens": {"gsm8k": 7}}})
    assert dcfg.bench_id(more, L) == dcfg.bench_id(base, L)
    for stage_of in (dcfg.bench_stage, dcfg.sampled_bench_stage):
        old, new = stage_of(base, L), stage_of(more, L)
        assert dcfg.benchmark_slice(new, "gsm8k") != dcfg.benchmark_slice(old, "gsm8k")
        for name in base["benchmarks"]["names"]:
            if name != "gsm8k":
                assert dcfg.benchmark_slice(new, name) == dcfg.benchmark_slice(old, name), name
    cut = dcfg.benchmark_slice(dcfg.bench_stage(more, L), "gsm8k")["benchmarks"]
    assert cut["num_prompts"] == 2 and cut["max_new_tokens"] == 7
    # a benchmark the mappings leave out gets the schema's defaults, as the prompts loader does
    partial = dcfg.deep_merge(base, {"benchmarks": {"num_prompts": {"gsm8k": 3}}})
    partial["benchmarks"]["num_prompts"] = {"gsm8k": 3}
    assert dcfg.benchmark_slice(dcfg.bench_stage(partial, L), "mbpp")["benchmarks"]["num_prompts"] == 2


def test_code_digest_tracks_stage_sources():
    assert dcfg.code_digest("train") != dcfg.code_digest("bench")
    assert len(dcfg.code_digest("analysis")) == 12


# ------------------------------------------------------------------------------------------- DAG
def test_lint_is_clean():
    r = snakemake("--lint", check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_paper_preset_dry_runs():
    r = snakemake("-n", "--configfile", "presets/paper.yaml", env=PAPER_DATA_ENV)
    jobs = _jobs(r.stdout)
    # DFlash + DScout trained, EAGLE-3 and PARD-2 imported from their public checkpoints by the same rule,
    # plus one drafter per recipe of the study (Tables 1, 2; Figures 4, 7)
    assert jobs["train_drafter"] == 4 + 8  # six benchmarks x T in {0, 1} x 5 repeats (one job per repeat):
    assert jobs["benchmark"] == 6 * 5 and jobs["benchmark_sampled"] == 6 * 5
    assert jobs["generate_responses"] == 1 and jobs["table3"] == 1
    for table_or_figure in ("fig2", "fig_online", "fig3", "fig5", "table4", "study_table1", "study_table2", "study_fig4",
                            "study_fig7"):  # every table and figure of the paper
        assert jobs[table_or_figure] == 1, table_or_figure
    assert jobs["serving_benchmark"] == 4 * 5 and jobs["study_benchmark"] == 6 and jobs["depth_search"] == 1


def test_paper_preset_dry_runs_with_slurm_profile():
    """The cluster command line, minus conda (not installable here; env-modules is a no-op stand-in)."""
    r = snakemake("-n", "--configfile", "presets/paper.yaml", "--profile", "profiles/slurm", "--sdm", "env-modules",
                  env=PAPER_DATA_ENV)
    jobs = _jobs(r.stdout)
    assert jobs["train_drafter"] == 12 and jobs["benchmark"] + jobs["benchmark_sampled"] == 12 * 5
    assert jobs["table4"] == 1 and jobs["all"] == 1


def test_imported_drafters_need_no_responses():
    """A pretrained baseline's job depends on the target only: a responses change must not touch it."""
    import copy

    base = dcfg.validate_config(yaml.safe_load((ROOT / "presets" / "paper.yaml").read_text()))
    changed = copy.deepcopy(base)
    changed["responses"]["max_new_tokens"] = 123
    assert dcfg.drafter_id(changed, "eagle3", 36) == dcfg.drafter_id(base, "eagle3", 36)
    assert "pretrained" in dcfg.drafter_id(base, "pard2", 36)
    assert dcfg.drafter_id(changed, "dscout", 36) != dcfg.drafter_id(base, "dscout", 36)


@pytest.fixture(scope="module")
def smoke_artifacts_run(smoke_run):
    """The remaining artifacts (Tables 1, 2, 4; Figures 3, 4, 5, 7; the findings stage) on top of the smoke run."""
    work, _ = smoke_run
    r = snakemake("--cores", "2", "--configfile", "presets/smoke.yaml", "presets/smoke_artifacts.yaml", cwd=work,
                  timeout=900, env=import_guard_env(work, ["presets/smoke.yaml", "presets/smoke_artifacts.yaml"]))
    jobs = _jobs(r.stdout + r.stderr)
    return work, jobs


@pytest.mark.slow
def test_smoke_artifacts_reuse_the_smoke_run(smoke_artifacts_run):
    _, jobs = smoke_artifacts_run
    # nothing of the main DAG reruns: only the study and findings drafters, their jobs, the temperature-1
    # benchmarks (AR + the sampled methods) and the artifacts that read them
    assert not {"generate_responses", "target_features", "benchmark"} & set(jobs)
    assert jobs.get("train_drafter") == 8 + 9 and jobs.get("benchmark_sampled") == 6 * 2 and jobs.get("table3") == 1


@pytest.mark.slow
def test_temperature_one_rows_in_table3(smoke_artifacts_run):
    work, _ = smoke_artifacts_run
    import csv

    rows = list(csv.DictReader(open(work / "results/tables/table3.csv")))
    sampled = {r["method_name"] for r in rows if float(r["temperature"]) == 1.0}
    greedy = {r["method_name"] for r in rows if float(r["temperature"]) == 0.0}
    assert sampled == {"AR", "DFlash(16)", "DScout(16)"} and {"EAGLE-3(16)", "PARD-2(4)"} <= greedy
    assert "## Temperature 1" in (work / "results/tables/table3.md").read_text()
    records = [json.loads(l) for f in (work / "results/bench").rglob("*.jsonl") for l in f.read_text().splitlines()]
    longest = {t: max(r["new_tokens"] for r in records if r["temperature"] == t) for t in (0.0, 1.0)}
    assert longest[1.0] <= 6 < longest[0.0] <= 12  # benchmarks.sampled_max_new_tokens vs max_new_tokens


@pytest.mark.slow
def test_smoke_dag_produces_table3_from_records(smoke_run):
    work, _ = smoke_run
    table = (work / "results/tables/table3.md").read_text()
    assert "DScout(32)" in table and "DFlash(16)" in table and "EAGLE-3" in table and "PARD-2" in table
    assert "Paper (reported" in table
    assert (work / "results/figures/fig2.png").stat().st_size > 0
    records = [json.loads(l) for f in (work / "results/bench").rglob("*.jsonl") for l in f.read_text().splitlines()]
    assert {r["benchmark"] for r in records} == {"gsm8k", "math500", "humaneval", "mbpp", "livecodebench", "mt_bench"}
    required = {"benchmark", "prompt_id", "turn", "method", "drafter", "block_size", "temperature", "repeat",
                "concurrency", "new_tokens", "decode_seconds", "accept_lengths", "output_ids"}
    assert all(required <= set(r) for r in records)
    assert {r["turn"] for r in records if r["benchmark"] == "mt_bench"} == {0, 1}
    greedy = [r for r in records if r["method"] != "ar" and r["temperature"] == 0]
    assert greedy and all(r["matches_ar"] or r["near_tie"] for r in greedy)
    for r in greedy:
        bound = r["max_block_size"] if r["block_size"] == "online" else r["block_size"]
        assert all(1 <= n <= bound for n in r["accept_lengths"])
    drafters = list((work / "results/drafters").glob("*/training_summary.json"))
    assert {json.loads(d.read_text())["kind"] for d in drafters} == {"dflash", "eagle3", "pard2"}
    assert all((d.parent / "config.resolved.json").exists() for d in drafters)
    for d in (work / "results/drafters").glob("d*-2t1d-*"):  # DFlash / DScout: the DFlash checkpoint layout ...
        cfg = json.loads((d / "config.json").read_text())
        assert "target_layer_ids" in cfg["dflash_config"]
        # ... except for a reduced draft vocabulary (the CPU default), which no DFlash runtime drafts with as we do
        assert cfg["architectures"] == ["DScoutDrafter"] and "draft_vocab_size=8192" in cfg["not_dflash_format"][0]
    assert {r["method"] for r in records} == {"ar", "dflash", "dscout", "eagle3", "pard2"}
    csv = (work / "results/tables/table3.csv").read_text().splitlines()
    assert csv[0].startswith("benchmark,method_name") and len(csv) > 4


@pytest.mark.slow
def test_smoke_dag_scores_accuracy_with_lm_eval_metrics(smoke_run):
    """Accuracy stands in Table 3 per method (equal to AR's at T=0), plus the target's accuracy job's table."""
    work, _ = smoke_run
    table = (work / "results/tables/table3.md").read_text()
    assert "Task accuracy on the timed prompts" in table
    assert "Every method's accuracy equals AR's (greedy outputs are identical): **yes**." in table
    assert "## Task accuracy of the target (greedy AR, larger sample)" in table
    acc = [json.loads(l) for f in (work / "results/accuracy").rglob("*.jsonl") if "answers" not in f.name
           for l in f.read_text().splitlines()]
    assert {r["benchmark"] for r in acc} == {"gsm8k", "humaneval"} and len(acc) == 6
    assert all(isinstance(r["correct"], bool) for r in acc)  # humaneval scored: the code ran (opt-in)
    records = [json.loads(l) for f in (work / "results/bench").rglob("*.jsonl") for l in f.read_text().splitlines()]
    scored = {r["benchmark"] for r in records if r["correct"] is not None}
    assert scored == {"gsm8k", "math500", "humaneval", "mbpp"}  # LiveCodeBench, MT-Bench: no scorer


@pytest.mark.slow
@pytest.mark.parametrize("block_size", ["4", "online"])
def test_lm_eval_decodes_a_task_through_the_speculative_engine(block_size, smoke_run, tmp_path):
    """`dscout-lm-eval --model dscout`: lm-eval's gsm8k (read from the mirror) decoded by our engine, with τ and
    the paired speedup over AR beside the task's metric; greedy outputs equal AR's."""
    work, _ = smoke_run
    target = next((work / "results/target").glob("*/target.json")).parent
    drafter = next(d for d in (work / "results/drafters").glob("dscout-*") if (d / "training_summary.json").exists())
    data = str(DATA)
    r = subprocess.run([sys.executable, "-m", "dscout.lmeval_model", "--mirror", data, "--model", "dscout",
                        "--model_args", f"target={target},drafter={drafter},block_size={block_size},threads=1",
                        "--tasks", "gsm8k_mirror", "--limit", "2", "--num_fewshot", "0",
                        "--gen_kwargs", "max_gen_toks=8", "--output_path", str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "exact_match" in r.stdout and "dscout speed" in r.stdout
    speed = json.loads((tmp_path / "out" / "dscout_speed.json").read_text())["gsm8k_mirror"]
    assert speed["method"] == f"DScout({block_size})" and speed["requests"] == 2 and speed["greedy_compared"] == 2
    assert speed["greedy_mismatches"] == 0 and speed["tau"] >= 1 and speed["speedup"] > 0
    results = next((tmp_path / "out").rglob("results_*.json"))
    assert "exact_match,flexible-extract" in json.loads(results.read_text())["results"]["gsm8k_mirror"]


@pytest.mark.slow
def test_smoke_dag_renders_the_recipe_study(smoke_artifacts_run):
    """Tables 1, 2 and Figures 4, 7 from the study's own records: one drafter per recipe, lossless decoding."""
    work, _ = smoke_artifacts_run
    for name in ("table1", "table2"):
        assert "Measured on tiny-random" in (work / f"results/tables/{name}.md").read_text()
        assert (work / f"results/tables/{name}.csv").exists() and (work / f"results/tables/{name}.tex").exists()
    for name in ("fig4", "fig7"):
        assert (work / f"results/figures/{name}.png").stat().st_size > 0
    records = [json.loads(l) for f in (work / "results/study").rglob("*.jsonl") for l in f.read_text().splitlines()]
    drafters = {r["drafter"] for r in records if r["method"] != "ar"}
    assert len(drafters) == len(dcfg.STUDY_PLAN)  # one checkpoint per recipe, reused across block sizes
    assert all(r["matches_ar"] or r["near_tie"] for r in records if r["method"] != "ar")
    rows = list(__import__("csv").reader(open(work / "results/tables/table2.csv")))
    assert rows[1][0] == "fixed 8" and rows[1][2] == "n/a"  # never decoded above its training horizon


@pytest.mark.slow
def test_smoke_dag_runs_the_depth_search(smoke_artifacts_run):
    work, _ = smoke_artifacts_run
    search = json.loads(next((work / "results/depth").glob("*/search.json")).read_text())
    assert search["exhaustive"] == 3 and 1 <= search["trained"] <= 3
    assert search["peak_depth"] in {p["depth"] for p in search["points"]}
    assert all(p["tau"] >= 1 and p["throughput"] > 0 for p in search["points"])
    assert (work / "results/figures/fig5.png").stat().st_size > 0
    assert set(search["taps_sweep"]) == {"2", "3"}  # configured taps vs all usable layers of the 4-layer target
    assert (work / "results/figures/fig3.png").stat().st_size > 0


@pytest.mark.slow
def test_smoke_dag_runs_the_online_block_size_controller(smoke_run):
    """The `block_size: online` row: calibrated latency model saved per job, bs chosen per round in the records,
    its comparison with the fixed rows in Table 3 and its figure."""
    work, _ = smoke_run
    online = [json.loads(l) for f in (work / "results/bench").rglob("dscout-online-*.jsonl")
              for l in f.read_text().splitlines()]
    assert online and all(r["block_size"] == "online" and r["matches_ar"] for r in online)
    for r in online:
        assert len(r["round_block_sizes"]) == len(r["accept_lengths"]) == len(r["round_seconds"])
        assert all(1 <= n <= b <= r["max_block_size"] for n, b in zip(r["accept_lengths"], r["round_block_sizes"]))
    # two online rows (the second with its own controller settings, {explore: 0}): one latency model each per job
    # (6 benchmarks x 2 repeats)
    latency = list((work / "results/bench").rglob("t0/r*/latency-dscout-online-*.json"))
    assert len(latency) == 24 and {s["part"] for s in json.loads(latency[0].read_text())["samples"]} == {
        "draft", "verify"}  # the catch-up (deferred commits) is timed inside draft forwards
    assert sum("-explore0-" in p.name for p in latency) == 12
    assert {r["method_name"] for r in online} == {"DScout(online)", "DScout(online, explore 0)"}
    table = (work / "results/tables/table3.md").read_text()
    assert "DScout(online) against the fixed block sizes" in table and "Within 3% of the oracle" in table
    assert "DScout(online, explore 0) against the fixed block sizes" in table
    assert (work / "results/figures/fig_online.png").stat().st_size > 0
    assert json.loads((work / "results/figures/fig_online.json").read_text())["rounds"] == sum(
        len(r["round_block_sizes"]) for r in online if r["temperature"] == 0)


@pytest.mark.slow
def test_smoke_dag_renders_table4_from_batched_serving(smoke_artifacts_run):
    work, _ = smoke_artifacts_run
    rows = (work / "results/tables/table4.csv").read_text().splitlines()
    assert rows[0].startswith("concurrency") and [r.split(",")[0] for r in rows[1:]] == ["1", "2"]
    records = [json.loads(l) for f in (work / "results/serving").rglob("*.jsonl") for l in f.read_text().splitlines()]
    ar = {(r["concurrency"], r["prompt_id"]): r["output_ids"] for r in records if r["method"] == "ar"}
    assert all(r["output_ids"] == ar[(r["concurrency"], r["prompt_id"])] for r in records)
    assert {r["block_size"] for r in records if r["method_key"] == "dscout-online"} == {"online"}
    assert {r["block_size"] for r in records if r["method_key"] == "dscout-online-explore0"} == {"online"}
    assert "DScout(online)" in (work / "results/tables/table4.md").read_text()
    assert "DScout(online, explore0)" in (work / "results/tables/table4.md").read_text()
    assert "online_vs_best" in rows[0] and "online_explore0_vs_best" in rows[0]
    # one job per (concurrency, repeat): c in {1, 2} x 2 repeats, each calibrating its own controllers
    assert len(list((work / "results/serving").rglob("c*/r*.latency-dscout-online-explore0.json"))) == 4
    assert {(r["concurrency"], r["repeat"]) for r in records} == {(1, 0), (1, 1), (2, 0), (2, 1)}
    # vLLM's rows (one serving_vllm job per repeat, every level): real servers, the same prompts, output = AR above
    vllm = [r for r in records if r["runtime"] == "vllm"]
    assert {(r["method_key"], r["concurrency"], r["repeat"]) for r in vllm} == {
        (k, c, rep) for k in ("vllm-ar", "vllm-dflash-bs4") for c in (1, 2) for rep in (0, 1)}
    assert all(r["accept_lengths_exact"] and r["decode_window_exact"] for r in vllm)
    assert all(r["batch_decode_seconds"] <= r["batch_wall_seconds"] for r in vllm)  # prefill outside the window
    assert "vLLM DFlash(best)" in (work / "results/tables/table4.md").read_text()
    assert "ours_vs_vllm" in rows[0] and all(r.split(",")[rows[0].split(",").index("ours_vs_vllm")] for r in rows[1:])


@pytest.mark.slow
def test_second_run_schedules_nothing_and_changes_rerun_only_their_stage(smoke_run):
    work, first = smoke_run
    r = first.second_run
    assert "Nothing to be done" in r.stdout + r.stderr
    bench_only = work / "bench_only.yaml"
    bench_only.write_text("benchmarks: {max_new_tokens: 9}\n")
    jobs = _jobs(snakemake("-n", "--cores", "2", "--configfile", "presets/smoke.yaml", str(bench_only),
                           cwd=work).stdout)
    assert "train_drafter" not in jobs and "generate_responses" not in jobs and jobs["benchmark"] >= 1
    recipe = work / "recipe.yaml"
    recipe.write_text("drafters: {dscout: {recipe: step3_unmask}}\n")
    jobs = _jobs(snakemake("-n", "--cores", "2", "--configfile", "presets/smoke.yaml", str(recipe),
                           cwd=work).stdout)
    assert jobs.get("train_drafter") == 1 and "generate_responses" not in jobs and "target_features" not in jobs
    taps = work / "taps.yaml"  # a drafter with other taps retrains alone, from a new cache of exactly its taps
    taps.write_text("drafters: {dflash: {num_taps: 3}}\n")
    jobs = _jobs(snakemake("-n", "--cores", "2", "--configfile", "presets/smoke.yaml", str(taps), cwd=work).stdout)
    assert jobs.get("train_drafter") == 1 and jobs.get("target_features") == 1 and "generate_responses" not in jobs


def _benchmarks_scheduled(dry_run_stdout: str) -> list[tuple[str, str, str]]:
    """``(benchmark, temperature, repeat)`` of every benchmark job a (dry) run lists (the rule's message)."""
    import re

    return sorted(re.findall(r"Benchmark (\w+), T=([0-9.]+), repeat (\d+) of \d+", dry_run_stdout))


@pytest.mark.slow
def test_changing_one_benchmarks_prompts_or_budget_schedules_that_benchmarks_jobs_only(smoke_run):
    """Exact slices (issue 47), tried as a new user would on a finished run: GSM8K's num_prompts from 1 to 2
    schedules GSM8K's benchmark jobs (one per repeat) and what reads them, no other benchmark's."""
    work, _ = smoke_run
    names = ["gsm8k", "math500", "humaneval", "mbpp", "livecodebench", "mt_bench"]
    more = work / "gsm8k_two_prompts.yaml"
    more.write_text(yaml.safe_dump({"benchmarks": {"num_prompts": {n: 2 if n == "gsm8k" else 1 for n in names}}}))
    r = snakemake("-n", "--cores", "2", "--configfile", "presets/smoke.yaml", str(more), cwd=work)
    jobs = _jobs(r.stdout)
    assert _benchmarks_scheduled(r.stdout) == [("gsm8k", "0", "0"), ("gsm8k", "0", "1")], r.stdout[-3000:]
    assert jobs["benchmark"] == 2 and set(jobs) <= {"benchmark", "table3", "fig2", "fig_online", "all"}, jobs
    budget = work / "mt_bench_budget.yaml"  # a token budget: the same for max_new_tokens
    budget.write_text(yaml.safe_dump({"benchmarks": {"max_new_tokens": {n: 9 if n == "mt_bench" else 12
                                                                        for n in names}}}))
    r = snakemake("-n", "--cores", "2", "--configfile", "presets/smoke.yaml", str(budget), cwd=work)
    assert _benchmarks_scheduled(r.stdout) == [("mt_bench", "0", "0"), ("mt_bench", "0", "1")], r.stdout[-3000:]
    same = work / "same_as_preset.yaml"  # the preset's own values written per benchmark: no benchmark reruns (the
    # tables' captions print the config as written, so they do)
    same.write_text(yaml.safe_dump({"benchmarks": {"num_prompts": {n: 1 for n in names},
                                                   "max_new_tokens": {n: 12 for n in names}}}))
    r = snakemake("-n", "--cores", "2", "--configfile", "presets/smoke.yaml", str(same), cwd=work)
    assert _benchmarks_scheduled(r.stdout) == [] and "benchmark" not in _jobs(r.stdout), r.stdout[-3000:]


@pytest.mark.slow
def test_a_benchmark_job_killed_mid_repeat_loses_that_repeat_only(smoke_run, tmp_path):
    """Resumable benchmarks (issue 47): the job of GSM8K's repeat 1 is killed while it decodes; the rerun runs that
    job alone, and repeat 0's records (every benchmark's) stay byte-identical and untouched (same mtime)."""
    import shutil
    import signal
    import time

    from tests.workflow import snakemake_env

    work = tmp_path / "work"
    shutil.copytree(smoke_run[0], work, symlinks=True)  # copy2 keeps mtimes: the copy is as up to date as the run
    bench = next((work / "results/bench").glob("*/gsm8k/t0")).parent.parent
    r0 = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in bench.glob("*/t0/r0/*")}
    assert len(r0) > 6 * 5
    killed = bench / "gsm8k/t0/r1/ar.jsonl"
    log = work / f"results/logs/benchmark/{bench.name}-gsm8k-t0-r1.log"
    args = [sys.executable, "-m", "snakemake", "--cores", "1", "--configfile", "presets/smoke.yaml", "--force",
            str(killed.relative_to(work))]
    t0 = time.time()
    # its own process group: the kill takes Snakemake and the job at once, as a node failure or SLURM's time limit
    # does (a SIGTERM to Snakemake alone lets the running job finish)
    proc = subprocess.Popen(args, cwd=work, env=snakemake_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:  # killed once the job decodes its prompts (tqdm's bar names the repeat in the job's log)
        while time.time() - t0 < 300 and proc.poll() is None:
            if log.exists() and log.stat().st_mtime > t0 and "gsm8k r1" in log.read_text():
                break
            time.sleep(0.2)
        if proc.poll() is not None:
            raise AssertionError(f"snakemake ended before the job could be killed:\n{proc.communicate()[0][-3000:]}")
        assert "gsm8k r1" in log.read_text(), "the job was not decoding repeat 1"
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0 and not killed.exists(), out[-3000:]  # the killed repeat's records are gone ...
    snakemake("--unlock", "--configfile", "presets/smoke.yaml", cwd=work)  # the lock a hard kill leaves
    rerun = snakemake("--cores", "1", "--configfile", "presets/smoke.yaml", "--rerun-incomplete", cwd=work)
    assert _benchmarks_scheduled(rerun.stdout + rerun.stderr) == [("gsm8k", "0", "1")], rerun.stdout[-3000:]
    assert killed.exists() and json.loads(killed.read_text().splitlines()[0])["repeat"] == 1  # ... and redone
    for p, (data, mtime) in r0.items():  # ... while repeat 0 was never touched
        assert p.read_bytes() == data and p.stat().st_mtime_ns == mtime, p


@pytest.mark.slow
def test_one_run_brings_everything_up_to_date_when_a_drafter_taps_new_layers(smoke_run, tmp_path):
    """A change of a drafter's taps reruns, in one invocation, its feature cache, the drafter, and what reads it.

    Regression: with one shared cache of the union of all taps (an ``ancient()`` input), a real run rebuilt only
    the cache and a second invocation was needed for the drafter, the benchmarks and the tables.
    """
    import shutil

    work = tmp_path / "work"
    shutil.copytree(smoke_run[0], work, symlinks=True)  # copy2 keeps mtimes: the copy is as up to date as the run
    summaries = {p.parent.name: p.stat().st_mtime_ns for p in (work / "results/drafters").glob("*/training_summary.json")}
    before = (work / "results/tables/table3.md").read_text()
    taps = work / "taps.yaml"  # no cache holds layers {0, 2} so far (the smoke caches: {0, 1}, {0, 3}, {1, 2})
    taps.write_text("drafters: {dflash: {target_layer_ids: [0, 2]}}\n")
    args = ("--cores", "2", "--configfile", "presets/smoke.yaml", str(taps))
    first = snakemake(*args, cwd=work)
    jobs = _jobs(first.stdout + first.stderr)
    assert jobs.get("target_features") == 1 and jobs.get("train_drafter") == 1, jobs
    assert jobs.get("benchmark", 0) >= 1 and jobs.get("table3") == 1, jobs
    again = snakemake("-n", *args, cwd=work)
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]
    changed = [p for p in (work / "results/drafters").glob("*/training_summary.json")
               if summaries.get(p.parent.name) != p.stat().st_mtime_ns]
    assert len(changed) == 1 and changed[0].parent.name.startswith("dflash-"), changed
    resolved = json.loads((changed[0].parent / "config.resolved.json").read_text())
    assert resolved["stage_config"]["layer_ids"] == [0, 2]
    assert list((work / "results/features").glob("*/float16-l0.2/index.json"))
    assert (work / "results/tables/table3.md").read_text() != before


def run_notebook(path: Path, env: dict) -> dict:
    """Execute a notebook's code cells in order in one namespace (as a kernel would); returns the namespace."""
    nb = json.loads(path.read_text())
    ns: dict = {"__name__": "__main__"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] == "code":
                exec(compile("".join(cell["source"]), f"{path.name}[cell {i}]", "exec"), ns)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return ns


def test_analysis_notebook_rebuilds_table3_from_smoke_records(smoke_run):
    work, _ = smoke_run
    ns = run_notebook(ROOT / "notebooks" / "analysis.ipynb", {"DSCOUT_RESULTS": str(work / "results")})
    assert len(ns["records"]) > 0 and "DScout(32)" in ns["table3"].index
    assert set(ns["table3"].columns) >= {"gsm8k", "mt_bench", "average"}
    assert ns["position"].shape[0] == 16 and ns["position"].notna().any().any()


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_dag_jobs_and_ids_equal_the_snapshot(name):
    """Refactors keep the jobs and their ids: the default's and the paper preset's job outputs equal the snapshot
    (tests/snapshots/; after an intended change, `python -m tests.workflow` rewrites it and the change is reviewed)."""
    got = dag_outputs(SNAPSHOTS[name], env=PAPER_DATA_ENV if name == "paper" else None)
    want = (ROOT / "tests" / "snapshots" / f"dag_{name}.tsv").read_text().splitlines()
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    assert not missing and not extra, f"jobs missing: {missing[:10]}\njobs new: {extra[:10]}"


@pytest.mark.slow
def test_teacher_forced_tau_rebuilds_the_runs_prompts(smoke_run, tmp_path):
    """`teacher_forced_on_bench_records` on the smoke run's records: every temperature-0 benchmark, one block per
    AR output position with a next token, τ(bs) in [1, bs] and non-decreasing; a record whose prompt length the
    rebuilt chat does not match is refused with the file, prompt and turn named."""
    import shutil

    from dscout.models.target import load_prepared_target as load_target
    from dscout.experiments.drafter_eval import bench_record_sequences, teacher_forced_on_bench_records
    from dscout.models.export import load_dflash_checkpoint

    work, _ = smoke_run
    data = str(DATA)
    target = load_target(str(next((work / "results/target").glob("*/target.json")).parent))
    drafter = load_dflash_checkpoint(next((work / "results/drafters").glob("dscout-*")), dtype=target.dtype)
    drafter.attach_target(target)
    bench_dir = next((work / "results/bench").iterdir())
    seqs = bench_record_sequences(target, bench_dir, data)
    summary = teacher_forced_on_bench_records(target, drafter, bench_dir, data, (2, 4, 8))
    assert set(summary) == set(seqs) == {p.parent.name for p in bench_dir.glob("*/t0")} and len(summary) == 6
    for bench, s in summary.items():
        assert s["blocks"] == sum(sum(q["loss_mask"]) - 1 for q in seqs[bench]) > 0
        taus = [s["tau"][bs] for bs in (2, 4, 8)]
        assert all(1 <= tau <= bs for tau, bs in zip(taus, (2, 4, 8))) and taus == sorted(taus)
    assert len(seqs["mt_bench"]) == 2 * len(seqs["gsm8k"])  # MT-Bench: two turns per prompt
    copy = tmp_path / "bench"
    shutil.copytree(bench_dir, copy)
    path = copy / "gsm8k" / "t0" / "r0" / "ar.jsonl"
    recs = [json.loads(l) for l in path.read_text().splitlines()]
    recs[0]["prompt_tokens"] += 1
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(ValueError, match=r"ar\.jsonl: prompt .* turn 0 rebuilds to"):
        bench_record_sequences(target, copy, data)


@pytest.mark.slow
def test_findings_stage_end_to_end(smoke_artifacts_run):
    """The findings DAG on the smoke run: held-out never trained on, every drafter read at its plan's bs, the live
    decoding check agreeing with the teacher-forced walk, and verdicts that follow the intervals in the CSV."""
    import csv

    from dscout.analysis.findings import FINDINGS, verdict
    from dscout.training.holdout import holdout_split

    work, jobs = smoke_artifacts_run
    assert jobs.get("findings_eval") == len(dcfg.FINDINGS_PLAN) and jobs.get("findings_bench_outputs") == 1
    assert jobs.get("findings_taps") == 1  # the evaluated sequences' taps: once, read by every evaluation
    [fdir] = (work / "results/findings").iterdir()
    stage = json.loads((fdir / "config.resolved.json").read_text())["stage_config"]
    rows = [json.loads(l) for f in (fdir / "records").glob("*.jsonl") for l in f.read_text().splitlines()]
    held_ids = {r["id"] for r in rows if r["set"] == "heldout"}
    from safetensors import safe_open

    with safe_open(str(fdir / "eval_taps.safetensors"), framework="pt") as f:  # every read sequence, no other
        assert set(f.keys()) == {str(r["id"]) for r in rows if "accept" in r}
    assert len(held_ids) == stage["holdout"] == 3
    for name, (_, bss) in dcfg.FINDINGS_PLAN.items():
        mine = [r for r in rows if r["drafter"] == name]
        assert {r["bs"] for r in mine if r["set"] == "heldout"} == set(bss) == {r["bs"] for r in mine if r["set"] == "bench"}
        checks = [r for r in mine if r["set"] == "decode_check"]
        assert len(checks) == 1 and checks[0]["equal"] and checks[0]["compared"] > 0
        summary = json.loads((work / "results/drafters" / stage["drafters"][name]["id"] / "training_summary.json").read_text())
        log = [json.loads(l) for l in (work / "results/drafters" / stage["drafters"][name]["id"] / "train_log.jsonl").read_text().splitlines()]
        n = summary["num_sequences"] + stage["holdout"]
        _, held = holdout_split(n, stage["holdout"])
        assert not {i for r in log for i in r["sample_ids"]} & set(held)
    table = list(csv.DictReader(open(work / "results/tables/findings.csv")))
    assert [r["finding"] for r in table] == [f for _, f, _, _ in FINDINGS]
    for r in table:
        for p in ("", "bench_"):
            lo, hi = float(r[f"{p}ci_low"]), float(r[f"{p}ci_high"])
            enough = int(r[f"{p}anchors"]) >= stage["min_anchors"] and "no DFlash" not in r["note"]
            assert r[f"{p}verdict"] == verdict(lo, hi, enough)
    for f in ("tables/findings_table1.md", "tables/findings_table2.md", "figures/findings_fig2.png",
              "figures/findings_fig4.png", "figures/findings_fig7.png"):
        assert (work / "results" / f).stat().st_size > 0
