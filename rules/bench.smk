# Benchmarks: one job per (benchmark, temperature, repeat) runs AR and every method side by side on the same
# prompts, so speedups compare timings taken under the same machine conditions; one JSONL file per method.


rule benchmark:
    message:
        "Benchmark {wildcards.benchmark}, T={wildcards.temp}, repeat {wildcards.repeat}"
    input:
        unpack(drafter_inputs),
        target=f"{TARGET_DIR}/target.json",
    output:
        expand(
            "results/bench/{{bid}}/{{benchmark}}/t{{temp}}/r{{repeat}}/{method}.jsonl",
            method=METHOD_KEYS,
        ),
    params:
        cli=CLI,
        stage=stage_json(BENCH_STAGE),
        drafters=drafter_args,
        out_dir=bench_out_dir,
        code=code("bench"),
        data_root=DATA_ROOT,
    threads: workflow.cores
    resources:
        gpu=min(GPUS, 1),
    log:
        "results/logs/benchmark/{bid}-{benchmark}-t{temp}-r{repeat}.log",
    benchmark:
        "results/benchmarks/benchmark/{bid}-{benchmark}-t{temp}-r{repeat}.tsv"
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} bench --stage {params.stage:q} --target $(dirname {input.target}) "
        "--benchmark {wildcards.benchmark} --temperature {wildcards.temp} --repeat {wildcards.repeat} "
        "{params.drafters} --out-dir {params.out_dir} --data-root {params.data_root:q} "
        "--threads {threads} > {log} 2>&1"
