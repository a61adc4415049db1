"""The program-order prologue every kernel starts with (jit code only).

optimized.launch passes each launch an order table and REORDER: the identity schedule passes
REORDER=False and the kernel reads nothing extra (the CUDA fast path is unchanged); any other
schedule (reversed, random) makes physical program p run logical program order[p], which is
how the schedule-permutation oracle reorders programs even on the sequential interpreter.

Owns the prologue. Must not read anything but the order table.
"""

import triton
import triton.language as tl


@triton.jit
def logical_program_id(order_ptr, REORDER: tl.constexpr):
    """The logical program id of this instance: tl.program_id(0), or its entry in the order table."""
    pid = tl.program_id(0)
    if REORDER:
        pid = tl.load(order_ptr + pid)
    return pid
