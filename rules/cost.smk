# The bill before the first job: `snakemake --configfile presets/paper.yaml cost` prints, per rule, jobs,
# GPU-hours, estimated wall time per job against its SLURM runtime request, GPU memory (the training memory plan's
# column), host memory and disk written (src/dscout/cost.py: the cost model and its named constants; README
# "The bill"). A localrule with no output: it runs, on the login node, every time it is asked for, and starts
# nothing else. The same bill: `python src/dscout/cli.py plan-cost --configfile config.yaml presets/paper.yaml`.


rule cost:
    message:
        "The bill of this configuration (dscout plan-cost)"
    params:
        cli=CLI,
        config=lambda w: json.dumps(config, sort_keys=True, default=str),
        project=workflow.basedir,
    log:
        "results/logs/cost.log",
    localrule: True
    conda:
        "../envs/plot.yaml"  # torch-free: the cost model reads shapes and the config only
    shell:
        "python {params.cli} plan-cost --config-json {params.config:q} --project-dir {params.project:q} "
        "--out results/cost/bill.md 2> {log}"
