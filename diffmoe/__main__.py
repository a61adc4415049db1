"""`python -m diffmoe`: the same as the `diffmoe` command.

Must not hold logic of its own: it calls diffmoe.cli.main.
"""

import sys

from .cli import main

sys.exit(main())
