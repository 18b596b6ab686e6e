# The memory plan: one update of every drafter this config trains, run on fake tensors (no GPU needed), peak bytes
# per GPU with a breakdown. On demand, for any preset:  snakemake --cores 1 memory_plan --configfile presets/paper.yaml
# (config.check_plan's plan-time refusal uses the closed-form estimate of dscout.training.memory_estimate).

MEMORY_PLAN_ID = dcfg.short_hash({k: config.get(k) for k in ("target", "responses", "training", "drafters", "study",
                                                            "depth_search")})


rule memory_plan:
    message:
        "Memory plan: one update of each trained drafter on fake tensors (peak bytes per GPU)"
    output:
        md=f"results/memory_plan/{MEMORY_PLAN_ID}.md",
    params:
        cli=CLI,
        stage=stage_json(config),
        code=code("train"),
    log:
        f"results/logs/memory_plan-{MEMORY_PLAN_ID}.log",
    localrule: True
    conda:
        "../envs/train.yaml"
    shell:
        "python {params.cli} memory-plan --stage {params.stage:q} --out {output.md} > {log} 2>&1; rc=$?; "
        "cat {log}; exit $rc"
