"""The memory-safe interpreter: every interpreted load and store checked before it runs.

Under `TRITON_INTERPRET=1` a kernel's `tl.load` / `tl.store` dereference raw host addresses
(`triton._C.libtriton.interpreter.load` / `store`): a store with a dropped mask writes past the
end of its tensor into the process heap, and the harness then dies of it ("corrupted size vs.
prev_size", SIGABRT, issue 28) before any oracle can say which launch did it. `MemoryGuard`
hooks the interpreter's memory methods (`create_masked_load`, `create_masked_store`,
the atomic ones; `tl.load` without a mask and tensor-descriptor accesses go through the
first two) and, before each runs, keeps only the
lanes whose element lies inside the live allocation the access belongs to: the others are masked off (a load gives its
`other` value, zero without one; a compare-and-swap, which has no mask, is pointed at a scratch
word of the guard's own). The refused lanes are recorded as `OutOfBounds` events; the bounds
oracle (diffmoe/oracles/bounds.py) words them.

Which allocations are live: a kernel can only reach memory through the pointers it is given,
and under the interpreter a pointer argument is a tensor whose storage the kernel addresses
directly (CPU tensors keep their own storage; device tensors are copied to the host storage
the kernel then sees). So the allocations of one launch are the storages (`data_ptr`,
`nbytes`) of its tensor arguments, tuples and tensor descriptors included, taken where the
interpreter makes its host copies (`GridExecutor._init_args_hst`). That covers the workspaces,
the output, the problem's inputs and every tensor the implementation allocated during the call,
without hooking torch's allocator. An access inside a storage but outside the view the launch
meant (a workspace's guard bytes, another buffer carved from the same workspace) is memory-safe
and left to the red-zone and store-extent oracles.

Accesses made outside any launch (a jit function called directly) are not judged: no launch
names their allocations. The hooks are installed while a guard is active (a context manager,
re-entrant, several guards at once) and removed when the last one exits, so they nest with the
race recorder's hooks (diffmoe/interpreter/address_recorder.py): the guard entered inside the
recorder runs first, so the recorder records only the accesses that were performed.

Owns the hooks and the raw events. Must not word a finding (diffmoe/oracles/bounds.py does).

Longer than 400 lines because the hooks and the guard share the module's hook state (the active
guards, the saved originals, the launch in flight) and must be read together to see that the
interpreter is restored on every path, as in the race recorder.
"""

from __future__ import annotations

import linecache
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from diffmoe.contract import LaunchInfo
from diffmoe.interpreter.triton_pin import pinned_interpreter_problem, triton_release
from diffmoe.interpreter import wrap_watch
from diffmoe.interpreter.address_analysis import _access_intervals, _element_bytes, _view_extent
from diffmoe.interpreter.wrap_watch import AddressWrap, Headroom, Wrap, live_wraps

SUPPORTED_TRITON = (3, 9)
# method: (access kind, pointer parameter, mask parameter), a parameter as (position after self,
# name), as diffmoe/interpreter/address_recorder.py reads them.
_BUILDER_HOOKS: dict[str, tuple[str, tuple[int, str], tuple[int, str] | None]] = {
    "create_masked_load": ("load", (0, "ptrs"), (1, "mask")),
    "create_masked_store": ("store", (0, "ptrs"), (2, "mask")),
    "create_atomic_load": ("atomic", (0, "ptr"), (1, "mask")),
    "create_atomic_store": ("atomic", (0, "ptr"), (2, "mask")),
    "create_atomic_rmw": ("atomic", (1, "ptr"), (3, "mask")),
    "create_atomic_cas": ("atomic", (0, "ptr"), None),
}
HOOKED_BUILDER_METHODS = tuple(_BUILDER_HOOKS)
HOOKED_EXECUTOR_METHODS = ("_init_args_hst", "_restore_args_dev")


@dataclass(frozen=True)
class Allocation:
    """One storage a launch was given: [start, end) host addresses and the arguments passing it."""

    start: int
    end: int
    args: tuple[str, ...]
    views: tuple[tuple[str, int, int], ...] = ()  # (argument, view start, view end) within it


