"""Where long runs execute: a Ray runtime named by `--cluster local|auto|ray://HOST:PORT` (issue 31).

* `local`: a Ray runtime this process starts itself (`ray.init` with as many CPUs as workers, no
  dashboard) and stops when the run ends.
* `auto`: the running cluster this machine belongs to (`ray start --head` / `ray start --address`
  on its nodes; Ray finds it through the address file `ray start` leaves, or `RAY_ADDRESS`).
* `ray://HOST:PORT`: a cluster's Ray Client server, from a machine outside it.
* `HOST:PORT` (the address `ray start --head` prints) joins that cluster as `auto` does.

Joining a cluster (anything but `local`) disconnects at the end and leaves the cluster running.
On CUDA each task asks Ray for one GPU (a check wants a GPU of its own); on a CPU, one CPU.
A spec that is not one of these, Ray missing, or a cluster that cannot be reached is a
ValueError in one line (the CLI's exit 2), raised before any task runs.

Owns connecting to Ray and what a task asks of it. Must not know what the tasks do.
"""

from __future__ import annotations

import logging
import re
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

CLUSTER_CHOICES = "local, auto, ray://HOST:PORT or HOST:PORT"
# A task whose worker process (or node) is lost is run again this many times before the run
# fails: Ray's own default for tasks (3), named here because the fault test depends on it.
MAX_TASK_RETRIES = 3
CONNECT_TIMEOUT_SECONDS = 5.0  # a cluster on a reachable network answers a TCP connect in milliseconds
# Local runtime's object store: the tasks exchange a few kilobytes (seeds, outcomes), and Ray's own
# default (30 % of the machine's memory) would take gigabytes from the checks on a shared machine.
LOCAL_OBJECT_STORE_BYTES = 100 * 1024 * 1024
_HOST_PORT = re.compile(r"^(ray://)?([A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:]+\]):(\d{1,5})$")


@dataclass(frozen=True)
class ClusterSpec:
    kind: str  # "local", "auto" or "address"
    address: str | None = None

    def __str__(self) -> str:
        return self.address if self.kind == "address" else self.kind


def parse_cluster(spec: str) -> ClusterSpec:
    """`--cluster`'s value -> ClusterSpec; a ValueError naming the allowed forms."""
    if not isinstance(spec, str):
        raise TypeError(f"cluster must be a string ({CLUSTER_CHOICES}), got {spec!r}")
    if spec in ("local", "auto"):
        return ClusterSpec(spec)
    match = _HOST_PORT.match(spec)
    if match is None:
        raise ValueError(f"--cluster {spec}: expected {CLUSTER_CHOICES}")
    port = int(match.group(3))
    if not 1 <= port <= 65535:
        raise ValueError(f"--cluster {spec}: the port must be an integer in [1, 65535], got {port}")
    return ClusterSpec("address", spec)


def task_options(device: str | None) -> dict:
    """What one task asks of Ray: one GPU on CUDA, one CPU otherwise."""
    if device is not None and str(device).startswith("cuda"):
        return {"num_gpus": 1, "num_cpus": 1}
    return {"num_cpus": 1}


def _reachable(spec: ClusterSpec) -> None:
    """A TCP connection to HOST:PORT first: Ray itself waits 60 s and more for a cluster that is not
    there (measured with Ray 2.60: over 60 s of retries to a closed port), and then may not raise."""
    match = _HOST_PORT.match(spec.address or "")
    host, port = match.group(2).strip("[]"), int(match.group(3))
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_SECONDS).close()
    except OSError as exc:
        raise ValueError(f"--cluster {spec}: nothing answers at {host}:{port} ({exc.strerror or exc})") from None


def import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError("--cluster needs Ray: pip install 'diffmoe[cluster]' (or 'ray')") from None
    return ray


def check_cluster(spec: ClusterSpec) -> None:
    """What can be known of `spec` before a run starts: Ray importable, and a cluster's address answering.
    A ValueError in one line otherwise; a command calls it before its progress starts."""
    import_ray()
    if spec.kind == "address":
        _reachable(spec)


@contextmanager
def connected(spec: ClusterSpec, *, workers: int, runtime_env: dict | None = None) -> Iterator[object]:
    """Ray initialised for `spec` while the block runs (the module doc); yields the ray module.

    runtime_env: Ray's runtime environment for the tasks (their `env_vars`, `working_dir`,
    `py_modules`, `worker_process_setup_hook`): what an implementation outside this package
    needs on the cluster's nodes.
    """
    check_cluster(spec)
    ray = import_ray()
    if ray.is_initialized():
        raise ValueError("Ray is already initialised in this process; --cluster starts or joins it itself")
    handlers = _signal_handlers()
    options = dict(logging_level=logging.ERROR, log_to_driver=False, configure_logging=False)
    if runtime_env:
        options["runtime_env"] = runtime_env
    try:
        if spec.kind == "local":
            ray.init(address="local", num_cpus=workers, include_dashboard=False,
                     object_store_memory=LOCAL_OBJECT_STORE_BYTES, **options)
        else:
            ray.init(address=spec.address if spec.kind == "address" else "auto", **options)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        ray.shutdown()
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ValueError(f"--cluster {spec}: cannot start or reach Ray ({detail})") from None
    try:
        yield ray
    finally:
        ray.shutdown()  # stops a local runtime; only disconnects from a joined cluster
        _restore(handlers)


# ray.init installs its own SIGTERM handler in the driver (sys.exit(15)) and ray.shutdown leaves it:
# a SIGTERM the process met later, in a full suite a test's own, ended as SystemExit(15) inside an
# unrelated check (2026-12-05). What the process had before the run is put back after it.
_RESTORED_SIGNALS = ("SIGTERM", "SIGINT")


def _signal_handlers() -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}  # only the main thread sets handlers, Ray's included
    return {name: signal.getsignal(getattr(signal, name)) for name in _RESTORED_SIGNALS if hasattr(signal, name)}


def _restore(handlers: dict) -> None:
    for name, handler in handlers.items():
        if handler is not None:  # None: set outside Python, nothing to put back
            signal.signal(getattr(signal, name), handler)
