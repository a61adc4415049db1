"""Moved to peers.sglang (peers/moved.py): this path works for one release, with a DeprecationWarning.

Owns nothing but the old name: must not hold code (the code is at the new path)."""

from .moved import serve

__getattr__ = serve(__name__, 'peers.sglang.core', {'make': 'make_0_5_20', 'make_fallback': 'make_fallback_0_5_20', 'make_scaled': 'make_scaled_0_5_20', 'wheel_function': 'wheel_function_0_5_20'}, '0.5.20')
