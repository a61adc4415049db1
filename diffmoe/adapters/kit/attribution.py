"""Automatic launch attribution: every Triton launch and every stand-in op of a run reported at its
pipeline stage, from the tensors it reads and writes, so an adapter names buffers, not launches.

    kernels.fused_moe_kernel = kit.ReportingKernel("fused_moe_kernel", kernels.fused_moe_kernel, ACTIVE)
    ACTIVE.reporter = kit.Attribution(config, problem, recorder)   # families.FamilyFunction does this
    out = attribution.finish(fused_experts(...))

A run's tensors are named by view: the bytes of their storage they can address (two views of
one allocation that share no byte are two buffers). The problem's inputs are named from the start (and any
tensor the adapter names with `name(tensor, buffer)`, e.g. the int32 copy of topk_ids it passes).
A launch (`launch`, what a ReportingKernel sends) or a stand-in op (`op`, with its reads and writes
given) reads the named tensors among its arguments and writes the unnamed ones (fresh allocations:
a self-allocating kernel's intermediates), and an earlier stage's intermediate its stage does not
read (memory the kernel reuses: vLLM's intermediate_cache3 over cache1's bytes). Its stage is the latest stage of the pipeline
(diffmoe.problem.vocabulary.pipeline_stages, the alignment before it) that reads one of the buffers
it reads: the down GEMM reads w2, the gate/up GEMM w1, the activation gate_up_output, the input's
quant hidden_states, the alignment topk_ids only. What it writes gets that stage's names: the
adapter's own for an argument it names (`names`: argument or parameter name -> buffer), else the
argument's name when it is one of the stage's buffers, else the one the stage writes in that dtype
(FP8 codes, float32 scales, the bf16 intermediate), else a private buffer named after the argument.
`finish(output)` attributes the host code after the last launch: the combine over top-k (the reduce,
reading down_output, writing the output), or, when the down GEMM stored the output itself (top-1),
a copy of it reported as the reduce. A launch that reads none of the pipeline's buffers
is placed with the latest stage that wrote a buffer it reads (a staged alignment's second kernel,
reading the first's private counts), else after the previous launch, at its stage; the first launch
of a run reading nothing named is a ValueError naming the kernel (the run's crash finding): name its inputs.

Owns the attribution and the kernel proxy (`ReportingKernel`, `launch_grid`: peers/ use them too).
Must not import an implementation or know any package's names.
"""

from __future__ import annotations

import threading
from typing import Mapping

import torch

from diffmoe.problem.config import MoEConfig
from diffmoe.problem.vocabulary import FP8_DTYPE, INPUT_NAMES, Buffers as B, Stages, buffer_spec, pipeline_stages

ACTIVE = threading.local()  # a default slot for the run in progress on this thread: `ACTIVE.reporter`
ALIGN_WRITES = (B.SORTED_TOKEN_IDS, B.EXPERT_IDS, B.NUM_TOKENS_POST_PADDED)
# what each GEMM reads besides its activations: the weights decide the stage
WEIGHTS_OF = {Stages.GATE_UP_GEMM: (B.W1, B.W1_SCALE), Stages.DOWN_GEMM: (B.W2, B.W2_SCALE)}


class ReportingKernel:
    """Stands where a module holds a jit kernel (instrumentation, not a change): `kernel[grid](...)`
    goes to the reporter `active.reporter` of the run in progress, if any, as
    `reporter.launch(name, grid, bound_args, run, jit)`, and runs the kernel unchanged."""

    def __init__(self, name: str, jit, active: threading.local = ACTIVE):
        self.name, self.jit, self.active = name, jit, active
        self.arg_names = list(jit.arg_names)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            run = lambda: self.jit[grid](*args, **kwargs)  # noqa: E731
            reporter = getattr(self.active, "reporter", None)
            if reporter is None:
                return run()
            bound = dict(zip(self.arg_names, args), **kwargs)
            return reporter.launch(self.name, grid, bound, run, self.jit)

        return launch


def launch_grid(jit, grid, args: dict) -> tuple[int, ...]:
    """The grid a launch `jit[grid](**args)` runs: a tuple as given, or a callable grid of the bound
    arguments; of an autotuned kernel with one config, of the arguments and that config's
    meta-parameters (the only config it can run). An autotuned kernel with several configs picks
    one at launch, so its grid is not known beforehand: a ValueError says so."""
    if not callable(grid):
        return tuple(grid)
    configs = getattr(jit, "configs", None)
    if configs is None:
        return tuple(grid(args))
    if len(configs) != 1:
        raise ValueError(f"{getattr(jit, 'fn', jit)} is autotuned over {len(configs)} configs: its grid is chosen at "
                         "launch; pin it to one config to report its launches")
    return tuple(grid({**args, **configs[0].all_kwargs()}))


