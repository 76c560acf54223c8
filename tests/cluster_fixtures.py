"""Real services for the cluster tests: a Ray head (and workers) and an MLflow tracking server.

Each is started here on free ports, in its own session and temporary directory, and stopped by
its own process group (and the PIDs whose command line names its temporary directory) —
never with `ray stop`, which would end every Ray cluster on the machine, a user's own included.
"""

from __future__ import annotations

import ipaddress
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
#: This test session's cluster token: every node, client and `hpo` subprocess here gets it in
#: RAY_AUTH_TOKEN, so nothing depends on (or writes) the user's ~/.ray/auth_token.
RAY_TOKEN = secrets.token_hex(32)


#: Ports handed out in this test session (never handed out twice, even after a service ends).
_TAKEN: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (Linux; the usual default)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(span: int = 1) -> int:
    """The first of ``span`` consecutive free ports, none handed out before in this session and
    all outside the kernel's ephemeral range: a port the kernel picked for us (bind to 0) is
    one it can also give to any outgoing connection (Ray opens many) before the service binds
    it, and a node whose port is taken never comes up."""
    low_e, high_e = _ephemeral_range()
    starts = [p for p in range(10000, 65536 - span) if p + span <= low_e or p > high_e]
    rng = random.Random()
    for _ in range(5000):
        start = rng.choice(starts)
        ports = range(start, start + span)
        if not any(port in _TAKEN for port in ports) and all(_bindable(port) for port in ports):
            _TAKEN.update(ports)
            return start
    raise RuntimeError(f"no {span} free consecutive port(s) outside the ephemeral range {low_e}-{high_e}")


