"""How far a shrink goes: a number of runs, never the clock.

Why: Hypothesis's engine stops a shrink after five minutes of wall time (its MAX_SHRINKING_SECONDS)
and hands back the smallest failure found so far. On a busy machine that is another config for
the same seed: beside a second full suite (load 13 to 15, 2026-12-07) a seeded two-worker
local-cluster fuzz of the legacy planner spent 43 s on each shrinking run and reported a
non-minimal config after 10 of them (tests/cluster/test_cluster_fuzz.py), where the same seed on a quiet
machine shrinks to the minimal one. Same seed, same result: for the length of a search diffmoe
lifts that clock, and bounds the shrink by its runs instead (SHRINK_RUNS), as it bounds the
descent below a forced pair's floors (DESCENT_RUNS, diffmoe/fuzz/descent.py). Past either limit
the fuzz says the shrink was cut (`shrink_cut`); an interrupt still ends it at any time with the
smallest failure found.

Owns the two run limits and lifting Hypothesis's shrink clock around a search. Must not judge.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

# Shrinking runs after the first failure of a search (every judged candidate counts, a failing
# one or not). Hypothesis itself stops after 500 successful shrinks; the shrinks this suite
# judges end in tens of runs (the CLI's `30 examples + 38 shrinking runs`, docs/cli.md), so the
# limit is far from a normal shrink and bounds one that creeps on a slow kernel.
SHRINK_RUNS = 500
# Candidates the descent below the forced floors judges: six fields, a handful of values each,
# walked again while one moves (diffmoe/fuzz/descent.py).
DESCENT_RUNS = 200


@contextmanager
def clock_lifted() -> Iterator[None]:
    """Hypothesis's five-minute shrink limit off while the block runs (restored after). A release
    of Hypothesis without the constant has no clock to lift: nothing is changed."""
    from hypothesis.internal.conjecture import engine

    previous = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if previous is None:
        yield
        return
    engine.MAX_SHRINKING_SECONDS = math.inf
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = previous
