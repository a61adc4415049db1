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

Why intervals and not byte sets: a block of 64 rows x 256 elements is 64 contiguous runs,
so each access is reduced to sorted, merged `[start, end)` intervals right away (np.unique
on the element addresses), each program's intervals are merged into a disjoint union when
the program ends, and the whole launch is then checked in one sweep over the elementary
segments between all interval and buffer boundaries. Memory and time scale with the number
of runs, not the number of bytes.

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

This is the one module of diffmoe that touches Triton, and only when a recorder is entered.
It hooks interpreter internals and is therefore pinned to the Triton versions it was written
against (`SUPPORTED_TRITON`); on another version it refuses to run rather than silently
record nothing. Addresses are those the interpreter hands to the kernel, which are the
tensors' own storage for CPU tensors (device tensors are copied to the host first, so their
views could not be named and would be labelled "unnamed").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np
import torch

from ..contract import LaunchInfo
from ..report import ByteRange, Finding, Oracles

SUPPORTED_TRITON = (3, 9)

# Interpreter internals this module replaces while a recorder is active. The version pin
# exists because these names and their signatures are not a public Triton API.
# method: (access kind, pointer parameter, mask parameter), a parameter as (position after
# self, name). Atomic read-modify-write, compare-and-swap and atomic store are atomic writes;
# atomic load and poll are atomic reads.
_READ, _WRITE, _ATOMIC_READ, _ATOMIC_WRITE = range(4)
_N_KINDS = 4
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

