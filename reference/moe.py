"""The reference MoE: plain PyTorch, a fresh tensor per stage, every intermediate returned.

Slow and obviously right. Every place where two correct kernels may round differently is a named
rounding point, and the config's numerics profile (config.numerics_profile: "diffmoe", "vllm",
"liger", "lmdeploy", or one of them with +point=choice overrides) picks one choice at each:
diffmoe.problem.numerics holds the points, their menus and the profiles as data,
reference/rounding/ one function per choice, citing where it is seen. This module composes them
(quantize_activation: amax -> scale -> codes -> NaN code; silu_and_mul: clamp -> silu -> rounding)
and calls every point through the profile, never by a profile's name.
diffmoe's numerics are the ones DESIGN.md states as vLLM's:
  * dynamic activation quantisation: per tensor and per token, scale = max(amax / 448,
    1 / (448 * 512)); per 1x128 group, scale = max(amax, 1e-10) / 448; codes = cast(clamp(x /
    scale, -448, 448)) with torch's round-to-nearest-even cast to float8_e4m3fn;
  * GEMMs dequantise codes to float32 (code * scale) and accumulate in float32, then round to bf16;
  * silu_and_mul in float32: silu(gate) * up, rounded to bf16 before it is quantised, so the
    fused and unfused flags give the same `quanted_down_input` bit for bit; with
    `swiglu_limit` the gate is clamped to max=limit and up to [-limit, limit] first (float32
    clamps of the bf16 values, as vLLM 0.33's swiglu_limit_func);
  * router weight multiplied in float32 before the bf16 rounding of the down GEMM output (or
    into the hidden states, when router_weight='input');
  * reduce: a float32 sum over k in order 0..K-1, rounded to bf16; with `routed_scaling_factor`
    (DeepSeek-style models) the float32 sum is multiplied by float32(factor) before that rounding,
    as SGLang 0.5.23's moe_sum_reduce_triton.
  * weights at their own granularity (`weight_scales`: per tensor beside per-token activations is
    vLLM 0.33's (kFp8StaticTensorSym, kFp8DynamicTokenSym)): dequantised by the weight layout, the
    activations by quant's scaling unit.

Inputs outside the generated ranges, decided here because the reference is the spec:
  * NaN or Inf in hidden_states propagate by plain IEEE arithmetic, nothing is clamped or
    sanitised. FP8 schemes: a NaN makes the amax of its scaling unit (the token's row per
    token, its 1x128 group per group, the whole tensor per tensor) NaN, so that unit's scale
    and every code in it are NaN (torch casts NaN to the e4m3fn NaN code); an Inf makes the
    unit's scale Inf, the Inf element's code NaN (Inf / Inf) and every other code 0, and
    dequantising gives 0 * Inf = NaN. Either way every gate_up_output row fed by the unit is
    NaN, hence the token's down_output rows and its output row are NaN (per tensor, where
    one scale covers every token: every output). Other tokens are untouched. bf16: an Inf gives +-Inf products, NaN where
    opposite infinities meet or silu(-Inf) = -Inf * 0, and the output row holds NaN and/or
    Inf. The optimized path must produce the same values; NaN payloads and signs are not
    part of the contract (the compare treats any NaN as equal to any NaN). Under the vllm
    profile the FP8 quantisations do what vLLM's do instead (amax=drop_nan, *_nan_code=pos_max or
    neg_max): a NaN is dropped from its unit's amax and its own code is +-448, so its token's
    outputs are finite.
  * A zero-token call (T = 0, `make_problem(config, num_tokens=0)`) returns a [0, H] output
    and empty intermediates; a per-tensor scale of an empty activation is the floor
    (the amax of nothing is 0; under the vllm profile, which has no floor there, it is 0).
  * Rows routed to experts the expert map sends elsewhere (-1) produce exact zeros; when
    every chosen expert is remote (skew "all-remote"), the whole output is exactly +0.
    A dropped slot (topk_ids -1, `dropped_slots`) is the same: its rows are exact zeros,
    whatever its router weight and its token's values (vLLM's align skips ids < 0).
  * Shared experts fused into the routed set (`shared_experts`) are ordinary experts here.

Owns the reference's stages. Must not import Triton, the optimized path or the harness's oracles.
"""

from __future__ import annotations

import torch

from diffmoe.problem.config import QUANT_BLOCK, MoEConfig
from diffmoe.contract import RunResult
from diffmoe.problem.inputs import Problem
from diffmoe.problem.vocabulary import Buffers, Stages, materialised_buffers, pipeline_stages

