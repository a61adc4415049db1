"""The wire format between the judge and the candidate's process: data, never code (issue 43).

Owns: `encode`/`decode` and the schema they hold to. A message is a JSON document for its
structure and raw byte buffers for its tensors and bytes (dtype, shape, device and length named
in the document); the objects that travel are the allow-listed dataclasses below, rebuilt field
by field and each field checked against its annotation. Nothing in a message names a function,
a module or a class outside that list, so nothing the candidate sends runs code in the judge
(pickle did: any `__reduce__` the candidate handed back ran in the judge when it was read).
Anything else is a `MessageError`, which the judge reports as a `contract` finding.

Frame: 8-byte length of the JSON document, the document, then each buffer as 8-byte length and
bytes, in the order the document numbers them.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import torch

_LENGTH = struct.Struct("<Q")
# The classes that may cross, by name: what a check's requests and answers are made of. A name
# missing here is a MessageError on either side, never a pickle.
_CLASSES = (
    ("diffmoe.problem.config", "MoEConfig"), ("diffmoe.problem.inputs", "Problem"),
    ("diffmoe.contract", "Schedule"), ("diffmoe.contract", "WorkspacePlan"),
    ("diffmoe.contract", "Placement"), ("diffmoe.problem.vocabulary", "StageSpec"),
    ("diffmoe.findings", "Finding"), ("diffmoe.findings", "ByteRange"),
    ("diffmoe.check.candidate", "Run"), ("diffmoe.check.candidate", "Executed"),
    ("diffmoe.check.candidate", "TensorIdentity"), ("diffmoe.check.recording", "LaunchLog"),
    ("diffmoe.check.recording", "RecordedLaunch"), ("diffmoe.check.recording", "TensorRegion"),
    ("diffmoe.interpreter.store_coverage", "StoreGap"),
    ("diffmoe.interpreter.bounds_guard", "OutOfBounds"), ("diffmoe.interpreter.bounds_guard", "Allocation"),
    ("diffmoe.interpreter.wrap_watch", "AddressWrap"), ("diffmoe.interpreter.wrap_watch", "Wrap"),
    ("diffmoe.interpreter.wrap_watch", "Headroom"),
    ("diffmoe.interpreter.program_sample", "ProgramSample"), ("diffmoe.interpreter.program_sample", "SampledLaunch"),
    ("diffmoe.isolation.messages", "Handle"), ("diffmoe.isolation.messages", "RemoteWorkspaces"),
    ("diffmoe.isolation.messages", "RemoteOutput"), ("diffmoe.isolation.messages", "AddressVerdicts"),
    ("diffmoe.isolation.messages", "Unsendable"),
)
_REGISTRY: dict[str, type] = {}
_HINTS: dict[type, dict[str, Any]] = {}
_DEVICE = re.compile(r"(cpu|meta|cuda(:\d+)?)\Z")
_MAX_DEPTH = 64  # deeper than any message a check sends; a deeper one is refused, not recursed into


class MessageError(ValueError):
    """A message that is not data of the schema: its bytes are never used."""


def _registry() -> dict[str, type]:
    if not _REGISTRY:
        import importlib

        for module, name in _CLASSES:
            _REGISTRY[name] = getattr(importlib.import_module(module), name)
    return _REGISTRY


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


# ---- encoding ----------------------------------------------------------------------------
def encode(obj: object) -> bytes:
    """The bytes of `obj`, or a TypeError naming what is not data of the schema."""
    buffers: list[bytes] = []
    document = json.dumps(_to_data(obj, buffers, 0), separators=(",", ":")).encode()
    parts = [_LENGTH.pack(len(document)), document]
    for buffer in buffers:
        parts += [_LENGTH.pack(len(buffer)), buffer]
    return b"".join(parts)


def _to_data(obj: object, buffers: list[bytes], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise TypeError("a message nested deeper than diffmoe sends")
    depth += 1
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if isinstance(obj, (bool, int, float, str)):  # a subclass travels as its plain value
        return (bool if isinstance(obj, bool) else int if isinstance(obj, int) else
                float if isinstance(obj, float) else str)(obj)
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        buffers.append(t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes() if t.numel() else b"")
        return {"T": len(buffers) - 1, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                "device": str(t.device)}
    if isinstance(obj, (bytes, bytearray, memoryview)):
        buffers.append(bytes(obj))
        return {"B": len(buffers) - 1}
    if isinstance(obj, torch.dtype):
        return {"dtype": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.device):
        return {"device": str(obj)}
    if isinstance(obj, list):
        return [_to_data(v, buffers, depth) for v in obj]
    if isinstance(obj, tuple) and not dataclasses.is_dataclass(obj):
        return {"tuple": [_to_data(v, buffers, depth) for v in obj]}
    if isinstance(obj, (set, frozenset)):
        return {"set": [_to_data(v, buffers, depth) for v in obj]}
    if isinstance(obj, Mapping):
        return {"dict": [[_to_data(k, buffers, depth), _to_data(v, buffers, depth)] for k, v in obj.items()]}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = type(obj).__name__
        if _registry().get(name) is not type(obj):
            raise TypeError(f"{type(obj).__module__}.{type(obj).__qualname__} is not a type the candidate's process may send")
        return {"class": name, "fields": {f.name: _to_data(getattr(obj, f.name), buffers, depth)
                                          for f in dataclasses.fields(obj)}}
    if hasattr(obj, "item") and type(obj).__module__ == "numpy":  # a numpy scalar in a finding's figures
        return _to_data(obj.item(), buffers, depth)
    raise TypeError(f"a {type(obj).__module__}.{type(obj).__qualname__} is not data a message carries")


# ---- decoding ----------------------------------------------------------------------------
def decode(data: bytes) -> Any:
    """The value `data` encodes; a MessageError for anything that is not data of the schema."""
    view = memoryview(data)
    try:
        (size,) = _LENGTH.unpack_from(view, 0)
        document = json.loads(bytes(view[8:8 + size]))
        buffers, at = [], 8 + size
        while at < len(view):
            (length,) = _LENGTH.unpack_from(view, at)
            if at + 8 + length > len(view):
                raise MessageError("a buffer runs past the message's end")
            buffers.append(view[at + 8:at + 8 + length])
            at += 8 + length
    except (struct.error, ValueError, RecursionError) as exc:
        raise MessageError(f"not a message of diffmoe's wire format ({type(exc).__name__}: {exc})") from None
    return _from_data(document, buffers, 0)


def _tagged(value: dict, keys: set[str]) -> bool:
    return set(value) == keys


def _from_data(value: Any, buffers: list, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise MessageError("a message nested deeper than diffmoe sends")
    depth += 1
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, list):
        return [_from_data(v, buffers, depth) for v in value]
    if not isinstance(value, dict):
        raise MessageError(f"a {type(value).__name__} in a message")
    if _tagged(value, {"T", "dtype", "shape", "device"}):
        return _tensor(value, buffers)
    if _tagged(value, {"B"}):
        return bytes(_buffer(value["B"], buffers))
    if _tagged(value, {"dtype"}):
        return _dtype(value["dtype"])
    if _tagged(value, {"device"}):
        return torch.device(_device(value["device"]))
    if _tagged(value, {"tuple"}) and isinstance(value["tuple"], list):
        return tuple(_from_data(v, buffers, depth) for v in value["tuple"])
    if _tagged(value, {"set"}) and isinstance(value["set"], list):
        return {_hashable(_from_data(v, buffers, depth)) for v in value["set"]}
    if _tagged(value, {"dict"}) and isinstance(value["dict"], list):
        pairs = [_pair(p, buffers, depth) for p in value["dict"]]
        return {_hashable(k): v for k, v in pairs}
    if _tagged(value, {"class", "fields"}) and isinstance(value["fields"], dict):
        return _instance(value["class"], value["fields"], buffers, depth)
    raise MessageError(f"an object with keys {sorted(value)[:6]} in a message")


def _pair(pair: Any, buffers: list, depth: int) -> tuple:
    if not isinstance(pair, list) or len(pair) != 2:
        raise MessageError("a dict entry that is not a key and a value")
    return _from_data(pair[0], buffers, depth), _from_data(pair[1], buffers, depth)


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        raise MessageError(f"a {type(key).__name__} as a key") from None
    return key


def _buffer(index: Any, buffers: list) -> memoryview:
    if type(index) is not int or not 0 <= index < len(buffers):
        raise MessageError(f"buffer {index!r} of a message with {len(buffers)}")
    return buffers[index]


def _dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise MessageError(f"dtype {str(name)[:40]!r} is not a torch dtype")
    return dtype


def _device(name: Any) -> str:
    if not isinstance(name, str) or not _DEVICE.match(name):
        raise MessageError(f"device {str(name)[:40]!r} is not cpu, meta or cuda[:n]")
    return name


def _tensor(value: dict, buffers: list) -> torch.Tensor:
    dtype, device = _dtype(value["dtype"]), _device(value["device"])
    shape = value["shape"]
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise MessageError(f"tensor shape {str(shape)[:60]} is not a list of sizes")
    data = _buffer(value["T"], buffers)
    numel = 1
    for n in shape:
        numel *= n
    if len(data) != numel * dtype.itemsize:
        raise MessageError(f"a {dtype} tensor of shape {shape} in {len(data)} bytes")
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape).to(device)


def _instance(name: Any, fields: dict, buffers: list, depth: int) -> Any:
    cls = _registry().get(name) if isinstance(name, str) else None
    if cls is None:
        raise MessageError(f"{str(name)[:60]!r} is not a type a message carries")
    known = {f.name: f for f in dataclasses.fields(cls)}
    if not set(fields) <= set(known):
        raise MessageError(f"{name} has no field {sorted(set(fields) - set(known))[0]!r}")
    hints = _hints(cls)
    values = {k: _from_data(v, buffers, depth) for k, v in fields.items()}
    for key, field_value in values.items():
        if not conforms(field_value, hints.get(key, Any)):
            raise MessageError(f"{name}.{key} is a {type(field_value).__name__}, not {hints[key]}")
    try:
        obj = cls(**{k: v for k, v in values.items() if known[k].init})
    except (TypeError, ValueError) as exc:  # a missing field, or a config its own validation refuses
        raise MessageError(f"{name}: {exc}") from None
    for key, field_value in values.items():
        if not known[key].init:
            object.__setattr__(obj, key, field_value)
    return obj


def conforms(value: Any, hint: Any) -> bool:
    """Whether a decoded value fits a field's annotation (containers element by element; what the
    annotation does not pin down, Any and protocols, is any decoded data)."""
    if hint is Any or isinstance(hint, (str, typing.TypeVar)):
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return type(value) in (int, float)
    if hint in (int, str, bool, bytes):
        return type(value) is hint
    if origin is None:
        return isinstance(value, hint) if isinstance(hint, type) and not _protocol(hint) else True
    if origin in (list, Sequence) or origin is typing.List:
        return isinstance(value, (list, tuple)) and all(conforms(v, args[0]) for v in value) if args else True
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(v, args[0]) for v in value)
        return not args or (len(args) == len(value) and all(conforms(v, a) for v, a in zip(value, args)))
    if origin in (set, frozenset):
        return isinstance(value, (set, frozenset)) and all(conforms(v, args[0]) for v in value) if args else True
    if origin in (dict, Mapping):
        return isinstance(value, dict) and (not args or all(conforms(k, args[0]) and conforms(v, args[1])
                                                            for k, v in value.items()))
    return True


def _protocol(cls: type) -> bool:
    return bool(getattr(cls, "_is_protocol", False))