_EMPTY = np.empty(0, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# Support checks


def _triton_problem() -> str | None:
    """Why recording cannot run here, or None when it can."""
    try:
        import triton
    except Exception as exc:  # any import failure means no interpreter to hook
        return f"triton is not importable: {exc}"
    version = str(getattr(triton, "__version__", "unknown"))
    parts = version.split(".")
    try:
        major_minor = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        major_minor = None
    if major_minor != SUPPORTED_TRITON:
        return f"interpreter race recording supports triton {SUPPORTED_TRITON[0]}.{SUPPORTED_TRITON[1]}.x, found {version}"
    try:
        interpret = bool(triton.knobs.runtime.interpret)
    except Exception:
        interpret = False
    if not interpret:
        return (
            "interpreter race recording needs the Triton interpreter: set TRITON_INTERPRET=1 "
            "before triton is imported (kernels compiled for a GPU expose no per-program accesses)"
        )
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
# Interval helpers (int64 numpy arrays of [start, end) byte addresses)


def _access_intervals(addresses: np.ndarray, element_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Merged byte intervals covered by elements starting at `addresses`."""
    if addresses.size == 0:
        return _EMPTY, _EMPTY
    # A stable sort is near linear on the sorted runs a row-major tile produces; repeated
    # addresses need no removal, as a zero gap never starts a new run.
    a = np.sort(addresses, kind="stable")
    # A gap wider than one element starts a new run; overlapping elements stay in one run.
    breaks = np.flatnonzero(np.diff(a) > element_bytes) + 1
    first = np.concatenate(([0], breaks))
    last = np.concatenate((breaks - 1, [a.size - 1]))
    return a[first], a[last] + element_bytes


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint, sorted union of intervals; touching intervals are merged."""
    if starts.size <= 1:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(new)
    return s[heads], np.maximum.reduceat(e, heads)


def _element_bytes(ptr_handle: Any) -> int:
    """Bytes per element behind a pointer handle (pointers to pointers are 8 bytes)."""
    ty = ptr_handle.dtype
    ty = getattr(ty, "scalar", ty)
    pointee = getattr(ty, "element_ty", None)
    if pointee is None:
        return 1
    if getattr(pointee, "is_ptr", lambda: False)():
        return 8
    return max(1, int(pointee.primitive_bitwidth) // 8)


def _view_extent(tensor: Any) -> tuple[int, int] | None:
    """(first byte address, byte length) spanned by a strided view, or None if empty."""
    if not isinstance(tensor, torch.Tensor):
        tensor = getattr(tensor, "base", None)  # triton's TensorWrapper (a reinterpreted tensor)
        if not isinstance(tensor, torch.Tensor):
            return None
    if tensor.numel() == 0:
        return None
    last = sum((size - 1) * abs(stride) for size, stride in zip(tensor.shape, tensor.stride()))
    return int(tensor.data_ptr()), (last + 1) * tensor.element_size()


# ---------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class _Region:
    label: str
    start: int
    end: int
    kernel_arg: str | None = None


@dataclass
class _Launch:
    """An announced launch, without the tensors (holding them would keep workspaces alive)."""

    index: int
    stage: str | None
    kernel: str
    grid: tuple[int, ...]
    writes: tuple[_Region, ...]
    reads: tuple[_Region, ...]
    info: Any = None  # the LaunchInfo object, compared by identity only


@dataclass
class RunSummary:
    """One interpreter launch as recorded: what it touched and how many conflicts it had."""

    launch: int | None  # index of the announced launch, None when unannounced
    stage: str | None
    kernel: str
    grid: tuple[int, int, int]
    programs: int  # program instances that accessed memory
    bytes_read: int  # distinct bytes loaded (plain or atomic) by any program
    bytes_written: int  # distinct bytes stored (plain or atomic) by any program
    conflicting_bytes: int  # distinct bytes involved in a race


@dataclass
class _Conflict:
    launch_key: tuple
    stage: str | None
    kernel: str
    grid: tuple[int, int, int]
    written: str
    other: str
    kinds: set[str]
    first_kind: str  # the kind at the first conflicting byte, which names the programs
    nbytes: int
    span: tuple[int, int]  # absolute addresses of the first conflicting span
    written_base: int
    other_base: int
    writer: int
    other_program: int
    written_arg: str | None
    other_arg: str | None


class _Run:
    """Accesses of one interpreter launch, merged per program as programs finish."""

    def __init__(self, index: int, kernel: str, args: tuple[_Region, ...], launch: _Launch | None) -> None:
        self.index = index
        self.kernel = kernel
        self.args = args
        self.launch = launch
        self.grid: tuple[int, int, int] | None = None
        self.current: int | None = None
        self.pending: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(_N_KINDS)]
        # Per kind: lists of (program ids, starts, ends) for finished programs.
        self.done: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = [[] for _ in range(_N_KINDS)]
        self.programs: set[int] = set()
        self.repeated = False

    def add(self, kind: int, pid: int, grid: tuple[int, int, int], starts: np.ndarray, ends: np.ndarray) -> None:
        if self.grid is None:
            self.grid = grid
        if pid != self.current:
            self.flush()
            self.current = pid
            # A program seen again (never on the sequential interpreter) must still count as
            # one program in the sweep, so its pieces are merged again at the end.
            self.repeated |= pid in self.programs
            self.programs.add(pid)
        self.pending[kind].append((starts, ends))

    def flush(self) -> None:
        """Merge the current program's accesses; programs run one at a time, so it is done."""
        if self.current is None:
            return
        for kind in range(_N_KINDS):
            parts = self.pending[kind]
            if not parts:
                continue
            s, e = _union(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
            self.done[kind].append((np.full(s.size, self.current, dtype=np.int64), s, e))
            self.pending[kind] = []
        self.current = None

    def kind_arrays(self, kind: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = self.done[kind]
        if not parts:
            return _EMPTY, _EMPTY, _EMPTY
        pids, starts, ends = (np.concatenate([p[i] for p in parts]) for i in range(3))
        if self.repeated:
            merged = [(pid, *_union(starts[pids == pid], ends[pids == pid])) for pid in np.unique(pids).tolist()]
            pids = np.concatenate([np.full(m[1].size, m[0], dtype=np.int64) for m in merged])
            starts = np.concatenate([m[1] for m in merged])
            ends = np.concatenate([m[2] for m in merged])
        return pids, starts, ends


def _covering(pids: np.ndarray, starts: np.ndarray, ends: np.ndarray, address: int) -> list[int]:
    hit = (starts <= address) & (ends > address)
    return sorted(set(pids[hit].tolist()))


def _first_pair(writers: list[int], others: list[int]) -> tuple[int, int] | None:
    for p in writers:
        for q in others:
            if p != q:
                return p, q
    return None


def _analyse(run: _Run) -> tuple[RunSummary, list[_Conflict]]:
    """Find the races of one finished run."""
    run.flush()
    launch = run.launch
    grid = run.grid or (1, 1, 1)
    arrays = [run.kind_arrays(k) for k in range(_N_KINDS)]

    def distinct(kinds: tuple[int, ...]) -> int:
        s = np.concatenate([arrays[k][1] for k in kinds])
        e = np.concatenate([arrays[k][2] for k in kinds])
        us, ue = _union(s, e)
        return int((ue - us).sum())

    summary = RunSummary(
        launch=launch.index if launch else None,
        stage=launch.stage if launch else None,
        kernel=run.kernel,
        grid=grid,
        programs=len(run.programs),
        bytes_read=distinct((_READ, _ATOMIC_READ)),
        bytes_written=distinct((_WRITE, _ATOMIC_WRITE)),
        conflicting_bytes=0,
    )
    if arrays[_WRITE][0].size == 0 and arrays[_ATOMIC_WRITE][0].size == 0:
        return summary, []

    writes = launch.writes if launch else ()
    reads = launch.reads if launch else ()
    regions = (*writes, *reads, *run.args)
    bounds = np.unique(
        np.concatenate(
            [a[i] for a in arrays for i in (1, 2)]
            + [np.array([r.start for r in regions] + [r.end for r in regions], dtype=np.int64)]
        )
    )
    n = bounds.size

    # Per kind and segment: how many programs cover it and the sum of their ids. Each program's
    # intervals are disjoint, so the count is the number of distinct programs, and when it is 1
    # the sum is that program's id.
    counts, sums = [], []
    for pids, s, e in arrays:
        i0 = np.searchsorted(bounds, s)
        i1 = np.searchsorted(bounds, e)
        c = np.bincount(i0, minlength=n) - np.bincount(i1, minlength=n)
        w = np.bincount(i0, weights=pids, minlength=n) - np.bincount(i1, weights=pids, minlength=n)
        counts.append(np.cumsum(c)[:-1])
        sums.append(np.cumsum(w)[:-1].astype(np.int64))

    def other_program(a: int, b: int) -> np.ndarray:
        """Segments where some program of kind a and a different program of kind b meet."""
        ca, sa, cb, sb = counts[a], sums[a], counts[b], sums[b]
        return (ca >= 1) & (cb >= 1) & ((ca >= 2) | (cb >= 2) | (sa != sb))

    other_writes = (counts[_WRITE] >= 2) | other_program(_WRITE, _ATOMIC_WRITE)
    other_reads = (
        other_program(_WRITE, _READ) | other_program(_WRITE, _ATOMIC_READ) | other_program(_ATOMIC_WRITE, _READ)
    )
    racy = other_writes | other_reads
    if not racy.any():
        return summary, []
    lengths = np.diff(bounds)
    summary.conflicting_bytes = int(lengths[racy].sum())

    # Name the bytes: a written byte by the views the launch declared as written first, the
    # other side of a read conflict by the views declared as read first, then kernel arguments.
    seg = np.flatnonzero(racy)
    addr = bounds[seg]
    write_order = (*writes, *reads, *run.args)
    read_order = (*reads, *writes, *run.args)

    def region_index(order: tuple[_Region, ...]) -> np.ndarray:
        idx = np.full(seg.size, -1, dtype=np.int64)
        for i, r in enumerate(order):
            idx[(idx < 0) & (addr >= r.start) & (addr < r.end)] = i
        return idx

    w_idx = region_index(write_order)
    r_idx = region_index(read_order)
    # Group by label, not by region: one name may appear among both reads and writes.
    names = sorted({r.label for r in regions}) + ["\0unnamed"]
    name_id = {n: i for i, n in enumerate(names)}

    def label_ids(order: tuple[_Region, ...], idx: np.ndarray) -> np.ndarray:
        table = np.array([name_id[r.label] for r in order] + [len(names) - 1], dtype=np.int64)
        return table[idx]  # idx -1 picks the trailing "unnamed"

    w_lab = label_ids(write_order, w_idx)
    r_lab = label_ids(read_order, r_idx)
    ww = other_writes[seg]
    wr = other_reads[seg]
    # One row per (segment, conflict kind): written label, other label, segment position.
    rows_w = np.concatenate([w_lab[ww], w_lab[wr]])
    rows_o = np.concatenate([w_lab[ww], r_lab[wr]])
    rows_j = np.concatenate([np.flatnonzero(ww), np.flatnonzero(wr)])
    rows_k = np.concatenate([np.zeros(int(ww.sum()), dtype=np.int64), np.ones(int(wr.sum()), dtype=np.int64)])
    keys = rows_w * len(names) + rows_o

    conflicts = []
    for key in np.unique(keys):
        sel = keys == key
        js = np.unique(rows_j[sel])  # positions into seg, ascending address
        kinds = {("write-write", "write-read")[k] for k in np.unique(rows_k[sel]).tolist()}
        segs = seg[js]
        nbytes = int(lengths[segs].sum())
        first = int(js[0])
        run_end = 0
        while run_end + 1 < segs.size and segs[run_end + 1] == segs[run_end] + 1:
            run_end += 1
        span = (int(bounds[segs[0]]), int(bounds[segs[run_end] + 1]))
        at = span[0]
        # The kind flagged at the first segment picks which programs to name.
        first_kinds = rows_k[sel][rows_j[sel] == first]
        writers = _covering(*arrays[_WRITE], at)
        if 0 in first_kinds:
            kind_first = "write-write"
            pair = _first_pair(writers, writers + _covering(*arrays[_ATOMIC_WRITE], at))
            other_order, other_i = write_order, int(w_idx[first])
        else:
            kind_first = "write-read"
            plain_readers = _covering(*arrays[_READ], at)
            readers = sorted(set(plain_readers + _covering(*arrays[_ATOMIC_READ], at)))
            pair = _first_pair(writers, readers) or _first_pair(_covering(*arrays[_ATOMIC_WRITE], at), plain_readers)
            other_order, other_i = read_order, int(r_idx[first])
        writer, other = pair if pair else (-1, -1)

        def describe(order: tuple[_Region, ...], i: int) -> tuple[str, int, str | None]:
            if i < 0:
                return f"unnamed@0x{span[0]:x}", span[0], None
            r = order[i]
            return r.label, r.start, r.kernel_arg

        wlabel, wbase, warg = describe(write_order, int(w_idx[first]))
        olabel, obase, oarg = describe(other_order, other_i)
        conflicts.append(
            _Conflict(
                launch_key=("announced", launch.index) if launch else ("unannounced", run.index),
                stage=launch.stage if launch else None,
                kernel=run.kernel,
                grid=grid,
                written=wlabel,
                other=olabel,
                kinds=kinds,
                first_kind=kind_first,
                nbytes=nbytes,
                span=span,
                written_base=wbase,
                other_base=obase,
                writer=writer,
                other_program=other,
                written_arg=warg,
                other_arg=oarg,
            )
        )
    return summary, conflicts


@dataclass
class _StrayStores:
    """Bytes one announced launch stored outside every view it declared it writes."""

    launch: _Launch
    kernel: str
    nbytes: int
    span: tuple[int, int]  # absolute addresses of the first stray run
    label: str  # the named region (or launch view, or kernel argument) the first run falls in
    base: int  # that region's first address
    declared: tuple[str, ...]


def _stray_stores(run: _Run, named: tuple[_Region, ...]) -> _StrayStores | None:
    """Store extent: every byte a launch stores must lie in a view it declared as written.

    Order-free like the race analysis: a sweep over the boundaries of the stored intervals and
    the declared write views. Unannounced launches declared nothing and are not judged here."""
    launch = run.launch
    if launch is None:
        return None
    parts = [run.kind_arrays(k) for k in (_WRITE, _ATOMIC_WRITE)]
    starts = np.concatenate([p[1] for p in parts])
    ends = np.concatenate([p[2] for p in parts])
    if starts.size == 0:
        return None
    ss, se = _union(starts, ends)
    declared = launch.writes
    ds = np.array([r.start for r in declared], dtype=np.int64)
    de = np.array([r.end for r in declared], dtype=np.int64)
    bounds = np.unique(np.concatenate([ss, se, ds, de]))
    n = bounds.size

    def covered(s: np.ndarray, e: np.ndarray) -> np.ndarray:
        c = np.bincount(np.searchsorted(bounds, s), minlength=n) - np.bincount(np.searchsorted(bounds, e), minlength=n)
        return np.cumsum(c)[:-1] > 0

    stray = covered(ss, se) & ~covered(ds, de) if ds.size else covered(ss, se)
    if not stray.any():
        return None
    seg = np.flatnonzero(stray)
    lengths = np.diff(bounds)
    last = 0
    while last + 1 < seg.size and seg[last + 1] == seg[last] + 1:
        last += 1
    span = (int(bounds[seg[0]]), int(bounds[seg[last] + 1]))
    label, base = f"unnamed@0x{span[0]:x}", span[0]
    for r in (*named, *launch.reads, *run.args):
        if r.start <= span[0] < r.end:
            label, base = r.label, r.start
            break
    return _StrayStores(launch, run.kernel, int(lengths[seg].sum()), span, label, base,
                        tuple(sorted({r.label for r in declared})))


def _stray_finding(s: _StrayStores) -> Finding:
    where = ByteRange(s.label, s.span[0] - s.base, s.span[1] - s.base)
    declared = ", ".join(s.declared) or "nothing"
    return Finding(
        oracle=Oracles.STORE_EXTENT,
        stage=s.launch.stage,
        buffers=[s.label],
        byte_ranges=[where],
        message=(f"launch {s.kernel} stores {s.nbytes} byte{'s' if s.nbytes != 1 else ''} outside the views it "
                 f"declared it writes ({declared}), first at {where}"),
        figures={"kernel": s.kernel, "launch": s.launch.index, "stray_bytes": s.nbytes, "declared_writes": list(s.declared)},
    )


def _finding(c: _Conflict, launch_index: int | None, runs: int) -> Finding:
    w_range = ByteRange(c.written, c.span[0] - c.written_base, c.span[1] - c.written_base)
    o_range = ByteRange(c.other, c.span[0] - c.other_base, c.span[1] - c.other_base)
    kinds = sorted(c.kinds, reverse=True)  # write-write before write-read
    verb = "loads" if kinds == ["write-read"] else ("also stores" if kinds == ["write-write"] else "loads or stores")
    message = (
        f"program {c.writer} of {c.kernel} stores {w_range} while program {c.other_program} of the same launch "
        f"{verb} {o_range}: {c.nbytes} byte{'s' if c.nbytes != 1 else ''} shared between programs, "
        f"so the result depends on the order the programs run in"
    )
    figures: dict[str, Any] = {
        "kernel": c.kernel,
        "launch": launch_index if launch_index is not None else "unannounced",
        "grid": list(c.grid),
        "writer_program": c.writer,
        "other_program": c.other_program,
        "conflicting_bytes": c.nbytes,
        "kind": ", ".join(kinds),
    }
    if c.written_arg:
        figures["written_kernel_arg"] = c.written_arg
    if c.other_arg:
        figures["other_kernel_arg"] = c.other_arg
    if runs > 1:
        figures["interpreter_launches"] = runs
    ranges = [w_range] if o_range == w_range else [w_range, o_range]
    return Finding(
        oracle=Oracles.RACES,
        message=message,
        stage=c.stage,
        buffers=[c.written, c.other],
        byte_ranges=ranges,
        figures=figures,
    )


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
    addresses = addresses.reshape(-1).astype(np.int64, copy=False)
    if addresses.size == 0:
        return
    starts, ends = _access_intervals(addresses, _element_bytes(ptrs))
    pid, grid = _program(builder)
    for r in recorders:
        r._access(kind, pid, grid, starts, ends)


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
    return tuple(
        _Region(f"unnamed@0x{start:x}", start, end, kernel_arg=", ".join(ns)) for (start, end), ns in extents.items()
    )


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
        self._run = _Run(self._run_count, kernel, args, self._stack[-1] if self._stack else None)
        self._run_count += 1

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
