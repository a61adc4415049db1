"""Liger-Kernel's release table: every supported release in one row (its wheel's pin).

Adding a release is one row here: `diffmoe peers fetch liger==V` fetches it, `--impl liger==V` runs it
(`peers.liger:make_V`, and `make_wide_V`, with the dots as underscores).

Owns the rows and the files diffmoe keeps of each wheel. Must stay light: the CLI reads it to list
the peers, so it imports nothing of torch, Triton or the adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from diffmoe.adapters.peer_wheels import PeerWheel

from ..exports import ReleaseRow

PROJECT = "liger"
DEFAULT = "0.8.5"  # `--impl liger`, `diffmoe peers fetch liger`
FACTORIES = ("make", "make_wide")  # what each release exports (peers/liger/__init__.py)
_LIGER = "liger_kernel"
# The Liger files the adapter loads (peers/liger/core.py), the same paths in every supported release.
FILES = (
    f"{_LIGER}/ops/fused_moe.py",  # LigerFusedMoEFunction (its forward: the run sequence), compute_routing_metadata
    f"{_LIGER}/ops/fused_moe_kernels.py",  # the routing, fused up-proj + SwiGLU, down-proj and gather-sum kernels
    f"{_LIGER}/ops/utils.py",  # ensure_contiguous (the forward's decorator)
    f"{_LIGER}/utils.py",  # infer_device (ops/utils.py imports it)
    f"{_LIGER}/transformers/swiglu.py",  # LigerExperts.forward: the call site tests/peers/test_peer_call_sites.py reads
)


@dataclass(frozen=True)
class Release(ReleaseRow):
    """One Liger-Kernel release: its wheel's sha256, measured on the wheel PyPI served (0.8.5 on
    2026-12-04: 910,117 bytes; 0.8.0 and 0.8.1 on 2026-12-05: 403,120 and 506,445 bytes)."""

    PROJECT: ClassVar[str] = PROJECT
    DEFAULT: ClassVar[str] = DEFAULT
    version: str
    sha256: str

    @property
    def wheel(self) -> PeerWheel:
        return PeerWheel(name=PROJECT, package="liger-kernel", version=self.version,
                         filename=f"liger_kernel-{self.version}-py3-none-any.whl", sha256=self.sha256, files=FILES,
                         license="BSD-2-Clause")


RELEASES: dict[str, Release] = {r.version: r for r in (
    Release("0.8.0", "e1f03eeb4ba6a6a413d585dacf92c4c15d164bab5844fa4ead2fede6bcac469c"),
    Release("0.8.1", "90836c1e9de22a1c57a640775fb79151ea704748cf9c3f6658dddaa06fff1989"),
    Release("0.8.5", "60789cd576af073ab9b192b570d2597fd0cdad489cd62fb44fb16256d43754c9"),
)}
