# Benchmarks: one job per (benchmark, temperature, repeat) runs AR and every method side by side on the same prompts,
# so every speedup compares timings taken in one process under the same machine conditions (Table 3 pairs AR and a
# method inside a repeat, never across jobs); one JSONL file per (repeat, method). A job killed mid-repeat loses
# that repeat only: the finished repeats are other jobs' outputs, which a rerun leaves untouched. Each job gets its
# benchmark's slice of the stage (its prompt count and token budget), so changing one benchmark's reruns its jobs only.


rule benchmark:
    wildcard_constraints:
        temp="0",
        repeat=r"\d+",
    message:
        "Benchmark {wildcards.benchmark}, T={wildcards.temp}, repeat {wildcards.repeat} of {params.repeats}"
    input:
        unpack(drafter_inputs),
        target=f"{TARGET_DIR}/target.json",
    output:
        expand("results/bench/{{bid}}/{{benchmark}}/t{{temp}}/r{{repeat}}/{method}.jsonl", method=METHOD_KEYS)
        + expand(
            "results/bench/{{bid}}/{{benchmark}}/t{{temp}}/r{{repeat}}/latency-{method}.json", method=ONLINE_METHOD_KEYS
        ),
    params:
        cli=CLI,
        stage=lambda w: stage_json(dcfg.benchmark_slice(ENGINE_BENCH_STAGE, w.benchmark)),
        drafters=drafter_args,
        out_dir=bench_out_dir,
        repeats=len(REPEATS),
        prefill_gb=config["benchmarks"]["prefill_store_gb"],
        code=code("bench"),
        data_root=DATA_ROOT,
    threads: JOB_THREADS
    resources:
        gpu=min(GPUS, 1),
    log:
        "results/logs/benchmark/{bid}-{benchmark}-t{temp}-r{repeat}.log",
    benchmark:
        "results/timings/benchmark/{bid}-{benchmark}-t{temp}-r{repeat}.tsv"
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} bench --stage {params.stage:q} --target $(dirname {input.target}) "
        "--benchmark {wildcards.benchmark} --temperature {wildcards.temp} --repeat {wildcards.repeat} "
        "--repeats {params.repeats} --prefill-store-gb {params.prefill_gb} "
        "{params.drafters} --out-dir {params.out_dir} --data-root {params.data_root:q} "
        "--threads {threads} > {log} 2>&1"


# temperatures above 0: the same job over AR and `benchmarks.sampled_methods`
use rule benchmark as benchmark_sampled with:
    wildcard_constraints:
        temp=r"[1-9][0-9.]*|0\.[0-9]*[1-9][0-9]*",
        repeat=r"\d+",
    output:
        expand("results/bench/{{bid}}/{{benchmark}}/t{{temp}}/r{{repeat}}/{method}.jsonl", method=SAMPLED_METHOD_KEYS)
        + expand(
            "results/bench/{{bid}}/{{benchmark}}/t{{temp}}/r{{repeat}}/latency-{method}.json",
            method=SAMPLED_ONLINE_METHOD_KEYS,
        ),
    params:
        stage=lambda w: stage_json(dcfg.benchmark_slice(ENGINE_SAMPLED_BENCH_STAGE, w.benchmark)),


# Table 3's rows on a serving runtime (methods[].backend: vllm / sglang): one job per (temperature, repeat) over every
# benchmark, one server per method (AR of that runtime included) on loopback, one request at a time; each row is
# paired with its runtime's AR. Resumable per method: a finished method's records are kept when a later server fails.
rule benchmark_vllm:
    wildcard_constraints:
        backend="vllm",
        repeat=r"\d+",
    message:
        "Table 3 on {wildcards.backend}: AR and its rows, T={wildcards.temp}, repeat {wildcards.repeat}"
    input:
        unpack(server_drafter_inputs),
        target=f"{TARGET_DIR}/target.json",
    output:
        "results/bench_server/{bid}/{backend}/t{temp}/r{repeat}.jsonl",
    params:
        cli=CLI,
        stage=lambda w: stage_json(server_bench_stage(w.backend, w.temp)),
        drafters=server_drafter_args,
        env=config["serving"]["vllm"]["env"],
        python=f"--vllm-python {config['serving']['vllm']['python']}" if config["serving"]["vllm"]["python"] else "",
        code=code("bench"),
        data_root=DATA_ROOT,
    threads: JOB_THREADS
    resources:
        **cluster_resources("benchmark_vllm"),
    log:
        "results/logs/benchmark_{backend}/{bid}-t{temp}-r{repeat}.log",
    benchmark:
        "results/timings/benchmark_{backend}/{bid}-t{temp}-r{repeat}.tsv"
    conda:
        "../envs/vllm.yaml"
    shell:
        "python {params.cli} bench-server --stage {params.stage:q} --target $(dirname {input.target}) "
        "{params.drafters} --temperature {wildcards.temp} --repeat {wildcards.repeat} --vllm-env {params.env:q} "
        "{params.python} --out {output} --data-root {params.data_root:q} --threads {threads} > {log} 2>&1"


use rule benchmark_vllm as benchmark_sglang with:
    wildcard_constraints:
        backend="sglang",
        repeat=r"\d+",
    params:
        cli=CLI,
        stage=lambda w: stage_json(server_bench_stage(w.backend, w.temp)),
        drafters=server_drafter_args,
        env="",
        python="",
        code=code("bench"),
        data_root=DATA_ROOT,
    resources:
        **cluster_resources("benchmark_sglang"),
    conda:
        "../envs/serve.yaml"


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
