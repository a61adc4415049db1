"""Recorders that watch one call of the implementation, launch by launch.

Owns: the stage in flight (so a crash or a timeout can name it), bitwise copies of the
problem's inputs (which input a run wrote, when, and restoring it), the guard bytes
checked after every launch, and the reads of the implementation's own tensors that nothing wrote
(`UnwrittenReads`, which the poison oracle words). Each is a `LaunchRecorder` (diffmoe/contract.py) chained into the
call by `Check.execute`; none judges anything beyond what it watches. Beside them, `LateWatch`:
what every call returned and was given, compared again at the check's end (writes made after
run() returned).

Must not report under an oracle's name other than the contract's (input writes, late writes).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch

from diffmoe.contract import LaunchInfo
from diffmoe.check.guards import GuardedTensor, GuardedWorkspaces
from diffmoe.check.recording import LaunchLog, region_of
from diffmoe.findings import Finding, Oracles
from diffmoe.problem.vocabulary import Buffers


class StageTracker:
    """Remembers the stage of the launch in flight, so a crash can name it, and tells the
    progress callback (a worker reports it to the parent, so a timeout can name it too)."""

    def __init__(self, on_stage: Callable[[str | None], None] | None = None) -> None:
        self.stage: str | None = None
        self.on_stage = on_stage

    def before_launch(self, launch: LaunchInfo) -> None:
        self.stage = launch.stage
        if self.on_stage is not None:
            self.on_stage(launch.stage)

    def after_launch(self, launch: LaunchInfo) -> None:
        pass


def _byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 tensor (a copy when it is not contiguous)."""
    return tensor.detach().reshape(-1).view(torch.uint8)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(_byte_view(a), _byte_view(b))


class InputWatch:
    """Bitwise copies of the problem's inputs: which input a run wrote, when, and restoring it.

    `attribute=True` (the first run) also compares every input before and after each launch,
    so a write made by host code between launches is told apart from one made by a launch.
    """

    def __init__(self, inputs: dict[str, torch.Tensor]) -> None:
        self.inputs = inputs
        self.pristine = {name: tensor.detach().clone() for name, tensor in inputs.items()}
        self.reported: set[str] = set()
        self.attribute = False
        self.blame: dict[str, tuple[str, str | None]] = {}

    def start(self, attribute: bool) -> None:
        self.attribute = attribute
        self.blame = {}

    def _newly_changed(self) -> list[str]:
        return [n for n, t in self.inputs.items() if n not in self.blame and not _same_bytes(t, self.pristine[n])]

    def before_launch(self, launch: LaunchInfo) -> None:
        if self.attribute:
            for name in self._newly_changed():
                self.blame[name] = (f"by code outside any launch, before {launch.kernel} (stage {launch.stage})", launch.stage)

    def after_launch(self, launch: LaunchInfo) -> None:
        if self.attribute:
            for name in self._newly_changed():
                self.blame[name] = (f"during the launch of {launch.kernel} (stage {launch.stage})", launch.stage)

    def _writer(self, name: str, log: LaunchLog | None) -> tuple[str, str | None] | None:
        """The first recorded launch whose writes cover bytes of input `name`."""
        if log is None:
            return None
        target = region_of(name, self.inputs[name])
        for launch in log:
            for region in launch.writes:
                if region.overlap(target) is not None:
                    return (f"by the launch of {launch.kernel} (stage {launch.stage}), which writes {region.name} "
                            f"over its bytes", launch.stage)
        return None

    def finish(self, what: str, log: LaunchLog | None = None) -> list[Finding]:
        """Findings for inputs changed since the copies were taken; every changed input is restored."""
        findings: list[Finding] = []
        for name, tensor in self.inputs.items():
            before = self.pristine[name]
            # One snapshot, compared and counted: a thread the candidate left behind may still be
            # writing the tensor (tests/support/hostile_kernels.py's CorruptsItsInputsLate), and between a
            # check of the live tensor and a count of its changed bytes a second write undid the first
            # (IndexError on no changed byte, beside a second full suite at load 4 to 9, 2026-12-07).
            now = tensor.detach().clone()
            if _same_bytes(now, before):
                continue
            differs = _byte_view(now) != _byte_view(before)
            changed = int(differs.sum())
            first = int(differs.nonzero()[0, 0])
            how, stage = self._writer(name, log) or self.blame.get(name) or ("outside any reported launch", None)
            tensor.copy_(before)  # later runs, and the reference's view of the problem, see the original
            if name in self.reported:
                continue
            self.reported.add(name)
            findings.append(Finding(
                oracle=Oracles.CONTRACT, stage=stage, buffers=[name],
                message=f"input {name} was written during {what}, {how}: {changed} of {before.numel() * before.element_size()} "
                        "bytes changed (inputs belong to the caller and must not be written)",
                figures={"changed_bytes": changed, "first_changed_byte": first},
            ))
        return findings


