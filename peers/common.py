"""What every peer adapter shares (peers/PROJECT/core.py): `PeerFiles` (a peer's files loaded once
per cache root and device, with the adapter kit's loader, its module names resolved to those
files while it runs), the interpreter set-up (`interpreter_on_a_cpu`, `install_interpreter_fixes`), the
check of a problem against the built implementation (what each adapter runs is declared: its
`Supports`, diffmoe.adapters.kit.supports), the recorder's
view of a launch whose rows a peer keeps expert-sorted (`report_launch`), the shape of an adapter
whose peer allocates every buffer itself (`SelfAllocatingPeer`, `fresh_allocations_plan`) and the
permutation of a peer's expert-sorted rows into route order (`route_order`).

Owns that shared machinery. Must not hold third-party source or judge a peer's results.
"""

import os
import threading

import torch

from diffmoe.adapters.kit.attribution import ReportingKernel, launch_grid  # noqa: F401 - the adapters' proxy, kept here


def interpreter_on_a_cpu() -> None:
    """Without CUDA, the Triton interpreter (TRITON_INTERPRET=1, unless it is set) before a peer's
    files are loaded: `@triton.jit` picks interpreted or compiled kernels when it decorates them (its
    knob is read then), so this runs right before the first load, never at import (importing a peer
    package changes no environment). The CLI sets it the same way before it imports an --impl module."""
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


# Fields a problem may differ in from the config an adapter was built for (as optimized/moe.py).
PER_CALL_FIELDS = ("num_tokens", "seed", "skew")


def interpreting() -> bool:
    """Whether Triton runs kernels under its interpreter (its own knob, read at call time)."""
    from triton import knobs

    return bool(knobs.runtime.interpret)


def install_interpreter_fixes() -> None:
    """As optimized/launch.py: under the interpreter, diffmoe's exact casts and dots, the
    probe-gated fixes third-party kernels need, and the interpreter fast path."""
    if not interpreting():
        return
    from diffmoe.backend.conformance import gated_probe
    from diffmoe.interpreter import fixes as interpreter_fixes
    from diffmoe.interpreter import fast_path as interpreter_speed

    interpreter_speed.install()
    interpreter_fixes.install(probe=gated_probe)


def check_problem(impl, problem) -> None:
    """ValueError unless `problem` fits `impl` (its config but PER_CALL_FIELDS, at most its
    max_tokens, on its device)."""
    base = {f: v for f, v in problem.config.to_dict().items() if f not in PER_CALL_FIELDS}
    mine = {f: v for f, v in impl.config.to_dict().items() if f not in PER_CALL_FIELDS}
    if base != mine:
        raise ValueError(f"problem config differs from the implementation's in {sorted(f for f in base if base[f] != mine[f])}")
    if problem.num_tokens > impl.max_tokens:
        raise ValueError(f"num_tokens must be in [0, {impl.max_tokens}], got {problem.num_tokens}")
    if problem.device != impl.device:
        raise ValueError(f"problem is on {problem.device}, the implementation runs on {impl.device}")


class PeerFiles:
    """A peer's files, loaded once per (class, cache root, device key). A subclass names its
    `peer` (diffmoe.adapters.peer_wheels.PEERS), loads its modules into `self.modules` in
    `__init__(root, device)`, and may key devices coarser than `str(device)` (`device_key`)."""

    peer: str
    modules: dict
    _loaded: dict = {}
    _lock = threading.Lock()

    @staticmethod
    def device_key(device) -> str:
        return str(device)

    @classmethod
    def get(cls, device):
        from diffmoe.adapters import peer_wheels

        root = peer_wheels.peer_root(cls.peer)  # one line naming `diffmoe peers fetch <peer>` when missing
        key = (cls, str(root), cls.device_key(device))
        with cls._lock:
            if key not in cls._loaded:
                interpreter_on_a_cpu()
                install_interpreter_fixes()
                cls._loaded[key] = cls(root, device)
            return cls._loaded[key]

    def load(self, root, files, before=None, loaded=None) -> None:
        """Into `self.modules`, with the adapter kit (diffmoe.adapters.kit.load_modules): the modules of
        `before` (name -> module: stand-ins) and each (name, path under `root`) of `files` executed in
        order, each seeing the ones before it, every package above them an empty module (no `__init__`
        of the peer runs); `loaded(name, module)`, if given, right after each."""
        from diffmoe.adapters import kit

        self.modules = kit.load_modules(kit.PackageSource.folder(root), files, before=before, loaded_hook=loaded)

    def installed(self):
        """The peer's module names resolve to these modules (its files import some at call time)."""
        return self.modules.installed()


