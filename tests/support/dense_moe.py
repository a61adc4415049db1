"""An independent float64 formulation of the MoE, used only to test the reference.

Token by token, expert by expert, with no padding, no buffers and no activation quantisation:
out[t] = sum_k w[t, k] * W2[e] @ (silu(g) * u), (g, u) = W1[e] @ x[t], all in float64, with the
weights the FP8 path actually multiplies (the dequantised codes) so that only the activation
rounding separates it from the reference (weights at the config's own granularity, weight_scheme; the
sum times routed_scaling_factor when set). A dropped slot (id -1) is skipped; a SwiGLU limit
clamps g to at most the limit and u to [-limit, limit] (gpt-oss's SwiGLU, as vLLM states it).

`quantized_input=True` multiplies the dequantised FP8 codes of the input (the reference's own
input quantisation) instead of the hidden states: for a SwiGLU limit near zero, where the
clamped up is about limit * sign(up), the input's rounding (relative 2^-4) flips the sign of
every up within that error of zero, an error no activation tolerance covers, while the
rounding of the gate-up GEMM's bf16 output (which keeps signs) does not.
"""

from __future__ import annotations

import torch

from reference.moe import dequantize_activation, dequantize_weight, quantize_activation


def dense_moe_float64(problem, *, quantized_input: bool = False) -> torch.Tensor:
    cfg = problem.config
    w1 = dequantize_weight(problem.w1, problem.w1_scale, cfg.weight_scheme).double()  # [L, 2I, H]
    w2 = dequantize_weight(problem.w2, problem.w2_scale, cfg.weight_scheme).double()  # [L, H, I]
    x = problem.hidden_states.double()  # [T, H]
    out = torch.zeros_like(x)  # [T, H]
    for t in range(problem.num_tokens):
        for k in range(cfg.topk):
            e = int(problem.topk_ids[t, k])
            if e < 0:
                continue  # a dropped slot: routed nowhere
            local = e if problem.expert_map is None else int(problem.expert_map[e])
            if local < 0:
                continue  # expert not on this rank: contributes nothing
            w = float(problem.topk_weights[t, k])
            xt = x[t] * w if cfg.router_weight == "input" else x[t]  # [H]
            if quantized_input and cfg.is_fp8:
                xt = _fp8_values(problem, t, w)  # [H]
            gu = w1[local] @ xt  # [2I]
            gate, up = gu[: cfg.inter], gu[cfg.inter :]  # [I] each
            if cfg.swiglu_limit is not None:
                gate, up = gate.clamp(max=cfg.swiglu_limit), up.clamp(-cfg.swiglu_limit, cfg.swiglu_limit)
            act = torch.nn.functional.silu(gate) * up  # [I]
            y = w2[local] @ act  # [H]
            out[t] += y * w if cfg.router_weight == "down" else y
    return out if cfg.routed_scaling_factor is None else out * cfg.routed_scaling_factor


def _fp8_values(problem, t: int, w: float) -> torch.Tensor:
    """[H] float64: token t's dequantised input codes, as the FP8 path multiplies them (the scale
    is the whole call's for per-tensor quantisation)."""
    cfg = problem.config
    x = problem.hidden_states
    if cfg.router_weight == "input":  # K == 1: each token by its own weight
        x = (x.float() * problem.topk_weights).to(torch.bfloat16)
    codes, scale = quantize_activation(x, cfg.quant)  # [T, H]
    return dequantize_activation(codes, scale, cfg.quant)[t].double()  # [H]
