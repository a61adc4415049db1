"""Moved to diffmoe/interpreter/address_analysis.py (issue 43: the candidate's process, where the
interpreter's address record is analysed, may not see diffmoe/oracles/). This name stays for code
that imported it; it warns.

Owns nothing but the old name; must not grow code of its own."""

import warnings

from diffmoe.interpreter.address_analysis import *  # noqa: F401,F403

warnings.warn("diffmoe.oracles.address_analysis moved to diffmoe.interpreter.address_analysis", DeprecationWarning,
              stacklevel=2)
