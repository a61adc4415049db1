"""lmdeploy 0.18.0's blocked-FP8 fused MoE under diffmoe's oracles, from its pinned wheel
(peers/lmdeploy/core.py). The wheel is fetched once (network, about 107 MB; the cache it
leaves, 93 KB, is reused: diffmoe/adapters/peer_wheels.py); without network and cache the module skips
naming the fetch command.

What is asserted is what diffmoe measures of lmdeploy's kernels on this machine (docs/peers.md,
"Testing lmdeploy's kernel"): which oracles stay quiet, and which report a real difference of
lmdeploy's numerics or a limit of the adapter, each for its stated reason.
"""

from __future__ import annotations

import pytest
import torch

from diffmoe.interpreter import fixes as interpreter_fixes
from diffmoe.adapters import peer_wheels
from diffmoe.problem.config import QUANT_BLOCK, MoEConfig
from diffmoe.contract import IMPLEMENTATION_ALIASES, Schedule, unsupported
from diffmoe.problem.inputs import make_problem
from diffmoe.check.recording import LaunchLog
from diffmoe.judge.runner import run_differential
from diffmoe.problem.vocabulary import Buffers as B
from diffmoe.problem.vocabulary import Stages

NO_WORKSPACES = (torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8))


@pytest.fixture(scope="module", autouse=True)
def lmdeploy_files():
    """The pinned wheel's files in the peer cache: downloaded and verified on first use only."""
    try:
        return peer_wheels.fetch("lmdeploy")
    except peer_wheels.PeerError as exc:
        pytest.skip(f"lmdeploy 0.18.0 is not in the peer cache and cannot be fetched ({exc}); run "
                    f"`{peer_wheels.fetch_command('lmdeploy')}`")


def factory():
    from peers.lmdeploy import make

    return make


def config(**kw) -> MoEConfig:
    base = dict(num_tokens=8, num_experts=4, topk=2, hidden=128, inter=128, quant="fp8-block", fused=False)
    return MoEConfig(**{**base, **kw})


def run(c: MoEConfig, recorder=None, schedule=Schedule()):
    p = make_problem(c)
    return p, factory()(c).run(p, NO_WORKSPACES, recorder=recorder, schedule=schedule).output


def test_the_alias_names_the_adapter():
    assert IMPLEMENTATION_ALIASES["lmdeploy"] == "peers.lmdeploy:make_0_18_0"


@pytest.mark.parametrize("field, kw", [
    ("quant", dict(quant="fp8-token")), ("fused", dict(fused=True)), ("router_weight", dict(router_weight="input", topk=1)),
    ("output", dict(output="workspace")),
])
def test_supports_refuses_what_lmdeploy_does_not_run_naming_the_field(field, kw):
    c = config(**kw)
    reason = unsupported(factory(), c)
    assert reason is not None and reason.startswith(f"{field} must"), reason
    with pytest.raises(ValueError, match=rf"^{field} must"):
        factory()(c)
    assert unsupported(factory(), config()) is None


def test_the_declared_plan_is_fresh_allocations_only():
    plan = factory().plan_workspaces(config(), 8)
    assert plan.placements == () and plan.workspace_bytes == (0, 0) and "fresh allocations" in plan.planner


def test_every_launch_is_reported_with_its_stage_in_pipeline_order():
    log = LaunchLog()
    run(config(), log)
    stages = [launch.stage for launch in log.launches]
    assert stages == [Stages.QUANT_INPUT, *[Stages.ALIGN] * 3, Stages.GATE_UP_GEMM, Stages.ACTIVATION,
                      Stages.QUANT_DOWN_INPUT, Stages.DOWN_GEMM, Stages.REDUCE], stages


def test_the_sort_reports_its_own_tables_under_private_names():
    """What the store-extent oracle holds the sort to: every table a route-sort launch writes is
    declared (the block tables only where BUILD_BLOCKS is on: lmdeploy passes ExpStart again as a
    placeholder there, which must not read as two names on one buffer)."""
    log = LaunchLog()
    run(config(), log)
    written = {launch.kernel: [r.name for r in launch.writes] for launch in log.launches if launch.stage == Stages.ALIGN}
    assert written == {
        "_sorted_idx_phase1_kernel": [B.private("Counts"), B.private("LocalPos")],
        "_route_prefix_kernel": [B.private("ExpStart"), B.private("ExpEnd")],  # BUILD_BLOCKS off: no BlockEnd
        "_scatter_sorted_idx_kernel": [B.SORTED_TOKEN_IDS],
    }, written


def test_reporting_leaves_lmdeploy_s_results_bit_for_bit_unchanged():
    """The sorted-order buffers are permuted to route order for the snapshots and put back."""
    _, quiet = run(config())
    _, recorded = run(config(), LaunchLog(snapshot=True))
    assert torch.equal(quiet.view(torch.int16), recorded.view(torch.int16))


def test_the_snapshots_are_in_route_order():
    """Row r of the reported gate/up output is route r's product: token r // K's codes times expert topk_ids[r]'s weights."""
    log = LaunchLog(snapshot=True)
    p, _ = run(config(), log)
    codes = log.snapshots[B.QUANTED_GATE_UP_INPUT].float() * log.snapshots[B.QUANTED_GATE_UP_INPUT_SCALES].repeat_interleave(QUANT_BLOCK, 1)
    w1 = p.w1.float() * p.w1_scale.repeat_interleave(QUANT_BLOCK, 1).repeat_interleave(QUANT_BLOCK, 2)
    experts = p.topk_ids.reshape(-1).long()
    want = torch.einsum("rh,rnh->rn", codes.repeat_interleave(2, 0), w1[experts])
    got = log.snapshots[B.GATE_UP_OUTPUT].float()
    assert torch.allclose(got, want, rtol=2**-7, atol=1e-3)


