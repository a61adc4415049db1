"""Backend conformance: does the Triton backend under us compute what a Triton MoE assumes?

The Triton interpreter silently gets some primitives wrong (../shared/DESIGN.md, "Facts
measured here"): the float32 -> e4m3fn and float32 -> bf16 casts round wrongly, e4m3fn NaN
codes and bf16 subnormals are misread on the way to float32, and the bf16 x bf16 dot is garbage. A later
Triton release may fix any of these, and a GPU backend may get other things wrong (TF32 in a
float32 dot, an approximate division). So nothing is assumed: small kernels probe each
primitive a Triton FP8 MoE relies on, on the active backend, against torch or a float64
reference. What is judged is Triton, not an MoE: this is harness knowledge, and it lives in the
harness.

This is one of the few modules of diffmoe allowed to import Triton (with the interpreter race
recorder and the compile gate); nothing imports it at start-up: `diffmoe doctor` and an
implementation that wants probe results import it when they need it. Importing it turns the
interpreter on when no GPU is present (TRITON_INTERPRET=1 must be set before triton is first
imported). It imports no implementation.

Two uses:
  * `run_probes(keys, device, full=False)`: the cheap probes an implementation derives its
    workaround switches from (optimized.backend.backend_traits asks for the ones behind its
    switches, once per process and backend, and decides itself which switch each result turns
    off).
  * the full sweep behind `diffmoe doctor` (run by diffmoe/backend/doctor.py), one row per
    primitive with its status (ok / DEFECT / skipped), the mismatch count, and the workaround
    the implementation applies for it. Where a workaround is applied and the implementation
    hands over its software path, the sweep also runs it on the same inputs, so the report says
    whether the workaround itself is right on this backend.

The plug-in interface (what an implementation tells the doctor): a `ConformanceHooks`,
obtained by `diffmoe doctor` from the default implementation's factory through the contract
(the factory's optional `conformance_hooks` attribute, a zero-argument callable; see
diffmoe/contract.py). It holds:
  * `workarounds`: primitive key -> `Workaround(trait, description, software)`: the switch that
    turns it on, what it does (the doctor's workaround column), and optionally its software
    path as a one-argument @triton.jit function the probe kernels call in place of the native
    primitive: for the casts and upcasts, the conversion itself (float32 -> e4m3fn /
    float32 -> bf16 / bf16 -> float32); for `bf16_dot`, the conversion applied to both bf16
    operands before an ieee float32 tl.dot. No `software`: the doctor cannot run it and says
    nothing of it (e.g. a decode that lives inside a GEMM). A primitive absent from the
    mapping has no workaround.
  * `switches(device) -> (switches, refusal)`: the implementation's workaround switches on
    `device` (name -> on, in the order the doctor lists them) and, where it refuses to run on
    this backend, why (None: it runs).
  * `launch(kernel, programs, schedule, device, **kernel_args)` (optional): launch a harness
    probe kernel on a (programs,) grid under a `Schedule` the way the implementation launches
    its own, which passes the order table as `order_ptr` and `REORDER` (the program-order
    probe's kernel takes both). Without it, the probe launches with plain Triton and its own
    table, and so judges the backend alone.
  * `unguarded` (optional): primitive key -> what a DEFECT means for this implementation when
    no workaround is applied, in place of the generic text of `PRIMITIVES`.
Without hooks the doctor judges the backend alone: no switch, no workaround.

Exit code of the doctor: 0 when every primitive is ok or has its workaround applied (and, where
the sweep runs that workaround, it came out right), 1 otherwise.

Longer than 400 lines because the suite is one piece: each probe's inputs, kernel, comparison
and verdict sit next to the others they share helpers with (seventeen primitives), and the doctor's
report renders exactly those rows; split, every probe would span three files.

Owns the probes and the doctor's report. Must not import an implementation: it gets one's hooks through the contract.
"""

from __future__ import annotations

import math
import os
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

import torch

# The interpreter is chosen when a kernel is decorated: without a GPU it must be on before
# triton is first imported (as the implementations do on import).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from diffmoe.problem.ulps import ulp_distance  # noqa: E402
from diffmoe.contract import Schedule, default_device, interpreter_enabled  # noqa: E402

OK = "ok"
DEFECT = "DEFECT"
SKIPPED = "skipped"

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0
FLOAT32_UNIT_ROUNDOFF = 2.0**-24
# Hopper's FP8 tensor cores keep about 14 bits of a running sum (DeepSeek-V3 report, section
# 3.3.2): truncation to a 14-bit significand loses up to 2^-13 relative per addition. The fp8
# dot on CUDA is judged by that accumulator: against float32's, an H200 was 18.7x over at K=128
# (`diffmoe doctor` there, bench/gpu_checks.sh 2026-12-04), the hardware's design, not a defect.
FP8_TENSOR_CORE_UNIT_ROUNDOFF = 2.0**-13
# The dots are probed at the K step a grouped GEMM uses per tl.dot call (BLOCK_K = 128).
DOT_K = 128
# tl.exp feeds only silu, whose product is rounded to bf16 and judged one e4m3 step apart
# (tolerances: forced_fused). 256 float32 ulps is at most 2^-15 relative, 1/128 of a bf16 ulp:
# an exp that close moves a bf16 rounding by at most one step, on under 1% of values. The bound
# sits above what CUDA's tl.exp (ex2.approx of x * log2(e)) can lose near the overflow edge
# (rounding of the product and of the constant: up to ~65 ulp at |x| = 87) and far below a
# wrong or low-precision exp (a float16-grade exp is ~2^13 ulps off).
EXP_MAX_ULP = 256


# ---- the backend --------------------------------------------------------------------------


def backend_name(device: torch.device) -> str:
    """"interpreter" or "cuda" for probe kernels launched on `device`; raises where neither can run them."""
    if interpreter_enabled():
        return "interpreter"
    if device.type == "cuda":
        return "cuda"
    raise RuntimeError(
        "the conformance probes need CUDA or the Triton interpreter: set TRITON_INTERPRET=1 "
        "before importing triton (diffmoe sets it when no GPU is present)"
    )


def normalize_device(device: torch.device) -> torch.device:
    """`cuda` -> `cuda:N` (the current device)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


# ---- results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeResult:
    """One primitive on one backend. `mismatches` counts elements that differ from the
    reference (for the dots: that exceed the bound; for tl.exp: that differ by any ulp, the
    status being decided by EXP_MAX_ULP). `workaround_mismatches` is the same count for the
    implementation's workaround on the same inputs (None: no workaround, or not run)."""

    primitive: str
    status: str
    mismatches: int
    total: int
    detail: str
    workaround_mismatches: int | None = None
    workaround_total: int | None = None


