"""Pure-PyTorch reference MoE (no Triton anywhere under this package).

Must not import Triton or the optimized path.
"""

from .moe import reference_moe

__all__ = ["reference_moe"]
