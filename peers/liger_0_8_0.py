"""Moved to peers.liger (peers/moved.py): this path works for one release, with a DeprecationWarning.

Owns nothing but the old name: must not hold code (the code is at the new path)."""

from .moved import serve

__getattr__ = serve(__name__, 'peers.liger.core', {'make': 'make_0_8_0', 'make_wide': 'make_wide_0_8_0'}, '0.8.0')
