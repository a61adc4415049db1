"""The peer modules that moved when each project became a package with one release table: an old
path keeps working for one release, with a `DeprecationWarning` naming the new one.

    peers.vllm_0_33:make    ->  peers.vllm:make_0_33_0      (and vllm_0_28, vllm_0_30)
    peers.sglang_0_5_23:make_fallback  ->  peers.sglang:make_fallback_0_5_23   (and sglang_0_5_20)
    peers.liger_0_8_0:make_wide  ->  peers.liger:make_wide_0_8_0   (liger_0_8 is 0.8.5, and liger_0_8_1)
    peers.lmdeploy_0_18:make  ->  peers.lmdeploy:make_0_18_0
    peers.vllm_core, vllm_ops, vllm_standins  ->  peers.vllm.core, .ops, .standins (sglang_* and liger_core alike)

Each old module is a file of a few lines calling `serve`: its factories are the new package's
objects (the same ones: a replay line names the new path), and any other name is looked up in the
module the code moved to. Owns the warning and the lookup; nothing else.
"""

from __future__ import annotations

import importlib
import sys
import warnings


def serve(old: str, new: str, factories: dict[str, str] | None = None, release: str | None = None):
    """The `__getattr__` of the old module `old`: its `factories` (old name -> new package's attribute)
    from the package, `RELEASE` the package's row for `release`, every other name from `new`; the
    warning is given once, when the old module is imported."""
    package = new.rsplit(".", 1)[0] if factories is not None and new.count(".") > 1 else new
    where = f"{package}:{', '.join(factories.values())}" if factories else new
    warnings.warn(f"{old} moved: use {where} (the old path works for one release)", DeprecationWarning, stacklevel=3)

    def __getattr__(name: str):
        if factories and name in factories:
            return getattr(importlib.import_module(package), factories[name])
        if release is not None and name in ("RELEASE", "PEER", "VllmFiles", "LigerFiles"):
            row = importlib.import_module(package).RELEASES[release]
            if name == "RELEASE":
                return row
            if name == "PEER":
                return row.peer
            files = getattr(importlib.import_module(new), name)  # the release's own files class, as it was
            return files.of_release(row if name == "VllmFiles" else row.peer)
        try:
            return getattr(importlib.import_module(new), name)
        except AttributeError:
            raise AttributeError(f"module {old!r} has no attribute {name!r} (it moved to {new})") from None

    sys.modules[old].__getattr__ = __getattr__
    return __getattr__
