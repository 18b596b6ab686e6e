# Target-feature cache and drafter training (DeepSpeed; one CPU process, or the launcher on GPUs).


rule target_features:
    message:
        "Caching target features {wildcards.fid}"
    input:
        target=f"{TARGET_DIR}/target.json",
        responses=RESPONSES,
    output:
        "results/features/{rid}/{fid}/index.json",
    params:
        cli=CLI,
        stage=features_stage_json,
        responses_stage=stage_json(config["responses"]),
        code=code("features"),
        batch_size=config["features"]["batch_size"],
    threads: JOB_THREADS
    # every cache before the first training: the trainings then run side by side (with the accuracy stage)
    # instead of one of them alone while a late cache holds the other cores
    priority: 1
    resources:
        **cluster_resources("target_features"),
    log:
        "results/logs/target_features/{rid}-{fid}.log",
    benchmark:
        "results/timings/target_features/{rid}-{fid}.tsv"
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} features --stage {params.stage:q} --target $(dirname {input.target}) "
        "--responses {input.responses} --responses-stage {params.responses_stage:q} "
        "--out $(dirname {output}) --batch-size {params.batch_size} --threads {threads} > {log} 2>&1"


rule train_drafter:
    message:
        "Training drafter {wildcards.did}"
    input:
        target=f"{TARGET_DIR}/target.json",
        responses=responses_of_drafter,
        features=features_of_drafter,
        published=published_of_drafter,
    output:
        # every kind writes training_summary.json last; dflash/dscout (and eagle3) also config.json + weights
        summary="results/drafters/{did}/training_summary.json",
    params:
        cli=CLI,
        stage=drafter_stage_json,
        responses_stage=stage_json(config["responses"]),
        features=features_arg,
        responses=responses_arg,
        launcher=launcher,
        code=code("train"),
    threads: TRAIN_THREADS
    resources:
        **cluster_resources("train_drafter", imported=_imported),
    log:
        "results/logs/train_drafter/{did}.log",
    benchmark:
        "results/timings/train_drafter/{did}.tsv"
    conda:
        "../envs/train.yaml"
    shell:
        # checkpoints live outside the declared output (results/checkpoints/), so a failed job keeps them and resumes
        "{params.launcher} {params.cli} train --stage {params.stage:q} --target $(dirname {input.target}) "
        "{params.responses} --responses-stage {params.responses_stage:q} {params.features} "
        "--out $(dirname {output.summary}) --work results/checkpoints/drafters/{wildcards.did} "
        "--threads {threads} > {log} 2>&1"
