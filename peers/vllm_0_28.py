"""vLLM 0.28.0's Triton fused MoE: `--impl vllm==0.28.0` (`peers.vllm_0_28:make`); `diffmoe peers fetch vllm==0.28.0`.

Owns this release's factory. Must not hold anything the releases share: that is peers/vllm_core.py
(its RELEASES row: under an expert map the two-argument moe_sum, remote blocks writing zeros).
"""

from .vllm_core import release_factory

make = release_factory("0.28.0", __name__)
RELEASE = make.release
