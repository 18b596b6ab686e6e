# dscout — DScout reproduction workflow (thin entry point: config, validation, includes, `rule all`).
#
#   snakemake --cores all                                   # the CPU default (config.yaml)
#   snakemake --cores all --configfile presets/smoke.yaml   # the tiny end-to-end run the tests use
#   snakemake --profile profiles/slurm --configfile presets/paper.yaml --sdm conda   # GPU cluster
#   snakemake results/tables/table3.md                      # one artifact (and only what it needs)
#   snakemake --configfile presets/paper.yaml cost          # the bill (GPU-hours, wall vs runtime, disk) first

import os

from snakemake.utils import min_version

min_version("9.0")


# the project's defaults, beside this Snakefile (also under `snakemake -s <project>/Snakefile -d <elsewhere>`);
# --configfile files merge over it
configfile: os.path.join(workflow.basedir, "config.yaml")


include: "rules/common.smk"
include: "rules/target.smk"
include: "rules/train.smk"
include: "rules/bench.smk"
include: "rules/paper.smk"
include: "rules/study.smk"
include: "rules/depth.smk"
include: "rules/serving.smk"
include: "rules/findings.smk"
include: "rules/memory.smk"
include: "rules/cost.smk"


rule all:
    default_target: True
    input:
        final_outputs(),
