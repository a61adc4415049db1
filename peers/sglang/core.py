"""SGLang's Triton fused MoE (`fused_experts`, its CUDA branch) as a diffmoe implementation:
`--impl sglang` (0.5.23), `--impl sglang==0.5.20`, and `peers.sglang:make_fallback_0_5_23` for the
branch SGLang takes on a platform that is none of CUDA, HIP, XPU and MUSA.

What runs is SGLang's own Python call sequence from the seven files `diffmoe peers fetch sglang`
cached out of the pinned wheel (diffmoe/adapters/peer_wheels.py), executed by path with the adapter
kit (diffmoe/adapters/kit/): fused_moe.py's `fused_experts` (the tile config, the alignment, both
`invoke_fused_moe_kernel` calls with their activation quant, silu_and_mul, the combine over top-k)
and its jit kernels. Everything else those files import is a kit stub; the few names evaluated at
import or on the path get values below (STUB_VALUES): the platform probes (is_cuda() True for the
CUDA branch, False for the fallback; every other platform False; no SM90, no PDL: the interpreter
is neither), the environment registry's flags at their default (off), no symmetric-memory pool,
no fused sum all-reduce, no deterministic-inference override, no tuned-config override.

SGLang's compiled CUDA ops are the adapter kit's stand-ins with SGLang's conventions
(peers/sglang/standins.py, which also holds the values the stubs carry).
fused_moe.py's `@torch.compile` sum (top-k > 2 at <= 32 tokens) runs eagerly
(torch.compiler.set_stance("force_eager")): the same torch.sum, without a C++ toolchain.

Launches are reported with vocabulary names: each stand-in op (ALIGN, the quants, ACTIVATION),
each `fused_moe_kernel` launch (a proxy around the jit kernel, peers.common.ReportingKernel: the
gate/up GEMM reads w1, the down GEMM w2) and, when `fused_experts` returns, the combine over top-k that fused_moe.py
does in host code (torch.add at K = 2, torch.sum or moe_sum_reduce above), reported as the reduce
(at K = 1 the down GEMM stores the result itself: the adapter's copy of it is the reduce). Every intermediate SGLang keeps is in route order (row t*K+k),
so nothing is permuted. The fallback's activation, torch code between the launches, is reported
as the activation right before the first launch that reads its result.

Workspaces: SGLang allocates every buffer itself (torch.empty in _fused_moe_kernel_sequence),
so the plan says so; the output is fused_experts' own tensor copied into the caller's.

Numerics: the `sglang` profile (diffmoe.problem.numerics), from the facts above; the fallback's
`sglang_fallback` (torch's silu rounded to bf16 before the product, Triton group quant).
Batch invariance: not claimed. The tile config depends on the number of tokens (get_default_config
switches BLOCK_SIZE_* at M <= E), so a token's row may be summed in another order in another batch.

Owns the adapter (loading SGLang's files, the stand-in conventions, launch reporting, the refusals).
Must not copy SGLang source or change its numerics: differences are reported, not fixed.
"""

from __future__ import annotations

import logging
import threading
import types

import torch

from diffmoe.adapters import kit, peer_wheels
from diffmoe.contract import LaunchInfo
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.vocabulary import QUANT_BLOCK, Buffers as B, Stages

from diffmoe.adapters.kit import Rule, Supports

from ..common import ReportingKernel, SelfAllocatingPeer, launch_grid
from .releases import Release  # noqa: F401 - a release row, what factory() takes
from .standins import ACTIVE as _ACTIVE, MOE as _MOE, OPS as _OPS, moe_align_block_size, override_config, stub_values

