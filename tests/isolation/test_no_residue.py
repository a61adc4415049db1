"""No residue (diffmoe/isolation/zygote.py): a command leaves nothing in the temporary folder.

Each check's candidate runs under a zygote with a folder of its own (its TMPDIR, where its
socket lives). Seen: 991 `diffmoe-candidate-*` folders and 290 `pymp-*` folders (the forked
zygote's listener) left in /tmp by one day of test runs; a machine that runs diffmoe in a loop
fills its /tmp. Both ways a zygote starts are held here: inside the OS boundary (bwrap, a fresh
interpreter) and without it (forked from the CLI's process).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from diffmoe.isolation import boundary
from hang_bounds import SUBPROCESS_HANG_S

CHECK = ["check", "--tokens", "2", "--experts", "2", "--topk", "1", "--hidden", "16", "--inter", "16",
         "--quant", "fp8-tensor", "--fused"]


@pytest.mark.parametrize("bounded", [True, False], ids=["os-boundary", "no-boundary"])
def test_a_check_leaves_nothing_in_the_temporary_folder(tmp_path, bounded):
    if bounded and boundary.available() is not None:
        pytest.skip(f"the OS boundary is not available here: {boundary.available()}")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch))
    env.pop(boundary.OFF_ENV, None)
    if not bounded:
        env[boundary.OFF_ENV] = "1"
    done = subprocess.run([sys.executable, "-m", "diffmoe", *CHECK], capture_output=True, text=True, env=env,
                          timeout=SUBPROCESS_HANG_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(os.listdir(scratch)) == []


def test_a_python_programs_checks_leave_nothing_when_it_exits(tmp_path):
    """The API's way: a program that imported the reference starts a fresh-interpreter zygote,
    stopped (and its folder removed) when the program exits."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    program = ("from diffmoe.judge.runner import run_differential\n"
               "from diffmoe.problem.config import MoEConfig\n"
               "from optimized.moe import TritonFP8MoE\n"
               "config = MoEConfig(num_tokens=2, num_experts=2, topk=1, hidden=16, inter=16, quant='fp8-tensor')\n"
               "assert run_differential(config, TritonFP8MoE, isolation='process').passed\n")
    env = dict(os.environ, TMPDIR=str(scratch))
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env,
                          timeout=SUBPROCESS_HANG_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(os.listdir(scratch)) == []


def test_a_killed_judges_folder_is_removed_by_the_next_judge(tmp_path, monkeypatch):
    """A judge killed with SIGKILL cannot remove its folder (inside the boundary its zygote dies
    with it): the next folder made in the same temporary folder removes it, and nothing of a live
    judge or of another pid namespace."""
    monkeypatch.setattr(boundary.tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    namespace = boundary._pid_namespace()
    if not namespace:
        pytest.skip("no /proc/self/ns/pid here: nothing is swept")
    dead = tmp_path / f"diffmoe-candidate-{namespace}-{dead_pid}-abc"
    live = tmp_path / f"diffmoe-candidate-{namespace}-{os.getpid()}-def"
    other = tmp_path / f"diffmoe-candidate-{namespace + 1}-{dead_pid}-ghi"
    for folder in (dead, live, other):
        folder.mkdir()
        (folder / "zygote").write_text("")
    made = boundary.candidate_folder()
    try:
        left = sorted(p.name for p in tmp_path.iterdir())
        assert dead.name not in left and live.name in left and other.name in left, left
    finally:
        os.rmdir(made)
