"""Integer wraps that reach an address: the overflow watch (issue 42).

An address in a Triton kernel is a base pointer plus an integer offset the kernel computes,
typically `offs_token * stride_cm` in 32-bit integers. Past 2^31 elements that product wraps:
the kernel loads or stores at a wrong address that may still lie inside the tensor, so nothing
crashes and the bounds guard (diffmoe/interpreter/bounds_guard.py) sees a legal access. The
interpreter computes that product in numpy at the kernel's own width, so it wraps exactly as the
GPU does; this watch computes every integer value once more exactly (in 64 bits, which no
index of a real shape leaves) and keeps the exact lanes beside the value (`Mark`), from the first
signed 8/16/32-bit `*`, `+`, `-` or `<<` whose exact result does not fit (`Wrap`: where, the
operands, both values) through the operations that carry an offset to an address: integer
arithmetic, division and shifts, casts, `tl.where`, broadcasts, reshapes and `+` on a pointer.

A wrapped value is not yet a defect (a hash, a masked-off lane, a wrap a later operation
cancels): the watch speaks only when a load or store uses a pointer whose address differs from
its exact address in a lane its mask lets through. Operations outside that list (a reduction, a
`tl.dot`, a gather, a load of an index) drop the mark: the watch may miss a wrap that travels
through them, never invents one.

The hooks are installed with the bounds guard's (one install, one restore, the same launches):
the guard's load and store hooks ask `live_wraps` before they check bounds. Owns the hooks'
arithmetic and the marks. Must not word a finding (diffmoe/oracles/overflow.py does).

Headroom: at a test's sizes nothing wraps, yet the same kernel wraps at a production shape. So the
watch also keeps, per launch, the largest 32-bit offset a pointer is moved by (`tl.load(x_ptr +
offs)` with `offs` int32: the form of every wrap above) and the line that moved it; a launch whose
largest one reaches HEADROOM_FLOOR is a `Headroom` record, which the report words as a warning,
not a finding (`2^31 / peak` times that offset wraps). An int32 product cast to int64 before the
pointer is moved is not seen here (only its wrap is, above).
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

# The integer widths checked: a kernel's index arithmetic is signed 32-bit unless it casts; int64
# products would need 128-bit arithmetic and no shape reaches them (2^63 elements).
_CHECKED = (np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32))
_OPS = {np.multiply: "*", np.add: "+", np.subtract: "-", np.left_shift: "<<"}
MARK = "_diffmoe_wrap"  # the attribute a marked TensorHandle carries: a Mark
# Frames inside these folders are the interpreter's and the hooks', never the kernel's line.
_NOT_KERNEL = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)


@dataclass(frozen=True)
class Wrap:
    """Where a value wrapped, and one lane of it: `lhs op rhs = exact`, kept as `wrapped`."""

    op: str
    dtype: str  # "int32"
    file: str  # the kernel's source file ("" when no frame outside Triton was found)
    line: int
    function: str  # the jit function holding the line (the kernel, or a helper it calls)
    code: str  # the source line, stripped
    lhs: int
    rhs: int
    exact: int
    wrapped: int


# The smallest 32-bit pointer offset, in elements, a launch's headroom is reported from: 2^24 leaves
# at most 128x before 2^31, closer than a test shape is to a production one (a 16-token check's
# offsets grow 16384x by T = 262,144); below it the report stays quiet.
HEADROOM_FLOOR = 2**24


@dataclass
class Headroom:
    """One launch's largest 32-bit pointer offset (elements), when it reaches HEADROOM_FLOOR."""

    launch: int  # interpreter launch index within the guard
    kernel: str
    peak: int  # the largest |offset| of a 32-bit `pointer + offset`, elements
    file: str  # where that offset was added to a pointer ("" when no frame outside Triton was found)
    line: int
    function: str
    code: str
    stage: str | None = None
    announced: int | None = None


@dataclass
class AddressWrap:
    """Loads or stores of one interpreter launch through addresses made from a wrapped value."""

    launch: int  # interpreter launch index within the guard
    kernel: str
    kind: str  # load, store or atomic
    program: int  # the first program that made one
    grid: tuple[int, int, int]
    wrap: Wrap  # the first program's first wrapped lane
    lanes: int  # accesses through a wrapped lane, all programs
    programs: int  # programs that made one
    stage: str | None = None  # of the announced launch in flight
    announced: int | None = None  # its index among the call's announced launches


class Mark:
    """A value's exact (unbounded) lanes, as int64 of its shape, and the first wrap among them.
    Where `exact` equals the value the kernel holds, that lane did not wrap (or its wrap cancelled)."""

    __slots__ = ("exact", "wrap")

    def __init__(self, exact: np.ndarray, wrap: Wrap) -> None:
        self.exact = exact
        self.wrap = wrap


