"""Third-party fused-MoE kernels behind diffmoe's plug-in contract: one package per project, each
with one release table (diffmoe.contract.PEER_PROJECTS names them).

    peers.vllm       vLLM's Triton fused MoE (TritonExperts)      --impl vllm, vllm==0.28.0, ...
    peers.sglang     SGLang's Triton fused MoE (fused_experts)    --impl sglang, sglang==0.5.20, ...
    peers.liger      Liger-Kernel's bf16 fused MoE                --impl liger, liger==0.8.0, ...
    peers.lmdeploy   lmdeploy's blocked-FP8 fused MoE             --impl lmdeploy

In each, `releases.py` is the table (a release is one row: its wheel's pin and what differs), the
package exports each release's factories (`peers.vllm:make_0_28_0`, peers/exports.py) and `core.py`
is the adapter. `common.py` holds what every adapter shares, `call_sites.py` the table of where each
release's own model layer calls the kernel, `moved.py` the old module paths (one release, with a
warning).

A peer's code is never copied here: `diffmoe peers fetch NAME` (diffmoe/adapters/peer_wheels.py)
caches the few files its adapter loads, by path, from the pinned wheel. Importing this package, or
a project's, loads nothing and changes no environment: without a GPU the first load of a peer's
files turns the Triton interpreter on (peers/common.py, `PeerFiles.get`), as the CLI does before it
imports an --impl module.

Owns the package map. Must not hold third-party source or judge a peer's results.
"""

import importlib as _importlib
import warnings as _warnings

# What this module exported before the shared code moved to peers/common.py: served for one release
_COMMON = ("PeerFiles", "ReportingKernel", "SelfAllocatingPeer", "check_problem", "fresh_allocations_plan",
           "install_interpreter_fixes", "interpreting", "launch_grid", "report_launch",
           "route_order", "PER_CALL_FIELDS")


def __getattr__(name: str):
    if name in _COMMON:
        _warnings.warn(f"peers.{name} moved: use peers.common.{name} (the old path works for one release)",
                       DeprecationWarning, stacklevel=2)
        return getattr(_importlib.import_module("peers.common"), name)
    raise AttributeError(f"module 'peers' has no attribute {name!r}")
