"""The target's task accuracy on a sample larger than Table 3's timed prompts.

Table 3 times a few prompts per benchmark; task accuracy needs more, with answers long enough to finish. At
temperature 0 a lossless speculative method emits exactly AR's tokens (Table 3 counts any difference), so the
target's greedy accuracy is every method's accuracy. This stage decodes it batched (``transformers`` generate,
the same resumable path that regenerates training responses), scores each answer with lm-eval's task metrics
(:mod:`dscout.evaluation.scoring`) and writes one JSON object per prompt.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..data.benchmarks import load_benchmark
from ..data.responses import generate_responses
from ..jsonl import read_jsonl, write_jsonl
from .scoring import EXECUTES_CODE, SCORERS, score


def evaluate_accuracy(target, benchmark: str, root, out_path: str | os.PathLike, stage: dict) -> list[dict]:
    """Greedy AR answers to ``num_prompts`` prompts of ``benchmark``, scored; written to ``out_path`` (JSONL).

    Answers are generated into ``<out>.answers.jsonl`` first (resumable: a killed job keeps the answers it has);
    the scored file appears atomically once every prompt is scored.

    Args:
        target: :class:`~dscout.models.target.TargetModel`.
        benchmark: a scored benchmark (gsm8k, math500, humaneval, mbpp).
        root: the data mirror folder (or the hub, see :mod:`dscout.data.hub`).
        out_path: the scored JSONL file.
        stage: :func:`dscout.config.accuracy_stage` (``accuracy``: num_prompts, max_new_tokens, batch_size, seed,
            confirm_run_unsafe_code; ``chat``: system_prompt, enable_thinking).
    Returns:
        One record per prompt: ``benchmark, prompt_id, correct, new_tokens, finish_reason, output_text``.
    Raises:
        ValueError: a benchmark without a scorer, or one that runs code without ``confirm_run_unsafe_code``.
    """
    a, chat = stage["accuracy"], stage["chat"]
    items = load_benchmark(benchmark, root, a["num_prompts"], seed=a["seed"])
    if benchmark not in SCORERS or (benchmark in EXECUTES_CODE and not a["confirm_run_unsafe_code"]):
        raise ValueError(f"accuracy.benchmarks: '{benchmark}' has no scorer here (or runs code and "
                         "benchmarks.confirm_run_unsafe_code is false)")
    out_path = Path(out_path)
    answers = out_path.with_name(out_path.stem + ".answers.jsonl")
    prompts = [{"id": it.prompt_id, "source": benchmark, "prompt": it.turns[0]} for it in items]
    generate_responses(target, prompts, answers, max_new_tokens=a["max_new_tokens"], batch_size=a["batch_size"],
                       temperature=0.0, system_prompt=chat.get("system_prompt"),
                       enable_thinking=chat.get("enable_thinking"), seed=a["seed"])
    by_id = {r["id"]: r for r in read_jsonl(answers)}
    records = []
    for it in items:
        r = by_id[it.prompt_id]
        records.append({"benchmark": benchmark, "prompt_id": it.prompt_id,
                        "correct": score(benchmark, r["response"], it.reference, a["confirm_run_unsafe_code"]),
                        "new_tokens": len(r["response_ids"]), "finish_reason": r["finish_reason"],
                        "output_text": r["response"]})
    write_jsonl(records, out_path)
    return records


__all__ = ["evaluate_accuracy"]
