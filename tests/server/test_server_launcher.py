"""alrkvd-serve without a server: finding tritonserver, the backend dir, command and environment."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from server import serve


def test_finds_tritonserver_in_the_pytriton_wheel(monkeypatch):
    monkeypatch.delenv("TRITONSERVER_HOME", raising=False)
    install = serve.find_tritonserver()
    assert install.binary.name == "tritonserver" and os.access(install.binary, os.X_OK)
    assert (install.backends / "python" / "libtriton_python.so").is_file()
    assert install.stub_for(serve.python_version()) is not None
    assert any(d.name == "nvidia_pytriton.libs" for d in install.lib_dirs)


def test_backend_dir_gets_the_stub_of_the_running_python(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITONSERVER_HOME", raising=False)
    install = serve.find_tritonserver()
    backends = serve.prepare_backend_dir(install, tmp_path)
    stub = backends / "python" / serve.STUB_NAME
    assert stub.read_bytes() == install.stub_for(serve.python_version()).read_bytes()
    assert stub.stat().st_mode & stat.S_IXUSR
    assert (backends / "python" / "libtriton_python.so").is_file()


def _fake_home(tmp_path: Path, with_stub: bool) -> Path:
    home = tmp_path / "tritonserver"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "tritonserver").write_text("#!/bin/sh\n")
    (home / "backends" / "python").mkdir(parents=True)
    (home / "lib").mkdir()
    if with_stub:
        (home / "backends" / "python" / serve.STUB_NAME).write_text("stub")
    return home


def test_tritonserver_home_wins_and_uses_its_own_stub(tmp_path, monkeypatch):
    home = _fake_home(tmp_path, with_stub=True)
    monkeypatch.setenv("TRITONSERVER_HOME", str(home))
    install = serve.find_tritonserver()
    assert install.binary == home / "bin" / "tritonserver"
    assert install.lib_dirs == (home / "lib",)
    assert serve.prepare_backend_dir(install, tmp_path / "work") == home / "backends"


def test_tritonserver_home_without_a_stub_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONSERVER_HOME", str(_fake_home(tmp_path, with_stub=False)))
    with pytest.raises(serve.LaunchError, match="stub"):
        serve.prepare_backend_dir(serve.find_tritonserver(), tmp_path / "work")
    monkeypatch.setenv("TRITONSERVER_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(serve.LaunchError, match="bin/tritonserver"):
        serve.find_tritonserver()


def test_environment_puts_this_python_first(monkeypatch):
    monkeypatch.delenv("TRITONSERVER_HOME", raising=False)
    install = serve.find_tritonserver()
    env = serve.server_env(install, {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/x"})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    libs = env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert libs[-1] == "/x" and str(install.lib_dirs[0]) in libs
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(serve.REPO_ROOT)


def test_command_ports_models_and_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITONSERVER_HOME", raising=False)
    install = serve.find_tritonserver()
    launcher = serve.TritonLauncher(http_port=1, grpc_port=2, metrics_port=3, host="127.0.0.1")
    cmd = launcher.command(install, tmp_path)
    assert "--http-port=1" in cmd and "--grpc-port=2" in cmd and "--metrics-port=3" in cmd
    assert f"--model-repository={serve.DEFAULT_MODEL_REPOSITORY}" in cmd
    assert {"--load-model=smollm2", "--load-model=qwen3moe_dummy"} <= set(cmd)
    assert not any(c.startswith("--model-config-name") for c in cmd)
    assert "--model-load-thread-count=1" in cmd  # models initialize one at a time (serve.py says why)
    gpu = serve.TritonLauncher(models=["smollm2"], gpu=True).command(install, tmp_path)
    assert "--model-config-name=gpu" in gpu and "--load-model=qwen3moe_dummy" not in gpu
    assert launcher.http_url == "127.0.0.1:1" and launcher.metrics_url == "http://127.0.0.1:3/metrics"


def test_defaults_are_tritons_ports():
    args = serve.build_parser().parse_args([])
    assert (args.http_port, args.grpc_port, args.metrics_port) == (8000, 8001, 8002)


def test_every_model_has_a_gpu_config():
    for model in serve.list_models(serve.DEFAULT_MODEL_REPOSITORY):
        gpu = serve.DEFAULT_MODEL_REPOSITORY / model / "configs" / "gpu.pbtxt"
        assert "KIND_GPU" in gpu.read_text(), model


def test_missing_repository_is_reported(tmp_path, capsys):
    assert serve.main(["--model-repository", str(tmp_path / "none")]) == 1
    assert "does not exist" in capsys.readouterr().err
