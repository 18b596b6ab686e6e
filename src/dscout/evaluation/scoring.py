"""Task accuracy of benchmark outputs through lm-eval's own task definitions and metric code (lm-eval 0.4.13).

* GSM8K: the ``gsm8k`` task's ``flexible-extract`` filter (its regex, last match) then its ``exact_match`` metric
  with the task's ``regexes_to_ignore`` against the reference solution (``... #### 72``), both read from lm-eval's
  ``tasks/gsm8k/gsm8k.yaml`` and built with lm-eval's filter and metric registries.
* MATH-500: the ``minerva_math500`` task's ``process_results`` (lm-eval's ``tasks/minerva_math/utils.py``); we
  report its ``math_verify`` metric (math-verify's equivalence of the output against the reference solution), the
  one that reads a ``\\boxed{}`` answer as our prompt asks for it.
* HumanEval / MBPP: pass@1 by executing the program the ``humaneval_instruct`` / ``mbpp_instruct`` tasks build
  (the first python code block of the answer, HumanEval's prompt prepended when the answer omits the signature;
  then the task's tests: ``test`` + ``check(entry_point)``, or MBPP's ``test_list``), each in its own Python
  subprocess with a timeout. As in lm-eval, running model-written code is opt-in (its ``unsafe_code`` tasks need
  ``--confirm_run_unsafe_code``; here the config key ``benchmarks.confirm_run_unsafe_code``). lm-eval itself
  executes through the hub metric ``evaluate.load("code_eval")``, which needs the hub at import, so the
  execution step is ours.
* LiveCodeBench (needs its own harness and hidden test cases) and MT-Bench (needs an LLM judge): None.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from functools import lru_cache

CODE_TIMEOUT_SECONDS = 10.0


def _lm_eval_task_yaml(relative: str) -> dict:
    import lm_eval
    from lm_eval.tasks._yaml_loader import load_yaml

    return load_yaml(os.path.join(os.path.dirname(lm_eval.__file__), "tasks", relative), resolve_func=False)


@lru_cache(maxsize=None)
def _gsm8k_scorer():
    """(filter pipeline, metric, metric kwargs) of lm-eval's gsm8k task, ``flexible-extract``."""
    from lm_eval.api.registry import get_metric
    from lm_eval.filters import build_filter_ensemble

    cfg = _lm_eval_task_yaml("gsm8k/gsm8k.yaml")
    spec = next(f for f in cfg["filter_list"] if f["name"] == "flexible-extract")
    ensemble = build_filter_ensemble(spec["name"], [(c["function"], {k: v for k, v in c.items() if k != "function"})
                                                    for c in spec["filter"]])
    metric = next(m for m in cfg["metric_list"] if m["metric"] == "exact_match")
    kwargs = {k: v for k, v in metric.items() if k not in ("metric", "aggregation", "higher_is_better")}
    return [make() for make in ensemble.filters], get_metric("exact_match"), kwargs


def extract_gsm8k_answer(text: str) -> str:
    """The answer lm-eval's gsm8k ``flexible-extract`` filter takes from a response (``[invalid]`` if none)."""
    filters, _, _ = _gsm8k_scorer()
    out = [[text]]
    for f in filters:
        out = f.apply(out, [{}])
    return list(out)[0]


def score_gsm8k(text: str, reference: dict) -> bool:
    """lm-eval gsm8k exact match (flexible-extract) of a response against the reference solution.

    Args:
        reference: ``{"target": "<solution> #### 72"}`` (the dataset's answer field) or ``{"answer": "72"}``.
    """
    _, metric, kwargs = _gsm8k_scorer()
    target = reference.get("target") or f"#### {reference['answer']}"
    return bool(metric(references=[target], predictions=[extract_gsm8k_answer(text)], **kwargs)["exact_match"])


def score_math500(text: str, reference: dict) -> bool:
    """lm-eval minerva_math500's ``math_verify`` metric: is the response's answer equivalent to the solution's?

    Args:
        reference: ``{"answer": ..., "solution": ...}`` (MATH-500 fields); the solution falls back to
            ``\\boxed{answer}`` when absent.
    """
    from lm_eval.tasks.minerva_math.utils import process_results

    doc = {"answer": reference["answer"], "solution": reference.get("solution") or f"\\boxed{{{reference['answer']}}}"}
    return bool(process_results(doc, [text])["math_verify"])


def first_code_block(text: str) -> str:
    """The first fenced python block of a response (the whole text if it has none)."""
    m = re.search(r"```(?:python|py)?\n(.*?)```", text, re.S)
    return m.group(1) if m else text


def run_python(program: str, timeout: float = CODE_TIMEOUT_SECONDS) -> bool:
    """Run a program in a fresh Python subprocess; True iff it exits 0 within ``timeout`` seconds."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "program.py")
        with open(path, "w") as f:
            f.write(program)
        try:
            r = subprocess.run([sys.executable, path], capture_output=True, timeout=timeout, cwd=d)
        except subprocess.TimeoutExpired:
            return False
    return r.returncode == 0


def humaneval_program(text: str, reference: dict) -> str:
    """The candidate program plus HumanEval's tests (``test`` + ``check(entry_point)``, the task's target)."""
    code = first_code_block(text)
    if f"def {reference['entry_point']}" not in code:
        code = reference["prompt"] + code
    return code + "\n\n" + reference["test"] + f"\n\ncheck({reference['entry_point']})\n"


def mbpp_program(text: str, reference: dict) -> str:
    """The candidate program plus MBPP's ``test_imports`` and ``test_list`` assertions."""
    return ("\n".join(reference.get("imports", [])) + "\n" + first_code_block(text) + "\n\n"
            + "\n".join(reference["tests"]) + "\n")


def score_humaneval(text: str, reference: dict, timeout: float = CODE_TIMEOUT_SECONDS) -> bool:
    return run_python(humaneval_program(text, reference), timeout)


def score_mbpp(text: str, reference: dict, timeout: float = CODE_TIMEOUT_SECONDS) -> bool:
    return run_python(mbpp_program(text, reference), timeout)


SCORERS = {"gsm8k": score_gsm8k, "math500": score_math500, "humaneval": score_humaneval, "mbpp": score_mbpp}
EXECUTES_CODE = {"humaneval", "mbpp"}


def score(benchmark: str, text: str, reference: dict | None, execute_code: bool = False) -> bool | None:
    """Task accuracy of one output (True/False), or None: no scorer, or code execution not confirmed."""
    if reference is None or benchmark not in SCORERS or (benchmark in EXECUTES_CODE and not execute_code):
        return None
    return SCORERS[benchmark](text, reference)


__all__ = ["SCORERS", "extract_gsm8k_answer", "first_code_block", "humaneval_program", "mbpp_program",
           "run_python", "score", "score_gsm8k", "score_humaneval", "score_math500", "score_mbpp"]