class RedZoneWatch:
    """Checks the guard bytes after every launch, so an out-of-bounds write is pinned to the
    stage and the buffers of the launch that made it (guards are re-armed after a hit)."""

    def __init__(self, guarded: GuardedWorkspaces, output: GuardedTensor | None) -> None:
        self.guarded, self.output = guarded, output
        self.findings: list[Finding] = []

    def check(self, stage: str | None = None, writes: Collection[str] = ()) -> None:
        found = self.guarded.check_red_zones() + (self.output.check_red_zones(Buffers.OUTPUT) if self.output else [])
        for f in found:
            f.stage = f.stage or stage
            if stage is not None:
                f.message += f" by a launch of stage {stage} writing {', '.join(writes)}"
                f.buffers = list(dict.fromkeys([*f.buffers, *writes]))
        if found:
            self.guarded.reset_guards()
            if self.output is not None:
                self.output.reset_guards()
        self.findings += found

    def before_launch(self, launch: LaunchInfo) -> None:
        pass

    def after_launch(self, launch: LaunchInfo) -> None:
        self.check(launch.stage, list(launch.writes))


_FILL: dict[torch.dtype, torch.Tensor | None] = {}


def _fill_pattern(dtype: torch.dtype) -> torch.Tensor | None:
    """The bytes of one element of `dtype` as torch's fill_uninitialized_memory leaves it (NaN
    floats, the largest integers), asked of torch itself once per dtype; None where the fill
    cannot be told from a value code writes on purpose (all-zero bytes)."""
    if dtype not in _FILL:
        from diffmoe.check.call_environment import allocations_poisoned

        with allocations_poisoned():
            pattern = torch.empty(1, dtype=dtype).view(torch.uint8).clone()
        # bool's fill is True, a value code writes on purpose as often as not
        _FILL[dtype] = pattern if bool(pattern.any()) and dtype != torch.bool else None
    return _FILL[dtype]


class UnwrittenReads:
    """Which bytes a launch reads that no launch of this call wrote and nothing else did either.

    Runs with the call's own allocations poisoned (`call_environment.allocations_poisoned`):
    a tensor the implementation allocated and nobody wrote still holds torch's fill pattern. Before
    each launch, every view it declares it reads whose storage is not one of the check's own
    (workspaces, output, inputs: the poison oracle's second run judges those) and whose bytes no
    earlier launch of this call declared it wrote is looked at: when every element still holds the
    fill pattern, no launch and no host code (a `torch.zeros`, a copy) wrote any of it.
    `found` lists (launch index, stage, kernel, view name, bytes) for the poison oracle to word.
    """

    def __init__(self, own_storages: Collection[int]) -> None:
        self.own = set(own_storages)
        self.written: dict[int, list[tuple[int, int]]] = {}  # storage -> byte ranges launches wrote
        self.found: list[tuple[int, str, str, str, int]] = []
        self.launches = 0

    def _unwritten(self, region) -> bool:
        return not any(s < region.end_byte and region.start_byte < e for s, e in self.written.get(region.storage_ptr, ()))

    def before_launch(self, launch: LaunchInfo) -> None:
        for name, view in (launch.reads or {}).items():
            if not isinstance(view, torch.Tensor) or view.numel() == 0 or view.device.type == "meta":
                continue
            region = region_of(name, view)
            pattern = _fill_pattern(view.dtype)
            if region.storage_ptr in self.own or pattern is None or not self._unwritten(region):
                continue
            size = view.element_size()
            elements = view.detach().contiguous().view(torch.uint8).reshape(-1, size)
            # every element: a declared read view may be wider than what the launch reads (the unused
            # tail of a private sorted-ids buffer sized for the worst case, measured on the shipped
            # implementation), so a partly filled view says nothing certain
            if bool((elements == pattern.to(elements.device)).all()):
                self.found.append((self.launches, launch.stage, launch.kernel, str(name), elements.numel()))

    def after_launch(self, launch: LaunchInfo) -> None:
        self.launches += 1
        for name, view in (launch.writes or {}).items():
            if isinstance(view, torch.Tensor) and view.numel():
                region = region_of(name, view)
                self.written.setdefault(region.storage_ptr, []).append((region.start_byte, region.end_byte))


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


