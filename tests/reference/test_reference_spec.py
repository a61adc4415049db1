"""reference.moe against the independent numpy specification in tests/support/spec_moe.py, stage by stage.

Every stage the reference reports is judged on its own ("teacher forcing"): the spec
recomputes it from the reference's own inputs to that stage, so one wrong stage is named
and does not blur the stages after it. Rules:

  * quantisation codes and scales: bitwise (any NaN code equals any NaN code, NaN signs and
    payloads not being part of the contract);
  * gate_up_output, activation_output, down_output (bf16): inside the spec's interval, the
    bf16 values any float32 evaluation within the error bound rounds to. A fixed ulp count
    cannot be justified, since the reference's float32 accumulation order (BLAS's) and torch's
    float32 exp cannot be reproduced, and would be too loose: a value one bf16 ulp off is the
    signature of a misplaced rounding. The bound is the a-priori float32 error instead
    (gamma_n * sum |a_i w_i| for a dot product of length n, SILU_ULPS float32 ulps for silu),
    far narrower than a bf16 ulp except near a rounding boundary or where the sum cancels: on
    the labelled cases 92% of the gate-up intervals and all but 58 of 264716 activation
    intervals hold a single bf16 value, so a 1-ulp slip is caught almost everywhere (and the
    free-running spec's gate-up and down outputs are at most 1 bf16 ulp from the reference's);
    rows of experts the expert map sends elsewhere: bitwise +0;
  * output: bitwise, from the reference's down_output (the float32 sum in k order is exact
    arithmetic numpy repeats);
  * end to end: the spec run on the problem alone, every bounded stage taking its own answer
    forward, within END_TO_END_REL_TOL of the reference's output.

A meta-test plants bugs in the reference (monkeypatched functions and constants of reference.moe
and reference/rounding/, or a wrapper recomputing a stage wrongly) and requires the stage
comparison to catch each one on at least one labelled case.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import reference.moe as moe
import reference.rounding.gemm_reduce as gemm_points
import reference.rounding.quant as quant_points
import spec_moe as spec
from diffmoe.problem.config import QUANT_BLOCK, MoEConfig
from diffmoe.contract import RunResult
from diffmoe.problem.edge_cases import edge_cases
from diffmoe.problem.inputs import Problem, make_problem
from diffmoe.problem.vocabulary import FP8_DTYPE, FP8_MAX, Buffers, Stages

SCHEMES = ("bf16", "fp8-tensor", "fp8-token", "fp8-block")

# End to end the spec and the reference part only where a bounded stage's interval holds more
# than one bf16 value and the two picked different ones: one bf16 ulp (2^-8 relative) on an
# isolated element. Downstream such an element can move its own e4m3 code by one step (at most
# 2^-3 of its value) or, when it is its unit's amax, the unit's scale by 2^-8 relative, which
# moves only the unit's codes that sit within 2^-8 of a rounding boundary, each by one step.
# One down-input element a step off moves its token's output by about 2^-3 * |a_i| / ||a_t||
# relative; a row spread over I >= 45 values keeps |a_i| / ||a_t|| below 0.5 even for its
# amax, hence 2^-4. bf16 has no code steps: a flip is 2^-8 on one element, 2^-7 allows two.
# A wrong scale, expert or weight is >= 2^-1 off. This is the loose, end-to-end sanity bound;
# the stage checks above are the strict ones. Measured on the labelled cases: <= 1.8e-4 for
# every scheme, flips being rare (85 of 529432 gate-up elements, no activation).
END_TO_END_REL_TOL = {"bf16": 2**-7, "fp8-tensor": 2**-4, "fp8-token": 2**-4, "fp8-block": 2**-4}


# ---- labelled cases ---------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    config: MoEConfig
    num_tokens: int | None = None  # a call with fewer tokens than config.num_tokens
    # make_problem normalises each token's K weights to sum 1, so with K = 1 every weight is
    # exactly 1 and the router-weight arithmetic is invisible; vLLM without renormalisation
    # passes weights below 1. These cases redraw the weights in [0.25, 1).
    unnormalised_weights: bool = False
    # reference/moe.py specifies how NaN and Inf in hidden_states propagate: token 1 gets a NaN,
    # token 3 a -Inf (make_problem never draws either).
    non_finite: bool = False


def _cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    for quant in SCHEMES:
        for fused in (False, True) if quant != "bf16" else (False,):
            prefix = f"{quant}/{'fused' if fused else 'unfused'}"
            labelled = edge_cases(quant, fused=fused)
            for label, cfg in labelled.items():
                cases[f"{prefix}/{label}"] = Case(cfg)
            rw = labelled["router-weight-on-input"]
            cases[f"{prefix}/router-weight-on-input-unnormalised"] = Case(rw, unnormalised_weights=True)
            cases[f"{prefix}/router-weight-down-K=1-unnormalised"] = Case(rw.replace(router_weight="down"), unnormalised_weights=True)
            # H = 2 * 128: two 1x128 groups per token, and w1's [2I, H] = [256, 256] is a 2x2
            # grid of 128x128 blocks (a transposed scale grid is visible); K = 3 makes the
            # reduce add more than two rows.
            cases[f"{prefix}/two-groups-2x2-block-grid-K=3"] = Case(
                MoEConfig(num_tokens=6, num_experts=4, topk=3, hidden=2 * QUANT_BLOCK, inter=QUANT_BLOCK, quant=quant, fused=fused, seed=3)
            )
            cases[f"{prefix}/T=0"] = Case(labelled["T<BLOCK_M"], num_tokens=0)
            cases[f"{prefix}/nan-and-inf-in-hidden-states"] = Case(labelled["T<BLOCK_M"], non_finite=True)
    return cases


CASES = _cases()


@functools.cache
def build_problem(case: Case) -> Problem:
    """The case's problem, built once: the reference and every planted bug only read it."""
    problem = make_problem(case.config, num_tokens=case.num_tokens)
    if case.unnormalised_weights:
        gen = torch.Generator().manual_seed(case.config.seed + 1)
        weights = 0.25 + 0.75 * torch.rand(problem.topk_weights.shape, generator=gen)
        problem = dataclasses.replace(problem, topk_weights=weights.to(torch.float32))
    if case.non_finite:
        hidden = problem.hidden_states.clone()
        hidden[1, 3], hidden[3, 5] = float("nan"), float("-inf")
        problem = dataclasses.replace(problem, hidden_states=hidden)
    return problem


