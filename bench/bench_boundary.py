"""What the OS boundary costs on a default check (issue 43: goal <= 10 % more).

Two measures, each with the boundary (bubblewrap, diffmoe/isolation/boundary.py) and without
(DIFFMOE_NO_BOUNDARY=1, the same process isolation):
  * a default check with a warm zygote, as a pytest session or a fuzz run pays it per example
    (every default oracle and schedule, in a worker with the CLI's time limit);
  * `diffmoe check` as a user runs it, a fresh process: the zygote's start is in it (inside the
    boundary a fresh interpreter started by bwrap; without it a fork of the judge).

    python -m pytest bench/bench_boundary.py --benchmark-only --benchmark-columns=median,min,max

The ratio of the medians is the cost; docs/robustness.md ("Isolation") records the figures.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from diffmoe.judge.runner import DEFAULT_INTERPRETER_TIME_LIMIT, run_differential
from diffmoe.isolation import boundary
from diffmoe.problem.config import MoEConfig

# bench/bench_isolation.py's config: a default check of a few seconds
CONFIG = MoEConfig(num_tokens=16, num_experts=8, topk=2, hidden=128, inter=128, quant="fp8-token", fused=True,
                   output="separate", seed=0)
SIDES = ("boundary", "no-boundary")

pytestmark = pytest.mark.skipif(boundary.available() is not None, reason=f"no boundary here: {boundary.available()}")


def _env(side: str) -> dict:
    env = dict(os.environ)
    env.pop(boundary.OFF_ENV, None)
    return env if side == "boundary" else {**env, boundary.OFF_ENV: "1"}


@pytest.mark.parametrize("side", SIDES)
def test_boundary_cost_warm(side: str, benchmark, moe_device, monkeypatch):
    if side == "boundary":  # the zygote table keys on it: each side has its own zygote
        monkeypatch.delenv(boundary.OFF_ENV, raising=False)
    else:
        monkeypatch.setenv(boundary.OFF_ENV, "1")

    def check():
        return run_differential(CONFIG, device=moe_device, isolation="process", time_limit=DEFAULT_INTERPRETER_TIME_LIMIT)

    report = check()  # the zygote's start and first-call costs
    assert report.passed, report.render()
    assert (report.isolation is None) == (side == "boundary")
    benchmark.group = "boundary-warm"
    benchmark.pedantic(check, rounds=5, iterations=1)
    benchmark.extra_info.update({"side": side, "config": CONFIG.to_dict()})


@pytest.mark.parametrize("side", SIDES)
def test_boundary_cost_cli(side: str, benchmark):
    args = [sys.executable, "-m", "diffmoe", "check", "--tokens", "16", "--experts", "8", "--topk", "2", "--hidden",
            "128", "--inter", "128", "--quant", "fp8-token", "--fused"]

    def cli():
        done = subprocess.run(args, env=_env(side), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr

    benchmark.group = "boundary-cli"
    benchmark.pedantic(cli, rounds=3, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update({"side": side})