def test_lmdeploy_passes_under_its_own_profile_and_is_flagged_under_diffmoes():
    """Quiet under the `lmdeploy` profile the factory declares (diffmoe.problem.numerics):
    races, schedule (4 orders), both aliasing oracles, store extent (the sort's own tables under
    private names), poison, red zone, call sequence, the differential. Under numerics="diffmoe"
    each divergent stage is its own finding, the largest departure first: `down_gemm` (lmdeploy
    weighs by the router in the reduce: rows off by a factor, measured departure 1.53), `reduce`,
    `quant_down_input`, and last `quant_input`, the earliest divergent stage, where lmdeploy's
    scale is amax * float32(1/448), diffmoe's the correctly rounded amax / 448 (one ulp)."""
    own = run_differential(config(), factory())
    assert own.config.numerics == "lmdeploy" and own.passed, own.render()
    report = run_differential(config(numerics="diffmoe"), factory())
    assert {f.oracle for f in report.findings} == {"differential"}, report.render()
    assert [f.stage for f in report.findings] == [
        Stages.DOWN_GEMM, Stages.REDUCE, Stages.QUANT_DOWN_INPUT, Stages.QUANT_INPUT], report.render()
    quant = report.findings[-1]
    assert quant.buffers == [B.QUANTED_GATE_UP_INPUT_SCALES] and quant.figures["max_ulp"] == 1
    assert all(f.figures["earliest_divergent_stage"] == Stages.QUANT_INPUT for f in report.findings)


@pytest.mark.parametrize("changes", [dict(), dict(topk=3, num_tokens=5, zero_rows=1), dict(hidden=256, inter=384)],
                         ids=["K=2", "K=3-zero-row", "two-K-blocks"])
def test_the_lmdeploy_profile_gives_lmdeploys_bits_stage_by_stage(changes):
    """Each stage of the profile on lmdeploy's own inputs (its snapshots) gives lmdeploy's bits:
    the quantisations, the ratio-rescaled GEMMs (within the bf16 GEMM rule: BLAS sums in its own
    order), silu before the multiply, the unweighted down rows and the bf16 weighted reduce."""
    from diffmoe.tolerance.compare import ulp_distance
    from reference.moe import reference_stage

    c = config(numerics="lmdeploy", **changes)
    log = LaunchLog(snapshot=True)
    p, out = run(c, log)
    snaps = log.snapshots

    def stage(name, *reads):
        return reference_stage(name, {r: snaps[r] for r in reads}, p)

    q_in = stage(Stages.QUANT_INPUT)
    for name in (B.QUANTED_GATE_UP_INPUT, B.QUANTED_GATE_UP_INPUT_SCALES):
        assert torch.equal(q_in[name].view(torch.uint8) if name == B.QUANTED_GATE_UP_INPUT else q_in[name],
                           snaps[name].view(torch.uint8) if name == B.QUANTED_GATE_UP_INPUT else snaps[name]), name
    gate_up = stage(Stages.GATE_UP_GEMM, B.QUANTED_GATE_UP_INPUT, B.QUANTED_GATE_UP_INPUT_SCALES)[B.GATE_UP_OUTPUT]
    assert int(ulp_distance(gate_up, snaps[B.GATE_UP_OUTPUT]).max()) <= 2
    act = stage(Stages.ACTIVATION, B.GATE_UP_OUTPUT)[B.ACTIVATION_OUTPUT]
    assert int(ulp_distance(act, snaps[B.ACTIVATION_OUTPUT]).max()) <= 1  # silu's exp: one float32 ulp
    q_down = stage(Stages.QUANT_DOWN_INPUT, B.ACTIVATION_OUTPUT)
    assert torch.equal(q_down[B.QUANTED_DOWN_INPUT_SCALES], snaps[B.QUANTED_DOWN_INPUT_SCALES])
    down = stage(Stages.DOWN_GEMM, B.QUANTED_DOWN_INPUT, B.QUANTED_DOWN_INPUT_SCALES)[B.DOWN_OUTPUT]
    assert int(ulp_distance(down, snaps[B.DOWN_OUTPUT]).max()) <= 2
    reduced = stage(Stages.REDUCE, B.DOWN_OUTPUT)[B.OUTPUT]
    assert torch.equal(reduced.view(torch.int16), out.view(torch.int16))


def test_lmdeploy_s_input_scale_is_amax_times_the_float32_reciprocal():
    log = LaunchLog(snapshot=True)
    p, _ = run(config(), log)
    groups = p.hidden_states.float().reshape(8, -1, QUANT_BLOCK)
    amax = groups.abs().amax(-1).clamp_min(1e-6)
    reciprocal = torch.tensor(1 / 448, dtype=torch.float32)
    got = log.snapshots[B.QUANTED_GATE_UP_INPUT_SCALES]
    assert torch.equal(got, amax * reciprocal)
    assert not torch.equal(got, amax / 448)  # the reference's correctly rounded division: 1 ulp apart here


def test_without_the_gated_interpreter_fixes_lmdeploy_cannot_run():
    if not interpreter_fixes.gated_installed():
        pytest.skip("runs on a GPU or a Triton the gated fixes are not for")
    with interpreter_fixes.suspended(gated=True):
        with pytest.raises(Exception, match="mask has unsupported dtype|_semantic"):
            run(config())


def test_without_the_cache_a_run_fails_with_one_line_naming_the_fetch(monkeypatch, tmp_path):
    monkeypatch.setenv(peer_wheels.CACHE_ENV, str(tmp_path / "empty"))
    with pytest.raises(peer_wheels.PeerError) as exc:
        factory()(config())
    assert "\n" not in str(exc.value) and "`diffmoe peers fetch lmdeploy`" in str(exc.value)
