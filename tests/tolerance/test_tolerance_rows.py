"""The tolerance table's meta-test: every row catches an error just beyond what its reason
allows, and stays quiet on correct code.

Loud half: for each (scheme, buffer) row judged per stage (the `forced` rules, and the fused
act+quant's), the reference's own stage output, which the row passes, is moved just past the
row's reason on one element: a bitwise row by one code or one ulp, an ulp row by one ulp more
than it allows (beyond its floor), the GEMMs' derived interval (diffmoe.tolerance.gemm_interval) by one
bf16 step past its end. Two planted kernel errors the old rules let through are caught by name:
a fused scale 0.2 % off (the old rule allowed 2^-6), and one extra bf16 rounding of the
accumulator inside the K loop (the old 2-ulp rule saw it only where a sum cancels, 1.4-1.8 % of
the elements; the interval sees 21 %).

Quiet half: the shipped implementation on every labelled edge case is tests/oracles/test_oracles_quiet.py;
here every peer runs the per-stage oracles (differential, teacher forcing) on the labelled edge
cases of each scheme it supports.
"""

from __future__ import annotations

import pytest
import torch

from diffmoe.tolerance.compare import DERIVED, Rule, compare
from diffmoe.problem.config import QUANT_BLOCK, QUANT_SCHEMES, MoEConfig
from diffmoe.contract import factory_numerics, unsupported
from diffmoe.problem.edge_cases import edge_cases
from diffmoe.tolerance.gemm_interval import GEMM_STAGES, compare_stage, stage_bound
from diffmoe.problem.inputs import make_problem
from diffmoe.problem.numerics import SCHEME_ONLY
from diffmoe.findings import Oracles
from diffmoe.judge.runner import run_differential
from diffmoe.tolerance.table import BACKENDS, FORCED, INTERPRETER, PROFILE_ROWS, TOLERANCES, rule_for, tolerance_row
from diffmoe.problem.vocabulary import Buffers, Stages, pipeline_stages
from reference.moe import dequantize_activation, dequantize_weight, local_expert_ids, reference_moe, reference_stage

B = Buffers
# Sizes with several K blocks (H = I = 384: three 128-wide blocks) and a few routed rows per expert.
ROW_CONFIG = dict(num_tokens=6, num_experts=3, topk=2, hidden=384, inter=384, seed=5)


def _stage_of(config: MoEConfig, buffer: str):
    return next(s for s in pipeline_stages(config) if buffer in s.writes)


def _judged(config: MoEConfig, buffer: str):
    """(rule, reference output, its inputs, problem) of the stage writing `buffer`."""
    problem = make_problem(config)
    ref = reference_moe(problem)
    stage = _stage_of(config, buffer)
    everything = {**reference_moe(make_problem(config.replace(fused=False))).intermediates, **ref.intermediates,
                  B.OUTPUT: ref.output}
    inputs = {n: everything[n] for n in stage.reads if n in everything}
    out = reference_stage(stage.name, inputs, problem)[buffer]
    rule = rule_for(config.quant, buffer, FORCED, fused=stage.name == Stages.ACT_QUANT, numerics=config.numerics_profile)
    return rule, out, inputs, problem


def _judge(rule: Rule, buffer: str, ref: torch.Tensor, cand: torch.Tensor, inputs, problem):
    return compare_stage(buffer, ref, cand, rule, inputs, problem)


def _step(x: torch.Tensor, index: int, steps: int) -> torch.Tensor:
    """`x` with element `index` moved `steps` representable values away from zero (toward zero
    when negative), on its own dtype's grid: the bit pattern's magnitude plus `steps`."""
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]
    out = x.clone().reshape(-1)
    view = out.view(bits)
    view[index] = view[index] + steps
    return out.view(x.shape)


def _finite_nonzero_index(x: torch.Tensor) -> int:
    v = x.float().reshape(-1)
    return int(((v != 0) & torch.isfinite(v) & (v.abs() < 100)).nonzero()[0])


def _rows():
    for (point, choice, buffer) in PROFILE_ROWS:  # the rows a choice brings, judged under a user profile making it
        quant = SCHEME_ONLY.get((point, choice), ("bf16",))[0]
        spec = f"diffmoe+{point}={choice}"
        yield pytest.param(MoEConfig(quant=quant, numerics=spec, **ROW_CONFIG), buffer, id=f"{spec}-{quant}-{buffer}")
    for (quant, buffer), row in TOLERANCES.items():
        fused_options = (False, True) if quant != "bf16" else (False,)
        for fused in fused_options:
            config = MoEConfig(quant=quant, fused=fused, **ROW_CONFIG)
            stage = _stage_of(config, buffer) if any(buffer in s.writes for s in pipeline_stages(config)) else None
            if stage is None or (fused and stage.name != Stages.ACT_QUANT):
                continue  # the buffer is not a stage output of this pipeline, or the fused flag changes nothing
            yield pytest.param(config, buffer, id=f"{quant}-{buffer}" + ("-fused" if fused else ""))


