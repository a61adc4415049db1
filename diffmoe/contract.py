"""The plug-in contract: what an MoE implementation provides to be tested by diffmoe.

An implementation is built by a factory from a `MoEConfig` whose `num_tokens` is the
largest batch it will be asked to run. It then:

* declares its workspace plan (`workspace_plan(num_tokens)`): the buffer list it coloured,
  where each buffer lives (workspace 0 = ws1 or 1 = ws2, byte offset, bytes) and the stages
  with what each reads and writes; `workspace_shapes(max_tokens)` gives the bytes of ws1, ws2;
* runs (`run`) one problem of any T up to the maximum inside two caller-provided uint8
  workspaces, writing the final output into `output` when the caller passes one (or into a
  workspace view, when its plan carves the output from ws1), under a program `Schedule`,
  reporting every kernel launch to an optional `LaunchRecorder`;
* optionally runs one stage on given inputs (`run_stage`) so the harness can judge a stage on
  the reference's inputs ("teacher forcing");
* optionally names the backend variants it can be compiled with (`compile_variants`, e.g. the
  native kernels and a software-rounding fallback) for `diffmoe compile-check`, which builds
  and runs it on CPU tensors while `compile_target()` says which GPU the launches are for
  (diffmoe.backend.compile_gate records each Triton launch instead of running it).

What the harness holds an implementation to (diffmoe.judge.runner reports each breach as a
finding): T may be anything from 0 to the maximum (`problem.num_tokens`; a zero-token call
returns a [0, H] output); the problem's input tensors (`Problem.inputs()`) belong to the
caller and are never written; the output is [T, H] bfloat16 on the problem's device, and is
the caller's `output` tensor when one is passed; every buffer of
`vocabulary.materialised_buffers(config)` is written by a reported launch (or returned in
`RunResult.intermediates`), and no launch writes a buffer the pipeline does not declare. NaN
and Inf inputs propagate as reference/moe.py specifies.

The harness reaches an implementation only through this contract: a factory named
"MODULE:FACTORY" (`--impl`; `DEFAULT_IMPLEMENTATION` when none is named, which reports and
replay lines call `DEFAULT_IMPLEMENTATION_NAME`, "optimized"). A factory may also
carry optional attributes, cheap to read, that let the harness ask without building the
implementation (building one may probe its backend or import Triton):

* `plan_workspaces(config, num_tokens) -> WorkspacePlan`: the plan the built implementation's
  `workspace_plan(num_tokens)` would declare (`diffmoe plan` uses it; without it, `plan` builds
  the implementation and asks it);
* `conformance_hooks() -> diffmoe.backend.conformance.ConformanceHooks`: for a Triton implementation,
  which workaround it applies per backend primitive, its software paths, its switches on a
  device and its launcher, for `diffmoe doctor` (see diffmoe/backend/conformance.py; without it, the
  doctor judges the backend alone);
* `supports(config) -> str | None`: None when the implementation runs this config, else one
  line naming the field it refuses and why (a peer without an unfused path, say). The harness
  then does not ask it: `run_differential` refuses the config (the CLI's usage error), the
  fuzzers draw around it, and the metamorphic oracle, whose sibling it refuses, is skipped
  with that reason instead of reporting the refusal as a crash. `resolve_factory` reads them all,
  once, into a typed `FactoryHandle` (no other module reads a factory attribute by name);
* `numerics = "vllm"` (a string, not a callable): the rounding profile the reference follows when
  it judges this implementation, for a config whose `numerics` is None: a built-in profile
  (config.NUMERICS_PROFILES), or one with overrides (`"vllm+reduce=fp32"`, the spec `--numerics`
  takes: diffmoe.problem.numerics). `judged_config` resolves it before the problem is built, so
  reports and replay lines carry it; without the attribute the profile is diffmoe's and the
  config keeps None.

A factory may also say `batch_invariant = False` (a bool): its implementation does not claim that a
token's results are independent of the batch it is computed in (a tile or split chosen from the
batch size), so the batch-invariance oracle skips it with that reason instead of reporting
the design as a bug. Without the attribute, or with True, the oracle judges it when selected.

A factory that runs a third party's code from a pinned wheel says which: `peer_wheel = "vllm==0.28.0"`
(a name of diffmoe.adapters.peer_wheels.PEERS, what `diffmoe peers fetch` takes). Before any run the
CLI asks the peer cache for it (`factory_peer_wheel`), so a missing wheel is one line naming the
`diffmoe peers fetch` to run (exit 2), not a crash finding of a kernel that never ran.

An implementation (the built object, not its factory) may set `orders_programs = True` when its
`run` applies the schedule itself, as the shipped kernels do with an order table they read. Without
it the harness runs `run` inside diffmoe.interpreter.grid_order's control, which reorders every launch made
under the Triton interpreter at its grid loop, so any Triton kernel is judged by the schedule
oracle without an order table (`applies_own_order` reads it; the two together would reorder twice).

Nothing here imports Triton: implementations may be written in anything that takes torch tensors.

Owns the types an implementation builds and the names of the default implementation. Must not import an implementation.
Longer than 400 lines because the contract is one page an implementer reads: every optional factory
attribute is stated in this docstring beside the types, and the vocabulary it speaks is re-exported here.
"""

