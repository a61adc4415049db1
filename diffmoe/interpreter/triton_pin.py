"""Which Triton release is importable: for the modules that hook the interpreter's internals
(address_recorder, fixes), which are pinned to the release they were written for.

Owns reading the version, and the three reasons a hook cannot run here (Triton not importable,
another release, not interpreting); it imports Triton when asked, never at import.
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


def pinned_interpreter_problem(subject: str, supported: tuple[int, int], not_interpreting: str) -> str | None:
    """Why `subject` (a module hooking the interpreter) cannot run here, or None: Triton not
    importable, a release other than `supported`, or kernels not interpreted (`not_interpreting`)."""
    version, major_minor, broken = triton_release()
    if broken is not None:
        return f"triton is not importable: {broken}"
    import triton

    if major_minor != supported:
        return f"{subject} supports triton {supported[0]}.{supported[1]}.x, found {version}"
    try:
        interpret = bool(triton.knobs.runtime.interpret)
    except Exception:  # noqa: BLE001 - a release without the knob: not interpreting
        interpret = False
    return None if interpret else not_interpreting
