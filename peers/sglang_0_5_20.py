"""SGLang 0.5.20's Triton fused MoE: `--impl sglang==0.5.20` (`peers.sglang_0_5_20:make`), and its
non-CUDA fallback branch, `peers.sglang_0_5_20:make_fallback`.

Owns this release's factories. Must not hold what the releases share: that is peers/sglang_core.py.
"""

from .sglang_core import Release, factory

RELEASE = Release(peer="sglang==0.5.20", version="0.5.20")
make = factory(RELEASE, cuda=True, module=__name__)
make_fallback = factory(RELEASE, cuda=False, module=__name__)
