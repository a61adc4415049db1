"""Liger-Kernel 0.8.5's bf16 fused MoE (`LigerFusedMoEFunction`) as a diffmoe implementation: `--impl liger`.

What runs is Liger's own all-Triton forward, from the four files `diffmoe peers fetch liger`
cached out of the pinned wheel (diffmoe/adapters/peer_wheels.py), executed by path: ops/fused_moe.py
(LigerFusedMoEFunction.forward, compute_routing_metadata, _token_aggregation),
ops/fused_moe_kernels.py (its jit kernels), ops/utils.py (ensure_contiguous) and utils.py. The
packages `liger_kernel` and `liger_kernel.ops` are empty modules: no Liger `__init__` runs (it
imports the transformers integrations).

One call is the forward of Liger's autograd function, run under torch.no_grad: the routing
metadata (three launches: histogram, prefix sums, scatter; align), the fused gather + gate/up
GEMM + SwiGLU (one launch writing pre_act, the bf16 gate/up product, and post_act, SwiGLU of
the float32 accumulators rounded once: gate_up_gemm, reported as writing gate_up_output and
activation_output), the down GEMM (down_gemm, into Y: the *unweighted* product) and the
weighted gather-sum (reduce: the router weight applied to Y in float32).

Launches are reported with vocabulary names by a proxy around each jit kernel of the loaded
fused_moe module (peers.ReportingKernel; Liger's launchers run unchanged). Liger keeps pre_act,
post_act and Y in expert-sorted order (row r is route s_scatter_idx[r]); for the recorder's
snapshot the adapter permutes those rows in place to route order (token * K + k) and puts
them back, bit for bit, before Liger goes on. s_scatter_idx is reported as sorted_token_ids,
Liger's other routing tables under their own names (`private:x_gather_idx`, ...: Buffers.private).

Workspaces: every buffer Liger uses is a fresh allocation (torch.empty in its forward and its
routing); the declared plan says so: no placement, 0 bytes of ws1 and ws2. The output is
_token_aggregation's own tensor, copied into the caller's (output='separate').

Supported: quant bf16 (Liger's MoE has no FP8 path), fused=False (SwiGLU is fused into the
gate/up GEMM, no quant to fuse), router_weight 'down' (applied in the gather-sum), output
'separate', silu. Refused through `supports` with the field named: everything else. Its three
GEMM-side kernels are `@triton.autotune`d: under the interpreter the first config runs
(diffmoe.interpreter.fixes, autotune_driver), on a GPU the fastest. Program order: under the
interpreter a non-identity schedule permutes each launch's programs at the grid loop
(diffmoe.interpreter.grid_order, triton 3.9 only; `run` applies it, so it sets `orders_programs`). No
`run_stage`: the buffers a stage would be fed live inside Liger's one Python call.

Numerics: the factory declares the reference's `liger` profile (`make.numerics`,
diffmoe.problem.numerics): SwiGLU of the float32 product, the router weight in the reduce.

Owns the adapter (loading Liger's files, the run sequence, launch reporting, the declared
plan). Must not copy Liger source or change its numerics: differences are reported, not fixed.
"""

from __future__ import annotations

import os
import threading
import types
from pathlib import Path

import torch

from diffmoe.adapters import peer_wheels
from diffmoe.problem.config import MoEConfig
from diffmoe.adapters.contract import LaunchInfo, WorkspacePlan
from diffmoe.problem.vocabulary import Buffers, Stages

from . import (
    PeerFiles, ReportingKernel, SelfAllocatingPeer, fresh_allocations_plan, launch_grid, refuse_set_fields, report_launch,
    supports_from,
)

PEER = "liger"
VERSION = peer_wheels.PEERS[PEER].version
B = Buffers
# Liger's files, executed in this order (each imports only the ones before it)
REAL_MODULES = (
    ("liger_kernel.utils", "liger_kernel/utils.py"),
    ("liger_kernel.ops.utils", "liger_kernel/ops/utils.py"),
    ("liger_kernel.ops.fused_moe_kernels", "liger_kernel/ops/fused_moe_kernels.py"),
    ("liger_kernel.ops.fused_moe", "liger_kernel/ops/fused_moe.py"),
)
PACKAGES = ("liger_kernel", "liger_kernel.ops")
# Liger's own switch (fused_moe_kernels.py reads it at import): every kernel keeps one config, so
# what runs does not depend on a timing race (the same bits on every run and machine) and each
# launch's grid is known before it runs (peers.launch_grid). Liger documents it as its escape
# hatch from autotuning; its single configs are BLOCK_N=128, BLOCK_K=64 for the GEMMs.
AUTOTUNE_SWITCH = ("LIGER_FUSED_MOE_AUTOTUNE", "0")
ALIGN_KERNELS = ("_moe_router_histogram_kernel", "_moe_router_prefix_sum_kernel", "_moe_router_scatter_kernel")
FORWARD_KERNELS = (*ALIGN_KERNELS, "_fused_up_proj_swiglu_kernel", "_fused_down_proj_kernel",
                   "_token_gather_weighted_sum_kernel")