def _mark_of(handle: Any) -> Mark | None:
    return getattr(handle, MARK, None)


def _held(data: np.ndarray) -> np.ndarray:
    """The lanes as the kernel holds them, as int64 (pointers: their addresses)."""
    data = np.asarray(data)
    return data.view(np.int64) if data.dtype == np.uint64 else data.astype(np.int64)


def _exact(handle: Any) -> np.ndarray:
    """A value's exact lanes: its mark's, or what it holds."""
    mark = _mark_of(handle)
    return mark.exact if mark is not None else _held(handle.data)


def _set(handle: Any, exact: np.ndarray, wrap: Wrap) -> None:
    """Mark `handle` when some lane's exact value differs from what it holds; unmark it otherwise."""
    data = getattr(handle, "data", None)
    if not isinstance(data, np.ndarray):
        return
    try:
        exact = np.broadcast_to(exact, data.shape)
    except ValueError:
        return  # a shape the operation changed some other way: the mark ends here
    if (exact != _held(data)).any():
        try:
            setattr(handle, MARK, Mark(exact, wrap))
        except AttributeError:  # a handle that takes no attribute: the mark ends here
            pass


def _kernel_frame() -> tuple[str, int, str]:
    """(file, line, function) of the innermost frame outside Triton and this folder: the kernel's
    (or its jit helper's) line being interpreted."""
    import triton

    skip = (*_NOT_KERNEL, os.path.dirname(os.path.abspath(triton.__file__)) + os.sep, os.path.dirname(np.__file__) + os.sep)
    frame = sys._getframe(2)
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not name.startswith(skip):
            return name, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return "", 0, ""


def _wrap_at(op: Any, lhs: np.ndarray, rhs: np.ndarray, out: np.ndarray, exact: np.ndarray, wrapped: np.ndarray) -> Wrap:
    """The first wrapped lane of a `*`, `+`, `-` or `<<`: where, its exact operands, both values."""
    index = np.unravel_index(int(np.argmax(wrapped)), wrapped.shape) if wrapped.ndim else ()
    file, line, function = _kernel_frame()
    code = linecache.getline(file, line).strip() if file else ""
    return Wrap(_OPS[op], str(out.dtype), file, line, function, code, int(np.broadcast_to(lhs, wrapped.shape)[index]),
                int(np.broadcast_to(rhs, wrapped.shape)[index]), int(exact[index]), int(out[index]))


# ---------------------------------------------------------------------------------------------
# Hooks (installed and removed by bounds_guard._install / _uninstall)

def _hooked_binary(original: Any, name: str) -> Any:
    """Every binary operation: an integer result's exact lanes from its operands' exact lanes; a
    signed 8/16/32-bit `*`, `+`, `-`, `<<` whose exact result does not fit is where a wrap starts."""

    def binary_op(self, lhs, rhs, op):
        out = original(self, lhs, rhs, op)
        data = getattr(out, "data", None)
        if not isinstance(data, np.ndarray) or data.dtype.kind not in "iu":
            return out  # a float or a comparison: no address is carried on
        marked = _mark_of(lhs) or _mark_of(rhs)
        checked = op in _OPS and data.dtype in _CHECKED
        if marked is None and not checked:
            return out
        a, b = _exact(lhs), _exact(rhs)
        with np.errstate(all="ignore"):
            exact = np.left_shift(a, np.clip(b, 0, 62)) if op is np.left_shift else op(a, b)
        if exact.dtype != np.int64:  # an operation numpy answers in another type (a true divide)
            return out
        if checked and marked is None:
            wrapped = exact != data.astype(np.int64)
            if wrapped.any():
                _set(out, exact, _wrap_at(op, a, b, data, exact, wrapped))
        elif marked is not None:
            _set(out, exact, marked.wrap)
        return out

    binary_op.__wrapped__ = original
    return binary_op


class _Peak(threading.local):
    """The launch in flight's largest 32-bit pointer offset and where it was added (per thread)."""

    def __init__(self) -> None:
        self.on = False
        self.peak = 0
        self.where: tuple[str, int, str] | None = None


_peak = _Peak()


def begin_launch() -> None:
    """A launch starts (the bounds guard's hook): its headroom is measured from zero."""
    _peak.on, _peak.peak, _peak.where = True, 0, None


def end_launch() -> tuple[int, tuple[str, int, str]] | None:
    """A launch ends: (its largest 32-bit pointer offset, where) when that reached HEADROOM_FLOOR."""
    found = (_peak.peak, _peak.where) if _peak.where is not None else None
    _peak.on, _peak.peak, _peak.where = False, 0, None
    return found


