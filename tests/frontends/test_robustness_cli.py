"""`diffmoe fuzz` as a shell runs it: interrupted by SIGTERM or Ctrl-C (SIGINT) while it
shrinks, it stops, prints the smallest failure so far, leaves no worker
process behind, and a second run with the same --database replays a stored failure first;
with --workers 2 (a local Ray runtime the command starts) a Ctrl-C to the job's whole process
group does the same and leaves no Ray process behind.

The implementation under test is written to a temporary module: it answers at once (zeros,
which the static-aliasing oracle alone does not judge), except for H > 256, where run() sleeps
forever. Every example
then costs milliseconds or the time limit (1 s), so the search reaches its shrink phase in
a few seconds; the static-aliasing oracle alone keeps the oracles from asking more of it.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from diffmoe.problem.config import MoEConfig
from ray_cluster import processes_left
from signal_dispositions import sigint_as
from hang_bounds import SUBPROCESS_HANG_S

HANGS_ON_WIDE_HIDDEN = '''
import time

import torch

from diffmoe.contract import RunResult
from optimized.moe import TritonFP8MoE


class HangsOnWideHidden(TritonFP8MoE):
    def run(self, problem, workspaces, *, output=None, **kwargs):
        while self.config.hidden > 256:
            time.sleep(0.05)
        out = output if output is not None else torch.empty(problem.num_tokens, self.config.hidden, dtype=torch.bfloat16)
        return RunResult(output=out.zero_())


def factory(config):
    return HangsOnWideHidden(config)
'''

# A bound on a hang, not a speed goal (issue 48: a 3 s goal here failed at 6.7 s at load average 20):
# a fuzz still running this long after the signal ignored it. How fast a stop is, is measured by
# bench/bench_stop.py (docs/robustness.md quotes it): about 1 s, 3.0 to 3.3 s with --workers 2
# (ray.shutdown), on this 2-core machine unloaded; several times that loaded.
STOP_HANG_S = 120.0
# How long a fuzz that ignores SIGINT must go on after one to show it ignored it: longer than an
# unloaded stop takes (above). Loaded, a stop taking longer would make the check vacuous, not failing.
IGNORED_FOR_S = 4.0


class Fuzz:
    """A `python -m diffmoe fuzz` subprocess whose stderr lines are read as they come."""

    def __init__(self, folder, database, *extra, disposition: str = "terminal"):
        """Started with SIGINT as `disposition` says (tests/support/signal_dispositions.py), whatever
        pytest inherited, in a session of its own (a signal to its group reaches the fuzz and its
        processes only), its environment marked (every process it starts carries the mark)."""
        self.mark = uuid.uuid4().hex
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]),
                   DIFFMOE_TEST_MARK=self.mark)
        argv = [
            sys.executable, "-m", "diffmoe", "fuzz", "--impl", "hangs:factory", "--database", str(database),
            "--max-tokens", "2", "--max-experts", "2", "--oracles", "static-aliasing", "--time-limit", "1", "--json",
            *extra,
        ]
        with sigint_as(disposition):
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                         start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stderr:
            self.stderr.append(line)
            self.lines.put(line)

    def wait_for(self, needle: str, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if needle in line:
                return line
        self.proc.kill()
        pytest.fail(f"no {needle!r} on stderr within {timeout} s:\n{''.join(self.stderr)}")

    def children(self) -> list[int]:
        """Worker processes of the fuzz (found through /proc; none where there is no /proc)."""
        pids = []
        for entry in (os.listdir("/proc") if os.path.isdir("/proc") else []):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as fh:
                        if int(fh.read().split(")")[-1].split()[1]) == self.proc.pid:
                            pids.append(int(entry))
                except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                    pass
        return pids

    def interrupt(self, signum, group: bool = False) -> tuple[float, int, dict]:
        """Send `signum` (to the whole process group: `group`); the seconds until exit (for
        bench/bench_stop.py: no test asserts them), the exit code and the JSON printed."""
        workers = self.children()
        sent = time.monotonic()
        if group:
            os.killpg(self.proc.pid, signum)
        else:
            self.proc.send_signal(signum)
        try:
            code = self.proc.wait(timeout=STOP_HANG_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"fuzz did not stop within {STOP_HANG_S:g} s of the signal: it hangs")
        elapsed = time.monotonic() - sent
        for pid in workers:  # reaped by the fuzz before it exited, so gone (or a zombie of init)
            assert not _alive(pid), f"worker {pid} outlived the fuzz"
        out = self.proc.stdout.read()
        assert "Traceback" not in "".join(self.stderr), "".join(self.stderr)
        return elapsed, code, json.loads(out)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# With --json the progress on stderr is JSON lines (diffmoe/cluster/progress.py); the first line of
# a phase names the config under way as its detail.
FIRST_EXAMPLE = '{"progress": "fuzz", "phase": "generate"'
SHRINKING = '{"progress": "fuzz", "phase": "shrink"'


def _config_of(progress_line: str) -> str:
    line = json.loads(progress_line)
    assert line["done"] == 0, line  # the phase's first example: none finished before it
    return line["detail"]


def _hidden_of(short: str) -> int:
    """H of a config's short form ("... H=16 ...")."""
    return int(re.search(r"\bH=(\d+)\b", short).group(1))


