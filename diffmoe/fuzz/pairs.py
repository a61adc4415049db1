"""The scale-granularity pairs every fuzz meets early, each at a size where a mix-up of the two shows.

Why (issue 48 item 5): the strategies draw the weights' and the activations' granularity as two
axes (diffmoe.fuzz.strategies), and a default fuzz drew per-tensor weights beside per-token
activations in 9 % of its examples, the first of them with T = K = 1, where every activation scale
is the one token's: a kernel that ran that pair down the per-tensor path (`tensor-path-for-tensor-
weights` in tests/support/bug_zoo.py) went unfound in 100 examples.

How: the generate phase's examples FORCED_SLOTS (the 2nd, 4th, 6th and 8th it runs; the first is
Hypothesis's simplest draw, left as it is) run the drawn config moved to one pair of
config.SCALE_PAIRS each, at the floors below (`force_pair`): the call keeps MIN_ORDINARY_TOKENS
ordinary tokens beside its zero, NaN and Inf rows (row 0's scale differs from some other row's),
K >= MIN_TOPK (the down GEMM's rows of one token are scaled apart), and fp8-block's H and I hold
two 128-wide groups; sizes the draw made larger stay, cut back where a budget of the strategies
needs it. Every other field is the draw's. The remap is applied to the finished config, not while
drawing: a value forced inside the draw would move the ranges of the later draws, which Hypothesis
reports as inconsistent data generation, and the search's own draws stay what they were.

Shrinking replays one mapping: at the first failure of a forced example the driver judges the
unforced draw, then the draw moved to the pair without the floors, and pins the first mode that
fails (`PairForcing.ladder`; the forced config itself last, known to fail). Every shrinking run is mapped
by that mode, so the shrinker judges exactly what it believes it judged, and the failure shrinks
freely when the pair or the floors were not what made it. A failure pinned at the floors shrinks
within them; the driver then walks the config below them one field at a time (diffmoe/fuzz/
descent.py), and a note says so only when no field could go below its floor (`floors_hold`). A
forced config the user's bounds, the fuzz's max_tokens / max_experts or the implementation's
`supports` refuse is not run: the slot runs its draw. A database replay maps nothing (it does not
know the mode): a stored failure of a forced example replays as its draw, and the next search
forces the pairs at the same slots again.

Owns the forced pairs, their slots and floors, and a round's pinned mode. Must not draw or judge.
"""

from __future__ import annotations

from typing import Callable

from diffmoe.fuzz.strategies import MAX_SIZE, MIN_SIZE, TOKEN_BUDGET, WEIGHT_BUDGET
from diffmoe.problem.config import QUANT_BLOCK, SCALE_PAIRS, SCHEME_OF_ACT_SCALES, MoEConfig

# generate-phase example (1-based) -> the pair it is moved to: every pair within the first 8
FORCED_SLOTS = {2 * (n + 1): pair for n, pair in enumerate(SCALE_PAIRS)}
# at least this many tokens in the call besides its special rows: token 0 may be a zero row, and a
# scale read from the wrong token shows only where two ordinary tokens' amaxes differ
MIN_ORDINARY_TOKENS = 3
MIN_CALL_TOKENS = 4
MIN_TOPK = 2
MIN_BLOCK_SIZE = 2 * QUANT_BLOCK  # two 1x128 groups per row, 2x2 weight blocks

Pair = tuple[str, str]
Mode = tuple[Pair, bool]  # (the pair, whether at the floors)


