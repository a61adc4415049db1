"""The bounds oracle: no interpreted load or store outside the allocations its launch was given.

The guard itself (diffmoe/interpreter/bounds_guard.py) runs under every interpreted call of the
implementation, whatever the selection, because an out-of-bounds store it let through would
corrupt the process heap: it refuses the access (masks the lanes off) and records it. This
oracle words what it recorded: the kernel, the program, the access, the bytes refused and the
nearest buffer, by its name (a view the launch declared, ws1/ws2/output, an input) or, for a
tensor the implementation allocated and no launch named, by the launch argument that received
it; never by address.

Owns the wording and the verdict. Must not hook the interpreter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from diffmoe.findings import ByteRange, Finding, Oracles
from diffmoe.oracles.base import Oracle
from diffmoe.problem.vocabulary import Buffers

if TYPE_CHECKING:
    from diffmoe.check.execution import Check, Run
    from diffmoe.interpreter.bounds_guard import OutOfBounds

_VERB = {"load": "loads", "store": "stores", "atomic": "accesses atomically"}
_NOUN = {"load": "load", "store": "store", "atomic": "atomic access"}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _reference(event: OutOfBounds, known: Mapping[int, str]) -> tuple[str, str, int, int]:
    """(label, short name, start, end) of the buffer the refused bytes belong to, by name, never by
    address.

    A named view (the launch's declared views, the check's workspaces, output and inputs) inside
    the nearest allocation first: the one starting last at or below the refused bytes. Else the
    allocation as the launch argument passing it, the way the implementation's own tensors are
    named: "buffer argument `out_ptr` of launch 3 (stage reduce)" (after "the 256-byte")."""
    a = event.nearest
    assert a is not None
    at = event.span[0]
    inside = [(name, s, e) for name, (s, e) in event.views.items() if a.start <= s < a.end]
    if inside:
        below = [v for v in inside if v[1] <= at]
        name, s, e = max(below, key=lambda v: v[1]) if below else min(inside, key=lambda v: v[1])
        label = name if any(a.start <= p < a.end for p in known) else f"{name} (allocated by the implementation)"
        return label, name, s, e
    arg, s, e = a.views[0] if a.views else (a.args[0], a.start, a.end)
    if event.announced is not None:
        where = f"launch {event.announced} (stage {event.stage})"
    else:
        where = f"the launch of {event.kernel}"
    return f"buffer argument `{arg}` of {where}", arg, s, e


def bounds_finding(event: OutOfBounds, known: Mapping[int, str] = {}) -> Finding:  # noqa: B006 - read only
    """One BOUNDS finding for one refused access (diffmoe/interpreter/bounds_guard.py)."""
    figures: dict[str, Any] = {
        "kernel": event.kernel, "program": event.program, "grid": list(event.grid), "access": event.kind,
        "bytes_outside": event.nbytes, "programs": event.programs,
    }
    if event.announced is not None:
        figures["launch"] = event.announced
    if event.nearest is None:
        message = (f"program {event.program} of {event.kernel} {_VERB[event.kind]} "
                   f"{_plural(event.nbytes, 'byte')} though the launch was given no tensor at all; "
                   f"the {_NOUN[event.kind]} was not performed")
        return Finding(oracle=Oracles.BOUNDS, stage=event.stage, message=message, figures=figures)
    label, short, start, end = _reference(event, known)
    s, e = event.span
    if s >= end:
        where = f"{s - end} bytes past its end" if s > end else "right after its end"
    elif e <= start:
        where = f"{start - e} bytes before its start" if e < start else "right before its start"
    else:
        where = "inside it and runs across its end"
    rng = ByteRange(short, s - start, e - start)
    figures.update({"nearest": short, "nearest_kernel_args": list(event.nearest.args)})
    others = f" ({_plural(event.programs, 'program')} in all)" if event.programs > 1 else ""
    message = (f"program {event.program} of {event.kernel} {_VERB[event.kind]} "
               f"{_plural(event.nbytes, 'byte')} outside the allocation it addresses{others}: the first refused run, "
               f"bytes [{s - start}, {e - start}) of the {end - start}-byte {label}, starts {where}; "
               f"the {_NOUN[event.kind]} was not performed")
    return Finding(oracle=Oracles.BOUNDS, stage=event.stage, buffers=[short], byte_ranges=[rng],
                   message=message, figures=figures)


def _known_storages(check: Check) -> dict[int, str]:
    """First addresses of the check's own tensors (workspaces, output, inputs) -> name, as the
    candidate's calls saw them (isolated, its process's addresses)."""
    names = dict(check.storages)  # every call's named tensors, at the addresses the candidate saw them
    names.update(check.guarded.region_names() if check.guarded is not None else {})
    if check.output is not None:
        names.update(check.output.region_names(Buffers.OUTPUT))
    return names


def _distinct(check: Check, events: list) -> list[Finding]:
    """One finding per (kernel, access, stage), the first event of each."""
    out, seen, known = [], set(), _known_storages(check)
    for event in events:
        key = (event.kernel, event.kind, event.stage)
        if key not in seen:
            seen.add(key)
            out.append(bounds_finding(event, known))
    return out


class Bounds(Oracle):
    name = Oracles.BOUNDS
    checks = "out-of-bounds loads and stores (interpreter)"
    how = ("every interpreted load and store is checked before it runs against the storages of the launch's tensor "
           "arguments (workspaces, output, inputs, the implementation's own tensors); one outside is refused, never "
           "performed, and named: kernel, program, bytes, the nearest buffer")
    rank = 5

    def judge_run(self, check: Check, run: Run, first: bool) -> list[Finding]:
        return _distinct(check, run.out_of_bounds) if first else []

    def after_finish(self, check: Check) -> list[Finding]:
        """Refused accesses of the calls after the first run (other orders, every oracle's own calls,
        teacher forcing's stages) of a kind the first run did not make."""
        first = {id(e) for e in check.runs[0].out_of_bounds} if check.runs else set()
        made = {(e.kernel, e.kind, e.stage) for e in check.runs[0].out_of_bounds} if check.runs else set()
        later = [e for e in check.out_of_bounds if id(e) not in first and (e.kernel, e.kind, e.stage) not in made]
        return _distinct(check, later)

    def after_crash(self, check: Check) -> list[Finding]:
        """Every refused access up to the crash (an out-of-bounds access is a likely cause of it)."""
        return _distinct(check, check.out_of_bounds)
