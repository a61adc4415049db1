"""vLLM 0.30.0's Triton fused MoE: `--impl vllm==0.30.0` (`peers.vllm_0_30:make`), fetched by `diffmoe peers fetch vllm==0.30.0`.

Owns this release's factory. Must not hold anything the releases share: that is peers/vllm_core.py
(its RELEASES row for 0.30.0: under an expert map, the two-argument moe_sum and the remote slots
aligned, their blocks writing zeros; the fused FP8-block quant runs whatever the clamp limit).
"""

from .vllm_core import RELEASES, VllmTritonMoE, attach

RELEASE = RELEASES["0.30.0"]


def make(config, device=None) -> VllmTritonMoE:
    """The factory: `--impl vllm==0.30.0`."""
    return VllmTritonMoE(config, device, release=RELEASE)


attach(make, RELEASE)
