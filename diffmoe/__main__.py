"""`python -m diffmoe`: the same as the `diffmoe` command."""

import sys

from .cli import main

sys.exit(main())