from .rounding import gemm_reduce as gr
from .rounding.gemm_reduce import dequantize_activation, dequantize_weight, expert_gemm  # noqa: F401 - the reference's API
from .rounding.points import Rounding, rounding


def _rounding(cfg: MoEConfig) -> Rounding:
    return rounding(cfg.numerics_profile)


def quantize_activation(x: torch.Tensor, quant: str, r: Rounding | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic FP8 quantisation of a [R, C] activation: (codes [R, C] fp8, scales fp32 [1], [R, 1] or
    [R, C/128]), through the profile's points for quant's scaling unit: amax, then the scale,
    the codes before the clamp, the clamp and the cast (diffmoe's profile when r is None)."""
    r = r or rounding(None)
    xf = x.float()  # [R, C]
    rows, cols = xf.shape
    if quant == "fp8-tensor":
        units, scale_shape = xf.reshape(1, 1, xf.numel()), (1,)  # one unit
    elif quant == "fp8-token":
        units, scale_shape = xf.reshape(rows, 1, cols), (rows, 1)  # a unit per row
    elif quant == "fp8-block":
        units, scale_shape = xf.reshape(rows, cols // QUANT_BLOCK, QUANT_BLOCK), (rows, cols // QUANT_BLOCK)  # R may be 0
    else:
        raise ValueError(f"quant must be an fp8 scheme, got {quant!r}")
    # [R, U, 1]; the amax of no element (a zero-token call's tensor) is 0
    amax = r.fn("amax")(units) if units.shape[2] else units.new_zeros(1, 1, 1)
    scale, floored = r.unit_fn("scale", quant)(amax)
    codes = r.unit_fn("nan_code", quant)(r.unit_fn("codes", quant)(units, scale, floored))
    return codes.reshape(xf.shape), scale.reshape(scale_shape)


def silu_and_mul(gate_up: torch.Tensor, limit: float | None = None, r: Rounding | None = None) -> torch.Tensor:
    """silu(gate) * up, rounded to bf16: [R, 2I] (bf16, or the float32 product) -> [R, I], through the
    profile's swiglu_clamp, silu and silu_rounding points (diffmoe's when r is None: silu(gate) * up
    in float32, rounded once; with a SwiGLU limit, gate = min(gate, limit) and up = clamp(up, -limit,
    limit) first, as vLLM 0.33's swiglu_limit_func)."""
    r = r or rounding(None)
    i = gate_up.shape[1] // 2
    gate, up = r.fn("swiglu_clamp")(gate_up[:, :i], gate_up[:, i:], limit)  # [R, I] fp32 each
    return r.fn("silu_rounding")(r.fn("silu")(gate), up)  # [R, I] bf16


def _gemm(codes_or_values: torch.Tensor, a_scale: torch.Tensor | None, local_ids: torch.Tensor, w: torch.Tensor,
          w_scale: torch.Tensor | None, cfg: MoEConfig) -> torch.Tensor:
    """A routed [R, K] activation (bf16 values, or FP8 codes with their scales) times each row's
    expert weight, float32; FP8 as the profile's fp8_gemm point multiplies."""
    if not cfg.is_fp8:
        return expert_gemm(codes_or_values.float(), local_ids, w.float())
    return _rounding(cfg).fn("fp8_gemm")(codes_or_values, a_scale, local_ids, w, w_scale, cfg.scale_schemes)


def _weighted_input(x: torch.Tensor, weights: torch.Tensor, cfg: MoEConfig) -> torch.Tensor:
    """The hidden states times the router weight (router_weight='input', K == 1), as bf16."""
    return _rounding(cfg).fn("input_weight")(x, weights)


def _activation(given: dict[str, torch.Tensor], problem: Problem) -> torch.Tensor:
    """The activation of the gate/up values the profile's activation_input point reads: [TK, I] bf16."""
    r = _rounding(problem.config)
    values = r.fn("activation_input")(given.get(Buffers.GATE_UP_OUTPUT), lambda: _gate_up_product(given, problem))
    return silu_and_mul(values, problem.config.swiglu_limit, r)


def local_expert_ids(problem: Problem) -> torch.Tensor:
    """[TK] local expert of each routed row (row t*K + k), -1 where the expert is not local."""
    ids = problem.topk_ids.long().flatten()  # [TK] global ids
    unrouted = (ids < 0) | (ids >= problem.config.num_experts)  # a -1 slot: no expert computes it
    if problem.expert_map is not None:
        ids = problem.expert_map.long()[ids.clamp(0, problem.config.num_experts - 1)]  # [TK]
    return ids.masked_fill(unrouted, -1)


def reference_stage(stage: str, inputs: dict[str, torch.Tensor], problem: Problem) -> dict[str, torch.Tensor]:
    """One stage of the pipeline on given inputs: the buffers it reads (vocabulary names; what
    `inputs` lacks comes from the problem), into fresh tensors. The harness runs it on a
    candidate's own intermediates, so each stage is judged without carrying error forward."""
    cfg = problem.config
    r = _rounding(cfg)
    q = cfg.quant
    b = Buffers
    t, k = problem.topk_ids.shape  # T, K
    given = {**problem.inputs(), **inputs}
    if stage == Stages.QUANT_INPUT:
        x = given[b.HIDDEN_STATES]  # [T, H] bf16
        if cfg.router_weight == "input":
            x = _weighted_input(x, given[b.TOPK_WEIGHTS], cfg)  # [T, H] (K == 1)
        codes, scale = quantize_activation(x, q, r)  # [T, H] fp8, scales
        return {b.QUANTED_GATE_UP_INPUT: codes, b.QUANTED_GATE_UP_INPUT_SCALES: scale}
    if stage == Stages.GATE_UP_GEMM:
        return {b.GATE_UP_OUTPUT: _gate_up_product(given, problem).to(torch.bfloat16)}  # [TK, 2I] bf16
    if stage == Stages.ACTIVATION:
        return {b.ACTIVATION_OUTPUT: _activation(given, problem)}  # [TK, I] bf16
    if stage == Stages.ACT_QUANT:
        # the chain quantises the activation the unfused pipeline computes: the same codes either way
        # (fused_act_quant=chain); vLLM's fused op quantises the float32 activation instead (fp32_block)
        def chain() -> tuple[torch.Tensor, torch.Tensor]:
            return quantize_activation(_activation(given, problem), q, r)

        codes, scale = r.fn("fused_act_quant")(given[b.GATE_UP_OUTPUT], q, cfg.swiglu_limit, chain)  # [TK, I] fp8
        return {b.QUANTED_DOWN_INPUT: codes, b.QUANTED_DOWN_INPUT_SCALES: scale}
    if stage == Stages.QUANT_DOWN_INPUT:
        codes, scale = quantize_activation(given[b.ACTIVATION_OUTPUT], q, r)  # [TK, I] fp8, scales
        return {b.QUANTED_DOWN_INPUT: codes, b.QUANTED_DOWN_INPUT_SCALES: scale}
    if stage == Stages.DOWN_GEMM:
        if cfg.is_fp8:
            a2, a2_scale = given[b.QUANTED_DOWN_INPUT], given[b.QUANTED_DOWN_INPUT_SCALES]
        else:
            a2, a2_scale = given[b.ACTIVATION_OUTPUT], None  # [TK, I] bf16
        down = _gemm(a2, a2_scale, local_expert_ids(problem), problem.w2, problem.w2_scale, cfg)  # [TK, H] fp32
        if cfg.router_weight == "down" and r.weighs_in_down_gemm:
            down = down * given[b.TOPK_WEIGHTS].reshape(-1, 1)  # [TK, H] weighted, before the rounding
        return {b.DOWN_OUTPUT: down.to(torch.bfloat16)}  # [TK, H] bf16
    if stage == Stages.REDUCE:
        rows = given[b.DOWN_OUTPUT].view(t, k, cfg.hidden)  # [T, K, H]; H spelled out: -1 is ambiguous at T = 0
        if cfg.router_weight == "down":  # the weight where the profile's router_weight point puts it
            rows = r.fn("router_weight")(rows, given[b.TOPK_WEIGHTS].view(t, k))
        # [T, H] bf16, summed in k order, times routed_scaling_factor before the last rounding
        return {b.OUTPUT: r.fn("reduce")(rows, cfg.routed_scaling_factor)}
    raise ValueError(f"stage must be one of {[s.name for s in pipeline_stages(cfg)]}, got {stage!r}")


def gemm_exact(stage: str, inputs: dict[str, torch.Tensor], problem: Problem) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A GEMM stage (gate_up_gemm or down_gemm) on given inputs, in float64: the value of each
    output's dot product [R, N] (the router weight applied where the profile applies it in the
    GEMM), the sum of its terms' magnitudes [R, N], and the contraction length (H or I). Every
    term is exact in float64 up to one rounding (an e4m3 code times a float32 scale is exact; the
    product of two such values keeps 56 bits). The derived GEMM rule (diffmoe.tolerance.gemm_interval)
    bounds any float32 evaluation of the dot by these."""
    cfg = problem.config
    b = Buffers
    k = problem.topk_ids.shape[1]
    given = {**problem.inputs(), **inputs}
    weights = None
    if stage == Stages.GATE_UP_GEMM:
        if cfg.is_fp8:
            a_scale = given[b.QUANTED_GATE_UP_INPUT_SCALES]
            if cfg.quant != "fp8-tensor":
                a_scale = a_scale.repeat_interleave(k, dim=0)  # one row of scales per routed row
            a = gr.dequantize_activation(given[b.QUANTED_GATE_UP_INPUT].repeat_interleave(k, dim=0), a_scale, cfg.quant,
                                         torch.float64)
        else:
            x = given[b.HIDDEN_STATES]
            if cfg.router_weight == "input":
                x = _weighted_input(x, given[b.TOPK_WEIGHTS], cfg)  # the profile's bf16 rounding point
            a = x.repeat_interleave(k, dim=0).double()  # [TK, H]
        w = gr.dequantize_weight(problem.w1, problem.w1_scale, cfg.weight_scheme, torch.float64)
    elif stage == Stages.DOWN_GEMM:
        if cfg.is_fp8:
            a = gr.dequantize_activation(given[b.QUANTED_DOWN_INPUT], given[b.QUANTED_DOWN_INPUT_SCALES], cfg.quant,
                                         torch.float64)
        else:
            a = given[b.ACTIVATION_OUTPUT].double()  # [TK, I]
        w = gr.dequantize_weight(problem.w2, problem.w2_scale, cfg.weight_scheme, torch.float64)
        if cfg.router_weight == "down" and _rounding(cfg).weighs_in_down_gemm:
            weights = given[b.TOPK_WEIGHTS].reshape(-1, 1).double()  # [TK, 1]
    else:
        raise ValueError(f"stage must be {Stages.GATE_UP_GEMM!r} or {Stages.DOWN_GEMM!r}, got {stage!r}")
    ids = local_expert_ids(problem)
    exact = torch.zeros(a.shape[0], w.shape[1], dtype=torch.float64, device=a.device)  # [R, N]
    magnitude = torch.zeros_like(exact)
    for e in range(w.shape[0]):
        rows = (ids == e).nonzero().flatten()
        exact[rows] = a[rows] @ w[e].T
        magnitude[rows] = a[rows].abs() @ w[e].abs().T
    if weights is not None:
        exact, magnitude = exact * weights, magnitude * weights.abs()
    return exact, magnitude, a.shape[1]


def _gate_up_product(given: dict[str, torch.Tensor], problem: Problem) -> torch.Tensor:
    """The gate/up GEMM of the routed rows in float32, before its bf16 rounding: [TK, 2I]."""
    cfg = problem.config
    b = Buffers
    k = problem.topk_ids.shape[1]
    a1, a1_scale = given[b.HIDDEN_STATES], None  # [T, H] bf16
    if cfg.is_fp8:
        a1, a1_scale = given[b.QUANTED_GATE_UP_INPUT], given[b.QUANTED_GATE_UP_INPUT_SCALES]
        if cfg.quant != "fp8-tensor":
            a1_scale = a1_scale.repeat_interleave(k, dim=0)  # one row of scales per routed row
    elif cfg.router_weight == "input":
        a1 = _weighted_input(a1, given[b.TOPK_WEIGHTS], cfg)
    a1 = a1.repeat_interleave(k, dim=0)  # [TK, H]: routed row t*K + k reads token t
    return _gemm(a1, a1_scale, local_expert_ids(problem), problem.w1, problem.w1_scale, cfg)  # [TK, 2I] fp32


def reference_moe(problem: Problem) -> RunResult:
    """Run the whole pipeline, stage by stage; every stage writes fresh tensors. The reference
    computes the activation even when the config fuses it away; a fused config's down input is
    the fused stage's (under diffmoe's profile the same bits as quantising the activation)."""
    cfg = problem.config
    stages: dict[str, torch.Tensor] = {}
    for spec in pipeline_stages(cfg.replace(fused=False)):  # the unfused chain holds every buffer
        fused_here = cfg.fused and spec.name == Stages.QUANT_DOWN_INPUT
        stages.update(reference_stage(Stages.ACT_QUANT if fused_here else spec.name, stages, problem))
    # The reference computes everything; it reports what the config's pipeline materialises.
    reported = {name: stages[name] for name in materialised_buffers(cfg)}
    return RunResult(output=stages[Buffers.OUTPUT], intermediates=reported)
