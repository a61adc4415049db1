"""The adapter core every vLLM release shares: vLLM's Triton fused MoE (`TritonExperts`) as a diffmoe implementation.

Every supported release is a row of peers/vllm/releases.py (its wheel's pin, what its
`TritonExperts.apply` calls: the moe_sum form, whether remote slots are dropped at the alignment,
whether a clamp limit turns the fused FP8-block quant off, read from each wheel); peers/vllm
exports each release's factory (`make_0_33_0`, and `make` for the default release).

What runs is vLLM's own code, from the files `diffmoe peers fetch vllm==VERSION` cached out of
the pinned wheel (diffmoe/adapters/peer_wheels.py), executed by path: fused_moe.py (fused_moe_kernel,
invoke_fused_moe_triton_kernel, the tile configs: tuned JSON per GPU name from the cached
configs/, else vLLM's defaults, always under the interpreter; the expert assignment),
moe_align_block_size.py, utils.py (_resize_cache, moe_kernel_quantize_input), modular_kernel.py
(the FusedMoEExperts base classes) and experts/triton_moe.py (TritonExperts.workspace_shapes and
TritonExperts.apply, which carves the workspaces and launches both GEMMs). What they import
beyond those files is peers/vllm/standins.py's stand-in modules, vLLM's compiled CUDA ops
included (peers/vllm/ops.py's torch versions).

One call, as vLLM's modular kernel (modular_kernel.py, no-DP/EP prepare/finalize) makes it:
  * prepare (prepare_finalize/no_dp_ep.py): the router weight on the input multiplies the bf16
    hidden states (K = 1), then vLLM's moe_kernel_quantize_input quantises them: quant_input;
  * buffers (FusedMoEKernelModularImpl._allocate_buffers): diffmoe's ws1 and ws2, viewed in the
    activation dtype (bf16), are vLLM's workspace13 (common workspace of max(workspace13,
    output) elements) and workspace2; the output is the caller's tensor (output='separate',
    vLLM's output alias) or `_resize_cache(workspace13, (T, H))` (output='workspace');
  * TritonExperts.apply: align, gate_up_gemm into intermediate_cache1 = workspace2 (T, K, 2I),
    silu_and_mul into intermediate_cache2 = workspace13 (T*K, I), the down input's quant (a fresh
    FP8 copy; for 128-block FP8 vLLM always fuses silu with the quant: act_quant), down_gemm
    into intermediate_cache3 = workspace2 (T, K, H) over cache1 (dead by then), moe_sum: reduce.
Every launch is reported with vocabulary names: cache1 = gate_up_output, cache2 =
activation_output, the FP8 copy = quanted_down_input, cache3 = down_output.

The declared plan (`plan_workspaces`) takes its workspace sizes from vLLM's own
TritonExperts.workspace_shapes and places cache1/cache3 at offset 0 of ws2 and cache2 (and a
workspace output) at offset 0 of ws1, exactly as apply carves them; the static oracle then
judges vLLM's real layout (cache1 and cache3 share bytes, their live ranges do not meet).

Supported: quant bf16, fp8-tensor, fp8-token (unfused: vLLM has no fused silu+quant for them),
fp8-block (fused only: every supported release fuses there), router_weight down or input (K = 1),
output separate or workspace, expert_map (vLLM's EP argument: global_num_experts = E, w1/w2
hold the L local experts, apply takes the map as it is). Refused with a ValueError naming the
field: fused=True except with fp8-block, fused=False with fp8-block.
Program order: under the interpreter a non-identity schedule permutes the programs of each
Triton launch of the call at the interpreter's grid loop (diffmoe.interpreter.grid_order, triton 3.9 only;
the adapter applies it itself, so it sets `orders_programs`); the torch stand-ins have no
program order; on a GPU the hardware order runs.

Teacher forcing (`run_stage`) runs the same sequence with the stage's inputs written over the
buffers that hold them right after the launch that produced them.

Longer than 400 lines because it holds the loader, the declared plan, the run
sequence and the launch reporter, which all drive the same loaded vLLM modules.

Owns the adapter (loading vLLM's files, the run sequence, launch reporting, the declared plan).
Must not copy vLLM source or change vLLM's numerics: differences are reported, not fixed.
"""

from __future__ import annotations

import functools
import inspect
import math
from pathlib import Path

import torch

from diffmoe.interpreter import grid_order
from diffmoe.problem.config import QUANT_BLOCK, MoEConfig
from diffmoe.contract import LaunchInfo, Placement, RunResult, Schedule, WorkspacePlan, default_device
from diffmoe.problem.vocabulary import Buffers, Stages, buffer_spec, pipeline_stages

