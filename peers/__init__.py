"""Third-party fused-MoE kernels behind diffmoe's plug-in contract, one module per peer and pinned version.

    peers.vllm_0_33:make    vLLM 0.33.0's Triton fused MoE (TritonExperts), from its own wheel's files

A peer's code is never copied here: `diffmoe peers fetch NAME` (diffmoe/peer_wheels.py) caches
the few files its adapter loads, by path, from the pinned wheel. Without a GPU the Triton
kernels run under the interpreter: the switch must be set before Triton is first imported,
hence here, before any peer module is.

Owns the package's entry point. Must not hold third-party source or judge a peer's results.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