def force_pair(config: MoEConfig, pair: Pair, floors: bool = True) -> MoEConfig | None:
    """`config` moved to `pair` (weights, activations) of config.SCALE_PAIRS, at the floors when
    `floors`; None where no valid config results (the caller then runs the draw)."""
    weights, acts = pair
    quant = SCHEME_OF_ACT_SCALES[acts]
    c = config
    block = quant == "fp8-block"
    floor = MIN_BLOCK_SIZE if block and floors else QUANT_BLOCK if block else MIN_SIZE

    def size(v: int) -> int:  # fp8-block: a multiple of 128
        return min(MAX_SIZE, max(floor, -(-v // QUANT_BLOCK) * QUANT_BLOCK)) if block else max(floor, v)

    h, i = size(c.hidden), size(c.inter)
    call, t, k, e, expert_map = c.call_num_tokens, c.num_tokens, c.topk, c.num_experts, c.expert_map
    need = max(MIN_CALL_TOKENS, c.special_rows + MIN_ORDINARY_TOKENS) if floors else max(1, c.special_rows)
    if floors:
        call = max(call, need)
        t, k = max(t, call), max(k, MIN_TOPK)
    # the strategies' budgets: the draw's larger sizes cut back (T to the call, then H and I, then K or E)
    if t * k * max(h, i) > TOKEN_BUDGET:
        t = call = min(call, max(need, TOKEN_BUDGET // (k * max(h, i))))
    if t * k * max(h, i) > TOKEN_BUDGET:
        h = i = floor
    if t * k * max(h, i) > TOKEN_BUDGET:
        k = max(1, TOKEN_BUDGET // (t * max(h, i)))
    if e < k:  # experts for the raised K, the added ones held elsewhere (-1) under a map
        expert_map = None if expert_map is None else expert_map + (-1,) * (k - e)
        e = k
    if e * 2 * h * i > WEIGHT_BUDGET:
        h = i = floor
    if e * 2 * h * i > WEIGHT_BUDGET:
        e, expert_map = max(1, WEIGHT_BUDGET // (2 * h * i)), None
        k = min(k, e)
    try:
        return c.replace(
            quant=quant, weight_scales=weights, act_scales=None, fused=c.fused and c.is_fp8,
            num_tokens=t, call_tokens=None if call == t else call, topk=k, num_experts=e, expert_map=expert_map,
            hidden=h, inter=i, router_weight=c.router_weight if k == 1 else "down",
            dropped_slots=min(c.dropped_slots, call * k), shared_experts=min(c.shared_experts, k - 1),
        )
    except (TypeError, ValueError):
        return None


class PairForcing:
    """One search round's forcing: the generate phase's slot and, after the first failure, the pinned mode."""

    def __init__(self, runs: Callable[[MoEConfig], bool]) -> None:
        self.runs = runs  # whether the fuzz may run a config (bounds, max sizes, the implementation's `supports`)
        self.slot = 0  # generate-phase examples run this round
        self.pinned: Mode | None = None

    def reset(self) -> None:
        self.slot, self.pinned = 0, None

    def mapped(self, drawn: MoEConfig, mode: Mode | None) -> MoEConfig:
        """The config `mode` maps the draw to: the draw itself where it maps to nothing the fuzz runs."""
        if mode is None:
            return drawn
        forced = force_pair(drawn, *mode)
        return forced if forced is not None and self.runs(forced) else drawn

    def slot_mode(self) -> Mode | None:
        """The mode of the generate phase's next example: its slot's pair at the floors, or none."""
        pair = FORCED_SLOTS.get(self.slot + 1)
        return None if pair is None else (pair, True)

    @staticmethod
    def ladder(mode: Mode) -> list[Mode | None]:
        """The modes tried, in order, when an example forced by `mode` fails: the draw, the pair
        without the floors, then `mode` itself (known to fail)."""
        return [None, (mode[0], False), mode]


def floors_hold(config: MoEConfig) -> bool:
    """Whether `config` is at or above every floor of `force_pair` (a descent below them found nothing)."""
    return (config.num_tokens >= MIN_CALL_TOKENS and config.topk >= MIN_TOPK
            and config.call_num_tokens - config.special_rows >= MIN_ORDINARY_TOKENS
            and (config.quant != "fp8-block" or min(config.hidden, config.inter) >= MIN_BLOCK_SIZE))


def forced_note(pair: Pair) -> str:
    """The outcome's note when a failure shrank within a forced pair's floors and no field went below them."""
    return (f"the first failure came on an example moved to {pair[0]}/{pair[1]} scales at the forced floors (the call's "
            f"ordinary tokens >= {MIN_ORDINARY_TOKENS}, T >= {MIN_CALL_TOKENS}, K >= {MIN_TOPK}, fp8-block H and I >= "
            f"{MIN_BLOCK_SIZE}), where neither its draw nor the pair alone failed: it shrank within those floors and "
            "held at the floors, no field failing below its own (diffmoe/fuzz/descent.py), so a smaller config "
            "may fail with several fields below them")