def _offset_peak(offset: Any) -> None:
    """Keep the launch's largest |32-bit offset| a pointer is moved by, and where it first reached it."""
    data = getattr(offset, "data", None)
    if not isinstance(data, np.ndarray) or data.dtype != np.int32 or not data.size:
        return
    peak = max(int(data.max()), -int(data.min()))
    if peak > _peak.peak:
        _peak.peak = peak
        if peak >= HEADROOM_FLOOR:
            _peak.where = _kernel_frame()


def _hooked_unary(original: Any, name: str) -> Any:
    """An operation whose lanes map one to one onto its operands' (a cast, a broadcast, a
    reshape, a pointer plus an offset): the same operation on the exact lanes."""

    def method(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if name == "create_addptr" and _peak.on and len(args) > 1:
            _offset_peak(args[1])
        for arg in args:  # the common case first: no operand marked, nothing to do
            if getattr(arg, MARK, None) is not None:
                break
        else:
            return out
        marks = [(i, _mark_of(a)) for i, a in enumerate(args) if _mark_of(a) is not None]
        wrap = marks[0][1].wrap
        if name == "create_addptr":
            ptr, offset = args[0], args[1]
            size = max(1, ptr.get_element_ty().primitive_bitwidth // 8)
            with np.errstate(all="ignore"):
                _set(out, _exact(ptr) + size * _exact(offset), wrap)
        elif name == "create_reshape":
            _set(out, marks[0][1].exact.reshape(out.data.shape), wrap)
        elif name == "create_trans":
            _set(out, np.transpose(marks[0][1].exact, args[1] if len(args) > 1 else kwargs.get("perm")), wrap)
        elif name == "create_expand_dims":
            _set(out, np.expand_dims(marks[0][1].exact, args[1] if len(args) > 1 else kwargs.get("axis")), wrap)
        else:  # a cast, a bitcast, a broadcast, a splat: the exact lanes broadcast to the result
            _set(out, marks[-1][1].exact.reshape(-1)[:1].reshape(()) if name == "create_splat" else marks[-1][1].exact, wrap)
        return out

    method.__name__ = name
    method.__wrapped__ = original
    return method


# Integer operations the interpreter does outside binary_op: their exact lanes, as it computes them.
_EXACT = {
    "create_idiv": lambda a, b: (a - np.fmod(a, b)) // b,
    "create_ashr": lambda a, b: np.right_shift(a, np.clip(b, 0, 63)),
}


def _hooked_exact(original: Any, name: str) -> Any:
    """An integer division or arithmetic shift of a marked value: the same on its exact lanes."""

    def method(self, lhs, rhs):
        out = original(self, lhs, rhs)
        mark = _mark_of(lhs) or _mark_of(rhs)
        if mark is not None:
            with np.errstate(all="ignore"):
                b = _exact(rhs)
                _set(out, _EXACT[name](_exact(lhs), np.where(b == 0, 1, b) if name == "create_idiv" else b), mark.wrap)
        return out

    method.__name__ = name
    method.__wrapped__ = original
    return method


def _hooked_select(original: Any, name: str) -> Any:
    """`tl.where(cond, a, b)`: each lane's exact value is the one it took."""

    def create_select(self, cond, lhs, rhs):
        out = original(self, cond, lhs, rhs)
        mark = _mark_of(lhs) or _mark_of(rhs)
        if mark is not None and isinstance(getattr(out, "data", None), np.ndarray) and out.data.dtype.kind in "iu":
            take = np.asarray(cond.data, dtype=bool)
            _set(out, np.where(take, _exact(lhs), _exact(rhs)), mark.wrap)
        return out

    create_select.__wrapped__ = original
    return create_select


# InterpreterBuilder method -> hook factory(original, name). Every other method drops a mark.
HOOKS = {
    "binary_op": _hooked_binary,
    "create_select": _hooked_select,
    **{name: _hooked_exact for name in _EXACT},
    **{name: _hooked_unary for name in ("create_int_cast", "create_expand_dims", "create_broadcast", "create_splat",
                                        "create_reshape", "create_trans", "create_addptr", "create_bitcast")},
}


def live_wraps(ptrs: Any, mask: Any) -> tuple[Wrap, int] | None:
    """(the first wrap, the number of lanes) of a pointer block whose lanes hold an address other
    than their exact one where the mask lets them through; None when it has none."""
    mark = _mark_of(ptrs)
    if mark is None:
        return None
    held = _held(ptrs.data)
    lanes = np.broadcast_to(mark.exact, held.shape) != held
    if mask is not None:
        lanes = lanes & np.broadcast_to(np.asarray(mask.data, dtype=bool), held.shape)
    count = int(lanes.sum())
    return (mark.wrap, count) if count else None
