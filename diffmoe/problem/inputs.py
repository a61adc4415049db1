"""Deterministic problem generation: every input tensor of a MoE call, from the config alone.

The same config gives bitwise the same tensors on any run: everything is drawn on the CPU
from one `torch.Generator` seeded with `config.seed`, in a fixed order, then moved to the
requested device.

A call may carry fewer tokens than the config's T, which is the largest batch the
implementation is built for: `make_problem(config, num_tokens=n)` gives the first n tokens
of the config's problem (n = 0 included: an engine may call with an empty batch), with the
same weights; `Problem.num_tokens` is the T of the call.

Inputs a config opts into (each drawn from its own generator, seeded from `config.seed` and
the input's name, so a config without them is bitwise the problem it always was):
`router="softmax-topk"` (softmax over E logits, top-K, optional renormalisation),
`expert_scale_spread` (per-expert weight scales), `outlier_channels` (a few input channels of
each expert's weights scaled up), `tie_heavy` hidden states, the
all-zero / NaN / Inf rows (`zero_rows`, `nan_rows`, `inf_rows`) among the call's tokens, and
`dropped_slots` (-1 ids). `shared_experts` changes the routing itself (the router draws K-S
slots among the first E-S experts; the shared experts fill the last S slots), so no stream.
The spread and the outliers are on by default (config.DEFAULT_EXPERT_SCALE_SPREAD,
DEFAULT_OUTLIER_CHANNELS; issue 42), so that default inputs tell experts apart; 0 turns each off.

Value bounds (why quantisation never overflows): hidden states are standard normal clamped
to [-4, 4]; weights are normal with std 1/sqrt(fan_in) clamped to 4 std. Every scale is
derived from the amax (dynamic for activations, static for weights), so codes stay within
+-448 by construction; the bounds keep bf16 intermediates far from overflow too.

Owns generating inputs from the config. Must not depend on an implementation or on the fused flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from diffmoe.problem.config import OUTLIER_OCTAVES, QUANT_BLOCK, SHARED_EXPERT_WEIGHT, MoEConfig
from diffmoe.problem.vocabulary import FP8_DTYPE, FP8_MAX, Buffers, weight_scale_shape

# Floor for a weight scale (an all-zero weight block would otherwise divide by zero).
WEIGHT_SCALE_FLOOR = 1e-10


# The intermediates with one row per routed slot ([TK, ...]), whose rows of a slot that is not
# computed (Problem.computed_slots) carry no value.
TOKEN_FIELDS = ("hidden_states", "topk_ids", "topk_weights")  # a Problem's fields with one row per token
ROUTED_ROW_BUFFERS = (Buffers.GATE_UP_OUTPUT, Buffers.ACTIVATION_OUTPUT, Buffers.QUANTED_DOWN_INPUT,
                      Buffers.QUANTED_DOWN_INPUT_SCALES, Buffers.DOWN_OUTPUT)


@dataclass
class Problem:
    """All inputs of one MoE call. Weights cover the L local experts only."""

    config: MoEConfig
    hidden_states: torch.Tensor  # [T, H] bf16
    topk_ids: torch.Tensor  # [T, K] int32 global expert ids, distinct per token, or -1 (a dropped slot)
    topk_weights: torch.Tensor  # [T, K] fp32
    w1_master: torch.Tensor  # [L, 2I, H] bf16, gate rows first then up rows
    w2_master: torch.Tensor  # [L, H, I] bf16
    w1: torch.Tensor  # [L, 2I, H] fp8 codes, or the bf16 master for quant='bf16'
    w2: torch.Tensor  # [L, H, I]
    w1_scale: torch.Tensor | None  # fp32, weight_scale_shape(config, L, 2I, H); None for bf16
    w2_scale: torch.Tensor | None  # fp32, weight_scale_shape(config, L, H, I)
    expert_map: torch.Tensor | None  # [E] int32 global -> local or -1

    def inputs(self) -> dict[str, torch.Tensor]:
        """The tensors an implementation receives, by vocabulary name (for checksums and aliasing)."""
        named = {
            Buffers.HIDDEN_STATES: self.hidden_states,
            Buffers.TOPK_IDS: self.topk_ids,
            Buffers.TOPK_WEIGHTS: self.topk_weights,
            Buffers.W1: self.w1,
            Buffers.W2: self.w2,
            Buffers.W1_SCALE: self.w1_scale,
            Buffers.W2_SCALE: self.w2_scale,
            Buffers.EXPERT_MAP: self.expert_map,
        }
        return {k: v for k, v in named.items() if v is not None}

    def to(self, device: torch.device | str) -> Problem:
        moved = {
            f.name: (getattr(self, f.name).to(device) if isinstance(getattr(self, f.name), torch.Tensor) else getattr(self, f.name))
            for f in fields(self)
        }
        return Problem(**moved)

    @property
    def device(self) -> torch.device:
        return self.hidden_states.device

    def computed_slots(self) -> torch.Tensor:
        """[TK] bool: the routed slots (row t*K + k) an implementation computes. A slot whose id is
        outside [0, E) (an unrouted -1) or whose expert the map sends to -1 (remote) has no value
        on this rank: its rows of the per-routed-row buffers (ROUTED_ROW_BUFFERS) may hold
        anything, as long as nothing downstream reads them (the output still judges that)."""
        e = self.config.num_experts
        ids = self.topk_ids.long().flatten()
        ok = (ids >= 0) & (ids < e)
        if self.expert_map is not None:
            ok &= self.expert_map.long()[ids.clamp(0, e - 1)] >= 0
        return ok

    @property
    def num_tokens(self) -> int:
        """T of this call: config.num_tokens, or fewer for a smaller call (0 included)."""
        return int(self.hidden_states.shape[0])


def _routed_sizes(config: MoEConfig) -> tuple[int, int, int]:
    """T, and the experts and slots the router chooses among: E - S and K - S (S shared experts)."""
    return config.num_tokens, config.num_experts - config.shared_experts, config.topk - config.shared_experts


def _local_mask(config: MoEConfig, experts: int) -> torch.Tensor:
    """[experts] whether each of the first `experts` global experts is local (skew all-remote)."""
    return torch.tensor([v >= 0 for v in config.expert_map[:experts]])


def _route(config: MoEConfig, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    t, e, k = _routed_sizes(config)
    scores = torch.rand(t, e, generator=gen)  # [T, E] in [0, 1)
    if config.skew == "one-expert":
        scores[:, 0] = 2.0  # every token picks expert 0 (plus K-1 others)
    elif config.skew == "empty-experts":
        active = max(k, math.ceil(e / 2))
        scores[:, active:] = -1.0  # experts >= active receive nothing
    elif config.skew == "all-remote" and config.expert_map is not None:
        scores[:, _local_mask(config, e)] -= 2.0  # below every remote expert, in the same random order among themselves
    ids = scores.topk(k, dim=1).indices.to(torch.int32)  # [T, K], distinct by construction
    logits = torch.randn(t, k, generator=gen)
    weights = torch.softmax(logits, dim=1).to(torch.float32)  # [T, K], rows sum to 1
    return ids, weights


# Streams of the opt-in inputs: each has its own generator, so turning one on changes nothing else.
_STREAMS = {"router": 1, "expert_scale_spread": 2, "tie_heavy": 3, "special_rows": 4, "dropped_slots": 5,
            "outlier_channels": 6}
# Tie-heavy amax: 448 * 2^-7, so scale = amax / 448 is exactly 2^-7 and a code is x * 128 exactly.
TIE_HEAVY_AMAX = 3.5
# Significant bits of a tie-heavy value: e4m3 keeps 4 (1 + 3 mantissa bits), so with 5 about
# half the values sit exactly halfway between two codes.
TIE_HEAVY_BITS = 5


def _stream(config: MoEConfig, name: str) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed((config.seed * 8 + _STREAMS[name]) % 2**63)


def _softmax_topk(config: MoEConfig, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Engine-style routing: E logits, softmax over all E, the K most probable experts."""
    t, e, k = _routed_sizes(config)
    logits = torch.randn(t, e, generator=gen) * 2.0  # [T, E]
    if config.skew == "one-expert":
        logits[:, 0] = 30.0  # expert 0 wins every token
    elif config.skew == "empty-experts":
        logits[:, max(k, math.ceil(e / 2)):] = -30.0  # never among the top K, probability ~1e-13
    elif config.skew == "all-remote" and config.expert_map is not None:
        logits[:, _local_mask(config, e)] -= 60.0
    probs = torch.softmax(logits, dim=1)  # [T, E]
    weights, ids = probs.topk(k, dim=1)  # [T, K] each
    if config.renormalize:
        weights = weights / weights.sum(dim=1, keepdim=True)
    return ids.to(torch.int32), weights.to(torch.float32).contiguous()


