"""A chosen few of each launch's programs (issue 42, item 2): a production shape's launch under the
Triton interpreter, judged on the programs that hold its extremes.

At DeepSeek-V3's shape with a 262,144-token prefill one GEMM launch has hundreds of thousands of
programs and the interpreter runs each in Python; no CPU runs them all. The bugs that live only
at such a shape live in particular programs: an int32 offset wraps in the programs whose tiles
hold the highest rows, experts or columns, a store mask fails in the last partial tile. While a
`sampled_programs(sample)` context is active, every interpreter launch runs only the programs
`sample.choose(grid, launch)` names, in ascending order (or a schedule's order over them, under
diffmoe.interpreter.grid_order's `program_order`); every other program of the launch does not
run at all, so the bytes it would have written keep what they held. `tl.program_id` and
`tl.num_programs` read the real grid: a chosen program computes exactly what it computes in a
full run.

Which programs, without kernel-specific code (`ProgramSample.choose`): every corner of the grid
(the first and last program along each axis, in every combination), the first and last `ends`
programs in CUDA's numbering (p = x + nx * (y + ny * z)): a 1-D grid that a kernel maps onto
(rows, columns) tiles, grouped or not, has its highest row and column tiles there), and `seeded`
more drawn from the rest with a generator seeded by (seed, launch index): the same sample on every
run of the same calls. A launch of at most `full_below` programs runs whole.

Every launch is recorded (`SampledRun.launches`: the kernel, its grid, the programs that ran), so
a report can say what was sampled and a replay reproduces it. The bounds guard, the overflow
watch, the address recorder and the store watch see the programs that ran, as in a full run.

Owns the choice and the shrunk grid of each launch (a wrapper of `GridExecutor.__call__`, installed
while a context is active); the grid loop's program mapping is grid_order's. Must not change what
a chosen program computes.
"""

from __future__ import annotations

import random
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from diffmoe.interpreter import grid_order

# A launch this small runs whole: cheaper than the care a sample needs (a unit test's launches
# are all below it, so a sampled check of a small problem is a full one).
FULL_BELOW = 64
# Programs drawn from the rest of a launch beyond its corners and ends.
SEEDED = 16
# The first and last programs of the flattened grid always run.
ENDS = 2


@dataclass(frozen=True)
class ProgramSample:
    """Which programs of each launch run (module docstring)."""

    seed: int = 0
    seeded: int = SEEDED
    ends: int = ENDS
    full_below: int = FULL_BELOW

    def __post_init__(self) -> None:
        for name in ("seed", "seeded", "ends", "full_below"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"ProgramSample.{name} must be an int, got {type(value).__name__}")
            if value < 0:
                raise ValueError(f"ProgramSample.{name} must be >= 0, got {value}")

    def choose(self, grid: tuple[int, ...], launch: int) -> tuple[int, ...] | None:
        """The programs (CUDA numbers, ascending) launch number `launch` of a context runs on
        `grid`, or None: all of them."""
        nx, ny, nz = (tuple(int(n) for n in grid) + (1, 1, 1))[:3]
        total = nx * ny * nz
        if total <= max(self.full_below, 1):
            return None
        chosen = {x + nx * (y + ny * z) for x in {0, nx - 1} for y in {0, ny - 1} for z in {0, nz - 1}}
        chosen.update(range(min(self.ends, total)))
        chosen.update(range(max(total - self.ends, 0), total))
        rng = random.Random(f"diffmoe-program-sample/{self.seed}/{launch}")
        # Draw without materialising the grid (random.sample over a range is O(k)); at most
        # len(chosen) of the draws repeat a chosen program, so `seeded` new ones remain.
        want = min(total, len(chosen) + self.seeded)
        for p in rng.sample(range(total), want):
            if len(chosen) == want:
                break
            chosen.add(p)
        return tuple(sorted(chosen)) if len(chosen) < total else None


