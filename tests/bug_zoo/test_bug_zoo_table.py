"""tests/support/make_bug_zoo_table.py, the bug-zoo sweep: its mutants run as tasks (diffmoe/cluster/tasks.py)
give the same table in this process and as Ray tasks on a local runtime, and its usage errors exit 2
before any run."""

from __future__ import annotations

import pytest

import fresh_process
import make_bug_zoo_table as table

CHEAP = ["dropped-router-weight", "native-fp8-cast"]  # one check each, T=1 E=2 (docs/bug-zoo.md)


@pytest.mark.parametrize("argv, says", [(["--workers", "0"], "--workers must be in [1, 256], got 0"),
                                        (["--workers", "2", "--cluster", "remote"], "--cluster remote: expected local")])
def test_bad_workers_or_cluster_exit_2_before_any_run(argv, says, capsys, monkeypatch):
    monkeypatch.setattr(table, "run_all", lambda *a, **k: pytest.fail("a mutant ran"))
    assert table.main(argv) == 2
    assert says in capsys.readouterr().err


@pytest.mark.slow  # four checks and a local Ray start: about 40 s on 2 loaded cores
def test_two_workers_on_a_local_ray_runtime_give_the_in_process_table():
    here = table.render_table(table.run_all(names=CHEAP))
    # the Ray half in a fresh interpreter (tests/support/fresh_process.py says why)
    done = fresh_process.run(["-c", "import make_bug_zoo_table as t; "
                              f"print(t.render_table(t.run_all(names={CHEAP!r}, workers=2)), end='')"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == here
    assert "mutation score: 2 of 2 mutants caught" in here and "none (survived)" not in here
