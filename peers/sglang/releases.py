"""SGLang's release table: every supported release in one row (its wheel's pin).

Adding a release is one row here: `diffmoe peers fetch sglang==V` fetches it, `--impl sglang==V` runs
its CUDA branch (`peers.sglang:make_V` with the dots as underscores; `make_fallback_V` the non-CUDA
branch, `make_scaled_V` the CUDA branch with a routed scaling factor) and `--fn sglang==V:FUNCTION
--family sglang` a function of its files (`peers.sglang:wheel_function_V`).

Owns the rows and the files diffmoe keeps of each wheel. Must stay light: the CLI reads it to list
the peers, so it imports nothing of torch, Triton or the adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diffmoe.adapters.peer_wheels import PeerWheel

from ..exports import ReleaseRow

PROJECT = "sglang"
DEFAULT = "0.5.23"  # `--impl sglang`, `diffmoe peers fetch sglang`
FACTORIES = ("make", "make_fallback", "make_scaled")  # what each release exports (peers/sglang/__init__.py)
WHEEL_FUNCTION = "wheel_function"  # `--fn sglang==V:[MODULE:]FUNCTION` (diffmoe.contract.WHEEL_FUNCTIONS)
_MOE = "sglang/srt/layers/moe/moe_runner/triton_utils"
# The SGLang files the adapter loads (peers/sglang/core.py), the same paths in both supported releases.
FILES = (
    f"{_MOE}/fused_moe.py",  # fused_experts, _fused_moe_kernel_sequence, moe_combine_topk: the run sequence
    f"{_MOE}/moe_align_block_size.py",  # the Python side of the alignment op (+1 bucket)
    f"{_MOE}/fused_moe_triton_config.py",  # try_get_optimal_moe_config: the tile config
    "sglang/kernels/ops/moe/fused_moe_triton_kernels.py",  # fused_moe_kernel, invoke_fused_moe_kernel, moe_sum_reduce_triton
    "sglang/kernels/ops/moe/moe_align_small_numel.py",  # the Triton align for one-token batches over > 63 experts
    "sglang/kernels/ops/quantization/fp8_kernel.py",  # scaled_fp8_quant, the per-token-group quants
    "sglang/kernels/ops/quantization/fp8_utils.py",  # fp8_dtype_to_triton (fp8_kernel.py imports it)
    f"{_MOE}/configs/",  # the tuned tile configs per Triton release and GPU (~390 JSON files, ~1.6 MB)
    # the call sites the adapter mirrors, read (never run) by tests/peers/test_peer_call_sites.py (peers/call_sites.py)
    "sglang/srt/layers/moe/fused_moe_triton/layer.py",  # FusedMoE.__init__: the runner config the layer fills
    "sglang/srt/layers/moe/moe_runner/triton.py",  # fused_experts_none_to_triton: the fused_experts call
    "sglang/srt/layers/moe/moe_runner/base.py",  # MoeRunnerConfig: the runner fields fused_experts reads
    "sglang/srt/layers/quantization/fp8.py",  # Fp8MoEMethod.get_triton_quant_info: per-tensor and 128-block FP8
    "sglang/srt/layers/quantization/w8a8_fp8.py",  # W8A8Fp8MoEMethod.get_triton_quant_info: per-channel weights
    "sglang/srt/layers/quantization/unquant.py",  # UnquantizedFusedMoEMethod.get_triton_quant_info: bf16
)


@dataclass(frozen=True)
class Release(ReleaseRow):
    """One SGLang release: its wheel (CPython 3.11's) and sha256, measured on the wheel PyPI served on
    2026-12-05 (its size in bytes beside each row)."""

    PROJECT: ClassVar[str] = PROJECT
    DEFAULT: ClassVar[str] = DEFAULT
    version: str
    sha256: str

    @property
    def peer(self) -> str:
        """Its diffmoe.adapters.peer_wheels name: always the versioned one (SGLang's factories name the release
        they run, the default included)."""
        return self.impl

    @property
    def wheel(self) -> PeerWheel:
        return PeerWheel(name=PROJECT, package="sglang", version=self.version,
                         filename=f"sglang-{self.version}-cp311-cp311-manylinux_2_34_x86_64.whl", sha256=self.sha256,
                         files=FILES, license="Apache-2.0", platform="manylinux_2_34_x86_64", python="3.11")


RELEASES: dict[str, Release] = {r.version: r for r in (
    Release("0.5.20", "1573527042f4f6b4ead838302818595fc77fdc611dbcc2e40cd150fbc8f8513c"),  # 27,393,709
    Release("0.5.23", "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"),  # 39,063,923
)}
