"""SIGINT as each test needs it, whatever the shell that started pytest gave it.

A job started in the background by a non-interactive shell (`cmd &` in a script, CI runners,
`nohup cmd &`) inherits SIGINT ignored, and Python then leaves it ignored: it installs its
KeyboardInterrupt handler only where SIGINT was at its default on entry. A test that sends
SIGINT must therefore set the disposition itself, in its own process and for the children it
starts (issue 30: three signal tests failed, one searched for 18 minutes, when the suite ran
as a background job).

exec() keeps an ignored signal ignored and resets a caught one to its default, so the handler
this process has while it starts a child decides what the child starts with.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

# What a child starts with: a terminal's foreground job ("terminal": SIGINT at its default, so a
# Python child raises KeyboardInterrupt) or a background job of a non-interactive shell ("ignored").
DISPOSITIONS = ("terminal", "ignored")


@contextlib.contextmanager
def sigint_as(disposition: str) -> Iterator[None]:
    """Inside the block, SIGINT is as a `disposition` job has it: "terminal", this process raises
    KeyboardInterrupt on it and a child starts with it at its default; "ignored", both ignore it."""
    if disposition not in DISPOSITIONS:
        raise ValueError(f"disposition must be one of {list(DISPOSITIONS)}, got {disposition!r}")
    handler = signal.default_int_handler if disposition == "terminal" else signal.SIG_IGN
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
