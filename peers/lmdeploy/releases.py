"""lmdeploy's release table: every supported release in one row (its wheel's pin).

Adding a release is one row here: `diffmoe peers fetch lmdeploy==V` fetches it, `--impl lmdeploy==V`
runs it (`peers.lmdeploy:make_V` with the dots as underscores).

Owns the rows and the files diffmoe keeps of each wheel. Must stay light: the CLI reads it to list
the peers, so it imports nothing of torch, Triton or the adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diffmoe.adapters.peer_wheels import PeerWheel

from ..exports import ReleaseRow

PROJECT = "lmdeploy"
DEFAULT = "0.18.0"  # `--impl lmdeploy`, `diffmoe peers fetch lmdeploy`
FACTORIES = ("make",)  # what each release exports (peers/lmdeploy/__init__.py)
_K = "lmdeploy/pytorch/kernels/cuda"
# The lmdeploy files the adapter loads (peers/lmdeploy/core.py).
FILES = (
    f"{_K}/moe/blocked_fp8.py",  # fused_moe_blocked_fp8: both blocked-FP8 GEMMs, the sequence
    f"{_K}/moe/fused_moe.py",  # the route sort kernels, moe_reduce, _make_intermediate
    f"{_K}/activation.py",  # silu_and_mul
    f"{_K}/blocked_gemm_fp8.py",  # quant_fp8: the 1x128-group activation quant
    f"{_K}/utils.py",  # get_device_props (the launch grids read it)
    # the call site the adapter mirrors (TritonFusedMoEBlockedF8Impl.forward), read by
    # tests/peers/test_peer_call_sites.py (peers/call_sites.py)
    "lmdeploy/pytorch/backends/cuda/moe/blocked_fp8.py",
)


@dataclass(frozen=True)
class Release(ReleaseRow):
    """One lmdeploy release: its wheel (CPython 3.11's) and sha256, measured on the wheel PyPI served on
    2026-12-04 (its size in bytes beside the row)."""

    PROJECT: ClassVar[str] = PROJECT
    DEFAULT: ClassVar[str] = DEFAULT
    version: str
    sha256: str

    @property
    def wheel(self) -> PeerWheel:
        return PeerWheel(name=PROJECT, package="lmdeploy", version=self.version,
                         filename=f"lmdeploy-{self.version}-cp311-cp311-manylinux_2_28_x86_64.whl", sha256=self.sha256,
                         files=FILES, license="Apache-2.0", python="3.11")


RELEASES: dict[str, Release] = {r.version: r for r in (
    Release("0.18.0", "e6790a25dcdb0345c160567fdf2ac604fec319389523a8b806834c9d92c8ffe1"),  # 106,690,261
)}
