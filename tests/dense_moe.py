"""An independent float64 formulation of the MoE, used only to test the reference.

Token by token, expert by expert, with no padding, no buffers and no activation quantisation:
out[t] = sum_k w[t, k] * W2[e] @ (silu(g) * u), (g, u) = W1[e] @ x[t], all in float64, with the
weights the FP8 path actually multiplies (the dequantised codes) so that only the activation
rounding separates it from the reference.
"""

from __future__ import annotations

import torch

from reference.moe import dequantize_weight


def dense_moe_float64(problem) -> torch.Tensor:
    cfg = problem.config
    w1 = dequantize_weight(problem.w1, problem.w1_scale, cfg.quant).double()  # [L, 2I, H]
    w2 = dequantize_weight(problem.w2, problem.w2_scale, cfg.quant).double()  # [L, H, I]
    x = problem.hidden_states.double()  # [T, H]
    out = torch.zeros_like(x)  # [T, H]
    for t in range(problem.num_tokens):
        for k in range(cfg.topk):
            e = int(problem.topk_ids[t, k])
            local = e if problem.expert_map is None else int(problem.expert_map[e])
            if local < 0:
                continue  # expert not on this rank: contributes nothing
            w = float(problem.topk_weights[t, k])
            xt = x[t] * w if cfg.router_weight == "input" else x[t]  # [H]
            gu = w1[local] @ xt  # [2I]
            act = torch.nn.functional.silu(gu[: cfg.inter]) * gu[cfg.inter :]  # [I]
            y = w2[local] @ act  # [H]
            out[t] += y * w if cfg.router_weight == "down" else y
    return out