def route_order(sorted_rows: torch.Tensor, sorted_idx: torch.Tensor) -> torch.Tensor:
    """A peer's expert-sorted rows (row r holds route sorted_idx[r]) gathered into route order
    (row t * K + k holds route t * K + k), the order of diffmoe's vocabulary."""
    out = torch.empty_like(sorted_rows)
    out[sorted_idx.long()] = sorted_rows
    return out


def fresh_allocations_plan(config, planner: str):
    """The declared plan of a peer that carves nothing: every buffer a fresh allocation, no
    placement, 0 bytes of ws1 and ws2 (the static oracle then has nothing to judge, and says so)."""
    from diffmoe.contract import WorkspacePlan
    from diffmoe.problem.vocabulary import pipeline_stages

    return WorkspacePlan(planner=f"{planner} (fresh allocations only)", buffer_list=(), placements=(),
                         stages=tuple(pipeline_stages(config)), workspace_bytes=(0, 0))


class SelfAllocatingPeer:
    """An adapter of a peer that allocates every buffer itself (lmdeploy, Liger), behind the
    plug-in contract: built for a config it supports, on the default device; no workspaces; one
    run is the peer's own Python call (`call(problem)`, returning its output tensor) inside the
    peer's modules and the schedule's program order (diffmoe.interpreter.grid_order), with the run's
    launch reporter (`reporter_class(impl, problem, recorder)`) active for the kernel proxies
    (`active`, peers.common.ReportingKernel); `check_launches(reporter)` says whether the call made the
    launches the adapter maps. The output is the peer's tensor, copied into the caller's."""

    name: str
    files_class: type  # a PeerFiles subclass
    reporter_class: type
    active: threading.local
    orders_programs = True  # run() applies the schedule through diffmoe.interpreter.grid_order itself

    @staticmethod
    def check_supported(config) -> None:
        raise NotImplementedError

    def __init__(self, config, device=None):
        from diffmoe.contract import default_device

        config.validate()
        self.check_supported(config)
        self.config = config
        self.device = torch.device(device) if device is not None else default_device()
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.max_tokens = config.num_tokens
        self.files = self.files_class.get(self.device)

    def workspace_plan(self, num_tokens: int):
        return fresh_allocations_plan(self.config, self.name)

    def workspace_shapes(self, max_tokens: int | None = None) -> tuple[int, int]:
        return (0, 0)

    def call(self, problem) -> torch.Tensor:
        raise NotImplementedError

    def check_launches(self, reporter) -> None:
        """RuntimeError unless the call made the launches the adapter maps to stages."""

    def run(self, problem, workspaces, *, output=None, schedule=None, recorder=None):
        from diffmoe.interpreter import grid_order
        from diffmoe.contract import RunResult, Schedule

        check_problem(self, problem)
        if not isinstance(workspaces, (tuple, list)) or len(workspaces) != 2:
            raise TypeError("workspaces must be a pair (ws1, ws2) of uint8 tensors")
        t, hidden = problem.num_tokens, self.config.hidden
        out = output if output is not None else torch.empty(t, hidden, dtype=torch.bfloat16, device=self.device)
        if out.shape != (t, hidden) or out.dtype != torch.bfloat16 or out.device != self.device:
            raise ValueError(f"output must be a [{t}, {hidden}] bf16 tensor on {self.device}")
        if t == 0:
            return RunResult(output=out)  # nothing routed: no launch
        reporter = self.reporter_class(self, problem, recorder)
        self.active.reporter = reporter
        try:
            with self.files.installed(), grid_order.program_order(schedule or Schedule()), torch.no_grad():
                install_interpreter_fixes()
                result = self.call(problem)
        finally:
            self.active.reporter = None
        self.check_launches(reporter)
        out.copy_(result)
        return RunResult(output=out)


def report_launch(recorder, info, run, sorted_rows: dict, sorted_idx):
    """`run()` the launch `info` describes, between the recorder's before and after; the buffers
    of `sorted_rows` (name -> tensor a peer keeps in expert-sorted order, row r = route
    sorted_idx[r]) are in route order while the recorder looks after the launch (its snapshot
    is of route order) and put back, bit for bit, before the peer goes on."""
    if recorder is None:
        return run()
    recorder.before_launch(info)
    result = run()
    saved = {n: t.clone() for n, t in sorted_rows.items()}
    for n, t in sorted_rows.items():
        t.copy_(route_order(saved[n], sorted_idx))
    recorder.after_launch(info)
    for n, t in sorted_rows.items():
        t.copy_(saved[n])
    return result
