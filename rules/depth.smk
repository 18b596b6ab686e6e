# Figure 5: the drafter-depth search (config `depth_search`). One job trains candidates lazily in increasing d
# and stops at the first throughput drop; candidates and checkpoints live beside search.json, so a killed job
# resumes where it stopped.


rule depth_search:
    message:
        "Drafter-depth search over d in {params.candidates}"
    input:
        target=f"{TARGET_DIR}/target.json",
        features=feature_cache(DEPTH_STAGE["layer_ids"]) if DEPTH else [],
    output:
        "results/depth/{did}/search.json",
    params:
        cli=CLI,
        stage=lambda w: stage_json(DEPTH_STAGE),
        candidates=config["depth_search"]["candidates"],
        code=code("depth"),
        data_root=DATA_ROOT,
    threads: JOB_THREADS
    resources:
        gpu=min(GPUS, 1),
    log:
        "results/logs/depth_search/{did}.log",
    benchmark:
        "results/timings/depth_search/{did}.tsv"
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} depth-search --stage {params.stage:q} --target $(dirname {input.target}) "
        "--features $(dirname {input.features}) --out {output} --data-root {params.data_root:q} "
        "--threads {threads} > {log} 2>&1"


rule fig5:
    message:
        "Figure 5 (throughput vs drafter depth)"
    input:
        depth_search_output,
    output:
        png=report("results/figures/fig5.png", caption="../report/fig5.rst", category="Figures"),
        pdf="results/figures/fig5.pdf",
    params:
        cli=CLI,
        stage=stage_json({"target": config["target"]["name"], "max_steps": config["depth_search"]["max_steps"]}),
        prefix=lambda w, output: os.path.splitext(output[0])[0],
        code=code("analysis"),
    log:
        "results/logs/fig5.log",
    benchmark:
        "results/timings/fig5.tsv"
    localrule: True
    conda:
        "../envs/plot.yaml"
    shell:
        "python {params.cli} fig5 --stage {params.stage:q} --search {input} --out-prefix {params.prefix} "
        "> {log} 2>&1"


rule fig3:
    message:
        "Figure 3 (G = τ / T per configuration dimension)"
    input:
        search=depth_search_output,
        records=bench_records(),
    output:
        png=report("results/figures/fig3.png", caption="../report/fig3.rst", category="Figures"),
        pdf="results/figures/fig3.pdf",
    params:
        cli=CLI,
        stage=stage_json({"target": config["target"]["name"]}),
        prefix=lambda w, output: os.path.splitext(output[0])[0],
        code=code("analysis"),
    log:
        "results/logs/fig3.log",
    benchmark:
        "results/timings/fig3.tsv"
    localrule: True
    conda:
        "../envs/plot.yaml"
    shell:
        "python {params.cli} fig3 --stage {params.stage:q} --search {input.search} --records {input.records} "
        "--out-prefix {params.prefix} > {log} 2>&1"
