"""Liger-Kernel 0.8.1's bf16 fused MoE: `--impl liger==0.8.1` (`peers.liger_0_8_1:make`), and
`peers.liger_0_8_1:make_wide`: the first release whose kernels cast the expert index to int64 before
multiplying it by the weight stride (Liger-Kernel#1296, fixed by PR #1248), the museum's fixed release.

Owns this release's factories. Must not hold what the releases share: that is peers/liger_core.py.
"""

from .liger_core import release_factories

PEER = "liger==0.8.1"
make, make_wide = release_factories(PEER, __name__)
