"""vLLM 0.33.0's Triton fused MoE: `--impl vllm` (= `--impl vllm==0.33.0`, `peers.vllm_0_33:make`).

Owns this release's factory. Must not hold anything the releases share: that is peers/vllm_core.py
(its RELEASES row for 0.33.0: the pad-aware moe_sum and the remote slots dropped at the
alignment under an expert map, vLLM PR #54083; a clamp limit unfuses the FP8-block quant).

Numerics: the factory declares the reference's `vllm` profile (`make.numerics`, diffmoe.contract
NUMERICS): vLLM 0.33.0's rounding points (diffmoe.problem.numerics; reference/rounding/ cites the same vLLM sources
peers/vllm_ops.py follows), so a check with numerics=None judges this release against what
vLLM's own ops compute, and numerics="diffmoe" against diffmoe's. Every release declares it
(peers/vllm_core.py, attach).
"""

from .vllm_core import VARIANTS, VllmFiles, VllmTritonMoE, check_supported, plan_workspaces, release_factory  # noqa: F401

make = release_factory("0.33.0", __name__)
RELEASE = make.release
PEER = RELEASE.peer  # its diffmoe.adapters.peer_wheels name ("vllm"), what `diffmoe peers fetch` takes
VllmFiles = VllmFiles.of_release(RELEASE)  # noqa: F811 - this release's files (tests reach vLLM's modules through it)
