"""Stage and buffer vocabulary shared by the reference, the optimized path and the oracles.

Every buffer name, shape and dtype is spelled here once; nobody else writes a buffer name
as a free string. The pipeline (DESIGN.md) in stage order:

    route -> align -> quant_input -> gate_up_gemm -> activation -> quant_down_input
          -> down_gemm -> reduce              (activation + quant_down_input = act_quant when fused)

Shapes use the letters T, E, K, H, I, TK (see diffmoe.problem.config).

Must not import an implementation: the reference, the optimized path and the oracles all read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from diffmoe.problem.config import QUANT_BLOCK, MoEConfig

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn

# The two shared workspaces, by Placement.workspace index (0 and 1): the plan, the guards and the
# findings name them so.
WORKSPACE_NAMES = ("ws1", "ws2")


def workspace_name(index: int) -> str:
    return WORKSPACE_NAMES[index] if 0 <= index < len(WORKSPACE_NAMES) else f"workspace{index}"


def over_fp8_max(t: torch.Tensor) -> torch.Tensor:
    """t / 448, correctly rounded on every device: every FP8 scale of the reference's profiles and
    of the vLLM stand-ins divides so. torch on CUDA divides by a Python scalar as a multiply by its
    reciprocal: 3.40625 / 448 came out one float32 ulp high on an H200 (bench/gpu_checks.sh,
    2026-12-04); a tensor divisor is a true division there too."""
    return t / torch.full_like(t, FP8_MAX)



class Buffers:
    """Names of every tensor that flows through the pipeline."""

    # problem inputs (owned by the caller, never written)
    HIDDEN_STATES = "hidden_states"  # [T, H] bf16
    TOPK_IDS = "topk_ids"  # [T, K] int32, global expert ids
    TOPK_WEIGHTS = "topk_weights"  # [T, K] fp32
    W1 = "w1"  # [L, 2I, H] fp8 codes (bf16 for the bf16 scheme)
    W1_SCALE = "w1_scale"  # fp32, shape per scheme (weight_scale_shape)
    W2 = "w2"  # [L, H, I]
    W2_SCALE = "w2_scale"
    EXPERT_MAP = "expert_map"  # [E] int32, global -> local or -1

    # intermediates, pipeline order
    QUANTED_GATE_UP_INPUT = "quanted_gate_up_input"  # [T, H] fp8
    QUANTED_GATE_UP_INPUT_SCALES = "quanted_gate_up_input_scales"  # fp32, activation_scale_shape
    GATE_UP_OUTPUT = "gate_up_output"  # [TK, 2I] bf16
    ACTIVATION_OUTPUT = "activation_output"  # [TK, I] bf16
    QUANTED_DOWN_INPUT = "quanted_down_input"  # [TK, I] fp8
    QUANTED_DOWN_INPUT_SCALES = "quanted_down_input_scales"  # fp32
    DOWN_OUTPUT = "down_output"  # [TK, H] bf16
    OUTPUT = "output"  # [T, H] bf16

    # the aligned layout (implementation-private; the reference has no padding)
    SORTED_TOKEN_IDS = "sorted_token_ids"
    EXPERT_IDS = "expert_ids"
    NUM_TOKENS_POST_PADDED = "num_tokens_post_padded"
    # per-program partial amax of a per-tensor quantisation (implementation-private)
    AMAX_PARTIALS = "amax_partials"

    # An implementation's own scratch buffer that has no name here (a peer's sort tables:
    # lmdeploy's per-expert counts, Liger's tile offsets): reported as PRIVATE_PREFIX + its own
    # name, a launch may write it (the contract oracle), the aliasing and extent oracles see its
    # bytes like any buffer's, and no numeric oracle compares it.
    PRIVATE_PREFIX = "private:"

    @classmethod
    def private(cls, name: str) -> str:
        """The reported name of an implementation's own scratch buffer `name`."""
        return cls.PRIVATE_PREFIX + name


