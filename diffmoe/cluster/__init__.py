"""The execution layer of long runs on Ray (issue 31): `runtime` (the `--cluster` spec, Ray started or
joined, what a task asks), `board` (the state a run's tasks share with the process that started them).

Owns where tasks run. Must not know what a task does: the fuzz's tasks are diffmoe/fuzz/cluster_workers.py's.
"""