FILES = (  # executed in this order, each seeing the ones before it
    (f"{_OPS}.quantization.fp8_utils", "sglang/kernels/ops/quantization/fp8_utils.py"),
    (f"{_OPS}.quantization.fp8_kernel", "sglang/kernels/ops/quantization/fp8_kernel.py"),
    (f"{_OPS}.moe.fused_moe_triton_kernels", "sglang/kernels/ops/moe/fused_moe_triton_kernels.py"),
    (f"{_OPS}.moe.moe_align_small_numel", "sglang/kernels/ops/moe/moe_align_small_numel.py"),
    (f"{_MOE}.fused_moe_triton_config", f"{_MOE.replace('.', '/')}/fused_moe_triton_config.py"),
    (f"{_MOE}.moe_align_block_size", f"{_MOE.replace('.', '/')}/moe_align_block_size.py"),
    (f"{_MOE}.fused_moe", f"{_MOE.replace('.', '/')}/fused_moe.py"),
)
class SglangFiles:
    """One release's files loaded once per (cache root, branch)."""

    _loaded: dict = {}
    _lock = threading.Lock()

    @classmethod
    def get(cls, peer: str, cuda: bool) -> SglangFiles:
        from ..common import install_interpreter_fixes, interpreter_on_a_cpu

        root = peer_wheels.peer_root(peer)  # one line naming `diffmoe peers fetch <peer>` when missing
        with cls._lock:
            if (str(root), cuda) not in cls._loaded:
                interpreter_on_a_cpu()
                install_interpreter_fixes()
                cls._loaded[(str(root), cuda)] = cls(root, cuda)
            return cls._loaded[(str(root), cuda)]

    def __init__(self, root, cuda: bool):
        stubs = kit.Stubs(["sglang", "sgl_kernel", "aiter", "deep_gemm"], stub_values(cuda))
        self.modules = kit.load_modules(kit.PackageSource.folder(root), FILES, stubs=stubs)
        # SGLang warns on every call that no tuned config matches E, N and the GPU (none can: diffmoe's
        # shapes are no real model's); the default config it then takes is the one that runs
        logging.getLogger(f"{_MOE}.fused_moe_triton_config").setLevel(logging.ERROR)
        self.fused_moe = self.modules[f"{_MOE}.fused_moe"]
        # SGLang's own utils give logging.Logger a warning_once (not loaded here); fused_moe.py calls it when a
        # tuned config asks for TMA (USE_TMA, diffmoe tuned-configs forces such entries): its logger here is
        # one that has it, and logs once per message as SGLang's does
        self.fused_moe.logger = _OnceLogger(self.fused_moe.logger)
        kernels = self.modules[f"{_OPS}.moe.fused_moe_triton_kernels"]
        # instrumentation, not a change: invoke_fused_moe_kernel reaches the jit kernel through a module global
        kernels.fused_moe_kernel = ReportingKernel("fused_moe_kernel", kernels.fused_moe_kernel, _ACTIVE)
        fp8 = self.modules[f"{_OPS}.quantization.fp8_kernel"]
        fp8._per_token_group_quant_8bit = ReportingKernel("_per_token_group_quant_8bit",
                                                          fp8._per_token_group_quant_8bit, _ACTIVE)
        self.installed = self.modules.installed
        if not cuda:  # the fallback still aligns with the +1-bucket op: the name its file imports on a GPU
            self.modules[f"{_MOE}.moe_align_block_size"].sgl_moe_align_block_size = moe_align_block_size


class _OnceLogger(logging.LoggerAdapter):
    """A module's logger with SGLang's warning_once: each message logged at most once."""

    def __init__(self, logger: logging.Logger):
        super().__init__(logger, {})
        self._seen: set = set()

    def warning_once(self, msg, *args, **kwargs) -> None:
        if msg not in self._seen:
            self._seen.add(msg)
            self.warning(msg, *args, **kwargs)


