"""Hostile implementations (issue 33, item 2), each modelled on a way submitted "fast" kernels
gamed other evaluators (KernelBench's revamped evaluation, GPU MODE's pygpubench): copy the
expected tensors, read them from memory, patch the comparison, return views, NaN, cached or
never-computed results. tests/test_exploits.py runs each; every one must end in a finding.

A module of its own, importing only what an implementation may (the shipped kernel, the
contract): isolated, the candidate's process loads it by reference, and what it then reaches for
(the reference, the comparison) is what the import guard refuses.
"""

from __future__ import annotations

import gc
import sys
import threading
import time

import torch

from diffmoe.adapters.contract import RunResult
from optimized.moe import TritonFP8MoE


class CopiesTheReference(TritonFP8MoE):
    """Computes nothing: imports diffmoe's reference and returns its result."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        from reference import reference_moe

        result = reference_moe(problem)
        if output is not None:
            output.copy_(result.output)
            return RunResult(output=output, intermediates=result.intermediates)
        return result


class ReadsTheReferenceThroughGc(TritonFP8MoE):
    """Computes nothing: finds the check's own reference result among the live objects and copies
    it (zeros when there is none to find)."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        shape = (problem.num_tokens, self.config.hidden)
        for obj in gc.get_objects():
            if isinstance(obj, RunResult) and obj.intermediates and tuple(obj.output.shape) == shape:
                if output is not None:
                    output.copy_(obj.output)
                    return RunResult(output=output, intermediates=dict(obj.intermediates))
                return obj
        out = output if output is not None else torch.empty(shape, dtype=torch.bfloat16)
        return RunResult(output=out.zero_())


class PatchesTheComparison(TritonFP8MoE):
    """Replaces diffmoe's comparison, wherever a module holds it, by one that compares the
    reference with itself; then returns zeros."""

    patched: list = []  # (module, the original), for the test to undo: the patch outlives the check

    def run(self, problem, workspaces, *, output=None, **kwargs):
        from diffmoe.tolerance.compare import compare as original

        def agrees(name, reference, candidate, rule, bound=None):
            return original(name, reference, reference, rule, bound=bound)

        for mod in list(sys.modules.values()):
            if getattr(mod, "compare", None) is original:
                mod.compare = agrees
                PatchesTheComparison.patched.append((mod, original))
        result = super().run(problem, workspaces, output=output, **kwargs)
        result.output.zero_()
        return result

    @classmethod
    def undo(cls) -> None:
        while cls.patched:
            mod, original = cls.patched.pop()
            mod.compare = original


class ReportsLaunchesButRunsNoKernel(TritonFP8MoE):
    """Announces its stages to the recorder as launches, but computes everything in torch (here:
    the reference): no Triton kernel runs."""

    def run(self, problem, workspaces, *, output=None, recorder=None, **kwargs):
        return CopiesTheReference.run(self, problem, workspaces, output=output)


class ReturnsAViewOfTheInput(TritonFP8MoE):
    def run(self, problem, workspaces, *, output=None, **kwargs):
        super().run(problem, workspaces, output=output, **kwargs)
        return RunResult(output=problem.hidden_states)


class ReturnsNaN(TritonFP8MoE):
    """All-NaN output: a comparison that treats NaN as a wildcard would pass it."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        result = super().run(problem, workspaces, output=output, **kwargs)
        result.output.fill_(float("nan"))
        return result


class WritesAfterReturning(TritonFP8MoE):
    """Returns at once and writes the output on a thread afterwards (work moved off the call)."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        from reference import reference_moe

        result = reference_moe(problem).output

        def late():
            time.sleep(0.2)
            target.copy_(result)

        target = output if output is not None else torch.empty_like(result)
        threading.Thread(target=late, daemon=True).start()
        return RunResult(output=target)


_CACHE: dict[tuple, torch.Tensor] = {}


class CachesByShape(TritonFP8MoE):
    """Keeps each output by input shape, and returns it for any later call of that shape."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        key = tuple(problem.hidden_states.shape)
        if key in _CACHE:
            out = output if output is not None else torch.empty_like(_CACHE[key])
            return RunResult(output=out.copy_(_CACHE[key]))
        result = super().run(problem, workspaces, output=output, **kwargs)
        _CACHE[key] = result.output.clone()
        return result


class ReturnsZerosAndNothingElse(TritonFP8MoE):
    """Computes nothing and reports nothing: no launch, no intermediate, a zero output (once
    judged by no oracle: with no down-GEMM input reported, the output had no bound to meet)."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        out = output if output is not None else torch.empty(problem.num_tokens, self.config.hidden, dtype=torch.bfloat16)
        return RunResult(output=out.zero_())


class ReturnsAViewOfAWorkspace(TritonFP8MoE):
    """Computes, then hands back a view of a workspace (bytes the harness filled and the kernel
    used as scratch) instead of the caller's output."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        result = super().run(problem, workspaces, output=output, **kwargs)
        shape = tuple(result.output.shape)
        ws1 = workspaces[0]
        count = min(ws1.numel() // 2, result.output.numel())
        return RunResult(output=ws1[: count * 2].view(torch.bfloat16).reshape(-1)[:count].reshape(shape)
                         if count == result.output.numel() else ws1[:0].view(torch.bfloat16))
