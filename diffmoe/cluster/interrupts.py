"""Ctrl-C and SIGTERM noted, not raised, while a run waits for its workers or tasks.

While a run reads what its workers send (a queue, Ray's futures), SIGINT and SIGTERM handlers that
would raise (Python callables: KeyboardInterrupt's, the CLI's SIGTERM) only note the signal in the
list `interrupts_noted` yields, and the waiting loop raises KeyboardInterrupt between two reads.
Raised inside Queue.get, it could cut a message in half and lose a worker's outcome (seen once in
three suite runs: "fuzz worker 2 of 2 died (exit code 0) before sending its outcome" after a
SIGTERM). An ignored or default disposition is left as it is. Main thread only (elsewhere nothing
changes).

Owns that one guard. Must not know what is waited for.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def interrupts_noted() -> Iterator[list[int]]:
    """Inside the block, SIGINT and SIGTERM that would raise are appended to the list yielded (module doc)."""
    noted: list[int] = []
    saved = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            current = signal.getsignal(signum)
            if callable(current):
                saved[signum] = current
                signal.signal(signum, lambda got, frame: noted.append(got))
    try:
        yield noted
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
