"""Hostile implementations (issue 33, item 2), each modelled on a way submitted "fast" kernels
gamed other evaluators (KernelBench's revamped evaluation, GPU MODE's pygpubench): copy the
expected tensors, read them from memory, patch the comparison, return views, NaN, cached or
never-computed results. tests/isolation/test_exploits.py runs each; every one must end in a finding.

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
import triton
import triton.language as tl

from diffmoe.contract import LaunchInfo, RunResult
from diffmoe.problem.vocabulary import Buffers, buffer_spec, pipeline_stages
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
    """Computes nothing: finds the check's own reference result among the live objects (the
    `reference` beside the very problem it is called with: a check calls several problems of one
    shape) and copies it; zeros when there is none to find."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        for obj in gc.get_objects():
            try:
                found = getattr(obj, "problem", None) is problem and getattr(obj, "reference", None)
            except KeyboardInterrupt:
                raise
            except BaseException:  # noqa: BLE001 - what a live object does on attribute access (pytest's
                continue  # mark generator raises Failed, a BaseException, for an unknown name)
            if isinstance(found, RunResult) and found.intermediates:
                if output is not None:
                    output.copy_(found.output)
                    return RunResult(output=output, intermediates=dict(found.intermediates))
                return found
        out = output if output is not None else torch.empty(problem.num_tokens, self.config.hidden, dtype=torch.bfloat16)
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
    """Announces its stages to the recorder as Triton launches (LaunchInfo.triton) on the declared
    views, but computes everything in torch (here: the reference's stages, written into those
    views): no Triton kernel runs."""

    triton = True  # what each launch claims

    def run(self, problem, workspaces, *, output=None, recorder=None, **kwargs):
        from reference import reference_moe

        cfg, t = self.config, problem.num_tokens
        want = reference_moe(problem)
        views = dict(problem.inputs())
        for p in self.workspace_plan(t).placements:
            spec = buffer_spec(cfg, p.buffer, t)
            views[p.buffer] = workspaces[p.workspace][p.offset:p.end].view(spec.dtype).view(spec.shape)
        views.setdefault(Buffers.OUTPUT, output if output is not None else torch.empty(t, cfg.hidden, dtype=torch.bfloat16))
        for stage in pipeline_stages(cfg):
            for name in stage.writes:  # what the plan does not carve (the scales): private tensors
                if name not in views:
                    spec = buffer_spec(cfg, name, t)
                    views[name] = torch.empty(spec.shape, dtype=spec.dtype)
            info = LaunchInfo(stage.name, f"{stage.name}_kernel", (max(1, t),),
                              {n: views[n] for n in stage.reads if n in views},
                              {n: views[n] for n in stage.writes}, triton=self.triton)
            if recorder is not None:
                recorder.before_launch(info)
            for name, view in info.writes.items():
                value = want.output if name == Buffers.OUTPUT else want.intermediates.get(name)
                if value is not None:
                    view.copy_(value.reshape(view.shape).to(view.dtype))
            if recorder is not None:
                recorder.after_launch(info)
        return RunResult(output=views[Buffers.OUTPUT])


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


# ---- issue 43: doors out of the candidate's process ------------------------------------------
class _PlansOnly:
    """The shipped kernel's workspace plan and shapes, and no run_stage (teacher forcing is then
    skipped, as for any implementation without it): what computes nothing needs to declare."""

    def __init__(self, config):
        self.config = config
        self._shipped = TritonFP8MoE(config)

    def workspace_plan(self, num_tokens=None):
        return self._shipped.workspace_plan(num_tokens)

    def workspace_shapes(self, max_tokens):
        return self._shipped.workspace_shapes(max_tokens)


def _zeros(problem, output, hidden):
    out = output if output is not None else torch.empty(problem.num_tokens, hidden, dtype=torch.bfloat16)
    return RunResult(output=out.zero_())


class _EmptiesTheFindings:
    """Unpickled in the judge, this would empty every report it makes (issue 43's pickle door)."""

    def __reduce__(self):
        return exec, ("import diffmoe.check.report as r; r.Report.__init__ = (lambda init: lambda self, *a, **k: "
                      "(init(self, *a, **k), self.findings.clear())[1])(r.Report.__init__)",)


class HandsThePickleBack(_PlansOnly):
    """Computes nothing (zeros) and declares a numerics profile that is an object whose unpickling
    in the judge makes every report pass: a judge that unpickles the candidate's messages runs it."""

    numerics = _EmptiesTheFindings()

    def run(self, problem, workspaces, *, output=None, **kwargs):
        return _zeros(problem, output, self.config.hidden)


class RemovesTheImportGuard(_PlansOnly):
    """Computes nothing: takes the import guard off sys.meta_path, imports the reference and
    returns its result (issue 43's guard door)."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "ImportGuard"]
        return CopiesTheReference.run(self, problem, workspaces, output=output, **kwargs)


class DropsAPthIntoTheVenv(TritonFP8MoE):
    """Writes a .pth into the venv's site-packages (code every later interpreter of the venv
    runs at its start), from run: the boundary refuses the write and the judge names the path."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        import site

        _write(f"{site.getsitepackages()[0]}/diffmoe_hostile.pth")
        return super().run(problem, workspaces, output=output, **kwargs)


