"""Hypothesis strategies for `MoEConfig` and `Schedule`, with bounded, documented domains.

Every example runs both implementations under the Triton interpreter, so the domains are
kept small enough for a few seconds per example, and every field shrinks toward the
simplest config that still fails.

Domains of `moe_configs()` (draw order, which is also shrink priority):

* quant: ``QUANT_ORDER`` = fp8-tensor, fp8-token, bf16, fp8-block. fp8-tensor comes first
  because it is the simplest FP8 scheme (one scale) and allows the smallest sizes, so a
  failure that needs FP8 and the fused flag shrinks to fp8-tensor with the smallest H and I,
  and a failure that needs nothing scheme-specific shrinks there too. bf16 has no fused path
  and fp8-block forces H and I to multiples of 128, the largest sizes, hence last.
* num_tokens T: 1..max_tokens (default 96), further capped so that the token budget below
  holds with K = 1 and the smallest sizes. Half the draws come from the boundary list
  ``TOKEN_BOUNDARIES`` (1; 15, 16, 17; 31, 32, 33; 63, 64, 65 around the row-block sizes
  16, 32 and 64; 129 and the cap itself, above the largest block), kept where within range.
* num_experts E: 1..max_experts (default 64); half the draws are primes, which never
  divide a block or a grid evenly.
* topk K: 1..E, capped by the token budget; K == E is drawn on purpose (every expert busy).
* hidden H, inter I: fp8-block: multiples of 128 in 128..512; other schemes: 16..512, odd
  values included (masking of ragged tiles). Capped by both budgets.
* fused: True/False for FP8 schemes, always False for bf16 (the config rejects it).
* router_weight: "down", or "input" only when K == 1 (the config requires it).
* expert_map: None, or a map with local indices 0..L-1 each used once (L >= 1) and -1 for
  experts held elsewhere; shrinks to None first.
* skew: uniform, one-expert, empty-experts (``ROUTING_SKEWS`` order, uniform first).
* output: separate, workspace ("separate" first: fewer buffers in the workspaces).
* planner: fixed by default; a parameter (None draws fixed or legacy).
* seed: 0..2**32-1.

The opt-in inputs (drawn after the seed, so they shrink away first; each shrinks to off):

* call_tokens: about half the draws call with 1..T-1 tokens on workspaces built for T
  (None when T = 1), the smaller batches an engine sends between its largest ones.
* router: random-k or softmax-topk (``ROUTERS`` order); renormalize drawn for softmax-topk.
* expert_scale_spread: 0..MAX_EXPERT_SCALE_SPREAD octaves of per-expert weight scale.
* outlier_channels: 0..MAX_OUTLIER_CHANNELS outlier input channels per expert and weight, drawn
  last (after the weight granularity), so every earlier choice is what it was before the field
  existed (issue 42). Both shrink to 0, inputs that no longer tell experts apart; with
  `inputs=False` a config has the defaults of both (config.DEFAULT_EXPERT_SCALE_SPREAD, ...).
* tie_heavy: False/True.
* zero_rows, nan_rows, inf_rows (on by default; `special_rows=False` never draws them): 1 or 2
  zero rows in about half the draws, one NaN and one Inf row in about an eighth each, cut to
  the call's T (zero rows first; a one-token call may be padding alone). Why by
  default: serving engines pad a decode batch to the next CUDA-graph size with all-zero tokens
  and run the MoE on them every step (vLLM's capture sizes are 1, 2, 4 and multiples of 8, so
  most batch sizes are padded); a NaN or Inf token is what an upstream overflow sends. The bug
  zoo's scale-floor-dropped, nan-squashed-on-input and reduce-skips-non-finite-sums mutants are
  invisible without these rows (tests/bug_zoo/test_bug_zoo.py, their `unseen_without` configs pass);
  with them drawn by default, the default fuzz finds each from a cold start with no flag
  (tests/bug_zoo/test_bug_zoo_fuzzed.py). `special_rows=False` is `diffmoe fuzz --no-special-rows`.

numerics is never drawn (always None): the rounding profile is the implementation's to declare
(diffmoe.contract.NUMERICS), and the fuzzer resolves it as run_differential does.

The MoE-model features (only with `features=True`; drawn last, each shrinks to off). Off by
default: with them drawn, the default fuzz from a cold start (seed 0, 60 examples, T <= 32,
E <= 8; tests/bug_zoo/test_bug_zoo_fuzzed.py) missed two bug-zoo mutants it otherwise finds
(amax-over-capacity-rows, amax-pass-cached-across-calls), the budget spent on other draws:

* swiglu_limit: None in about three draws of four, or one of ``SWIGLU_LIMITS`` (7.0, gpt-oss's; 1.0 and 0.25, which clamp
  about a third and most of the generated gate-up values, roughly standard normal).
* dropped_slots: 0 in about three draws of four, else 1..min(MAX_DRAWN_DROPS, T*K) or (half of
  those) all T*K slots set to -1.
* shared_experts: 0..min(MAX_SHARED_EXPERTS, K-1).
* routed_scaling_factor: None in about three draws of four, or one of ``ROUTED_SCALING_FACTORS``
  (drawn after every other field, below).

The weights' scale granularity (issue 27 item 5; every FP8 draw, drawn after every other field so
that a draw's earlier choices are what they were before the axis existed): in about half the draws
of a scheme with another weight granularity a serving engine pairs with its activations
(`other_weight_scales`: per-tensor weights beside fp8-token's per-token activations), that one;
shrinks to the scheme's own. With the three scheme names this draws every pair of config.SCALE_PAIRS.

Budgets (enforced by construction: each size is drawn with an upper bound derived from the
sizes already drawn, so nothing is filtered out):

* ``TOKEN_BUDGET`` = 2**16 bounds T*K*max(H, I), the largest routed activation. The
  interpreter's cost per example grows with it and with E (every expert adds row blocks,
  even an empty one adds programs); `moe_configs(max_tokens=..., max_experts=...)` trade
  coverage for speed.
* ``WEIGHT_BUDGET`` = 2**22 bounds E*2I*H, the gate-up weight, which drives problem
  generation and the reference's float32 dequantisation (16 MiB per weight at most).

The minimal draw is ``MINIMAL_CONFIG`` (fp8-tensor, T=E=K=1, H=I=16, unfused, router weight
on the down GEMM, no expert map, uniform skew, separate output, fixed planner, seed 0, no expert
scale spread and no outlier channels);
the minimal draw with the fused flag on is ``MINIMAL_FUSED_CONFIG``, the same config fused.

Bounds (diffmoe.fuzz.bounds, `moe_configs(bounds=...)`, `diffmoe fuzz --topk 1..2`): every bounded
size is drawn within its bound, which may reach past the domain above to a real model's sizes
(`--experts 72`, `--hidden 4096`, `diffmoe fuzz --model NAME`; the config's own limits and its
MAX_PROBLEM_BYTES still hold); the caps above are derived from the bounds' lower ends, the budgets
grown to hold the smallest bounded config (a pin asks for it) at every T a `num_tokens` bound allows; a bounded choice is drawn from the
values it allows; a bounded opt-in field keeps a drawn value inside its bound and otherwise takes
one drawn from it, and a draw the config then refuses (3 NaN rows in a 2-token call) is rejected.
Without bounds the draws are exactly the unbounded ones (same seed, same examples).

Owns the drawn domains. Must not run a check: fuzzing.py and the tests do.
Longer than 400 lines because every field's domain lives here, the bounded one beside the
default, so the draw order (the shrink order) reads in one place.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from diffmoe.fuzz.bounds import FieldBounds
from diffmoe.problem.config import (
    ACT_SCALES_OF_SCHEME, ALL_ROUTING_SKEWS, MAX_EXPERT_SCALE_SPREAD, MAX_OUTLIER_CHANNELS, MAX_SHARED_EXPERTS, MAX_TOKENS, PLANNERS, QUANT_BLOCK,
    QUANT_SCHEMES, ROUTERS, ROUTING_SKEWS, SCALE_PAIRS, WEIGHT_SCALES_OF_SCHEME, MoEConfig, check_int,
)
from diffmoe.problem.config import MAX_EXPERTS as CONFIG_MAX_EXPERTS
from diffmoe.contract import SCHEDULE_KINDS, Schedule

QUANT_ORDER = ("fp8-tensor", "fp8-token", "bf16", "fp8-block")
OUTPUT_ORDER = ("separate", "workspace")
ROUTER_WEIGHT_ORDER = ("down", "input")

MIN_SIZE = 16  # H and I for schemes without a block constraint
MAX_SIZE = 512  # H and I for every scheme
MAX_EXPERTS = 64
DEFAULT_MAX_TOKENS = 96
MAX_DRAWN_SEED = 2**32 - 1
# Special rows of each kind per draw: one shows a kind's propagation, two show that it stays
# in its own token; more only costs time.
MAX_SPECIAL_ROWS = 2
# Zero (padding) rows in about half the draws (a coin), one or two of them: an engine's padded
# decode batches are the common case, not an edge, and a call of padding alone is real too (an
# idle data-parallel rank runs the MoE on a dummy batch to keep its collectives in step). NaN
# and Inf rows in about an eighth of the draws each (three coins), one row: a non-finite token
# makes its own output rows non-finite by definition (a per-tensor scale's whole output), so
# each such draw judges less of the rest of the problem. Off shrinks to none.
ZERO_ROW_COUNTS = (1, MAX_SPECIAL_ROWS)
NON_FINITE_COINS = 3
# SwiGLU limits drawn: gpt-oss's 7.0 (above almost every generated gate-up value, so the clamp
# path runs on unchanged values), 1.0 and 0.25 (the clamp changes a third and most of them).
SWIGLU_LIMITS = (7.0, 1.0, 0.25)
# Dropped slots drawn when some (not all) are: up to 64, cut to T*K.
MAX_DRAWN_DROPS = 64
# Routed scaling factors drawn when one is: DeepSeek-V3's 2.5, DeepSeek-V2's 16.0, and 0.5 (a factor
# below 1, which rounds values the sum alone leaves exact).
ROUTED_SCALING_FACTORS = (2.5, 16.0, 0.5)


def other_weight_scales(quant: str) -> tuple[str, ...]:
    """The weight granularities beside quant's own that a serving engine pairs with quant's activation
    scales (config.SCALE_PAIRS): per-tensor weights beside per-token activations for fp8-token."""
    if quant not in ACT_SCALES_OF_SCHEME:
        return ()
    act = ACT_SCALES_OF_SCHEME[quant]
    return tuple(w for w, a in SCALE_PAIRS if a == act and w != WEIGHT_SCALES_OF_SCHEME[quant])

TOKEN_BUDGET = 2**16  # T * K * max(H, I)
WEIGHT_BUDGET = 2**22  # E * 2I * H

# Row-block sizes of the GEMMs (16 and 32 for small batches and the interpreter, 64 the
# largest): off-by-one bugs live just below, at and just above each, and beyond the largest.
ROW_BLOCKS = (16, 32, 64)
TOKEN_BOUNDARIES = (1, *(b + d for b in ROW_BLOCKS for d in (-1, 0, 1)), 2 * ROW_BLOCKS[-1] + 1)

# Sizes a kernel author tends to test (tile-aligned) and ragged ones that need masking.
SIZE_HINTS = (16, 17, 32, 45, 64, 97, 127, 128, 129, 256, 384, 512)

PRIMES = tuple(p for p in range(2, MAX_EXPERTS + 1) if all(p % d for d in range(2, int(p**0.5) + 1)))

MINIMAL_CONFIG = MoEConfig(
    num_tokens=1,
    num_experts=1,
    topk=1,
    hidden=MIN_SIZE,
    inter=MIN_SIZE,
    quant=QUANT_ORDER[0],
    fused=False,
    router_weight="down",
    planner="fixed",
    output="separate",
    expert_map=None,
    skew="uniform",
    seed=0,
    expert_scale_spread=0,  # the drawn inputs shrink to off, below the defaults (issue 42)
    outlier_channels=0,
)
MINIMAL_FUSED_CONFIG = MINIMAL_CONFIG.replace(fused=True)


def size_floor(quant: str) -> int:
    """Smallest H or I the scheme allows in these domains (also the step between sizes)."""
    return QUANT_BLOCK if quant == "fp8-block" else MIN_SIZE


def _quant_choices(quant: str | Sequence[str] | None, fused: bool | None) -> tuple[str, ...]:
    if quant is None:
        wanted = set(QUANT_SCHEMES)
    elif isinstance(quant, str):
        wanted = {quant}
    else:
        wanted = set(quant)
    unknown = sorted(q for q in wanted if q not in QUANT_SCHEMES)
    if unknown or not wanted:
        raise ValueError(f"quant must be None, one of {list(QUANT_SCHEMES)} or a non-empty list of them, got {quant!r}")
    if fused:
        wanted.discard("bf16")  # the fused path exists for FP8 only
        if not wanted:
            raise ValueError("fused=True needs an fp8 quant scheme, got quant='bf16' only")
    return tuple(q for q in QUANT_ORDER if q in wanted)  # keep the documented shrink order


def biased_integers(lo: int, hi: int, specials: Sequence[int]) -> SearchStrategy[int]:
    """An int in lo..hi; about half the draws come from `specials` (those within range).

    Every draw makes the same three choices (take a special?, which special, which plain
    value) whatever the values, because Hypothesis shrinks toward *fewer* choices first: a
    branch that skipped a choice would look simpler than the smallest value and win the
    shrink. Each choice shrinks to its first option, so the result shrinks toward `lo`.
    """
    if lo > hi:
        raise ValueError(f"empty range: lo={lo} > hi={hi}")
    kept = sorted({v for v in specials if lo <= v <= hi}) or [lo]
    # tuples + map rather than st.composite: these are built once per draw inside
    # moe_configs, and composite's construction (it reads the function's source) would
    # dominate the generation time.
    choices = st.tuples(st.booleans(), st.integers(0, len(kept) - 1), st.integers(lo, hi))
    return choices.map(lambda c: kept[c[1]] if c[0] else c[2])


def token_counts(cap: int, lo: int = 1) -> SearchStrategy[int]:
    """T in lo..cap, biased to the block boundaries that fit and to the cap itself."""
    return biased_integers(lo, cap, (*TOKEN_BOUNDARIES, cap))


def expert_counts(cap: int = MAX_EXPERTS, lo: int = 1) -> SearchStrategy[int]:
    """E in lo..cap, biased to primes."""
    return biased_integers(lo, cap, PRIMES)


def hidden_sizes(quant: str, cap: int, lo: int | None = None) -> SearchStrategy[int]:
    """H or I for `quant` in floor..min(cap, MAX_SIZE): multiples of 128 for fp8-block. `lo`
    (a bound, diffmoe.fuzz.bounds) replaces the floor (for fp8-block rounded up to a multiple) and
    lifts the MAX_SIZE cap: a bounded size is drawn within its bound, a model's sizes included."""
    floor = size_floor(quant) if lo is None else lo
    cap = min(cap, MAX_SIZE) if lo is None else cap
    if cap < floor:
        raise ValueError(f"size cap must be at least {floor} for quant={quant!r}, got {cap}")
    if quant == "fp8-block":
        # Same shape of choices as the other schemes, so switching scheme costs nothing.
        first = max(1, -(-floor // QUANT_BLOCK))
        return biased_integers(first, cap // QUANT_BLOCK, (cap // QUANT_BLOCK,)).map(lambda n: n * QUANT_BLOCK)
    return biased_integers(floor, cap, SIZE_HINTS)


def expert_maps(num_experts: int) -> SearchStrategy[tuple[int, ...]]:
    """Valid maps: L >= 1 local experts numbered 0..L-1 once each, the rest -1.

    The permutation says which global experts are local and in what local order; it shrinks
    to the identity and L to 1, so the simplest map is (0, -1, -1, ...).
    """

    def to_map(drawn: tuple[list[int], int]) -> tuple[int, ...]:
        order, num_local = drawn
        mapping = [-1] * num_experts
        for local, global_id in enumerate(order[:num_local]):
            mapping[global_id] = local
        return tuple(mapping)

    return st.tuples(st.permutations(range(num_experts)), st.integers(1, num_experts)).map(to_map)


def moe_configs(
    *,
    planner: str | None = "fixed",
    max_tokens: int = DEFAULT_MAX_TOKENS,
    quant: str | Sequence[str] | None = None,
    fused: bool | None = None,
    max_experts: int = MAX_EXPERTS,
    expert_map: bool = True,
    token_budget: int = TOKEN_BUDGET,
    weight_budget: int = WEIGHT_BUDGET,
    inputs: bool = True,
    special_rows: bool = True,
    features: bool = False,
    bounds: FieldBounds | None = None,
) -> SearchStrategy[MoEConfig]:
    """Valid MoEConfigs within the module's documented domains.

    planner: "fixed"/"legacy" pins it; None draws either. quant: pins a scheme or a list of
    schemes (kept in QUANT_ORDER). fused: None draws it for FP8 schemes; True/False pins it.
    expert_map: False never draws a map. The budgets bound T*K*max(H, I) and E*2I*H.
    inputs: False never draws the opt-in inputs (call_tokens, router, spread, outliers, tie_heavy): each keeps its default.
    special_rows: True (default) draws all-zero, NaN and Inf rows at the module's shares; False never.
    features: True also draws the MoE-model features (swiglu_limit, dropped_slots, shared_experts).
    bounds: pins and ranges of any field (diffmoe.fuzz.bounds; `diffmoe fuzz --topk 1..2`), drawn
    only within them (see `_bounded_plan`).
    """
    if planner is not None and planner not in PLANNERS:
        raise ValueError(f"planner must be None or one of {list(PLANNERS)}, got {planner!r}")
    check_int("max_tokens", max_tokens, 1, MAX_TOKENS)
    check_int("max_experts", max_experts, 1, MAX_EXPERTS)
    if fused is not None and not isinstance(fused, bool):
        raise TypeError(f"fused must be None or a bool, got {fused!r}")
    for name, value in (("expert_map", expert_map), ("inputs", inputs), ("special_rows", special_rows),
                        ("features", features)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
    if bounds is not None and not isinstance(bounds, FieldBounds):
        raise TypeError(f"bounds must be None or a diffmoe.fuzz.bounds.FieldBounds, got {bounds!r}")
    b = bounds or FieldBounds()
    if fused is None and len(b.allowed("fused", (False, True))) == 1:
        fused = b.pinned("fused")
    quants = _quant_choices(quant, fused)
    planners = PLANNERS if planner is None else (planner,)
    if b:
        quants, planners, token_budget, weight_budget = _bounded_plan(b, quants, planners, max_tokens, max_experts,
                                                                      token_budget, weight_budget)
    floor = max(size_floor(q) for q in quants)
    # The smallest config of every allowed scheme must fit, or construction could dead-end.
    check_int("token_budget", token_budget, floor, 2**40)
    check_int("weight_budget", weight_budget, 2 * max_experts * floor * floor, 2**40)
    em_pin = b.values.get("expert_map", (None,))[0]
    rw_allowed = b.allowed("router_weight", ROUTER_WEIGHT_ORDER)
    k_lo, k_hi = b.range("topk", 1, 1 if rw_allowed == ("input",) else CONFIG_MAX_EXPERTS)
    e_lo, e_hi = _expert_range(b, k_lo, max_experts)
    if em_pin is not None:
        e_lo = e_hi = len(em_pin)

    def size_bounds(q: str, name: str) -> tuple[int | None, int]:
        """(floor or None when unbounded, ceiling) of H or I for scheme q."""
        if name not in b.ranges:
            return None, MAX_SIZE
        lo, hi = b.ranges[name]
        if q == "fp8-block":
            return max(QUANT_BLOCK, -(-lo // QUANT_BLOCK) * QUANT_BLOCK), hi // QUANT_BLOCK * QUANT_BLOCK
        return lo, hi

    @st.composite
    def build(draw) -> MoEConfig:
        q = draw(st.sampled_from(quants))
        lo = size_floor(q)
        (h_lo, h_hi), (i_lo, i_hi) = size_bounds(q, "hidden"), size_bounds(q, "inter")
        h_min, i_min = lo if h_lo is None else h_lo, lo if i_lo is None else i_lo
        act_min = max(h_min, i_min)
        t_lo, t_hi = b.range("num_tokens", 1, max_tokens)
        t = draw(token_counts(min(t_hi, token_budget // (k_lo * act_min)), t_lo))
        e = draw(expert_counts(min(e_hi, weight_budget // (2 * h_min * i_min)), e_lo))
        k_cap = min(e, k_hi, token_budget // (t * act_min))
        # K == E drawn on purpose: with every expert busy, block padding is at its largest.
        k = draw(biased_integers(k_lo, k_cap, (k_cap,)))
        act_cap = token_budget // (t * k)  # max(H, I) under the token budget
        h = draw(hidden_sizes(q, min(h_hi, act_cap, weight_budget // (2 * e * i_min)), h_lo))
        i = draw(hidden_sizes(q, min(i_hi, act_cap, weight_budget // (2 * e * h)), i_lo))
        # Drawn whether or not they apply (see biased_integers: a skipped choice would make
        # bf16 or K > 1 look simpler to the shrinker than they are).
        drawn_fused = draw(st.booleans())
        drawn_rw = draw(st.sampled_from(rw_allowed))
        f = False if q == "bf16" else (drawn_fused if fused is None else fused)
        rw = drawn_rw if k == 1 else "down"
        if em_pin is not None:
            em = em_pin
        else:
            em = draw(st.one_of(st.none(), expert_maps(e))) if expert_map else None
        skew = draw(st.sampled_from(b.allowed("skew", ROUTING_SKEWS, ALL_ROUTING_SKEWS)))
        output = draw(st.sampled_from(b.allowed("output", OUTPUT_ORDER)))
        chosen_planner = draw(st.sampled_from(planners))
        seed = draw(st.integers(*b.ranges.get("seed", (0, MAX_DRAWN_SEED))))
        extra = draw(_input_fields(t)) if inputs else {}
        if b:
            extra = draw(_within_bounds(b, extra, INPUT_FIELDS))
        if special_rows:
            extra.update(draw(_special_row_fields(t if extra.get("call_tokens") is None else extra["call_tokens"])))
        if features:
            extra.update(draw(_feature_fields(t, k)))
        if b:
            extra = draw(_within_bounds(b, extra, LATER_FIELDS))
        # drawn last, and only for a scheme that has another weight granularity, so every earlier choice
        # of a draw is what it was before these axes existed, and a draw of another scheme draws nothing
        # more (an unconditional coin moved the legacy-planner shrink of tests/fuzz/test_strategies.py from
        # 33 routed rows to 34); each shrinks to the scheme's own weights and no scaling factor
        if other_weight_scales(q) and draw(st.booleans()):
            extra["weight_scales"] = draw(st.sampled_from(other_weight_scales(q)))
        if inputs:
            extra["outlier_channels"] = draw(st.integers(0, MAX_OUTLIER_CHANNELS))
        if b:
            extra = draw(_within_bounds(b, extra, LAST_FIELDS))
        if features:
            scaled, factor = draw(st.tuples(st.tuples(st.booleans(), st.booleans()).map(all),
                                            st.sampled_from(ROUTED_SCALING_FACTORS)))
            extra["routed_scaling_factor"] = factor if scaled else None
        if "routed_scaling_factor" in b.values:  # a pin (`--model deepseek-v3`): no choice drawn for it
            extra["routed_scaling_factor"] = b.values["routed_scaling_factor"][0]
        fields = dict(
            num_tokens=t,
            num_experts=e,
            topk=k,
            hidden=h,
            inter=i,
            quant=q,
            fused=f,
            router_weight=rw,
            expert_map=em,
            skew=skew,
            output=output,
            planner=chosen_planner,
            seed=seed,
            **extra,
        )
        if not b:
            return MoEConfig(**fields)
        try:  # a pinned opt-in field the drawn sizes cannot hold (3 NaN rows in a 2-token call): not an example
            return MoEConfig(**fields)
        except ValueError:
            reject()

    return build()


# The opt-in fields a bound may override after the sizes are drawn: the inputs (before the special
# rows, which are cut to the call's tokens), then the rest.
INPUT_FIELDS = ("call_tokens", "router", "renormalize", "expert_scale_spread", "tie_heavy")
LAST_FIELDS = ("outlier_channels",)
LATER_FIELDS = ("zero_rows", "nan_rows", "inf_rows", "random_orders", "numerics", "swiglu_limit", "dropped_slots",
                "shared_experts")
_DEFAULTS = MoEConfig()


def _within_bounds(b: FieldBounds, extra: dict, names: Sequence[str]) -> SearchStrategy[dict]:
    """`extra` with every bounded field among `names` moved inside its bound: a drawn value already
    inside stays, any other is replaced by one drawn from the bound (always drawn: fixed shape)."""
    ranged = [n for n in names if n in b.ranges]
    valued = [n for n in names if n in b.values]
    choices = st.tuples(*(st.integers(*b.ranges[n]) for n in ranged), *(st.sampled_from(b.values[n]) for n in valued))

    def to_fields(c: tuple) -> dict:
        out = dict(extra)
        for n, v in zip((*ranged, *valued), c):
            current = out.get(n, getattr(_DEFAULTS, n))
            inside = current is not None and b.ranges[n][0] <= current <= b.ranges[n][1] if n in b.ranges else \
                current in b.values[n]
            if not inside:
                out[n] = v
        if "router" in names and out.get("router") != "softmax-topk" and "renormalize" not in b.values:
            out["renormalize"] = False  # a router pinned away from softmax-topk takes renormalize off with it
        return out

    return choices.map(to_fields)


def _bounded_plan(b: FieldBounds, quants: tuple[str, ...], planners: tuple[str, ...], max_tokens: int,
                  max_experts: int, token_budget: int, weight_budget: int):
    """The schemes and planners the bounds leave, and the budgets grown to hold the smallest
    bounded config of every scheme left (a pin asks for that config: the budgets bound cost, they
    must not refuse what was asked). ValueError naming the field when nothing is left."""
    quants = b.allowed("quant", quants)
    if not quants:
        raise ValueError(f"quant must be one of {list(b.values['quant'])} and an fp8 scheme when fused is pinned on; none is left")
    planners = b.allowed("planner", planners)
    if not planners:
        raise ValueError(f"planner must be one of {list(b.values['planner'])} and match the fuzz's planner; none is left")
    t_lo, t_hi = b.range("num_tokens", 1, max_tokens)
    if t_lo > t_hi:
        raise ValueError(f"num_tokens must be bounded within [1, max_tokens = {max_tokens}], got {b.ranges['num_tokens']}")
    rw = b.allowed("router_weight", ROUTER_WEIGHT_ORDER)
    k_lo, k_hi = b.range("topk", 1, 1 if rw == ("input",) else CONFIG_MAX_EXPERTS)
    if k_lo > k_hi:
        raise ValueError("topk must be 1 when router_weight is pinned to 'input' (the weight scales the token itself)")
    e_lo, e_hi = _expert_range(b, k_lo, max_experts)
    em = b.values.get("expert_map", (None,))[0]
    if em is not None and not e_lo <= len(em) <= e_hi:
        raise ValueError(f"expert_map pins num_experts to {len(em)}, outside the other bounds (num_experts {e_lo}..{e_hi}, topk >= {k_lo})")
    if e_lo > e_hi:
        raise ValueError(f"num_experts must be at least topk's lower bound {k_lo} and at most {e_hi}: the bounds leave none")
    if em is not None:
        e_lo = len(em)
    kept = []
    for q in quants:
        sizes = []
        for name in ("hidden", "inter"):
            lo, hi = b.ranges.get(name, (size_floor(q), MAX_SIZE))
            if q == "fp8-block":
                lo, hi = max(QUANT_BLOCK, -(-lo // QUANT_BLOCK) * QUANT_BLOCK), hi // QUANT_BLOCK * QUANT_BLOCK
            sizes.append((lo, hi))
        if all(lo <= hi for lo, hi in sizes):
            kept.append(q)
            (h, _), (i, _) = sizes
            # a bounded T is drawn over its whole bound (`--tokens 8192..65536` at a model's sizes)
            t_held = t_hi if "num_tokens" in b.ranges else t_lo
            token_budget = max(token_budget, t_held * k_lo * max(h, i))
            weight_budget = max(weight_budget, 2 * e_lo * h * i, 2 * max_experts * size_floor(q) ** 2)
    if not kept:
        raise ValueError(f"hidden and inter must hold a multiple of {QUANT_BLOCK} for quant='fp8-block' (the only "
                         f"scheme left), got {b.ranges.get('hidden')} and {b.ranges.get('inter')}")
    return tuple(kept), planners, token_budget, weight_budget


def _expert_range(b: FieldBounds, k_lo: int, max_experts: int) -> tuple[int, int]:
    """E's range: a bound's own (which may pass max_experts: a model's E), else 1..max_experts, or up to a
    pinned expert map's length; at least K's floor."""
    if "num_experts" in b.ranges:
        lo, hi = b.ranges["num_experts"]
        return max(lo, k_lo, 1), hi
    em = b.values.get("expert_map", (None,))[0]
    return max(1, k_lo), max_experts if em is None else max(max_experts, len(em))


def _input_fields(num_tokens: int) -> SearchStrategy[dict]:
    """call_tokens, router, renormalize, expert_scale_spread, tie_heavy (fixed shape of choices)."""
    choices = st.tuples(
        st.booleans(), st.integers(1, max(1, num_tokens - 1)),  # a call below the maximum? with how many
        st.sampled_from(ROUTERS), st.booleans(),
        st.integers(0, MAX_EXPERT_SCALE_SPREAD),
        st.booleans(),
    )

    def to_fields(c: tuple) -> dict:
        below, call, router, renormalize, spread, tie_heavy = c
        return dict(
            call_tokens=call if below and num_tokens > 1 else None,
            router=router,
            renormalize=renormalize and router == "softmax-topk",
            expert_scale_spread=spread,
            tie_heavy=tie_heavy,
        )

    return choices.map(to_fields)


def _special_row_fields(call_tokens: int) -> SearchStrategy[dict]:
    """zero_rows, nan_rows, inf_rows at the shares above, cut to the call's tokens (zero rows
    first, then NaN, then Inf). Coins, not one sampled count: drawn from (0, 0, 1, 2) with
    sampled_from, zero rows came in 7 of 31 of the default fuzz's first configs with room for
    them (seed 0), not the half meant; Hypothesis leans to a choice's first option."""
    rare = st.tuples(*(st.booleans() for _ in range(NON_FINITE_COINS))).map(all)
    counts = st.tuples(st.booleans(), st.sampled_from(ZERO_ROW_COUNTS), rare, rare)

    def to_fields(c: tuple[bool, int, bool, bool]) -> dict:
        zero_on, zeros, nan_on, inf_on = c
        left, fields = call_tokens, {}
        for name, wanted in (("zero_rows", zeros if zero_on else 0), ("nan_rows", int(nan_on)), ("inf_rows", int(inf_on))):
            fields[name] = min(wanted, left)
            left -= fields[name]
        return fields

    return counts.map(to_fields)


def _feature_fields(num_tokens: int, topk: int) -> SearchStrategy[dict]:
    """swiglu_limit, dropped_slots, shared_experts. The choices' ranges do not depend on T or K
    (counts are cut to the config afterwards): a range that moved with K would let the
    shrinker's replay of a smaller K land on different choices (see biased_integers)."""
    routed = num_tokens * topk
    # The limit and the drops are each on in about a quarter of the draws (two booleans): a peer
    # refusing both (peers/) still gets about half the draws, the fuzzers drawing around refusals.
    on = st.tuples(st.booleans(), st.booleans()).map(all)
    choices = st.tuples(
        on, st.sampled_from(SWIGLU_LIMITS),
        on, st.booleans(), st.integers(1, MAX_DRAWN_DROPS),  # drop? all? how many
        st.integers(0, MAX_SHARED_EXPERTS),
    )

    def to_fields(c: tuple) -> dict:
        clamp, limit, drop, drop_all, dropped, shared = c
        dropped = (routed if drop_all else min(dropped, routed)) if drop else 0
        return dict(swiglu_limit=limit if clamp else None, dropped_slots=dropped, shared_experts=min(shared, topk - 1))

    return choices.map(to_fields)


def schedules(max_seed: int = 2**16) -> SearchStrategy[Schedule]:
    """identity, reversed, or random:SEED with SEED in 0..max_seed; shrinks to identity."""
    check_int("max_seed", max_seed, 0, 2**63 - 1)
    # Kind and seed are both always drawn (fixed shape, see biased_integers); the seed is
    # only used by random.
    kind_and_seed = st.tuples(st.sampled_from(SCHEDULE_KINDS), st.integers(0, max_seed))
    return kind_and_seed.map(lambda ks: Schedule(ks[0], ks[1] if ks[0] == "random" else 0))
