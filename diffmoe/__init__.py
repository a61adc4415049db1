"""diffmoe: reference-vs-optimized differential testing for fused Mixture-of-Experts kernels.

The harness imports no Triton. Entry points: `MoEConfig`, `make_problem`, the plug-in
contract in `diffmoe.contract`, and `run_differential` (diffmoe.runner).

Owns the public re-exports only.
"""

from .config import MoEConfig
from .contract import LaunchInfo, MoEImplementation, Placement, RunResult, Schedule, WorkspacePlan
from .problem import Problem, make_problem
from .vocabulary import Buffers, Stages

__all__ = [
    "Buffers",
    "LaunchInfo",
    "MoEConfig",
    "MoEImplementation",
    "Placement",
    "Problem",
    "RunResult",
    "Schedule",
    "Stages",
    "WorkspacePlan",
    "make_problem",
]