def _write(path) -> None:
    """One line of Python into `path`, a refusal ignored (the judge is told of it all the same)."""
    try:
        with open(path, "w") as f:
            f.write("import os\n")
    except OSError:
        pass


class OpensASocket(TritonFP8MoE):
    """Connects to a local port from run (a judge's service, another machine): refused, named."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        import socket

        try:
            socket.create_connection(("127.0.0.1", 9), timeout=30).close()  # refused at once; a hang bound
        except OSError:
            pass
        return super().run(problem, workspaces, output=output, **kwargs)


# ---- issue 43, item 3: launches that must do their work ---------------------------------------
@triton.jit
def _does_nothing(x_ptr):
    pass


@triton.jit
def _copy_bytes(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offsets < n
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=live), mask=live)


def _bytes(view: torch.Tensor) -> torch.Tensor:
    assert view.is_contiguous(), "the shipped kernel's views are contiguous"
    return view.reshape(-1).view(torch.uint8)


class _Relay:
    """Between the shipped kernel and the harness's recorder: each of the kernel's launches runs
    unreported (its bytes computed outside any launch the harness sees), then is reported as a
    Triton launch of its own kernel name, inside which `how` redoes its writes (see the classes)."""

    def __init__(self, recorder, how):
        self.recorder, self.how = recorder, how
        self.before: dict[str, torch.Tensor] = {}

    def before_launch(self, info):
        self.before = {n: v.detach().clone() for n, v in info.writes.items()}

    def after_launch(self, info):
        done = {n: v.detach().clone() for n, v in info.writes.items()}
        self.how(info, self.before, done, self.recorder)


def _reported(info, recorder, inside):
    if recorder is not None:
        recorder.before_launch(info)
    inside()
    if recorder is not None:
        recorder.after_launch(info)


class _RelaysItsLaunches(TritonFP8MoE):
    def run(self, problem, workspaces, *, output=None, recorder=None, **kwargs):
        return super().run(problem, workspaces, output=output, recorder=_Relay(recorder, self.relay), **kwargs)


def _one_program(info):
    _does_nothing[(1,)](next(iter(info.writes.values())))


class RunsADoNothingKernel(_RelaysItsLaunches):
    """Reports each launch as a Triton kernel that runs one program doing nothing; the bytes it
    declares were computed before it by code no launch reports (on a GPU: torch on the host).
    Counted, its launches ran a Triton program each, which is all that was asked before."""

    @staticmethod
    def relay(info, before, done, recorder):
        _reported(info, recorder, lambda: _one_program(info))


class WritesItsViewsFromTheHost(_RelaysItsLaunches):
    """Puts each launch's views back as they were, then reports the launch: a one-program kernel
    that does nothing, while torch writes the computed bytes into the views inside the launch."""

    @staticmethod
    def relay(info, before, done, recorder):
        for name, view in info.writes.items():
            view.copy_(before[name])

        def inside():
            _one_program(info)
            for name, view in info.writes.items():
                view.copy_(done[name])

        _reported(info, recorder, inside)


class StoresHalfItsViews(_RelaysItsLaunches):
    """Each reported launch's Triton kernel stores the first half of every view it declares; the
    other half holds what code no launch reports computed before it."""

    @staticmethod
    def relay(info, before, done, recorder):
        for name, view in info.writes.items():
            half = _bytes(view).numel() // 2
            _bytes(view)[:half].copy_(_bytes(before[name])[:half])

        def inside():
            for name, view in info.writes.items():
                n = max(1, _bytes(view).numel() // 2)
                _copy_bytes[(triton.cdiv(n, 256),)](_bytes(done[name]), _bytes(view), n, BLOCK=256)

        _reported(info, recorder, inside)


class WritesIntoThePeerCache(TritonFP8MoE):
    """Drops a file into the peer cache ($DIFFMOE_PEER_CACHE, a peer's wheels that later checks
    import), from run: the boundary refuses the write and the judge names the path."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        from diffmoe.adapters import peer_wheels

        _write(peer_wheels.cache_dir() / "diffmoe_hostile.py")
        return super().run(problem, workspaces, output=output, **kwargs)


def _judging_sources() -> list[str]:
    """What a candidate finds of diffmoe's oracles and tolerance by looking where they lie."""
    import os

    import diffmoe

    found = []
    for folder in ("oracles", "tolerance"):
        path = os.path.join(os.path.dirname(diffmoe.__file__), folder)
        try:
            names = os.listdir(path)
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(path, name)) as f:
                    found.append(f"{folder}/{name}:{len(f.read())}")
            except OSError:
                pass
    return found


