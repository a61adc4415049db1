"""diffmoe.interpreter.fixes: the interpreter's casts and dots, fixed at the interpreter, are bit
for bit the kernels' software workarounds as they run on the unpatched interpreter (and torch's
casts / CUDA's satfinite where those define the value).

Domains: every bf16 pattern, every e4m3fn code, every bf16 upper half with the rounding-critical
lower halves (ties, neighbours, NaN payloads) plus 2^20 random float32 patterns, and dots over
random, subnormal and non-finite operands. Each comparison runs the software path with the
fixes uninstalled and the native path with them installed, in one process.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from diffmoe.backend.conformance import gated_probe
from diffmoe.interpreter import fixes
from optimized.backend import interpreter_enabled
from optimized.kernels.act_quant_kernel import _quantize_tile
from optimized.kernels.grouped_gemm_kernel import e4m3_to_f32
from optimized.kernels.numerics import bf16_to_f32, to_bf16, to_e4m3

pytestmark = pytest.mark.skipif(not interpreter_enabled(), reason="fixes the Triton interpreter (TRITON_INTERPRET=1)")

FP8 = torch.float8_e4m3fn
BLOCK = 1 << 20  # Triton's largest block: interpreter cost is per program and op, not per element


@pytest.fixture(autouse=True)
def _fixes_installed_after():
    yield
    fixes.install(probe=gated_probe)  # every test leaves the process as the optimized path expects it


def unpatched():
    """Run a block with triton's own interpreter methods (the defects present)."""
    return fixes.suspended()


# ---- kernels ---------------------------------------------------------------------------------


@triton.jit
def _bf16_cast_kernel(x_ptr, y_ptr, n, SOFTWARE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, to_bf16(tl.load(x_ptr + offs, mask=mask, other=0.0), SOFTWARE), mask=mask)


@triton.jit
def _bf16_upcast_kernel(x_ptr, y_ptr, n, SOFTWARE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, bf16_to_f32(tl.load(x_ptr + offs, mask=mask, other=0.0), SOFTWARE), mask=mask)


@triton.jit
def _e4m3_cast_kernel(x_ptr, q_ptr, n, SOFTWARE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(q_ptr + offs, to_e4m3(tl.load(x_ptr + offs, mask=mask, other=0.0), SOFTWARE), mask=mask)


@triton.jit
def _e4m3_quantize_kernel(x_ptr, q_ptr, n, SOFTWARE: tl.constexpr, BLOCK: tl.constexpr):
    """The row kernel's own quantisation (divide by a scale of 1, NaN-keeping clamp, cast and,
    on the software path, the NaN code written by bits), on a [1, BLOCK] tile."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)[None, :]
    scale = tl.full([1], 1.0, tl.float32)
    q = _quantize_tile(v, scale, SOFTWARE)
    tl.store(q_ptr + offs[None, :], q, mask=mask[None, :])


@triton.jit
def _e4m3_upcast_kernel(x_ptr, y_ptr, n, SOFTWARE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if SOFTWARE:
        y = e4m3_to_f32(x)  # the grouped GEMM's DECODE_FP8 decode
    else:
        y = x.to(tl.float32)
    tl.store(y_ptr + offs, y, mask=mask)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, SOFTWARE: tl.constexpr, FP8_OPERANDS: tl.constexpr,
                M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    """c = a @ b with a [M, K] and b stored [N, K], loaded [K, N] as the grouped GEMM loads weights;
    SOFTWARE is the GEMM's workaround (UPCAST_BF16_DOT or DECODE_FP8), else the plain dot."""
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rn[None, :] * K + rk[:, None])
    if SOFTWARE:
        if FP8_OPERANDS:
            c = tl.dot(e4m3_to_f32(a), e4m3_to_f32(b), input_precision="ieee")
        else:
            c = tl.dot(bf16_to_f32(a, True), bf16_to_f32(b, True), input_precision="ieee")
    else:
        c = tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], c)


def run(kernel, x: torch.Tensor, out_dtype: torch.dtype, software: bool) -> torch.Tensor:
    out = torch.full(x.shape, 0x5A, dtype=torch.uint8).view(out_dtype) if out_dtype.itemsize == 1 else \
        torch.empty(x.shape, dtype=out_dtype)
    block = min(BLOCK, triton.next_power_of_2(max(x.numel(), 16)))
    kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), SOFTWARE=software, BLOCK=block)
    return out


