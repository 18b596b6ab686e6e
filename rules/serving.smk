# Table 4 (config `serving`): one job per (concurrency level, repeat). backend batched (CPU default): the same c
# requests decoded together by the batched engine for AR, DFlash(16) and DScout at every candidate bs. backend sglang
# (cluster): one SGLang server per method on loopback, each on a free port and checked against its own description
# (/get_server_info) before it is measured, c warm-up requests from beyond the measured pool, then a closed-loop
# client at concurrency c over the pool (dscout.backends.sglang). Either way AR and every method of a repeat run in
# the same job, the records share one schema and Table 4 pairs each method with AR's throughput of the same repeat,
# picking DScout(best) per c from the measured throughput. A killed job loses its own repeat only.

SERVING_ENV = "../envs/serve.yaml" if config["serving"]["backend"] == "sglang" else "../envs/train.yaml"


rule serving_benchmark:
    wildcard_constraints:
        repeat=r"\d+",
    message:
        "Serving at concurrency {wildcards.c}, repeat {wildcards.repeat} ({params.backend})"
    input:
        unpack(serving_drafter_inputs),
        target=f"{TARGET_DIR}/target.json",
    output:
        "results/serving/{sid}/c{c}/r{repeat}.jsonl",
    params:
        cli=CLI,
        stage=lambda w: stage_json(SERVING_STAGE),
        backend=config["serving"]["backend"],
        prefill_gb=config["benchmarks"]["prefill_store_gb"],
        code=code("serving"),
        data_root=DATA_ROOT,
    threads: JOB_THREADS
    resources:
        gpu=min(GPUS, 1),
    log:
        "results/logs/serving_benchmark/{sid}-c{c}-r{repeat}.log",
    benchmark:
        "results/timings/serving_benchmark/{sid}-c{c}-r{repeat}.tsv"
    conda:
        SERVING_ENV
    shell:
        "python {params.cli} serve-cpu --stage {params.stage:q} --target $(dirname {input.target}) "
        "--drafter dflash=$(dirname {input.dflash}) --drafter dscout=$(dirname {input.dscout}) "
        "--concurrency {wildcards.c} --repeat {wildcards.repeat} --prefill-store-gb {params.prefill_gb} "
        "--out {output} --data-root {params.data_root:q} --threads {threads} > {log} 2>&1"


rule serving_vllm:
    wildcard_constraints:
        repeat=r"\d+",
    message:
        "Serving with vLLM (AR, DFlash) at every concurrency level, repeat {wildcards.repeat}"
    input:
        dflash=lambda w: serving_drafter_inputs(w)["dflash"],
        target=f"{TARGET_DIR}/target.json",
    output:
        "results/serving/{vsid}/vllm/r{repeat}.jsonl",
    params:
        cli=CLI,
        stage=lambda w: stage_json(VLLM_SERVING_STAGE),
        env=config["serving"]["vllm"]["env"],
        python=f"--vllm-python {config['serving']['vllm']['python']}" if config["serving"]["vllm"]["python"] else "",
        code=code("serving"),
        data_root=DATA_ROOT,
    threads: JOB_THREADS
    resources:
        **cluster_resources("serving_vllm"),
    log:
        "results/logs/serving_vllm/{vsid}-r{repeat}.log",
    benchmark:
        "results/timings/serving_vllm/{vsid}-r{repeat}.tsv"
    conda:
        "../envs/vllm.yaml"
    shell:
        "python {params.cli} serve-vllm --stage {params.stage:q} --target $(dirname {input.target}) "
        "--drafter $(dirname {input.dflash}) --repeat {wildcards.repeat} --vllm-env {params.env:q} {params.python} "
        "--out {output} --data-root {params.data_root:q} --threads {threads} > {log} 2>&1"


rule table4:
    message:
        "Table 4 (serving at concurrency c)"
    input:
        serving_records_input,
    output:
        md=report("results/tables/table4.md", caption="../report/table4.rst", category="Tables"),
        csv="results/tables/table4.csv",
        tex="results/tables/table4.tex",
    params:
        cli=CLI,
        stage=stage_json(dcfg.table4_stage(config)),
        prefix=lambda w, output: os.path.splitext(output[0])[0],
        code=code("analysis"),
    log:
        "results/logs/table4.log",
    benchmark:
        "results/timings/table4.tsv"
    localrule: True
    conda:
        "../envs/plot.yaml"
    shell:
        "python {params.cli} table4 --stage {params.stage:q} --records {input} --out-prefix {params.prefix} "
        "> {log} 2>&1"
