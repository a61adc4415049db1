"""The stand-in runner (tests/test_fuzzing.py's) inside Ray's worker processes, which are not forked
from the test and so cannot inherit a monkeypatch: `install` is Ray's `worker_process_setup_hook`
(`runtime_env()` below), and the environment variables it reads say what the stand-in does.

STANDIN_FAILS: "legacy" (the legacy fused plan fails, the default), "never", or "tokens>=N".
STANDIN_SLEEP: seconds each example takes (0 by default; the interrupt and fault tests slow it).
STANDIN_LOG: a file every judged config is appended to, one JSON line with the task's process id.
"""

from __future__ import annotations

import json
import os
import sys
import time

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def _fails():
    rule = os.environ.get("STANDIN_FAILS", "legacy")
    if rule == "never":
        return lambda c: False
    if rule.startswith("tokens>="):
        n = int(rule.split(">=")[1])
        return lambda c: c.num_tokens >= n
    return lambda c: c.planner == "legacy" and c.fused


def install() -> None:
    from test_fuzzing import make_fake_runner

    fake = make_fake_runner(fails=_fails())
    judge = fake.run_differential
    pause = float(os.environ.get("STANDIN_SLEEP", "0"))
    log = os.environ.get("STANDIN_LOG")

    def run_differential(config, *args, **kwargs):
        if pause:
            time.sleep(pause)
        if log:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"pid": os.getpid(), "config": config.to_dict()}) + "\n")
        return judge(config, *args, **kwargs)

    fake.run_differential = run_differential
    sys.modules["diffmoe.check.runner"] = fake


def runtime_env(**variables: str) -> dict:
    """Ray's runtime environment that installs the stand-in in every task's process."""
    path = os.pathsep.join([TESTS, ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return {"worker_process_setup_hook": "ray_standins.install",
            "env_vars": {"PYTHONPATH": path, "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1"), **variables}}
