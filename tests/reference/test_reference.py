"""The reference against an independent float64 dense formulation, and its own invariants."""

import pytest
import torch

from dense_moe import dense_moe_float64
from diffmoe.problem.edge_cases import edge_cases
from diffmoe.problem.inputs import make_problem
from diffmoe.problem.vocabulary import Buffers, materialised_buffers
from reference import reference_moe
from reference.moe import quantize_activation

SCHEMES = ["bf16", "fp8-tensor", "fp8-token", "fp8-block"]

# Per-token relative L2 error of the reference against float64, ||ref_t - dense_t|| / ||dense_t||.
# fp8: two dynamic activation quantisations, each with relative rounding error <= 2^-4 (half an
#   e4m3 step) per element; a full step 2^-3 on every element bounds their sum. Measured: <= 0.062
#   over 80 tokens (T=16, E=4, K=2, H=I=256, seeds 0-4). A wrong scale, expert or weight gives >= 0.5.
# bf16: four bf16 roundings (gate_up, activation, down, output), each <= 2^-8 relative: 4 * 2^-8 = 2^-6.
#   Measured: <= 0.0049.
REL_L2_TOL = {"bf16": 2**-6, "fp8-tensor": 2**-3, "fp8-token": 2**-3, "fp8-block": 2**-3}

CASES = {f"{q}/{label}": cfg for q in SCHEMES for label, cfg in edge_cases(q).items()}


@pytest.mark.parametrize("config", CASES.values(), ids=CASES.keys())
def test_reference_matches_float64_dense(config):
    problem = make_problem(config)
    ref = reference_moe(problem).output.double()  # [T, H]
    # a SwiGLU limit near zero amplifies the input's FP8 rounding (tests/support/dense_moe.py says why)
    dense = dense_moe_float64(problem, quantized_input=config.swiglu_limit is not None)  # [T, H]
    finite_in = torch.isfinite(problem.hidden_states).all(dim=1)  # [T]
    # a token with a NaN/Inf input has no finite answer on either side; under a per-tensor scale a
    # non-finite input also makes the shared scale non-finite, so no token keeps a finite answer
    shared_scale = config.quant == "fp8-tensor" and not bool(finite_in.all())
    assert not torch.isfinite(ref[~finite_in]).all(dim=1).any(), "a non-finite input token came out finite"
    if shared_scale:
        return
    assert torch.isfinite(ref[finite_in]).all(), "a finite input token came out non-finite"
    ref, dense = ref[finite_in], dense[finite_in]
    err = (ref - dense).norm(dim=1)
    norm = dense.norm(dim=1)
    zero_rows = norm == 0  # all-zero inputs, tokens routed only to non-local experts or dropped: exactly zero on both sides
    assert torch.all(ref[zero_rows] == 0)
    rel = err[~zero_rows] / norm[~zero_rows]
    worst = rel.max().item() if rel.numel() else 0.0  # every slot dropped: all exact zeros, checked above
    assert worst <= REL_L2_TOL[config.quant], f"worst token rel err {worst:.4f}"


@pytest.mark.parametrize("quant", SCHEMES[1:])
def test_fused_flag_only_changes_what_is_reported(quant):
    base = edge_cases(quant)["T<BLOCK_M"]
    unfused = reference_moe(make_problem(base))
    fused = reference_moe(make_problem(base.replace(fused=True)))
    name = Buffers.QUANTED_DOWN_INPUT
    assert torch.equal(unfused.intermediates[name].view(torch.uint8), fused.intermediates[name].view(torch.uint8))
    assert Buffers.ACTIVATION_OUTPUT in unfused.intermediates
    assert Buffers.ACTIVATION_OUTPUT not in fused.intermediates
    assert list(fused.intermediates) == materialised_buffers(base.replace(fused=True))


def test_every_stage_writes_a_fresh_tensor():
    result = reference_moe(make_problem(edge_cases("fp8-token")["T<BLOCK_M"]))
    ptrs = [t.untyped_storage().data_ptr() for t in result.intermediates.values()]
    assert len(set(ptrs)) == len(ptrs)


def test_quantisation_saturates_rounds_to_nearest_even_and_floors_the_scale():
    x = torch.tensor([[448.0, -448.0, 0.0, 3.125, 3.375]])  # amax 448 -> scale 1
    codes, scale = quantize_activation(x, "fp8-token")
    assert scale.item() == 1.0
    # in [2, 4) the e4m3 step is 0.25: 3.125 and 3.375 are ties and go to the even mantissa
    assert codes.float().tolist() == [[448.0, -448.0, 0.0, 3.0, 3.5]]
    big, _ = quantize_activation(torch.tensor([[896.0, 1.0]]), "fp8-tensor")  # scale 2: 896 -> 448
    assert big.float().tolist() == [[448.0, 0.5]]
    zeros, floor = quantize_activation(torch.zeros(1, 4), "fp8-token")
    assert floor.item() == pytest.approx(1 / (448 * 512)) and torch.all(zeros.float() == 0)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("quant", ["fp8-tensor", "fp8-token", "fp8-block"])
def test_activation_scales_are_correctly_rounded_quotients_on_every_device(quant, device):
    """scale = amax / 448 is the correctly rounded float32 quotient on every device. The
    float64 quotient of two float32 values, rounded once to float32, is the correctly rounded
    float32 quotient (53 >= 2 * 24 + 2 bits). torch on CUDA divides by a Python scalar as a
    multiply by its reciprocal, one ulp off for 3.40625 among others: on a GPU this fails
    without diffmoe.problem.vocabulary.over_fp8_max."""
    amaxes = torch.arange(0x3F80, 0x4100, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()  # [1, 8)
    amaxes = amaxes[(amaxes.double() / 448).float() != amaxes * (1 / 448)]  # where a reciprocal multiply is off
    assert 3.40625 in amaxes.tolist() and amaxes.numel() > 10
    rows = torch.zeros(amaxes.numel(), 128)
    rows[:, 0] = amaxes  # one group, one token, one tensor per row
    for i in range(rows.shape[0]):
        _, scale = quantize_activation(rows[i:i + 1].to(device), quant)
        want = (amaxes[i].double() / 448).float()
        assert scale.flatten()[0].cpu() == want, (quant, device, amaxes[i].item())
