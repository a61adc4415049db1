"""Runtime aliasing: hand-made launch sequences whose views alias are flagged, correct ones
are not; a fake implementation walking the real planner's plans agrees with the static oracle."""

import itertools

import pytest
import torch

from diffmoe.problem.config import QUANT_SCHEMES, MoEConfig
from diffmoe.contract import LaunchInfo
from diffmoe.check.guards import GuardedTensor, GuardedWorkspaces
from diffmoe.oracles.runtime_aliasing import check_runtime_aliasing
from diffmoe.oracles.static_aliasing import check_static_aliasing
from diffmoe.check.recording import LaunchLog
from diffmoe.findings import ByteRange, Oracles
from diffmoe.problem.vocabulary import FP8_DTYPE, Buffers, Stages, buffer_spec
from optimized.workspace_planner import plan_workspaces

B = Buffers
TK, I = 16, 64  # routed rows, intermediate size


def _record(log, stage, reads=None, writes=None):
    launch = LaunchInfo(stage=stage, kernel=f"{stage}_kernel", grid=(1,), reads=reads or {}, writes=writes or {})
    log.before_launch(launch)
    log.after_launch(launch)


def _fused_tail(log, ws_gate_up, ws_down_input, ws_down_output, scales):
    """gate_up_gemm -> act_quant -> down_gemm with the given workspaces for each buffer."""
    gate_up = ws_gate_up[: TK * 2 * I * 2].view(torch.bfloat16).view(TK, 2 * I)  # [TK, 2I] bf16
    down_input = ws_down_input[: TK * I].view(FP8_DTYPE).view(TK, I)  # [TK, I] fp8
    down_output = ws_down_output[: TK * 32 * 2].view(torch.bfloat16).view(TK, 32)  # [TK, H] bf16
    _record(log, Stages.GATE_UP_GEMM, writes={B.GATE_UP_OUTPUT: gate_up})
    down_in = {B.QUANTED_DOWN_INPUT: down_input, B.QUANTED_DOWN_INPUT_SCALES: scales}
    _record(log, Stages.ACT_QUANT, reads={B.GATE_UP_OUTPUT: gate_up}, writes=down_in)
    _record(log, Stages.DOWN_GEMM, reads=down_in, writes={B.DOWN_OUTPUT: down_output})


def test_fused_kernel_writing_over_its_input_is_flagged():
    ws1, ws2 = torch.empty(8192, dtype=torch.uint8), torch.empty(8192, dtype=torch.uint8)
    log = LaunchLog()
    _fused_tail(log, ws2, ws2, ws1, torch.empty(TK, 1))  # the legacy colouring
    findings = check_runtime_aliasing(log, {ws1.data_ptr(): "ws1", ws2.data_ptr(): "ws2"})
    assert len(findings) == 1
    f = findings[0]
    assert f.oracle == Oracles.RUNTIME_ALIASING and f.stage == Stages.ACT_QUANT
    assert f.buffers == [B.GATE_UP_OUTPUT, B.QUANTED_DOWN_INPUT]
    assert f.byte_ranges == [ByteRange("ws2", 0, TK * I)]
    assert f.message == (
        f"quanted_down_input written by act_quant clobbers gate_up_output "
        f"(written by gate_up_gemm, read by act_quant) in ws2 bytes [0, {TK * I})"
    )
    assert f.figures["launch"] == 1 and f.figures["kernel"] == "act_quant_kernel"


def test_alternating_workspaces_are_quiet():
    ws1, ws2 = torch.empty(8192, dtype=torch.uint8), torch.empty(8192, dtype=torch.uint8)
    log = LaunchLog()
    _fused_tail(log, ws1, ws2, ws1, torch.empty(TK, 1))  # gate_up_output is dead once down_gemm writes ws1
    assert check_runtime_aliasing(log, {ws1.data_ptr(): "ws1", ws2.data_ptr(): "ws2"}) == []


