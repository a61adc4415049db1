"""A museum of real bugs: released vLLM, SGLang and Liger-Kernel wheels whose MoE bugs diffmoe catches on a CPU.

Each exhibit is one row of EXHIBITS: a bug fixed in a later release, the releases that
ship it, the first release with the fix and the one run for it, the oracle and stage that must
name it, the minimal config, and the routing it needs. `run_exhibit` checks the config against
every buggy release (each must FAIL with a finding of that oracle at that stage) and the fixed
release (it must PASS the same config, the same inputs, every oracle but metamorphic: the peers have
no fused/unfused sibling). Nothing of diffmoe's sits between the wheels and the verdict: one
adapter core per project (peers/vllm/core.py, peers/sglang/core.py, peers/liger/core.py) runs every
release of it; only the release's own files differ.

    diffmoe museum [NAME ...] [--list] [--workers N [--cluster local|auto|ray://HOST:PORT]] [--json] [--fetch]

exits 0 only when every selected exhibit behaved as recorded, 1 when one did not, 2 for usage
errors (an unknown exhibit; releases not in the peer cache: one line each naming its fetch
command, before any run). It fetches nothing unless told: `--fetch` fetches the missing releases
first (network; one line each on stderr), and a failed fetch exits 2. While the
releases run, their progress goes to stderr (diffmoe/cluster/progress.py: a bar on a terminal,
a line per release run otherwise); stdout holds only the verdicts. Each release run is a task
(`run_release`, diffmoe/cluster/tasks.py): `--workers N > 1` runs N at a time as Ray tasks on
`--cluster` (a local Ray runtime by default), the verdicts printed in the table's order.

Routing an exhibit needs beyond what MoEConfig draws: `unrouted_slots`, the routed slots
(row t*K + k) whose topk_ids entry is -1 (what vLLM's EP dispatch hands TritonExperts for slots
no rank computes). They are set on the generated problem; the report's replay line then says
the inputs were given, and an exhibit's own replay line is `diffmoe museum NAME`. An exhibit
whose `requires` names a MoEConfig field this diffmoe lacks is pending, listed but not run.

Owns the exhibit table and its verdicts. Must not hold vLLM code or adjust a release's
numerics: the wheels are run as they are (peers/).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from diffmoe.problem.config import MoEConfig
from diffmoe.problem.vocabulary import Stages

EXIT_AS_RECORDED, EXIT_NOT_AS_RECORDED, EXIT_USAGE = 0, 1, 2
DESCRIPTION = ("Run the exhibits: real vLLM, SGLang and Liger-Kernel bugs, each buggy release against the fixed one on "
               "the same config.")


@dataclass(frozen=True)
class Exhibit:
    name: str  # `diffmoe museum NAME`
    title: str
    pr: str  # the pull request that fixed it (owner/repo#N)
    buggy: tuple[str, ...]  # releases run that ship the bug (`--impl` spellings)
    fixed_in: str  # the first release with the fix (read in its wheel)
    fixed: str  # the release run for the fix (`--impl` spelling)
    oracle: str  # the oracle that must name it on every buggy release
    stage: str  # ... at this stage
    fields: dict  # the minimal config's MoEConfig fields (built when the exhibit runs: see `requires`)
    unrouted_slots: tuple[int, ...] = ()  # routed slots (t*K + k) whose topk_ids entry is -1
    requires: str | None = None  # a MoEConfig field the exhibit needs; pending without it
    # fused is each release's own choice for the config (the one its `supports` takes: peers/vllm/core.py
    # fuses_block_quant): a
    # release that fuses the FP8-block quant, and one whose apply falls back to the unfused path,
    # meet the same inputs and the same reference, each through the pipeline it runs
    fused_by_release: bool = False
    why: str = ""
    # the factory of each release's peer package it is run through (`make`: the one `--impl RELEASE` names;
    # `make_scaled`: SGLang's CUDA branch given a routed scaling factor, peers/sglang/core.py;
    # `make_wide`: Liger's call with the experts stored past int32 weight offsets, peers/liger/core.py)
    factory: str = "make"

    def impl_spec(self, release: str) -> str:
        """The `MODULE:FACTORY` spec run for `release` (a peer name: contract.peer_factory_spec)."""
        from diffmoe.contract import peer_factory_spec

        return peer_factory_spec(release, self.factory)

    @property
    def config(self) -> MoEConfig:
        return MoEConfig(**self.fields)

    @property
    def pending(self) -> str | None:
        """Why the exhibit cannot run with this diffmoe, or None."""
        if self.requires is not None and self.requires not in {f.name for f in dataclasses.fields(MoEConfig)}:
            return f"needs MoEConfig.{self.requires}, which this diffmoe does not have yet"
        return None

    def replay(self) -> str:
        return f"diffmoe museum {self.name}"

    def minimal_config(self) -> str:
        f = self.fields
        parts = [f"T={f['num_tokens']} E={f['num_experts']} K={f['topk']} H={f['hidden']} I={f['inter']} {f['quant']}"]
        parts += [f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in f.items()
                  if k not in ("num_tokens", "num_experts", "topk", "hidden", "inter", "quant")
                  and not (k == "fused" and self.fused_by_release)]
        if self.fused_by_release:
            parts.append("fused as each release chooses")
        if self.unrouted_slots:
            parts.append(f"topk_ids -1 at slots {list(self.unrouted_slots)}")
        if self.factory != "make":
            parts.append(f"run as {self.factory}")
        return ", ".join(parts)


_EP = dict(num_tokens=2, num_experts=4, topk=2, hidden=128, inter=128, quant="bf16", expert_map=(0, 1, -1, -1))
# both bugs: present in 0.28.0-0.30.0 (read in each wheel), fixed in 0.31.0, 0.33.0 run for the fix
_RELEASES = dict(buggy=("vllm==0.28.0", "vllm==0.30.0"), fixed_in="0.31.0", fixed="vllm==0.33.0")
_STALE_ROWS = dict(pr="vllm-project/vllm#54083", stage=Stages.REDUCE, fields=_EP, **_RELEASES)
# present in 0.28.0-0.32.0 (read in the 0.28.0, 0.30.0, 0.31.0 and 0.32.0 wheels), fixed in 0.33.0
_RELEASES_TO_0_33 = dict(buggy=("vllm==0.28.0", "vllm==0.30.0"), fixed_in="0.33.0", fixed="vllm==0.33.0")
EXHIBITS: tuple[Exhibit, ...] = (
    Exhibit(
        name="stale-ep-rows",
        title="stale workspace rows summed under expert parallelism",
        oracle="poison", unrouted_slots=(0, 1), **_STALE_ROWS,
        why="token 0's slots are -1: the alignment skips them, so no GEMM writes their rows of intermediate_cache3 "
            "(workspace2, over cache1's unwritten row 0), and the two-argument moe_sum adds those bytes into token 0's "
            "output; 0.31.0's pad-aware moe_sum skips them. A zero-filled workspace gives 0, the right answer",
    ),
    Exhibit(
        name="stale-ep-rows-own-call",
        title="the same bug, the stale row written earlier in the same call",
        oracle="differential", unrouted_slots=(1,), **_STALE_ROWS,
        why="one -1 slot: its cache3 row lies over the up half of cache1's row 0, which the gate/up GEMM wrote in this "
            "call, so the stale bytes are the same under every poison (the poison oracle cannot see it) and a "
            "zero-filled workspace does not hide it; the differential sees token 0's output off at reduce",
    ),
    Exhibit(
        name="swiglu-clamp-dropped",
        title="SwiGLU clamp dropped on the FP8-block fast path",
        pr="vllm-project/vllm#57984", oracle="differential", stage=Stages.ACT_QUANT, **_RELEASES,
        fields=dict(num_tokens=1, num_experts=2, topk=1, hidden=128, inter=128, quant="fp8-block", fused=True,
                    swiglu_limit=1.0),
        requires="swiglu_limit", fused_by_release=True,
        why="silu_and_mul_per_block_quant takes no clamp, and 0.28-0.30 fuse anyway: the swiglu limit is ignored for "
            "FP8 block-[128, 128] experts; 0.31.0 falls back to the unfused, clamped path (the adapter passes the limit "
            "to each release as its apply takes it: peers/vllm/core.py swiglu_limit), so the fixed release runs the "
            "config unfused, its own choice. The limit is 1 rather than gpt-oss's 7: the generated gate/up values are "
            "about standard normal, so 1 clamps about a third of them (7 would clamp none and hide nothing)",
    ),
    Exhibit(
        name="sglang-top1-routed-scaling",
        title="top-1 with a routed scaling factor returns a never-written cache",
        pr="sgl-project/sglang#40187", buggy=("sglang==0.5.20",), fixed_in="0.5.21", fixed="sglang==0.5.23",
        oracle="differential", stage=Stages.REDUCE, factory="make_scaled",
        fields=dict(num_tokens=2, num_experts=2, topk=1, hidden=64, inter=64, quant="bf16"),
        why="at top-1, 0.5.20's fused_experts lets the down GEMM store into the output (_use_intermediate is "
            "topk != 1), then, routed_scaling_factor not being 1, takes the scaling combine, which sums "
            "intermediate_cache3, a torch.empty no launch wrote, over that output; 0.5.21 keeps the intermediate "
            "whenever the factor is not 1. The adapter's make_scaled passes factor 2 with the router weights halved "
            "(exact: peers/sglang/core.py ROUTED_SCALING_FACTOR), so the right output is the reference's bit for bit "
            "and no MoEConfig field is needed; the call-sequence oracle names it too (the same bytes for other values)",
    ),
    Exhibit(
        name="vllm-tensor-scale-expert-0",
        title="per-tensor weight scales beside per-token activations: every expert reads expert 0's scale",
        pr="vllm-project/vllm (0.33.0 wheel)", oracle="differential", stage=Stages.DOWN_GEMM, **_RELEASES_TO_0_33,
        fields=dict(num_tokens=2, num_experts=2, topk=1, hidden=128, inter=128, quant="fp8-token",
                    weight_scales="tensor"),
        why="(kFp8StaticTensorSym, kFp8DynamicTokenSym) is in TritonExperts' supported list, and its weight scale is "
            "1-D [E]; the kernel takes the channel-wise branch (per-token activations), which reads "
            "b_scale_ptr + expert * stride_bse + n * stride_bsn, and 0.28-0.32's invoke_fused_moe_triton_kernel passes "
            "stride_bse = 0 for a scale of fewer than 2 dimensions, so every expert's GEMM is scaled by expert 0's "
            "scale; 0.33.0 passes B_scale.stride(0). Token 0 is routed to expert 1, whose w2 scale is 6.5% above "
            "expert 0's (its w1 scale happens to equal expert 0's: the gate/up GEMM is right)",
    ),
    Exhibit(
        name="liger-int32-expert-offset",
        title="an expert index times the weight stride wraps int32 (the illegal memory access of Liger-Kernel#1296)",
        pr="linkedin/Liger-Kernel#1248", buggy=("liger==0.8.0",), fixed_in="0.8.1", fixed="liger==0.8.1",
        oracle="bounds", stage=Stages.GATE_UP_GEMM, factory="make_wide",
        fields=dict(num_tokens=1, num_experts=2, topk=1, hidden=1024, inter=1024, quant="bf16"),
        why="0.8.0's _fused_up_proj_swiglu_kernel loads the int32 tile_expert entry and multiplies it by stride_w_E "
            "(2 * I * H, bound as int32) in int32: expert 1024 of a 1026-expert stack at H = I = 1024 is 2^31 elements "
            "in, which wraps to -2^31, 4 GiB before the stack (a GPU's illegal memory access; the bounds guard refuses "
            "the loads, so the gate/up product is 0 and the differential names it too). 0.8.1 casts expert_idx to "
            "int64 first. make_wide stores the problem's 2 experts at index 1024.. of a lazily committed stack "
            "(peers/liger/core.py): the check's own inputs stay small, and the stack costs the filled experts' pages",
    ),
)

@dataclass
class Verdict:
    """One release's run of one exhibit."""

    release: str
    expected: str  # "fail" or "pass"
    findings: list[tuple[str, str | None]]  # (oracle, stage) of every finding
    seconds: float
    as_recorded: bool


