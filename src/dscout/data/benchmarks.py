"""Benchmark registry: name -> hub copy, mirror file, prompt template, turns and scorer.

Rows load through ``datasets.load_dataset`` from the mirror file under ``data_root`` or, without one, from the
hub copy upstream harnesses use (:mod:`dscout.data.hub`). Prompt templates follow the DFlash benchmark harness
(z-lab/dflash ``benchmark.py``), written in our words where the upstream text is free prose. Subsets are drawn
reproducibly: ``random.Random(seed).shuffle`` over the rows, then the first ``n`` (recorded as ``selection`` in
every record).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from .hub import HubSource, load_rows

MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class BenchmarkPrompt:
    """One benchmark item.

    Attributes:
        benchmark: registry name.
        prompt_id: stable id from the source file.
        turns: user turns (two for MT-Bench; turn 2 sees the model's own turn-1 answer).
        reference: what the scorer compares against (or None).
    """

    benchmark: str
    prompt_id: str
    turns: tuple[str, ...]
    reference: dict | None = None


LCB_FILE = "livecodebench/codegen_release_v5_880problems_from_submissions_O1-Mini-2024-09-12_N1.json"


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: where its rows live and how a row becomes a prompt.

    Attributes:
        name: registry name (config ``benchmarks.names``).
        hub: the hub copy upstream harnesses load.
        local_file: the mirror file under ``data_root`` (read first when present).
        loader: ``(rows, origin) -> prompts``; rows use the mirror's field names, origin labels errors.
        scorer: the accuracy scorer in :mod:`dscout.evaluation.scoring`, or None (unscored).
        turns: user turns per prompt.
        from_hub: maps a hub row to the mirror's field names (None: the same names).
        notes: what is special (shown in docs).
    """

    name: str
    hub: HubSource
    local_file: str
    loader: Callable[[list[dict], str], list[BenchmarkPrompt]]
    scorer: str | None = None
    turns: int = 1
    from_hub: Callable[[dict], dict] | None = None
    notes: str = ""


def _field(path, row: int, rec: dict, name: str):
    """``rec[name]``; a missing (or null) field raises KeyError naming the file, the row and the field."""
    if rec.get(name) is None:
        raise KeyError(f"{path}, row {row}: missing field '{name}'")
    return rec[name]


def _gsm8k(rows: list[dict], path: str) -> list[BenchmarkPrompt]:
    out = []
    for i, r in enumerate(rows, 1):
        solution = str(_field(path, i, r, "answer"))
        answer = solution.split("####")[-1].strip().replace(",", "")
        out.append(BenchmarkPrompt("gsm8k", f"gsm8k-{i - 1}", (_field(path, i, r, "question") + MATH_SUFFIX,),
                                   {"answer": answer, "target": solution}))
    return out


def _math500(rows: list[dict], path: str) -> list[BenchmarkPrompt]:
    out = []
    for i, r in enumerate(rows, 1):
        out.append(BenchmarkPrompt("math500", str(r.get("unique_id") or i - 1),
                                   (_field(path, i, r, "problem") + MATH_SUFFIX,),
                                   {"answer": str(_field(path, i, r, "answer")),
                                    "solution": str(r.get("solution") or "")}))
    return out


def _humaneval(rows: list[dict], path: str) -> list[BenchmarkPrompt]:
    out = []
    for i, r in enumerate(rows, 1):
        prompt = _field(path, i, r, "prompt")
        text = ("Write a solution to the following problem and make sure that it passes the tests:\n"
                f"```python\n{prompt}\n```")
        out.append(BenchmarkPrompt("humaneval", _field(path, i, r, "task_id"), (text,),
                                   {"prompt": prompt, "test": r.get("test", ""),
                                    "entry_point": r.get("entry_point", "")}))
    return out


def _mbpp(rows: list[dict], path: str) -> list[BenchmarkPrompt]:
    out = []
    for i, r in enumerate(rows, 1):
        tid = int(_field(path, i, r, "task_id"))
        if not 11 <= tid <= 510:  # the sanitized test split DFlash loads
            continue
        out.append(BenchmarkPrompt("mbpp", f"mbpp-{tid}", (_field(path, i, r, "prompt"),),
                                   {"tests": r.get("test_list") or [], "imports": r.get("test_imports") or []}))
    return out


def _livecodebench(rows: list[dict], path: str) -> list[BenchmarkPrompt]:
    out = []
    for i, r in enumerate(rows, 1):
        q = _field(path, i, r, "question_content")
        starter = r.get("starter_code") or ""
        text = ("You are an expert Python programmer. Solve the problem below with a correct Python program "
                "that passes all of its tests.\n\nQuestion: " + q + "\n\n")
        if starter:
            text += ("Complete the following starter code and put your solution in a python code block.\n"
                     f"```python\n{starter}\n```\n")
        else:
            text += ("Read the input from standard input and write the answer to standard output. Put your "
                     "solution in a python code block.\n```python\n# YOUR CODE HERE\n```\n")
        out.append(BenchmarkPrompt("livecodebench", str(_field(path, i, r, "question_id")), (text,), None))
    return out


def _mt_bench(rows: list[dict], path: str) -> list[BenchmarkPrompt]:
    out = []
    for i, r in enumerate(rows, 1):
        turns = tuple(_field(path, i, r, "turns"))
        out.append(BenchmarkPrompt("mt_bench", f"mt-{r.get('question_id') or i}", turns,
                                   {"category": r.get("category")}))
    return out


_LCB_FIELDS = ("question_title", "question_content", "platform", "question_id", "contest_id", "contest_date",
               "starter_code", "difficulty")


def _lcb_from_hub(row: dict) -> dict:
    """The problem fields of a LiveCodeBench hub row (its test cases are megabytes and unused for prompts)."""
    return {k: row.get(k) for k in _LCB_FIELDS}


def _mt_bench_from_hub(row: dict) -> dict:
    """HuggingFaceH4/mt_bench_prompts names the fields of FastChat's question.jsonl differently."""
    return {"question_id": row.get("prompt_id"), "category": row.get("category"), "turns": row.get("prompt"),
            "reference": row.get("reference")}


BENCHMARKS: dict[str, Benchmark] = {
    "gsm8k": Benchmark("gsm8k", HubSource("openai/gsm8k", "main", "test"), "gsm8k/test.jsonl", _gsm8k,
                       scorer="gsm8k"),
    "math500": Benchmark("math500", HubSource("HuggingFaceH4/MATH-500", None, "test"), "math500/test.jsonl",
                         _math500, scorer="math500"),
    "humaneval": Benchmark("humaneval", HubSource("openai/openai_humaneval", None, "test"),
                           "humaneval/HumanEval.jsonl.gz", _humaneval, scorer="humaneval"),
    "mbpp": Benchmark("mbpp", HubSource("google-research-datasets/mbpp", "sanitized", "test"),
                      "mbpp/sanitized-mbpp.json", _mbpp, scorer="mbpp"),
    "livecodebench": Benchmark(
        "livecodebench",
        HubSource("livecodebench/code_generation_lite", None, "train",
                  data_files=("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl")),
        LCB_FILE, _livecodebench, scorer=None, from_hub=_lcb_from_hub,
        notes="release_v5 (880 problems: the files test.jsonl to test5.jsonl); pass@1 needs LiveCodeBench's own "
              "harness with its hidden tests: unscored here"),
    "mt_bench": Benchmark("mt_bench", HubSource("HuggingFaceH4/mt_bench_prompts", None, "train"),
                          "mt_bench/question.jsonl", _mt_bench, scorer=None, turns=2, from_hub=_mt_bench_from_hub,
                          notes="two turns; quality needs an LLM judge (FastChat llm_judge): unscored here"),
}

def get_benchmark(name: str) -> Benchmark:
    """Registry lookup. Raises KeyError listing the valid names."""
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark '{name}'; valid: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def benchmark_rows(name: str, root) -> tuple[list[dict], str]:
    """A benchmark's rows (mirror field names) and their origin: the mirror file, else the hub copy."""
    bench = get_benchmark(name)
    return load_rows(root, bench.local_file, bench.hub, f"benchmark {name}", bench.from_hub)


def load_benchmark(name: str, root, num_prompts: int | None = None, seed: int = 0) -> list[BenchmarkPrompt]:
    """Load ``num_prompts`` items of a benchmark through ``datasets.load_dataset`` (mirror, else hub).

    The subset is ``random.Random(seed).shuffle`` of the row order, then the first ``num_prompts``.

    Raises:
        DataUnavailable (a FileNotFoundError): no mirror file and no reachable hub copy (message names the
            file, the hub id, ``dscout fetch-data`` and the ``data_root`` key).
        KeyError / ValueError: for a row with a missing field or a file datasets cannot parse (file, row named).
    """
    bench = get_benchmark(name)
    items = bench.loader(*benchmark_rows(name, root))
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    if num_prompts is not None:
        order = order[:num_prompts]
    return [items[i] for i in order]


def stage_prompts(bench_stage: dict, name: str, root) -> list[BenchmarkPrompt]:
    """The prompts a benchmark job decodes, from its stage's ``benchmarks`` section (``num_prompts``: one count, or
    a count per benchmark, 2 where a benchmark is missing; ``seed``). The bench stage and every reader of its
    records (e.g. :func:`dscout.experiments.drafter_eval.bench_record_sequences`) go through here."""
    n = bench_stage["num_prompts"]
    n = n if isinstance(n, int) else n.get(name, 2)
    return load_benchmark(name, root, n, seed=bench_stage["seed"])


__all__ = ["BENCHMARKS", "Benchmark", "BenchmarkPrompt", "benchmark_rows", "get_benchmark", "load_benchmark",
           "stage_prompts", "MATH_SUFFIX"]