@dataclass
class OutOfBounds:
    """Accesses of one interpreter launch that fell outside the allocation they belong to (module doc)."""

    launch: int  # interpreter launch index within the guard
    kernel: str
    kind: str  # load, store or atomic
    program: int  # the first program that made one
    grid: tuple[int, int, int]
    span: tuple[int, int]  # the first refused byte run, absolute addresses
    nbytes: int  # refused bytes, all programs
    programs: int  # programs that made one
    nearest: Allocation | None  # the allocation closest to `span`
    stage: str | None = None  # of the announced launch in flight
    announced: int | None = None  # its index among the call's announced launches
    views: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # its named views, absolute extents


def _triton_problem() -> str | None:
    problem = pinned_interpreter_problem(
        "the bounds guard", SUPPORTED_TRITON,
        "the bounds guard checks interpreted accesses: set TRITON_INTERPRET=1 before triton is imported "
        "(compiled kernels expose no per-access addresses)")
    if problem is not None:
        return problem
    version = triton_release()[0]
    from triton.runtime import interpreter

    missing = [f"InterpreterBuilder.{m}" for m in HOOKED_BUILDER_METHODS if not hasattr(interpreter.InterpreterBuilder, m)]
    missing += [f"GridExecutor.{m}" for m in HOOKED_EXECUTOR_METHODS if not hasattr(interpreter.GridExecutor, m)]
    if missing:
        return f"triton {version} interpreter lacks {', '.join(missing)}; the bounds guard cannot hook it"
    return None


def guard_for_call(named: Mapping[str, Any], stage: str | None = None) -> tuple[MemoryGuard | None, str | None]:
    """(a guard for one call of the implementation, None) or (None, why no access can be guarded
    here). Without a GPU and with Triton not imported yet, Triton here can only be the
    interpreter (as the race recorder assumes too)."""
    import os
    import sys

    if "triton" not in sys.modules:
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
    problem = _triton_problem()
    return (None, problem) if problem is not None else (MemoryGuard(named, stage), None)


# ---------------------------------------------------------------------------------------------
# Hooks: installed while at least one guard is active

_lock = threading.RLock()
_active: list[MemoryGuard] = []
_originals: dict[tuple[type, str], Any] = {}
_state = threading.local()  # .launch: the allocations of the interpreter launch in flight


def _storage_of(value: Any) -> Any:
    tensor = getattr(value, "base", value) if not hasattr(value, "untyped_storage") else value
    storage = getattr(tensor, "untyped_storage", None)
    return (tensor, storage()) if storage is not None else (None, None)


def _allocations(names: Any, args: Any, kwargs: Mapping[str, Any]) -> tuple[Allocation, ...]:
    """The storages of a launch's tensor arguments (host copies, as the kernel addresses them)."""
    found: dict[tuple[int, int], tuple[list[str], list[tuple[str, int, int]]]] = {}

    def visit(name: str, value: Any) -> None:
        if isinstance(value, tuple):
            for i, v in enumerate(value):
                visit(f"{name}[{i}]", v)
            return
        if not hasattr(value, "data_ptr"):
            inner = getattr(value, "base", None)  # a tensor descriptor
            if inner is not None and hasattr(inner, "data_ptr"):
                visit(name, inner)
            return
        tensor, storage = _storage_of(value)
        if storage is None or tensor.device.type != "cpu":
            return
        start = int(storage.data_ptr())
        key = (start, start + int(storage.nbytes()))
        names_, views = found.setdefault(key, ([], []))
        names_.append(name)
        if tensor.numel():
            last = sum((s - 1) * abs(st) for s, st in zip(tensor.shape, tensor.stride()))
            views.append((name, int(tensor.data_ptr()), int(tensor.data_ptr()) + (last + 1) * tensor.element_size()))

    for name, value in [*zip(names, args), *kwargs.items()]:
        visit(str(name), value)
    return tuple(Allocation(s, e, tuple(n), tuple(v)) for (s, e), (n, v) in found.items())


class _Launch:
    """The interpreter launch in flight: its allocations as sorted arrays, and its events."""

    def __init__(self, kernel: str, allocations: tuple[Allocation, ...]) -> None:
        self.kernel = kernel
        self.allocations = tuple(sorted(allocations, key=lambda a: a.start))
        self.starts = np.array([a.start for a in self.allocations], dtype=np.int64)
        self.ends = np.array([a.end for a in self.allocations], dtype=np.int64)
        self.guards = [(g, g._begin(kernel)) for g in _active if g._depth > 0]


