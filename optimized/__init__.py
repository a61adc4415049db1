"""The optimized MoE: Triton FP8 fused MoE running inside two shared workspaces.

Without a GPU the kernels run under the Triton interpreter: the switch must be set before
the first kernel module is imported, hence before the imports below.

Owns the package's entry point (`make_implementation`). Must not import the harness beyond diffmoe's contract, vocabulary and conformance API.
"""

from .backend import ensure_interpreter_without_gpu

ensure_interpreter_without_gpu()

from .moe import TritonFP8MoE, make_implementation  # noqa: E402
from .workspace_planner import plan_workspaces, planned_buffer_list  # noqa: E402

__all__ = ["TritonFP8MoE", "make_implementation", "plan_workspaces", "planned_buffer_list"]
