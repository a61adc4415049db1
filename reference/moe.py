"""The reference MoE: plain PyTorch, a fresh tensor per stage, every intermediate returned.

Slow and obviously right. The config's numerics profile (config.numerics_profile) picks the
rounding: "diffmoe" (below), "vllm", vLLM 0.33.0's own rounding points, which
reference/numerics.py holds, one function each, "liger", Liger-Kernel 0.8.5's
(reference/numerics_liger.py: SwiGLU of the float32 gate/up product, the router weight applied
in the reduce), or "lmdeploy", lmdeploy 0.18.0's blocked-FP8 pipeline
(reference/numerics_lmdeploy.py: reciprocal-product scales, ratio-rescaled accumulation, silu
rounded before the multiply, bf16 weighted reduce), which this module calls at those points.
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
  * reduce: a float32 sum over k in order 0..K-1, rounded to bf16.

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
    profile the FP8 quantisations do what vLLM's do instead (reference/numerics.py): a NaN is
    dropped from its unit's amax and its own code is +-448, so its token's outputs are finite.
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
from diffmoe.adapters.contract import RunResult
from diffmoe.problem.inputs import Problem
from diffmoe.problem.vocabulary import (
    FP8_DTYPE, FP8_MAX, Buffers, Stages, materialised_buffers, over_fp8_max, pipeline_stages,
)

from . import numerics as vllm
from . import numerics_liger as liger
from . import numerics_lmdeploy as lmdeploy

TOKEN_SCALE_FLOOR = 1.0 / (FP8_MAX * 512.0)  # per-tensor and per-token scale floor (vLLM)
GROUP_AMAX_FLOOR = 1e-10  # 1x128 group amax floor (vLLM)


def quantize_activation(x: torch.Tensor, quant: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic FP8 quantisation of a [R, C] activation: (codes [R, C] fp8, scales fp32)."""
    xf = x.float()  # [R, C]
    if quant == "fp8-tensor":
        amax = xf.abs().amax() if xf.numel() else xf.new_zeros(())  # the amax of no element is 0
        scale = over_fp8_max(amax).clamp_min(TOKEN_SCALE_FLOOR).reshape(1)  # [1]
        per_element = scale  # broadcast
    elif quant == "fp8-token":
        scale = over_fp8_max(xf.abs().amax(dim=1, keepdim=True)).clamp_min(TOKEN_SCALE_FLOOR)  # [R, 1]
        per_element = scale
    elif quant == "fp8-block":
        groups = xf.view(xf.shape[0], xf.shape[1] // QUANT_BLOCK, QUANT_BLOCK)  # [R, C/128, 128]
        scale = over_fp8_max(groups.abs().amax(dim=2).clamp_min(GROUP_AMAX_FLOOR))  # [R, C/128]
        per_element = scale.repeat_interleave(QUANT_BLOCK, dim=1)  # [R, C]
    else:
        raise ValueError(f"quant must be an fp8 scheme, got {quant!r}")
    codes = (xf / per_element).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)  # [R, C] fp8, RNE
    return codes, scale


