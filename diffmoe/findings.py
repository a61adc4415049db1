"""Findings: what every oracle, recorder and guard reports, in one type at the ground.

A finding names the oracle, the stage, the buffers and (where relevant) the bytes, with a
message a kernel engineer understands at a glance and the figures behind it. The interpreter's
recorders build them in the candidate's process, the oracles in the judge's, and a Report
(diffmoe.check.report) holds them; so the type sits below all of them (issue 44: the layers).

Owns the finding types and the oracles' names. Must not import anything of diffmoe.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


class Oracles:
    """Oracle names, as they appear in findings and in `--oracles` selections."""

    DIFFERENTIAL = "differential"  # every materialised buffer against the reference
    TEACHER_FORCING = "teacher-forcing"  # one stage on the reference's inputs
    METAMORPHIC = "metamorphic"  # fused vs unfused quanted_down_input
    STATIC_ALIASING = "static-aliasing"  # the declared plan alone
    RUNTIME_ALIASING = "runtime-aliasing"  # the views each launch really used
    BOUNDS = "bounds"  # every interpreted load and store inside its launch's allocations (refused otherwise)
    OVERFLOW = "overflow"  # no interpreted load or store through an integer offset that wrapped
    RACES = "races"  # per-program addresses under the interpreter
    STORE_EXTENT = "store-extent"  # every stored byte inside the launch's declared write views (interpreter)
    CALL_SEQUENCE = "call-sequence"  # a call does not depend on the calls before it on the same workspaces
    SCHEDULE = "schedule"  # result depends on program order
    POISON = "poison"  # result depends on workspace contents before the call
    RED_ZONE = "red-zone"  # guard bytes around a workspace changed
    CONTRACT = "contract"  # shapes, dtypes, declared buffers, input writes
    BATCH_INVARIANCE = "batch-invariance"  # a token's results do not depend on its batch
    CRASH = "crash"  # the implementation raised
    TIMEOUT = "timeout"  # the example ran past its time limit


@dataclass(frozen=True)
class ByteRange:
    """Bytes [start, end) of a workspace (ws1, ws2) or another named storage."""

    region: str
    start: int
    end: int

    def __str__(self) -> str:
        return f"{self.region}[{self.start}:{self.end}]"


@dataclass
class Finding:
    oracle: str
    message: str
    stage: str | None = None
    buffers: list[str] = field(default_factory=list)
    byte_ranges: list[ByteRange] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["byte_ranges"] = [asdict(b) for b in self.byte_ranges]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        return cls(
            oracle=d["oracle"],
            message=d["message"],
            stage=d.get("stage"),
            buffers=list(d.get("buffers", [])),
            byte_ranges=[ByteRange(**b) for b in d.get("byte_ranges", [])],
            figures=dict(d.get("figures", {})),
        )

    def headline(self) -> str:
        where = f" at {self.stage}" if self.stage else ""
        bufs = f" [{', '.join(self.buffers)}]" if self.buffers else ""
        return f"{self.oracle}{where}{bufs}: {self.message}"
