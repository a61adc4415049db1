"""Public path of the pytest plugin: `diffmoe.pytest_plugin` is `diffmoe.frontends.pytest_plugin`, the same module object.

Kept because users import it (README, docs): imports, attributes and monkeypatching all reach
the one module in diffmoe/frontends/pytest_plugin.py. Must not hold code of its own.
"""

import sys

from diffmoe.frontends import pytest_plugin as _module

sys.modules[__name__] = _module
