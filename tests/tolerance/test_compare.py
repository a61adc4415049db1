"""compare / ulp_distance / the tolerance table: each rule catches what it exists for and
passes what it must pass."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from diffmoe.tolerance.compare import NAN_VS_NUMBER_DISTANCE, Rule, compare, ulp_distance
from diffmoe.problem.config import MoEConfig, QUANT_SCHEMES
from diffmoe.tolerance.table import END_TO_END, FORCED, TOLERANCES, rule_for
from diffmoe.problem.vocabulary import FP8_DTYPE, Buffers, Stages, materialised_buffers, pipeline_stages

FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16, FP8_DTYPE]
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16, FP8_DTYPE: torch.int8}
NAN = float("nan")
INF = float("inf")


def _values(dtype, n=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=gen) * 4).to(dtype)


def _bump_bits(x: torch.Tensor, index, steps: int = 1) -> torch.Tensor:
    """A copy of x with the bit pattern at `index` moved by `steps` (away from zero for positives)."""
    y = x.clone()
    y.view(BITS[x.dtype])[index] += steps
    return y


# ---- ulp_distance ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_adjacent_values_are_one_ulp_apart(dtype):
    magnitudes = (_values(torch.float32).abs() + 0.5).clamp(max=200)  # below the top code
    for x in (magnitudes.to(dtype), (-magnitudes).to(dtype)):
        assert ulp_distance(x, _bump_bits(x, slice(None))).tolist() == [1] * x.numel()


def test_ulp_distance_matches_nextafter_for_float32():
    x = _values(torch.float32, 256)
    up = torch.nextafter(x, torch.full_like(x, INF))
    two_up = torch.nextafter(up, torch.full_like(x, INF))
    assert ulp_distance(x, up).eq(1).all()
    assert ulp_distance(two_up, x).eq(2).all()


def test_signed_zeros_are_one_point_and_zero_is_crossed():
    z = torch.tensor([0.0, -0.0, 1e-45, -1e-45])  # +0, -0, +min subnormal, -min subnormal
    assert ulp_distance(z[0:1], z[1:2]).item() == 0
    assert ulp_distance(z[2:3], z[3:4]).item() == 2  # -min, (+-)0, +min
    assert ulp_distance(z[1:2], z[2:3]).item() == 1


def test_e4m3_codes_in_order():
    codes = torch.tensor([448.0, 416.0, -448.0, 0.001953125], dtype=torch.float32).to(FP8_DTYPE)
    others = torch.tensor([416.0, 448.0, 448.0, 0.0], dtype=torch.float32).to(FP8_DTYPE)
    # 416 and 448 are adjacent top codes; -448 to 448 spans both halves; 2^-9 is the smallest subnormal
    assert ulp_distance(codes, others).tolist() == [1, 1, 2 * 126, 1]


def test_nan_distances():
    a = torch.tensor([NAN, NAN, 1.0])
    b = torch.tensor([NAN, 2.0, NAN])
    assert ulp_distance(a, b).tolist() == [0, NAN_VS_NUMBER_DISTANCE, NAN_VS_NUMBER_DISTANCE]


def test_ulp_distance_of_integers_is_the_difference():
    assert ulp_distance(torch.tensor([1, 5, -3]), torch.tensor([1, 2, 4])).tolist() == [0, 3, 7]


def test_ulp_distance_of_float64_extremes_saturates():
    big = torch.tensor([torch.finfo(torch.float64).max], dtype=torch.float64)
    distance = ulp_distance(big, -big).item()
    assert distance == torch.iinfo(torch.int64).max  # the true 2 * 0x7FEF... does not fit


def test_ulp_distance_rejects_mismatched_tensors():
    with pytest.raises(ValueError, match="equal shapes and dtypes"):
        ulp_distance(torch.zeros(2), torch.zeros(3))


@settings(max_examples=200, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False), st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_ulp_distance_is_a_metric_on_float32(x, y):
    a, b = torch.tensor([x]), torch.tensor([y])
    d = ulp_distance(a, b).item()
    assert d == ulp_distance(b, a).item()
    assert (d == 0) == (x == y)  # +0 == -0 on both sides
    if d == 1:
        assert torch.nextafter(a, b).item() == y


# ---- compare: catches --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_one_ulp_change_is_caught_and_located(dtype):
    ref = _values(dtype, 48).reshape(6, 8)
    cand = _bump_bits(ref, (4, 3))
    bitwise = compare("gate_up_output", ref, cand, Rule.bitwise())
    assert not bitwise.ok
    assert (bitwise.mismatches, bitwise.differing, bitwise.max_ulp) == (1, 1, 1)
    index, ref_value, cand_value = bitwise.first[0]
    assert index == (4, 3)
    assert ref_value == ref[4, 3].item() and cand_value == cand[4, 3].item()
    assert bitwise.max_abs == pytest.approx(abs(ref_value - cand_value))
    assert "(4, 3)" in bitwise.summary()
    assert not compare("x", ref, cand, Rule.ulp(0)).ok
    assert compare("x", ref, cand, Rule.ulp(1)).ok


def test_two_ulp_change_fails_one_ulp_rule_but_passes_absolute_floor():
    ref = torch.tensor([1.0, 2.0, 0.0], dtype=torch.bfloat16)
    cand = _bump_bits(ref, 1, 2)
    result = compare("x", ref, cand, Rule.ulp(1))
    assert not result.ok and result.max_ulp == 2 and result.first[0][0] == (1,)
    assert compare("x", ref, cand, Rule.ulp(1, atol=2**-5)).ok  # two bf16 ulps at 2.0 are 2^-5
    assert not compare("x", ref, cand, Rule.ulp(1, atol=2**-8)).ok


def test_first_lists_at_most_five_in_row_major_order():
    ref = torch.zeros(4, 4)
    cand = ref.clone()
    cand[3, 0] = cand[0, 2] = cand[2, 1] = cand[1, 1] = cand[1, 3] = cand[3, 3] = 1.0
    result = compare("x", ref, cand, Rule.bitwise())
    assert result.mismatches == 6
    assert [index for index, _, _ in result.first] == [(0, 2), (1, 1), (1, 3), (2, 1), (3, 0)]


def test_fp8_step_allows_adjacent_codes_only():
    ref = torch.tensor([1.0, 1.125, -3.0, 448.0]).to(FP8_DTYPE)
    one_step = torch.tensor([1.125, 1.0, -3.25, 416.0]).to(FP8_DTYPE)
    two_steps = torch.tensor([1.25, 1.125, -3.0, 448.0]).to(FP8_DTYPE)
    assert compare("q", ref, one_step, Rule.fp8_step()).ok
    result = compare("q", ref, two_steps, Rule.fp8_step())
    assert not result.ok and result.mismatches == 1 and result.max_ulp == 2 and result.first[0][0] == (0,)
    assert not compare("q", ref, one_step, Rule.bitwise()).ok


def test_fp8_step_floor_in_code_units():
    ref = torch.tensor([2**-9, 0.25]).to(FP8_DTYPE)  # subnormal codes are 2^-9 apart
    cand = torch.tensor([2**-6, 0.25]).to(FP8_DTYPE)  # 8 subnormal steps, 0.027 code units
    assert not compare("q", ref, cand, Rule.fp8_step()).ok
    assert compare("q", ref, cand, Rule.fp8_step(atol=1.0)).ok


def test_fp8_step_refuses_other_dtypes():
    result = compare("x", torch.zeros(3), torch.zeros(3), Rule.fp8_step())
    assert not result.ok and "fp8-step" in result.problem


def test_tolerance_mode_is_atol_plus_rtol_times_reference():
    ref = torch.tensor([1.0, 100.0, 0.0])
    assert compare("x", ref, torch.tensor([1.01, 101.0, 0.01]), Rule.tolerance(atol=0.01, rtol=0.01)).ok
    result = compare("x", ref, torch.tensor([1.03, 100.0, 0.0]), Rule.tolerance(atol=0.01, rtol=0.01))
    assert not result.ok and result.first[0][0] == (0,)


# ---- compare: NaN and infinities ---------------------------------------------------------


@pytest.mark.parametrize("rule", [Rule.bitwise(), Rule.ulp(0), Rule.tolerance(0.0, 0.0)], ids=lambda r: r.mode)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, FP8_DTYPE])
def test_nan_in_the_same_place_is_equal_even_with_other_payloads(rule, dtype):
    ref = torch.tensor([1.0, NAN, 2.0]).to(dtype)
    cand = ref.clone()
    bits = cand.view(BITS[dtype])
    bits[1] = bits[1] | -128 if dtype == FP8_DTYPE else bits[1] - 1  # e4m3fn: the other-sign NaN; else another payload
    assert torch.isnan(cand.float()[1])
    assert not torch.equal(ref.view(BITS[dtype]), cand.view(BITS[dtype]))
    result = compare("x", ref, cand, rule)
    assert result.ok and result.differing == 0


@pytest.mark.parametrize(
    "rule",
    [Rule.bitwise(), Rule.ulp(10**6, atol=1e9), Rule.tolerance(1e9, 1e9)],
    ids=lambda r: r.mode,
)
def test_nan_against_a_number_fails_in_every_mode(rule):
    ref = torch.tensor([1.0, 2.0, NAN])
    cand = torch.tensor([1.0, NAN, 3.0])
    result = compare("x", ref, cand, rule)
    assert not result.ok and result.mismatches == 2 and result.nonfinite_mismatches == 2
    assert [index for index, _, _ in result.first] == [(1,), (2,)]
    assert math.isnan(result.first[0][2])


def test_nan_against_a_code_fails_fp8_step():
    ref = torch.tensor([448.0, 1.0]).to(FP8_DTYPE)
    cand = torch.tensor([NAN, 1.0]).to(FP8_DTYPE)  # e4m3fn NaN is the code right above 448
    assert not compare("q", ref, cand, Rule.fp8_step()).ok


@pytest.mark.parametrize("rule", [Rule.ulp(1), Rule.tolerance(1e9, 1e9)], ids=lambda r: r.mode)
def test_infinities(rule):
    big = torch.finfo(torch.float32).max
    ref = torch.tensor([INF, -INF, INF, big, 1.0])
    same = ref.clone()
    assert compare("x", ref, same, rule).ok
    cand = torch.tensor([INF, INF, big, INF, 1.0])  # sign flip, overflow, overflow
    result = compare("x", ref, cand, rule)
    assert result.mismatches == 3 and result.nonfinite_mismatches == 3
    assert [index for index, _, _ in result.first] == [(1,), (2,), (3,)]
    assert math.isfinite(result.max_abs)


def test_signed_zero_is_a_bitwise_difference_only():
    ref, cand = torch.tensor([0.0]), torch.tensor([-0.0])
    assert not compare("x", ref, cand, Rule.bitwise()).ok
    assert compare("x", ref, cand, Rule.ulp(0)).ok


# ---- compare: stays quiet, and reports problems instead of raising -----------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.int32, torch.uint8, torch.bool])
@pytest.mark.parametrize("mode", ["bitwise", "ulp", "tolerance"])
def test_identical_tensors_pass(dtype, mode):
    ref = _values(torch.float32, 40).to(dtype).reshape(5, 8)
    result = compare("x", ref, ref.clone(), Rule(mode))
    assert result.ok and result.mismatches == 0 and result.differing == 0 and result.first == []
    assert result.max_ulp == 0 and result.max_abs == 0.0 and result.total == 40


def test_strided_views_compare_by_logical_index():
    base = _values(torch.bfloat16, 64).reshape(8, 8)
    ref = base.t()[2:6]  # non-contiguous
    cand = ref.clone()
    cand[1, 5] = cand[1, 5] * 2
    result = compare("x", ref, cand, Rule.bitwise())
    assert result.mismatches == 1 and result.first[0][0] == (1, 5)


def test_integer_buffers():
    ref = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    cand = torch.tensor([[0, 1], [2, 4]], dtype=torch.int32)
    result = compare("sorted_token_ids", ref, cand, Rule.bitwise())
    assert not result.ok and result.first == [((1, 1), 3, 4)] and result.max_ulp == 1


@pytest.mark.parametrize(
    "cand, words",
    [
        (torch.zeros(3, 4, dtype=torch.bfloat16), "shape (3, 4)"),
        (torch.zeros(4, 3, dtype=torch.float32), "dtype torch.float32"),
    ],
)
def test_shape_or_dtype_mismatch_is_a_problem_not_an_exception(cand, words):
    result = compare("x", torch.zeros(4, 3, dtype=torch.bfloat16), cand, Rule.bitwise())
    assert not result.ok and words in result.problem and result.problem in result.summary()


def test_empty_tensors_pass():
    assert compare("x", torch.zeros(0, 7), torch.zeros(0, 7), Rule.bitwise()).ok


def test_rule_validation():
    with pytest.raises(ValueError, match="mode"):
        Rule("close")
    with pytest.raises(ValueError, match="max_ulp"):
        Rule.ulp(-1)
    with pytest.raises(ValueError, match="atol"):
        Rule.tolerance(atol=float("nan"), rtol=0.0)
    assert Rule.fp8_step().max_ulp == 1


def test_figures_carry_the_rule_and_reason():
    ref = torch.tensor([1.0, 2.0])
    result = compare("x", ref, torch.tensor([1.0, 3.0]), Rule.ulp(2, reason="why"))
    figures = result.figures()
    assert figures["reason"] == "why" and figures["mismatches"] == 1 and figures["first"]


# ---- tolerance table -------------------------------------------------------------------------


def _configs():
    for quant in QUANT_SCHEMES:
        for fused in ([False, True] if quant != "bf16" else [False]):
            for output in ("separate", "workspace"):
                yield MoEConfig(quant=quant, fused=fused, output=output)


@pytest.mark.parametrize("cfg", list(_configs()), ids=lambda c: f"{c.quant}-{'fused' if c.fused else 'unfused'}-{c.output}")
def test_every_materialised_buffer_has_a_reasoned_rule_in_both_modes(cfg):
    buffers = set(materialised_buffers(cfg)) | {Buffers.ACTIVATION_OUTPUT}
    for buffer in buffers:
        for mode in (END_TO_END, FORCED):
            rule = rule_for(cfg.quant, buffer, mode, fused=cfg.fused)
            assert rule.reason and len(rule.reason.splitlines()) == 1, (buffer, mode)


def test_bf16_has_no_quant_rows():
    with pytest.raises(ValueError, match="no tolerance row"):
        rule_for("bf16", Buffers.QUANTED_DOWN_INPUT, FORCED)
    assert {b for q, b in TOLERANCES if q == "bf16"} == {
        Buffers.GATE_UP_OUTPUT,
        Buffers.ACTIVATION_OUTPUT,
        Buffers.DOWN_OUTPUT,
        Buffers.OUTPUT,
    }


def test_unknown_mode_or_scheme():
    with pytest.raises(ValueError, match="mode"):
        rule_for("fp8-token", Buffers.OUTPUT, "loose")
    with pytest.raises(ValueError, match="quant"):
        rule_for("int4", Buffers.OUTPUT, FORCED)


@pytest.mark.parametrize("quant", [q for q in QUANT_SCHEMES if q != "bf16"])
def test_table_semantics(quant):
    b = Buffers
    # forced: quantisation is exact, after silu in the fused kernel too on the interpreter (one exp);
    # on CUDA, whose exp is another function, the fused codes may move one step
    for buffer in (b.QUANTED_GATE_UP_INPUT, b.QUANTED_GATE_UP_INPUT_SCALES, b.QUANTED_DOWN_INPUT, b.QUANTED_DOWN_INPUT_SCALES):
        assert rule_for(quant, buffer, FORCED).mode == "bitwise"
        assert rule_for(quant, buffer, FORCED, fused=True).mode == "bitwise"
    assert rule_for(quant, b.QUANTED_DOWN_INPUT, FORCED, fused=True, backend="cuda").mode == "fp8-step"
    assert rule_for(quant, b.QUANTED_DOWN_INPUT_SCALES, FORCED, fused=True, backend="cuda").mode != "bitwise"
    assert rule_for(quant, b.OUTPUT, FORCED).mode == "bitwise"
    activation = rule_for(quant, b.ACTIVATION_OUTPUT, FORCED)
    assert (activation.mode, activation.max_ulp, activation.atol) == ("ulp", 1, 0.0)
    for gemm in (b.GATE_UP_OUTPUT, b.DOWN_OUTPUT):  # the interval derived from the stage's inputs
        assert rule_for(quant, gemm, FORCED).mode == "derived"
    # end to end: the first quantisation is still exact, everything later may move
    assert rule_for(quant, b.QUANTED_GATE_UP_INPUT, END_TO_END).mode == "bitwise"
    assert rule_for(quant, b.GATE_UP_OUTPUT, END_TO_END).mode == "ulp"
    assert rule_for(quant, b.QUANTED_DOWN_INPUT, END_TO_END).mode == "fp8-step"
    assert rule_for(quant, b.OUTPUT, END_TO_END).mode == "tolerance"
    # the tolerance to beat: vLLM's atol = rtol = 2e-2 for these paths
    final = rule_for(quant, b.OUTPUT, END_TO_END)
    assert 0 < final.atol <= 2e-2 and 0 < final.rtol <= 2e-2


def test_fused_flag_only_changes_the_act_quant_outputs():
    act_quant = next(s for s in pipeline_stages(MoEConfig(fused=True)) if s.name == Stages.ACT_QUANT)
    for (quant, buffer), row in TOLERANCES.items():
        if buffer not in act_quant.writes:
            assert row.forced_fused is None, (quant, buffer)


def test_forced_gate_up_ulp_rule_catches_a_wrong_row_and_passes_rounding_noise():
    rule = rule_for("bf16", Buffers.GATE_UP_OUTPUT, FORCED, backend="cuda")  # the interpreter's is derived
    ref = _values(torch.bfloat16, 256).reshape(8, 32)
    assert compare("gate_up_output", ref, _bump_bits(ref, (slice(None), slice(None, None, 3))), rule).ok
    wrong = ref.clone()
    wrong[2] = ref[5]
    assert not compare("gate_up_output", ref, wrong, rule).ok
