"""What the overflow watch costs a default check (issue 42, item 3).

The watch (diffmoe/interpreter/wrap_watch.py) runs with the bounds guard under every interpreted
call: every signed 8/16/32-bit `*`, `+`, `-`, `<<` of a kernel is computed once more in 64 bits,
and a marked value's exact lanes travel with it. Two sides, the same default check (every
default oracle and schedule) of benchkit.WATCH_CONFIG, in the judge's process (the
watch's hooks can be switched off there for the comparison):

    python -m pytest bench/bench_overflow_watch.py --benchmark-only --benchmark-columns=median,min,max

The ratio of the medians is the cost; docs/oracles.md ("Integer offsets that wrap") records it.
"""

from __future__ import annotations

import pytest

from benchkit import time_a_default_check
from diffmoe.interpreter import wrap_watch


@pytest.mark.parametrize("side", ["watch", "no-watch"])
def test_overflow_watch_cost(side: str, benchmark, moe_device, monkeypatch):
    if side == "no-watch":
        monkeypatch.setattr(wrap_watch, "HOOKS", {})

    time_a_default_check(benchmark, moe_device, "overflow-watch", side)