from __future__ import annotations

import os
import random
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, runtime_checkable

import torch

from diffmoe.problem.config import MoEConfig, quoted
from diffmoe.problem.numerics import parse_spec
# The pipeline's vocabulary, which an implementation speaks (its plan names buffers and stages,
# its shapes come from buffer_spec): exported here so an implementation imports one public module.
from diffmoe.problem.vocabulary import (  # noqa: F401 - this module's API
    FP8_DTYPE,
    FP8_MAX,
    SCALES_OF,
    Buffers,
    StageSpec,
    Stages,
    TensorSpec,
    activation_scale_shape,
    buffer_spec,
    materialised_buffers,
    pipeline_stages,
    weight_scale_shape,
)

__all__ = [
    # what an implementation builds and reports
    "CompileTarget", "LaunchInfo", "LaunchRecorder", "MoEImplementation", "Placement", "RunResult", "Schedule",
    "WorkspacePlan", "compile_target", "compiling_for", "default_device", "interpreter_enabled",
    # the factory's optional attributes, by name
    "BATCH_INVARIANT", "CONFORMANCE_HOOKS", "NUMERICS", "ORDERS_PROGRAMS", "PEER_WHEEL", "PLAN_WORKSPACES", "SUPPORTS",
    "ConfigRefused", "DEFAULT_IMPLEMENTATION", "DEFAULT_IMPLEMENTATION_NAME", "FactoryHandle", "resolve_factory",
    # the vocabulary
    "FP8_DTYPE", "FP8_MAX", "SCALES_OF", "Buffers", "StageSpec", "Stages", "TensorSpec", "activation_scale_shape",
    "buffer_spec", "materialised_buffers", "pipeline_stages", "weight_scale_shape",
]

SCHEDULE_KINDS = ("identity", "reversed", "random")


