"""The reference's vllm numerics profile (its choices in reference/rounding/), one rounding point at a time.

Each test builds a small tensor on which diffmoe's rounding and vLLM's differ, computes what
vLLM's formula gives straight from the formula (float32 arithmetic written out here, not the
reference's code), and requires the vllm branch to give those bits and the diffmoe branch not
to: the point is both implemented and visible. Then the points together: reference_moe under
numerics="vllm" uses each of them, and numerics=None is diffmoe's profile bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from diffmoe.tolerance.compare import ulp_distance
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.inputs import make_problem
from diffmoe.problem.vocabulary import FP8_DTYPE, FP8_MAX, Buffers, Stages
from reference import reference_moe
from reference.moe import quantize_activation, reference_stage, silu_and_mul
from reference.rounding import CHOICES, rounding
from reference.rounding.gemm_reduce import gemm_scales_after_dot

FLOOR = 1.0 / (FP8_MAX * 512.0)
VLLM = rounding("vllm")


class vllm:  # noqa: N801 - the vllm profile's points, as the old module's functions were called
    """The vllm profile's choices at each point, called one at a time."""

    @staticmethod
    def quantize(x, quant):
        return quantize_activation(x, quant, VLLM)

    @staticmethod
    def silu_and_mul(gate_up, limit=None):
        return silu_and_mul(gate_up, limit, VLLM)

    @staticmethod
    def silu_and_mul_per_block_quant(gate_up):
        return CHOICES["fused_act_quant"]["fp32_block"](gate_up, "fp8-block", None, lambda: None)

    @staticmethod
    def fp8_gemm(a, a_scale, w, w_scale, quant):  # one expert's GEMM
        return gemm_scales_after_dot(a, a_scale, torch.zeros(a.shape[0], dtype=torch.long), w[None], w_scale[None], quant)

    @staticmethod
    def weighted_input(x, weights):
        return VLLM.fn("input_weight")(x, weights)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, any NaN equal to any NaN (the compare's rule)."""
    return a.shape == b.shape and bool((ulp_distance(a, b) == 0).all())


def e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.to(FP8_DTYPE)


def midpoints_times(scale: torch.Tensor) -> torch.Tensor:
    """x whose x / scale are the e4m3 rounding midpoints: where one float32 ulp moves the code."""
    values = torch.arange(0, 127, dtype=torch.uint8).view(FP8_DTYPE).float()  # 0 .. 448
    return ((values[1:] + values[:-1]) / 2 * scale).float()


# ---- amax and the NaN clamp -----------------------------------------------------------------------


@pytest.mark.parametrize("quant, nan_code", [("fp8-tensor", FP8_MAX), ("fp8-token", FP8_MAX), ("fp8-block", -FP8_MAX)])
def test_a_nan_is_dropped_from_the_amax_and_its_code_is_the_clamp_bound(quant, nan_code):
    """fmaxf drops a NaN from the amax; fmaxf(-448, fminf(NaN, 448)) is +448 (scaled_fp8_quant),
    fminf(fmaxf(NaN, -448), 448) is -448 (per-token-group quant)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 128, generator=gen).to(torch.bfloat16)
    x[0, 5] = float("nan")
    codes, scale = vllm.quantize(x, quant)
    finite = x.float().nan_to_num(nan=0.0).abs()
    row_amax = finite[0].max()
    assert float(scale.reshape(-1)[0]) == pytest.approx(float(row_amax if quant != "fp8-tensor" else finite.max()) / FP8_MAX,
                                                       rel=2**-23)
    assert codes[0, 5].float() == nan_code
    assert not torch.isnan(codes.float()).any()
    diffmoe_codes, diffmoe_scale = quantize_activation(x, quant)
    assert torch.isnan(diffmoe_scale.reshape(-1)[0]) and torch.isnan(diffmoe_codes[0].float()).all()  # diffmoe propagates


# ---- per tensor: no floor, the reciprocal --------------------------------------------------------


def test_per_tensor_codes_multiply_by_the_reciprocal_of_an_unfloored_scale():
    """csrc .../fp8/common.cu: scale = amax / 448, codes = x * (1 / scale)."""
    amax = torch.tensor(3.0)
    scale = amax / FP8_MAX  # float32
    x = torch.cat([midpoints_times(scale), amax.reshape(1)]).reshape(1, -1)  # [1, 127], amax 3.0
    codes, got_scale = vllm.quantize(x, "fp8-tensor")
    assert torch.equal(got_scale, scale.reshape(1))
    want = e4m3((x * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX))
    assert same_bits(codes.float(), want.float())
    divided = e4m3((x / scale).clamp(-FP8_MAX, FP8_MAX))
    assert not same_bits(codes.float(), divided.float())  # the reciprocal is visible on these midpoints
    assert not same_bits(quantize_activation(x, "fp8-tensor")[0].float(), want.float())


def test_per_tensor_all_zero_has_scale_zero_and_nan_codes_clamped():
    """No floor: an all-zero tensor's scale is 0, 0 * (1 / 0) is NaN and the clamp makes it +448
    (dequantised 448 * 0 = 0); diffmoe floors the scale and gives zero codes."""
    x = torch.zeros(2, 16, dtype=torch.bfloat16)
    codes, scale = vllm.quantize(x, "fp8-tensor")
    assert float(scale) == 0.0 and bool((codes.float() == FP8_MAX).all())
    assert bool((codes.float() * scale == 0).all())
    d_codes, d_scale = quantize_activation(x, "fp8-tensor")
    assert float(d_scale) == pytest.approx(FLOOR) and bool((d_codes.float() == 0).all())


# ---- per token and per group: the floors --------------------------------------------------------


def test_per_token_scale_is_floored_and_codes_divide():
    """common.cu, dynamic_per_token_scaled_fp8_quant: scale = max(amax / 448, 1 / (448 * 512)),
    codes = x / scale; the same as diffmoe's on finite rows."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    x[2] = 0
    codes, scale = vllm.quantize(x, "fp8-token")
    xf = x.float()
    want_scale = torch.maximum(xf.abs().amax(dim=1, keepdim=True) / FP8_MAX, torch.tensor(FLOOR))
    assert torch.equal(scale, want_scale)
    assert same_bits(codes.float(), e4m3((xf / want_scale).clamp(-FP8_MAX, FP8_MAX)).float())


def test_per_group_scale_floors_the_amax_and_codes_divide():
    """per_token_group_quant.cu: scale = max(amax, 1e-10) / 448 (an all-zero group: 1e-10 / 448)."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 256, generator=gen).to(torch.bfloat16)
    x[1, 128:] = 0
    codes, scale = vllm.quantize(x, "fp8-block")
    groups = x.float().reshape(2, 2, 128)
    want_scale = torch.maximum(groups.abs().amax(dim=2), torch.tensor(1e-10)) / FP8_MAX  # [2, 2]
    assert torch.equal(scale, want_scale)
    want = e4m3((groups / want_scale[..., None]).clamp(-FP8_MAX, FP8_MAX)).reshape(2, 256)
    assert same_bits(codes.float(), want.float())


# ---- the fused silu + 128-block quant -------------------------------------------------------------


def test_fused_block_quant_reads_the_float32_activation_with_the_token_floor():
    """silu_and_mul_per_block_quant: gate * (1 / (1 + exp(-gate))) * up in float32, scale =
    max(amax / 448, 1 / (448 * 512)). Row 1 is tiny (amax below 1/512) so the floor differs from
    the group quant's; row 0 is ordinary, so only the skipped bf16 rounding differs there."""
    gen = torch.Generator().manual_seed(3)
    gate_up = torch.randn(16, 256, generator=gen).to(torch.bfloat16)
    gate_up[1] = (gate_up[1].float() * 2**-8).to(torch.bfloat16)
    codes, scale = vllm.silu_and_mul_per_block_quant(gate_up)
    g, u = gate_up[:, :128].float(), gate_up[:, 128:].float()
    act = g * (1.0 / (1.0 + torch.exp(-g))) * u  # [16, 128] float32

    def floored(a):
        return torch.maximum(a.abs().amax(dim=1, keepdim=True) / FP8_MAX, torch.tensor(FLOOR))

    want_scale = floored(act)
    assert torch.equal(scale, want_scale)
    assert float(want_scale[1]) == pytest.approx(FLOOR)  # the floor is what row 1 shows
    assert same_bits(codes.float(), e4m3((act / want_scale).clamp(-FP8_MAX, FP8_MAX)).float())
    assert not torch.equal(floored(g / (1.0 + torch.exp(-g)) * u), want_scale)  # silu's reciprocal shows in the scales
    unfused_codes, unfused_scale = quantize_activation(silu_and_mul(gate_up), "fp8-block")  # diffmoe's, fused or not
    assert not torch.equal(unfused_scale, scale)


# ---- the FP8 GEMM: scales after the dot -----------------------------------------------------------


def _codes(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * 64).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


@pytest.mark.parametrize("quant", ["fp8-tensor", "fp8-token"])
def test_the_gemm_scales_the_codes_dot_product(quant):
    """fused_moe.py: accumulator = dot(a, b) (codes, float32), then accumulator * a_scale * b_scale.
    An Inf activation scale gives Inf where the codes' dot is not 0; dequantising first gives NaN."""
    a, w = _codes((3, 256), 0), _codes((8, 256), 1)
    a_scale = torch.tensor([[0.01], [float("inf")], [0.02]]) if quant == "fp8-token" else torch.tensor([0.01])
    w_scale = torch.linspace(0.001, 0.002, 8) if quant == "fp8-token" else torch.tensor(0.003)
    got = vllm.fp8_gemm(a, a_scale, w, w_scale, quant)
    want = (a.float() @ w.float().T) * a_scale * w_scale.reshape(1, -1)
    assert same_bits(got, want)
    dequantised_first = (a.float() * a_scale) @ (w.float() * w_scale.reshape(-1, 1)).T
    assert not same_bits(got, dequantised_first)  # the order of the scaling shows in the float32 bits
    if quant == "fp8-token":
        assert torch.isinf(got[1]).all() and torch.isnan(dequantised_first[1]).all()


def test_the_block_gemm_scales_each_128_wide_k_block():
    """fused_moe.py, group_k > 0: accumulator += dot(a_k, b_k) * a_scale[:, k] * b_scale[n, k]."""
    a, w = _codes((4, 256), 2), _codes((256, 256), 3)
    a_scale = torch.rand(4, 2, generator=torch.Generator().manual_seed(4)) * 0.01
    w_scale = torch.rand(2, 2, generator=torch.Generator().manual_seed(5)) * 0.01  # [N/128, K/128]
    got = vllm.fp8_gemm(a, a_scale, w, w_scale, "fp8-block")
    want = torch.zeros(4, 256)
    for k in range(2):
        ks = slice(128 * k, 128 * (k + 1))
        b_scale = torch.cat([w_scale[0, k].expand(128), w_scale[1, k].expand(128)])  # per output column
        want = want + (a.float()[:, ks] @ w.float()[:, ks].T) * a_scale[:, k : k + 1] * b_scale.reshape(1, -1)
    assert same_bits(got, want)
    a_values = a.float() * a_scale.repeat_interleave(128, dim=1)
    w_values = w.float() * w_scale.repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)
    assert not same_bits(got, a_values @ w_values.T)  # dequantising first rounds differently


