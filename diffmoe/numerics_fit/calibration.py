"""The calibration set of `diffmoe numerics fit`: a few small configs, drawn deterministically, that
make every rounding point act somewhere.

A point can only be fitted on a config where it changes something: the quant points need their
scheme, `fused_act_quant` a fused config, the floors an all-zero token, `amax` and the NaN codes a
NaN token, `swiglu_clamp` a SwiGLU limit, `input_weight` router_weight='input', and the reduce's
bf16-versus-float32 choices K = 2 and K = 3 (vLLM's moe_sum switches there). So the set is the
supported (quant scheme, fused flag) pairs, each drawn once per round, every round giving the pairs
another of FEATURES (a config the implementation's `supports` refuses, or the config refuses,
falls back to the plain feature). Sizes are the smallest the schemes allow (H = I = 128, one 1x128
group), so a peer under the Triton interpreter runs a config in seconds.

Owns the drawing of the calibration set. Must not run an implementation or judge anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from diffmoe.contract import unsupported
from diffmoe.problem.config import QUANT_SCHEMES, MoEConfig

# the smallest sizes every scheme takes: one 1x128 group, one 128x128 weight block
_BASE = dict(num_tokens=6, num_experts=4, topk=2, hidden=128, inter=128)
# What each round adds, in order; FEATURES[0] is the plain config every pair falls back to.
# Each entry: (name, fields). The first has 16 tokens: a division and a product with the reciprocal
# round a code apart about once per 2,000 codes of the generated problems (0.2 of T=6 x H=128 input
# codes per call, 1.6 of T=16's, measured over seeds 0-4), so at T=6 the codes points rarely act. The SwiGLU limit 1.3 is no bf16 value (bf16 rounds it to 1.296875), so a
# float32 clamp and a bf16 clamp of the same values differ, and it clamps a share of the gate/up
# values of the generated problems, which spread over a few units. K=1 router weights from a softmax
# over E, since a top-1 random-k weight is exactly 1.0 and no weighting would act.
FEATURES: tuple[tuple[str, dict], ...] = (
    ("16 tokens, a zero row, K=2", dict(num_tokens=16, zero_rows=1)),
    ("NaN row, K=3", dict(nan_rows=1, topk=3)),
    ("SwiGLU limit", dict(swiglu_limit=1.3, zero_rows=1)),
    ("router weight on the input, K=1", dict(router_weight="input", topk=1, router="softmax-topk")),
)
ROUNDS = len(FEATURES)  # rounds in the default set: every pair sees every feature


def scheme_pairs(quants: Sequence[str] | None = None) -> list[tuple[str, bool]]:
    """(quant, fused) pairs in QUANT_SCHEMES order; bf16 has no fused path."""
    chosen = list(QUANT_SCHEMES) if not quants else list(quants)
    for q in chosen:
        if q not in QUANT_SCHEMES:
            raise ValueError(f"quant must be one of {list(QUANT_SCHEMES)}, got {q!r}")
    return [(q, fused) for q in QUANT_SCHEMES if q in chosen for fused in ((False, True) if q != "bf16" else (False,))]


def _refusal(factory: Callable | None, config: MoEConfig) -> str | None:
    try:
        config.validate()
    except (TypeError, ValueError) as exc:
        return str(exc)
    return unsupported(factory, config)


def calibration_configs(factory: Callable | None, quants: Sequence[str] | None = None, count: int | None = None,
                        seed: int = 0) -> tuple[list[tuple[MoEConfig, str]], list[str]]:
    """([(config, feature name)], [why a pair is left out]): `count` configs (default ROUNDS per
    supported pair: each pair with every feature) over the (quant, fused) pairs the factory supports, each with its round's feature
    (or the plain one where that is refused); seeds seed, seed + 1, ... The same arguments give the
    same set."""
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise ValueError(f"count must be a positive integer, got {count!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    pairs, left_out = [], []
    for quant, fused in scheme_pairs(quants):
        why = _refusal(factory, MoEConfig(**{**_BASE, "quant": quant, "fused": fused, **FEATURES[0][1]}))
        if why is None:
            pairs.append((quant, fused))
        else:
            left_out.append(f"{quant}{' fused' if fused else ''}: {why}")
    if not pairs:
        return [], left_out
    total = count if count is not None else ROUNDS * len(pairs)
    configs: list[tuple[MoEConfig, str]] = []
    for i in range(total):
        index, round_ = i % len(pairs), i // len(pairs)
        quant, fused = pairs[index]
        feature = FEATURES[(round_ + index) % len(FEATURES)]
        config = MoEConfig(**{**_BASE, "quant": quant, "fused": fused, "seed": seed + i, **feature[1]})
        if _refusal(factory, config) is not None:
            feature = FEATURES[0]
            config = MoEConfig(**{**_BASE, "quant": quant, "fused": fused, "seed": seed + i, **feature[1]})
        configs.append((config, feature[0]))
    return configs, left_out