from diffmoe.adapters.kit import Rule, Supports

from ..common import PeerFiles, check_problem, install_interpreter_fixes, interpreting
from . import ops as vllm_ops, releases, standins as vllm_standins
from .releases import RELEASES, Release

B = Buffers


DEFAULT = RELEASES[releases.DEFAULT]  # `--impl vllm`
_MOE = "vllm.model_executor.layers.fused_moe"
# vLLM's files, executed in this order (each imports only the ones before it and stand-ins)
REAL_MODULES = (
    (f"{_MOE}.utils", "vllm/model_executor/layers/fused_moe/utils.py"),
    (f"{_MOE}.moe_align_block_size", "vllm/model_executor/layers/fused_moe/moe_align_block_size.py"),
    (f"{_MOE}.modular_kernel", "vllm/model_executor/layers/fused_moe/modular_kernel.py"),
    (f"{_MOE}.fused_moe", "vllm/model_executor/layers/fused_moe/fused_moe.py"),
    (f"{_MOE}.experts.triton_moe", "vllm/model_executor/layers/fused_moe/experts/triton_moe.py"),
)
VARIANTS = ("vllm", "cache2-in-ws2")  # the second: a planted carve bug (tests), cache2 carved from workspace2


class VllmFiles(PeerFiles):
    """vLLM's five files loaded once per (release, cache root, device), with their stand-ins."""

    release: Release
    _per_release: dict = {}

    @classmethod
    def of_release(cls, release: Release) -> type[VllmFiles]:
        """The class loading `release`'s files (one per release: PeerFiles keys its cache by class)."""
        sub = cls._per_release.get(release.version)
        if sub is None:
            sub = type(f"VllmFiles_{release.version.replace('.', '_')}", (cls,), {"peer": release.peer, "release": release})
            cls._per_release[release.version] = sub
        return sub

    @classmethod
    def of(cls, release: Release, device) -> VllmFiles:
        return cls.of_release(release).get(device)

    def __init__(self, root: Path, device: torch.device):
        self.root = root
        standins = vllm_standins.standin_modules(device)
        vllm_standins.link_parents(standins)
        self.load(root, REAL_MODULES, before=standins)  # the adapter kit's loader, each file under its parent
        self.utils = self.modules[f"{_MOE}.utils"]
        self.fused_moe = self.modules[f"{_MOE}.fused_moe"]
        self.triton_moe = self.modules[f"{_MOE}.experts.triton_moe"]
        self.TritonExperts = self.triton_moe.TritonExperts
        # instrumentation, not a change: apply() reaches the GEMM launcher through this module
        # global; the wrapper reports each call and runs vLLM's launcher unchanged
        self.invoke_gemm = self.fused_moe.invoke_fused_moe_triton_kernel
        self.triton_moe.invoke_fused_moe_triton_kernel = self._reporting_gemm
        self._gemm_signature = inspect.signature(self.invoke_gemm)
        # the same for the clamped SwiGLU (utils.swiglu_limit_func, torch or Triton): reported as
        # the activation launch, run unchanged
        self.swiglu_limit = self.triton_moe.swiglu_limit_func
        self.triton_moe.swiglu_limit_func = self._reporting_swiglu_limit

    def _reporting_gemm(self, *args, **kwargs):
        reporter = vllm_ops.ACTIVE_REPORTER.get()
        if reporter is None or not isinstance(reporter, RunReporter):
            return self.invoke_gemm(*args, **kwargs)
        bound = self._gemm_signature.bind(*args, **kwargs)
        return reporter.gemm(self.invoke_gemm, bound)

    def _reporting_swiglu_limit(self, output, input, swiglu_limit=0.0, topk_ids=None, expert_map=None):
        reporter = vllm_ops.ACTIVE_REPORTER.get()
        run = lambda: self.swiglu_limit(output, input, swiglu_limit, topk_ids, expert_map)  # noqa: E731
        if reporter is None or not isinstance(reporter, RunReporter):
            return run()
        return reporter.launch("swiglu_limit", "vllm utils.swiglu_limit_func", (input.shape[0],),
                               {"input": input, "output": output}, run)

    def experts(self, config: MoEConfig, quant: vllm_standins.FusedMoEQuantConfig):
        layer = vllm_standins.FusedMoEConfig(num_experts=config.num_experts, swiglu_limit=swiglu_limit(config))
        return self.TritonExperts(layer, quant)


