"""Public path of the config: `MoEConfig` and the names that describe its fields' values.

The config lives in diffmoe/problem/config.py; this module exports the part users write
against (`__all__`). Any other name of that module is still found here, with a
DeprecationWarning naming diffmoe.problem.config (diffmoe.moved).

Owns the public names (`__all__`) only. Must not hold code of its own.
"""

from diffmoe.moved import internal_names
from diffmoe.problem.config import (
    ACT_SCALES,
    MAX_EXPERTS,
    MAX_PROBLEM_BYTES,
    MAX_TOKENS,
    NUMERICS_PROFILES,
    PLANNERS,
    QUANT_SCHEMES,
    ROUTERS,
    ROUTING_SKEWS,
    WEIGHT_SCALES,
    MoEConfig,
    problem_bytes,
)

__all__ = [
    "ACT_SCALES",
    "MAX_EXPERTS",
    "MAX_PROBLEM_BYTES",
    "MAX_TOKENS",
    "NUMERICS_PROFILES",
    "PLANNERS",
    "QUANT_SCHEMES",
    "ROUTERS",
    "ROUTING_SKEWS",
    "WEIGHT_SCALES",
    "MoEConfig",
    "problem_bytes",
]

__getattr__ = internal_names(__name__, "diffmoe.problem.config")
