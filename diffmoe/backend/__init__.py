"""Can the backend be trusted, and does the code compile for a GPU we lack.

`conformance` (probes of the primitives a Triton MoE assumes), `doctor` (`diffmoe doctor`: the
probes' full sweep as one report) and `compile_gate` (`diffmoe compile-check`: every kernel
specialization compiled for a GPU this machine does not have).

Owns the backend's verdicts. Must not run a differential check.
"""
