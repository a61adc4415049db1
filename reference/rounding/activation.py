"""The activation's rounding points, one function per choice: which gate/up values it reads, where
the SwiGLU limit clamps them, silu's float32 formula, and where silu(gate) * up rounds to bf16.

reference/moe.py's silu_and_mul composes them: clamp(gate, up) -> silu(gate) -> rounding(silu, up).
Citations: vLLM 0.33.0 (csrc/ paths are its CUDA sources, others files of its wheel), Liger-Kernel
0.8.5 (liger_kernel/ops/fused_moe*.py of its wheel), lmdeploy 0.18.0
(lmdeploy/pytorch/kernels/cuda/ of its wheel). The menus' names are diffmoe.problem.numerics's.

Owns the activation's choice functions. Must not import peers/, Triton or the harness's oracles.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

# ---- activation_input: (the stored gate_up_output, the unrounded product on demand) -> gate/up -------


def input_stored_bf16(stored: torch.Tensor, product: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The stored bf16 gate_up_output, as every two-kernel pipeline reads it: diffmoe's, vLLM's
    (silu_and_mul on intermediate_cache1), lmdeploy's (`_silu_and_mul_kernel`)."""
    return stored


def input_fp32_product(stored: torch.Tensor, product: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The gate/up GEMM's float32 product, which the stage does not store: Liger 0.8.5's
    `_fused_up_proj_swiglu_kernel` stores the product rounded to bf16 (pre_act) but computes SwiGLU
    from its float32 accumulators, so the activation never sees the rounded product."""
    return product()


# ---- swiglu_clamp: (gate, up, limit) -> float32 gate, up ------------------------------------------------


def clamp_fp32(gate: torch.Tensor, up: torch.Tensor, limit: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """gate = min(gate, limit), up = clamp(up, -limit, limit) as float32 clamps of the values read
    (DESIGN.md's; vLLM 0.33's swiglu_limit_func, fused_moe/utils.py, pad-aware Triton path). NaN stays."""
    gate, up = gate.float(), up.float()
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return gate, up


def clamp_bf16(gate: torch.Tensor, up: torch.Tensor, limit: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The same clamps on bf16 tensors (torch's bf16 clamp): vLLM 0.33's `_swiglu_limit_torch`
    (fused_moe/utils.py, the path the peer runs). A float32 input is rounded to bf16 for the clamp,
    as that op's input is; without a limit nothing is clamped or rounded. NaN stays."""
    if limit is not None:
        gate = gate.to(torch.bfloat16).clamp(max=limit)
        up = up.to(torch.bfloat16).clamp(-limit, limit)
    return gate.float(), up.float()


def clamp_none(gate: torch.Tensor, up: torch.Tensor, limit: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """No clamp in the kernel: Liger 0.8.5 and lmdeploy 0.18 take no SwiGLU limit, so a config with
    swiglu_limit cannot be judged under this choice (MoEConfig.validate refuses it)."""
    if limit is not None:
        raise ValueError(f"swiglu_clamp=none takes no swiglu_limit, got {limit!r}")
    return gate.float(), up.float()


# ---- silu: float32 gate -> float32 silu(gate) ---------------------------------------------------------------


def silu_divide(gate: torch.Tensor) -> torch.Tensor:
    """gate / (1 + exp(-gate)), the definition: diffmoe's (the shipped kernels compute this one, and
    the interpreter's exp is torch's, so the fused stage is bitwise); lmdeploy 0.18's
    `_silu_and_mul_kernel` (activation.py)."""
    return gate / (1.0 + torch.exp(-gate))


def silu_reciprocal(gate: torch.Tensor) -> torch.Tensor:
    """gate * (1 / (1 + exp(-gate))), the reciprocal rounded first: vLLM 0.33's fused silu + block
    quant (csrc/quantization/fused_kernels/)."""
    return gate * (1.0 / (1.0 + torch.exp(-gate)))


def silu_sigmoid(gate: torch.Tensor) -> torch.Tensor:
    """gate * sigmoid(gate): Liger 0.8.5's `_fused_up_proj_swiglu_kernel` (acc_gate * sigmoid(acc_gate))."""
    return gate * torch.sigmoid(gate)


def silu_torch(gate: torch.Tensor) -> torch.Tensor:
    """torch's F.silu (its own exp; 43,917 of 2^20 float32 results differ from the definition's):
    the vllm profile's formula for vLLM 0.33's silu_and_mul (csrc/activation_kernels.cu, silu_kernel:
    x / (1 + expf(-x)) with CUDA's expf, which no CPU formula matches bit for bit; the activation's
    1-ulp tolerance row covers the exp). peers/vllm/ops.py's stand-in writes the definition (divide)."""
    return F.silu(gate)


# ---- silu_rounding: (float32 silu, float32 up) -> bf16 --------------------------------------------------


def rounding_once(silu: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu * up in float32, rounded once to bf16: diffmoe's; Liger 0.8.5's post_act."""
    return (silu * up).to(torch.bfloat16)


def rounding_silu_to_bf16(silu: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu rounded to bf16, then the product with up rounded: vLLM 0.33's silu_and_mul
    (csrc/activation_kernels.cu: silu_kernel returns scalar_t, and scalar_t * scalar_t rounds);
    lmdeploy 0.18's `_silu_and_mul_kernel` (silu stored as bf16, times up in bf16)."""
    return (silu.to(torch.bfloat16).float() * up).to(torch.bfloat16)