@dataclass(frozen=True)
class Schedule:
    """The order in which a launch's program instances run.

    identity: ascending, as the Triton interpreter and a quiet GPU do.
    reversed: descending, the opposite extreme.
    random:   a permutation drawn from `seed`, like a busy GPU's out-of-order scheduling.
    """

    kind: str = "identity"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULE_KINDS:
            raise ValueError(f"schedule must be one of {list(SCHEDULE_KINDS)} (random as random:SEED), got {self.kind!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"schedule seed must be an int >= 0, got {self.seed!r}")

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """'identity', 'reversed' or 'random:SEED'."""
        if not isinstance(text, str):
            raise TypeError(f"schedule must be a string, got {text!r}")
        kind, _, seed = text.partition(":")
        if kind == "random":
            if not seed.isdigit():
                raise ValueError(f"schedule random needs a seed, as random:SEED with SEED >= 0, got {text!r}")
            return cls("random", int(seed))
        if seed:
            raise ValueError(f"schedule {kind!r} takes no seed, got {text!r}")
        return cls(kind)

    def __str__(self) -> str:
        return f"random:{self.seed}" if self.kind == "random" else self.kind

    @property
    def is_identity(self) -> bool:
        return self.kind == "identity"

    def order(self, num_programs: int, launch_index: int = 0) -> list[int]:
        """Program ids in run order for one launch. Random orders differ per launch index."""
        ids = list(range(num_programs))
        if self.kind == "reversed":
            ids.reverse()
        elif self.kind == "random":
            random.Random(self.seed * 1_000_003 + launch_index).shuffle(ids)
        return ids


@dataclass
class LaunchInfo:
    """One kernel launch as an implementation reports it."""

    stage: str  # vocabulary stage name
    kernel: str  # kernel function name
    grid: tuple[int, ...]
    reads: Mapping[str, torch.Tensor]  # vocabulary name -> the view the launch reads
    writes: Mapping[str, torch.Tensor]  # vocabulary name -> the view the launch writes
    # True: the launch runs a Triton kernel (a @triton.jit function) on `grid`; False (the default):
    # a torch op or other host code reported as a stage (a stand-in, a torch implementation). Under the
    # interpreter a launch that says True and runs no Triton program is a contract finding (issue 33).
    triton: bool = False
    # Why the launch has its stage when something other than the implementation's own code decided it
    # (the adapter kit's attribution: "reads w2, which down_gemm reads"); shown by `check --launches`.
    why: str = ""


class LaunchRecorder(Protocol):
    """Sees every launch; `after_launch` runs once the launch has finished."""

    def before_launch(self, launch: LaunchInfo) -> None: ...

    def after_launch(self, launch: LaunchInfo) -> None: ...


@dataclass(frozen=True)
class Placement:
    """Where a buffer lives: workspace 0 (ws1) or 1 (ws2), byte offset and length."""

    buffer: str
    workspace: int
    offset: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


@dataclass(frozen=True)
class WorkspacePlan:
    """An implementation's declared memory plan for one token count."""

    planner: str  # a label, e.g. "fixed" or "legacy"
    buffer_list: tuple[str, ...]  # the list the planner coloured, pipeline order
    placements: tuple[Placement, ...]  # buffers carved from ws1/ws2
    stages: tuple[StageSpec, ...]  # what runs, in order, with reads and writes
    workspace_bytes: tuple[int, int]  # bytes of ws1, ws2 this token count needs

    def placement(self, buffer: str) -> Placement | None:
        for p in self.placements:
            if p.buffer == buffer:
                return p
        return None


@dataclass
class RunResult:
    """What a run returns: the final output and any intermediates it chose to report.

    Intermediates that live in shared workspaces are overwritten by later stages; the harness
    therefore snapshots each launch's writes through the recorder, and an implementation only
    needs to put here what it computes outside its launches (the reference puts everything).
    """

    output: torch.Tensor  # [T, H] bf16
    intermediates: dict[str, torch.Tensor] = field(default_factory=dict)


@runtime_checkable
class MoEImplementation(Protocol):
    """The contract. See the module docstring and docs/plugging-in.md."""

    config: MoEConfig

    def workspace_plan(self, num_tokens: int) -> WorkspacePlan: ...

    def workspace_shapes(self, max_tokens: int) -> tuple[int, int]: ...

    def run(
        self,
        problem,
        workspaces: tuple[torch.Tensor, torch.Tensor],
        *,
        output: torch.Tensor | None = None,
        schedule: Schedule = Schedule(),
        recorder: LaunchRecorder | None = None,
    ) -> RunResult: ...


ImplementationFactory = Callable[[MoEConfig], MoEImplementation]

# The implementation tested when none is named (`--impl`): the one place it is named.
DEFAULT_IMPLEMENTATION = "optimized:make_implementation"
# What reports, replay lines and JSON call it ("optimized", its module); an implementation named
# with --impl is called by its spec as given, and its replay lines carry `--impl SPEC`.
DEFAULT_IMPLEMENTATION_NAME = DEFAULT_IMPLEMENTATION.partition(":")[0]
# The peer projects (peers/, third-party kernels run from their own wheels), each a package with one
# release table (PACKAGE.releases: RELEASES by version, DEFAULT, FACTORIES, optionally WHEEL_FUNCTION), read by
# name as the default implementation is: adding a release is a row there, adding a project a row here.
PEER_PROJECTS = {"vllm": "peers.vllm", "lmdeploy": "peers.lmdeploy", "liger": "peers.liger", "sglang": "peers.sglang"}


def peer_release_tables() -> dict:
    """Each peer project's release table module (PEER_PROJECTS), by project."""
    import importlib

    return {project: importlib.import_module(f"{package}.releases") for project, package in PEER_PROJECTS.items()}


def release_attribute(factory: str, version: str) -> str:
    """The name a peer package exports a release's factory under: `make_0_33_0` for make, 0.33.0."""
    return f"{factory}_{version.replace('.', '_')}"


def peer_factory_spec(peer: str, factory: str = "make") -> str:
    """The MODULE:FACTORY of `factory` (one of the project's FACTORIES) for the peer name `peer`
    (`vllm`, the default release, or `vllm==0.28.0`); a ValueError naming the releases for another."""
    project, _, version = peer.partition("==")
    if project not in PEER_PROJECTS:
        raise ValueError(f"peer must be one of {list(PEER_PROJECTS)} (optionally ==VERSION), got {peer!r}")
    table = peer_release_tables()[project]
    version = version or table.DEFAULT
    if version not in table.RELEASES:
        raise ValueError(f"{project} must be one of the releases diffmoe runs ({', '.join(table.RELEASES)}), "
                         f"got {version!r}")
    if factory not in table.FACTORIES:
        raise ValueError(f"a {project} release exports {', '.join(table.FACTORIES)}, not {factory!r}")
    return f"{PEER_PROJECTS[project]}:{release_attribute(factory, version)}"


class _PeerNames(Mapping):
    """A name -> MODULE:FACTORY mapping built from the release tables when first read (they live with
    the adapters, which this module must not import before someone asks)."""

    def __init__(self, build: Callable[[], dict]) -> None:
        self._build, self._built = build, None

    def _names(self) -> dict:
        if self._built is None:
            self._built = self._build()
        return self._built

    def __getitem__(self, key):
        return self._names()[key]

    def __iter__(self):
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


def _aliases() -> dict:
    names = {}
    for project, table in peer_release_tables().items():
        names[project] = peer_factory_spec(project)
        names.update({f"{project}=={v}": peer_factory_spec(f"{project}=={v}") for v in table.RELEASES})
    return names


def _wheel_functions() -> dict:
    return {f"{project}=={v}": f"{PEER_PROJECTS[project]}:{release_attribute(table.WHEEL_FUNCTION, v)}"
            for project, table in peer_release_tables().items() if hasattr(table, "WHEEL_FUNCTION")
            for v in table.RELEASES}


# Short names for the peers: `--impl vllm` (the project's default release), `--impl vllm==0.28.0` (each
# release, spelled as `diffmoe peers fetch` spells it), each the MODULE:FACTORY of its `make`.
IMPLEMENTATION_ALIASES: Mapping[str, str] = _PeerNames(_aliases)
# The peer wheels whose functions `--fn NAME==V[:MODULE]:FUNCTION --family F` loads with no user code (loading.py):
# each the MODULE:FACTORY of `wheel_function(path)`, the function at `path` with its factory's attributes
WHEEL_FUNCTIONS: Mapping[str, str] = _PeerNames(_wheel_functions)

# The optional factory attributes (module docstring).
PLAN_WORKSPACES = "plan_workspaces"
CONFORMANCE_HOOKS = "conformance_hooks"
SUPPORTS = "supports"
NUMERICS = "numerics"
FACTORY_ATTRIBUTES = (PLAN_WORKSPACES, CONFORMANCE_HOOKS, SUPPORTS, NUMERICS)
# The factory's optional claim (module docstring): False when its results depend on the batch.
BATCH_INVARIANT = "batch_invariant"
# The factory's optional claim (module docstring): the peer wheel it runs from.
PEER_WHEEL = "peer_wheel"
# The implementation's optional attribute (module docstring): its run applies the schedule itself.
ORDERS_PROGRAMS = "orders_programs"


def applies_own_order(impl: object) -> bool:
    """Whether `impl` applies the program schedule itself (`orders_programs` is True), so the
    harness must not reorder its launches at the interpreter's grid loop too."""
    return getattr(impl, ORDERS_PROGRAMS, False) is True


# The factory's optional tuned-config attributes (diffmoe/tuned_configs/): the folder of its peer wheel's cache
# holding the tile-config JSON files the release ships, and `with_tile_config(tile)`, the factory with that tile
# config forced through the release's own override mechanism.
TUNED_CONFIG_DIR = "tuned_config_dir"
WITH_TILE_CONFIG = "with_tile_config"
# The implementation's optional attribute (module docstring): the backend variants it compiles with.
COMPILE_VARIANTS = "compile_variants"


class FactoryHandle:
    """A factory resolved once (`resolve_factory`): every optional attribute this contract names
    read here, and nowhere else, into a typed field. The raw values are read at construction (an
    attribute set on the factory afterwards is not seen: resolve again); each typed field checks
    its value when first asked, so a wrong one is the same error at the same point it always was.

    `make` is the factory itself (calling the handle calls it); `label` its `name` attribute (what a
    report calls a factory its module does not export), `module` and `qualname` its own."""

    __slots__ = ("make", "_raw", "module", "qualname", "label")

    def __init__(self, factory: Callable) -> None:
        self.make = factory
        names = (*FACTORY_ATTRIBUTES, BATCH_INVARIANT, PEER_WHEEL, TUNED_CONFIG_DIR, WITH_TILE_CONFIG)
        self._raw = {name: getattr(factory, name, None) for name in names}
        self.module = getattr(factory, "__module__", None)
        self.qualname = getattr(factory, "__qualname__", None)
        self.label = getattr(factory, "name", None)

    def __call__(self, config: MoEConfig, *args, **kwargs):
        return self.make(config, *args, **kwargs)

    def __repr__(self) -> str:
        return f"FactoryHandle({self.make!r})"

    def attribute(self, name: str) -> Callable | None:
        """One of the callable FACTORY_ATTRIBUTES, or None when the factory has none (or a
        non-callable value under that name)."""
        attr = self._raw[name]
        return attr if callable(attr) else None

    @property
    def supports(self) -> Callable | None:
        return self.attribute(SUPPORTS)

    @property
    def plan_workspaces(self) -> Callable | None:
        return self.attribute(PLAN_WORKSPACES)

    @property
    def conformance_hooks(self) -> Callable | None:
        return self.attribute(CONFORMANCE_HOOKS)

    @property
    def numerics(self) -> str | None:
        """The declared profile's canonical spec, or None; a ValueError naming the attribute and
        the profiles (or the point and its menu) for anything else."""
        declared = self._raw[NUMERICS]
        return None if declared is None else parse_spec(declared, f"the factory's {NUMERICS} attribute").spec

    @property
    def batch_invariant(self) -> bool | None:
        declared = self._raw[BATCH_INVARIANT]
        if declared is not None and not isinstance(declared, bool):
            raise TypeError(f"the factory's {BATCH_INVARIANT} attribute must be a bool, got {quoted(declared)}")
        return declared

    @property
    def peer_wheel(self) -> str | None:
        name = self._raw[PEER_WHEEL]
        if name is not None and not isinstance(name, str):
            raise TypeError(f"a factory's {PEER_WHEEL} must be a peer's name (a str, as `diffmoe peers fetch` takes it), "
                            f"got {type(name).__name__}")
        return name

    @property
    def tuned_configs(self) -> tuple[str, Callable[[dict | None], Callable]] | None:
        """(TUNED_CONFIG_DIR, WITH_TILE_CONFIG) when the factory declares both, else None; a
        TypeError naming the attribute for a folder that is not a str or a forcing function that
        is not callable."""
        folder, force = self._raw[TUNED_CONFIG_DIR], self._raw[WITH_TILE_CONFIG]
        if folder is None and force is None:
            return None
        if not isinstance(folder, str):
            raise TypeError(f"a factory's {TUNED_CONFIG_DIR} must be a folder inside its peer wheel (a str), "
                            f"got {quoted(folder)}")
        if not callable(force):
            raise TypeError(f"a factory's {WITH_TILE_CONFIG} must be callable (tile config -> factory), got {quoted(force)}")
        return folder, force

    def declared(self) -> dict:
        """What the factory declares, as data and unchecked (the isolation's candidate process
        sends it to the judge, which checks it there)."""
        return {
            NUMERICS: self._raw[NUMERICS],
            BATCH_INVARIANT: self._raw[BATCH_INVARIANT],
            PEER_WHEEL: self._raw[PEER_WHEEL],
            SUPPORTS: self.supports is not None,
            PLAN_WORKSPACES: self.plan_workspaces is not None,
        }


def resolve_factory(factory: Callable | FactoryHandle) -> FactoryHandle:
    """`factory` as a FactoryHandle (a handle is its own)."""
    return factory if isinstance(factory, FactoryHandle) else FactoryHandle(factory)


def compile_variants(impl: object) -> tuple[str, ...]:
    """The backend variants a built implementation names (COMPILE_VARIANTS), or ("default",)."""
    return tuple(getattr(impl, COMPILE_VARIANTS, ()) or ("default",))


def factory_attribute(factory: Callable, name: str) -> Callable | str | None:
    """One of the factory's optional cheap attributes (FACTORY_ATTRIBUTES), or None when it has
    none (callers then build the implementation, or do without). NUMERICS is a string: see
    `factory_numerics`."""
    if name not in FACTORY_ATTRIBUTES:
        raise ValueError(f"no optional factory attribute {name!r}; known: {list(FACTORY_ATTRIBUTES)}")
    handle = resolve_factory(factory)
    return handle.numerics if name == NUMERICS else handle.attribute(name)



def factory_peer_wheel(factory: Callable | None) -> str | None:
    """The peer wheel the factory runs from (its PEER_WHEEL attribute), or None; a TypeError for a
    value that is not a string."""
    return None if factory is None else resolve_factory(factory).peer_wheel


def declared_attributes(factory: Callable) -> dict:
    """What the factory declares, as data and unchecked (FactoryHandle.declared)."""
    return resolve_factory(factory).declared()


def factory_numerics(factory: Callable | None) -> str | None:
    """The numerics profile the factory declares (its NUMERICS attribute), as its canonical spec;
    None when it declares none; a ValueError naming the attribute and the profiles (or the point
    and its menu) for anything else."""
    return None if factory is None else resolve_factory(factory).numerics


def factory_batch_invariant(factory: Callable | None) -> bool | None:
    """The factory's BATCH_INVARIANT claim: True, False, or None when it makes none; a TypeError
    naming the attribute for anything but a bool."""
    return None if factory is None else resolve_factory(factory).batch_invariant


def judged_config(config: MoEConfig, factory: Callable | None) -> MoEConfig:
    """`config` as the harness judges it against `factory`'s implementation: a config naming its
    numerics keeps it; numerics=None takes the profile the factory declares. Without a declared
    profile it stays None (the reference's diffmoe profile), so the configs, reports and replay
    lines of such implementations are what they always were."""
    if config.numerics is not None:
        return config
    declared = factory_numerics(factory)
    return config if declared is None else config.replace(numerics=declared)


class ConfigRefused(ValueError):
    """The implementation's own `supports` refuses the config: nothing to judge. A usage error
    for the CLI (exit 2, one line), not a harness failure."""


def unsupported(factory: Callable | None, config: MoEConfig) -> str | None:
    """Why the factory's implementation refuses `config` (its `supports` attribute), or None."""
    supports = None if factory is None else resolve_factory(factory).supports
    if supports is None:
        return None
    reason = supports(config)
    if reason is not None and not isinstance(reason, str):
        raise TypeError(f"{SUPPORTS}(config) must return None or a str, got {type(reason).__name__}")
    return reason


def factory_plan(factory: ImplementationFactory, config: MoEConfig, num_tokens: int | None = None) -> WorkspacePlan:
    """The plan the factory's implementation declares for `num_tokens` (default: the config's):
    from its `plan_workspaces` attribute when it has one, else by building it."""
    num_tokens = config.num_tokens if num_tokens is None else num_tokens
    plan = resolve_factory(factory).plan_workspaces
    if plan is not None:
        return plan(config, num_tokens)
    return factory(config).workspace_plan(num_tokens)


@dataclass(frozen=True)
class CompileTarget:
    """The GPU an implementation's launches are being captured for (`diffmoe compile-check`).

    While one is set, the implementation is built and run on CPU tensors and its Triton launches
    are recorded and compiled ahead of time, never executed: it should choose the tiles and
    kernel switches it would choose on that GPU, without probing a device it does not have.
    """

    backend: str  # "cuda"
    arch: int  # compute capability as major*10 + minor: 90 for sm_90 (H100/H200)
    variant: str = "default"  # one of the implementation's `compile_variants`

    @property
    def arch_name(self) -> str:
        return f"sm_{self.arch}"


_COMPILE_TARGET: ContextVar[CompileTarget | None] = ContextVar("diffmoe_compile_target", default=None)


def compile_target() -> CompileTarget | None:
    """The target launches are captured for, or None in a normal run."""
    return _COMPILE_TARGET.get()


@contextmanager
def compiling_for(target: CompileTarget):
    """Set `compile_target()` for the duration of a capture."""
    token = _COMPILE_TARGET.set(target)
    try:
        yield target
    finally:
        _COMPILE_TARGET.reset(token)


def interpreter_enabled() -> bool:
    """Whether Triton runs kernels under its interpreter (TRITON_INTERPRET, read as Triton reads it)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def default_device() -> torch.device:
    """The device an implementation and its problem take when none is named, one rule for the
    harness and every implementation: the CPU while a compile target is set (the compile gate
    builds and runs on CPU tensors and only records the launches) or under the interpreter
    (which runs on CPU tensors), else the current CUDA device where there is one, else the CPU.
    With two rules, an H200 once got a problem on cuda:0 beside an implementation built on the
    CPU (bench/gpu_checks.sh, 2026-12-04)."""
    if compile_target() is not None or interpreter_enabled() or not torch.cuda.is_available():
        return torch.device("cpu")
    # with an index: tensors report cuda:N, and torch.device("cuda") != torch.device("cuda:0")
    return torch.device("cuda", torch.cuda.current_device())
