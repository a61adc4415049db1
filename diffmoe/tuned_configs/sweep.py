"""Judging a release's tuned configs: every entry forced through the release's own override on a
problem of its file's scheme, shrunk to CPU size, checked by every oracle.

The problem (shrunk_config): E = min(the file's E, SHRUNK_EXPERTS), top-k 2 (1 for a one-expert
file), H = 2 * QUANT_BLOCK (K of the gate/up GEMM: two quantisation blocks, so a K tile that
straddles a scale block is seen), I = QUANT_BLOCK, T = min(the entry's batch, MAX_TOKENS) tokens
(a batch of a few tokens fills a fraction of one BLOCK_SIZE_M tile, as on the GPU; past
MAX_TOKENS only the cost grows). fused, and I = 2 * QUANT_BLOCK where I = QUANT_BLOCK is refused,
are the release's own choices for the scheme (its `supports`). Every oracle judges but metamorphic (the peers run one pipeline per scheme: the
museum's set, diffmoe/museum/exhibits.py).

Many entries force the same run (the same tile on the same shrunk problem, and on the interpreter the
same tile less the compile options it drops, INTERPRETER_IGNORED: the 5252 entries of vLLM 0.33.0's
supported files and its 6 default rows are 731 distinct runs at MAX_TOKENS 8), so each distinct run is judged
once and its verdict shared (`Row.shared`). With a resume file, every verdict is appended to it as
it is reached (one JSON line) and a later sweep with the same file takes them from it: an
interrupted sweep continues where it stopped. The distinct runs are tasks (`judge_run` on a `Run`,
diffmoe/cluster/tasks.py): with one worker they are judged here in order; with more, as Ray tasks
(`--cluster`, a local runtime by default), each loading the --impl spec itself. Their verdicts come
back here, where the resume file is written and `on_row` told as each arrives, and the rows keep the
plan's order whatever order the runs finished in. The release's default-config path (no file, vLLM's
get_default_config) is judged too, at T = 1 and MAX_TOKENS, per scheme, as file "(default config) SCHEME".

Owns the shrunk problem, the verdicts and the resume file. Must not import an implementation (the
factory's attributes carry the configs' folder and the override; a Ray worker loads the user's spec).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from diffmoe.contract import TUNED_CONFIG_DIR, WITH_TILE_CONFIG, resolve_factory, unsupported  # noqa: F401 - the attribute names, re-exported
from diffmoe.problem.config import QUANT_BLOCK, MoEConfig, quoted

from .files import ConfigFile, Entry, config_files, for_model, model_key

def factory_tuned_configs(factory: Callable | None) -> tuple[str, Callable[[dict | None], Callable]] | None:
    """(TUNED_CONFIG_DIR, WITH_TILE_CONFIG) when the factory declares both, else None
    (diffmoe.contract.FactoryHandle.tuned_configs: a TypeError naming a wrong attribute)."""
    return None if factory is None else resolve_factory(factory).tuned_configs


SHRUNK_EXPERTS = 4  # enough experts for a token's two slots to land in different experts' blocks
# T at most 8: one check of every oracle at T=8, E=4, H=256, I=128 took 4.4 s to 10 s on this 2-core machine
# (bf16, fp8-tensor, fp8-block, loaded by other work; measured 2026-12-05), 731 distinct runs for vLLM 0.33.0
MAX_TOKENS = 8
DEFAULT_CONFIG = "(default config)"
DEFAULT_BATCHES = (1, MAX_TOKENS)


@dataclass
class Row:
    """One entry's verdict (or the default config's at one batch)."""

    file: str
    batch: int
    tile: dict | None  # None: the release's own default
    tokens: int
    passed: bool
    findings: list[str]  # "oracle@stage: message" of each finding
    seconds: float
    shared: bool = False  # the verdict of an identical run judged before (this sweep or the resume file)

    @property
    def first_finding(self) -> str | None:
        return self.findings[0] if self.findings else None

    def as_json(self) -> dict:
        return {"file": self.file, "batch": self.batch, "tile": self.tile, "tokens": self.tokens,
                "verdict": "PASS" if self.passed else "FAIL", "findings": self.findings,
                "seconds": round(self.seconds, 3), "shared": self.shared}


@dataclass
class SweepResult:
    rows: list[Row] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, why)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.passed for r in self.rows)


def forcing_function(factory: Callable) -> Callable[[dict | None], Callable]:
    """The release's `with_tile_config`; a ValueError when the factory declares no tuned configs."""
    declared = factory_tuned_configs(factory)
    if declared is None:
        raise ValueError("--impl must name a release that ships tuned configs and declares how to force one "
                         "(a factory with tuned_config_dir and with_tile_config: vllm, vllm==0.28.0, sglang, ...)")
    return declared[1]


