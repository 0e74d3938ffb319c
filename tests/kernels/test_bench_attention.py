"""benchmarks/bench_attention.py --smoke: the H200 benchmark's code paths on tiny shapes (CPU:
TRITON_INTERPRET=1), so that the script the GPU run uses is checked in CI."""
from kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

import importlib.util  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

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
