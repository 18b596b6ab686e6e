"""Task scorers (lm-eval's task definitions and metrics) and benchmark loaders (real mirror files: ../shared/data)."""

import json

import pytest

from dscout.evaluation.scoring import extract_gsm8k_answer, score, score_humaneval, score_math500, score_mbpp
from dscout.data.benchmarks import BENCHMARKS, load_benchmark
from dscout.data.prompts import load_training_prompts
from tests.workflow import DATA


def test_gsm8k_is_lm_evals_flexible_extract_exact_match():
    assert extract_gsm8k_answer("so the total is \\boxed{1,234}.") == "1,234"  # the filter keeps the comma...
    assert score("gsm8k", "so the total is \\boxed{1,234}.", {"target": "6 * 200 + 34 = 1234\n#### 1234"})
    assert extract_gsm8k_answer("First 3 apples, then 5 more: 8 apples.") == "8"  # last number
    assert score("gsm8k", "The answer is \\boxed{72}", {"answer": "72"})
    assert not score("gsm8k", "The answer is \\boxed{71}", {"answer": "72"})
    assert score("gsm8k", "It costs $18 in total.", {"answer": "18"})  # "$" is in the task's regexes_to_ignore
    assert not score("gsm8k", "It costs $18.00 in total.", {"answer": "18"})  # exact match, not numeric
    assert extract_gsm8k_answer("no numbers here") == "[invalid]"


def test_math500_is_minerva_math_verify():
    ref = {"answer": "\\frac{1}{2}", "solution": "Half of it: $\\boxed{\\frac{1}{2}}$."}
    assert score_math500("so \\boxed{\\dfrac{1}{2}}", ref)
    assert score_math500("The answer is \\boxed{0.5}.", ref)  # equivalence, not string match
    assert score_math500("\\boxed{ 3 }", {"answer": "3"})
    assert not score_math500("so \\boxed{2}", ref)


def test_code_scorers_run_the_tests():
    ref = {"prompt": "def add(a, b):\n", "test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"}
    assert score_humaneval("```python\ndef add(a, b):\n    return a + b\n```", ref)
    assert not score_humaneval("```python\ndef add(a, b):\n    return a - b\n```", ref)
    mref = {"tests": ["assert sq(3) == 9"], "imports": []}
    assert score_mbpp("```python\ndef sq(x):\n    return x * x\n```", mref)
    assert not score_mbpp("def sq(x): return x", mref)
    assert score("humaneval", "x", ref) is None  # executing model code is opt-in
    assert score("humaneval", "```python\ndef add(a, b):\n    return a + b\n```", ref, execute_code=True)
    assert not score_mbpp("```python\ndef sq(x):\n    while True: pass\n```", mref, timeout=1.0)  # timeout


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_every_benchmark_loads_real_prompts(name):
    items = load_benchmark(name, DATA, 3, seed=0)
    assert len(items) == 3 and all(i.turns and i.turns[0].strip() for i in items)
    assert load_benchmark(name, DATA, 3, seed=0) == items  # reproducible subset
    if name == "mt_bench":
        assert all(len(i.turns) == 2 for i in items)


def test_gsm8k_reference_answers_score_themselves():
    for it in load_benchmark("gsm8k", DATA, 20):
        assert score("gsm8k", f"... \\boxed{{{it.reference['answer']}}}", it.reference)


def test_bad_row_names_file_and_row(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"test.jsonl, row 2"):
        load_benchmark("gsm8k", tmp_path)
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps({"answer": "#### 1"}) + "\n")
    with pytest.raises(KeyError, match=r"row 1: missing field 'question'"):
        load_benchmark("gsm8k", tmp_path)


def test_training_prompt_mix():
    ps = load_training_prompts(DATA, [{"name": "gsm8k_train", "count": 5}, {"name": "code_alpaca", "count": 3}])
    assert len(ps) == 8 and len({p["id"] for p in ps}) == 8
    with pytest.raises(KeyError, match="valid"):
        load_training_prompts(DATA, [{"name": "nope", "count": 1}])
