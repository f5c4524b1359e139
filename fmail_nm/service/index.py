"""``fmail-nm index``: ``notmuch new`` (hooks included), then the post-new pass
(:func:`fmail_nm.passes.post_new.post_new`) in this process -- our hook leaves it to us when
asked (``PASS_AFTER_ENV``), so an index run starts one Python, not two -- then a summary.
Before ``notmuch new``, fmail-nm indexes new mail itself where it can, each message written
once with its final tags: an empty database whole (:mod:`fmail_nm.passes.first_index`),
otherwise the files delivered into ``new/`` since the last run (:mod:`fmail_nm.passes.delivery`).

On a terminal, one progress line covers the whole run: notmuch's own phase (it prints
"Processed N of M files" only to a terminal, so notmuch new runs on a pseudo-terminal) and ours
(the pass run here, through a callback; a hook of an earlier version that still runs the pass
inside notmuch new is asked for its progress lines with ``FMAIL_PROGRESS=1``, see
:mod:`fmail_nm.progress`), each drawn as
``indexing [#####.....] 1200/6044 files, 310/s, 16 s left``.  Not on a terminal: no bar, no
carriage returns.
"""

from __future__ import annotations

import logging
import math
import re
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, TypeVar

from .. import progress
from ..adopt.hooks import defers_pass, is_ours, kept_hook, legacy_kept_hook
from ..config import Config
from ..passes import DELIVERY_MIN_FILES, NEW_SINCE_ENV, PASS_AFTER_ENV
from ..passes.prefetch import Prefetch
from ..store import maildir, sidecar
from ..store.notmuch import AddedFiles, NotmuchAccessError, Reader, Writer, write_lock_held
from ..store.notmuch_cli import run_notmuch_new
from .mbsync import MBSYNC_TIMEOUT, ChannelBusy, wait_for_channels

if TYPE_CHECKING:  # the passes are imported while notmuch new runs (see run_index)
    from ..passes.first_index import FirstIndex
    from ..passes.tagging import TaggingReport

T = TypeVar("T")
log = logging.getLogger(__name__)

# What notmuch new prints on a terminal (notmuch-new.c), as (phase, done, total) with total 0
# for "not known".  The first run counts the files ("Found 3000 files so far.", then "Found 6044
# total files"); progress comes once a second ("Processed 1200 of 6044 files (16s remaining).",
# without "of M" on later runs); the last line is "Processed 6044 total files in 38s ..." (or
# "Processed 1 file in ...").
_COUNTING = re.compile(r"Found (\d{1,12}) files so far")
_FOUND = re.compile(r"Found (\d{1,12}) total files?")
_FINISHED = re.compile(r"Processed (\d{1,12}) (?:total files|file) in")
_PROCESSED = re.compile(r"Processed (\d{1,12})(?: of (\d{1,12}))? files?")
_ADDED = re.compile(r"Added (\d+) new messages?")


@dataclass(frozen=True)
class IndexSummary:
    added: int
    total: int
    counts: dict[str, int]
    tagging: TaggingReport
    notmuch_output: str
    parsed_ahead: int = 0  # new files parsed while notmuch new ran (passes.prefetch)
    first_index: bool = False  # fmail-nm indexed the empty database itself (passes.first_index)
    delivered: int = 0  # new messages fmail-nm indexed itself before notmuch new (passes.delivery)

    def describe(self) -> str:
        """One line for a person: ``indexed: 3 new, 169 messages in all (inbox 98, ...)``."""
        counts = ", ".join(f"{tag} {n}" for tag, n in self.counts.items())
        return f"indexed: {self.added} new, {self.total} messages in all ({counts})"


class IndexingFailed(NotmuchAccessError):
    """notmuch new failed; the message carries its output.  (A NotmuchAccessError, so a
    :class:`~fmail_nm.errors.BackendError`: the request was fine, the machinery failed.)"""


class IndexingStopped(IndexingFailed):
    """notmuch new was stopped at the service's shutdown: it kept what it indexed, and the
    next start indexes the rest -- no failure to report."""


# How long a write waits for the re-index it asks for (mbsync renamed a file it names).
REINDEX_TIMEOUT = 60.0
# How long `fmail-nm index` and init wait for an mbsync run of ours before indexing: as long
# as such a run may last before it is stopped, so a big pull is waited out, not given up on.
SYNC_WAIT_TIMEOUT = MBSYNC_TIMEOUT
# A run that takes longer is stopped and reported: almost always a write lock another program
# holds (notmuch new waits silently for it).  Generous, because a big first pull takes a while.
INDEX_TIMEOUT = 1200.0