@dataclass
class ExhibitResult:
    exhibit: Exhibit
    verdicts: list[Verdict] = field(default_factory=list)
    pending: str | None = None

    @property
    def as_recorded(self) -> bool:
        return self.pending is None and all(v.as_recorded for v in self.verdicts)


def exhibit_problem(exhibit: Exhibit):
    """The exhibit's inputs: the config's generated problem with its unrouted slots set to -1."""
    from diffmoe.problem.inputs import make_problem

    problem = make_problem(exhibit.config)
    if not exhibit.unrouted_slots:
        return problem
    ids = problem.topk_ids.clone()
    ids.view(-1)[list(exhibit.unrouted_slots)] = -1
    return dataclasses.replace(problem, topk_ids=ids)


@dataclass(frozen=True)
class ReleaseRun:
    """One release's run of one exhibit, as a task (diffmoe/cluster/tasks.py): plain data for a Ray worker."""

    exhibit: Exhibit
    release: str
    expected: str  # "fail" or "pass"
    oracles: tuple[str, ...]


def run_release(run: ReleaseRun) -> Verdict:
    """A task: the exhibit's config run on the release and judged; a buggy release must be named by
    (exhibit.oracle, exhibit.stage), the fixed one must pass."""
    from diffmoe.contract import unsupported
    from diffmoe.judge.runner import load_factory, run_differential

    exhibit = run.exhibit
    start = time.perf_counter()
    spec = exhibit.impl_spec(run.release)
    factory = load_factory(spec)
    config, inputs = exhibit.config, exhibit_problem(exhibit)
    if exhibit.fused_by_release and unsupported(factory, config) is not None:
        # the release runs the other pipeline (its `supports` says which: diffmoe.contract)
        config = config.replace(fused=not config.fused)
        inputs = dataclasses.replace(inputs, config=config)  # the same tensors: fused changes no input
    report = run_differential(config, factory, oracles=list(run.oracles), problem=inputs, implementation_name=spec)
    found = [(f.oracle, f.stage) for f in report.findings]
    ok = (exhibit.oracle, exhibit.stage) in found if run.expected == "fail" else report.passed
    return Verdict(run.release, run.expected, found, time.perf_counter() - start, ok)


