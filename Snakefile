# dscout — DScout reproduction workflow (thin entry point: config, validation, includes, `rule all`).
#
#   snakemake --cores all                                   # the CPU default (config.yaml)
#   snakemake --cores all --configfile presets/smoke.yaml   # the tiny end-to-end run the tests use
#   snakemake --profile profiles/slurm --configfile presets/paper.yaml --sdm conda   # GPU cluster
#   snakemake results/tables/table3.md                      # one artifact (and only what it needs)

from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


include: "rules/common.smk"
include: "rules/target.smk"
include: "rules/train.smk"
include: "rules/bench.smk"
include: "rules/paper.smk"
include: "rules/study.smk"
include: "rules/depth.smk"
include: "rules/serving.smk"


rule all:
    default_target: True
    input:
        final_outputs(),
