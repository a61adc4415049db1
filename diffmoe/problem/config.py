"""The one description of a MoE problem: `MoEConfig`.

A config is everything needed to rebuild a failing case bit for bit: sizes, quantisation
scheme, the optimized path's switches and the seed. It is frozen, validated with messages
that name the field and its allowed range, and round-trips through JSON exactly, because
reproducers are stored as JSON. Must not import Triton or an implementation.
Longer than 400 lines because every field's validation message lives beside its field, in
one class, so the rules a user reads in an error are the ones the constructor applies.

Dimension letters (used everywhere in diffmoe): T tokens, E experts, K top-k, H hidden
size, I intermediate size (the gate-up projection has 2*I columns), TK = T*K routed rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Collection

from diffmoe.problem.models import ep_placement
from diffmoe.problem.numerics import DEFAULT_PROFILE, NO_CLAMP, PROFILE_NAMES, SCHEME_ONLY, Profile, parse_spec, profile
from diffmoe.problem.numerics import QUANT_SCHEMES as NUMERICS_QUANT_SCHEMES

QUANT_SCHEMES = ("bf16", "fp8-tensor", "fp8-token", "fp8-block")
ACTIVATIONS = ("silu",)
ROUTER_WEIGHT_PLACEMENTS = ("down", "input")
PLANNERS = ("fixed", "legacy")
OUTPUT_PLACEMENTS = ("workspace", "separate")
# The skews the fuzzing strategies draw (diffmoe.fuzz.strategies samples this tuple).
ROUTING_SKEWS = ("uniform", "one-expert", "empty-experts")
# Every skew a config may name. all-remote, a labelled edge case rather than a drawn
# distribution: each token's experts come first from those the expert map sends elsewhere
# (-1), so with at least K remote experts every token is routed away from this rank and the
# output is exactly zero; with fewer, the remaining picks fall on local experts; without a
# map it is the uniform draw. It is valid for every config.
ALL_ROUTING_SKEWS = (*ROUTING_SKEWS, "all-remote")
# How the router weights are made. random-k: K logits per token, softmaxed over those K (rows
# sum to 1; at K = 1 the weight is exactly 1.0). softmax-topk: as serving engines route, E
# logits per token, a softmax over all E, the K largest probabilities kept (each below 1,
# at K = 1 too), divided by their sum when `renormalize` is set.
ROUTERS = ("random-k", "softmax-topk")
# Per-expert weight scale spread, in octaves: each local expert's w1 and w2 are multiplied by
# 2^u, u uniform in [-spread, spread], so per-tensor weight scales differ across experts (with
# equal amaxes, using one expert's scale for all of them is invisible). 4 octaves keep every
# intermediate far from bf16 overflow (weights at most 16x their unscaled bound).
MAX_EXPERT_SCALE_SPREAD = 4
# The spread every problem has unless turned off (issue 42): with none, at H, I >= 256 every
# expert's weight amax is the 4-std clamp, so a kernel scaling every expert by expert 0's
# per-tensor scale passed a default check (vLLM 0.28.0's defect did at seed 0). Two octaves: two
# experts' scales then differ by 2^d, d the difference of two uniform draws in [-2, 2]
# (triangular on [-4, 4]), under 5 % (|d| < 0.07) for about 3.5 % of expert pairs, against
# about 1.8 % at 4 octaves; and the largest expert stays within 16x of the smallest (256x at
# 4), so no expert's contribution to a token hides inside another's tolerance.
DEFAULT_EXPERT_SCALE_SPREAD = 2
# Outlier input channels per expert and weight (issue 42): each local expert's w1 and w2 have
# this many input columns (of H for w1, of I for w2; at most the width) multiplied by 2^v, v
# uniform in OUTLIER_OCTAVES, as real checkpoints' weights have a few channels far above the
# rest. Each expert's largest outlier sets its per-tensor and per-channel amax, so scales differ
# across experts even without a spread, and a block holding an outlier column has another scale
# than its neighbours. Four: a few per expert (3 % of the columns at H = 128; the columns are
# drawn uniformly, so at H = 512 about one 128-wide block in three of an expert holds none).
DEFAULT_OUTLIER_CHANNELS = 4
MAX_OUTLIER_CHANNELS = 16
# 2x..8x the channel's values: with the spread, a weight stays within 32 * 4 = 128x its
# unscaled 4-std bound, far from bf16 overflow (every FP8 scale is derived from the amax).
OUTLIER_OCTAVES = (1.0, 3.0)
# Random program orders a check runs beside identity and reversed (each one more run of the
# implementation, judged bitwise against the first). Two by default: one random order found
# every program-order mutant of the bug zoo, a second one is cheap insurance for races that
# need two particular programs swapped.
DEFAULT_RANDOM_ORDERS = 2
MAX_RANDOM_ORDERS = 16

# Whose rounding the reference follows: a numerics profile spec (diffmoe.problem.numerics: the
# rounding points, their menus and the built-in profiles as data; reference/rounding/ the functions).
# The built-in names: diffmoe's own (DESIGN.md's numerics), vLLM 0.33.0's, Liger-Kernel 0.8.5's and
# lmdeploy 0.18.0's (fp8-block only: its ratio-rescaled GEMM describes no other scheme); any of
# them may be followed by +point=choice overrides. A config's numerics=None means the profile the
# implementation under test declares (diffmoe.contract.NUMERICS), diffmoe's when it
# declares none.
NUMERICS_PROFILES = PROFILE_NAMES
DEFAULT_NUMERICS = DEFAULT_PROFILE
assert NUMERICS_QUANT_SCHEMES == QUANT_SCHEMES, "diffmoe.problem.numerics keeps its own copy of the schemes"

# fp8-block: 1x128 activation groups and 128x128 weight blocks (DeepSeek-style), as DESIGN.md.
QUANT_BLOCK = 128

# ---- scale granularity: the weights' and the activations' as two axes (issue 27 item 5) ----------
# Weights: one scale per expert's tensor, per output channel, or per 128x128 block.
WEIGHT_SCALES = ("tensor", "channel", "block")
# Activations: one scale computed per tensor, per token, or per 1x128 group (dynamic). A given (static)
# per-tensor scale is not an axis value yet: it needs the scale as a problem input every
# implementation receives (docs/inputs.md, "Scale granularity").
ACT_SCALES = ("tensor", "token", "group")
# The FP8 scheme whose activation scaling unit each activation granularity has: `quant` names the
# activation's unit, so a config's activation scales are always its quant scheme's.
SCHEME_OF_ACT_SCALES = {"tensor": "fp8-tensor", "token": "fp8-token", "group": "fp8-block"}
# The weight layout each old scheme name means (`fp8-token` always meant per-channel weights): the
# alias's default, kept so every old config, replay line and JSON means what it meant.
WEIGHT_SCALES_OF_SCHEME = {"fp8-tensor": "tensor", "fp8-token": "channel", "fp8-block": "block"}
ACT_SCALES_OF_SCHEME = {"fp8-tensor": "tensor", "fp8-token": "token", "fp8-block": "group"}
# The scheme name whose weight layout each weight granularity is (the reference's and the kernels'
# dequantisers read weight scales by scheme name).
SCHEME_OF_WEIGHT_SCALES = {v: k for k, v in WEIGHT_SCALES_OF_SCHEME.items()}
# Every (weights, activations) pair a serving engine runs: vLLM 0.33.0's TritonExperts supports
# (kFp8Static128BlockSym, kFp8Dynamic128Sym), (kFp8StaticChannelSym, kFp8DynamicTokenSym),
# (kFp8StaticTensorSym, kFp8DynamicTokenSym), (kFp8StaticTensorSym, kFp8DynamicTensorSym) and, with a
# static activation scale, (kFp8StaticTensorSym, kFp8StaticTensorSym) (model_executor/layers/fused_moe/
# experts/triton_moe.py, _supports_quant_scheme, read from the cached wheel). Per-channel weights with
# a per-tensor activation scale, or blocks with anything but 1x128 groups, are in no engine's list.
SCALE_PAIRS = (("tensor", "tensor"), ("tensor", "token"), ("channel", "token"), ("block", "group"))
# routed_scaling_factor bounds: DeepSeek-V2 ships 16.0, DeepSeek-V3 2.5, Kimi-K2 2.827; 256 is a margin
# that keeps the scaled output of the generator's values (|out| well below 2^8) far from bf16 overflow.
MAX_ROUTED_SCALING_FACTOR = 256.0

# Upper bounds, checked before anything is allocated: a hostile or mistyped config must not
# exhaust memory. Each field reaches the sizes engines run (issue 42): T to 2^20 tokens (decode
# 1-512, chunked prefill 8192-65536, warm-up and training batches to 262,144 and beyond), E to 1024
# (Qwen3-Next's 512 routed experts and its fused shared one make 513), H and I to 16384 (Mixtral-8x22B's I);
# routed rows to 2^24 (2^20 tokens at top-16). What bounds memory is the total, MAX_PROBLEM_BYTES.
MAX_TOKENS = 2**20
MAX_EXPERTS = 1024
MAX_HIDDEN = 16384
MAX_INTER = 16384
MAX_ROUTED_ROWS = 2**24
MAX_SEED = 2**63 - 1
# The per-field bounds still allow absurd totals (512 experts of 16384 x 16384 weights are
# petabytes), so the total is bounded too: `estimated_bytes` counts every weight and routed
# activation once, as float32 (the unit the reference computes in). A check's peak memory is
# a small multiple of it (masters, FP8 codes, dequantised copies, both implementations'
# intermediates). 8 GiB lets one accelerator-sized check through and stops a hostile or
# mistyped config before the first allocation.
MAX_PROBLEM_BYTES = 8 * 2**30
# ---- the MoE-model features (swiglu_limit, dropped_slots, shared_experts) --------------------
# SwiGLU clamp limit bounds: above every gate-up value the clamp is the plain activation. The
# generator's gate-up values stay below 16*sqrt(H) <= 2048 (|x| <= 4, |w| <= 4/sqrt(H)), so
# 2^16 leaves a wide margin; gpt-oss uses 7.0 (vLLM's gemm1_clamp_limit).
MAX_SWIGLU_LIMIT = 2.0**16
# Shared experts fused into the routed set: DeepSeek-V3 and Qwen2-MoE have 1 or 2; 8 is a margin.
MAX_SHARED_EXPERTS = 8
# Weight of a shared expert's slot: models add the shared expert's output unweighted.
SHARED_EXPERT_WEIGHT = 1.0

# A config file is a few hundred bytes; anything past this is not a config.
MAX_CONFIG_JSON_CHARS = 2**20
# Longest integer literal a config JSON may hold (MAX_SEED has 19 digits): Python would
# otherwise parse a million-digit literal before any bound is checked.
MAX_JSON_INT_DIGITS = 32
# Values quoted in error messages are cut to this many characters, so that an error caused
# by a hostile value stays one readable line.
MAX_QUOTED_CHARS = 60


def problem_bytes(num_tokens: int, topk: int, hidden: int, inter: int, local_experts: int) -> int:
    """Every local weight (L*2I*H + L*H*I) and activation (T*H + TK*(2I + I + H)) once, at 4 bytes
    (float32, as the reference dequantises): what a problem of these sizes costs to build."""
    weights = local_experts * 3 * inter * hidden
    activations = num_tokens * hidden + num_tokens * topk * (3 * inter + hidden)
    return 4 * (weights + activations)


def flag_zero_rows(call_tokens: int, nan_rows: int = 0, inf_rows: int = 0) -> int:
    """The all-zero (padding) tokens a config built from command-line flags holds unless
    `--zero-rows` says otherwise: one, when the call keeps at least one ordinary token beside it
    and its NaN and Inf rows, else none. Serving engines pad decode batches to a CUDA-graph size
    with zero tokens and run the MoE on them every step, and a kernel that divides by a zero
    token's amax (a scale without its floor: 0 / 0) passes every check without one. `MoEConfig`'s
    own default stays 0: a config from Python or a JSON file says exactly what it holds; the
    replay command (diffmoe.check.report.check_command) names --zero-rows wherever it differs from this."""
    return 1 if call_tokens - nan_rows - inf_rows >= 2 else 0


def flag_nan_rows(call_tokens: int, act_granularity: str | None, zero_rows: int = 1, inf_rows: int = 0) -> int:
    """The NaN tokens a config built from command-line flags holds unless `--nan-rows` says
    otherwise (issue 48 item 5): one, where a NaN token's output is its own row's business (the
    activations' scales are not per tensor: one NaN there makes the shared scale, and so every
    output row, NaN) and the call keeps an ordinary token beside it and its zero (`zero_rows`: the
    one `flag_zero_rows` adds, or `--zero-rows`) and Inf rows, else none. Without it a kernel
    that squashes a NaN (nan_to_num on its input) or leaves a NaN row unwritten passes a default
    check. Zero rows come first: a two-token call keeps its padding token, not a NaN one."""
    return 1 if act_granularity != "tensor" and call_tokens - zero_rows - inf_rows >= 2 else 0


def check_int(name: str, value: Any, lo: int, hi: int, hi_text: str | None = None) -> int:
    """`value` as an int in [lo, hi]; TypeError/ValueError naming `name` and the range otherwise
    (the upper bound shown as `hi_text = hi` when it is derived from other fields)."""
    shown = f"[{lo}, {hi}]" if hi_text is None else f"[{lo}, {hi_text} = {hi}]"
    if not _is_int(value):
        raise TypeError(f"{name} must be an int in {shown}, got {type(value).__name__} {quoted(value)}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in {shown}, got {value}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def quoted(value: Any, limit: int = MAX_QUOTED_CHARS) -> str:
    """repr(value), cut to `limit` characters: error messages quote values that may be huge."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {quoted(key)}")
        seen[key] = value
    return seen


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (NaN and Infinity literals are not accepted)")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise ValueError(f"an integer literal of {len(text)} digits is out of range (at most {MAX_JSON_INT_DIGITS})")
    return int(text)


