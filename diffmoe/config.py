"""Public path of `MoEConfig`: `diffmoe.config` is `diffmoe.problem.config`, the same module object.

Kept because users import it (README, docs): imports, attributes and monkeypatching all reach
the one module in diffmoe/problem/config.py. Must not hold code of its own.
"""

import sys

from diffmoe.problem import config as _module

sys.modules[__name__] = _module
