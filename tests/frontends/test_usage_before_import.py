"""Every argument check comes before the implementation loads (issue 48: `diffmoe fuzz ... --seed 1
--database DIR` was refused only after the kernel's import, 27 s under load).

The `--impl` of each case is a module written for the test that leaves a marker file when it is
imported (in this process or in the candidate's, which inherits PYTHONPATH): each command given a
bad argument beside it must exit 2 with one line, and the marker must not exist. Every command that
loads an `--impl` is covered (check, in process and isolated; fuzz; plan; numerics fit;
compile-check; tuned-configs). museum runs only the pinned releases of its table, in its tasks,
after its checks; demo and doctor take no --impl.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from diffmoe.frontends import cli
from hang_bounds import SUBPROCESS_HANG_S

SMALL = ["--tokens", "1", "--experts", "1", "--topk", "1", "--hidden", "16", "--inter", "16", "--quant", "fp8-tensor"]

MARKS_ITS_IMPORT = '''
import pathlib

pathlib.Path({marker!r}).write_text("imported")


def factory(config):
    from optimized import make_implementation

    return make_implementation(config)
'''

# (argv with IMPL and TMP standing for the module's spec and the test's folder, what the line names)
CASES = {
    "check-device": (["check", *SMALL, "--impl", "IMPL", "--isolation", "none", "--device", "nonsense"], "--device"),
    "check-isolated-device": (["check", *SMALL, "--impl", "IMPL", "--device", "nonsense"], "--device"),
    "fuzz-seed-and-database": (["fuzz", "--impl", "IMPL", "--isolation", "none", "--seed", "1", "--database", "TMP/db"],
                               "--seed and --database cannot be combined"),
    "fuzz-seed-and-database-two-workers": (["fuzz", "--impl", "IMPL", "--workers", "2", "--seed", "1",
                                            "--database", "TMP/db"], "--seed and --database cannot be combined"),
    "fuzz-database-url": (["fuzz", "--impl", "IMPL", "--isolation", "none", "--database", "redis://h:70000/0"], "port"),
    "fuzz-save-failure": (["fuzz", "--impl", "IMPL", "--isolation", "none", "--save-failure", "TMP/missing/f.json"],
                          "--save-failure"),
    "fuzz-device": (["fuzz", "--impl", "IMPL", "--isolation", "none", "--device", "nonsense"], "--device"),
    "fuzz-runtime-env": (["fuzz", "--impl", "IMPL", "--workers", "2", "--runtime-env", "[1]"], "--runtime-env"),
    "plan-png": (["plan", *SMALL, "--impl", "IMPL", "--png", "TMP/missing/plan.png"], "--png"),
    "numerics-fit-device": (["numerics", "fit", "--impl", "IMPL", "--device", "nonsense"], "--device"),
    "compile-check-tile-class": (["compile-check", *SMALL, "--impl", "IMPL", "--tile-class", "bogus"], "--tile-class"),
    "tuned-configs-config-dir": (["tuned-configs", "--impl", "IMPL", "--config-dir", "TMP/missing"], "--config-dir"),
    "tuned-configs-resume": (["tuned-configs", "--impl", "IMPL", "--resume", "TMP"], "--resume"),
}


@pytest.fixture
def marked_impl(tmp_path, monkeypatch):
    """(the spec of a module that leaves tmp_path/imported when imported, the marker's path)."""
    marker = tmp_path / "imported"
    name = f"marks_its_import_{uuid.uuid4().hex}"  # never in sys.modules already
    (tmp_path / f"{name}.py").write_text(MARKS_ITS_IMPORT.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    # compile-check sets TRITON_INTERPRET=0 for its compiles: restored after the test
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))
    return f"{name}:factory", marker


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_argument_is_refused_before_the_implementation_loads(marked_impl, tmp_path, capsys, case):
    spec, marker = marked_impl
    argv, named = CASES[case]
    argv = [spec if a == "IMPL" else a.replace("TMP", str(tmp_path)) for a in argv]
    code = cli.main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == cli.EXIT_USAGE, captured.err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("diffmoe") and named in lines[0], lines
    assert not marker.exists(), f"{case}: the implementation was imported before the argument was refused"


def test_the_marker_shows_an_import(marked_impl, capsys):
    """The check above can fail: a valid command imports the module, and the marker appears."""
    spec, marker = marked_impl
    assert cli.main(["plan", *SMALL, "--impl", spec]) == cli.EXIT_OK, capsys.readouterr().err
    assert marker.exists()


HEAVY = ("ray", "triton", "optimized", "reference", "diffmoe.judge.runner", "diffmoe.isolation.client")


def test_a_refused_fuzz_imports_neither_ray_nor_a_kernel(tmp_path):
    """The issue's command with two workers: refused before Ray is imported to check the cluster
    (it was imported first) and before any kernel module, in a fresh process."""
    code = ("import sys\nfrom diffmoe.frontends import cli\n"
            f"status = cli.main(['fuzz', '--workers', '2', '--seed', '1', '--database', {str(tmp_path / 'db')!r}])\n"
            f"print(status, sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SUBPROCESS_HANG_S)
    assert done.stdout.split(" ", 1) == [str(cli.EXIT_USAGE), "[]\n"], (done.stdout, done.stderr[-2000:])
    assert done.stderr.strip().splitlines() == [
        "diffmoe: error: --seed and --database cannot be combined: a seeded run is reproducible and replays no stored failure"]
