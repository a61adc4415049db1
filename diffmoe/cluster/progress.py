"""Progress of long runs on stderr: a live bar on a terminal, plain lines otherwise.

The one interface every long run reports through (`diffmoe fuzz`, `diffmoe compile-check` and its
`--sweep`, `diffmoe museum`, bench/false_alarm_campaign.py, bench/compile_sweep.py):

    with Progress(sys.stderr, "museum", total=9, unit="release") as progress:
        for ...:
            ...
            progress.update(done, detail="stale-ep-rows vllm==0.30.0: as recorded")

`done` counts the items finished so far (a count, not an increment; `advance()` adds one); `total`
may be None, unknown (the fuzz's shrink phase). A `phase` that differs from the previous update's
starts a new count: on a terminal the bar so far is left on screen and a new one, labelled
"LABEL (PHASE)", counts from there.

On a terminal (`live_terminal`: stream.isatty(), TERM is not "dumb" and NO_COLOR is unset) a tqdm
bar, rewritten in place by carriage returns on every update and left on screen when it closes:

    museum:  33%|###3      | 3/9 releases [00:41 elapsed, 01:22 left, 13.7 s/release]  stale-ep-rows ...
    fuzz (shrink): 12 examples [00:09 elapsed, 1.3 examples/s]  T=1 E=1 ...

The rate is the mean since the count (or its phase) started, measured at the last update, and reads
as seconds per item when an item takes a second or more (they mostly do here), else items per
second; time left is what the remaining items take at that rate, shown only with a total.

Otherwise plain lines, each ended by a newline, never a carriage return: with each=True one per
update (items that take seconds), with each=False one at each change of phase and then at most one
every `interval` seconds (the fuzz, whose examples may take milliseconds). The default line reads

    museum: 3/9 releases  00:41 elapsed  13.7 s/release  01:22 left  stale-ep-rows vllm==0.33.0 ...

and a caller whose lines are parsed gives its own (`line=`): the fuzz keeps
"fuzz: N examples  phase=P  S s  <config>" byte for byte (tests/frontends/test_robustness_cli.py reads it).

With json_lines=True (the commands' --json, whose stdout holds the result alone) every line is one
JSON object instead, written when a plain line would be, and one more when the run closes:

    {"progress": "museum", "phase": null, "done": 3, "total": 9, "unit": "release", "elapsed_s": 41.2,
     "detail": "stale-ep-rows vllm==0.33.0: as recorded", "closed": false}

`done` and `elapsed_s` count from the phase's start, as the bar does; a program reading stderr line
by line follows a long run (or a cluster's tasks as they finish) without parsing a bar.

tqdm is imported only when a bar is drawn; its monitor thread is off (fuzz workers, check workers
and compilers are forked while a bar is open, and a forked child must not inherit a running thread).

Owns how progress looks and when it is written. Must not touch stdout, a result or a verdict: it
writes only to the stream it is given (and `write()` prints a caller's own line where the caller
says, clearing the bar around it); its clock decides only when to write and what the rate reads.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Callable, TextIO

PLAIN_INTERVAL_S = 10.0  # each=False: seconds between plain lines within a phase
_KEEP = object()  # update(total=...) not given: the total stays
_ROWS = 1000  # the screen rows tqdm is told of: one bar is drawn, always on the cursor's row

# {desc}, {units}, {pace}, {left}, {detail} are Progress's own (see _bar_class); the rest is tqdm's
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {units} [{elapsed} elapsed, {left} left, {pace}]{detail}"
BAR_FORMAT_NO_TOTAL = "{desc}: {n_fmt} {units} [{elapsed} elapsed, {pace}]{detail}"


def live_terminal(stream: TextIO) -> bool:
    """Whether `stream` gets a live bar: a terminal (isatty), TERM not "dumb", NO_COLOR unset or
    empty (a request for plain output is honoured as one for no colour would be)."""
    if os.environ.get("TERM") == "dumb" or os.environ.get("NO_COLOR"):
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):  # no isatty, or a closed stream
        return False


def terminal_columns(stream: TextIO) -> int | None:
    """The width of the terminal `stream` writes to, asked at each draw (a resized window); else
    $COLUMNS; None when neither says (a terminal reporting 0 columns, as a bare pty does: the line
    is then not cut)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = int(os.environ.get("COLUMNS", ""))
        except ValueError:
            columns = 0
    return columns if columns > 0 else None


def format_seconds(seconds: float) -> str:
    """mm:ss, or h:mm:ss from an hour on (as tqdm writes elapsed time)."""
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def plural(unit: str) -> str:
    return unit if unit.endswith("s") else unit + "s"