class RunReporter:
    """One run's launch reporting: vocabulary names and stages from the tensors each launch touches."""

    def __init__(self, impl: SglangTritonMoE, problem, recorder):
        self.impl, self.problem, self.recorder = impl, problem, recorder
        self.kernels: list[str] = []
        self.routing: dict[str, torch.Tensor] = {}
        self.gate_up: torch.Tensor | None = None
        self.down_output: torch.Tensor | None = None
        self.activated = False

    def _launch(self, stage, kernel, grid, reads, writes, run):
        self.kernels.append(kernel)
        if self.recorder is None:
            return run()
        info = LaunchInfo(stage=stage, kernel=kernel, grid=tuple(grid), reads=reads, writes=writes)
        self.recorder.before_launch(info)
        result = run()
        self.recorder.after_launch(info)
        return result

    def _quant_names(self, x):
        if x.data_ptr() == self.problem.hidden_states.data_ptr():
            return Stages.QUANT_INPUT, B.HIDDEN_STATES, B.QUANTED_GATE_UP_INPUT, B.QUANTED_GATE_UP_INPUT_SCALES
        self._host_activation(x)
        return Stages.QUANT_DOWN_INPUT, B.ACTIVATION_OUTPUT, B.QUANTED_DOWN_INPUT, B.QUANTED_DOWN_INPUT_SCALES

    def op(self, op, reads, writes, compute):
        kernel = f"{op} (diffmoe torch stand-in)"
        if op == "moe_align_block_size":
            self.routing = {B.SORTED_TOKEN_IDS: writes["sorted_token_ids"], B.EXPERT_IDS: writes["expert_ids"],
                            B.NUM_TOKENS_POST_PADDED: writes["num_tokens_post_padded"]}
            return self._launch(Stages.ALIGN, kernel, (1,), {B.TOPK_IDS: reads["topk_ids"]}, dict(self.routing), compute)
        if op == "silu_and_mul":
            self.activated = True
            return self._launch(Stages.ACTIVATION, kernel, (reads["input"].shape[0],),
                                {B.GATE_UP_OUTPUT: reads["input"]}, {B.ACTIVATION_OUTPUT: writes["output"]}, compute)
        stage, x, codes, scales = self._quant_names(reads["input"])
        return self._launch(stage, kernel, (reads["input"].shape[0],), {x: reads["input"]},
                            {codes: writes["output"], scales: writes["scale"]}, compute)

    def launch(self, kernel: str, grid, args: dict, run, jit=None):
        p, cfg = self.problem, self.impl.config
        grid = launch_grid(jit, grid, args)
        if kernel == "_per_token_group_quant_8bit":  # the fallback's Triton group quant
            stage, x, codes, scales = self._quant_names(args["y_ptr"])
            return self._launch(stage, kernel, grid, {x: args["y_ptr"]}, {codes: args["y_q_ptr"], scales: args["y_s_ptr"]}, run)
        first = args["b_ptr"].data_ptr() == p.w1.data_ptr()
        if first:
            stage, a_name, s_name, w, w_scale, out = (Stages.GATE_UP_GEMM, B.QUANTED_GATE_UP_INPUT,
                                                      B.QUANTED_GATE_UP_INPUT_SCALES, B.W1, B.W1_SCALE, B.GATE_UP_OUTPUT)
            if not cfg.is_fp8:
                a_name = B.HIDDEN_STATES
            self.gate_up = args["c_ptr"].view(-1, args["c_ptr"].shape[-1])
        else:
            self._host_activation(args["a_ptr"])
            self.down_output = args["c_ptr"].view(-1, args["c_ptr"].shape[-1])
            stage, a_name, s_name, w, w_scale, out = (Stages.DOWN_GEMM, B.QUANTED_DOWN_INPUT, B.QUANTED_DOWN_INPUT_SCALES,
                                                      B.W2, B.W2_SCALE, B.DOWN_OUTPUT)
            if not cfg.is_fp8:
                a_name = B.ACTIVATION_OUTPUT
        reads = {a_name: args["a_ptr"], w: args["b_ptr"], **self.routing}
        if args.get("a_scale_ptr") is not None:
            reads[s_name] = args["a_scale_ptr"]
        if args.get("b_scale_ptr") is not None:
            reads[w_scale] = args["b_scale_ptr"]
        if args.get("MUL_ROUTED_WEIGHT"):
            reads[B.TOPK_WEIGHTS] = args["topk_weights_ptr"]
        c = args["c_ptr"]
        writes = {out: c.view(-1, c.shape[-1])}
        if first or self.impl.routed_scaling_factor is None:
            return self._launch(stage, kernel, grid, reads, writes, run)
        # make_scaled: the down GEMM stores its rows times the weights divided by the factor, not the
        # vocabulary's down_output (the product with the router weights): a private buffer here, and its
        # product with the factor, exact (a power of two), is reported as down_output right after it
        store = c.view(-1, c.shape[-1])
        result = self._launch(stage, kernel, grid, reads, {SCALED_DOWN_OUTPUT: store}, run)
        scaled = torch.empty_like(store)
        self.down_output = scaled
        self._launch(stage, "down_output = the store times routed_scaling_factor (diffmoe, exact)", (store.shape[0],),
                     {SCALED_DOWN_OUTPUT: store}, {B.DOWN_OUTPUT: scaled},
                     lambda: torch.mul(store, self.impl.routed_scaling_factor, out=scaled))
        return result

    def _host_activation(self, activation_output):
        """The fallback's activation is torch code in fused_moe.py between the launches: reported as
        the activation, reading the gate/up GEMM's output and writing `activation_output`, before the
        first launch that reads it."""
        if not self.activated:
            self.activated = True
            self._launch(Stages.ACTIVATION, "silu * up (SGLang fused_moe.py host code, torch)", (1,),
                         {B.GATE_UP_OUTPUT: self.gate_up}, {B.ACTIVATION_OUTPUT: activation_output}, lambda: None)

    def finish(self, output, down_output) -> torch.Tensor:
        """fused_moe.py's combine over top-k (host code, or moe_sum_reduce inside it): the reduce. At
        K = 1 there is none: the down GEMM stored fused_experts' result itself, so the adapter's copy
        of it is reported as the reduce (the output is then judged apart from down_output)."""
        if self.impl.config.topk == 1 and self.impl.routed_scaling_factor is None:
            result = torch.empty_like(output)
            return self._launch(Stages.REDUCE, "copy of the down GEMM's store (diffmoe, K = 1)", (output.shape[0],),
                                {B.DOWN_OUTPUT: down_output}, {B.OUTPUT: result}, lambda: result.copy_(output))
        self._launch(Stages.REDUCE, "combine over top-k (SGLang fused_moe.py host code)", (output.shape[0],),
                     {B.DOWN_OUTPUT: down_output}, {B.OUTPUT: output}, lambda: None)
        return output


