"""The one launch helper every kernel launch goes through.

It applies the program `Schedule` (an order table the kernels read when REORDER is on; the
identity schedule passes REORDER=False, so the CUDA fast path reads nothing extra) and, when
a recorder is attached, reports the stage, the kernel and the views it reads and writes.
Without a recorder it adds nothing but a branch.

Under the Triton interpreter it is also where the interpreter's numeric defects are fixed, once
per process, before any kernel of ours runs (diffmoe.interpreter.fixes: exact float32 <-> bf16 /
e4m3fn casts and bf16 / fp8 dots): at import, so the conformance probes (diffmoe.backend.conformance, run
by optimized.backend, which imports this module to install the fixes first) already see the fixed primitives and the backend traits turn the
corresponding software workarounds off, and again (a dictionary check) at each launch. The
interpreter fast path (diffmoe.interpreter.fast_path: jit helpers skip re-patching triton.language,
same ops, same bits) is installed at the same moment.

Owns launching and installing the interpreter fixes. Must not choose tiles or traits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from diffmoe.interpreter import fixes as interpreter_fixes
from diffmoe.interpreter import fast_path as interpreter_speed
from diffmoe.contract import LaunchInfo, LaunchRecorder, Schedule, interpreter_enabled


def install_interpreter_fixes() -> interpreter_fixes.FixStatus | None:
    """Fix the interpreter's numeric defects (idempotent); None when the interpreter is not in use."""
    if not interpreter_enabled():
        return None
    from diffmoe.backend.conformance import gated_probe  # the probes decide the gated fixes (interpreter/fixes.py)

    interpreter_speed.install()  # exact: helpers skip re-patching triton.language (diffmoe/interpreter/fast_path.py)
    return interpreter_fixes.install(probe=gated_probe)


install_interpreter_fixes()


@dataclass
class LaunchContext:
    """Per-run launch state: schedule, recorder, and the launch counter random orders use."""

    device: torch.device
    schedule: Schedule = field(default_factory=Schedule)
    recorder: LaunchRecorder | None = None
    launches: int = 0
    _dummy_order: torch.Tensor | None = None

    def order_table(self, num_programs: int) -> tuple[torch.Tensor, bool]:
        if self.schedule.is_identity:
            if self._dummy_order is None:
                self._dummy_order = torch.zeros(1, dtype=torch.int32, device=self.device)
            return self._dummy_order, False
        order = self.schedule.order(num_programs, self.launches)
        return torch.tensor(order, dtype=torch.int32, device=self.device), True


# No multiply-add contraction on CUDA: every float32 product and sum is rounded on its own, as in
# the reference (torch) and the interpreter (numpy), so a GEMM epilogue or a scale product never
# carries one rounding fewer. Said explicitly because Triton's default flips from on (3.9) to off
# (3.10); the interpreter ignores the option.
FP_FUSION = False


def kernel_name(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)  # a JITFunction wraps the Python function
    return getattr(fn, "__name__", type(kernel).__name__)


def launch(ctx: LaunchContext, kernel, grid_size: int, *, stage: str, reads: dict, writes: dict, **kernel_args) -> None:
    """Launch `kernel` on a (grid_size,) grid with keyword arguments, order_ptr and REORDER added."""
    if grid_size <= 0:
        return
    if not interpreter_fixes.installed():
        install_interpreter_fixes()
    order, reorder = ctx.order_table(grid_size)
    info = None
    if ctx.recorder is not None:
        info = LaunchInfo(stage=stage, kernel=kernel_name(kernel), grid=(grid_size,), reads=reads, writes=writes,
                          triton=True)
        ctx.recorder.before_launch(info)
    kernel[(grid_size,)](**kernel_args, order_ptr=order, REORDER=reorder, enable_fp_fusion=FP_FUSION)
    ctx.launches += 1
    if info is not None:
        ctx.recorder.after_launch(info)
