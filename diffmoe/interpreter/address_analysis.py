"""What one interpreter launch's per-program accesses mean: races and stray stores.

Owns the pure analysis behind the races and store-extent oracles: byte intervals per program,
the order-free sweep for conflicts between programs of one launch, stores outside the views a
launch declared, and the findings that name them. It touches no Triton and no tensor memory;
the recording is diffmoe/interpreter/address_recorder.py's (it feeds `_Run` as programs access memory).

Why intervals and not byte sets: a block of 64 rows x 256 elements is 64 contiguous runs,
so each access is reduced to sorted, merged `[start, end)` intervals right away (np.unique
on the element addresses), each program's intervals are merged into a disjoint union when
the program ends, and the whole launch is then checked in one sweep over the elementary
segments between all interval and buffer boundaries. Memory and time scale with the number
of runs, not the number of bytes.

Longer than 400 lines because the sweep, its conflict records and the findings that describe a
conflict (which programs, which buffers, which bytes) share private record types that nothing
outside the two address oracles should see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from diffmoe.findings import ByteRange, Finding, Oracles

# Access kinds. Atomic read-modify-write, compare-and-swap and atomic store are atomic writes;
# atomic load and poll are atomic reads.
_READ, _WRITE, _ATOMIC_READ, _ATOMIC_WRITE = range(4)
# Not an access of its own: the bytes of a plain store that differ from the bytes there before it
# (issue 48: two programs storing identical bytes race without changing the result this time).
_CHANGED = 4
_N_KINDS = 5
_EMPTY = np.empty(0, dtype=np.int64)
# Bytes no view of the launch, no named region and no kernel argument covers (never seen on CPU
# tensors, whose arguments are the kernel's own storage): named without an address (issue 28).
UNNAMED = "memory no view or argument of the launch covers"


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
    # write-write only: every program stored the same bytes at every byte they share (None: not
    # known, an atomic writer among them, or no write-write conflict)
    identical: bool | None = None


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
        self.rank: dict[int, int] = {}  # program -> its place in the order programs first ran
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
            self.rank.setdefault(pid, len(self.rank))
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


def _stored_identical(run: _Run, arrays: list, counts: list, sums: list, bounds: np.ndarray,
                      segs: np.ndarray) -> bool:
    """Whether the programs storing each of the write-write segments `segs` all stored the same
    bytes there. Programs ran one after another, so they did exactly when no program but the
    first to store a byte changed it (the first may: it replaced what was there before)."""
    if (counts[_ATOMIC_WRITE][segs] > 0).any():
        return False  # a read-modify-write's bytes are not a value two programs agree on
    changers = counts[_CHANGED][segs]
    if (changers >= 2).any():
        return False
    one = segs[changers == 1]
    if one.size == 0:
        return True
    # the first writer of each segment: paint the write intervals, latest program first
    pids, starts, ends = arrays[_WRITE]
    first = np.full(bounds.size - 1, -1, dtype=np.int64)
    i0, i1 = np.searchsorted(bounds, starts), np.searchsorted(bounds, ends)
    for j in sorted(range(pids.size), key=lambda j: -run.rank.get(int(pids[j]), 0)):
        first[i0[j]:i1[j]] = pids[j]
    return bool((first[one] == sums[_CHANGED][one]).all())


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
        ww_segs = seg[np.unique(rows_j[sel][rows_k[sel] == 0])]
        identical = _stored_identical(run, arrays, counts, sums, bounds, ww_segs) if ww_segs.size else None

        def describe(order: tuple[_Region, ...], i: int) -> tuple[str, int, str | None]:
            if i < 0:
                return UNNAMED, span[0], None
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
                identical=identical,
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
    label, base = UNNAMED, span[0]
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
    if kinds == ["write-write"] and c.identical:
        # issue 48: identical bytes do not make this run's result depend on the order; say so
        consequence = ("; every program stored identical bytes there this time, so this run's result does not depend "
                       "on the order the programs run in, but it would wherever they store different bytes")
    else:
        consequence = ", so the result depends on the order the programs run in"
    message = (
        f"program {c.writer} of {c.kernel} stores {w_range} while program {c.other_program} of the same launch "
        f"{verb} {o_range}: {c.nbytes} byte{'s' if c.nbytes != 1 else ''} shared between programs{consequence}"
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
    if c.identical is not None:
        figures["identical_bytes"] = c.identical
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
