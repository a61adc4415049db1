"""Pins and ranges of config fields for a fuzz: `--quant fp8-block --topk 1..2 --fused`.

A `FieldBounds` maps MoEConfig fields to what the fuzzer may draw for them: an integer field to
an inclusive range `LO..HI` (a pin is `N`, the range N..N), any other field to the values
allowed (`--quant fp8-tensor,fp8-block`; a bool, a float, a profile spec or an expert map is
pinned to one value). diffmoe.fuzz.strategies draws every bounded field only within its bound.

Each integer field's allowed range is the config's own (MoEConfig.validate): a bound may reach past
the fuzz's default domain (E and K at most diffmoe.fuzz.strategies.MAX_EXPERTS, 64; H and I at most
MAX_SIZE, 512) to the sizes real models have (`--experts 72`, `--hidden 4096`, `--model NAME`;
issue 42), and the strategies draw within it. A bound outside the config's range, an empty range
(`4..2`) or a value the field does not take is a ValueError naming the field and what it allows;
the CLI turns it into exit 2.

Owns the bounds' type, parsing and validation. Must not draw: the strategies do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from diffmoe.problem.config import (
    ALL_ROUTING_SKEWS, MAX_EXPERT_SCALE_SPREAD, MAX_EXPERTS, MAX_HIDDEN, MAX_INTER, MAX_OUTLIER_CHANNELS, MAX_RANDOM_ORDERS, MAX_ROUTED_ROWS, MAX_SEED, MAX_SHARED_EXPERTS, MAX_TOKENS,
    OUTPUT_PLACEMENTS, PLANNERS, QUANT_SCHEMES, ROUTER_WEIGHT_PLACEMENTS, ROUTERS,
    MoEConfig,
)
from diffmoe.problem.numerics import parse_spec

RANGE_SEPARATOR = ".."
# The fuzz's own domain caps (diffmoe.fuzz.strategies.MAX_EXPERTS, MAX_SIZE; not imported: the
# strategies import this module): what an unbounded field is drawn within. tests/fuzz/test_fuzz_controls.py
# holds the two in step.
FUZZ_MAX_EXPERTS = 64
FUZZ_MAX_SIZE = 512

# Integer fields and their allowed ranges in a fuzz (the config's own).
INT_FIELDS: dict[str, tuple[int, int]] = {
    "num_tokens": (1, MAX_TOKENS),
    "num_experts": (1, MAX_EXPERTS),
    "topk": (1, MAX_EXPERTS),
    "hidden": (1, MAX_HIDDEN),
    "inter": (1, MAX_INTER),
    "seed": (0, MAX_SEED),
    "call_tokens": (0, MAX_TOKENS),
    "expert_scale_spread": (0, MAX_EXPERT_SCALE_SPREAD),
    "outlier_channels": (0, MAX_OUTLIER_CHANNELS),
    "zero_rows": (0, MAX_TOKENS),
    "nan_rows": (0, MAX_TOKENS),
    "inf_rows": (0, MAX_TOKENS),
    "random_orders": (0, MAX_RANDOM_ORDERS),
    "dropped_slots": (0, MAX_ROUTED_ROWS),
    "shared_experts": (0, MAX_SHARED_EXPERTS),
}
# Fields with a closed set of values (a comma-separated list picks several).
CHOICE_FIELDS: dict[str, tuple[Any, ...]] = {
    "quant": QUANT_SCHEMES,
    "planner": PLANNERS,
    "output": OUTPUT_PLACEMENTS,
    "router_weight": ROUTER_WEIGHT_PLACEMENTS,
    "skew": ALL_ROUTING_SKEWS,
    "router": ROUTERS,
    "fused": (False, True),
    "renormalize": (False, True),
    "tie_heavy": (False, True),
}
# Fields pinned to one value, validated by the config itself.
PIN_FIELDS = ("swiglu_limit", "numerics", "expert_map", "routed_scaling_factor")
FIELDS = (*INT_FIELDS, *CHOICE_FIELDS, *PIN_FIELDS)


@dataclass(frozen=True)
class FieldBounds:
    """ranges: int field -> (lo, hi), inclusive; values: other field -> the values allowed."""

    ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    values: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, bound in self.ranges.items():
            if name not in INT_FIELDS:
                raise ValueError(f"bounds: {name!r} is not an integer config field; integer fields: {list(INT_FIELDS)}")
            lo, hi = bound
            allowed_lo, allowed_hi = INT_FIELDS[name]
            if not (allowed_lo <= lo <= hi <= allowed_hi):
                what = "an empty range" if lo > hi else "outside the allowed range"
                raise ValueError(f"{name} must be bounded within [{allowed_lo}, {allowed_hi}] (N or LO..HI with LO <= HI), "
                                 f"got {_shown(lo, hi)}: {what}")
        for name, allowed in self.values.items():
            if name not in CHOICE_FIELDS and name not in PIN_FIELDS:
                raise ValueError(f"bounds: {name!r} is not a config field a fuzz can pin; fields: {list(FIELDS)}")
            if not allowed:
                raise ValueError(f"{name} must allow at least one value")
            if name in CHOICE_FIELDS:
                bad = [v for v in allowed if v not in CHOICE_FIELDS[name]]
                if bad:
                    raise ValueError(f"{name} must be one of {list(CHOICE_FIELDS[name])}, got {bad[0]!r}")
            else:
                if len(allowed) != 1:
                    raise ValueError(f"{name} can only be pinned to one value, got {len(allowed)}")
                try:
                    if name == "numerics":  # a spec alone: its scheme-only choices are the config's to judge
                        parse_spec(allowed[0], "numerics")
                    else:
                        MoEConfig(**_witness(name, allowed[0]))
                except (TypeError, ValueError) as exc:
                    raise ValueError(str(exc)) from None

    def __bool__(self) -> bool:
        return bool(self.ranges or self.values)

    def range(self, name: str, lo: int, hi: int) -> tuple[int, int]:
        """[lo, hi] cut to the field's bound (an empty result has lo > hi)."""
        if name not in self.ranges:
            return lo, hi
        b_lo, b_hi = self.ranges[name]
        return max(lo, b_lo), min(hi, b_hi)

    def allowed(self, name: str, default: tuple[Any, ...], universe: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
        """`default` (in its order: the shrink order) kept to the field's allowed values; with a
        bound, taken from `universe` when given (every value the config allows, not only those drawn)."""
        if name not in self.values:
            return default
        return tuple(v for v in (universe or default) if v in self.values[name])

    def pinned(self, name: str) -> Any:
        """The one value a field is pinned to (KeyError when it is not pinned to one)."""
        values = self.values.get(name, ())
        if len(values) != 1:
            raise KeyError(name)
        return values[0]

    def holds(self, config: MoEConfig) -> bool:
        """Whether `config` lies within every bound (what the strategies guarantee of each draw)."""
        for name, (lo, hi) in self.ranges.items():
            value = getattr(config, name)
            if value is None or not lo <= value <= hi:
                return False
        return all(getattr(config, name) in allowed for name, allowed in self.values.items())

    def describe(self) -> str:
        parts = [f"{name}={_shown(lo, hi)}" for name, (lo, hi) in self.ranges.items()]
        parts += [f"{name}={','.join(str(v) for v in vs)}" for name, vs in self.values.items()]
        return " ".join(parts)


def _shown(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}{RANGE_SEPARATOR}{hi}"


def _witness(name: str, value: Any) -> dict[str, Any]:
    """The smallest config fields that hold a pinned value, to let MoEConfig validate it alone."""
    if name == "expert_map":
        m = tuple(value) if isinstance(value, (list, tuple)) else value
        return {"expert_map": m, "num_experts": len(m) if isinstance(m, tuple) else 1, "topk": 1}
    return {name: value}


def parse_int_bound(name: str, text: str, flag: str | None = None) -> tuple[int, int]:
    """`N` or `LO..HI` as (lo, hi); ValueError naming the flag (or field) and the allowed range."""
    where = flag or name
    allowed_lo, allowed_hi = INT_FIELDS[name]
    lo_text, sep, hi_text = text.strip().partition(RANGE_SEPARATOR)
    try:
        lo = int(lo_text)
        hi = int(hi_text) if sep else lo
    except ValueError:
        raise ValueError(f"{where} must be N or LO..HI within [{allowed_lo}, {allowed_hi}], got {text.strip()[:60]!r}") from None
    if not (allowed_lo <= lo <= hi <= allowed_hi):
        what = "an empty range" if lo > hi else "outside the allowed range"
        raise ValueError(f"{where} must be N or LO..HI within [{allowed_lo}, {allowed_hi}], got {text.strip()[:60]}: {what}")
    return lo, hi


def parse_choices(name: str, text: str, flag: str | None = None) -> tuple[str, ...]:
    """`A` or `A,B` of a choice field's values; ValueError naming the flag and the values allowed."""
    where = flag or name
    allowed = CHOICE_FIELDS[name]
    picked = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    bad = [p for p in picked if p not in allowed]
    if bad or not picked:
        raise ValueError(f"{where} must be one of {list(allowed)} or a comma-separated list of them, got {text.strip()[:60]!r}")
    return picked

