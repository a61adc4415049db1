"""Public path of the Hypothesis strategies: `moe_configs()`, `schedules()` and their parts.

The strategies live in diffmoe/fuzz/strategies.py (its docstring documents every domain); this
module exports the ones users compose (`__all__`). Any other name of that module is still found
here, with a DeprecationWarning naming diffmoe.fuzz.strategies (diffmoe.moved).

Owns the public names (`__all__`) only. Must not hold code of its own.
"""

from diffmoe.fuzz.bounds import FieldBounds
from diffmoe.fuzz.strategies import (
    MAX_EXPERTS,
    MAX_SIZE,
    MINIMAL_CONFIG,
    MINIMAL_FUSED_CONFIG,
    TOKEN_BUDGET,
    WEIGHT_BUDGET,
    expert_counts,
    expert_maps,
    hidden_sizes,
    moe_configs,
    schedules,
    token_counts,
)
from diffmoe.moved import internal_names

__all__ = [
    "MAX_EXPERTS",
    "MAX_SIZE",
    "MINIMAL_CONFIG",
    "MINIMAL_FUSED_CONFIG",
    "TOKEN_BUDGET",
    "WEIGHT_BUDGET",
    "FieldBounds",
    "expert_counts",
    "expert_maps",
    "hidden_sizes",
    "moe_configs",
    "schedules",
    "token_counts",
]

__getattr__ = internal_names(__name__, "diffmoe.fuzz.strategies")