def branch_supports(cuda: bool = True) -> Supports:
    """What the adapter runs of the CUDA branch (or the fallback): the factory's `supports`, and its
    check (diffmoe.adapters.kit.Supports)."""
    name = "SGLang's Triton fused MoE" + ("" if cuda else " (non-CUDA fallback)")
    return Supports(
        name,
        Rule("fused", (False,), "its path has no fused activation + quant (silu_and_mul writes intermediate_cache2 "
                                "in bf16, the down call quantises it)"),
        *(() if cuda else (Rule("quant", ("bf16", "fp8-block"), "its scaled_fp8_quant calls the CUDA/JIT per-tensor "
                                "and per-token ops, which the fallback does not import"),)),
        *(Rule(f, refused=(QUANT_BLOCK,), when=lambda c: c.quant == "fp8-block", condition="quant='fp8-block'",
               why="a whole-row group goes to SGLang's per-token quant (sglang_per_token_group_quant_fp8), whose "
                   "rounding the group profile does not describe") for f in ("hidden", "inter")),
        Rule("router_weight", ("down",), "on the input SGLang multiplies the gate/up GEMM's accumulator, a rounding "
                                         "point no profile names"),
        Rule("output", ("separate",), "fused_experts returns a fresh tensor"),
        Rule("expert_map", why="fused_experts takes local expert ids (expert parallelism maps them before it)"),
        Rule("activation", ("silu",), "the adapter runs SGLang's SwiGLU path"),
        Rule("swiglu_limit", why="its clamped SwiGLU is DeepSeek V4's path (swiglu_limit == 10 only, act_and_mul_triton)"),
        Rule("dropped_slots", why="fused_experts is called without -1 ids (its expert filter is off when every expert "
                                  "is local)"),
        Rule("weight_scales", why="SGLang's one flag per_channel_quant gives per-token activations per-channel weights, "
                                  "and per-tensor activations per-tensor weights (invoke_fused_moe_kernel, "
                                  "fused_moe_kernel): per-tensor weights beside per-token activations is no call its "
                                  "path takes"),
        Rule("routed_scaling_factor", why="the adapter's moe runner config passes routed_scaling_factor=None; SGLang's "
                                          "combine takes one, not wired yet"),
    )