@dataclass(frozen=True)
class Primitive:
    key: str
    title: str
    unguarded: str  # what a DEFECT means when no workaround is applied (hooks may say it of their own code)


PRIMITIVES = (
    Primitive("fp8_cast", "float32 -> e4m3fn cast (native)", "FP8 codes differ from a round-to-nearest-even cast"),
    Primitive("fp8_upcast", "e4m3fn -> float32 upcast (native)", "NaN codes read as finite values"),
    Primitive("bf16_cast", "float32 -> bf16 cast (native)", "every bf16 output can be one ulp off"),
    Primitive("bf16_upcast", "bf16 -> float32 upcast (native)", "bf16 subnormals read as wrong values"),
    Primitive("fp8_dot", "fp8 x fp8 tl.dot",
              "fp8 GEMMs on it are off by more than float32 accumulation, which the tolerance table assumes"),
    Primitive("bf16_dot", "bf16 x bf16 tl.dot", "bf16 GEMMs on it are wrong"),
    Primitive("fp32_dot", "float32 tl.dot (ieee)", "float32 GEMMs on it are off"),
    Primitive("exp", "tl.exp", "silu's error exceeds what the tolerance table assumes"),
    Primitive("program_order", "program order table", "the schedule-permutation oracle does not permute anything"),
    Primitive("grid_order", "grid-loop program order (interpreter)",
              "a plug-in without an order table is not reordered: the schedule oracle compares runs of one order"),
    Primitive("aliasing", "aliasing tensor views", "kernels do not see real storage: the aliasing oracles' premise fails"),
    Primitive("fp32_div", "float32 division", "`/` is not correctly rounded (tl.math.div_rn would be)"),
    # what third-party kernels use (lmdeploy 0.18's blocked-FP8 MoE: silu * up and its reduce in bf16,
    # `mask & (m < M)` in its quant, `fast_expf = tl.math.exp`); diffmoe.interpreter.fixes fixes each
    # on the interpreter where its probe finds it
    Primitive("bf16_arith", "bf16 elementwise arithmetic", "bf16 +, -, *, min/max, comparisons in a kernel are wrong"),
    Primitive("bf16_reduce", "bf16 tl.sum / tl.max / tl.min", "bf16 reductions in a kernel are wrong"),
    Primitive("scalar_mask", "scalar comparison in a block mask", "a load masked by `block & (i < n)` raises"),
    Primitive("builtin_alias", "module-level alias of a builtin", "a kernel calling `f = tl.math.exp` raises"),
    # unsloth's MoE grouped GEMM converts its tl.range index (`expert_idx.to(tl.int64)`)
    Primitive("range_index", "tl.range loop index", "a kernel converting its loop index (`i.to(tl.int64)`) raises"),
    # vLLM's and lmdeploy's bf16 MoE kernels are @triton.autotune'd; under the interpreter on a
    # machine without a GPU there is no driver to time their configs with
    Primitive("autotune_driver", "@triton.autotune without a GPU driver", "an autotuned kernel raises: no driver times its configs"),
)
PRIMITIVE_KEYS = tuple(p.key for p in PRIMITIVES)
_BY_KEY = {p.key: p for p in PRIMITIVES}


# ---- the plug-in interface (see the module docstring) -------------------------------------


@dataclass(frozen=True)
class Workaround:
    """What an implementation does in place of one primitive, when its switch `trait` is on
    (always, when `trait` is None: a rule its kernels follow on every backend)."""

    trait: str | None  # the implementation's switch (a key of what `ConformanceHooks.switches` returns)
    description: str  # shown in the doctor's workaround column
    # a one-argument @triton.jit function (module docstring), two-argument for fp32_div (the
    # division it uses instead of `/`); None: not run here
    software: Any = None


# (switch name -> on, in display order; why the implementation refuses this backend, or None)
Switches = tuple[Mapping[str, bool], "str | None"]
# launch(kernel, programs, schedule, device, **kernel_args)
Launcher = Callable[..., None]


@dataclass(frozen=True)
class ConformanceHooks:
    """What an implementation tells the doctor (module docstring)."""

    workarounds: Mapping[str, Workaround]
    switches: Callable[[torch.device], Switches]
    launch: Launcher | None = None
    unguarded: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted((set(self.workarounds) | set(self.unguarded)) - set(PRIMITIVE_KEYS))
        if unknown:
            raise ValueError(f"conformance hooks name unknown primitives {unknown}; known: {list(PRIMITIVE_KEYS)}")


def software_path(hooks: ConformanceHooks | None, key: str):
    """The implementation's software path for primitive `key`, or None when it gave none."""
    workaround = hooks.workarounds.get(key) if hooks is not None else None
    return workaround.software if workaround is not None else None


# ---- kernels ------------------------------------------------------------------------------
#
# The cast probes share one kernel; CONVERT is the conversion under test: a native one below,
# or an implementation's software path (Workaround.software).


@triton.jit
def native_fp8_cast(x):
    return x.to(tl.float8e4nv)


@triton.jit
def native_fp8_upcast(x):
    return x.to(tl.float32)


@triton.jit
def native_bf16_cast(x):
    return x.to(tl.bfloat16)


@triton.jit
def native_bf16_upcast(x):
    return x.to(tl.float32)


NATIVE = {
    "fp8_cast": native_fp8_cast,
    "fp8_upcast": native_fp8_upcast,
    "bf16_cast": native_bf16_cast,
    "bf16_upcast": native_bf16_upcast,
}


@triton.jit
def _convert_probe_kernel(x_ptr, y_ptr, n, CONVERT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, CONVERT(tl.load(x_ptr + offs, mask=mask, other=0.0)), mask=mask)


@triton.jit
def _dot_probe_kernel(
    a_ptr, b_ptr, c_ptr,
    UPCAST: tl.constexpr, UPCAST_BF16: tl.constexpr, IEEE: tl.constexpr,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
):
    """c [M, N] = a [M, K] @ b, b stored [N, K] and loaded as [K, N] the way a grouped GEMM
    loads expert weights. With UPCAST_BF16, both operands go through UPCAST (an
    implementation's bf16 dot workaround) and the dot is an ieee float32 one."""
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rn[None, :] * K + rk[:, None])
    if UPCAST_BF16:
        c = tl.dot(UPCAST(a), UPCAST(b), input_precision="ieee")
    elif IEEE:
        c = tl.dot(a, b, input_precision="ieee")
    else:
        c = tl.dot(a, b)  # the default, as fp8 and bf16 GEMMs call it
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], c)


@triton.jit
def _exp_probe_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.exp(tl.load(x_ptr + offs, mask=mask, other=0.0)), mask=mask)


@triton.jit
def native_div(x, y):
    return x / y


