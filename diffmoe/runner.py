"""Public path of `run_differential`: `diffmoe.runner` is `diffmoe.check.runner`, the same module object.

Kept because users import it (README, docs): imports, attributes and monkeypatching all reach
the one module in diffmoe/check/runner.py. Must not hold code of its own.
"""

import sys

from diffmoe.check import runner as _module

sys.modules[__name__] = _module
