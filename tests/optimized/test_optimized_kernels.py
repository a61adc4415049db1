"""The optimized path's kernels one at a time, under the Triton interpreter.

* numerics: the software roundings onto the e4m3 and bf16 grids are bitwise torch's casts, and
  the interpreter's native casts are not (the defects the workarounds exist for);
* the row kernel (input quant, activation, down-input quant, fused act+quant) against the
  reference's quantize_activation / silu_and_mul, and fused against unfused;
* the grouped GEMM on the reference's exact inputs, judged by the project's tolerance table;
* the reduce against the reference's k-ordered float32 sum;
* the schedule hook: every kernel gives the same bits under any program order, and the order
  table really reorders the programs.
"""

from __future__ import annotations

# No TRITON_INTERPRET here: tests/conftest.py turns the interpreter on where there is no GPU.
# Set at import, it would flip every kernel decorated later in the same pytest process into the
# interpreter on a GPU machine too (seen on an H200: the compiled suite ran interpreted).

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from diffmoe.interpreter import fixes as interpreter_fixes
from diffmoe.tolerance.compare import Rule, compare, ulp_distance
from diffmoe.problem.config import QUANT_BLOCK, MoEConfig
from diffmoe.tolerance.gemm_interval import compare_stage
from diffmoe.contract import Schedule
from diffmoe.problem.inputs import make_problem
from diffmoe.check.recording import LaunchLog
from diffmoe.tolerance.table import rule_for
from diffmoe.problem.vocabulary import Buffers as B
from diffmoe.problem.vocabulary import Stages
from optimized.act_quant import row_programs, run_row_stage
from optimized.align import align_routed_rows, max_blocks, max_padded_rows
from optimized.backend import INTERPRETER_TRAITS, interpreter_enabled
from optimized.grouped_gemm import AlignedLayout, run_grouped_gemm
from optimized.kernels.numerics import to_bf16, to_e4m3
from optimized.launch import LaunchContext, launch
from optimized.reduce import run_reduce
from optimized.tiles import choose_tiles
from reference import reference_moe
from reference.moe import quantize_activation, silu_and_mul

pytestmark = pytest.mark.skipif(
    not interpreter_enabled(), reason="drives the kernels with CPU tensors under the Triton interpreter (TRITON_INTERPRET=1)"
)

CPU = torch.device("cpu")
FP8 = torch.float8_e4m3fn
FP8_SCHEMES = ("fp8-tensor", "fp8-token", "fp8-block")
SCHEMES = ("bf16", *FP8_SCHEMES)
TRAITS = INTERPRETER_TRAITS
SCHEDULES = (Schedule("reversed"), Schedule("random", 3))
NAN_BF16 = 0x7FC0  # poison: any element a kernel should write and did not stays NaN
NAN_E4M3 = 0x7F


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw pattern, for exact comparisons (NaN != NaN and +0 == -0 would hide differences)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def poisoned(shape, dtype) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype)
    if dtype == torch.bfloat16:
        bits(t).fill_(NAN_BF16)
    elif dtype == FP8:
        bits(t).fill_(NAN_E4M3)
    else:
        t.fill_(float("nan"))
    return t


def fraction(mask: torch.Tensor) -> str:
    return f"{int(mask.sum())} of {mask.numel()} ({100.0 * float(mask.float().mean()):.3f}%)"


# =============================================================================================
# Numerics: software rounding onto the e4m3 and bf16 grids