def run_exhibits(exhibits: Sequence[Exhibit], oracles: Sequence[str] | None = None,
                 on_verdict: Callable[[Exhibit, Verdict], None] | None = None, *, workers: int = 1,
                 cluster=None) -> list[ExhibitResult]:
    """Every buggy release of each exhibit must fail with (exhibit.oracle, exhibit.stage); the fixed one must
    pass. Each release run is a task (diffmoe/cluster/tasks.py): in this process in order with one worker, as
    Ray tasks on `cluster` (a --cluster spec; default a local runtime) with more. `on_verdict(exhibit,
    verdict)` as each run's verdict arrives; the results keep the exhibits' and releases' order. Ctrl-C
    raises KeyboardInterrupt once the runs under way are cancelled."""
    from diffmoe.findings import Oracles
    from diffmoe.check.execution import default_device
    from diffmoe.cluster.tasks import Task, run_tasks
    from diffmoe.oracles.registry import DEFAULT_ORACLES

    chosen = tuple(oracles) if oracles is not None else tuple(o for o in DEFAULT_ORACLES if o != Oracles.METAMORPHIC)
    results = [ExhibitResult(e, pending=e.pending) for e in exhibits]
    runs = [(n, ReleaseRun(e, release, expected, chosen)) for n, e in enumerate(exhibits) if e.pending is None
            for release, expected in [*((r, "fail") for r in e.buggy), (e.fixed, "pass")]]
    verdicts: dict[int, Verdict] = {}

    def on_result(index: int, verdict: Verdict) -> None:
        verdicts[index] = verdict
        if on_verdict is not None:
            on_verdict(runs[index][1].exhibit, verdict)

    tasks = [Task(run_release, run, name=f"{run.exhibit.name} {run.release}") for _, run in runs]
    done = run_tasks(tasks, workers=workers, cluster=cluster, device=str(default_device()), on_result=on_result)
    if done.interrupted:
        raise KeyboardInterrupt
    for index, (n, _) in enumerate(runs):
        results[n].verdicts.append(verdicts[index])
    return results