@triton.jit
def _div_probe_kernel(x_ptr, y_ptr, q_ptr, n, BLOCK: tl.constexpr, DIVIDE: tl.constexpr):
    """DIVIDE: `/` (native_div) or an implementation's division (Workaround.software)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=1.0)
    y = tl.load(y_ptr + offs, mask=mask, other=1.0)
    tl.store(q_ptr + offs, DIVIDE(x, y), mask=mask)


@triton.jit
def _order_probe_kernel(counter_ptr, seen_ptr, order_ptr, REORDER: tl.constexpr):
    """Takes the next slot of a global counter and writes its logical program id there: `seen`
    is the order in which the logical programs ran."""
    pid = tl.program_id(0)
    if REORDER:
        pid = tl.load(order_ptr + pid)
    slot = tl.atomic_add(counter_ptr, 1)
    tl.store(seen_ptr + slot, pid)


@triton.jit
def _grid_order_probe_kernel(counter_ptr, seen_ptr):
    """As _order_probe_kernel on a 2-D grid without an order table: `seen` is the order in which
    the programs, by linear id x + nx * y, ran."""
    slot = tl.atomic_add(counter_ptr, 1)
    tl.store(seen_ptr + slot, tl.program_id(0) + tl.num_programs(0) * tl.program_id(1))


@triton.jit
def _alias_probe_kernel(write_ptr, read_ptr, out_ptr, NBYTES: tl.constexpr):
    """Writes bytes through one view, then reads them back as int16 through another view of
    the same storage, in the same program of the same launch."""
    offs = tl.arange(0, NBYTES)
    tl.store(write_ptr + offs, ((offs * 37 + 11) & 0xFF).to(tl.uint8))
    tl.debug_barrier()  # the CTA's stores are visible to its loads past this point
    half = tl.arange(0, NBYTES // 2)
    tl.store(out_ptr + half, tl.load(read_ptr + half))


@triton.jit
def _bf16_arith_probe_kernel(x_ptr, y_ptr, out_ptr, cmp_ptr, n, BLOCK: tl.constexpr):
    """out rows: x + y, x - y, x * y, -x, max(x, y), min(x, y); cmp rows: x < y, x == y (bf16 throughout)."""
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=1.0)
    y = tl.load(y_ptr + offs, mask=mask, other=1.0)
    tl.store(out_ptr + offs, x + y, mask=mask)
    tl.store(out_ptr + n + offs, x - y, mask=mask)
    tl.store(out_ptr + 2 * n + offs, x * y, mask=mask)
    tl.store(out_ptr + 3 * n + offs, -x, mask=mask)
    tl.store(out_ptr + 4 * n + offs, tl.maximum(x, y), mask=mask)
    tl.store(out_ptr + 5 * n + offs, tl.minimum(x, y), mask=mask)
    tl.store(cmp_ptr + offs, (x < y).to(tl.int8), mask=mask)
    tl.store(cmp_ptr + n + offs, (x == y).to(tl.int8), mask=mask)


@triton.jit
def _bf16_reduce_probe_kernel(x_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Per row of x [ROWS, COLS] (bf16): the sum of its first two columns (one add: exact in any
    order), its max and its min."""
    r, c = tl.arange(0, ROWS), tl.arange(0, COLS)
    x = tl.load(x_ptr + r[:, None] * COLS + c[None, :])
    pair = tl.load(x_ptr + r[:, None] * COLS + tl.arange(0, 2)[None, :])
    tl.store(out_ptr + r, tl.sum(pair, axis=1))
    tl.store(out_ptr + ROWS + r, tl.max(x, axis=1))
    tl.store(out_ptr + 2 * ROWS + r, tl.min(x, axis=1))


@triton.jit
def _scalar_mask_probe_kernel(x_ptr, y_ptr, n, live, BLOCK: tl.constexpr):
    """A load masked by a block mask and a scalar comparison, as a quant kernel's row loop writes it."""
    offs = tl.arange(0, BLOCK)
    row = tl.program_id(0)
    tl.store(y_ptr + row * BLOCK + offs,
             tl.load(x_ptr + row * BLOCK + offs, mask=(offs < n) & (row < live), other=-1.0))


_ALIASED_EXP = tl.math.exp  # a module-level alias of a builtin, as lmdeploy's `fast_expf = tl.math.exp`


@triton.jit
def _builtin_alias_probe_kernel(x_ptr, y_ptr, z_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, _ALIASED_EXP(x))
    tl.store(z_ptr + offs, tl.exp(x))


@triton.jit
def _range_index_probe_kernel(y_ptr, N: tl.constexpr):
    for i in tl.range(0, N):  # compiled, i is an int32 tensor: it converts
        tl.store(y_ptr + i, i.to(tl.int64) * 3 + (2**31 - 1))


# Two configs, so Triton's autotuner times them (with one it picks it untimed: autotuner.py,
# "Match single-config autotune behavior"); each gives the same result, BLOCK only tiles it.
_AUTOTUNE_CONFIGS = [triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})]


@triton.autotune(configs=_AUTOTUNE_CONFIGS, key=["n"])
@triton.jit
def _autotune_probe_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)  # exact: no contraction to differ by


def _elementwise_launch(n: int, device: torch.device) -> tuple[tuple[int], int]:
    """(grid, BLOCK) of an element-wise probe over n elements. The interpreter's cost is per
    program and per op, not per element: one program takes everything. A GPU gets the usual
    1024-element blocks (a huge block would only make compilation slow)."""
    block = triton.next_power_of_2(max(n, 16)) if backend_name(device) == "interpreter" else 1024
    return (triton.cdiv(n, block),), block