@pytest.mark.parametrize("config, buffer", list(_rows()))
def test_each_row_is_quiet_on_the_reference_and_catches_one_step_past_its_reason(config, buffer):
    rule, ref, inputs, problem = _judged(config, buffer)
    assert _judge(rule, buffer, ref, ref.clone(), inputs, problem).ok
    i = _finite_nonzero_index(ref)
    if rule.mode == DERIVED:
        below, above = stage_bound(rule, buffer, ref, inputs, problem)
        top = ref.double().reshape(-1)[i] + above.reshape(-1)[i]  # the interval's upper end
        moved = ref.clone().reshape(-1)
        moved[i] = top.to(ref.dtype)
        assert _judge(rule, buffer, ref, moved.view(ref.shape), inputs, problem).ok  # its end is inside
        moved = _step(moved.view(ref.shape), i, 1 if float(top) > 0 else -1)  # one bf16 step past it
    else:
        moved = _step(ref, i, rule.max_ulp + 1)
        if rule.atol:  # beyond the floor too
            while abs(float(moved.reshape(-1)[i].float()) - float(ref.reshape(-1)[i].float())) <= rule.atol:
                moved = _step(moved, i, 1)
    c = _judge(rule, buffer, ref, moved, inputs, problem)
    assert not c.ok and c.mismatches == 1, c.summary()


@pytest.mark.parametrize("quant", [q for q in QUANT_SCHEMES if q != "bf16"])
def test_a_fused_scale_two_tenths_of_a_percent_off_is_caught(quant):
    config = MoEConfig(quant=quant, fused=True, **ROW_CONFIG)
    rule, ref, inputs, problem = _judged(config, B.QUANTED_DOWN_INPUT_SCALES)
    off = ref.clone()
    off.reshape(-1)[0] *= 1.002
    assert not _judge(rule, B.QUANTED_DOWN_INPUT_SCALES, ref, off, inputs, problem).ok


def _gemm_with_bf16_partials(config: MoEConfig, inputs, problem) -> torch.Tensor:
    """The gate-up GEMM as a kernel that rounds its float32 accumulator to bf16 after every
    128-wide K block (one extra rounding inside the K loop), rounded to bf16 at the end."""
    k = config.topk
    codes = inputs[B.QUANTED_GATE_UP_INPUT].repeat_interleave(k, dim=0)
    scales = inputs[B.QUANTED_GATE_UP_INPUT_SCALES]
    if config.quant != "fp8-tensor":
        scales = scales.repeat_interleave(k, dim=0)
    a = dequantize_activation(codes, scales, config.quant)  # [TK, H] fp32
    w = dequantize_weight(problem.w1, problem.w1_scale, config.quant)  # [L, 2I, H] fp32
    ids = local_expert_ids(problem)
    out = torch.zeros(a.shape[0], w.shape[1])
    for e in range(w.shape[0]):
        rows = (ids == e).nonzero().flatten()
        acc = torch.zeros(len(rows), w.shape[1])
        for k0 in range(0, a.shape[1], QUANT_BLOCK):
            acc = (acc + a[rows, k0:k0 + QUANT_BLOCK] @ w[e, :, k0:k0 + QUANT_BLOCK].T).bfloat16().float()
        out[rows] = acc
    return out.bfloat16()


@pytest.mark.parametrize("quant", [q for q in QUANT_SCHEMES if q != "bf16"])
def test_one_extra_bf16_rounding_in_the_k_loop_is_caught_far_more_often_than_two_ulp_caught_it(quant):
    # H = 256: two K blocks, so exactly one extra rounding (of the first block's partial sum). The
    # ratio below was measured without the spread and outlier channels default inputs have since
    # issue 42; with them (larger gate-up values) the interval still flags 22 % of the elements at
    # fp8-tensor, the 2-ulp rule 7.98x fewer, just under the 8x asserted: the inputs measured are pinned
    config = MoEConfig(quant=quant, **{**ROW_CONFIG, "hidden": 256}, expert_scale_spread=0, outlier_channels=0)
    rule, ref, inputs, problem = _judged(config, B.GATE_UP_OUTPUT)
    bad = _gemm_with_bf16_partials(config, inputs, problem)
    new = _judge(rule, B.GATE_UP_OUTPUT, ref, bad, inputs, problem)
    old = compare(B.GATE_UP_OUTPUT, ref, bad, Rule.ulp(2, atol=2**-10))  # the rule before the derived interval
    # measured (seeds 5..7): 21% of the elements outside the interval, 1.4-1.8% beyond 2 ulp (only
    # where the sum cancels, so a small output lets it pass entirely)
    assert new.mismatches > 0.15 * new.total and new.mismatches > 8 * old.mismatches, (new.summary(), old.summary())