def run_exhibit(exhibit: Exhibit, oracles: Sequence[str] | None = None,
                on_verdict: Callable[[Exhibit, Verdict], None] | None = None) -> ExhibitResult:
    """One exhibit's runs in this process (run_exhibits)."""
    return run_exhibits([exhibit], oracles, on_verdict)[0]


def runs_of(exhibits: Sequence[Exhibit]) -> int:
    """Release runs the exhibits make: each runnable one's buggy releases and its fixed one."""
    return sum(len(e.buggy) + 1 for e in exhibits if e.pending is None)


def missing_releases(exhibits: Sequence[Exhibit]) -> list[str]:
    """The releases the runnable `exhibits` run whose wheels are not in the peer cache, sorted."""
    from diffmoe.adapters.peer_wheels import is_cached

    wanted = {r for e in exhibits if e.pending is None for r in (*e.buggy, e.fixed)}
    return sorted(r for r in wanted if not is_cached(r))


def _render(result: ExhibitResult) -> str:
    e = result.exhibit
    head = f"{e.name}: {e.title} ({e.pr}; buggy {', '.join(e.buggy)}, fixed in {e.fixed_in})"
    if result.pending is not None:
        return f"{head}\n  PENDING: {result.pending}"
    lines = [head, f"  config: {e.minimal_config()}; must be named by {e.oracle} at {e.stage}"]
    for v in result.verdicts:
        got = "PASS" if not v.findings else "FAIL " + ", ".join(f"{o}@{s}" for o, s in v.findings)
        lines.append(f"  {v.release:13} expected {v.expected:4}  got {got}  ({v.seconds:.1f} s)"
                     f"{'' if v.as_recorded else '  NOT AS RECORDED'}")
    lines.append(f"  replay: {e.replay()}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`diffmoe museum`'s arguments (diffmoe/frontends/commands/museum.py adds them to its subcommand)."""
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"exhibits to run (default: all): {', '.join(e.name for e in EXHIBITS)}")
    parser.add_argument("--list", action="store_true", help="list the exhibits without running them")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="release runs at a time, as Ray tasks when over 1 (default 1: one after another in this process)")
    parser.add_argument("--cluster", metavar="local|auto|ray://HOST:PORT",
                        help="where --workers N > 1 runs: local (a Ray runtime started here, the default), auto (the running "
                             "cluster this machine is in), ray://HOST:PORT or HOST:PORT; each run asks for one GPU on CUDA")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--fetch", action="store_true",
                        help="fetch the releases missing from the peer cache first (network); without it a missing "
                             "release is a usage error naming its `diffmoe peers fetch`")


