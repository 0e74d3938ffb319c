"""docker-compose.yml parses, and every path and command it names exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKDIR = "/opt/alrkvd"


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services():
    services = compose()["services"]
    assert {"triton", "locust-master", "locust-worker"} <= set(services)
    triton = services["triton"]
    assert triton["shm_size"]
    assert "healthcheck" in triton and "/v2/health/ready" in " ".join(triton["healthcheck"]["test"])
    devices = triton["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert services["locust-master"]["depends_on"]["triton"]["condition"] == "service_healthy"
    # alrkvd-serve binds to the loopback by default: the container asks for every interface on purpose
    from server.serve import build_parser

    assert build_parser().parse_args(triton["command"][1:]).host == "0.0.0.0"
    assert triton["restart"] == "on-failure"  # alrkvd-serve exits 1 when a model can no longer serve
    assert services["locust-worker"]["deploy"]["replicas"] >= 1


def test_build_context_dockerfile_and_copies_exist():
    build = compose()["services"]["triton"]["build"]
    context = ROOT / build["context"]
    dockerfile = context / build["dockerfile"]
    assert dockerfile.is_file()
    text = dockerfile.read_text()
    assert re.search(r"^ARG TRITON_IMAGE=nvcr\.io/nvidia/tritonserver:", text, re.M)
    for src in re.findall(r"^COPY\s+(.+?)\s+\S+$", text, re.M):
        for path in src.split():
            assert (context / path).exists(), f"Dockerfile copies missing {path}"
    assert "numpy" in (context / "requirements.txt").read_text()


def test_volumes_exist():
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            if host.startswith((".", "/")):
                path = ROOT / host
                assert path.exists() or host == "./reports", f"{name}: {host} does not exist"


def _in_image(path: str) -> Path:
    """A path inside the image (relative to the working dir or under /opt/alrkvd) in the repo."""
    return ROOT / (path[len(WORKDIR) + 1:] if path.startswith(WORKDIR + "/") else path)


def test_commands_name_existing_files_and_entry_points():
    pyproject = (ROOT / "pyproject.toml").read_text()
    for name, service in compose()["services"].items():
        cmd = service["command"]
        cmd = shlex.split(cmd) if isinstance(cmd, str) else cmd
        program = cmd[0]
        if program.startswith("alrkvd-"):
            assert re.search(rf"^{program}\s*=", pyproject, re.M), f"{name}: no console script {program}"
            if program == "alrkvd-serve":
                from server.serve import build_parser

                args = build_parser().parse_args(cmd[1:])
                assert _in_image(str(args.model_repository)).is_dir()
        else:
            assert program == "locust", f"{name}: unexpected program {program}"
            assert _in_image(cmd[cmd.index("-f") + 1]).is_file()
    docker_cmd = re.search(r"^CMD\s+(\[.*\])$", (ROOT / "Dockerfile").read_text(), re.M).group(1)
    assert yaml.safe_load(docker_cmd)[0] == "alrkvd-serve"
