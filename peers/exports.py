"""What a peer package exports from its release table: `make_0_33_0` for release 0.33.0's `make`,
one attribute per (factory, release) of the table (PACKAGE.releases: FACTORIES, RELEASES, DEFAULT,
optionally WHEEL_FUNCTION), and each factory of the default release under its own name (`make`).

Each is built when first asked, once, named `PACKAGE:ATTRIBUTE` (its `__module__` and `__qualname__`),
so that `--impl PACKAGE:ATTRIBUTE` loads it, a replay line names it, and pickling finds it by
reference.

Owns the package-level `__getattr__` the projects share. Must stay light: the CLI imports a
project's release table, and with it the package, to list the peers.
"""

from __future__ import annotations

import threading
from typing import Callable, ClassVar

from diffmoe.contract import release_attribute


class ReleaseRow:
    """What every release row answers from its project's table (a dataclass with `version` that sets
    PROJECT and DEFAULT): `impl`, its `--impl` and `diffmoe peers fetch` spelling, and `peer`, its
    peer-cache name (the project's own for the default release: `--impl vllm` is vllm==0.33.0)."""

    PROJECT: ClassVar[str]
    DEFAULT: ClassVar[str]
    version: str

    @property
    def impl(self) -> str:
        return f"{self.PROJECT}=={self.version}"

    @property
    def peer(self) -> str:
        return self.PROJECT if self.version == self.DEFAULT else self.impl


def release_exports(package: str, table, build: Callable[[str, object], Callable]):
    """(`__getattr__`, `__dir__`) for the package `package` whose release table is `table`:
    `build(name, release)` makes the factory `name` (one of FACTORIES, or WHEEL_FUNCTION) of `release`."""
    names = (*table.FACTORIES, *((table.WHEEL_FUNCTION,) if hasattr(table, "WHEEL_FUNCTION") else ()))
    built: dict[str, Callable] = {}
    lock = threading.RLock()

    def exports() -> dict:  # read from the table at each lookup: a row added is exported at once
        return {release_attribute(n, v): (n, r) for n in names for v, r in table.RELEASES.items()}

    def __getattr__(attribute: str):
        exported = exports()
        key = release_attribute(attribute, table.DEFAULT) if attribute in names else attribute
        if key not in exported:
            raise AttributeError(f"module {package!r} has no attribute {attribute!r} (its releases: "
                                 f"{', '.join(table.RELEASES)}; each exports {', '.join(names)} as NAME_{{version}})")
        with lock:
            if key not in built:
                name, release = exported[key]
                factory = build(name, release)
                factory.__module__, factory.__qualname__ = package, key
                built[key] = factory
            return built[key]

    def __dir__():
        return sorted({*exports(), *names, "RELEASES", "DEFAULT"})

    return __getattr__, __dir__
