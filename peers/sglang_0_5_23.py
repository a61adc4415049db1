"""SGLang 0.5.23's Triton fused MoE: `--impl sglang` (= `--impl sglang==0.5.23`, `peers.sglang_0_5_23:make`),
and its non-CUDA fallback branch, `peers.sglang_0_5_23:make_fallback`.

Owns this release's factories. Must not hold what the releases share: that is peers/sglang_core.py.
"""

from .sglang_core import Release, factory

RELEASE = Release(peer="sglang==0.5.23", version="0.5.23")
make = factory(RELEASE, cuda=True, module=__name__)
make_fallback = factory(RELEASE, cuda=False, module=__name__)