# the run in progress on this thread, for the kernel proxies (peers.ReportingKernel)
_ACTIVE: threading.local = threading.local()


class LigerFiles(PeerFiles):
    """Liger's four files loaded once per (cache root, device kind)."""

    peer = PEER

    @staticmethod
    def device_key(device) -> str:
        return device.type

    def __init__(self, root: Path, device: torch.device):
        self.modules: dict[str, types.ModuleType] = {}
        switch, off = AUTOTUNE_SWITCH
        saved = os.environ.get(switch)
        os.environ[switch] = off
        try:
            self.load(root, PACKAGES, REAL_MODULES)
        finally:
            if saved is None:
                os.environ.pop(switch, None)
            else:
                os.environ[switch] = saved
        self.fused_moe = self.modules["liger_kernel.ops.fused_moe"]
        # instrumentation, not a change: fused_moe.py's launchers reach each kernel through a
        # module global (`from ...fused_moe_kernels import _fused_down_proj_kernel`)
        for attr in FORWARD_KERNELS:
            setattr(self.fused_moe, attr, ReportingKernel(attr, getattr(self.fused_moe, attr), _ACTIVE))


class RunReporter:
    """One run's launch reporting: vocabulary names and stages from the kernel launched."""

    def __init__(self, impl: LigerFusedMoE, problem, recorder):
        self.impl, self.problem, self.recorder = impl, problem, recorder
        self.sorted_idx: torch.Tensor | None = None
        self.kernels: list[str] = []

    def launch(self, kernel: str, grid, args: dict, run, jit=None):
        p, cfg = self.problem, self.impl.config
        self.kernels.append(kernel)
        sorted_rows: set[str] = set()  # reported buffers Liger keeps in expert-sorted order
        reads: dict[str, torch.Tensor] = {}
        writes: dict[str, torch.Tensor] = {}
        if kernel in ALIGN_KERNELS:
            # Liger's routing tables, each under its own name (Buffers.private); s_scatter_idx,
            # sorted position -> route, is the vocabulary's sorted_token_ids
            stage, reads = Stages.ALIGN, {B.TOPK_IDS: p.topk_ids}
            if kernel == "_moe_router_histogram_kernel":
                writes = {B.private("tile_expert_counts"): args["partial_sum_ptr"]}
            elif kernel == "_moe_router_prefix_sum_kernel":
                writes = {B.private("tile_expert_counts"): args["partial_sum_ptr"],
                          B.private("expert_start_idx"): args["expert_freq_offs_ptr"],
                          B.private("expert_tile_offset"): args["expert_tile_offset_ptr"]}
            else:
                self.sorted_idx = args["s_scatter_idx_ptr"]
                writes = {B.SORTED_TOKEN_IDS: self.sorted_idx,
                          B.private("s_reverse_scatter_idx"): args["s_reverse_scatter_idx_ptr"],
                          B.private("x_gather_idx"): args["x_gather_idx_ptr"],
                          B.private("tile_row_start"): args["tile_row_start_ptr"],
                          B.private("tile_expert"): args["tile_expert_ptr"]}
        elif kernel == "_fused_up_proj_swiglu_kernel":
            stage = Stages.GATE_UP_GEMM
            reads = {B.HIDDEN_STATES: args["x_ptr"], B.W1: args["gate_up_proj_ptr"], B.SORTED_TOKEN_IDS: self.sorted_idx}
            writes = {B.GATE_UP_OUTPUT: args["pre_act_ptr"], B.ACTIVATION_OUTPUT: args["post_act_ptr"]}
            sorted_rows = set(writes)
        elif kernel == "_fused_down_proj_kernel":
            stage = Stages.DOWN_GEMM
            reads = {B.ACTIVATION_OUTPUT: args["post_act_ptr"], B.W2: args["down_proj_ptr"]}
            writes, sorted_rows = {B.DOWN_OUTPUT: args["Y_ptr"]}, {B.DOWN_OUTPUT}  # before the router weight
        elif kernel == "_token_gather_weighted_sum_kernel":
            stage = Stages.REDUCE
            # Y is in sorted order; s_reverse_scatter_idx maps each route to its row
            reads = {B.DOWN_OUTPUT: args["Y_ptr"], B.TOPK_WEIGHTS: args["w_ptr"]}
            writes = {B.OUTPUT: args["out_ptr"]}
        else:
            raise NotImplementedError(f"Liger launched {kernel}, which the adapter does not map to a diffmoe stage")
        grid = launch_grid(jit, grid, args)
        info = LaunchInfo(stage=stage, kernel=kernel, grid=grid, reads=reads, writes=writes, triton=True)
        return report_launch(self.recorder, info, run, {n: writes[n] for n in sorted_rows}, self.sorted_idx)


