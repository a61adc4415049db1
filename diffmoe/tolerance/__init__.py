"""How close is close enough: one buffer of the candidate against the same buffer of the reference.

`compare` applies a `Rule` element by element, `table` is the one tolerance table (per quant
scheme, judging mode and numerics profile), `gemm_interval` derives a GEMM stage's per-element
interval from its exact float64 dot products.

Owns rules and comparisons. Must not run an implementation or build a report.
"""
