"""Program order at the Triton interpreter's grid loop: any Triton kernel under any `Schedule`.

Under `TRITON_INTERPRET=1` triton 3.9 runs one launch's program instances from a single loop
(`triton.runtime.interpreter.GridExecutor.__call__`): it calls
`interpreter_builder.set_grid_dim(nx, ny, nz)` once, then `set_grid_idx(x, y, z)` before each
program, x outermost, z innermost, and `tl.program_id` reads back what was set. While a
`program_order(schedule)` context is active, both calls are replaced on that builder instance:
`set_grid_dim` starts a launch (launch index 0, 1, ... counted from the context's start, so a
random order is the same on every run), and the k-th step of the loop runs program
`schedule.order(nx * ny * nz, launch)[k]` instead of the k-th. Programs are numbered as CUDA
numbers blocks, p = x + nx * (y + ny * z) (the race recorder's program number too), so a 2-D or
3-D grid is permuted over its flattened index and every program still runs exactly once.

The same hooks run a subset of a launch's programs for diffmoe.interpreter.program_sample (a
production shape's launch of millions of programs judged on a chosen few): it shrinks the loop
to len(programs) steps (`run_subset_next`), `set_grid_dim` still receives the real grid (what
`tl.num_programs` reads), and step k runs the subset's k-th program, or under a schedule its
`schedule.order(len(programs), launch)[k]`-th.

Kernels need nothing (no order table): this is how the schedule oracle reorders a plug-in's
kernels (diffmoe.check.execution wraps `run` in it unless the implementation sets
`orders_programs`, diffmoe.contract.ORDERS_PROGRAMS) and the vLLM adapter its own launches.
The shipped kernels keep their order table (optimized/kernels/program_order.py), which also
works compiled; they declare `orders_programs` and are never reordered twice.

Compiled launches are not reordered: without the interpreter there is no grid loop to steer,
the context does nothing, and the hardware picks the order. The schedule oracle then relies on
a kernel's own order table; a kernel without one runs in the hardware's order under every
schedule, so its runs differ only where the hardware's scheduling happens to.

The identity schedule needs no control, imports nothing and works anywhere (inside another
context it restores the interpreter's own order for its extent: the innermost context wins, so
nested contexts never compose two permutations). Any other schedule under the interpreter
replaces interpreter internals, not a Triton API, so it is pinned to the release it was read
from (SUPPORTED_TRITON): elsewhere entering it raises a RuntimeError naming the version and
what to do. It coexists with the race recorder (which hooks the builder's class methods and
`GridExecutor.__call__`, and reads `grid_idx`, which here is the program that really runs) and
with diffmoe.interpreter.fixes (the builder's cast and dot methods), in either nesting order.

Owns the replaced grid-loop calls and their install state. Must not change what a program
computes: only which program runs at each step of the loop (and, for a sample, how many steps).
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from diffmoe.contract import Schedule
from diffmoe.interpreter.triton_pin import triton_release

SUPPORTED_TRITON = (3, 9)
# The builder methods the grid loop calls, replaced on the `interpreter_builder` instance.
REPLACED_BUILDER_METHODS = ("set_grid_dim", "set_grid_idx")


class ProgramOrder:
    """One active context: its schedule and the interpreter launches it has reordered."""

    def __init__(self, schedule: Schedule, steering: bool):
        self.schedule = schedule
        self.steering = steering  # False: identity, or compiled launches (the loop is left alone)
        self.launches = 0  # interpreter launches begun inside this context
        self._order: list[int] = []
        self._for: object = None  # the launch _order was drawn for

    def _begin(self, launch: "_Launch") -> None:
        self._order = self.schedule.order(launch.steps, self.launches)
        self._for = launch
        self.launches += 1

    def step(self, k: int) -> int:
        """Which of the launch's steps runs at loop step k."""
        return self._order[k]


class _Launch:
    """The launch the grid loop is running: its real grid, and the programs it runs (None: all,
    step k running program k; else the subset diffmoe.interpreter.program_sample chose)."""

    def __init__(self, grid: tuple[int, int, int], programs: tuple[int, ...] | None) -> None:
        self.grid = grid
        self.programs = programs

    @property
    def steps(self) -> int:
        return len(self.programs) if self.programs is not None else self.grid[0] * self.grid[1] * self.grid[2]


_lock = threading.RLock()
_stack: list[ProgramOrder] = []  # active contexts, innermost last
_saved: dict[str, Any] = {}  # instance attributes the hooks shadowed (absent: the class method)
_builder: Any = None  # the interpreter_builder the hooks are installed on
_holds = 0  # program_sample contexts holding the hooks (each launch may run a subset)
_next_subset: _Launch | None = None  # the subset the launch about to call set_grid_dim runs
_launch: _Launch | None = None  # the launch whose loop is running


def interpreting() -> bool:
    """Whether Triton kernels run under the interpreter here (without importing Triton when
    nothing has: TRITON_INTERPRET is then what Triton will read)."""
    if "triton" not in sys.modules:
        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    from triton import knobs

    return bool(knobs.runtime.interpret)