def quant_config(config: MoEConfig, w1_scale=None, w2_scale=None) -> vllm_standins.FusedMoEQuantConfig:
    """vLLM's quant config for diffmoe's scheme: dynamic activations, static weight scales. The two
    granularities are passed apart, as vLLM's own FusedMoEQuantConfig holds them: per_act_token_quant
    for per-token activations, per_out_ch_quant for per-channel weights; per-tensor weights beside
    per-token activations (kFp8StaticTensorSym, kFp8DynamicTokenSym) keep their [E] scale, which
    fused_moe.py's invoke_fused_moe_triton_kernel broadcasts over N (stride_bsn 0 for a 1-D B_scale)."""
    # The SwiGLU limit rides in the quant config too, as gemm1_clamp_limit: every release's quant methods pass the
    # layer's swiglu_limit so (UnquantizedFusedMoEMethod.get_fused_moe_quant_config, and make_fp8_moe_quant_config for
    # Fp8MoEMethod and compressed-tensors; peers/call_sites.py reads them). The adapter passed it only in the layer's
    # FusedMoEConfig before: the same clamp (activation.py's from_configs takes the quant config's first), not the call.
    q = config.quant
    if q == "bf16":
        return vllm_standins.FusedMoEQuantConfig(gemm1_clamp_limit=swiglu_limit(config))
    return vllm_standins.FusedMoEQuantConfig(
        quant_dtype=vllm_ops.FP8, per_act_token_quant=q == "fp8-token",
        per_out_ch_quant=config.weight_granularity == "channel",
        block_shape=[QUANT_BLOCK, QUANT_BLOCK] if q == "fp8-block" else None, w1_scale=w1_scale, w2_scale=w2_scale,
        gemm1_clamp_limit=swiglu_limit(config),
    )


# the keywords no_dp_ep.py's _quantize_input passes that describe MX / NVFP4 scales only (the adapter leaves them
# at moe_kernel_quantize_input's defaults: an FP8 quant never reads them); peers/call_sites.py checks the rest
MX_ONLY_QUANTIZE_KEYWORDS = ("is_scale_swizzled", "is_scale_transposed", "mx_alignment")


def quantize_kwargs(q: vllm_standins.FusedMoEQuantConfig) -> dict:
    """moe_kernel_quantize_input's keywords as the no-DP/EP prepare passes them (_quantize_input in
    prepare_finalize/no_dp_ep.py), less MX_ONLY_QUANTIZE_KEYWORDS."""
    return dict(quant_dtype=q.quant_dtype, per_act_token_quant=q.per_act_token_quant, block_shape=q.block_shape)


def swiglu_limit(config: MoEConfig) -> float | None:
    """The config's SwiGLU clamp limit (MoEConfig.swiglu_limit where this diffmoe has it), passed
    to TritonExperts as vLLM takes a model's: the layer's FusedMoEConfig.swiglu_limit."""
    return getattr(config, "swiglu_limit", None)


def fuses_block_quant(config: MoEConfig, release: Release) -> bool:
    """Whether `release`'s apply fuses silu with the 128-block quant for `config`."""
    return config.quant == "fp8-block" and not (release.clamp_unfuses_block_quant and swiglu_limit(config) is not None)


@functools.lru_cache(maxsize=None)
def release_supports(release: Release) -> Supports:
    """What the adapter runs of `release`: the factory's `supports`, and its check (diffmoe.adapters.kit.Supports)."""
    return Supports(
        f"{release.module} (vLLM {release.version})",
        Rule("fused", lambda c: (fuses_block_quant(c, release),), when=lambda c: c.quant == "fp8-block",
             condition="quant='fp8-block'",
             why="vLLM fuses silu with the 128-block quant (ops.silu_and_mul_per_block_quant)"
                 + (" unless a clamp limit turns it off: its apply then falls back to the unfused, clamped path (the "
                    "fused kernel takes no clamp)" if release.clamp_unfuses_block_quant else ", a clamp limit or not")),
        Rule("fused", (False,), when=lambda c: c.quant != "fp8-block", condition="quant other than 'fp8-block'",
             why="vLLM fuses silu with the down input's quant only for 128-block FP8"),
        Rule("activation", ("silu",), "the adapter runs vLLM's SwiGLU path"),
        Rule("routed_scaling_factor", why="TritonExperts.apply takes no scaling factor (modular_kernel.py passes "
                                          "routed_scaling_factor to the fused-router monolithic experts only)"),
        Rule("dropped_slots", when=lambda c: c.expert_map is None, condition="no expert_map",
             why="vLLM meets topk_ids -1 only under expert parallelism (without a map 0.33.0 sums the rows of -1 "
                 "slots, stale)"),
    )


