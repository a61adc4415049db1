"""Draws that depend on the seed alone.

Hypothesis (6.131 and later) scans the source of every loaded module outside site-packages and
outside test files for constants and mixes them into about one draw in twenty
(`hypothesis.internal.conjecture.providers._get_local_constants`). diffmoe's own modules are such
modules, so what a seeded search draws could depend on what the process had imported: measured
2026-12-05, `fuzz(max_examples=6, seed=worker_seed(7, 0))` drew T=33 fp8-tensor as its sixth example
in a fresh interpreter and in a Ray task, and T=32 fp8-block inside the pytest process that had started
the Ray cluster (tests/test_cluster_fuzz.py's same-seed test failed 4 runs of 4; with the pool empty it
passes). Whether the constants or the time the first scan of a large process takes moved that draw
was not settled; either way it comes from this scan. A seed is a promise (a replayed search, the
workers' split, a task retried on another node), so while diffmoe searches, the pool is empty.

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
    try:
        yield
    finally:
        providers._get_local_constants = found