UNITS = {progress.COUNTING: "files", progress.INDEXING: "files"}  # any other phase: messages

LINE_WIDTH = 79  # the longest line drawn: fits 80 columns with the cursor after it
BAR_WIDTH = 30  # the widest bar; narrower when the counts are long, never under BAR_MIN
BAR_MIN = 10
MIN_SECONDS = 2.0  # no rate or time left before this much of a phase has been seen ...
MIN_ITEMS = 5  # ... and this many items of it done
REDRAW_INTERVAL = 0.1  # seconds between redraws of one phase (a new phase or its end: at once)


def parse_line(line: str) -> tuple[str, int, int] | None:
    """``(phase, done, total)`` from one line notmuch new or our hook wrote to the terminal
    (``total`` 0: not known), or None for any other line."""
    ours = progress.parse_progress(line)
    if ours is not None:
        return ours
    if match := _COUNTING.search(line):
        return progress.COUNTING, int(match.group(1)), 0
    if match := _FOUND.search(line):
        return progress.INDEXING, 0, int(match.group(1))
    if match := _FINISHED.search(line):
        return progress.INDEXING, int(match.group(1)), int(match.group(1))
    if match := _PROCESSED.search(line):
        return progress.INDEXING, int(match.group(1)), int(match.group(2) or 0)
    return None


def format_rate(rate: float) -> str:
    return f"{rate:.1f}/s" if rate < 10 else f"{rate:.0f}/s"


def format_left(seconds: float) -> str:
    """``38 s left``, ``4 min left``, ``2 h 05 min left``."""
    if seconds < 90:
        return f"{max(1, math.ceil(seconds))} s left"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min left"
    return f"{minutes // 60} h {minutes % 60:02d} min left"


