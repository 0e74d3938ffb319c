"""benchmarks/bench_attention.py --smoke: the H200 benchmark's code paths on tiny shapes (CPU:
TRITON_INTERPRET=1), so that the script the GPU run uses is checked in CI."""
from kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

import importlib.util  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_attention.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_attention", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_attention_smoke(tmp_path):
    bench = _load_bench()
    out = tmp_path / "bench.json"
    assert bench.main(["--smoke", "--no-tune", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    methods = {row["method"] for row in result["rows"]}
    assert {"sdpa", "paged-fp16", "alrkvd-mixed", "alrkvd-r16", "kivi4"} <= methods
    assert all("error" not in row and row.get("check_ok", True) for row in result["rows"])
    assert result["meta"]["copy_GBps"] > 0 and result["meta"]["torch"] and result["meta"]["triton"]


def test_bench_attention_tuning_smoke(tmp_path):
    # --tune replaces each kernel's default launch with every config of TUNE_SPACE in turn: each must launch
    bench = _load_bench()
    out = tmp_path / "bench.json"
    assert bench.main(["--smoke", "--tune", "--out", str(out)]) == 0
    tuning = json.loads(out.read_text())["meta"]["tuning"]
    assert set(tuning) == set(bench.TUNE_SPACE)
    for kernel, report in tuning.items():
        assert len(report["results"]) == len(bench.TUNE_SPACE[kernel])
        assert all("us" in r for r in report["results"]), [r for r in report["results"] if "us" not in r]


def test_bench_attention_compare_smoke(tmp_path):
    # --compare-with: a second copy of the ALR-KVD kernel module, loaded from a file (here this tree's own), timed
    # against this tree's on the same rows; the same kernel, so their outputs agree exactly
    bench = _load_bench()
    out = tmp_path / "bench.json"
    kernel_file = SCRIPT.parents[1] / "kernels" / "alrkvd_attention.py"
    assert bench.main(["--smoke", "--compare-with", str(kernel_file), "--variants", "alrkvd-rot-r16",
                       "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["meta"]["compare_with"] == str(kernel_file) and "tuning" not in result["meta"]
    row = next(r for r in result["rows"] if r["method"] == "alrkvd-rot-r16")
    assert row["check_ok"] and row["before_us"] > 0 and row["after_us"] == row["us"] > 0
    # (the ratio of the unscaled times: microseconds divided may differ in the last bit)
    assert row["ratio"] == pytest.approx(row["after_us"] / row["before_us"], rel=1e-12)
    assert row["max_diff_vs_before"] == 0
