"""The benchmark runner's side-by-side order: every method, AR included, takes every position in turn."""

from dscout.data.benchmarks import BenchmarkPrompt
from dscout.decoding.engine import SpeculativeEngine
from dscout.decoding.proposers import BlockDiffusionProposer
from dscout.evaluation import runner
from dscout.evaluation.runner import Method, run_benchmark

from .conftest import tiny_drafter


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


class _Logged(SpeculativeEngine):
    calls: list = []

    def __init__(self, name, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.name = name

    def generate(self, *args, **kwargs):
        _Logged.calls.append(self.name)
        return super().generate(*args, **kwargs)


def test_the_method_order_rotates_through_ar_and_greedy_matches_are_judged_after_the_turn(target, monkeypatch):
    """A method always run first meets the machine fresher (the CPU default's AR was always first in Table 3);
    with AR rotating, a method that runs before AR on a prompt still has its greedy output checked against it."""
    monkeypatch.setattr(runner, "chat_prompt_ids", lambda tok, msgs, *a: [3 + len(m["content"]) for m in msgs])
    monkeypatch.setattr(target, "tokenizer", _Tok(), raising=False)
    d = tiny_drafter(target, layers=2, block_size=8)
    methods = [Method("ar", "ar", "AR", _Logged("ar", target, None, [0])),
               Method("x4", "dscout", "X(4)", _Logged("x4", target, BlockDiffusionProposer(d), [0]), 4, "d"),
               Method("x8", "dscout", "X(8)", _Logged("x8", target, BlockDiffusionProposer(d), [0]), 8, "d")]
    prompts = [BenchmarkPrompt("t", f"p{i}", ["a" * (i + 1)], None) for i in range(3)]
    _Logged.calls = []
    recs = run_benchmark(target, methods, prompts, benchmark="t", max_new_tokens=12, temperature=0.0, repeat=0,
                         chat={}, near_tie_epsilon=1e-3, score_outputs=False, warmup=False)
    order = [_Logged.calls[i:i + 3] for i in range(0, 9, 3)]
    assert [o.index("ar") for o in order] == [0, 2, 1]  # AR first, last, in the middle
    assert all(sorted(o) == ["ar", "x4", "x8"] for o in order)
    for key in ("x4", "x8"):
        assert [r["matches_ar"] for r in recs[key]] == [True] * 3
        assert [r["output_ids"] for r in recs[key]] == [r["output_ids"] for r in recs["ar"]]
    # a wrong output is caught also where its method ran before AR (prompt p1: x8 ran before AR)
    methods[2] = Method("x8", "dscout", "X(8)", _Wrong("x8", target, BlockDiffusionProposer(d), [0]), 8, "d")
    _Logged.calls = []
    recs = run_benchmark(target, methods, prompts, benchmark="t", max_new_tokens=12, temperature=0.0, repeat=0,
                         chat={}, near_tie_epsilon=1e-3, score_outputs=False, warmup=False)
    assert _Logged.calls[3:6].index("x8") < _Logged.calls[3:6].index("ar")
    assert [r["matches_ar"] for r in recs["x8"]] == [False] * 3
    assert all(r["first_mismatch"] == 11 and r["near_tie"] is False for r in recs["x8"])
    assert [r["matches_ar"] for r in recs["x4"]] == [True] * 3
    _Logged.calls = []  # the next repeat starts one position further on (one-prompt benchmarks rotate too)
    run_benchmark(target, methods, prompts[:1], benchmark="t", max_new_tokens=4, temperature=0.0, repeat=1, chat={},
                  near_tie_epsilon=1e-3, score_outputs=False, warmup=False)
    assert _Logged.calls == ["x4", "x8", "ar"]


class _Wrong(_Logged):
    """Returns its output with the last token changed (a lossless engine must never do this)."""

    def generate(self, *args, **kwargs):
        r = super().generate(*args, **kwargs)
        r.output_ids[-1] = (r.output_ids[-1] + 1) % 64 or 1
        return r


def test_a_benchmark_job_clears_only_the_repeat_folders_beyond_the_configured_repeats(tmp_path):
    """A rerun with fewer repeats must not leave the earlier run's r7/, r8/ beside its records (found when a
    9-repeat run's last two repeats were read into a 7-repeat report); the configured repeats' folders are other
    jobs' finished outputs (one job per repeat, issue 47) and stay."""
    from dscout.evaluation.runner import clear_repeat_dirs

    for rel in ("r0/ar.jsonl", "r1/ar.jsonl", "r7/ar.jsonl", "r12/ar.jsonl", "rare/keep.txt",
                "latency-dscout-online.json", "config.resolved.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}\n")
    removed = clear_repeat_dirs(tmp_path, repeats=2)
    assert sorted(p.name for p in removed) == ["r12", "r7"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.resolved.json", "latency-dscout-online.json",
                                                          "r0", "r1", "rare"]
    assert (tmp_path / "r0/ar.jsonl").read_text() == "{}\n"
    assert sorted(p.name for p in clear_repeat_dirs(tmp_path)) == ["r0", "r1"]  # repeats=None: all of them


def test_a_repeat_is_complete_only_with_every_methods_parseable_records(tmp_path):
    from dscout.evaluation.runner import repeat_complete

    r0 = tmp_path / "r0"
    r0.mkdir()
    (r0 / "ar.jsonl").write_text('{"repeat": 0, "new_tokens": 3}\n')
    assert repeat_complete(r0, ["ar"]) and not repeat_complete(r0, ["ar", "dscout-bs16"])
    (r0 / "dscout-bs16.jsonl").write_text('{"repeat": 0, "new_t')  # cut off mid-line
    assert not repeat_complete(r0, ["ar", "dscout-bs16"])
    (r0 / "dscout-bs16.jsonl").write_text("")
    assert not repeat_complete(r0, ["ar", "dscout-bs16"])
    assert not repeat_complete(tmp_path / "r1", ["ar"])