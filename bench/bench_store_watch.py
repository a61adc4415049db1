"""What watching a Triton launch's stores costs a default check (issue 43, item 3).

The store watch (diffmoe/interpreter/store_coverage.py) runs on the first order's run of every
check under the interpreter: one hook call per interpreted store, two copies of each declared
write view per Triton launch. Two sides, the same default check (every default oracle and
schedule) of benchkit.WATCH_CONFIG, in the judge's process (the watch runs beside the
candidate either way; in process it can be switched off for the comparison):

    python -m pytest bench/bench_store_watch.py --benchmark-only --benchmark-columns=median,min,max

The ratio of the medians is the cost; docs/robustness.md ("The hostile implementations") records it.
"""

from __future__ import annotations

import pytest

from benchkit import time_a_default_check
from diffmoe.check.candidate import Candidate


@pytest.mark.parametrize("side", ["watch", "no-watch"])
def test_store_watch_cost(side: str, benchmark, moe_device, monkeypatch):
    if side == "no-watch":
        monkeypatch.setattr(Candidate, "_store_watch", staticmethod(lambda: None))

    time_a_default_check(benchmark, moe_device, "store-watch", side)
