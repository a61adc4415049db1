"""Public path of the Hypothesis strategies: `diffmoe.strategies` is `diffmoe.fuzz.strategies`, the same module object.

Kept because users import it (README, docs): imports, attributes and monkeypatching all reach
the one module in diffmoe/fuzz/strategies.py. Must not hold code of its own.
"""

import sys

from diffmoe.fuzz import strategies as _module

sys.modules[__name__] = _module
