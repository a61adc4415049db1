"""The descent below a forced pair's floors: after Hypothesis's shrink, one field at a time.

Why: a failure first met on an example the generate phase moved to a scale-granularity pair at its
floors (diffmoe/fuzz/pairs.py: T >= 4, K >= 2, >= 3 ordinary tokens, fp8-block H and I >= 256),
whose draw and unfloored pair pass, shrinks with that mapping pinned, so Hypothesis cannot go
below the floors: the museum's stale-EP-rows bug shrank to T=4 E=2 K=2 where the bug needs T=1 E=1
K=1 (the revert 47c5177). Hypothesis shrinks the draw, not the config, so no draw reaches a config
below a floor; this descent works on the config itself.

How (`descend`): from the config the shrink ended on, each field of FIELDS in turn (the pair first:
the minimal draw's tensor/tensor scales; then T, whose call's tokens, and so its ordinary ones,
come down with it; K; E; H; I) tries its smallest value first, then values halving the distance
back to the current one (`steps`), in increasing order, and keeps the first candidate that fails
the same way; the fields are walked again until none moves. The caller judges each candidate (the
shrink's judge, counted as a shrinking run) and says which it may run (bounds, max sizes, the
implementation's `supports`); a candidate no valid config gives is skipped. A limit on the
candidates judged stops it (diffmoe/fuzz/shrink_limits.py: runs, not seconds, so the same seed
reaches the same config on a busy machine; the caller says so, as for a cut shrink).

Owns the candidate configs and the order they are tried in. Must not judge or count.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from diffmoe.fuzz import shrink_limits
from diffmoe.fuzz.strategies import MINIMAL_CONFIG, size_floor
from diffmoe.problem.config import MoEConfig

R = TypeVar("R")

FIELDS = ("pair", "num_tokens", "topk", "num_experts", "hidden", "inter")


def steps(value: int, low: int, unit: int = 1) -> list[int]:
    """Values below `value` to try, in increasing order: `low`, then `value` less half the distance,
    a quarter, ... down to one `unit` (sizes of fp8-block move by 128)."""
    out = [low] if value > low else []
    units = (value - low) // unit // 2
    while units >= 1:
        if value - units * unit not in out:
            out.append(value - units * unit)
        units //= 2
    return out


def _local_map(expert_map: tuple[int, ...] | None, experts: int) -> tuple[int, ...] | None:
    """The first `experts` entries of the map, local indices renumbered 0..L-1 in order (one kept local)."""
    if expert_map is None:
        return None
    kept = list(expert_map[:experts])
    if all(v < 0 for v in kept):
        kept[0] = 0
    order = sorted(v for v in kept if v >= 0)
    return tuple(order.index(v) if v >= 0 else -1 for v in kept)


def moved(config: MoEConfig, name: str, value: int) -> MoEConfig | None:
    """`config` with field `name` at `value`, its dependent fields clamped; None where no valid config results."""
    c = config
    changes: dict = {name: value}
    if name == "num_tokens":
        call = min(c.call_num_tokens, value)
        changes.update(call_tokens=None if call == value else call, dropped_slots=min(c.dropped_slots, value * c.topk))
    elif name == "topk":
        changes.update(shared_experts=min(c.shared_experts, value - 1), dropped_slots=min(c.dropped_slots, c.num_tokens * value))
    elif name == "num_experts":
        changes.update(expert_map=_local_map(c.expert_map, value))
    try:
        return c.replace(**changes)
    except (TypeError, ValueError):
        return None


def candidates(config: MoEConfig, name: str) -> list[MoEConfig]:
    """The configs field `name` is tried at, in order (valid ones only)."""
    c = config
    if name == "pair":
        simplest = MINIMAL_CONFIG.quant
        if c.quant == simplest and c.weight_scales is None:
            return []
        size = size_floor(simplest)
        try:  # every size of another scheme is one of the simplest's (its floor is the lowest)
            return [c.replace(quant=simplest, weight_scales=None, act_scales=None, hidden=max(c.hidden, size),
                              inter=max(c.inter, size))]
        except (TypeError, ValueError):
            return []
    if name == "num_tokens":
        values = steps(c.num_tokens, 1)
    elif name == "topk":
        values = steps(c.topk, 1)  # shared experts clamped to K - 1
    elif name == "num_experts":
        values = steps(c.num_experts, c.topk)  # K distinct experts per token
    else:
        floor = size_floor(c.quant)
        values = steps(getattr(c, name), floor, floor if c.quant == "fp8-block" else 1)
    return [m for m in (moved(c, name, v) for v in values) if m is not None]


def descend(
    config: MoEConfig,
    report: R,
    fails: Callable[[MoEConfig], R | None],
    runs: Callable[[MoEConfig], bool],
    limit: int | None = None,
) -> tuple[MoEConfig, R, bool]:
    """(the smallest failing config found, its report, whether the limit cut the descent).

    fails(candidate): the candidate's report when it fails the same way, else None; runs(candidate):
    whether the fuzz may run it at all; limit: the candidates it may judge (None: DESCENT_RUNS)."""
    limit = shrink_limits.DESCENT_RUNS if limit is None else limit  # read now: a test lowers it
    judged = 0
    tried: set[MoEConfig] = {config}
    moving = True
    while moving:
        moving = False
        for name in FIELDS:
            for candidate in candidates(config, name):
                if candidate in tried or not runs(candidate):
                    continue
                if judged >= limit:
                    return config, report, True
                judged += 1
                tried.add(candidate)
                found = fails(candidate)
                if found is not None:
                    config, report, moving = candidate, found, True
                    break
    return config, report, False
