"""Third-party fused-MoE kernels behind diffmoe's plug-in contract, one module per peer and pinned version.

    peers.vllm_0_33:make      vLLM 0.33.0's Triton fused MoE (TritonExperts), from its own wheel's files
    peers.lmdeploy_0_18:make  lmdeploy 0.18.0's blocked-FP8 fused MoE, from its own wheel's files

A peer's code is never copied here: `diffmoe peers fetch NAME` (diffmoe/peer_wheels.py) caches
the few files its adapter loads, by path, from the pinned wheel. Without a GPU the Triton
kernels run under the interpreter: the switch must be set before Triton is first imported,
hence here, before any peer module is.

Owns the package's entry point and what every adapter shares (`modules_installed`: a peer's
module names resolved to its loaded files while it runs). Must not hold third-party source or judge a peer's results.
"""

import contextlib
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@contextlib.contextmanager
def modules_installed(modules: dict):
    """`sys.modules` maps each name in `modules` to its module while inside (a peer's files import
    their siblings, some at call time); every name is put back as it was on the way out."""
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