class Stages:
    """Names of the pipeline stages (also the names of the optimized path's launches)."""

    ALIGN = "align"
    QUANT_INPUT = "quant_input"
    GATE_UP_GEMM = "gate_up_gemm"
    ACTIVATION = "activation"
    QUANT_DOWN_INPUT = "quant_down_input"
    ACT_QUANT = "act_quant"  # fused activation + quant_down_input
    DOWN_GEMM = "down_gemm"
    REDUCE = "reduce"


INPUT_NAMES = (
    Buffers.HIDDEN_STATES,
    Buffers.TOPK_IDS,
    Buffers.TOPK_WEIGHTS,
    Buffers.W1,
    Buffers.W1_SCALE,
    Buffers.W2,
    Buffers.W2_SCALE,
)

# Scale tensors belong to the codes they scale; oracles report them under the codes' stage.
SCALES_OF = {
    Buffers.QUANTED_GATE_UP_INPUT: Buffers.QUANTED_GATE_UP_INPUT_SCALES,
    Buffers.QUANTED_DOWN_INPUT: Buffers.QUANTED_DOWN_INPUT_SCALES,
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize  # no tensor built: the plan tier asks ~10^4 times a second


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage: the buffers it reads and the buffers it writes."""

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]


def activation_scale_shape(config: MoEConfig, rows: int, cols: int) -> tuple[int, ...]:
    """Scales of a dynamically quantised [rows, cols] activation."""
    if config.quant == "fp8-tensor":
        return (1,)
    if config.quant == "fp8-token":
        return (rows, 1)
    if config.quant == "fp8-block":
        return (rows, cols // QUANT_BLOCK)
    raise ValueError(f"quant={config.quant!r} has no activation scales")


def weight_scale_shape(config: MoEConfig, experts: int, n: int, k: int) -> tuple[int, ...]:
    """Scales of an [experts, n, k] FP8 weight: per tensor (per expert), per output channel, or 128x128 blocks
    (the config's weight granularity, `weight_scheme`)."""
    if config.weight_scheme == "fp8-tensor":
        return (experts,)
    if config.weight_scheme == "fp8-token":
        return (experts, n)
    if config.weight_scheme == "fp8-block":
        return (experts, math.ceil(n / QUANT_BLOCK), math.ceil(k / QUANT_BLOCK))
    raise ValueError(f"quant={config.quant!r} has no weight scales")


def buffer_spec(config: MoEConfig, name: str, num_tokens: int | None = None) -> TensorSpec:
    """Shape and dtype of an intermediate buffer for `num_tokens` tokens (default: config's T)."""
    t = config.num_tokens if num_tokens is None else num_tokens
    tk, h, i = t * config.topk, config.hidden, config.inter
    # one branch per buffer, only the one asked built (the plan tier calls this per buffer per config)
    if name == Buffers.QUANTED_GATE_UP_INPUT:
        shape, dtype = (t, h), FP8_DTYPE
    elif name == Buffers.GATE_UP_OUTPUT:
        shape, dtype = (tk, 2 * i), torch.bfloat16
    elif name == Buffers.ACTIVATION_OUTPUT:
        shape, dtype = (tk, i), torch.bfloat16
    elif name == Buffers.QUANTED_DOWN_INPUT:
        shape, dtype = (tk, i), FP8_DTYPE
    elif name == Buffers.DOWN_OUTPUT:
        shape, dtype = (tk, h), torch.bfloat16
    elif name == Buffers.OUTPUT:
        shape, dtype = (t, h), torch.bfloat16
    elif name == Buffers.QUANTED_GATE_UP_INPUT_SCALES and config.is_fp8:
        shape, dtype = activation_scale_shape(config, t, h), torch.float32
    elif name == Buffers.QUANTED_DOWN_INPUT_SCALES and config.is_fp8:
        shape, dtype = activation_scale_shape(config, tk, i), torch.float32
    else:
        known = [Buffers.QUANTED_GATE_UP_INPUT, Buffers.GATE_UP_OUTPUT, Buffers.ACTIVATION_OUTPUT, Buffers.QUANTED_DOWN_INPUT,
                 Buffers.DOWN_OUTPUT, Buffers.OUTPUT]
        if config.is_fp8:
            known += [Buffers.QUANTED_GATE_UP_INPUT_SCALES, Buffers.QUANTED_DOWN_INPUT_SCALES]
        raise ValueError(f"{name!r} is not an intermediate buffer of quant={config.quant!r}; known: {sorted(known)}")
    return TensorSpec(name, shape, dtype)


def declared_workspace_buffers(config: MoEConfig) -> list[str]:
    """The buffer list a two-workspace implementation declares, in pipeline order (DESIGN.md table).

    This is the list *before* any planner decision: it still holds `activation_output` when
    the fused flag is on. The final output joins the list when it is carved from ws1.
    """
    if config.is_fp8:
        names = [
            Buffers.QUANTED_GATE_UP_INPUT,
            Buffers.GATE_UP_OUTPUT,
            Buffers.ACTIVATION_OUTPUT,
            Buffers.QUANTED_DOWN_INPUT,
            Buffers.DOWN_OUTPUT,
        ]
    else:
        names = [Buffers.GATE_UP_OUTPUT, Buffers.ACTIVATION_OUTPUT, Buffers.DOWN_OUTPUT]
    if config.output == "workspace":
        names.append(Buffers.OUTPUT)
    return names


def pipeline_stages(config: MoEConfig) -> list[StageSpec]:
    """The stages that run for this config, in order, with what each reads and writes.

    Weights and routing tensors are inputs and are left out of `reads` except where a stage
    reads the router weights (they decide which stage is affected by a placement bug).
    """
    b = Buffers
    stages: list[StageSpec] = []
    weight_on_input = config.router_weight == "input"
    if config.is_fp8:
        reads = (b.HIDDEN_STATES, b.TOPK_WEIGHTS) if weight_on_input else (b.HIDDEN_STATES,)
        stages.append(StageSpec(Stages.QUANT_INPUT, reads, (b.QUANTED_GATE_UP_INPUT, b.QUANTED_GATE_UP_INPUT_SCALES)))
        gemm1_in: tuple[str, ...] = (b.QUANTED_GATE_UP_INPUT, b.QUANTED_GATE_UP_INPUT_SCALES)
    else:
        gemm1_in = (b.HIDDEN_STATES, b.TOPK_WEIGHTS) if weight_on_input else (b.HIDDEN_STATES,)
    stages.append(StageSpec(Stages.GATE_UP_GEMM, gemm1_in, (b.GATE_UP_OUTPUT,)))
    down_in_fp8 = (b.QUANTED_DOWN_INPUT, b.QUANTED_DOWN_INPUT_SCALES)
    if config.fused:
        stages.append(StageSpec(Stages.ACT_QUANT, (b.GATE_UP_OUTPUT,), down_in_fp8))
        gemm2_in: tuple[str, ...] = down_in_fp8
    else:
        stages.append(StageSpec(Stages.ACTIVATION, (b.GATE_UP_OUTPUT,), (b.ACTIVATION_OUTPUT,)))
        if config.is_fp8:
            stages.append(StageSpec(Stages.QUANT_DOWN_INPUT, (b.ACTIVATION_OUTPUT,), down_in_fp8))
            gemm2_in = down_in_fp8
        else:
            gemm2_in = (b.ACTIVATION_OUTPUT,)
    if config.router_weight == "down":
        gemm2_in = gemm2_in + (b.TOPK_WEIGHTS,)
    stages.append(StageSpec(Stages.DOWN_GEMM, gemm2_in, (b.DOWN_OUTPUT,)))
    stages.append(StageSpec(Stages.REDUCE, (b.DOWN_OUTPUT,), (b.OUTPUT,)))
    return stages


def materialised_buffers(config: MoEConfig) -> list[str]:
    """Every intermediate some stage writes, in pipeline order (the final output last)."""
    names: list[str] = []
    for stage in pipeline_stages(config):
        names.extend(n for n in stage.writes if n not in names)
    return names


def producer_stage(config: MoEConfig, buffer: str) -> str:
    """The stage that writes `buffer` for this config."""
    for stage in pipeline_stages(config):
        if buffer in stage.writes:
            return stage.name
    raise ValueError(f"no stage writes {buffer!r} for quant={config.quant!r} fused={config.fused}")
