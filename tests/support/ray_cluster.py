"""A real two-node Ray cluster on localhost for the tests that need one (issue 31): `ray start
--head` and `ray start --address`, each run with `--block` as a child of the test process, so
stopping it (SIGTERM, which makes `ray start --block` stop every process it started, then a kill)
leaves no Ray process behind; `ray stop` is never used, as it stops every Ray process on the
machine, other users' included. Every port is a free one of this machine and Ray's temporary folder
is the test's own, so two suites on one machine do not meet.

Where Ray is not installed the tests that need it are skipped, except under CI=true, where they fail
(Ray is in the `test` extra).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import pytest

from redis_server import free_port

START_SECONDS = 120.0  # measured: the head answers in 8 to 15 s on a loaded 2-core machine
# A start that fails is tried again with other free ports: the ports are chosen free, then released for
# Ray to bind, and another process (a second suite beside this one) may take one in between. Seen
# 2026-12-07: two suites side by side started their clusters in the same second, and one head never
# came up (every cluster test of that suite an error); the next start, with new ports, comes up.
START_ATTEMPTS = 3
NODE_CPUS = 1  # two nodes of one CPU each: the two tasks of a two-worker fuzz land one per node
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # the tasks exchange kilobytes; Ray's minimum is 75 MiB


def ray_binary() -> str:
    found = os.path.join(os.path.dirname(sys.executable), "ray")
    if not os.path.exists(found):
        found = shutil.which("ray") or ""
    if not found:
        message = "Ray is not installed (pip install -e '.[test]')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + "; CI must run the cluster tests")
        pytest.skip(message)
    return found


def _node_ports() -> list[str]:
    ports = []
    for flag in ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port"):
        ports += [flag, str(free_port())]
    return ports


class ClusterStartFailed(RuntimeError):
    """The cluster did not bring up its nodes (RayCluster._wait_for_nodes)."""


def start_cluster(nodes: int = 2, attempts: int = START_ATTEMPTS, start=None) -> RayCluster:
    """A RayCluster of `nodes` nodes, started again with new ports (and a new temporary folder) when a
    start fails, at most `attempts` times (START_ATTEMPTS says why); the test fails naming each
    address tried when none comes up."""
    start = start or (lambda: RayCluster(nodes))
    tried = []
    for _ in range(attempts):
        try:
            return start()
        except ClusterStartFailed as exc:
            tried.append(str(exc))
    pytest.fail(f"no Ray cluster came up in {attempts} starts: {'; '.join(tried)}")


class RayCluster:
    def __init__(self, nodes: int = 2) -> None:
        binary = ray_binary()
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # short: Ray's socket paths under it must stay within the 107 bytes of a Unix socket name
        self.temp_dir = tempfile.mkdtemp(prefix="dmray", dir="/tmp")
        self.env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
        self.procs: list[subprocess.Popen] = []
        common = ["--block", "--num-cpus", str(NODE_CPUS), "--object-store-memory", str(OBJECT_STORE_BYTES),
                  "--disable-usage-stats"]
        head = [binary, "start", "--head", "--port", str(self.port), "--include-dashboard", "false",
                "--temp-dir", self.temp_dir, *common, *_node_ports()]
        self._start(head)
        self._wait_for_nodes(1)
        for _ in range(nodes - 1):
            self._start([binary, "start", "--address", self.address, *common, *_node_ports()])
        self._wait_for_nodes(nodes)

    def _start(self, command: list[str]) -> None:
        self.procs.append(subprocess.Popen(command, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True))

    def _wait_for_nodes(self, count: int) -> None:
        probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
                 "sys.exit(0 if sum(n['Alive'] for n in ray.nodes()) >= int(sys.argv[2]) else 1)")
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            try:
                done = subprocess.run([sys.executable, "-c", probe, self.address, str(count)], env=self.env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
            except subprocess.TimeoutExpired:  # the head not up yet: Ray's client waits for it
                continue
            if done.returncode == 0:
                return
            time.sleep(1.0)
        self.stop()
        raise ClusterStartFailed(f"the Ray cluster at {self.address} did not bring up {count} node(s)")

    def stop(self) -> None:
        for p in reversed(self.procs):  # the worker node first, then the head
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)  # its own process group: the processes it started
                    p.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def kill_when_named(pid_of: Callable[[], int | None], limit: float = 120.0) -> tuple[threading.Thread, list[int]]:
    """The fault tests' killer: a started thread that SIGKILLs the process `pid_of()` names as soon as it
    names one (a task's worker process, mid-run), and the list the killed pid is appended to."""
    killed: list[int] = []

    def kill() -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            pid = pid_of()
            if pid is not None:
                killed.append(pid)
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=kill)
    thread.start()
    return thread, killed


def processes_marked(mark: str) -> list[int]:
    """Live processes whose environment holds `mark` ("NAME=VALUE"): what a command started, Ray's
    processes included (they inherit the environment), found through /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if mark.encode() in fh.read():
                        with open(f"/proc/{entry}/stat") as st:
                            if st.read().rsplit(")", 1)[1].split()[0] != "Z":
                                found.append(int(entry))
            except OSError:
                continue
    return found


def processes_left(mark: str, limit: float = 120.0) -> list[int]:
    """processes_marked(mark) once none is left, or after `limit` seconds: a stopped runtime's last
    processes take a moment to exit (2 s was enough unloaded), and the limit bounds a hang only."""
    deadline = time.monotonic() + limit
    while (left := processes_marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.25)
    return left
