"""vLLM 0.33.0's Triton fused MoE, run from its own wheel's files, judged by diffmoe's oracles
(peers/vllm/). The wheel is fetched once (network, about 336 MB; the cache it leaves,
about 1.4 MB, is reused: diffmoe/adapters/peer_wheels.py).

What is held here: the declared plan is vLLM's layout (sizes from TritonExperts.workspace_shapes)
and the static oracle judges cache1/cache3 sharing workspace2 safe from live ranges; the launches
carve exactly there; a check at T=8 E=4 K=2 H=I=128 passes every oracle but the metamorphic one
(vLLM has one path per scheme, there is no fused/unfused sibling); a planted carve bug (cache2
carved from workspace2) and a planted reduce bug are caught; program order is permuted at the
interpreter's grid loop. The adapter declares the reference's vllm numerics profile: the
differences of vLLM's rounding from diffmoe's (bf16 moe_sum at K = 3, NaN dropped by the FP8
quant, the input router weight rounded to bf16) pass under it and are flagged, at their stage,
under an explicit numerics="diffmoe": the profile is what makes the difference.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

import pytest
import torch

from bug_zoo import make_vllm_cache2_in_ws2  # the planted carve bug, a bug-zoo mutant
from diffmoe.adapters import peer_wheels
from diffmoe.problem.config import MoEConfig
from diffmoe.contract import Schedule, factory_numerics, factory_plan
from diffmoe.oracles.registry import DEFAULT_ORACLES
from diffmoe.oracles.static_aliasing import check_static_aliasing
from diffmoe.problem.inputs import make_problem
from diffmoe.findings import Oracles
from diffmoe.judge.runner import factory_name, run_differential
from diffmoe.problem.vocabulary import Buffers as B, pipeline_stages
from diffmoe.problem.vocabulary import Stages

SMALL = dict(num_tokens=8, num_experts=4, topk=2, hidden=128, inter=128)
QUANTS = ("bf16", "fp8-tensor", "fp8-token", "fp8-block")
# metamorphic builds the other `fused` flag's sibling, which vLLM does not have (peers/vllm/core.py)
CHECK_ORACLES = [o for o in DEFAULT_ORACLES if o != Oracles.METAMORPHIC]


@pytest.fixture(scope="module", autouse=True)
def vllm_wheel():
    """The pinned wheel's files in the peer cache: downloaded and verified on first use only."""
    return peer_wheels.fetch("vllm")


def config(quant: str, **changes) -> MoEConfig:
    return MoEConfig(**{**SMALL, "quant": quant, "fused": quant == "fp8-block", **changes})


def vllm_factory():
    from peers.vllm import make

    return make


class Recorder:
    def __init__(self):
        self.launches = []

    def before_launch(self, launch):
        pass

    def after_launch(self, launch):
        self.launches.append(launch)


def _workspaces(impl):
    n1, n2 = impl.workspace_shapes()
    return (torch.full((n1,), 0xFF, dtype=torch.uint8, device=impl.device),
            torch.full((n2,), 0xFF, dtype=torch.uint8, device=impl.device))


# ---- the plan: vLLM's layout, judged from live ranges -----------------------------------------


@pytest.mark.parametrize("output", ["separate", "workspace"])
@pytest.mark.parametrize("quant", QUANTS)
def test_the_plan_is_vllms_layout_and_the_static_oracle_judges_it_safe(quant, output):
    c = config(quant, output=output)
    make = vllm_factory()
    plan = factory_plan(make, c)
    assert plan == make(c).workspace_plan(c.num_tokens)  # the cheap attribute says what the instance does
    t, k, h, i = c.num_tokens, c.topk, c.hidden, c.inter
    # TritonExperts.workspace_shapes: workspace13 (T, K, max(I, H)), workspace2 (T, K, max(2I, H)), output (T, H);
    # the modular kernel's common workspace holds max(workspace13, output) elements, bf16
    assert plan.workspace_bytes == (2 * max(t * k * max(i, h), t * h), 2 * t * k * max(2 * i, h))
    cache1, cache3 = plan.placement(B.GATE_UP_OUTPUT), plan.placement(B.DOWN_OUTPUT)
    assert (cache1.workspace, cache1.offset, cache3.workspace, cache3.offset) == (1, 0, 1, 0)  # they share bytes...
    cache2 = plan.placement(B.ACTIVATION_OUTPUT)
    assert (cache2 is None) == c.fused and (cache2 is None or (cache2.workspace, cache2.offset) == (0, 0))
    if output == "workspace":
        assert (plan.placement(B.OUTPUT).workspace, plan.placement(B.OUTPUT).offset) == (0, 0)
    assert check_static_aliasing(plan) == []  # ...and their live ranges do not meet