def _hooked_init_args(original: Any) -> Any:
    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = original(self, args_dev, kwargs)
        if _active:
            kernel = getattr(self.fn, "__name__", "kernel")
            _state.launch = _Launch(kernel, _allocations(getattr(self, "arg_names", ()), args_hst, kwargs_hst))
            wrap_watch.begin_launch()
        return args_hst, kwargs_hst

    init_args.__wrapped__ = original
    return init_args


def _hooked_restore(original: Any) -> Any:
    def restore(self, *args, **kwargs):
        launch, _state.launch = getattr(_state, "launch", None), None
        near = wrap_watch.end_launch()
        if launch is not None and near is not None:
            for guard, index in launch.guards:
                guard._near(index, launch, *near)
        return original(self, *args, **kwargs)

    restore.__wrapped__ = original
    return restore


def _addresses(ptrs: Any) -> np.ndarray:
    """The pointer block's addresses as int64, without a copy for the interpreter's uint64 ones."""
    data = np.asarray(ptrs.data)
    return data.view(np.int64) if data.dtype == np.uint64 else data.astype(np.int64)


def _refused(launch: _Launch, ptrs: Any, mask: Any) -> tuple[np.ndarray, int] | None:
    """(the lanes to refuse, a bool array of the pointers' shape; the index of the allocation the
    access belongs to, or -1), or None when every live lane is inside one allocation.

    One access is one pointer block built from one base pointer, so all its lanes must lie in one
    allocation: the one holding its first live lane (else the one holding most of them). Lanes
    in another argument's storage are refused too, so that where an overflow lands (the heap
    puts small tensors side by side) cannot change the verdict."""
    addresses = _addresses(ptrs)
    if addresses.size == 0:
        return None
    size = _element_bytes(ptrs)
    # fastest path, before the mask is looked at: every lane, masked or not, inside one allocation
    lo, hi = int(addresses.min()), int(addresses.max()) + size
    i = int(np.searchsorted(launch.starts, lo, side="right")) - 1
    if i >= 0 and hi <= launch.ends[i]:
        return None
    live = None
    if mask is not None:
        live = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        if live.all():
            live = None
    picked = addresses if live is None else addresses[live]
    if picked.size == 0:
        return None
    lo, hi = int(picked.min()), int(picked.max()) + size
    # fast path: every lane inside one allocation (allocations are contiguous)
    i = int(np.searchsorted(launch.starts, lo, side="right")) - 1
    if i >= 0 and hi <= launch.ends[i]:
        return None
    first = int(picked.reshape(-1)[0])
    home, most = -1, 0
    for j, (start, end) in enumerate(zip(launch.starts.tolist(), launch.ends.tolist())):
        if start <= first and first + size <= end:
            home = j
            break
        count = int(((picked >= start) & (picked + size <= end)).sum())
        if count > most:
            home, most = j, count
    if home < 0:
        inside = np.zeros(addresses.shape, dtype=bool)
    else:
        inside = (addresses >= launch.starts[home]) & (addresses + size <= launch.ends[home])
    refused = ~inside if live is None else (live & ~inside)
    return (refused, home) if refused.any() else None


_SCRATCH = np.zeros(2, dtype=np.int64)  # a compare-and-swap's refused lanes land here


def _program(builder: Any) -> tuple[int, tuple[int, int, int]]:
    """(the linear index of the program in flight, the grid)."""
    grid = tuple(getattr(builder, "grid_dim", (1, 1, 1)))
    x, y, z = getattr(builder, "grid_idx", None) or (-1, 0, 0)
    return int(x + y * grid[0] + z * grid[0] * grid[1]), grid


