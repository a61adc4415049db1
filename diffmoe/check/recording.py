"""Launch recorders: what the harness learns from an implementation's `LaunchRecorder` calls.

`LaunchLog` keeps, for every launch in order, the storage and byte range of every view it
read and wrote (the runtime aliasing oracle judges those), and optionally a copy of every
buffer right after the launch that wrote it: intermediates in shared workspaces are
overwritten by later stages, so the copy is the only way to compare them with the reference.
It also keeps whether a launch was reported as a Triton kernel and, under the interpreter, how
many Triton programs ran during it (diffmoe.interpreter.program_count; the contract oracle judges
a Triton launch that ran none), and, where the call gives it a store watch
(diffmoe.interpreter.store_coverage: the first order's run), which declared bytes of each Triton
launch its programs did not store (`RecordedLaunch.unstored`, `host_written`).

Owns the launch log and the snapshots. Must not judge what it records: the oracles do.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping

import torch

from diffmoe.contract import LaunchInfo, LaunchRecorder
from diffmoe.interpreter.program_count import programs_run
from diffmoe.interpreter.store_coverage import StoreGap  # noqa: F401 - a RecordedLaunch holds them


@dataclass(frozen=True)
class TensorRegion:
    """The bytes a view can address: [start_byte, end_byte) of its storage.

    start/end count from the start of the storage (`untyped_storage().data_ptr()`), so two
    regions overlap exactly when they share a storage and their byte ranges intersect. The
    span covers every element the strides can reach, gaps included.
    """

    name: str
    storage_ptr: int
    start_byte: int
    end_byte: int
    device: str
    storage_nbytes: int = 0

    @property
    def nbytes(self) -> int:
        return self.end_byte - self.start_byte

    def overlap(self, other: TensorRegion) -> tuple[int, int] | None:
        """The shared bytes [start, end) of the same storage, or None."""
        if self.device != other.device or self.storage_ptr != other.storage_ptr:
            return None
        start, end = max(self.start_byte, other.start_byte), min(self.end_byte, other.end_byte)
        return (start, end) if start < end else None


def region_of(name: str, tensor: torch.Tensor) -> TensorRegion:
    storage = tensor.untyped_storage()
    size = tensor.element_size()
    start = tensor.storage_offset() * size
    if tensor.numel() == 0:
        end = start
    else:
        # torch strides are never negative, so the first element is the lowest address
        last = sum((n - 1) * stride for n, stride in zip(tensor.shape, tensor.stride()))
        end = start + last * size + size
    return TensorRegion(name, storage.data_ptr(), start, end, str(tensor.device), storage.nbytes())


@dataclass(frozen=True)
class RecordedLaunch:
    index: int  # position in the run, from 0
    stage: str
    kernel: str
    grid: tuple[int, ...]
    reads: list[TensorRegion]
    writes: list[TensorRegion]
    triton: bool = False  # reported as a Triton kernel (LaunchInfo.triton)
    why: str = ""  # why it has its stage, when the adapter kit decided it (LaunchInfo.why); "" otherwise
    # Triton programs the interpreter ran between before_launch and after_launch; None where they are
    # not counted (compiled launches: diffmoe.interpreter.program_count) or the launch did not finish
    programs: int | None = None
    # Under the interpreter, on the first order's run, for a Triton launch whose write views are in
    # host memory (diffmoe.interpreter.store_coverage): its declared bytes no store of the launch
    # touched, unchanged (`unstored`) or changed by other code inside its window (`host_written`);
    # None where stores were not watched
    unstored: tuple[StoreGap, ...] | None = None
    host_written: tuple[StoreGap, ...] | None = None


def _regions(views: Mapping[str, torch.Tensor]) -> list[TensorRegion]:
    return [region_of(name, view) for name, view in views.items()]


@dataclass
class LaunchLog:
    """Records every launch; with snapshot=True also copies each written buffer after its launch.

    snapshots: buffer name -> copy taken after the latest launch that wrote it.
    snapshot_launch: buffer name -> index of that launch.
    """

    snapshot: bool = False
    stores: Any = None  # a diffmoe.interpreter.store_coverage.StoreWatch, entered around the run, or None
    launches: list[RecordedLaunch] = field(default_factory=list)
    snapshots: dict[str, torch.Tensor] = field(default_factory=dict)
    snapshot_launch: dict[str, int] = field(default_factory=dict)
    # launches begun: (index, programs run then, the store watch's views of it or None)
    _open: list[tuple[int, int | None, Any]] = field(default_factory=list)

    def before_launch(self, launch: LaunchInfo) -> None:
        self.launches.append(
            RecordedLaunch(
                index=len(self.launches),
                stage=launch.stage,
                kernel=launch.kernel,
                grid=tuple(launch.grid),
                reads=_regions(launch.reads),
                writes=_regions(launch.writes),
                triton=bool(getattr(launch, "triton", False)),
                why=str(getattr(launch, "why", "") or ""),
            )
        )
        views = self.stores.begin(launch.writes) if self.stores is not None and self.launches[-1].triton else None
        self._open.append((len(self.launches) - 1, programs_run(), views))

    def after_launch(self, launch: LaunchInfo) -> None:
        if self._open:
            index, before, views = self._open.pop()
            after = programs_run()
            if before is not None and after is not None:
                self.launches[index] = replace(self.launches[index], programs=after - before)
            if views is not None:
                unstored, host = self.stores.end(views)
                self.launches[index] = replace(self.launches[index], unstored=unstored, host_written=host)
        if not self.snapshot:
            return
        for name, view in launch.writes.items():
            self.snapshots[name] = view.detach().clone()
            self.snapshot_launch[name] = len(self.launches) - 1

    def clear(self) -> None:
        """Forget everything, to record another run."""
        self.launches.clear()
        self._open.clear()
        self.snapshots.clear()
        self.snapshot_launch.clear()

    def __len__(self) -> int:
        return len(self.launches)

    def __iter__(self) -> Iterator[RecordedLaunch]:
        return iter(self.launches)


class ChainedRecorder:
    """Forwards every call to each recorder, in the order given (None entries are skipped)."""

    def __init__(self, *recorders: LaunchRecorder | None) -> None:
        self.recorders = [r for r in recorders if r is not None]

    def before_launch(self, launch: LaunchInfo) -> None:
        for recorder in self.recorders:
            recorder.before_launch(launch)

    def after_launch(self, launch: LaunchInfo) -> None:
        for recorder in self.recorders:
            recorder.after_launch(launch)
