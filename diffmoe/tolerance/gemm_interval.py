"""The derived rule of a GEMM stage: the interval its bf16 output must fall in, per element.

A GEMM stage's output is one round-to-nearest-even bf16 rounding of a float32 dot product. Its
exact value v and the sum m of its terms' magnitudes are computed in float64 from the very inputs
the stage was fed (reference.moe.gemm_exact). Any float32 evaluation of that dot, whatever the
summation order (blocked, pairwise, with or without FMA), with the scales applied before the dot,
after it or per 128-wide K block, and the router weight multiplied before the rounding, lies
within B = (n + 3 * blocks + 6) * 2^-24 * m of v: the bound gamma_n = n*u / (1 - n*u) of a
float32 sum of n terms in any order (Higham, Accuracy and Stability of Numerical Algorithms,
2nd ed., sec. 3.1), plus one rounding per scale product, per block's scaling and add, and the
weight. Round to nearest even is monotone, so the candidate's bf16 value lies in
[RNE(v - B), RNE(v + B)], each end rounded outward to float32 first.

Why it replaces the 2-ulp rule on the interpreter: B is far below a bf16 ulp (at n = 1024 and
random signs about 2^-14 of m), so for almost every element the interval holds one bf16 value,
the reference's; one extra bf16 rounding of a partial sum inside the K loop moves a partial sum
by up to 2^-9 of itself and lands outside it, where 2 ulp let it pass. A non-finite v or m (a NaN
or Inf input) leaves the element to the comparison's own non-finite rule.

The same error reaches an activation computed from the unstored float32 product (the
activation_input=fp32_product choice: Liger's SwiGLU of the accumulators): `activation_interval_bound` carries it through
silu(gate) * up (silu's slope is at most 1.1) plus the formula's own float32 roundings.

Owns the intervals. Must not choose where they apply: the tolerance table does (a DERIVED rule on
a GEMM buffer, an activation of the float32 product), and the oracles judge a stage with `compare_stage`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from diffmoe.tolerance.compare import DERIVED, Comparison, Rule, compare
from diffmoe.problem.config import QUANT_BLOCK
from diffmoe.problem.vocabulary import Buffers, Stages

if TYPE_CHECKING:
    from diffmoe.problem.inputs import Problem

FLOAT32_UNIT_ROUNDOFF = 2.0**-24
# Roundings on top of the n - 1 adds of the sum: the two scale products of a dequantised term
# (or of the dot, scaled after), the weight, and the gamma_n denominator's margin.
EXTRA_ROUNDINGS = 6
ROUNDINGS_PER_BLOCK = 3  # a K block's partial sum times its two scales, then added to the accumulator
SMALLEST_FLOAT32 = 2.0**-149  # a subnormal step per term covers products that underflow

GEMM_STAGES = {Buffers.GATE_UP_OUTPUT: Stages.GATE_UP_GEMM, Buffers.DOWN_OUTPUT: Stages.DOWN_GEMM}

GEMM_INTERVAL_REASON = (
    "any float32 evaluation of the dot lies within (n + 3*blocks + 6) * 2^-24 * sum|terms| of its exact value "
    "(gamma_n for any summation order, plus the scale, block and weight roundings), computed in float64 from the "
    "stage's own inputs; round-to-nearest-even to bf16 is monotone, so the output lies between the roundings of the "
    "two ends"
)


def float32_error_bound(exact: torch.Tensor, magnitude: torch.Tensor, n: int) -> torch.Tensor:
    """B per element (float64): how far any float32 evaluation of the dot may be from `exact`."""
    roundings = n + ROUNDINGS_PER_BLOCK * math.ceil(n / QUANT_BLOCK) + EXTRA_ROUNDINGS
    gamma = roundings * FLOAT32_UNIT_ROUNDOFF / (1 - roundings * FLOAT32_UNIT_ROUNDOFF)
    return gamma * magnitude + n * SMALLEST_FLOAT32


def outward_float32(x: torch.Tensor, toward: float) -> torch.Tensor:
    """float64 -> the nearest float32 on the side of `toward` (-inf: largest <= x; +inf: smallest >= x)."""
    y = x.float()
    beyond = (y.double() > x) if toward < 0 else (y.double() < x)
    return torch.where(beyond, torch.nextafter(y, torch.full_like(y, toward)), y)


def interval_bound(reference: torch.Tensor, stage: str, inputs: dict[str, torch.Tensor],
                   problem: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """(below, above): how far under and over the reference's bf16 output [R, N] a candidate's
    may lie, for compare's derived rule; +inf where the dot is not finite (the comparison's
    non-finite rule judges those elements)."""
    from reference.moe import gemm_exact

    exact, magnitude, n = gemm_exact(stage, inputs, problem)
    return _relative_to(reference, exact, float32_error_bound(exact, magnitude, n))


# silu'(x) = s(x) (1 + x (1 - s(x))) lies in [-0.0999, 1.0999]: its largest |slope|
SILU_MAX_SLOPE = 1.1
# float32 roundings in evaluating gate * sigmoid(gate) * up: exp, add, division, two products
ACTIVATION_ROUNDINGS = 8

ACTIVATION_INTERVAL_REASON = (
    "the activation is computed from the float32 gate/up product, which the stage does not store: gate and up each "
    "lie within the GEMM's float32 error bound of their exact values (as the GEMM rows), silu's slope is at most 1.1, "
    "plus 8 float32 roundings of the formula; round-to-nearest-even to bf16 is monotone"
)


def _relative_to(reference: torch.Tensor, value: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(below, above) of the bf16 interval [RNE(value - b), RNE(value + b)] around the reference;
    +inf where it is not finite."""
    lo = outward_float32(value - b, -math.inf).to(torch.bfloat16).double()
    hi = outward_float32(value + b, math.inf).to(torch.bfloat16).double()
    ref = reference.double().reshape(value.shape)
    finite = torch.isfinite(value) & torch.isfinite(b) & torch.isfinite(lo) & torch.isfinite(hi)
    inf = torch.full_like(ref, math.inf)
    below = torch.where(finite, (ref - lo).clamp_min(0.0), inf).reshape(reference.shape)
    above = torch.where(finite, (hi - ref).clamp_min(0.0), inf).reshape(reference.shape)
    return below, above