@dataclass(frozen=True)
class SampledLaunch:
    """One interpreter launch made inside a context: `programs` ran of the grid's (None: all)."""

    kernel: str
    grid: tuple[int, int, int]
    programs: tuple[int, ...] | None
    stage: str | None = None  # what the context's `label` answered at the launch (a check: its stage)

    @property
    def total(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def ran(self) -> int:
        return self.total if self.programs is None else len(self.programs)


@dataclass
class SampledRun:
    """An active context: its sample and every launch made inside it."""

    sample: ProgramSample
    launches: list[SampledLaunch] = field(default_factory=list)
    whole: Callable[[], bool] | None = None  # asked at each launch: True runs it whole
    label: Callable[[], str | None] | None = None  # asked at each launch: its SampledLaunch.stage

    def summary(self) -> str:
        """One line: how much of the launches ran."""
        ran, total, sampled = launch_counts(self.launches)
        return (f"{ran} of {total} programs ran over {len(self.launches)} launches "
                f"({sampled} sampled, seed {self.sample.seed})")


def launch_counts(launches: list[SampledLaunch]) -> tuple[int, int, int]:
    """(programs that ran, programs of the grids, launches sampled) over `launches`."""
    return (sum(l.ran for l in launches), sum(l.total for l in launches),
            sum(l.programs is not None for l in launches))


class _ShrunkGrid:
    """A launch's grid as its executor evaluates it: the real grid is worked out, the programs
    chosen and handed to the grid loop, and the loop is told to take len(programs) steps."""

    def __init__(self, grid: Any, run: SampledRun, kernel: str) -> None:
        self.grid, self.run, self.kernel = grid, run, kernel

    def __call__(self, args: Any) -> tuple[int, ...]:
        real = self.grid(args) if callable(self.grid) else self.grid
        real = (tuple(int(n) for n in real) + (1, 1, 1))[:3]
        whole = self.run.whole is not None and self.run.whole()
        programs = None if whole else self.run.sample.choose(real, len(self.run.launches))
        stage = self.run.label() if self.run.label is not None else None
        self.run.launches.append(SampledLaunch(self.kernel, real, programs, stage))
        if programs is None:
            return real
        grid_order.run_subset_next(real, programs)
        return (len(programs), 1, 1)


_lock = threading.RLock()
_active: list[SampledRun] = []  # innermost last
_installed: dict[str, Any] = {}  # "wrapper": ours, "original": what it wraps


def _wrap(original: Any) -> Any:
    def call(self, *args, **kwargs):
        run = _active[-1] if _active else None
        if run is None or isinstance(self.grid, _ShrunkGrid):
            return original(self, *args, **kwargs)
        kept = self.grid
        self.grid = _ShrunkGrid(kept, run, getattr(self.fn, "__name__", "kernel"))
        try:
            return original(self, *args, **kwargs)
        finally:
            self.grid = kept

    call.__name__ = getattr(original, "__name__", "__call__")
    call.__wrapped__ = original
    return call


def _install() -> None:
    from triton.runtime import interpreter

    current = interpreter.GridExecutor.__dict__["__call__"]
    if _installed.get("wrapper") is current:
        return
    wrapper = _wrap(current)
    interpreter.GridExecutor.__call__ = wrapper
    _installed.update(wrapper=wrapper, original=current)


def _uninstall() -> None:
    from triton.runtime import interpreter

    # Put back only what is still ours on top: a hook installed over it since keeps its own
    # saved copy, and ours then passes calls through (no context is active).
    if interpreter.GridExecutor.__dict__.get("__call__") is _installed.get("wrapper"):
        interpreter.GridExecutor.__call__ = _installed["original"]
    _installed.clear()


@contextmanager
def sampled_programs(sample: ProgramSample, whole: Callable[[], bool] | None = None,
                     label: Callable[[], str | None] | None = None) -> Iterator[SampledRun]:
    """Every interpreter launch made inside runs only the programs `sample` chooses (module
    docstring), but a launch made while `whole()` answers True runs all of its programs (a check
    runs the alignment whole: every later stage reads its index); `label()` names each launch in
    the record (a check: the stage in flight). A RuntimeError where the interpreter's grid loop
    cannot be steered here."""
    if not isinstance(sample, ProgramSample):
        raise TypeError(f"sample must be a diffmoe.interpreter.program_sample.ProgramSample, got {type(sample).__name__}")
    if not grid_order.interpreting():
        raise RuntimeError("a program sample needs the Triton interpreter (TRITON_INTERPRET=1): compiled launches "
                           "run every program")
    problem = grid_order.control_problem()
    if problem is not None:
        raise RuntimeError(problem)
    run = SampledRun(sample, whole=whole, label=label)
    with grid_order.holding_the_loop():
        with _lock:
            _install()
            _active.append(run)
        try:
            yield run
        finally:
            with _lock:
                _active.remove(run)
                if not _active:
                    _uninstall()


__all__ = ["ENDS", "FULL_BELOW", "SEEDED", "ProgramSample", "SampledLaunch", "SampledRun", "launch_counts",
           "sampled_programs"]
