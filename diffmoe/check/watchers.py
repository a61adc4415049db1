"""Recorders that watch one call of the implementation, launch by launch.

Owns: the stage in flight (so a crash or a timeout can name it), bitwise copies of the
problem's inputs (which input a run wrote, when, and restoring it), and the guard bytes
checked after every launch. Each is a `LaunchRecorder` (diffmoe/adapters/contract.py) chained into the
call by `Check.execute`; none judges anything beyond what it watches.

Must not report under an oracle's name other than the contract's (input writes).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch

from diffmoe.adapters.contract import LaunchInfo
from diffmoe.oracles.guards import GuardedTensor, GuardedWorkspaces
from diffmoe.check.recording import LaunchLog, region_of
from diffmoe.check.report import Finding, Oracles
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
            if _same_bytes(tensor, before):
                continue
            changed = int((_byte_view(tensor) != _byte_view(before)).sum())
            first = int((_byte_view(tensor) != _byte_view(before)).nonzero()[0, 0])
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