def shrunk_config(scheme: str, experts: int, batch: int, factory: Callable) -> MoEConfig:
    """The CPU-size problem an entry of a file of `scheme` and `experts` experts is judged on."""
    e = max(1, min(experts, SHRUNK_EXPERTS))
    config = MoEConfig(num_tokens=max(1, min(batch, MAX_TOKENS)), num_experts=e, topk=min(2, e),
                       hidden=2 * QUANT_BLOCK, inter=QUANT_BLOCK, quant=scheme, fused=False)
    # the release's own choices, in order: vLLM fuses the block quant with silu; SGLang sends a whole-row group
    # (I = 128) to another quant op, so its fp8-block problem has I = 256 (two groups too)
    for changes in ({}, {"fused": True}, {"inter": 2 * QUANT_BLOCK}):
        try:
            candidate = config.replace(**changes)
        except ValueError:  # fused is for the FP8 schemes only
            continue
        if unsupported(factory, candidate) is None:
            return candidate
    raise ValueError(f"--impl refuses every shrunk problem of scheme {scheme!r}: {unsupported(factory, config)}")


# Triton's compile options, which schedule compiled code and change no value: the interpreter's launcher
# keeps only the kernel's own parameters (triton/runtime/interpreter.py GridExecutor.__call__ drops the
# rest), and no fused-MoE kernel of vLLM 0.33.0 or SGLang 0.5.23 has a parameter of these names
# (tests/tuned_configs/test_tuned_configs.py reads them). 12864 of the two releases' 12900 entries set num_warps and
# num_stages, 1692 the ROCm options; dropping them halves the distinct runs on a CPU (vLLM 0.33.0
# 1487 -> 731, SGLang 0.5.23 1400 -> 742). Compiled, every key counts.
INTERPRETER_IGNORED = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg", "waves_per_eu",
                                 "matrix_instr_nonkdim", "kpack", "grf_mode"})


def run_key(config: MoEConfig, tile: dict | None, interpreted: bool = True) -> str:
    """What makes two entries the same run: the shrunk problem and the forced tile (on the interpreter,
    less the compile options it drops: INTERPRETER_IGNORED)."""
    if tile is not None and interpreted:
        tile = {k: v for k, v in tile.items() if k not in INTERPRETER_IGNORED}
    return json.dumps([config.to_dict(), None if tile is None else sorted(tile.items())], sort_keys=True, default=str)


def load_resume(path: Path | None) -> dict[str, dict]:
    """The verdicts a resume file holds, by run key (a truncated last line, from a killed sweep, is skipped)."""
    done: dict[str, dict] = {}
    if path is None or not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            item = json.loads(line)
            done[item["key"]] = item
        except (ValueError, KeyError, TypeError):
            continue
    return done


def judge(config: MoEConfig, factory: Callable, name: str, oracles: Sequence[str]) -> tuple[bool, list[str]]:
    """One check: passed, and "oracle@stage: message" per finding."""
    from diffmoe.judge.runner import run_differential

    report = run_differential(config, factory, oracles=list(oracles), implementation_name=name)
    return report.passed, [f"{f.oracle}@{f.stage}: {' '.join(str(f.message).split())}" for f in report.findings]


def plan(files: Sequence[ConfigFile], schemes_default: bool = True) -> list[tuple[str, int, Entry | None, str, int]]:
    """(file name, batch, entry or None for the default, scheme, file E) of every row, in order."""
    rows = []
    for f in files:
        if f.scheme is None:
            continue
        rows += [(f.name, e.batch, e, f.scheme, f.experts) for e in f.entries()]
    if schemes_default:
        for scheme in sorted({f.scheme for f in files if f.scheme is not None}):
            rows += [(f"{DEFAULT_CONFIG} {scheme}", b, None, scheme, SHRUNK_EXPERTS) for b in DEFAULT_BATCHES]
    return rows


@dataclass(frozen=True)
class Run:
    """One distinct forced run, as a task (diffmoe/cluster/tasks.py): plain data, so it travels to a Ray worker."""

    impl: str  # the --impl spec: a Ray worker loads the factory from it
    config: MoEConfig
    tile: dict | None
    oracles: tuple[str, ...]


# The factories judge_run forces tiles through, by --impl spec: the sweep puts its own here (a run in this
# process uses it as it is); a Ray worker, which starts with none, loads the spec once.
_factories: dict[str, Callable] = {}


def judge_run(run: Run) -> tuple[bool, list[str], float]:
    """A task: the run's tile forced through the release's override and judged; (passed, findings, seconds)."""
    factory = _factories.get(run.impl)
    if factory is None:
        from diffmoe.adapters.loading import load_factory

        factory = _factories[run.impl] = load_factory(run.impl)
    start = time.perf_counter()
    try:
        passed, findings = judge(run.config, forcing_function(factory)(run.tile), f"{run.impl} tile {run.tile}", run.oracles)
    except (ValueError, TypeError) as exc:  # a tile the release's override refuses before any check
        passed, findings = False, [f"crash@None: {type(exc).__name__}: {exc}"]
    return passed, findings, time.perf_counter() - start