def software_vs_fixed(kernel, x: torch.Tensor, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(software path on the unpatched interpreter, native path on the fixed one)."""
    with unpatched():
        soft = run(kernel, x, out_dtype, software=True)
    return soft, run(kernel, x, out_dtype, software=False)


def int_bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor | None = None) -> None:
    bad = int_bits(got) != int_bits(want)
    if bad.any():
        i = bad.nonzero().flatten()[:5].tolist()
        shown = [(hex(int(int_bits(x)[j])) if x is not None else j, hex(int(int_bits(got)[j])), hex(int(int_bits(want)[j]))) for j in i]
        raise AssertionError(f"{int(bad.sum())} of {bad.numel()} differ (input, got, want): {shown}")


# ---- inputs ----------------------------------------------------------------------------------


def all_bf16() -> torch.Tensor:
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def all_e4m3() -> torch.Tensor:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8)


def f32_from_bits(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int64).to(torch.int32).view(torch.float32)  # wraps >= 2^31 to the same bits


def bf16_rounding_sample() -> torch.Tensor:
    """Every bf16 upper half with the lower halves that decide RNE (0, 1, tie - 1, tie, tie + 1,
    0xFFFF): every tie with both parities, every carry into the exponent (overflow to Inf), every
    subnormal, every NaN payload; plus 2^20 random float32 patterns."""
    upper = torch.arange(65536, dtype=torch.int64) << 16
    lows = torch.tensor([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=torch.int64)
    structured = (upper[:, None] | lows[None, :]).flatten()
    rand = torch.randint(0, 2**32, (1 << 20,), generator=torch.Generator().manual_seed(1), dtype=torch.int64)
    return f32_from_bits(torch.cat([structured, rand]))


def e4m3_sample() -> torch.Tensor:
    """Every e4m3 value, every midpoint and its float32 neighbours (both signs), the range beyond
    448 to Inf, float32 subnormals, NaNs of both signs and several payloads, and 2^20 random
    float32 patterns besides 2^18 random values in [-512, 512] and 2^18 log-uniform magnitudes."""
    g = torch.Generator().manual_seed(2)
    codes = all_e4m3().float()
    finite = torch.unique(codes[torch.isfinite(codes)].abs())
    mids = (finite[:-1] + finite[1:]) / 2
    mids = torch.cat([mids, -mids, torch.tensor([464.0, -464.0])])  # 464: 448's tie with the NaN code's 480
    near = torch.cat([torch.nextafter(mids, torch.full_like(mids, math.inf)), torch.nextafter(mids, torch.full_like(mids, -math.inf))])
    big = torch.tensor([448.0, 449.0, 463.99997, 464.00003, 479.0, 480.0, 481.0, 1e4, 3e38, math.inf])
    nan_bits = torch.tensor([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFC00000, 0xFF800001, 0xFFFFFFFF, 0x7FA00000], dtype=torch.int64)
    sub = f32_from_bits(torch.randint(1, 2**23, (4096,), generator=g, dtype=torch.int64) | (torch.randint(0, 2, (4096,), generator=g) << 31))
    rand_bits = f32_from_bits(torch.randint(0, 2**32, (1 << 20,), generator=g, dtype=torch.int64))
    uniform = torch.empty(1 << 18).uniform_(-512.0, 512.0, generator=g)
    sign = torch.where(torch.rand(1 << 18, generator=g) < 0.5, -1.0, 1.0)
    log_uniform = sign * torch.exp2(torch.empty(1 << 18).uniform_(-14.0, 10.0, generator=g))
    return torch.cat([codes, mids, near, big, -big, f32_from_bits(nan_bits), sub, torch.tensor([0.0, -0.0]),
                      rand_bits, uniform, log_uniform])


def satfinite_e4m3(x: torch.Tensor) -> torch.Tensor:
    """cvt.rn.satfinite.e4m3x2.f32 (what Triton emits for CUDA): RNE, +-448 beyond the range and
    for +-Inf, NaN stays NaN (torch's cast of the clamped value; clamp keeps NaN)."""
    return x.clamp(-448.0, 448.0).to(FP8)


# ---- installation ----------------------------------------------------------------------------


def test_install_is_idempotent_and_the_optimized_path_installs_it():
    import optimized.launch  # noqa: F401 - installs at import under the interpreter
    from triton.runtime import interpreter

    first = fixes.status()
    assert first.installed, first.reason
    patched = {name: interpreter.InterpreterBuilder.__dict__[name] for name in fixes.PATCHED_METHODS}
    assert fixes.install() == first
    assert {name: interpreter.InterpreterBuilder.__dict__[name] for name in fixes.PATCHED_METHODS} == patched
    for fn in patched.values():
        assert fn.__wrapped__ is not fn  # triton's own method is kept behind it


def test_uninstall_restores_triton_and_a_launch_reinstalls(monkeypatch):
    from triton.runtime import interpreter

    from optimized.launch import LaunchContext, launch

    fixes.uninstall()
    assert not fixes.installed()
    for name in fixes.PATCHED_METHODS:
        method = interpreter.InterpreterBuilder.__dict__[name]
        if name == "create_dot":  # triton's own beneath the row-by-row product, which stays (dot_rows)
            method = method.__wrapped__
        assert not hasattr(method, "__wrapped__")
    x = torch.tensor([127.4], dtype=torch.float32)  # the defect's own example: 127.4 -> 64
    q = torch.empty(1, dtype=FP8)
    _e4m3_cast_kernel[(1,)](x, q, 1, SOFTWARE=False, BLOCK=16)
    assert q.float().item() == 64.0
    launch(LaunchContext(torch.device("cpu")), _e4m3_cast_kernel, 1, stage="test", reads={}, writes={},
           x_ptr=x, q_ptr=q, n=1, SOFTWARE=False, BLOCK=16)
    assert fixes.installed()
    assert q.float().item() == 128.0


def test_refuses_a_triton_version_it_was_not_written_for(monkeypatch):
    from triton.runtime import interpreter

    fixes.uninstall()
    before = {name: interpreter.InterpreterBuilder.__dict__[name] for name in fixes.PATCHED_METHODS}
    monkeypatch.setattr(triton, "__version__", "3.10.0")
    result = fixes.install()
    assert not result.installed and "3.9" in result.reason and "3.10.0" in result.reason
    assert fixes.install() == result  # refused once, not re-checked at every launch
    assert {name: interpreter.InterpreterBuilder.__dict__[name] for name in fixes.PATCHED_METHODS} == before
    assert not fixes.status().installed
    fixes.uninstall()  # forget the refusal; the autouse fixture reinstalls on the real version
    monkeypatch.undo()


def test_refuses_a_changed_builder_signature(monkeypatch):
    from triton.runtime import interpreter

    fixes.uninstall()
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", lambda self, a, b, d, precision: None)
    result = fixes.install()
    assert not result.installed and "create_dot" in result.reason
    monkeypatch.undo()
    fixes.uninstall()


# ---- bf16 ------------------------------------------------------------------------------------


def test_bf16_upcast_every_pattern():
    x = all_bf16()
    soft, fixed = software_vs_fixed(_bf16_upcast_kernel, x, torch.float32)
    assert_same_bits(fixed, soft, x)
    # and exact: bits moved, NaN payloads included (torch's widening keeps them too)
    assert_same_bits(fixed, (x.view(torch.int16).to(torch.int32) << 16).view(torch.float32), x)
    with unpatched():
        assert not fixes.install().installed  # a launch inside cannot put the fixes back
        broken = run(_bf16_upcast_kernel, x, torch.float32, software=False)
    assert (int_bits(broken) != int_bits(fixed)).any()  # the defect the fix is for (subnormals)


def test_bf16_cast_rounding_sample():
    x = bf16_rounding_sample()
    soft, fixed = software_vs_fixed(_bf16_cast_kernel, x, torch.bfloat16)
    assert_same_bits(fixed, soft, x)
    finite = ~torch.isnan(x)
    assert_same_bits(fixed[finite], x[finite].to(torch.bfloat16), x[finite])  # torch's RNE
    nan = torch.isnan(x)
    assert torch.isnan(fixed[nan].float()).all()
    with unpatched():
        broken = run(_bf16_cast_kernel, x, torch.bfloat16, software=False)
    assert (int_bits(broken) != int_bits(fixed)).float().mean() > 0.3  # truncation: about half off


def test_bf16_cast_rounding_mode_rtz_is_triton_s_own():
    """Only round-to-nearest-even is replaced; another mode goes to triton's implementation."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    x = interpreter.TensorHandle(np.array([1.0 + 2**-9], dtype=np.float32), tl.float32)
    rtz = builder.create_fp_to_fp(x, tl.bfloat16, interpreter._ir.ROUNDING_MODE.RTZ)
    assert int(rtz.data[0]) == 0x3F80


# ---- e4m3 ------------------------------------------------------------------------------------


def test_e4m3_upcast_every_code():
    x = all_e4m3()
    soft, fixed = software_vs_fixed(_e4m3_upcast_kernel, x, torch.float32)
    assert_same_bits(fixed, soft, x)
    finite = ~torch.isnan(x.float())
    assert_same_bits(fixed[finite], x.float()[finite], x[finite])
    assert int(finite.sum()) == 254 and torch.isnan(fixed[~finite]).all()
    with unpatched():
        broken = run(_e4m3_upcast_kernel, x, torch.float32, software=False)
    assert torch.isfinite(broken[~finite]).all()  # the defect: NaN codes read as +-480


def test_e4m3_quantisation_as_the_row_kernel_runs_it():
    """_quantize_tile (clamp, cast, NaN by bits on the software path): every input, NaN, Inf and
    beyond 448 included, gives the same code on the fixed native path."""
    x = e4m3_sample()
    soft, fixed = software_vs_fixed(_e4m3_quantize_kernel, x, FP8)
    assert_same_bits(fixed, soft, x)
    assert_same_bits(fixed, satfinite_e4m3(x), x)  # NaN codes with the NaN's sign, as torch writes them


def test_e4m3_cast_is_satfinite_round_to_nearest_even():
    """The bare cast: torch's RNE in range, +-448 beyond it and for +-Inf (cvt.rn.satfinite),
    the NaN code for NaN."""
    x = e4m3_sample()
    fixed = run(_e4m3_cast_kernel, x, FP8, software=False)
    assert_same_bits(fixed, satfinite_e4m3(x), x)
    in_range = x.abs() <= 448.0
    with unpatched():
        soft = run(_e4m3_cast_kernel, x, FP8, software=True)
        broken = run(_e4m3_cast_kernel, x, FP8, software=False)
    # the software rounding (grid, then the cast of a value on the grid) agrees wherever it is used:
    # the kernels clamp to +-448 first and write NaN codes themselves (the test above)
    assert_same_bits(fixed[in_range], soft[in_range], x[in_range])
    assert (int_bits(broken[in_range]) != int_bits(fixed[in_range])).any()


# ---- dots ------------------------------------------------------------------------------------


def dot_operands(kind: str, seed: int, special: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    m, n, k = 32, 32, 128
    if kind == "bf16":
        a, b = (torch.randn(m, k, generator=g) * 4).bfloat16(), (torch.randn(n, k, generator=g) * 4).bfloat16()
        if special:  # subnormals, huge values, Inf and NaN patterns among the operands
            pats = torch.randint(0, 65536, (m, k), generator=g, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
            a = torch.where(torch.rand(m, k, generator=g) < 0.2, pats, a)
            sub = torch.randint(0, 0x80, (n, k), generator=g, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
            b = torch.where(torch.rand(n, k, generator=g) < 0.3, sub, b)
        return a, b
    a = torch.randint(0, 256, (m, k), generator=g, dtype=torch.int32).to(torch.uint8)
    b = torch.randint(0, 256, (n, k), generator=g, dtype=torch.int32).to(torch.uint8)
    if not special:  # no NaN codes
        a, b = torch.where((a & 0x7F) == 0x7F, a & 0xF0, a), torch.where((b & 0x7F) == 0x7F, b & 0xF0, b)
    return a.view(FP8), b.view(FP8)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on Inf/NaN products
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("special", [False, True], ids=["finite", "special"])
def test_dot_is_the_kernels_float32_workaround_bitwise(kind, special):
    for seed in range(3):
        a, b = dot_operands(kind, seed, special)
        fp8 = kind == "fp8"
        c_soft, c_fixed = torch.empty(32, 32), torch.empty(32, 32)
        with unpatched():
            _dot_kernel[(1,)](a, b, c_soft, SOFTWARE=True, FP8_OPERANDS=fp8, M=32, N=32, K=128)
        _dot_kernel[(1,)](a, b, c_fixed, SOFTWARE=False, FP8_OPERANDS=fp8, M=32, N=32, K=128)
        assert_same_bits(c_fixed.flatten(), c_soft.flatten())
        if not special:
            exact = a.double() @ b.double().T
            assert ((c_fixed.double() - exact).abs() <= 128 * 2**-24 * (a.double().abs() @ b.double().abs().T) * 1.01).all()


def test_bf16_dot_defect_is_present_without_the_fix():
    a, b = dot_operands("bf16", 0, False)
    c = torch.empty(32, 32)
    with unpatched():
        _dot_kernel[(1,)](a, b, c, SOFTWARE=False, FP8_OPERANDS=False, M=32, N=32, K=128)
    assert (c.double() - a.double() @ b.double().T).abs().max() > 1.0


# ---- coexistence with the race recorder ------------------------------------------------------


def test_race_recorder_and_fixes_coexist():
    from diffmoe.interpreter.address_recorder import RaceRecorder, races_supported

    ok, why = races_supported()
    if not ok:
        pytest.skip(why)
    x = torch.tensor([127.4, -0.3, 500.0, math.nan], dtype=torch.float32)
    q = torch.empty(4, dtype=FP8)
    with RaceRecorder() as recorder:
        _e4m3_quantize_kernel[(1,)](x, q, 4, SOFTWARE=False, BLOCK=16)
        assert fixes.installed()
    assert fixes.installed()
    assert_same_bits(q, satfinite_e4m3(x), x)
    assert recorder.findings() == []  # one program: nothing to race with
