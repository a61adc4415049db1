"""The one tolerance table: how close each buffer must be, per quant scheme and judging mode.

Two judging modes:
  forced:     one stage judged on its own: the candidate's stage fed the reference's exact
              inputs (teacher forcing), or the reference's stage fed the candidate's own inputs
              (the differential oracle). Tight, and they compose: no upstream difference is in it.
  end_to_end: the buffer after a full run, where every upstream difference has propagated. The
              differential no longer judges intermediates this way (its rules did not compose:
              legitimate one-code flips carried past an elementwise bound); the rows document
              and measure the propagated differences (bench/measure_tolerances.py). The output
              is judged end to end by a bound derived per check from the candidate's own
              down-GEMM input (diffmoe.judge.runner.DERIVED_OUTPUT_REASON).

Every bound is derived from a step size of the formats involved and comes with a one-line
reason: adjacent e4m3 codes are at most 2^-3 apart relative (round-to-nearest moves a value
by at most the half step, 2^-4); a bf16 rounding moves a value by at most 2^-8 relative
(half an ulp), and one bf16 ulp is at most 2^-7 relative; float32 accumulation over an
n-long dot product moves a sum by about sqrt(n) * 2^-24 relative. The bounds are checked
against the differences measured between the reference and the optimized path on each
backend; figures: see docs/tolerances.md.

A backend whose arithmetic differs by design gets its own rows (BACKEND_ROWS), each with its
reason: on CUDA the FP8 GEMMs of prefill tiles accumulate in Hopper's FP8 tensor cores.

Nothing else in diffmoe writes a tolerance number: the differential and teacher-forcing
oracles ask `rule_for`.

Owns the table and its reasons. Must not compare: compare.py applies a rule.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from diffmoe.tolerance.compare import Rule
from diffmoe.problem.config import QUANT_SCHEMES
from diffmoe.problem.numerics import profile
from diffmoe.tolerance.gemm_interval import ACTIVATION_INTERVAL_REASON, GEMM_INTERVAL_REASON
from diffmoe.problem.vocabulary import Buffers

INTERPRETER = "interpreter"
CUDA = "cuda"
BACKENDS = (INTERPRETER, CUDA)

END_TO_END = "end_to_end"
FORCED = "forced"
JUDGING_MODES = (END_TO_END, FORCED)

# Format facts the reasons refer to (relative sizes).
E4M3_STEP = 2**-3  # largest relative gap between adjacent normal e4m3 codes
E4M3_HALF_STEP = 2**-4  # round-to-nearest error bound of an e4m3 cast
BF16_HALF_ULP = 2**-8  # round-to-nearest error bound of a bf16 cast
BF16_ULP = 2**-7  # largest relative gap between adjacent bf16 values


@dataclass(frozen=True)
class ToleranceRow:
    """The rules for one (quant scheme, buffer).

    forced_fused, when set, replaces `forced` for a buffer produced by the fused act_quant
    stage: that stage recomputes silu from the reference's gate_up_output, and silu's exp
    differs by a float32 ulp between numpy, CUDA and torch, so bitwise cannot hold there.
    """

    end_to_end: Rule
    forced: Rule
    forced_fused: Rule | None = None

    def rule(self, mode: str, fused: bool = False) -> Rule:
        if mode == END_TO_END:
            return self.end_to_end
        if mode == FORCED:
            return self.forced_fused if fused and self.forced_fused is not None else self.forced
        raise ValueError(f"mode must be one of {list(JUDGING_MODES)}, got {mode!r}")


_B = Buffers

# Rows and rules that do not depend on the scheme: the activation is a bf16 stage in every
# scheme, and the forced down GEMM epilogue and the reduce are the same arithmetic everywhere.
_ACTIVATION_ROW = ToleranceRow(
    end_to_end=Rule.tolerance(
        atol=2**-9,
        rtol=2**-5,
        reason="gate and up may each arrive 2 bf16 ulp (<= 2^-6 relative) off and the product adds relative "
        "errors (2^-5); 2^-9 floor for silu's steep negative tail",
    ),
    forced=Rule.ulp(
        1,
        reason="silu's exp differs by one float32 ulp between numpy, CUDA and torch, which crosses at most one "
        "bf16 rounding boundary",
    ),
)
# A GEMM stage on the interpreter: the interval any float32 evaluation of its dots rounds into,
# derived per element from the stage's own inputs (diffmoe.tolerance.gemm_interval). It replaced 2 bf16 ulp
# with a 2^-10 floor, which let one extra bf16 rounding inside the K loop pass.
_GEMM_FORCED = Rule.derived(GEMM_INTERVAL_REASON)
# The 2-ulp rule stays where the accumulator is not known to be IEEE float32 (CUDA's bf16 mma).
_DOWN_GEMM_FORCED_ULP = Rule.ulp(
    2,
    atol=2**-10,
    reason="float32 re-association over I (~sqrt(I)*2^-24) and the router weight multiplied before the single "
    "bf16 rounding cross at most two rounding boundaries; 2^-10 floor for cancellation near zero",
)
_GATE_UP_FORCED_ULP = Rule.ulp(
    2,
    atol=2**-10,
    reason="bf16 inputs upcast exactly; float32 re-association over H (~sqrt(H)*2^-24) crosses at most one "
    "or two bf16 rounding boundaries; 2^-10 floor for cancellation near zero",
)
_REDUCE_FORCED = Rule.bitwise("the reduce sums the K rows in order k = 0..K-1 as the reference's profile does (float32, "
                               "rounded once; vllm: bf16 adds for K = 2..4): the same arithmetic, the same bits")

# The fused act+quant on the interpreter: the kernel's silu, div_rn(x, 1 + exp(-x)), and the
# reference's, x / (1 + exp(-x)), are one function there (the interpreter's float32 exp is torch's:
# diffmoe.interpreter.fixes), so the stage is the same arithmetic as the reference's. Measured
# before that: numpy's exp moved 17% of float32 silu values by an ulp, 0 of 65,536 bf16 ones.
_FUSED_SAME_FUNCTION = ("silu is x / (1 + exp(-x)) on both sides with the same exp (the interpreter's is torch's), "
                        "rounded to bf16, then the same amax, division and e4m3 cast: the same bits")

_FP8_ROWS: dict[str, ToleranceRow] = {
    _B.QUANTED_GATE_UP_INPUT: ToleranceRow(
        end_to_end=Rule.bitwise("first stage: identical bf16 input, one float32 division, one round-to-nearest-even e4m3 cast"),
        forced=Rule.bitwise("identical bf16 input, one float32 division, one round-to-nearest-even e4m3 cast"),
    ),
    _B.QUANTED_GATE_UP_INPUT_SCALES: ToleranceRow(
        end_to_end=Rule.bitwise("amax is exact in any reduction order and amax/448 is one correctly rounded float32 division"),
        forced=Rule.bitwise("amax is exact in any reduction order and amax/448 is one correctly rounded float32 division"),
    ),
    _B.GATE_UP_OUTPUT: ToleranceRow(
        end_to_end=Rule.ulp(
            2,
            atol=2**-10,
            reason="inputs arrive bitwise; float32 re-association over H (~sqrt(H)*2^-24) crosses at most one bf16 "
            "rounding boundary, two with the scales applied in another order; 2^-10 floor for cancellation near zero",
        ),
        forced=_GEMM_FORCED,
    ),
    _B.ACTIVATION_OUTPUT: _ACTIVATION_ROW,
    _B.QUANTED_DOWN_INPUT: ToleranceRow(
        end_to_end=Rule.fp8_step(
            atol=1.0,
            reason="upstream differences (<= 2^-5 relative) stay below the e4m3 step (>= 2^-4 relative), so a code "
            "moves to an adjacent one at most; near zero subnormal codes are 2^-9 apart: floor of one code unit (amax/448)",
        ),
        forced=Rule.bitwise("the reference's bf16 activation, one float32 division, one round-to-nearest-even e4m3 cast"),
        forced_fused=Rule.bitwise(_FUSED_SAME_FUNCTION),
    ),
    _B.QUANTED_DOWN_INPUT_SCALES: ToleranceRow(
        end_to_end=Rule.tolerance(
            atol=0.0,
            rtol=2**-4,
            reason="the amax inherits activation_output's 2^-5 relative bound and scale = amax/448; factor 2 for the "
            "float32 division and the amax moving to another element",
        ),
        forced=Rule.bitwise("amax of the reference's bf16 activation is exact; amax/448 is one correctly rounded float32 division"),
        forced_fused=Rule.bitwise(_FUSED_SAME_FUNCTION),
    ),
    _B.DOWN_OUTPUT: ToleranceRow(
        end_to_end=Rule.tolerance(
            atol=2**-6,
            rtol=2**-6,
            reason="a fraction of the I input codes sit one e4m3 step (<= 2^-3 relative) off; with random signs the "
            "dot product moves by ~2^-3*|a*w|*sqrt(flips), about a percent of |down_output| (vLLM accepts 2e-2..3.9e-2)",
        ),
        forced=_GEMM_FORCED,
    ),
    _B.OUTPUT: ToleranceRow(
        end_to_end=Rule.tolerance(
            atol=2**-6,
            rtol=2**-6,
            reason="router weights sum to 1, so the weighted sum over K carries down_output's bound, plus one bf16 "
            "rounding (2^-8)",
        ),
        forced=_REDUCE_FORCED,
    ),
}

_BF16_ROWS: dict[str, ToleranceRow] = {
    _B.GATE_UP_OUTPUT: ToleranceRow(
        end_to_end=_GATE_UP_FORCED_ULP,
        forced=_GEMM_FORCED,
    ),
    _B.ACTIVATION_OUTPUT: _ACTIVATION_ROW,
    _B.DOWN_OUTPUT: ToleranceRow(
        end_to_end=Rule.tolerance(
            atol=2**-8,
            rtol=2**-7,
            reason="some of the I activations arrive a few bf16 ulp (<= 2^-5 relative) off; with random signs the "
            "dot product stays within about one bf16 ulp (2^-7) of its size; 2^-8 floor for cancellation",
        ),
        forced=_GEMM_FORCED,
    ),
    _B.OUTPUT: ToleranceRow(
        end_to_end=Rule.tolerance(
            atol=2**-8,
            rtol=2**-7,
            reason="router weights sum to 1, so the weighted sum over K carries down_output's bound, plus one bf16 "
            "rounding (2^-8)",
        ),
        forced=_REDUCE_FORCED,
    ),
}

# The table. FP8 schemes share their rows: the bounds above depend on the formats, not on
# the scale granularity; a measurement that separates them gets its own rows here.
TOLERANCES: dict[tuple[str, str], ToleranceRow] = {
    **{(quant, buffer): row for quant in QUANT_SCHEMES if quant != "bf16" for buffer, row in _FP8_ROWS.items()},
    **{("bf16", buffer): row for buffer, row in _BF16_ROWS.items()},
}


# On CUDA, prefill tiles (BLOCK_M >= 64) run the FP8 GEMMs on wgmma with one promotion to float32
# per 128-wide K block (optimized/tiles.py; `diffmoe compile-check` shows the instruction). Not yet
# measured on a GPU: the bound is derived, and bench/gpu_checks.sh measures it where one is lent.
_CUDA_FP8_GEMM = Rule.ulp(
    4,
    atol=2**-8,
    reason="Hopper's FP8 wgmma keeps about 14 mantissa bits while it accumulates (DeepSeek-V3 report, sec. 3.3.2); "
    "promoted to float32 once per 128-wide K block, each block's partial sum carries up to ~2^-13 of its size, and "
    "with random signs over Kd/128 <= 64 blocks the output moves by under 2^-10 relative, below one bf16 ulp (2^-7): "
    "two more rounding boundaries than the float32 rows (4 ulp); 2^-8 floor for cancellation near zero",
)
# On CUDA, tl.exp is ex2.approx of x * log2(e), not torch's exp: silu moves by a float32 ulp or two.
_CUDA_FUSED_CODES = Rule.fp8_step(
    reason="CUDA's tl.exp differs from torch's by a float32 ulp or two: the bf16 activation (2^-7) and its scale "
    "(2^-7) move by less than the e4m3 half step 2^-4, so a code moves to an adjacent one at most",
)
_CUDA_FUSED_SCALES = Rule.tolerance(
    atol=0.0,
    rtol=2**-6,
    reason="the largest |activation| may move by one bf16 ulp (<= 2^-7 relative) when CUDA's exp differs by a "
    "float32 ulp; scale = amax/448 moves with it, plus two float32 roundings",
)
BACKEND_ROWS: dict[tuple[str, str, str], ToleranceRow] = {
    **{
        (CUDA, quant, buffer): ToleranceRow(
            end_to_end=_CUDA_FP8_GEMM if buffer == _B.GATE_UP_OUTPUT else _FP8_ROWS[buffer].end_to_end,
            forced=_CUDA_FP8_GEMM,
        )
        for quant in QUANT_SCHEMES if quant != "bf16"
        for buffer in (_B.GATE_UP_OUTPUT, _B.DOWN_OUTPUT)
    },
    **{
        (CUDA, "bf16", buffer): dataclasses.replace(_BF16_ROWS[buffer], forced=rule)
        for buffer, rule in ((_B.GATE_UP_OUTPUT, _GATE_UP_FORCED_ULP), (_B.DOWN_OUTPUT, _DOWN_GEMM_FORCED_ULP))
    },
    **{
        (CUDA, quant, buffer): dataclasses.replace(_FP8_ROWS[buffer], forced_fused=rule)
        for quant in QUANT_SCHEMES if quant != "bf16"
        for buffer, rule in ((_B.QUANTED_DOWN_INPUT, _CUDA_FUSED_CODES), (_B.QUANTED_DOWN_INPUT_SCALES, _CUDA_FUSED_SCALES))
    },
}


# Forced rules a rounding-point choice changes (diffmoe.problem.numerics), on every backend, keyed
# (point, choice, buffer): any profile making that choice, built-in or a user's, gets the row.
# activation_input=fp32_product: the activation is computed from the float32 gate/up accumulators the
# stage does not store (Liger 0.8.5's, reference/rounding/activation.py), so the GEMM's float32
# re-association reaches the activation unrounded: measured on Liger, 5 of 195 campaign configs had
# one activation 2 to 13 bf16 ulp from the reference's, each at a value near zero where the product
# cancels (1e-5 and below).
PROFILE_ROWS: dict[tuple[str, str, str], Rule] = {
    ("activation_input", "fp32_product", _B.ACTIVATION_OUTPUT): Rule.derived(ACTIVATION_INTERVAL_REASON),
}


def tolerance_row(quant: str, buffer: str, backend: str = INTERPRETER) -> ToleranceRow:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if (backend, quant, buffer) in BACKEND_ROWS:
        return BACKEND_ROWS[(backend, quant, buffer)]
    try:
        return TOLERANCES[(quant, buffer)]
    except KeyError:
        known = sorted(b for q, b in TOLERANCES if q == quant)
        if not known:
            raise ValueError(f"quant must be one of {list(QUANT_SCHEMES)}, got {quant!r}") from None
        raise ValueError(f"no tolerance row for buffer {buffer!r} under quant={quant!r}; rows exist for {known}") from None


def rule_for(quant: str, buffer: str, mode: str, *, fused: bool = False, backend: str = INTERPRETER,
             numerics: str | None = None) -> Rule:
    """The rule judging `buffer` under `quant` in `mode` ("end_to_end" or "forced") on `backend`
    ("interpreter", the default, or "cuda"), for the reference's `numerics` profile spec (None:
    diffmoe's): a forced rule of PROFILE_ROWS whose choice the profile makes replaces the table's.

    `fused` matters only in forced mode, for the buffers the fused act_quant stage produces.
    """
    rule = tolerance_row(quant, buffer, backend).rule(mode, fused)
    if mode == FORCED:
        chosen = profile(numerics)
        for (point, choice, row_buffer), profile_rule in PROFILE_ROWS.items():
            if row_buffer == buffer and chosen.uses(point, choice):
                return profile_rule
    return rule
