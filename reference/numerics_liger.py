"""The reference's `liger` numerics profile: Liger-Kernel 0.8.5's bf16 fused MoE, one function per point.

reference/moe.py computes diffmoe's own numerics. Under `numerics="liger"` it calls these at the
points where Liger's forward (liger_kernel/ops/fused_moe.py and fused_moe_kernels.py of the
0.8.5 wheel, the files `diffmoe peers fetch liger` keeps) rounds differently. The facts:

  * `_fused_up_proj_swiglu_kernel` stores the gate/up product rounded to bf16 (pre_act) and
    computes SwiGLU from the float32 accumulators, `acc_gate * sigmoid(acc_gate) * acc_up`,
    rounded once to bf16 (post_act): the activation never sees the rounded product;
  * `_fused_down_proj_kernel` stores the down product unweighted (Y, rounded to bf16);
  * `_token_gather_weighted_sum_kernel` applies the router weight there: each token's output is
    the float32 sum over k of float32(w_k) * float32(Y_k), rounded once to bf16.

Owns the liger profile's rounding points. Must not import peers/ (the adapter is judged against
these), Triton or the harness's oracles.
"""

from __future__ import annotations

import torch

PROFILE = "liger"


def swiglu_of_product(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU of the float32 gate/up product [R, 2I] (gate first): gate * sigmoid(gate) * up in
    float32, rounded once to bf16: [R, I]."""
    i = gate_up.shape[1] // 2
    gate, up = gate_up[:, :i].float(), gate_up[:, i:].float()
    return (gate * torch.sigmoid(gate) * up).to(torch.bfloat16)


def weighted_sum(per_token: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The gather-sum: per_token [T, K, H] bf16 unweighted rows, weights [T, K]; sum over k in
    order of float32(w) * float32(y), rounded once to bf16: [T, H]."""
    acc = torch.zeros(per_token.shape[0], per_token.shape[2], dtype=torch.float32, device=per_token.device)
    for j in range(per_token.shape[1]):
        acc = acc + weights[:, j : j + 1].float() * per_token[:, j].float()
    return acc.to(torch.bfloat16)
