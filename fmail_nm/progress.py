"""Progress of the long passes, as lines another process can read back.

The post-new pass (tagging, blocklist, sidecar) runs inside ``notmuch new``'s post-new hook,
whose output goes to the terminal notmuch new was given.  ``fmail-nm index`` and ``init`` run
notmuch new on a pseudo-terminal to draw one progress bar, and set ``FMAIL_PROGRESS=1`` for it;
the passes then report through :func:`report_progress`, which writes to stderr one line per
update in this format (one line, ``\\n``-terminated)::

    fmail-nm progress: <phase> <done>/<total>

``<phase>`` is a short lowercase name (``tagging``, ``blocklist``, ``sidecar``, ...), ``<done>``
and ``<total>`` are counts of messages (``total`` 0: not known).  The reader
(:mod:`fmail_nm.service.index`) parses these with :func:`parse_progress`, next to notmuch's own
"Processed N of M files", and draws them as one bar.  Without ``FMAIL_PROGRESS`` -- a notmuch
new the user runs, the watcher -- nothing is written.

A pass takes an optional callback of type :data:`ProgressCallback`, ``on_progress(phase, done,
total)``: the hook passes :func:`from_environment` (the line writer, or None), ``run_index``
passes its display.  Dependency-free on purpose: the hook loads it after every ``notmuch new``.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from typing import TextIO

ProgressCallback = Callable[[str, int, int], None]
"""``on_progress(phase, done, total)``: ``done`` of ``total`` items of ``phase`` are done."""

ENV = "FMAIL_PROGRESS"  # "1": the hook's passes write progress lines to stderr
PREFIX = "fmail-nm progress:"

# The phases.  notmuch's own are named by the reader: "counting" (the first run counts the
# files), "indexing" (notmuch new adding them).
COUNTING = "counting"
INDEXING = "indexing"
TAGGING = "tagging"
BLOCKLIST = "blocklist"
SIDECAR = "sidecar"
RECIPIENTS = "recipients"

MAX_PHASE = 20
MAX_DIGITS = 12
INTERVAL = 0.2  # seconds between two lines of one phase (its first and last always go out)

_PHASE = re.compile(rf"[a-z][a-z0-9-]{{0,{MAX_PHASE - 1}}}")
_LINE = re.compile(rf"{re.escape(PREFIX)} ({_PHASE.pattern}) (\d{{1,{MAX_DIGITS}}})"
                   rf"/(\d{{1,{MAX_DIGITS}}})(?![\w/])")
_STRIP = re.compile(rf"{re.escape(PREFIX)}[^\r\n]*(?:\r\n|\r|\n)?")


def format_progress(phase: str, done: int, total: int) -> str:
    """One progress line, ``fmail-nm progress: tagging 1200/6044`` and a newline.  Raises
    ValueError for a phase name or count the reader would not accept."""
    if not _PHASE.fullmatch(phase):
        raise ValueError(f"progress phase must match {_PHASE.pattern}: {phase!r}")
    if not (0 <= done < 10 ** MAX_DIGITS and 0 <= total < 10 ** MAX_DIGITS):
        raise ValueError(f"progress counts out of range: {done}/{total}")
    return f"{PREFIX} {phase} {done}/{total}\n"


def parse_progress(line: str) -> tuple[str, int, int] | None:
    """``(phase, done, total)`` from a line :func:`format_progress` wrote (terminal noise around
    it allowed), or None for any other line."""
    match = _LINE.search(line)
    if match is None:
        return None
    return match.group(1), int(match.group(2)), int(match.group(3))


def strip_progress(text: str) -> str:
    """``text`` without its progress lines (for output shown to a person)."""
    return _STRIP.sub("", text)


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the process that started us asked for progress lines."""
    return (os.environ if environ is None else environ).get(ENV) == "1"


class LineReporter:
    """A :data:`ProgressCallback` writing progress lines to a stream: a phase's first and last
    update always, the ones between at most every ``interval`` seconds.  Never raises: a bad
    value or a closed stream loses a line, not the pass."""

    def __init__(self, stream: TextIO | None = None, *, interval: float = INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream  # None: sys.stderr at the time of writing
        self.interval = interval
        self.clock = clock
        self._phase: str | None = None
        self._last = 0.0

    def __call__(self, phase: str, done: int, total: int) -> None:
        now = self.clock()
        first = phase != self._phase
        if not (first or done >= total or now - self._last >= self.interval):
            return
        try:
            line = format_progress(phase, done, total)
        except ValueError:
            return
        self._phase, self._last = phase, now
        stream = self.stream or sys.stderr
        try:
            stream.write(line)
            stream.flush()
        except (OSError, ValueError):  # a closed terminal or stream
            pass


_reporter = LineReporter()


def report_progress(phase: str, done: int, total: int) -> None:
    """Write a progress line to stderr, throttled -- only when ``FMAIL_PROGRESS=1`` asks for
    it; otherwise do nothing.  A :data:`ProgressCallback`."""
    if wanted():
        _reporter(phase, done, total)


def from_environment() -> ProgressCallback | None:
    """The callback for the hook's passes: :func:`report_progress` when the environment asks
    for progress lines, else None (the passes then skip reporting altogether)."""
    return report_progress if wanted() else None
