"""Interpreter fast path: a device-function call skips re-patching a language already patched.

Under `TRITON_INTERPRET=1`, triton 3.9 runs every call of one `@triton.jit` function from
another (a helper such as `tl.zeros`, `tl.cdiv` or a kernel's own prologue) through
`InterpretedFunction.__call__`, which first calls `_patch_lang(fn)`: an `inspect.getmembers`
walk over `triton.language`, `tl.core`, `tl.tensor` and `tl.math` that replaces every builtin
with an interpreter wrapper. A kernel launch has already done that walk for the modules its own
globals hold, and a device call's patches are never undone, so inside a launch almost every such
walk finds nothing left to replace. It cost about 14% of one check (cProfile of a T=33 E=47 K=11
fp8-block fused check: 473 walks, 1.0 s of 7.6 s).

`install()` wraps that method: when every module the helper's globals hold (`tl`, `tl.core`)
and every object `_patch_lang` would walk for it is patched already (a sentinel builtin of each,
chosen at install, is an interpreter wrapper now), the helper runs at once; otherwise triton's
own method runs and patches as before. `_patch_lang` patches and restores an object's members
as one scope, so one sentinel per object tells its state. The same ops run on the same values:
bits cannot change (the whole suite and the bug zoo run with it).

The same install also skips the interpreter's integer-overflow sanitizer while its assertions
are off. `InterpreterOptions` has `sanitize_overflow=True` and `debug=False`, and triton 3.9's
interpreter never sets `debug`: every int32 add, sub and mul then builds an int64 copy, the op,
two comparisons and an `and`, and hands them to `device_assert`, which returns at once when
`debug` is False. Nothing is ever checked; the work is thrown away. With `sanitize_overflow=False`
(set only while `debug` is False; a builder given options with `debug=True` keeps its checks)
one differential-only check of T=64 E=47 K=8 H=I=128 fp8-token fused went from 2.53 s to 1.98 s
(5,635 of 7,827 sanitizer calls were of that kind).

And it looks numpy dtypes up in a table built once. The interpreter's `_get_np_dtype` builds a
20-entry dict of Triton dtype -> numpy dtype on every call (every load, store, cast and constant):
122k calls, 1.8 s of a 24 s cProfile of 12 fuzz examples. The wrapper answers from a memo of what
the original returned for each dtype (pointers and blocks unwrapped as it does); a dtype it has
not seen goes to the original, errors included. Same dtypes, so the same bits.

And while an interpreted grid runs, numpy's BLAS (the OpenBLAS numpy bundles, which every
interpreted `tl.dot` calls through `np.matmul`) uses one thread. A kernel tile's dot is small
(32x128 by 128x256 for BLOCK_M=32: above OpenBLAS's threading threshold of 65536*4 multiply-adds,
so it wakes a second thread for every dot); on a loaded 2-core machine that wait dominates:
one cheap check of T=33 E=47 K=11 H=I=128 fp8-block fused spent 0.73 s of process time in its
94 dots with OpenBLAS's default two threads and 0.011 s with one. The pin also makes the bits
independent of the machine: whether OpenBLAS gives the same bits on one thread and on two
depends on its kernels. With OPENBLAS_CORETYPE=Haswell (which machines of this kind set on some
processors) 15 of 18 tile products of the kernels' shapes differed between one and two threads,
unset none did (tests/support/blas_threads_probe.py). Every interpreted dot is now a stack of one-row
products (diffmoe.interpreter.dot_rows, issue 33), a gemv per row, whose bits did not depend on
the thread count in that probe (0 of 18 under both configurations); the pin stays for the
thread wake-ups (a 32x128 @ 128x256 row-by-row product: 105 us of process time on two threads,
50 us on one) and for BLAS builds whose gemv does depend on it. So an interpreted kernel's bits are triton's own
interpreter's run on one thread, on every machine, whatever its thread count; the tests run that
comparison under both configurations. The count is put back after each grid
(`GridExecutor.__call__`), so numpy code outside a launch keeps its threads; without a bundled
OpenBLAS nothing is pinned (and nothing is claimed).

And the frontend's types are built once per shape. Every op of every program builds a
`block_type` and a `tensor`; in triton 3.9's `triton.language.core` the name `tuple` is
Triton's own tuple class, so each `block_type(dtype, shape)` unwraps its shape twice, builds two
`tl.tuple`s (each typing its elements) and formats its name, and each `tensor` builds a
`constexpr` per dimension and another `tl.tuple`: 164k block types and 215k tensors, 4.2 s and
2.8 s of a 25 s cProfile of 12 fuzz examples. The wrapped constructors answer a shape seen before
(the element type's name and the shape's ints; anything else goes to triton's own constructor,
errors included) with the attributes triton's constructor computed for it the first time: the
same values, the shape tuple and numel shared between types and tensors of one shape (nothing
in triton 3.9's language, semantic or interpreter modules mutates them). The element type
and the handle stay the caller's own objects.

And `warm_rewrites()` fills the interpreter's cache of rewritten functions in this process.
Triton rewrites a `@triton.jit` function's source (parse, transform, compile) the first time
it runs, into a class-level cache; a check run in a forked worker (diffmoe/check/worker.py) starts
from the parent's cache and throws its own away, so with an empty parent every example paid
for every rewrite again: 18 rewrites, 0.16 s of a cProfile of 12 examples run in one process, paid
per example when each is forked. The runner calls it before forking a check: it rewrites every
module-level jit function (and the one an autotuner or heuristics object wraps) not yet
cached, with triton's own `rewrite()`, so the cache holds what the worker would have computed
(a test compares the code objects); one that fails is left to fail where triton would.

And two operands of one shape skip the broadcast. `broadcast_impl_value` runs for every binary
op, load and store; for two blocks of one shape (most of them) it rebuilds the result shape and
compares it with each operand's through Triton tuples, to return both operands unchanged, as it
does for two scalars: 86k calls, 3.7 s of a 20 s cProfile of 12 fuzz examples. The interpreter's
semantic object answers those two cases at once, with the same two objects; every other pair
(a scalar with a block, shapes that differ, anything that is not a block type's tuple of ints)
goes to triton's method, errors included.

Pinned to the Triton release it was read from (SUPPORTED_TRITON); elsewhere it patches nothing
and says why. Imports Triton only inside `install()`.

Owns the wrapped InterpretedFunction.__call__, GridExecutor.__call__, block_type.__init__, tensor.__init__, the interpreter semantic's broadcast_impl_value, ReduceOps.apply_impl (the vectorized XOR reduction), the memoized `_get_np_dtype`, the interpreter builder's sanitize_overflow option and numpy's BLAS thread count during a launch. Must not change what an interpreted kernel computes (beyond fixing the BLAS thread count at one).

Longer than 400 lines because each cut sits beside the measurement and the exactness argument
that justify it, and all of them are installed and undone as one unit.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys
import threading

from diffmoe.interpreter.triton_pin import triton_release

SUPPORTED_TRITON = (3, 9)

_lock = threading.Lock()
_original = None
_reason: str | None = None
_sanitizer_options = None  # the builder's options before install, put back by uninstall
_original_np_dtype = None  # the interpreter's _get_np_dtype, put back by uninstall
_original_grid_call = None  # GridExecutor.__call__, put back by uninstall
_modules_scanned = 0  # len(sys.modules) at warm_rewrites' last scan
_replaced: list = []  # (holder, attribute name, triton's own or None for an instance attribute), put back by uninstall


def _problem():
    version, major_minor, broken = triton_release()
    if broken is not None:
        return f"triton is not importable: {broken}"
    if major_minor != SUPPORTED_TRITON:
        return f"written for triton {SUPPORTED_TRITON[0]}.{SUPPORTED_TRITON[1]}.x, found {version}: nothing patched"
    from triton.runtime import interpreter

    for name in ("InterpretedFunction", "GridExecutor", "_patch_lang", "InterpreterError", "tl", "_get_np_dtype"):
        if not hasattr(interpreter, name):
            return f"triton {version} interpreter has no {name}: nothing patched"
    return None


def _sentinel(obj, is_builtin) -> str | None:
    """One member of `obj` that `_patch_builtin` replaces (a builtin now, before any patch)."""
    for name in sorted(vars(obj)):
        if is_builtin(getattr(obj, name, None)):
            return name
    return None


def install() -> str:
    """Wrap `InterpretedFunction.__call__` (idempotent, thread-safe, never raises); returns what
    was done or why nothing was. Must run outside any launch (the sentinels are read then)."""
    global _original, _reason
    with _lock:
        if _original is not None or _reason is not None:
            return _reason or "installed"
        problem = _problem()
        if problem is not None:
            _reason = problem
            return problem
        from triton.runtime import interpreter

        tl = interpreter.tl
        is_builtin = tl.core.is_builtin
        walked = {"tl": (tl, tl.tensor, tl.math, tl.core.tensor_descriptor_base),
                  "core": (tl.core, tl.core.tensor, tl.core.tensor_descriptor_base)}
        sentinels = {}
        for obj in {id(o): o for objs in walked.values() for o in objs}.values():
            name = _sentinel(obj, is_builtin)
            if name is None:  # already patched (inside a launch?) or nothing to patch: keep triton's
                _reason = f"{getattr(obj, '__name__', obj)!r} shows no unpatched builtin: nothing patched"
                return _reason
            sentinels[id(obj)] = (obj, name)
        original = interpreter.InterpretedFunction.__call__
        error = interpreter.InterpreterError

        def patched(obj) -> bool:
            holder, name = sentinels[id(obj)]
            return not is_builtin(getattr(holder, name, None))

        def call(self, *args, **kwargs):
            langs = [v for v in self.fn.__globals__.values() if v is tl or v is tl.core]
            if langs and all(patched(o) for lang in langs for o in walked["tl" if lang is tl else "core"]):
                fn = self.rewrite()
                try:
                    return fn(*args, **kwargs)
                except Exception as e:  # as triton's own __call__ reports it
                    raise error(repr(e)) from e
            return original(self, *args, **kwargs)

        call.__wrapped__ = original
        interpreter.InterpretedFunction.__call__ = call
        _original = original
        _skip_unchecked_overflow_sanitizer(interpreter.interpreter_builder)
        _memoize_np_dtype(interpreter)
        _one_blas_thread_per_grid(interpreter)
        _memoize_types(interpreter.tl.core)
        _skip_broadcasts_of_one_shape(interpreter)
        _vectorize_xor_reductions(interpreter)
        return "installed"


def _vectorize_xor_reductions(interpreter) -> None:
    """`tl.reduce(x, axis, _xor_combine)` (`xor_sum`, which `tl.sort`'s compare-and-swap calls per
    stage) by numpy's bitwise_xor.reduce: triton's ReduceOps has no fast path for it and calls the
    combine function once per element (Liger's routing sort: 69 reductions of 1024 elements, 2 s
    of a 2.4 s run under cProfile). XOR of integers is exact in any order."""
    import numpy as np

    ops = interpreter.ReduceOps
    original = ops.apply_impl
    xor = interpreter.tl.standard._xor_combine

    def apply_impl(self, input):
        if self.combine_fn is xor and len(input) == 1 and input[0].dtype.scalar.is_int():
            data = np.bitwise_xor.reduce(input[0].handle.data, axis=self.axis, keepdims=self.keep_dims)
            if self.axis is None and not self.keep_dims:
                data = data.item()  # a scalar, as triton's generic_reduce takes it
            return self.to_tensor(data, input[0].dtype)
        return original(self, input)

    apply_impl.__wrapped__ = original
    ops.apply_impl = apply_impl
    _replaced.append((ops, "apply_impl", original))


def _skip_broadcasts_of_one_shape(interpreter) -> None:
    """interpreter_semantic.broadcast_impl_value answering equal shapes and two scalars at once (module doc)."""
    semantic, tl_tuple = interpreter.interpreter_semantic, interpreter.tl.core.tuple
    original = semantic.broadcast_impl_value  # the class's method, bound

    def broadcast_impl_value(lhs, rhs):
        lhs_ty, rhs_ty = lhs.type, rhs.type
        if lhs_ty.is_block():
            if rhs_ty.is_block():
                lhs_shape, rhs_shape = lhs_ty.shape, rhs_ty.shape
                if lhs_shape.__class__ is tl_tuple and rhs_shape.__class__ is tl_tuple and lhs_shape.values == rhs_shape.values:
                    return lhs, rhs
        elif not rhs_ty.is_block():
            return lhs, rhs
        return original(lhs, rhs)

    broadcast_impl_value.__wrapped__ = original
    semantic.broadcast_impl_value = broadcast_impl_value  # on the instance: compiled code's semantic objects keep the class's
    _replaced.append((semantic, "broadcast_impl_value", None))


def _memoize_types(core) -> None:
    """block_type.__init__ and tensor.__init__ from a memo per shape (module docstring)."""
    block_type, tensor, tl_tuple, constexpr = core.block_type, core.tensor, core.tuple, core.constexpr
    original_block_init, original_tensor_init = block_type.__init__, tensor.__init__
    block_memo: dict = {}  # (str(element type), shape ints) -> (shape, numel, name) as triton built them
    tensor_memo: dict = {}  # shape ints -> (shape, numel) as triton built them

    def shape_ints(shape):
        """The ints `_unwrap_shape` makes of a list or Triton tuple of ints or constexpr ints, else None."""
        if shape.__class__ is tl_tuple:
            shape = shape.values
        elif shape.__class__ is not list:
            return None  # triton's own assertion (a builtin tuple) or unwrapping decides
        ints = []
        for d in shape:
            if d.__class__ is constexpr:
                d = d.value
            if d.__class__ is not int:
                return None
            ints.append(d)
        return (*ints,)

    def block_init(self, element_ty, shape):
        ints = shape_ints(shape)
        if ints is None:
            return original_block_init(self, element_ty, shape)
        key = (str(element_ty), ints)
        found = block_memo.get(key)
        if found is None:
            original_block_init(self, element_ty, shape)
            block_memo[key] = (self.shape, self.numel, self.name)
            return None
        self.element_ty = element_ty
        self.shape, self.numel, self.name = found
        return None

    def tensor_init(self, handle, type):  # noqa: A002 - triton's parameter name
        if type.is_block():
            shape = type.shape
            ints = shape_ints(shape) if shape.__class__ is tl_tuple else None
        else:
            ints = ()
        found = None if ints is None else tensor_memo.get(ints)
        if found is None:
            original_tensor_init(self, handle, type)
            if ints is not None:
                tensor_memo[ints] = (self.shape, self.numel)
            return None
        # the attributes in the order triton's constructor sets them
        self.handle = handle
        self.shape, self.numel = found
        self.type = type
        self.dtype = type.scalar
        return None

    for cls, name, new, original in ((block_type, "__init__", block_init, original_block_init),
                                     (tensor, "__init__", tensor_init, original_tensor_init)):
        new.__wrapped__ = original
        setattr(cls, name, new)
        _replaced.append((cls, name, original))


def numpy_blas_threads():
    """(get, set) of the thread count of the OpenBLAS numpy has loaded, or None when numpy has
    none loaded (another BLAS, or not Linux: /proc/self/maps names the loaded libraries)."""
    import numpy

    folder = os.path.dirname(os.path.dirname(numpy.__file__))  # site-packages: numpy.libs sits beside numpy
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line and line.split()[-1].startswith(folder)})
    except OSError:
        return None
    for path in paths:
        lib = ctypes.CDLL(path)  # already loaded: the same handle numpy uses
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "64_"), ("openblas", "")):
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                put.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
                return get, put
    return None


def _one_blas_thread_per_grid(interpreter) -> None:
    """GridExecutor.__call__ with numpy's BLAS on one thread, its count put back after (module doc)."""
    global _original_grid_call
    threads = numpy_blas_threads()
    if threads is None:
        return
    get, put = threads
    original = interpreter.GridExecutor.__call__

    def call(self, *args, **kwargs):
        before = get()
        if before == 1:
            return original(self, *args, **kwargs)
        put(1)
        try:
            return original(self, *args, **kwargs)
        finally:
            put(before)

    call.__wrapped__ = original
    interpreter.GridExecutor.__call__ = call
    _original_grid_call = original


