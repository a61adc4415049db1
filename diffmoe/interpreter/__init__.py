"""The Triton interpreter, made trustworthy and observable (`TRITON_INTERPRET=1`).

`fixes` (its numeric defects fixed once, at the interpreter), `fast_path` (jit helpers skip
re-patching, same bits), `dot_rows` (every `tl.dot` one output row at a time: a row's bits
never depend on its neighbours), `program_count` (how many Triton programs have run: a launch reported as
Triton that ran none is found), `grid_order` (program instances in any `Schedule`), `address_recorder`
(which bytes each program instance touches, for the races and store-extent oracles) and
`triton_pin` (the Triton release these hooks were written for).

Owns every hook into Triton's interpreter internals. Must not judge (the oracles read what the
recorder saw) and must not import Triton before a hook is installed.
"""
