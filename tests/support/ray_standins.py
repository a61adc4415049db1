"""The stand-in runner (tests/fuzz/test_fuzzing.py's) inside Ray's worker processes, which are not forked
from the test and so cannot inherit a monkeypatch: `install` is Ray's `worker_process_setup_hook`
(`runtime_env()` below), and the environment variables it reads say what the stand-in does.

STANDIN_FAILS: "legacy" (the legacy fused plan fails, the default), "never", or "tokens>=N".
STANDIN_SLEEP: seconds each example takes (0 by default; the interrupt and fault tests slow it).
STANDIN_LOG: a file every judged config is appended to, one JSON line with the task's process id.
STANDIN_GATE: a file a failing example creates. With it, a task process's examples after its first
STANDIN_GATE_AFTER that do not fail wait until the file exists (at most GATE_WAIT_SECONDS), and in a
process that waited each then takes STANDIN_GATE_SLEEP (0.5) seconds: a search that has not failed
cannot end before another one's first failure, however late a loaded machine starts that other task,
and it still runs for a while after it (the time the stop has to reach it).
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

GATE_WAIT_SECONDS = 300.0  # a bound, never reached when the other search fails: it then fails the test's assertion

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(TESTS))


def _fails():
    rule = os.environ.get("STANDIN_FAILS", "legacy")
    if rule == "never":
        return lambda c: False
    if rule.startswith("tokens>="):
        n = int(rule.split(">=")[1])
        return lambda c: c.num_tokens >= n
    return lambda c: c.planner == "legacy" and c.fused


def install() -> None:
    from stand_in_runner import make_fake_runner

    fake = make_fake_runner(fails=_fails())
    judge = fake.run_differential
    pause = float(os.environ.get("STANDIN_SLEEP", "0"))
    log = os.environ.get("STANDIN_LOG")
    gate = os.environ.get("STANDIN_GATE")
    gate_after = int(os.environ.get("STANDIN_GATE_AFTER", "0"))
    gate_sleep = float(os.environ.get("STANDIN_GATE_SLEEP", "0.5"))
    fails = _fails()
    judged, waited = [0], [False]

    def wait_for_gate(config) -> None:
        judged[0] += 1
        if fails(config):
            open(gate, "a").close()
        elif judged[0] > gate_after:
            deadline = time.monotonic() + GATE_WAIT_SECONDS
            while not os.path.exists(gate) and time.monotonic() < deadline:
                waited[0] = True
                time.sleep(0.05)
            if waited[0]:
                time.sleep(gate_sleep)

    def run_differential(config, *args, **kwargs):
        if gate:
            wait_for_gate(config)
        if pause:
            time.sleep(pause)
        if log:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"pid": os.getpid(), "config": config.to_dict()}) + "\n")
        return judge(config, *args, **kwargs)

    fake.run_differential = run_differential
    sys.modules["diffmoe.judge.runner"] = fake


def runtime_env(**variables: str) -> dict:
    """Ray's runtime environment that installs the stand-in in every task's process."""
    path = os.pathsep.join([TESTS, ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return {"worker_process_setup_hook": "ray_standins.install",
            "env_vars": {"PYTHONPATH": path, "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1"), **variables}}


@pytest.fixture
def on_cluster(ray_cluster, monkeypatch):
    """fuzz_in_workers on the two-node cluster, the stand-in installed in its tasks."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # as the test cluster was started

    def run(variables: dict | None = None, **kwargs):
        from diffmoe.fuzz.workers import fuzz_in_workers

        return fuzz_in_workers(cluster=ray_cluster.address, runtime_env=runtime_env(**(variables or {})), **kwargs)

    return run