def control_problem() -> str | None:
    """Why a non-identity schedule cannot be applied at the grid loop here, or None when it can.
    Only meaningful under the interpreter (compiled launches need no control: none is made)."""
    version, major_minor, broken = triton_release()
    if broken is not None:
        return f"triton is not importable: {broken}"
    if major_minor != SUPPORTED_TRITON:
        return (f"grid-loop program-order control is written for triton {SUPPORTED_TRITON[0]}.{SUPPORTED_TRITON[1]}'s "
                f"interpreter (GridExecutor.__call__ calling set_grid_dim, then set_grid_idx per program), this is "
                f"triton {version}: run with the identity schedule (--schedule identity), or give the kernels an "
                f"order table and set the implementation's `orders_programs`")
    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    missing = [m for m in REPLACED_BUILDER_METHODS if not callable(getattr(builder, m, None))]
    if missing:
        return (f"triton {version}'s interpreter_builder lacks {', '.join(missing)}: "
                "grid-loop order control cannot hook it")
    return None


def status() -> tuple[bool, str]:
    """(True, what runs) when non-identity schedules reorder interpreter launches here, else
    (False, why not): for `diffmoe doctor` and the runner."""
    if not interpreting():
        return False, "compiled launches run in the hardware's order (no interpreter grid loop to steer)"
    problem = control_problem()
    if problem is not None:
        return False, problem
    return True, f"triton {triton_release()[0]} interpreter grid loop"


def _original(name: str):
    saved = _saved.get(name)
    return saved if saved is not None else getattr(type(_builder), name).__get__(_builder)


def run_subset_next(grid: tuple[int, int, int], programs: tuple[int, ...]) -> None:
    """The next launch's loop (whose grid the caller has shrunk to len(programs) steps) runs
    `programs`, numbered on the real `grid`, which `tl.num_programs` reports
    (diffmoe.interpreter.program_sample, while it holds the hooks)."""
    global _next_subset
    _next_subset = _Launch(grid, programs)


def _set_grid_dim(nx, ny, nz):
    global _launch, _next_subset
    launch, _next_subset = _next_subset, None
    if launch is None or len(launch.programs) != nx * ny * nz:
        launch = _Launch((int(nx), int(ny), int(nz)), None)
    _launch = launch
    _original("set_grid_dim")(*launch.grid)
    active = _stack[-1] if _stack else None
    if active is not None and active.steering:
        active._begin(launch)


def _set_grid_idx(x, y, z):
    active = _stack[-1] if _stack else None
    steering = active is not None and active.steering
    launch = _launch
    if launch is not None and (steering or launch.programs is not None):
        if launch.programs is not None:
            step = int(x)  # the loop's grid was shrunk to (len(programs), 1, 1)
        else:
            _, ny, nz = launch.grid
            step = (int(x) * ny + int(y)) * nz + int(z)
        if steering:
            if active._for is not launch:  # entered between this launch's set_grid_dim and its loop
                active._begin(launch)
            step = active.step(step)
        p = launch.programs[step] if launch.programs is not None else step
        nx, ny, _ = launch.grid
        x, y, z = p % nx, (p // nx) % ny, p // (nx * ny)
    _original("set_grid_idx")(x, y, z)


def _install() -> None:
    global _builder
    from triton.runtime import interpreter

    _builder = interpreter.interpreter_builder
    own = vars(_builder)
    for name, hook in zip(REPLACED_BUILDER_METHODS, (_set_grid_dim, _set_grid_idx)):
        if name in own:
            _saved[name] = own[name]
        setattr(_builder, name, hook)


def _uninstall() -> None:
    global _builder, _launch, _next_subset
    _launch = _next_subset = None
    for name in REPLACED_BUILDER_METHODS:
        if name in _saved:
            setattr(_builder, name, _saved.pop(name))
        else:
            vars(_builder).pop(name, None)
    _builder = None


def installed() -> bool:
    """Whether the grid-loop calls are currently replaced (by any active context)."""
    return _builder is not None


@contextmanager
def program_order(schedule: Schedule) -> Iterator[ProgramOrder]:
    """Every interpreter launch made inside runs its programs in `schedule`'s order (module
    docstring). Identity, and any schedule when kernels are compiled, changes nothing. A
    RuntimeError when a non-identity schedule meets an interpreter this was not written for."""
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a diffmoe.contract.Schedule, got {type(schedule).__name__}")
    control = ProgramOrder(schedule, steering=not schedule.is_identity and interpreting())
    if control.steering:
        problem = control_problem()
        if problem is not None:
            raise RuntimeError(problem)
    with _lock:
        if control.steering and _builder is None:
            _install()
        _stack.append(control)
    try:
        yield control
    finally:
        with _lock:
            _stack.remove(control)
            _release_if_unused()


def _release_if_unused() -> None:
    if _builder is not None and not _holds and not any(c.steering for c in _stack):
        _uninstall()


@contextmanager
def holding_the_loop() -> Iterator[None]:
    """The grid-loop hooks installed for the extent, whatever order contexts are active: what
    diffmoe.interpreter.program_sample enters to run a subset of each launch's programs. The
    caller has checked control_problem()."""
    global _holds
    with _lock:
        if _builder is None:
            _install()
        _holds += 1
    try:
        yield
    finally:
        with _lock:
            _holds -= 1
            _release_if_unused()


__all__ = ["ProgramOrder", "REPLACED_BUILDER_METHODS", "SUPPORTED_TRITON", "control_problem", "holding_the_loop",
           "installed", "interpreting", "program_order", "run_subset_next", "status"]
