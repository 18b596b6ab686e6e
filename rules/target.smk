# Target preparation and response regeneration.


rule prepare_target:
    message:
        "Preparing target {wildcards.tid}"
    output:
        "results/target/{tid}/target.json",
    params:
        cli=CLI,
        stage=stage_json({**dcfg.target_stage(config), "device": config["target"]["device"],
                          "attn_implementation": config["target"]["attn_implementation"],
                          "num_layers": NUM_TARGET_LAYERS}),
        code=code("target"),
    log:
        "results/logs/prepare_target/{tid}.log",
    benchmark:
        "results/benchmarks/prepare_target/{tid}.tsv"
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} prepare-target --stage {params.stage:q} --out $(dirname {output}) > {log} 2>&1"


rule generate_responses:
    message:
        "Regenerating training responses with the target ({wildcards.rid})"
    input:
        target=f"{TARGET_DIR}/target.json",
    output:
        "results/responses/{rid}/responses.jsonl",
    params:
        cli=CLI,
        stage=stage_json(dcfg.responses_stage(config)),
        code=code("responses"),
        data_root=DATA_ROOT,
    threads: JOB_THREADS
    resources:
        gpu=GPUS,
    log:
        "results/logs/generate_responses/{rid}.log",
    benchmark:
        "results/benchmarks/generate_responses/{rid}.tsv"
    conda:
        "../envs/serve.yaml" if config["responses"]["backend"] == "sglang" else "../envs/train.yaml"
    shell:
        "python {params.cli} generate --stage {params.stage:q} --target $(dirname {input.target}) "
        "--out {output} --data-root {params.data_root:q} --threads {threads} --gpus {resources.gpu} > {log} 2>&1"
