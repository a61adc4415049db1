"""Liger-Kernel 0.8.5's bf16 fused MoE: `--impl liger` (= `--impl liger==0.8.5`, `peers.liger_0_8:make`),
and `peers.liger_0_8:make_wide`, the same call with the experts stored past int32 weight offsets.

Owns this release's factories. Must not hold what the releases share: that is peers/liger_core.py.
"""

from .liger_core import LigerFiles, release_factories

PEER = "liger"  # the default Liger pin (= liger==0.8.5): its diffmoe.adapters.peer_wheels name, what `diffmoe peers fetch` takes
make, make_wide = release_factories(PEER, __name__)
LigerFiles = LigerFiles.of_release(PEER)  # noqa: F811 - this release's files
