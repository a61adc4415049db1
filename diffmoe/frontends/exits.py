"""Exit codes and how a command ends: the statuses `diffmoe` returns (docs/cli.md, "Exit codes";
they cannot lie: 0 is only ever a verdict), the usage error that is one line on stderr and status 2,
and SIGTERM turned into Ctrl-C's KeyboardInterrupt (130), whose status a caught interrupt keeps under `python -m`.

Owns the meaning of each exit status and the one-line form of an error; main()
(diffmoe/frontends/cli.py) turns what a command raises into them.
"""

from __future__ import annotations

import contextlib
import signal

PROG = "diffmoe"
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_BROKEN_PIPE = 141  # stdout closed by its reader: 128 + SIGPIPE, as a shell reports it
# An error is one line on stderr; a message quoting a hostile value is cut to this length.
MAX_ERROR_CHARS = 400


class UsageError(Exception):
    """Bad arguments or an invalid config: reported as one line, exit code 2."""


def _one_line(message: str) -> str:
    line = " ".join(message.split())
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 3] + "..."


def _raise_keyboard_interrupt(signum, frame):  # pragma: no cover - exercised via a signal
    raise KeyboardInterrupt


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM raises KeyboardInterrupt inside the block (as Ctrl-C does); restored afterwards.
    SIGINT is left as the command found it: a SIGINT ignored on entry (nohup, a background job
    of a non-interactive shell) stays ignored, and SIGTERM is then the way to stop (docs/robustness.md,
    "Started with SIGINT ignored")."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    except ValueError:  # not the main thread: Ctrl-C still works
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def forget_caught_interrupts() -> None:
    """Keep the status a command returned when it caught an interrupt, under `python -m diffmoe`.

    Since bpo-41602 (Python 3.9, backported to 3.8) the interpreter's `-m` path ends the process by SIGINT, whatever
    status it was given, when its flag for an unhandled KeyboardInterrupt is set; and every exec() or
    eval() of a string sets that flag when a KeyboardInterrupt leaves it, even one caught later, and
    clears it when one completes. A SIGTERM that landed in code a library built with exec (dataclasses,
    namedtuple; a lazy import during a fuzz's first example) made a caught interrupt's 130 a death
    by SIGINT (-2 to a subprocess caller; once in 40 runs at load 8, tests/frontends/test_robustness_cli.py).
    One string exec that completes clears the flag (checked by tests/frontends/test_exit_codes.py)."""
    exec("")  # noqa: S102 - the clearing described above; runs no input
