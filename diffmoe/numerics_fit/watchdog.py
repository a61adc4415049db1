"""The fit's time limit: a candidate run that makes no progress (no phase, no launch) for `limit`
seconds is stopped, the way a check's worker is (diffmoe/check/worker.py), but in this process: a
fit keeps the run's buffers, which a worker would have to send back whole.

A SIGALRM timer, re-armed at every progress event, raises `Silence` in the main thread; the
check's guarded call turns it into a crash finding of that config (diffmoe.check.execution
catches everything the implementation's call raises), so the fit reports a residue and exits 1
instead of waiting forever (the bug zoo's reduce-waits-for-all-programs spins under the
interpreter). Off the main thread, or without setitimer, there is no limit.

Owns the timer. Must not judge anything.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Silence(Exception):
    """No progress within the fit's time limit."""


def _usable() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextmanager
def silence_limit(limit: float | None) -> Iterator[Callable[..., None]]:
    """Yields `beat(*_)`, to call at every progress event; Silence is raised when `limit` seconds
    pass without one. None (or no usable timer): no limit, beat does nothing."""
    if limit is None or not _usable():
        yield lambda *_: None
        return

    def fire(signum, frame) -> None:
        raise Silence(f"no progress within the time limit of {limit:g} s")

    def beat(*_) -> None:
        signal.setitimer(signal.ITIMER_REAL, limit)

    previous = signal.signal(signal.SIGALRM, fire)
    beat()
    try:
        yield beat
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
