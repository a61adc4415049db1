"""How many Triton programs the interpreter has run in this process: what a check reads around each
reported launch, so a launch reported as a Triton kernel that ran none is told apart (issue 33).

Under `TRITON_INTERPRET=1` triton 3.9 runs a launch's programs from one loop
(`GridExecutor.__call__`), calling `interpreter_builder.set_grid_idx(x, y, z)` before each program
(diffmoe.interpreter.grid_order reads the same loop). `programs_run()` wraps the class's
`InterpreterBuilder.set_grid_idx` once, on first use, with a counter: one more per program
started, whatever schedule steers the loop (grid_order's instance hooks call the class's method)
and beside the race recorder (which hooks loads, stores and the launch, not this method). The
count only grows; a reader takes the difference across a launch. Cost: one Python call per
program, next to the program's own interpretation (many ops each).

Compiled launches have no grid loop to count: `programs_run()` is None there, and on a Triton
release other than the one this was read from (SUPPORTED_TRITON), so nothing is judged.

Owns the counter and its wrapper of `set_grid_idx`. Must not change which program runs or what it
computes.
"""

from __future__ import annotations

import sys
import threading

from diffmoe.interpreter.triton_pin import triton_release

SUPPORTED_TRITON = (3, 9)

_lock = threading.Lock()
_count = 0
_state: bool | None = None  # None: not tried yet; True: counting; False: cannot here


def _install() -> bool:
    """Wrap set_grid_idx once (under _lock); whether programs are counted here."""
    global _state
    if _state is not None:
        return _state
    from diffmoe.interpreter.grid_order import interpreting

    _state = False
    if not interpreting():
        return False
    version, major_minor, broken = triton_release()
    if broken is not None or major_minor != SUPPORTED_TRITON:
        return False
    from triton.runtime import interpreter

    builder = getattr(interpreter, "InterpreterBuilder", None)
    original = getattr(builder, "__dict__", {}).get("set_grid_idx")
    if original is None:
        return False

    def set_grid_idx(self, x, y, z):
        global _count
        _count += 1
        return original(self, x, y, z)

    set_grid_idx.__wrapped__ = original
    builder.set_grid_idx = set_grid_idx
    _state = True
    return True


def programs_run() -> int | None:
    """Triton programs the interpreter has started in this process, or None where they cannot be
    counted (compiled launches, another Triton release, Triton not imported yet)."""
    if _state is None:
        if "triton" not in sys.modules:  # no Triton kernel can have run yet; importing it here would cost a torch-only check
            return None
        with _lock:
            _install()
    return _count if _state else None


__all__ = ["SUPPORTED_TRITON", "programs_run"]
