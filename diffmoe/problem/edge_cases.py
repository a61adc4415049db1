"""Labelled edge-case configs: the shapes kernels get wrong, named, beside the fuzzing.

`edge_cases(quant)` gives the same labelled set for any quant scheme, with sizes adjusted
where a scheme forbids them (fp8-block needs H and I to be multiples of 128). The sizes are
the smallest that still show each case, because every case runs on the Triton interpreter.

Owns the list of named shapes. Must not run anything: the tests and the tolerance measurement run them.
"""

from __future__ import annotations

from diffmoe.problem.config import ACT_SCALES_OF_SCHEME, QUANT_BLOCK, SCALE_PAIRS, WEIGHT_SCALES_OF_SCHEME, MoEConfig


def _other_weights(quant: str) -> dict:
    """weight_scales of the pair beside quant's own that serving engines run with quant's activations
    (per-tensor weights beside per-token activations: vLLM's kFp8StaticTensorSym with kFp8DynamicTokenSym),
    or nothing for a scheme without one (the case is then the scheme's own weights, spread)."""
    act = ACT_SCALES_OF_SCHEME.get(quant)
    others = [w for w, a in SCALE_PAIRS if a == act and w != WEIGHT_SCALES_OF_SCHEME.get(quant)]
    return dict(weight_scales=others[0]) if others else {}


def edge_cases(quant: str, *, fused: bool = False, planner: str = "fixed") -> dict[str, MoEConfig]:
    odd_h, odd_i = (QUANT_BLOCK, QUANT_BLOCK) if quant == "fp8-block" else (97, 45)
    base = dict(hidden=128, inter=128, quant=quant, fused=fused, planner=planner, seed=7)
    cases = {
        "T=1": dict(num_tokens=1, num_experts=4, topk=2),
        "T<BLOCK_M": dict(num_tokens=5, num_experts=4, topk=2),
        "T>BLOCK_M": dict(num_tokens=70, num_experts=3, topk=2),
        "odd-H-and-I": dict(num_tokens=6, num_experts=3, topk=2, hidden=odd_h, inter=odd_i),
        "prime-E": dict(num_tokens=9, num_experts=7, topk=3),
        "K=E": dict(num_tokens=4, num_experts=3, topk=3),
        "E=1": dict(num_tokens=3, num_experts=1, topk=1),
        "all-tokens-one-expert": dict(num_tokens=12, num_experts=5, topk=2, skew="one-expert"),
        "empty-experts": dict(num_tokens=6, num_experts=8, topk=2, skew="empty-experts"),
        "expert-map-with-minus-1": dict(num_tokens=7, num_experts=6, topk=2, expert_map=(0, -1, 1, -1, 2, -1)),
        # softmax over all E logits: at K = 1 the weight is below 1, so dropping or doubling it shows
        "router-weight-on-input": dict(num_tokens=5, num_experts=4, topk=1, router_weight="input", router="softmax-topk"),
        "output-in-workspace": dict(num_tokens=6, num_experts=4, topk=2, output="workspace"),
        # the inputs (see MoEConfig): a smaller call on workspaces built for 40 tokens
        "call-below-maximum": dict(num_tokens=40, call_tokens=5, num_experts=4, topk=2),
        "expert-scale-spread": dict(num_tokens=6, num_experts=4, topk=2, expert_scale_spread=4),
        "zero-rows": dict(num_tokens=5, num_experts=4, topk=2, zero_rows=2),
        "nan-rows": dict(num_tokens=4, num_experts=4, topk=2, nan_rows=1),
        "inf-rows": dict(num_tokens=4, num_experts=4, topk=2, inf_rows=1),
        "softmax-topk-K=1": dict(num_tokens=5, num_experts=4, topk=1, router="softmax-topk"),
        "softmax-topk-renormalized": dict(num_tokens=6, num_experts=5, topk=2, router="softmax-topk", renormalize=True),
        "tie-heavy": dict(num_tokens=4, num_experts=3, topk=2, tie_heavy=True),
        # the MoE-model features (see MoEConfig). Gate-up values are about standard normal:
        # 0.25 clamps most gates and ups, 2^-10 clamps all but a few of them
        "swiglu-limit": dict(num_tokens=5, num_experts=4, topk=2, swiglu_limit=0.25),
        "swiglu-limit-below-almost-every-value": dict(num_tokens=3, num_experts=3, topk=2, swiglu_limit=2.0**-10),
        "dropped-slots": dict(num_tokens=7, num_experts=4, topk=2, dropped_slots=5),
        # the last expert local: a dropped slot looked up as expert_map[-1] lands on a real expert
        "dropped-slots-with-expert-map": dict(num_tokens=6, num_experts=6, topk=2, dropped_slots=4,
                                              expert_map=(0, -1, 1, -1, -1, 2)),
        "all-slots-dropped": dict(num_tokens=4, num_experts=3, topk=2, dropped_slots=8),
        "shared-experts": dict(num_tokens=6, num_experts=6, topk=4, shared_experts=2),
        # DeepSeek-V3's factor: the routed sum times 2.5 before its last rounding
        "routed-scaling-factor": dict(num_tokens=5, num_experts=4, topk=2, routed_scaling_factor=2.5),
        # issue 48: the factor scales the down rows' slack with the sum; five shared experts (weight 1)
        # and a clamp make the output small beside its rows, so a bound that summed the rows' slack
        # unscaled failed the shipped kernel here (fp8-block, seed 1; the fuzz found it at T=16 H=I=512)
        "routed-scaling-factor-with-shared-experts": dict(num_tokens=8, num_experts=6, topk=6, shared_experts=5,
                                                          swiglu_limit=0.25, routed_scaling_factor=2.5, seed=1),
        # the weights at another granularity than the scheme's own (issue 27 item 5), each expert's scale
        # apart (3 octaves of spread): a kernel reading one expert's per-tensor scale for all, or a
        # per-channel layout for a per-tensor scale, is off by a factor
        "weights-at-another-granularity": dict(num_tokens=6, num_experts=4, topk=2, expert_scale_spread=3,
                                               **_other_weights(quant)),
    }
    return {label: MoEConfig(**{**base, **fields}) for label, fields in cases.items()}