# Fields beyond the problem's core description, named in summaries and commands only when set.
OPT_IN_FIELDS = ("call_tokens", "router", "renormalize", "expert_scale_spread", "outlier_channels", "zero_rows",
                  "nan_rows", "inf_rows", "tie_heavy", "random_orders", "numerics", "swiglu_limit", "dropped_slots",
                  "shared_experts", "weight_scales", "act_scales", "routed_scaling_factor")
# Fields whose default changed (issue 42: 0 before, the spread and outliers every problem now
# has), named in every replay command whatever their value, so a command means the same problem
# under any later default. A command printed before the change that names neither rebuilt 0 and 0:
# `--expert-scale-spread 0 --outlier-channels 0` replays it (docs/inputs.md).
ALWAYS_NAMED = ("expert_scale_spread", "outlier_channels")
# outlier_channels is omitted from a config's JSON when 0, so a config without outliers serialises
# as every config did before the field existed (stored reproducers and their checksums unchanged);
# a JSON that names expert_scale_spread but not outlier_channels is such a config (to_json writes
# every other field) and means 0 outliers. A hand-written file naming neither gets the defaults.
# Fields a config's JSON names only when they are set: a config without them serialises exactly as
# it did before they existed, so stored reproducers and their checksums stay as they were.
OMITTED_WHEN_DEFAULT = ("weight_scales", "act_scales", "routed_scaling_factor")


