"""An independent specification of the MoE pipeline in numpy, used only to test the reference.

Nothing here comes from reference/ (nor from tests/support/dense_moe.py, which borrows the
reference's weight dequantisation): every rounding is written out by hand, bf16 by integer
ops on the float32 bit pattern, float8_e4m3fn from its bit layout. diffmoe is used for the
inputs and the names (config, problem, vocabulary), torch only at the boundary
(`to_numpy`), to read tensors as numpy arrays.

The pipeline, as DESIGN.md ("Semantics worth matching") and the rounding points documented
by reference/moe.py state it (T tokens, E experts, K top-k, H hidden, I intermediate,
TK = T*K routed rows, row t*K + k reads token t; L local experts):

  input weight  router_weight='input' (K == 1): x = bf16(float32(x) * w)
  quant input   per tensor / per token: scale = max(amax / 448, 1 / (448 * 512)) in float32;
                per 1x128 group: scale = max(amax, 1e-10) / 448;
                codes = e4m3fn(clamp(x / scale, -448, 448)), ties to even
  gate-up       float32 operands (code * scale, rounded to float32), accumulated in float32,
                rounded to bf16; rows of experts the expert map sends elsewhere (-1) are 0
  activation    silu(gate) * up in float32, rounded to bf16; with a SwiGLU limit, gate and
                up first clamped in float32 to gate <= limit, -limit <= up <= limit
  quant down    as quant input, on the [TK, I] activation
  down          as gate-up; router_weight='down' multiplies the float32 result by the
                router weight in float32, before the bf16 rounding
  reduce        float32 sum over k in order 0..K-1, rounded to bf16

Exact where it can be: input weighting, quantisation, dequantisation and the reduce are
single IEEE operations in a fixed order, which numpy performs with the same roundings, so
the spec gives their results bit for bit. Two stages cannot be reproduced bit for bit: the
order in which a float32 GEMM accumulates is the BLAS library's choice, and torch's float32
silu uses its own exp. For those the spec returns a `Bounded`: its own answer (the exact
value rounded as the pipeline says) and the interval of bf16 values that any float32
evaluation within a proved (GEMM) or stated (silu) error bound can round to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from diffmoe.problem.config import QUANT_BLOCK
from diffmoe.problem.inputs import Problem
from diffmoe.problem.vocabulary import Buffers

FP8_MAX = np.float32(448.0)  # largest finite e4m3fn value (S.1111.110)
# Floors as float32: the reference's float32 arithmetic sees a Python float as its float32
# rounding (1 / (448 * 512) is not a binary fraction, 1e-10 neither).
TOKEN_SCALE_FLOOR = np.float32(1.0 / (448.0 * 512.0))  # per-tensor and per-token scale floor
GROUP_AMAX_FLOOR = np.float32(1e-10)  # 1x128 group amax floor

U32 = 2.0**-24  # unit roundoff of float32
U64 = 2.0**-53  # unit roundoff of float64
# torch's float32 silu (x / (1 + exp(-x)) with a vectorised exp accurate to about 1 ulp) is
# a few ulps from the exact silu: one for exp, half for the add, half for the division, and
# 1 + exp(-x) does not amplify a relative error. Four ulps is that with a margin; the test
# fails (the reference leaves the interval) if torch is ever less accurate.
SILU_ULPS = 4
FP8_SCHEMES = ("fp8-tensor", "fp8-token", "fp8-block")


# ---- bf16 -------------------------------------------------------------------------------


def bf16_round(x) -> np.ndarray:
    """float32 -> nearest bf16, ties to even, returned as float32 holding the bf16 value.

    Integer ops on the bit pattern: add 0x7FFF plus the lowest kept bit, then clear the low
    16 bits. A carry out of the mantissa bumps the exponent, which is the right round-up,
    up to Inf past the largest finite bf16. A NaN keeps its quiet bit set, because clearing
    the low payload bits of a signalling NaN would leave the Inf pattern.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)  # 64-bit so that adding never wraps
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    quiet_nan = (bits | 0x00400000) & 0xFFFF0000
    out = np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint32)
    return out.view(np.float32)


