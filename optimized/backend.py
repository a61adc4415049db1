"""Which backend runs the kernels, and which of its defects the kernels must work around.

Each workaround is a constexpr switch (BackendTraits). The switches are not hard-coded per
backend: `backend_traits` derives them from cheap conformance probes run on the backend itself
(the harness's diffmoe.backend.conformance, which judges Triton; which probes gate which switch is
ours: TRAIT_PROBES), once per process and backend. A workaround goes off only where its
probes ran and found the primitive right, so a Triton release that fixes a defect gets the
fast path, and a probe that cannot run leaves the workaround on. The software paths are
correct on every backend (tests/backend/test_conformance.py checks them with every switch on), so the
safe choice costs speed, never bits.

Known defects (../shared/DESIGN.md, notes/interpreter_defects_repro.py): under triton 3.9's own
interpreter the float32 -> e4m3fn and float32 -> bf16 casts round wrongly, bf16 subnormals are
mangled on the way to float32, e4m3fn NaN codes read as +-480 and the bf16 x bf16 dot is wrong.
diffmoe.interpreter.fixes corrects all of them exactly at the interpreter (optimized.launch
installs it before any launch); the probes then find every primitive right and every switch is
off there too, so the interpreter runs the kernels' plain CUDA paths. The switches stay for a
backend whose probes still fail: a Triton the fixes refuse to patch, or a GPU. `diffmoe doctor` runs the full
sweep and prints what holds on the backend at hand (optimized.conformance_hooks tells it what
we do about each primitive).

On CUDA a software path is a different product: correct, but compiled to scalar float32 code
with tens of KB of register spills (measured by `diffmoe compile-check --variant safe`), orders
of magnitude slower. So when a CUDA probe finds a defect (or cannot run), `backend_traits` refuses
with a message naming it, unless DIFFMOE_ALLOW_SOFTWARE_FALLBACK=1 says to run slowly anyway, and
even then it warns. On the interpreter nothing is refused: an unfixed one runs the software paths.

While `diffmoe compile-check` captures launches (diffmoe.contract.compile_target() is set), no
probe runs: the capture names the trait set (COMPILE_VARIANTS) and the backend is CUDA.

This module itself imports no triton (the probes are imported when traits are first asked for):
the interpreter switch below must be settable before triton is first imported.

Owns choosing the backend's traits. Must not define probes: they are diffmoe.backend.conformance's.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, fields

import torch

from diffmoe.contract import compile_target, default_device, interpreter_enabled


@dataclass(frozen=True)
class BackendTraits:
    """Workarounds the kernels apply (constexpr switches)."""

    name: str  # "interpreter" or "cuda" (also picks the tile sizes)
    software_fp8_cast: bool  # round onto the e4m3 grid before the cast
    software_bf16_cast: bool  # round onto the bf16 grid before the cast; widen bf16 by bit shifts
    upcast_bf16_dot: bool  # run bf16 x bf16 dots in float32


def safe_traits(name: str) -> BackendTraits:
    """Every workaround on: correct on any backend."""
    return BackendTraits(name, software_fp8_cast=True, software_bf16_cast=True, upcast_bf16_dot=True)


# The trait sets `diffmoe compile-check` compiles for a GPU (TritonFP8MoE.compile_variants): the
# native kernels a GPU whose probes all pass runs, and the fallback a failing probe would select.
COMPILE_VARIANTS = {
    "native": BackendTraits("cuda", software_fp8_cast=False, software_bf16_cast=False, upcast_bf16_dot=False),
    "safe": safe_traits("cuda"),
}

ALLOW_FALLBACK_ENV = "DIFFMOE_ALLOW_SOFTWARE_FALLBACK"


class SoftwareFallbackError(RuntimeError):
    """A CUDA backend whose probes would select the (correct but very slow) software paths."""

    def __init__(self, message: str, traits: BackendTraits):
        super().__init__(message)
        self.traits = traits  # what would have run


# Every workaround on: what the probes derive under triton 3.9's own interpreter (every defect
# present, diffmoe.interpreter.fixes not installed). Tests that drive the kernels directly use
# it on purpose, to exercise the software paths; with the fixes installed they give the same bits.
INTERPRETER_TRAITS = safe_traits("interpreter")


def backend_name(device: torch.device) -> str:
    """"interpreter" or "cuda" for kernels launched on `device`; raises where neither can run them."""
    target = compile_target()
    if target is not None:
        return target.backend  # launches are captured and compiled for it, never run here
    if interpreter_enabled():
        return "interpreter"
    if device.type == "cuda":
        return "cuda"
    raise RuntimeError(
        "the optimized MoE needs CUDA or the Triton interpreter: set TRITON_INTERPRET=1 "
        "before importing triton (diffmoe sets it when no GPU is present)"
    )


# (backend name, device) -> (traits, why the software paths are on: "" when none is)
_TRAITS_CACHE: dict[tuple[str, str], tuple[BackendTraits, str]] = {}


TRAIT_FIELDS = tuple(f.name for f in fields(BackendTraits) if f.name != "name")
# The workaround switches and the conformance probes (diffmoe.backend.conformance.PRIMITIVES keys) that
# must all be ok for the switch to go off.
TRAIT_PROBES = {
    # the FP8 decode in the GEMMs is switched with the cast (one switch for the FP8 workarounds)
    "software_fp8_cast": ("fp8_cast", "fp8_upcast"),
    "software_bf16_cast": ("bf16_cast", "bf16_upcast"),
    "upcast_bf16_dot": ("bf16_dot",),
}
assert set(TRAIT_PROBES) == set(TRAIT_FIELDS), "every workaround switch needs its probes"


def probe_defects(device: torch.device) -> dict:
    """The cheap probes behind the workaround switches, keyed by primitive (ProbeResults)."""
    from diffmoe.backend.conformance import run_probes  # imports triton: only once a kernel is wanted

    from .launch import install_interpreter_fixes  # the probes judge what our launches will run on

    install_interpreter_fixes()
    return run_probes({k for probes in TRAIT_PROBES.values() for k in probes}, device)


def traits_from_results(name: str, results: dict) -> BackendTraits:
    """A workaround goes off only where every probe behind it ran and found the primitive right;
    a defect, a skipped or a missing probe leaves it on (the software paths are right anyway)."""
    from diffmoe.backend.conformance import OK

    switches = {
        trait: not all(k in results and results[k].status == OK for k in keys) for trait, keys in TRAIT_PROBES.items()
    }
    return BackendTraits(name, **switches)


def derive_traits(name: str, device: torch.device) -> BackendTraits:
    return traits_from_results(name, probe_defects(device))


def software_paths(traits: BackendTraits) -> list[str]:
    return [f for f in TRAIT_FIELDS if getattr(traits, f)]


def check_no_software_fallback(traits: BackendTraits, why: str) -> None:
    """On CUDA, refuse (or, with DIFFMOE_ALLOW_SOFTWARE_FALLBACK=1, loudly warn about) traits
    that switch a software path on; anywhere else, nothing."""
    on = software_paths(traits)
    if traits.name != "cuda" or not on:
        return
    message = (
        f"the CUDA backend would run the software fallback ({', '.join(on)}) because {why}: correct, but "
        "compiled to scalar float32 code with large register spills, far too slow to be the kernel you meant "
        "to test. Run `diffmoe doctor` for the failing primitive; set "
        f"{ALLOW_FALLBACK_ENV}=1 to run the fallback anyway."
    )
    if os.environ.get(ALLOW_FALLBACK_ENV, "0") in ("", "0"):
        raise SoftwareFallbackError(message, traits)
    warnings.warn(message + f" ({ALLOW_FALLBACK_ENV} is set: running it)", RuntimeWarning, stacklevel=3)


def backend_traits(device: torch.device) -> BackendTraits:
    """The workaround switches for kernels on `device`, from the backend's conformance probes
    (cached); every workaround on if the probes cannot be run at all. On CUDA, traits that turn a
    software path on raise SoftwareFallbackError (see the module docstring)."""
    target = compile_target()
    if target is not None:
        variant = "native" if target.variant == "default" else target.variant  # what a sound GPU runs
        if variant not in COMPILE_VARIANTS:
            raise ValueError(f"compile variant must be one of {sorted(COMPILE_VARIANTS)}, got {target.variant!r}")
        return COMPILE_VARIANTS[variant]
    name = backend_name(device)
    device = normalize_device(device)
    key = (name, str(device))
    cached = _TRAITS_CACHE.get(key)
    if cached is None:
        try:
            traits = derive_traits(name, device)
            why = "its conformance probes found a defect (or could not check the primitive) behind each"
        except Exception as exc:  # noqa: BLE001 - no probe result: the safe choice, which is always correct
            traits = safe_traits(name)
            why = f"its conformance probes could not run ({type(exc).__name__}: {exc})"
        cached = _TRAITS_CACHE[key] = (traits, why)
    traits, why = cached
    check_no_software_fallback(traits, why)
    return traits


def clear_traits_cache() -> None:
    """Forget the probed traits (tests that fake probe results restore the real ones with it)."""
    _TRAITS_CACHE.clear()


def normalize_device(device: torch.device) -> torch.device:
    """`cuda` -> `cuda:N` (the current device): tensors report an index, and torch.device("cuda")
    does not compare equal to torch.device("cuda:0")."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def ensure_interpreter_without_gpu() -> None:
    """Turn the interpreter on when no GPU is present; must run before triton is imported."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
