"""Launches that must do their work (issue 43, item 3): which bytes of its declared write views a
launch reported as a Triton kernel stored from its Triton programs, and which changed without one.

A launch reported with `LaunchInfo.triton` claims that Triton programs computed the views it
declares in `writes`. Counting programs (diffmoe.interpreter.program_count) does not hold it to
that: a one-program kernel that does nothing, with torch writing the views on the host, counts
one. Under `TRITON_INTERPRET=1` every store a program makes goes through a few
`InterpreterBuilder` methods with real host addresses (as diffmoe.interpreter.address_recorder
reads them); while a `StoreWatch` is active they are wrapped, and for each Triton launch the
launch log opens a watch on (`begin`/`end`), every stored byte inside a declared write view is
marked in a bitmap of that view's bytes. The view's bytes are also copied at `begin` and compared
at `end`. What `end` returns per view (a `StoreGap`, defined here):

* `unstored`: declared bytes no store of the launch touched and that did not change;
* `host_written`: declared bytes that changed during the launch though no store touched them:
  code other than the launch's Triton programs wrote them inside its window.

Both count the view's own elements only (a strided view's gaps are not declared). The contract
oracle (diffmoe/oracles/contract.py) judges them; the rule for what must be stored is there.

The hooks are entered outside the bounds guard (diffmoe/interpreter/bounds_guard.py), so a lane
the guard refused is masked off before it reaches them: only performed stores count. Views not
in host memory (device tensors, which the interpreter copies to the host) are not watched: their
addresses cannot be named. A compare-and-swap counts its whole element as stored.

Cost: one Python call and a few numpy operations per interpreted store (stores are a small part
of a program's operations), and two copies of each declared write view per Triton launch, on the
first order's run of a check only (the run the contract oracle judges): +2.4 % to +6.7 % on a
default check, measured 2026-12-06 (bench/bench_store_watch.py; docs/robustness.md).

Owns the store hooks and the per-launch bitmaps. Must not judge what it records (the contract
oracle does), nor change what a store writes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from diffmoe.interpreter.triton_pin import pinned_interpreter_problem


@dataclass(frozen=True)
class StoreGap:
    """Bytes of one declared write view of a Triton launch that no store of its Triton programs
    touched (diffmoe.interpreter.store_coverage): `nbytes` of the view's `declared` bytes, the
    first run of them at byte offsets [first[0], first[1]) from the view's first byte, and per
    row of the view's first dimension that has any (`rows`), how many (`row_bytes`)."""

    buffer: str
    nbytes: int
    declared: int
    first: tuple[int, int]
    rows: tuple[int, ...] = ()
    row_bytes: tuple[int, ...] = ()
    row_count: int = 0  # rows of the view (its first dimension; 1 for a scalar)

    @classmethod
    def of(cls, buffer: str, mask: np.ndarray, declared: int, per_row: np.ndarray) -> StoreGap:
        at = np.flatnonzero(mask)
        if not at.size:
            return cls(buffer, 0, declared, (0, 0), row_count=per_row.size)
        breaks = np.flatnonzero(np.diff(at) > 1)
        end = int(at[breaks[0]]) + 1 if breaks.size else int(at[-1]) + 1
        rows = np.flatnonzero(per_row)
        return cls(buffer, int(at.size), declared, (int(at[0]), end), tuple(int(r) for r in rows),
                   tuple(int(n) for n in per_row[rows]), per_row.size)


SUPPORTED_TRITON = (3, 9)
# method: (pointer parameter, mask parameter), a parameter as (position after self, name), as
# diffmoe/interpreter/address_recorder.py reads them: the builder methods that write memory.
_STORE_HOOKS: dict[str, tuple[tuple[int, str], tuple[int, str] | None]] = {
    "create_masked_store": ((0, "ptrs"), (2, "mask")),
    "create_atomic_store": ((0, "ptr"), (2, "mask")),
    "create_atomic_rmw": ((1, "ptr"), (3, "mask")),
    "create_atomic_cas": ((0, "ptr"), None),
}

_lock = threading.RLock()
_open: list[_View] = []  # the views of every Triton launch in flight, across watches
_originals: dict[str, Any] = {}
_depth = 0


def watch_problem() -> str | None:
    """Why stores cannot be watched here, or None when they can."""
    problem = pinned_interpreter_problem(
        "the store watch", SUPPORTED_TRITON,
        "the store watch needs the Triton interpreter (compiled kernels expose no per-store addresses)")
    if problem is not None:
        return problem
    from triton.runtime import interpreter

    missing = [m for m in _STORE_HOOKS if not hasattr(interpreter.InterpreterBuilder, m)]
    return f"the Triton interpreter lacks InterpreterBuilder.{', '.join(missing)}" if missing else None


