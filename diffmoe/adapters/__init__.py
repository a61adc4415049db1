"""The adapter kit: running another project's kernels through the contract (diffmoe.contract).

Public (what docs/plugging-in.md builds an adapter from): `kit` (load a project's files from its
wheel with stubs and stand-ins, report its launches), `peer_wheels` (`diffmoe peers fetch`: the
pinned wheels peers/ loads files from) and `function_factory` (a factory from a function with a
family's call signature: diffmoe.adapters.families). Internal: `loading` (a factory named by
`--impl`) and `museum` (released wheels whose MoE bugs diffmoe catches).

Owns the boundary between diffmoe and any implementation. Must not import an implementation:
implementations are reached through a factory named at run time.
"""

__all__ = ["function_factory", "kit", "peer_wheels"]


def __getattr__(name: str):
    # Read on first use: importing a submodule (diffmoe.adapters.loading) must not import the kit.
    if name == "function_factory":
        from diffmoe.adapters.families import function_factory

        return function_factory
    if name in ("kit", "peer_wheels"):
        import importlib

        return importlib.import_module(f"diffmoe.adapters.{name}")
    raise AttributeError(f"module 'diffmoe.adapters' has no attribute {name!r}")
