"""What the optimized path tells `diffmoe doctor` (diffmoe.backend.conformance.ConformanceHooks).

The doctor's probes are the harness's (diffmoe.backend.conformance: they judge Triton, not this MoE).
What is ours, and handed over here: which workaround we apply per primitive and under which
switch (optimized.backend.BackendTraits), our software paths for the doctor to verify on its
probe inputs (the numerics helpers with the software switch on, as the kernels call them), the
switches we would run with on a device (and why we refuse it, on a CUDA backend whose probes
select the slow software fallback), and our launch helper for the program-order probe.

`diffmoe doctor` obtains them through the contract: `make_implementation.conformance_hooks`
(optimized/moe.py) is `conformance_hooks` below. Importing this module imports triton.

Owns what the optimized path answers the doctor. Must not define probes: they are the harness's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from diffmoe.backend.conformance import ConformanceHooks, Workaround
from diffmoe.contract import Schedule

from . import backend
from .kernels.numerics import bf16_to_f32, to_bf16, to_e4m3
from .launch import LaunchContext, launch


@triton.jit
def software_fp8_cast(x):
    return to_e4m3(x, True)


@triton.jit
def software_bf16_cast(x):
    return to_bf16(x, True)


@triton.jit
def software_bf16_upcast(x):
    """bf16 -> float32 by bit moves: the bf16 upcast workaround, and the bf16 dot's operand
    conversion (UPCAST_BF16_DOT widens both operands so, then dots in float32, ieee)."""
    return bf16_to_f32(x, True)


@triton.jit
def correctly_rounded_div(x, y):
    """The kernels' float32 division (act_quant_kernel, numerics.silu)."""
    return tl.math.div_rn(x, y)


WORKAROUNDS = {
    "fp8_cast": Workaround("software_fp8_cast",
                           "software RNE rounding onto the e4m3 grid (numerics.round_to_e4m3_grid)", software_fp8_cast),
    # the decode lives inside the grouped GEMM kernel: nothing for the doctor to run on its own
    "fp8_upcast": Workaround("software_fp8_cast",
                             "fp8 GEMM operands decoded to float32 by bits (DECODE_FP8, on with software_fp8_cast)"),
    "bf16_cast": Workaround("software_bf16_cast",
                            "integer RNE rounding onto the bf16 grid, bits moved by hand (numerics.to_bf16)",
                            software_bf16_cast),
    "bf16_upcast": Workaround("software_bf16_cast", "bf16 widened by bit shifts (numerics.bf16_to_f32)",
                              software_bf16_upcast),
    "bf16_dot": Workaround("upcast_bf16_dot", "bf16 dot upcast to float32, ieee (UPCAST_BF16_DOT)",
                           software_bf16_upcast),
    # no switch: every backend gets it (CUDA compiles `/` to the approximate div.full.f32; the
    # compile gate finds none in the kernels' PTX)
    "fp32_div": Workaround(None, "every float32 division is tl.math.div_rn", correctly_rounded_div),
}

# What a DEFECT means for our kernels, where we say more than the harness's generic text.
UNGUARDED = {
    "fp8_dot": "the fp8 GEMMs call tl.dot on fp8 operands directly: their sums are off by more than "
               "float32 accumulation, which the tolerance table assumes",
    "bf16_dot": "the bf16 GEMMs are wrong",
    "fp32_dot": "the bf16 dot workaround runs on it, so the bf16 GEMMs are off too",
}


def switches(device: torch.device) -> tuple[dict[str, bool], str | None]:
    """The traits the optimized path would use on `device` and, where it refuses the backend
    (SoftwareFallbackError), why; the doctor judges the refused traits all the same."""
    refusal = None
    try:
        traits = backend.backend_traits(device)
    except backend.SoftwareFallbackError as exc:
        traits, refusal = exc.traits, str(exc)
    return {f: getattr(traits, f) for f in backend.TRAIT_FIELDS}, refusal


def launch_probe(kernel, programs: int, schedule: Schedule, device: torch.device, *, context=LaunchContext,
                 **kernel_args) -> None:
    """A probe kernel launched through our own launch helper (which passes order_ptr and REORDER)."""
    launch(context(device, schedule), kernel, programs, stage="conformance", reads={}, writes={}, **kernel_args)


HOOKS = ConformanceHooks(workarounds=WORKAROUNDS, switches=switches, launch=launch_probe, unguarded=UNGUARDED)


def conformance_hooks() -> ConformanceHooks:
    return HOOKS
