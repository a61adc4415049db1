"""The adapter every Liger-Kernel release shares: its bf16 fused MoE (`LigerFusedMoEFunction`) as a
diffmoe implementation. `--impl liger` (= `liger==0.8.5`), `liger==0.8.0` and `liger==0.8.1`
(the rows of peers/liger/releases.py) run through it: only each release's own files differ.

What runs is Liger's own all-Triton forward, from the four files `diffmoe peers fetch liger==V`
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
fused_moe module (peers.common.ReportingKernel; Liger's launchers run unchanged). Liger keeps pre_act,
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
GEMM-side kernels are `@triton.autotune`d; 0.8.1 and later pin each to one config under their own
switch (LIGER_FUSED_MOE_AUTOTUNE=0, set while the files load), and 0.8.0, which has no switch, is
given the same single configs (`PINNED_CONFIGS`), so the releases differ in their code only.
Program order: under the interpreter a non-identity schedule permutes each launch's programs at the grid loop
(diffmoe.interpreter.grid_order, triton 3.9 only; `run` applies it, so it sets `orders_programs`). No
`run_stage`: the buffers a stage would be fed live inside Liger's one Python call.

Numerics: the factory declares the reference's `liger` profile (`make.numerics`,
diffmoe.problem.numerics): SwiGLU of the float32 product, the router weight in the reduce.

`make_wide` (the museum's Liger exhibit, Liger-Kernel#1296): the same call with the problem's E experts
stored from expert index wide_base(config) of a weight stack of wide_base + E experts, built on a
bare storage and filled only there (Linux commits the untouched pages of such an allocation lazily,
so the multi-GiB stack costs the filled experts' bytes), and topk_ids shifted by wide_base: the same
products, reached through an expert index times the weight stride past 2^31 elements. On a
release that multiplies in int32 (0.8.0) the wrapped loads address memory before the stack: run it
only inside a check, where the bounds guard (diffmoe/interpreter/bounds_guard.py, on for every call
under the interpreter) refuses them; called bare, it reads whatever lies there.

Owns the adapter (loading Liger's files, the run sequence, launch reporting, the declared
plan). Must not copy Liger source or change its numerics: differences are reported, not fixed.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from pathlib import Path

import torch

from diffmoe.adapters import peer_wheels
from diffmoe.problem.config import MoEConfig
from diffmoe.contract import LaunchInfo, WorkspacePlan
from diffmoe.problem.vocabulary import Buffers, Stages

from diffmoe.adapters.kit import Rule, Supports

from ..common import PeerFiles, ReportingKernel, SelfAllocatingPeer, fresh_allocations_plan, launch_grid, report_launch

B = Buffers
# Liger's files, executed in this order (each imports only the ones before it)
REAL_MODULES = (
    ("liger_kernel.utils", "liger_kernel/utils.py"),
    ("liger_kernel.ops.utils", "liger_kernel/ops/utils.py"),
    ("liger_kernel.ops.fused_moe_kernels", "liger_kernel/ops/fused_moe_kernels.py"),
    ("liger_kernel.ops.fused_moe", "liger_kernel/ops/fused_moe.py"),
)
# Liger's own switch (fused_moe_kernels.py reads it at import, from 0.8.1): every kernel keeps one
# config, so what runs does not depend on a timing race (the same bits on every run and machine)
# and each launch's grid is known before it runs (peers.common.launch_grid). Liger documents it as its
# escape hatch from autotuning; its single configs are BLOCK_N=128, BLOCK_K=64 for the GEMMs.
AUTOTUNE_SWITCH = ("LIGER_FUSED_MOE_AUTOTUNE", "0")
# The forward's single configs under that switch, as 0.8.1's `_get_gemm_autotune_configs` and
# `_get_token_gather_autotune_configs` return them (each one of 0.8.0's own autotune candidates):
# 0.8.0 has no switch, so the adapter pins its autotuned forward kernels to these.
PINNED_CONFIGS = {
    "_fused_up_proj_swiglu_kernel": (dict(BLOCK_N=128, BLOCK_K=64), dict(num_warps=8, num_stages=2)),
    "_fused_down_proj_kernel": (dict(BLOCK_N=128, BLOCK_K=64), dict(num_warps=8, num_stages=2)),
    "_token_gather_weighted_sum_kernel": (dict(BLOCK_H=128, BLOCK_K=4), dict(num_warps=4, num_stages=4)),
}
# make_wide: the expert index past which an expert's offset in the gate/up stack, expert * 2 * I * H
# elements, leaves int32 (Liger-Kernel#1296).
INT32_LIMIT = 1 << 31


def wide_base(config: MoEConfig) -> int:
    """The first expert index whose gate/up weight offset (index * 2 * I * H elements) is past int32:
    make_wide stores the problem's experts from there."""
    return -(-INT32_LIMIT // (2 * config.inter * config.hidden))
ALIGN_KERNELS = ("_moe_router_histogram_kernel", "_moe_router_prefix_sum_kernel", "_moe_router_scatter_kernel")
FORWARD_KERNELS = (*ALIGN_KERNELS, "_fused_up_proj_swiglu_kernel", "_fused_down_proj_kernel",
                   "_token_gather_weighted_sum_kernel")
# the run in progress on this thread, for the kernel proxies (peers.common.ReportingKernel)
_ACTIVE: threading.local = threading.local()


class LigerFiles(PeerFiles):
    """Liger's four files loaded once per (cache root, device kind); `of_release(peer)` is one
    release's (its `peer`, a diffmoe.adapters.peer_wheels name)."""

    peer = "liger"

    @classmethod
    def of_release(cls, peer: str) -> type:
        return type(f"LigerFiles_{peer_wheels.peer(peer).version.replace('.', '_')}", (cls,), {"peer": peer})

    @staticmethod
    def device_key(device) -> str:
        return device.type

    def __init__(self, root: Path, device: torch.device):
        switch, off = AUTOTUNE_SWITCH
        saved = os.environ.get(switch)
        os.environ[switch] = off
        try:
            self.load(root, REAL_MODULES)
        finally:
            if saved is None:
                os.environ.pop(switch, None)
            else:
                os.environ[switch] = saved
        self.fused_moe = self.modules["liger_kernel.ops.fused_moe"]
        kernels = self.modules["liger_kernel.ops.fused_moe_kernels"]
        if not hasattr(kernels, "_AUTOTUNE_DISABLED"):  # a release without the switch (0.8.0): its configs pinned
            for attr, (meta, launch) in PINNED_CONFIGS.items():
                tuner = getattr(kernels, attr)
                chosen = [c for c in tuner.configs if c.kwargs == meta and c.num_warps == launch["num_warps"]
                          and c.num_stages == launch["num_stages"]]
                if len(chosen) != 1:
                    raise RuntimeError(f"Liger's {attr} has no autotune config {meta} {launch} to pin")
                tuner.configs = chosen
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
            # make_wide: the stack holds the problem's weights (reported as those it was filled from)
            w1 = p.w1 if self.impl.wide else args["gate_up_proj_ptr"]
            reads = {B.HIDDEN_STATES: args["x_ptr"], B.W1: w1, B.SORTED_TOKEN_IDS: self.sorted_idx}
            writes = {B.GATE_UP_OUTPUT: args["pre_act_ptr"], B.ACTIVATION_OUTPUT: args["post_act_ptr"]}
            sorted_rows = set(writes)
        elif kernel == "_fused_down_proj_kernel":
            stage = Stages.DOWN_GEMM
            reads = {B.ACTIVATION_OUTPUT: args["post_act_ptr"], B.W2: p.w2 if self.impl.wide else args["down_proj_ptr"]}
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


def release_supports(name: str, version: str) -> Supports:
    """What the adapter runs of release `version` (`name` is what its refusals call it): the
    factory's `supports`, and its check (diffmoe.adapters.kit.Supports)."""
    return Supports(
        name,
        Rule("quant", ("bf16",), f"Liger {version}'s fused MoE has no FP8 path"),
        Rule("fused", (False,), "with bf16 there is no quant to fuse (Liger fuses SwiGLU into its gate/up GEMM, "
                                "which the adapter reports)"),
        Rule("router_weight", ("down",), "Liger applies the router weight in its gather-sum, after the down GEMM"),
        Rule("output", ("separate",), "Liger's gather-sum returns a fresh tensor, never a workspace"),
        Rule("expert_map", why="Liger's fused MoE routes over every expert (no expert-parallel map)"),
        Rule("activation", ("silu",), "Liger's fused MoE is SwiGLU's"),
        Rule("routed_scaling_factor", why=f"Liger {version}'s LigerFusedMoEFunction takes no routed scaling factor"),
        Rule("swiglu_limit", why=f"Liger {version}'s SwiGLU (in _fused_up_proj_swiglu_kernel) has no clamp"),
        Rule("dropped_slots", why="Liger's routing histogram counts every topk id as an expert (a -1 id is not skipped)"),
    )


class LigerFusedMoE(SelfAllocatingPeer):
    """A Liger-Kernel release's LigerFusedMoEFunction forward behind diffmoe's plug-in contract
    (diffmoe.contract); `release_factories` makes each release's subclass."""

    name: str
    files_class: type
    reporter_class = RunReporter
    active = _ACTIVE
    wide = False  # make_wide: the experts stored past int32 offsets of a lazily committed stack

    def call(self, problem) -> torch.Tensor:
        x, w1, w2, ids, weights = self.apply_args(problem)
        if self.wide:
            base = wide_base(self.config)
            w1, w2 = self.stacked(w1, base), self.stacked(w2, base)
            ids = ids + base
        return self.files.fused_moe.LigerFusedMoEFunction.apply(x, w1, w2, ids, weights)

    @staticmethod
    def apply_args(problem) -> tuple:
        """LigerFusedMoEFunction.apply's arguments as Liger's own module passes them (LigerExperts.forward in
        transformers/swiglu.py: x, gate_up_proj, down_proj, the top-k ids as int32, the top-k weights;
        peers/call_sites.py reads it)."""
        return problem.hidden_states, problem.w1, problem.w2, problem.topk_ids.to(torch.int32), problem.topk_weights

    @staticmethod
    def stacked(weights: torch.Tensor, base: int) -> torch.Tensor:
        """`weights` as experts base.. of a stack of base + E experts, the other experts never written.
        The stack stands for a large model's weights, an input: it is built on a bare storage, which
        torch does not fill, rather than by torch.empty, which a check poisons (every private
        allocation of a call: diffmoe/check/call_environment.py) and so would commit the whole
        multi-GiB stack (measured: 12.7 GB peak, 104 s for one check). Its untouched pages stay
        uncommitted; only the filled experts cost memory."""
        shape = (base + weights.shape[0], *weights.shape[1:])
        storage = torch.UntypedStorage(math.prod(shape) * weights.element_size(), device=weights.device)
        stack = torch.empty(0, dtype=weights.dtype, device=weights.device).set_(storage, 0, shape)
        stack[base:] = weights
        return stack

    def check_launches(self, reporter) -> None:
        if reporter.kernels[3:] != list(FORWARD_KERNELS[3:]):
            raise RuntimeError(f"Liger's forward launched {reporter.kernels}; the adapter expects the routing, then "
                               f"{list(FORWARD_KERNELS[3:])}")


@functools.lru_cache(maxsize=None)
def release_factories(release) -> tuple:
    """(make, make_wide) for `release` (a row of peers/liger/releases.py); peers/liger exports them
    as make_V and make_wide_V."""
    peer, version = release.peer, release.version
    supports = release_supports(release.impl, version)
    check_supported = supports.check
    files = LigerFiles.of_release(peer)

    def plan_workspaces(config: MoEConfig, num_tokens: int) -> WorkspacePlan:
        """Liger's layout: nothing carved, every buffer a fresh allocation."""
        check_supported(config)
        return fresh_allocations_plan(config, f"liger-{version}")

    attrs = dict(name=f"liger-{version}", files_class=files, check_supported=staticmethod(check_supported))
    plain = type(f"LigerFusedMoE_{version.replace('.', '_')}", (LigerFusedMoE,), attrs)
    wide = type(f"LigerWideFusedMoE_{version.replace('.', '_')}", (plain,), dict(wide=True))

    def make(config: MoEConfig, device=None) -> LigerFusedMoE:
        return plain(config, device)

    def make_wide(config: MoEConfig, device=None) -> LigerFusedMoE:
        return wide(config, device)

    make.__doc__ = f"The factory: `--impl {release.impl}`."
    make_wide.__doc__ = (f"`--impl peers.liger:make_wide_{version.replace('.', '_')}`: the same call with the experts "
                         "stored from expert wide_base(config) of a lazily committed stack (peers/liger/core.py)")
    for factory in (make, make_wide):
        factory.plan_workspaces = plan_workspaces
        factory.numerics = "liger"  # diffmoe.contract.NUMERICS: Liger's rounding points (diffmoe.problem.numerics)
        factory.peer_wheel = peer  # diffmoe.contract.PEER_WHEEL: the CLI checks the cache before a run
        factory.supports = supports  # diffmoe.contract.SUPPORTS
    return make, make_wide