@dataclass(frozen=True)
class MoEConfig:
    """One MoE problem and the optimized path's switches.

    Fields:
        num_tokens: T, tokens in the batch (1..MAX_TOKENS).
        num_experts: E, global experts (1..MAX_EXPERTS).
        topk: K, experts per token (1..E), distinct per token.
        hidden: H, model width (multiple of 128 for fp8-block).
        inter: I, expert intermediate width (multiple of 128 for fp8-block).
        quant: one of QUANT_SCHEMES.
        fused: SiLU-and-mul fused with the FP8 quantisation of the down input (fp8 only).
        activation: one of ACTIVATIONS.
        router_weight: "down" multiplies the down GEMM output by the router weight,
            "input" scales the hidden states before the gate-up GEMM (needs K == 1, as in vLLM).
        planner: "fixed" or "legacy" (the known-bad workspace plan, kept to prove it is caught).
        output: "workspace" carves the final output from ws1 (upstream's non-batched path),
            "separate" writes a caller-supplied tensor.
        expert_map: optional tuple of length E mapping global expert -> local index or -1
            (expert parallelism); the local indices must be exactly 0..L-1.
        skew: routing distribution, one of ALL_ROUTING_SKEWS ("all-remote" routes every token
            away from this rank when the expert map has at least K remote experts).
        call_tokens: T of the call, 0..num_tokens, or None for num_tokens: the workspaces and
            the implementation are built for num_tokens (the largest batch), the call carries
            the first call_tokens tokens, as an engine's smaller batches do.
        router: one of ROUTERS (see there); renormalize divides softmax-topk's K weights by
            their sum (softmax-topk only).
        expert_scale_spread: octaves of per-expert weight scale spread, 0..MAX_EXPERT_SCALE_SPREAD
            (default DEFAULT_EXPERT_SCALE_SPREAD; 0 before issue 42).
        outlier_channels: input channels of each local expert's w1 and w2 scaled up as outliers,
            0..MAX_OUTLIER_CHANNELS (default DEFAULT_OUTLIER_CHANNELS); a config JSON naming
            expert_scale_spread but not this field means 0 (see to_dict).
        zero_rows, nan_rows, inf_rows: tokens of the call made all-zero, holding one NaN, or
            holding one +-Inf (distinct tokens, together at most the call's T); opt-in inputs
            whose propagation reference/moe.py specifies.
        tie_heavy: hidden states with 4 significant bits and an amax of 3.5 = 448 * 2^-7 in
            every row and every 128-group, so the activation scale is exactly 2^-7 and about
            half the values land on e4m3 rounding midpoints (ties): a rounding-mode bug shows
            on every seed.
        seed: problem seed; the same config gives bitwise the same problem.
        random_orders: random program orders the schedule oracle runs beside identity and
            reversed, 0..MAX_RANDOM_ORDERS; their seeds are seed+1 .. seed+random_orders.
        numerics: the reference's rounding, a profile spec (one of NUMERICS_PROFILES, optionally
            followed by +point=choice overrides: diffmoe.problem.numerics), stored in its canonical
            form; or None for the profile the implementation declares (the harness resolves it
            before building the problem).
        swiglu_limit: None, or the SwiGLU clamp limit in (0, MAX_SWIGLU_LIMIT]: the activation is
            silu(min(gate, limit)) * clamp(up, -limit, limit) (gpt-oss; vLLM's gemm1_clamp_limit).
        dropped_slots: routed slots (of the config's T*K) whose topk_ids entry is -1, 0..T*K:
            slots the router or the expert-parallel dispatch leaves unrouted; they keep their
            router weight and contribute nothing.
        shared_experts: S, 0..min(MAX_SHARED_EXPERTS, K-1): the last S of the E experts are
            shared experts fused into the routed set, every token's last S slots pick them in
            order with weight SHARED_EXPERT_WEIGHT; the first K-S slots route among the first E-S.
        weight_scales: None (the quant scheme's own: fp8-tensor per tensor, fp8-token per output
            channel, fp8-block 128x128 blocks) or one of WEIGHT_SCALES; a pair outside SCALE_PAIRS is
            refused. Stored as None when it is the scheme's own, so an alias and its spelled-out
            pair are one config.
        act_scales: None (the quant scheme's own) or one of ACT_SCALES, which must be a granularity
            of quant's scaling unit (SCHEME_OF_ACT_SCALES), so it is always stored as None: `--act-scales`
            is the command line's way to name quant by its activation granularity.
        routed_scaling_factor: None, or the factor in (0, MAX_ROUTED_SCALING_FACTOR] the routed sum
            is multiplied by (DeepSeek-style models; reference/moe.py says where it rounds).
    """

    num_tokens: int = 8
    num_experts: int = 4
    topk: int = 2
    hidden: int = 256
    inter: int = 256
    quant: str = "fp8-token"
    fused: bool = False
    activation: str = "silu"
    router_weight: str = "down"
    planner: str = "fixed"
    output: str = "separate"
    expert_map: tuple[int, ...] | None = None
    skew: str = "uniform"
    seed: int = 0
    call_tokens: int | None = None
    router: str = "random-k"
    renormalize: bool = False
    expert_scale_spread: int = DEFAULT_EXPERT_SCALE_SPREAD
    outlier_channels: int = DEFAULT_OUTLIER_CHANNELS
    zero_rows: int = 0
    nan_rows: int = 0
    inf_rows: int = 0
    tie_heavy: bool = False
    random_orders: int = DEFAULT_RANDOM_ORDERS
    numerics: str | None = None
    swiglu_limit: float | None = None
    dropped_slots: int = 0
    shared_experts: int = 0
    weight_scales: str | None = None
    act_scales: str | None = None
    routed_scaling_factor: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.expert_map, list):  # accept a list from callers; store the hashable tuple
            object.__setattr__(self, "expert_map", tuple(self.expert_map))
        for name in ("swiglu_limit", "routed_scaling_factor"):  # 7 and 7.0 are one value; store the float
            if _is_int(getattr(self, name)):
                object.__setattr__(self, name, float(getattr(self, name)))
        # an alias and its spelled-out pair are one config: the scheme's own granularity is stored as None
        if WEIGHT_SCALES_OF_SCHEME.get(self.quant, object()) == self.weight_scales:
            object.__setattr__(self, "weight_scales", None)
        if ACT_SCALES_OF_SCHEME.get(self.quant, object()) == self.act_scales:
            object.__setattr__(self, "act_scales", None)
        if isinstance(self.numerics, str):  # one profile, one string: its canonical spec (validate names a bad one)
            with contextlib.suppress(ValueError):
                object.__setattr__(self, "numerics", parse_spec(self.numerics).spec)
        self.validate()

    # ---- derived sizes -------------------------------------------------------------
    @property
    def routed_rows(self) -> int:
        """TK: rows after routing (each token once per chosen expert)."""
        return self.num_tokens * self.topk

    @property
    def call_num_tokens(self) -> int:
        """T of the call: call_tokens, or num_tokens when it is None."""
        return self.num_tokens if self.call_tokens is None else self.call_tokens

    @property
    def special_rows(self) -> int:
        """Tokens of the call that are all-zero, NaN or Inf rows."""
        return self.zero_rows + self.nan_rows + self.inf_rows

    @property
    def estimated_bytes(self) -> int:
        """The size `validate` bounds by MAX_PROBLEM_BYTES (see `problem_bytes`)."""
        return problem_bytes(self.num_tokens, self.topk, self.hidden, self.inter, self.num_local_experts)

    @property
    def is_fp8(self) -> bool:
        return self.quant != "bf16"

    @property
    def weight_granularity(self) -> str | None:
        """The weights' scale granularity (one of WEIGHT_SCALES), None for bf16."""
        if not self.is_fp8:
            return None
        return self.weight_scales or WEIGHT_SCALES_OF_SCHEME[self.quant]

    @property
    def act_granularity(self) -> str | None:
        """The activations' scale granularity (one of ACT_SCALES), None for bf16."""
        if not self.is_fp8:
            return None
        return self.act_scales or ACT_SCALES_OF_SCHEME[self.quant]

    @property
    def weight_scheme(self) -> str:
        """The scheme name whose weight layout this config's weights have (`quant` for every alias;
        fp8-tensor's for per-tensor weights beside per-token activations, ...): what weight scale
        shapes and dequantisers read."""
        if not self.is_fp8:
            return self.quant
        return SCHEME_OF_WEIGHT_SCALES[self.weight_granularity]

    @property
    def scale_schemes(self) -> str | tuple[str, str]:
        """What the GEMM choice functions read (reference/rounding/gemm_reduce.py): `quant` when the
        weights are the scheme's own, else (activation scheme, weight scheme)."""
        return self.quant if self.weight_scheme == self.quant else (self.quant, self.weight_scheme)

    @property
    def numerics_profile(self) -> str:
        """The profile the reference follows, as its canonical spec: numerics, or DEFAULT_NUMERICS
        when it is None."""
        return DEFAULT_NUMERICS if self.numerics is None else self.numerics

    @property
    def rounding_profile(self) -> Profile:
        """The profile the reference follows, resolved: its choice at every rounding point."""
        return profile(self.numerics_profile)

    @property
    def num_local_experts(self) -> int:
        """L: experts whose weights this rank holds (E without an expert map)."""
        if self.expert_map is None:
            return self.num_experts
        return sum(1 for v in self.expert_map if v >= 0)

    @classmethod
    def unchecked(cls, **fields: Any) -> MoEConfig:
        """A config built without `validate()`, for a sampler whose draws are valid by construction.

        diffmoe.fuzz.plan_tier draws tens of thousands of configs a second; validate() was a quarter
        of its time (profiled, 20,000 plans). Its meta-test validates every draw, so a sampler bug
        still fails loudly. Anyone else: use the constructor.
        """
        self = object.__new__(cls)
        self.__dict__.update(_FIELD_DEFAULTS)  # a frozen dataclass blocks setattr, not its __dict__
        self.__dict__.update(fields)
        return self

    def replace(self, **changes: Any) -> MoEConfig:
        """A copy with some fields changed, validated."""
        return dataclasses.replace(self, **changes)

    # ---- validation ----------------------------------------------------------------
    def validate(self) -> MoEConfig:
        """Raise TypeError/ValueError naming the field and its allowed range; return self."""
        int_fields = {
            "num_tokens": (1, MAX_TOKENS),
            "num_experts": (1, MAX_EXPERTS),
            "topk": (1, MAX_EXPERTS),
            "hidden": (1, MAX_HIDDEN),
            "inter": (1, MAX_INTER),
            "seed": (0, MAX_SEED),
        }
        for name, (lo, hi) in int_fields.items():
            check_int(name, getattr(self, name), lo, hi)
        if self.topk > self.num_experts:
            raise ValueError(f"topk must be in [1, num_experts={self.num_experts}], got {self.topk}")
        if self.routed_rows > MAX_ROUTED_ROWS:
            raise ValueError(
                f"num_tokens * topk must be at most {MAX_ROUTED_ROWS}, got {self.num_tokens} * {self.topk}"
            )
        choices = {
            "quant": QUANT_SCHEMES,
            "activation": ACTIVATIONS,
            "router_weight": ROUTER_WEIGHT_PLACEMENTS,
            "planner": PLANNERS,
            "output": OUTPUT_PLACEMENTS,
            "skew": ALL_ROUTING_SKEWS,
            "router": ROUTERS,
        }
        for name, allowed in choices.items():
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a string, one of {list(allowed)}, got {quoted(value)}")
            if value not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {quoted(value)}")
        for name in ("fused", "renormalize", "tie_heavy"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {quoted(getattr(self, name))}")
        if self.fused and not self.is_fp8:
            raise ValueError("fused must be false for quant='bf16': fusion joins the activation with an FP8 quantisation")
        if self.quant == "fp8-block":
            for name in ("hidden", "inter"):
                if getattr(self, name) % QUANT_BLOCK:
                    raise ValueError(
                        f"{name} must be a multiple of {QUANT_BLOCK} for quant='fp8-block', got {getattr(self, name)}"
                    )
        if self.router_weight == "input" and self.topk != 1:
            raise ValueError(f"topk must be 1 when router_weight='input' (the weight scales the token itself), got {self.topk}")
        self._validate_expert_map()
        self._validate_inputs()
        self._validate_numerics()
        self._validate_model_features()
        self._validate_scales()
        if self.estimated_bytes > MAX_PROBLEM_BYTES:
            raise ValueError(
                f"num_tokens, num_experts, topk, hidden and inter describe {self.estimated_bytes / 2**30:.1f} GiB of float32 "
                f"weights and activations (L*3*I*H + T*H + T*K*(3*I + H) elements, L the local experts); at most "
                f"{MAX_PROBLEM_BYTES // 2**30} GiB (MAX_PROBLEM_BYTES) is allowed: fewer tokens, or an expert map "
                f"holding fewer local experts (--ep RANK/SIZE), shrinks it"
            )
        return self

    def _validate_inputs(self) -> None:
        if self.call_tokens is not None:
            check_int("call_tokens", self.call_tokens, 0, self.num_tokens)
        if self.renormalize and self.router != "softmax-topk":
            raise ValueError(f"renormalize applies to router='softmax-topk' only, got router={quoted(self.router)}")
        check_int("expert_scale_spread", self.expert_scale_spread, 0, MAX_EXPERT_SCALE_SPREAD)
        check_int("outlier_channels", self.outlier_channels, 0, MAX_OUTLIER_CHANNELS)
        check_int("random_orders", self.random_orders, 0, MAX_RANDOM_ORDERS)
        t = self.call_num_tokens
        for name in ("zero_rows", "nan_rows", "inf_rows"):
            check_int(name, getattr(self, name), 0, t)
        if self.special_rows > t:
            raise ValueError(
                f"zero_rows + nan_rows + inf_rows must be at most the call's tokens ({t}), got "
                f"{self.zero_rows} + {self.nan_rows} + {self.inf_rows}"
            )

    def _validate_model_features(self) -> None:
        limit = self.swiglu_limit
        if limit is not None:
            if not isinstance(limit, float):
                raise TypeError(f"swiglu_limit must be None or a float in (0, {MAX_SWIGLU_LIMIT:g}], got {quoted(limit)}")
            if not 0.0 < limit <= MAX_SWIGLU_LIMIT:  # False for NaN too
                raise ValueError(f"swiglu_limit must be finite and in (0, {MAX_SWIGLU_LIMIT:g}], got {limit!r}")
        check_int("dropped_slots", self.dropped_slots, 0, self.routed_rows, "num_tokens * topk")
        # topk - 1: at least one slot of every token is routed
        check_int("shared_experts", self.shared_experts, 0, min(MAX_SHARED_EXPERTS, self.topk - 1),
                  f"min({MAX_SHARED_EXPERTS}, topk - 1)")
        if limit is not None and self.numerics is not None and self.rounding_profile.uses(*NO_CLAMP):
            raise ValueError(f"swiglu_limit must be None with numerics={quoted(self.numerics)}: that profile has no "
                             f"clamp ({NO_CLAMP[0]}={NO_CLAMP[1]}, as neither Liger 0.8.5 nor lmdeploy 0.18 clamps), "
                             f"got {limit!r}")

    def _validate_scales(self) -> None:
        """The two granularity axes: known names, a pair some serving engine runs (SCALE_PAIRS), the
        activation's granularity one of quant's scaling unit; and the routed scaling factor."""
        for name, allowed in (("weight_scales", WEIGHT_SCALES), ("act_scales", ACT_SCALES)):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise TypeError(f"{name} must be None or a string, one of {list(allowed)}, got {quoted(value)}")
            if value not in allowed:
                raise ValueError(f"{name} must be None or one of {list(allowed)}, got {quoted(value)}")
            if not self.is_fp8:
                raise ValueError(f"{name} must be None for quant='bf16' (bf16 weights and activations have no scales), "
                                 f"got {quoted(value)}")
        if self.act_scales is not None and SCHEME_OF_ACT_SCALES[self.act_scales] != self.quant:
            raise ValueError(f"act_scales={quoted(self.act_scales)} needs quant={quoted(SCHEME_OF_ACT_SCALES[self.act_scales])} "
                             f"(quant names the activations' scaling unit), got quant={quoted(self.quant)}")
        if self.is_fp8 and (self.weight_granularity, self.act_granularity) not in SCALE_PAIRS:
            pairs = ", ".join(f"{w}/{a}" for w, a in SCALE_PAIRS)
            raise ValueError(f"weight_scales={quoted(self.weight_granularity)} with {quoted(self.act_granularity)} activation "
                             f"scales is no pair a serving engine runs; allowed weights/activations: {pairs}")
        factor = self.routed_scaling_factor
        if factor is not None:
            if not isinstance(factor, float):
                raise TypeError(f"routed_scaling_factor must be None or a float in (0, {MAX_ROUTED_SCALING_FACTOR:g}], "
                                f"got {quoted(factor)}")
            if not 0.0 < factor <= MAX_ROUTED_SCALING_FACTOR:  # False for NaN too
                raise ValueError(f"routed_scaling_factor must be finite and in (0, {MAX_ROUTED_SCALING_FACTOR:g}], "
                                 f"got {factor!r}")

    def _validate_numerics(self) -> None:
        """A profile spec, and a config its choices can describe (SCHEME_ONLY)."""
        if self.numerics is None:
            return
        chosen = parse_spec(self.numerics, "numerics", none_ok=True)
        for (point, choice), (scheme, why) in SCHEME_ONLY.items():
            if chosen.uses(point, choice) and self.quant != scheme:
                raise ValueError(f"numerics={quoted(self.numerics)} needs quant={quoted(scheme)} ({point}={choice}: "
                                 f"{why}), got quant={quoted(self.quant)}")

    def _validate_expert_map(self) -> None:
        m = self.expert_map
        if m is None:
            return
        if not isinstance(m, tuple) or not all(_is_int(v) for v in m):
            raise TypeError(f"expert_map must be a tuple of ints or None, got {quoted(m)}")
        if len(m) != self.num_experts:
            raise ValueError(f"expert_map must have length num_experts={self.num_experts}, got {len(m)}")
        local = sorted(v for v in m if v != -1)
        if any(v < -1 for v in m) or local != list(range(len(local))):
            raise ValueError(
                f"expert_map entries must be -1 or local indices 0..L-1 each used once, got {quoted(list(m))}"
            )
        if not local:
            raise ValueError("expert_map must keep at least one local expert (all entries are -1)")

    # ---- JSON ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["expert_map"] = None if self.expert_map is None else list(self.expert_map)
        for name in OMITTED_WHEN_DEFAULT:
            if d[name] is None:
                del d[name]
        if d["outlier_channels"] == 0:
            del d["outlier_channels"]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any) -> MoEConfig:
        if not isinstance(data, dict):
            raise TypeError(f"config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known, key=str)
        if unknown:
            shown = quoted(unknown, 200)
            raise ValueError(f"unknown config field(s) {shown}; allowed: {sorted(known)}")
        data = dict(data)
        if "expert_scale_spread" in data and "outlier_channels" not in data:  # written before the field existed
            data["outlier_channels"] = 0
        em = data.get("expert_map")
        if em is not None:
            if not isinstance(em, list):
                raise TypeError(f"expert_map must be a list of ints or null, got {quoted(em)}")
            if len(em) > MAX_EXPERTS:  # before a tuple of a hostile length is built
                raise ValueError(f"expert_map must have at most {MAX_EXPERTS} entries (num_experts), got {len(em)}")
            data["expert_map"] = tuple(em)
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> MoEConfig:
        """Parse a config file's text. Beyond JSON itself this refuses, with a one-line
        ValueError: more than MAX_CONFIG_JSON_CHARS characters, duplicate keys (JSON keeps the
        last silently), NaN/Infinity literals, integer literals longer than
        MAX_JSON_INT_DIGITS digits, and nesting deeper than Python's recursion limit."""
        if not isinstance(text, str):
            raise TypeError(f"config JSON must be a str, got {type(text).__name__}")
        if len(text) > MAX_CONFIG_JSON_CHARS:
            raise ValueError(f"config JSON must be at most {MAX_CONFIG_JSON_CHARS} characters, got {len(text)}")
        try:
            data = json.loads(
                text, object_pairs_hook=_reject_duplicate_keys, parse_constant=_reject_constant, parse_int=_bounded_int
            )
        except json.JSONDecodeError as exc:
            raise ValueError(f"config is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        except RecursionError:
            raise ValueError("config is not valid JSON: nested too deeply") from None
        except ValueError as exc:  # raised by the hooks above
            raise ValueError(f"config is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def with_flag_rows(self, given: Collection[str] = ()) -> MoEConfig:
        """This config with the zero and NaN rows the command line gives it by default
        (`flag_nan_rows`, then `flag_zero_rows`), except those named in `given` (the flags set)."""
        nan = self.nan_rows if "nan_rows" in given else flag_nan_rows(
            self.call_num_tokens, self.act_granularity, self.zero_rows if "zero_rows" in given else 1, self.inf_rows)
        zero = self.zero_rows if "zero_rows" in given else flag_zero_rows(self.call_num_tokens, nan, self.inf_rows)
        return self.replace(zero_rows=zero, nan_rows=nan)

    def opt_in_fields(self) -> list[tuple[str, Any]]:
        """(field, value) of every opt-in input and the schedule count that differs from its
        default, in declaration order (True for a switch that is on): what a summary or a
        replay command must add to the always-present fields."""
        defaults = MoEConfig.__dataclass_fields__
        return [
            (name, getattr(self, name)) for name in OPT_IN_FIELDS
            if getattr(self, name) != defaults[name].default
        ]

    def short(self) -> str:
        """A one-line human summary, e.g. for progress output."""
        parts = [
            f"T={self.num_tokens} E={self.num_experts} K={self.topk} H={self.hidden} I={self.inter}",
            self.quant,
            "fused" if self.fused else "unfused",
            f"planner={self.planner}",
            f"output={self.output}",
        ]
        if self.router_weight != "down":
            parts.append(f"router_weight={self.router_weight}")
        if self.expert_map is not None:
            placement = ep_placement(self.expert_map, self.shared_experts)
            parts.append(f"expert_map={list(self.expert_map)}" if placement is None else f"ep={placement[0]}/{placement[1]}")
        if self.skew != "uniform":
            parts.append(f"skew={self.skew}")
        parts += [name if value is True else f"{name}={value}" for name, value in self.opt_in_fields()]
        parts.append(f"seed={self.seed}")
        return " ".join(parts)


_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(MoEConfig)}