def check_supported(config: MoEConfig) -> None:
    """ValueError naming the field for what the adapter does not run."""
    name = "peers.liger_0_8"
    if config.quant != "bf16":
        raise ValueError(f"quant must be 'bf16' for {name}: Liger 0.8.5's fused MoE has no FP8 path, got {config.quant!r}")
    if config.fused:
        raise ValueError(f"fused must be false for {name}: with bf16 there is no quant to fuse (Liger fuses SwiGLU "
                         "into its gate/up GEMM, which the adapter reports)")
    if config.router_weight != "down":
        raise ValueError(f"router_weight must be 'down' for {name}: Liger applies the router weight in its gather-sum, "
                         f"after the down GEMM, got {config.router_weight!r}")
    if config.output != "separate":
        raise ValueError(f"output must be 'separate' for {name}: Liger's gather-sum returns a fresh tensor, never a "
                         f"workspace, got {config.output!r}")
    if config.expert_map is not None:
        raise ValueError(f"expert_map must be None for {name}: Liger's fused MoE routes over every expert (no "
                         "expert-parallel map)")
    if config.activation != "silu":
        raise ValueError(f"activation must be 'silu' for {name}, got {config.activation!r}")
    refuse_set_fields(config, name, {
        "routed_scaling_factor": "Liger 0.8.5's LigerFusedMoEFunction takes no routed scaling factor",
        "swiglu_limit": "Liger 0.8.5's SwiGLU (in _fused_up_proj_swiglu_kernel) has no clamp",
        "dropped_slots": "Liger's routing histogram counts every topk id as an expert (a -1 id is not skipped)",
    })


def plan_workspaces(config: MoEConfig, num_tokens: int) -> WorkspacePlan:
    """Liger's layout: nothing carved, every buffer a fresh allocation."""
    check_supported(config)
    return fresh_allocations_plan(config, f"liger-{VERSION}")


class LigerFusedMoE(SelfAllocatingPeer):
    """Liger-Kernel 0.8.5's LigerFusedMoEFunction forward behind diffmoe's plug-in contract (diffmoe.adapters.contract)."""

    name = f"liger-{VERSION}"
    files_class = LigerFiles
    reporter_class = RunReporter
    active = _ACTIVE
    check_supported = staticmethod(check_supported)

    def call(self, problem) -> torch.Tensor:
        return self.files.fused_moe.LigerFusedMoEFunction.apply(*self.apply_args(problem))

    @staticmethod
    def apply_args(problem) -> tuple:
        """LigerFusedMoEFunction.apply's arguments as Liger's own module passes them (LigerExperts.forward in
        transformers/swiglu.py: x, gate_up_proj, down_proj, the top-k ids as int32, the top-k weights;
        peers/call_sites.py reads it)."""
        return problem.hidden_states, problem.w1, problem.w2, problem.topk_ids.to(torch.int32), problem.topk_weights

    def check_launches(self, reporter) -> None:
        if reporter.kernels[3:] != list(FORWARD_KERNELS[3:]):
            raise RuntimeError(f"Liger's forward launched {reporter.kernels}; the adapter expects the routing, then "
                               f"{list(FORWARD_KERNELS[3:])}")


def make(config: MoEConfig, device=None) -> LigerFusedMoE:
    """The factory: `--impl peers.liger_0_8:make` (alias `--impl liger`)."""
    return LigerFusedMoE(config, device)


make.plan_workspaces = plan_workspaces
make.numerics = "liger"  # diffmoe.adapters.contract.NUMERICS: judged against Liger's rounding points (diffmoe.problem.numerics)
make.peer_wheel = PEER  # diffmoe.adapters.contract.PEER_WHEEL: the CLI checks the cache before a run
make.supports = supports_from(check_supported)  # diffmoe.adapters.contract.SUPPORTS: the fuzzers draw around what it refuses