def _hooked(original: Any, kind: str, ptr: tuple[int, str], mask: tuple[int, str] | None) -> Any:
    def method(self, *args, **kwargs):
        launch = getattr(_state, "launch", None)
        if launch is None or not launch.guards:
            return original(self, *args, **kwargs)
        args = list(args)

        def get(spec):
            return args[spec[0]] if len(args) > spec[0] else kwargs.get(spec[1])

        def put(spec, value):
            if len(args) > spec[0]:
                args[spec[0]] = value
            else:
                kwargs[spec[1]] = value

        ptrs = get(ptr)
        m = get(mask) if mask is not None else None
        wrapped = live_wraps(ptrs, m)
        if wrapped is not None:
            pid, grid = _program(self)
            for guard, index in launch.guards:
                guard._wrapped(index, launch, kind, pid, grid, *wrapped)
        verdict = _refused(launch, ptrs, m)
        if verdict is None:
            return original(self, *args, **kwargs)
        refused, home = verdict
        addresses = _addresses(ptrs)
        bad = np.broadcast_to(addresses, refused.shape)[refused]
        pid, grid = _program(self)
        for guard, index in launch.guards:
            guard._refuse(index, launch, kind, pid, grid, bad, _element_bytes(ptrs), home)
        from triton.runtime.interpreter import TensorHandle

        if mask is not None:
            keep = np.broadcast_to(np.asarray(m.data, dtype=bool), refused.shape) & ~refused  # never None here
            put(mask, TensorHandle(keep, m.dtype))
        else:  # no mask to clear: point the refused lanes at the scratch word
            _SCRATCH[:] = 0
            safe = np.where(refused, np.uint64(_SCRATCH.ctypes.data), np.asarray(ptrs.data).astype(np.uint64))
            put(ptr, TensorHandle(safe.astype(np.asarray(ptrs.data).dtype), ptrs.dtype))
        return original(self, *args, **kwargs)

    method.__name__ = original.__name__
    method.__wrapped__ = original
    return method


def _install() -> None:
    from triton.runtime import interpreter

    builder_cls = interpreter.InterpreterBuilder
    for name, (kind, ptr, mask) in _BUILDER_HOOKS.items():
        original = builder_cls.__dict__[name]
        _originals[(builder_cls, name)] = original
        setattr(builder_cls, name, _hooked(original, kind, ptr, mask))
    for name, hook in wrap_watch.HOOKS.items():  # the overflow watch's marks (diffmoe/interpreter/wrap_watch.py)
        original = builder_cls.__dict__[name]
        _originals[(builder_cls, name)] = original
        setattr(builder_cls, name, hook(original, name))
    executor_cls = interpreter.GridExecutor
    for name, wrap in (("_init_args_hst", _hooked_init_args), ("_restore_args_dev", _hooked_restore)):
        original = executor_cls.__dict__[name]
        _originals[(executor_cls, name)] = original
        setattr(executor_cls, name, wrap(original))


def _uninstall() -> None:
    while _originals:
        (cls, name), original = _originals.popitem()
        setattr(cls, name, original)
    _state.launch = None


def instrumentation_installed() -> bool:
    return bool(_originals)


