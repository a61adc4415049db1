"""SGLang 0.5.20's Triton fused MoE: `--impl sglang==0.5.20` (`peers.sglang_0_5_20:make`), and its
non-CUDA fallback branch, `peers.sglang_0_5_20:make_fallback`, and the CUDA branch with a routed scaling
factor, `peers.sglang_0_5_20:make_scaled`.

Owns this release's factories. Must not hold what the releases share: that is peers/sglang_core.py.
"""

import functools

from .sglang_core import Release, factory
from .sglang_function import wheel_function as _wheel_function

RELEASE = Release(peer="sglang==0.5.20", version="0.5.20")
make = factory(RELEASE, cuda=True, module=__name__)
make_fallback = factory(RELEASE, cuda=False, module=__name__)
# the CUDA branch with a routed scaling factor (sglang_core.ROUTED_SCALING_FACTOR): the museum's SGLang exhibit
make_scaled = factory(RELEASE, cuda=True, module=__name__, scaled=True)
# `--fn sglang==0.5.20:[MODULE:]FUNCTION --family sglang` (diffmoe.contract.WHEEL_FUNCTIONS)
wheel_function = functools.partial(_wheel_function, RELEASE)