@triton.jit
def _cast_e4m3_kernel(x_ptr, q_ptr, n, SOFTWARE_ROUNDING: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(q_ptr + offs, to_e4m3(tl.load(x_ptr + offs, mask=mask, other=0.0), SOFTWARE_ROUNDING), mask=mask)


@triton.jit
def _cast_bf16_kernel(x_ptr, y_ptr, n, SOFTWARE_ROUNDING: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, to_bf16(tl.load(x_ptr + offs, mask=mask, other=0.0), SOFTWARE_ROUNDING), mask=mask)


CAST_BLOCK = 16384


def kernel_e4m3(x: torch.Tensor, software: bool) -> torch.Tensor:
    q = poisoned(x.shape, FP8)
    _cast_e4m3_kernel[(triton.cdiv(x.numel(), CAST_BLOCK),)](x, q, x.numel(), SOFTWARE_ROUNDING=software, BLOCK=CAST_BLOCK)
    return q


def kernel_bf16(x: torch.Tensor, software: bool) -> torch.Tensor:
    y = poisoned(x.shape, torch.bfloat16)
    _cast_bf16_kernel[(triton.cdiv(x.numel(), CAST_BLOCK),)](x, y, x.numel(), SOFTWARE_ROUNDING=software, BLOCK=CAST_BLOCK)
    return y


def finite_e4m3_values() -> torch.Tensor:
    """Every finite e4m3fn value upcast to float32: all 256 patterns but the NaNs 0x7f, 0xff."""
    codes = torch.tensor([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=torch.uint8)
    return codes.view(FP8).float()


def e4m3_midpoints() -> torch.Tensor:
    """Midpoints of adjacent finite e4m3 values (0 and the subnormals included), both signs.
    Each is exact in float32 (e4m3 values have 4 significant bits), so it is a true tie."""
    grid = torch.unique(finite_e4m3_values().abs())  # sorted, 0 .. 448
    mids = (grid[:-1] + grid[1:]) / 2
    return torch.cat([mids, -mids])


def random_float32(n_per_scale: int, seed: int) -> torch.Tensor:
    """float32 in [-448, 448] at several scales: uniform over the range, unit normal, around the
    normal/subnormal boundary 2^-6, and log-uniform magnitudes over 2^-12 .. 448."""
    gen = torch.Generator().manual_seed(seed)
    n = n_per_scale
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    log_uniform = sign * torch.exp2(torch.empty(n).uniform_(-12.0, float(np.log2(448.0)), generator=gen))
    parts = [
        torch.empty(n).uniform_(-448.0, 448.0, generator=gen),
        torch.randn(n, generator=gen),
        torch.randn(n, generator=gen) * 2**-7,
        log_uniform,
    ]
    return torch.cat(parts).clamp(-448.0, 448.0)


def e4m3_special_values() -> dict[str, torch.Tensor]:
    finite = finite_e4m3_values()
    mids = e4m3_midpoints()
    return {
        "code points": finite,
        "midpoints (ties to even)": mids,
        "just above midpoints": torch.nextafter(mids, torch.full_like(mids, float("inf"))),
        "just below midpoints": torch.nextafter(mids, torch.full_like(mids, -float("inf"))),
        # 2^-10 is half the smallest subnormal 2^-9: a tie between 0 and 2^-9, even is 0
        "signed zeros and tiny": torch.tensor([0.0, -0.0, 1e-30, -1e-30, 2**-11, -(2**-11), 2**-10, -(2**-10), 1e-45, -1e-45]),
    }


@pytest.mark.parametrize("label", list(e4m3_special_values()))
def test_software_e4m3_rounding_is_torchs_cast_on_special_values(label):
    x = e4m3_special_values()[label].contiguous()
    want = x.to(FP8)
    got = kernel_e4m3(x, software=True)
    bad = bits(got) != bits(want)
    assert not bad.any(), (
        f"{label}: {fraction(bad)} codes differ, e.g. {x[bad][:4].tolist()} -> {got[bad][:4].float().tolist()}, "
        f"torch {want[bad][:4].float().tolist()}"
    )


def test_tiny_values_round_to_zero_keeping_their_sign():
    x = e4m3_special_values()["signed zeros and tiny"]
    got = bits(kernel_e4m3(x, software=True))
    assert torch.all(x.abs() <= 2**-10)  # each is at most half the smallest subnormal 2^-9: rounds to zero
    sign_bit = torch.where(torch.signbit(x), 0x80, 0x00).to(torch.uint8)
    assert torch.equal(got, sign_bit), f"{x.tolist()} -> {got.tolist()}"
    assert int(torch.signbit(x).sum()) == 5  # half of them negative: the sign bit is really tested


def test_software_e4m3_rounding_is_torchs_cast_on_random_values():
    x = random_float32(16384, seed=0)
    want = x.to(FP8)
    got = kernel_e4m3(x, software=True)
    bad = bits(got) != bits(want)
    assert not bad.any(), f"{fraction(bad)} codes differ from torch's cast, e.g. {x[bad][:4].tolist()}"


def test_native_e4m3_cast_is_wrong_under_the_unfixed_interpreter():
    """The defect the software rounding exists for: without it triton 3.9's interpreter's cast
    drops the mantissa carry and rounds ties away from zero (DESIGN.md measures ~2.6% of random
    values). diffmoe.interpreter.fixes corrects it at the interpreter: there the native cast is
    exact (on the values the kernels cast: within +-448, as they clamp first)."""
    x = random_float32(16384, seed=0)
    mids = e4m3_midpoints()
    with interpreter_fixes.suspended():
        bad = bits(kernel_e4m3(x, software=False)) != bits(x.to(FP8))
        bad_ties = bits(kernel_e4m3(mids, software=False)) != bits(mids.to(FP8))
    inside = x.abs() <= 448
    assert interpreter_fixes.installed()
    assert bitwise_equal(kernel_e4m3(x[inside], software=False), x[inside].to(FP8))
    assert bitwise_equal(kernel_e4m3(mids, software=False), mids.to(FP8))
    figures = f"native cast differs from torch on {fraction(bad)} random values and {fraction(bad_ties)} ties"
    assert bad.any(), f"{figures}: it now matches torch on random values, the workaround may no longer be needed"
    assert bad_ties.any(), f"{figures}: it now rounds ties to even"
    # Measured: 13.4% of this random set (DESIGN.md's 2.6% is for randn*100; small and subnormal
    # magnitudes are hit more often) and 140 of the 252 ties. A sanity bound, so that a broken
    # probe kernel cannot pass for the defect:
    assert bad.float().mean() < 0.5, figures
    # exactly representable values convert exactly natively: the software rounding's output is
    # such a value, which is why rounding first and casting natively second is exact
    finite = finite_e4m3_values()
    assert bitwise_equal(kernel_e4m3(finite, software=False), finite.to(FP8))


FLOAT32_MIN_NORMAL = 2.0**-126


def random_bf16_inputs(seed: int) -> torch.Tensor:
    """float32 for the bf16 rounding: normal values at three scales, random bit patterns (every
    finite float32 equally likely), exact ties with both parities of the kept bit, their
    neighbours, signed zeros and the overflow edge. float32 subnormals are left to their own
    test below."""
    gen = torch.Generator().manual_seed(seed)
    n = 16384
    raw = torch.randint(-(2**31), 2**31 - 1, (n,), generator=gen, dtype=torch.int64).to(torch.int32).view(torch.float32)
    ties_bits = (torch.randint(-(2**15), 2**15 - 1, (n,), generator=gen, dtype=torch.int32) << 16) | 0x8000
    ties = ties_bits.view(torch.float32)
    fmax = torch.finfo(torch.float32).max
    # fmax and 3.3895e38 round up to +-inf in bf16; 1.0 and -1.0 are exact
    edges = torch.tensor([0.0, -0.0, fmax, -fmax, 3.3895e38, -3.3895e38, 1.0, -1.0, FLOAT32_MIN_NORMAL, -FLOAT32_MIN_NORMAL])
    x = torch.cat([
        torch.randn(n, generator=gen) * 10,
        torch.randn(n, generator=gen) * 1e-3,
        torch.randn(n, generator=gen) * 1e30,
        raw,
        ties,
        torch.nextafter(ties, torch.full_like(ties, float("inf"))),
        torch.nextafter(ties, torch.full_like(ties, -float("inf"))),
        edges,
    ])
    return x[torch.isfinite(x) & ((x.abs() >= FLOAT32_MIN_NORMAL) | (x == 0))]


def float32_subnormals(seed: int) -> torch.Tensor:
    """Random float32 subnormals (exponent field 0), both signs, incl. ties of the bf16 rounding."""
    gen = torch.Generator().manual_seed(seed)
    mantissa = torch.randint(1, 2**23, (4096,), generator=gen, dtype=torch.int32)
    mantissa[:512] = (mantissa[:512] & ~0xFFFF) | 0x8000  # exact ties
    sign = torch.randint(0, 2, (4096,), generator=gen, dtype=torch.int32) << 31
    return (mantissa | sign).view(torch.float32)


def test_software_bf16_rounding_is_torchs_cast():
    x = random_bf16_inputs(seed=1)
    want = x.to(torch.bfloat16)
    bad = bits(kernel_bf16(x, software=True)) != bits(want)
    assert not bad.any(), f"{fraction(bad)} differ from torch's round-to-nearest-even, e.g. {x[bad][:4].tolist()}"
    assert (bits(want) & 0x7F80 == 0x7F80).sum() >= 4  # the overflow edge is in the set: +-inf reached


def test_software_bf16_rounding_of_float32_subnormals_is_torchs_cast():
    """Subnormal float32 values (|x| < 2^-126) must round like any other: bf16 has float32's
    exponent range, so torch keeps them as bf16 subnormals."""
    x = float32_subnormals(seed=2)
    want = x.to(torch.bfloat16)
    got = kernel_bf16(x, software=True)
    bad = bits(got) != bits(want)
    assert not bad.any(), (
        f"{fraction(bad)} float32 subnormals convert wrongly, e.g. bits "
        f"{[hex(v & 0xFFFFFFFF) for v in bits(x[bad][:3]).tolist()]} -> "
        f"{[hex(v & 0xFFFF) for v in bits(got[bad][:3]).tolist()]}, torch "
        f"{[hex(v & 0xFFFF) for v in bits(want[bad][:3]).tolist()]}"
    )


def test_native_bf16_cast_truncates_under_the_unfixed_interpreter():
    x = random_bf16_inputs(seed=1)
    with interpreter_fixes.suspended():
        bad = bits(kernel_bf16(x, software=False)) != bits(x.to(torch.bfloat16))
    assert bitwise_equal(kernel_bf16(x, software=False), x.to(torch.bfloat16)), "the fixed interpreter's cast must round"
    assert bad.any(), "the native bf16 cast now rounds like torch: the workaround may no longer be needed"
    assert bad.float().mean() < 1.0, f"native bf16 cast differs from torch on {fraction(bad)}"


# =============================================================================================
# Row kernel


def row_stage(
    x: torch.Tensor,
    quant: str | None,
    *,
    apply_activation: bool = False,
    store_activation: bool = False,
    row_weight: torch.Tensor | None = None,
    ctx: LaunchContext | None = None,
    stage: str = Stages.QUANT_INPUT,
) -> dict[str, torch.Tensor]:
    """Run the row kernel through its launcher into poisoned fresh outputs; returns them. The
    vocabulary names only label the views for a recorder; the kernel does not read them."""
    rows = x.shape[0]
    cols = x.shape[1] // 2 if apply_activation else x.shape[1]
    tiles = choose_tiles("interpreter", rows, quant or "bf16", cols)
    ctx = ctx or LaunchContext(CPU)
    out: dict[str, torch.Tensor] = {}
    kwargs = {}
    if store_activation or quant is None:
        out["act"] = poisoned((rows, cols), torch.bfloat16)
        kwargs["act_out"] = (B.ACTIVATION_OUTPUT, out["act"])
    if quant is not None:
        scale_shape = {"fp8-tensor": (1,), "fp8-token": (rows, 1), "fp8-block": (rows, cols // QUANT_BLOCK)}[quant]
        out["codes"] = poisoned((rows, cols), FP8)
        out["scales"] = poisoned(scale_shape, torch.float32)
        kwargs["codes_out"] = (B.QUANTED_GATE_UP_INPUT, out["codes"])
        kwargs["scales_out"] = (B.QUANTED_GATE_UP_INPUT_SCALES, out["scales"])
        kwargs["amax_partials"] = poisoned((row_programs(rows, tiles),), torch.float32)
    if row_weight is not None:
        kwargs["row_weight"] = (B.TOPK_WEIGHTS, row_weight)
    run_row_stage(ctx, tiles, TRAITS, stage=stage, x=(B.HIDDEN_STATES, x), apply_activation=apply_activation,
                  quant=quant, **kwargs)
    return out


def _bf16_rows(rows: int, cols: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=gen) * scale).to(torch.bfloat16)


def _with_zero_rows(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    x = x.clone()
    x[rows] = 0
    return x


def _wide_range_rows(rows: int, cols: int, seed: int) -> torch.Tensor:
    """One large element per row and the rest tiny: most codes land in the e4m3 subnormals."""
    x = _bf16_rows(rows, cols, seed, scale=1e-3).float()
    x[torch.arange(rows), torch.arange(rows) % cols] = 300.0
    return x.to(torch.bfloat16)


# label -> (builder(cols_for_scheme) -> x); rows per program is 32 on the interpreter and the
# column step 256 (128 for fp8-block), so these cover partial programs and partial steps.
ROW_CASES = {
    "1-row": lambda c: _bf16_rows(1, c, 1),
    "rows<BLOCK_R": lambda c: _bf16_rows(5, c, 2),
    "rows=BLOCK_R": lambda c: _bf16_rows(32, c, 3),
    "rows-not-a-multiple-of-BLOCK_R": lambda c: _bf16_rows(45, c, 4, scale=3.0),
    "cols>cols_per_step": lambda c: _bf16_rows(9, c + 2 * QUANT_BLOCK, 5),
    "all-zero-rows": lambda c: _with_zero_rows(_bf16_rows(40, c, 6), [0, 3, 33, 39]),
    "all-zero": lambda c: torch.zeros(7, c, dtype=torch.bfloat16),
    "wide-dynamic-range": lambda c: _wide_range_rows(37, c, 7),
    "large-magnitude": lambda c: _bf16_rows(11, c, 8, scale=1e4),
}


@pytest.mark.parametrize("quant", FP8_SCHEMES)
@pytest.mark.parametrize("label", list(ROW_CASES))
def test_input_quant_is_bitwise_the_reference(label, quant):
    x = ROW_CASES[label](2 * QUANT_BLOCK)
    got = row_stage(x, quant)
    want_codes, want_scales = quantize_activation(x, quant)
    assert bitwise_equal(got["scales"], want_scales), compare("scales", want_scales, got["scales"], Rule.bitwise()).summary()
    assert bitwise_equal(got["codes"], want_codes), compare("codes", want_codes, got["codes"], Rule.bitwise()).summary()
    if label.startswith("all-zero"):
        floor = want_scales.min()
        assert floor > 0  # the floor, not a division by zero
        assert torch.all(bits(got["codes"][x.float().abs().amax(1) == 0]) == 0)


@pytest.mark.parametrize("quant", ("fp8-tensor", "fp8-token"))
@pytest.mark.parametrize("cols", (97, 300), ids=("odd-cols", "odd-cols>cols_per_step"))
def test_input_quant_with_odd_columns_is_bitwise_the_reference(quant, cols):
    x = _bf16_rows(45, cols, 9, scale=2.0)
    got = row_stage(x, quant)
    want_codes, want_scales = quantize_activation(x, quant)
    assert bitwise_equal(got["scales"], want_scales)
    assert bitwise_equal(got["codes"], want_codes), compare("codes", want_codes, got["codes"], Rule.bitwise()).summary()


def test_fp8_block_refuses_columns_that_are_not_whole_groups():
    # where odd columns are not allowed, the launcher must say so rather than quantise garbage
    with pytest.raises(ValueError, match="multiple of 128"):
        row_stage(_bf16_rows(4, 97, 10), "fp8-block")


@pytest.mark.parametrize("quant", FP8_SCHEMES)
@pytest.mark.parametrize("rows", (1, 37), ids=("1-row", "rows-not-a-multiple-of-BLOCK_R"))
def test_input_quant_with_a_router_weight_per_row(quant, rows):
    x = _bf16_rows(rows, 2 * QUANT_BLOCK, 11, scale=2.0)
    w = torch.rand(rows, generator=torch.Generator().manual_seed(12))  # fp32 router weights
    got = row_stage(x, quant, row_weight=w)
    # the reference scales the hidden states in float32 and rounds to bf16 before quantising
    want_codes, want_scales = quantize_activation((x.float() * w[:, None]).to(torch.bfloat16), quant)
    assert bitwise_equal(got["scales"], want_scales)
    assert bitwise_equal(got["codes"], want_codes), compare("codes", want_codes, got["codes"], Rule.bitwise()).summary()
    # control: without the weight the codes differ, so the weight really was applied
    plain_codes, _ = quantize_activation(x, quant)
    assert not bitwise_equal(got["codes"], plain_codes)


# ---- activation -----------------------------------------------------------------------------


def numpy_silu_and_mul_f32(gate_up: torch.Tensor) -> torch.Tensor:
    """The kernel's float32 formula, gate / (1 + exp(-gate)) * up, evaluated with numpy's exp as
    the interpreter evaluates tl.exp: float32 [R, I]."""
    i = gate_up.shape[1] // 2
    gate = gate_up[:, :i].float().numpy()
    up = gate_up[:, i:].float().numpy()
    with np.errstate(over="ignore"):
        return torch.from_numpy(gate / (np.float32(1.0) + np.exp(-gate)) * up)


def torch_silu_and_mul_f32(gate_up: torch.Tensor) -> torch.Tensor:
    """The reference's float32 formula, gate / (1 + torch.exp(-gate)) * up: [R, I]."""
    i = gate_up.shape[1] // 2
    gate = gate_up[:, :i].float()
    return gate / (1.0 + torch.exp(-gate)) * gate_up[:, i:].float()


def adversarial_gate_up_pairs(max_pairs: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) bf16 pairs whose silu(gate) * up rounds to different bf16 values with numpy's
    exp and with torch's (the unfixed interpreter's tl.exp and the reference's). Random data
    almost never shows it (a 1-ulp float32 difference
    rarely straddles a bf16 rounding boundary), so the pairs are searched for: gates where the
    float32 silu differs, times every bf16 `up` in [1/4, 8) of either sign."""
    gen = torch.Generator().manual_seed(seed)
    gate = (torch.randn(20000, generator=gen) * 3).to(torch.bfloat16).float()
    with np.errstate(over="ignore"):
        g = gate.numpy()
        emu = torch.from_numpy(g / (np.float32(1.0) + np.exp(-g)))
    def torch_silu(g: torch.Tensor) -> torch.Tensor:
        return g / (1.0 + torch.exp(-g))

    differs = bits(emu) != bits(torch_silu(gate))
    gate, emu, tor = gate[differs][:3000], emu[differs][:3000], torch_silu(gate[differs][:3000])
    ups = torch.arange(0, 0x10000, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    ups = ups[(ups.abs() >= 0.25) & (ups.abs() < 8)]
    hit = bits((emu[:, None] * ups).to(torch.bfloat16)) != bits((tor[:, None] * ups).to(torch.bfloat16))
    gi, ui = hit.nonzero(as_tuple=True)
    return gate[gi][:max_pairs].to(torch.bfloat16), ups[ui][:max_pairs].to(torch.bfloat16)


def activation_input(rows: int, inter: int, seed: int) -> tuple[torch.Tensor, int]:
    """gate_up [rows, 2*inter] bf16: random rows, with the adversarial pairs written over the
    first elements of rows 1 and (rows - 2) in blocks so they reach several programs. Returns
    the tensor and how many adversarial pairs were placed."""
    x = _bf16_rows(rows, 2 * inter, seed, scale=2.0)
    gate, up = adversarial_gate_up_pairs(2 * inter, seed)
    n = gate.numel()
    half = (n + 1) // 2
    for row, sl in ((1, slice(0, half)), (rows - 2, slice(half, n))):
        k = sl.stop - sl.start
        x[row, :k] = gate[sl]
        x[row, inter : inter + k] = up[sl]
    return x, n


ACT_ROWS, ACT_INTER = 70, 3 * QUANT_BLOCK  # 3 row programs (the last partial), 2 column steps


def test_unfused_activation_is_the_reference_bitwise_where_numpys_exp_would_move_it():
    x, placed = activation_input(ACT_ROWS, ACT_INTER, seed=20)
    assert placed > 0, "no (gate, up) pair found where numpy's and torch's silu round to different bf16"
    got = row_stage(x, None, apply_activation=True, stage=Stages.ACTIVATION)["act"]
    want = silu_and_mul(x)
    emu32, torch32 = numpy_silu_and_mul_f32(x), torch_silu_and_mul_f32(x)
    # the inputs are adversarial: numpy's exp (the unfixed interpreter's) moves exactly the placed
    # pairs' bf16 results, by one ulp
    numpy_moves = ulp_distance(want, emu32.to(torch.bfloat16))
    assert int((numpy_moves > 0).sum()) == placed and int(numpy_moves.max()) == 1
    assert bitwise_equal(want, torch32.to(torch.bfloat16))  # the reference is the formula, rounded once
    # the interpreter's exp is torch's (diffmoe.interpreter.fixes): the kernel is the reference, bit for bit
    assert bitwise_equal(got, want), f"{fraction(ulp_distance(want, got) > 0)} differ"


# ---- fused act+quant ------------------------------------------------------------------------


def _group_of(quant: str, shape: tuple[int, int]) -> torch.Tensor:
    """[R, C] index of each element's scale group: the whole tensor, a row, or a 1x128 group."""
    rows, cols = shape
    r = torch.arange(rows)[:, None].expand(rows, cols)
    c = torch.arange(cols)[None, :].expand(rows, cols)
    if quant == "fp8-tensor":
        return torch.zeros(rows, cols, dtype=torch.long)
    if quant == "fp8-token":
        return r.clone()
    return r * (cols // QUANT_BLOCK) + c // QUANT_BLOCK


@pytest.mark.parametrize("quant", FP8_SCHEMES)
def test_fused_act_quant_is_bitwise_activation_then_quant(quant):
    """The metamorphic property of the optimized path: one fused kernel gives the same codes and
    scales as its own activation kernel followed by its own quant kernel."""
    x, _ = activation_input(ACT_ROWS, ACT_INTER, seed=21)
    fused = row_stage(x, quant, apply_activation=True, stage=Stages.ACT_QUANT)
    act = row_stage(x, None, apply_activation=True, stage=Stages.ACTIVATION)["act"]
    unfused = row_stage(act, quant, stage=Stages.QUANT_DOWN_INPUT)
    assert bitwise_equal(fused["scales"], unfused["scales"])
    assert bitwise_equal(fused["codes"], unfused["codes"]), compare("codes", unfused["codes"], fused["codes"], Rule.bitwise()).summary()
    # and the activation it stores on request is the unfused one
    with_act = row_stage(x, quant, apply_activation=True, store_activation=True, stage=Stages.ACT_QUANT)
    assert bitwise_equal(with_act["act"], act) and bitwise_equal(with_act["codes"], fused["codes"])


@pytest.mark.parametrize("quant", FP8_SCHEMES)
def test_fused_act_quant_against_the_reference(quant):
    """On the adversarial activation inputs (where numpy's exp would move the bf16 activation),
    the fused codes and scales are the reference's under the forced fused rule: bitwise on the
    interpreter (one exp on both sides)."""
    x, _ = activation_input(ACT_ROWS, ACT_INTER, seed=22)
    fused = row_stage(x, quant, apply_activation=True, stage=Stages.ACT_QUANT)
    ref_codes, ref_scales = quantize_activation(silu_and_mul(x), quant)
    codes_cmp = compare(B.QUANTED_DOWN_INPUT, ref_codes, fused["codes"],
                        rule_for(quant, B.QUANTED_DOWN_INPUT, "forced", fused=True))
    scales_cmp = compare(B.QUANTED_DOWN_INPUT_SCALES, ref_scales, fused["scales"],
                         rule_for(quant, B.QUANTED_DOWN_INPUT_SCALES, "forced", fused=True))
    assert codes_cmp.ok, codes_cmp.summary()
    assert scales_cmp.ok, scales_cmp.summary()


# =============================================================================================
# Grouped GEMM


def aligned_layout(problem, block_m: int) -> AlignedLayout:
    cfg = problem.config
    tk, e = cfg.routed_rows, cfg.num_experts
    sorted_ids = torch.empty(max_padded_rows(tk, e, block_m), dtype=torch.int32)
    expert_ids = torch.empty(max_blocks(tk, e, block_m), dtype=torch.int32)
    post = torch.empty(1, dtype=torch.int32)
    blocks = align_routed_rows(problem.topk_ids, problem.expert_map, e, block_m, sorted_ids, expert_ids, post)
    return AlignedLayout(sorted_ids, expert_ids, post, blocks, block_m)


def gemm(problem, ref, which: str, *, ctx: LaunchContext | None = None, mul_router_weight: bool | None = None):
    """One of the two GEMMs on the reference's exact inputs; returns the [TK, N] output (a view
    of a buffer one row longer, whose extra row must stay untouched: the padding rows of the
    layout carry the sentinel TK and must be masked, not written there)."""
    cfg = problem.config
    q, fp8 = cfg.quant, cfg.is_fp8
    tiles = choose_tiles("interpreter", cfg.routed_rows, q, max(cfg.hidden, cfg.inter))
    ctx = ctx or LaunchContext(CPU)
    weights = (B.TOPK_WEIGHTS, problem.topk_weights.reshape(-1))
    if which == "gate_up":
        a = (B.QUANTED_GATE_UP_INPUT, ref.intermediates[B.QUANTED_GATE_UP_INPUT]) if fp8 else (B.HIDDEN_STATES, problem.hidden_states)
        a_scale = (B.QUANTED_GATE_UP_INPUT_SCALES, ref.intermediates[B.QUANTED_GATE_UP_INPUT_SCALES]) if fp8 else None
        w, w_scale, n, name = (B.W1, problem.w1), (B.W1_SCALE, problem.w1_scale), 2 * cfg.inter, B.GATE_UP_OUTPUT
        row_div, stage = cfg.topk, Stages.GATE_UP_GEMM
        mul = False if mul_router_weight is None else mul_router_weight
    else:
        a_name = B.QUANTED_DOWN_INPUT if fp8 else B.ACTIVATION_OUTPUT
        a = (a_name, ref.intermediates[a_name])
        a_scale = (B.QUANTED_DOWN_INPUT_SCALES, ref.intermediates[B.QUANTED_DOWN_INPUT_SCALES]) if fp8 else None
        w, w_scale, n, name = (B.W2, problem.w2), (B.W2_SCALE, problem.w2_scale), cfg.hidden, B.DOWN_OUTPUT
        row_div, stage = 1, Stages.DOWN_GEMM
        mul = (cfg.router_weight == "down") if mul_router_weight is None else mul_router_weight
    full = poisoned((cfg.routed_rows + 1, n), torch.bfloat16)
    out = full[: cfg.routed_rows]
    run_grouped_gemm(
        ctx, tiles, TRAITS, stage=stage, quant=q, a=a, a_scale=a_scale, w=w, w_scale=w_scale if fp8 else None,
        out=(name, out), layout=aligned_layout(problem, tiles.block_m), topk_weights=weights, a_row_div=row_div,
        mul_router_weight=mul, router_weight_on_a=which == "gate_up" and cfg.router_weight == "input" and not fp8,
    )
    assert torch.all(bits(full[-1]) == NAN_BF16), "a padding row (sentinel TK) was written"
    return out


def _gemm_config(quant: str, **fields) -> MoEConfig:
    base = dict(num_tokens=37, num_experts=4, topk=2, hidden=128, inter=256, quant=quant, seed=5)
    return MoEConfig(**{**base, **fields})


def gemm_cases(quant: str) -> dict[str, MoEConfig]:
    odd = dict(hidden=384, inter=128) if quant == "fp8-block" else dict(hidden=97, inter=45)
    return {
        "T=37-E=4-K=2": _gemm_config(quant),
        "odd-or-3-k-blocks": _gemm_config(quant, num_tokens=13, **odd),
        "expert-map-with-minus-1": _gemm_config(quant, num_tokens=9, num_experts=6, expert_map=(0, -1, 1, -1, 2, -1),
                                                hidden=128, inter=128),
        "empty-experts": _gemm_config(quant, num_tokens=10, num_experts=8, skew="empty-experts", hidden=128, inter=128),
    } | ({"router-weight-on-input": _gemm_config(quant, num_tokens=9, topk=1, router_weight="input", hidden=128, inter=128)}
         if quant == "bf16" else {})  # fp8 applies the input weight in the quant stage, not in the GEMM


GEMM_CASES = {f"{q}/{label}": cfg for q in SCHEMES for label, cfg in gemm_cases(q).items()}


@pytest.mark.parametrize("config", GEMM_CASES.values(), ids=GEMM_CASES.keys())
def test_grouped_gemms_on_the_reference_inputs_are_within_the_forced_rule(config, record_property):
    problem = make_problem(config)
    ref = reference_moe(problem)
    q = config.quant
    routed_experts = problem.topk_ids.long().reshape(-1)  # [TK] global expert of each routed row
    non_local = torch.zeros_like(routed_experts, dtype=torch.bool)
    if problem.expert_map is not None:
        non_local = problem.expert_map.long()[routed_experts] == -1
        assert non_local.any() and not non_local.all()  # both kinds of rows present
    if config.skew == "empty-experts":
        assert torch.bincount(routed_experts, minlength=config.num_experts).eq(0).any()
    for which, name in (("gate_up", B.GATE_UP_OUTPUT), ("down", B.DOWN_OUTPUT)):
        got = gemm(problem, ref, which)
        c = compare_stage(name, ref.intermediates[name], got, rule_for(q, name, "forced"), ref.intermediates,
                          problem)
        record_property(f"{which}_max_ulp", c.max_ulp)
        record_property(f"{which}_differing", f"{c.differing} of {c.total}")
        # Measured: at most 12 of 37888 elements differ; by at most 2 bf16 ulp (1 where
        # |value| > 2^-6), from the re-associated float32 sum and, for fp8, the scales applied
        # after the dot rather than to its operands. Larger ulp counts occur only for results
        # near zero (up to 13339 ulp at |value| ~ 1e-7: -1.4e-7 against 0.0), where the sum
        # cancels: inside the derived interval, whose width there is the float32 error bound.
        assert c.ok, c.summary()
        assert c.nonfinite_mismatches == 0  # no poisoned (unwritten) row left
        # rows routed to a non-local expert (-1 block) are stored as +0.0, exactly
        assert torch.all(bits(got[non_local]) == 0), f"{which}: rows of non-local experts are not +0.0"


@pytest.mark.parametrize("quant", SCHEMES)
def test_router_weight_is_multiplied_in_the_down_epilogue(quant):
    """The forced test above runs the down GEMM with the epilogue multiply and matches the
    reference; without it the same GEMM is far from the reference (the router weights are
    softmax values well below 1), so the flag really is the multiply."""
    config = gemm_cases(quant)["expert-map-with-minus-1"]
    problem = make_problem(config)
    ref = reference_moe(problem)
    plain = gemm(problem, ref, "down", mul_router_weight=False)
    assert not compare_stage(B.DOWN_OUTPUT, ref.intermediates[B.DOWN_OUTPUT], plain,
                             rule_for(quant, B.DOWN_OUTPUT, "forced"), ref.intermediates, problem).ok


# =============================================================================================
# Reduce


def reduce(down: torch.Tensor, topk: int, ctx: LaunchContext | None = None) -> torch.Tensor:
    t, h = down.shape[0] // topk, down.shape[1]
    tiles = choose_tiles("interpreter", down.shape[0], "bf16", h)
    out = poisoned((t, h), torch.bfloat16)
    run_reduce(ctx or LaunchContext(CPU), tiles, TRAITS, stage=Stages.REDUCE, down=(B.DOWN_OUTPUT, down), out=(B.OUTPUT, out), topk=topk)
    return out


def k_ordered_sum(down: torch.Tensor, topk: int) -> torch.Tensor:
    """The reference's reduction: float32, k = 0..K-1 in order, one bf16 rounding."""
    per_token = down.view(-1, topk, down.shape[1])
    acc = per_token[:, 0].float()
    for k in range(1, topk):
        acc = acc + per_token[:, k].float()
    return acc.to(torch.bfloat16)


@pytest.mark.parametrize("topk", (1, 2, 3, 4), ids=lambda k: f"K={k}")
def test_reduce_is_bitwise_the_reference(topk):
    # T=37 (a partial token block of 32) and H=300 (a partial column block of 256)
    config = MoEConfig(num_tokens=37, num_experts=4, topk=topk, hidden=300, inter=64, quant="bf16", seed=topk)
    ref = reference_moe(make_problem(config))
    got = reduce(ref.intermediates[B.DOWN_OUTPUT], topk)
    assert bitwise_equal(got, ref.output), compare("output", ref.output, got, Rule.bitwise()).summary()


@pytest.mark.parametrize("topk", (3, 4), ids=lambda k: f"K={k}")
def test_reduce_keeps_the_k_order_where_it_matters(topk):
    """Rows that cancel: k=0 holds a large value L, k=1 about -L, the rest values 2^-30 smaller.
    In k order L and -L cancel first and the small rows survive; summed from the other end the
    small rows are absorbed by L. So only the k-ordered sum matches bit for bit."""
    gen = torch.Generator().manual_seed(topk)
    t, h = 40, 260
    large = torch.randn(t, h, generator=gen).sign() * 2**10 * (1 + torch.rand(t, h, generator=gen))
    down = torch.empty(t, topk, h)
    down[:, 0] = large
    down[:, 1] = -large * (1 + 2**-7 * torch.randint(-2, 3, (t, h), generator=gen))
    down[:, 2:] = torch.randn(t, topk - 2, h, generator=gen) * 2**-20
    down = down.to(torch.bfloat16).reshape(t * topk, h)
    want = k_ordered_sum(down, topk)
    got = reduce(down, topk)
    assert bitwise_equal(got, want), compare("output", want, got, Rule.bitwise()).summary()
    reversed_sum = k_ordered_sum(down.view(t, topk, h).flip(1).reshape(t * topk, h), topk)
    assert not bitwise_equal(reversed_sum, want), "this data does not tell the orders apart"


def test_reduce_of_bf16_subnormals_is_bitwise_the_reference():
    """bf16 has float32's exponent range: values below 2^-126 are bf16 subnormals, and the sum of
    such rows must still be the reference's."""
    gen = torch.Generator().manual_seed(40)
    t, topk, h = 8, 2, 64
    magnitude = torch.randint(1, 0x80, (t * topk, h), generator=gen, dtype=torch.int16)  # exponent field 0
    sign = torch.randint(0, 2, (t * topk, h), generator=gen, dtype=torch.int16) * -0x8000
    down = (magnitude | sign).view(torch.bfloat16)
    want = k_ordered_sum(down, topk)
    got = reduce(down, topk)
    assert bitwise_equal(got, want), compare("output", want, got, Rule.bitwise()).summary()


# =============================================================================================
# Schedule hook


@triton.jit
def _order_probe_kernel(counter_ptr, seen_ptr, order_ptr, REORDER: tl.constexpr):
    """Writes its (logical) program id into the next free slot: `seen` is the run order."""
    pid = tl.program_id(0)
    if REORDER:
        pid = tl.load(order_ptr + pid)
    slot = tl.atomic_add(counter_ptr, 1)
    tl.store(seen_ptr + slot, pid)


def probe_order(ctx: LaunchContext, programs: int) -> list[int]:
    counter = torch.zeros(1, dtype=torch.int32)
    seen = torch.full((programs,), -1, dtype=torch.int32)
    launch(ctx, _order_probe_kernel, programs, stage="probe", reads={}, writes={"seen": seen}, counter_ptr=counter, seen_ptr=seen)
    return seen.tolist()


def test_the_order_table_reorders_the_programs():
    n = 7
    assert probe_order(LaunchContext(CPU), n) == list(range(n))
    assert probe_order(LaunchContext(CPU, Schedule("reversed")), n) == list(range(n))[::-1]
    ctx = LaunchContext(CPU, Schedule("random", 5))
    first, second = probe_order(ctx, n), probe_order(ctx, n)
    assert first == Schedule("random", 5).order(n, 0) and second == Schedule("random", 5).order(n, 1)
    assert sorted(first) == list(range(n)) and first != list(range(n)) and first != second
    log = LaunchLog()
    probe_order(LaunchContext(CPU, Schedule("reversed"), log), n)
    (rec,) = log.launches
    assert (rec.stage, rec.kernel, rec.grid) == ("probe", "_order_probe_kernel", (n,))


class ProgramZeroOnly(LaunchContext):
    """Every program is told it is program 0: a kernel that honours the order table then does
    program 0's work only, and leaves the rest of its output unwritten."""

    def order_table(self, num_programs):
        return torch.zeros(num_programs, dtype=torch.int32, device=self.device), True


def _row_kernel_runs():
    x = _bf16_rows(100, 2 * QUANT_BLOCK, 30, scale=2.0)  # 4 row programs
    gate_up = _bf16_rows(100, 4 * QUANT_BLOCK, 31, scale=2.0)
    runs = {f"quant/{q}": (lambda ctx, q=q: row_stage(x, q, ctx=ctx)) for q in FP8_SCHEMES}
    runs["activation"] = lambda ctx: row_stage(gate_up, None, apply_activation=True, ctx=ctx)
    for q in FP8_SCHEMES:
        runs[f"act_quant/{q}"] = lambda ctx, q=q: row_stage(gate_up, q, apply_activation=True, ctx=ctx)
    w = torch.rand(100, generator=torch.Generator().manual_seed(32))
    runs["quant-with-row-weight/fp8-tensor"] = lambda ctx: row_stage(x, "fp8-tensor", row_weight=w, ctx=ctx)
    return runs


def _gemm_runs():
    runs = {}
    for q in SCHEMES:
        # 4 experts: about 4 M blocks; gate_up has 2 N blocks (2I = 512 > BLOCK_N = 256). Every
        # scheme's scaling code runs in the gate-up GEMM; the down GEMM adds the router weight.
        config = _gemm_config(q, num_tokens=24, hidden=128, inter=256)
        problem = make_problem(config)
        ref = reference_moe(problem)
        runs[f"gate_up_gemm/{q}"] = lambda ctx, p=problem, r=ref: {"out": gemm(p, r, "gate_up", ctx=ctx)}
        if q == "fp8-token":
            runs[f"down_gemm/{q}"] = lambda ctx, p=problem, r=ref: {"out": gemm(p, r, "down", ctx=ctx)}
    return runs


def _reduce_runs():
    down = _bf16_rows(70 * 3, 300, 33)  # T=70: 3 token blocks x 2 column blocks
    return {"reduce": lambda ctx: {"out": reduce(down, 3, ctx=ctx)}}


def kernel_runs():
    return {**_row_kernel_runs(), **_gemm_runs(), **_reduce_runs()}


KERNEL_RUN_NAMES = [
    *(f"quant/{q}" for q in FP8_SCHEMES), "activation", *(f"act_quant/{q}" for q in FP8_SCHEMES),
    "quant-with-row-weight/fp8-tensor", *(f"gate_up_gemm/{q}" for q in SCHEMES), "down_gemm/fp8-token", "reduce",
]


@pytest.fixture(scope="module")
def runs():
    built = kernel_runs()
    assert sorted(built) == sorted(KERNEL_RUN_NAMES)
    return built


@pytest.fixture(scope="module")
def in_order(runs):
    """name -> (outputs, LaunchLog) of the identity schedule, computed once per kernel run."""
    cache = {}

    def get(name):
        if name not in cache:
            log = LaunchLog()
            cache[name] = (runs[name](LaunchContext(CPU, Schedule(), log)), log)
        return cache[name]

    return get


@pytest.mark.parametrize("name", KERNEL_RUN_NAMES)
def test_every_kernel_gives_the_same_bits_in_any_program_order(runs, in_order, name):
    want, log = in_order(name)
    assert all(launch.grid[0] >= 2 for launch in log.launches), "a single program would make the order moot"
    for schedule in SCHEDULES:
        got = runs[name](LaunchContext(CPU, schedule))
        for key in want:
            assert bitwise_equal(got[key], want[key]), f"{name}: {key} differs under {schedule}"


@pytest.mark.parametrize("name", KERNEL_RUN_NAMES)
def test_every_kernel_reads_its_program_id_through_the_order_table(runs, in_order, name):
    full, _ = in_order(name)
    partial = runs[name](ProgramZeroOnly(CPU))
    # every output but the single per-tensor scale (stored by whichever program is 0) must lose
    # the elements of the programs that never ran
    for key, t in full.items():
        if key == "scales" and t.numel() == 1:
            continue
        written_full = bits(t) != bits(poisoned(t.shape, t.dtype))
        written_partial = bits(partial[key]) != bits(poisoned(t.shape, t.dtype))
        assert written_full.all(), f"{name}: {key} not fully written in order"
        assert written_partial.any() and not written_partial.all(), f"{name}: {key} ignores the order table"