def units(unit: str, done: int, total: int | None) -> str:
    """"1 example" alone, "1/10 examples" and "3 examples"."""
    return unit if done == 1 and total is None else plural(unit)


def pace(done: int, seconds: float, unit: str) -> str:
    """The mean rate of `done` items in `seconds`: "13.7 s/config" when an item takes a second or
    more, else "4.2 configs/s"; "? s/config" before the first item."""
    if done <= 0 or not seconds > 0:
        return f"? s/{unit}"
    per_item = seconds / done
    return f"{per_item:.1f} s/{unit}" if per_item >= 1 else f"{done / seconds:.1f} {plural(unit)}/s"


def time_left(done: int, total: int | None, seconds: float) -> str:
    """The remaining items at the mean rate so far ("01:22"), "?" before the first item."""
    if total is None:
        return "?"
    if done >= total:
        return format_seconds(0)
    if done <= 0 or not seconds > 0:
        return "?"
    return format_seconds((total - done) * seconds / done)


def _check_count(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0{' or None' if allow_none else ''}, got {value!r}")


class Progress:
    """One long run's progress on `stream` (module doc). Use as a context manager, or call close()."""

    def __init__(self, stream: TextIO, label: str, total: int | None = None, *, unit: str = "item",
                 each: bool = True, interval: float = PLAIN_INTERVAL_S, phase: str | None = None,
                 live: bool | None = None, json_lines: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(label, str) or not label:
            raise ValueError(f"label must be a non-empty string, got {label!r}")
        if not isinstance(unit, str) or not unit:
            raise ValueError(f"unit must be a non-empty string, got {unit!r}")
        _check_count("total", total, allow_none=True)
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 <= interval < math.inf:
            raise ValueError(f"interval must be a number of seconds >= 0, got {interval!r}")
        self.stream, self.label, self.unit, self.each, self.interval = stream, label, unit, bool(each), float(interval)
        self.json_lines = bool(json_lines)
        self.live = False if self.json_lines else live_terminal(stream) if live is None else bool(live)
        self._clock = clock
        self.total = total
        self.phase = phase
        self.done = 0
        self.detail = ""
        self._phase_start = self._last_line = self._updated_at = clock()
        self._phase_base = 0  # done at the start of the phase: the count shown starts there
        self._bar_updates = 0  # draws of the current bar (one never drawn is relabelled at a new phase)
        self._bar = self._open_bar() if self.live else None
        self.closed = False

    # ---- the interface -----------------------------------------------------------------------

    def update(self, done: int, *, detail: str = "", phase=_KEEP, total=_KEEP, line: str | None = None) -> None:
        """`done` items finished; `detail` (what was last done or is under way) follows the counts;
        a `phase` unlike the last starts a new count from `done`; `total` changes the total (None:
        unknown); `line` is the plain line to write if one is due (default: `plain_line()`)."""
        if self.closed:
            raise ValueError(f"update on a closed Progress ({self.label})")
        _check_count("done", done)
        if total is not _KEEP:
            _check_count("total", total, allow_none=True)
        now = self._clock()
        new_phase = phase is not _KEEP and phase != self.phase
        if new_phase:
            self._start_phase(phase, done, now, self.total if total is _KEEP else total)
        elif total is not _KEEP:
            self.total = total
        if self.total is not None and done - self._phase_base > self.total:
            self.total = done - self._phase_base  # more than announced (a fuzz's database replay): the count is right
        self.done, self.detail, self._updated_at = done, str(detail), now
        if self._bar is not None:
            self._draw()
        elif self.each or new_phase or now - self._last_line >= self.interval:
            self._write_line(self.json_line() if self.json_lines else self.plain_line() if line is None else line)
            self._last_line = now

    def advance(self, count: int = 1, *, detail: str = "", line: str | None = None) -> None:
        """update(done + count)."""
        _check_count("count", count)
        self.update(self.done + count, detail=detail, line=line)

    def plain_line(self) -> str:
        """"LABEL: 3/9 releases  00:41 elapsed  13.7 s/release  01:22 left  DETAIL" (no total: no
        "/9" and no time left)."""
        done, total, seconds = self.done - self._phase_base, self.total, self._updated_at - self._phase_start
        label = self.label if self.phase is None else f"{self.label} ({self.phase})"
        count = f"{done}/{total}" if total is not None else f"{done}"
        parts = [f"{label}: {count} {units(self.unit, done, total)}", f"{format_seconds(seconds)} elapsed",
                 pace(done, seconds, self.unit)]
        if total is not None:
            parts.append(f"{time_left(done, total, seconds)} left")
        if self.detail:
            parts.append(self.detail)
        return "  ".join(parts)

    def json_line(self, closed: bool = False) -> str:
        """The state as one JSON object (module doc)."""
        return json.dumps({"progress": self.label, "phase": self.phase, "done": self.done - self._phase_base,
                           "total": self.total, "unit": self.unit,
                           "elapsed_s": round(self._updated_at - self._phase_start, 3), "detail": self.detail,
                           "closed": closed})

    def write(self, text: str, file: TextIO | None = None) -> None:
        """Print one line of the caller's own on `file` (default: the progress stream), the live bar
        cleared before and drawn again after, so the two do not run into each other."""
        out = self.stream if file is None else file
        if self._bar is not None:
            self._bar.clear()
        out.write(text + "\n")
        out.flush()
        if self._bar is not None:
            self._draw()

    def close(self, done: int | None = None, detail: str | None = None) -> None:
        """End the run: with `done` (and `detail`), the final state, drawn on a terminal; no plain
        line is written (with json_lines, one last JSON line, "closed": true). The bar stays on
        screen. A second close does nothing."""
        if self.closed:
            return
        if done is not None:
            _check_count("done", done)
            self.done, self._updated_at = done, self._clock()
            if self.total is not None and done - self._phase_base > self.total:
                self.total = done - self._phase_base
        if detail is not None:
            self.detail = str(detail)
        if self._bar is not None:
            self._draw(refresh=False)
            self._bar.close()  # draws the final state once more and ends the line
            self._bar = None
        elif self.json_lines:
            self._write_line(self.json_line(closed=True))
        self.closed = True

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the bar ------------------------------------------------------------------------------

    def _start_phase(self, phase, done: int, now: float, total: int | None) -> None:
        # the last phase's bar stays on screen as it was last drawn; one never drawn since it
        # opened is relabelled instead, not left behind as a stray empty line
        leave = self._bar is not None and self._bar_updates > 0
        if leave:
            self._bar.close()  # draws its final state (the last update's): before the counts below change
        self.phase, self.total, self.done, self.detail = phase, total, done, ""
        self._phase_base, self._phase_start = done, now
        if leave:
            self._bar = self._open_bar()
        elif self._bar is not None:
            self._bar.set_description_str(self._desc(), refresh=False)
            self._bar.total = total

    def _desc(self) -> str:
        return self.label if self.phase is None else f"{self.label} ({self.phase})"

    def _open_bar(self):
        self._bar_updates = 0
        # nrows given: tqdm hides a bar below the screen's last row, and a terminal reporting no size
        # (a bare pty) would hide the only one; the width is asked at each draw (_figures)
        return _bar_class()(self, total=self.total, desc=self._desc(), unit=self.unit, file=self.stream, leave=True,
                            mininterval=0, miniters=1, bar_format=BAR_FORMAT, nrows=_ROWS)

    def _draw(self, refresh: bool = True) -> None:
        bar = self._bar
        bar.total = self.total
        bar.n = bar.last_print_n = self.done - self._phase_base
        if refresh:
            bar.refresh()
            self._bar_updates += 1

    def _figures(self) -> dict[str, str | float]:
        """The fields the bar's format adds to tqdm's, from this object's own clock and counts."""
        done, seconds = self.done - self._phase_base, self._updated_at - self._phase_start
        return {
            "units": units(self.unit, done, self.total), "pace": pace(done, seconds, self.unit),
            "left": time_left(done, self.total, seconds), "detail": f"  {self.detail}" if self.detail else "",
            "elapsed": self._clock() - self._phase_start,
            "bar_format": BAR_FORMAT if self.total is not None else BAR_FORMAT_NO_TOTAL,
            "ncols": terminal_columns(self.stream),
        }

    def _write_line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


_BAR_CLASS = None


def _bar_class():
    """tqdm with the monitor thread off and Progress's own fields in its format (made on first use:
    a run that draws no bar does not import tqdm)."""
    global _BAR_CLASS
    if _BAR_CLASS is None:
        from tqdm import tqdm

        class _Bar(tqdm):
            monitor_interval = 0  # no thread: workers are forked while a bar is open

            def __init__(self, owner: Progress, **kwargs) -> None:
                self._owner = owner
                super().__init__(**kwargs)

            @property
            def format_dict(self):
                figures = super().format_dict
                owner = getattr(self, "_owner", None)
                if owner is not None:
                    figures.update(owner._figures())
                return figures

        _BAR_CLASS = _Bar
    return _BAR_CLASS
