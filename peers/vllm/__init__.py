"""vLLM's Triton fused MoE (TritonExperts), run from each supported release's own wheel.

    --impl vllm              peers.vllm:make, the default release (releases.DEFAULT)
    --impl vllm==0.28.0      peers.vllm:make_0_28_0: every release of releases.py, one row each

- `releases.py`: the release table (each wheel's pin, what its apply does where releases differ);
- `core.py`: the adapter (loading the release's files, the run sequence, launch reporting, the plan);
- `ops.py`: vLLM's compiled ops as the adapter kit's stand-ins with vLLM's conventions;
- `standins.py`: the stand-in modules vLLM's files import.

Owns the package's exports (peers/exports.py: one factory per release, built when first asked).
Importing it loads nothing of the adapter and changes no environment.
"""

from . import releases
from .releases import DEFAULT, RELEASES  # noqa: F401 - the package's table


def _build(name: str, release):
    from .core import release_factory

    return release_factory(release.version)


from ..exports import release_exports  # noqa: E402

__getattr__, __dir__ = release_exports(__name__, releases, _build)
