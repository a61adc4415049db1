"""Task functions for tests/cluster/test_tasks.py, importable in Ray's worker processes (tests/support/ is on their
PYTHONPATH: `runtime_env` below). Each takes one dict:

name: the task's name, logged with its process id (one JSON line per attempt in `log`).
value: what `square` squares.
wait_for: a file the task waits for (at most WAIT_SECONDS) before returning: the test decides when it ends.
first_attempt_waits: only the first attempt (the first line of this name in `log`) waits; a retry returns at once.
"""

from __future__ import annotations

import json
import os
import time

from ray_standins import runtime_env as _standin_env

WAIT_SECONDS = 120.0


def _attempts(log: str, name: str) -> int:
    if not os.path.exists(log):
        return 0
    with open(log, encoding="utf-8") as fh:
        return sum(json.loads(line)["name"] == name for line in fh if line.strip())


def logged(log) -> list[dict]:
    if not os.path.exists(log):
        return []
    with open(log, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def square(arg: dict) -> int:
    log, name = arg.get("log"), arg.get("name", "")
    first = log is None or _attempts(log, name) == 0
    if log is not None:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"name": name, "pid": os.getpid()}) + "\n")
    wait_for = arg.get("wait_for")
    if wait_for is not None and (first or not arg.get("first_attempt_waits")):
        deadline = time.monotonic() + WAIT_SECONDS
        while not os.path.exists(wait_for) and time.monotonic() < deadline:
            time.sleep(0.05)
    return arg["value"] ** 2


def planted_failure(arg: dict) -> None:
    raise ValueError(f"planted failure in {arg['name']}")


def interrupted_here(arg: dict) -> None:
    raise KeyboardInterrupt


def runtime_env() -> dict:
    """Ray's runtime environment of these tasks: tests/ and the package on the path, nothing installed."""
    return {"env_vars": {"PYTHONPATH": _standin_env()["env_vars"]["PYTHONPATH"]}}


def reporting(arg: dict) -> dict:
    """Posts its value as its progress; returns the stops the board answered."""
    from diffmoe.cluster.tasks import task_report

    return task_report(("value", arg["value"]))


def until_stopped(arg: dict) -> str:
    """Reports every 50 ms until a stop is posted (at most WAIT_SECONDS); returns the stop's name."""
    from diffmoe.cluster.tasks import task_report

    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        stops = task_report(("alive", arg["name"]))
        if stops:
            return ",".join(sorted(stops))
        time.sleep(0.05)
    return "never stopped"


def reports_for(arg: dict) -> tuple[float, float]:
    """Reports every 10 ms for `seconds` of its own (busy, as a check is); returns its start and end
    (time.time(), comparable across the processes of one machine)."""
    from diffmoe.cluster.tasks import task_report

    start = time.time()
    while time.time() - start < arg["seconds"]:
        task_report(("busy", start))
        spin = time.perf_counter()
        while time.perf_counter() - spin < 0.01:
            pass
    return start, time.time()
