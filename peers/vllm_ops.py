"""Moved to peers.vllm.ops (peers/moved.py): this path works for one release, with a DeprecationWarning.

Owns nothing but the old name: must not hold code (the code is at the new path)."""

from .moved import serve

__getattr__ = serve(__name__, 'peers.vllm.ops')
