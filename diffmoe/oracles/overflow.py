"""The overflow oracle: no interpreted load or store through an integer offset that wrapped.

The watch (diffmoe/interpreter/wrap_watch.py) runs with the bounds guard under every interpreted
call: it recomputes the kernel's 8/16/32-bit index arithmetic in 64 bits, follows the lanes that
did not fit, and records each load or store that a wrapped lane reaches with its mask on. Unlike a
refused access, that access was performed (the wrapped address may lie inside the tensor: the
silent corruption of vllm-project/vllm#34279, Liger-Kernel#1246, sgl-project/sglang#35188). This
oracle words it: the kernel, the program, the source line where the value wrapped, one lane's
operands with the exact value and the wrapped one.

Owns the wording and the verdict. Must not hook the interpreter.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from diffmoe.findings import Finding, Oracles
from diffmoe.oracles.base import Oracle

if TYPE_CHECKING:
    from diffmoe.check.execution import Check, Run
    from diffmoe.interpreter.wrap_watch import AddressWrap

_VERB = {"load": "loads", "store": "stores", "atomic": "accesses atomically"}
_NOUN = {"load": "load", "store": "store", "atomic": "atomic access"}
_OP = {"*": "product", "+": "sum", "-": "difference", "<<": "shift"}


def _where(file: str) -> str:
    """The file as a reader finds it: relative to the working folder when under it."""
    if not file:
        return "an unknown line"
    try:
        relative = os.path.relpath(file)
    except ValueError:
        return file
    return file if relative.startswith("..") else relative


def overflow_finding(event: AddressWrap) -> Finding:
    """One OVERFLOW finding for one launch's accesses through one wrapped line."""
    w = event.wrap
    figures: dict[str, Any] = {
        "kernel": event.kernel, "program": event.program, "grid": list(event.grid), "access": event.kind,
        "lanes": event.lanes, "programs": event.programs, "file": _where(w.file), "line": w.line,
        "function": w.function, "op": w.op, "dtype": w.dtype, "lhs": w.lhs, "rhs": w.rhs, "exact": w.exact,
        "wrapped": w.wrapped,
    }
    if event.announced is not None:
        figures["launch"] = event.announced
    others = f" ({event.programs} programs in all)" if event.programs > 1 else ""
    code = f" `{w.code}`" if w.code else ""
    message = (f"program {event.program} of {event.kernel} {_VERB[event.kind]} through "
               f"{event.lanes} address{'es' if event.lanes != 1 else ''} made from an {w.dtype} {_OP[w.op]} that "
               f"wrapped{others}: at {_where(w.file)}:{w.line} ({w.function}){code}, {w.lhs} {w.op} {w.rhs} = {w.exact} "
               f"does not fit {w.dtype} and became {w.wrapped}; the {_NOUN[event.kind]} was performed at the wrapped "
               f"address (an operand cast to int64 before the {_OP[w.op]} computes it exactly)")
    return Finding(oracle=Oracles.OVERFLOW, stage=event.stage, message=message, figures=figures)


def _distinct(events: list) -> list[Finding]:
    """One finding per (kernel, access, line that wrapped), the first event of each."""
    out, seen = [], set()
    for event in events:
        key = (event.kernel, event.kind, event.wrap.file, event.wrap.line)
        if key not in seen:
            seen.add(key)
            out.append(overflow_finding(event))
    return out


class Overflow(Oracle):
    name = Oracles.OVERFLOW
    checks = "integer offsets that wrap before an address (interpreter)"
    how = ("every signed 8/16/32-bit `*`, `+`, `-` and `<<` a kernel computes is computed again in 64 bits; a lane "
           "that did not fit is followed through casts, `tl.where`, broadcasts and pointer arithmetic, and a load or "
           "store it reaches with its mask on is named: kernel, program, source line, operands, exact and wrapped values")
    rank = 4  # before bounds: a wrapped offset is often why an access left its tensor

    def judge_run(self, check: Check, run: Run, first: bool) -> list[Finding]:
        return _distinct(run.wraps) if first else []

    def warnings(self, check: Check) -> list[str]:
        return headroom_warnings(check.headroom, check.config)

    def after_finish(self, check: Check) -> list[Finding]:
        """Wraps of the runs after the first (other orders, the oracles' own calls) on a line the
        first run did not wrap."""
        first = check.runs[0].wraps if check.runs else []
        made = {(e.kernel, e.kind, e.wrap.file, e.wrap.line) for e in first}
        ids = {id(e) for e in first}
        later = [e for e in check.wraps if id(e) not in ids and (e.kernel, e.kind, e.wrap.file, e.wrap.line) not in made]
        return _distinct(later)


def headroom_warnings(headroom: list, config: Any) -> list[str]:
    """One warning per (kernel, line) whose 32-bit pointer offset came within 2^31 / HEADROOM_FLOOR of
    wrapping (wrap_watch.Headroom), the largest first: how many times larger that offset may grow, and
    the token count that is if it grows with the tokens. Not a finding: the check's verdict stands."""
    largest: dict[tuple, Any] = {}
    for h in headroom:
        key = (h.kernel, h.file, h.line)
        if key not in largest or h.peak > largest[key].peak:
            largest[key] = h
    out = []
    tokens = max(1, config.call_num_tokens)
    for h in sorted(largest.values(), key=lambda h: -h.peak):
        factor = 2**31 / h.peak
        code = f" `{h.code}`" if h.code else ""
        out.append(f"{h.kernel} moves a pointer by a 32-bit offset of {h.peak} (2^{math.log2(h.peak):.1f}) elements at "
                   f"{_where(h.file)}:{h.line}{code}{'' if h.stage is None else f' ({h.stage})'}: {factor:.1f}x that "
                   f"offset wraps int32 (from about T = {math.ceil(tokens * factor)} if it grows with the tokens); an "
                   f"offset cast to int64 before it grows cannot wrap")
    return out