def activation_interval_bound(reference: torch.Tensor, inputs: dict[str, torch.Tensor],
                              problem: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """(below, above) for an activation computed from the unrounded float32 gate/up product (the
    activation_input=fp32_product choice, Liger's: reference/rounding/activation.py): the product's
    GEMM error carried through silu(gate) * up."""
    from reference.moe import gemm_exact

    exact, magnitude, n = gemm_exact(Stages.GATE_UP_GEMM, inputs, problem)
    b = float32_error_bound(exact, magnitude, n)
    i = exact.shape[1] // 2
    gate, up, b_gate, b_up = exact[:, :i], exact[:, i:], b[:, :i], b[:, i:]
    silu = gate * torch.sigmoid(gate)
    value = silu * up
    moved = SILU_MAX_SLOPE * b_gate * (up.abs() + b_up) + silu.abs() * b_up
    bound = moved + ACTIVATION_ROUNDINGS * FLOAT32_UNIT_ROUNDOFF * (value.abs() + moved) + SMALLEST_FLOAT32
    return _relative_to(reference, value, bound)


def stage_bound(rule: Rule, buffer: str, reference: torch.Tensor, inputs: dict[str, torch.Tensor],
                problem: Problem) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The derived bound `compare` takes for `buffer` under `rule`, or None when the rule is not
    derived (every other rule is judged on its own)."""
    if rule.mode != DERIVED:
        return None
    if buffer == Buffers.ACTIVATION_OUTPUT:
        return activation_interval_bound(reference, inputs, problem)
    if buffer not in GEMM_STAGES:
        raise ValueError(f"a derived stage rule exists for {sorted([*GEMM_STAGES, Buffers.ACTIVATION_OUTPUT])}, not {buffer!r}")
    return interval_bound(reference, GEMM_STAGES[buffer], inputs, problem)


def compare_stage(buffer: str, reference: torch.Tensor, candidate: torch.Tensor, rule: Rule,
                  inputs: dict[str, torch.Tensor], problem: Problem) -> Comparison:
    """`compare` under a stage's rule, the derived interval computed from the stage's `inputs`
    when the rule is derived (the oracles' and the tests' one way to judge a stage)."""
    return compare(buffer, reference, candidate, rule, bound=stage_bound(rule, buffer, reference, inputs, problem))