def service_env() -> dict[str, str]:
    """The environment of the services and of the `hpo` subprocesses: this checkout's code
    first, and Ray's token auth on with this session's own token (as a team's cluster runs)."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": RAY_TOKEN,
            "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}


def _ray_bin() -> str:
    return shutil.which("ray") or str(Path(sys.executable).with_name("ray"))


def _stop_group(process: subprocess.Popen, marker: Optional[str] = None) -> None:
    """End one service started by this module, everything in its process group, and any
    process whose command line names its private ``marker`` directory (Ray's workers)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)  # `ray start --block` tears its node down on SIGTERM
            process.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    if marker:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def _node_ports() -> list[str]:
    """Every port a Ray node opens, chosen free, so that no node collides with another Ray on
    this machine."""
    low = free_port(span=41)
    return [f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
            f"--min-worker-port={low}", f"--max-worker-port={low + 40}"]


@dataclass
class RayCluster:
    """A Ray head with its dashboard (the Jobs API) and any workers added to it."""

    num_cpus: int = 2
    gcs_port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)
    nodes: list[subprocess.Popen] = field(default_factory=list)
    temp_dir: str = ""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self) -> "RayCluster":
        # Short and private: Ray's socket paths must stay under 107 characters.
        self.temp_dir = tempfile.mkdtemp(prefix="hpo-ray-", dir="/tmp")
        self._start_node(["--head", f"--port={self.gcs_port}", f"--dashboard-port={self.dashboard_port}",
                          "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--temp-dir={self.temp_dir}",
                          f"--ray-client-server-port={free_port()}"], self.num_cpus)
        self._wait_dashboard()
        return self

    def add_worker(self, num_cpus: int = 1) -> None:
        # Its own temporary directory, as on a machine of its own: nodes sharing one would share
        # runtime_resources/, and one node's clean-up of a job's working_dir would pull it away
        # from under the other's processes.
        own = Path(self.temp_dir) / f"w{len(self.nodes)}"
        own.mkdir()
        self._start_node([f"--address={self.address}", f"--temp-dir={own}"], num_cpus)

    def _start_node(self, args: list[str], num_cpus: int) -> None:
        log = open(Path(self.temp_dir) / f"node{len(self.nodes)}.log", "wb")  # noqa: SIM115 - closed with the dir
        self.nodes.append(subprocess.Popen(
            [_ray_bin(), "start", *args, *_node_ports(), "--node-ip-address=127.0.0.1", f"--num-cpus={num_cpus}",
             "--disable-usage-stats", "--block"],
            env=service_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        want, deadline = len(self.nodes), time.time() + 180
        while self.alive_nodes() < want:
            assert all(n.poll() is None for n in self.nodes), \
                f"ray start exited early: {(Path(self.temp_dir) / f'node{want - 1}.log').read_text()[-2000:]}"
            assert time.time() < deadline, (f"the cluster did not reach {want} node(s): "
                                            f"{(Path(self.temp_dir) / f'node{want - 1}.log').read_text()[-2000:]}")
            time.sleep(2)

    def _wait_dashboard(self) -> None:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{self.dashboard}/api/version", timeout=5)
                return
            except urllib.error.HTTPError:
                return  # 401: up, behind the token
            except OSError:
                assert time.time() < deadline, "the Ray dashboard did not come up"
                time.sleep(1)

    def alive_nodes(self) -> int:
        probe = ("import ray; ray.init(address=%r, log_to_driver=False); "
                 "print(sum(1 for n in ray.nodes() if n['Alive']))" % self.address)
        try:
            run = subprocess.run([sys.executable, "-c", probe], env=service_env(), capture_output=True, text=True,
                                 timeout=45)
        except subprocess.TimeoutExpired:
            return 0  # not ready to take a driver yet: the caller polls again until its deadline
        lines = run.stdout.strip().splitlines()
        return int(lines[-1]) if run.returncode == 0 and lines and lines[-1].isdigit() else 0

    def stop(self) -> None:
        for node in reversed(self.nodes):
            _stop_group(node, self.temp_dir or None)
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def seen_from_another_machine() -> tuple[str, str]:
    """(address to bind, host to put in the URI) for a server reached as a second machine
    reaches it: by a Host header that MLflow's default allow-list (localhost and the private
    ranges) refuses. This machine's non-loopback address where it has one outside the private
    ranges; else its host name (never ``localhost``), bound at the address the name resolves to."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # a UDP connect sends nothing: it only picks the route's source
            address = probe.getsockname()[0]
        except OSError:
            address = None
    if address and not ipaddress.ip_address(address).is_loopback and not address.startswith(_MLFLOW_PRIVATE):
        return address, address
    name = socket.gethostname()
    if name.lower() in ("localhost", ""):
        raise RuntimeError(f"no address or host name here that MLflow's default allow-list refuses ({address}, {name})")
    return socket.gethostbyname(name), name


#: The IPv4 ranges MLflow's server accepts by default besides localhost (mlflow.server.security_utils).
_MLFLOW_PRIVATE = ("10.", "192.168.", *(f"172.{i}." for i in range(16, 32)))


@dataclass
class MlflowServer:
    """`mlflow server` with a SQLite backend and an artifact root in ``root``, listening on
    ``host``; ``allowed_hosts`` is its ``--allowed-hosts`` (default: MLflow's own)."""

    root: Path
    port: int = field(default_factory=free_port)
    process: Optional[subprocess.Popen] = None
    host: str = "127.0.0.1"
    allowed_hosts: Optional[str] = None

    @property
    def uri(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "MlflowServer":
        return self.launch().wait()

    def launch(self) -> "MlflowServer":
        """Start the process without waiting for it (several servers come up side by side)."""
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "server.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", self.host, "--port", str(self.port),
             "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--workers", "1",
             *(["--allowed-hosts", self.allowed_hosts] if self.allowed_hosts else [])],
            # MLflow's own defaults unless this server says otherwise (not a user's variable).
            env={k: v for k, v in service_env().items() if k != "MLFLOW_SERVER_ALLOWED_HOSTS"},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.root)
        return self

    def wait(self) -> "MlflowServer":
        """Block until the server answers /health (180 s at most)."""
        assert self.process is not None, "launch() first"
        deadline = time.time() + 180
        while True:
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=5)
                return self
            except OSError:
                assert self.process.poll() is None, (self.root / "server.log").read_text()[-2000:]
                assert time.time() < deadline, "the MLflow server did not come up"
                time.sleep(1)

    def stop(self) -> None:
        if self.process is not None:
            _stop_group(self.process)