SUPPORTS = {True: branch_supports(True), False: branch_supports(False)}  # by branch (cuda)


def check_supported(config: MoEConfig, cuda: bool = True) -> None:
    """ValueError naming the field for what the adapter does not run, and why."""
    SUPPORTS[cuda].check(config)


class SglangTritonMoE(SelfAllocatingPeer):
    """SGLang's fused_experts behind diffmoe's plug-in contract (diffmoe.contract)."""

    reporter_class = RunReporter
    active = _ACTIVE
    release: Release
    cuda: bool
    # make_scaled's factor (ROUTED_SCALING_FACTOR), passed to fused_experts with the router weights divided by it;
    # None: the layer's default, no scaling
    routed_scaling_factor: float | None = None
    # a tile config forced through SGLang's own override (override_config: both GEMM launches take it), None for
    # the release's own choice (its shipped files, else get_default_config): with_tile_config
    tile_config: dict | None = None

    def __init__(self, config, device=None):
        self.name = f"sglang-{self.release.version}" + ("" if self.cuda else "-fallback")
        self.files_class = types.SimpleNamespace(get=lambda device: SglangFiles.get(self.release.peer, self.cuda))
        super().__init__(config, device)

    def check_supported(self, config) -> None:  # noqa: D102 - SelfAllocatingPeer's hook
        check_supported(config, self.cuda)

    def call(self, problem) -> torch.Tensor:
        with torch.compiler.set_stance("force_eager"), override_config(self.tile_config):
            out = self.files.fused_moe.fused_experts(**self.fused_experts_kwargs(problem))
        return _ACTIVE.reporter.finish(out, _ACTIVE.reporter.down_output)

    def runner_config(self) -> types.SimpleNamespace:
        """The MoeRunnerConfig fields fused_experts reads, as FusedMoE (fused_moe_triton/layer.py) fills them for a
        model without expert parallelism; every other field at MoeRunnerConfig's default (moe_runner/base.py),
        except `inplace`: False, so that the problem's hidden states are never overwritten (the layer's default
        writes the result over them; the kernels and their order are the same)."""
        cfg = self.config
        return types.SimpleNamespace(
            num_experts=cfg.num_experts, num_local_experts=cfg.num_experts, inplace=False, no_combine=False,
            activation="silu", is_gated=True, apply_router_weight_on_input=False,
            routed_scaling_factor=self.routed_scaling_factor, gemm1_alpha=None, gemm1_beta=None,
            gemm1_clamp_limit=None, swiglu_limit=None, gate_up_interleaved=True, no_combine_keep_router_weight=False)

    def fused_experts_kwargs(self, problem) -> dict:
        """fused_experts' keywords as the Triton runner passes them (fused_experts_none_to_triton in
        moe_runner/triton.py), from the quant info its quant method builds (peers/call_sites.py reads both):
        Fp8MoEMethod for per-tensor and 128-block FP8 (no per_channel_quant; block_shape its weight_block_size),
        W8A8FP8MoEMethod for per-channel weights (per_channel_quant=True), dynamic activations (a13_scale None),
        no biases, zero points or pre-quantised input. The adapter passed only some of them, positionally, before."""
        cfg = self.config
        return dict(
            hidden_states=problem.hidden_states, w1=problem.w1, w2=problem.w2,
            # StandardTopKOutput (topk_weights, topk_ids, router_logits): SGLang's top-k writes int32 ids
            topk_output=(self._router_weights(problem), problem.topk_ids.to(torch.int32), None),
            moe_runner_config=self.runner_config(), b1=None, b2=None, use_fp8_w8a8=cfg.is_fp8, use_int8_w8a8=False,
            use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=cfg.quant == "fp8-token",
            w1_scale=problem.w1_scale, w2_scale=problem.w2_scale, w1_zp=None, w2_zp=None, a1_scale=None, a2_scale=None,
            block_shape=[QUANT_BLOCK, QUANT_BLOCK] if cfg.quant == "fp8-block" else None, a1_q=None,
            fuse_swiglu_interleaved=False)

    def _router_weights(self, problem) -> torch.Tensor:
        """The top-k weights fused_experts is given: the problem's, divided by the routed scaling factor
        when there is one, so that its product with the factor in the combine is the problem's MoE.
        The factor is a power of two (ROUTED_SCALING_FACTOR): the division, the down GEMM's product and
        the combine's multiplication are exact, so the reference's bits stay the right answer."""
        if self.routed_scaling_factor is None:
            return problem.topk_weights
        return problem.topk_weights / self.routed_scaling_factor

    def check_launches(self, reporter) -> None:
        gemms = reporter.kernels.count("fused_moe_kernel")
        if gemms != 2:
            raise RuntimeError(f"SGLang's fused_experts launched {reporter.kernels}; the adapter expects two fused_moe_kernel launches")


