"""vLLM 0.30.0's Triton fused MoE: `--impl vllm==0.30.0` (`peers.vllm_0_30:make`); `diffmoe peers fetch vllm==0.30.0`.

Owns this release's factory. Must not hold anything the releases share: that is peers/vllm_core.py
(its RELEASES row, the same as 0.28.0's: the stale-rows and clamp bugs of the museum are in both).
"""

from .vllm_core import release_factory

make = release_factory("0.30.0", __name__)
RELEASE = make.release
