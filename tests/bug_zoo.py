"""The bug zoo: deliberately broken variants of the optimized MoE, each a bug a kernel
engineer could plausibly write, kept as fixtures so the suite can prove which oracle catches
which kind of bug.

Every mutant subclasses `optimized.moe.TritonFP8MoE` and overrides the smallest hook
(`_gemm`, `_act_quant`, `_reduce`, `_align`, `_carve`, `_run_stage`, `run`, `workspace_shapes`,
or `traits`);
the legacy planner is not a subclass at all but the shipped implementation run with
`planner="legacy"`. Each `Mutant` records what it breaks, the smallest config that shows
it, the oracles that must report it and the buffer or stage a finding must name.

A mutant's factory is also a module-level function, so a config from the table replays with
`PYTHONPATH=tests diffmoe check ... --impl bug_zoo:<factory>`.

`OUTCOME_MUTANTS` holds the mutants whose failure is not a wrong value but an outcome of
the run itself: one crashes (a Triton error), one hangs under the interpreter. They are
caught by the `crash` and `timeout` outcomes, which are not selectable oracles, so they
live apart from `MUTANTS` (whose expected oracles are checks one can select).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

# optimized first: it switches Triton to the interpreter when there is no GPU, which must
# happen before anything imports triton.
from optimized.moe import TritonFP8MoE

import triton  # noqa: E402 - after optimized, which picks the interpreter without a GPU
import triton.language as tl  # noqa: E402

from diffmoe.config import MoEConfig
from diffmoe.contract import RunResult
from diffmoe.report import Finding, Oracles, Report
from diffmoe.vocabulary import FP8_DTYPE, Buffers, Stages, buffer_spec
import optimized.act_quant as act_quant_module  # noqa: E402
from optimized.kernels.act_quant_kernel import PASS_AMAX  # noqa: E402
from optimized.kernels.reduce_kernel import moe_reduce_kernel  # noqa: E402
from optimized.launch import launch

B = Buffers


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
    """The quant kernels use the backend's float32 -> e4m3fn cast instead of rounding onto
    the e4m3 grid first. Right on CUDA; under the Triton interpreter the native cast drops
    the mantissa carry and rounds ties away from zero, so some codes are one step off."""

    def __init__(self, config: MoEConfig, device=None):
        super().__init__(config, device)
        self.traits = dataclasses.replace(self.traits, software_fp8_cast=False)


class FusedNativeFP8Cast(TritonFP8MoE):
    """Only the fused act+quant uses the backend's native e4m3 cast (a fast path written for
    CUDA, where the native cast is right); the unfused quant keeps the software rounding. The
    two paths, which must agree bit for bit, now disagree under the interpreter."""

    def _act_quant(self, stage, row, source, fused, codes_out, scales_out, software_fp8=None):
        super()._act_quant(stage, row, source, fused, codes_out, scales_out,
                           software_fp8=False if fused else software_fp8)


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


def make_amax_pass_cached_across_calls(config: MoEConfig) -> TritonFP8MoE:
    return AmaxPassCachedAcrossCalls(config)


def make_fused_tile_not_power_of_two(config: MoEConfig) -> TritonFP8MoE:
    return FusedTileNotPowerOfTwo(config)


def make_reduce_waits_for_all_programs(config: MoEConfig) -> TritonFP8MoE:
    return ReduceWaitsForAllPrograms(config)


# ---- the registry ------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    name: str
    what_it_breaks: str  # one line, for the README table
    factory: Callable[[MoEConfig], TritonFP8MoE]  # run_differential's `implementation`
    config: MoEConfig  # the smallest config that shows it
    expected_oracles: frozenset[str]  # each must report at least one finding
    expected_name: str  # a buffer, stage or workspace some expected oracle's finding names
    baseline_config: MoEConfig | None = None  # what the unmodified implementation runs (default: config)

    @property
    def impl(self) -> str:
        """The `--impl MODULE:FACTORY` spec that replays this mutant."""
        return "optimized" if self.factory is make_legacy_planner else f"bug_zoo:{self.factory.__name__}"

    @property
    def control_config(self) -> MoEConfig:
        return self.baseline_config or self.config


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
            expected_oracles=frozenset({O.STATIC_ALIASING, O.RUNTIME_ALIASING, O.RACES, O.SCHEDULE, O.DIFFERENTIAL}),
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
            expected_oracles=frozenset({O.DIFFERENTIAL, O.RACES, O.SCHEDULE}),
            expected_name=Stages.GATE_UP_GEMM,
        ),
        Mutant(
            name="gemm-grid-ignores-padding",
            what_it_breaks="grouped GEMM grid sized cdiv(TK, BLOCK_M), not by the padded blocks: the last "
                           "expert's rows are never written and the next stage reads stale workspace bytes",
            factory=make_grid_ignores_padding,
            config=_cfg(),
            expected_oracles=frozenset({O.POISON, O.DIFFERENTIAL}),
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
