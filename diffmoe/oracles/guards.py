"""Moved to diffmoe/check/guards.py (issue 43: the candidate's process, which allocates the guarded
workspaces, may not see diffmoe/oracles/). This name stays for code that imported it; it warns.

Owns nothing but the old name; must not grow code of its own."""

import warnings

from diffmoe.check.guards import *  # noqa: F401,F403

warnings.warn("diffmoe.oracles.guards moved to diffmoe.check.guards", DeprecationWarning, stacklevel=2)