@pytest.mark.slow
def test_interrupted_fuzz_reports_and_the_next_run_replays_its_failure_first(tmp_path):
    (tmp_path / "hangs.py").write_text(HANGS_ON_WIDE_HIDDEN)
    database = tmp_path / "db"

    first = Fuzz(tmp_path, database)
    opening = _config_of(first.wait_for(FIRST_EXAMPLE))
    assert "H=16 " in opening  # a fresh search starts from the simplest config, which passes
    first.wait_for(SHRINKING)  # a failure was found and is being shrunk
    _, code, data = first.interrupt(signal.SIGTERM)
    assert code == 1 and data["interrupted"] is True
    found = MoEConfig.from_dict(data["config"])
    assert found.hidden > 256 and data["replay"].startswith("diffmoe check ")
    assert [f["oracle"] for f in data["report"]["findings"]] == ["timeout"]
    assert os.listdir(database)  # the failure is on disk

    second = Fuzz(tmp_path, database)
    replayed = _config_of(second.wait_for(FIRST_EXAMPLE))
    # A stored failure first, not the simplest config. Not necessarily the reported one: with two
    # workers, the one that was not shrinking may also have stored a failure before the signal
    # (seen in one .ci/run of three), and Hypothesis replays the database smallest-first by its
    # own order of choices, not by the config the report names.
    assert _hidden_of(replayed) > 256, (replayed, found.short())
    second.wait_for(SHRINKING)
    _, code, data = second.interrupt(signal.SIGINT)  # Ctrl-C
    assert code == 1 and data["interrupted"] is True
    assert MoEConfig.from_dict(data["config"]).hidden > 256


@pytest.mark.slow
def test_interrupted_before_any_failure_exits_130(tmp_path):
    (tmp_path / "hangs.py").write_text(HANGS_ON_WIDE_HIDDEN)
    fuzz = Fuzz(tmp_path, tmp_path / "db")
    fuzz.wait_for(FIRST_EXAMPLE)
    _, code, data = fuzz.interrupt(signal.SIGTERM)
    assert code == 130
    assert data["interrupted"] is True and data["passed"] is True


@pytest.mark.slow
def test_a_fuzz_started_with_sigint_ignored_keeps_ignoring_it_and_stops_on_sigterm(tmp_path):
    """The documented choice (docs/robustness.md, "Started with SIGINT ignored"): a fuzz run with nohup or in
    the background ignores SIGINT, even one sent to its whole process group (the fuzz and its
    workers), and keeps shrinking; SIGTERM then stops it with what it found.

    The fuzz ends only when its shrinking worker does (the other stops generating by itself once
    a failure is found, so its liveness proves nothing): still running IGNORED_FOR_S after
    the SIGINT means the shrinking worker ignored it too; this shrink takes 30 s or more
    (measured: it reaches H=257 after 34 s)."""
    (tmp_path / "hangs.py").write_text(HANGS_ON_WIDE_HIDDEN)
    fuzz = Fuzz(tmp_path, tmp_path / "db", disposition="ignored")
    fuzz.wait_for(SHRINKING)
    os.killpg(fuzz.proc.pid, signal.SIGINT)  # what a Ctrl-C reaching the job's group would send
    time.sleep(IGNORED_FOR_S)  # longer than a terminal's Ctrl-C takes to stop a fuzz unloaded (above)
    assert fuzz.proc.poll() is None, "SIGINT ignored on entry stopped the fuzz or its shrinking worker"
    _, code, data = fuzz.interrupt(signal.SIGTERM)
    assert code == 1 and data["interrupted"] is True
    assert MoEConfig.from_dict(data["config"]).hidden > 256


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="Ray and /proc: Linux")
def test_a_ctrl_c_to_the_group_stops_a_two_worker_fuzz_and_its_local_ray_runtime(tmp_path):
    """--workers 2 starts a local Ray runtime; a terminal's Ctrl-C reaches the fuzz, Ray's processes
    and the tasks at once: the fuzz still stops with the smallest failure found (exit 1), no
    traceback, and no process it started outlives it."""
    (tmp_path / "hangs.py").write_text(HANGS_ON_WIDE_HIDDEN)
    fuzz = Fuzz(tmp_path, tmp_path / "db", "--workers", "2")
    fuzz.wait_for(SHRINKING, timeout=SUBPROCESS_HANG_S)
    _, code, data = fuzz.interrupt(signal.SIGINT, group=True)
    assert code == 1 and data["interrupted"] is True
    assert MoEConfig.from_dict(data["config"]).hidden > 256
    assert processes_left(f"DIFFMOE_TEST_MARK={fuzz.mark}") == []
