"""The bug zoo: deliberately broken variants of the optimized MoE, each a bug a kernel
engineer could plausibly write, kept as fixtures so the suite can prove which oracle catches
which kind of bug.

Every mutant subclasses `optimized.moe.TritonFP8MoE` and overrides the smallest hook
(`_gemm`, `_act_quant`, `_reduce`, `_align`, `_carve`, `_run_stage`, `run`, `workspace_shapes`,
or `traits`);
the legacy planner is not a subclass at all but the shipped implementation run with
`planner="legacy"`, and `vllm-cache2-in-ws2` is vLLM 0.33's adapter (peers/vllm/core.py) with
one carve planted wrong, judged against the unmodified adapter (its `control_factory`). Each `Mutant` records what it breaks, the smallest config that shows
it, the oracles that must report it and the buffer or stage a finding must name.

A mutant's factory is also a module-level function, so a config from the table replays with
`PYTHONPATH=tests/support diffmoe check ... --impl bug_zoo:<factory>`.

`OUTCOME_MUTANTS` holds the mutants whose failure is not a wrong value but an outcome of
the run itself: one crashes (a Triton error), one hangs under the interpreter. They are
caught by the `crash` and `timeout` outcomes, which are not selectable oracles, so they
live apart from `MUTANTS` (whose expected oracles are checks one can select).
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch

# optimized first: it switches Triton to the interpreter when there is no GPU, which must
# happen before anything imports triton.
from optimized.moe import TritonFP8MoE

import triton  # noqa: E402 - after optimized, which picks the interpreter without a GPU
import triton.language as tl  # noqa: E402

from diffmoe.interpreter import fixes as interpreter_fixes
from diffmoe.adapters import peer_wheels
from diffmoe.problem.config import MoEConfig
from diffmoe.contract import RunResult
from diffmoe.check.report import Report
from diffmoe.findings import Finding, Oracles
from diffmoe.problem.vocabulary import FP8_DTYPE, Buffers, Stages, buffer_spec
import optimized.act_quant as act_quant_module  # noqa: E402
import optimized.kernels.act_quant_kernel as act_quant_kernel_module  # noqa: E402
import optimized.kernels.numerics as numerics_module  # noqa: E402
from optimized.kernels.act_quant_kernel import PASS_AMAX, PASS_QUANTIZE  # noqa: E402
from optimized.kernels.numerics import bf16_to_f32, to_bf16  # noqa: E402
from optimized.kernels.reduce_kernel import moe_reduce_kernel  # noqa: E402
from optimized.backend import safe_traits
from optimized.grouped_gemm import run_grouped_gemm
from optimized.launch import launch
from optimized.workspace_planner import plan_workspaces
from peers import vllm as vllm_peer  # loads no vLLM file until an adapter is built
from peers.vllm import core as vllm_core

B = Buffers
# the stages whose kernels cast float32 to e4m3fn
_QUANT_STAGES = (Stages.QUANT_INPUT, Stages.QUANT_DOWN_INPUT, Stages.ACT_QUANT)


# ---- the mutants -------------------------------------------------------------------------


class DroppedRouterWeight(TritonFP8MoE):
    """The down GEMM's epilogue no longer multiplies by the router weight.

    The kind of slip made when moving the router-weight multiply between the down GEMM and
    the reduce: the flag is turned off on one side and never turned on on the other, so every
    token's experts are summed unweighted.
    """

    def _gemm(self, stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights, *, a_row_div, mul_router_weight,
              router_weight_on_a=False):
        super()._gemm(stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights, a_row_div=a_row_div,
                      mul_router_weight=False, router_weight_on_a=router_weight_on_a)


class SentinelOffByOne(TritonFP8MoE):
    """The align step pads each expert's segment with TK - 1 instead of the sentinel TK.

    TK - 1 is the last *real* routed row, so the GEMM's `row < TK` mask lets every padding
    slot through: each padded block computes that row with its own expert's weights and
    stores it, and the row ends up holding whichever block ran last.
    """

    def _align(self, problem):
        layout = super()._align(problem)
        routed = problem.config.routed_rows
        used = int(layout.num_tokens_post_padded.item())
        ids = layout.sorted_token_ids[:used]
        ids[ids == routed] = routed - 1  # the off-by-one: "last valid row" where "one past" was meant
        return layout


class GridIgnoresPadding(TritonFP8MoE):
    """The grouped GEMM's grid is sized from the routed rows, cdiv(TK, BLOCK_M), instead of
    from the padded layout, so the blocks of the last expert(s) never run.

    Their rows of gate_up_output and down_output are never written, and the next stage reads
    whatever the workspace held before the call: a read of memory this call never wrote.
    """

    def _gemm(self, stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights, **kwargs):
        routed = problem.config.routed_rows
        short = dataclasses.replace(layout, blocks=-(-routed // layout.block_m))  # cdiv(TK, BLOCK_M)
        super()._gemm(stage, ctx, problem, short, a, a_scale, w, w_scale, out, weights, **kwargs)


class NativeFP8Cast(TritonFP8MoE):
    """The quant kernels use the backend's float32 -> e4m3fn cast unconditionally, on a backend
    whose cast is wrong, instead of rounding onto the e4m3 grid first where the probes found a
    defect. Right on CUDA; on triton 3.9's unfixed interpreter (its cast runs here inside
    `interpreter_fixes.suspended()`) the cast drops the mantissa carry and rounds ties away from
    zero, so some codes are one step off."""

    def __init__(self, config: MoEConfig, device=None):
        super().__init__(config, device)
        # every other primitive on the software path that is right on that backend too
        self.traits = dataclasses.replace(safe_traits(self.traits.name), software_fp8_cast=False)

    def _run_stage(self, stage, bufs, problem, layout, ctx):
        if stage not in _QUANT_STAGES:
            return super()._run_stage(stage, bufs, problem, layout, ctx)
        with interpreter_fixes.suspended():  # the defective backend the native cast ignores
            super()._run_stage(stage, bufs, problem, layout, ctx)


class FusedNativeFP8Cast(TritonFP8MoE):
    """Only the fused act+quant uses the backend's native e4m3 cast (a fast path written for
    CUDA, where the native cast is right), on a backend whose cast is wrong (the unfixed
    interpreter, `interpreter_fixes.suspended()`); the unfused quant keeps the software rounding.
    The two paths, which must agree bit for bit, now disagree."""

    def __init__(self, config: MoEConfig, device=None):
        super().__init__(config, device)
        self.traits = safe_traits(self.traits.name)  # every other primitive right on that backend

    def _act_quant(self, stage, row, source, fused, codes_out, scales_out, software_fp8=None):
        if not fused:
            return super()._act_quant(stage, row, source, fused, codes_out, scales_out, software_fp8)
        with interpreter_fixes.suspended():
            super()._act_quant(stage, row, source, fused, codes_out, scales_out, software_fp8=False)


class WorkspaceOneRowShort(TritonFP8MoE):
    """`workspace_shapes` sizes ws1 one row short of the largest buffer the plan puts there
    (a `rows - 1` in the byte count). The plan still declares the full buffer, so the harness
    must refuse to launch rather than let a kernel run off the end."""

    def workspace_shapes(self, max_tokens=None):
        t = max_tokens or self.max_tokens
        plan = self.workspace_plan(t)
        n1, n2 = plan.workspace_bytes
        largest = max((p for p in plan.placements if p.workspace == 0), key=lambda p: p.nbytes)
        rows = buffer_spec(self.config, largest.buffer, t).shape[0]
        return n1 - largest.nbytes // rows, n2


class GroupScalesStridesSwapped(TritonFP8MoE):
    """The act+quant launch passes its 1x128 group scales with the row and group strides
    swapped, so the scale of (row r, group g) is stored at element r + g*G instead of r*G + g:
    scales land in other rows' slots and the down GEMM dequantises with the wrong ones."""

    def _act_quant(self, stage, row, source, fused, codes_out, scales_out, software_fp8=None):
        name, scales = scales_out
        if scales.dim() == 2:  # [rows, groups]; a per-tensor scale has no strides to swap
            scales = scales.as_strided(scales.shape, (scales.stride(1), scales.stride(0)))
        super()._act_quant(stage, row, source, fused, codes_out, (name, scales), software_fp8)


class InPlaceReduce(TritonFP8MoE):
    """The final output is carved from ws2 at offset 0, the bytes of down_output, instead of
    from ws1 as the plan declares: the reduce writes token t's row over routed row t while
    another program may still have to read it. Harmless in ascending program order (row t is
    read by token t // K, whose program runs no later), wrong when a later program runs first."""

    def _carve(self, plan, workspaces, num_tokens):
        bufs = super()._carve(plan, workspaces, num_tokens)
        if self.config.output == "workspace":
            spec = buffer_spec(self.config, B.OUTPUT, num_tokens)
            bufs[B.OUTPUT] = workspaces[1][: spec.nbytes].view(spec.dtype).view(spec.shape)
        return bufs