def bf16_bits(x) -> np.ndarray:
    """The 16-bit patterns of float32 arrays that hold bf16 values."""
    return (np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _f32_down(x: np.ndarray) -> np.ndarray:
    """The largest float32 <= x (float64 in)."""
    with np.errstate(over="ignore"):
        f = x.astype(np.float32)
    return np.where(f.astype(np.float64) > x, np.nextafter(f, np.float32(-np.inf)), f)


def _f32_up(x: np.ndarray) -> np.ndarray:
    """The smallest float32 >= x (float64 in)."""
    with np.errstate(over="ignore"):
        f = x.astype(np.float32)
    return np.where(f.astype(np.float64) < x, np.nextafter(f, np.float32(np.inf)), f)


# ---- float8_e4m3fn -----------------------------------------------------------------------


def _e4m3_value(code: int) -> float:
    """Value of one code: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0
    is subnormal (m / 8 * 2^-6); S.1111.111 is NaN; there are no infinities."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * mantissa / 8.0 * 2.0**-6
    return sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)


E4M3_VALUES = np.array([_e4m3_value(c) for c in range(256)], dtype=np.float64)  # [256]
E4M3_NAN_CODE = 0x7F
# Codes 0x00..0x7E are the non-negative finite values 0 .. 448 in increasing order.
_E4M3_MAGNITUDES = E4M3_VALUES[:E4M3_NAN_CODE]
assert np.all(np.diff(_E4M3_MAGNITUDES) > 0) and _E4M3_MAGNITUDES[-1] == FP8_MAX


def e4m3_is_nan(codes: np.ndarray) -> np.ndarray:
    return (np.asarray(codes) & 0x7F) == E4M3_NAN_CODE


def e4m3_encode(v) -> np.ndarray:
    """float32 values, already saturated to [-448, 448] (or NaN), -> e4m3fn codes (uint8).

    Exact rounding to nearest, ties to even: in the binade [2^b, 2^(b+1)) (b >= -6; below
    2^-6 the subnormals share the spacing of the lowest binade) the spacing is 2^(b-3), and
    |v| / spacing is exact in float64, so np.round (ties to even) picks the neighbour whose
    mantissa is even. A result of 2^(b+1) is the next binade's first value, still on the grid.
    Saturation is the caller's clamp, as DESIGN.md writes it: a finite |v| > 448 is refused.
    The sign is kept for zero (-0 -> 0x80) and NaN (0x7F | sign).
    """
    v = np.ascontiguousarray(v, dtype=np.float32)
    nan = np.isnan(v)
    magnitude = np.where(nan, np.float32(0), np.abs(v)).astype(np.float64)  # NaNs out before the cast:
    # widening a signalling NaN raises numpy's invalid-value warning
    if np.any(magnitude > FP8_MAX):
        raise ValueError(f"e4m3_encode needs values saturated to +-448, got {magnitude.max()}")
    _, exp = np.frexp(magnitude)  # magnitude = m * 2^exp, m in [0.5, 1): binade b = exp - 1
    spacing = np.ldexp(1.0, np.maximum(exp - 1, -6) - 3)
    rounded = np.round(magnitude / spacing) * spacing
    code = np.searchsorted(_E4M3_MAGNITUDES, rounded).astype(np.uint8)
    assert np.array_equal(_E4M3_MAGNITUDES[code], rounded), "rounded value off the e4m3 grid"
    code = np.where(nan, np.uint8(E4M3_NAN_CODE), code).astype(np.uint8)
    return code | (np.signbit(v).astype(np.uint8) << 7)


def e4m3_decode(codes) -> np.ndarray:
    """e4m3fn codes -> float32 values (exact: every code value is a float32)."""
    return E4M3_VALUES[np.asarray(codes, dtype=np.uint8)].astype(np.float32)


# ---- boundary ---------------------------------------------------------------------------


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor as numpy: bf16 as float32 values (bits << 16), e4m3fn as uint8 codes, others as is."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        bits = t.view(torch.int16).numpy().view(np.uint16)
        return (bits.astype(np.uint32) << 16).view(np.float32)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().copy()
    return t.numpy().copy()


@dataclass
class SpecInputs:
    """A problem's inputs as numpy arrays (bf16 as float32 values, e4m3fn as uint8 codes)."""

    quant: str
    router_weight: str
    num_tokens: int  # T of the call
    topk: int  # K
    hidden: int  # H
    inter: int  # I
    hidden_states: np.ndarray  # [T, H] float32 (bf16 values)
    topk_weights: np.ndarray  # [T, K] float32
    local: np.ndarray  # [TK] int64 local expert of routed row t*K + k, -1 where not local or dropped
    w1: np.ndarray  # [L, 2I, H] uint8 codes, or float32 bf16 values for quant='bf16'
    w2: np.ndarray  # [L, H, I]
    w1_scale: np.ndarray | None  # float32
    w2_scale: np.ndarray | None
    swiglu_limit: float | None = None
    weight_quant: str = ""  # the scheme whose layout the weight scales have (MoEConfig.weight_scheme); "" for quant's
    routed_scaling_factor: float | None = None

    @property
    def weight_layout(self) -> str:
        return self.weight_quant or self.quant

    @property
    def is_fp8(self) -> bool:
        return self.quant in FP8_SCHEMES


def _scale_array(s: torch.Tensor | None) -> np.ndarray | None:
    return None if s is None else to_numpy(s).astype(np.float32)


def problem_arrays(problem: Problem) -> SpecInputs:
    cfg = problem.config
    ids = to_numpy(problem.topk_ids).astype(np.int64).reshape(-1)  # [TK] global ids, -1 for a dropped slot
    if problem.expert_map is None:
        local = ids
    else:
        mapped = to_numpy(problem.expert_map).astype(np.int64)
        local = np.array([mapped[e] if e >= 0 else -1 for e in ids], dtype=np.int64)  # [TK]
    return SpecInputs(
        quant=cfg.quant,
        router_weight=cfg.router_weight,
        num_tokens=problem.num_tokens,
        topk=cfg.topk,
        hidden=cfg.hidden,
        inter=cfg.inter,
        hidden_states=to_numpy(problem.hidden_states),
        topk_weights=to_numpy(problem.topk_weights).astype(np.float32),
        local=local,
        w1=to_numpy(problem.w1),
        w2=to_numpy(problem.w2),
        w1_scale=_scale_array(problem.w1_scale),
        w2_scale=_scale_array(problem.w2_scale),
        swiglu_limit=cfg.swiglu_limit,
        weight_quant=cfg.weight_scheme,
        routed_scaling_factor=cfg.routed_scaling_factor,
    )


# ---- exact stages -----------------------------------------------------------------------


def weight_input(x: np.ndarray, topk_weights: np.ndarray) -> np.ndarray:
    """router_weight='input' (K == 1): [T, H] bf16 values times each token's weight in
    float32, rounded to bf16."""
    assert topk_weights.shape[1] == 1, "the router weight scales the token itself only when K == 1"
    return bf16_round(x.astype(np.float32) * topk_weights.astype(np.float32))


def quantize(x: np.ndarray, quant: str) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic FP8 quantisation of a [R, C] activation: (codes uint8 [R, C], scales float32
    of shape [1] per tensor, [R, 1] per token, [R, C/128] per group).

    Every step is one float32 operation (amax is exact, the divisions by 448 and by the
    scale round once), and numpy's maximum and clip propagate NaN as torch's clamps do.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = x.shape
    zero = np.float32(0.0)  # the amax of no element is 0 (a zero-token call)
    if quant == "fp8-tensor":
        amax = np.max(np.abs(x), initial=zero)
        scale = np.maximum(np.float32(amax) / FP8_MAX, TOKEN_SCALE_FLOOR).reshape(1)  # [1]
        per_element = scale
    elif quant == "fp8-token":
        amax = np.max(np.abs(x), axis=1, keepdims=True, initial=zero)  # [R, 1]
        scale = np.maximum(amax / FP8_MAX, TOKEN_SCALE_FLOOR)  # [R, 1]
        per_element = scale
    elif quant == "fp8-block":
        assert cols % QUANT_BLOCK == 0, "1x128 groups need C to be a multiple of 128"
        amax = np.max(np.abs(x.reshape(rows, cols // QUANT_BLOCK, QUANT_BLOCK)), axis=2, initial=zero)
        scale = np.maximum(amax, GROUP_AMAX_FLOOR) / FP8_MAX  # [R, C/128]: floor first, then divide
        per_element = scale[:, np.arange(cols) // QUANT_BLOCK]  # [R, C]: column c is in group c // 128
    else:
        raise ValueError(f"quant must be one of {FP8_SCHEMES}, got {quant!r}")
    with np.errstate(invalid="ignore", divide="ignore"):  # Inf / Inf and 0 / 0 are NaN, as in torch
        saturated = np.clip(x / per_element, -FP8_MAX, FP8_MAX)
    return e4m3_encode(saturated), scale.astype(np.float32)


def dequantize(codes: np.ndarray, scale: np.ndarray, quant: str) -> np.ndarray:
    """float32 values of [R, C] activation codes: code * scale, rounded to float32."""
    cols = codes.shape[1]
    if quant == "fp8-block":
        scale = scale[:, np.arange(cols) // QUANT_BLOCK]  # [R, C]
    with np.errstate(invalid="ignore"):
        return e4m3_decode(codes) * scale.astype(np.float32)


def dequantize_weight(w: np.ndarray, scale: np.ndarray | None, quant: str) -> np.ndarray:
    """float32 values of [L, N, C] weights: code * scale rounded to float32 (bf16 weights as is).

    Scales: [L] per tensor, [L, N] per output channel, [L, ceil(N/128), ceil(C/128)] for
    128x128 blocks (element (n, c) is in block (n // 128, c // 128)).
    """
    if quant == "bf16":
        return w.astype(np.float32)
    _, n, c = w.shape
    if quant == "fp8-tensor":
        per_element = scale[:, None, None]
    elif quant == "fp8-token":
        per_element = scale[:, :, None]
    elif quant == "fp8-block":
        per_element = scale[:, (np.arange(n) // QUANT_BLOCK)[:, None], (np.arange(c) // QUANT_BLOCK)[None, :]]
    else:
        raise ValueError(f"unknown quant {quant!r}")
    return e4m3_decode(w) * per_element.astype(np.float32)


def reduce(down: np.ndarray, num_tokens: int, topk: int, factor: float | None = None) -> np.ndarray:
    """[TK, H] bf16 values -> [T, H]: a float32 sum over k in order 0..K-1 (times float32(factor), the
    routed scaling factor, when given), rounded to bf16. Each numpy float32 operation rounds once, so
    the order fixes the result bit for bit."""
    per_token = down.astype(np.float32).reshape(num_tokens, topk, down.shape[1])  # [T, K, H]
    acc = per_token[:, 0].copy()
    for j in range(1, topk):
        acc = acc + per_token[:, j]
    if factor is not None:
        acc = acc * np.float32(factor)
    return bf16_round(acc)


# ---- bounded stages ---------------------------------------------------------------------


@dataclass
class Bounded:
    """A bf16 stage the spec cannot reproduce bit for bit.

    nearest: the spec's own answer, the stage's float32 result computed exactly (correctly
      rounded) and then rounded to bf16;
    lo, hi: the least and greatest bf16 values (as float32) that any float32 evaluation within
      the error bound `radius` of the exact value can round to. Rounding to nearest is monotone,
      so every such evaluation lands in [lo, hi]. NaN where the exact value is NaN.
    exact, radius: float64, for reports.
    """

    nearest: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    exact: np.ndarray
    radius: np.ndarray


def _bounded(exact: np.ndarray, radius: np.ndarray, nearest_f32: np.ndarray) -> Bounded:
    with np.errstate(invalid="ignore"):  # Inf - Inf where the exact value is infinite: NaN, below
        lo, hi = exact - radius, exact + radius
    infinite = np.isinf(exact)
    lo, hi = np.where(infinite, exact, lo), np.where(infinite, exact, hi)  # an Inf is exactly Inf
    return Bounded(
        nearest=bf16_round(nearest_f32), lo=bf16_round(_f32_down(lo)), hi=bf16_round(_f32_up(hi)), exact=exact, radius=radius
    )


def _gamma(n: int, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): a dot product of length n evaluated in any order,
    with or without fused multiply-adds, is within gamma_n * sum |a_i b_i| of the exact value."""
    return n * u / (1.0 - n * u)


def expert_gemm(a: np.ndarray, w: np.ndarray, local: np.ndarray, row_weight: np.ndarray | None = None) -> Bounded:
    """out[r] = w[local[r]] @ a[r] in float32, times row_weight[r] in float32 when given, in bf16.

    a [R, C] and w [L, N, C] hold float32 values; rows with local[r] == -1 are exactly 0.
    The exact sum is computed in float64 (each product of two float32 values is exact there,
    the sum is within gamma_C(float64) of exact); a float32 accumulation in any order is within
    gamma_C(float32) * sum |a_i w_i| of it. With a row weight the float32 product rounds once
    more (relative 2^-24) and the float64 product once (2^-53).
    """
    rows, c = a.shape
    n = w.shape[1]
    exact = np.zeros((rows, n), dtype=np.float64)
    magnitude = np.zeros((rows, n), dtype=np.float64)  # sum |a_i w_i|
    with np.errstate(invalid="ignore", over="ignore"):
        for e in np.unique(local[local >= 0]):
            sel = local == e
            ae, we = a[sel].astype(np.float64), w[e].astype(np.float64)  # [R_e, C], [N, C]
            exact[sel] = ae @ we.T
            magnitude[sel] = np.abs(ae) @ np.abs(we).T
        radius = (_gamma(c, U32) + _gamma(c, U64)) * magnitude
        nearest = exact.astype(np.float32)  # the correctly rounded float32 accumulation
        if row_weight is not None:
            wgt = row_weight.astype(np.float64)[:, None]  # [R, 1]
            exact = exact * wgt
            radius = radius * np.abs(wgt) * (1 + U32) + (U32 + 2 * U64) * np.abs(exact)
            nearest = nearest * row_weight.astype(np.float32)[:, None]  # float32 product, one rounding
    return _bounded(exact, radius, nearest)


def silu_and_mul(gate_up: np.ndarray, limit: float | None = None) -> Bounded:
    """[R, 2I] bf16 values -> [R, I]: silu(gate) * up in float32, rounded to bf16.

    silu(g) = g / (1 + exp(-g)) in float64 is within a few 2^-53 of exact. The float32 silu is
    allowed SILU_ULPS ulps (relative SILU_ULPS * 2^-23, plus as many of the smallest subnormal
    where silu is tiny), then the float32 product with up rounds once (relative 2^-24).
    A limit clamps first, exactly: each clamp returns one of two float32 values (the value, or
    the limit rounded to float32); NaN stays NaN.
    """
    i = gate_up.shape[1] // 2
    gate, up = gate_up[:, :i].astype(np.float64), gate_up[:, i:].astype(np.float64)  # [R, I]
    if limit is not None:
        lim = np.float64(np.float32(limit))
        gate, up = np.minimum(gate, lim), np.minimum(np.maximum(up, -lim), lim)
    with np.errstate(over="ignore", invalid="ignore"):
        silu = gate / (1.0 + np.exp(-gate))
        exact = silu * up
        silu_error = SILU_ULPS * (2.0**-23 * np.abs(silu) + 2.0**-149) + 4 * U64 * np.abs(silu)
        radius = np.abs(up) * silu_error * (1 + U32) + (U32 + 2 * U64) * np.abs(exact)
        nearest = silu.astype(np.float32) * up.astype(np.float32)  # correctly rounded silu, float32 product
    return _bounded(exact, radius, nearest)


# ---- the whole pipeline -----------------------------------------------------------------


def spec_moe(problem: Problem) -> dict[str, np.ndarray]:
    """Every stage of the pipeline from the problem alone, each bounded stage taking the
    spec's own answer (`Bounded.nearest`) forward. Keys are vocabulary buffer names; the
    activation is included whether or not a fused pipeline materialises it."""
    p = problem_arrays(problem)
    q, t, k = p.quant, p.num_tokens, p.topk
    stages: dict[str, np.ndarray] = {}

    x = p.hidden_states  # [T, H]
    if p.router_weight == "input":
        x = weight_input(x, p.topk_weights)
    if p.is_fp8:
        codes, scale = quantize(x, q)
        stages[Buffers.QUANTED_GATE_UP_INPUT], stages[Buffers.QUANTED_GATE_UP_INPUT_SCALES] = codes, scale
        a1 = dequantize(codes, scale, q)  # [T, H]
    else:
        a1 = x
    a1 = np.repeat(a1, k, axis=0)  # [TK, H]: routed row t*K + k reads token t

    gate_up = expert_gemm(a1, dequantize_weight(p.w1, p.w1_scale, p.weight_layout), p.local).nearest  # [TK, 2I]
    stages[Buffers.GATE_UP_OUTPUT] = gate_up
    act = silu_and_mul(gate_up, p.swiglu_limit).nearest  # [TK, I]
    stages[Buffers.ACTIVATION_OUTPUT] = act
    if p.is_fp8:
        codes, scale = quantize(act, q)
        stages[Buffers.QUANTED_DOWN_INPUT], stages[Buffers.QUANTED_DOWN_INPUT_SCALES] = codes, scale
        a2 = dequantize(codes, scale, q)  # [TK, I]
    else:
        a2 = act

    row_weight = p.topk_weights.reshape(-1) if p.router_weight == "down" else None  # [TK]
    down = expert_gemm(a2, dequantize_weight(p.w2, p.w2_scale, p.weight_layout), p.local, row_weight).nearest  # [TK, H]
    stages[Buffers.DOWN_OUTPUT] = down
    stages[Buffers.OUTPUT] = reduce(down, t, k, p.routed_scaling_factor)  # [T, H]
    return stages
