"""lmdeploy 0.18.0's blocked-FP8 fused MoE (`fused_moe_blocked_fp8`) as a diffmoe implementation: `--impl lmdeploy`.

What runs is lmdeploy's own all-Triton pipeline, from the five files `diffmoe peers fetch
lmdeploy` cached out of the pinned wheel (diffmoe/adapters/peer_wheels.py), executed by path:
kernels/cuda/moe/blocked_fp8.py (fused_moe_blocked_fp8 and its GEMM kernel), moe/fused_moe.py
(the route sort kernels, moe_reduce), activation.py (silu_and_mul), blocked_gemm_fp8.py
(quant_fp8, the 1x128-group activation quant) and utils.py. Their imports beyond those files are
empty package modules and `lmdeploy.utils.get_logger` (the standard logger); no lmdeploy
package `__init__` runs. Without a GPU, `get_device_props` (which asks CUDA) answers with
lmdeploy's own table entry for sm_90 and an H100/H200's 132 SMs: it sizes the persistent
row loops' grids only, never a value computed.

One call, as lmdeploy's fused-MoE layer makes it: quant_fp8(hidden_states, 128) (quant_input),
then fused_moe_blocked_fp8: the route sort (three launches: align), the gate/up GEMM into
intermediate_cache1 (gate_up_gemm), silu_and_mul (activation), quant_fp8 of its output
(quant_down_input), the down GEMM into intermediate_cache2 (down_gemm), moe_reduce (reduce:
the router weight is applied here, rounded to bf16, products and sum in bf16).

Launches are reported with vocabulary names, lmdeploy's own buffers as the views, by a proxy
around each jit kernel of the loaded modules (instrumentation: lmdeploy's launchers run
unchanged). lmdeploy keeps cache1, the silu output and the down input's codes and scales in
*sorted-route* order (rows by expert, as its sort left them); the vocabulary's rows are in
route order (token * K + k). For the recorder's snapshot of those four the adapter permutes the
rows in place to route order and puts them back, bit for bit, before lmdeploy goes on. Its
down output (cache2, route order) is the product *before* the router weight, which lmdeploy
applies in moe_reduce: reported as `down_output`, it differs from the vocabulary's (weighted
for router_weight='down') by that placement, and the differential oracle says so at
down_gemm (docs/peers.md, "Testing lmdeploy's kernel").

Workspaces: every buffer lmdeploy uses is a fresh allocation (torch.empty in
_make_intermediate, quant_fp8, silu_and_mul, moe_reduce); the declared plan says so: no
placement, 0 bytes of ws1 and ws2. The output is moe_reduce's own tensor, copied into the
caller's (output='separate').

Supported: quant fp8-block, fused=False (lmdeploy's silu and quant are separate kernels),
router_weight 'down' (applied in its reduce), output 'separate', silu. Refused through
`supports` with the field named: everything else. Program order: under the interpreter a
non-identity schedule permutes each launch's programs at the interpreter's grid loop
(diffmoe.interpreter.grid_order, triton 3.9 only; `run` applies it, so it sets `orders_programs`); on a GPU
the hardware order runs. No `run_stage`: the buffers a stage would be fed live inside
lmdeploy's one Python call.

Numerics: the factory declares the reference's `lmdeploy` profile (`make.numerics`,
diffmoe.problem.numerics): lmdeploy's rounding points, so a check judges it against what
its kernels compute; `numerics="diffmoe"` judges it against diffmoe's.

Owns the adapter (loading lmdeploy's files, the run sequence, launch reporting, the declared
plan). Must not copy lmdeploy source or change its numerics: differences are reported, not fixed.
"""

from __future__ import annotations

import logging
import threading
import types
from pathlib import Path

import torch

from diffmoe.adapters import peer_wheels
from diffmoe.problem.config import QUANT_BLOCK, MoEConfig
from diffmoe.contract import LaunchInfo, WorkspacePlan
from diffmoe.problem.vocabulary import Buffers, Stages

from .releases import DEFAULT, RELEASES
from diffmoe.adapters.kit import Rule, Supports

from ..common import PeerFiles, ReportingKernel, SelfAllocatingPeer, fresh_allocations_plan, launch_grid, report_launch

