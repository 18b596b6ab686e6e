"""The prepared GPU check script runs end to end (tiny shape, CPU) so it cannot rot before a GPU is lent."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_script_runs_on_cpu_with_tiny_shape(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.main(["--shape", "tiny", "--device", "cpu", "--dtype", "float64", "--prompts", "1",
                  "--prompt-len", "12", "--new-tokens", "16", "--block-sizes", "4,8", "--out", str(tmp_path)])
    assert r["mismatches"] == 0  # float64: no near-ties, so speculative output equals AR exactly
    assert set(r["methods"]) == {"ar", "dflash-bs4", "replay-bs4", "dflash-bs8", "replay-bs8"}
    assert r["methods"]["replay-bs8"]["tau"] > r["methods"]["dflash-bs8"]["tau"]  # replay accepts long runs
    assert (tmp_path / "gpu_check.json").exists()
