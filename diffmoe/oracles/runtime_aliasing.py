"""Runtime aliasing: judge the views each launch really read and wrote (a `LaunchLog`).

The static oracle trusts the declared plan; this one checks what happened, so it also
catches an implementation that carves its views differently from what it declared.

Rules, by buffer name and storage bytes:
  * within a launch, a write overlapping a read of a different buffer: the launch may
    destroy its own input before every program instance has read it;
  * within a launch, two writes of different buffers overlapping;
  * across launches, when launch j reads buffer b last written by launch i, a write of a
    different buffer at any launch k with i < k <= j overlapping the bytes j reads: b no
    longer holds what i wrote.
One finding per pair of buffers and stage.

Owns the runtime rule. Must not run the implementation: it reads the launch log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diffmoe.check.recording import LaunchLog, RecordedLaunch, TensorRegion
from diffmoe.findings import ByteRange, Finding, Oracles
from diffmoe.problem.vocabulary import Buffers
from diffmoe.oracles.base import Oracle


@dataclass(frozen=True)
class _Labeller:
    """Names storage bytes after the caller's labels (data_ptr -> "ws1", "output", ...).

    A label's pointer may be the storage's own start or lie inside it (a guarded workspace
    is the middle of a larger allocation): bytes are reported relative to the nearest
    labelled pointer at or below them, so "ws2 bytes [0, 4096)" means ws2's first 4096 bytes.
    A storage the caller did not label is one the implementation allocated: it is named by what
    it holds, the first view a launch wrote into it (else read from it), never by its address
    (issue 28): "intermediate_cache1 (allocated by the implementation)".
    """

    names: dict[int, str]
    holds: dict[int, str] = field(default_factory=dict)  # unlabelled storage -> the first view's name

    @classmethod
    def of(cls, names: dict[int, str], launches: list[RecordedLaunch]) -> _Labeller:
        holds: dict[int, str] = {}
        for kind in ("writes", "reads"):
            for launch in launches:
                for region in getattr(launch, kind):
                    holds.setdefault(region.storage_ptr, region.name)
        return cls(names, holds)

    def byte_range(self, region: TensorRegion, start: int, end: int) -> ByteRange:
        limit = region.storage_ptr + max(region.storage_nbytes, 1)
        inside = sorted(p for p in self.names if region.storage_ptr <= p < limit)
        if not inside:
            held = self.holds.get(region.storage_ptr, region.name)
            return ByteRange(f"{held} (allocated by the implementation)", start, end)
        address = region.storage_ptr + start
        below = [p for p in inside if p <= address]
        base = below[-1] if below else inside[0]
        shift = base - region.storage_ptr
        return ByteRange(self.names[base], start - shift, end - shift)


def _describe(r: ByteRange) -> str:
    return f"{r.region} bytes [{r.start}, {r.end})"


class _Findings:
    """Collects findings keyed by (clobbering launch's stage, pair of buffers)."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, frozenset[str]], tuple[int, Finding]] = {}

    def add(self, launch: RecordedLaunch, buffers: list[str], where: ByteRange, message: str, figures: dict) -> None:
        key = (launch.stage, frozenset(buffers))
        if key in self._by_key:
            finding = self._by_key[key][1]
            if where not in finding.byte_ranges:
                finding.byte_ranges.append(where)
            return
        finding = Finding(
            oracle=Oracles.RUNTIME_ALIASING,
            stage=launch.stage,
            buffers=buffers,
            byte_ranges=[where],
            message=message,
            figures={"launch": launch.index, "kernel": launch.kernel, **figures},
        )
        self._by_key[key] = (launch.index, finding)

    def ordered(self) -> list[Finding]:
        return [f for _, f in sorted(self._by_key.values(), key=lambda item: item[0])]


def _last_writer(launches: list[RecordedLaunch], buffer: str, before: int) -> int | None:
    for i in range(before - 1, -1, -1):
        if any(w.name == buffer for w in launches[i].writes):
            return i
    return None


def check_runtime_aliasing(log: LaunchLog, region_names: dict[int, str]) -> list[Finding]:
    """Findings for every buffer a launch overwrote while it was still needed (see module doc)."""
    launches = list(log.launches)
    label = _Labeller.of(dict(region_names), launches)
    found = _Findings()

    # Across launches first: its message names who wrote and who reads the lost buffer,
    # which also describes a launch clobbering its own input best.
    for j, reader in enumerate(launches):
        for read in reader.reads:
            i = _last_writer(launches, read.name, j)
            if i is None:
                continue
            for k in range(i + 1, j + 1):
                clobberer = launches[k]
                for write in clobberer.writes:
                    shared = write.overlap(read) if write.name != read.name else None
                    if shared is None:
                        continue
                    where = label.byte_range(read, *shared)
                    found.add(
                        clobberer,
                        [read.name, write.name],
                        where,
                        f"{write.name} written by {clobberer.stage} clobbers {read.name} "
                        f"(written by {launches[i].stage}, read by {reader.stage}) in {_describe(where)}",
                        {"written_at_launch": i, "read_at_launch": j},
                    )

    for launch in launches:
        for write in launch.writes:
            for read in launch.reads:
                shared = write.overlap(read) if write.name != read.name else None
                if shared is None:
                    continue
                where = label.byte_range(read, *shared)
                found.add(
                    launch,
                    [read.name, write.name],
                    where,
                    f"{launch.stage} writes {write.name} over {read.name}, which it reads, in {_describe(where)}",
                    {},
                )
        for n, first in enumerate(launch.writes):
            for second in launch.writes[n + 1 :]:
                shared = first.overlap(second) if first.name != second.name else None
                if shared is None:
                    continue
                where = label.byte_range(first, *shared)
                found.add(
                    launch,
                    [first.name, second.name],
                    where,
                    f"{launch.stage} writes {first.name} and {second.name} to the same {_describe(where)}",
                    {},
                )
    return found.ordered()


class RuntimeAliasing(Oracle):
    name = Oracles.RUNTIME_ALIASING
    checks = "the views each launch really used"
    how = "the same rule over storages, offsets and extents the launch recorder saw"
    rank = 40

    def judge_run(self, check, run, first: bool) -> list[Finding]:
        if not first:
            return []
        names = check.guarded.region_names()
        if check.output is not None:
            names.update(check.output.region_names(Buffers.OUTPUT))
        for name, tensor in check.problem.inputs().items():
            names[tensor.untyped_storage().data_ptr()] = name
        return check_runtime_aliasing(run.log, names)
