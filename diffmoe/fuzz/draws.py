"""Draws that depend on the seed alone.

Hypothesis (6.131 and later) scans the source of every loaded module outside site-packages and
outside test files for constants and mixes them into about one draw in twenty
(`hypothesis.internal.conjecture.providers._get_local_constants`). diffmoe's own modules are such
modules, so what a seeded search draws could depend on what the process had imported: measured
2026-12-05, `fuzz(max_examples=6, seed=worker_seed(7, 0))` drew T=33 fp8-tensor as its sixth example
in a fresh interpreter and in a Ray task, and T=32 fp8-block inside the pytest process that had started
the Ray cluster (tests/cluster/test_cluster_fuzz.py's same-seed test failed 4 runs of 4; with the pool empty it
passes). Hypothesis also caches, per kind of draw, the constants of that pool the draw permits
(CONSTANTS_CACHE): any earlier Hypothesis test of the process fills it, so the pool must be emptied
and that cache forgotten (a full suite's same-seed test failed with the pool alone emptied; with both,
a run of tests/fuzz/test_strategies.py before it passes, and fails without the cache cleared). A seed is a
promise (a replayed search, the workers' split, a task retried on another node), so while diffmoe
searches, the pool is empty.

Owns that one switch. Where Hypothesis has no such pool (older releases), there is nothing to do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def seed_only_draws() -> Iterator[None]:
    """Within: Hypothesis draws no constant taken from the loaded modules' source."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a Hypothesis without that module
        yield
        return
    found = getattr(providers, "_get_local_constants", None)
    empty = getattr(providers, "Constants", None)
    if found is None or empty is None:
        yield
        return
    providers._get_local_constants = lambda: empty()
    _forget_permitted(providers)  # what an earlier search of this process filtered from the full pool
    try:
        yield
    finally:
        providers._get_local_constants = found
        _forget_permitted(providers)  # the next search of this process recomputes them from the full pool


def _forget_permitted(providers) -> None:
    """Empty Hypothesis's cache of the constants each draw's constraints permit (CONSTANTS_CACHE, keyed by
    the draw, not by the pool): filled by any earlier Hypothesis test in the process, it kept serving the
    loaded modules' constants inside the search (the same-seed test failed in a full suite with the pool
    alone emptied, 2026-12-05). Hypothesis clears it the same way when its pool grows."""
    cache = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    if cache is not None:
        cache.clear()
