"""vLLM's release table: every supported release in one row (its wheel's pin and what its
`TritonExperts.apply` does where releases differ, read in each wheel's experts/triton_moe.py).

Adding a release is one row here: `diffmoe peers fetch vllm==V` fetches it, `--impl vllm==V` runs it
(`peers.vllm:make_V` with the dots as underscores), and the run checks each op call against the row.

Owns the rows and the files diffmoe keeps of each wheel. Must stay light: the CLI reads it to list
the peers, so it imports nothing of torch, Triton or the adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diffmoe.adapters.peer_wheels import PeerWheel

from ..exports import ReleaseRow

PROJECT = "vllm"
DEFAULT = "0.33.0"  # `--impl vllm`, `diffmoe peers fetch vllm`
FACTORIES = ("make",)  # what each release exports (peers/vllm/__init__.py)
_MOE = "vllm/model_executor/layers/fused_moe"
# The vLLM files the adapter loads (peers/vllm/core.py), the same paths in every supported release.
FILES = (
    f"{_MOE}/fused_moe.py",  # fused_moe_kernel, invoke_fused_moe_triton_kernel, configs
    f"{_MOE}/moe_align_block_size.py",  # the Python side of the alignment op
    f"{_MOE}/experts/triton_moe.py",  # TritonExperts: workspace_shapes, apply (the carving)
    f"{_MOE}/utils.py",  # _resize_cache, moe_kernel_quantize_input, enable_swap_ab
    f"{_MOE}/modular_kernel.py",  # FusedMoEExperts(Modular): TritonExperts' base classes
    f"{_MOE}/configs/",  # the tuned tile configs fused_moe.py reads per GPU name (~340 JSON files, ~1.1 MB)
    # the call sites the adapter mirrors, read (never run) by tests/peers/test_peer_call_sites.py (peers/call_sites.py)
    f"{_MOE}/fused_moe_modular_method.py",  # FusedMoEModularMethod.apply: the layer's expert map, router weight
    f"{_MOE}/prepare_finalize/no_dp_ep.py",  # prepare: the router weight on the input, the input quant's flags
    f"{_MOE}/oracle/fp8.py",  # make_fp8_moe_quant_config: the SwiGLU limit as gemm1_clamp_limit, the scale flags
    f"{_MOE}/unquantized_fused_moe_method.py",  # bf16's quant config: the SwiGLU limit as gemm1_clamp_limit
    "vllm/model_executor/layers/quantization/fp8.py",  # Fp8MoEMethod: per-tensor and 128-block FP8, its flags
    # CompressedTensorsW8A8Fp8MoEMethod: per-channel weights beside per-token activations
    "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/compressed_tensors_moe_w8a8_fp8.py",
)


@dataclass(frozen=True)
class Release(ReleaseRow):
    """One vLLM release: its wheel's sha256 (measured on the wheel PyPI served on 2026-12-04, its
    size in bytes beside each row) and what its TritonExperts.apply does where releases differ;
    the run checks each op call against it (peers/vllm/core.py RunReporter)."""

    PROJECT: ClassVar[str] = PROJECT
    DEFAULT: ClassVar[str] = DEFAULT
    version: str
    sha256: str
    # under an expert map, apply ends in the pad-aware ops.moe_sum(cache3, output, topk_ids,
    # expert_map) (vLLM PR #54083, 0.31.0); before, the two-argument moe_sum(cache3, output)
    pad_aware_moe_sum: bool
    # under an expert map, apply aligns with ignore_invalid_experts (the op gets the map and
    # drops remote slots); before, the op never sees the map and remote blocks write zeros
    drops_remote_at_align: bool
    # a SwiGLU clamp limit turns the fused silu + 128-block quant off (vLLM PR #57984, 0.31.0);
    # before, the fused kernel, which takes no clamp, ran anyway
    clamp_unfuses_block_quant: bool

    @property
    def module(self) -> str:
        """The package exporting its factory (what its refusals call it)."""
        return "peers.vllm"

    @property
    def wheel(self) -> PeerWheel:
        return PeerWheel(name=PROJECT, package="vllm", version=self.version,
                         filename=f"vllm-{self.version}-cp38-abi3-manylinux_2_28_x86_64.whl", sha256=self.sha256,
                         files=FILES, license="Apache-2.0")


RELEASES: dict[str, Release] = {r.version: r for r in (
    Release("0.28.0", "addb0ffdaafd8155d75e9b3f5ddb3da28fdee9e8a7097ede91f7db2e9e1a3889",  # 314,500,103
            pad_aware_moe_sum=False, drops_remote_at_align=False, clamp_unfuses_block_quant=False),
    Release("0.30.0", "ef52ee58c410ead0b8afb190838fa4cbcb52075596f67862a03859d984966ac4",  # 314,883,777
            pad_aware_moe_sum=False, drops_remote_at_align=False, clamp_unfuses_block_quant=False),
    Release("0.33.0", "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",  # 336,361,138
            pad_aware_moe_sum=True, drops_remote_at_align=True, clamp_unfuses_block_quant=True),
)}
