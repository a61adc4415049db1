"""lmdeploy's blocked-FP8 fused MoE (fused_moe_blocked_fp8), run from its pinned wheel.

    --impl lmdeploy           peers.lmdeploy:make, the default release (releases.DEFAULT)
    --impl lmdeploy==0.18.0   peers.lmdeploy:make_0_18_0: every release of releases.py, one row each

- `releases.py`: the release table (the wheel's pin, the files kept);
- `core.py`: the adapter (loading the release's files, the run sequence, launch reporting).

Owns the package's exports (peers/exports.py: each factory built when first asked). Importing it
loads nothing of the adapter and changes no environment.
"""

from . import releases
from .releases import DEFAULT, RELEASES  # noqa: F401 - the package's table


def _build(name: str, release):
    from .core import release_factory

    return release_factory(release)


from ..exports import release_exports  # noqa: E402

__getattr__, __dir__ = release_exports(__name__, releases, _build)