def _memoize_np_dtype(interpreter) -> None:
    """`_get_np_dtype` from a memo of the original's answers (module docstring)."""
    global _original_np_dtype
    original = interpreter._get_np_dtype
    pointer_type, block_type = interpreter.tl.pointer_type, interpreter.tl.block_type
    pointer = original(pointer_type(interpreter.tl.int8))
    memo = {}

    def np_dtype(tt_dtype):
        if isinstance(tt_dtype, block_type):
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, pointer_type):
            return pointer
        found = memo.get(tt_dtype)
        if found is None:
            found = memo[tt_dtype] = original(tt_dtype)
        return found

    np_dtype.__wrapped__ = original
    interpreter._get_np_dtype = np_dtype
    _original_np_dtype = original


def _skip_unchecked_overflow_sanitizer(builder) -> None:
    """sanitize_overflow=False while debug is False: the sanitizer's device_assert checks nothing then."""
    global _sanitizer_options
    options = builder.options
    if not options.debug and options.sanitize_overflow:
        _sanitizer_options = options
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def uninstall() -> None:
    """Put triton's own method and options back (a test compares both)."""
    global _original, _reason, _sanitizer_options, _original_np_dtype, _original_grid_call, _modules_scanned
    with _lock:
        if _original is not None:
            from triton.runtime import interpreter

            interpreter.InterpretedFunction.__call__ = _original
            if _sanitizer_options is not None:
                interpreter.interpreter_builder.options = _sanitizer_options
                _sanitizer_options = None
            if _original_np_dtype is not None:
                interpreter._get_np_dtype = _original_np_dtype
            if _original_grid_call is not None:
                interpreter.GridExecutor.__call__ = _original_grid_call
            while _replaced:
                holder, name, original = _replaced.pop()
                if original is None:  # an instance attribute over its class's method
                    delattr(holder, name)
                else:
                    setattr(holder, name, original)
        _original, _reason, _original_np_dtype, _original_grid_call, _modules_scanned = None, None, None, None, 0