class ReadsTheJudgingCode(TritonFP8MoE):
    """Lists and reads diffmoe/oracles/*.py and diffmoe/tolerance/*.py where they lie (to learn the
    bounds it is judged by) and tells the judge whether it found any: zeros when it did (a test
    then sees its check fail), the shipped kernel's result when it found nothing."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        result = super().run(problem, workspaces, output=output, **kwargs)
        if _judging_sources():
            result.output.zero_()
        return result


class ImportsTheOracles(TritonFP8MoE):
    """Imports diffmoe's oracles and tolerance from run (to patch what judges it): refused, named."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        for name in ("diffmoe.oracles", "diffmoe.tolerance.compare"):
            try:
                __import__(name)
            except ImportError:
                pass
        return super().run(problem, workspaces, output=output, **kwargs)
# ---- issue 43 item 4: doors a check with a few calls per instance, on the main thread, left open


class TurnsWrongAfterItsEighthCall(TritonFP8MoE):
    """Right for its first eight calls, then its output is off by a quarter (an autotuner that
    switches to a wrong config once it has timed enough calls, a cache that fills up)."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        self.calls = getattr(self, "calls", 0) + 1
        result = super().run(problem, workspaces, output=output, **kwargs)
        if self.calls > 8:
            result.output.mul_(1.25)
        return result


class WrongOffTheMainThread(TritonFP8MoE):
    """Right when called from the process's main thread; off by a quarter from any other thread."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        result = super().run(problem, workspaces, output=output, **kwargs)
        if threading.current_thread() is not threading.main_thread():
            result.output.mul_(1.25)
        return result


LATE_SECONDS = 0.2  # after returning: within a small check's remaining calls (a 1 s delay outlived a T=2 H=16 fuzz example)


def _later(seconds: float, change) -> None:
    def late():
        time.sleep(seconds)
        change()

    threading.Thread(target=late, daemon=True).start()


class CorruptsItsOutputLate(TritonFP8MoE):
    """Returns a right output, then changes it LATE_SECONDS later (a stream or thread still writing)."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        result = super().run(problem, workspaces, output=output, **kwargs)
        returned = result.output
        _later(LATE_SECONDS, lambda: returned.mul_(1.25))
        return result


class CorruptsItsInputsLate(TritonFP8MoE):
    """Right, and writes nothing of its inputs during a call; LATE_SECONDS after a call of fewer
    tokens than the config's (a decode step), it overwrites that call's hidden states."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        result = super().run(problem, workspaces, output=output, **kwargs)
        if problem.num_tokens < self.config.num_tokens:
            hidden = problem.hidden_states
            _later(LATE_SECONDS, lambda: hidden.mul_(-1))
        return result


class WritesItsInputsAfterItsEighthCall(TritonFP8MoE):
    """Right, and from its 9th call on it negates the hidden states it was given after computing
    (only a series of many calls on one instance sees it; its outputs stay right)."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        self.calls = getattr(self, "calls", 0) + 1
        result = super().run(problem, workspaces, output=output, **kwargs)
        if self.calls > 8:
            problem.hidden_states.mul_(-1)
        return result


class CountsItsCalls(TritonFP8MoE):
    """Honest; counts the calls of `run` made in this process (the series' cache is judged by it)."""

    calls = 0

    def run(self, problem, workspaces, *, output=None, **kwargs):
        type(self).calls += 1
        return super().run(problem, workspaces, output=output, **kwargs)


class WrongAndCountsItsCalls(TritonFP8MoE):
    """Off by a quarter on every call, and counts them (a check that has failed runs no series)."""

    calls = 0

    def run(self, problem, workspaces, *, output=None, **kwargs):
        type(self).calls += 1
        result = super().run(problem, workspaces, output=output, **kwargs)
        result.output.mul_(1.25)
        return result


class CrashesBelowAWidthOf256(TritonFP8MoE):
    """Right at H >= 256 and raises below (a kernel with a tile no narrower config fits): a check at
    H = 256 passes, and the series, whose config is cut to H = 128, has no first call to judge by."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        if problem.hidden_states.shape[-1] < 256:
            raise ValueError("hidden size below 256")
        return super().run(problem, workspaces, output=output, **kwargs)


class CrashesAfterItsEighthCall(TritonFP8MoE):
    """Right for its first eight calls, then raises (a cache that overflows): the series' crash is
    the check's, since its calls before succeeded on that config."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls > 8:
            raise RuntimeError("cache full")
        return super().run(problem, workspaces, output=output, **kwargs)


class StoresPastItsOutputAfterItsEighthCall(TritonFP8MoE):
    """Right, and from its 9th call on a Triton launch copies its output onto itself 4 KiB past
    the end (a grid sized from a stale batch): the bounds guard refuses those accesses."""

    def run(self, problem, workspaces, *, output=None, recorder=None, **kwargs):
        self.calls = getattr(self, "calls", 0) + 1
        result = super().run(problem, workspaces, output=output, recorder=recorder, **kwargs)
        if self.calls > 8:
            flat = _bytes(result.output)
            n = flat.numel() + 4096  # past the 256 guard bytes after it
            info = LaunchInfo(stage=pipeline_stages(self.config)[-1], kernel="_copy_bytes", grid=(1,),
                              reads={Buffers.OUTPUT: result.output}, writes={Buffers.OUTPUT: result.output}, triton=True)
            _reported(info, recorder, lambda: _copy_bytes[(1,)](flat, flat, n, BLOCK=triton.next_power_of_2(n)))
        return result
