"""The execution layer of long runs on Ray (issue 31): `tasks` (independent tasks run in process or as
Ray tasks, results streamed back, lost tasks retried, Ctrl-C), `runtime` (the `--cluster` spec, Ray
started or joined, what a task asks), `board` (the state a run's tasks share with the process that
started them), `interrupts` (signals noted while a run waits), `progress` (a long run's progress on stderr: a bar
on a terminal, a line per item otherwise, JSON lines with --json).

Owns where tasks run. Must not know what a task does: the fuzz's tasks are diffmoe/fuzz/workers.py's,
the tuned-config sweep's diffmoe/tuned_configs/sweep.py's.
"""