def test_the_planted_carve_bug_is_caught_statically_and_at_runtime():
    c = config("fp8-token")
    findings = check_static_aliasing(factory_plan(make_vllm_cache2_in_ws2, c))
    assert findings and findings[0].stage == Stages.ACTIVATION
    assert set(findings[0].buffers) == {B.GATE_UP_OUTPUT, B.ACTIVATION_OUTPUT}
    report = run_differential(c, make_vllm_cache2_in_ws2, oracles=[Oracles.STATIC_ALIASING, Oracles.RUNTIME_ALIASING])
    assert not report.passed
    by_oracle = {f.oracle for f in report.findings}
    assert {Oracles.STATIC_ALIASING, Oracles.RUNTIME_ALIASING} <= by_oracle, report.render()
    assert report.implementation == "bug_zoo:make_vllm_cache2_in_ws2"
    # the same check on vLLM's own carving is quiet
    assert run_differential(c, vllm_factory(), oracles=[Oracles.STATIC_ALIASING, Oracles.RUNTIME_ALIASING]).passed


# ---- the launches: vLLM's carving, vocabulary names -------------------------------------------


@pytest.mark.parametrize("quant", QUANTS)
def test_every_launch_is_reported_where_vllm_carved_it(quant):
    c = config(quant)
    impl = vllm_factory()(c)
    ws1, ws2 = _workspaces(impl)
    rec = Recorder()
    impl.run(make_problem(c, impl.device), (ws1, ws2), output=torch.empty(8, c.hidden, dtype=torch.bfloat16, device=impl.device),
             recorder=rec)
    stages = [launch.stage for launch in rec.launches]
    expected = {
        "bf16": [Stages.ALIGN, Stages.GATE_UP_GEMM, Stages.ACTIVATION, Stages.DOWN_GEMM, Stages.REDUCE],
        "fp8-block": [Stages.QUANT_INPUT, Stages.ALIGN, Stages.GATE_UP_GEMM, Stages.ACT_QUANT, Stages.DOWN_GEMM,
                      Stages.REDUCE],
    }.get(quant, [Stages.QUANT_INPUT, Stages.ALIGN, Stages.GATE_UP_GEMM, Stages.ACTIVATION, Stages.QUANT_DOWN_INPUT,
                  Stages.DOWN_GEMM, Stages.REDUCE])
    assert stages == expected
    writes = {name: view for launch in rec.launches for name, view in launch.writes.items()}
    assert [launch.kernel for launch in rec.launches if launch.stage.endswith("gemm")] == ["fused_moe_kernel"] * 2
    assert writes[B.GATE_UP_OUTPUT].data_ptr() == ws2.data_ptr() == writes[B.DOWN_OUTPUT].data_ptr()  # cache1, cache3
    assert writes[B.GATE_UP_OUTPUT].shape == (16, 256) and writes[B.DOWN_OUTPUT].shape == (16, 128)
    if not c.fused:
        assert writes[B.ACTIVATION_OUTPUT].data_ptr() == ws1.data_ptr()  # cache2 from workspace13
    if c.is_fp8:  # the FP8 copy is vLLM's own fresh allocation
        q = writes[B.QUANTED_DOWN_INPUT]
        assert not (ws1.data_ptr() <= q.data_ptr() < ws1.data_ptr() + ws1.numel())
        assert not (ws2.data_ptr() <= q.data_ptr() < ws2.data_ptr() + ws2.numel())


