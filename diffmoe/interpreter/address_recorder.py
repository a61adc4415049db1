"""Race oracle over the Triton interpreter: which bytes each program instance touches.

Under `TRITON_INTERPRET=1` every kernel launch runs its program instances one after another
on the CPU, and every global-memory access goes through a handful of `InterpreterBuilder`
methods with real host addresses. `RaceRecorder` wraps those methods while it is active and
records, per kernel launch and per program instance, the byte intervals loaded, stored and
accessed atomically (masked-off lanes excluded, each element covering its element size).

A byte stored by one program and loaded or stored by another program of the same launch is
a race: on a GPU the two programs may run in either order (or at once), so the result
depends on scheduling. The analysis is order-free, so a race is reported even though the
interpreter itself runs programs in ascending order and the output looks right. Atomic
accesses by several programs to one byte are not races among themselves; an atomic write
against another program's plain load, or a plain store against another program's atomic
access, is.

The analysis of what was recorded (intervals, the conflict sweep, stray stores, the findings)
is address_analysis.py's. Owns the hooks and the recorder; must not judge what it records.

The same addresses give the store-extent oracle: every byte an announced launch stores must
lie inside a view it declared it writes (`LaunchInfo.writes`). A stray store into workspace
bytes nobody reads yet changes no value, so no other oracle sees it; this one names the stage,
the kernel and where the bytes landed (a workspace, a declared read view, a kernel argument).

Kernel launches are the unit of concurrency. A `LaunchInfo` announced through
`before_launch` / `after_launch` names the views (reads, writes) and the stage of the
interpreter launches made in between; if an implementation makes several interpreter
launches inside one announced launch they are still checked one by one, because kernels
launched one after another on a stream are ordered and treating them as concurrent would
flag every producer/consumer pair. Launches made outside any announced launch are checked
too, as "unannounced".

It imports Triton only when a recorder is entered.
It hooks interpreter internals and is therefore pinned to the Triton versions it was written
against (`SUPPORTED_TRITON`); on another version it refuses to run rather than silently
record nothing. Addresses are those the interpreter hands to the kernel, which are the
tensors' own storage for CPU tensors (device tensors are copied to the host first, so their
views could not be named and would be labelled "unnamed").

Longer than 400 lines because the hooks and the recorder share the module's hook state (the
active recorders, the saved originals, a re-entrancy guard) and must be read together to see
that the interpreter is restored on every path.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from diffmoe.contract import LaunchInfo
from diffmoe.interpreter.triton_pin import pinned_interpreter_problem, triton_release
from diffmoe.findings import Finding
from diffmoe.interpreter.address_analysis import (  # noqa: F401 - _READ, _WRITE, _Run, _analyse: tests/oracles/test_races.py drives them
    RunSummary,
    _Conflict,
    _Launch,
    _Region,
    _Run,
    _StrayStores,
    _access_intervals,
    _analyse,
    _element_bytes,
    _finding,
    _stray_finding,
    _stray_stores,
    _view_extent,
    _READ,
    _WRITE,
    _ATOMIC_READ,
    _ATOMIC_WRITE,
    _CHANGED,
)

SUPPORTED_TRITON = (3, 9)

# Interpreter internals this module replaces while a recorder is active. The version pin
# exists because these names and their signatures are not a public Triton API.
# method: (access kind, pointer parameter, mask parameter), a parameter as (position after
# self, name). Atomic read-modify-write, compare-and-swap and atomic store are atomic writes;
# atomic load and poll are atomic reads.
_BUILDER_HOOKS: dict[str, tuple[int, tuple[int, str], tuple[int, str] | None]] = {
    "create_masked_load": (_READ, (0, "ptrs"), (1, "mask")),
    "create_masked_store": (_WRITE, (0, "ptrs"), (2, "mask")),
    "create_atomic_load": (_ATOMIC_READ, (0, "ptr"), (1, "mask")),
    "create_atomic_store": (_ATOMIC_WRITE, (0, "ptr"), (2, "mask")),
    "create_atomic_rmw": (_ATOMIC_WRITE, (1, "ptr"), (3, "mask")),
    "create_atomic_cas": (_ATOMIC_WRITE, (0, "ptr"), None),
    "create_atomic_poll": (_ATOMIC_READ, (0, "ptr"), None),
}
HOOKED_BUILDER_METHODS = tuple(_BUILDER_HOOKS)
HOOKED_EXECUTOR_METHODS = ("__call__",)
# Read (not replaced) on the builder: the current program instance and the grid size.
READ_BUILDER_ATTRIBUTES = ("grid_idx", "grid_dim")



# ---------------------------------------------------------------------------------------------
# Support checks


def _triton_problem() -> str | None:
    """Why recording cannot run here, or None when it can."""
    problem = pinned_interpreter_problem(
        "interpreter race recording", SUPPORTED_TRITON,
        "interpreter race recording needs the Triton interpreter: set TRITON_INTERPRET=1 "
        "before triton is imported (kernels compiled for a GPU expose no per-program accesses)")
    if problem is not None:
        return problem
    version = triton_release()[0]
    try:
        from triton.runtime import interpreter
    except Exception as exc:
        return f"the Triton interpreter is not importable: {exc}"
    missing = [f"InterpreterBuilder.{m}" for m in HOOKED_BUILDER_METHODS if not hasattr(interpreter.InterpreterBuilder, m)]
    missing += [f"GridExecutor.{m}" for m in HOOKED_EXECUTOR_METHODS if not hasattr(interpreter.GridExecutor, m)]
    if not hasattr(interpreter, "interpreter_builder"):
        missing.append("interpreter_builder")
    if missing:
        return f"triton {version} interpreter lacks {', '.join(missing)}; race recording cannot hook it"
    # The hooks read the pointer and mask by position or name: check both still hold.
    import inspect

    for name, (_, *params) in _BUILDER_HOOKS.items():
        names = list(inspect.signature(getattr(interpreter.InterpreterBuilder, name)).parameters)[1:]
        for param in params:
            if param is not None and (len(names) <= param[0] or names[param[0]] != param[1]):
                return (
                    f"triton {version} InterpreterBuilder.{name}{tuple(names)} has no parameter "
                    f"{param[1]!r} at position {param[0]}; race recording cannot hook it"
                )
    return None


def races_supported() -> tuple[bool, str]:
    """(True, description) when the race oracle can run here, else (False, the reason)."""
    problem = _triton_problem()
    if problem is not None:
        return False, problem
    import triton

    return True, f"triton {triton.__version__} interpreter"


# ---------------------------------------------------------------------------------------------
# Instrumentation: installed while at least one recorder is active


_lock = threading.RLock()
_active: list[RaceRecorder] = []
_originals: dict[tuple[type, str], Any] = {}
_suppress = threading.local()


def _suppressed() -> int:
    return getattr(_suppress, "depth", 0)


def _program(builder: Any) -> tuple[int, tuple[int, int, int]]:
    grid = tuple(getattr(builder, "grid_dim", (1, 1, 1)))
    idx = getattr(builder, "grid_idx", None)
    if idx is None:
        return -1, grid  # an access outside any grid iteration
    x, y, z = idx
    return int(x + y * grid[0] + z * grid[0] * grid[1]), grid


def _dispatch(builder: Any, kind: int, ptrs: Any, mask: Any) -> None:
    recorders = [r for r in _active if r._recording]
    if not recorders:
        return
    addresses = np.asarray(ptrs.data)
    if mask is not None:
        m = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        if not m.all():  # plain loads and stores come with an all-true mask
            addresses = addresses[m]
    _record(recorders, builder, kind, ptrs, addresses.reshape(-1).astype(np.int64, copy=False))


def _record(recorders: list, builder: Any, kind: int, ptrs: Any, addresses: np.ndarray) -> None:
    """Hand the byte intervals of `addresses` (element starts) to every recording recorder."""
    if addresses.size == 0:
        return
    starts, ends = _access_intervals(addresses, _element_bytes(ptrs))
    pid, grid = _program(builder)
    for r in recorders:
        r._access(kind, pid, grid, starts, ends)


def _dispatch_changed(builder: Any, ptrs: Any, value: Any, mask: Any) -> None:
    """Record the elements of a plain store whose bytes differ from those already there (read
    before the store runs): what tells two programs storing identical bytes (address_analysis)."""
    recorders = [r for r in _active if r._recording]
    if not recorders or value is None:
        return
    from triton.runtime import interpreter

    addresses = np.asarray(ptrs.data)
    new = np.ascontiguousarray(np.broadcast_to(np.asarray(value.data), addresses.shape))
    live = np.ones(addresses.shape, dtype=bool) if mask is None else \
        np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
    old = np.ascontiguousarray(interpreter._interpreter.load(addresses, live, np.zeros_like(new), new.dtype))
    width = new.dtype.itemsize
    differs = (old.view(np.uint8).reshape(-1, width) != new.view(np.uint8).reshape(-1, width)).any(axis=1)
    _record(recorders, builder, _CHANGED, ptrs, addresses.reshape(-1)[differs & live.reshape(-1)].astype(np.int64, copy=False))


def _hooked(original: Any, kind: int, ptr: tuple[int, str], mask: tuple[int, str] | None) -> Any:
    """A builder method that records its access, then runs the original without recording the
    inner loads and stores it makes (atomic load and store are built on the masked ones).

    `ptr` and `mask` give the position (after self) and the name of those parameters, since
    some interpreter call sites pass arguments by keyword."""

    def argument(spec: tuple[int, str], args: tuple, kwargs: dict) -> Any:
        return args[spec[0]] if len(args) > spec[0] else kwargs.get(spec[1])

    def method(self, *args, **kwargs):
        if _suppressed() == 0 and _active:
            m = argument(mask, args, kwargs) if mask is not None else None
            _dispatch(self, kind, argument(ptr, args, kwargs), m)
            if kind == _WRITE:
                _dispatch_changed(self, argument(ptr, args, kwargs), args[1] if len(args) > 1 else kwargs.get("value"), m)
        _suppress.depth = _suppressed() + 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _suppress.depth -= 1

    method.__name__ = original.__name__
    method.__wrapped__ = original
    return method


def _hooked_launch(original: Any) -> Any:
    def call(self, *args, **kwargs):
        recorders = [r for r in _active if r._recording]
        if not recorders:
            return original(self, *args, **kwargs)
        kernel = getattr(self.fn, "__name__", "kernel")
        regions = _kernel_arg_regions(getattr(self, "arg_names", ()), args, kwargs)
        for r in recorders:
            r._run_begin(kernel, regions)
        try:
            return original(self, *args, **kwargs)
        finally:
            for r in recorders:
                r._run_end()

    call.__name__ = original.__name__
    call.__wrapped__ = original
    return call


def _kernel_arg_regions(names: Any, args: tuple, kwargs: Mapping[str, Any]) -> tuple[_Region, ...]:
    """Byte extents of the tensor arguments of a launch, to name addresses no LaunchInfo names."""
    pairs = list(zip(names, args)) + list(kwargs.items())
    # Pointers carry no record of the argument they came from, so arguments passing the same
    # view (an in-place kernel) are one region named after all of them.
    extents: dict[tuple[int, int], list[str]] = {}
    for name, value in pairs:
        values = [(f"{name}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, tuple) else [(name, value)]
        for n, v in values:
            ext = _view_extent(v) if hasattr(v, "data_ptr") else None
            if ext:
                extents.setdefault((ext[0], ext[0] + ext[1]), []).append(n)
    # labelled by the recorder (RaceRecorder._run_begin): after the launch that first received them
    return tuple(_Region("", start, end, kernel_arg=", ".join(ns)) for (start, end), ns in extents.items())


def _install() -> None:
    from triton.runtime import interpreter

    builder_cls = interpreter.InterpreterBuilder
    for name, (kind, ptr, mask) in _BUILDER_HOOKS.items():
        original = builder_cls.__dict__[name]
        _originals[(builder_cls, name)] = original
        setattr(builder_cls, name, _hooked(original, kind, ptr, mask))
    executor_cls = interpreter.GridExecutor
    original = executor_cls.__dict__["__call__"]
    _originals[(executor_cls, "__call__")] = original
    executor_cls.__call__ = _hooked_launch(original)


def _uninstall() -> None:
    while _originals:
        (cls, name), original = _originals.popitem()
        setattr(cls, name, original)


def instrumentation_installed() -> bool:
    """Whether the interpreter is currently hooked (by any active recorder)."""
    return bool(_originals)


# ---------------------------------------------------------------------------------------------
# Public recorder


class RaceRecorder:
    """Records per-program memory accesses of interpreter launches and reports races.

    A `LaunchRecorder`: pass it as `recorder=` to an implementation's `run` so launches get
    their stage and buffer names. Use it as a context manager; the interpreter is hooked only
    inside `with`. Entering it on an unsupported Triton, or without TRITON_INTERPRET=1, raises
    RuntimeError. Several recorders may be active at once and a recorder may be re-entered;
    the hooks are removed when the last one exits.
    """

    def __init__(self, named: Mapping[str, Any] | None = None) -> None:
        # Regions to name stray stores by (the harness passes ws1, ws2 and the output), beside
        # each launch's own views and kernel arguments.
        self._named = tuple(
            _Region(str(label), ext[0], ext[0] + ext[1])
            for label, tensor in (named or {}).items()
            if (ext := _view_extent(tensor)) is not None
        )
        self._stray: list[_StrayStores] = []
        self._argument_names: dict[tuple[int, int], str] = {}  # undeclared tensors, by extent
        self._depth = 0
        self._launches: list[_Launch] = []
        self._stack: list[_Launch] = []
        self._run: _Run | None = None
        self._run_count = 0
        self._implicit_run = False
        self._conflicts: list[_Conflict] = []
        self.runs: list[RunSummary] = []  # every interpreter launch recorded, in order

    # -- LaunchRecorder protocol

    def before_launch(self, launch: LaunchInfo) -> None:
        def regions(views: Mapping[str, Any]) -> tuple[_Region, ...]:
            out = []
            for name, view in (views or {}).items():
                ext = _view_extent(view) if view is not None else None
                if ext:
                    out.append(_Region(str(name), ext[0], ext[0] + ext[1]))
            return tuple(out)

        self._close_implicit_run()
        record = _Launch(
            index=len(self._launches),
            stage=launch.stage,
            kernel=launch.kernel,
            grid=tuple(launch.grid),
            writes=regions(launch.writes),
            reads=regions(launch.reads),
            info=launch,
        )
        self._launches.append(record)
        self._stack.append(record)

    def after_launch(self, launch: LaunchInfo) -> None:
        self._close_implicit_run()
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i].info is launch:
                del self._stack[i:]
                return
        if self._stack:  # an equal but not identical LaunchInfo: close the innermost
            self._stack.pop()

    # -- context manager

    def __enter__(self) -> RaceRecorder:
        problem = _triton_problem()
        if problem is not None:
            raise RuntimeError(problem)
        with _lock:
            if self._depth == 0:
                if not _active:
                    try:
                        _install()
                    except Exception:
                        _uninstall()  # never leave the interpreter half hooked
                        raise
                _active.append(self)
            self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            self._depth -= 1
            if self._depth == 0:
                self._close_implicit_run()
                if self._run is not None:  # exited from inside a launch: keep what was seen
                    self._finish_run()
                _active.remove(self)
                self._stack.clear()
                for launch in self._launches:
                    launch.info = None  # drop the LaunchInfo and with it the tensors
                if not _active:
                    _uninstall()

    @property
    def _recording(self) -> bool:
        return self._depth > 0

    # -- results

    def findings(self) -> list[Finding]:
        """One RACES finding per (launch, written buffer, other buffer), in launch order."""
        self._close_implicit_run()
        # Several interpreter launches inside one announced launch: keep the first one's span
        # and programs, add up the bytes.
        merged: dict[tuple, tuple[_Conflict, int]] = {}
        for c in self._conflicts:
            key = (c.launch_key, c.written, c.other)
            if key in merged:
                first, runs = merged[key]
                merged[key] = (replace(first, nbytes=first.nbytes + c.nbytes, kinds=first.kinds | c.kinds), runs + 1)
            else:
                merged[key] = (c, 1)
        out = []
        for (launch_key, _, _), (c, runs) in merged.items():
            index = launch_key[1] if launch_key[0] == "announced" else None
            out.append(_finding(c, index, runs))
        return out

    def store_extent_findings(self) -> list[Finding]:
        """One STORE_EXTENT finding per announced launch that stored a byte outside its declared
        write views, in launch order."""
        self._close_implicit_run()
        return [_stray_finding(s) for s in self._stray]

    # -- called by the hooks

    def _run_begin(self, kernel: str, args: tuple[_Region, ...]) -> None:
        self._close_implicit_run()
        if self._run is not None:
            self._finish_run()
        args = tuple(replace(r, label=self._argument_name(kernel, r)) if not r.label else r for r in args)
        self._run = _Run(self._run_count, kernel, args, self._stack[-1] if self._stack else None)
        self._run_count += 1

    def _argument_name(self, kernel: str, region: _Region) -> str:
        """A tensor no launch declared, named by the launch argument that first received it in this
        call ("the buffer argument `C` of launch 3 (stage down_gemm)"), never by its address."""
        key = (region.start, region.end)
        if key not in self._argument_names:
            launch = self._stack[-1] if self._stack else None
            where = f"launch {launch.index} (stage {launch.stage})" if launch else f"an unannounced launch of {kernel}"
            self._argument_names[key] = f"the buffer argument `{region.kernel_arg}` of {where}"
        return self._argument_names[key]

    def _run_end(self) -> None:
        if self._run is not None and not self._implicit_run:
            self._finish_run()

    def _access(self, kind: int, pid: int, grid: tuple[int, int, int], starts: np.ndarray, ends: np.ndarray) -> None:
        if self._run is None:
            # A load or store outside any interpreter launch (a device function called
            # directly): keep it as a launch of its own.
            self._run = _Run(self._run_count, "unknown", (), self._stack[-1] if self._stack else None)
            self._run_count += 1
            self._implicit_run = True
        self._run.add(kind, pid, grid, starts, ends)

    def _close_implicit_run(self) -> None:
        if self._implicit_run and self._run is not None:
            self._implicit_run = False
            self._finish_run()

    def _finish_run(self) -> None:
        run, self._run = self._run, None
        summary, conflicts = _analyse(run)
        self.runs.append(summary)
        self._conflicts.extend(conflicts)
        stray = _stray_stores(run, self._named)
        if stray is not None:
            self._stray.append(stray)


__all__ = [
    "HOOKED_BUILDER_METHODS",
    "HOOKED_EXECUTOR_METHODS",
    "RaceRecorder",
    "RunSummary",
    "SUPPORTED_TRITON",
    "instrumentation_installed",
    "races_supported",
]
