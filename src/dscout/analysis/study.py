"""The recipe study's artifacts from its decoded records: Tables 1 and 2, Figures 4 and 7 (docs/method.md §3).

Each study drafter is trained with one recipe of the paper's ablations (``dscout.config.STUDY_PLAN``) and
decoded greedily through the engine on Table 3's benchmark prompts; its records carry the drafter id, which the
stage maps to the recipe. The rounds it decoded are the rows :mod:`dscout.analysis.recipe_artifacts` renders —
the same tables and figures, intervals and MAT (tokens / rounds, bonus included) as the findings stage's, with
one set: the decoded prompts (each (benchmark, prompt, turn) a bootstrap unit). Where the findings stage reads
teacher-forced walks of many sequences (cheap on a CPU), the study measures what decoding itself does, through
the engine that decodes Table 3 (on the cluster, the paper's protocol). The paper's values sit beside ours,
labelled; every caption states the study's scale (drafter shape, steps, prompts).
"""

from __future__ import annotations

from .aggregate import load_records
from .recipe_artifacts import (FIG4_STEPS, RecordSet, record_sets, write_fig4 as _fig4,  # noqa: F401
                               write_fig7 as _fig7, write_table1 as _table1, write_table2 as _table2)

TABLE2_BS = [8, 16, 24, 32]
SET = "decoded"


def study_rows(records: list[dict], recipes: dict[str, str]) -> list[dict]:
    """Greedy study records -> rows ``{set: "decoded", id, drafter: recipe, bs, rounds, source: benchmark}``.

    Args:
        records: the study's records (:mod:`dscout.records`); AR rows and temperatures above 0 are skipped.
        recipes: drafter id -> recipe name (the study stage's mapping).
    Raises:
        ValueError: if a speculative record's drafter is not in ``recipes`` (records of another study), naming
            the record's drafter, benchmark and prompt.
    """
    rows = []
    for r in records:
        if r["method"] == "ar" or r["temperature"] != 0:
            continue
        if r["drafter"] not in recipes:
            raise ValueError(f"record of drafter {r['drafter']} ({r.get('benchmark')}, prompt {r.get('prompt_id')})"
                             " is not part of this study; rerun the study rule")
        rows.append({"set": SET, "id": f"{r['benchmark']}/{r['prompt_id']}/{r.get('turn', 0)}/r{r.get('repeat', 0)}",
                     "drafter": recipes[r["drafter"]], "bs": int(r["block_size"]),
                     "rounds": list(r["accept_lengths"]), "source": r["benchmark"]})
    return rows


def _sets(record_paths, stage: dict) -> list[RecordSet]:
    rows = study_rows(load_records(record_paths), stage["recipes"])
    return record_sets(rows, [(SET, "decoded prompts")], stage.get("bootstrap"))


def _caption(stage: dict) -> str:
    return (f"Measured on {stage.get('target', 'the target')} (CPU): one drafter per recipe, "
            f"{stage.get('shape', '?')}, {stage.get('max_steps', '?')} training steps each (the paper: 6 epochs "
            f"on 1.4M samples), greedy decoding of {stage.get('num_prompts', '?')} prompts x "
            f"{', '.join(stage.get('benchmarks', []))}, {stage.get('max_new_tokens', '?')} new tokens; MAT = tokens "
            "/ rounds of the decoded records in results/study/; [a, b] = 95 % paired bootstrap interval over prompts.")


def write_table1(record_paths, out_prefix: str, stage: dict) -> list[list]:
    """Table 1 from the study's decoded rounds: :func:`recipe_artifacts.write_table1`."""
    return _table1(_sets(record_paths, stage), out_prefix, _caption(stage))


def write_table2(record_paths, out_prefix: str, stage: dict) -> list[list]:
    """Table 2 from the study's decoded rounds at bs 8, 16, 24, 32: :func:`recipe_artifacts.write_table2`."""
    return _table2(_sets(record_paths, stage), out_prefix, _caption(stage), TABLE2_BS)


def write_fig4(record_paths, out_prefix: str, stage: dict) -> dict:
    """Figure 4 from the study's decoded rounds: :func:`recipe_artifacts.write_fig4`."""
    return _fig4(_sets(record_paths, stage), out_prefix,
                 f"{stage.get('target', '')}, {stage.get('shape', '')}, {stage.get('max_steps', '?')} steps, decoded")


def write_fig7(record_paths, out_prefix: str, stage: dict) -> dict:
    """Figure 7 from the study's decoded rounds: :func:`recipe_artifacts.write_fig7`."""
    return _fig7(_sets(record_paths, stage), out_prefix)


WRITERS = {"table1": write_table1, "table2": write_table2, "fig4": write_fig4, "fig7": write_fig7}
