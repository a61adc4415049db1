"""The reference's rounding points: one function per choice (quant.py, activation.py,
gemm_reduce.py), registered by point in points.py, which binds a profile (diffmoe.problem.numerics,
the profiles as data) to them.

Owns nothing beyond its modules. Must not import peers/, Triton or the harness's oracles.
"""

from .points import CHOICES, Rounding, rounding

__all__ = ["CHOICES", "Rounding", "rounding"]