def test_offsets_are_relative_to_a_guarded_workspace_body():
    guarded = GuardedWorkspaces((8192, 8192))
    ws1, ws2 = guarded.workspaces
    log = LaunchLog()
    _fused_tail(log, ws2[256:], ws2[256:], ws1, torch.empty(TK, 1))
    (f,) = check_runtime_aliasing(log, guarded.region_names())
    assert f.byte_ranges == [ByteRange("ws2", 256, 256 + TK * I)]


def test_clobber_by_a_later_launch_before_the_read():
    ws = torch.empty(1024, dtype=torch.uint8)
    log = LaunchLog()
    _record(log, "a", writes={"x": ws[0:512]})
    _record(log, "b", writes={"y": ws[256:768]})
    _record(log, "c", reads={"x": ws[0:512]})
    (f,) = check_runtime_aliasing(log, {ws.data_ptr(): "ws1"})
    assert f.stage == "b" and f.buffers == ["x", "y"]
    assert f.byte_ranges == [ByteRange("ws1", 256, 512)]
    assert f.message == "y written by b clobbers x (written by a, read by c) in ws1 bytes [256, 512)"
    assert (f.figures["written_at_launch"], f.figures["read_at_launch"]) == (0, 2)


def test_rewriting_a_buffer_before_its_read_is_fine():
    ws = torch.empty(1024, dtype=torch.uint8)
    log = LaunchLog()
    _record(log, "a", writes={"x": ws[0:512]})
    _record(log, "b", writes={"y": ws[0:512]})  # y is never read: dead on arrival, x is rewritten next
    _record(log, "a2", writes={"x": ws[0:512]})
    _record(log, "c", reads={"x": ws[0:512]})
    assert check_runtime_aliasing(log, {ws.data_ptr(): "ws1"}) == []


def test_in_place_update_of_one_buffer_is_fine():
    ws = torch.empty(1024, dtype=torch.uint8)
    log = LaunchLog()
    _record(log, "a", writes={"x": ws[0:512]})
    _record(log, "b", reads={"x": ws[0:512]}, writes={"x": ws[0:512]})
    _record(log, "c", reads={"x": ws[0:512]})
    assert check_runtime_aliasing(log, {}) == []


def test_two_writes_of_one_launch_overlapping():
    ws = torch.empty(1024, dtype=torch.uint8)
    log = LaunchLog()
    _record(log, "act_quant", writes={B.QUANTED_DOWN_INPUT: ws[0:512], B.QUANTED_DOWN_INPUT_SCALES: ws[500:564]})
    (f,) = check_runtime_aliasing(log, {ws.data_ptr(): "ws2"})
    assert f.buffers == [B.QUANTED_DOWN_INPUT, B.QUANTED_DOWN_INPUT_SCALES]
    assert f.byte_ranges == [ByteRange("ws2", 500, 512)]
    assert "act_quant writes quanted_down_input and quanted_down_input_scales to the same ws2 bytes [500, 512)" == f.message


def test_writing_into_a_caller_input_that_the_launch_reads():
    hidden = torch.zeros(8, 16, dtype=torch.bfloat16)
    log = LaunchLog()
    codes_over_hidden = hidden.view(torch.uint8)[:4].view(FP8_DTYPE)  # [4, 32] fp8 on the first 4 rows' bytes
    _record(log, Stages.QUANT_INPUT, reads={B.HIDDEN_STATES: hidden}, writes={B.QUANTED_GATE_UP_INPUT: codes_over_hidden})
    (f,) = check_runtime_aliasing(log, {hidden.data_ptr(): "hidden_states"})
    assert f.buffers == [B.HIDDEN_STATES, B.QUANTED_GATE_UP_INPUT]
    assert f.byte_ranges == [ByteRange("hidden_states", 0, 4 * 32)]
    assert "which it reads" in f.message


