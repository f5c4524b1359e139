"""Parse the files of a delivery while ``notmuch new`` indexes them.

An index run learns which messages are new only once ``notmuch new`` is done, but their files
are on disk before it starts.  Those that arrived since the last run -- adding or renaming a
file into a Maildir directory moves the directory's mtime and the file's ctime -- are parsed on
a thread while notmuch new runs in its own process, so the mirror's parse (most of what a
small delivery costs after notmuch) overlaps notmuch's work instead of following it.

It is a guess and only ever saves time: a file not parsed here is parsed by the mirror as
before, and the run waits only for the files in ``new/`` (deliveries, which the mirror would
parse next anyway): files in ``cur/`` -- mail delivered as read, and old mail a client renamed,
parsed in vain -- are taken as far as the thread got while notmuch ran.  The first
run (no stamp yet, an empty database) parses nothing here: a first index is the job of its
own worker processes.  Without a stamp on a database that has mail (notmuch new and the hook
indexed it all so far), the files that arrived since the database's last commit are taken.
The thread also imports the passes the run needs next, so that import overlaps notmuch too.

The files in ``new/`` are listed first (:meth:`Prefetch.deliveries`), and the thread waits
(:meth:`Prefetch.resume`): an index run may index those itself before notmuch new
(:mod:`fmail_nm.passes.delivery`), and a thread parsing beside it would only fight it for the
GIL between libnotmuch's calls.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..private import private_dir

if TYPE_CHECKING:
    from .mirror import Parsed

log = logging.getLogger(__name__)

STAMP_NAME = "prefetch-stamp"  # in the data directory: when the last index run began
# A file's ctime comes from the kernel's coarse clock, a tick behind time.time(): a file that
# lands in the tick before a run begins could look older than the run.  (Missing one only
# means the mirror parses it, as without a prefetch.)
CLOCK_SLACK = 0.05
MAX_FILES = 2000  # more than this is a big delivery: the mirror's worker processes take it
MAILDIR_LEAVES = ("new", "cur")  # new/ first: deliveries; cur/ also holds renamed old mail
SKIP_DIRS = frozenset({".notmuch", "tmp"})


class Prefetch:
    """One index run's background parse: :meth:`start` before notmuch new, :meth:`take` after
    it, :meth:`done` once the run succeeded (the next run looks for files newer than this
    one's start)."""

    def __init__(self, mail_root: Path, data_dir: Path, *, max_files: int = MAX_FILES,
                 fallback: float | None = None) -> None:
        self.mail_root = mail_root
        self.stamp_file = data_dir / STAMP_NAME
        self.max_files = max_files
        # Without a stamp (no index run of ours yet: notmuch new and the hook did them all),
        # files that arrived since this time -- the database's last commit -- are the guess.
        self.fallback = fallback
        self.started = 0.0
        self._parsed: dict[str, Parsed] = {}
        self._deliveries: list[str] | None = None  # the files in new/, once listed
        self._stop = threading.Event()
        self._listed = threading.Event()  # the files in new/ are listed (or never will be)
        self._go = threading.Event()  # parse on (see resume)
        self._wanted: list[str] | None = None  # the deliveries that need a parse (see resume)
        self._deliveries_done = threading.Event()  # every file in new/ parsed (or none)
        self._thread: threading.Thread | None = None

    def start(self) -> Prefetch:
        self.started = time.time()
        since = self._last_start()
        if since is None:
            since = self.fallback
        self._thread = threading.Thread(
            target=self._run, args=(None if since is None else since - CLOCK_SLACK,),
            name="fmail-prefetch", daemon=True)
        self._thread.start()
        return self

    def take(self) -> dict[str, Parsed]:
        """The files parsed, by name.  Waits for those in ``new/`` -- deliveries, which the
        mirror would parse next anyway -- then stops the thread: files in ``cur/`` (also
        renamed old mail) are taken only as far as the thread got while notmuch ran."""
        if self._thread is not None:
            self._go.set()
            self._deliveries_done.wait()
            self._stop.set()
            self._thread.join()
        return self._parsed

    def stop(self) -> None:
        """Stop the thread without waiting for the deliveries' parse: the run failed or was
        stopped (a shutdown), and nothing will use what it parsed.  Waits for the file being
        parsed at most."""
        if self._thread is not None:
            self._stop.set()
            self._go.set()
            self._thread.join()

    def deliveries(self) -> list[str] | None:
        """The files in ``new/`` that arrived since the last run, once the thread has listed
        them; None when not known: no earlier run, more than ``max_files``, or the listing
        failed."""
        if self._thread is None:
            return None
        self._listed.wait()
        return self._deliveries

    def resume(self, wanted: list[str] | None = None) -> None:
        """Let the thread parse, once the files are listed.  It waits for this: a delivery
        indexed in this process meanwhile (:mod:`fmail_nm.passes.delivery`) would lose the GIL
        to the thread's parsing after every libnotmuch call, and take twice as long.
        ``wanted``: the deliveries still to parse (the others are indexed already), if known."""
        if not self._go.is_set():  # the first word counts
            self._wanted = wanted
            self._go.set()

    def done(self) -> None:
        """Remember this run's start for the next one (after a run that indexed)."""
        try:
            private_dir(self.stamp_file.parent)
            self.stamp_file.write_text(f"{self.started:.6f}\n")
        except OSError as exc:  # costs the next run its head start, nothing else
            log.debug("prefetch stamp not written: %s", exc)

    def _last_start(self) -> float | None:
        try:
            return float(self.stamp_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def _run(self, since: float | None) -> None:
        try:
            deliveries: list[str] = []
            if since is not None:
                leaves = changed_leaves(self.mail_root, since)
                deliveries = list(itertools.islice(_files_in(leaves["new"], since),
                                                   self.max_files + 1))
                if len(deliveries) <= self.max_files:
                    self._deliveries = deliveries
            self._listed.set()
            self._go.wait()
            # The passes are imported here, whether or not there is anything to parse (the run
            # needs them next), once the delivery is indexed: while notmuch new runs.
            from . import post_new  # noqa: F401
            from .mirror import parse_file

            wanted = self._wanted if self._wanted is not None else deliveries[:self.max_files]
            for name in wanted:
                if self._stop.is_set():
                    return
                self._parsed[name] = parse_file([name])
            self._deliveries_done.set()
            if since is None:
                return
            # A big cur/ with nothing new in it takes a while to scan: stop means stop.
            others = _files_in(leaves["cur"], since, self._stop)
            for name in itertools.islice(others, max(0, self.max_files - len(deliveries))):
                if self._stop.is_set():
                    return
                self._parsed[name] = parse_file([name])
        except Exception:  # untrusted files, racing renames: a guess that failed costs nothing
            log.debug("prefetch stopped", exc_info=True)
        finally:
            self._listed.set()
            self._deliveries_done.set()


def arrived_since(mail_root: Path, since: float) -> Iterator[str]:
    """Files in Maildir ``new``/``cur`` directories below ``mail_root`` added or renamed there
    at or after ``since`` (epoch seconds): all of ``new/`` first, then ``cur/``."""
    leaves = changed_leaves(mail_root, since)
    for leaf in MAILDIR_LEAVES:
        yield from _files_in(leaves[leaf], since)


def changed_leaves(mail_root: Path, since: float) -> dict[str, list[str]]:
    """The Maildir ``new`` and ``cur`` directories below ``mail_root`` changed at or after
    ``since`` (a file added, renamed or removed moves a directory's mtime), by leaf name."""
    leaves: dict[str, list[str]] = {leaf: [] for leaf in MAILDIR_LEAVES}
    for top, dirs, _files in os.walk(mail_root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        for leaf in MAILDIR_LEAVES:
            if leaf in dirs:
                path = os.path.join(top, leaf)
                try:
                    if os.stat(path).st_mtime >= since:
                        leaves[leaf].append(path)
                except OSError:
                    continue
        dirs[:] = [d for d in dirs if d not in MAILDIR_LEAVES]
    return leaves


def _files_in(directories: Iterable[str], since: float,
              stop: threading.Event | None = None) -> Iterator[str]:
    for directory in directories:
        yield from _files_since(directory, since, stop)


def _files_since(directory: str, since: float,
                 stop: threading.Event | None = None) -> Iterator[str]:
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if stop is not None and stop.is_set():
                    return
                try:
                    if entry.is_file(follow_symlinks=False) and \
                            entry.stat(follow_symlinks=False).st_ctime >= since:
                        yield entry.path
                except OSError:
                    continue
    except OSError:
        return
