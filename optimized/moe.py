"""The optimized MoE: Triton FP8 fused MoE inside two shared workspaces.

Built once for a config whose num_tokens is the largest batch, it runs any T up to that
inside two caller-provided uint8 workspaces. Every intermediate is a view carved from ws1 or
ws2 by the workspace planner (fixed or legacy); the small private buffers (aligned layout,
scales, per-tensor amax partials) are allocated once here, so a call allocates nothing but
the final output when the caller asks for a fresh one.

Stages, in order (diffmoe.problem.vocabulary): quant_input -> gate_up_gemm -> activation ->
quant_down_input (or act_quant when fused) -> down_gemm -> reduce.

Inputs outside the generated ranges follow the reference (reference/moe.py, the spec):
  * NaN/Inf in hidden_states propagate exactly as there: the row kernel's amax and scale
    floor keep a NaN (Triton's max and maximum drop NaN operands by default), its clamp
    keeps NaN, and a NaN value is stored as the e4m3fn NaN code on every backend; the
    grouped GEMM decodes FP8 operands itself under the interpreter, whose own conversion
    reads the NaN code as +-480. Finite inputs are unaffected bit for bit.
  * A zero-token call (problem.num_tokens == 0) launches nothing and returns the [0, H]
    output (the caller's tensor, a fresh one, or the empty ws1 view).
  * Blocks of experts the expert map sends elsewhere store zeros, so a call whose every
    token is routed away returns exact zeros; dropped slots (topk_ids -1) are aligned into
    blocks of the same kind (optimized.align), so they are exact zeros too.
  * `swiglu_limit` is a constexpr switch of the row kernel's activation; shared experts fused
    into the routed set are ordinary experts.

Owns the implementation class and its factory. Must not hold jit code or judge its own results.
"""

from __future__ import annotations

import torch

from diffmoe.problem.config import MoEConfig
from diffmoe.contract import RunResult, Schedule, WorkspacePlan
from diffmoe.problem.inputs import Problem
from diffmoe.problem.vocabulary import (
    SCALES_OF,
    Buffers,
    Stages,
    activation_scale_shape,
    buffer_spec,
    materialised_buffers,
    pipeline_stages,
)

from .act_quant import row_programs, run_row_stage
from .align import align_routed_rows, max_blocks, max_padded_rows
from .backend import COMPILE_VARIANTS, backend_traits, default_device, normalize_device
from .grouped_gemm import AlignedLayout, run_grouped_gemm
from .launch import LaunchContext
from .reduce import run_reduce
from .tiles import choose_tiles
from .workspace_planner import plan_workspaces

B = Buffers
# Fields a problem may differ in from the config the implementation was built for.
PER_CALL_FIELDS = ("num_tokens", "seed", "skew")


