"""What watching a Triton launch's stores costs a default check (issue 43, item 3).

The store watch (diffmoe/interpreter/store_coverage.py) runs on the first order's run of every
check under the interpreter: one hook call per interpreted store, two copies of each declared
write view per Triton launch. Two sides, the same default check (every default oracle and
schedule) of bench/bench_isolation.py's config, in the judge's process (the watch runs beside the
candidate either way; in process it can be switched off for the comparison):

    python -m pytest bench/bench_store_watch.py --benchmark-only --benchmark-columns=median,min,max

The ratio of the medians is the cost; docs/robustness.md ("The hostile implementations") records it.
"""

from __future__ import annotations

import pytest

from diffmoe.check.candidate import Candidate
from diffmoe.check.runner import DEFAULT_INTERPRETER_TIME_LIMIT, run_differential
from diffmoe.problem.config import MoEConfig

CONFIG = MoEConfig(num_tokens=16, num_experts=8, topk=2, hidden=128, inter=128, quant="fp8-token", fused=True,
                   output="separate", seed=0)


@pytest.mark.parametrize("side", ["watch", "no-watch"])
def test_store_watch_cost(side: str, benchmark, moe_device, monkeypatch):
    if side == "no-watch":
        monkeypatch.setattr(Candidate, "_store_watch", staticmethod(lambda: None))

    def check():
        return run_differential(CONFIG, device=moe_device, isolation="none", time_limit=DEFAULT_INTERPRETER_TIME_LIMIT)

    report = check()  # the interpreter's first-call costs
    assert report.passed, report.render()
    benchmark.group = "store-watch"
    benchmark.pedantic(check, rounds=7, iterations=1)
    benchmark.extra_info.update({"side": side, "config": CONFIG.to_dict()})