def render_progress(phase: str, done: int, total: int, rate: float | None = None,
                    left: float | None = None, width: int = LINE_WIDTH) -> str:
    """One progress line, at most ``width`` characters:
    ``indexing [#####.....] 1200/6044 files, 310/s, 16 s left``; without a total,
    ``indexing: 1200 files, 310/s``."""
    unit = UNITS.get(phase, "messages")
    facts = [format_rate(rate)] if rate is not None else []
    if left is not None:
        facts.append(format_left(left))
    while True:  # too long for the width (huge counts): drop the time left, then the rate
        if total <= 0:
            line = ", ".join([f"{phase}: {done} {unit}", *facts])
        else:
            tail = ", ".join([f"{done}/{total} {unit}", *facts])
            bar = max(BAR_MIN, min(BAR_WIDTH, width - len(phase) - len(tail) - 4))
            filled = min(bar, bar * done // total)
            line = f"{phase} [{'#' * filled}{'.' * (bar - filled)}] {tail}"
        if len(line) <= width or not facts:
            return line[:width]
        facts.pop()


def progress_bar(line: str, width: int = BAR_WIDTH) -> str | None:
    """notmuch's progress line as a bar (no rate, no time left), or None if the line is not
    progress."""
    event = parse_line(line)
    if event is None:
        return None
    phase, done, total = event
    if total <= 0:
        return f"{phase}: {done} {UNITS.get(phase, 'messages')}"
    filled = min(width, width * done // total)
    unit = UNITS.get(phase, "messages")
    return f"{phase} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {unit}"


class ProgressDisplay:
    """One line on a terminal, redrawn in place with ``\\r``: the current phase, its bar, its
    counts, its rate and the time left (from the rate since the phase began; none until
    ``MIN_SECONDS`` and ``MIN_ITEMS`` of it were seen).  :meth:`feed` takes the raw lines
    notmuch new and our hook write; :meth:`update` is a :data:`~fmail_nm.progress.ProgressCallback`
    for passes run in this process; :meth:`finish` ends the line.  Disabled (``enabled`` false,
    by default when ``stream`` is not a terminal) it writes nothing at all.  Never raises on
    odd input."""

    def __init__(self, stream: TextIO, *, enabled: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, width: int = LINE_WIDTH) -> None:
        self.stream = stream
        self.enabled = _isatty(stream) if enabled is None else enabled
        self.clock = clock
        self.width = width
        self._phase: str | None = None
        self._start = 0.0  # when the phase was first seen, and how far it was then
        self._start_done = 0
        self._state: tuple[str, int, int] | None = None  # the latest update, drawn or not
        self._drawn_at = 0.0
        self._pending = False  # the latest update is not on the screen yet
        self._shown = 0  # length of the line on the screen (0: nothing drawn)
        self._finished = False

    def feed(self, line: str) -> None:
        event = parse_line(line)
        if event is not None:
            self.update(*event)

    def update(self, phase: str, done: int, total: int) -> None:
        if not self.enabled or self._finished or done < 0 or total < 0:
            return
        if total == 0 and done == 0:  # nothing to do in this phase: nothing to show
            return
        now = self.clock()
        new_phase = phase != self._phase or (self._state is not None and done < self._state[1])
        if new_phase:
            self._phase, self._start, self._start_done = phase, now, done
        self._state = (phase, done, total)
        self._pending = True
        if new_phase or (total and done >= total) or now - self._drawn_at >= REDRAW_INTERVAL:
            self._draw(now)

    def finish(self) -> None:
        """Draw the last update if it was held back, then end the line (if one was drawn)."""
        if not self.enabled or self._finished:
            return
        if self._pending:
            self._draw(self.clock())
        self._finished = True
        if self._shown:
            self._write("\n")

    def line(self, now: float) -> str | None:
        """The line for the latest update as of ``now``, or None before any."""
        if self._state is None:
            return None
        phase, done, total = self._state
        rate = left = None
        elapsed, items = now - self._start, done - self._start_done
        if elapsed >= MIN_SECONDS and items >= MIN_ITEMS:
            rate = items / elapsed
            if total > done:
                left = (total - done) / rate
        return render_progress(phase, done, total, rate, left, self.width)

    def _draw(self, now: float) -> None:
        text = self.line(now)
        if text is None:
            return
        self._write("\r" + text + " " * max(0, self._shown - len(text)))
        self._shown = len(text)
        self._drawn_at = now
        self._pending = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: stop drawing
            self.enabled = False


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


SUMMARY_TAGS = ("inbox", "unread", "sent", "list", "flagged", "attachment")


def summary_counts(config: Config, reader: Reader) -> tuple[int, dict[str, int]]:
    """All messages, and those with each SUMMARY_TAGS tag (spam and deleted mail included):
    as the mirror's triggers keep them when it holds every change notmuch has -- a notmuch
    count reads every match, seven of them ~30 ms of each run at 100k messages -- else
    counted."""
    kept = _kept_summary(config, reader)
    if kept is not None:
        return kept
    return (reader.count("*", exclude_tags=()),
            {tag: reader.count(f"tag:{tag}", exclude_tags=()) for tag in SUMMARY_TAGS})


def message_total(config: Config, reader: Reader) -> int:
    """All messages, spam and deleted mail included: kept by the mirror, or one count."""
    kept = _kept_summary(config, reader)
    return kept[0] if kept is not None else reader.count("*", exclude_tags=())


def _kept_summary(config: Config, reader: Reader) -> tuple[int, dict[str, int]] | None:
    path = sidecar.sidecar_path(config.data_dir)
    try:
        with sidecar.opened(path, readonly=True) as conn:
            conn.execute("BEGIN")  # the state and the counts from one snapshot
            state, revision = sidecar.mirror_state(conn), reader.revision()
            if (state.uuid, state.revision) != (revision.uuid, revision.number):
                return None
            kept = sidecar.tag_counts(conn)
            return (sidecar.mirror_count(conn, "messages"),
                    {tag: kept.get(tag, 0) for tag in SUMMARY_TAGS})
    except (sidecar.SidecarError, sqlite3.Error):
        return None


def run_index(config: Config, *, show_progress: bool | None = None,
              on_line: Callable[[str], None] | None = None,
              on_progress: progress.ProgressCallback | None = None,
              timeout: float | None = None, full_scan: bool = False,
              on_lock_wait: Callable[[], None] | None = None) -> IndexSummary:
    """The revision before ``notmuch new`` goes to the hook (``NEW_SINCE_ENV``), so that a
    first index tags what it adds and never re-tags mail indexed before.

    ``show_progress`` (default: when stderr is a terminal) draws one progress line on stderr
    for the whole run, notmuch's phase and ours (:class:`ProgressDisplay`); ``on_progress``
    gets the same updates as ``(phase, done, total)``.  ``on_line`` sees every line notmuch
    new and its hooks print.

    ``timeout`` bounds ``notmuch new`` (hooks included): a run still going after that long --
    typically waiting silently for a write lock another program holds -- is stopped and
    reported as :class:`IndexingFailed` instead of hanging the caller.  ``full_scan``: see
    :func:`~fmail_nm.store.notmuch_cli.run_notmuch_new`.  ``on_lock_wait`` is called when
    another program holds the write lock as notmuch new is about to start (it would wait for
    it without a word): a person at a terminal is told what the command waits for."""
    notmuch_config = config.settings.notmuch_config
    interactive = _isatty(sys.stderr) if show_progress is None else show_progress
    display = ProgressDisplay(sys.stderr, enabled=interactive)
    sinks = [s for s in (display.update if interactive else None, on_progress) if s is not None]

    def report(phase: str, done: int, total: int) -> None:
        for sink in sinks:
            sink(phase, done, total)

    def handle(line: str) -> None:
        if on_line is not None:
            on_line(line)
        if sinks and (event := parse_line(line)) is not None:
            report(*event)

    # On a pseudo-terminal notmuch new prints its progress, and the hook its own (asked with
    # FMAIL_PROGRESS); without one neither does, and nothing here draws.
    as_tty = bool(sinks)
    # Files delivered since the last run are listed and parsed, and the passes imported, on a
    # thread: while a delivery is indexed here (passes.delivery) and notmuch new runs in its
    # own process, so what a small delivery costs after notmuch shrinks to the sidecar's writes.
    prefetch: Prefetch | None = None
    try:
        first = delivered = None
        with Reader(notmuch_config) as reader:
            hook_dir = reader.setting("database.hook_dir")
            empty = message_total(config, reader) == 0
            prefetch = Prefetch(config.mail_root, config.data_dir,
                                fallback=None if empty else reader.changed_at()).start()
            if empty:
                first = _index_first(config, reader, report if sinks else None)
            before = reader.revision().number
            if first is None:
                delivered = _index_delivery(config, reader, prefetch, hook_dir,
                                            report if sinks else None)
        prefetch.resume()  # parse what is left while notmuch new runs
        # Our hook leaves the pass to us (one process, imports paid once, progress through
        # the callback); a hook of an earlier version has run it already, and running it again
        # here would only find nothing to do, at a cost on every run.  No hook of ours: we run
        # it.
        hook = Path(hook_dir) / "post-new" if hook_dir else None
        hooked = hook is not None and is_ours(hook) and not defers_pass(hook)
        env = {NEW_SINCE_ENV: str(before), progress.ENV: "1" if as_tty else "",
               PASS_AFTER_ENV: "1"}
        if on_lock_wait is not None and write_lock_held(notmuch_config):
            on_lock_wait()
        result = run_notmuch_new(notmuch_config, as_tty=as_tty,
                                 on_line=handle if (as_tty or on_line) else None,
                                 timeout=timeout, env=env, full_scan=full_scan)
        output = progress.strip_progress(result.output)
        if result.shut_down:
            raise IndexingStopped("notmuch new stopped at shutdown; the next start indexes "
                                  "the rest")
        if result.timed_out:
            raise IndexingFailed(
                f"notmuch new did not finish within {timeout:g}s and was stopped; another "
                f"program (a mail client, another notmuch new) may be holding the notmuch write "
                f"lock")
        if result.returncode != 0:
            raise IndexingFailed(
                f"notmuch new failed (exit {result.returncode}):\n{_plain(output).strip()}")
        added = int(m.group(1)) if (m := _ADDED.search(output)) else 0
        prefetched = prefetch.take()
        delivered_ids = frozenset(delivered.messages if delivered else ())
        added += (first.added if first else 0) + len(delivered_ids)
        from ..passes.mirror import sync_sidecar
        from ..passes.post_new import drop_old_recipients, post_new
        from ..passes.tagging import TaggingReport

        with Reader(notmuch_config) as reader, Writer(notmuch_config) as writer:
            tagging, parsed_ahead = TaggingReport(), 0
            # Before the pass, whose mirror sync then takes the revision this write makes; a
            # hook that ran the pass inside notmuch new synced before it, so sync it here.
            if drop_old_recipients(reader, writer) and hooked:
                sync_sidecar(config, reader)
            if not hooked:
                done = post_new(config, reader, writer, new_since=before,
                                on_progress=report if sinks else None, prefetched=prefetched,
                                tagged=delivered_ids)
                tagging, parsed_ahead = done.tagging, done.mirror.prefetched
            maildir.prune_holds(config, reader)
            total, counts = summary_counts(config, reader)
            summary = IndexSummary(added=added, total=total, counts=counts, tagging=tagging,
                                   notmuch_output=output, parsed_ahead=parsed_ahead,
                                   first_index=first is not None,
                                   delivered=len(delivered_ids))
        prefetch.done()
        return summary
    finally:
        if prefetch is not None:
            # a run that failed or was stopped (a shutdown) waits for no parse; a no-op once
            # taken
            prefetch.stop()
        display.finish()


def wait_between_syncs(config: Config, timeout: float, *,
                       on_channel_wait: Callable[[list[str]], None] | None = None) -> float:
    """Wait, at most ``timeout`` seconds, until no mbsync run of ours is syncing; the seconds
    waited.  In the middle of a run -- of any account, in any process -- an index would drop
    a message moved on the server, with the tags only notmuch keeps (see
    :func:`~fmail_nm.service.mbsync.wait_for_channels`); ``on_channel_wait`` gets the busy
    channels once, when there are any.  :class:`~fmail_nm.service.mbsync.ChannelBusy` when
    the wait took all of ``timeout``: nothing is lost, every run of ours is followed by an
    index of its own."""
    waited = wait_for_channels(config, timeout, on_wait=on_channel_wait)
    if waited is None:
        raise ChannelBusy("mbsync is syncing this mail right now; try again when it is done")
    return waited


def index_between_syncs(config: Config, timeout: float, *,
                        on_lock_wait: Callable[[], None] | None = None,
                        on_channel_wait: Callable[[list[str]], None] | None = None
                        ) -> IndexSummary:
    """:func:`run_index` (no progress line) after :func:`wait_between_syncs`, within
    ``timeout`` seconds in all."""
    waited = wait_between_syncs(config, timeout, on_channel_wait=on_channel_wait)
    return run_index(config, show_progress=False, on_lock_wait=on_lock_wait,
                     timeout=max(timeout - waited, 0.1))


def reindex_for_write(config: Config, timeout: float | None = None) -> IndexSummary:
    """The re-index a write asks for (mbsync renamed a file it names), or the one after a
    push (mbsync renamed what it uploaded): :func:`index_between_syncs` within ``timeout``
    (default ``REINDEX_TIMEOUT``)."""
    return index_between_syncs(config, REINDEX_TIMEOUT if timeout is None else timeout)


def _index_first(config: Config, reader: Reader,
                 on_progress: progress.ProgressCallback | None) -> FirstIndex | None:
    """An empty database's first index by fmail-nm itself (:mod:`fmail_nm.passes.first_index`),
    when nothing stands in its way; None when notmuch new must do it."""
    from ..passes.first_index import index_first, why_not

    reason = why_not(reader) or hook_in_the_way(reader.setting("database.hook_dir"))
    if reason is not None:
        log.info("first index left to notmuch new: %s", reason)
        return None
    first = index_first(config, reader, on_progress=on_progress)
    for name in first.not_mail:
        log.info("not mail, not indexed: %s", name)
    return first


def _index_delivery(config: Config, reader: Reader, prefetch: Prefetch, hook_dir: str,
                    on_progress: progress.ProgressCallback | None) -> AddedFiles | None:
    """The delivery's new files indexed by fmail-nm itself (:mod:`fmail_nm.passes.delivery`)
    when there are enough and nothing stands in its way; None when notmuch new indexes them."""
    min_files = DELIVERY_MIN_FILES
    if len(prefetch.deliveries() or ()) < min_files:  # notmuch new's: not even an import
        return None
    from ..passes.delivery import index_delivery, why_not

    reason = why_not(reader) or hook_in_the_way(hook_dir)
    if reason is not None:
        log.debug("delivery left to notmuch new: %s", reason)
        return None
    return index_delivery(config, reader, prefetch, on_progress=on_progress,
                          min_files=min_files)


def hook_in_the_way(hook_dir: str) -> str | None:
    """A post-new hook that expects notmuch new to bring it the new mail (the user's, chained
    before ours, or one of ours from a version that runs the pass itself), or None."""
    if not hook_dir:
        return None
    hook = Path(hook_dir) / "post-new"
    if (hook.exists() or hook.is_symlink()) and not defers_pass(hook):
        return "a post-new hook other than fmail-nm's current one expects notmuch new"
    if any(kept(Path(hook_dir), "post-new").exists() for kept in (kept_hook, legacy_kept_hook)):
        return "a post-new hook of yours runs after notmuch new"
    return None


def _plain(output: str) -> str:
    """notmuch's terminal output for a message: without its progress redraws and escapes."""
    lines = output.replace("\x1b[K", "").replace("\r\n", "\n").split("\n")
    return "\n".join(line.rpartition("\r")[2] for line in lines)