# ---- silu_and_mul, the input weight, moe_sum -----------------------------------------------------


def test_silu_is_rounded_to_bf16_before_the_multiply():
    """activation_kernels.cu: bf16(bf16(silu(gate)) * up), where diffmoe rounds once."""
    gen = torch.Generator().manual_seed(4)
    gate_up = torch.randn(16, 256, generator=gen).to(torch.bfloat16)
    got = vllm.silu_and_mul(gate_up)
    g, u = gate_up[:, :128].float(), gate_up[:, 128:].float()
    silu = (g / (1.0 + torch.exp(-g))).to(torch.bfloat16).float()
    assert same_bits(got, (silu * u).to(torch.bfloat16))
    assert not same_bits(got, silu_and_mul(gate_up))


def test_the_input_router_weight_is_rounded_to_bf16_before_the_multiply():
    """no_dp_ep.py: a1.mul_(topk_weights.to(a1.dtype)): the weight itself becomes bf16."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
    w = torch.tensor([[0.3], [0.7], [0.123], [0.9]])  # none of them a bf16 value
    got = vllm.weighted_input(x, w)
    assert same_bits(got, (x.float() * w.to(torch.bfloat16).float()).to(torch.bfloat16))
    assert not same_bits(got, (x.float() * w).to(torch.bfloat16))


@pytest.mark.parametrize("topk", [2, 3, 4, 5])
def test_moe_sum_accumulates_in_bf16_for_k_2_to_4_only(topk):
    """moe_align_sum_kernels.cu: x = 0; x += input[k] in bf16 for K = 2..4; at::sum_out (float32)
    for other K. At K = 2 the two roundings agree (one add after an exact one)."""
    cfg = MoEConfig(num_tokens=16, num_experts=8, topk=topk, hidden=128, inter=128, quant="bf16")
    gen = torch.Generator().manual_seed(6)
    down = torch.randn(16 * topk, 128, generator=gen).to(torch.bfloat16)
    problem = make_problem(cfg.replace(numerics="vllm"))
    got = reference_stage(Stages.REDUCE, {Buffers.DOWN_OUTPUT: down}, problem)[Buffers.OUTPUT]
    per_token = down.view(16, topk, 128).float()
    fp32 = per_token.sum(dim=1).to(torch.bfloat16)
    acc = torch.zeros(16, 128)
    for j in range(topk):
        acc = (acc + per_token[:, j]).to(torch.bfloat16).float()
    assert same_bits(got, acc.to(torch.bfloat16) if topk in (2, 3, 4) else fp32)
    diffmoe = reference_stage(Stages.REDUCE, {Buffers.DOWN_OUTPUT: down}, make_problem(cfg))[Buffers.OUTPUT]
    assert same_bits(got, diffmoe) == (topk in (2, 5))  # the bf16 chain is visible at K = 3, 4


# ---- the profile through reference_moe -----------------------------------------------------------


@pytest.mark.parametrize("config", [
    MoEConfig(num_tokens=4, num_experts=4, topk=3, hidden=128, inter=128, quant="bf16"),
    MoEConfig(num_tokens=4, num_experts=4, topk=2, hidden=128, inter=128, quant="fp8-block", fused=True),
    MoEConfig(num_tokens=4, num_experts=4, topk=1, hidden=128, inter=128, quant="fp8-token", router_weight="input",
              router="softmax-topk"),
], ids=["bf16-k3", "fp8-block-fused", "fp8-token-input-weight"])
def test_reference_moe_follows_the_profile_and_none_is_diffmoe(config):
    none = reference_moe(make_problem(config))
    diffmoe = reference_moe(make_problem(config.replace(numerics="diffmoe")))
    vllm_run = reference_moe(make_problem(config.replace(numerics="vllm")))
    assert same_bits(none.output, diffmoe.output)
    assert all(same_bits(none.intermediates[n], diffmoe.intermediates[n]) for n in none.intermediates)
    assert not same_bits(vllm_run.output, diffmoe.output)


def test_fused_block_down_input_is_the_fused_ops_under_vllm_and_the_unfused_chains_under_diffmoe():
    config = MoEConfig(num_tokens=4, num_experts=4, topk=2, hidden=128, inter=128, quant="fp8-block", fused=True)
    for numerics in ("diffmoe", "vllm"):
        cfg = config.replace(numerics=numerics)
        run = reference_moe(make_problem(cfg))
        gate_up = run.intermediates[Buffers.GATE_UP_OUTPUT]
        unfused = reference_moe(make_problem(cfg.replace(fused=False))).intermediates[Buffers.QUANTED_DOWN_INPUT]
        fused_codes = run.intermediates[Buffers.QUANTED_DOWN_INPUT]
        if numerics == "vllm":
            assert same_bits(fused_codes.float(), vllm.silu_and_mul_per_block_quant(gate_up)[0].float())
            assert not same_bits(fused_codes.float(), unfused.float())
        else:
            assert same_bits(fused_codes.float(), unfused.float())  # the metamorphic invariant holds


@pytest.mark.parametrize("quant", ["bf16", "fp8-tensor", "fp8-token", "fp8-block"])
def test_a_zero_token_call_runs_under_the_vllm_profile(quant):
    cfg = MoEConfig(num_tokens=4, num_experts=4, topk=3, hidden=128, inter=128, quant=quant,
                    fused=quant == "fp8-block", numerics="vllm")
    run = reference_moe(make_problem(cfg, num_tokens=0))
    diffmoe = reference_moe(make_problem(cfg.replace(numerics="diffmoe"), num_tokens=0))
    assert run.output.shape == (0, 128)
    assert {n: v.shape for n, v in run.intermediates.items()} == {n: v.shape for n, v in diffmoe.intermediates.items()}


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("quant", ["fp8-tensor", "fp8-token", "fp8-block", "fused"])
def test_vllm_scales_are_correctly_rounded_quotients_on_every_device(quant, device):
    """amax / 448 as CUDA's float division rounds it: the float64 quotient rounded once (torch on
    CUDA would multiply by the reciprocal of a Python scalar, one ulp high for 3.40625)."""
    amax = torch.tensor(3.40625)
    assert (amax.double() / 448).float() != amax * (1 / 448)  # a value where the two part
    row = torch.zeros(1, 256)
    row[0, 0] = amax
    if quant == "fused":  # silu(40) is 40 in float32: the block's amax is 40 * up = 136.25
        gate_up = torch.zeros(1, 256, dtype=torch.bfloat16)
        gate_up[0, 0], gate_up[0, 128] = 40.0, amax
        act = torch.tensor(40.0) * amax
        assert (act.double() / 448).float() != act * (1 / 448)
        scale = vllm.silu_and_mul_per_block_quant(gate_up.to(device))[1]
        assert scale.flatten()[0].cpu() == (act.double() / 448).float()
        return
    scale = vllm.quantize(row.to(device), quant)[1]
    assert scale.flatten()[0].cpu() == (amax.double() / 448).float()


def test_sglangs_reduce_starts_from_the_first_row_up_to_k2_and_from_zero_above():
    """reduce=fp32_from_zero_past_k2: torch.add keeps a -0.0 pair, torch.sum from +0 does not."""
    from reference.rounding.gemm_reduce import reduce_fp32_from_zero_past_k2

    for k, sign in ((1, -1.0), (2, -1.0), (3, 1.0), (6, 1.0)):
        rows = torch.full((2, k, 4), -0.0, dtype=torch.bfloat16)
        out = reduce_fp32_from_zero_past_k2(rows)
        assert torch.equal(torch.copysign(torch.ones(2, 4), out.float()), torch.full((2, 4), sign)), k


def test_sglangs_group_scale_floors_the_amax_at_1e10_then_multiplies():
    from reference.rounding.quant import scale_min_amax, scale_min_amax_product, scale_min_amax_product_1e10

    amax = torch.tensor([[[0.0]], [[3.7]], [[1e-12]]])
    scale, floored = scale_min_amax_product_1e10(amax)
    assert torch.equal(floored, amax.clamp_min(1e-10))
    assert torch.equal(scale, floored * torch.tensor(1.0 / 448, dtype=torch.float32))
    assert not torch.equal(scale, scale_min_amax_product(amax)[0])  # lmdeploy's floor is 1e-6
    assert not torch.equal(scale, scale_min_amax(amax)[0])  # amax * (1/448) is not amax / 448 everywhere
