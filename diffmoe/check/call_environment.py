"""The process state one call of the implementation runs under: private allocations poisoned,
numpy quiet about the NaNs it is fed on purpose, and os._exit intercepted.

Owns those three context managers. Must not judge or record anything: diffmoe/check/execution.py
wraps the implementation's calls in them.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


class HardExit(BaseException):
    """os._exit(code) called by the implementation while the check had intercepted it."""

    def __init__(self, code: object):
        super().__init__(code)
        self.code = code


@contextmanager
def exits_intercepted() -> Iterator[None]:
    """os._exit raises HardExit while the implementation runs, so a Python-level os._exit(0) is
    a crash finding in process too, instead of ending diffmoe with status 0 and no report. (A
    C-level exit() or a signal cannot be intercepted in process: a worker process sees those.)"""
    real = os._exit

    def intercepted(code=0):
        raise HardExit(code)

    os._exit = intercepted
    try:
        yield
    finally:
        os._exit = real


@contextmanager
def allocations_poisoned() -> Iterator[None]:
    """torch's fill_uninitialized_memory, which needs deterministic mode (warn_only: an op
    without a deterministic kernel still runs); both restored afterwards.

    The mode is set through torch._C: the public torch.use_deterministic_algorithms also
    imports torch._inductor to mirror the flag there, which costs 4.3 s on first use (measured,
    torch 2.13 CPU, `python -X importtime`), once per check process; nothing here compiles."""
    set_mode = getattr(torch._C, "_set_deterministic_algorithms", None) or torch.use_deterministic_algorithms
    mode, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    set_mode(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation.*")
            yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
        set_mode(mode, warn_only=warn_only)


@contextmanager
def numpy_quiet() -> Iterator[None]:
    """Poisoned workspaces and NaN/Inf input rows are NaN on purpose; the interpreter computes on
    them with numpy, whose floating-point warnings (and nanmax's "All-NaN slice") would only bury
    the findings."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="All-NaN slice encountered", category=RuntimeWarning)
        yield