def main(argv: Sequence[str] | None = None, *, prog: str = "diffmoe museum") -> int:
    """`diffmoe museum [NAME ...] [--list] [--json]`; returns the exit code."""
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_arguments(parser)
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:
        return EXIT_AS_RECORDED if exc.code == 0 else EXIT_USAGE
    return run(args, prog)


def run(args: argparse.Namespace, prog: str = "diffmoe museum") -> int:
    """The command on parsed arguments (add_arguments)."""
    known = {e.name: e for e in EXHIBITS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"{prog}: unknown exhibit {unknown[0]!r}; exhibits: {', '.join(known)}", file=sys.stderr)
        return EXIT_USAGE
    chosen = [known[n] for n in args.names] if args.names else list(EXHIBITS)
    from diffmoe.cluster.tasks import checked_cluster

    try:  # before any run and before the progress starts
        cluster = checked_cluster(args.cluster, args.workers)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.list:
        for e in chosen:
            state = f"pending ({e.pending})" if e.pending else e.replay()
            print(f"{e.name:24} {e.pr:24} buggy {','.join(r.split('==')[1] for r in e.buggy):12} fixed {e.fixed_in}  "
                  f"{e.oracle}@{e.stage}  {state}")
        return EXIT_AS_RECORDED
    from diffmoe.adapters.peer_wheels import PeerError, cache_dir, fetch, fetch_command, not_cached_message

    missing = missing_releases(chosen)
    if missing and not args.fetch:  # before any run: each would be a crash finding, "NOT AS RECORDED" for no bug at all
        for release in missing:  # one line per release, each naming its fetch
            print(f"{prog}: {not_cached_message([release], cache_dir())}", file=sys.stderr)
        return EXIT_USAGE
    for release in missing:  # --fetch: asked for, each said on stderr
        print(f"{prog}: fetching {release} (`{fetch_command(release)}`)", file=sys.stderr)
        try:
            fetch(release)
        except PeerError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    from diffmoe.cluster.progress import Progress

    try:
        # on stderr: a bar on a terminal, else a line per release run (diffmoe/cluster/progress.py)
        with Progress(sys.stderr, "museum", total=runs_of(chosen), unit="release", json_lines=args.json) as progress:
            def on_verdict(exhibit: Exhibit, verdict: Verdict) -> None:
                got = "as recorded" if verdict.as_recorded else "NOT AS RECORDED"
                progress.advance(detail=f"{exhibit.name} {verdict.release} (expected {verdict.expected}): {got}")

            results = run_exhibits(chosen, on_verdict=on_verdict, workers=args.workers, cluster=cluster)
    except (PeerError, ValueError) as exc:  # ValueError: a --cluster nothing answers at, before any run
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps([{"exhibit": r.exhibit.name, "pr": r.exhibit.pr, "pending": r.pending, "as_recorded": r.as_recorded,
                           "verdicts": [dataclasses.asdict(v) for v in r.verdicts]} for r in results]))
    else:
        print("\n".join(_render(r) for r in results))
    ran = [r for r in results if r.pending is None]
    return EXIT_AS_RECORDED if ran and all(r.as_recorded for r in ran) else EXIT_NOT_AS_RECORDED
