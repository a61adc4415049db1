"""Comparing one buffer of the reference with the same buffer of a candidate.

A `Rule` says how close is close enough; `compare` applies it element by element and
returns a `Comparison` with the verdict and the figures a finding needs (how many elements
fail, the worst distance in ULP and in absolute value, where the first failures are).

Distances in ULP use the ordered integer view of the bit pattern: a float's sign-magnitude
pattern is mapped to the integer -magnitude (negative) or +magnitude (positive), so adjacent
representable values are adjacent integers in the tensor's own dtype, +0 and -0 are the same
point, and the infinities sit one step past the largest finite values.

NaN handling: a NaN facing a NaN in the same position is equal in every mode (whatever the
payloads, since kernels and torch disagree on payloads and nobody reads them); a NaN facing
a number is a failure in every mode. An infinity passes only against the same infinity: an
overflow is never "one ulp off" the largest finite value.

Owns comparing two tensors under a rule. Must not choose rules: the tolerance table does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from diffmoe.problem.ulps import (  # noqa: F401 - NAN_VS_NUMBER_DISTANCE, FP8_DTYPES, ulp_distance: this module's API too
    _FLOAT_FORMATS, _INT_DTYPES, FP8_DTYPES, NAN_VS_NUMBER_DISTANCE, _decode, _is_supported, _ordered_distance, ulp_distance,
)

BITWISE = "bitwise"
ULP = "ulp"
TOLERANCE = "tolerance"
FP8_STEP = "fp8-step"
DERIVED = "derived"
RULE_MODES = (BITWISE, ULP, TOLERANCE, FP8_STEP, DERIVED)

FIRST_FAILURES_SHOWN = 5


@dataclass(frozen=True)
class Rule:
    """How close a candidate buffer must be to the reference.

    mode:
        bitwise:   identical bit patterns (NaN payloads aside).
        ulp:       at most `max_ulp` units in the last place of the tensor's dtype, or
                   |diff| <= `atol` (an absolute floor: near zero, where a sum cancels, a tiny
                   absolute error spans many ULP).
        fp8-step:  FP8 codes at most one code step apart (adjacent codes), or |diff| <= `atol`
                   in code units; for codes computed from a transcendental upstream.
        tolerance: |diff| <= atol + rtol * |reference|.
        derived:   |diff| <= a per-element bound computed for this comparison (`compare(...,
                   bound=)`), e.g. the effect of the differences a candidate legitimately has.
    reason: one line saying where the bound comes from.
    """

    mode: str
    max_ulp: int = 0
    atol: float = 0.0
    rtol: float = 0.0
    reason: str = ""

    def __post_init__(self) -> None:
        if self.mode not in RULE_MODES:
            raise ValueError(f"rule mode must be one of {list(RULE_MODES)}, got {self.mode!r}")
        if not isinstance(self.max_ulp, int) or isinstance(self.max_ulp, bool) or self.max_ulp < 0:
            raise ValueError(f"max_ulp must be an int >= 0, got {self.max_ulp!r}")
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.mode == FP8_STEP:
            object.__setattr__(self, "max_ulp", 1)  # the mode's meaning; shown in reports

    @classmethod
    def bitwise(cls, reason: str = "") -> Rule:
        return cls(BITWISE, reason=reason)

    @classmethod
    def ulp(cls, max_ulp: int, atol: float = 0.0, reason: str = "") -> Rule:
        return cls(ULP, max_ulp=max_ulp, atol=atol, reason=reason)

    @classmethod
    def fp8_step(cls, atol: float = 0.0, reason: str = "") -> Rule:
        return cls(FP8_STEP, max_ulp=1, atol=atol, reason=reason)

    @classmethod
    def tolerance(cls, atol: float, rtol: float, reason: str = "") -> Rule:
        return cls(TOLERANCE, atol=atol, rtol=rtol, reason=reason)

    @classmethod
    def derived(cls, reason: str = "") -> Rule:
        return cls(DERIVED, reason=reason)

    def describe(self) -> str:
        """The bound in a few words, e.g. '<= 2 ulp or |diff| <= 0.000977'."""
        if self.mode == BITWISE:
            return "bitwise"
        floor = f" or |diff| <= {self.atol:.3g}" if self.atol else ""
        if self.mode == ULP:
            return f"<= {self.max_ulp} ulp{floor}"
        if self.mode == FP8_STEP:
            return f"<= 1 fp8 code step{floor}"
        if self.mode == DERIVED:
            return "the derived per-element bound"
        return f"|diff| <= {self.atol:.3g} + {self.rtol:.3g} * |reference|"


@dataclass
class Comparison:
    """The verdict on one buffer and the figures behind it.

    mismatches: elements failing the rule. differing: elements whose bit patterns differ
    (NaN payloads aside), whether or not the rule allows it. max_ulp: the largest distance in
    ULP of the dtype over the elements that are not a NaN or infinity mismatch (for integer
    dtypes, the largest integer difference). max_abs: the largest |reference - candidate|
    over elements finite on both sides. nonfinite_mismatches: NaN facing a number, or an
    infinity facing anything but the same infinity. first: up to five failing elements as
    (index, reference value, candidate value), in row-major order. problem: set instead of
    the figures when the tensors cannot be compared (shape, dtype, rule not applicable).
    scale: the buffer's own scale, max |reference| over the elements max_abs is taken on; it
    makes `departure` comparable across stages (issue 27: a one-code flip in a quantisation,
    about 1/16 of its scale at most, must not head a report whose GEMM is off by a factor).
    row_failures: failing elements per row (along the first axis; [rows] int64, on the CPU)
    when any fails, for where a divergence lies (diffmoe/oracles/by_expert.py); not a figure.
    """

    name: str
    ok: bool
    rule: Rule
    mismatches: int
    total: int
    max_ulp: int
    max_abs: float
    first: list[tuple[tuple[int, ...], Any, Any]] = field(default_factory=list)
    differing: int = 0
    nonfinite_mismatches: int = 0
    problem: str | None = None
    scale: float = 0.0
    row_failures: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def departure(self) -> float:
        """How far the candidate departs, relative to the buffer's scale: max_abs / scale; inf
        when the tensors cannot be compared or a NaN/infinity faces anything else, and inf for
        a difference on an all-zero reference. 0 when the comparison passed bit for bit."""
        if self.problem or self.nonfinite_mismatches:
            return math.inf
        if self.max_abs == 0:
            return 0.0
        return self.max_abs / self.scale if self.scale > 0 else math.inf

    def summary(self) -> str:
        """One line for a finding message."""
        if self.problem:
            return f"{self.name}: {self.problem}"
        head = f"{self.name}: {self.mismatches} of {self.total} elements fail {self.rule.describe()}"
        if self.ok:
            head = f"{self.name}: within {self.rule.describe()} ({self.differing} of {self.total} differ)"
        figures = f" (max {self.max_ulp} ulp, max |diff| {self.max_abs:.6g}"
        if self.nonfinite_mismatches:
            figures += f", {self.nonfinite_mismatches} NaN/inf mismatches"
        figures += ")"
        if not self.first:
            return head + figures
        index, ref, cand = self.first[0]
        return f"{head}{figures}; first at {index}: reference {ref!r}, candidate {cand!r}"

    def figures(self) -> dict[str, Any]:
        """The numbers, for `Finding.figures`."""
        d: dict[str, Any] = {
            "rule": self.rule.describe(),
            "mismatches": self.mismatches,
            "total": self.total,
            "differing": self.differing,
            "max_ulp": self.max_ulp,
            "max_abs": self.max_abs,
            "departure": self.departure if math.isfinite(self.departure) else "inf",  # JSON has no inf
            "first": [f"{index}: {ref!r} vs {cand!r}" for index, ref, cand in self.first],
        }
        if self.nonfinite_mismatches:
            d["nonfinite_mismatches"] = self.nonfinite_mismatches
        if self.rule.reason:
            d["reason"] = self.rule.reason
        if self.problem:
            d["problem"] = self.problem
        return d


# ---- compare --------------------------------------------------------------------------


def _values(x: torch.Tensor) -> torch.Tensor:
    """float64 values; float32 holds every bf16, fp16 and fp8 value exactly on the way."""
    if x.dtype == torch.float64:
        return x
    if x.dtype == torch.bool:
        return x.to(torch.int64).to(torch.float64)
    return x.to(torch.float32).to(torch.float64) if x.is_floating_point() else x.to(torch.float64)


def _problem(reference: torch.Tensor, candidate: torch.Tensor, rule: Rule) -> str | None:
    if not isinstance(reference, torch.Tensor) or not isinstance(candidate, torch.Tensor):
        return f"expected two tensors, got {type(reference).__name__} and {type(candidate).__name__}"
    if reference.shape != candidate.shape:
        return f"shape {tuple(candidate.shape)} differs from the reference's {tuple(reference.shape)}"
    if reference.dtype != candidate.dtype:
        return f"dtype {candidate.dtype} differs from the reference's {reference.dtype}"
    if not _is_supported(reference.dtype):
        return f"dtype {reference.dtype} cannot be compared (supported: {sorted(str(d) for d in (*_FLOAT_FORMATS, *_INT_DTYPES))})"
    if rule.mode == FP8_STEP and reference.dtype not in FP8_DTYPES:
        return f"rule fp8-step applies to FP8 codes, not to dtype {reference.dtype}"
    return None


def _first_failures(fail: torch.Tensor, ref_values: torch.Tensor, cand_values: torch.Tensor, integral: bool):
    flat = fail.reshape(-1).nonzero().flatten()[:FIRST_FAILURES_SHOWN].tolist()
    ref_flat, cand_flat = ref_values.reshape(-1), cand_values.reshape(-1)
    shape = tuple(fail.shape)
    out = []
    for position in flat:
        index = tuple(int(i) for i in _unravel(position, shape))
        ref, cand = ref_flat[position].item(), cand_flat[position].item()
        if integral:
            ref, cand = int(ref), int(cand)
        out.append((index, ref, cand))
    return out


def _unravel(position: int, shape: tuple[int, ...]) -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(position % size)
        position //= size
    return index[::-1]


def compare(name: str, reference: torch.Tensor, candidate: torch.Tensor, rule: Rule,
            bound: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None) -> Comparison:
    """Judge `candidate` against `reference` under `rule`. A derived rule takes its per-element
    `bound`, the reference's shape: one tensor (|candidate - reference| <= bound) or a pair
    (below, above): reference - below <= candidate <= reference + above (an interval that need
    not be centred on the reference, as diffmoe.tolerance.gemm_interval's). Never raises on mismatched
    tensors: a shape, dtype or rule problem comes back as ok=False with `problem` set."""
    problem = _problem(reference, candidate, rule)
    if problem is None and (rule.mode == DERIVED) != (bound is not None):
        problem = "a derived rule needs its bound tensor, and only a derived rule takes one"
    for part in (bound if isinstance(bound, tuple) else (bound,)):
        if problem is None and part is not None and tuple(part.shape) != tuple(reference.shape):
            problem = f"derived bound of shape {tuple(part.shape)} for a reference of shape {tuple(reference.shape)}"
    total = reference.numel() if isinstance(reference, torch.Tensor) else 0
    if problem:
        return Comparison(name, False, rule, mismatches=0, total=total, max_ulp=0, max_abs=0.0, problem=problem)
    reference = reference.detach()
    candidate = candidate.detach().to(reference.device)
    if total == 0:
        return Comparison(name, True, rule, mismatches=0, total=0, max_ulp=0, max_abs=0.0)

    ref_values, cand_values = _values(reference), _values(candidate)  # float64, input shape
    integral = reference.dtype in _INT_DTYPES
    if integral:
        same_bits = reference == candidate
        nonfinite_bad = torch.zeros_like(same_bits)
        finite = torch.ones_like(same_bits)
        distance = (reference.to(torch.int64) - candidate.to(torch.int64)).abs()
    else:
        dr, dc = _decode(reference), _decode(candidate)
        both_nan = dr.nan & dc.nan
        same_bits = (dr.bits == dc.bits) | both_nan
        nonfinite = dr.nan | dc.nan | dr.inf | dc.inf
        nonfinite_bad = nonfinite & ~same_bits  # an infinity equals only the same infinity
        finite = ~nonfinite
        distance = torch.where(nonfinite, 0, _ordered_distance(dr, dc))

    abs_diff = torch.where(finite, (ref_values - cand_values).abs(), 0.0)
    if rule.mode == BITWISE:
        fail = ~same_bits
    elif rule.mode in (ULP, FP8_STEP):
        fail = nonfinite_bad | ((distance > rule.max_ulp) & (abs_diff > rule.atol))
    else:
        if rule.mode == TOLERANCE:
            within = abs_diff <= rule.atol + rule.rtol * ref_values.abs()
        elif isinstance(bound, tuple):
            below, above = (b.detach().to(device=ref_values.device, dtype=torch.float64) for b in bound)
            diff = torch.where(finite, cand_values - ref_values, 0.0)
            within = (diff <= above) & (-diff <= below)
        else:
            within = abs_diff <= bound.detach().to(device=ref_values.device, dtype=torch.float64)
        fail = nonfinite_bad | (finite & ~within)

    mismatches = int(fail.sum())
    return Comparison(
        name=name,
        ok=mismatches == 0,
        rule=rule,
        mismatches=mismatches,
        total=total,
        max_ulp=int(distance.max()),
        max_abs=float(abs_diff.max()),
        scale=float(torch.where(finite, ref_values.abs(), 0.0).max()),
        first=_first_failures(fail, ref_values, cand_values, integral) if mismatches else [],
        differing=int((~same_bits).sum()),
        nonfinite_mismatches=int(nonfinite_bad.sum()),
        row_failures=fail.reshape(fail.shape[0], -1).sum(1).cpu() if mismatches and fail.dim() else None,
    )
