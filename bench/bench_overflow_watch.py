"""What the overflow watch costs a default check (issue 42, item 3).

The watch (diffmoe/interpreter/wrap_watch.py) runs with the bounds guard under every interpreted
call: every signed 8/16/32-bit `*`, `+`, `-`, `<<` of a kernel is computed once more in 64 bits,
and a marked value's exact lanes travel with it. Two sides, the same default check (every
default oracle and schedule) of bench/bench_store_watch.py's config, in the judge's process (the
watch's hooks can be switched off there for the comparison):

    python -m pytest bench/bench_overflow_watch.py --benchmark-only --benchmark-columns=median,min,max

The ratio of the medians is the cost; docs/oracles.md ("Integer offsets that wrap") records it.
"""

from __future__ import annotations

import pytest

from diffmoe.check.runner import DEFAULT_INTERPRETER_TIME_LIMIT, run_differential
from diffmoe.interpreter import wrap_watch
from diffmoe.problem.config import MoEConfig

CONFIG = MoEConfig(num_tokens=16, num_experts=8, topk=2, hidden=128, inter=128, quant="fp8-token", fused=True,
                   output="separate", seed=0)


@pytest.mark.parametrize("side", ["watch", "no-watch"])
def test_overflow_watch_cost(side: str, benchmark, moe_device, monkeypatch):
    if side == "no-watch":
        monkeypatch.setattr(wrap_watch, "HOOKS", {})

    def check():
        return run_differential(CONFIG, device=moe_device, isolation="none", time_limit=DEFAULT_INTERPRETER_TIME_LIMIT)

    report = check()  # the interpreter's first-call costs
    assert report.passed, report.render()
    benchmark.group = "overflow-watch"
    benchmark.pedantic(check, rounds=7, iterations=1)
    benchmark.extra_info.update({"side": side, "config": CONFIG.to_dict()})
