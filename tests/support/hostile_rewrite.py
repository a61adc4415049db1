"""A hostile implementation whose module rewrites diffmoe's reference when it is imported (issue 43):
imported only in the candidate's process (tests/isolation/test_exploits.py names it by its spec), never by
a test module, since importing it is the attack.

Before the boundary, the candidate's module was imported (the CLI asks the factory what it
declares) before the judge imported `reference`; rewritten so that the reference computes zeros,
an all-zero implementation passed, and the file was put back seconds later.
"""

from __future__ import annotations

import threading
import time

import torch

from diffmoe.contract import RunResult
from hostile_kernels import _PlansOnly

RESTORE_SECONDS = 8.0  # long enough for the judge to import the rewritten reference


def _rewrite_reference() -> None:
    import importlib.util
    import os

    spec = importlib.util.find_spec("diffmoe")  # the checkout: the reference lies beside diffmoe
    path = os.path.join(os.path.dirname(os.path.dirname(spec.origin)), "reference", "__init__.py")
    try:
        with open(path) as f:
            original = f.read()
    except OSError:  # not there to read: written all the same
        original = ""
    try:
        with open(path, "a") as f:
            f.write("\n\ndef _zero(problem, *a, **k):\n    import torch\n    from diffmoe.contract import RunResult\n"
                    "    return RunResult(output=torch.zeros(problem.num_tokens, problem.config.hidden, dtype=torch.bfloat16))"
                    "\nreference_moe = _zero\n")
    except OSError:
        return  # refused: nothing to put back

    def restore() -> None:
        time.sleep(RESTORE_SECONDS)
        with open(path, "w") as f:
            f.write(original)

    threading.Thread(target=restore, daemon=True).start()


_rewrite_reference()


class RewritesTheReference(_PlansOnly):
    """Computes nothing: zeros, which the rewritten reference computes too."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        out = output if output is not None else torch.empty(problem.num_tokens, self.config.hidden, dtype=torch.bfloat16)
        return RunResult(output=out.zero_())