def sweep(factory: Callable, folder: Path, impl: str, pattern: str = "*.json", max_entries: int | None = None,
          resume: Path | None = None, oracles: Sequence[str] | None = None,
          on_start: Callable[[int], None] | None = None, on_row: Callable[[Row], None] | None = None,
          workers: int = 1, cluster=None, model=None) -> SweepResult:
    """Judge every entry of the config files in `folder` (the release's, or a copy) matching `pattern` (at most
    `max_entries` of them, then the default config); `on_start(total rows)`, `on_row(row)` as each row's verdict
    is reached (the resume file's first, then every row of a run as the run finishes).

    workers, cluster (a --cluster spec or ClusterSpec): the distinct runs as tasks (diffmoe/cluster/tasks.py):
    one worker judges them here in order; more run them as Ray tasks (`cluster`, default a local runtime),
    each loading `impl` (an --impl spec) itself. The verdicts, the resume file (written here as they arrive)
    and the rows' order are the same either way. Ctrl-C keeps every verdict reached (and written) and raises
    KeyboardInterrupt. model: a diffmoe.problem.models.ModelShape, keeping only the files its layer
    loads (files.for_model).
    """
    from diffmoe.check.execution import default_device
    from diffmoe.findings import Oracles
    from diffmoe.cluster.tasks import Task, run_tasks
    from diffmoe.interpreter.grid_order import interpreting
    from diffmoe.oracles.registry import DEFAULT_ORACLES

    forcing_function(factory)
    files = config_files(folder, pattern)
    if not files:
        raise ValueError(f"--files {pattern!r} matches no tuned-config file in {folder}")
    if model is not None:
        matched = for_model(files, model.experts, model.shared_experts, model.inter)
        if not matched:
            es, ns = model_key(model.experts, model.shared_experts, model.inter)
            raise ValueError(f"--model {model.name}: no tuned-config file of E in {sorted(es)} and N in {sorted(ns)} "
                             f"(I / TP) matches --files {pattern!r} in {folder}")
        files = matched
    chosen = tuple(oracles) if oracles is not None else tuple(o for o in DEFAULT_ORACLES if o != Oracles.METAMORPHIC)
    result = SweepResult(skipped=[(f.name, f.skip_reason) for f in files if f.scheme is None])
    todo = plan(files)
    entries = [r for r in todo if r[2] is not None]
    if max_entries is not None:
        entries = entries[:max_entries]
    todo = entries + [r for r in todo if r[2] is None]
    if on_start is not None:
        on_start(len(todo))

    interpreted = interpreting()
    done = load_resume(resume)
    rows: list[Row | None] = [None] * len(todo)
    keyed = []  # per row: (key, file, batch, tile, tokens)
    runs: dict[str, Run] = {}  # the distinct runs not in the resume file, in order of first row
    for file, batch, entry, scheme, experts in todo:
        tile = None if entry is None else entry.tile
        config = shrunk_config(scheme, experts, batch, factory)
        key = run_key(config, tile, interpreted)
        keyed.append((key, file, batch, tile, config.num_tokens))
        if key not in done:
            runs.setdefault(key, Run(impl, config, tile, chosen))
    rows_of: dict[str, list[int]] = {}
    for index, (key, *_rest) in enumerate(keyed):
        rows_of.setdefault(key, []).append(index)

    def reached(key: str, passed: bool, findings: list[str], seconds: float | None) -> None:
        """Every row of `key` gets its verdict; the first is the judged one unless it came from the resume file."""
        for n, index in enumerate(rows_of[key]):
            _, file, batch, tile, tokens = keyed[index]
            judged = seconds is not None and n == 0
            rows[index] = Row(file, batch, tile, tokens, passed, list(findings), seconds if judged else 0.0, shared=not judged)
            if on_row is not None:
                on_row(rows[index])

    _factories[impl] = factory
    keys = list(runs)
    out = open(resume, "a") if resume is not None else None
    try:
        for key in rows_of:
            if key in done:  # from the resume file: reached before any run
                reached(key, done[key]["passed"], done[key]["findings"], None)

        def on_result(index: int, value: tuple[bool, list[str], float]) -> None:
            key = keys[index]
            passed, findings, seconds = value
            done[key] = {"key": key, "passed": passed, "findings": findings}
            if out is not None:  # here, in the one process that writes the file, as each verdict arrives
                out.write(json.dumps(done[key]) + "\n")
                out.flush()
            reached(key, passed, findings, seconds)

        first = {key: keyed[rows_of[key][0]] for key in keys}
        tasks = [Task(judge_run, runs[key], name=f"{first[key][1]} batch {first[key][2]}") for key in keys]
        run = run_tasks(tasks, workers=workers, cluster=cluster, device=str(default_device()), on_result=on_result)
        if run.interrupted:
            raise KeyboardInterrupt
    finally:
        if out is not None:
            out.close()
    result.rows = [r for r in rows if r is not None]
    return result
