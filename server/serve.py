"""alrkvd-serve: run a real `tritonserver` on our model repository and block until stopped.

Finds `tritonserver` in `$TRITONSERVER_HOME` (NVIDIA's image: /opt/tritonserver) or in the
`nvidia-pytriton` wheel, lays out a private backend directory holding the Python-backend stub
built for the running Python, sets the library path, starts the server, waits until every model
is ready, prints the URLs, and stops the server cleanly on SIGINT/SIGTERM.

    alrkvd-serve                                # 127.0.0.1: HTTP 8000, gRPC 8001, metrics 8002
    alrkvd-serve --host 0.0.0.0                 # every interface (a container: docker-compose.yml)
    alrkvd-serve --gpu                          # models' configs/gpu.pbtxt (KIND_GPU)
    alrkvd-serve --models smollm2 --http-port 9000

Safe defaults: the endpoints bind to the loopback unless told otherwise; model control is off
(`--model-control-mode=none`: no client can load, unload or rewrite a model; `--models` serves a
repository of links to the chosen models); the model-repository, shared-memory, logging and trace APIs
need a header `alrkvd-admin-key` whose value is random unless `--admin-key` names one.

Stopping (SIGINT/SIGTERM): the launcher first writes the drain file ($ALRKVD_DRAIN_FILE, which the models
watch): they refuse new requests and give running ones `exit_timeout - DRAIN_MARGIN_S` seconds before
ending them with an error; then it stops tritonserver. A model's stub process that dies while the server
still reports ready (Triton 2.51 neither restarts the stub of a decoupled model nor marks it not ready)
makes the launcher stop the server and exit 1, for whatever supervises it to restart it.

Importing this module is cheap (standard library only): tests and the load tests use
`find_tritonserver`, `wait_until_ready` and `TritonLauncher` directly.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL_REPOSITORY = REPO_ROOT / "model_repository"
DEFAULT_HTTP_PORT, DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT = 8000, 8001, 8002
DEFAULT_OPENAI_PORT = 9000
STUB_NAME = "triton_python_backend_stub"
DEFAULT_HOST = "127.0.0.1"
# Triton APIs that read or change the server rather than serve a model: behind the admin key.
ADMIN_APIS = ("model-repository", "shared-memory", "logging", "trace")
ADMIN_HEADER = "alrkvd-admin-key"
DRAIN_FILE_ENV = "ALRKVD_DRAIN_FILE"
# Seconds of the exit timeout kept for what follows the drain: the models' finalize and the server's exit.
DRAIN_MARGIN_S = 10


class LaunchError(RuntimeError):
    """The server could not be found, started, or did not become ready."""


# ----------------------------------------------------------------------------------------------
# Finding the server
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TritonInstall:
    """Where one `tritonserver` installation keeps its pieces."""

    binary: Path  # bin/tritonserver
    backends: Path  # holds python/ (libtriton_python.so, triton_python_backend_utils.py)
    lib_dirs: tuple[Path, ...]  # go on LD_LIBRARY_PATH
    stubs: Path | None  # python_backend_stubs/3.X/ (the wheel ships one stub per Python)

    def stub_for(self, version: str) -> Path | None:
        if self.stubs is None:
            return None
        stub = self.stubs / version / STUB_NAME
        return stub if stub.is_file() else None


def _install_from_home(home: Path) -> TritonInstall:
    binary = home / "bin" / "tritonserver"
    if not binary.is_file():
        raise LaunchError(f"$TRITONSERVER_HOME={home} has no bin/tritonserver")
    stubs = home / "python_backend_stubs"
    return TritonInstall(
        binary=binary,
        backends=home / "backends",
        lib_dirs=tuple(d for d in (home / "lib",) if d.is_dir()),
        stubs=stubs if stubs.is_dir() else None,
    )


def _install_from_pytriton() -> TritonInstall | None:
    # find_spec, not import: `import pytriton` pulls in numpy and friends.
    from importlib.util import find_spec

    spec = find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg = Path(next(iter(spec.submodule_search_locations)))
    home = pkg / "tritonserver"
    if not (home / "bin" / "tritonserver").is_file():
        return None
    libs = [d for d in (pkg.parent / "nvidia_pytriton.libs", home / "external_libs") if d.is_dir()]
    return TritonInstall(
        binary=home / "bin" / "tritonserver",
        backends=home / "backends",
        lib_dirs=tuple(libs),
        stubs=home / "python_backend_stubs",
    )


def find_tritonserver() -> TritonInstall:
    """`$TRITONSERVER_HOME` first, then the `nvidia-pytriton` wheel of the running Python."""
    home = os.environ.get("TRITONSERVER_HOME")
    if home:
        return _install_from_home(Path(home))
    install = _install_from_pytriton()
    if install is None:
        raise LaunchError(
            "tritonserver not found: set $TRITONSERVER_HOME or `pip install nvidia-pytriton==0.7.0` "
            "(`make setup` does)"
        )
    return install


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def prepare_backend_dir(install: TritonInstall, workdir: Path) -> Path:
    """A backend directory whose python/ holds the stub matching the running Python.

    The wheel's own backends/python/ has no stub (pytriton copies one in at run time); we copy
    the backend (1.5 MB) into `workdir` rather than write into the installed package, so several
    servers from different Pythons or checkouts never race on it.
    """
    stub = install.stub_for(python_version())
    if stub is None:
        if (install.backends / "python" / STUB_NAME).is_file():
            return install.backends  # a complete install (NVIDIA's image)
        raise LaunchError(
            f"no Python-backend stub for Python {python_version()} in {install.stubs}; "
            "run the launcher with a Python the wheel ships a stub for (3.8-3.13)"
        )
    backends = workdir / "backends"
    shutil.copytree(install.backends / "python", backends / "python", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(stub, backends / "python" / STUB_NAME)
    return backends


def server_env(install: TritonInstall, base: dict[str, str] | None = None,
               drain_file: Path | None = None) -> dict[str, str]:
    """Environment for tritonserver and the stubs it forks.

    The stub runs the `python3` first on PATH, so the running interpreter's bin goes first; the
    repository root goes on PYTHONPATH so model.py can `import backend.engine`; `drain_file` is
    where the launcher announces a stop to the models ($ALRKVD_DRAIN_FILE).
    """
    env = dict(os.environ if base is None else base)
    if drain_file is not None:
        env[DRAIN_FILE_ENV] = str(drain_file)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    libs = [str(d) for d in install.lib_dirs]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def list_models(model_repository: Path) -> list[str]:
    return sorted(p.name for p in model_repository.iterdir() if (p / "config.pbtxt").is_file())


def repository_view(model_repository: Path, models: list[str], workdir: Path) -> Path:
    """A repository under `workdir` holding links to `models` only: with model control off Triton serves
    every model of its repository, so this is how `--models` chooses."""
    view = workdir / "models"
    view.mkdir(parents=True, exist_ok=True)
    for model in models:
        source = model_repository / model
        if not (source / "config.pbtxt").is_file():
            raise LaunchError(f"model {model!r} is not in {model_repository}")
        (view / model).symlink_to(source.resolve(), target_is_directory=True)
    return view


def python_stubs(server_pid: int) -> dict[int, str]:
    """pid -> model instance name (e.g. smollm2_0_0) of the Python-backend stubs `server_pid` runs."""
    stubs = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
            if ppid != server_pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if Path(argv[0]).name == STUB_NAME:
            stubs[int(entry)] = argv[8] if len(argv) > 8 else "?"  # the stub's arguments: ..., ipc handle, instance
    return stubs


# ----------------------------------------------------------------------------------------------
# Readiness
# ----------------------------------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on the loopback (bound together, so they differ), for a server of one's own."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_until_ready(http_url: str, models: list[str], timeout: float,
                     process: subprocess.Popen | None = None, health_path: str = "/v2/health/ready") -> None:
    """Poll `health_path` and each `/v2/models/<m>/ready` until all answer 200.

    `http_url` is "host:port". Raises LaunchError when the process exits first or on timeout.
    """
    deadline = time.monotonic() + timeout
    pending = [f"http://{http_url}{health_path}"] + [
        f"http://{http_url}/v2/models/{m}/ready" for m in models]
    while pending:
        if process is not None and process.poll() is not None:
            raise LaunchError(f"tritonserver exited with code {process.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise LaunchError(f"not ready after {timeout:.0f} s: {pending[0]}")
        if _http_ok(pending[0]):
            pending.pop(0)
        else:
            time.sleep(0.25)


# ----------------------------------------------------------------------------------------------
# The launcher
# ----------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """preexec_fn: the server gets SIGTERM if the launcher dies without stopping it (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _reap_group(pgid: int, grace_s: float = 5.0) -> None:
    """Python-backend stubs still alive after tritonserver exited: give them a moment, then kill.

    They share the server's process group (the server leads a session of its own).
    """
    deadline = time.monotonic() + grace_s
    while True:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        if time.monotonic() > deadline:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        time.sleep(0.1)


@dataclass
class TritonLauncher:
    """One tritonserver process on one model repository."""

    model_repository: Path = DEFAULT_MODEL_REPOSITORY
    models: list[str] | None = None  # None: every model in the repository
    host: str = DEFAULT_HOST
    http_port: int = DEFAULT_HTTP_PORT
    grpc_port: int = DEFAULT_GRPC_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    gpu: bool = False
    log_verbose: int = 0
    exit_timeout_s: int = 30
    admin_key: str | None = None  # None: a random one, so the admin APIs are closed to everyone
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = field(default=None, init=False)
    _workdir: tempfile.TemporaryDirectory | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.admin_key is None:
            self.admin_key = secrets.token_urlsafe(24)

    @property
    def _client_host(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    @property
    def http_url(self) -> str:
        return f"{self._client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self._client_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._client_host}:{self.metrics_port}/metrics"

    def selected_models(self) -> list[str]:
        return list(self.models) if self.models else list_models(self.model_repository)

    @property
    def drain_file(self) -> Path | None:
        return Path(self._workdir.name) / "drain" if self._workdir is not None else None

    def command(self, install: TritonInstall, backends: Path, model_repository: Path | None = None) -> list[str]:
        """`model_repository`: the one Triton reads (a `repository_view` when `models` chooses), default ours."""
        restricted = f"{','.join(ADMIN_APIS)}:{ADMIN_HEADER}={self.admin_key}"
        cmd = [
            str(install.binary),
            f"--model-repository={model_repository or self.model_repository}",
            f"--backend-directory={backends}",
            f"--http-address={self.host}", f"--http-port={self.http_port}",
            f"--grpc-address={self.host}", f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.host}", f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            f"--allow-gpu-metrics={str(self.gpu).lower()}",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--log-verbose={self.log_verbose}",
            "--model-control-mode=none",  # no client loads, unloads or rewrites a model
            f"--http-restricted-api={restricted}",
            f"--grpc-restricted-protocol={restricted}",
            # One model initializes at a time. The Python backend (2.51) declares a stub failed when its health
            # thread misses a 1 s window during `initialize`, then waits for that stub to exit, which it never does:
            # the server hung so once in CI, two models initializing at once on 2 cores.
            "--model-load-thread-count=1",
        ]
        if self.gpu:
            cmd.append("--model-config-name=gpu")  # <model>/configs/gpu.pbtxt
        return cmd + list(self.extra_args)

    def start(self, stdout=None, stderr=None) -> None:
        if not self.model_repository.is_dir():
            raise LaunchError(f"model repository {self.model_repository} does not exist")
        install = find_tritonserver()
        self._workdir = tempfile.TemporaryDirectory(prefix="alrkvd-triton-")
        workdir = Path(self._workdir.name)
        backends = prepare_backend_dir(install, workdir)
        repository = repository_view(self.model_repository, self.models, workdir) if self.models else None
        self.process = subprocess.Popen(
            self.command(install, backends, repository), env=server_env(install, drain_file=self.drain_file),
            stdout=stdout, stderr=stderr,
            start_new_session=True,  # our own signal handling decides when it stops
            preexec_fn=_die_with_parent,
        )

    def wait_until_ready(self, timeout: float = 600.0) -> None:
        wait_until_ready(self.http_url, self.selected_models(), timeout, self.process)

    def announce_drain(self) -> None:
        """Tell the models a stop is coming: the seconds they may give running requests (the drain file)."""
        path = self.drain_file
        if path is None or path.exists():
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{max(0, self.exit_timeout_s - DRAIN_MARGIN_S)}\n")
        tmp.replace(path)  # the models never read a half-written file

    def stubs(self) -> dict[int, str]:
        """The server's Python-backend stubs: pid -> model instance name."""
        return python_stubs(self.process.pid) if self.process is not None else {}

    def stop(self, grace_s: float | None = None) -> int | None:
        """Drain file, then SIGINT (Triton's graceful exit: unload, finalize), then SIGKILL after a grace."""
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            self.announce_drain()
            proc.send_signal(signal.SIGINT)
            try:
                # Triton gives up at its exit timeout ("Exiting immediately"), yet its exit can then hang (seen
                # for 15 s with a stream of a dead stub open): a few seconds more, then SIGKILL
                proc.wait(timeout=grace_s if grace_s is not None else self.exit_timeout_s + 5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the server and its stubs
                proc.wait()
        _reap_group(proc.pid)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
        return proc.returncode

    def print_urls(self, file=sys.stdout) -> None:
        models = self.selected_models()
        print(f"\nalrkvd: tritonserver ready with {', '.join(models)}", file=file)
        print(f"  HTTP     http://{self.http_url}", file=file)
        print(f"  gRPC     {self.grpc_url}", file=file)
        print(f"  metrics  {self.metrics_url}", file=file)
        print(f"  try      alrkvd-client --url {self.grpc_url} \"Write a haiku about caches\"", file=file)
        print("  stop     Ctrl-C\n", file=file, flush=True)


def start_openai_front(grpc_url: str, models: list[str], host: str, port: int,
                       timeout: float = 60.0) -> subprocess.Popen:
    """The OpenAI-compatible front (server/openai_front.py) for `models` as a child process talking to
    `grpc_url`, ready (its /health answers)."""
    proc = subprocess.Popen([sys.executable, "-m", "server.openai_front", "--triton-grpc", grpc_url,
                             "--host", host, "--port", str(port), "--models", *models],
                            cwd=REPO_ROOT, preexec_fn=_die_with_parent)
    client_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    deadline = time.monotonic() + timeout
    while not _http_ok(f"http://{client_host}:{port}/health"):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise LaunchError(f"the OpenAI front did not start on port {port} (exit {proc.returncode})")
        time.sleep(0.2)
    return proc


def stop_process(proc: subprocess.Popen | None, grace_s: float = 10.0) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class StubWatchdog:
    """Notices a model instance whose stub process is gone while the server still reports ready.

    `check()`, called often, looks at the stubs once per `interval_s` and returns the instances that had a
    stub and have had none for two looks in a row (a stub Triton restarts comes back under the same name);
    none while the server is not ready (stopping: its stubs exit on purpose).
    """

    def __init__(self, launcher: TritonLauncher, interval_s: float = 1.0):
        self.launcher, self.interval_s = launcher, interval_s
        self.instances = set(launcher.stubs().values())
        self.missing: set[str] = set()
        self.next_look = time.monotonic() + interval_s

    def check(self) -> list[str]:
        if time.monotonic() < self.next_look:
            return []
        self.next_look = time.monotonic() + self.interval_s
        now = set(self.launcher.stubs().values())
        gone = self.instances - now
        lost = sorted(gone & self.missing)
        self.missing = gone
        self.instances |= now
        if lost and not _http_ok(f"http://{self.launcher.http_url}/v2/health/ready"):
            return []  # the server is stopping (or not serving at all): its stubs may go
        return lost


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="alrkvd-serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-repository", type=Path, default=DEFAULT_MODEL_REPOSITORY)
    p.add_argument("--models", nargs="+", default=None,
                   help="models to load (default: every model in the repository)")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help="address the endpoints bind to (default: the loopback; 0.0.0.0: every interface)")
    p.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT)
    p.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)
    p.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT)
    p.add_argument("--openai-port", type=int, default=DEFAULT_OPENAI_PORT,
                   help="port of the OpenAI-compatible API (/v1/chat/completions, ...; server/openai_front.py) "
                        "in front of tritonserver; 0: none")
    p.add_argument("--gpu", action="store_true",
                   help="use each model's configs/gpu.pbtxt (KIND_GPU) instead of config.pbtxt")
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument("--exit-timeout", type=int, default=30,
                   help="seconds Triton waits for in-flight requests when stopping (the models drain for "
                        f"{DRAIN_MARGIN_S} s less, then end what still runs with an error)")
    p.add_argument("--admin-key", default=os.environ.get("ALRKVD_ADMIN_KEY"),
                   help=f"value of the {ADMIN_HEADER} header that opens the {', '.join(ADMIN_APIS)} APIs "
                        "(default $ALRKVD_ADMIN_KEY, else random: closed)")
    p.add_argument("--ready-timeout", type=float, default=900.0,
                   help="seconds to wait for the models to load")
    p.add_argument("extra", nargs="*", help="further tritonserver options, after --")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    launcher = TritonLauncher(
        model_repository=args.model_repository.resolve(), models=args.models, host=args.host,
        http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port,
        gpu=args.gpu, log_verbose=args.log_verbose, exit_timeout_s=args.exit_timeout,
        admin_key=args.admin_key, extra_args=args.extra,
    )
    stopping = []
    front = None

    def _on_signal(signum, _frame):
        stopping.append(signum)

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        launcher.start()
        print(f"alrkvd-serve: tritonserver pid {launcher.process.pid}", flush=True)
        deadline = time.monotonic() + args.ready_timeout
        while not stopping:
            try:
                launcher.wait_until_ready(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
                if args.openai_port:
                    front = start_openai_front(launcher.grpc_url, launcher.selected_models(), args.host,
                                               args.openai_port)
                launcher.print_urls()
                if front is not None:
                    host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
                    print(f"  OpenAI   http://{host}:{args.openai_port}/v1 (pid {front.pid})\n", flush=True)
                break
            except LaunchError:
                if launcher.process.poll() is not None or time.monotonic() > deadline:
                    raise
        watchdog = StubWatchdog(launcher)
        while not stopping and launcher.process.poll() is None:
            time.sleep(0.2)
            lost = watchdog.check()
            if lost:
                raise LaunchError(
                    f"the Python-backend stub of {', '.join(lost)} died and tritonserver still reports ready "
                    "(Triton 2.51 neither restarts the stub of a decoupled model nor marks it not ready): stopping")
    except LaunchError as e:
        print(f"alrkvd-serve: {e}", file=sys.stderr, flush=True)
        stop_process(front)
        launcher.stop()
        return 1
    if stopping:
        print("alrkvd-serve: stopping tritonserver ...", file=sys.stderr, flush=True)
    stop_process(front)
    code = launcher.stop()
    if stopping:
        return 0 if code == 0 else 1
    print(f"alrkvd-serve: tritonserver exited with code {code}", file=sys.stderr)
    return code or 1


if __name__ == "__main__":
    sys.exit(main())
