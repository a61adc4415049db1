"""What crosses between the judge and the candidate's process: messages of data (codec.py) and
the judge's stand-ins for objects that stay in the candidate's process.

Owns: `send`/`recv` (encoded bytes, never pickles and never shared memory: what the candidate
returns is a copy it cannot change afterwards, and reading it runs none of its code), handles
of instances, workspaces and outputs, the address verdicts of a run, and what stands for a
non-dict run_stage result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diffmoe.isolation.codec import MessageError, decode, encode

dumps = encode
loads = decode


def send(conn, message: object) -> None:
    conn.send_bytes(encode(message))


def recv(conn) -> Any:
    """The next message; EOFError when the connection closed, MessageError when it is not data."""
    return decode(conn.recv_bytes())


@dataclass(frozen=True)
class Handle:
    """An object of the candidate's process (an instance), named to the judge by its number."""

    id: int


@dataclass(frozen=True)
class RemoteWorkspaces:
    """Guarded workspaces in the candidate's process: their handle and the names of their regions
    (address -> "ws1"/"ws2"), which the runtime-aliasing oracle reads."""

    id: int
    regions: dict[int, str]

    def region_names(self) -> dict[int, str]:
        return dict(self.regions)


@dataclass(frozen=True)
class RemoteOutput:
    """A guarded output in the candidate's process: its handle, where it lives (the contract
    oracle compares it with what run() returned) and its address."""

    id: int
    tensor: Any  # diffmoe.check.candidate.TensorIdentity

    def region_names(self, name: str = "output") -> dict[int, str]:
        return {self.tensor.data_ptr(): name}


@dataclass(frozen=True)
class AddressVerdicts:
    """The interpreter's address record of a run, as the races and store-extent oracles read it:
    computed beside the candidate, where the addresses are, and sent as findings."""

    race_findings: list
    extent_findings: list

    def findings(self) -> list:
        return list(self.race_findings)

    def store_extent_findings(self) -> list:
        return list(self.extent_findings)


@dataclass(frozen=True)
class Unsendable:
    """What run_stage returned when it is not a dict: only its type travels (the judge's
    contract finding names it)."""

    type_name: str


# ---- checks of what the candidate's process answered (the judge's side reads nothing else) ---
def triples_of_str(attempts) -> bool:
    """The refused attempts a reply ends with: (what, subject, detail) strings."""
    return isinstance(attempts, list) and all(
        isinstance(a, tuple) and len(a) == 3 and all(isinstance(x, str) for x in a) for a in attempts)


def series_answer(answer, calls: int) -> bool:
    """Candidate.series's answer: per call made (its tensors by name, the bounds guard's refused
    accesses; at most `calls`, the series stopping at a call with refused accesses), and findings."""
    import torch

    from diffmoe.findings import Finding
    from diffmoe.interpreter.bounds_guard import OutOfBounds

    def one(a) -> bool:
        return (isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], dict)
                and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in a[0].items())
                and isinstance(a[1], list) and all(isinstance(e, OutOfBounds) for e in a[1]))

    return (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], list) and 1 <= len(answer[0]) <= calls
            and all(one(a) for a in answer[0]) and isinstance(answer[1], list)
            and all(isinstance(f, Finding) for f in answer[1]))
