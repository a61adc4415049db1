"""The interpreter fast path (diffmoe/interpreter/fast_path.py): helpers skip re-patching a language
already patched, and nothing an interpreted kernel computes changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import optimized  # noqa: F401 - picks the interpreter without a GPU, installs the fast path
from diffmoe.interpreter import fast_path as interpreter_speed
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.inputs import make_problem
from diffmoe.interpreter.triton_pin import triton_release
from hang_bounds import SUBPROCESS_HANG_S

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter only")

CONFIG = MoEConfig(num_tokens=5, num_experts=3, topk=2, hidden=128, inter=128, quant="fp8-block", fused=True, seed=3)
# 99 routed rows: BLOCK_M = 32 (optimized/tiles.py), so a GEMM tile's dot (32x128 by 128x128) is
# above OpenBLAS's threading threshold (65536 * 4 multiply-adds) and would run on two threads
THREADED_DOTS = MoEConfig(num_tokens=33, num_experts=4, topk=3, hidden=128, inter=128, quant="fp8-token", fused=True, seed=5)


def run_once(config: MoEConfig = CONFIG) -> tuple[torch.Tensor, ...]:
    impl = optimized.make_implementation(config)
    result = impl.run(make_problem(config), impl.allocate_workspaces())
    return (result.output, *(t for _, t in sorted(result.intermediates.items()) if isinstance(t, torch.Tensor)))


@pytest.fixture
def patch_walks(monkeypatch):
    from triton.runtime import interpreter

    walks = []
    original = interpreter._patch_lang

    def counting(fn):
        walks.append(fn)
        return original(fn)

    monkeypatch.setattr(interpreter, "_patch_lang", counting)
    return walks


def test_helpers_skip_the_walk_and_the_bits_do_not_change(patch_walks):
    assert triton_release()[1] == interpreter_speed.SUPPORTED_TRITON, "the fast path is pinned to the tested release"
    assert interpreter_speed.installed()
    fast = run_once()
    fast_walks = len(patch_walks)
    interpreter_speed.uninstall()
    try:
        patch_walks.clear()
        slow = run_once()
        slow_walks = len(patch_walks)
    finally:
        assert interpreter_speed.install() == "installed"
    # one walk per launch is left; triton's own path walks again at every helper call
    assert fast_walks < slow_walks / 2, (fast_walks, slow_walks)
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_install_is_idempotent():
    assert interpreter_speed.install() == "installed" and interpreter_speed.install() == "installed"


def test_the_overflow_sanitizer_is_skipped_only_while_its_assertions_are_off():
    """With debug off the sanitizer's device_assert checks nothing; install turns it off then,
    uninstall puts it back, and the bits are those of the sanitizing interpreter (first test)."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    assert not builder.options.debug and not builder.options.sanitize_overflow
    interpreter_speed.uninstall()
    try:
        assert builder.options.sanitize_overflow, "uninstall puts triton's option back"
        debug_options = builder.options.__class__(debug=True)
        builder.options = debug_options
        interpreter_speed.install()
        assert builder.options is debug_options and builder.options.sanitize_overflow, "debug keeps its checks"
        interpreter_speed.uninstall()
        builder.options = builder.options.__class__()
    finally:
        assert interpreter_speed.install() == "installed"
    assert not builder.options.sanitize_overflow


def test_numpy_dtypes_come_from_a_memo_of_the_interpreters_own_answers():
    """Every Triton dtype, as a scalar, a block and a pointer, maps to what triton's own
    _get_np_dtype says; an unknown dtype still raises as it does; uninstall puts it back."""
    from triton.runtime import interpreter

    tl = interpreter.tl
    fast = interpreter._get_np_dtype
    original = fast.__wrapped__
    assert fast is not original, "install memoizes the lookup"
    scalars = [tl.int1, tl.float16, tl.float32, tl.float64, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32,
               tl.uint32, tl.int64, tl.uint64, tl.bfloat16, tl.float8e5, tl.float8e5b16, tl.float8e4nv,
               tl.float8e4b8, tl.float8e4b15]
    for dt in scalars:
        for form in (dt, tl.block_type(dt, [4]), tl.pointer_type(dt), tl.block_type(tl.pointer_type(dt), [2])):
            assert fast(form) == original(form), form
            assert fast(form) == original(form), f"{form}, answered from the memo"
    with pytest.raises(KeyError):
        original(tl.void)
    with pytest.raises(KeyError):
        fast(tl.void)
    interpreter_speed.uninstall()
    try:
        assert interpreter._get_np_dtype is original
    finally:
        assert interpreter_speed.install() == "installed"
    assert interpreter._get_np_dtype is not original


