"""Exact fixes of the Triton interpreter's numeric defects, made once, at the interpreter.

Under `TRITON_INTERPRET=1` every Triton op runs as numpy code in
`triton.runtime.interpreter.InterpreterBuilder`. In triton 3.9 a few of those get the numbers
wrong (../shared/DESIGN.md, "Facts measured here"; Triton PR #11897):

  * float32 -> float8_e4m3fn (`create_fp_to_fp`, the generic `_convert_float`): the mantissa
    carry is dropped, ties round away from zero, nothing saturates, NaN is lost;
  * float32 -> bfloat16 (`create_fp_trunc` -> `cast_impl`): truncates, whatever rounding
    mode was asked for;
  * bfloat16 -> float32 (`create_fp_ext` -> `cast_impl`): subnormals come out wrong;
  * float8_e4m3fn -> float32 (`create_fp_to_fp`): the NaN codes (S.1111.111) read as +-480;
  * `create_dot` on bf16 operands multiplies their raw uint16 storage as integers (garbage),
    and on fp8 operands widens them with the same NaN-losing conversion.

One more replacement is a choice, not a fix: `create_exp` of float32 is torch's float32 exp
(numpy's, which the interpreter calls, is a different function: it differs from torch's in 39%
of 2^20 normal samples, from the correctly rounded exp in 39%, torch's in 1%). The reference
computes silu as x / (1 + torch.exp(-x)) and the kernels as div_rn(x, 1 + tl.exp(-x)), so on
the interpreter the two are one function and the fused act+quant stage is judged bitwise
(diffmoe.tolerance.table); CUDA's tl.exp (ex2.approx of x * log2(e)) is not, and keeps its rule.

Each of these loses nothing before the builder method is called (the operands arrive as their
exact bit patterns), so each is corrected exactly there: `install()` replaces those builder
methods for exactly those dtype pairs with numpy code computing what CUDA computes (the PTX
Triton 3.9 emits for sm_90, compiled here without a GPU: `cvt.rn.satfinite.e4m3x2.f32`,
`cvt.rn.bf16.f32`, `cvt.f32.bf16`, `cvt.rn.f16x2.e4m3x2` + `cvt.f32.f16`), and the dots as
an IEEE float32 dot of the exactly widened operands, one output row at a time as every
interpreted dot (diffmoe.interpreter.dot_rows, installed beneath these fixes). Every other dtype pair, rounding mode and
op goes to triton's own implementation unchanged.

The results are, bit for bit, what the kernels' software workarounds (optimized/kernels:
`round_to_bf16_grid`, `round_to_e4m3_grid` + the NaN code written by bits, `bf16_to_f32`,
`e4m3_to_f32` + the float32 dot) compute under the unpatched interpreter
(tests/interpreter/test_interpreter_fixes.py checks every bf16 pattern, every e4m3 code and a large
float32 sample), so with the fixes in place the conformance probes find those primitives right
and the kernels run as the plain CUDA kernels. Where NaN bits are concerned (no backend
contract, the probes compare NaN to any NaN) they follow the software paths: float32 -> bf16
keeps the NaN's sign and top payload and sets the quiet bit; float32 -> e4m3 gives the NaN
code with the NaN's sign (as torch); e4m3 NaN codes widen to the canonical quiet NaN 0x7FC00000.
Finite float32 beyond +-448 and +-Inf saturate to +-448 in the e4m3 cast, as `satfinite` does
(the kernels clamp before they cast, so none of them reaches it).

Probe-gated fixes (what a third-party kernel needs: lmdeploy 0.18's blocked-FP8 MoE, peers/):
six more defects of triton 3.9's interpreter, each patched only where its `diffmoe doctor`
probe finds it (run once per process on triton's own methods; the caller passes the probe,
`install(probe=diffmoe.backend.conformance.gated_probe)`, as optimized/, peers/ and the
families do: the interpreter layer sits below the backend's probes):

  * `bf16_arith`: bf16 add/sub/mul, min/max, comparisons and negation run on the raw uint16
    storage (triton-lang/triton#5424): fixed in `binary_op` / `create_fneg` as the float32 op
    of the exactly widened operands, rounded once to nearest even (for +, -, * that is the
    correctly rounded bf16 result CUDA's `add/mul.rn.bf16` gives: float32 has 24 >= 2*8+2 bits,
    so the double rounding is innocuous); negation flips the sign bit. bf16 division and fmod
    stay triton's (CUDA divides bf16 through an approximate float32 division not modelled here);
  * `bf16_reduce`: `tl.sum` of bf16 adds the raw bits (#11584): fixed in `ReduceOps.sum` as a
    left-to-right sequence of bf16-rounded adds (exact for two operands in any order; longer
    sums follow the in-thread order of Triton's lowering, which a reduction spread over lanes
    need not). `tl.max` / `tl.min` widen floats to float32 before reducing (standard.py), so
    they are right already: the probe checks them and nothing patches them;
  * `scalar_mask`: a comparison's handle keeps its operands' dtype, so a scalar comparison
    splat into a block (`mask & (i < M)`) becomes an int32 mask and a load raises "mask has
    unsupported dtype": the comparison builder methods label their result int1, as the IR does;
  * `builtin_alias`: a module-level alias of a Triton builtin (`fast_expf = tl.math.exp`) is not
    patched by `_patch_lang` (it patches the tl modules only) and raises "_semantic argument
    must be provided" inside a kernel: the kernel's globals bound to builtins are patched in
    the same launch scope;
  * `range_index`: a `tl.range` loop index is a Python int under the interpreter (a tensor compiled), so
    a kernel converting it (`expert_idx.to(tl.int64)`, unsloth's grouped GEMM) raises "'int' object
    has no attribute 'to'": the index is an int that also converts as the compiled int32 index does
    (its arithmetic stays an int's, so the kernels that ran before run as they did);
  * `autotune_driver`: a `@triton.autotune` kernel with several configs times them with the
    active driver's benchmarker, and under the interpreter on a machine without a GPU there is
    none ("0 active drivers"): `Autotuner.do_bench` gives an untimed benchmarker there (a
    kernel's own `do_bench` is kept), so the first config left after Triton's pruning runs, as
    Triton picks a single config untimed. The kernel runs one of its own configs unchanged and
    `best_config` names it; timing on a GPU may pick another, whose bits can differ where the
    configs tile a reduction differently.

`suspended()` suspends the cast and dot fixes only (the software paths model exactly those; the
row-by-row product beneath them stays, as no software path models a row's dependence on its
neighbours);
`suspended(gated=True)` suspends the probe-gated ones too (the tests showing their defects).

The race recorder (diffmoe.interpreter.address_recorder) hooks other builder methods (loads,
stores, atomics) and the grid loop; the two coexist in either order.

The builder methods replaced are interpreter internals, not a Triton API: `install()` patches
only the Triton version it was written and tested against (SUPPORTED_TRITON) and, anywhere
else, patches nothing and says why. Triton is imported only when `install()` (or `status()`)
is called.

Longer than 400 lines because the fixes share one install state, one pin and the exact
conversions, and the probe-gated ones reuse the cast fixes' widening and rounding.

Owns the patched interpreter methods and their install state. Must not change a result the software paths would not give.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

from diffmoe.interpreter import dot_rows
from diffmoe.interpreter.dot_rows import matmul_by_rows
from diffmoe.interpreter.triton_pin import triton_release

SUPPORTED_TRITON = (3, 9)
# InterpreterBuilder methods replaced (their parameters after self, checked before patching)
PATCHED_METHODS = {
    "cast_impl": ("src", "dst_type"),
    "create_fp_to_fp": ("src", "dst_type", "rounding_mode"),
    "create_dot": ("a", "b", "d", "input_precision", "max_num_imprecise_acc"),
    "create_exp": ("arg",),
}
E4M3_MAX = 448.0
DEFECT = "DEFECT"  # a probe's status when it finds its defect (diffmoe.backend.conformance reports in these)
CANONICAL_NAN_F32 = 0x7FC00000

_lock = threading.Lock()
_originals: dict[str, object] = {}
_last: FixStatus | None = None
_suspended = 0  # > 0 inside suspended(): install() patches nothing


@dataclass(frozen=True)
class FixStatus:
    installed: bool  # the fixes are in place (now or from an earlier call)
    reason: str  # what was patched, or why nothing was


def _triton_problem() -> str | None:
    """Why the fixes cannot be installed here, or None."""
    version, major_minor, broken = triton_release()
    if broken is not None:  # no triton, nothing to fix
        return f"triton is not importable: {broken}"
    if major_minor != SUPPORTED_TRITON:
        return (f"interpreter fixes are written for triton {SUPPORTED_TRITON[0]}.{SUPPORTED_TRITON[1]}.x, found {version}: "
                "nothing patched (the kernels' software workarounds stay on wherever the conformance probes find a defect)")
    try:
        import inspect

        from triton.runtime import interpreter
    except Exception as exc:  # noqa: BLE001
        return f"the Triton interpreter is not importable: {exc}"
    for name, params in PATCHED_METHODS.items():
        method = getattr(interpreter.InterpreterBuilder, name, None)
        if method is None:
            return f"triton {version} InterpreterBuilder has no {name}: nothing patched"
        names = tuple(inspect.signature(method).parameters)[1:]
        if names != params:
            return f"triton {version} InterpreterBuilder.{name}{names} is not {name}{params}: nothing patched"
    for name in ("TensorHandle", "_ir"):
        if not hasattr(interpreter, name):
            return f"triton {version} interpreter has no {name}: nothing patched"
    return None


# ---- the exact conversions (numpy arrays of the interpreter's storage types) ---------------


def f32_to_bf16_bits(x):
    """float32 array -> uint16 bfloat16 bits, round to nearest even (overflow to Inf, subnormals
    rounded like any value); a NaN keeps its sign and top 7 payload bits and is made quiet."""
    import numpy as np

    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    quiet_nan = (bits & np.uint32(0xFFFF0000)) | np.uint32(0x00400000)
    out = np.where(x != x, quiet_nan, rounded)
    return (out >> np.uint32(16)).astype(np.uint16)


def bf16_bits_to_f32(bits):
    """uint16 bfloat16 bits -> float32, exact (every pattern: subnormals, Inf and NaN bits kept)."""
    import numpy as np

    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_e4m3_bits(x):
    """float32 array -> uint8 float8_e4m3fn codes as `cvt.rn.satfinite.e4m3x2.f32`: round to
    nearest even, finite values beyond +-448 and +-Inf to +-448; NaN to the NaN code S.1111.111
    with the NaN's sign (as torch's cast writes it)."""
    import numpy as np
    import torch

    flat = np.array(x, dtype=np.float32, order="C", copy=True).reshape(-1)  # torch wants writable memory
    t = torch.from_numpy(flat).clamp(-E4M3_MAX, E4M3_MAX)  # clamp keeps NaN; torch's cast is RNE
    return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(np.shape(x))


_E4M3_TABLE = None


def e4m3_table():
    """float32 value of each of the 256 e4m3fn codes; the NaN codes are the quiet NaN 0x7FC00000."""
    global _E4M3_TABLE
    if _E4M3_TABLE is None:
        import numpy as np
        import torch

        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        values = codes.view(torch.float8_e4m3fn).float().numpy().copy()
        nan = (np.arange(256) & 0x7F) == 0x7F
        values.view(np.uint32)[nan] = CANONICAL_NAN_F32
        values.setflags(write=False)
        _E4M3_TABLE = values
    return _E4M3_TABLE


def e4m3_bits_to_f32(bits):
    """uint8 e4m3fn codes -> float32, exact; NaN codes to 0x7FC00000. Keeps the input's memory
    layout (a dot's BLAS call sees the same strides the kernels' own decode would give it)."""
    import numpy as np

    bits = np.asarray(bits, dtype=np.uint8)
    out = np.empty_like(bits, dtype=np.float32)
    np.take(e4m3_table(), bits, out=out)
    return out


def torch_exp_f32(x):
    """float32 array -> torch's float32 exp of it, elementwise (the same bits whatever the
    array's shape or an element's position: measured on 2^20 values against one-element calls)."""
    import numpy as np
    import torch

    flat = np.array(x, dtype=np.float32, order="C", copy=True)  # torch wants writable memory
    return torch.from_numpy(flat).exp().numpy()


# ---- the replacement builder methods ---------------------------------------------------------


def _make_patches(interpreter):
    import triton.language as tl

    TensorHandle = interpreter.TensorHandle
    orig_cast_impl = _originals["cast_impl"]
    orig_fp_to_fp = _originals["create_fp_to_fp"]
    orig_dot = _originals["create_dot"]
    rtne = interpreter._ir.ROUNDING_MODE.RTNE

    def cast_impl(self, src, dst_type):
        s, d = src.dtype.scalar, dst_type.scalar
        if s == tl.float32 and d == tl.bfloat16:  # create_fp_trunc: RTNE is the only mode routed here
            return TensorHandle(f32_to_bf16_bits(src.data), d)
        if s == tl.bfloat16 and d == tl.float32:  # create_fp_ext
            return TensorHandle(bf16_bits_to_f32(src.data), d)
        return orig_cast_impl(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        s, d = src.dtype.scalar, dst_type.scalar
        if s == tl.float32 and d == tl.float8e4nv and rounding_mode == rtne:
            return TensorHandle(f32_to_e4m3_bits(src.data), d)
        if s == tl.float8e4nv and d == tl.float32:
            return TensorHandle(e4m3_bits_to_f32(src.data), d)
        if s == tl.float32 and d == tl.bfloat16 and rounding_mode == rtne:
            return TensorHandle(f32_to_bf16_bits(src.data), d)
        return orig_fp_to_fp(self, src, dst_type, rounding_mode)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        sa, sb = a.dtype.scalar, b.dtype.scalar
        if sa == tl.bfloat16 and sb == tl.bfloat16:
            a_data, b_data = bf16_bits_to_f32(a.data), bf16_bits_to_f32(b.data)
        elif sa == tl.float8e4nv and sb == tl.float8e4nv:
            a_data, b_data = e4m3_bits_to_f32(a.data), e4m3_bits_to_f32(b.data)
        else:
            return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        # as triton's own float32 path: products and sums in float32 (exact products for these
        # operands), the accumulator added after; row by row as every interpreted dot (dot_rows)
        return TensorHandle(matmul_by_rows(a_data, b_data, d.data.dtype) + d.data, d.dtype.scalar)

    orig_exp = _originals["create_exp"]

    def create_exp(self, arg):
        if arg.dtype.scalar != tl.float32:
            return orig_exp(self, arg)
        return TensorHandle(torch_exp_f32(arg.data), arg.dtype.scalar)

    cast_impl.__wrapped__ = orig_cast_impl
    create_fp_to_fp.__wrapped__ = orig_fp_to_fp
    create_dot.__wrapped__ = orig_dot
    create_exp.__wrapped__ = orig_exp
    return {"cast_impl": cast_impl, "create_fp_to_fp": create_fp_to_fp, "create_dot": create_dot, "create_exp": create_exp}


def install(probe: Callable[[str], str] | None = None) -> FixStatus:
    """Patch the interpreter (idempotent; thread-safe). Never raises: on a Triton version the
    fixes were not written for it patches nothing and the status says why. `probe` (key -> status,
    diffmoe.backend.conformance.gated_probe) decides the probe-gated fixes; the first one given is
    kept for the process, and without one they are left out until a call gives it."""
    global _last, _probe
    with _lock:
        if probe is not None and _probe is None:
            _probe = probe
        if _suspended:
            return FixStatus(False, "suspended (interpreter_fixes.suspended(): the defects are wanted)")
        if _originals and _last is not None and _last.reason.endswith(NO_PROBE) and _probe is not None:
            _last = _installed_status(_install_gated_locked())  # installed before a probe was given
        if _originals or _last is not None:
            return _last  # already installed, or already refused (the version does not change)
        problem = _triton_problem()
        if problem is not None:
            _last = FixStatus(False, problem)
            return _last
        from triton.runtime import interpreter

        cls = interpreter.InterpreterBuilder
        dot_rows.install()  # beneath the fixes: what uninstall() and suspended() put back keeps it
        for name in PATCHED_METHODS:
            _originals[name] = cls.__dict__[name]
        for name, fn in _make_patches(interpreter).items():
            setattr(cls, name, fn)
        _last = _installed_status(_install_gated_locked())
        return _last


def _installed_status(gated: str) -> FixStatus:
    import triton

    return FixStatus(True, "float32<->bf16 and float32<->e4m3fn casts and the bf16 and fp8 dots of the "
                           f"triton {triton.__version__} interpreter computed exactly, float32 exp as torch's; {gated}")


def uninstall(keep_gated: bool = False) -> None:
    """Put triton's own methods back (tests that show the defects use it); `keep_gated`: the
    probe-gated fixes stay."""
    global _last
    with _lock:
        _last = None
        if not keep_gated:
            _uninstall_gated_locked()
        if not _originals:
            return
        from triton.runtime import interpreter

        for name, original in _originals.items():
            setattr(interpreter.InterpreterBuilder, name, original)
        _originals.clear()


@contextmanager
def suspended(gated: bool = False):
    """Run a block on triton's own (defective) cast and dot methods, e.g. a mutant that models a
    kernel ignoring a backend defect; install() (and so optimized.launch) patches nothing inside
    it. The probe-gated fixes stay in place (installed if they were not: no software path models
    those defects) unless `gated`, which suspends them too. Everything is back afterwards as it
    was before."""
    global _suspended
    was, was_gated = installed(), gated_installed()
    with _lock:
        _suspended += 1
    uninstall(keep_gated=not gated)
    if not gated:
        with _lock:
            _install_gated_locked()
    try:
        yield
    finally:
        with _lock:
            _suspended -= 1
        if was and not _suspended:
            install()
        elif was_gated and not _suspended:
            with _lock:
                _install_gated_locked()


def installed() -> bool:
    return bool(_originals)


def status() -> FixStatus:
    """Whether the fixes are in place, and why not where they are not (imports triton)."""
    if _originals:
        return _last
    if _suspended:
        return FixStatus(False, "suspended (interpreter_fixes.suspended(): the defects are wanted)")
    problem = _triton_problem()
    return FixStatus(False, problem or "install() has not run in this process")


# ---- the probe-gated fixes (module docstring) ------------------------------------------------

GATED_FIXES = ("bf16_arith", "bf16_reduce", "scalar_mask", "builtin_alias", "range_index", "autotune_driver")  # probe keys
_gated_originals: dict[tuple[int, str], tuple[object, str, object]] = {}  # (id(owner), name) -> (owner, name, original)
_gated_verdicts: dict[str, str] = {}  # probe key -> its status on triton's own methods (once per process)
_gated_reason: str | None = None  # what the last gated install did, or why it patched nothing
# The probe of a gated fix's defect, given by the caller (issue 44: the interpreter layer does not
# reach up into the backend's conformance probes; optimized/, peers/ and the families pass
# diffmoe.backend.conformance.gated_probe): key -> the probe's status on triton's own methods.
_probe: Callable[[str], str] | None = None
NO_PROBE = "probe-gated fixes not checked: no probe given (install(probe=diffmoe.backend.conformance.gated_probe))"


def _gated_problem() -> str | None:
    """Why the probe-gated fixes cannot be installed here, or None."""
    version, major_minor, broken = triton_release()
    if broken is not None:
        return f"triton is not importable: {broken}"
    if major_minor != SUPPORTED_TRITON:
        return (f"probe-gated fixes are written for triton {SUPPORTED_TRITON[0]}.{SUPPORTED_TRITON[1]}.x, found "
                f"{version}: nothing patched")
    import inspect

    from triton.runtime import interpreter

    wanted = {
        (interpreter.InterpreterBuilder, "binary_op"): ("lhs", "rhs", "op"),
        (interpreter.InterpreterBuilder, "create_fneg"): ("input",),
        (getattr(interpreter, "ReduceOps", None), "sum"): ("input",),
    }
    for (owner, name), params in wanted.items():
        method = getattr(owner, name, None) if owner is not None else None
        if method is None:
            return f"triton {version} interpreter has no {name}: probe-gated fixes not installed"
        names = tuple(inspect.signature(method).parameters)[1:]
        if names != params:
            return f"triton {version} interpreter {name}{names} is not {name}{params}: probe-gated fixes not installed"
    for name in ("_patch_lang", "_patch_lang_core", "_patch_attr", "interpreter_builder", "TensorHandle"):
        if not hasattr(interpreter, name):
            return f"triton {version} interpreter has no {name}: probe-gated fixes not installed"
    from functools import cached_property

    from triton.runtime import autotuner

    # the autotune fix replaces the benchmarker lookup; Autotuner.__init__ keeps a user's own as _do_bench
    if not isinstance(vars(autotuner.Autotuner).get("do_bench"), cached_property) or \
            "do_bench" not in inspect.signature(autotuner.Autotuner.__init__).parameters:
        return f"triton {version} Autotuner.do_bench is not the benchmarker lookup it was: probe-gated fixes not installed"
    return None


class _Property(property):
    """A property that can carry `__wrapped__` (the install records each fix's original there)."""


def _untimed(kernel_call, quantiles=None):
    """The interpreter's benchmarker: every config takes the same time, so `Autotuner.run` keeps
    the first config left after Triton's own pruning (`builtins.min` returns the first of equal
    timings), the choice triton already makes untimed for a single config. A time under the
    interpreter says nothing of the kernel, and no config runs just to be timed."""
    return [0.0] * len(quantiles) if quantiles else 0.0


class _LoopIndex(int):
    """A `tl.range` loop index under the interpreter: the int the interpreter yields (every
    arithmetic stays a Python int's, as before), which also converts as the compiled loop's int32
    index does: `i.to(tl.int64)` (unsloth's grouped GEMM: `expert_idx.to(tl.int64) * N`, issue 49)."""

    def to(self, dtype, *args, **kwargs):
        from triton.runtime.interpreter import TensorHandle
        import numpy as np
        import triton.language as tl

        base, np_base = (tl.int32, np.int32) if -2**31 <= self < 2**31 else (tl.int64, np.int64)
        return tl.core.tensor(TensorHandle(np.array(int(self), dtype=np_base), base), base).to(dtype, *args, **kwargs)


class _Globals:
    """A function's globals dict as an object, so that triton's patch scope can set and restore
    names in it as it does module attributes."""

    def __init__(self, namespace: dict):
        object.__setattr__(self, "_namespace", namespace)

    def __getattr__(self, name):
        try:
            return self._namespace[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self._namespace[name] = value

    def __delattr__(self, name):
        del self._namespace[name]


def _gated_patches(interpreter, key: str) -> list[tuple[object, str, object]]:
    """(owner, attribute, replacement) of the fix for probe `key`."""
    import numpy as np
    import triton.language as tl

    TensorHandle = interpreter.TensorHandle
    builder, reduce_ops = interpreter.InterpreterBuilder, interpreter.ReduceOps
    bf16 = tl.bfloat16
    if key == "bf16_arith":
        rounded = {np.add, np.subtract, np.multiply, np.minimum, np.maximum, np.fmin, np.fmax}
        compared = {np.less, np.less_equal, np.greater, np.greater_equal, np.equal, np.not_equal}
        orig_binary, orig_neg = builder.binary_op, builder.create_fneg

        def binary_op(self, lhs, rhs, op):
            if lhs.dtype.scalar == bf16 and rhs.dtype.scalar == bf16 and (op in rounded or op in compared):
                out = op(bf16_bits_to_f32(lhs.data), bf16_bits_to_f32(rhs.data))
                if op in compared:
                    return TensorHandle(out, lhs.dtype.scalar)  # labelled as triton labels it
                return TensorHandle(f32_to_bf16_bits(out), bf16)
            return orig_binary(self, lhs, rhs, op)

        def create_fneg(self, input):
            if input.dtype.scalar == bf16:
                return TensorHandle(np.asarray(input.data, dtype=np.uint16) ^ np.uint16(0x8000), bf16)
            return orig_neg(self, input)

        return [(builder, "binary_op", binary_op), (builder, "create_fneg", create_fneg)]
    if key == "bf16_reduce":
        orig_sum = reduce_ops.sum

        def sum_(self, input):
            if input.dtype != bf16:
                return orig_sum(self, input)
            data = bf16_bits_to_f32(input.handle.data)
            axis = self.axis
            if axis is None:
                data, axis = data.reshape(-1), 0
            rows = np.moveaxis(data, axis, 0)
            acc = rows[0].copy()
            for row in rows[1:]:  # each combine one bf16 add, rounded
                acc = bf16_bits_to_f32(f32_to_bf16_bits(acc + row))
            bits = f32_to_bf16_bits(acc)
            if self.keep_dims:
                bits = np.expand_dims(bits, axis) if self.axis is not None else bits.reshape((1,) * input.handle.data.ndim)
            return self.to_tensor(bits, input.dtype)

        return [(reduce_ops, "sum", sum_)]
    if key == "scalar_mask":
        patches = []
        for name in sorted(vars(builder)):
            if name.startswith(("create_icmp", "create_fcmp")):
                original = getattr(builder, name)

                def compare(self, lhs, rhs, _original=original):
                    return TensorHandle(_original(self, lhs, rhs).data, tl.int1)

                patches.append((builder, name, compare))
        return patches
    if key == "builtin_alias":
        orig_patch_lang = interpreter._patch_lang
        is_builtin = tl.core.is_builtin

        def _patch_lang(fn):
            scope = orig_patch_lang(fn)
            holder = _Globals(fn.__globals__)
            for name, value in list(fn.__globals__.items()):
                if is_builtin(value):  # a module-level alias (fast_expf = tl.math.exp): patched in the same scope
                    interpreter._patch_attr(holder, name, value, interpreter.interpreter_builder, scope)
            return scope

        return [(interpreter, "_patch_lang", _patch_lang)]
    if key == "range_index":
        orig_core = interpreter._patch_lang_core

        def _patch_lang_core(lang, scope):
            orig_core(lang, scope)
            plain = lang.range  # the interpreter's: a Python range of ints

            def range_(*args, **kwargs):
                return map(_LoopIndex, plain(*args, **kwargs))

            scope.set_attr(lang, "range", range_)

        return [(interpreter, "_patch_lang_core", _patch_lang_core)]
    if key == "autotune_driver":
        from triton import knobs
        from triton.runtime import autotuner

        lookup = vars(autotuner.Autotuner)["do_bench"].func  # triton's: the active driver's benchmarker

        def do_bench(self):
            # a plain property, never cached on the instance: uninstalling puts triton's lookup
            # back for every autotuner, those already tuned included
            if self._do_bench is None and knobs.runtime.interpret:
                return _untimed
            return lookup(self)

        return [(autotuner.Autotuner, "do_bench", _Property(do_bench))]
    raise ValueError(f"unknown probe-gated fix {key!r}; known: {list(GATED_FIXES)}")


def _install_gated_locked() -> str:
    """Each probe-gated fix whose probe finds the defect (caller holds _lock); returns what was done."""
    global _gated_reason
    if _gated_originals or _gated_reason is not None:
        return _gated_reason or ""
    problem = _gated_problem()
    if problem is not None:
        _gated_reason = problem
        return problem
    if _probe is None and not all(key in _gated_verdicts for key in GATED_FIXES):
        return NO_PROBE  # not remembered: a later install(probe=...) checks them
    from triton.runtime import interpreter

    applied, clean = [], []
    for key in GATED_FIXES:
        if key not in _gated_verdicts:  # triton's own methods: the gated patches are not in place yet
            _gated_verdicts[key] = _probe(key)
        if _gated_verdicts[key] != DEFECT:
            clean.append(f"{key} {_gated_verdicts[key]}")
            continue
        for owner, name, new in _gated_patches(interpreter, key):
            original = vars(owner)[name] if name in vars(owner) else getattr(owner, name)
            new.__wrapped__ = original
            _gated_originals[(id(owner), name)] = (owner, name, original)
            setattr(owner, name, new)
        applied.append(key)
    _gated_reason = (f"probe-gated fixes applied where the doctor's probe found the defect: {', '.join(applied) or 'none'}"
                     + (f" (not needed: {', '.join(clean)})" if clean else ""))
    return _gated_reason


def _uninstall_gated_locked() -> None:
    global _gated_reason
    _gated_reason = None
    for owner, name, original in reversed(list(_gated_originals.values())):
        setattr(owner, name, original)
    _gated_originals.clear()


def install_gated(probe: Callable[[str], str] | None = None) -> str:
    """The probe-gated fixes alone (idempotent): a peer adapter that needs them calls install()
    and may check this."""
    global _probe
    with _lock:
        if probe is not None and _probe is None:
            _probe = probe
        if _suspended:
            return "suspended"
        return _install_gated_locked()


def gated_installed() -> tuple[str, ...]:
    """The probe-gated fixes in place now."""
    with _lock:
        return tuple(k for k in GATED_FIXES if k in _applied_keys())


def _applied_keys() -> set[str]:
    return {k for k, v in _gated_verdicts.items() if v == DEFECT} if _gated_originals else set()
