"""`diffmoe compile-check` in a fresh process (`compile_check`), and the toy Triton plug-in the compile
tests build (`PLUGIN`, a module's source): shared by the compile gate's tests and the progress tests.

Owns the subprocess call and the plug-in's source. Must not judge a compile: the tests do.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = [sys.executable, "-m", "diffmoe.frontends.cli"]


def compile_check(*args: str, extra_path: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, env.get("PYTHONPATH")) if p)
    return subprocess.run([*CLI, "compile-check", *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=timeout)


PLUGIN = '''
import os
import torch
import triton
import triton.language as tl

from diffmoe.contract import RunResult, WorkspacePlan

NAN = tl.constexpr(float("nan"))


@triton.jit
def zero_kernel(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros([BLOCK], dtype=tl.float32), mask=offs < n)


@triton.jit
def nan_where_nan(x):
    return tl.where(x == x, x, NAN)


@triton.jit
def fill_kernel(out_ptr, n, USE_NAN: tl.constexpr, NESTED: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if NESTED:  # the global seen by two jit functions: Triton's cache key itself fails
        value = nan_where_nan(tl.zeros([BLOCK], dtype=tl.float32)) + NAN
    else:  # seen once: it compiles, then Triton's pre-launch check rejects it
        value = NAN if USE_NAN else 0.0
    tl.store(out_ptr + offs, tl.zeros([BLOCK], dtype=tl.float32) + value, mask=offs < n)


class Plugin:
    """A toy implementation: one Triton launch that fills the output."""

    def __init__(self, config, use_nan, nested=False):
        self.config = config
        self.use_nan = use_nan
        self.nested = nested

    def workspace_shapes(self, max_tokens):
        return (16, 16)

    def workspace_plan(self, num_tokens):
        return WorkspacePlan("toy", (), (), (), (16, 16))

    def run(self, problem, workspaces, *, output=None, schedule=None, recorder=None):
        out = torch.empty(problem.num_tokens, self.config.hidden, dtype=torch.float32)
        if self.use_nan is False:
            zero_kernel[(triton.cdiv(out.numel(), 256),)](out, out.numel(), BLOCK=256)
        elif self.use_nan:
            fill_kernel[(triton.cdiv(out.numel(), 256),)](out, out.numel(), USE_NAN=self.use_nan, NESTED=self.nested,
                                                          BLOCK=256)
        return RunResult(output=out.to(torch.bfloat16))


def good(config):
    return Plugin(config, False)


def nan_global(config):
    return Plugin(config, True)


def nan_global_nested(config):
    return Plugin(config, True, nested=True)


def no_launch(config):
    return Plugin(config, None)
'''
