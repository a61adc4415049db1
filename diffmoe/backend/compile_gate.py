"""The compile gate: compile every Triton kernel specialization an implementation launches, for a
GPU this machine does not have.

How (measured on triton 3.9.0, no GPU, no driver): `triton.compile(ASTSource(fn, signature,
constexprs, attrs), target=GPUTarget("cuda", arch, 32))` runs the whole pipeline down to PTX and
a cubin with the ptxas bundled in the wheel. The exact specializations are taken from real
launches: the implementation is built and run on CPU tensors with diffmoe.contract's
`compile_target()` set (so it picks the tiles and switches it would pick on that GPU), every
`JITFunction.run` is intercepted and bound with Triton's own binder for the target's backend
(argument types, divisibility and constexprs exactly as a launch on the GPU would see them), and
nothing runs. Each distinct specialization is then compiled once per target, in parallel worker
processes.

Per specialization the gate reports: ok, "unsupported" (an FP8 kernel for a target without
float8_e4m3fn: sm_80), or the compiler's error with kernel and line; registers and spill bytes
(ptxas -v), shared memory (compiled metadata), and the matrix instruction the PTX uses (wgmma /
tcgen05 / mma.sync, with its operand types: "e4m3" or "f16" for fp8 operands widened to fp16).

This is the third module of diffmoe allowed to import Triton (with the race recorder and the
backend conformance suite), and it does so lazily: it must run with TRITON_INTERPRET unset, in a
process where no kernel was imported under the interpreter (`diffmoe compile-check` sees to it).

Longer than 400 lines because capture, binding, compiling in workers and reading the compiler's
output (ptxas statistics, the PTX's matrix instructions and divisions) are one pipeline over one
private record of a specialization; split, each part would need the others' internals.

Owns capturing and compiling launches for a GPU target. Must not run a kernel.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import re
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Sequence

import torch

from diffmoe.problem.config import QUANT_SCHEMES, MoEConfig
from diffmoe.contract import CompileTarget, ImplementationFactory, LaunchInfo, Schedule, compile_variants, compiling_for
from diffmoe.problem.inputs import make_problem

# Targets the gate knows: name -> compute capability. sm_80 has no float8_e4m3fn (Triton needs
# sm_89 for it), so its FP8 specializations are reported "unsupported", not compiled.
ARCHS = {"sm_80": 80, "sm_89": 89, "sm_90": 90, "sm_100": 100}
DEFAULT_ARCHS = ("sm_90",)
FP8_MIN_ARCH = 89
WARP_SIZE = 32

OK = "ok"
FAILED = "FAILED"
UNSUPPORTED = "unsupported"

# The schedules captured: identity launches without the order table (REORDER=False), any other
# with it; both specializations ship.
CAPTURE_SCHEDULES = (Schedule("identity"), Schedule("reversed"))


class CompileGateError(RuntimeError):
    """The gate cannot run here (Triton without the AOT API, kernels imported under the interpreter)."""


def parse_arch(text: str) -> int:
    """'sm_90', 'sm90', 'sm_90a' or '90' -> 90; ValueError naming the known targets otherwise."""
    if not isinstance(text, str):
        raise TypeError(f"arch must be a string such as sm_90, got {text!r}")
    m = re.fullmatch(r"(?:sm_?)?(\d+)a?", text.strip().lower())
    name = f"sm_{m.group(1)}" if m else None
    if name not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {text!r}")
    return ARCHS[name]


# ---- which configs ------------------------------------------------------------------------

# CUDA tile classes (optimized/tiles.py): BLOCK_M = 16 for TK <= 64, 32 for TK <= 1024, 64 above;
# one T per class at K = 2. H = 2048 and I = 512 give the row kernel its widest column step (1024)
# and a narrower one, as in a real model.
TILE_CLASSES = {"decode": (64, 8), "mid": (1024, 256), "prefill": (None, 1024)}  # name: (largest TK, T at K=2)


def tile_class(config: MoEConfig) -> str:
    for name, (largest, _) in TILE_CLASSES.items():
        if largest is None or config.routed_rows <= largest:
            return name
    raise AssertionError("unreachable: the last class is unbounded")


def representative_configs() -> list[MoEConfig]:
    """The CI subset: every scheme x fused flag x tile class (the order table comes from the two
    captured schedules)."""
    configs = []
    for quant in QUANT_SCHEMES:
        for fused in ((False, True) if quant != "bf16" else (False,)):
            for _, tokens in TILE_CLASSES.values():
                configs.append(MoEConfig(num_tokens=tokens, num_experts=8, topk=2, hidden=2048, inter=512,
                                         quant=quant, fused=fused, seed=0))
    return configs


def sweep_configs() -> list[MoEConfig]:
    """The full sweep: the CI subset plus the router weight on the input, the output carved from
    ws1 and a DeepSeek-sized layer (H = 7168, I = 2048; E = 2, since the tiles follow T*K and
    generating eight experts' weights on the CPU costs ~17 s a config)."""
    configs = representative_configs()
    for quant in QUANT_SCHEMES:
        for fused in ((False, True) if quant != "bf16" else (False,)):
            configs.append(MoEConfig(num_tokens=8, num_experts=8, topk=1, hidden=2048, inter=512, quant=quant,
                                     fused=fused, router_weight="input", seed=0))
            configs.append(MoEConfig(num_tokens=256, num_experts=8, topk=2, hidden=2048, inter=512, quant=quant,
                                     fused=fused, output="workspace", seed=0))
            for _, tokens in TILE_CLASSES.values():
                configs.append(MoEConfig(num_tokens=tokens, num_experts=2, topk=2, hidden=7168, inter=2048,
                                         quant=quant, fused=fused, seed=0))
    return configs


# ---- capture ------------------------------------------------------------------------------


@dataclass
class Specialization:
    """One kernel specialization as a launch on the target would compile it."""

    kernel: str  # module:qualname of the jit function
    arch: int
    variant: str
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict
    stage: str  # the stage of the first launch that used it
    config: str  # the first config that launched it (compact)
    quant: str = ""  # its quant scheme
    tile_class: str = ""  # its CUDA tile class (TILE_CLASSES)
    fn: object = field(repr=False, compare=False, default=None)  # the JITFunction

    @property
    def key(self) -> str:
        return repr((self.kernel, self.arch, self.variant, sorted(self.signature.items()), sorted(self.constexprs.items(), key=repr),
                     sorted(self.attrs.items(), key=repr), sorted(self.options.items(), key=repr)))

    @property
    def kernel_name(self) -> str:
        return self.kernel.rsplit(":", 1)[-1]

    def meta(self) -> dict[str, object]:
        """The named constexprs (by parameter name), for reports."""
        names = [p.name for p in self.fn.params] if self.fn is not None else []
        out = {}
        for path, value in self.constexprs.items():
            index = path[0] if isinstance(path, tuple) else path
            name = names[index] if isinstance(index, int) and index < len(names) else str(path)
            out[name] = getattr(value, "value", value)
        return out

    def divisible_ints(self) -> list[str]:
        """Integer arguments Triton specialized as multiples of 16 (part of the compile key)."""
        names = [p.name for p in self.fn.params] if self.fn is not None else []
        out = []
        for path, attr in self.attrs.items():
            index = path[0] if isinstance(path, tuple) else path
            if not isinstance(index, int) or index >= len(names):
                continue
            if str(self.signature.get(names[index], "")).startswith("*"):
                continue  # pointers: 16-byte aligned in every launch here
            if any(a and a[0] == "tt.divisibility" for a in attr):
                out.append(names[index])
        return out

    @property
    def uses_fp8(self) -> bool:
        return any("fp8" in str(t) for t in self.signature.values())


def _require_aot_api():
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend
        from triton.runtime.jit import JITFunction, create_function_from_signature
    except ImportError as exc:  # a Triton without the ahead-of-time API
        raise CompileGateError(f"this Triton ({_triton_version()}) has no ahead-of-time compile API: {exc}") from None
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise CompileGateError("the compile gate needs TRITON_INTERPRET unset (or 0) before any kernel is imported; "
                               "run `diffmoe compile-check` in a fresh process")
    return triton, GPUTarget, ASTSource, make_backend, JITFunction, create_function_from_signature


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "not installed"


class _StageTracker:
    """A LaunchRecorder that only remembers the stage in flight, to label captured launches."""

    stage = "?"

    def before_launch(self, launch: LaunchInfo) -> None:
        self.stage = launch.stage

    def after_launch(self, launch: LaunchInfo) -> None:
        pass


@contextlib.contextmanager
def _intercept_launches(on_launch: Callable[..., None]):
    """Every JITFunction.run (and each config of an autotuned kernel) goes to `on_launch(fn, args,
    kwargs)` instead of the GPU; nothing executes."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    def run(self, *args, grid, warmup, **kwargs):
        on_launch(self, args, kwargs)
        return None

    def autotuned_run(self, *args, **kwargs):
        for config in self.configs:  # every config a GPU could pick is a specialization that ships
            self.fn.run(*args, **kwargs, **config.all_kwargs())
        return None

    saved = (JITFunction.run, Autotuner.run)
    JITFunction.run, Autotuner.run = run, autotuned_run
    try:
        yield
    finally:
        JITFunction.run, Autotuner.run = saved


def _short_config(config: MoEConfig) -> str:
    return (f"T={config.num_tokens} E={config.num_experts} K={config.topk} H={config.hidden} I={config.inter} "
            f"{config.quant}{' fused' if config.fused else ''}")


def capture_specializations(
    factory: ImplementationFactory,
    configs: Iterable[MoEConfig],
    archs: Sequence[int],
    variants: Sequence[str] | None = None,
    progress: Callable[[int, int, int], None] | None = None,
) -> list[Specialization]:
    """Build and run the implementation for each config, target and variant with launches
    intercepted; the distinct specializations, in first-seen order. `progress(configs done,
    configs, specializations so far)` after each config."""
    triton, GPUTarget, _, make_backend, _, create_function_from_signature = _require_aot_api()
    from triton import knobs

    binders: dict[tuple[int, int], tuple[object, Callable]] = {}
    found: dict[str, Specialization] = {}
    configs = list(configs)
    backends = {arch: make_backend(GPUTarget("cuda", arch, WARP_SIZE)) for arch in archs}
    plan = [(arch, variant) for arch in archs for variant in _variants(factory, configs, arch, variants)]
    for done, config in enumerate(configs, 1):
        problem = make_problem(config, "cpu")  # once per config: the inputs do not depend on the target
        for arch, variant in plan:
            backend = backends[arch]
            tracker = _StageTracker()

            def on_launch(fn, args, kwargs, arch=arch, variant=variant, config=config, tracker=tracker, backend=backend):
                kwargs = dict(kwargs)
                kwargs.setdefault("debug", fn.debug or knobs.runtime.debug)
                kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
                kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
                slot = (id(fn), arch)
                if slot not in binders:
                    binders[slot] = (fn, create_function_from_signature(fn.signature, fn.params, backend))
                bound, specialization, options = binders[slot][1](*args, **kwargs)
                options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
                spec = Specialization(
                    kernel=f"{fn.module}:{fn.fn.__qualname__}", arch=arch, variant=variant, signature=signature,
                    constexprs=constexprs, attrs=attrs, options=dict(options.__dict__), stage=tracker.stage,
                    config=_short_config(config), quant=config.quant, tile_class=tile_class(config), fn=fn,
                )
                found.setdefault(spec.key, spec)

            with compiling_for(CompileTarget("cuda", arch, variant)), _intercept_launches(on_launch):
                impl = factory(config)
                shapes = impl.workspace_shapes(config.num_tokens)
                workspaces = tuple(torch.empty(int(n), dtype=torch.uint8) for n in shapes)
                for schedule in CAPTURE_SCHEDULES:
                    impl.run(problem, workspaces, schedule=schedule, recorder=tracker)
        if progress:
            progress(done, len(configs), len(found))
    return list(found.values())


def _variants(factory, configs, arch, requested) -> list[str]:
    """The implementation's declared compile variants (its `compile_variants`), or "default"."""
    if not configs:
        return []
    with compiling_for(CompileTarget("cuda", arch, "default")), _intercept_launches(lambda *a: None):
        declared = compile_variants(factory(configs[0]))
    if requested is None:
        return list(declared)
    unknown = [v for v in requested if v not in declared]
    if unknown:
        raise ValueError(f"variant must be among {list(declared)} for this implementation, got {unknown}")
    return list(requested)


# ---- compile ------------------------------------------------------------------------------


@dataclass
class CompileResult:
    kernel: str
    arch: str
    variant: str
    stage: str
    config: str
    meta: dict
    status: str
    quant: str = ""
    tile_class: str = ""
    divisible: list = field(default_factory=list)  # integer arguments specialized as multiples of 16
    seconds: float = 0.0
    registers: int | None = None
    spill_stores: int | None = None  # bytes
    spill_loads: int | None = None  # bytes
    shared: int | None = None  # bytes of shared memory
    mma: str = ""  # e.g. "wgmma m64n128k32 e4m3.e4m3", "mma.sync m16n8k16 f16.f16", "none"
    approx_divisions: int | None = None  # div.full / div.approx float32 in the PTX (a `/` not written div_rn)
    error: str = ""

    @property
    def spills(self) -> int:
        return (self.spill_stores or 0) + (self.spill_loads or 0)

    def to_dict(self) -> dict:
        return asdict(self)


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_WGMMA = re.compile(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\.(\w+)\.(\w+)\.(\w+)")
_TCGEN05 = re.compile(r"tcgen05\.mma\.cta_group::(\d)\.kind::(\w+)")
_APPROX_DIV = re.compile(r"\bdiv\.(?:full|approx)(?:\.ftz)?\.f32\b")
_MMA_SYNC = re.compile(r"mma\.sync\.aligned\.(m\d+n\d+k\d+)\.row\.col\.(\w+)\.(\w+)\.(\w+)\.(\w+)")


def mma_of_ptx(ptx: str) -> str:
    """The matrix instruction the PTX uses (the first found, by kind), or "none"."""
    if m := _WGMMA.search(ptx):
        return f"wgmma {m.group(1)} {m.group(3)}.{m.group(4)}"
    if m := _TCGEN05.search(ptx):
        return f"tcgen05 kind::{m.group(2)}"
    if m := _MMA_SYNC.search(ptx):
        return f"mma.sync {m.group(1)} {m.group(3)}.{m.group(4)}"
    return "none"


def ptxas_resources(log: str) -> tuple[int | None, int | None, int | None]:
    """(registers, spill store bytes, spill load bytes) from `ptxas -v` output."""
    regs = _PTXAS_REGS.search(log)
    spills = _PTXAS_SPILLS.search(log)
    return (int(regs.group(1)) if regs else None, int(spills.group(1)) if spills else None,
            int(spills.group(2)) if spills else None)


def _ptxas_log(ptx: str, arch: int) -> str:
    """`ptxas -v` on the PTX with the ptxas Triton itself uses for `arch` (for a cached kernel,
    whose compile printed nothing)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as fh:
            fh.write(ptx)
        proc = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name={sm_arch_from_capability(arch)}", src,
                               "-o", os.path.join(tmp, "k.o")], capture_output=True, text=True)
    return proc.stderr + proc.stdout


def _error_text(exc: BaseException, spec: Specialization) -> str:
    """The compiler's message, one line: the root cause, the kernel, file:line and the source line."""
    node, src = getattr(exc, "node", None), getattr(exc, "src", None)
    where = spec.kernel_name
    if node is not None and hasattr(node, "lineno") and spec.fn is not None:
        start = getattr(spec.fn, "starting_line_number", None)
        code = getattr(getattr(spec.fn, "fn", None), "__code__", None)
        line = node.lineno + (start - 1 if isinstance(start, int) else 0)
        where = f"{spec.kernel_name} ({code.co_filename if code else '?'}:{line})"
        if src:
            lines = src.split("\n")
            if 0 < node.lineno <= len(lines):
                where += f" `{lines[node.lineno - 1].strip()}`"
    root = exc
    while getattr(root, "error_message", None) is None and (root.__cause__ or root.__context__) is not None:
        root = root.__cause__ or root.__context__  # Triton wraps the real error in a CompilationError
    message = getattr(root, "error_message", None) or str(root)
    message = " ".join(str(message).split())
    return f"{type(root).__name__} in {where}: {message[:600]}"


def _globals_failing_launch_check(fn) -> list[str]:
    """The globals `JITFunction.run` would reject before a launch (its own comparison)."""
    missing = object()
    used = getattr(fn, "used_global_vals", None) or {}
    return sorted({name for (name, _), (value, scope) in used.items() if scope.get(name, missing) != value})


_WORK: list[Specialization] = []  # set before the pool forks; workers compile by index


def _compile_index(index: int) -> CompileResult:
    return compile_specialization(_WORK[index])


def compile_specialization(spec: Specialization) -> CompileResult:
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    arch_name = f"sm_{spec.arch}"
    result = CompileResult(spec.kernel_name, arch_name, spec.variant, spec.stage, spec.config, spec.meta(), OK,
                           spec.quant, spec.tile_class, spec.divisible_ints())
    if spec.uses_fp8 and spec.arch < FP8_MIN_ARCH:
        result.status = UNSUPPORTED
        result.error = (f"{arch_name} has no float8_e4m3fn (Triton supports it from sm_89; FP8 tensor cores from "
                        "sm_89/sm_90): this FP8 kernel cannot run there")
        return result
    start = time.perf_counter()
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            saved = knobs.nvidia.dump_ptxas_log
            knobs.nvidia.dump_ptxas_log = True
            try:
                spec.fn.cache_key  # the first step of every JIT launch: it checks the globals the kernel uses
                compiled = triton.compile(ASTSource(spec.fn, spec.signature, spec.constexprs, spec.attrs),
                                          target=GPUTarget("cuda", spec.arch, WARP_SIZE), options=spec.options)
            finally:
                knobs.nvidia.dump_ptxas_log = saved
    except Exception as exc:  # noqa: BLE001 - the compiler's error is the gate's finding
        result.status = FAILED
        result.error = _error_text(exc, spec)
        if "not supported in this architecture" in result.error:
            result.status = UNSUPPORTED
        result.seconds = time.perf_counter() - start
        return result
    changed = _globals_failing_launch_check(spec.fn)
    if changed:
        # Triton compares every global the kernel used with `!=` before each launch: a global not
        # equal to itself (NaN) compiles, then fails every launch on the GPU
        result.status = FAILED
        result.error = (f"RuntimeError in {spec.kernel_name}: global variable(s) {', '.join(changed)} fail Triton's "
                        "pre-launch check (the value does not compare equal to the one compiled, e.g. a NaN constexpr): "
                        "every launch on the GPU would raise")
        result.seconds = time.perf_counter() - start
        return result
    ptx = compiled.asm.get("ptx", "")
    text = log.getvalue()
    if "Used " not in text:  # a cache hit compiles nothing: ask ptxas itself
        text = _ptxas_log(ptx, spec.arch)
    result.registers, result.spill_stores, result.spill_loads = ptxas_resources(text)
    result.shared = int(getattr(compiled.metadata, "shared", 0) or 0)
    result.mma = mma_of_ptx(ptx)
    result.approx_divisions = len(_APPROX_DIV.findall(ptx))
    result.seconds = time.perf_counter() - start
    return result


def compile_all(specs: Sequence[Specialization], jobs: int | None = None,
                progress: Callable[[int, int, CompileResult], None] | None = None) -> list[CompileResult]:
    """Compile every specialization, `jobs` worker processes at a time (default: the cores)."""
    global _WORK
    jobs = jobs or os.cpu_count() or 1
    results: list[CompileResult | None] = [None] * len(specs)
    if jobs <= 1 or len(specs) <= 1:
        for i, spec in enumerate(specs):
            results[i] = compile_specialization(spec)
            if progress:
                progress(i + 1, len(specs), results[i])
        return results  # type: ignore[return-value]
    _WORK = list(specs)
    try:
        # fork: the workers inherit the captured jit functions (plug-in kernels loaded by path too)
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            for done, (i, result) in enumerate(zip(range(len(specs)), pool.map(_compile_index, range(len(specs)))), 1):
                results[i] = result
                if progress:
                    progress(done, len(specs), result)
    finally:
        _WORK = []
    return results  # type: ignore[return-value]


# ---- the gate -----------------------------------------------------------------------------


@dataclass
class GateReport:
    results: list[CompileResult]
    archs: list[str]
    configs: int
    seconds: float
    forbid_spills: tuple[str, ...] = ()  # variants whose spills are failures

    def failures(self) -> list[CompileResult]:
        return [r for r in self.results if r.status != OK or (r.variant in self.forbid_spills and r.spills > 0)]

    @property
    def exit_code(self) -> int:
        return 0 if not self.failures() else 1

    def to_dict(self) -> dict:
        return {"archs": self.archs, "configs": self.configs, "specializations": len(self.results),
                "seconds": round(self.seconds, 2), "forbid_spills": list(self.forbid_spills),
                "ok": self.exit_code == 0, "exit_code": self.exit_code,
                "results": [r.to_dict() for r in self.results]}

    def render(self) -> str:
        head = ("kernel", "arch", "variant", "stage", "key constexprs", "status", "regs", "spills", "smem", "mma")
        rows = []
        for r in self.results:
            spill = "-" if r.spill_stores is None else f"{r.spill_stores}/{r.spill_loads} B"
            sizes = [d for d in r.divisible if not d.startswith("stride_")]
            meta = _meta_text(r.meta) + (f" div16:{','.join(sizes)}" if sizes else "")
            rows.append((r.kernel, r.arch, r.variant, r.stage, meta, r.status,
                         "-" if r.registers is None else str(r.registers), spill,
                         "-" if r.shared is None else str(r.shared), r.mma or "-"))
        widths = [max(len(str(x[c])) for x in [head, *rows]) for c in range(len(head))]
        lines = ["  ".join(str(x[c]).ljust(widths[c]) for c in range(len(head))).rstrip() for x in [head, *rows]]
        lines.insert(1, "  ".join("-" * w for w in widths))
        bad = self.failures()
        for r in bad:
            why = r.error or f"{r.spill_stores} B spill stores, {r.spill_loads} B spill loads in the {r.variant} variant"
            lines.append(f"{r.status if r.status != OK else 'SPILLS'}: {r.kernel} [{r.arch} {r.variant}, {r.stage}, {r.config}]: {why}")
        counts = {s: sum(r.status == s for r in self.results) for s in (OK, UNSUPPORTED, FAILED)}
        verdict = "all compiled" if not bad else f"{len(bad)} of {len(self.results)} not accepted"
        lines.append(f"compile-check: {len(self.results)} specializations from {self.configs} configs for "
                     f"{', '.join(self.archs)}: {counts[OK]} ok, {counts[UNSUPPORTED]} unsupported, {counts[FAILED]} failed "
                     f"({self.seconds:.1f} s): {verdict}")
        return "\n".join(lines)


# Constexprs every specialization carries but that rarely tell two apart; left out of the table.
_QUIET_META = {"SOFTWARE_BF16", "SOFTWARE_FP8", "UPCAST_BF16_DOT", "DECODE_FP8", "BLOCK_K", "BLOCK_P"}


def _meta_text(meta: dict) -> str:
    # stride_* = 1 is Triton's own specialization of unit strides, the same in every launch here
    return " ".join(f"{k}={_short(v)}" for k, v in meta.items() if k not in _QUIET_META and not k.startswith("stride_"))


def _short(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def run_gate(
    factory: ImplementationFactory,
    configs: Sequence[MoEConfig],
    archs: Sequence[str] = DEFAULT_ARCHS,
    *,
    variants: Sequence[str] | None = None,
    jobs: int | None = None,
    forbid_spills: Sequence[str] = (),
    progress: Callable[[int, int, CompileResult], None] | None = None,
    capture_progress: Callable[[int, int, int], None] | None = None,
) -> GateReport:
    """Capture and compile; the report's exit_code is 0 only when every specialization compiled
    (and, for the variants in `forbid_spills`, spilled nothing). `capture_progress(configs done,
    configs, specializations so far)` after each config is captured, `progress(specializations
    done, specializations, result)` after each is compiled."""
    start = time.perf_counter()
    arch_ids = [parse_arch(a) for a in archs]
    specs = capture_specializations(factory, configs, arch_ids, variants, capture_progress)
    if configs and not specs:
        raise CompileGateError("no Triton launch was captured: the implementation launches no @triton.jit kernel "
                               "(or its kernels were imported under the interpreter), so there is nothing to compile")
    results = compile_all(specs, jobs, progress)
    return GateReport(results, [f"sm_{a}" for a in arch_ids], len(configs), time.perf_counter() - start,
                      tuple(forbid_spills))


def report_json(report: GateReport) -> str:
    return json.dumps(report.to_dict())
