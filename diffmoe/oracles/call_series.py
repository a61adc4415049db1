"""The call-sequence oracle's long series: one instance called SERIES_CALLS times, once from another thread.

The call-sequence oracle's other calls make at most three calls per instance, all on the main
thread: a kernel that turns wrong after its 8th call (an autotuner switching configs once it has
timed enough, a cache filling up) or only when called from a thread other than the main one passed
them (issue 43). Here one fresh instance and one pair of workspaces take SERIES_CALLS calls of
1..SERIES_MAX_TOKENS tokens, every call after the first of its size judged bitwise against that
first one (same inputs, same instance: exactness holds), and one more call made from a thread of
its own. The instance's first call is of T = 1, and every other call is T = 1 again: a kernel that
turns wrong after its n-th call (1 <= n < SERIES_CALLS) diverges from that first answer, whatever
n, without a reference (one wrong from its first call is wrong on the check's own call, which the
differential judges).

As cheap as the interpreter allows: the calls are made on `series_config`, the check's config with
T, E, K, H and I cut to SERIES_MAX_TOKENS, SERIES_EXPERTS, SERIES_TOPK, SERIES_WIDTH (the rest kept:
quantisation, fusion, routing, numerics), since under the interpreter a call's cost is mostly per
launch and per program; and all of them are one request to the candidate's process
(`Check.series`, `Candidate.series`: the lightest watch), whose answers this module compares
(docs/oracles.md has the measured cost).

The series judges the calls' history, not a config: it is not run on a check that has already
failed (it would change no verdict), and where the first call of a size fails on its own (a crash,
an access the bounds guard refuses) it has nothing to judge the later calls against, and the report
says so under `skipped` (SERIES_SKIP_KEY) rather than fail the check for a config it did not ask for.

Owns the series: its config, its sizes, its calls and their verdicts. Must not touch the other
calls of the call-sequence oracle (call_sequence.py).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from diffmoe.contract import unsupported
from diffmoe.check.candidate import Crash
from diffmoe.findings import Finding, Oracles
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.inputs import Problem, make_problem
from diffmoe.problem.vocabulary import Buffers, producer_stage
from diffmoe.tolerance.compare import Rule, compare

if TYPE_CHECKING:
    from diffmoe.check.execution import Check

# Issue 43: at least 32 calls on one instance, the horizon of an autotuner or a cache that changes
# its answer after some calls; T = 1 every other call, so one size alone is called 16 times (a
# counter kept per shape passes 8 calls too).
SERIES_CALLS = 32
SERIES_MAX_TOKENS = 4
# H and I of the series' config: the floor of every quantisation scheme's sizes (fp8-block's
# 128-wide blocks); measured on the shipped kernels (E=4 K=2 fp8-token, this 2-core machine), a
# T=1..4 call costs 0.07 s at H=I=128, 0.10 s at the default H=I=256.
SERIES_WIDTH = 128
# E and K of the series' config: its grouped GEMMs' programs grow with the experts a call routes to;
# measured 2026-12-06 (shipped kernels, fp8-token H=I=128 K=2, process CPU seconds, this 2-core
# machine): a T=1..4 call costs 30 ms at E=4, 23 ms at E=2, and 23 ms at H=I=32 too (one block
# either way), so the width stays the floor every scheme accepts.
SERIES_EXPERTS = 2
SERIES_TOPK = 2
# The one value of each number that only selects a path by being set (gpt-oss's SwiGLU clamp,
# DeepSeek-V3's routed scaling factor).
SERIES_SWIGLU_LIMIT = 7.0
SERIES_ROUTED_SCALE = 2.5
# The report's `skipped` entry of a series not run or not judged (the rest of call-sequence ran).
SERIES_SKIP_KEY = "call-sequence series"
# The fields that shape the inputs' values only, never which code path a kernel takes: the series
# draws them all the same way, so checks that differ in them share one series (measured: the 203
# checks of tests/oracles/test_oracles_quiet.py drew 147 distinct series configs with these kept, 91 with
# them drawn one way, and 65 with the sizes and numbers canonical too (_canonical, 2026-12-07), each
# 1.55 s of a 2-core machine's time).
SERIES_DATA = dict(zero_rows=0, nan_rows=0, inf_rows=0, skew="uniform", router="random-k", renormalize=False,
                   expert_scale_spread=0, outlier_channels=0, tie_heavy=False, random_orders=0, dropped_slots=0)


def series_sizes(largest: int) -> list[int]:
    """The T of each call, in order: every size once (each judged against its reference), then
    T = 1 every other call and the other sizes in turn between."""
    sizes = list(range(1, min(SERIES_MAX_TOKENS, largest) + 1))
    if not sizes:
        return []
    others = sizes[1:] or sizes
    sequence = list(sizes)
    while len(sequence) < SERIES_CALLS:
        n = len(sequence) - len(sizes)
        sequence.append(1 if n % 2 == 0 else others[(n // 2) % len(others)])
    return sequence


def _canonical(cfg: MoEConfig) -> list[dict]:
    """The canonical cuts of `cfg`, most canonical first: its path (scheme, fusion, placements,
    routing, granularities, whether it has an expert map, shared experts, a SwiGLU clamp, a routed
    scaling factor) at one shape and one value of each number."""
    topk = min(cfg.topk, SERIES_TOPK)
    fields = dict(num_experts=max(SERIES_EXPERTS, topk), topk=topk, hidden=SERIES_WIDTH, inter=SERIES_WIDTH,
                  shared_experts=min(cfg.shared_experts, max(topk - 1, 0)),
                  swiglu_limit=None if cfg.swiglu_limit is None else SERIES_SWIGLU_LIMIT,
                  routed_scaling_factor=None if cfg.routed_scaling_factor is None else SERIES_ROUTED_SCALE)
    if cfg.expert_map is None:
        return [fields]
    # an expert map of its own size: one local expert and one that is not (either way round)
    experts = fields["num_experts"]
    return [{**fields, "expert_map": tuple(0 if e == local else -1 for e in range(experts))} for local in range(experts)]


def series_config(check: Check) -> tuple[MoEConfig, Problem]:
    """The series' config and problem: the check's path at one canonical shape (_canonical: T =
    SERIES_MAX_TOKENS, E = SERIES_EXPERTS, K <= SERIES_TOPK, H = I = SERIES_WIDTH, seed 0, the
    inputs' data fields drawn one way, SERIES_DATA) when it is valid and the implementation runs
    it; else the check's config with T, E, K, H and I cut (E and K kept where an expert map or
    shared experts tie them); else the check's own config and problem (its first tokens). The
    series judges a kernel's history on its path (scheme, fusion, placements, workspaces,
    activation), not its sizes or data, which the check's own calls judge: checks of one path share
    one series config, and a process runs the series once for them (_PASSED)."""
    cfg = check.config
    topk = min(cfg.topk, SERIES_TOPK)
    common = dict(num_tokens=SERIES_MAX_TOKENS, call_tokens=None, seed=0, **SERIES_DATA)
    cut = dict(common, hidden=min(cfg.hidden, SERIES_WIDTH), inter=min(cfg.inter, SERIES_WIDTH))
    candidates = [{**common, **fields} for fields in _canonical(cfg)]
    candidates += [{**cut, "num_experts": max(min(cfg.num_experts, SERIES_EXPERTS), topk), "topk": topk}, cut]
    for fields in candidates:
        try:
            small = dataclasses.replace(cfg, **fields)
            small.validate()
            if unsupported(check.factory, small) is None:
                return small, make_problem(small, check.device)
        except (ValueError, TypeError):
            pass  # a field tied to the sizes: a larger cut, or the check's own config
    return cfg, check.problem


def series_findings(check: Check) -> list[Finding]:
    """The series (module docstring); at most one finding: the first call that diverges."""
    from diffmoe.check.execution import first_tokens

    config, source = series_config(check)
    sequence = series_sizes(source.num_tokens)
    if not sequence:
        return []
    if check.findings or (check.out_of_bounds and check.selected(Oracles.BOUNDS)):
        # the check has failed already (refused accesses are worded by the bounds oracle at its
        # end): the series' 33 calls would change no verdict (a kernel found only by the series is
        # found on a check that passed everything else)
        check.skipped.setdefault(SERIES_SKIP_KEY, "not run: the check had already failed")
        return []
    key = _passed_key(check, config)
    if key is not None and key in _PASSED:
        return []
    problems = {t: first_tokens(source, t) for t in sorted(set(sequence))}
    # the call from another thread right after the first call of every size: those are its
    # comparison, and a divergence after it is the main thread's calls' own
    calls = [(t, False) for t in sequence]
    calls.insert(len(problems), (max(problems), True))
    whats = [f"call {n} of {len(calls)} (T={t}, from {'a thread other than the main one' if on_thread else 'the main thread'}) "
             f"on one instance and workspaces of {config.short()}" for n, (t, on_thread) in enumerate(calls, 1)]
    baseline = len(problems)  # the first call of every size: each later call is judged against one
    try:
        answered = check.series(config, problems, calls, whats)
    except Crash as crash:
        pending, refused = check.series_crash_findings()
        if crash.finding.figures.get("phase") not in whats[:baseline]:
            check.findings += pending
            check.out_of_bounds += refused
            raise
        # a first call failed on its own: a fault of the series' config, not of the calls before it
        # (the check's own calls judge its config; the fuzz draws the series' too)
        return _no_baseline(check, crash.finding.message)
    if any(refused for _, refused in answered[:baseline]):
        n = next(n for n, (_, refused) in enumerate(answered[:baseline], 1) if refused)
        return _no_baseline(check, f"{whats[n - 1]} made {len(answered[n - 1][1])} accesses the bounds guard refused")
    later_refused = [event for _, refused in answered[baseline:] for event in refused]
    check.out_of_bounds += later_refused  # the bounds oracle words them (its after_finish)
    answers = [buffers for buffers, _ in answered]
    firsts: dict[int, int] = {}  # T -> the index of its first call
    for n, ((t, on_thread), what, buffers) in enumerate(zip(calls, whats, answers), 1):
        if t not in firsts:
            firsts[t] = n - 1
            continue
        first = answers[firsts[t]]
        for name in [Buffers.OUTPUT, *sorted(set(buffers) - {Buffers.OUTPUT})]:
            if name not in first:
                continue
            c = compare(name, first[name], buffers[name], Rule.bitwise("the same call on the same instance"))
            if c.ok:
                continue
            why = ("that one made from the main thread: a kernel right only on the main thread" if on_thread else
                   "a kernel whose answer depends on the calls before it: bytes an earlier call left in the "
                   "workspaces or a private buffer, an autotuner switching configs, a cache filling up")
            return [Finding(
                oracle=Oracles.CALL_SEQUENCE, stage=producer_stage(config, name), buffers=[name],
                message=f"{name} of {what} differs from the first T={t} call of the same inputs on that instance "
                        f"(call {firsts[t] + 1}): {c.differing} of {c.total} elements differ ({why})",
                figures={"call": n, "calls": len(calls), "tokens": t, "on_thread": on_thread, **c.figures()},
            )]
    if key is not None and not later_refused:
        _PASSED.add(key)
    return []


def _no_baseline(check: Check, why: str) -> list[Finding]:
    check.skipped.setdefault(SERIES_SKIP_KEY, f"not judged: {why} (the first call of a size is what the later ones are "
                                              "judged against; the series judges the calls' history, not its config)")
    return []


# The series that passed in this process: (factory, series config, program order, device, interpreter
# or not, where the candidate ran). One that passed is not run again for the same key: a pytest
# session or a fuzz of one implementation pays it once per series config (its 33 calls cost more
# than the rest of a small check, docs/oracles.md). One that found something runs again every time.
# The factory is its object, or its spec where the judge holds only that (a RemoteFactory: a
# command line, each of whose checks makes its own): a planted bug needs a factory of its own (a
# module patched between two checks of one factory in one process is not seen by the series).
_PASSED: set[tuple] = set()


def passed_keys() -> list[tuple]:
    """The series that passed in this process, as keys that pickle (a check's worker process sends
    them to its parent: diffmoe/check/worker.py; a factory that does not pickle is left out)."""
    import pickle

    keys = []
    for key in _PASSED:
        try:
            pickle.dumps(key)
        except Exception:  # noqa: BLE001 - a closure or a lambda factory: this process keeps it alone
            continue
        keys.append(key)
    return keys


def learn(keys: object) -> None:
    """Take series that passed in a worker process (passed_keys()); anything else is ignored."""
    if isinstance(keys, list):
        for key in keys:
            if isinstance(key, tuple):
                try:
                    _PASSED.add(key)
                except TypeError:
                    pass


def _passed_key(check: Check, config: MoEConfig) -> tuple | None:
    from diffmoe.isolation.client import RemoteFactory

    factory = ("spec", check.factory.spec) if isinstance(check.factory, RemoteFactory) else check.factory
    key = (factory, config, str(check.schedules[0]), str(check.device), os.environ.get("TRITON_INTERPRET", ""),
           type(check.candidate).__name__)
    try:
        hash(key)
    except TypeError:  # a factory or a config field that cannot be a key: run it every time
        return None
    return key
