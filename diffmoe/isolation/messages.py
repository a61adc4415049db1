"""What crosses between the judge and the candidate's process: pickled messages and the
judge's stand-ins for objects that stay in the candidate's process.

Owns: `send`/`recv` (pickled bytes, never shared memory: what the candidate returns is a copy it
cannot change afterwards), handles of instances, workspaces and outputs, the address verdicts of
a run, and what stands for a non-dict run_stage result.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Any

import torch


def _tensor(dtype: torch.dtype, shape: tuple[int, ...], device: str, data: bytes) -> torch.Tensor:
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape).to(device)


class _Pickler(pickle.Pickler):
    """Plain pickle, but a tensor travels as its dtype, shape, device and bytes: a copy, whatever
    its dtype (plain pickle of an FP8 storage loses its dtype), with no shared memory."""

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            data = t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes() if t.numel() else b""
            return _tensor, (t.dtype, tuple(t.shape), str(t.device), data)
        return NotImplemented


def dumps(obj: object) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def loads(data: bytes) -> Any:
    return pickle.loads(data)


def send(conn, message: object) -> None:
    conn.send_bytes(dumps(message))


def recv(conn) -> Any:
    return loads(conn.recv_bytes())


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
