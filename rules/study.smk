# The recipe study (config `study`): one drafter per ablation recipe, decoded greedily on a few prompts through
# the same engine, and the artifacts computed from those records: Tables 1, 2 and Figures 4, 7.


rule study_benchmark:
    message:
        "Recipe study: {wildcards.benchmark}, {params.n_methods} (recipe, bs) rows + AR"
    input:
        unpack(study_drafter_inputs),
        target=f"{TARGET_DIR}/target.json",
    output:
        expand("results/study/{{sid}}/{{benchmark}}/t0/r0/{method}.jsonl", method=STUDY_METHOD_KEYS),
    params:
        cli=CLI,
        stage=stage_json(STUDY_STAGE),
        drafters=study_drafter_args,
        n_methods=len(STUDY_METHOD_KEYS) - 1,
        code=code("bench"),
        data_root=DATA_ROOT,
    threads: JOB_THREADS
    resources:
        **cluster_resources("study_benchmark"),
    log:
        "results/logs/study_benchmark/{sid}-{benchmark}.log",
    benchmark:
        "results/timings/study_benchmark/{sid}-{benchmark}.tsv"
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} bench --stage {params.stage:q} --target $(dirname {input.target}) "
        "--benchmark {wildcards.benchmark} --temperature 0 --repeats 1 {params.drafters} "
        "--out-dir results/study/{wildcards.sid}/{wildcards.benchmark}/t0 --data-root {params.data_root:q} "
        "--threads {threads} > {log} 2>&1"


for _artifact, _kind in (("table1", "tables"), ("table2", "tables"), ("fig4", "figures"), ("fig7", "figures")):

    rule:
        name:
            f"study_{_artifact}"
        message:
            f"{_artifact} from the recipe study's records"
        input:
            study_records_input,
        output:
            (
                [f"results/tables/{_artifact}.{e}" for e in ("md", "csv", "tex")]
                if _kind == "tables"
                else [f"results/figures/{_artifact}.{e}" for e in ("png", "pdf")]
            ),
        params:
            cli=CLI,
            stage=study_table_stage_json(),
            which=_artifact,
            prefix=lambda w, output: os.path.splitext(output[0])[0],
            code=code("analysis"),
        log:
            f"results/logs/{_artifact}.log",
        benchmark:
            f"results/timings/{_artifact}.tsv"
        localrule: True
        conda:
            "../envs/plot.yaml"
        shell:
            "python {params.cli} study --which {params.which} --stage {params.stage:q} --records {input} "
            "--out-prefix {params.prefix} > {log} 2>&1"