class OutputOneRowLate(TritonFP8MoE):
    """The final output is carved from ws1 one row late (byte offset = one output row), by
    pointer arithmetic that nothing checks against the end of ws1: the reduce's last row
    lands past the workspace. The result itself is right, so only the guard bytes tell."""

    def _carve(self, plan, workspaces, num_tokens):
        bufs = super()._carve(plan, workspaces, num_tokens)
        if self.config.output == "workspace":
            # torch refuses such a view on an exactly sized workspace; the harness's workspaces
            # have guard bytes behind them, so it goes through there, as a raw pointer would on a GPU
            out = bufs[B.OUTPUT]
            bufs[B.OUTPUT] = out.as_strided(out.shape, out.stride(), out.storage_offset() + out.stride(0))
        return bufs


class ResultInWorkspace(TritonFP8MoE):
    """With a caller-supplied output, the reduce still writes into the ws1 slot the output
    would have in the workspace layout (the pattern of vLLM PR #50338): the caller's tensor
    is never written, and the ws1 slot is down_output's own bytes."""

    def _carve(self, plan, workspaces, num_tokens):
        bufs = super()._carve(plan, workspaces, num_tokens)
        spec = buffer_spec(self.config, B.OUTPUT, num_tokens)
        self._workspace_output = workspaces[0][: spec.nbytes].view(spec.dtype).view(spec.shape)
        return bufs

    def _reduce(self, stage, ctx, down, out):
        # The slot belongs to the call that carved it; a single stage run on fresh buffers
        # (teacher forcing) carves nothing and takes the caller's tensor, as it should.
        target = self.__dict__.pop("_workspace_output", None)
        super()._reduce(stage, ctx, down, (out[0], target if target is not None else out[1]))


class InPlaceInputQuant(TritonFP8MoE):
    """The input quantisation writes its FP8 codes into the bytes of hidden_states instead of
    its workspace slot ("the bf16 input is dead once quantised, so reuse its memory"). The
    codes take the first half of the input's bytes; the result is right, because each
    program loads its rows before it stores codes, but the caller's hidden_states is gone."""

    def _run_stage(self, stage, bufs, problem, layout, ctx):
        if stage == Stages.QUANT_INPUT:
            x = problem.hidden_states  # [T, H] bf16, contiguous
            codes = x.view(torch.uint8).reshape(-1)[: x.numel()].view(FP8_DTYPE).view(x.shape)
            bufs = {**bufs, B.QUANTED_GATE_UP_INPUT: codes}
            super()._run_stage(stage, bufs, problem, layout, ctx)
            self._in_place_codes = codes  # the GEMM reads the codes where they were written
            return
        if stage == Stages.GATE_UP_GEMM and getattr(self, "_in_place_codes", None) is not None:
            bufs = {**bufs, B.QUANTED_GATE_UP_INPUT: self.__dict__.pop("_in_place_codes")}
        super()._run_stage(stage, bufs, problem, layout, ctx)


class ReturnsDownOutput(TritonFP8MoE):
    """A K == 1 fast path ("each token has one expert, so down_output already is the result")
    taken whatever K: the reduce is skipped and down_output, [T*K, H], is returned as the
    output. The caller's output tensor is never written."""

    def _carve(self, plan, workspaces, num_tokens):
        bufs = super()._carve(plan, workspaces, num_tokens)
        self._down_output = bufs[B.DOWN_OUTPUT]
        return bufs

    def _reduce(self, stage, ctx, down, out):
        pass  # the fast path: no reduce

    def run(self, problem, workspaces, **kwargs):
        super().run(problem, workspaces, **kwargs)
        return RunResult(output=self._down_output)


class FusedTileNotPowerOfTwo(TritonFP8MoE):
    """The fused act+quant takes a whole row per step (cols_per_step = I, a GPU tuning that
    saves the loop), but Triton's tl.arange needs a power of two: any I that is not one fails
    to compile (under the interpreter: fails at launch). Caught as a crash, not a hang or a
    wrong value; fp8-block keeps its 128-column groups and is unaffected."""

    def _act_quant(self, stage, row, source, fused, codes_out, scales_out, software_fp8=None):
        if fused and self.config.quant != "fp8-block":
            row = dict(row, tiles=dataclasses.replace(row["tiles"], cols_per_step=self.config.inter))
        super()._act_quant(stage, row, source, fused, codes_out, scales_out, software_fp8)


@triton.jit
def _arrive_and_wait(counter_ptr, num_programs, order_ptr, REORDER: tl.constexpr):
    """Grid-wide barrier: each program counts itself in, then spins until all have."""
    tl.atomic_add(counter_ptr, 1)
    arrived = tl.load(counter_ptr, volatile=True)
    while arrived < num_programs:
        arrived = tl.load(counter_ptr, volatile=True)


class ReduceWaitsForAllPrograms(TritonFP8MoE):
    """Before the reduce, a grid-wide barrier: every program increments a counter and spins
    until all programs have arrived (a pattern written for a GPU, where all programs of a
    small grid run at once). The interpreter runs programs one at a time, so with two or
    more programs the first one spins forever: the check hangs in stage reduce. One reduce
    program (T <= 32 and H <= 256 on the interpreter) passes."""

    def _reduce(self, stage, ctx, down, out):
        t, h = out[1].shape
        programs = triton.cdiv(t, self.tiles.reduce_tokens) * triton.cdiv(h, self.tiles.reduce_cols)
        counter = torch.zeros(1, dtype=torch.int32, device=self.device)
        launch(ctx, _arrive_and_wait, programs, stage=stage, reads={}, writes={}, counter_ptr=counter, num_programs=programs)
        super()._reduce(stage, ctx, down, out)


class ReduceOneRowTooMany(TritonFP8MoE):
    """The reduce is launched for T + 1 tokens while it declares (and returns) the [T, H] output.

    An off-by-one in the token count of the launch: the extra row is stored just past the
    output's view, inside ws1 when the output is carved from it, on bytes no later stage reads.
    Nothing the call returns changes and no guard byte is hit: only the launch's store extent
    shows it (on a GPU the same store clobbers whatever an engine keeps after the output).
    """

    def run(self, *args, **kwargs):
        # the slip is in the whole-pipeline launch path; run_stage (teacher forcing) writes into a
        # tensor of exactly [T, H], where the extra row would corrupt the process's heap
        self._whole_pipeline = True
        try:
            return super().run(*args, **kwargs)
        finally:
            self._whole_pipeline = False

    def _reduce(self, stage, ctx, down, out):
        if not getattr(self, "_whole_pipeline", False):
            return super()._reduce(stage, ctx, down, out)
        (down_name, down_t), (out_name, out_t) = down, out
        t, h = out_t.shape
        num_h_blocks = triton.cdiv(h, self.tiles.reduce_cols)
        programs = triton.cdiv(t + 1, self.tiles.reduce_tokens) * num_h_blocks
        launch(
            ctx, moe_reduce_kernel, programs, stage=stage, reads={down_name: down_t}, writes={out_name: out_t},
            down_ptr=down_t, out_ptr=out_t, T=t + 1, H=h, TOPK=self.config.topk, num_h_blocks=num_h_blocks,
            routed_scaling_factor=1.0, ROUTED_SCALE=False,
            stride_dm=down_t.stride(0), stride_dh=down_t.stride(1), stride_om=out_t.stride(0), stride_oh=out_t.stride(1),
            SOFTWARE_BF16=self.traits.software_bf16_cast, BLOCK_T=self.tiles.reduce_tokens, BLOCK_H=self.tiles.reduce_cols,
        )


class AmaxPassCachedAcrossCalls(TritonFP8MoE):
    """Per-tensor down-input quantisation skips its amax pass after the first call.

    A "static scale after warm-up" shortcut: the per-program amax partials (a private buffer)
    are computed once, and every later call reduces the first call's partials. A lone call,
    and every rerun of the same call, is exactly right; a smaller call after a larger one
    quantises with the larger call's scale.
    """

    def _act_quant(self, stage, row, source, fused, codes_out, scales_out, software_fp8=None):
        real = act_quant_module.launch
        cached = getattr(self, "_cached_partials", None)

        def launch_once(ctx, kernel, grid_size, **kwargs):
            if kwargs.get("PASS") != PASS_AMAX.value:
                return real(ctx, kernel, grid_size, **kwargs)
            if cached is not None:  # the partials of the first call stand in for this call's
                self._amax_partials.copy_(cached)
                return None
            real(ctx, kernel, grid_size, **kwargs)
            self._cached_partials = self._amax_partials.clone()
            return None

        act_quant_module.launch = launch_once
        try:
            super()._act_quant(stage, row, source, fused, codes_out, scales_out, software_fp8)
        finally:
            act_quant_module.launch = real