# ---- inputs -----------------------------------------------------------------------------


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def e4m3_code_points() -> torch.Tensor:
    """All 256 e4m3fn patterns as float32 (0x7f and 0xff are NaN)."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).float()


def e4m3_midpoints() -> torch.Tensor:
    """Midpoints of adjacent finite e4m3 values, both signs: exact in float32, so true ties."""
    finite = e4m3_code_points()
    grid = torch.unique(finite[torch.isfinite(finite)].abs())
    mids = (grid[:-1] + grid[1:]) / 2
    return torch.cat([mids, -mids])


def e4m3_random(n: int, seed: int) -> torch.Tensor:
    """float32 in [-448, 448]: uniform over the range, unit normal, log-uniform magnitudes from
    2^-12 (below the e4m3 subnormals) to 448."""
    g = _gen(seed)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    log_uniform = sign * torch.exp2(torch.empty(n).uniform_(-12.0, math.log2(E4M3_MAX), generator=g))
    parts = [torch.empty(n).uniform_(-E4M3_MAX, E4M3_MAX, generator=g), torch.randn(n, generator=g), log_uniform]
    return torch.cat(parts).clamp(-E4M3_MAX, E4M3_MAX)


def fp8_cast_inputs(full: bool) -> torch.Tensor:
    mids = e4m3_midpoints()
    if not full:
        return torch.cat([mids, e4m3_random(256, seed=11)])
    up = torch.nextafter(mids, torch.full_like(mids, math.inf))
    down = torch.nextafter(mids, torch.full_like(mids, -math.inf))
    return torch.cat([e4m3_code_points(), mids, up, down, e4m3_random(4096, seed=12)])


def float32_subnormals(n: int, seed: int) -> torch.Tensor:
    """Random float32 subnormals, both signs, a quarter of them exact ties of the bf16 rounding."""
    g = _gen(seed)
    mantissa = torch.randint(1, 2**23, (n,), generator=g, dtype=torch.int32)
    mantissa[: n // 4] = (mantissa[: n // 4] & ~0xFFFF) | 0x8000
    sign = torch.randint(0, 2, (n,), generator=g, dtype=torch.int32) << 31
    return (mantissa | sign).view(torch.float32)


def bf16_cast_inputs(full: bool) -> torch.Tensor:
    """Normal values at several scales, exact ties with both parities of the kept bit (and
    their neighbours when full), float32 subnormals, signed zeros and the overflow edge."""
    n = 4096 if full else 256
    g = _gen(21 if full else 22)
    tie_bits = (torch.randint(-(2**15), 2**15 - 1, (n,), generator=g, dtype=torch.int32) << 16) | 0x8000
    ties = tie_bits.view(torch.float32)
    ties = ties[torch.isfinite(ties) & (ties.abs() >= 2.0**-126)]
    fmax = torch.finfo(torch.float32).max
    edges = torch.tensor([0.0, -0.0, 1.0, -1.0, fmax, -fmax, 2.0**-126, -(2.0**-126)])
    parts = [torch.randn(n, generator=g) * 10, torch.randn(n, generator=g) * 1e-3, ties,
             float32_subnormals(n, seed=23 if full else 24), edges]
    if full:
        parts += [torch.randn(n, generator=g) * 1e30,
                  torch.nextafter(ties, torch.full_like(ties, math.inf)),
                  torch.nextafter(ties, torch.full_like(ties, -math.inf))]
    return torch.cat(parts)


def bf16_patterns(full: bool) -> torch.Tensor:
    """Every bf16 bit pattern when full; else the subnormals and a few normals and zeros."""
    if full:
        return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    mags = torch.cat([torch.arange(0, 0x80), torch.tensor([0x80, 0x3F80, 0x4049, 0x7F7F])]).to(torch.int32)
    return torch.cat([mags, mags | 0x8000]).to(torch.int16).view(torch.bfloat16)


def dot_operands(kind: str, m: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """a [m, DOT_K], b [n, DOT_K] (the weight layout) of the given element kind."""
    g = _gen(seed)
    a, b = torch.randn(m, DOT_K, generator=g), torch.randn(n, DOT_K, generator=g)
    if kind == "fp8":
        return (a * 16).clamp(-E4M3_MAX, E4M3_MAX).to(FP8), (b * 16).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    if kind == "bf16":
        return a.bfloat16(), b.bfloat16()
    return a, b


def exp_inputs() -> torch.Tensor:
    """Over the whole non-overflowing range, at silu's usual scale, and bf16-grid values (silu's
    inputs are bf16)."""
    g = _gen(31)
    return torch.cat([torch.empty(8192).uniform_(-87.0, 87.0, generator=g), torch.randn(8192, generator=g) * 4,
                      (torch.randn(4096, generator=g) * 8).bfloat16().float()])


def div_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Random mantissas over exponents 2^-30 .. 2^30 (quotients stay normal), and the two
    divisions the quant kernels do: amax / 448 and bf16 values / a scale."""
    g = _gen(41)
    n = 8192

    def wide() -> torch.Tensor:
        mant = 1.0 + torch.rand(n, generator=g)
        sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
        return sign * mant * torch.exp2(torch.randint(-30, 31, (n,), generator=g).float())

    amax = torch.rand(n, generator=g) * 100
    values = (torch.randn(n, generator=g) * 3).bfloat16().float()
    scales = (torch.rand(n, generator=g) * 10 + 1e-3) / E4M3_MAX
    return torch.cat([wide(), amax, values]), torch.cat([wide(), torch.full((n,), E4M3_MAX), scales])


# ---- comparisons ------------------------------------------------------------------------