PEER = "lmdeploy"  # the default release's peer-cache name (peers/lmdeploy/releases.py)
VERSION = RELEASES[DEFAULT].version
B = Buffers
_K = "lmdeploy.pytorch.kernels.cuda"
_R = "lmdeploy/pytorch/kernels/cuda"
# lmdeploy's files, executed in this order (each imports only the ones before it)
REAL_MODULES = (
    (f"{_K}.utils", f"{_R}/utils.py"),
    (f"{_K}.activation", f"{_R}/activation.py"),
    (f"{_K}.blocked_gemm_fp8", f"{_R}/blocked_gemm_fp8.py"),
    (f"{_K}.moe.fused_moe", f"{_R}/moe/fused_moe.py"),
    (f"{_K}.moe.blocked_fp8", f"{_R}/moe/blocked_fp8.py"),
)
# utils.py's WARPS_PER_SM / BLOCKS_PER_SM entries for (9, 0), and the 132 SMs of an H100/H200
INTERPRETER_DEVICE_PROPS = dict(multi_processor_count=132, compute_capability=(9, 0), warps_per_sm=64, blocks_per_sm=32)
GEMM_KERNELS = ("fused_moe_blocked_fp8_kernel", "fused_moe_blocked_fp8_compact_kernel")
# What each route-sort launch writes (lmdeploy's argument names): the sorted route ids are the
# vocabulary's sorted_token_ids; the per-expert counts, ranks, start/end offsets and block tables
# have no vocabulary name and are reported under their own (Buffers.private: `private:Counts`).
# The block tables are written only where the launch's BUILD_BLOCKS is on (lmdeploy passes
# ExpStart again as a placeholder BlockEnd where it is off).
ALIGN_WRITES = {
    "_sorted_idx_phase1_kernel": ("Counts", "LocalPos"),
    "_route_prefix_kernel": ("ExpStart", "ExpEnd", "BlockEnd"),
    "_scatter_sorted_idx_kernel": ("SortedIdx",),
    "_scatter_and_fill_block_meta_kernel": ("SortedIdx", "BlockExpertIds", "BlockOffsets"),
    "_single_cta_route_prepare_kernel": ("Cursors", "SortedIdx", "ExpStart", "ExpEnd", "BlockEnd", "BlockExpertIds",
                                         "BlockOffsets"),
}
BLOCK_TABLES = ("BlockEnd", "BlockExpertIds", "BlockOffsets")
ALIGN_KERNELS = tuple(ALIGN_WRITES)


# the run in progress on this thread, for the kernel proxies (peers.common.ReportingKernel)
_ACTIVE: threading.local = threading.local()


class LmdeployFiles(PeerFiles):
    """lmdeploy's five files loaded once per (cache root, device kind)."""

    peer = PEER

    @staticmethod
    def device_key(device) -> str:
        return device.type

    def __init__(self, root: Path, device: torch.device):
        utils = types.ModuleType("lmdeploy.utils")
        utils.get_logger = logging.getLogger

        def answer_device_props(name, module):
            if name.endswith(".utils") and device.type != "cuda":
                module.get_device_props = lambda device=None: dict(INTERPRETER_DEVICE_PROPS)

        self.load(root, REAL_MODULES, before={"lmdeploy.utils": utils}, loaded=answer_device_props)
        self.blocked_fp8 = self.modules[f"{_K}.moe.blocked_fp8"]
        self.quant_fp8 = self.modules[f"{_K}.blocked_gemm_fp8"].quant_fp8
        # instrumentation, not a change: each launcher reaches its kernel through a module
        # global; the proxy reports the launch and runs lmdeploy's kernel unchanged
        for module in self.modules.values():
            for attr, value in list(vars(module).items()):
                if attr in (*ALIGN_KERNELS, *GEMM_KERNELS, "_silu_and_mul_kernel", "_quant_fp8_kernel",
                            "_moe_reduce_kernel", "fused_moe_kernel", "fused_moe_compact_kernel"):
                    setattr(module, attr, ReportingKernel(attr, value, _ACTIVE))