# ---- the oracles ---------------------------------------------------------------------------------


# (quant, numerics) pairs judged under either profile; fp8-block under diffmoe's is a named
# profile difference instead (PROFILE_DIFFERENCES["fused-activation-in-float32"])
EITHER_PROFILE = [(q, n) for n in (None, "diffmoe") for q in QUANTS if not (q == "fp8-block" and n == "diffmoe")]


@pytest.mark.parametrize("quant, numerics", EITHER_PROFILE, ids=[f"{q}-{n}" for q, n in EITHER_PROFILE])
def test_a_check_of_vllm_passes_every_oracle(quant, numerics):
    """Under either profile: where they differ at K = 2 without special inputs (the activation's
    rounding), diffmoe's rules hold vLLM's choices too; the fused fp8-block quant of the float32
    activation is a rounding point only vLLM's profile names."""
    c = config(quant, numerics=numerics)
    report = run_differential(c, vllm_factory(), oracles=CHECK_ORACLES)
    assert report.implementation == "peers.vllm:make_0_33_0" == factory_name(vllm_factory())
    assert report.passed, report.render()


def test_a_workspace_output_check_passes():
    report = run_differential(config("bf16", output="workspace"), vllm_factory(), oracles=CHECK_ORACLES)
    assert report.passed, report.render()


