"""Liger-Kernel 0.8.0's bf16 fused MoE: `--impl liger==0.8.0` (`peers.liger_0_8_0:make`), and
`peers.liger_0_8_0:make_wide`, the same call with the experts stored past int32 weight offsets: the
museum's Liger exhibit (its kernels multiply the int32 expert index by the weight stride in int32,
Liger-Kernel#1296; 0.8.1 casts it to int64 first).

0.8.0 has no LIGER_FUSED_MOE_AUTOTUNE switch: the adapter pins its autotuned forward kernels to the
single configs 0.8.1's switch chooses (peers/liger_core.py PINNED_CONFIGS).

Owns this release's factories. Must not hold what the releases share: that is peers/liger_core.py.
"""

from .liger_core import release_factories

PEER = "liger==0.8.0"
make, make_wide = release_factories(PEER, __name__)
