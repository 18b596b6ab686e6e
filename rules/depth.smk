# Figure 5: the drafter-depth search (config `depth_search`), lazy in increasing d: candidate d + 1 is trained only
# while throughput G_d = τ_d / T_d still rose at d (docs/method.md §5).
#
# features.mode: cache (the CPU default) -- one job trains the candidates one after another from the offline
# feature cache; candidates and checkpoints live beside search.json, so a killed job resumes where it stopped.
# features.mode: online (the paper preset) -- no cache of the response set is written: each candidate is its own
# training job (the train_drafter command, launcher and resources, multi-GPU) that then measures its τ, T and G
# (point.json). `depth_candidate` is a Snakemake checkpoint: the search job's input function walks the candidates
# with the same unimodal_peak_search, asking for candidate d + 1 only once d's point shows G still rose.
if DEPTH_ONLINE:

    checkpoint depth_candidate:
        message:
            "Depth search: training and measuring candidate d = {wildcards.d}"
        input:
            target=f"{TARGET_DIR}/target.json",
            responses=RESPONSES,
        output:
            summary="results/depth/{did}/d{d}/training_summary.json",
            point="results/depth/{did}/d{d}/point.json",
        wildcard_constraints:
            d=r"\d+",
        params:
            cli=CLI,
            stage=lambda w: stage_json(depth_candidate_stage(DEPTH_STAGE, int(w.d))),
            search=lambda w: stage_json(DEPTH_STAGE),
            responses_stage=stage_json(config["responses"]),
            launcher=launcher,
            code=code("depth"),
            data_root=DATA_ROOT,
        threads: TRAIN_THREADS
        resources:
            **cluster_resources("depth_candidate"),
        log:
            "results/logs/depth_candidate/{did}-d{d}.log",
        benchmark:
            "results/timings/depth_candidate/{did}-d{d}.tsv"
        conda:
            "../envs/train.yaml"
        shell:
            # checkpoints outside the declared outputs (results/checkpoints/): a killed or timed-out job resumes
            "{params.launcher} {params.cli} train --stage {params.stage:q} --target $(dirname {input.target}) "
            "--responses {input.responses} --responses-stage {params.responses_stage:q} "
            "--out $(dirname {output.summary}) --work results/checkpoints/depth/{wildcards.did}/d{wildcards.d} "
            "--threads {threads} > {log} 2>&1 && "
            "python {params.cli} depth-point --stage {params.search:q} --target $(dirname {input.target}) "
            "--drafter $(dirname {output.summary}) --out {output.point} --data-root {params.data_root:q} "
            "--threads {threads} >> {log} 2>&1"

    rule depth_search:
        message:
            "Drafter-depth search over d in {params.candidates} (latency sweep; trained points from their jobs)"
        input:
            target=f"{TARGET_DIR}/target.json",
            points=depth_points,
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
            **cluster_resources("depth_search"),
        log:
            "results/logs/depth_search/{did}.log",
        benchmark:
            "results/timings/depth_search/{did}.tsv"
        conda:
            "../envs/train.yaml"
        shell:
            "python {params.cli} depth-search --stage {params.stage:q} --target $(dirname {input.target}) "
            "--points {input.points} --out {output} --data-root {params.data_root:q} "
            "--threads {threads} > {log} 2>&1"

else:

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
            **cluster_resources("depth_search"),
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
