"""What running on Ray costs and gains (issue 31): scheduling overhead against a cheap check
(goal <= 5 %), and a 100-config fuzz on a one-node against a two-node Ray cluster of this machine.

* `cheap_check`: one example as the fuzz judges most of them, the cheap oracle set
  (diffmoe/fuzz/tiers.py) on a small config, in this process.
* `board_round_trip`: the most the cluster adds to an example: a progress report answered with the
  stops from the run's board, one Ray actor call (diffmoe/cluster/board.py; a task posts it without
  waiting, diffmoe/cluster/tasks.py).
* `task_round_trip`: what it adds per task (one per worker, not per example): an empty task
  submitted and its result fetched.
* `campaign_nodes[1]`, `campaign_nodes[2]`: `fuzz_in_workers(workers=2, max_examples=100, cluster=...)` with
  the real kernels and the cheap oracle set (T <= 8, E <= 4, the fixed planner: every example
  passes, none is shrunk) on a real cluster of one node with 1 CPU and of two nodes with 1 CPU each
  (tests/support/ray_cluster.py), the cluster's start not timed. The ratio of the two medians is the gain.

    python -m pytest bench/bench_cluster.py --benchmark-only --benchmark-columns=median,min,max,rounds

docs/performance.md ("Running on Ray") records the figures with their date and machine.
"""

from __future__ import annotations

import os
import sys

import pytest

from diffmoe.judge.runner import run_differential
from diffmoe.cluster.board import start_board
from diffmoe.cluster.runtime import ClusterSpec, connected
from diffmoe.fuzz.workers import fuzz_in_workers
from diffmoe.fuzz.tiers import CHEAP_ORACLES
from diffmoe.problem.config import MoEConfig

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from ray_cluster import RayCluster  # noqa: E402 - the tests' real cluster of this machine

CHEAP_CONFIG = MoEConfig(num_tokens=4, num_experts=4, topk=2, hidden=128, inter=128, quant="fp8-token", fused=True, seed=0)
CAMPAIGN_EXAMPLES = 100


def test_cheap_check(benchmark):
    benchmark.group = "per example"
    run_differential(CHEAP_CONFIG, oracles=list(CHEAP_ORACLES))  # first-call costs
    report = benchmark.pedantic(run_differential, args=(CHEAP_CONFIG,), kwargs={"oracles": list(CHEAP_ORACLES)},
                                rounds=5, iterations=1)
    assert report.passed


@pytest.fixture
def local_ray(monkeypatch):
    # one authentication mode for every runtime this process meets: the test clusters run without
    # tokens, and a process that started a local runtime with them could not use their actors (seen)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with connected(ClusterSpec("local"), workers=1) as ray:
        yield ray


def test_board_round_trip(benchmark, local_ray):
    benchmark.group = "per example"
    board = start_board(local_ray)
    local_ray.get(board.report.remote(0, (0, "generate", "")))
    benchmark.pedantic(lambda: local_ray.get(board.report.remote(0, (1, "generate", "T=1"))), rounds=200, iterations=1)


def test_task_round_trip(benchmark, local_ray):
    benchmark.group = "per task"
    nothing = local_ray.remote(num_cpus=1)(lambda: None)  # by value: the workers cannot import bench/
    local_ray.get(nothing.remote())  # the worker process started
    benchmark.pedantic(lambda: local_ray.get(nothing.remote()), rounds=50, iterations=1)


@pytest.mark.parametrize("nodes", [1, 2])
def test_campaign_nodes(benchmark, nodes, monkeypatch):
    benchmark.group = f"{CAMPAIGN_EXAMPLES}-config fuzz"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # as the test cluster is started
    cluster = RayCluster(nodes=nodes)
    try:
        def campaign():
            return fuzz_in_workers(cluster=cluster.address, workers=2, max_examples=CAMPAIGN_EXAMPLES, seed=0,
                                   planner="fixed", max_tokens=8, max_experts=4, oracles=list(CHEAP_ORACLES),
                                   shrink=False)
        outcome = benchmark.pedantic(campaign, rounds=1, iterations=1)
        assert outcome.passed and outcome.generated_examples == CAMPAIGN_EXAMPLES
        benchmark.extra_info["nodes"] = nodes
    finally:
        cluster.stop()