def _int_bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _bit_mismatches(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Elements whose bit patterns differ, a NaN facing any NaN counting as equal (payloads and
    the NaN code a cast picks are nobody's contract)."""
    got, want = got.cpu(), want.cpu()
    differ = _int_bits(got) != _int_bits(want)
    both_nan = torch.isnan(got.float()) & torch.isnan(want.float())
    return differ & ~both_nan


def _examples(x: torch.Tensor, got: torch.Tensor, want: torch.Tensor, bad: torch.Tensor, k: int = 3) -> str:
    idx = bad.nonzero().flatten()[:k].tolist()
    return ", ".join(f"{x[i].item():.6g} -> {got.cpu()[i].float().item():.6g} (torch {want[i].float().item():.6g})" for i in idx)


def _dot_bound(a: torch.Tensor, b: torch.Tensor, u: float = FLOAT32_UNIT_ROUNDOFF) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact product (float64) and the bound gamma_K * sum_k |a_ik| |b_jk| that accumulation of
    K products with unit roundoff u meets in any summation order (float32: u = 2^-24)."""
    a64, b64 = a.cpu().double(), b.cpu().double()
    k = a.shape[1]
    gamma = k * u / (1 - k * u)
    return a64 @ b64.T, gamma * (a64.abs() @ b64.abs().T)


# ---- probes -----------------------------------------------------------------------------


def _on(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


def _cast(convert, x: torch.Tensor, out_dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`convert` (a one-argument @triton.jit conversion) applied to every element of x."""
    x = x.to(device)
    out = torch.empty(x.shape, dtype=out_dtype, device=device)
    grid, block = _elementwise_launch(x.numel(), device)
    _convert_probe_kernel[grid](x, out, x.numel(), CONVERT=convert, BLOCK=block)
    return out.cpu()


def _cast_probe(key: str, x: torch.Tensor, out_dtype: torch.dtype, want: torch.Tensor,
                device: torch.device, software) -> ProbeResult:
    """The native conversion against torch's; `software` (None: not run), the workaround's."""
    got = _cast(NATIVE[key], x, out_dtype, device)
    bad = _bit_mismatches(got, want)
    detail = f"bitwise vs torch; e.g. {_examples(x.float(), got, want, bad)}" if bad.any() else "bitwise vs torch"
    wbad = None
    if software is not None:
        wbad = int(_bit_mismatches(_cast(software, x, out_dtype, device), want).sum())
    return ProbeResult(key, DEFECT if bad.any() else OK, int(bad.sum()), x.numel(), detail,
                       wbad, x.numel() if software is not None else None)


def _workaround(hooks: ConformanceHooks | None, key: str, full: bool):
    """The software path the full sweep runs for `key` (the cheap probes run none)."""
    return software_path(hooks, key) if full else None


def probe_fp8_cast(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    x = fp8_cast_inputs(full)
    return _cast_probe("fp8_cast", x, FP8, x.to(FP8), device, _workaround(hooks, "fp8_cast", full))


def probe_fp8_upcast(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    """Every e4m3fn code, NaN codes included (256 values: cheap enough for the quick probe too).
    An implementation whose workaround lives inside a GEMM kernel gives no software path to run here."""
    x = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8)
    return _cast_probe("fp8_upcast", x, torch.float32, x.float(), device, _workaround(hooks, "fp8_upcast", full))


def probe_bf16_cast(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    x = bf16_cast_inputs(full)
    return _cast_probe("bf16_cast", x, torch.bfloat16, x.bfloat16(), device, _workaround(hooks, "bf16_cast", full))


def probe_bf16_upcast(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    x = bf16_patterns(full)
    return _cast_probe("bf16_upcast", x, torch.float32, x.float(), device, _workaround(hooks, "bf16_upcast", full))


def _dot(a: torch.Tensor, b: torch.Tensor, device: torch.device, *, upcast=None, ieee: bool = False) -> torch.Tensor:
    """a @ b.T by one tl.dot; `upcast` (a one-argument @triton.jit conversion): both operands
    converted by it first, and an ieee float32 dot."""
    m, n = a.shape[0], b.shape[0]
    c = torch.empty(m, n, dtype=torch.float32, device=device)
    _dot_probe_kernel[(1,)](a.to(device), b.to(device), c, UPCAST=upcast if upcast is not None else native_bf16_upcast,
                            UPCAST_BF16=upcast is not None, IEEE=ieee, M=m, N=n, K=DOT_K)
    return c.cpu().double()


def _dot_probe(key: str, kind: str, device: torch.device, full: bool, *, ieee: bool, workaround=None) -> ProbeResult:
    m = 64 if full else 16
    a, b = dot_operands(kind, m, m, seed={"fp8": 51, "bf16": 52, "fp32": 53}[kind])
    tensor_cores = kind == "fp8" and device.type == "cuda" and not interpreter_enabled()
    u, unit = (FP8_TENSOR_CORE_UNIT_ROUNDOFF, "u=2^-13: Hopper's 14-bit FP8 accumulator") if tensor_cores else \
        (FLOAT32_UNIT_ROUNDOFF, "u=2^-24: float32 accumulation")
    exact, bound = _dot_bound(a, b, u)
    got = _dot(a, b, device, ieee=ieee)
    err = (got - exact).abs()
    bad = ~(err <= bound)  # NaN counts as a violation
    worst = float((err / bound.clamp_min(1e-300)).max())
    detail = (f"|c - exact| <= gamma_K * sum|a||b| (K={DOT_K}, {unit} in any order); "
              f"worst error {worst:.3g} x the bound")
    wbad = None
    if workaround is not None:
        werr = (_dot(a, b, device, upcast=workaround) - exact).abs()
        wbad = int((~(werr <= bound)).sum())
    return ProbeResult(key, DEFECT if bad.any() else OK, int(bad.sum()), got.numel(), detail,
                       wbad, got.numel() if workaround is not None else None)


def probe_fp8_dot(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    return _dot_probe("fp8_dot", "fp8", device, full, ieee=False)


def probe_bf16_dot(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    return _dot_probe("bf16_dot", "bf16", device, full, ieee=False, workaround=_workaround(hooks, "bf16_dot", full))


def probe_fp32_dot(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    return _dot_probe("fp32_dot", "fp32", device, full, ieee=True)


def probe_exp(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    x = exp_inputs()
    y = torch.empty(x.shape, dtype=torch.float32, device=device)
    grid, block = _elementwise_launch(x.numel(), device)
    _exp_probe_kernel[grid](x.to(device), y, x.numel(), BLOCK=block)
    d = ulp_distance(y.cpu(), torch.exp(x))
    differ = int((d > 0).sum())
    one = int((d == 1).sum())
    worst = int(d.max())
    detail = (f"float32 ulps from torch.exp over [-87, 87]: {one} at 1 ulp ({100.0 * one / x.numel():.2f}%), "
              f"max {worst} ulp (bound {EXP_MAX_ULP})")
    return ProbeResult("exp", OK if worst <= EXP_MAX_ULP else DEFECT, differ, x.numel(), detail)


ORDER_PROGRAMS = 16


def _sequential_backend(device: torch.device) -> bool:
    """The interpreter runs program instances one at a time; a GPU runs them concurrently."""
    return backend_name(device) == "interpreter"


def plain_launch(kernel, programs: int, schedule: Schedule, device: torch.device, **kernel_args) -> None:
    """A probe kernel on a (programs,) grid with `schedule`'s order table, by plain Triton (no
    implementation's launcher: the backend alone is judged)."""
    order = torch.tensor(schedule.order(programs), dtype=torch.int32, device=device)
    kernel[(programs,)](**kernel_args, order_ptr=order, REORDER=not schedule.is_identity)


def _run_order(launch: Launcher, schedule: Schedule, device: torch.device, programs: int) -> list[int]:
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    seen = torch.full((programs,), -1, dtype=torch.int32, device=device)
    launch(_order_probe_kernel, programs, schedule, device, counter_ptr=counter, seen_ptr=seen)
    return seen.cpu().tolist()


def probe_program_order(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    """Through the implementation's own launcher (`hooks.launch`; plain Triton without one):
    the identity schedule must run programs 0..n-1, the reversed one n-1..0. Where programs run
    concurrently (GPU) only the logical programs are checked (each exactly once, the table's
    permutation): the hardware picks the order there."""
    n = ORDER_PROGRAMS
    launch = hooks.launch if hooks is not None and hooks.launch is not None else plain_launch
    sequential = _sequential_backend(device)
    bad = 0
    notes = []
    for schedule in (Schedule("identity"), Schedule("reversed")):
        want = schedule.order(n)
        seen = _run_order(launch, schedule, device, n)
        if sequential:
            wrong = sum(s != w for s, w in zip(seen, want))
        else:
            wrong = n - len(set(seen) & set(range(n)))
        bad += wrong
        if wrong:
            notes.append(f"{schedule}: ran {seen}")
    how = "run order equals the table" if sequential else "every logical program runs once (concurrent backend)"
    detail = f"{how}; " + ("; ".join(notes) if notes else "identity and reversed as asked")
    return ProbeResult("program_order", DEFECT if bad else OK, bad, 2 * n, detail)


GRID_ORDER_GRID = (4, 4)


def probe_grid_order(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    """diffmoe.interpreter.grid_order, which reorders the programs of kernels without an order table for the
    schedule oracle: under reversed and random:1 a plain 2-D launch must run its programs in
    exactly that order. Compiled backends have no grid loop to steer: nothing to check there."""
    from diffmoe.interpreter import grid_order

    if not _sequential_backend(device):
        return ProbeResult("grid_order", OK, 0, 0, "not applicable: compiled launches run in the hardware's order; "
                                                   "the schedule oracle permutes through order tables there")
    n = GRID_ORDER_GRID[0] * GRID_ORDER_GRID[1]
    schedules = (Schedule("reversed"), Schedule("random", 1))
    problem = grid_order.control_problem()
    if problem is not None:
        return ProbeResult("grid_order", DEFECT, len(schedules) * n, len(schedules) * n, problem)
    bad, notes = 0, []
    for schedule in schedules:
        counter = torch.zeros(1, dtype=torch.int32, device=device)
        seen = torch.full((n,), -1, dtype=torch.int32, device=device)
        with grid_order.program_order(schedule):
            _grid_order_probe_kernel[GRID_ORDER_GRID](counter, seen)
        ran = seen.cpu().tolist()
        wrong = sum(s != w for s, w in zip(ran, schedule.order(n)))
        bad += wrong
        if wrong:
            notes.append(f"{schedule}: ran {ran}")
    detail = f"a {GRID_ORDER_GRID} grid without an order table; " + (
        "; ".join(notes) if notes else "reversed and random:1 ran as asked")
    return ProbeResult("grid_order", DEFECT if bad else OK, bad, len(schedules) * n, detail)


ALIAS_BYTES = 1024


def _alias_views(storage: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two views carved from one uint8 storage as workspace buffers are: bytes [n, 2n) as uint8,
    and bytes [n, 3n) as int16, overlapping in [n, 2n)."""
    n = ALIAS_BYTES
    return storage[n:2 * n], storage[n:3 * n].view(torch.int16)


def probe_aliasing(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    n = ALIAS_BYTES
    storage = torch.full((3 * n,), 0xAA, dtype=torch.uint8, device=device)
    write_view, read_view = _alias_views(storage)
    out = torch.zeros(n // 2, dtype=torch.int16, device=device)
    _alias_probe_kernel[(1,)](write_view, read_view, out, NBYTES=n)
    pattern = (torch.arange(n) * 37 + 11) & 0xFF
    want = (pattern[0::2] | (pattern[1::2] << 8)).to(torch.int32).to(torch.int16)  # little-endian pairs
    seen_wrong = int((out.cpu() != want).sum())
    after = storage.cpu()
    landed_wrong = int((after[n:2 * n] != pattern.to(torch.uint8)).sum())
    guard_wrong = int((after[:n] != 0xAA).sum() + (after[2 * n:] != 0xAA).sum())
    bad = seen_wrong + landed_wrong + guard_wrong
    detail = (f"write through a uint8 view, read through an int16 view of the same bytes in one launch: "
              f"{seen_wrong} of {n // 2} read back wrong, {landed_wrong} of {n} bytes missing from the storage, "
              f"{guard_wrong} of {2 * n} bytes outside the views changed")
    return ProbeResult("aliasing", DEFECT if bad else OK, bad, n // 2 + 3 * n, detail)


def probe_fp32_div(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    """`/` in a kernel against the correctly rounded quotient; with the implementation's own
    division (its Workaround.software, e.g. tl.math.div_rn) run on the same inputs."""
    x, y = div_inputs()
    want = x / y  # torch's CPU division: IEEE, correctly rounded

    def divide(fn) -> torch.Tensor:
        q = torch.empty(x.shape, dtype=torch.float32, device=device)
        grid, block = _elementwise_launch(x.numel(), device)
        _div_probe_kernel[grid](x.to(device), y.to(device), q, x.numel(), BLOCK=block, DIVIDE=fn)
        return q.cpu()

    got = divide(native_div)
    bad = _bit_mismatches(got, want)
    detail = "bitwise vs torch (correctly rounded)"
    if bad.any():
        worst = int(ulp_distance(got, want).max())
        detail += f"; max {worst} ulp; e.g. {_examples(x, got, want, bad)}"
    software = _workaround(hooks, "fp32_div", full)
    wbad = None if software is None else int(_bit_mismatches(divide(software), want).sum())
    return ProbeResult("fp32_div", DEFECT if bad.any() else OK, int(bad.sum()), x.numel(), detail,
                       wbad, x.numel() if software is not None else None)


def bf16_operands(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 pairs of both signs over several scales, with infinities, equal pairs and subnormals
    (no NaN, no signed-zero pair: maxnum's choice between -0 and +0 is nobody's contract)."""
    g = _gen(seed)
    scale = torch.exp2(torch.randint(-20, 21, (n,), generator=g).float())
    x = (torch.randn(n, generator=g) * scale).bfloat16()
    y = (torch.randn(n, generator=g) * scale).bfloat16()
    y[: n // 16] = x[: n // 16]  # equal pairs
    x[n // 16 : n // 8] = torch.tensor(2.0**-130).bfloat16()  # a subnormal
    edges = torch.tensor([math.inf, -math.inf, 1.0, -3.0, 65280.0, 1e38]).bfloat16()
    x[-6:], y[-6:] = edges, edges.flip(0)
    return x, y


def _raised(key: str, exc: Exception, total: int) -> ProbeResult:
    """A probe kernel the backend could not run because of the defect probed: every result wrong."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return ProbeResult(key, DEFECT, total, total, f"the probe kernel raised {type(exc).__name__}: {text}")


def probe_bf16_arith(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    n = 4096 if full else 512
    x, y = bf16_operands(n, seed=61 if full else 62)
    block = triton.next_power_of_2(n)
    out = torch.empty(6 * n, dtype=torch.bfloat16, device=device)
    cmp = torch.empty(2 * n, dtype=torch.int8, device=device)
    _bf16_arith_probe_kernel[(1,)](x.to(device), y.to(device), out, cmp, n, BLOCK=block)
    want = torch.cat([x + y, x - y, x * y, -x, torch.maximum(x, y), torch.minimum(x, y)])  # torch: float op, rounded once
    want_cmp = torch.cat([x < y, x == y]).to(torch.int8)
    bad = _bit_mismatches(out.cpu(), want)
    bad_cmp = cmp.cpu() != want_cmp
    wrong = int(bad.sum()) + int(bad_cmp.sum())
    ops = ("+", "-", "*", "neg", "max", "min")
    per_op = ", ".join(f"{op} {int(b.sum())}" for op, b in zip(ops, bad.view(6, n)))
    detail = f"bitwise vs torch's bf16 ops (one rounding): {per_op}, < {int(bad_cmp[:n].sum())}, == {int(bad_cmp[n:].sum())}"
    return ProbeResult("bf16_arith", DEFECT if wrong else OK, wrong, 8 * n, detail)


def probe_bf16_reduce(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    rows, cols = (64, 128) if full else (16, 64)
    g = _gen(71)
    x = (torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-8, 9, (rows, 1), generator=g).float())).bfloat16()
    out = torch.empty(3 * rows, dtype=torch.bfloat16, device=device)
    _bf16_reduce_probe_kernel[(1,)](x.to(device), out, ROWS=rows, COLS=cols)
    want = torch.cat([(x[:, 0].float() + x[:, 1].float()).bfloat16(), x.amax(dim=1), x.amin(dim=1)])
    bad = _bit_mismatches(out.cpu(), want)
    parts = ", ".join(f"{name} {int(b.sum())}" for name, b in zip(("sum of 2", "max", "min"), bad.view(3, rows)))
    return ProbeResult("bf16_reduce", DEFECT if bad.any() else OK, int(bad.sum()), 3 * rows,
                       f"bitwise vs torch per row of [{rows}, {cols}]: {parts}")


def probe_scalar_mask(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    rows, block, n, live = 4, 16, 11, 3
    x = torch.arange(rows * block, dtype=torch.float32, device=device)
    y = torch.zeros(rows * block, dtype=torch.float32, device=device)
    try:
        _scalar_mask_probe_kernel[(rows,)](x, y, n, live, BLOCK=block)
    except Exception as exc:  # noqa: BLE001 - the defect itself: the load refuses the mask
        return _raised("scalar_mask", exc, y.numel())
    keep = (torch.arange(block) < n)[None, :] & (torch.arange(rows) < live)[:, None]
    want = torch.where(keep.reshape(-1), x.cpu(), torch.full_like(x.cpu(), -1.0))
    bad = _bit_mismatches(y.cpu(), want)
    return ProbeResult("scalar_mask", DEFECT if bad.any() else OK, int(bad.sum()), y.numel(),
                       "load masked by `(offs < n) & (program_id < live)`, bitwise vs the mask applied in torch")


def probe_builtin_alias(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    block = 64
    x = torch.linspace(-10.0, 10.0, block, device=device)
    y, z = torch.empty_like(x), torch.empty_like(x)
    try:
        _builtin_alias_probe_kernel[(1,)](x, y, z, BLOCK=block)
    except Exception as exc:  # noqa: BLE001 - the defect itself: the alias is not the builtin inside a kernel
        return _raised("builtin_alias", exc, block)
    bad = _bit_mismatches(y.cpu(), z.cpu())
    return ProbeResult("builtin_alias", DEFECT if bad.any() else OK, int(bad.sum()), block,
                       "`_ALIASED_EXP = tl.math.exp` called in a kernel, bitwise vs tl.exp in the same kernel")


def probe_range_index(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    n = 8
    y = torch.zeros(n, dtype=torch.int64, device=device)
    try:
        _range_index_probe_kernel[(1,)](y, N=n)
    except Exception as exc:  # noqa: BLE001 - the defect itself: the index is a Python int, with no .to
        return _raised("range_index", exc, n)
    bad = y.cpu() != torch.arange(n, dtype=torch.int64) * 3 + (2**31 - 1)  # in int64: past int32's range
    return ProbeResult("range_index", DEFECT if bad.any() else OK, int(bad.sum()), n,
                       "`i.to(tl.int64) * 3 + (2**31 - 1)` for i in tl.range(0, 8), exact vs torch's int64")


def probe_autotune_driver(device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    n = 100
    x = torch.linspace(-4.0, 4.0, n, device=device)
    y = torch.full_like(x, float("nan"))
    _autotune_probe_kernel.cache.clear()  # tune afresh: a key tuned before is not timed again
    try:
        _autotune_probe_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    except Exception as exc:  # noqa: BLE001 - the defect itself: timing the configs needs a driver
        return _raised("autotune_driver", exc, n)
    bad = _bit_mismatches(y.cpu(), x.cpu() * 2.0)
    chosen = _autotune_probe_kernel.best_config.all_kwargs()
    return ProbeResult("autotune_driver", DEFECT if bad.any() else OK, int(bad.sum()), n,
                       f"a kernel autotuned over BLOCK 16 and 32 (chose {chosen}), bitwise vs torch")


PROBES = {
    "fp8_cast": probe_fp8_cast,
    "fp8_upcast": probe_fp8_upcast,
    "bf16_cast": probe_bf16_cast,
    "bf16_upcast": probe_bf16_upcast,
    "fp8_dot": probe_fp8_dot,
    "bf16_dot": probe_bf16_dot,
    "fp32_dot": probe_fp32_dot,
    "exp": probe_exp,
    "program_order": probe_program_order,
    "grid_order": probe_grid_order,
    "aliasing": probe_aliasing,
    "fp32_div": probe_fp32_div,
    "bf16_arith": probe_bf16_arith,
    "bf16_reduce": probe_bf16_reduce,
    "scalar_mask": probe_scalar_mask,
    "builtin_alias": probe_builtin_alias,
    "range_index": probe_range_index,
    "autotune_driver": probe_autotune_driver,
}
assert tuple(PROBES) == PRIMITIVE_KEYS


def run_probe(key: str, device: torch.device, full: bool, hooks: ConformanceHooks | None = None) -> ProbeResult:
    """One probe (with `hooks`, the full sweep also runs the implementation's workaround); a
    probe that cannot run (a dtype the backend lacks, a compile error) is `skipped` with the
    reason, never an exception."""
    device = normalize_device(torch.device(device))
    try:
        with _on(device), warnings.catch_warnings():
            # garbage from a defective primitive makes numpy warn under the interpreter
            warnings.simplefilter("ignore", RuntimeWarning)
            return PROBES[key](device, full, hooks)
    except Exception as exc:  # noqa: BLE001 - any failure to run is reported, not raised
        return ProbeResult(key, SKIPPED, 0, 0, f"could not run: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")




def gated_probe(key: str) -> str:
    """The status of one probe-gated fix's probe on the CPU interpreter: what
    `diffmoe.interpreter.fixes.install(probe=...)` decides a gated fix by."""
    return run_probe(key, torch.device("cpu"), False).status


def run_probes(keys, device: torch.device, full: bool = False) -> dict[str, ProbeResult]:
    """Probes `keys` (cheap ones unless `full`), keyed by primitive in the order of PRIMITIVES:
    what an implementation derives its workaround switches from (small inputs that still hit
    each known defect)."""
    unknown = sorted(set(keys) - set(PRIMITIVE_KEYS))
    if unknown:
        raise ValueError(f"unknown primitives {unknown}; known: {list(PRIMITIVE_KEYS)}")
    return {k: run_probe(k, device, full) for k in sorted(set(keys), key=PRIMITIVE_KEYS.index)}


# ---- doctor -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DoctorRow:
    primitive: str
    title: str
    status: str
    mismatches: int
    total: int
    workaround: str
    workaround_applied: bool
    workaround_mismatches: int | None
    workaround_total: int | None
    trusted: bool  # ok, or a workaround applied that verified clean
    detail: str
    explanation: str = ""  # why the status is what it is, in words (the mismatch count's meaning included)

    @property
    def shown_status(self) -> str:
        """The table's status cell: "ok (bound)" where results differ but stay within the
        primitive's stated bound (tl.exp), so a nonzero count beside "ok" is visibly meant."""
        return f"{OK} (bound)" if self.status == OK and self.mismatches else self.status


# What a primitive's mismatch count counts and what makes its status ok (the doctor's explanations).
_EXACT = "bit for bit: a mismatch is any result that differs from the reference, and ok means none does"
_DOT_RULE = (f"a mismatch is a result outside the float32 accumulation bound |c - exact| <= gamma_K * sum|a||b| "
             f"(K={DOT_K}, any summation order), and ok means none is")
CRITERIA = {
    **{key: _EXACT for key in ("fp8_cast", "fp8_upcast", "bf16_cast", "bf16_upcast", "program_order", "grid_order",
                               "aliasing", "fp32_div", "bf16_arith", "bf16_reduce", "scalar_mask", "builtin_alias",
                               "autotune_driver")},
    "fp8_dot": _DOT_RULE,
    "bf16_dot": _DOT_RULE,
    "fp32_dot": _DOT_RULE,
    "exp": (f"a mismatch is any result that differs from torch.exp by one float32 ulp or more; ok means none is more "
            f"than the {EXP_MAX_ULP}-ulp bound (EXP_MAX_ULP) away: at most 2^-15 relative, so silu's bf16 result moves "
            f"by at most one step, which the tolerance table allows"),
}


def explain(result: ProbeResult) -> str:
    """Why `result`'s status is what it is, with what its mismatch count means."""
    counted = f"{result.mismatches} of {result.total}"
    rule = CRITERIA.get(result.primitive, _EXACT)
    if result.status == SKIPPED:
        return "skipped: the probe could not run here, so the primitive is unchecked"
    if result.status == OK and result.mismatches:
        return f"ok within the bound: {counted} differ, none beyond what is allowed ({rule})"
    if result.status == OK:
        return f"ok: 0 of {result.total} mismatches ({rule})"
    return f"DEFECT: {counted} mismatches ({rule})"


def _row(result: ProbeResult, switches: Mapping[str, bool], hooks: ConformanceHooks | None) -> DoctorRow:
    """One primitive's row, judged against the implementation's switches (`hooks`: what it does
    about each primitive; None: nothing)."""
    spec = _BY_KEY[result.primitive]
    workaround = hooks.workarounds.get(spec.key) if hooks is not None else None
    unguarded = hooks.unguarded.get(spec.key, spec.unguarded) if hooks is not None else spec.unguarded
    applied = workaround is not None and (workaround.trait is None or bool(switches.get(workaround.trait, False)))
    verified = result.workaround_mismatches == 0 if result.workaround_mismatches is not None else None
    if result.status == OK:
        trusted = True
        text = f"{workaround.description} (applied, not needed here)" if applied else "none needed"
    elif applied:
        trusted = verified is not False  # a workaround shown wrong on this backend is no workaround
        text = workaround.description
        if verified is not None:
            text += f"; verified: {result.workaround_mismatches} of {result.workaround_total} differ"
    else:
        trusted = False
        text = f"NONE: {unguarded}"
        if workaround is not None:
            text = f"NONE (switch {workaround.trait} is off): {unguarded}"
    return DoctorRow(spec.key, spec.title, result.status, result.mismatches, result.total, text, applied,
                     result.workaround_mismatches, result.workaround_total, trusted, result.detail, explain(result))


@dataclass(frozen=True)
class DoctorReport:
    backend: str
    device: str
    versions: dict[str, str]
    traits: Mapping[str, bool]  # the implementation's workaround switches (name -> on), in its order
    rows: tuple[DoctorRow, ...]
    seconds: float
    # why the implementation refuses this backend (e.g. CUDA probes selecting a software fallback)
    refusal: str | None = None
    # on the interpreter: whether diffmoe.interpreter.fixes corrected its numeric defects (an "ok"
    # row there is the fixed interpreter's, not triton's own), and what was patched or why not
    interpreter_fixes: str | None = None

    @property
    def exit_code(self) -> int:
        return 0 if self.refusal is None and all(r.trusted for r in self.rows) else 1

    def to_dict(self) -> dict:
        traits = dict(self.traits)
        return {
            "backend": self.backend,
            "device": self.device,
            "versions": self.versions,
            "traits": traits,
            "ok": self.exit_code == 0,
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
            "refusal": self.refusal,
            "interpreter_fixes": self.interpreter_fixes,
            "primitives": [asdict(r) for r in self.rows],
        }

    def render(self) -> str:
        head = ("primitive", "status", "mismatches", "workaround")
        body = [(r.title, r.shown_status, f"{r.mismatches} of {r.total}", r.workaround) for r in self.rows]
        widths = [max(len(row[c]) for row in [head, *body]) for c in range(3)]

        def line(row) -> str:
            return "  ".join(cell.ljust(widths[c]) for c, cell in enumerate(row[:3])) + "  " + row[3]

        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        on = [name for name, value in self.traits.items() if value]
        lines = [
            f"backend: {self.backend} on {self.device} ({versions})",
            *([f"interpreter fixes: {self.interpreter_fixes}"] if self.interpreter_fixes is not None else []),
            f"workarounds on: {', '.join(on) if on else 'none'}",
            "",
            line(head),
            "  ".join("-" * w for w in widths) + "  " + "-" * len(head[3]),
            *(line(row) for row in body),
            "",
            "details:",
            *(f"  {r.title}: {r.explanation}. {r.detail}" for r in self.rows),
            "",
        ]
        untrusted = [r.title for r in self.rows if not r.trusted]
        if self.refusal is not None:
            lines.append(f"verdict: REFUSED: {self.refusal}")
        elif untrusted:
            lines.append(f"verdict: NOT trusted: {', '.join(untrusted)} (defect or unchecked, no working workaround)")
        else:
            lines.append(f"verdict: trusted: every primitive is ok or has its workaround applied, none shown wrong here ({self.seconds:.1f} s)")
        return "\n".join(lines)