def warm_rewrites() -> int:
    """Rewrite every module-level jit function not yet in the interpreter's cache (module doc);
    returns how many. Nothing before install, and nothing when no module was imported since the
    last call (the scan is of sys.modules)."""
    global _modules_scanned
    with _lock:
        if _original is None or len(sys.modules) == _modules_scanned:
            return 0
        _modules_scanned = len(sys.modules)
        from triton.runtime import interpreter, jit

        cls, cached, wrapper = interpreter.InterpretedFunction, interpreter.InterpretedFunction.rewritten_fn, jit.KernelInterface
        found = {}
        for module in list(sys.modules.values()):
            try:
                values = list(vars(module).values())
            except TypeError:  # not a module (a lazy stand-in without __dict__)
                continue
            for value in values:
                # type(), not isinstance: isinstance asks a lazy object's __class__ (torch's deprecated aliases warn)
                for _ in range(3):  # an autotuner over heuristics over the jit function
                    if not issubclass(type(value), wrapper) or issubclass(type(value), cls):
                        break
                    value = getattr(value, "fn", None)
                if issubclass(type(value), cls) and value.fn not in cached:
                    found[id(value)] = value
        rewritten = 0
        for fn in found.values():
            try:
                fn.rewrite()
                rewritten += 1
            except Exception:  # noqa: BLE001 - the check's own first call raises it, as triton would
                pass
        return rewritten


def installed() -> bool:
    return _original is not None