class _View:
    """One declared write view of a launch in flight: its bytes [lo, lo + n), the ones that are
    its elements (`declared`), the ones a store touched, and a copy of them at the start."""

    def __init__(self, name: str, view: torch.Tensor) -> None:
        self.name = name
        self.size = size = view.element_size()
        span = sum((n - 1) * s for n, s in zip(view.shape, view.stride())) + 1  # elements, strides >= 0
        self.lo, self.n = int(view.data_ptr()), span * size
        self.bytes = torch.empty(0, dtype=torch.uint8).set_(
            view.untyped_storage(), view.storage_offset() * size, (self.n,))
        self.before = self.bytes.clone()
        self.rows = view.shape[0] if view.dim() else 1  # rows: its first dimension
        self.starts = self.declared = None  # contiguous: every byte declared, in the view's order
        if not view.is_contiguous():  # each element's first byte, in the view's logical order
            self.starts = torch.as_strided(torch.arange(span), view.shape, view.stride()).reshape(-1).numpy() * size
            self.declared = np.zeros(self.n, dtype=bool)
            for k in range(size):
                self.declared[self.starts + k] = True
        self.stored = np.zeros(self.n, dtype=bool)

    def mark(self, addresses: np.ndarray, size: int) -> None:
        offsets = addresses - self.lo
        offsets = offsets[(offsets > -size) & (offsets < self.n)]
        for k in range(size):
            at = offsets + k
            self.stored[at[(at >= 0) & (at < self.n)]] = True

    def gaps(self) -> tuple[Any, Any]:

        changed = (self.bytes != self.before).numpy()
        if changed.any():  # an element whose value changed changed whole (7.0 over 0.0 keeps two zero bytes)
            if self.starts is None:
                changed = np.repeat(changed.reshape(-1, self.size).any(axis=1), self.size)
            else:
                whole = np.zeros(self.starts.size, dtype=bool)
                for k in range(self.size):
                    whole |= changed[self.starts + k]
                for k in range(self.size):
                    changed[self.starts[whole] + k] = True
        missing = ~self.stored if self.declared is None else (self.declared & ~self.stored)
        declared = self.n if self.declared is None else int(self.declared.sum())
        return tuple(StoreGap.of(self.name, mask, declared, self._per_row(mask)) for mask in (missing & ~changed, missing & changed))

    def _per_row(self, mask: np.ndarray) -> np.ndarray:
        """Bytes of `mask` per row of the view (a byte of two overlapping elements counted twice)."""
        if self.starts is None:
            return mask.reshape(self.rows, -1).sum(axis=1)
        per_element = sum(mask[self.starts + k].astype(np.int64) for k in range(self.size))
        return per_element.reshape(self.rows, -1).sum(axis=1) if self.rows else np.zeros(0, dtype=np.int64)


def _addresses(ptrs: Any, mask: Any) -> np.ndarray:
    data = np.asarray(ptrs.data)
    addresses = data.view(np.int64) if data.dtype == np.uint64 else data.astype(np.int64)
    if mask is not None:
        live = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        if not live.all():
            return addresses[live]
    return addresses.reshape(-1)


def _hooked(original: Any, ptr: tuple[int, str], mask: tuple[int, str] | None) -> Any:
    from diffmoe.interpreter.address_analysis import _element_bytes

    def argument(spec: tuple[int, str], args: tuple, kwargs: dict) -> Any:
        return args[spec[0]] if len(args) > spec[0] else kwargs.get(spec[1])

    def method(self, *args, **kwargs):
        if _open:
            ptrs = argument(ptr, args, kwargs)
            addresses = _addresses(ptrs, argument(mask, args, kwargs) if mask is not None else None)
            if addresses.size:
                size = _element_bytes(ptrs)
                for view in _open:
                    view.mark(addresses, size)
        return original(self, *args, **kwargs)

    method.__name__ = original.__name__
    method.__wrapped__ = original
    return method


class StoreWatch:
    """While active (`with watch:`), the interpreter's stores are marked in the views of the
    launches begun with `begin`. Entering it where stores cannot be watched raises RuntimeError
    (`watch_problem` says why). Re-entrant; the hooks go when the last watch exits."""

    def __enter__(self) -> StoreWatch:
        global _depth
        problem = watch_problem()
        if problem is not None:
            raise RuntimeError(problem)
        with _lock:
            if _depth == 0:
                from triton.runtime import interpreter

                builder = interpreter.InterpreterBuilder
                for name, (ptr, mask) in _STORE_HOOKS.items():
                    _originals[name] = builder.__dict__[name]
                    setattr(builder, name, _hooked(_originals[name], ptr, mask))
            _depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        global _depth
        with _lock:
            _depth -= 1
            if _depth == 0:
                from triton.runtime import interpreter

                while _originals:
                    name, original = _originals.popitem()
                    setattr(interpreter.InterpreterBuilder, name, original)
                _open.clear()

    def begin(self, writes: Mapping[str, Any]) -> list[_View] | None:
        """Watch the declared write views of a launch now starting; None when one of them is not in
        host memory (nothing is judged for the launch then)."""
        views = []
        for name, view in (writes or {}).items():
            if not isinstance(view, torch.Tensor) or view.device.type != "cpu" or min(view.stride(), default=0) < 0:
                return None
            if view.numel():
                views.append(_View(str(name), view))
        with _lock:
            _open.extend(views)
        return views

    def end(self, views: list[_View]) -> tuple[tuple, tuple]:
        """(unstored, host_written) StoreGaps of the launch begun with `views`, one per view with any."""
        with _lock:
            for view in views:
                if view in _open:
                    _open.remove(view)
        unstored, host = [], []
        for view in views:
            quiet, changed = view.gaps()
            unstored += [quiet] if quiet.nbytes else []
            host += [changed] if changed.nbytes else []
        return tuple(unstored), tuple(host)


def watch_for_call() -> StoreWatch | None:
    """A watch for one call, or None where the interpreter's stores cannot be watched."""
    from diffmoe.interpreter.grid_order import interpreting

    if not interpreting() or watch_problem() is not None:
        return None
    return StoreWatch()


__all__ = ["SUPPORTED_TRITON", "StoreWatch", "watch_for_call", "watch_problem"]