def test_a_storage_the_implementation_allocated_is_named_by_what_it_holds_not_by_address():
    # issue 28: findings named fresh allocations by raw pointer; now by the first view written into it
    t = torch.empty(64, dtype=torch.uint8)
    log = LaunchLog()
    _record(log, "s", reads={"a": t[0:32]}, writes={"b": t[16:48]})
    (f,) = check_runtime_aliasing(log, {})
    assert f.byte_ranges == [ByteRange("b (allocated by the implementation)", 16, 32)]
    assert "0x" not in f.message


def test_one_finding_per_pair_and_stage_however_many_launches():
    ws = torch.empty(4096, dtype=torch.uint8)
    log = LaunchLog()
    _record(log, "gate_up_gemm", writes={"x": ws[0:2048]})
    for row in range(4):  # one launch per row block, each clobbering its own slice
        _record(log, "act_quant", reads={"x": ws[row * 512 : (row + 1) * 512]}, writes={"y": ws[row * 256 : (row + 1) * 256]})
    findings = check_runtime_aliasing(log, {ws.data_ptr(): "ws2"})
    assert len(findings) == 1 and findings[0].stage == "act_quant"
    assert findings[0].byte_ranges[0] == ByteRange("ws2", 0, 256)


def test_separate_storages_never_alias():
    a, b = torch.empty(512, dtype=torch.uint8), torch.empty(512, dtype=torch.uint8)
    log = LaunchLog()
    _record(log, "s0", writes={"x": a})
    _record(log, "s1", reads={"x": a}, writes={"y": b})
    _record(log, "s2", reads={"x": a, "y": b})
    assert check_runtime_aliasing(log, {}) == []


# ---- a fake implementation that carves its views from the real planner -----------------------


def _walk_plan(cfg: MoEConfig, num_tokens: int) -> tuple[LaunchLog, dict[int, str]]:
    """Report one launch per stage of the plan, with each placed buffer a view of its workspace
    exactly where the plan says, and every other buffer a tensor of its own."""
    plan = plan_workspaces(cfg, num_tokens)
    guarded = GuardedWorkspaces(plan.workspace_bytes)
    output = GuardedTensor((num_tokens, cfg.hidden), torch.bfloat16)
    views = {}
    for p in plan.placements:
        spec = buffer_spec(cfg, p.buffer, num_tokens)
        views[p.buffer] = guarded.workspaces[p.workspace][p.offset : p.end].view(spec.dtype).view(spec.shape)

    def view(name):
        if name not in views:
            if name == B.OUTPUT:
                views[name] = output.tensor
            elif name in (B.HIDDEN_STATES, B.TOPK_WEIGHTS):
                views[name] = torch.empty(num_tokens, cfg.hidden)
            else:
                spec = buffer_spec(cfg, name, num_tokens)
                views[name] = torch.empty(spec.shape, dtype=spec.dtype)
        return views[name]

    log = LaunchLog()
    for stage in plan.stages:
        _record(log, stage.name, {n: view(n) for n in stage.reads}, {n: view(n) for n in stage.writes})
    return log, {**guarded.region_names(), **output.region_names()}


def _switches():
    for quant, output, planner in itertools.product(QUANT_SCHEMES, ("separate", "workspace"), ("fixed", "legacy")):
        for fused in ((False, True) if quant != "bf16" else (False,)):
            yield MoEConfig(
                num_tokens=9, num_experts=4, topk=2, hidden=128, inter=256, quant=quant, fused=fused, planner=planner, output=output
            )


@pytest.mark.parametrize("cfg", list(_switches()), ids=lambda c: c.short())
def test_runtime_and_static_oracles_agree_on_the_planner(cfg):
    for num_tokens in (1, 4, 9):
        log, names = _walk_plan(cfg, num_tokens)
        runtime = check_runtime_aliasing(log, names)
        static = check_static_aliasing(plan_workspaces(cfg, num_tokens))
        assert [(f.stage, f.buffers, f.byte_ranges) for f in runtime] == [(f.stage, f.buffers, f.byte_ranges) for f in static]
        assert bool(runtime) == (cfg.planner == "legacy" and cfg.fused)