def _append_shared(config: MoEConfig, ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, K-S] routed slots -> [T, K]: every token's last S slots are the shared experts
    E-S..E-1 in order, weighted SHARED_EXPERT_WEIGHT (the shared expert fused into the top-k)."""
    t, s = ids.shape[0], config.shared_experts
    shared = torch.arange(config.num_experts - s, config.num_experts, dtype=torch.int32).expand(t, s)  # [T, S]
    ones = torch.full((t, s), SHARED_EXPERT_WEIGHT, dtype=torch.float32)  # [T, S]
    return torch.cat([ids, shared], dim=1).contiguous(), torch.cat([weights, ones], dim=1).contiguous()


def _drop_slots(config: MoEConfig, ids: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`dropped_slots` of the T*K slots, distinct and uniformly drawn, set to -1 (weights kept)."""
    slots = torch.randperm(ids.numel(), generator=gen)[: config.dropped_slots]
    ids = ids.clone()
    ids.view(-1)[slots] = -1
    return ids


def _spread_experts(config: MoEConfig, w: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Each expert's weight times 2^u, u uniform in [-spread, spread] octaves."""
    s = config.expert_scale_spread
    factors = torch.pow(2.0, torch.rand(w.shape[0], generator=gen) * 2 * s - s)  # [L]
    return (w.float() * factors[:, None, None]).to(torch.bfloat16)


def _outlier_channels(config: MoEConfig, w: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """[L, N, C] bf16 -> each expert's min(outlier_channels, C) input columns, distinct and drawn
    per expert, times 2^v, v uniform in OUTLIER_OCTAVES (per expert and column)."""
    n_exp, _, c = w.shape
    count = min(config.outlier_channels, c)
    lo, hi = OUTLIER_OCTAVES
    factors = torch.ones(n_exp, c)  # [L, C]
    for e in range(n_exp):
        cols = torch.randperm(c, generator=gen)[:count]
        factors[e, cols] = torch.pow(2.0, lo + (hi - lo) * torch.rand(count, generator=gen))
    return (w.float() * factors[:, None, :]).to(torch.bfloat16)


def _tie_heavy(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """[T, H] bf16 -> values of TIE_HEAVY_BITS significant bits in [-3.5, 3.5], with +-3.5 at the
    start of every 128-wide group (hence in every row and every group: the amax of every scheme)."""
    mantissa, exponent = torch.frexp(x.float())  # x = mantissa * 2^exponent, |mantissa| in [0.5, 1)
    step = 2.0**TIE_HEAVY_BITS
    y = torch.ldexp(torch.round(mantissa * step) / step, exponent).clamp(-TIE_HEAVY_AMAX, TIE_HEAVY_AMAX)
    signs = torch.where(torch.rand(x.shape[0], 1, generator=gen) < 0.5, -1.0, 1.0)  # [T, 1]
    y[:, ::QUANT_BLOCK] = TIE_HEAVY_AMAX * signs
    return y.to(torch.bfloat16)


def _special_rows(config: MoEConfig, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """zero_rows all-zero tokens, nan_rows tokens with one NaN, inf_rows with one +-Inf, distinct,
    among the call's first T tokens."""
    t, h = config.call_num_tokens, config.hidden
    rows = torch.randperm(t, generator=gen)[: config.special_rows].tolist()
    cols = torch.randint(0, h, (len(rows),), generator=gen).tolist()
    signs = torch.where(torch.rand(len(rows), generator=gen) < 0.5, -1.0, 1.0).tolist()
    x = x.clone()
    for n, (row, col, sign) in enumerate(zip(rows, cols, signs)):
        if n < config.zero_rows:
            x[row] = 0.0
        elif n < config.zero_rows + config.nan_rows:
            x[row, col] = float("nan")
        else:
            x[row, col] = sign * float("inf")
    return x


def _normal(shape: tuple[int, ...], std: float, gen: torch.Generator) -> torch.Tensor:
    return (torch.randn(shape, generator=gen) * std).clamp(-4 * std, 4 * std).to(torch.bfloat16)


def quantize_weight(config: MoEConfig, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Static FP8 quantisation of an [L, N, K] bf16 weight at the config's weight granularity
    (`weight_scheme`): codes and scales, scale = amax / 448."""
    wf = w.float()  # [L, N, K]
    n_exp, n, k = wf.shape
    if config.weight_scheme == "fp8-tensor":
        amax = wf.abs().amax(dim=(1, 2))  # [L]
        scale = (amax / FP8_MAX).clamp_min(WEIGHT_SCALE_FLOOR)
        expanded = scale[:, None, None]
    elif config.weight_scheme == "fp8-token":  # per output channel
        amax = wf.abs().amax(dim=2)  # [L, N]
        scale = (amax / FP8_MAX).clamp_min(WEIGHT_SCALE_FLOOR)
        expanded = scale[:, :, None]
    elif config.weight_scheme == "fp8-block":
        nb, kb = math.ceil(n / QUANT_BLOCK), math.ceil(k / QUANT_BLOCK)
        padded = torch.zeros(n_exp, nb * QUANT_BLOCK, kb * QUANT_BLOCK)
        padded[:, :n, :k] = wf.abs()
        amax = padded.view(n_exp, nb, QUANT_BLOCK, kb, QUANT_BLOCK).amax(dim=(2, 4))  # [L, nb, kb]
        scale = (amax / FP8_MAX).clamp_min(WEIGHT_SCALE_FLOOR)
        expanded = scale.repeat_interleave(QUANT_BLOCK, 1).repeat_interleave(QUANT_BLOCK, 2)[:, :n, :k]
    else:
        raise ValueError(f"quant={config.quant!r} has no FP8 weights")
    codes = (wf / expanded).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)  # torch's cast rounds to nearest even
    assert tuple(scale.shape) == weight_scale_shape(config, n_exp, n, k)
    return codes, scale.contiguous()


def tokens_of(problem: Problem, index: list[int] | slice) -> dict[str, torch.Tensor]:
    """The per-token fields of `problem` for the tokens `index` selects (fresh tensors)."""
    return {name: getattr(problem, name)[index].clone() for name in TOKEN_FIELDS}


def make_problem(config: MoEConfig, device: torch.device | str = "cpu", *, num_tokens: int | None = None) -> Problem:
    """Build every input of `config` deterministically from `config.seed`.

    num_tokens: the T of the call, 0..config.num_tokens (default config.call_num_tokens); the
    problem is then the first num_tokens tokens of the config's problem, same weights.
    """
    config.validate()
    if num_tokens is not None:
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool):
            raise TypeError(f"num_tokens must be None or an int in [0, {config.num_tokens}], got {num_tokens!r}")
        if not 0 <= num_tokens <= config.num_tokens:
            raise ValueError(f"num_tokens must be in [0, config.num_tokens={config.num_tokens}], got {num_tokens}")
    gen = torch.Generator(device="cpu").manual_seed(config.seed)
    t, h, i, n_local = config.num_tokens, config.hidden, config.inter, config.num_local_experts
    hidden = torch.randn(t, h, generator=gen).clamp(-4.0, 4.0).to(torch.bfloat16)  # [T, H]
    topk_ids, topk_weights = _route(config, gen)
    w1_master = _normal((n_local, 2 * i, h), 1.0 / math.sqrt(h), gen)  # [L, 2I, H]
    w2_master = _normal((n_local, h, i), 1.0 / math.sqrt(i), gen)  # [L, H, I]
    if config.router == "softmax-topk":
        topk_ids, topk_weights = _softmax_topk(config, _stream(config, "router"))
    if config.shared_experts:
        topk_ids, topk_weights = _append_shared(config, topk_ids, topk_weights)
    if config.dropped_slots:
        topk_ids = _drop_slots(config, topk_ids, _stream(config, "dropped_slots"))
    if config.expert_scale_spread:
        spread = _stream(config, "expert_scale_spread")
        w1_master, w2_master = _spread_experts(config, w1_master, spread), _spread_experts(config, w2_master, spread)
    if config.outlier_channels:
        outliers = _stream(config, "outlier_channels")
        w1_master, w2_master = _outlier_channels(config, w1_master, outliers), _outlier_channels(config, w2_master, outliers)
    if config.tie_heavy:
        hidden = _tie_heavy(hidden, _stream(config, "tie_heavy"))
    if config.special_rows:
        hidden = _special_rows(config, hidden, _stream(config, "special_rows"))
    if config.is_fp8:
        w1, w1_scale = quantize_weight(config, w1_master)
        w2, w2_scale = quantize_weight(config, w2_master)
    else:
        w1, w1_scale, w2, w2_scale = w1_master, None, w2_master, None
    expert_map = None if config.expert_map is None else torch.tensor(config.expert_map, dtype=torch.int32)
    problem = Problem(
        config=config,
        hidden_states=hidden,
        topk_ids=topk_ids,
        topk_weights=topk_weights,
        w1_master=w1_master,
        w2_master=w2_master,
        w1=w1,
        w2=w2,
        w1_scale=w1_scale,
        w2_scale=w2_scale,
        expert_map=expert_map,
    )
    if num_tokens is None:
        num_tokens = config.call_num_tokens
    if num_tokens != t:
        # fresh tensors, not views: an implementation writing past the call's rows must not
        # land in bytes that are still part of an input
        for name in ("hidden_states", "topk_ids", "topk_weights"):
            setattr(problem, name, getattr(problem, name)[:num_tokens].clone())
    return problem if torch.device(device) == torch.device("cpu") else problem.to(device)


def settle_uncomputed_rows(problem: Problem, reference: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> None:
    """In place: the rows of slots `problem`'s call does not compute (Problem.computed_slots:
    remote under an expert map, unrouted) of each per-routed-row buffer take the reference's
    values (`reference`: its intermediates), so no oracle judges bytes that carry no value;
    whatever reads them still shows in what it writes (the output)."""
    slots = problem.computed_slots()
    if bool(slots.all()):
        return
    for name in ROUTED_ROW_BUFFERS:
        mine, ref = buffers.get(name), reference.get(name)
        if (isinstance(mine, torch.Tensor) and ref is not None and mine.shape == ref.shape and mine.dim() >= 1
                and mine.shape[0] == slots.numel() and mine.dtype == ref.dtype):
            mine[~slots.to(mine.device)] = ref[~slots.to(ref.device)].to(mine.device)
