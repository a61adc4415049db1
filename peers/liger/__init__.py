"""Liger-Kernel's bf16 fused MoE (LigerFusedMoEFunction), run from each supported release's own wheel.

    --impl liger              peers.liger:make, the default release (releases.DEFAULT)
    --impl liger==0.8.0       peers.liger:make_0_8_0: every release of releases.py, one row each
    peers.liger:make_wide_0_8_0   the same call with the experts stored past int32 weight offsets (the
                                  museum's Liger exhibit: 0.8.0 multiplies the expert index by the weight
                                  stride in int32, Liger-Kernel#1296; 0.8.1 casts it to int64 first)

- `releases.py`: the release table (each wheel's pin, the files kept);
- `core.py`: the adapter (loading the release's files, the run sequence, launch reporting).

Owns the package's exports (peers/exports.py: each factory built when first asked). Importing it
loads nothing of the adapter and changes no environment.
"""

from . import releases
from .releases import DEFAULT, RELEASES  # noqa: F401 - the package's table


def _build(name: str, release):
    from .core import release_factories

    make, make_wide = release_factories(release)
    return make if name == "make" else make_wide


from ..exports import release_exports  # noqa: E402

__getattr__, __dir__ = release_exports(__name__, releases, _build)
