"""Task accuracy of benchmark outputs, offline: the benchmarks' standard scorers.

* GSM8K: exact match of the final number (the ``\\boxed{}`` answer the prompt asks for, else the last number in
  the text) against the number after ``####`` in the reference solution, compared numerically (commas and a
  trailing ``.`` stripped), as in the GSM8K paper's scorer and lm-eval's ``flexible-extract`` filter.
* MATH-500: exact match of the normalised ``\\boxed{}`` content against the reference answer (whitespace,
  ``\\left``/``\\right``, ``\\!``, ``$`` and ``\\text{}`` wrappers removed; numbers compared numerically).
* HumanEval / MBPP: pass@1 by running the benchmark's tests on the first python code block in a subprocess with
  a timeout (off unless ``execute_code`` is True: running model-written code is the user's decision).
* LiveCodeBench (no offline test cases) and MT-Bench (needs an LLM judge): not scored (None).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile

_NUM = re.compile(r"-?\d[\d,]*\.?\d*")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (braces balanced), or None."""
    i = text.rfind("\\boxed")
    if i < 0:
        return None
    j = text.find("{", i)
    if j < 0:
        return None
    depth = 0
    for k in range(j, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return text[j + 1:k]
    return None


def _to_number(s: str) -> float | None:
    s = s.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        return float(s)
    except ValueError:
        return None


def extract_gsm8k_answer(text: str) -> str | None:
    """The model's final answer: the boxed content's last number, else the last number in the text."""
    boxed = last_boxed(text)
    source = boxed if boxed is not None else text
    nums = _NUM.findall(source)
    return nums[-1].replace(",", "").rstrip(".") if nums else (boxed.strip() if boxed else None)


def score_gsm8k(text: str, reference: dict) -> bool:
    pred = extract_gsm8k_answer(text)
    if pred is None:
        return False
    a, b = _to_number(pred), _to_number(reference["answer"])
    return a is not None and b is not None and abs(a - b) < 1e-6


def normalize_math(s: str) -> str:
    s = s.strip()
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    for tok in ("\\left", "\\right", "\\!", "\\,", "\\;", "$", " ", "^\\circ", "^{\\circ}"):
        s = s.replace(tok, "")
    s = s.replace("dfrac", "frac").replace("tfrac", "frac")
    return s.rstrip(".")


def score_math(text: str, reference: dict) -> bool:
    pred = last_boxed(text)
    if pred is None:
        return False
    p, r = normalize_math(pred), normalize_math(reference["answer"])
    if p == r:
        return True
    a, b = _to_number(p), _to_number(r)
    return a is not None and b is not None and abs(a - b) < 1e-6


def first_code_block(text: str) -> str:
    m = re.search(r"```(?:python|py)?\n(.*?)```", text, re.S)
    return m.group(1) if m else text


def _run_python(code: str, timeout: float) -> bool:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=True) as f:
        f.write(code)
        f.flush()
        try:
            r = subprocess.run([sys.executable, f.name], capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
    return r.returncode == 0


def score_humaneval(text: str, reference: dict, timeout: float = 10.0) -> bool:
    code = first_code_block(text)
    if f"def {reference['entry_point']}" not in code:
        code = reference["prompt"] + code
    program = code + "\n\n" + reference["test"] + f"\n\ncheck({reference['entry_point']})\n"
    return _run_python(program, timeout)


def score_mbpp(text: str, reference: dict, timeout: float = 10.0) -> bool:
    code = first_code_block(text)
    program = "\n".join(reference.get("imports", [])) + "\n" + code + "\n\n" + "\n".join(reference["tests"]) + "\n"
    return _run_python(program, timeout)


def score(benchmark: str, text: str, reference: dict | None, execute_code: bool = False) -> bool | None:
    """Task accuracy of one output, or None where the benchmark has no offline scorer."""
    if reference is None:
        return None
    if benchmark == "gsm8k":
        return score_gsm8k(text, reference)
    if benchmark == "math500":
        return score_math(text, reference)
    if benchmark == "humaneval" and execute_code:
        return score_humaneval(text, reference)
    if benchmark == "mbpp" and execute_code:
        return score_mbpp(text, reference)
    return None
