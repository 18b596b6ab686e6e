"""Benchmark registry: name -> hub id, local file, prompt template, turns and scorer.

Prompt templates follow the DFlash benchmark harness (dflash-reference §4.3), written in our words where the
upstream text is free prose. Subsets are drawn reproducibly: ``random.Random(seed).shuffle`` over the file's
rows, then the first ``n`` (z-lab/dflash ``benchmark.py`` style; recorded as ``selection`` in every record).
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .paths import data_file

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


@dataclass(frozen=True)
class Benchmark:
    name: str
    hub_id: str
    local_file: str
    loader: Callable[[Path], list[BenchmarkPrompt]]
    scorer: str | None = None
    turns: int = 1
    notes: str = ""


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, row {i}: not valid JSON ({err.msg})") from err
    return rows


def _json_array(path: Path) -> list[dict]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from err


def _field(path: Path, row: int, rec: dict, name: str):
    if name not in rec:
        raise KeyError(f"{path}, row {row}: missing field '{name}'")
    return rec[name]


def _gsm8k(path: Path) -> list[BenchmarkPrompt]:
    out = []
    for i, r in enumerate(_jsonl(path), 1):
        answer = str(_field(path, i, r, "answer")).split("####")[-1].strip().replace(",", "")
        out.append(BenchmarkPrompt("gsm8k", f"gsm8k-{i - 1}", (_field(path, i, r, "question") + MATH_SUFFIX,),
                                   {"answer": answer}))
    return out


def _math500(path: Path) -> list[BenchmarkPrompt]:
    out = []
    for i, r in enumerate(_jsonl(path), 1):
        out.append(BenchmarkPrompt("math500", str(r.get("unique_id", i - 1)),
                                   (_field(path, i, r, "problem") + MATH_SUFFIX,),
                                   {"answer": str(_field(path, i, r, "answer"))}))
    return out


def _humaneval(path: Path) -> list[BenchmarkPrompt]:
    out = []
    for i, r in enumerate(_jsonl(path), 1):
        prompt = _field(path, i, r, "prompt")
        text = ("Write a solution to the following problem and make sure that it passes the tests:\n"
                f"```python\n{prompt}\n```")
        out.append(BenchmarkPrompt("humaneval", _field(path, i, r, "task_id"), (text,),
                                   {"prompt": prompt, "test": r.get("test", ""),
                                    "entry_point": r.get("entry_point", "")}))
    return out


def _mbpp(path: Path) -> list[BenchmarkPrompt]:
    rows = _json_array(path)
    out = []
    for i, r in enumerate(rows, 1):
        tid = int(_field(path, i, r, "task_id"))
        if not 11 <= tid <= 510:  # the sanitized test split DFlash loads
            continue
        out.append(BenchmarkPrompt("mbpp", f"mbpp-{tid}", (_field(path, i, r, "prompt"),),
                                   {"tests": r.get("test_list", []), "imports": r.get("test_imports", [])}))
    return out


def _livecodebench(path: Path) -> list[BenchmarkPrompt]:
    rows = _json_array(path)
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


def _mt_bench(path: Path) -> list[BenchmarkPrompt]:
    out = []
    for i, r in enumerate(_jsonl(path), 1):
        turns = tuple(_field(path, i, r, "turns"))
        out.append(BenchmarkPrompt("mt_bench", f"mt-{r.get('question_id', i)}", turns,
                                   {"category": r.get("category")}))
    return out


BENCHMARKS: dict[str, Benchmark] = {
    "gsm8k": Benchmark("gsm8k", "openai/gsm8k:main/test", "gsm8k/test.jsonl", _gsm8k, scorer="gsm8k"),
    "math500": Benchmark("math500", "HuggingFaceH4/MATH-500:test", "math500/test.jsonl", _math500,
                         scorer="math"),
    "humaneval": Benchmark("humaneval", "openai/openai_humaneval:test", "humaneval/HumanEval.jsonl.gz",
                           _humaneval, scorer="humaneval"),
    "mbpp": Benchmark("mbpp", "google-research-datasets/mbpp:sanitized/test", "mbpp/sanitized-mbpp.json",
                      _mbpp, scorer="mbpp"),
    "livecodebench": Benchmark(
        "livecodebench", "livecodebench/code_generation_lite:release_v5",
        "livecodebench/codegen_release_v5_880problems_from_submissions_O1-Mini-2024-09-12_N1.json",
        _livecodebench, scorer=None, notes="release_v5 (880 problems); no test cases offline, so no pass@1"),
    "mt_bench": Benchmark("mt_bench", "HuggingFaceH4/mt_bench_prompts:train", "mt_bench/question.jsonl",
                          _mt_bench, scorer=None, turns=2, notes="two turns; scoring needs an LLM judge"),
}


def get_benchmark(name: str) -> Benchmark:
    """Registry lookup. Raises KeyError listing the valid names."""
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark '{name}'; valid: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def load_benchmark(name: str, root, num_prompts: int | None = None, seed: int = 0) -> list[BenchmarkPrompt]:
    """Load ``num_prompts`` items of a benchmark from the local data folder.

    The subset is ``random.Random(seed).shuffle`` of the file order, then the first ``num_prompts``.

    Raises:
        FileNotFoundError: if the local file is missing (message names the file and the config key).
        KeyError / ValueError: for a row with a missing field or invalid JSON (file and row named).
    """
    bench = get_benchmark(name)
    items = bench.loader(data_file(root, bench.local_file))
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    if num_prompts is not None:
        order = order[:num_prompts]
    return [items[i] for i in order]


__all__ = ["BENCHMARKS", "Benchmark", "BenchmarkPrompt", "get_benchmark", "load_benchmark", "MATH_SUFFIX"]
