# Benchmarks: one job per (benchmark, temperature) runs AR and every method side by side on the same prompts,
# repeat after repeat, so speedups compare timings taken under the same machine conditions; one JSONL file per
# (repeat, method). One process for all repeats saves the per-job start (imports, model loads) 4 times over.


rule benchmark:
    wildcard_constraints:
        temp="0",
    message:
        "Benchmark {wildcards.benchmark}, T={wildcards.temp}, {params.repeats} repeats"
    input:
        unpack(drafter_inputs),
        target=f"{TARGET_DIR}/target.json",
    output:
        expand(
            "results/bench/{{bid}}/{{benchmark}}/t{{temp}}/r{repeat}/{method}.jsonl",
            repeat=REPEATS,
            method=METHOD_KEYS,
        )
        + expand("results/bench/{{bid}}/{{benchmark}}/t{{temp}}/latency-{method}.json", method=ONLINE_METHOD_KEYS),
    params:
        cli=CLI,
        stage=stage_json(BENCH_STAGE),
        drafters=drafter_args,
        out_dir=bench_out_dir,
        repeats=len(REPEATS),
        code=code("bench"),
        data_root=DATA_ROOT,
    threads: JOB_THREADS
    resources:
        gpu=min(GPUS, 1),
    log:
        "results/logs/benchmark/{bid}-{benchmark}-t{temp}.log",
    benchmark:
        "results/timings/benchmark/{bid}-{benchmark}-t{temp}.tsv"
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} bench --stage {params.stage:q} --target $(dirname {input.target}) "
        "--benchmark {wildcards.benchmark} --temperature {wildcards.temp} --repeats {params.repeats} "
        "{params.drafters} --out-dir {params.out_dir} --data-root {params.data_root:q} "
        "--threads {threads} > {log} 2>&1"


# temperatures above 0: the same job over AR and `benchmarks.sampled_methods`
use rule benchmark as benchmark_sampled with:
    wildcard_constraints:
        temp=r"[1-9][0-9.]*|0\.[0-9]*[1-9][0-9]*",
    output:
        expand(
            "results/bench/{{bid}}/{{benchmark}}/t{{temp}}/r{repeat}/{method}.jsonl",
            repeat=REPEATS,
            method=SAMPLED_METHOD_KEYS,
        )
        + expand(
            "results/bench/{{bid}}/{{benchmark}}/t{{temp}}/latency-{method}.json", method=SAMPLED_ONLINE_METHOD_KEYS
        ),
    params:
        stage=stage_json(SAMPLED_BENCH_STAGE),


# The target's task accuracy on a larger sample (greedy AR, batched, lm-eval metrics): every lossless method's
# accuracy at temperature 0. One job per benchmark; resumable (answers are kept as they are generated).
rule accuracy:
    message:
        "Task accuracy of the target on {wildcards.benchmark} ({params.n} prompts, greedy AR)"
    input:
        target=f"{TARGET_DIR}/target.json",
    output:
        "results/accuracy/{aid}/{benchmark}.jsonl",
    params:
        cli=CLI,
        stage=stage_json(dcfg.accuracy_stage(config)),
        n=config["accuracy"]["num_prompts"],
        code=code("accuracy"),
        data_root=DATA_ROOT,
    # untimed, like a training job: on a small CPU it runs beside the trainings instead of alone with all cores
    threads: TRAIN_THREADS
    resources:
        gpu=min(GPUS, 1),
    log:
        "results/logs/accuracy/{aid}-{benchmark}.log",
    benchmark:
        "results/timings/accuracy/{aid}-{benchmark}.tsv"
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} accuracy --stage {params.stage:q} --target $(dirname {input.target}) "
        "--benchmark {wildcards.benchmark} --out {output} --data-root {params.data_root:q} "
        "--threads {threads} > {log} 2>&1"
