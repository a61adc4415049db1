"""The board a run's Ray tasks share with the process that started them: one Ray actor.

Each task writes on it when it starts (its index, process id and node: a task started twice was
retried after its process or node was lost) and as it progresses; the starting process reads it
to stream progress and posts named stops on it: `interrupt` (the user's Ctrl-C or SIGTERM, posted
by diffmoe/cluster/tasks.py) and any a run's caller posts (the fuzz's `stop_generating`: a first
failure was met, searches still generating end, a shrink goes on). Tasks read the stops each time
they report (the fuzz: at every example), so no signal is sent into a task, whose interrupt could
land inside Hypothesis's own setup and trip its internal assertions (seen with the process pool the
fuzz had before these tasks).

Owns the shared state of one run's tasks. Must not know what the tasks do.
"""

from __future__ import annotations


class Board:
    """The actor's class (made a Ray actor by `start_board`)."""

    def __init__(self) -> None:
        self.starts: dict[int, list[tuple[int, str]]] = {}  # index -> [(pid, node id)] per attempt
        self.progress: dict[int, tuple] = {}  # index -> the task's last progress payload
        self.stops: dict[str, bool] = {}  # the stops posted: name -> True

    def started(self, index: int, pid: int, node: str) -> int:
        """A task's attempt begins; returns its attempt number (1 for the first)."""
        self.starts.setdefault(index, []).append((pid, node))
        return len(self.starts[index])

    def report(self, index: int, payload: tuple) -> dict:
        """A task's progress; returns the stops, read in the same round trip."""
        self.progress[index] = payload
        return dict(self.stops)

    def stop(self, name: str) -> None:
        self.stops[name] = True

    def snapshot(self) -> dict:
        return {"starts": {i: list(s) for i, s in self.starts.items()}, "progress": dict(self.progress),
                "stops": dict(self.stops)}


def start_board(ray):
    """A Board actor on the connected cluster. It asks for no CPU: it only holds a few numbers, and a
    CPU reserved for it would be one task fewer at a time."""
    return ray.remote(num_cpus=0)(Board).remote()