class TritonFP8MoE:
    """One implementation of the diffmoe plug-in contract (diffmoe.contract.MoEImplementation)."""

    name = "optimized"
    # `diffmoe compile-check` compiles both trait sets (optimized.backend.COMPILE_VARIANTS)
    compile_variants = tuple(COMPILE_VARIANTS)
    # optimized.launch passes the schedule's order table (kernels/program_order.py), which works
    # compiled too: the harness must not also reorder at the interpreter's grid loop (diffmoe.interpreter.grid_order)
    orders_programs = True

    def __init__(self, config: MoEConfig, device: torch.device | str | None = None):
        config.validate()
        self.config = config
        self.device = normalize_device(torch.device(device) if device is not None else default_device())
        self.traits = backend_traits(self.device)
        self.max_tokens = config.num_tokens
        max_tk = config.routed_rows
        self.tiles = choose_tiles(self.traits.name, max_tk, config.quant, max(config.hidden, config.inter))
        bm, dev = self.tiles.block_m, self.device
        self._sorted_token_ids = torch.empty(max_padded_rows(max_tk, config.num_experts, bm), dtype=torch.int32, device=dev)
        self._expert_ids = torch.empty(max_blocks(max_tk, config.num_experts, bm), dtype=torch.int32, device=dev)
        self._num_tokens_post_padded = torch.empty(1, dtype=torch.int32, device=dev)
        self._scales: dict[str, torch.Tensor] = {}
        if config.is_fp8:
            for name in SCALES_OF.values():
                self._scales[name] = torch.empty(buffer_spec(config, name).shape, dtype=torch.float32, device=dev)
        self._amax_partials = torch.empty(row_programs(max_tk, self.tiles), dtype=torch.float32, device=dev)

    # ---- the declared plan -----------------------------------------------------------
    def workspace_plan(self, num_tokens: int) -> WorkspacePlan:
        return plan_workspaces(self.config, num_tokens)

    def workspace_shapes(self, max_tokens: int | None = None) -> tuple[int, int]:
        return self.workspace_plan(max_tokens or self.max_tokens).workspace_bytes

    def allocate_workspaces(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh ws1, ws2 (uint8) for the largest batch; callers that test memory use their own."""
        n1, n2 = self.workspace_shapes()
        return (torch.empty(n1, dtype=torch.uint8, device=self.device), torch.empty(n2, dtype=torch.uint8, device=self.device))

    # ---- running ---------------------------------------------------------------------
    def run(
        self,
        problem: Problem,
        workspaces: tuple[torch.Tensor, torch.Tensor],
        *,
        output: torch.Tensor | None = None,
        schedule: Schedule = Schedule(),
        recorder=None,
    ) -> RunResult:
        self._check_problem(problem)
        t = problem.num_tokens
        plan = self.workspace_plan(t)
        bufs = self._carve(plan, workspaces, t)
        if self.config.output == "workspace" and output is not None:
            raise ValueError("output must be None when the config's output placement is 'workspace': "
                             "the result is carved from ws1 and returned")
        if self.config.output == "separate":
            out = output if output is not None else torch.empty(t, self.config.hidden, dtype=torch.bfloat16, device=self.device)
            self._check_output(out, t)
            bufs[B.OUTPUT] = out
        if t == 0:
            return RunResult(output=bufs[B.OUTPUT])  # nothing to compute: no launch, no align
        ctx = LaunchContext(self.device, schedule, recorder)
        layout = self._align(problem)
        for stage in plan.stages:
            self._run_stage(stage.name, bufs, problem, layout, ctx)
        return RunResult(output=bufs[B.OUTPUT])

    def run_stage(
        self, stage: str, inputs: dict[str, torch.Tensor], problem: Problem, *, schedule: Schedule = Schedule(), recorder=None
    ) -> dict[str, torch.Tensor]:
        """Run one stage on given inputs into fresh tensors (teacher forcing); returns its writes."""
        self._check_problem(problem)
        spec = next((s for s in pipeline_stages(self.config) if s.name == stage), None)
        if spec is None:
            raise ValueError(f"stage must be one of {[s.name for s in pipeline_stages(self.config)]}, got {stage!r}")
        t = problem.num_tokens
        outputs = {}
        for name in spec.writes:
            s = buffer_spec(self.config, name, t)
            # 0xFF bytes are NaN in bf16, fp32 and e4m3fn: an element the stage forgets to write
            # shows as NaN, not as whatever the allocator left there
            outputs[name] = torch.full((s.nbytes,), 0xFF, dtype=torch.uint8, device=self.device).view(s.dtype).view(s.shape)
        if t == 0:
            return outputs  # as run(): a zero-token call launches nothing
        bufs = {**inputs, **outputs}
        self._run_stage(stage, bufs, problem, self._align(problem), LaunchContext(self.device, schedule, recorder))
        return outputs

    # ---- stages ----------------------------------------------------------------------
    def _run_stage(self, stage: str, bufs: dict[str, torch.Tensor], problem: Problem, layout: AlignedLayout, ctx: LaunchContext) -> None:
        cfg = self.config
        q = cfg.quant
        weights = (B.TOPK_WEIGHTS, problem.topk_weights.view(-1))  # [TK] fp32
        row = dict(ctx=ctx, tiles=self.tiles, traits=self.traits)

        def named(*names):
            return tuple((n, bufs[n]) for n in names)

        if stage == Stages.QUANT_INPUT:
            run_row_stage(
                **row, stage=stage, x=(B.HIDDEN_STATES, problem.hidden_states), apply_activation=False, quant=q,
                codes_out=(B.QUANTED_GATE_UP_INPUT, bufs[B.QUANTED_GATE_UP_INPUT]),
                scales_out=(B.QUANTED_GATE_UP_INPUT_SCALES, bufs[B.QUANTED_GATE_UP_INPUT_SCALES]),
                row_weight=weights if cfg.router_weight == "input" else None,
                amax_partials=self._amax_partials,
            )
        elif stage == Stages.GATE_UP_GEMM:
            if cfg.is_fp8:
                a, a_scale = named(B.QUANTED_GATE_UP_INPUT, B.QUANTED_GATE_UP_INPUT_SCALES)
            else:
                a, a_scale = (B.HIDDEN_STATES, problem.hidden_states), None
            self._gemm(stage, ctx, problem, layout, a, a_scale, (B.W1, problem.w1), (B.W1_SCALE, problem.w1_scale),
                       (B.GATE_UP_OUTPUT, bufs[B.GATE_UP_OUTPUT]), weights, a_row_div=cfg.topk, mul_router_weight=False,
                       router_weight_on_a=cfg.router_weight == "input" and not cfg.is_fp8)
        elif stage == Stages.ACTIVATION:
            run_row_stage(**row, stage=stage, x=(B.GATE_UP_OUTPUT, bufs[B.GATE_UP_OUTPUT]), apply_activation=True,
                          quant=None, act_out=(B.ACTIVATION_OUTPUT, bufs[B.ACTIVATION_OUTPUT]), swiglu_limit=cfg.swiglu_limit)
        elif stage in (Stages.QUANT_DOWN_INPUT, Stages.ACT_QUANT):
            fused = stage == Stages.ACT_QUANT
            source = B.GATE_UP_OUTPUT if fused else B.ACTIVATION_OUTPUT
            self._act_quant(stage, row, (source, bufs[source]), fused,
                            (B.QUANTED_DOWN_INPUT, bufs[B.QUANTED_DOWN_INPUT]),
                            (B.QUANTED_DOWN_INPUT_SCALES, bufs[B.QUANTED_DOWN_INPUT_SCALES]))
        elif stage == Stages.DOWN_GEMM:
            if cfg.is_fp8:
                a, a_scale = named(B.QUANTED_DOWN_INPUT, B.QUANTED_DOWN_INPUT_SCALES)
            else:
                a, a_scale = (B.ACTIVATION_OUTPUT, bufs[B.ACTIVATION_OUTPUT]), None
            self._gemm(stage, ctx, problem, layout, a, a_scale, (B.W2, problem.w2), (B.W2_SCALE, problem.w2_scale),
                       (B.DOWN_OUTPUT, bufs[B.DOWN_OUTPUT]), weights, a_row_div=1,
                       mul_router_weight=cfg.router_weight == "down")
        elif stage == Stages.REDUCE:
            self._reduce(stage, ctx, (B.DOWN_OUTPUT, bufs[B.DOWN_OUTPUT]), (B.OUTPUT, bufs[B.OUTPUT]))
        else:
            raise ValueError(f"unknown stage {stage!r}")

    # The three hooks below are where deliberately broken variants (tests/bug_zoo) differ.
    def _gemm(self, stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights, *, a_row_div, mul_router_weight,
              router_weight_on_a=False):
        run_grouped_gemm(
            ctx, self.tiles, self.traits, stage=stage, quant=self.config.quant, a=a, a_scale=a_scale, w=w,
            w_scale=w_scale if self.config.is_fp8 else None, out=out, layout=layout, topk_weights=weights,
            a_row_div=a_row_div, mul_router_weight=mul_router_weight, router_weight_on_a=router_weight_on_a,
            weight_quant=self.config.weight_scheme,
        )

    def _act_quant(self, stage, row, source, fused, codes_out, scales_out, software_fp8=None):
        run_row_stage(**row, stage=stage, x=source, apply_activation=fused, quant=self.config.quant,
                      codes_out=codes_out, scales_out=scales_out, amax_partials=self._amax_partials,
                      software_fp8=software_fp8, swiglu_limit=self.config.swiglu_limit if fused else None)

    def _reduce(self, stage, ctx, down, out):
        run_reduce(ctx, self.tiles, self.traits, stage=stage, down=down, out=out, topk=self.config.topk,
                   routed_scaling_factor=self.config.routed_scaling_factor)

    def _align(self, problem: Problem) -> AlignedLayout:
        blocks = align_routed_rows(
            problem.topk_ids, problem.expert_map, self.config.num_experts, self.tiles.block_m,
            self._sorted_token_ids, self._expert_ids, self._num_tokens_post_padded,
        )
        return AlignedLayout(self._sorted_token_ids, self._expert_ids, self._num_tokens_post_padded, blocks, self.tiles.block_m)

    # ---- views and checks ------------------------------------------------------------
    def _carve(self, plan: WorkspacePlan, workspaces, num_tokens: int) -> dict[str, torch.Tensor]:
        """Every materialised buffer of this call: workspace views, or the private scale buffers."""
        if not isinstance(workspaces, (tuple, list)) or len(workspaces) != 2:
            raise TypeError("workspaces must be a pair (ws1, ws2) of uint8 tensors")
        for idx, ws in enumerate(workspaces):
            need = plan.workspace_bytes[idx]
            if not isinstance(ws, torch.Tensor) or ws.dtype != torch.uint8 or ws.dim() != 1 or not ws.is_contiguous():
                raise TypeError(f"ws{idx + 1} must be a contiguous 1-D uint8 tensor")
            if ws.numel() < need:
                raise ValueError(f"ws{idx + 1} holds {ws.numel()} bytes, the plan for T={num_tokens} needs {need}")
            if ws.device != self.device:
                raise ValueError(f"ws{idx + 1} is on {ws.device}, the implementation runs on {self.device}")
        bufs: dict[str, torch.Tensor] = {}
        wanted = set(materialised_buffers(self.config))
        for p in plan.placements:
            if p.buffer not in wanted:
                continue  # e.g. the legacy plan's slot for the never-written activation_output
            spec = buffer_spec(self.config, p.buffer, num_tokens)
            bufs[p.buffer] = workspaces[p.workspace][p.offset : p.offset + spec.nbytes].view(spec.dtype).view(spec.shape)
        for name, full in self._scales.items():
            shape = activation_scale_shape(
                self.config,
                num_tokens * (self.config.topk if name == B.QUANTED_DOWN_INPUT_SCALES else 1),
                self.config.inter if name == B.QUANTED_DOWN_INPUT_SCALES else self.config.hidden,
            )
            bufs[name] = full[: shape[0]] if len(shape) == 2 else full
        return bufs

    def _check_problem(self, problem: Problem) -> None:
        base = {f: v for f, v in problem.config.to_dict().items() if f not in PER_CALL_FIELDS}
        mine = {f: v for f, v in self.config.to_dict().items() if f not in PER_CALL_FIELDS}
        if base != mine:
            diff = sorted(f for f in base if base[f] != mine[f])
            raise ValueError(f"problem config differs from the implementation's in {diff}")
        if problem.num_tokens > self.max_tokens:
            raise ValueError(f"num_tokens must be in [1, {self.max_tokens}] for these workspaces (or 0, an empty call), "
                             f"got {problem.num_tokens}")
        if problem.device != self.device:
            raise ValueError(f"problem is on {problem.device}, the implementation runs on {self.device}")

    def _check_output(self, out: torch.Tensor, t: int) -> None:
        if out.shape != (t, self.config.hidden) or out.dtype != torch.bfloat16 or out.device != self.device:
            raise ValueError(f"output must be a [{t}, {self.config.hidden}] bf16 tensor on {self.device}, got "
                             f"{tuple(out.shape)} {out.dtype} on {out.device}")


def make_implementation(config: MoEConfig, device: torch.device | str | None = None) -> TritonFP8MoE:
    """The factory diffmoe loads by default (`--impl optimized:make_implementation`)."""
    return TritonFP8MoE(config, device)


def _conformance_hooks():
    """What we tell `diffmoe doctor` (imported on use: it imports the harness's probe kernels)."""
    from .conformance_hooks import conformance_hooks

    return conformance_hooks()


# The contract's optional cheap factory attributes (diffmoe/contract.py): the plan without
# building the implementation (which probes the backend), and the doctor's hooks.
make_implementation.plan_workspaces = plan_workspaces
make_implementation.conformance_hooks = _conformance_hooks