def test_every_backend_has_a_rule_for_every_row():
    for backend in BACKENDS:
        for quant, buffer in TOLERANCES:
            assert tolerance_row(quant, buffer, backend).rule(FORCED).reason
    # the derived interval is the interpreter's for the GEMM stages, and a profile's where it names one
    derived = {(q, b) for (q, b), row in TOLERANCES.items() if row.forced.mode == DERIVED}
    assert {b for _, b in derived} == set(GEMM_STAGES) and tolerance_row("fp8-token", B.GATE_UP_OUTPUT, INTERPRETER)
    assert all(rule.mode == DERIVED and rule.reason for rule in PROFILE_ROWS.values())


def test_liger_s_activation_of_the_float32_product_holds_what_the_campaign_found():
    """Liger's SwiGLU of its own float32 gate/up product: 13 bf16 ulp from the reference's at a
    value near zero (-7.0e-6 against -7.4e-6; bench/false_alarm_campaign.py --impl liger, seed 0),
    inside the interval the product's float32 error allows; one ulp beyond its end is not."""
    # the campaign's config as it was drawn, before issue 42's default outlier channels (which give the
    # flagged element another value): outlier_channels=0 keeps the inputs it was found on
    config = MoEConfig(num_tokens=20, num_experts=5, topk=5, hidden=128, inter=256, quant="bf16", call_tokens=16,
                       router="softmax-topk", expert_scale_spread=4, outlier_channels=0, nan_rows=1, seed=349017297,
                       numerics="liger")
    rule, ref, inputs, problem = _judged(config, B.ACTIVATION_OUTPUT)
    assert rule.mode == DERIVED
    below, above = stage_bound(rule, B.ACTIVATION_OUTPUT, ref, inputs, problem)
    i = 63 * config.inter + 217  # the element the campaign flagged
    cand = ref.clone().reshape(-1)
    cand[i] = torch.tensor(-7.3909759521484375e-06).to(ref.dtype)
    assert _judge(rule, B.ACTIVATION_OUTPUT, ref, cand.view(ref.shape), inputs, problem).ok
    cand[i] = (ref.double().reshape(-1)[i] - below.reshape(-1)[i]).to(ref.dtype)
    cand = _step(cand.view(ref.shape), i, 1 if float(cand[i]) < 0 else -1)  # one bf16 step below the lower end
    assert not _judge(rule, B.ACTIVATION_OUTPUT, ref, cand, inputs, problem).ok


PEERS = {"vllm": "vllm", "peers.lmdeploy:make_0_18_0": "lmdeploy", "peers.liger:make_0_8_5": "liger"}  # spec: wheel


@pytest.mark.slow
@pytest.mark.parametrize("spec", list(PEERS))
def test_every_peer_is_quiet_per_stage_on_the_labelled_edge_cases(spec):
    from diffmoe.adapters import peer_wheels
    from diffmoe.frontends.cli import load_implementation

    try:
        peer_wheels.fetch(PEERS[spec])
    except peer_wheels.PeerError as exc:
        pytest.skip(f"{PEERS[spec]} is not in the peer cache and cannot be fetched ({exc}); run "
                    f"`{peer_wheels.fetch_command(PEERS[spec])}`")
    factory, name = load_implementation(spec)
    ran, loud = 0, []
    for quant in QUANT_SCHEMES:
        for fused in ((False,) if quant == "bf16" else (False, True)):
            for label, config in edge_cases(quant, fused=fused).items():
                try:
                    if unsupported(factory, config.replace(numerics=factory_numerics(factory))):
                        continue
                except ValueError:  # a case its numerics profile cannot describe (lmdeploy's is fp8-block only)
                    continue
                report = run_differential(config, factory, implementation_name=name,
                                          oracles=[Oracles.DIFFERENTIAL, Oracles.TEACHER_FORCING])
                ran += 1
                if not report.passed:
                    loud.append(f"{quant} {'fused' if fused else 'unfused'} {label}: {report.findings[0].message[:200]}")
    assert ran >= 15, f"{name} ran only {ran} edge cases"  # 18 for lmdeploy (fp8-block) and Liger (bf16)
    assert not loud, f"{name}: " + "\n".join(loud)
