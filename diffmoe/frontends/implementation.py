"""The implementation under test as the command line reaches it: the --impl spec loaded (or the
default's factory), in this process or as a RemoteFactory for the candidate's, with the Triton
interpreter set up first on a machine without CUDA, a peer's uncached wheel and a config its
`supports` refuses turned into usage errors before anything runs.

Owns the loading and those refusals; must not run the implementation (the runner, the fuzz and the
backend modules do, through diffmoe.contract).
"""

from __future__ import annotations

import importlib
import os

from diffmoe.problem.config import MoEConfig
from diffmoe.contract import DEFAULT_IMPLEMENTATION, DEFAULT_IMPLEMENTATION_NAME
from diffmoe.frontends.exits import UsageError


def _runner():
    # Imported on use: it pulls in the implementations; tests may stand a fake in its place.
    return importlib.import_module("diffmoe.judge.runner")


def load_implementation(spec: str | None, isolation: str = "none"):
    """(factory or None for the default, the name reports and replay commands use). Isolated
    (`isolation="process"`), the factory is a RemoteFactory: its module is imported only in the
    candidate's process (diffmoe/isolation/client.py); a module that cannot be found is the same
    usage error, one refused by the import guard is the check's contract finding."""
    if spec is None:
        return None, DEFAULT_IMPLEMENTATION_NAME
    interpreter_on_a_cpu()
    try:
        if isolation == "process":
            from diffmoe.isolation.client import RemoteFactory

            factory = RemoteFactory(spec)
        else:
            factory = _runner().load_factory(spec)
    except (ImportError, TypeError, ValueError) as exc:
        message = str(exc)
        raise UsageError(message if "--impl" in message else f"--impl {spec}: {message}") from None
    require_cached_wheel(factory, spec)
    return factory, spec


def interpreter_on_a_cpu() -> None:
    """Without CUDA, the Triton interpreter (TRITON_INTERPRET=1) before any --impl module is imported:
    Triton picks interpreted or compiled kernels when `@triton.jit` decorates them, so an adapter that
    imports triton before anything of diffmoe did would get compiled kernels on a CPU ("0 active
    drivers", "Cannot call @triton.jit'd outside of the scope of a kernel"), reported as its crash
    (issue 28). An explicit TRITON_INTERPRET (compile-check's 0) is left as it is."""
    if "TRITON_INTERPRET" in os.environ:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def require_cached_wheel(factory, spec: str) -> None:
    """A peer whose pinned wheel is not in the cache (the factory's `peer_wheel`): a usage error naming
    the `diffmoe peers fetch` to run, before any run (it would be a crash finding of a kernel that
    never ran: issue 28)."""
    from diffmoe.contract import factory_peer_wheel

    try:
        wheel = factory_peer_wheel(factory)
    except TypeError as exc:
        raise UsageError(f"--impl {spec}: {exc}") from None
    if wheel is None:
        return
    from diffmoe.adapters.peer_wheels import PeerError, cache_dir, is_cached, not_cached_message

    try:
        if not is_cached(wheel):
            raise UsageError(f"--impl {spec}: {not_cached_message([wheel], cache_dir())}")
    except PeerError as exc:  # a name the peer table does not know
        raise UsageError(f"--impl {spec}: its {wheel!r} wheel: {exc}") from None


def default_factory():
    """The default implementation's factory (contract.DEFAULT_IMPLEMENTATION), loaded on use."""
    return _runner().load_factory(DEFAULT_IMPLEMENTATION)


def refuse_unsupported(factory, name: str, config: MoEConfig) -> None:
    """A config the implementation's own `supports` refuses: a usage error in one line (as `check`'s
    ConfigRefused), before the implementation is asked for anything."""
    from diffmoe.contract import unsupported

    try:
        reason = unsupported(factory, config)
    except TypeError as exc:
        raise UsageError(f"--impl {name}: {exc}") from None
    if reason is not None:
        raise UsageError(f"{name} does not run this config: {reason} (its `supports`; choose a config it runs)")
