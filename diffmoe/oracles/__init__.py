"""Oracle building blocks that judge memory use: declared plans, recorded launches, guard bytes.

The numerical oracles' building blocks are `diffmoe.compare` and `diffmoe.tolerances`.
"""

from .guards import POISON_PATTERNS, GuardedTensor, GuardedWorkspaces
from .runtime_aliasing import check_runtime_aliasing
from .static_aliasing import WORKSPACE_NAMES, check_static_aliasing, check_workspace_fit, live_ranges

__all__ = [
    "POISON_PATTERNS",
    "WORKSPACE_NAMES",
    "GuardedTensor",
    "GuardedWorkspaces",
    "check_runtime_aliasing",
    "check_static_aliasing",
    "check_workspace_fit",
    "live_ranges",
]
