"""fused_experts functions of the vLLM family signature in plain torch, for tests/adapters/test_families.py:
`fused_experts` (bf16, rounding where diffmoe's reference rounds) and `fused_experts_last_k_dropped`
(the same, summing every top-k row but the last: a planted bug)."""

import torch


def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, use_fp8_w8a8=False, per_channel_quant=False,
                  w1_scale=None, w2_scale=None, block_shape=None, drop_last=False):
    if use_fp8_w8a8:
        raise NotImplementedError("bf16 only")
    t, k = topk_ids.shape
    rows = torch.empty(t, k, w2.shape[1], dtype=torch.bfloat16)
    for tok in range(t):
        for j in range(k):
            e = int(topk_ids[tok, j])
            gu = (hidden_states[tok].float() @ w1[e].float().T).bfloat16().float()
            d = gu.shape[0] // 2
            g = gu[:d]
            act = ((g / (1 + torch.exp(-g))) * gu[d:]).bfloat16().float()
            rows[tok, j] = ((act @ w2[e].float().T) * topk_weights[tok, j]).bfloat16()
    out = rows[:, 0].float()
    for j in range(1, k - 1 if drop_last else k):
        out = out + rows[:, j].float()
    return out.bfloat16()


def fused_experts_last_k_dropped(*args, **kwargs):
    return fused_experts(*args, **kwargs, drop_last=True)