def _stage_keys(config: MoEConfig) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """(stage, the buffers that decide it, what it writes), in pipeline order, the alignment first."""
    keys = [(Stages.ALIGN, (B.TOPK_IDS,), ALIGN_WRITES)]
    for stage in pipeline_stages(config):
        reads = tuple(n for n in stage.reads if n != B.TOPK_WEIGHTS) + WEIGHTS_OF.get(stage.name, ())
        keys.append((stage.name, reads, stage.writes))
    return keys


def _span(tensor: torch.Tensor) -> tuple[int, int, int]:
    """(its storage's address, first byte, one past the last byte) of the bytes a view can address.
    Views are told apart by these, not by storage alone: a kernel that carves two intermediates from
    one allocation (FlagGems' intermediate_cache1 and cache3) had its down GEMM's store into the
    second counted as a read of the first, four bogus findings (issue 49)."""
    size = tensor.element_size()
    start = tensor.storage_offset() * size
    last = sum((n - 1) * stride for n, stride in zip(tensor.shape, tensor.stride()))
    return tensor.untyped_storage().data_ptr(), start, start + last * size + size


class Attribution:
    """One run's launch reporting, attributed from the tensors each launch touches (module docstring)."""

    def __init__(self, config: MoEConfig, problem, recorder=None, names: Mapping[str, str] | None = None):
        self.config, self.recorder, self.names = config, recorder, dict(names or {})
        self.num_tokens = problem.num_tokens
        self.keys = _stage_keys(config)
        self.weighted = {s.name for s in pipeline_stages(config) if B.TOPK_WEIGHTS in s.reads}
        # each stage's pipeline reads, and the intermediates some stage writes: a named intermediate
        # among a launch's arguments that its stage does not read is memory the kernel reuses (_report)
        self.stage_reads = {s.name: set(s.reads) for s in pipeline_stages(config)}
        self.intermediates = {n for s in pipeline_stages(config) for n in s.writes}
        self.writer_stage: dict[str, str] = {}  # buffer name -> the stage of the launch that last wrote it
        self.named: list[tuple[str, torch.Tensor]] = []
        self.stages: list[str] = []  # each reported launch's stage, in order
        for name in INPUT_NAMES:
            tensor = getattr(problem, name, None)
            if isinstance(tensor, torch.Tensor) and tensor.numel():
                self.name(tensor, name)

    def name(self, tensor: torch.Tensor, buffer: str) -> torch.Tensor:
        """`tensor` is `buffer` from now on (the first naming of a storage wins)."""
        if self.name_of(tensor) is None:
            self.named.append((buffer, tensor))
        return tensor

    def name_of(self, tensor: torch.Tensor) -> str | None:
        return self._entry(tensor)[0]

    def _entry(self, tensor: torch.Tensor):
        """(name, the named view) of the named view whose bytes `tensor` shares, or (None, None)."""
        if tensor.numel():
            ptr, start, end = _span(tensor)
            for name, known in self.named:
                if known.numel():
                    known_ptr, known_start, known_end = _span(known)
                    if known_ptr == ptr and start < known_end and known_start < end:
                        return name, known
        return None, None

    def _stage(self, kernel: str, reads: Mapping[str, torch.Tensor]):
        """(stage, what it writes, why). The latest stage reading a pipeline buffer it reads; for a
        launch that reads only buffers of its own (a staged alignment's private counts, issue 49), the
        latest stage that wrote one of them, else the previous launch's: its place between judged launches."""
        for stage, deciding, writes in reversed(self.keys):
            decided_by = next((n for n in deciding if n in reads), None)
            if decided_by is not None:
                return stage, writes, f"reads {decided_by}, which {stage} reads (the latest stage reading a buffer it reads)"
        order = [stage for stage, _, _ in self.keys]
        written = sorted((order.index(self.writer_stage[n]), n) for n in reads if n in self.writer_stage)
        if written:
            index, name = written[-1]
            return (*self.keys[index][::2], f"reads no pipeline buffer; {name}, which {order[index]} wrote: placed with "
                                            f"its writer")
        if self.stages:
            index = order.index(self.stages[-1])
            return (*self.keys[index][::2], f"reads no named buffer: placed by its position, after the previous "
                                            f"launch ({order[index]})")
        raise ValueError(f"{kernel} reads none of the pipeline's buffers (it read {sorted(reads) or 'no named tensor'}) "
                         "and no launch came before it: name its inputs (Attribution.name) or its arguments (names=)")

    def _write_name(self, arg: str, tensor: torch.Tensor, writes: tuple[str, ...], taken: set) -> str:
        if arg in self.names:
            return self.names[arg]
        if arg in writes:
            return arg
        for name in writes:
            if name in taken:
                continue
            dtype = FP8_DTYPE if name in (B.QUANTED_GATE_UP_INPUT, B.QUANTED_DOWN_INPUT) else (
                torch.float32 if name.endswith("_scales") else None)
            if dtype is None and name not in ALIGN_WRITES and tensor.dtype not in (FP8_DTYPE, torch.float32, torch.int32):
                return name
            if dtype is not None and tensor.dtype == dtype:
                return name
        return B.private(arg)

    def _shaped(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` in the vocabulary's shape of `name` when it holds exactly that many elements
        (SGLang's [T, K, H] down GEMM store is down_output's [T*K, H])."""
        try:
            spec = buffer_spec(self.config, name, self.num_tokens)
        except ValueError:
            return tensor
        if tensor.numel() == spec.numel and tensor.shape != spec.shape and tensor.is_contiguous():
            return tensor.view(spec.shape)
        return tensor

    def _report(self, kernel, grid, reads, writes_in, run, triton: bool, why: str | None = None, arguments=None):
        from diffmoe.contract import LaunchInfo

        stage, stage_writes, decided = self._stage(kernel, reads)
        why = why or f"the adapter kit's attribution: {decided}"
        if B.TOPK_WEIGHTS in reads:  # passed to both GEMMs, read by the one the pipeline says
            reads = {n: t for n, t in reads.items() if n != B.TOPK_WEIGHTS or stage in self.weighted}
        # An earlier stage's intermediate that this stage does not read is memory the kernel reuses for
        # what it writes (vLLM-style kernels carve intermediate_cache3 over cache1's bytes): a write.
        reused = [n for n in reads if n in self.intermediates and n not in self.stage_reads.get(stage, ())]
        if reused and arguments:
            writes_in = [*writes_in, *(arguments[n] for n in reused if n in arguments)]
            reads = {n: t for n, t in reads.items() if n not in reused or n not in arguments}
            why += f"; it writes into {', '.join(reused)}'s bytes, which {stage} does not read (memory reused)"
        writes, taken = {}, set()
        for arg, tensor in writes_in:
            name = self._write_name(arg, tensor, stage_writes, taken)
            taken.add(name)
            view = self._shaped(name, tensor)
            if self.name_of(view) is None:
                self.named.append((name, view))
            else:  # memory reused: its bytes now hold what this launch writes, found first from here on
                self.named.insert(0, (name, view))
            writes[name] = view
            self.writer_stage[name] = stage
        self.stages.append(stage)
        if self.recorder is None:
            return run()
        info = LaunchInfo(stage=stage, kernel=kernel, grid=tuple(grid), reads=reads, writes=writes, triton=triton, why=why)
        self.recorder.before_launch(info)
        result = run()
        self.recorder.after_launch(info)
        return result

    def _split(self, tensors):
        """(named buffers read: name -> the named view, unnamed arguments, name -> the argument passing it)."""
        reads, fresh, arguments = {}, [], {}
        for arg, tensor in tensors:
            name, known = self._entry(tensor)
            if name is None:
                fresh.append((arg, tensor))
            else:
                reads[name] = known
                arguments[name] = (arg, tensor)
        return reads, fresh, arguments

    def launch(self, kernel: str, grid, args: Mapping, run, jit=None):
        """A Triton launch (what a ReportingKernel sends): named tensor arguments read, unnamed ones written."""
        reads, fresh, arguments = self._split([(a, t) for a, t in args.items() if isinstance(t, torch.Tensor)])
        return self._report(kernel, launch_grid(jit, grid, dict(args)), reads, fresh, run, triton=jit is not None,
                            arguments=arguments)

    def op(self, op: str, reads: Mapping, writes: Mapping, compute):
        """A stand-in op, its reads and writes given (parameter name -> tensor)."""
        named, fresh, _ = self._split([(a, t) for a, t in reads.items() if isinstance(t, torch.Tensor)])
        fresh_writes = [(a, t) for a, t in writes.items() if isinstance(t, torch.Tensor)]
        rows = next(iter(reads.values())).shape[0] if reads else 1
        return self._report(f"{op} (diffmoe torch stand-in)", (rows,), named, fresh + fresh_writes, compute, triton=False)

    def finish(self, output: torch.Tensor) -> torch.Tensor:
        """The host code after the last launch, attributed (module docstring); the run's output."""
        down_name, down = self._entry(output)
        if down_name == B.DOWN_OUTPUT:  # top-1: the down GEMM stored the output itself
            result = torch.empty_like(output)
            self._report("copy of the down GEMM's store (diffmoe, top-1)", (output.shape[0],), {B.DOWN_OUTPUT: down},
                         [(B.OUTPUT, result)], lambda: result.copy_(output), triton=False,
                         why="the adapter kit's attribution: the run returned the down GEMM's own store (top-1), "
                             "copied by diffmoe as the reduce")
            return result
        if down_name is None:
            _, down = next(((n, t) for n, t in self.named if n == B.DOWN_OUTPUT), (None, None))
            if down is None:
                raise ValueError("the run returned before any launch wrote down_output: nothing to attribute the output to")
            self._report("combine over top-k (host code)", (output.shape[0],), {B.DOWN_OUTPUT: down},
                         [(B.OUTPUT, output)], lambda: None, triton=False,
                         why="the adapter kit's attribution: the host code between the last launch and the returned "
                             "output, reading down_output")
        return output