@pytest.fixture
def blas_threads():
    threads = interpreter_speed.numpy_blas_threads()
    assert threads is not None, "numpy's bundled OpenBLAS is found (the venv's numpy wheel carries it)"
    get, put = threads
    before = get()
    yield get, put
    put(before)


@pytest.fixture
def dot_threads(monkeypatch, blas_threads):
    """The BLAS thread count every interpreted dot saw."""
    from triton.runtime import interpreter

    get, _ = blas_threads
    seen = []
    original = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, *args, **kwargs):
        seen.append(get())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
    return seen


def test_dots_run_on_one_blas_thread_and_the_count_is_put_back(blas_threads, dot_threads):
    """The pin, on a whole run; its bits are triton's own interpreter's under the same BLAS
    configuration (one thread: OpenBLAS may round differently on two, see the probe above)."""
    get, put = blas_threads
    put(2)
    fast = run_once(THREADED_DOTS)
    assert dot_threads and set(dot_threads) == {1}, "every dot of a launch sees one thread"
    assert get() == 2, "the count is put back after the launch"
    interpreter_speed.uninstall()
    try:
        dot_threads.clear()
        run_once(CONFIG)
        assert set(dot_threads) == {2}, "triton's own launch keeps numpy's threads"
        put(1)
        slow = run_once(THREADED_DOTS)
    finally:
        assert interpreter_speed.install() == "installed"
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE: machines of this kind set them on some processors (AMD
# EPYC measured). With Haswell's kernels OpenBLAS gave different bits on one thread and on two for
# 15 of the probe's 18 tile products (16x128 @ 128x256 at scale 1e-3 among them); unset, 0 of 18.
BLAS_CONFIGURATIONS = {
    "OPENBLAS_CORETYPE=Haswell": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"},
    "OPENBLAS-unset": {},
}


@pytest.mark.parametrize("configuration", list(BLAS_CONFIGURATIONS))
def test_the_fast_paths_bits_do_not_depend_on_the_blas_thread_count(configuration):
    """What the product guarantees on every machine: an interpreted dot under the fast path
    gives the same bits whatever numpy's thread count (it pins one), and the same bits as
    triton's own interpreter under the same BLAS configuration (one thread). Whether OpenBLAS
    itself depends on the thread count is a property of the build and its configuration: the
    probe measures it, and where it does (Haswell's kernels, measured here) this test shows the
    pin is what keeps the bits fixed. Each configuration runs in a process of its own, whatever
    this process's environment (tests/support/blas_threads_probe.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    env.update(BLAS_CONFIGURATIONS[configuration])
    probe = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "blas_threads_probe.py")],
                           env=env, capture_output=True, text=True, timeout=SUBPROCESS_HANG_S)
    assert probe.returncode == 0, probe.stderr
    counts = json.loads(probe.stdout.strip().splitlines()[-1])
    if not counts["openblas"]:
        pytest.skip("numpy has no OpenBLAS loaded: the fast path pins nothing")
    assert counts["fast_path"] == 0, f"the fast path's bits changed with numpy's thread count: {counts}"
    assert counts["fast_vs_triton"] == 0, f"the fast path differs from triton's interpreter on one thread: {counts}"
    # "triton" is measured, not claimed: its dots are diffmoe's row-by-row products (one gemv per
    # row, diffmoe/interpreter/dot_rows.py), not numpy's whole-tile gemm, so they need not differ
    # where numpy's do (under Haswell's kernels: numpy 15 of 18, triton 0 of 18, measured here)


def _built_by_triton(cls, *args):
    obj = cls.__new__(cls)
    cls.__init__.__wrapped__(obj, *args)
    return obj


def _attributes(obj) -> dict:
    """vars() with Triton tuples and constexprs as plain values (memo and triton build distinct objects)."""
    from triton.language import core

    def plain(v):
        if isinstance(v, core.tuple):
            return ("tuple", [plain(x) for x in v.values])
        if isinstance(v, core.constexpr):
            return ("constexpr", plain(v.value))
        return v

    return {k: plain(v) for k, v in vars(obj).items()}


def test_types_and_tensors_come_from_a_memo_of_tritons_own_constructors():
    """Every block type and tensor the memo answers has the attributes (names, order, values)
    triton's own constructor gives it; a shape seen before shares its tuple; shapes triton
    refuses are still refused as it refuses them; uninstall puts the constructors back."""
    from triton.language import core
    from triton.runtime import interpreter

    tl = interpreter.tl
    assert core.block_type.__init__ is not core.block_type.__init__.__wrapped__, "install memoizes the types"
    c = core.constexpr
    for dt in (tl.float32, tl.int1, tl.uint8, tl.float8e4nv, tl.pointer_type(tl.bfloat16), tl.pointer_type(tl.int32)):
        for shape in ([16], [32, 128], [c(64), 16], [c(c(8))], core.tuple([1, 256]), core.tuple([c(4), c(2)])):
            for _ in range(2):  # the second answer comes from the memo
                fast, slow = core.block_type(dt, shape), _built_by_triton(core.block_type, dt, shape)
                assert fast.element_ty is dt and _attributes(fast) == _attributes(slow), (dt, shape)
                handle = object()
                t_fast, t_slow = core.tensor(handle, fast), _built_by_triton(core.tensor, handle, slow)
                assert t_fast.handle is handle and t_fast.type is fast
                assert list(vars(t_fast)) == list(vars(t_slow)) and _attributes(t_fast) == _attributes(t_slow)
        scalar = core.tensor(None, dt)
        assert _attributes(scalar) == _attributes(_built_by_triton(core.tensor, None, dt))
    assert core.block_type(tl.float32, [16, 128]).shape is core.block_type(tl.float32, [16, 128]).shape
    for shape, error in (([3], ValueError), ([], TypeError), ((16,), AssertionError), ([16.0], TypeError)):
        for build in (lambda: core.block_type(tl.float32, shape), lambda: _built_by_triton(core.block_type, tl.float32, shape)):
            with pytest.raises(error):
                build()
    original = core.block_type.__init__.__wrapped__, core.tensor.__init__.__wrapped__
    interpreter_speed.uninstall()
    try:
        assert (core.block_type.__init__, core.tensor.__init__) == original
    finally:
        assert interpreter_speed.install() == "installed"


def _jit_functions(module_prefix: str) -> list:
    import sys

    from triton.runtime import interpreter

    found = {id(v): v for name, m in sorted(sys.modules.items()) if name.startswith(module_prefix)
             for v in vars(m).values() if type(v) is interpreter.InterpretedFunction}
    return list(found.values())  # once each: a helper is imported into several modules


def test_warm_rewrites_caches_what_triton_would_rewrite_in_the_worker():
    """Every module-level kernel and helper of the shipped implementation is rewritten into
    triton's cache, and the cached code is the code triton's own rewrite gives."""
    from diffmoe.interpreter import fast_path as speed
    from triton.runtime import interpreter

    cache = interpreter.InterpretedFunction.rewritten_fn
    kernels = _jit_functions("optimized.")
    assert len(kernels) >= 5, "the shipped kernels are found"
    for k in kernels:
        cache.pop(k.fn, None)  # as a forked worker of a parent that never launched finds them
    speed._modules_scanned = 0
    assert speed.warm_rewrites() >= len(kernels)
    assert speed.warm_rewrites() == 0, "nothing imported since: no second scan"
    for k in kernels:
        warm, fresh = cache[k.fn].__code__, interpreter.FunctionRewriter(k.fn, **k.kwargs).rewrite_ast().__code__
        assert (warm.co_code, warm.co_consts, warm.co_names, warm.co_varnames) == \
               (fresh.co_code, fresh.co_consts, fresh.co_names, fresh.co_varnames), k.fn.__qualname__


def test_the_runner_warms_the_cache_before_forking_a_check(monkeypatch):
    from diffmoe.interpreter import fast_path as speed
    from diffmoe.judge.runner import run_differential

    calls = []
    monkeypatch.setattr(speed, "warm_rewrites", lambda: calls.append(1) or 0)
    config = MoEConfig(num_tokens=1, num_experts=1, topk=1, hidden=128, inter=128, quant="fp8-token", seed=1)
    run_differential(config, oracles=["differential"], schedules=["identity"])
    assert calls == [], "a check in this process forks nothing"
    assert run_differential(config, oracles=["differential"], schedules=["identity"], time_limit=60.0).passed
    assert calls == [1]


def test_operands_of_one_shape_skip_the_broadcast_and_others_get_tritons():
    """Two blocks of one shape and two scalars come back as the same two objects, as triton's
    method returns them; every other pair gets triton's answer (the same types and values) or its error."""
    import numpy as np
    from triton.runtime import interpreter

    tl, semantic = interpreter.tl, interpreter.interpreter_semantic
    fast = semantic.broadcast_impl_value
    original = fast.__wrapped__
    assert fast is not original, "install answers equal shapes itself"

    def block(*shape, dtype=tl.float32):
        data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        return tl.tensor(interpreter.TensorHandle(data, dtype), tl.block_type(dtype, list(shape)))

    def scalar():
        return tl.tensor(interpreter.TensorHandle(np.array([2.0], dtype=np.float32), tl.float32), tl.float32)

    for lhs, rhs in ((block(16, 128), block(16, 128)), (scalar(), scalar()), (block(4, dtype=tl.int32), block(4))):
        assert fast(lhs, rhs) == original(lhs, rhs) == (lhs, rhs)
        assert fast(lhs, rhs)[0] is lhs and fast(lhs, rhs)[1] is rhs
    for lhs, rhs in ((block(16, 1), block(1, 128)), (scalar(), block(8, 4)), (block(8, 4), scalar()), (block(128), block(16, 128))):
        for a, b in zip(fast(lhs, rhs), original(lhs, rhs)):
            assert a.type == b.type and np.array_equal(a.handle.data, b.handle.data)
    for build in (fast, original):
        with pytest.raises(ValueError, match="Cannot make_shape_compatible"):
            build(block(16, 4), block(16, 8))
    interpreter_speed.uninstall()
    try:
        assert "broadcast_impl_value" not in vars(semantic), "uninstall leaves the class's method"
    finally:
        assert interpreter_speed.install() == "installed"


def test_xor_reductions_are_vectorized_with_triton_s_own_bits():
    """tl.sort's xor_sum by numpy's bitwise_xor.reduce gives the bits of triton's own
    element-by-element reduction: every axis of a 3-D block, keep_dims both ways, signed and
    unsigned, and a whole sort."""
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    @triton.jit
    def xor_kernel(x_ptr, y_ptr, AXIS: tl.constexpr, KEEP: tl.constexpr):
        offs = (tl.arange(0, 2)[:, None, None] * 32 + tl.arange(0, 4)[None, :, None] * 8
                + tl.arange(0, 8)[None, None, :])
        r = tl.xor_sum(tl.load(x_ptr + offs), AXIS, keep_dims=KEEP)
        tl.store(y_ptr + tl.arange(0, 1), tl.sum(tl.ravel(r).to(tl.int64) * (tl.arange(0, r.numel) + 1), 0))

    @triton.jit
    def sort_kernel(x_ptr, y_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(y_ptr + offs, tl.sort(tl.load(x_ptr + offs), 0))

    ops = interpreter.ReduceOps
    fast, slow = ops.apply_impl, ops.apply_impl.__wrapped__

    def both(run):
        out = []
        for impl in (fast, slow):
            ops.apply_impl = impl
            try:
                out.append(run())
            finally:
                ops.apply_impl = fast
        return out

    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.int32, torch.int16, torch.uint8):
        info = torch.iinfo(dtype)
        x = torch.randint(info.min, info.max, (64,), generator=gen, dtype=torch.int64).to(dtype)
        for axis in (0, 1, 2):
            for keep in (False, True):
                def run(axis=axis, keep=keep, x=x):
                    y = torch.zeros(1, dtype=torch.int64)
                    xor_kernel[(1,)](x, y, AXIS=axis, KEEP=keep)
                    return y
                got, want = both(run)
                assert torch.equal(got, want), (dtype, axis, keep)
    x = torch.randint(-(2**31), 2**31 - 1, (256,), generator=gen, dtype=torch.int32)

    def sort():
        y = torch.empty_like(x)
        sort_kernel[(1,)](x, y, N=256)
        return y

    got, want = both(sort)
    assert torch.equal(got, want) and torch.equal(got, torch.sort(x).values)
