"""`python -m diffmoe`: the same as the `diffmoe` command.

Must not hold logic of its own: it calls diffmoe.frontends.cli.main.
"""

import sys

from diffmoe.frontends.cli import main

sys.exit(main())
