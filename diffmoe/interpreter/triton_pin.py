"""Which Triton release is importable: for the modules that hook the interpreter's internals
(address_recorder, fixes), which are pinned to the release they were written for.

Owns reading the version only; it imports Triton when asked, never at import.
"""

from __future__ import annotations


def triton_release() -> tuple[str, tuple[int, int] | None, str | None]:
    """(version string, (major, minor) or None when unreadable, why triton cannot be imported or None)."""
    try:
        import triton
    except Exception as exc:  # noqa: BLE001 - any import failure means no interpreter to hook
        return "", None, str(exc)
    version = str(getattr(triton, "__version__", "unknown"))
    parts = version.split(".")
    try:
        return version, (int(parts[0]), int(parts[1])), None
    except (IndexError, ValueError):
        return version, None, None
