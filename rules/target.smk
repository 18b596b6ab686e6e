# Target preparation and response regeneration.


rule download_models:
    # on the login node (internet): every hub model of the config into the HF cache, and every hub dataset a
    # stage reads without a mirror file into datasets' cache; the jobs after it run with the hub offline
    message:
        "Snapshotting the hub models {params.models} into the HF cache"
    output:
        HUB_STAMP,
    params:
        cli=CLI,
        stage=stage_json(dcfg_models.download_plan(config)),
        models=", ".join(HUB_MODELS),
        data_root=DATA_ROOT,
    log:
        "results/logs/download_models.log",
    localrule: True
    conda:
        "../envs/train.yaml"
    shell:
        "HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0 python {params.cli} download-models --stage {params.stage:q} "
        "--out {output} --data-root {params.data_root:q} > {log} 2>&1"


rule prepare_target:
    message:
        "Preparing target {wildcards.tid}"
    input:
        hub=HUB_STAMP if HUB_MODELS else [],
    output:
        "results/target/{tid}/target.json",
    params:
        cli=CLI,
        stage=stage_json(dcfg.prepare_target_stage(config, NUM_TARGET_LAYERS)),
        code=code("target"),
        data_root=DATA_ROOT,
    resources:
        **cluster_resources("prepare_target"),
    log:
        "results/logs/prepare_target/{tid}.log",
    benchmark:
        "results/timings/prepare_target/{tid}.tsv"
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} prepare-target --stage {params.stage:q} --out $(dirname {output}) "
        "--data-root {params.data_root:q} > {log} 2>&1"


rule write_published:
    # a drafter whose `pretrained:` is a folder under results/published/ (the miniature paper run) imports a
    # checkpoint this rule writes in the published layout of its kind (dscout.models.published)
    message:
        "Writing a published-layout checkpoint {wildcards.name}"
    input:
        target=f"{TARGET_DIR}/target.json",
    output:
        f"{PUBLISHED_DIR}/{{name}}/config.json",
    params:
        cli=CLI,
        stage=lambda w: stage_json(PUBLISHED[w.name]),
    resources:
        **cluster_resources("write_published"),
    log:
        "results/logs/write_published/{name}.log",
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} write-published --stage {params.stage:q} --target $(dirname {input.target}) "
        "--out $(dirname {output}) > {log} 2>&1"


rule generate_responses:
    message:
        "Regenerating training responses with the target ({wildcards.rid})"
    input:
        target=f"{TARGET_DIR}/target.json",
    output:
        responses="results/responses/{rid}/responses.jsonl",
        # the same rows packed for memory-mapped reading (dscout.data.packed): what training and features read
        packed="results/responses/{rid}/packed/index.json",
    params:
        cli=CLI,
        stage=stage_json(dcfg.responses_stage(config)),
        code=code("responses"),
        data_root=DATA_ROOT,
    threads: JOB_THREADS
    priority: 1  # on the path to every training job (the accuracy stage can wait)
    resources:
        **cluster_resources("generate_responses"),
    log:
        "results/logs/generate_responses/{rid}.log",
    benchmark:
        "results/timings/generate_responses/{rid}.tsv"
    conda:
        "../envs/serve.yaml" if config["responses"]["backend"] == "sglang" else "../envs/train.yaml"
    shell:
        "python {params.cli} generate --stage {params.stage:q} --target $(dirname {input.target}) "
        "--out {output.responses} --data-root {params.data_root:q} --threads {threads} --gpus {resources.gpu} > {log} 2>&1"


# Data mirror: `snakemake --cores 1 fetch_data` on a machine with internet writes, under data_root, every
# benchmark and prompt file this config reads (from the hub, through datasets), for compute nodes without it.
# No other rule depends on it: a run reads the mirror where it exists and the hub otherwise.
localrules:
    fetch_data,


rule fetch_data:
    message:
        "Fetching the data mirror from the hub"
    output:
        [os.path.join(dcfg_fetch.data_root(DATA_ROOT), f) for f in dcfg_fetch.mirror_files(config)],
    params:
        cli=CLI,
        # the mirror folder: the first output minus its path under the mirror
        root=lambda w, output: str(Path(output[0]).parents[len(Path(dcfg_fetch.mirror_files(config)[0]).parts) - 1]),
        benchmarks=" ".join(dcfg_fetch.needed_sources(config)[0]),
        sources=" ".join(s for s in dcfg_fetch.needed_sources(config)[1]
                         if dcfg_fetch.prompt_source(s).hub is not None),
    log:
        "results/logs/fetch_data.log",
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} fetch-data --out {params.root:q} --benchmarks {params.benchmarks} "
        "--sources {params.sources} > {log} 2>&1"
