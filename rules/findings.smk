# The paper's training-side findings, settled by statistics (config `findings`, docs/findings.md): one drafter per
# ablation recipe trained on the same responses minus a held-out set, teacher-forced greedy accept lengths at every
# anchor of the held-out responses and of benchmark prompts' AR outputs, and from those records the findings table
# (estimate, 95 % bootstrap interval, computed verdict) with Tables 1, 2 and Figures 2, 4, 7.


rule findings_bench_outputs:
    message:
        "Findings: greedy AR outputs of the benchmark prompts"
    input:
        target=f"{TARGET_DIR}/target.json",
    output:
        "results/findings/{fsid}/bench_outputs.jsonl",
    params:
        cli=CLI,
        stage=lambda w: stage_json(FINDINGS_STAGE),
        code=code("responses"),
        data_root=DATA_ROOT,
    threads: JOB_THREADS
    # before the trainings: every evaluation needs it, and it takes all cores
    priority: 1
    resources:
        gpu=min(GPUS, 1),
    log:
        "results/logs/findings_bench_outputs/{fsid}.log",
    benchmark:
        "results/timings/findings_bench_outputs/{fsid}.tsv"
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} findings-outputs --stage {params.stage:q} --target $(dirname {input.target}) "
        "--out {output} --data-root {params.data_root:q} --threads {threads} > {log} 2>&1"


rule findings_taps:
    message:
        "Findings: the target's taps of the evaluated sequences (once for every drafter)"
    input:
        target=f"{TARGET_DIR}/target.json",
        responses=RESPONSES,
        bench_outputs="results/findings/{fsid}/bench_outputs.jsonl",
    output:
        "results/findings/{fsid}/eval_taps.safetensors",
    params:
        cli=CLI,
        stage=lambda w: stage_json(FINDINGS_STAGE),
        responses_stage=stage_json(config["responses"]),
        layer_ids=lambda w: json.dumps(findings_layer_ids()),
        code=code("findings"),
    threads: JOB_THREADS
    # right after the benchmark outputs: every evaluation reads it
    priority: 1
    resources:
        gpu=min(GPUS, 1),
    log:
        "results/logs/findings_taps/{fsid}.log",
    benchmark:
        "results/timings/findings_taps/{fsid}.tsv"
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} findings-taps --stage {params.stage:q} --target $(dirname {input.target}) "
        "--layer-ids {params.layer_ids:q} --responses {input.responses} --responses-stage {params.responses_stage:q} "
        "--bench-outputs {input.bench_outputs} --out {output} --threads {threads} > {log} 2>&1"


rule findings_eval:
    message:
        "Findings: teacher-forced accept lengths of drafter {wildcards.name}"
    input:
        target=f"{TARGET_DIR}/target.json",
        responses=RESPONSES,
        drafter=findings_drafter_input,
        bench_outputs="results/findings/{fsid}/bench_outputs.jsonl",
        taps="results/findings/{fsid}/eval_taps.safetensors",
    output:
        "results/findings/{fsid}/records/{name}.jsonl",
    params:
        cli=CLI,
        stage=lambda w: stage_json(FINDINGS_STAGE),
        responses_stage=stage_json(config["responses"]),
        code=code("findings"),
    # evaluations of different drafters run side by side, like the trainings (nothing is timed)
    threads: TRAIN_THREADS
    resources:
        gpu=min(GPUS, 1),
    log:
        "results/logs/findings_eval/{fsid}-{name}.log",
    benchmark:
        "results/timings/findings_eval/{fsid}-{name}.tsv"
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} findings-eval --stage {params.stage:q} --name {wildcards.name} "
        "--target $(dirname {input.target}) --drafter $(dirname {input.drafter}) --responses {input.responses} "
        "--responses-stage {params.responses_stage:q} --bench-outputs {input.bench_outputs} --taps {input.taps} --out {output} "
        "--threads {threads} > {log} 2>&1"


rule findings_table:
    message:
        "The findings table: estimates, 95 % intervals and verdicts"
    input:
        findings_records_input,
    output:
        "results/tables/findings.md",
        "results/tables/findings.csv",
    params:
        cli=CLI,
        stage=lambda w: stage_json(FINDINGS_STAGE),
        code=code("findings_analysis"),
    log:
        "results/logs/findings_table.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    shell:
        "python {params.cli} findings --which findings --stage {params.stage:q} --records {input} "
        "--out-prefix results/tables/findings > {log} 2>&1"


for _artifact, _kind in (("table1", "tables"), ("table2", "tables"), ("fig2", "figures"), ("fig4", "figures"),
                         ("fig7", "figures")):

    rule:
        name:
            f"findings_{_artifact}"
        message:
            f"findings_{_artifact} from the findings records"
        input:
            findings_records_input,
        output:
            (
                [f"results/tables/findings_{_artifact}.{e}" for e in ("md", "csv", "tex")]
                if _kind == "tables"
                else [f"results/figures/findings_{_artifact}.{e}" for e in ("png", "pdf")]
            ),
        params:
            cli=CLI,
            stage=lambda w: stage_json(FINDINGS_STAGE),
            which=_artifact,
            prefix=lambda w, output: os.path.splitext(output[0])[0],
            code=code("findings_analysis"),
        log:
            f"results/logs/findings_{_artifact}.log",
        localrule: True
        conda:
            "../envs/plot.yaml"
        shell:
            "python {params.cli} findings --which {params.which} --stage {params.stage:q} --records {input} "
            "--out-prefix {params.prefix} > {log} 2>&1"


rule findings:
    message:
        "The findings stage: its table, Tables 1, 2 and Figures 2, 4, 7"
    input:
        lambda w: findings_outputs() or findings_records_input(w),
    localrule: True
