"""Public path of the plug-in contract: `diffmoe.contract` is `diffmoe.adapters.contract`, the same module object.

Kept because users import it (README, docs): imports, attributes and monkeypatching all reach
the one module in diffmoe/adapters/contract.py. Must not hold code of its own.
"""

import sys

from diffmoe.adapters import contract as _module

sys.modules[__name__] = _module
