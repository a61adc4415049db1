"""The fuzzer's example database wrapper: interrupted shrinks resume instead of passing as minimal.

A database replay resumes shrinking. Hypothesis saves every new smallest failure under its
primary key and takes a failure replayed from there as already shrunk (it skips the shrink
phase). A run that ends before its shrink does (Ctrl-C, SIGTERM, a kill) would so leave an
unshrunk failure that every later run replays and reports as minimal. `ResumingDatabase`
therefore marks the primary entries as shrunk when a run's shrink completes, and at the start
of a run moves unmarked primary entries to Hypothesis's secondary key: they are replayed
first all the same, and then shrunk on (Phase.reuse, then Phase.shrink).

Owns the database keys diffmoe adds. Must not run examples.
"""

from __future__ import annotations

from hypothesis.database import ExampleDatabase

SHRUNK_MARK = b".diffmoe-shrunk"
_HYPOTHESIS_SUB_KEYS = (b".secondary", b".pareto", SHRUNK_MARK)


class ResumingDatabase(ExampleDatabase):
    """The user's database, with unshrunk primary entries moved aside (see the module doc).

    Hypothesis's primary keys are the test digests; its sub keys append ".secondary" and
    ".pareto"; the marks of entries whose shrink completed live under ".diffmoe-shrunk".
    """

    def __init__(self, inner: ExampleDatabase) -> None:
        super().__init__()
        self.inner = inner
        self.primary_keys: list[bytes] = []

    def __repr__(self) -> str:
        return f"ResumingDatabase({self.inner!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ResumingDatabase) and self.inner == other.inner

    __hash__ = object.__hash__

    def _note_primary(self, key: bytes) -> None:
        if key.endswith(_HYPOTHESIS_SUB_KEYS) or key in self.primary_keys:
            return
        self.primary_keys.append(key)
        shrunk = set(self.inner.fetch(key + SHRUNK_MARK))
        for value in list(self.inner.fetch(key)):
            if value not in shrunk:  # replayed from the secondary key, then shrunk on
                self.inner.move(key, key + b".secondary", value)

    def fetch(self, key: bytes):
        self._note_primary(key)
        return self.inner.fetch(key)

    def save(self, key: bytes, value: bytes) -> None:
        self._note_primary(key)
        self.inner.save(key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.inner.move(src, dest, value)

    def mark_shrunk(self) -> None:
        """The run's shrink completed: its primary entries are minimal; drop stale marks."""
        for key in self.primary_keys:
            current = set(self.inner.fetch(key))
            for value in current:
                self.inner.save(key + SHRUNK_MARK, value)
            for value in set(self.inner.fetch(key + SHRUNK_MARK)) - current:
                self.inner.delete(key + SHRUNK_MARK, value)
