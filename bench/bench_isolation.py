"""What isolation costs on a default check (issue 33: goal <= 15 % more).

The same check as the CLI runs it, a default check (every default oracle and schedule) in a
worker with the CLI's time limit, with the implementation in the judge's process
(`isolation="none"`) and in its own (`"process"`: a child of the zygote per check,
diffmoe/isolation/). Wall time, not `process_time`: the candidate's work is in another process.
The zygote's start is paid once, in the warm-up, as a CLI run or a pytest session pays it once.

    python -m pytest bench/bench_isolation.py --benchmark-only --benchmark-columns=median,min,max

The ratio of the two medians is the cost; docs/robustness.md ("Isolation") records the figure
with its date and machine.
"""

from __future__ import annotations

import pytest

from diffmoe.judge.runner import DEFAULT_INTERPRETER_TIME_LIMIT, run_differential
from diffmoe.isolation.client import ISOLATIONS
from diffmoe.problem.config import MoEConfig

# The oracle benchmark's config (bench/bench_oracle_overhead.py): a default check of a few seconds.
CONFIG = MoEConfig(num_tokens=16, num_experts=8, topk=2, hidden=128, inter=128, quant="fp8-token", fused=True,
                   output="separate", seed=0)


@pytest.fixture(scope="module")
def warmed_up(moe_device) -> None:
    for isolation in ISOLATIONS:  # first-call costs, and the zygote's start
        report = run_differential(CONFIG, device=moe_device, isolation=isolation, time_limit=DEFAULT_INTERPRETER_TIME_LIMIT)
        if not report.passed:
            pytest.fail(f"the benchmark config does not pass, timings would be meaningless:\n{report.render()}")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_isolation_cost(isolation: str, warmed_up, benchmark, moe_device):
    benchmark.group = "isolation"
    benchmark.pedantic(run_differential, args=(CONFIG,),
                       kwargs={"device": moe_device, "isolation": isolation, "time_limit": DEFAULT_INTERPRETER_TIME_LIMIT},
                       rounds=5, iterations=1)
    benchmark.extra_info.update({"isolation": isolation, "config": CONFIG.to_dict()})