# ---- mutants of the opt-in input classes: each is invisible on the default inputs ---------


class ExpertZeroWeightScale(TritonFP8MoE):
    """Both GEMMs dequantise every expert's weights with expert 0's per-tensor scale (a
    `w_scale[0]` where `w_scale[expert]` was meant). With equal weight amaxes (the spread and
    the outlier channels both off) the scales are equal and the bug is invisible; the default
    inputs show it (issue 42). Other granularities and bf16 (no scales) run as shipped, so a
    fuzz finds it by its values on a per-tensor config, not by a crash elsewhere."""

    def _gemm(self, stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights, **kwargs):
        if w_scale is not None and w_scale[1] is not None and w_scale[1].dim() == 1:  # [L] per-tensor weight scales
            w_scale = (w_scale[0], w_scale[1][:1].expand_as(w_scale[1]).contiguous())
        super()._gemm(stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights, **kwargs)


class TensorPathForTensorWeights(TritonFP8MoE):
    """Per-tensor weights beside per-token activations take the per-tensor GEMM: the path is chosen by
    the weight scale's shape ([L], "per tensor"), and that path reads one activation scale with zero
    strides, so every routed row is dequantised with row 0's scale. Invisible where every row's scale
    is the same, to the differential oracle: a one-token call with K = 1 (issue 48 item 5: the default
    fuzz's first such draw). A full check's batch invariance sees it there (the token in a T=3 batch)."""

    def _gemm(self, stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights, **kwargs):
        if (self.config.weight_granularity, self.config.act_granularity) != ("tensor", "token"):
            return super()._gemm(stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights, **kwargs)
        run_grouped_gemm(ctx, self.tiles, self.traits, stage=stage, quant="fp8-tensor", a=a, a_scale=a_scale, w=w,
                         w_scale=w_scale, out=out, layout=layout, topk_weights=weights, weight_quant="fp8-tensor",
                         **kwargs)


class NaNSquashedOnInput(TritonFP8MoE):
    """The input quantisation reads `torch.nan_to_num(hidden_states)`: a defensive copy made
    by the launcher, so a NaN token comes out finite where the reference propagates NaN."""

    def _run_stage(self, stage, bufs, problem, layout, ctx):
        if stage == Stages.QUANT_INPUT:
            problem = dataclasses.replace(problem, hidden_states=torch.nan_to_num(problem.hidden_states))
        super()._run_stage(stage, bufs, problem, layout, ctx)


class ScaleFloorDropped(TritonFP8MoE):
    """The per-token scale is amax / 448 with no floor: an all-zero token gets scale 0 and
    codes 0 / 0 = NaN, where the reference floors the scale and keeps the token zero."""

    def _run_stage(self, stage, bufs, problem, layout, ctx):
        with _patched(act_quant_kernel_module, TOKEN_SCALE_FLOOR=tl.constexpr(0.0)):
            super()._run_stage(stage, bufs, problem, layout, ctx)


class InputRouterWeightDropped(TritonFP8MoE):
    """router_weight="input" (K = 1): the gate-up GEMM no longer scales the token by its router
    weight. With weights from a softmax over K = 1 logit (exactly 1.0) nothing changes; the
    softmax-over-E router of a serving engine gives weights below 1 and shows it."""

    def _gemm(self, stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights, **kwargs):
        super()._gemm(stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights,
                      **{**kwargs, "router_weight_on_a": False})


class TileFromBatchSize(TritonFP8MoE):
    """Both GEMMs step over K in 16-wide tiles for a call of one or two tokens (a decode-sized
    tile choice) and 128-wide otherwise: a row's dot is then summed in eight float32 partial sums
    instead of one, so its bits depend on the batch it is in. Every value stays within any float32
    summation order's interval (the differential's derived rule), each batch size is consistent
    with itself (schedule, call-sequence, teacher forcing): only batch invariance sees it. Rarely:
    the bf16 output hides most float32 reorderings (at T=3 H=I=256 one-token calls of seeds 0-3 move
    no element; of seed 4, 1 of 512 down elements, one ulp; the default fuzz of seed 0 met it at
    example 4, issue 48, and at example 103 under issue 42's default inputs)."""

    def _gemm(self, stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights, **kwargs):
        tiles = self.tiles
        if problem.num_tokens <= 2:
            self.tiles = dataclasses.replace(tiles, block_k=16)
        try:
            super()._gemm(stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights, **kwargs)
        finally:
            self.tiles = tiles


@triton.jit
def _round_to_e4m3_grid_ties_away(x):
    """float32 -> nearest e4m3fn value, ties away from zero (the bug: half-up on the magnitude)."""
    bits = x.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x80000) & 0xFFF00000).to(tl.float32, bitcast=True)
    scaled = tl.abs(x) * 512.0
    magnitude = tl.floor(scaled + 0.5) * (2.0**-9)
    subnormal = (magnitude.to(tl.uint32, bitcast=True) | (bits & 0x80000000)).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(x) < 0.015625, subnormal, normal)


class TiesRoundedAwayFromZero(TritonFP8MoE):
    """The software e4m3 rounding rounds ties away from zero instead of to even (the rule of
    `round()` in many languages). A random input puts few values exactly on a midpoint;
    tie-heavy inputs put about half of them there. The software rounding is the path a backend
    with a defective cast runs (on the fixed interpreter the probes turn it off), so it is on."""

    def __init__(self, config: MoEConfig, device=None):
        super().__init__(config, device)
        self.traits = dataclasses.replace(self.traits, software_fp8_cast=True)  # the path the bug is in

    def _run_stage(self, stage, bufs, problem, layout, ctx):
        with _patched(numerics_module, round_to_e4m3_grid=_round_to_e4m3_grid_ties_away):
            super()._run_stage(stage, bufs, problem, layout, ctx)


class AmaxOverCapacityRows(TritonFP8MoE):
    """The per-tensor amax of the down input is taken over every row the workspaces were
    sized for (the largest batch's TK), not over this call's rows: a call below the maximum
    folds in workspace bytes beyond its buffer, poison or an earlier call's rows. A call at
    the maximum is exactly right."""

    def _act_quant(self, stage, row, source, fused, codes_out, scales_out, software_fp8=None):
        capacity_rows = self.config.routed_rows
        capacity_programs = act_quant_module.row_programs(capacity_rows, self.tiles)
        real = act_quant_module.launch

        def over_capacity(ctx, kernel, grid_size, **kwargs):
            x = kwargs["x_ptr"]
            needed = (x.storage_offset() + (capacity_rows - 1) * x.stride(0) + x.shape[1]) * x.element_size()
            if x.untyped_storage().nbytes() < needed:  # a stage run on a tensor of exactly TK rows
                return real(ctx, kernel, grid_size, **kwargs)
            if kwargs.get("PASS") == PASS_AMAX.value:
                kwargs["x_ptr"] = torch.as_strided(x, (capacity_rows, x.shape[1]), x.stride(), x.storage_offset())
                kwargs["R"], grid_size = capacity_rows, capacity_programs
            elif kwargs.get("PASS") == PASS_QUANTIZE.value:
                kwargs["num_programs"] = capacity_programs
            return real(ctx, kernel, grid_size, **kwargs)

        act_quant_module.launch = over_capacity
        try:
            super()._act_quant(stage, row, source, fused, codes_out, scales_out, software_fp8)
        finally:
            act_quant_module.launch = real


# ---- mutants that exactly one oracle sees --------------------------------------------------


class PlanDriftsFromCarving(TritonFP8MoE):
    """The declared plan is the legacy one (gate_up_output and quanted_down_input on the same
    ws2 bytes) while the carving and the workspace sizes follow the fixed planner: the plan an
    engine sizes and audits its workspaces by is not what runs. Only the declared plan shows it."""

    def workspace_plan(self, num_tokens):
        return plan_workspaces(self.config, num_tokens, planner="legacy")

    def workspace_shapes(self, max_tokens=None):
        t = max_tokens or self.max_tokens
        # room for both, so that the declared plan fits the workspaces as well as the carving does
        return tuple(max(a, b) for a, b in zip(plan_workspaces(self.config, t, planner="fixed").workspace_bytes,
                                               plan_workspaces(self.config, t, planner="legacy").workspace_bytes))

    def _carve(self, plan, workspaces, num_tokens):
        return super()._carve(plan_workspaces(self.config, num_tokens, planner="fixed"), workspaces, num_tokens)