# make_scaled's routed_scaling_factor: not 1, so fused_experts takes its scaling combine (SGLang PR #40187 is
# about top-1 there); a power of two, so dividing the router weights by it and scaling back is exact in
# every format the path rounds to (bf16, fp32), short of subnormals the generated weights do not reach
ROUTED_SCALING_FACTOR = 2.0
SCALED_DOWN_OUTPUT = B.private("down_output_over_routed_scaling_factor")  # make_scaled's down GEMM store


def factory(release: Release, cuda: bool, module: str = "peers.sglang", scaled: bool = False):
    """The factory of one release and branch (peers/sglang exports them: make_V, make_fallback_V), and
    with `scaled` the CUDA branch called with routed_scaling_factor=ROUTED_SCALING_FACTOR (make_scaled_V)."""
    suffix = ("" if cuda else "_fallback") + ("_scaled" if scaled else "")
    cls = type(f"SglangTritonMoE_{release.version.replace('.', '_')}{suffix}", (SglangTritonMoE,),
               {"release": release, "cuda": cuda, "__module__": module,
                "routed_scaling_factor": ROUTED_SCALING_FACTOR if scaled else None})

    def make(config: MoEConfig, device=None) -> SglangTritonMoE:
        return cls(config, device)

    make.__module__ = module
    make.__name__ = make.__qualname__ = ("make" if cuda else "make_fallback") + ("_scaled" if scaled else "")  # the spec a replay line names
    make.numerics = "sglang" if cuda else "sglang_fallback"  # diffmoe.contract.NUMERICS
    make.supports = SUPPORTS[cuda]  # diffmoe.contract.SUPPORTS
    make.batch_invariant = False  # diffmoe.contract.BATCH_INVARIANT: the tile config follows the token count
    make.peer_wheel = release.peer  # diffmoe.contract.PEER_WHEEL: the CLI checks the cache before a run
    make.release = release
    if cuda and not scaled:
        # diffmoe tuned-configs (diffmoe/tuned_configs/): the folder of the wheel's tuned tile configs and this
        # factory with one forced through SGLang's override_config
        make.tuned_config_dir = TUNED_CONFIG_DIR
        make.with_tile_config = lambda tile_config: _forced(cls, make, tile_config)
    return make


# where each release's wheel keeps the tuned tile configs (one folder per Triton version: triton_3_4_0/...)
TUNED_CONFIG_DIR = "sglang/srt/layers/moe/moe_runner/triton_utils/configs"


def _forced(cls, base, tile_config: dict | None):
    """`base` (a release's make) building instances that run with `tile_config` forced."""
    forced = type(cls.__name__ + "_tuned", (cls,), {"tile_config": None if tile_config is None else dict(tile_config),
                                                    "__module__": cls.__module__})

    def make(config: MoEConfig, device=None) -> SglangTritonMoE:
        return forced(config, device)

    for name in ("numerics", "supports", "batch_invariant", "release", "peer_wheel"):
        setattr(make, name, getattr(base, name))
    make.__module__, make.__qualname__ = base.__module__, "make.with_tile_config"
    make.tile_config = tile_config
    return make
