"""What a command writes to stdout: its own output alone (with --json, exactly one JSON object). Whatever
the implementation under test prints goes to stderr.

Owns stdout's discipline; must not decide what a command prints (its handler does).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, TextIO


def _print_json(obj: Any, stream: TextIO | None = None) -> None:
    print(json.dumps(obj, default=str), file=stream or sys.stdout)


@contextlib.contextmanager
def implementation_output_to_stderr():
    """Around every call that runs (or builds) the implementation under test: what it prints goes
    to stderr, so stdout holds only what the CLI prints (with --json, exactly one JSON object).
    Python-level prints through sys.stdout are redirected (contextlib.redirect_stdout), and where
    stdout is a real file descriptor, fd 1 is pointed at stderr's too, for writes from C code and
    from worker processes (forked or spawned, they inherit both)."""
    saved_fd, out_fd, err_fd = None, 1, 2  # the process's descriptors, whatever sys.stdout is now
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    try:
        os.fstat(err_fd)
        saved_fd = os.dup(out_fd)
        os.dup2(err_fd, out_fd)
    except OSError:  # no fd 1 or 2 (closed): Python level only
        if saved_fd is not None:
            os.close(saved_fd)
        saved_fd = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved_fd is not None:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved_fd, out_fd)
            os.close(saved_fd)