# ---- comparisons ------------------------------------------------------------------------


def _float_bits_equal(ref: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Bitwise equality of float32 arrays (bf16 values included), any NaN equal to any NaN."""
    ref, want = np.ascontiguousarray(ref, np.float32), np.ascontiguousarray(want, np.float32)
    return (ref.view(np.uint32) == want.view(np.uint32)) | (np.isnan(ref) & np.isnan(want))


def _first(bad: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(bad)[0])


def _shape_problem(name: str, ref: np.ndarray, shape: tuple[int, ...]) -> str | None:
    return None if ref.shape == shape else f"{name}: shape {ref.shape}, spec {shape}"


def check_codes(name: str, ref: np.ndarray, want: np.ndarray) -> list[str]:
    if (msg := _shape_problem(name, ref, want.shape)) is not None:
        return [msg]
    bad = (ref != want) & ~(spec.e4m3_is_nan(ref) & spec.e4m3_is_nan(want))
    if not bad.any():
        return []
    at = _first(bad)
    return [f"{name}: {int(bad.sum())}/{bad.size} codes differ, first at {at}: reference {ref[at]:#04x}, spec {want[at]:#04x}"]


def check_bitwise(name: str, ref: np.ndarray, want: np.ndarray) -> list[str]:
    if (msg := _shape_problem(name, ref, want.shape)) is not None:
        return [msg]
    bad = ~_float_bits_equal(ref, want)
    if not bad.any():
        return []
    at = _first(bad)
    return [f"{name}: {int(bad.sum())}/{bad.size} values differ bitwise, first at {at}: reference {ref[at]!r}, spec {want[at]!r}"]


def check_bounded(name: str, ref: np.ndarray, want: spec.Bounded, remote_rows: np.ndarray) -> list[str]:
    if (msg := _shape_problem(name, ref, want.nearest.shape)) is not None:
        return [msg]
    problems = []
    nan_expected = np.isnan(want.lo) | np.isnan(want.hi)
    inside = np.where(nan_expected, np.isnan(ref), (ref >= want.lo) & (ref <= want.hi))
    if not inside.all():
        at = _first(~inside)
        problems.append(
            f"{name}: {int((~inside).sum())}/{inside.size} values outside the spec's interval, first at {at}: "
            f"reference {ref[at]!r}, interval [{want.lo[at]!r}, {want.hi[at]!r}], exact {want.exact[at]!r}"
        )
    zero = ref[remote_rows].view(np.uint32) != 0  # rows of non-local experts: exactly +0
    if zero.any():
        problems.append(f"{name}: {int(zero.sum())} values of rows routed to non-local experts are not +0")
    return problems


def _reported(result: RunResult, name: str, problems: list[str]) -> np.ndarray | None:
    if name not in result.intermediates:
        problems.append(f"{name}: not reported")
        return None
    return spec.to_numpy(result.intermediates[name])


def spec_mismatches(problem: Problem, result: RunResult) -> list[str]:
    """Every stage of `result` against the spec fed the reference's inputs to that stage.
    Returns one line per disagreement; empty when the reference follows the spec."""
    p = spec.problem_arrays(problem)
    q = p.quant
    problems: list[str] = []
    remote = np.flatnonzero(p.local < 0)  # routed rows of non-local experts

    def quant_stage(codes_name: str, scales_name: str, x: np.ndarray) -> np.ndarray:
        """Checks the reference's quantisation of x bitwise; returns its dequantised values
        (the spec's own where the reference's are missing or misshapen)."""
        codes, scales = spec.quantize(x, q)
        ref_codes = _reported(result, codes_name, problems)
        ref_scales = _reported(result, scales_name, problems)
        if ref_codes is not None:
            problems.extend(check_codes(codes_name, ref_codes, codes))
        if ref_scales is not None:
            problems.extend(check_bitwise(scales_name, ref_scales, scales))
        if ref_codes is not None and ref_scales is not None and ref_codes.shape == codes.shape and ref_scales.shape == scales.shape:
            codes, scales = ref_codes, ref_scales
        return spec.dequantize(codes, scales, q)

    def bounded_stage(name: str, ref: np.ndarray | None, want: spec.Bounded) -> np.ndarray:
        """Checks ref against the interval; returns what the next stage reads (the spec's own
        answer where the reference's is missing or misshapen)."""
        if ref is None:
            return want.nearest
        problems.extend(check_bounded(name, ref, want, remote))
        return ref if ref.shape == want.nearest.shape else want.nearest

    # input weighting and quantisation
    x = p.hidden_states
    if p.router_weight == "input":
        x = spec.weight_input(x, p.topk_weights)
    if p.is_fp8:
        a1 = quant_stage(Buffers.QUANTED_GATE_UP_INPUT, Buffers.QUANTED_GATE_UP_INPUT_SCALES, x)
    else:
        a1 = x
    a1 = np.repeat(a1, p.topk, axis=0)  # [TK, H]

    # gate-up GEMM
    w1 = spec.dequantize_weight(p.w1, p.w1_scale, p.weight_layout)
    gate_up = bounded_stage(
        Buffers.GATE_UP_OUTPUT, _reported(result, Buffers.GATE_UP_OUTPUT, problems), spec.expert_gemm(a1, w1, p.local)
    )

    # activation: a fused pipeline does not report it, but the reference still computes it and
    # quantises it; it is recomputed with the reference's own stage (reference_stage on the
    # reference's gate_up_output) so that its quantisation can be checked bit for bit, and
    # checked against the spec like the rest.
    want_act = spec.silu_and_mul(gate_up, p.swiglu_limit)
    if problem.config.fused:
        gu = torch.from_numpy(gate_up.copy()).to(torch.bfloat16)  # exact: the values are bf16 already
        recomputed = moe.reference_stage(Stages.ACTIVATION, {Buffers.GATE_UP_OUTPUT: gu}, problem)[Buffers.ACTIVATION_OUTPUT]
        act = bounded_stage(f"{Buffers.ACTIVATION_OUTPUT} (recomputed)", spec.to_numpy(recomputed), want_act)
    else:
        act = bounded_stage(Buffers.ACTIVATION_OUTPUT, _reported(result, Buffers.ACTIVATION_OUTPUT, problems), want_act)

    if p.is_fp8:
        a2 = quant_stage(Buffers.QUANTED_DOWN_INPUT, Buffers.QUANTED_DOWN_INPUT_SCALES, act)
    else:
        a2 = act

    # down GEMM and reduce
    w2 = spec.dequantize_weight(p.w2, p.w2_scale, p.weight_layout)
    row_weight = p.topk_weights.reshape(-1) if p.router_weight == "down" else None
    down = bounded_stage(
        Buffers.DOWN_OUTPUT, _reported(result, Buffers.DOWN_OUTPUT, problems), spec.expert_gemm(a2, w2, p.local, row_weight)
    )
    want_out = spec.reduce(down, p.num_tokens, p.topk, p.routed_scaling_factor)
    problems.extend(check_bitwise(Buffers.OUTPUT, spec.to_numpy(result.output), want_out))
    reported_out = _reported(result, Buffers.OUTPUT, problems)
    if reported_out is not None:
        problems.extend(check_bitwise(f"{Buffers.OUTPUT} (intermediates)", reported_out, want_out))
    return problems


def end_to_end_rel_error(problem: Problem, result: RunResult) -> tuple[np.ndarray, list[str]]:
    """Per token ||ref_t - spec_t|| / ||spec_t|| against the free-running spec, over the tokens
    whose spec output is finite and not all zero, and the tokens where the two disagree on what
    cannot be a relative error: a token routed to non-local experts only must be +0 in the
    reference; NaN and Inf elements must sit where the spec has them, and be the same Inf (any
    NaN equal to any NaN), with finite values elsewhere (their size is left to the stage checks)."""
    want = spec.spec_moe(problem)[Buffers.OUTPUT]  # [T, H] float32 (bf16 values)
    got = spec.to_numpy(result.output)
    if got.shape != want.shape:
        return np.zeros(0), [f"output shape {got.shape}, spec {want.shape}"]
    finite = np.isfinite(want)
    regular_tokens = finite.all(axis=1)
    zero_tokens = regular_tokens & (want == 0).all(axis=1)
    mismatches = []
    for t in np.flatnonzero(zero_tokens):
        if np.any(got[t].view(np.uint32) != 0):
            mismatches.append(f"token {t}: routed to non-local experts only, reference not +0")
    for t in np.flatnonzero(~regular_tokens):
        same = np.where(finite[t], np.isfinite(got[t]), _float_bits_equal(got[t], want[t]))
        if not same.all():
            mismatches.append(f"token {t}: NaN/Inf pattern differs at {np.flatnonzero(~same)[:4]} of {got.shape[1]}")
    keep = regular_tokens & ~zero_tokens
    w64, g64 = want[keep].astype(np.float64), got[keep].astype(np.float64)
    rel = np.linalg.norm(g64 - w64, axis=1) / np.linalg.norm(w64, axis=1)
    return rel, mismatches


# ---- the reference follows the spec -----------------------------------------------------


@functools.cache
def reference_result(case: Case) -> RunResult:
    return moe.reference_moe(build_problem(case))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_reference_matches_spec_stage_by_stage(case):
    problem = build_problem(case)
    result = reference_result(case)
    assert spec_mismatches(problem, result) == []


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_reference_matches_free_running_spec_end_to_end(case):
    problem = build_problem(case)
    result = reference_result(case)
    rel, exact_mismatches = end_to_end_rel_error(problem, result)
    assert exact_mismatches == []
    worst = rel.max(initial=0.0)
    assert worst <= END_TO_END_REL_TOL[case.config.quant], f"worst token rel err {worst:.4g}"


# ---- the spec's roundings against torch's casts ----------------------------------------
# Independent implementations cross-checked: a mistake in the spec's rounding would
# otherwise show up as a reference "bug", or hide one.


def test_spec_bf16_rounding_matches_torch_on_every_pattern_class():
    gen = np.random.default_rng(0)
    high = np.arange(2**16, dtype=np.uint32) << 16  # every bf16 pattern (all exponents, signs, NaN, Inf)
    low = np.concatenate([[0, 0x7FFF, 0x8000, 0x8001, 0xFFFF], gen.integers(0, 2**16, 3)]).astype(np.uint32)  # ties and near-ties
    x = (high[:, None] | low[None, :]).reshape(-1).view(np.float32)
    ours = spec.bf16_round(x)
    theirs = spec.to_numpy(torch.from_numpy(x.copy()).to(torch.bfloat16))
    number = ~np.isnan(x)
    assert np.array_equal(spec.bf16_bits(ours)[number], spec.bf16_bits(theirs)[number])
    assert np.all(np.isnan(ours[~number]))


def test_spec_e4m3_table_and_rounding_match_torch():
    decoded = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE).float().numpy()
    assert np.array_equal(spec.E4M3_VALUES.astype(np.float32), decoded, equal_nan=True)
    gen = np.random.default_rng(1)
    every_bf16 = spec.to_numpy(torch.arange(2**16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16))
    midpoints = (spec.E4M3_VALUES[:126] + spec.E4M3_VALUES[1:127]) / 2  # exact ties, both signs
    others = [gen.standard_normal(100_000) * 100, gen.standard_normal(20_000) * 2.0**-8, midpoints, -midpoints]
    values = np.concatenate([every_bf16, *(v.astype(np.float32) for v in others)])  # float32 throughout: a
    # signalling NaN among the bf16 patterns would raise numpy's invalid-cast warning in float64
    values = np.where(np.isnan(values), values, np.clip(values, -FP8_MAX, FP8_MAX)).astype(np.float32)
    ours = spec.e4m3_encode(values)
    theirs = torch.from_numpy(values.copy()).to(FP8_DTYPE).view(torch.uint8).numpy()
    nan = np.isnan(values)
    assert np.array_equal(ours[~nan], theirs[~nan])
    assert np.all(spec.e4m3_is_nan(ours[nan])) and np.all(spec.e4m3_is_nan(theirs[nan]))


def test_spec_refuses_unsaturated_values():
    with pytest.raises(ValueError, match="saturated"):
        spec.e4m3_encode(np.array([449.0], np.float32))


# ---- planted bugs -----------------------------------------------------------------------
# Each plant(monkeypatch) returns the runner to call in place of reference_moe, with the bug
# in place; `schemes` are the quant schemes on which the bug changes anything at all.


def _weight_scale_x2(mp):
    orig = gemm_points.dequantize_weight  # what the dequantize_first GEMM choice calls
    mp.setattr(gemm_points, "dequantize_weight", lambda w, s, q: orig(w, None if s is None else s * 2, q))
    return moe.reference_moe


def _block_scales_transposed(mp):
    # The scale grid's bytes read with rows and columns swapped (a kernel with the strides of
    # scale[e, kblk, nblk]); on grids of one row or column the bytes are the same.
    orig = gemm_points.dequantize_weight

    def bad(w, s, q):
        if q == "fp8-block":
            s = s.transpose(1, 2).contiguous().view(s.shape)
        return orig(w, s, q)

    mp.setattr(gemm_points, "dequantize_weight", bad)
    return moe.reference_moe


def _token_quant_with_tensor_amax(mp):
    orig = moe.quantize_activation

    def bad(x, q, r=None):
        if q != "fp8-token":
            return orig(x, q, r)
        codes, scale = orig(x, "fp8-tensor", r)
        return codes, scale.expand(x.shape[0], 1).clone()  # per-token shape, one tensor-wide scale

    mp.setattr(moe, "quantize_activation", bad)
    return moe.reference_moe


def _group_scale_from_first_group(mp):
    orig = moe.quantize_activation

    def bad(x, q, r=None):
        if q != "fp8-block":
            return orig(x, q, r)
        _, scale = orig(x, q, r)
        first = scale[:, :1].expand_as(scale).contiguous()  # every group takes group 0's scale
        codes = (x.float() / first.repeat_interleave(QUANT_BLOCK, dim=1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
        return codes, first

    mp.setattr(moe, "quantize_activation", bad)
    return moe.reference_moe


def _stage_wrapper(mp, bad_stage):
    """reference_moe runs every stage through moe.reference_stage: replace it with
    bad_stage(orig, stage, inputs, problem), which recomputes chosen stages wrongly."""
    orig = moe.reference_stage
    mp.setattr(moe, "reference_stage", lambda stage, inputs, problem: bad_stage(orig, stage, inputs, problem))
    return moe.reference_moe


def _input_router_weight_ignored(mp):
    def bad(orig, stage, inputs, problem):
        if problem.config.router_weight == "input" and stage in (Stages.QUANT_INPUT, Stages.GATE_UP_GEMM):
            inputs = {**inputs, Buffers.TOPK_WEIGHTS: torch.ones_like(problem.topk_weights)}  # x * 1 == x
        return orig(stage, inputs, problem)

    return _stage_wrapper(mp, bad)


def _router_weight_after_rounding(mp):
    def bad(orig, stage, inputs, problem):
        if stage != Stages.DOWN_GEMM or problem.config.router_weight != "down":
            return orig(stage, inputs, problem)
        ones = torch.ones_like(problem.topk_weights)
        down = orig(stage, {**inputs, Buffers.TOPK_WEIGHTS: ones}, problem)[Buffers.DOWN_OUTPUT]  # bf16, unweighted
        weighted = down.float() * problem.topk_weights.reshape(-1, 1)  # the weight after the rounding
        return {Buffers.DOWN_OUTPUT: weighted.to(torch.bfloat16)}

    return _stage_wrapper(mp, bad)


def _reduce_in_bf16(mp):
    def bad(orig, stage, inputs, problem):
        if stage != Stages.REDUCE:
            return orig(stage, inputs, problem)
        per_token = inputs[Buffers.DOWN_OUTPUT].view(problem.num_tokens, problem.config.topk, problem.config.hidden)
        acc = per_token[:, 0]  # [T, H] bf16
        for j in range(1, problem.config.topk):
            acc = acc + per_token[:, j]  # bf16 + bf16: rounded to bf16 after every add
        return {Buffers.OUTPUT: acc}

    return _stage_wrapper(mp, bad)


def _token_floor_is_group_floor(mp):
    mp.setattr(quant_points, "MIN_SCALE", quant_points.GROUP_AMAX_FLOOR / FP8_MAX)  # matters for all-zero units only
    return moe.reference_moe


def _group_floor_dropped(mp):
    mp.setattr(quant_points, "GROUP_AMAX_FLOOR", 0.0)  # an all-zero group then divides 0 by 0
    return moe.reference_moe


def _silu_of_up(mp):
    def bad(gate_up, limit=None, r=None):
        i = gate_up.shape[1] // 2
        return (F.silu(gate_up[:, i:].float()) * gate_up[:, :i].float()).to(torch.bfloat16)

    mp.setattr(moe, "silu_and_mul", bad)
    return moe.reference_moe


def _non_finite_sanitised(mp):
    def run(problem):
        clean = torch.nan_to_num(problem.hidden_states)  # NaN -> 0, Inf -> the largest finite
        return moe.reference_moe(dataclasses.replace(problem, hidden_states=clean))

    return run


FP8 = SCHEMES[1:]
PLANTED_BUGS = {
    "weight-scale-x2": (_weight_scale_x2, FP8),
    "block-weight-scales-transposed": (_block_scales_transposed, ("fp8-block",)),
    "per-token-quant-with-tensor-amax": (_token_quant_with_tensor_amax, ("fp8-token",)),
    "group-scale-from-first-group": (_group_scale_from_first_group, ("fp8-block",)),
    "router-weight-on-input-ignored": (_input_router_weight_ignored, SCHEMES),
    "router-weight-after-bf16-rounding": (_router_weight_after_rounding, SCHEMES),
    "reduce-in-bf16": (_reduce_in_bf16, SCHEMES),
    "token-scale-floor-is-group-floor": (_token_floor_is_group_floor, ("fp8-tensor", "fp8-token")),
    "group-amax-floor-dropped": (_group_floor_dropped, ("fp8-block",)),
    "silu-of-up-times-gate": (_silu_of_up, SCHEMES),
    "non-finite-inputs-sanitised": (_non_finite_sanitised, SCHEMES),
}


def first_catching_case(run, schemes) -> str | None:
    """The first labelled case on which the stage comparison fails under `run`."""
    for label, case in CASES.items():
        if case.config.quant not in schemes:
            continue
        problem = build_problem(case)
        if spec_mismatches(problem, run(problem)):
            return label
    return None


@pytest.mark.parametrize("bug", PLANTED_BUGS)
def test_planted_bug_is_caught(bug, monkeypatch):
    plant, schemes = PLANTED_BUGS[bug]
    run = plant(monkeypatch)
    assert first_catching_case(run, schemes) is not None, f"{bug}: no labelled case catches it"
