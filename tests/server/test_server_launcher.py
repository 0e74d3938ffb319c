"""alrkvd-serve without a server: finding tritonserver, the backend dir, command and environment, its safe
defaults, the drain file and what its stub watchdog looks at."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import time
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
    assert not any(c.startswith("--model-config-name") for c in cmd)
    assert "--model-load-thread-count=1" in cmd  # models initialize one at a time (serve.py says why)
    gpu = serve.TritonLauncher(models=["smollm2"], gpu=True).command(install, tmp_path, tmp_path / "view")
    assert "--model-config-name=gpu" in gpu and f"--model-repository={tmp_path / 'view'}" in gpu
    assert launcher.http_url == "127.0.0.1:1" and launcher.metrics_url == "http://127.0.0.1:3/metrics"


def test_safe_defaults_loopback_no_model_control_admin_apis_closed(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITONSERVER_HOME", raising=False)
    monkeypatch.delenv("ALRKVD_ADMIN_KEY", raising=False)
    args = serve.build_parser().parse_args([])
    assert args.host == serve.DEFAULT_HOST == "127.0.0.1" and args.admin_key is None
    launcher = serve.TritonLauncher()
    cmd = launcher.command(serve.find_tritonserver(), tmp_path)
    for endpoint in ("http", "grpc", "metrics"):
        assert f"--{endpoint}-address=127.0.0.1" in cmd
    assert "--model-control-mode=none" in cmd and not any(c.startswith("--load-model") for c in cmd)
    apis = "model-repository,shared-memory,logging,trace"
    assert f"--http-restricted-api={apis}:alrkvd-admin-key={launcher.admin_key}" in cmd
    assert f"--grpc-restricted-protocol={apis}:alrkvd-admin-key={launcher.admin_key}" in cmd
    assert len(launcher.admin_key) >= 32 and serve.TritonLauncher().admin_key != launcher.admin_key
    assert serve.build_parser().parse_args(["--host", "0.0.0.0"]).host == "0.0.0.0"


def test_models_are_chosen_through_a_repository_of_links(tmp_path):
    view = serve.repository_view(serve.DEFAULT_MODEL_REPOSITORY, ["smollm2"], tmp_path)
    assert serve.list_models(view) == ["smollm2"]
    assert (view / "smollm2").resolve() == (serve.DEFAULT_MODEL_REPOSITORY / "smollm2").resolve()
    with pytest.raises(serve.LaunchError, match="nope"):
        serve.repository_view(serve.DEFAULT_MODEL_REPOSITORY, ["nope"], tmp_path / "other")


def test_a_stop_is_announced_in_the_drain_file(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITONSERVER_HOME", raising=False)
    launcher = serve.TritonLauncher(exit_timeout_s=30)
    launcher._workdir = tempfile.TemporaryDirectory(dir=tmp_path)
    env = serve.server_env(serve.find_tritonserver(), {"PATH": "/usr/bin"}, drain_file=launcher.drain_file)
    assert env[serve.DRAIN_FILE_ENV] == str(launcher.drain_file) and not launcher.drain_file.exists()
    launcher.announce_drain()
    assert float(launcher.drain_file.read_text()) == 30 - serve.DRAIN_MARGIN_S
    launcher._workdir.cleanup()


def test_python_stubs_are_the_servers_children_named_so(tmp_path):
    """What the launcher's watchdog looks at: here this process stands in for tritonserver."""
    # argv as Triton gives a stub: [stub, model.py, shm region, size, growth, parent, backend dir, ipc, instance]
    argv = [str(tmp_path / serve.STUB_NAME), "-c", "import time; time.sleep(30)", *"abcde", "smollm2_0_0"]
    child = subprocess.Popen(argv, executable=sys.executable)
    other = subprocess.Popen(["sleep", "30"])
    try:  # the watchdog polls; on a loaded machine the child's /proc entry may lag its start (seen once in CI's suite)
        deadline = time.monotonic() + 10
        while serve.python_stubs(os.getpid()) != {child.pid: "smollm2_0_0"} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert serve.python_stubs(os.getpid()) == {child.pid: "smollm2_0_0"}
    finally:
        for p in (child, other):
            p.kill()
            p.wait()
    assert serve.python_stubs(os.getpid()) == {}


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