class InPlaceActivation(TritonFP8MoE):
    """The unfused activation writes activation_output over the first bytes of its own input,
    gate_up_output ("the input is dead once read"). A program loads its rows before storing,
    so with one program (TK <= 32 on the interpreter) every value is right; on a GPU, with
    programs running at once, one program's stores land on rows another has still to read."""

    def _carve(self, plan, workspaces, num_tokens):
        bufs = super()._carve(plan, workspaces, num_tokens)
        if B.ACTIVATION_OUTPUT in bufs:
            act, gate_up = bufs[B.ACTIVATION_OUTPUT], bufs[B.GATE_UP_OUTPUT]
            bufs[B.ACTIVATION_OUTPUT] = gate_up.view(-1)[: act.numel()].view(act.shape)
        return bufs


class _RouterWeightDroppedOnOnePath(TritonFP8MoE):
    """The down GEMM loses its router-weight multiply on one entry point only (ENTRY: "run",
    the whole pipeline, or "run_stage", one stage on its own): two call paths that drifted apart."""

    ENTRY = ""

    def _on_entry(self, method, *args, **kwargs):
        self._broken_path = True
        try:
            return method(*args, **kwargs)
        finally:
            self._broken_path = False

    def run(self, *args, **kwargs):
        if self.ENTRY == "run":
            return self._on_entry(super().run, *args, **kwargs)
        return super().run(*args, **kwargs)

    def run_stage(self, *args, **kwargs):
        if self.ENTRY == "run_stage":
            return self._on_entry(super().run_stage, *args, **kwargs)
        return super().run_stage(*args, **kwargs)

    def _gemm(self, stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights, *, mul_router_weight, **kwargs):
        super()._gemm(stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights,
                      mul_router_weight=mul_router_weight and not getattr(self, "_broken_path", False), **kwargs)


class StageEntryDropsRouterWeight(_RouterWeightDroppedOnOnePath):
    """The per-stage entry point (`run_stage`, what teacher forcing and a stage-by-stage
    debugger call) builds the down GEMM without the router-weight multiply; the whole-pipeline
    path is right."""

    ENTRY = "run_stage"


class PipelineDropsRouterWeight(_RouterWeightDroppedOnOnePath):
    """The whole pipeline moved the router-weight multiply from the down GEMM to the reduce,
    switching it off in the GEMM and never on in the reduce; the per-stage entry point kept the
    old path, so every stage run on its own is right. Only the pipeline's own run shows it."""

    ENTRY = "run"


