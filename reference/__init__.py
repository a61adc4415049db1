"""Pure-PyTorch reference MoE (no Triton anywhere under this package)."""

from .moe import reference_moe

__all__ = ["reference_moe"]
