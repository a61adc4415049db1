"""SGLang's fused_experts from a pinned wheel with no user code: `--fn sglang==V:fused_experts --family sglang`
(or `sglang==V:MODULE:FUNCTION`), through diffmoe.contract.WHEEL_FUNCTIONS and the package's
`wheel_function_V` (peers/sglang/releases.py).

Owns the function a spec names inside a release's files, and what it carries for its factory. Must not
hold the adapter itself (loading, stand-ins, refusals): that is peers/sglang/core.py.
"""

from __future__ import annotations

import torch

from diffmoe.adapters import peer_wheels

from .core import FILES, SUPPORTS, Release, SglangFiles
from .standins import ACTIVE, MOE

# the module of `--fn sglang==V:fused_experts --family sglang` when the spec names none (wheel_function)
FUNCTION_MODULE = f"{MOE}.fused_moe"


def wheel_function(release: Release, path: str):
    """The function at `path` (`FUNCTION` in FUNCTION_MODULE, or `MODULE:FUNCTION`, MODULE one of FILES) of
    the release's cached files, run as the CUDA branch runs it (the files loaded through the adapter kit with
    the peer's stubs and stand-ins, `@torch.compile` eager): what `--fn sglang==V:PATH --family sglang` calls
    (diffmoe.adapters.loading), with no user code. It carries its factory's attributes (diffmoe.adapters.
    families.CARRIED): the sglang family, the `sglang` profile, the pinned wheel, the CUDA branch's refusals.
    Its launches report to the peer's ACTIVE slot: the family function attributes each to its stage from the
    tensors it touches (diffmoe.adapters.kit.attribution), so it is judged stage by stage."""
    module, _, name = path.rpartition(":")
    module = module or FUNCTION_MODULE
    loaded = [n for n, _ in FILES]
    if module not in loaded:
        raise ValueError(f"the module of {release.peer}:{path} must be one of the files diffmoe keeps of the "
                         f"wheel ({', '.join(loaded)}), got {module!r}")
    if not name.isidentifier():
        raise ValueError(f"the function of {release.peer}:{path} must be a name, got {name!r}")

    def target():
        found = getattr(SglangFiles.get(release.peer, True).modules[module], name, None)
        if not callable(found):
            raise ValueError(f"the function of {release.peer}:{path} must be one of {module}'s, it has no {name!r}")
        return found

    if peer_wheels.is_cached(release.peer):  # else the CLI names the fetch to run before any call
        target()

    def function(*args, **kwargs):
        from ..common import install_interpreter_fixes

        files, run = SglangFiles.get(release.peer, True), target()
        install_interpreter_fixes()
        with files.installed(), torch.compiler.set_stance("force_eager"):
            return run(*args, **kwargs)

    function.__qualname__ = function.__name__ = f"{release.peer}:{module}:{name}"
    function.family, function.numerics, function.peer_wheel = "sglang", "sglang", release.peer
    function.active = ACTIVE  # its kernel proxy and stand-ins report there: every launch attributed to its stage
    function.batch_invariant = False  # the tile config follows the token count (module docstring)
    function.supports = SUPPORTS[True]
    return function