class LateWatch:
    """What every call returned and was given, kept with a copy taken when it returned, to be
    compared once more at the end of the check, just before the candidate's process is closed:
    an output or an input written after run() returned (by a thread, a stream still running, a
    timer) is seen only there, since each call's output is copied at its return (issue 43).

    One record per output storage: a later call writing into the same storage (the next call on
    the same output or workspaces) replaces it, and the harness's own rewrite of a workspace or
    output before a call drops it (`forget`). Inputs: the check's own (compared against the input
    watch's copies) and the per-call inputs of every other call's problem, except tensors the
    check's own problem holds too.
    """

    def __init__(self) -> None:
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor, str]] = {}
        self.inputs: list[tuple[str, torch.Tensor, torch.Tensor, str]] = []

    def forget(self, tensors: Collection[torch.Tensor]) -> None:
        for tensor in tensors:
            self.outputs.pop(_storage(tensor), None)

    def returned(self, tensor: torch.Tensor, what: str) -> None:
        key = _storage(tensor)
        self.outputs.pop(key, None)  # re-inserted last: the records stay in call order
        self.outputs[key] = (tensor, tensor.detach().clone(), what)

    def given(self, inputs: dict[str, torch.Tensor], what: str, pristine: dict[str, torch.Tensor] | None = None,
              covered: Collection[torch.Tensor] = ()) -> None:
        """Keep `inputs` of the call `what` (with their copies `pristine`, else fresh ones), leaving
        out tensors in the storages of `covered` (watched already)."""
        skip = {_storage(t) for t in covered}
        for name, tensor in inputs.items():
            if _storage(tensor) not in skip:
                copy = pristine[name] if pristine is not None else tensor.detach().clone()
                self.inputs.append((name, tensor, copy, what))

    def findings(self) -> list[Finding]:
        found: list[Finding] = []
        changed = [(what, t, c) for t, c, what in self.outputs.values() if not _same_bytes(t, c)]
        if changed:
            what, tensor, copy = changed[0]
            differing = int((_byte_view(tensor) != _byte_view(copy)).sum())
            found.append(Finding(
                oracle=Oracles.CONTRACT, buffers=[Buffers.OUTPUT],
                message=f"the output {what} returned changed after run() returned: {differing} of "
                        f"{copy.numel() * copy.element_size()} bytes differ when compared again at the check's end "
                        f"({len(changed)} of {len(self.outputs)} calls' outputs changed); a result must be complete "
                        "and final when run() returns (a thread or stream still writing, or a late corruption)",
                figures={"changed_bytes": differing, "calls_changed": len(changed), "calls_compared": len(self.outputs)},
            ))
        reported: set[str] = set()
        for name, tensor, copy, what in self.inputs:
            if name in reported or _same_bytes(tensor, copy):
                continue
            reported.add(name)
            differing = int((_byte_view(tensor) != _byte_view(copy)).sum())
            found.append(Finding(
                oracle=Oracles.CONTRACT, buffers=[name],
                message=f"input {name} of {what} changed after run() returned: {differing} of "
                        f"{copy.numel() * copy.element_size()} bytes differ when compared again at the check's end "
                        "(inputs belong to the caller and must not be written, during the call or after it)",
                figures={"changed_bytes": differing},
            ))
        return found
