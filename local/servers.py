"""Local Redis, Redis Cluster and Prometheus processes, for `compactd demo` and the tests (Kafka: broker.py)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from importlib import resources
from pathlib import Path

from compactd.errors import CompactdError
from compactd.state.keys import REDIS_CONFIG


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range: a port the kernel hands out (bind to 0) is handed out
    again to the next outbound connection of any client, which can take it before the server this port is for
    binds it ("Address already in use" under a busy test suite). Below the range only another free_port can."""
    low = _ephemeral_low()
    for _ in range(50):
        port = random.randrange(10_000, low) if low > 10_000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    with socket.socket() as s:  # every try taken: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    """The low end of the kernel's range for outbound connections' ports (Linux; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CompactdError(f"{what} exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise CompactdError(f"{what} did not listen on {port} within {timeout}s")


class Service:
    """A child process in its own process group, so stopping it never leaves grandchildren behind."""

    def __init__(self, name: str, argv: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.port, self.log = name, port, log
        self._log = open(log, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        wait_port(port, self.proc, name)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


def redis_server(
    workdir: Path, port: int | None = None, password: str | None = None, extra: tuple[str, ...] = ()
) -> Service:
    exe = shutil.which("redis-server")
    if exe is None:
        raise CompactdError("redis-server not found: run `make deps` (apt-get install redis-server)")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [
        exe,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "yes",
        "--dir",
        str(workdir),
        "--daemonize",
        "no",
        *(["--requirepass", password] if password else []),
        *(arg for key, value in REDIS_CONFIG.items() for arg in (f"--{key}", value)),
        *extra,
    ]
    return Service("redis", argv, port, workdir / "redis.log")


def prometheus_server(workdir: Path, target_port: int, port: int | None = None) -> Service:
    """A Prometheus (Debian package) scraping 127.0.0.1:`target_port` every second, with compactd's alert rules."""
    exe = shutil.which("prometheus")
    if exe is None:
        raise CompactdError("prometheus not found: run `make deps` (apt-get install prometheus)")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    rules = resources.files("compactd.dashboards").joinpath("alerts.yaml").read_text()
    (workdir / "alerts.yaml").write_text(rules)
    (workdir / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "rule_files: [alerts.yaml]\n"
        "scrape_configs:\n"
        f"  - job_name: compactd\n    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n"
    )
    argv = [
        exe,
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    return Service("prometheus", argv, port, workdir / "prometheus.log")


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is valid and free too."""
    for _ in range(200):
        port = free_port()
        if port + 10_000 > 65_535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        return port
    raise CompactdError("no free port pair for a Redis Cluster node")


def redis_cluster(workdir: Path, masters: int = 3) -> list[Service]:
    """A real Redis Cluster on loopback: `masters` redis-servers with cluster mode on, slots spread by redis-cli."""
    nodes = []
    try:
        for i in range(masters):
            node_dir = workdir / f"node{i}"
            extra = ("--cluster-enabled", "yes", "--cluster-config-file", str(node_dir / "nodes.conf"))
            nodes.append(redis_server(node_dir, port=_cluster_port(), extra=extra))
        cli = shutil.which("redis-cli")
        if cli is None:
            raise CompactdError("redis-cli not found: run `make deps` (apt-get install redis-server)")
        addresses = [f"127.0.0.1:{n.port}" for n in nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        while True:  # every node agrees the cluster is up
            states = [
                subprocess.run(
                    [cli, "-p", str(n.port), "cluster", "info"], capture_output=True, text=True, timeout=10
                ).stdout
                for n in nodes
            ]
            if all("cluster_state:ok" in st for st in states):
                return nodes
            if time.monotonic() > deadline:
                raise CompactdError("redis cluster did not reach cluster_state:ok within 30s")
            time.sleep(0.2)
    except BaseException:
        for n in nodes:
            n.stop()
        raise