class OutputMemsetRoundedUp(TritonFP8MoE):
    """Before the launches the caller's output is zeroed by a host-side memset whose length is
    rounded up to 512 bytes: with H = 128 (256-byte rows) and an odd T the memset runs past the
    output. The reduce then writes every real element, so no value changes."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        if output is not None and output.numel():
            nbytes = -(-output.numel() * output.element_size() // 512) * 512
            torch.as_strided(output, (nbytes // output.element_size(),), (1,), output.storage_offset()).zero_()
        return super().run(problem, workspaces, output=output, **kwargs)


class UnfusedActivationTruncates(TritonFP8MoE):
    """The unfused activation kernel stores silu(g) * u with the backend's native bf16 cast, on
    a backend whose cast truncates (the unfixed interpreter, `interpreter_fixes.suspended()`),
    where the fused path rounds to nearest even: the two paths quantise different activations.
    A check of the fused config runs only the fused path; its unfused sibling shows the
    difference."""

    def _run_stage(self, stage, bufs, problem, layout, ctx):
        if stage != Stages.ACTIVATION:
            return super()._run_stage(stage, bufs, problem, layout, ctx)
        traits = self.traits
        self.traits = dataclasses.replace(traits, software_bf16_cast=False)
        try:
            with interpreter_fixes.suspended():
                super()._run_stage(stage, bufs, problem, layout, ctx)
        finally:
            self.traits = traits


_ZOO_ZERO, _ZOO_LOAD_ADD_STORE, _ZOO_PREFIX_EXCHANGE, _ZOO_FINITE_ONLY, _ZOO_FINITE_OR_KEPT = 0, 1, 2, 3, 4


@triton.jit
def _zoo_reduce_kernel(
    # Pointers
    down_ptr,  # [TK, H] bf16, row t*K + k
    out_ptr,  # [T, H] bf16
    order_ptr,  # [num_programs] int32 program order (REORDER)
    # Dimensions
    H,
    TOPK,
    num_h_blocks,
    # Strides
    stride_dm, stride_om,
    # Meta-parameters
    MODE: tl.constexpr,
    REORDER: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Grid: (rows * num_h_blocks,), rows = T for _ZOO_ZERO and the _ZOO_FINITE modes, TK otherwise;
    each program owns one row and BLOCK_H columns. The broken reduces of the bug zoo, which
    all sum in float32 in k order and round once, as the real one does:

    _ZOO_ZERO: out[t] = 0.
    _ZOO_LOAD_ADD_STORE: routed row r adds itself into out[r // K] by a plain load-add-store
        (no atomic): two programs of one token read-modify-write the same bytes.
    _ZOO_PREFIX_EXCHANGE: routed row r = t*K + k sums rows t*K .. r and publishes the prefix
        sum with an atomic exchange, trusting programs to finish in launch order.
    _ZOO_FINITE_ONLY: token t sums its K rows and stores only the finite sums (a NaN sum is
        left unwritten: whatever the output held before stays there).
    _ZOO_FINITE_OR_KEPT: token t stores every element, a NaN sum replaced by the value the output
        held, read back (every byte stored: what it stores is stale).
    """
    pid = tl.program_id(0)
    if REORDER:
        pid = tl.load(order_ptr + pid)
    row = pid // num_h_blocks
    cols = (pid % num_h_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = cols < H
    if MODE == 0:
        tl.store(out_ptr + row * stride_om + cols, tl.zeros((BLOCK_H,), dtype=tl.float32).to(tl.bfloat16), mask=mask)
    elif MODE == 1:
        token = row // TOPK
        acc = bf16_to_f32(tl.load(out_ptr + token * stride_om + cols, mask=mask, other=0.0), True)
        acc += bf16_to_f32(tl.load(down_ptr + row * stride_dm + cols, mask=mask, other=0.0), True)
        tl.store(out_ptr + token * stride_om + cols, to_bf16(acc, True), mask=mask)
    elif MODE == 2:
        # The interpreter has no 16-bit atomics: exchange 32-bit words holding two bf16 columns
        # (even | odd << 16); H is even, a word never straddles a row.
        token = row // TOPK
        pairs = (pid % num_h_blocks) * (BLOCK_H // 2) + tl.arange(0, BLOCK_H // 2)
        pair_mask = 2 * pairs < H
        first = down_ptr + token * TOPK * stride_dm + 2 * pairs
        even = bf16_to_f32(tl.load(first, mask=pair_mask, other=0.0), True)
        odd = bf16_to_f32(tl.load(first + 1, mask=pair_mask, other=0.0), True)
        for j in range(token * TOPK + 1, row + 1):
            even += bf16_to_f32(tl.load(down_ptr + j * stride_dm + 2 * pairs, mask=pair_mask, other=0.0), True)
            odd += bf16_to_f32(tl.load(down_ptr + j * stride_dm + 2 * pairs + 1, mask=pair_mask, other=0.0), True)
        lo = to_bf16(even, True).to(tl.uint16, bitcast=True).to(tl.uint32)
        hi = to_bf16(odd, True).to(tl.uint16, bitcast=True).to(tl.uint32)
        word = (lo | (hi << 16)).to(tl.int32, bitcast=True)
        tl.atomic_xchg(out_ptr.to(tl.pointer_type(tl.int32)) + token * (stride_om // 2) + pairs, word, mask=pair_mask)
    else:
        acc = bf16_to_f32(tl.load(down_ptr + row * TOPK * stride_dm + cols, mask=mask, other=0.0), True)
        for k in range(1, TOPK):
            acc += bf16_to_f32(tl.load(down_ptr + (row * TOPK + k) * stride_dm + cols, mask=mask, other=0.0), True)
        if MODE == 3:
            tl.store(out_ptr + row * stride_om + cols, to_bf16(acc, True), mask=mask & (acc == acc))
        else:
            kept = bf16_to_f32(tl.load(out_ptr + row * stride_om + cols, mask=mask, other=0.0), True)
            tl.store(out_ptr + row * stride_om + cols, to_bf16(tl.where(acc == acc, acc, kept), True), mask=mask)


class _ZooReduce(TritonFP8MoE):
    """A reduce stage made of _zoo_reduce_kernel launches (MODES, in order)."""

    MODES: tuple[int, ...] = ()

    def _reduce(self, stage, ctx, down, out):
        (down_name, down_t), (out_name, out_t) = down, out
        t, h = out_t.shape
        block_h = 256
        num_h_blocks = triton.cdiv(h, block_h)
        for mode in self.MODES:
            rows = t if mode in (_ZOO_ZERO, _ZOO_FINITE_ONLY, _ZOO_FINITE_OR_KEPT) else t * self.config.topk
            launch(ctx, _zoo_reduce_kernel, rows * num_h_blocks, stage=stage, reads={down_name: down_t},
                   writes={out_name: out_t}, down_ptr=down_t, out_ptr=out_t, H=h, TOPK=self.config.topk,
                   num_h_blocks=num_h_blocks, stride_dm=down_t.stride(0), stride_om=out_t.stride(0), MODE=mode,
                   BLOCK_H=block_h)


class ReduceWithoutAtomics(_ZooReduce):
    """A scatter reduce: each routed row adds itself into its token's output row by a plain
    load, add and store, after a zeroing launch. Sequentially every order gives the same bits
    (with K = 2, 0 + a + b and 0 + b + a round alike), so no value and no program order shows
    it; on a GPU the two programs of a token race and one addition is lost."""

    MODES = (_ZOO_ZERO, _ZOO_LOAD_ADD_STORE)


class ReduceTrustsLaunchOrder(_ZooReduce):
    """Each routed row publishes its token's prefix sum (rows 0..k) with an atomic exchange,
    trusting the program of the last expert to finish last. Atomics do not race, and in launch
    order the last writer is the full sum; in another order a partial sum is left."""

    MODES = (_ZOO_PREFIX_EXCHANGE,)


class ReduceSkipsNonFiniteSums(_ZooReduce):
    """The reduce stores only finite sums ("do not write NaN"): a NaN token's output row keeps
    whatever the caller's tensor held. Under a NaN poison that is NaN, as the reference's row,
    so the values agree; under any other fill the row is garbage."""

    MODES = (_ZOO_FINITE_ONLY,)


class ReduceKeepsNonFiniteRows(_ZooReduce):
    """The reduce stores every element, but a NaN sum is replaced by the value the output held
    (read back): each byte is stored by the launch, so the store watch is satisfied, and the row is
    whatever the caller's tensor held, NaN under a NaN poison, garbage under any other fill."""

    MODES = (_ZOO_FINITE_OR_KEPT,)


@triton.jit
def _zoo_block_reduce_kernel(
    down_ptr,  # [TK, H] bf16, row t*K + k
    out_ptr,  # [T, H] bf16
    order_ptr,  # [num_programs] int32 program order (REORDER)
    T, H, TOPK,
    stride_dm, stride_om,
    MASK_LOADS: tl.constexpr,
    MASK_STORE: tl.constexpr,
    REORDER: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Grid: (cdiv(T, BLOCK_T),); each program sums the K rows of BLOCK_T tokens over all H <= BLOCK_H
    columns, as the real reduce does, with the bounds mask of its loads or its store dropped."""
    pid = tl.program_id(0)
    if REORDER:
        pid = tl.load(order_ptr + pid)
    tokens = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_H)
    mask = (tokens < T)[:, None] & (cols < H)[None, :]
    rows = down_ptr + (tokens * TOPK)[:, None] * stride_dm + cols[None, :]
    acc = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    for k in range(0, TOPK):
        if MASK_LOADS:
            acc += bf16_to_f32(tl.load(rows + k * stride_dm, mask=mask, other=0.0), True)
        else:
            acc += bf16_to_f32(tl.load(rows + k * stride_dm), True)
    target = out_ptr + tokens[:, None] * stride_om + cols[None, :]
    if MASK_STORE:
        tl.store(target, to_bf16(acc, True), mask=mask)
    else:
        tl.store(target, to_bf16(acc, True))


class _BlockReduce(TritonFP8MoE):
    """A reduce of whole token blocks (BLOCK_T = 4 rows a program, more than the bug zoo's T)
    through _zoo_block_reduce_kernel, with one of its bounds masks dropped."""

    MASK_LOADS, MASK_STORE, PRIVATE_OUTPUT = True, True, False

    def _reduce(self, stage, ctx, down, out):
        (down_name, down_t), (out_name, out_t) = down, out
        t, h = out_t.shape
        # the kernel writes the implementation's own [T, H] tensor, as SGLang's reduce writes its
        # own output buffer, which the caller's output is then copied from
        target = torch.empty_like(out_t) if self.PRIVATE_OUTPUT else out_t
        launch(ctx, _zoo_block_reduce_kernel, triton.cdiv(t, 4), stage=stage, reads={down_name: down_t},
               writes={out_name: target}, down_ptr=down_t, out_ptr=target, T=t, H=h, TOPK=self.config.topk,
               stride_dm=down_t.stride(0), stride_om=target.stride(0), MASK_LOADS=self.MASK_LOADS,
               MASK_STORE=self.MASK_STORE, BLOCK_T=4, BLOCK_H=triton.next_power_of_2(h))
        if target is not out_t:
            out_t.copy_(target)


class ReduceStoreMaskDropped(_BlockReduce):
    """The reduce's final store lost its mask (the slip of issue 28 in SGLang's final store): a
    program of 4 token rows stores all 4 into the implementation's own [T, H] output tensor, the
    rows past T into the heap beyond it. The values the call returns are right; under the
    interpreter the store used to corrupt the process heap (SIGABRT, "corrupted size vs.
    prev_size"); the bounds guard refuses the rows past the end."""

    MASK_STORE, PRIVATE_OUTPUT = False, True


class ReduceLoadMaskDropped(_BlockReduce):
    """The reduce loads all 4 token rows of its block without a mask: the K rows of tokens past T
    are read past the end of down_output and of the workspace holding it (the sums of those rows
    are never stored, so no value shows it)."""

    MASK_LOADS = False


@contextmanager
def _patched(module, **names):
    """Module globals replaced for the duration (the interpreter resolves a kernel's globals at
    call time, so a patched constant or helper reaches the kernel)."""
    saved = {name: getattr(module, name) for name in names}
    for name, value in names.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


# Module-level factories: the `--impl bug_zoo:<name>` entry points and run_differential's
# `implementation` argument.
def make_legacy_planner(config: MoEConfig) -> TritonFP8MoE:
    return TritonFP8MoE(config)  # the config itself selects planner="legacy"


def make_dropped_router_weight(config: MoEConfig) -> TritonFP8MoE:
    return DroppedRouterWeight(config)


def make_sentinel_off_by_one(config: MoEConfig) -> TritonFP8MoE:
    return SentinelOffByOne(config)


def make_grid_ignores_padding(config: MoEConfig) -> TritonFP8MoE:
    return GridIgnoresPadding(config)


def make_native_fp8_cast(config: MoEConfig) -> TritonFP8MoE:
    return NativeFP8Cast(config)


def make_fused_native_fp8_cast(config: MoEConfig) -> TritonFP8MoE:
    return FusedNativeFP8Cast(config)


def make_workspace_one_row_short(config: MoEConfig) -> TritonFP8MoE:
    return WorkspaceOneRowShort(config)


def make_group_scales_strides_swapped(config: MoEConfig) -> TritonFP8MoE:
    return GroupScalesStridesSwapped(config)


def make_in_place_reduce(config: MoEConfig) -> TritonFP8MoE:
    return InPlaceReduce(config)


def make_output_one_row_late(config: MoEConfig) -> TritonFP8MoE:
    return OutputOneRowLate(config)


def make_result_in_workspace(config: MoEConfig) -> TritonFP8MoE:
    return ResultInWorkspace(config)


def make_in_place_input_quant(config: MoEConfig) -> TritonFP8MoE:
    return InPlaceInputQuant(config)


def make_returns_down_output(config: MoEConfig) -> TritonFP8MoE:
    return ReturnsDownOutput(config)


def make_reduce_one_row_too_many(config: MoEConfig) -> TritonFP8MoE:
    return ReduceOneRowTooMany(config)


def make_reduce_store_mask_dropped(config: MoEConfig) -> TritonFP8MoE:
    return ReduceStoreMaskDropped(config)


def make_reduce_load_mask_dropped(config: MoEConfig) -> TritonFP8MoE:
    return ReduceLoadMaskDropped(config)


def make_amax_pass_cached_across_calls(config: MoEConfig) -> TritonFP8MoE:
    return AmaxPassCachedAcrossCalls(config)


def make_expert_zero_weight_scale(config: MoEConfig) -> TritonFP8MoE:
    return ExpertZeroWeightScale(config)


def make_tensor_path_for_tensor_weights(config: MoEConfig) -> TritonFP8MoE:
    return TensorPathForTensorWeights(config)


def make_nan_squashed_on_input(config: MoEConfig) -> TritonFP8MoE:
    return NaNSquashedOnInput(config)


def make_scale_floor_dropped(config: MoEConfig) -> TritonFP8MoE:
    return ScaleFloorDropped(config)


def make_input_router_weight_dropped(config: MoEConfig) -> TritonFP8MoE:
    return InputRouterWeightDropped(config)


def make_ties_rounded_away_from_zero(config: MoEConfig) -> TritonFP8MoE:
    return TiesRoundedAwayFromZero(config)


def make_amax_over_capacity_rows(config: MoEConfig) -> TritonFP8MoE:
    return AmaxOverCapacityRows(config)


def make_plan_drifts_from_carving(config: MoEConfig) -> TritonFP8MoE:
    return PlanDriftsFromCarving(config)


def make_tile_from_batch_size(config: MoEConfig) -> TritonFP8MoE:
    return TileFromBatchSize(config)


def make_in_place_activation(config: MoEConfig) -> TritonFP8MoE:
    return InPlaceActivation(config)


def make_stage_entry_drops_router_weight(config: MoEConfig) -> TritonFP8MoE:
    return StageEntryDropsRouterWeight(config)


def make_pipeline_drops_router_weight(config: MoEConfig) -> TritonFP8MoE:
    return PipelineDropsRouterWeight(config)


def make_output_memset_rounded_up(config: MoEConfig) -> TritonFP8MoE:
    return OutputMemsetRoundedUp(config)


def make_unfused_activation_truncates(config: MoEConfig) -> TritonFP8MoE:
    return UnfusedActivationTruncates(config)


def make_reduce_without_atomics(config: MoEConfig) -> TritonFP8MoE:
    return ReduceWithoutAtomics(config)


def make_reduce_trusts_launch_order(config: MoEConfig) -> TritonFP8MoE:
    return ReduceTrustsLaunchOrder(config)


def make_reduce_skips_non_finite_sums(config: MoEConfig) -> TritonFP8MoE:
    return ReduceSkipsNonFiniteSums(config)


def make_reduce_keeps_non_finite_rows(config: MoEConfig) -> TritonFP8MoE:
    return ReduceKeepsNonFiniteRows(config)


def make_fused_tile_not_power_of_two(config: MoEConfig) -> TritonFP8MoE:
    return FusedTileNotPowerOfTwo(config)


def make_reduce_waits_for_all_programs(config: MoEConfig) -> TritonFP8MoE:
    return ReduceWaitsForAllPrograms(config)


# ---- a peer adapter's planted carve ------------------------------------------------------
# vLLM 0.33.0's adapter (peers/vllm/core.py) with one carve changed: workspace2 handed over as
# workspace13 too, so intermediate_cache2 (activation_output) is carved from workspace2, over
# cache1 while silu_and_mul reads it. The declared plan says so (variant "cache2-in-ws2"), so the
# static oracle judges the carving the adapter really makes. Building either needs vLLM's files
# in the peer cache: without them it fails with one line naming `diffmoe peers fetch vllm`.


def make_vllm_cache2_in_ws2(config: MoEConfig) -> vllm_core.VllmTritonMoE:
    return vllm_core.VllmTritonMoE(config, variant="cache2-in-ws2")


def _plan_vllm_cache2_in_ws2(config: MoEConfig, num_tokens: int):
    return vllm_core.plan_workspaces(config, num_tokens, variant="cache2-in-ws2")


# diffmoe.contract's optional factory attributes: the declared plan without a build, and vLLM's
# `supports` (the fuzzers draw around what vLLM does not run)
make_vllm_cache2_in_ws2.plan_workspaces = _plan_vllm_cache2_in_ws2
make_vllm_cache2_in_ws2.supports = vllm_peer.make.supports


# ---- the registry ------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    name: str
    what_it_breaks: str  # one line, for the bug-zoo table (docs/bug-zoo.md)
    factory: Callable[[MoEConfig], object]  # run_differential's `implementation`
    config: MoEConfig  # the smallest config that shows it
    expected_oracles: frozenset[str]  # each must report at least one finding
    expected_name: str  # a buffer, stage or workspace some expected oracle's finding names
    baseline_config: MoEConfig | None = None  # what the unmodified implementation runs (default: config)
    # For a mutant of an opt-in input class: the same config without that input, which the
    # mutant passes (the input class is what makes the bug visible)
    unseen_without: MoEConfig | None = None
    # The implementation the mutant was broken from, which must pass its config (None: the shipped
    # one), and the peer whose cached files both need (diffmoe.adapters.peer_wheels; None: no peer)
    control_factory: Callable[[MoEConfig], object] | None = None
    peer: str | None = None

    @property
    def impl(self) -> str:
        """The `--impl MODULE:FACTORY` spec that replays this mutant."""
        return "optimized" if self.factory is make_legacy_planner else f"bug_zoo:{self.factory.__name__}"

    @property
    def control_config(self) -> MoEConfig:
        return self.baseline_config or self.config

    def fetch_peer(self) -> None:
        """The peer's pinned files in the cache (downloaded once, as tests/peers/test_peers_vllm.py does);
        diffmoe.adapters.peer_wheels.PeerError with one line naming `diffmoe peers fetch PEER` when that fails."""
        if self.peer is not None:
            peer_wheels.fetch(self.peer)


def finding_names(finding: Finding) -> set[str]:
    """Everything a finding points at: its stage, its buffers and the regions of its bytes."""
    names = set(finding.buffers) | {r.region for r in finding.byte_ranges}
    if finding.stage:
        names.add(finding.stage)
    return names


def names_expected(mutant: Mutant, report: Report) -> bool:
    """Whether a finding of one of the mutant's expected oracles names what it breaks."""
    return any(
        mutant.expected_name in finding_names(f) for f in report.findings if f.oracle in mutant.expected_oracles
    )


O = Oracles
_SMALL = dict(num_experts=2, topk=2, hidden=128, inter=128, quant="fp8-token", fused=True, seed=0)


def _cfg(**fields) -> MoEConfig:
    return MoEConfig(**{**_SMALL, "num_tokens": 1, **fields})


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            name="legacy-planner",
            what_it_breaks="fused FP8 plan keeps the unwritten activation_output slot: gate_up_output and "
                           "quanted_down_input share ws2 while act_quant reads one and writes the other",
            factory=make_legacy_planner,
            # 17 tokens x K=2 = 34 rows: two act_quant programs, so the alias also shows as a race
            config=_cfg(num_tokens=17, planner="legacy"),
            # the wrong values show only under another program order: the schedule oracle's to report
            expected_oracles=frozenset({O.STATIC_ALIASING, O.RUNTIME_ALIASING, O.RACES, O.SCHEDULE}),
            expected_name=B.QUANTED_DOWN_INPUT,
            baseline_config=_cfg(num_tokens=17, planner="fixed"),
        ),
        Mutant(
            name="dropped-router-weight",
            what_it_breaks="down GEMM epilogue skips the router-weight multiply",
            factory=make_dropped_router_weight,
            config=_cfg(),
            expected_oracles=frozenset({O.DIFFERENTIAL, O.TEACHER_FORCING}),
            expected_name=Stages.DOWN_GEMM,
        ),
        Mutant(
            name="align-sentinel-off-by-one",
            what_it_breaks="align pads expert segments with TK-1 (a real row) instead of the sentinel TK",
            factory=make_sentinel_off_by_one,
            config=_cfg(),
            expected_oracles=frozenset({O.RACES, O.SCHEDULE}),  # in launch order the last writer is right
            expected_name=Stages.GATE_UP_GEMM,
        ),
        Mutant(
            name="gemm-grid-ignores-padding",
            what_it_breaks="grouped GEMM grid sized cdiv(TK, BLOCK_M), not by the padded blocks: the last "
                           "expert's rows are never written and the next stage reads stale workspace bytes",
            factory=make_grid_ignores_padding,
            config=_cfg(),
            expected_oracles=frozenset({O.POISON, O.DIFFERENTIAL, O.CONTRACT}),  # contract: the rows never stored
            expected_name=B.GATE_UP_OUTPUT,
        ),
        Mutant(
            name="native-fp8-cast",
            what_it_breaks="quant kernels use the interpreter's native float32 -> e4m3fn cast (wrong rounding)",
            factory=make_native_fp8_cast,
            config=_cfg(),
            expected_oracles=frozenset({O.DIFFERENTIAL, O.TEACHER_FORCING}),
            expected_name=B.QUANTED_GATE_UP_INPUT,
        ),
        Mutant(
            name="fused-native-fp8-cast",
            what_it_breaks="only the fused act+quant uses the native e4m3 cast: fused and unfused "
                           "quanted_down_input disagree",
            factory=make_fused_native_fp8_cast,
            config=_cfg(),
            expected_oracles=frozenset({O.METAMORPHIC, O.DIFFERENTIAL, O.TEACHER_FORCING}),
            expected_name=B.QUANTED_DOWN_INPUT,
        ),
        Mutant(
            name="workspace-one-row-short",
            what_it_breaks="workspace_shapes gives ws1 one row less than the plan's largest ws1 buffer",
            factory=make_workspace_one_row_short,
            config=_cfg(),
            expected_oracles=frozenset({O.CONTRACT}),
            expected_name=B.GATE_UP_OUTPUT,
        ),
        Mutant(
            name="group-scales-strides-swapped",
            what_it_breaks="act+quant stores 1x128 group scales with row and group strides swapped (wrong rows)",
            factory=make_group_scales_strides_swapped,
            # I=256: two scale groups per row; T=2 (TK=4 > G=2) so the swap is not a mere transpose
            config=_cfg(num_tokens=2, inter=256, quant="fp8-block"),
            expected_oracles=frozenset({O.DIFFERENTIAL, O.TEACHER_FORCING}),
            expected_name=B.QUANTED_DOWN_INPUT_SCALES,
        ),
        Mutant(
            name="in-place-reduce",
            what_it_breaks="output carved from ws2 over down_output: reduce programs overwrite rows other "
                           "programs still read (a race)",
            factory=make_in_place_reduce,
            # 33 tokens: two reduce programs (32 tokens each), so one can clobber the other's input
            config=_cfg(num_tokens=33, output="workspace"),
            expected_oracles=frozenset({O.RACES, O.SCHEDULE, O.RUNTIME_ALIASING}),
            expected_name=Stages.REDUCE,
        ),
        Mutant(
            name="output-one-row-late",
            what_it_breaks="output carved from ws1 one row late: the reduce writes its last row past ws1",
            factory=make_output_one_row_late,
            config=_cfg(output="workspace"),
            expected_oracles=frozenset({O.RED_ZONE}),
            expected_name="ws1",
        ),
        Mutant(
            name="result-in-workspace",
            what_it_breaks="reduce writes a ws1 view instead of the caller's output (vLLM #50338 pattern)",
            factory=make_result_in_workspace,
            config=_cfg(),
            expected_oracles=frozenset({O.DIFFERENTIAL, O.POISON, O.RUNTIME_ALIASING}),
            expected_name=B.OUTPUT,
        ),
        Mutant(
            name="in-place-input-quant",
            what_it_breaks="input quant writes its codes over hidden_states' bytes: right result, caller's input destroyed",
            factory=make_in_place_input_quant,
            config=_cfg(),
            expected_oracles=frozenset({O.CONTRACT}),
            expected_name=B.HIDDEN_STATES,
        ),
        Mutant(
            name="reduce-one-row-too-many",
            what_it_breaks="reduce launched for T+1 tokens: one row stored past the output's view, inside ws1, "
                           "on bytes nothing reads",
            factory=make_reduce_one_row_too_many,
            # I=256: ws1 holds quanted_down_input (T*K*I = 1024 bytes), twice the output, so the extra
            # row lands inside ws1 and no guard byte sees it
            config=_cfg(num_tokens=2, inter=256, output="workspace"),
            expected_oracles=frozenset({O.STORE_EXTENT}),
            expected_name="ws1",
        ),
        Mutant(
            name="reduce-store-mask-dropped",
            what_it_breaks="the reduce's final store without its mask: 4 token rows stored into the "
                           "implementation's own [T, H] output tensor, the rows past T beyond its end",
            factory=make_reduce_store_mask_dropped,
            config=_cfg(),
            expected_oracles=frozenset({O.BOUNDS}),
            expected_name=B.OUTPUT,
        ),
        Mutant(
            name="reduce-load-mask-dropped",
            what_it_breaks="the reduce loads 4 token rows of down_output without a mask: the rows past T read "
                           "past the end of the workspace holding it",
            factory=make_reduce_load_mask_dropped,
            config=_cfg(),
            expected_oracles=frozenset({O.BOUNDS}),
            expected_name=B.DOWN_OUTPUT,
        ),
        Mutant(
            name="amax-pass-cached-across-calls",
            what_it_breaks="per-tensor down-input amax computed on the first call only: a later, smaller call "
                           "quantises with the earlier call's scale",
            factory=make_amax_pass_cached_across_calls,
            # seed 1: the activation amax of the 8-token call exceeds that of its first 4 tokens, so the
            # cached partials change the scale (seed 0 happens to have both maxima in the first half)
            config=_cfg(num_tokens=8, quant="fp8-tensor", fused=False, seed=1),
            expected_oracles=frozenset({O.CALL_SEQUENCE}),
            expected_name=B.QUANTED_DOWN_INPUT,
        ),
        Mutant(
            name="returns-down-output",
            what_it_breaks="K == 1 fast path taken for any K: reduce skipped, [T*K, H] down_output returned as the output",
            factory=make_returns_down_output,
            config=_cfg(),
            expected_oracles=frozenset({O.CONTRACT, O.DIFFERENTIAL}),
            expected_name=B.OUTPUT,
        ),
        # ---- the opt-in input classes: each mutant is invisible without its input (but call_tokens') ----
        Mutant(
            name="tile-from-batch-size",
            what_it_breaks="both GEMMs take 16-wide K tiles for a call of 1-2 tokens: a token's bits depend on its batch",
            factory=make_tile_from_batch_size,
            # T=3: its own calls use 128-wide tiles, call-sequence's one-token call (T // 16, which
            # batch invariance judges) 16-wide; bf16: no scale between the partial sums; H=I=256
            # seed 4: one down row's bit moves (at H=I=128 seeds 0-9 move none, at 256 seeds 0-3), measured
            # without issue 42's default spread and outliers, with which seed 4 moves none: those inputs pinned
            config=_cfg(num_tokens=3, hidden=256, inter=256, quant="bf16", fused=False, seed=4, expert_scale_spread=0,
                        outlier_channels=0),
            expected_oracles=frozenset({O.BATCH_INVARIANCE}),
            expected_name=Stages.DOWN_GEMM,
        ),
        Mutant(
            name="expert-zero-weight-scale",
            what_it_breaks="both GEMMs dequantise every expert with expert 0's per-tensor weight scale",
            factory=make_expert_zero_weight_scale,
            # default inputs (issue 42: the per-expert spread and outlier channels every config has
            # unless turned off); H=I=256: with both off every expert's weight amax is the clamp,
            # 4 std, so the scales are equal and the bug invisible (unseen_without)
            config=_cfg(num_tokens=2, hidden=256, inter=256, quant="fp8-tensor"),
            expected_oracles=frozenset({O.DIFFERENTIAL, O.TEACHER_FORCING}),
            expected_name=Stages.GATE_UP_GEMM,
            unseen_without=_cfg(num_tokens=2, hidden=256, inter=256, quant="fp8-tensor", expert_scale_spread=0,
                                outlier_channels=0),
        ),
        Mutant(
            name="tensor-path-for-tensor-weights",
            what_it_breaks="per-tensor weights beside per-token activations run the per-tensor GEMM: every row "
                           "dequantised with row 0's activation scale",
            factory=make_tensor_path_for_tensor_weights,
            # two tokens: two activation scales. No unseen_without: at T = K = 1 the differential
            # oracle sees one scale and passes, but the batch-invariance oracle runs that token at
            # position 2 of a T=3 batch, where row 0's scale is another token's (256 of 256 elements)
            config=_cfg(num_tokens=2, topk=1, quant="fp8-token", weight_scales="tensor"),
            expected_oracles=frozenset({O.DIFFERENTIAL, O.TEACHER_FORCING}),
            expected_name=Stages.GATE_UP_GEMM,
        ),
        Mutant(
            name="nan-squashed-on-input",
            what_it_breaks="input quant reads nan_to_num(hidden_states): a NaN token comes out finite",
            factory=make_nan_squashed_on_input,
            config=_cfg(num_tokens=2, nan_rows=1),
            expected_oracles=frozenset({O.DIFFERENTIAL, O.TEACHER_FORCING}),
            expected_name=B.QUANTED_GATE_UP_INPUT,
            unseen_without=_cfg(num_tokens=2),
        ),
        Mutant(
            name="scale-floor-dropped",
            what_it_breaks="per-token scale amax / 448 without its floor: an all-zero token becomes 0 / 0 = NaN",
            factory=make_scale_floor_dropped,
            config=_cfg(num_tokens=2, zero_rows=1),
            expected_oracles=frozenset({O.DIFFERENTIAL, O.TEACHER_FORCING}),
            expected_name=B.QUANTED_GATE_UP_INPUT,
            unseen_without=_cfg(num_tokens=2),
        ),
        Mutant(
            name="input-router-weight-dropped",
            what_it_breaks="router_weight=input (K = 1): the gate-up GEMM no longer scales the token by its weight",
            factory=make_input_router_weight_dropped,
            # random-k at K = 1 gives weight 1.0 exactly (unseen_without); softmax over E does not
            config=_cfg(quant="bf16", fused=False, topk=1, router_weight="input", router="softmax-topk"),
            expected_oracles=frozenset({O.DIFFERENTIAL, O.TEACHER_FORCING}),
            expected_name=Stages.GATE_UP_GEMM,
            unseen_without=_cfg(quant="bf16", fused=False, topk=1, router_weight="input"),
        ),
        Mutant(
            name="ties-rounded-away-from-zero",
            what_it_breaks="software e4m3 rounding takes ties away from zero instead of to even",
            factory=make_ties_rounded_away_from_zero,
            config=_cfg(tie_heavy=True),
            expected_oracles=frozenset({O.DIFFERENTIAL, O.TEACHER_FORCING}),
            expected_name=B.QUANTED_GATE_UP_INPUT,
            unseen_without=_cfg(),  # seed 0 puts no value on a midpoint; other seeds may
        ),
        Mutant(
            name="amax-over-capacity-rows",
            what_it_breaks="per-tensor down-input amax over the workspaces' capacity rows, not the call's: "
                           "a call below the maximum folds in bytes beyond its buffer",
            factory=make_amax_over_capacity_rows,
            # 40 tokens x K=2 = 80 capacity rows (3 row programs); the call carries 5 (1 program)
            config=_cfg(num_tokens=40, quant="fp8-tensor", fused=False, call_tokens=5),
            expected_oracles=frozenset({O.DIFFERENTIAL, O.POISON, O.STORE_EXTENT}),
            expected_name=B.QUANTED_DOWN_INPUT,
            # no unseen_without: without call_tokens the call-sequence series (calls of T = 1..3 on
            # workspaces sized for T = 4, issue 43) sees it too, its first T = 1 call's amax folding in
            # the poisoned capacity rows
        ),
        Mutant(
            name="reduce-skips-non-finite-sums",
            what_it_breaks="reduce stores only finite sums: a NaN token's output row keeps what the caller's "
                           "tensor held (NaN under a NaN poison, so the values agree)",
            factory=make_reduce_skips_non_finite_sums,
            config=_cfg(quant="bf16", fused=False, num_tokens=2, nan_rows=1),
            # the row it leaves is a declared byte its Triton programs stored nowhere (issue 43)
            expected_oracles=frozenset({O.POISON, O.CONTRACT}),
            expected_name=B.OUTPUT,
            unseen_without=_cfg(quant="bf16", fused=False, num_tokens=2),
        ),
        Mutant(
            name="reduce-keeps-non-finite-rows",
            what_it_breaks="reduce stores every element but replaces a NaN sum with the value the output held, "
                           "read back (NaN under a NaN poison, so the values agree; every byte stored)",
            factory=make_reduce_keeps_non_finite_rows,
            config=_cfg(quant="bf16", fused=False, num_tokens=2, nan_rows=1),
            expected_oracles=frozenset({O.POISON}),
            expected_name=B.OUTPUT,
            unseen_without=_cfg(quant="bf16", fused=False, num_tokens=2),
        ),
        # ---- one oracle alone sees each of these ----
        Mutant(
            name="plan-drifts-from-carving",
            what_it_breaks="the declared plan is the legacy one while carving and sizes follow the fixed planner",
            factory=make_plan_drifts_from_carving,
            config=_cfg(),
            expected_oracles=frozenset({O.STATIC_ALIASING}),
            expected_name=B.QUANTED_DOWN_INPUT,
        ),
        Mutant(
            name="in-place-activation",
            what_it_breaks="unfused activation writes over its own input's bytes: right with one program, a race "
                           "on a GPU",
            factory=make_in_place_activation,
            config=_cfg(fused=False),  # TK = 2: one activation program
            expected_oracles=frozenset({O.RUNTIME_ALIASING}),
            expected_name=B.ACTIVATION_OUTPUT,
        ),
        Mutant(
            name="stage-entry-drops-router-weight",
            what_it_breaks="run_stage builds the down GEMM without the router weight; the whole pipeline is right",
            factory=make_stage_entry_drops_router_weight,
            config=_cfg(quant="bf16", fused=False),
            expected_oracles=frozenset({O.TEACHER_FORCING}),
            expected_name=Stages.DOWN_GEMM,
        ),
        Mutant(
            name="pipeline-drops-router-weight",
            what_it_breaks="the pipeline moved the router-weight multiply to the reduce and lost it; each stage "
                           "on its own is right",
            factory=make_pipeline_drops_router_weight,
            config=_cfg(quant="bf16", fused=False),
            expected_oracles=frozenset({O.DIFFERENTIAL}),
            expected_name=Stages.DOWN_GEMM,
        ),
        Mutant(
            name="output-memset-rounded-up",
            what_it_breaks="host-side memset of the caller's output rounded up to 512 bytes: runs past the output",
            factory=make_output_memset_rounded_up,
            config=_cfg(quant="bf16", fused=False),  # one 256-byte row: 256 bytes past the end
            expected_oracles=frozenset({O.RED_ZONE}),
            expected_name=B.OUTPUT,
        ),
        Mutant(
            name="unfused-activation-truncates",
            what_it_breaks="only the unfused activation stores with the native (truncating) bf16 cast: fused and "
                           "unfused paths quantise different activations",
            factory=make_unfused_activation_truncates,
            config=_cfg(num_tokens=2, inter=256),  # the fused config: its unfused sibling is the broken path
            expected_oracles=frozenset({O.METAMORPHIC}),
            expected_name=B.QUANTED_DOWN_INPUT,
        ),
        Mutant(
            name="reduce-without-atomics",
            what_it_breaks="scatter reduce by plain load-add-store: every order gives the same bits, programs race",
            factory=make_reduce_without_atomics,
            config=_cfg(quant="bf16", fused=False),
            expected_oracles=frozenset({O.RACES}),
            expected_name=Stages.REDUCE,
        ),
        Mutant(
            name="reduce-trusts-launch-order",
            what_it_breaks="each routed row publishes its token's prefix sum by atomic exchange, trusting the last "
                           "expert's program to finish last",
            factory=make_reduce_trusts_launch_order,
            config=_cfg(quant="bf16", fused=False),
            expected_oracles=frozenset({O.SCHEDULE}),
            expected_name=B.OUTPUT,
        ),
        Mutant(
            name="vllm-cache2-in-ws2",
            what_it_breaks="vLLM 0.33's adapter carves intermediate_cache2 from workspace2, not workspace13: silu_and_mul "
                           "writes activation_output over the gate_up_output it reads",
            factory=make_vllm_cache2_in_ws2,
            # what `diffmoe fuzz --impl bug_zoo:make_vllm_cache2_in_ws2 --seed 0` shrinks to (its plan
            # tier finds it first; test_bug_zoo_fuzzed holds the two equal): the smallest sizes, and
            # an unfused scheme, since vLLM's fused path never writes cache2
            config=_cfg(num_experts=1, topk=1, hidden=16, inter=16, quant="fp8-tensor", fused=False),
            # silu_and_mul computes before it stores, so the values stay right: only the aliasing oracles see it
            expected_oracles=frozenset({O.STATIC_ALIASING, O.RUNTIME_ALIASING}),
            expected_name=B.ACTIVATION_OUTPUT,
            control_factory=vllm_peer.make,
            peer=vllm_peer.RELEASES[vllm_peer.DEFAULT].peer,
        ),
    )
}

OUTCOME_MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            name="fused-tile-not-power-of-two",
            what_it_breaks="fused act+quant steps over whole rows: tl.arange(0, I) fails for an I that is not a power of two",
            factory=make_fused_tile_not_power_of_two,
            config=_cfg(inter=96),
            expected_oracles=frozenset({O.CRASH}),
            expected_name=Stages.ACT_QUANT,
            baseline_config=_cfg(inter=96),
        ),
        Mutant(
            name="reduce-waits-for-all-programs",
            what_it_breaks="grid-wide barrier before the reduce: under the interpreter the first program spins forever",
            factory=make_reduce_waits_for_all_programs,
            config=_cfg(hidden=384),  # two reduce column blocks of 256: two programs
            expected_oracles=frozenset({O.TIMEOUT}),
            expected_name=Stages.REDUCE,
        ),
    )
}
