"""SGLang's Triton fused MoE (`fused_experts`), run from each supported release's own wheel.

    --impl sglang                 peers.sglang:make, the default release's CUDA branch (releases.DEFAULT)
    --impl sglang==0.5.20         peers.sglang:make_0_5_20: every release of releases.py, one row each
    peers.sglang:make_fallback_0_5_23   the branch SGLang takes on a platform none of CUDA, HIP, XPU, MUSA
    peers.sglang:make_scaled_0_5_23     the CUDA branch with a routed scaling factor (the museum's exhibit)
    --fn sglang==0.5.23:fused_experts --family sglang   a function of the release's files (wheel_function_0_5_23)

- `releases.py`: the release table (each wheel's pin, the files kept);
- `core.py`: the adapter (the files loaded with the adapter kit, the run sequence, launch reporting);
- `function.py`: a function of a release's files, called as its family calls it (`--fn`);
- `standins.py`: SGLang's compiled ops as the kit's stand-ins, and the values its stubs carry.

Owns the package's exports (peers/exports.py: each factory built when first asked). Importing it
loads nothing of the adapter and changes no environment.
"""

import functools

from . import releases
from .releases import DEFAULT, RELEASES  # noqa: F401 - the package's table


def _build(name: str, release):
    from .core import factory
    from .function import wheel_function

    if name == releases.WHEEL_FUNCTION:
        return functools.update_wrapper(functools.partial(wheel_function, release), wheel_function)
    return factory(release, cuda=name != "make_fallback", scaled=name == "make_scaled")


from ..exports import release_exports  # noqa: E402

__getattr__, __dir__ = release_exports(__name__, releases, _build)