class RunReporter:
    """One run's launch reporting: vocabulary names and stages from the kernel and its turn."""

    def __init__(self, impl: LmdeployBlockedFP8MoE, problem, recorder):
        self.impl, self.problem, self.recorder = impl, problem, recorder
        self.quants = self.gemms = 0
        self.sorted_idx: torch.Tensor | None = None

    def launch(self, kernel: str, grid, args: dict, run, jit=None):
        p, cfg = self.problem, self.impl.config
        tk, i = p.num_tokens * cfg.topk, cfg.inter
        sorted_rows: set[str] = set()  # reported buffers lmdeploy keeps in sorted-route order
        reads: dict[str, torch.Tensor] = {}
        writes: dict[str, torch.Tensor] = {}
        if kernel in ALIGN_KERNELS:
            stage, reads = Stages.ALIGN, {B.TOPK_IDS: p.topk_ids}
            for arg in ALIGN_WRITES[kernel]:
                if arg in BLOCK_TABLES and not args.get("BUILD_BLOCKS", True):
                    continue
                if isinstance(args.get(arg), torch.Tensor):
                    writes[B.SORTED_TOKEN_IDS if arg == "SortedIdx" else B.private(arg)] = args[arg]
            if "SortedIdx" in args:
                self.sorted_idx = args["SortedIdx"]
        elif kernel == "_quant_fp8_kernel":
            self.quants += 1
            if self.quants == 1:
                stage, reads = Stages.QUANT_INPUT, {B.HIDDEN_STATES: p.hidden_states}
                writes = {B.QUANTED_GATE_UP_INPUT: args["out_ptr"], B.QUANTED_GATE_UP_INPUT_SCALES: args["scale_ptr"]}
            else:
                stage = Stages.QUANT_DOWN_INPUT
                reads = {B.ACTIVATION_OUTPUT: args["a_ptr"]}
                writes = {B.QUANTED_DOWN_INPUT: args["out_ptr"], B.QUANTED_DOWN_INPUT_SCALES: args["scale_ptr"]}
                sorted_rows = set(writes)
        elif kernel in GEMM_KERNELS:
            self.gemms += 1
            if self.gemms == 1:
                stage = Stages.GATE_UP_GEMM
                reads = {B.QUANTED_GATE_UP_INPUT: args["A"], B.QUANTED_GATE_UP_INPUT_SCALES: args["A_scale"],
                         B.W1: args["B"], B.W1_SCALE: args["B_scale"]}
                writes, sorted_rows = {B.GATE_UP_OUTPUT: args["C"].view(tk, 2 * i)}, {B.GATE_UP_OUTPUT}
            else:
                stage = Stages.DOWN_GEMM
                reads = {B.QUANTED_DOWN_INPUT: args["A"], B.QUANTED_DOWN_INPUT_SCALES: args["A_scale"],
                         B.W2: args["B"], B.W2_SCALE: args["B_scale"]}
                writes = {B.DOWN_OUTPUT: args["C"].view(tk, cfg.hidden)}  # route order, before the router weight
            reads[B.SORTED_TOKEN_IDS] = args["SortedIdx"]
        elif kernel == "_silu_and_mul_kernel":
            stage = Stages.ACTIVATION
            reads, writes = {B.GATE_UP_OUTPUT: args["gateup_ptr"]}, {B.ACTIVATION_OUTPUT: args["out_ptr"]}
            sorted_rows = {B.ACTIVATION_OUTPUT}
        elif kernel == "_moe_reduce_kernel":
            stage = Stages.REDUCE
            reads = {B.DOWN_OUTPUT: args["hidden_states_ptr"].view(tk, cfg.hidden), B.TOPK_WEIGHTS: args["weights_ptr"]}
            writes = {B.OUTPUT: args["out_ptr"]}
        else:
            raise NotImplementedError(f"lmdeploy launched {kernel}, which the adapter does not map to a diffmoe stage")
        grid = launch_grid(jit, grid, args)
        info = LaunchInfo(stage=stage, kernel=kernel, grid=grid, reads=reads, writes=writes, triton=True)
        return report_launch(self.recorder, info, run, {n: writes[n] for n in sorted_rows}, self.sorted_idx)