def check_supported(config: MoEConfig, release: Release = DEFAULT) -> None:
    """ValueError naming the field for what the adapter does not run."""
    release_supports(release).check(config)


def vllm_shapes(files: VllmFiles, config: MoEConfig, num_tokens: int):
    """(workspace13, workspace2, output) shapes from vLLM's TritonExperts.workspace_shapes."""
    experts = files.experts(config, quant_config(config))
    return experts.workspace_shapes(num_tokens, 2 * config.inter, config.hidden, config.topk, config.num_experts,
                                    config.num_local_experts, None, vllm_standins.MoEActivation.SILU)


def plan_workspaces(config: MoEConfig, num_tokens: int, variant: str = "vllm", device=None,
                    release: Release = DEFAULT) -> WorkspacePlan:
    """vLLM's layout for `num_tokens` tokens: sizes from workspace_shapes, the carving of apply()."""
    check_supported(config, release)
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {list(VARIANTS)}, got {variant!r}")
    files = VllmFiles.of(release, torch.device(device) if device is not None else default_device())
    ws13, ws2, out = vllm_shapes(files, config, num_tokens)
    item = torch.bfloat16.itemsize  # workspace_dtype(activation dtype)
    sizes = (item * max(math.prod(ws13), math.prod(out)), item * math.prod(ws2))
    t, k, n, h = num_tokens, config.topk, 2 * config.inter, config.hidden
    cache2_ws = 1 if variant == "cache2-in-ws2" else 0
    carved = [  # (buffer, workspace, elements) as TritonExperts.apply / _allocate_buffers carve them
        (B.GATE_UP_OUTPUT, 1, t * k * n),  # intermediate_cache1 = _resize_cache(workspace2, (T, K, N))
        (B.ACTIVATION_OUTPUT, cache2_ws, t * k * (n // 2)),  # intermediate_cache2 = _resize_cache(workspace13, (T*K, N/2))
        (B.DOWN_OUTPUT, 1, t * k * h),  # intermediate_cache3 = _resize_cache(workspace2, (T, K, K_hidden))
    ]
    if config.output == "workspace":
        carved.append((B.OUTPUT, cache2_ws, t * h))  # fused_out = _resize_cache(common workspace13, (T, H))
    if config.fused:
        carved = [c for c in carved if c[0] != B.ACTIVATION_OUTPUT]  # act_quant never writes cache2
    placements = []
    for name, ws, elements in carved:
        nbytes = elements * item
        assert nbytes == buffer_spec(config, name, num_tokens).nbytes, (name, nbytes)
        placements.append(Placement(name, ws, 0, nbytes))
    if variant == "cache2-in-ws2":
        sizes = (0, max(sizes))
    return WorkspacePlan(
        planner=f"vllm-{release.version}" + ("" if variant == "vllm" else f" ({variant})"),
        buffer_list=tuple(p.buffer for p in placements),
        placements=tuple(placements),
        stages=tuple(pipeline_stages(config)),
        workspace_bytes=sizes,
    )


class RunReporter(vllm_ops.OpReporter):
    """One run's launch reporting: vocabulary names and stages from the op and the run's phase."""

    def __init__(self, impl: VllmTritonMoE, problem, recorder, schedule: Schedule,
                 force: dict[str, torch.Tensor] | None = None, capture: str | None = None):
        self.impl, self.problem, self.recorder, self.schedule = impl, problem, recorder, schedule
        self.phase = "prepare"
        self.gemms = 0
        # teacher forcing (run_stage): buffers overwritten with given values right after the launch
        # that writes them, and the writes of stage `capture` copied out
        self.force, self.capture = force or {}, capture
        self.captured: dict[str, torch.Tensor] | None = None

    def _report(self, stage: str, kernel: str, grid, reads: dict, writes: dict, compute, triton: bool = False):
        """triton: the launch runs one of vLLM's jit kernels (the GEMM); False for the torch stand-ins of its
        compiled ops and its torch helpers."""
        info = None
        if self.recorder is not None:
            info = LaunchInfo(stage=stage, kernel=kernel, grid=tuple(grid), reads=reads, writes=writes, triton=triton)
            self.recorder.before_launch(info)
        result = compute()
        if info is not None:
            self.recorder.after_launch(info)
        if stage == self.capture:
            self.captured = {name: view.clone() for name, view in writes.items()}
        for name, view in writes.items():
            if name in self.force:
                view.copy_(self.force[name].reshape(view.shape).to(view.dtype))
        return result

    def launch(self, op, kernel, grid, tensors, compute):
        cfg, p = self.impl.config, self.problem
        release = self.impl.release
        if op == "moe_align_block_size":
            stage, reads = Stages.ALIGN, {B.TOPK_IDS: tensors["topk_ids"]}
            if "expert_map" in tensors:
                if not release.drops_remote_at_align:
                    raise RuntimeError(f"vLLM {release.version}'s apply passed the expert map to the alignment op: "
                                       "peers/vllm/releases.py says it does not (drops_remote_at_align)")
                reads[B.EXPERT_MAP] = tensors["expert_map"]
            writes = {n: tensors[n] for n in (B.SORTED_TOKEN_IDS, B.EXPERT_IDS, B.NUM_TOKENS_POST_PADDED)}
        elif op in ("dynamic_scaled_fp8_quant", "dynamic_per_token_scaled_fp8_quant", "per_token_group_fp8_quant"):
            if self.phase == "prepare":
                stage = Stages.QUANT_INPUT
                reads = {B.HIDDEN_STATES: p.hidden_states}
                if cfg.router_weight == "input":
                    reads[B.TOPK_WEIGHTS] = p.topk_weights
                codes, scales = B.QUANTED_GATE_UP_INPUT, B.QUANTED_GATE_UP_INPUT_SCALES
            else:
                stage, reads = Stages.QUANT_DOWN_INPUT, {B.ACTIVATION_OUTPUT: tensors["input"]}
                codes, scales = B.QUANTED_DOWN_INPUT, B.QUANTED_DOWN_INPUT_SCALES
            writes = {codes: tensors["output"], scales: tensors["scale"]}
        elif op in ("silu_and_mul", "swiglu_limit"):
            stage = Stages.ACTIVATION
            reads, writes = {B.GATE_UP_OUTPUT: tensors["input"]}, {B.ACTIVATION_OUTPUT: tensors["output"]}
        elif op == "silu_and_mul_per_block_quant":
            stage, reads = Stages.ACT_QUANT, {B.GATE_UP_OUTPUT: tensors["input"]}
            writes = {B.QUANTED_DOWN_INPUT: tensors["output"], B.QUANTED_DOWN_INPUT_SCALES: tensors["scale"]}
        elif op == "moe_sum":
            x = tensors["input"]
            stage, reads = Stages.REDUCE, {B.DOWN_OUTPUT: x.view(-1, x.shape[-1]) if x.is_contiguous() else x}
            pad_aware = "expert_map" in tensors
            if cfg.expert_map is not None and pad_aware != release.pad_aware_moe_sum:
                raise RuntimeError(f"vLLM {release.version}'s apply called the {'pad-aware' if pad_aware else 'two-argument'} "
                                   "moe_sum under an expert map: peers/vllm/releases.py says otherwise (pad_aware_moe_sum)")
            if pad_aware:
                reads.update({B.TOPK_IDS: tensors["topk_ids"], B.EXPERT_MAP: tensors["expert_map"]})
            writes = {B.OUTPUT: tensors["output"]}
        else:
            raise NotImplementedError(f"vLLM op {op} has no diffmoe stage (phase {self.phase})")
        return self._report(stage, kernel, grid, reads, writes, compute)

    def gemm(self, invoke, bound: inspect.BoundArguments):
        a = bound.arguments
        cfg, p = self.impl.config, self.problem
        A, Bw, C, a_scale = a["A"], a["B"], a["C"], a.get("A_scale")
        tile = a["config"]
        sorted_ids, top_k = a.get("sorted_token_ids"), a["top_k"]
        bm, bn = tile["BLOCK_SIZE_M"], tile["BLOCK_SIZE_N"]
        if sorted_ids is not None:  # invoke_fused_moe_triton_kernel's EM and grid
            em = sorted_ids.size(0) if A.size(0) >= bm else min(sorted_ids.size(0), A.size(0) * top_k * bm)
        else:
            em = A.size(0) * top_k * bm
        grid = (-(em // -bm) * -(Bw.size(1) // -bn),)
        first = self.gemms == 0
        self.gemms += 1
        if first:
            stage, out = Stages.GATE_UP_GEMM, B.GATE_UP_OUTPUT
            a_name = B.QUANTED_GATE_UP_INPUT if cfg.is_fp8 else B.HIDDEN_STATES
            s_name, w_name, ws_name = B.QUANTED_GATE_UP_INPUT_SCALES, B.W1, B.W1_SCALE
        else:
            stage, out = Stages.DOWN_GEMM, B.DOWN_OUTPUT
            a_name = B.QUANTED_DOWN_INPUT if cfg.is_fp8 else B.ACTIVATION_OUTPUT
            s_name, w_name, ws_name = B.QUANTED_DOWN_INPUT_SCALES, B.W2, B.W2_SCALE
        reads = {a_name: p.hidden_states if (first and not cfg.is_fp8) else A, w_name: Bw}
        if first and cfg.router_weight == "input" and not cfg.is_fp8:
            reads[B.TOPK_WEIGHTS] = p.topk_weights
        if a_scale is not None:
            reads[s_name] = a_scale
        if a.get("B_scale") is not None:
            reads[ws_name] = a["B_scale"]
        if a.get("mul_routed_weight"):
            reads[B.TOPK_WEIGHTS] = a["topk_weights"]
        for name, key in ((B.SORTED_TOKEN_IDS, "sorted_token_ids"), (B.EXPERT_IDS, "expert_ids"),
                          (B.NUM_TOKENS_POST_PADDED, "num_tokens_post_padded")):
            if a.get(key) is not None:
                reads[name] = a[key]
        writes = {out: C.view(-1, C.shape[-1])}
        return self._report(stage, "fused_moe_kernel", grid, reads, writes, lambda: invoke(*bound.args, **bound.kwargs),
                            triton=True)


class VllmTritonMoE:
    """One vLLM release's TritonExperts behind diffmoe's plug-in contract (diffmoe.contract)."""

    orders_programs = True  # _execute runs the call inside diffmoe.interpreter.grid_order's control itself

    def __init__(self, config: MoEConfig, device=None, variant: str = "vllm", release: Release = DEFAULT,
                 tile_config: dict | None = None):
        config.validate()
        # a tile config forced through vLLM's own override (override_config: every GEMM launch takes it),
        # None for the release's own choice (its shipped files, else get_default_config): tuned_factory
        self.tile_config = dict(tile_config) if tile_config is not None else None
        check_supported(config, release)
        self.release = release
        self.name = f"vllm-{release.version}"
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {list(VARIANTS)}, got {variant!r}")
        self.config, self.variant = config, variant
        self.device = torch.device(device) if device is not None else default_device()
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.max_tokens = config.num_tokens
        self.files = VllmFiles.of(release, self.device)

    # ---- the declared plan -------------------------------------------------------------
    def workspace_plan(self, num_tokens: int) -> WorkspacePlan:
        return plan_workspaces(self.config, num_tokens, self.variant, self.device, self.release)

    def workspace_shapes(self, max_tokens: int | None = None) -> tuple[int, int]:
        return self.workspace_plan(max_tokens or self.max_tokens).workspace_bytes

    # ---- running -----------------------------------------------------------------------
    def run(self, problem, workspaces, *, output=None, schedule: Schedule = Schedule(), recorder=None) -> RunResult:
        check_problem(self, problem)
        plan = self.workspace_plan(problem.num_tokens)
        self._check_workspaces(workspaces, plan, problem.num_tokens)
        out, _ = self._execute(problem, workspaces, output, schedule, recorder)
        return RunResult(output=out)

    def run_stage(self, stage: str, inputs: dict[str, torch.Tensor], problem, *, schedule: Schedule = Schedule(),
                  recorder=None) -> dict[str, torch.Tensor]:
        """One stage on given inputs (teacher forcing), through vLLM's own sequence: a whole call
        on fresh workspaces in which each buffer the stage reads is overwritten with the given
        value right after the launch that writes it; returns the stage's writes."""
        check_problem(self, problem)
        spec = next((s for s in pipeline_stages(self.config) if s.name == stage), None)
        if spec is None:
            raise ValueError(f"stage must be one of {[s.name for s in pipeline_stages(self.config)]}, got {stage!r}")
        t = problem.num_tokens
        if t == 0:
            return {}
        n1, n2 = self.workspace_plan(t).workspace_bytes
        workspaces = (torch.zeros(n1, dtype=torch.uint8, device=self.device),
                      torch.zeros(n2, dtype=torch.uint8, device=self.device))
        output = None if self.config.output == "workspace" else \
            torch.empty(t, self.config.hidden, dtype=torch.bfloat16, device=self.device)
        force = {n: v for n, v in inputs.items() if n not in problem.inputs()}
        _, reporter = self._execute(problem, workspaces, output, schedule, recorder, force=force, capture=stage)
        if reporter.captured is None:
            raise RuntimeError(f"vLLM's call made no {stage} launch")
        return {n: v for n, v in reporter.captured.items() if n in spec.writes}

    def _execute(self, problem, workspaces, output, schedule, recorder, force=None, capture=None):
        cfg = self.config
        t = problem.num_tokens
        if cfg.output == "workspace" and output is not None:
            raise ValueError("output must be None when the config's output placement is 'workspace': vLLM's modular "
                             "kernel carves the result from workspace13 (ws1) and returns it")
        if cfg.output == "separate":
            out = output if output is not None else torch.empty(t, cfg.hidden, dtype=torch.bfloat16, device=self.device)
            if out.shape != (t, cfg.hidden) or out.dtype != torch.bfloat16 or out.device != self.device:
                raise ValueError(f"output must be a [{t}, {cfg.hidden}] bf16 tensor on {self.device}")
        files = self.files
        ws13_shape, ws2_shape, out_shape = vllm_shapes(files, cfg, t)
        ws13_src, ws2_src = workspaces if self.variant == "vllm" else (workspaces[1], workspaces[1])
        item = torch.bfloat16.itemsize
        common = ws13_src[: item * max(math.prod(ws13_shape), math.prod(out_shape))].view(torch.bfloat16)
        workspace2 = ws2_src[: item * math.prod(ws2_shape)].view(torch.bfloat16).view(ws2_shape)
        resize = files.utils._resize_cache  # vLLM's carving rule
        if cfg.output == "workspace":
            out = resize(common, out_shape)
        if t == 0:
            return out, None  # the modular kernel returns before any launch (M_full == 0)
        workspace13 = resize(common, ws13_shape)
        reporter = RunReporter(self, problem, recorder, schedule, force, capture)
        token = vllm_ops.ACTIVE_REPORTER.set(reporter)
        try:
            # the control's launch index counts the call's interpreter launches: the two GEMMs
            # are launches 0 and 1 (everything else runs as torch stand-ins)
            with files.installed(), grid_order.program_order(schedule):
                self._interpreter_ready()
                a1 = problem.hidden_states
                if cfg.router_weight == "input":  # no_dp_ep.prepare (K == 1)
                    a1 = a1 * problem.topk_weights.to(a1.dtype)
                q = quant_config(cfg, problem.w1_scale, problem.w2_scale)
                a1q, a1q_scale = files.utils.moe_kernel_quantize_input(a1, q.a1_scale, **quantize_kwargs(q))
                reporter.phase = "apply"
                experts = files.experts(cfg, q)
                # where try_get_optimal_moe_config is an lru_cache (keyed by shapes, not by the override) it is
                # emptied around a forced config, so that neither a forced nor a chosen config outlives its call
                clear = getattr(files.fused_moe.try_get_optimal_moe_config, "cache_clear", None)
                forced = self.tile_config is not None and clear is not None
                if forced:
                    clear()
                with vllm_standins.override_config(self.tile_config):
                    self._apply(experts, out, a1q, a1q_scale, problem, workspace13, workspace2)
                if forced:
                    clear()
        finally:
            vllm_ops.ACTIVE_REPORTER.reset(token)
        if reporter.gemms != 2:
            raise RuntimeError(f"vLLM's apply made {reporter.gemms} GEMM launches, the adapter expects 2")
        return out, reporter

    def _apply(self, experts, out, a1q, a1q_scale, problem, workspace13, workspace2) -> None:
        experts.apply(**self.apply_kwargs(experts, out, a1q, a1q_scale, problem, workspace13, workspace2))

    def apply_kwargs(self, experts, out, a1q, a1q_scale, problem, workspace13, workspace2) -> dict:
        """TritonExperts.apply's keywords as vLLM's modular kernel passes them
        (FusedMoEKernelModularImpl._fused_experts in modular_kernel.py; peers/call_sites.py reads it): a2_scale
        is the experts' own (`self.fused_experts.a2_scale`, None for dynamic activations; the adapter passed a
        literal None before), expert_tokens_meta what the no-DP/EP prepare returns (None)."""
        cfg = self.config
        return dict(
            output=out, hidden_states=a1q, w1=problem.w1, w2=problem.w2, topk_weights=problem.topk_weights,
            topk_ids=problem.topk_ids, activation=vllm_standins.MoEActivation.SILU, global_num_experts=cfg.num_experts,
            expert_map=problem.expert_map, a1q_scale=a1q_scale, a2_scale=experts.a2_scale, workspace13=workspace13,
            workspace2=workspace2, expert_tokens_meta=None, apply_router_weight_on_input=cfg.router_weight == "input",
        )

    @staticmethod
    def _interpreter_ready() -> None:
        if interpreting():
            from diffmoe.interpreter import fixes as interpreter_fixes

            if not interpreter_fixes.installed():
                install_interpreter_fixes()

    # ---- checks --------------------------------------------------------------------------

    def _check_workspaces(self, workspaces, plan: WorkspacePlan, t: int) -> None:
        if not isinstance(workspaces, (tuple, list)) or len(workspaces) != 2:
            raise TypeError("workspaces must be a pair (ws1, ws2) of uint8 tensors")
        for idx, ws in enumerate(workspaces):
            if not isinstance(ws, torch.Tensor) or ws.dtype != torch.uint8 or ws.dim() != 1 or not ws.is_contiguous():
                raise TypeError(f"ws{idx + 1} must be a contiguous 1-D uint8 tensor")
            if ws.numel() < plan.workspace_bytes[idx]:
                raise ValueError(f"ws{idx + 1} holds {ws.numel()} bytes, vLLM's layout for T={t} needs {plan.workspace_bytes[idx]}")
            if ws.device != self.device:
                raise ValueError(f"ws{idx + 1} is on {ws.device}, the implementation runs on {self.device}")


def release_factory(version: str):
    """`make(config, device=None)` for one release, with its factory attributes (attach); peers/vllm
    exports it as `make_VERSION` (what --impl loads and replay lines name)."""
    release = RELEASES[version]

    def make(config: MoEConfig, device=None) -> VllmTritonMoE:
        return VllmTritonMoE(config, device, release=release)

    make.__doc__ = f"The factory: `--impl {'vllm' if release is DEFAULT else release.impl}`."
    return attach(make, release)


def tuned_factory(version: str, tile_config: dict | None):
    """The factory of release `version` with `tile_config` forced through vLLM's override_config
    (diffmoe tuned-configs: one shipped entry), its attributes those of the release's `make`."""
    release = RELEASES[version]

    def make(config: MoEConfig, device=None) -> VllmTritonMoE:
        return VllmTritonMoE(config, device, release=release, tile_config=tile_config)

    make.__module__, make.__qualname__ = __name__, "tuned_factory.<locals>.make"
    make.tile_config = tile_config
    return attach(make, release)


# where each release's wheel keeps the tuned tile configs fused_moe.py reads (peer_wheels keeps the folder)
TUNED_CONFIG_DIR = "vllm/model_executor/layers/fused_moe/configs"


def attach(make, release: Release):
    """The factory attributes of a release's `make` (diffmoe.contract): its plan and `supports`."""
    def plan(config: MoEConfig, num_tokens: int) -> WorkspacePlan:
        return plan_workspaces(config, num_tokens, release=release)

    make.plan_workspaces = plan
    make.peer_wheel = release.peer  # diffmoe.contract.PEER_WHEEL: the CLI checks the cache before a run
    make.supports = release_supports(release)  # diffmoe.contract.SUPPORTS: the fuzzers draw around what it refuses
    # diffmoe.contract.NUMERICS: every release is judged against the `vllm` profile (diffmoe.problem.numerics):
    # the compiled ops it follows (quant, silu_and_mul, moe_sum) round alike in 0.28.0 to 0.33.0, so
    # the museum's buggy and fixed releases meet the same reference
    make.numerics = "vllm"
    # diffmoe.contract.BATCH_INVARIANT: not claimed. The 0.33.0 wheel's fused_moe.py,
    # get_default_config, takes `block_k = 128 if dtype == "fp8_w8a8" or M <= 64 else 64`: a bf16
    # row is summed in other K tiles once the batch passes 64 tokens; a fixed config is returned
    # only under VLLM_BATCH_INVARIANT, vLLM's own batch-invariant mode, which this adapter does not run
    make.batch_invariant = False
    make.release = release
    # diffmoe tuned-configs (diffmoe/tuned_configs/): the folder of the release's cached wheel holding the
    # tuned tile configs it ships, and the release's factory with one tile config forced through vLLM's
    # own override_config
    make.tuned_config_dir = TUNED_CONFIG_DIR
    make.with_tile_config = lambda tile_config: tuned_factory(release.version, tile_config)
    return make