def dequantize_activation(codes: torch.Tensor, scale: torch.Tensor, quant: str,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """float32 (or `dtype`) values of [R, C] codes."""
    if quant == "fp8-block":
        scale = scale.repeat_interleave(QUANT_BLOCK, dim=1)  # [R, C]
    return codes.to(dtype) * scale.to(dtype)  # [R, C]


def dequantize_weight(w: torch.Tensor, scale: torch.Tensor | None, quant: str,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """float32 (or `dtype`) values of [L, N, Kd] weights (bf16 weights are upcast)."""
    if quant == "bf16":
        return w.to(dtype)  # [L, N, Kd]
    if quant == "fp8-tensor":
        scale = scale[:, None, None]  # [L, 1, 1]
    elif quant == "fp8-token":
        scale = scale[:, :, None]  # [L, N, 1]
    else:
        n, kd = w.shape[1:]
        scale = scale.repeat_interleave(QUANT_BLOCK, 1).repeat_interleave(QUANT_BLOCK, 2)[:, :n, :kd]  # [L, N, Kd]
    return w.to(dtype) * scale.to(dtype)  # [L, N, Kd]


def expert_gemm(a: torch.Tensor, local_ids: torch.Tensor, w: torch.Tensor,
                scales: tuple[torch.Tensor, torch.Tensor, str] | None = None, fp8_gemm=vllm.fp8_gemm) -> torch.Tensor:
    """out[r] = a[r] @ w[local_ids[r]].T in float32; rows of non-local experts (-1) stay zero.
    With scales (a_scale, w_scale, quant), a and w are FP8 codes, multiplied as a peer's kernel
    does: `fp8_gemm(a_rows, a_scale_rows, w_e, w_scale_e, quant)` (reference/numerics.fp8_gemm,
    vLLM's; the lmdeploy profile's blocked_gemm)."""
    out = torch.zeros(a.shape[0], w.shape[1], dtype=torch.float32, device=a.device)  # [R, N]
    for e in range(w.shape[0]):
        rows = (local_ids == e).nonzero().flatten()  # routed rows of expert e
        if scales is None:
            out[rows] = a[rows] @ w[e].T  # [rows, N]
        else:
            a_scale, w_scale, quant = scales
            row_scale = a_scale if quant == "fp8-tensor" else a_scale[rows]  # one scale, or one per row
            out[rows] = fp8_gemm(a[rows], row_scale, w[e], w_scale[e], quant)
    return out


def _gemm(codes_or_values: torch.Tensor, a_scale: torch.Tensor | None, local_ids: torch.Tensor, w: torch.Tensor,
          w_scale: torch.Tensor | None, cfg: MoEConfig) -> torch.Tensor:
    """A routed [R, K] activation (bf16 values, or FP8 codes with their scales) times each row's
    expert weight, float32: dequantised first under diffmoe's profile, scaled after the dot under vLLM's."""
    if not cfg.is_fp8:
        return expert_gemm(codes_or_values.float(), local_ids, w.float())
    if _vllm(cfg):
        return expert_gemm(codes_or_values, local_ids, w, (a_scale, w_scale, cfg.quant))
    if _lmdeploy(cfg):
        return expert_gemm(codes_or_values, local_ids, w, (a_scale, w_scale, cfg.quant),
                           lambda a, sa, w, sw, quant: lmdeploy.blocked_gemm(a, sa, w, sw))
    a = dequantize_activation(codes_or_values, a_scale, cfg.quant)
    return expert_gemm(a, local_ids, dequantize_weight(w, w_scale, cfg.quant))


def silu_and_mul(gate_up: torch.Tensor, limit: float | None = None) -> torch.Tensor:
    """silu(gate) * up in float32, rounded to bf16: [R, 2I] -> [R, I]. With a SwiGLU limit,
    gate = min(gate, limit) and up = clamp(up, -limit, limit) first, as vLLM 0.33's
    swiglu_limit_func (fused_moe/utils.py, its torch and pad-aware Triton paths)."""
    i = gate_up.shape[1] // 2
    gate, up = gate_up[:, :i].float(), gate_up[:, i:].float()  # [R, I] fp32 each
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)  # [R, I]; NaN stays NaN
    # silu as its definition, x / (1 + exp(-x)): F.silu is another function (a faster exp inside;
    # 43,917 of 2^20 float32 results differ), and this one is what the kernels compute, so on the
    # interpreter (whose exp is torch's, diffmoe.interpreter.fixes) the fused stage is bitwise
    silu = gate / (1.0 + torch.exp(-gate))  # [R, I] fp32
    return (silu * up).to(torch.bfloat16)  # [R, I] bf16


# ---- the profile's choice at each rounding point (reference/numerics.py: the vllm profile) --------


def _vllm(cfg: MoEConfig) -> bool:
    return cfg.numerics_profile == vllm.PROFILE


def _liger(cfg: MoEConfig) -> bool:
    """reference/numerics_liger.py: SwiGLU of the float32 product, the router weight in the reduce."""
    return cfg.numerics_profile == liger.PROFILE


def _lmdeploy(cfg: MoEConfig) -> bool:
    return cfg.numerics_profile == lmdeploy.PROFILE


def _weighs_in_reduce(cfg: MoEConfig) -> bool:
    """Liger's and lmdeploy's down rows are unweighted: their reduce applies the router weight."""
    return _liger(cfg) or _lmdeploy(cfg)


def _quantize(x: torch.Tensor, cfg: MoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    if _lmdeploy(cfg):
        return lmdeploy.quantize(x)
    return vllm.quantize(x, cfg.quant) if _vllm(cfg) else quantize_activation(x, cfg.quant)


def _silu_and_mul(gate_up: torch.Tensor, cfg: MoEConfig) -> torch.Tensor:
    if _lmdeploy(cfg):
        return lmdeploy.silu_and_mul(gate_up)
    return vllm.silu_and_mul(gate_up, cfg.swiglu_limit) if _vllm(cfg) else silu_and_mul(gate_up, cfg.swiglu_limit)


def _weighted_input(x: torch.Tensor, weights: torch.Tensor, cfg: MoEConfig) -> torch.Tensor:
    """The hidden states times the router weight (router_weight='input', K == 1), as bf16."""
    return vllm.weighted_input(x, weights) if _vllm(cfg) else (x.float() * weights).to(torch.bfloat16)


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
    q = cfg.quant
    b = Buffers
    t, k = problem.topk_ids.shape  # T, K
    given = {**problem.inputs(), **inputs}
    if stage == Stages.QUANT_INPUT:
        x = given[b.HIDDEN_STATES]  # [T, H] bf16
        if cfg.router_weight == "input":
            x = _weighted_input(x, given[b.TOPK_WEIGHTS], cfg)  # [T, H] (K == 1)
        codes, scale = _quantize(x, cfg)  # [T, H] fp8, scales
        return {b.QUANTED_GATE_UP_INPUT: codes, b.QUANTED_GATE_UP_INPUT_SCALES: scale}
    if stage == Stages.GATE_UP_GEMM:
        return {b.GATE_UP_OUTPUT: _gate_up_product(given, problem).to(torch.bfloat16)}  # [TK, 2I] bf16
    if stage == Stages.ACTIVATION and _liger(cfg):
        # Liger's fused kernel: SwiGLU of the float32 product, which the bf16 gate_up_output no longer holds
        return {b.ACTIVATION_OUTPUT: liger.swiglu_of_product(_gate_up_product(given, problem))}  # [TK, I] bf16
    if stage == Stages.ACTIVATION:
        return {b.ACTIVATION_OUTPUT: _silu_and_mul(given[b.GATE_UP_OUTPUT], cfg)}  # [TK, I] bf16
    if stage == Stages.ACT_QUANT and q == "fp8-block" and _vllm(cfg) and cfg.swiglu_limit is None:
        # vLLM's one fused op: the float32 activation, never rounded to bf16, quantised (it takes
        # no clamp: with a limit vLLM 0.31+ runs the clamped silu_and_mul and the group quant, below)
        codes, scale = vllm.silu_and_mul_per_block_quant(given[b.GATE_UP_OUTPUT])  # [TK, I] fp8, scales
        return {b.QUANTED_DOWN_INPUT: codes, b.QUANTED_DOWN_INPUT_SCALES: scale}
    if stage in (Stages.QUANT_DOWN_INPUT, Stages.ACT_QUANT):
        # otherwise, fused or not, the activation is a bf16 tensor first: the same codes either way
        act = given[b.ACTIVATION_OUTPUT] if stage == Stages.QUANT_DOWN_INPUT else _silu_and_mul(given[b.GATE_UP_OUTPUT], cfg)
        codes, scale = _quantize(act, cfg)  # [TK, I] fp8, scales
        return {b.QUANTED_DOWN_INPUT: codes, b.QUANTED_DOWN_INPUT_SCALES: scale}
    if stage == Stages.DOWN_GEMM:
        if cfg.is_fp8:
            a2, a2_scale = given[b.QUANTED_DOWN_INPUT], given[b.QUANTED_DOWN_INPUT_SCALES]
        else:
            a2, a2_scale = given[b.ACTIVATION_OUTPUT], None  # [TK, I] bf16
        down = _gemm(a2, a2_scale, local_expert_ids(problem), problem.w2, problem.w2_scale, cfg)  # [TK, H] fp32
        if cfg.router_weight == "down" and not _weighs_in_reduce(cfg):
            down = down * given[b.TOPK_WEIGHTS].reshape(-1, 1)  # [TK, H] weighted, before the rounding
        return {b.DOWN_OUTPUT: down.to(torch.bfloat16)}  # [TK, H] bf16
    if stage == Stages.REDUCE:
        per_token = given[b.DOWN_OUTPUT].view(t, k, cfg.hidden)  # [T, K, H]; H spelled out: -1 is ambiguous at T = 0
        if _vllm(cfg):
            summed = vllm.moe_sum(per_token) if k in vllm.BF16_SUM_TOPK else vllm.sum_from_zero(per_token)
            return {b.OUTPUT: summed}  # [T, H] bf16
        if _weighs_in_reduce(cfg):
            profile = liger if _liger(cfg) else lmdeploy
            return {b.OUTPUT: profile.weighted_sum(per_token, given[b.TOPK_WEIGHTS].view(t, k))}  # [T, H] bf16
        acc = per_token[:, 0].float()  # [T, H] fp32
        for j in range(1, k):
            acc = acc + per_token[:, j].float()  # summed in k order, as the reduce kernel does
        return {b.OUTPUT: acc.to(torch.bfloat16)}  # [T, H] bf16
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
            a = dequantize_activation(given[b.QUANTED_GATE_UP_INPUT].repeat_interleave(k, dim=0), a_scale, cfg.quant, torch.float64)
        else:
            x = given[b.HIDDEN_STATES]
            if cfg.router_weight == "input":
                x = _weighted_input(x, given[b.TOPK_WEIGHTS], cfg)  # the profile's bf16 rounding point
            a = x.repeat_interleave(k, dim=0).double()  # [TK, H]
        w = dequantize_weight(problem.w1, problem.w1_scale, cfg.quant, torch.float64)
    elif stage == Stages.DOWN_GEMM:
        if cfg.is_fp8:
            a = dequantize_activation(given[b.QUANTED_DOWN_INPUT], given[b.QUANTED_DOWN_INPUT_SCALES], cfg.quant, torch.float64)
        else:
            a = given[b.ACTIVATION_OUTPUT].double()  # [TK, I]
        w = dequantize_weight(problem.w2, problem.w2_scale, cfg.quant, torch.float64)
        if cfg.router_weight == "down" and not _weighs_in_reduce(cfg):
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
