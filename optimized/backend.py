"""Which backend runs the kernels, and which of its defects the kernels must work around.

The interpreter's defects (../shared/DESIGN.md, notes/interpreter_defects_repro.py): the
float32 -> e4m3fn and float32 -> bf16 casts round wrongly and the bf16 x bf16 dot is wrong.
Each workaround is a constexpr flag; the software roundings are correct on every backend,
so turning one on where the defect is absent changes nothing but speed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class BackendTraits:
    """Workarounds the kernels apply (constexpr switches)."""

    name: str  # "interpreter" or "cuda"
    software_fp8_cast: bool  # round onto the e4m3 grid before the cast
    software_bf16_cast: bool  # round onto the bf16 grid before the cast
    upcast_bf16_dot: bool  # run bf16 x bf16 dots in float32


INTERPRETER_TRAITS = BackendTraits("interpreter", software_fp8_cast=True, software_bf16_cast=True, upcast_bf16_dot=True)
# CUDA's cvt.rn(.satfinite) casts round to nearest even; its bf16 mma is exact in float32.
CUDA_TRAITS = BackendTraits("cuda", software_fp8_cast=False, software_bf16_cast=False, upcast_bf16_dot=False)


def backend_traits(device: torch.device) -> BackendTraits:
    if device.type == "cuda" and not interpreter_enabled():
        return CUDA_TRAITS
    if not interpreter_enabled():
        raise RuntimeError(
            "the optimized MoE needs CUDA or the Triton interpreter: set TRITON_INTERPRET=1 "
            "before importing triton (diffmoe sets it when no GPU is present)"
        )
    return INTERPRETER_TRAITS


def default_device() -> torch.device:
    if torch.cuda.is_available() and not interpreter_enabled():
        return torch.device("cuda")
    return torch.device("cpu")


def normalize_device(device: torch.device) -> torch.device:
    """`cuda` -> `cuda:N` (the current device): tensors report an index, and torch.device("cuda")
    does not compare equal to torch.device("cuda:0")."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def ensure_interpreter_without_gpu() -> None:
    """Turn the interpreter on when no GPU is present; must run before triton is imported."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