def test_a_numeric_bug_in_a_stand_in_op_is_caught_by_the_differential(monkeypatch):
    """The differential judges what vLLM's sequence computed: a moe_sum that drops the last
    expert's row (a planted bug in the reduce) is named at reduce."""
    from peers.vllm import RELEASES
    from peers.vllm.core import VllmFiles as _files

    VllmFiles = _files.of_release(RELEASES["0.33.0"])

    files = VllmFiles.get(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    ops = files.modules["vllm._custom_ops"]
    honest = ops.moe_sum

    def moe_sum_dropping_the_last_expert(input, output, topk_ids=None, expert_map=None):
        input[:, -1].zero_()  # the reduce skips the last of the K slots
        honest(input, output, topk_ids, expert_map)

    monkeypatch.setattr(ops, "moe_sum", moe_sum_dropping_the_last_expert)
    report = run_differential(config("fp8-token", topk=3), vllm_factory(), oracles=[Oracles.DIFFERENTIAL])
    assert [(f.oracle, f.stage) for f in report.findings] == [(Oracles.DIFFERENTIAL, Stages.REDUCE)], report.render()


def test_the_factory_declares_the_vllm_profile_and_reports_carry_it():
    make = vllm_factory()
    assert factory_numerics(make) == "vllm"
    report = run_differential(config("bf16"), make, oracles=[Oracles.DIFFERENTIAL])
    assert report.config.numerics == "vllm" and report.replay_command().endswith("--numerics vllm --impl peers.vllm:make_0_33_0")


# Where vLLM's rounding differs from diffmoe's: (config changes, every stage diffmoe's profile
# flags, each its own finding: the first listed is the earliest divergent stage, the point itself;
# later ones are the same point's consequences judged on vLLM's own inputs, or a second point). Measured (bench/measure_numerics_profiles.py): K=3 bf16
# 206 of 1024 outputs one bf16 ulp of the larger partial sum apart; one NaN token: its 128 codes
# (+448 for the NaN, the rest scaled by the other values' amax); K=1 input weight with softmax
# weights: 22 of 1024 codes.
PROFILE_DIFFERENCES = {
    "moe_sum-bf16-k3": (dict(quant="bf16", topk=3), {(Oracles.DIFFERENTIAL, Stages.REDUCE)}),
    "nan-dropped-fp8-token": (dict(quant="fp8-token", nan_rows=1), {(Oracles.DIFFERENTIAL, Stages.QUANT_INPUT)}),
    # and the fused float32 activation's point below (fp8-block runs it)
    "nan-dropped-fp8-block": (dict(quant="fp8-block", nan_rows=1), {(Oracles.DIFFERENTIAL, Stages.QUANT_INPUT),
                                                                   (Oracles.DIFFERENTIAL, Stages.ACT_QUANT)}),
    "input-weight-in-bf16": (dict(quant="fp8-token", topk=1, router_weight="input", router="softmax-topk"),
                             {(Oracles.DIFFERENTIAL, Stages.QUANT_INPUT)}),
    # an Inf token: vLLM's scale is Inf and its codes 0 and +448 (Inf / Inf is NaN, clamped); the
    # GEMM scales its dot by Inf (Inf, not diffmoe's 0 * Inf = NaN per code), in both GEMMs, and
    # the down input's quant of those rows follows
    "inf-scaled-after-the-dot": (dict(quant="fp8-token", inf_rows=1), {
        (Oracles.DIFFERENTIAL, Stages.QUANT_INPUT), (Oracles.DIFFERENTIAL, Stages.GATE_UP_GEMM),
        (Oracles.DIFFERENTIAL, Stages.QUANT_DOWN_INPUT), (Oracles.DIFFERENTIAL, Stages.DOWN_GEMM)}),
    # an all-zero token: the fused op floors the scale at 1 / (448 * 512), the group quant's amax at 1e-10
    "fused-block-floor": (dict(quant="fp8-block", zero_rows=1), {(Oracles.DIFFERENTIAL, Stages.ACT_QUANT)}),
    # the fused silu + 128-block quant quantises the float32 activation, never rounded to bf16: its
    # amaxes and scales move by up to a bf16 half ulp (0.2% measured), codes one step (43 of 2048)
    "fused-activation-in-float32": (dict(quant="fp8-block"), {(Oracles.DIFFERENTIAL, Stages.ACT_QUANT)}),
}


def test_an_all_zero_call_at_k1_sums_from_plus_zero_as_at_sum_out_does():
    """A false alarm the campaign found (bench/false_alarm_campaign.py --impl vllm, seed 0, draw 12):
    vLLM's per-tensor scale of an all-zero call has no floor, its down rows hold -0.0, and the
    K = 1 reduce (at::sum_out) adds them to +0: 258 of 512 outputs +0.0 where a sum from the first
    row keeps -0.0. The vllm profile names that rounding point (reduce=bf16_k2_to_4: at::sum_out from +0 at K = 1)."""
    c = MoEConfig(num_tokens=1, num_experts=1, topk=1, hidden=512, inter=224, quant="fp8-tensor", output="workspace",
                  expert_scale_spread=1, zero_rows=1, seed=1230046189)
    report = run_differential(c, vllm_factory(), oracles=[Oracles.DIFFERENTIAL, Oracles.TEACHER_FORCING])
    assert report.config.numerics == "vllm" and report.passed, report.render()


@pytest.mark.parametrize("changes", [v[0] for v in PROFILE_DIFFERENCES.values()], ids=PROFILE_DIFFERENCES)
def test_vllms_rounding_passes_under_its_own_profile(changes):
    c = config(**changes)
    assert c.numerics is None  # the adapter's declared profile: vllm
    report = run_differential(c, vllm_factory(), oracles=[Oracles.DIFFERENTIAL, Oracles.TEACHER_FORCING])
    assert report.config.numerics == "vllm"
    assert report.passed, report.render()


@pytest.mark.parametrize("changes, flagged", PROFILE_DIFFERENCES.values(), ids=PROFILE_DIFFERENCES)
def test_vllms_rounding_is_flagged_under_diffmoes_profile(changes, flagged):
    c = config(numerics="diffmoe", **changes)
    report = run_differential(c, vllm_factory(), oracles=[Oracles.DIFFERENTIAL])
    assert report.config.numerics == "diffmoe" and "--numerics diffmoe" in report.replay_command()
    assert {(f.oracle, f.stage) for f in report.findings} == flagged, report.render()
    earliest = next(st.name for st in pipeline_stages(report.config) if st.name in {stage for _, stage in flagged})
    assert all(f.figures["earliest_divergent_stage"] == earliest for f in report.findings), report.render()


def test_the_schedule_permutes_the_programs_of_each_triton_launch(monkeypatch):
    """Both GEMM launches (launch indices 0 and 1 of the call) run their programs in the schedule's
    order at the interpreter's grid loop (diffmoe.interpreter.grid_order), with the same output bits."""
    from diffmoe.interpreter import grid_order

    if not grid_order.interpreting():
        pytest.skip("program order is controlled at the Triton interpreter's grid loop")
    from triton.runtime import interpreter

    launches = []
    cls = type(interpreter.interpreter_builder)
    set_dim, set_idx = cls.set_grid_dim, cls.set_grid_idx

    def dim(self, *grid):
        launches.append([])
        return set_dim(self, *grid)

    def idx(self, x, y, z):
        launches[-1].append(x)
        return set_idx(self, x, y, z)

    monkeypatch.setattr(cls, "set_grid_dim", dim)
    monkeypatch.setattr(cls, "set_grid_idx", idx)
    c = config("bf16")
    impl = vllm_factory()(c)
    assert impl.orders_programs  # the runner leaves its order to it
    problem = make_problem(c, impl.device)
    out = {}
    for schedule in (Schedule("identity"), Schedule("reversed"), Schedule("random", 3)):
        launches.clear()
        out[str(schedule)] = impl.run(problem, _workspaces(impl), schedule=schedule).output.clone()
        assert len(launches) == 2 and all(len(ran) > 1 for ran in launches)  # gate-up and down GEMMs
        for index, ran in enumerate(launches):
            assert ran == schedule.order(len(ran), index)
        assert not grid_order.installed()
    assert torch.equal(out["identity"], out["reversed"]) and torch.equal(out["identity"], out["random:3"])


def test_vllms_tuned_tile_configs_come_from_the_cache(monkeypatch):
    """fused_moe.py picks tiles from the wheel's configs/ JSON files by GPU name (the cache keeps
    them); the interpreter's name matches none, so CPU checks run vLLM's default configs."""
    import json

    from peers.vllm import RELEASES
    from peers.vllm.core import VllmFiles as _files

    VllmFiles = _files.of_release(RELEASES["0.33.0"])

    files = VllmFiles.get(torch.device("cpu"))
    fm = files.fused_moe
    w1, w2 = (1, 2 * 1792, 4096), (1, 4096, 1792)  # E=1, N=I=1792
    with files.installed():
        fm.get_moe_configs.cache_clear()
        default = fm.try_get_optimal_moe_config(w1, w2, 1, None, 8)
        assert default == fm.get_default_config(8, 1, 1792, 4096, 1, None)
        monkeypatch.setattr(fm, "get_device_name_as_file_name", lambda: "NVIDIA_A100-SXM4-80GB")
        fm.get_moe_configs.cache_clear()
        tuned = fm.try_get_optimal_moe_config(w1, w2, 1, None, 8)
        fm.get_moe_configs.cache_clear()
    path = files.root / "vllm/model_executor/layers/fused_moe/configs/E=1,N=1792,device_name=NVIDIA_A100-SXM4-80GB.json"
    assert tuned == json.loads(path.read_text())["8"] != default


# ---- what the adapter refuses --------------------------------------------------------------------


@pytest.mark.parametrize("changes, field", [
    (dict(quant="fp8-token", fused=True), "fused"),
    (dict(quant="fp8-tensor", fused=True), "fused"),
    (dict(quant="fp8-block", fused=False), "fused"),
])
def test_unsupported_configs_are_refused_naming_the_field(changes, field):
    c = MoEConfig(**{**SMALL, **changes})
    with pytest.raises(ValueError, match=rf"^{field} must"):
        vllm_factory()(c)
    with pytest.raises(ValueError, match=rf"^{field} must"):
        vllm_factory().plan_workspaces(c, c.num_tokens)


def test_without_the_cache_a_peer_run_fails_with_one_line_naming_the_fetch(monkeypatch, tmp_path):
    monkeypatch.setenv(peer_wheels.CACHE_ENV, str(tmp_path / "empty"))
    with pytest.raises(peer_wheels.PeerError) as exc:
        vllm_factory()(config("bf16"))
    assert "\n" not in str(exc.value) and "`diffmoe peers fetch vllm`" in str(exc.value)