# What the adapter runs (diffmoe.adapters.kit.Supports): the factory's `supports`, and its check
SUPPORTS = Supports(
    f"lmdeploy=={VERSION}",
    Rule("quant", ("fp8-block",), "lmdeploy's fused_moe_blocked_fp8 is its blocked-FP8 path"),
    Rule("fused", (False,), "lmdeploy 0.18 runs silu_and_mul and quant_fp8 as two kernels"),
    Rule("router_weight", ("down",), "lmdeploy applies the router weight in moe_reduce, after the down GEMM"),
    Rule("output", ("separate",), "lmdeploy's moe_reduce returns a fresh tensor, never a workspace"),
    Rule("expert_map", why="lmdeploy's expert_offset path is not wired into the adapter"),
    Rule("activation", ("silu",), "lmdeploy's fused MoE is SwiGLU's"),
    Rule("routed_scaling_factor", why="lmdeploy 0.18's fused_moe_blocked_fp8 takes no routed scaling factor"),
    Rule("swiglu_limit", why="lmdeploy 0.18's silu_and_mul has no clamp"),
    Rule("dropped_slots", why="lmdeploy 0.18's route sort (fused_moe._get_sorted_idx_*) is not known to skip "
                              "topk_ids -1, and the adapter wires no skip"),
)
check_supported = SUPPORTS.check


def plan_workspaces(config: MoEConfig, num_tokens: int) -> WorkspacePlan:
    """lmdeploy's layout: nothing carved, every buffer a fresh allocation."""
    check_supported(config)
    return fresh_allocations_plan(config, f"lmdeploy-{VERSION}")


class LmdeployBlockedFP8MoE(SelfAllocatingPeer):
    """lmdeploy 0.18.0's fused_moe_blocked_fp8 behind diffmoe's plug-in contract (diffmoe.contract)."""

    name = f"lmdeploy-{VERSION}"
    files_class = LmdeployFiles
    reporter_class = RunReporter
    active = _ACTIVE
    check_supported = staticmethod(check_supported)

    def call(self, problem) -> torch.Tensor:
        codes, scales = self.files.quant_fp8(problem.hidden_states, QUANT_BLOCK, **self.quant_kwargs(problem))
        return self.files.blocked_fp8.fused_moe_blocked_fp8(
            codes, scales, problem.w1, problem.w1_scale, problem.w2, problem.w2_scale, **self.call_kwargs(problem))

    @staticmethod
    def quant_kwargs(problem) -> dict:
        """quant_fp8's keywords as lmdeploy's TritonFusedMoEBlockedF8Impl.forward passes them
        (backends/cuda/moe/blocked_fp8.py; peers/call_sites.py reads it): the weights' dtype, the
        impl's scale_fmt (None: a plain float32 scale; 'ue8m0' is a model's choice diffmoe has no field for)."""
        return dict(dtype=problem.w1.dtype, scale_fmt=None)

    def call_kwargs(self, problem) -> dict:
        """fused_moe_blocked_fp8's keywords as TritonFusedMoEBlockedF8Impl.forward passes them: no biases,
        the input's dtype out, and with every expert local (no expert list, or a full one) expert_offset 0 and
        num_experts None. (The adapter passed num_experts=E before: the same run, but not the layer's call.)"""
        return dict(topk_weights=problem.topk_weights, topk_ids=problem.topk_ids, topk=self.config.topk, w1_bias=None,
                    w2_bias=None, out_dtype=problem.hidden_states.dtype, expert_offset=0, num_experts=None,
                    renormalize=False, act_func=None)

    def check_launches(self, reporter) -> None:
        if reporter.gemms != 2 or reporter.quants != 2:
            raise RuntimeError(f"lmdeploy's call made {reporter.gemms} GEMM and {reporter.quants} quant launches, "
                               "the adapter expects 2 of each")


def release_factory(release):
    """The factory of `release` (a row of peers/lmdeploy/releases.py: the one the adapter follows);
    peers/lmdeploy exports it as make_V."""
    if release.version != VERSION:
        raise ValueError(f"lmdeploy must be {VERSION} for this adapter, got {release.version!r}")

    def make(config: MoEConfig, device=None) -> LmdeployBlockedFP8MoE:
        return LmdeployBlockedFP8MoE(config, device)

    make.__doc__ = f"The factory: `--impl lmdeploy=={VERSION}` (alias `--impl lmdeploy`)."
    make.plan_workspaces = plan_workspaces
    make.numerics = "lmdeploy"  # diffmoe.contract.NUMERICS: judged against lmdeploy's rounding points (diffmoe.problem.numerics)
    make.peer_wheel = release.peer  # diffmoe.contract.PEER_WHEEL: the CLI checks the cache before a run
    make.supports = SUPPORTS  # diffmoe.contract.SUPPORTS: the fuzzers draw around what it refuses
    return make
