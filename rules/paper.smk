# The paper's tables and figures, each its own target, computed from raw records only.


rule table3:
    message:
        "Table 3 from {params.n} record files"
    input:
        records=bench_records() + server_bench_records(),
        accuracy=accuracy_records(),
    output:
        md=report("results/tables/table3.md", caption="../report/table3.rst", category="Tables"),
        csv="results/tables/table3.csv",
        tex="results/tables/table3.tex",
    params:
        cli=CLI,
        stage=table_stage_json(),
        n=len(bench_records() + server_bench_records()),
        code=code("analysis"),
    log:
        "results/logs/table3.log",
    benchmark:
        "results/timings/table3.tsv"
    localrule: True
    conda:
        "../envs/plot.yaml"
    shell:
        "python {params.cli} table3 --stage {params.stage:q} --records {input.records} "
        "--accuracy {input.accuracy} --out-prefix results/tables/table3 > {log} 2>&1"


rule fig2:
    message:
        "Figure 2 (accept-length distribution) from {params.n} record files"
    input:
        bench_records(),
    output:
        png=report("results/figures/fig2.png", caption="../report/fig2.rst", category="Figures"),
        pdf="results/figures/fig2.pdf",
    params:
        cli=CLI,
        stage=table_stage_json(),
        n=len(bench_records()),
        code=code("analysis"),
    log:
        "results/logs/fig2.log",
    benchmark:
        "results/timings/fig2.tsv"
    localrule: True
    conda:
        "../envs/plot.yaml"
    shell:
        "python {params.cli} fig2 --stage {params.stage:q} --records {input} --out-prefix results/figures/fig2 "
        "> {log} 2>&1"


# The online block-size controller (rows with `block_size: online`): bs chosen per round beside acceptance, and
# the calibrated latency model against the measured round times.
rule fig_online:
    message:
        "Figure online (block size chosen per round, latency model vs measured rounds)"
    input:
        records=[p for p in bench_records() if "/t0/" in p],
        latency=online_latency_files(),
    output:
        png=report("results/figures/fig_online.png", caption="../report/fig_online.rst", category="Figures"),
        pdf="results/figures/fig_online.pdf",
    params:
        cli=CLI,
        stage=table_stage_json(),
        code=code("analysis"),
    log:
        "results/logs/fig_online.log",
    benchmark:
        "results/timings/fig_online.tsv"
    localrule: True
    conda:
        "../envs/plot.yaml"
    shell:
        "python {params.cli} fig-online --stage {params.stage:q} --records {input.records} "
        "--latency {input.latency} --out-prefix results/figures/fig_online > {log} 2>&1"