class MemoryGuard:
    """While active (`with guard:`), refuses every interpreted access outside the launch's
    allocations and records it (`events`). A `LaunchRecorder` too: chained into a call's
    recorder, it learns the stage and the named views of the announced launch in flight, which
    name the nearest buffer. Entering it where the interpreter cannot be hooked raises
    RuntimeError (`guard_for_call` says why instead)."""

    def __init__(self, named: Mapping[str, Any] | None = None, stage: str | None = None) -> None:
        self._named = dict(named or {})
        self._stage = stage  # of launches no LaunchInfo announces (teacher forcing's run_stage)
        self.events: list[OutOfBounds] = []
        self.wraps: list[AddressWrap] = []  # accesses through wrapped offsets (wrap_watch.py): performed, not refused
        self.headroom: list[Headroom] = []  # launches whose 32-bit pointer offsets came near 2^31 (wrap_watch.py)
        self._depth = 0
        self._launches = 0
        self._announced: list[LaunchInfo] = []
        self._announced_count = 0
        # one event per (launch, access kind, allocation): a slip repeats in every program
        self._by_key: dict[tuple[int, str, int], tuple[OutOfBounds, set[int]]] = {}
        self._wraps_by_key: dict[tuple, tuple[AddressWrap, set[int]]] = {}

    # -- LaunchRecorder protocol
    def before_launch(self, launch: LaunchInfo) -> None:
        self._announced.append(launch)
        self._announced_count += 1
        self._announced_index = self._announced_count - 1

    def after_launch(self, launch: LaunchInfo) -> None:
        if self._announced and self._announced[-1] is launch:
            self._announced.pop()

    # -- context manager
    def __enter__(self) -> MemoryGuard:
        problem = _triton_problem()
        if problem is not None:
            raise RuntimeError(problem)
        with _lock:
            if self._depth == 0:
                if not _active:
                    try:
                        _install()
                    except Exception:
                        _uninstall()
                        raise
                _active.append(self)
            self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            self._depth -= 1
            if self._depth == 0:
                _active.remove(self)
                self._announced.clear()
                if not _active:
                    _uninstall()

    # -- called by the hooks
    def _begin(self, kernel: str) -> int:
        self._launches += 1
        return self._launches - 1

    def _views(self) -> dict[str, tuple[int, int]]:
        views: dict[str, tuple[int, int]] = {}
        sources = [self._named]
        if self._announced:
            info = self._announced[-1]
            sources = [dict(info.writes or {}), dict(info.reads or {}), self._named]
        for source in sources:
            for name, tensor in source.items():
                ext = _view_extent(tensor) if tensor is not None else None
                if ext is not None and name not in views:
                    views[str(name)] = (ext[0], ext[0] + ext[1])
        return views

    def _refuse(self, index: int, launch: _Launch, kind: str, pid: int, grid: tuple[int, int, int],
                addresses: np.ndarray, size: int, home: int) -> None:
        starts, ends = _access_intervals(addresses.reshape(-1), size)
        outside = int((ends - starts).sum())
        nearest = launch.allocations[home] if home >= 0 else _nearest(launch.allocations, int(starts[0]), int(ends[0]))
        if nearest is not None:  # an element straddling its end
            outside -= int(np.clip(np.minimum(ends, nearest.end) - np.maximum(starts, nearest.start), 0, None).sum())
        key = (index, kind, -1 if nearest is None else nearest.start)
        if self._counted(self._by_key, key, pid, "nbytes", outside):
            return
        event = OutOfBounds(index, launch.kernel, kind, pid, grid, (int(starts[0]), int(ends[0])), outside, 1, nearest,
                            **self._stage_of_launch(), views=self._views())
        self._by_key[key] = (event, {pid})
        self.events.append(event)

    def _wrapped(self, index: int, launch: _Launch, kind: str, pid: int, grid: tuple[int, int, int],
                 wrap: Wrap, lanes: int) -> None:
        key = (index, kind, wrap.file, wrap.line)  # one event per launch, access kind and line that wrapped
        if self._counted(self._wraps_by_key, key, pid, "lanes", lanes):
            return
        event = AddressWrap(index, launch.kernel, kind, pid, grid, wrap, lanes, 1, **self._stage_of_launch())
        self._wraps_by_key[key] = (event, {pid})
        self.wraps.append(event)

    def _near(self, index: int, launch: _Launch, peak: int, where: tuple[str, int, str]) -> None:
        file, line, function = where
        code = linecache.getline(file, line).strip() if file else ""
        self.headroom.append(Headroom(index, launch.kernel, peak, file, line, function, code, **self._stage_of_launch()))

    @staticmethod
    def _counted(table: dict, key: tuple, pid: int, amount: str, add: int) -> bool:
        """Add to the event already recorded under `key` (a slip repeats in every program): its
        `amount` and its programs; False when there is none yet."""
        if key not in table:
            return False
        event, programs = table[key]
        setattr(event, amount, getattr(event, amount) + add)
        programs.add(pid)
        event.programs = len(programs)
        return True

    def _stage_of_launch(self) -> dict:
        """The stage and announced index of the launch in flight (or the guard's own stage)."""
        info = self._announced[-1] if self._announced else None
        return dict(stage=info.stage if info is not None else self._stage,
                    announced=getattr(self, "_announced_index", None) if info is not None else None)


def _nearest(allocations: tuple[Allocation, ...], start: int, end: int) -> Allocation | None:
    best, distance = None, None
    for a in allocations:
        d = start - a.end if start >= a.end else (a.start - end if end <= a.start else 0)
        if distance is None or d < distance:
            best, distance = a, d
    return best


__all__ = [
    "Allocation", "HOOKED_BUILDER_METHODS", "HOOKED_EXECUTOR_METHODS", "MemoryGuard",
    "OutOfBounds", "SUPPORTED_TRITON", "guard_for_call", "instrumentation_installed",
]
