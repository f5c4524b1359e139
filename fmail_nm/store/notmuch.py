"""The notmuch access layer: the only module that imports notmuch2.

Two rules shape it (see ARCHITECTURE.md, "Traps"):

* libnotmuch is not thread-safe, so every handle stays on the thread that opened it.
* Debian's libnotmuch is built with ``retry_lock``: a read-write open blocks silently while
  another process (``notmuch new``, a mail client) holds the lock.  Writes therefore run on one
  writer thread that opens the database only for one batch, and the caller stops waiting after
  a bounded time with :class:`DatabaseBusy` -- the batch is then abandoned, never half-applied.

Readers see a snapshot; :class:`Reader` reopens when the database has moved on, so every call
sees the latest committed state.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import notmuch2
from notmuch2 import _capi

from ..config import THREAD_ID
from ..errors import BackendError, CallerError
from ..tags import DEFAULT_EXCLUDED, FLAG_TAGS
from .notmuch_config import config_bool, config_list, file_stamp, find_notmuch_config
from .query import all_of, id_query, quote
from .threads import ThreadSummary, author_of, listed_by, rank_id, thread_authors

T = TypeVar("T")

WRITE_LOCK_TIMEOUT = 10.0


class NotmuchAccessError(BackendError):
    """The notmuch database could not be used as asked (busy, missing, out of step)."""


class DatabaseBusy(NotmuchAccessError):
    """Another process holds the notmuch write lock for longer than we are willing to wait."""

    def __init__(self, waited: float) -> None:
        super().__init__(
            f"database busy: another program (notmuch new, a mail client) holds the notmuch "
            f"write lock; gave up after {waited:.1f}s, nothing was changed -- retry shortly"
        )
        self.waited = waited


class DatabaseMissing(NotmuchAccessError):
    """There is no notmuch database (or config) where libnotmuch looks."""


class ConfigUnparsable(NotmuchAccessError):
    """notmuch's config file is there, but notmuch cannot load it: a syntax error, or a file it
    may not read.  notmuch itself says only "cannot load config file", naming no file, and its
    ``notmuch config list`` prints nothing at all: without this, a setting it lacks is blamed."""

    def __init__(self, path: Path, notmuch_says: str = "") -> None:
        said = f" (notmuch: {notmuch_says})" if notmuch_says else ""
        if os.access(path, os.R_OK):
            problem = f"notmuch could not parse its config file {path}{said}: fix the line at " \
                      "fault there (the syntax is in notmuch-config(1))"
        else:
            problem = f"notmuch may not read its config file {path}{said}: give it read access"
        super().__init__(problem)


def notmuch_message(output: str) -> str:
    """notmuch's own words from its error output, without its advice to run `notmuch setup`
    (which would write a new config over the user's)."""
    return " ".join(line.strip() for line in output.splitlines()
                    if line.strip() and "notmuch setup" not in line)


class DatabaseDamaged(NotmuchAccessError):
    """libnotmuch found the database, but Xapian cannot read it: damaged (a disk error, a
    copy taken while it was written) or written by a newer Xapian."""

    # What the rebuild (its folder moved aside, then `fmail-nm init`) cannot give back.
    LOST_IN_REBUILD = "tags set by hand come back only from an earlier `notmuch dump`"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.problem = (f"the notmuch database cannot be read ({reason}): it is damaged or "
                        "was written by a newer Xapian")
        super().__init__(
            f"{self.problem}; nothing was changed. `xapian-check` on its `.notmuch/xapian` "
            "folder (under notmuch's database.path) tells more. To rebuild it, move that "
            "folder aside and run `fmail-nm init`: it indexes your mail again with "
            f"fmail-nm's tags ({self.LOST_IN_REBUILD})")


class _WriteLocked(NotmuchAccessError):
    """Another program holds the database's write lock (a write open retries)."""


class WriteNotSaved(NotmuchAccessError):
    """notmuch could not commit a write session (the disk full, an I/O error): the index
    stayed as it was, while files the session renamed stay renamed until the next index."""

    AFTER_RENAMES = ("its tag changes were not recorded; run `fmail-nm index` once there is "
                     "space, to bring the index in step with any file already renamed")

    def __init__(self, exc: BaseException, left: str = AFTER_RENAMES) -> None:
        """``left``: what the session left on disk, and what to do about it."""
        super().__init__(
            f"the notmuch database could not save this write ({exc}; is the disk full?): {left}")
        self.reason = exc


class DiskFull(NotmuchAccessError):
    """Too little free space where the notmuch database lives to start a write session."""

    def __init__(self, free: int, where: str) -> None:
        super().__init__(
            f"disk full: only {free // 1024} KiB free on the filesystem of the notmuch "
            f"database ({where}); a write needs at least {MIN_FREE_BYTES // 2**20} MiB -- "
            "nothing was changed; free some space and retry")
        self.free = free


class StaleFiles(NotmuchAccessError):
    """The index names a message file that is no longer on disk (renamed since the last
    ``notmuch new``, e.g. by mbsync adding ``,U=``); re-indexing fixes it."""

    @classmethod
    def naming(cls, path: str | os.PathLike[str]) -> StaleFiles:
        return cls(f"{os.fsdecode(path)} is no longer on disk (renamed by mbsync or a mail "
                   "client since the last index); re-index (fmail-nm index) and try again")


class FlagsNotWritten(NotmuchAccessError):
    """A message file could not be renamed to carry the Maildir flags its tags call for."""


class QueryError(CallerError):
    """notmuch could not parse a query (a ``raw:`` one, or a term it refuses)."""


# libnotmuch 0.37 aborts the whole process (an uncaught std::out_of_range) on an empty
# thread: value -- `thread:""`, or `thread:"` at the end of a query -- where a raw: query
# could put one: such a query is refused before it reaches libnotmuch.
_EMPTY_THREAD = re.compile(r'\bthread:"(?:"(?!")|\s*$)')


def _checked(query: str) -> str:
    if _EMPTY_THREAD.search(query):
        raise QueryError('an empty thread: value (thread:"") is not a query notmuch can run; '
                         "give a thread id")
    return query


def _rejected(exc: notmuch2.NotmuchError) -> QueryError:
    """The model's error for a query notmuch refused.  notmuch2 keeps Xapian's reason (e.g.
    "Didn't understand date specification") from us; the search language's own terms always
    parse, so it is a part written in notmuch's syntax it could not read."""
    hint = ""
    if isinstance(exc, notmuch2.XapianError):
        hint = (" -- it could not parse what is in its own syntax (a raw: part, a tagging "
                'rule\'s query): e.g. raw:"date:2026-03-01..2026-03-31" (dates YYYY-MM-DD), '
                "or use after:/before:")
    return QueryError(f"notmuch rejected the query: {exc}{hint}")


class IndexKeptChanging(NotmuchAccessError):
    """Another program committed to the index during every try of a read."""

    def __init__(self, tries: int) -> None:
        super().__init__(
            f"the notmuch index changed during each of {tries} tries to read it "
            "(another program -- notmuch new, a tagging script, a mail client -- is writing "
            "to it); nothing was changed -- retry shortly")


class _SnapshotMoved(Exception):
    """The database committed after the read's snapshot opened (see Reader._threads)."""


@dataclass(frozen=True)
class Revision:
    number: int
    uuid: str


@dataclass(frozen=True)
class IndexedMessage:
    """What the index knows of a message without opening its file."""

    message_id: str
    thread_id: str
    subject: str
    from_header: str
    date: int  # seconds since the epoch, from the Date header as notmuch parsed it
    tags: frozenset[str]
    filenames: tuple[str, ...]


@dataclass(frozen=True)
class ThreadNode:
    """A message in a thread, in thread order, with its depth in the reply tree."""

    message: IndexedMessage
    depth: int
    parent_id: str | None


# ---------------------------------------------------------------------------------------------
# Opening the database where libnotmuch finds it


def _open(config_path: str | None, mode: notmuch2.Database.MODE) -> notmuch2.Database:
    config = config_path if config_path else notmuch2.Database.CONFIG.SEARCH
    try:
        return notmuch2.Database(mode=mode, config=config)
    except notmuch2.XapianError as exc:
        # Xapian reached the database: it exists, so "run init" would be the wrong advice.
        reason = " ".join(str(exc).split())
        if "write lock" in reason.lower():  # Xapian's "Unable to get write lock on …"
            raise _WriteLocked(reason) from None
        raise DatabaseDamaged(reason) from None
    except notmuch2.NotmuchError as exc:
        found = find_notmuch_config(config_path)
        if isinstance(exc, notmuch2.NoConfigError) and found is not None:
            raise ConfigUnparsable(found, notmuch_message(str(exc))) from None
        raise DatabaseMissing(
            f"cannot open the notmuch database ({' '.join(str(exc).split())}); "
            "run `fmail-nm init` first"
        ) from None


def settings_of_database(config_path: str | os.PathLike[str] | None,
                         keys: Iterable[str]) -> dict[str, str] | None:
    """``keys`` as libnotmuch resolves them (config file, database, defaults) -- the values
    ``notmuch config list`` prints, read by the same library in this process: the hook and
    every index run load the configuration, and starting notmuch for it cost a process start
    each time.  Keys without a value are left out.  None when the database does not open
    (none yet, a config notmuch cannot load): ``notmuch config list`` still works then, and
    says what is wrong."""
    config = os.fspath(config_path) if config_path else notmuch2.Database.CONFIG.SEARCH
    try:
        db = notmuch2.Database(mode=notmuch2.Database.MODE.READ_ONLY, config=config)
    except notmuch2.NotmuchError:
        return None
    try:
        merged = db.config  # a key's value as libnotmuch resolved it, wherever it was set
        return {key: value for key in keys if (value := merged.get(key))}
    finally:
        db.close()


def xapian_folders(database_path: Path) -> tuple[Path, Path]:
    """Where notmuch keeps the Xapian files under its ``database.path``: ``.notmuch/xapian``
    beside the mail, or ``xapian`` in a database folder of its own."""
    return database_path / ".notmuch" / "xapian", database_path / "xapian"


def ensure_database(config_path: str | os.PathLike[str] | None = None) -> bool:
    """Create an empty database where the config says, if there is none; True if created."""
    path = os.fspath(config_path) if config_path else None
    try:  # a damaged database is not created anew: DatabaseDamaged says how to rebuild it
        _open(path, notmuch2.Database.MODE.READ_ONLY).close()
        return False
    except DatabaseMissing:
        pass
    try:
        notmuch2.Database.create(config=path or notmuch2.Database.CONFIG.SEARCH).close()
    except notmuch2.NotmuchError as exc:
        raise DatabaseMissing(f"cannot create the notmuch database: {exc}") from None
    return True


def _find(db: notmuch2.Database, message_id: str) -> notmuch2.Message:
    """A message by Message-ID; LookupError when there is none -- and for a ghost, the entry
    notmuch keeps for a Message-ID it knows only from the replies that name it (a parent
    never received, a message with replies whose file was deleted): no file, nothing to
    read or change.  Queries never match ghosts; this keeps lookups by id the same."""
    msg = db.find(message_id)
    if msg.ghost:
        raise LookupError(message_id)
    return msg


def _header(msg: notmuch2.Message, name: str) -> str:
    try:
        return msg.header(name)
    except LookupError:
        return ""


def _message_id(msg: notmuch2.Message) -> str:
    """The Message-ID from the Xapian value notmuch keeps for sorting by it: reading it does
    not load the document's term list, as ``messageid`` does (a third of a search page's
    cost).  ``messageid`` where that value is missing: libnotmuch then reads the header from
    the file, which still has its angle brackets."""
    try:
        value = msg.header("message-id")
    except LookupError:
        value = ""
    return value if value and not value.startswith("<") else str(msg.messageid)


def _indexed(msg: notmuch2.Message) -> IndexedMessage:
    return IndexedMessage(
        message_id=str(msg.messageid),
        thread_id=str(msg.threadid),
        subject=_header(msg, "subject"),
        from_header=_header(msg, "from"),
        date=msg.date,
        tags=frozenset(str(t) for t in msg.tags),
        filenames=tuple(os.fsdecode(p) for p in msg.filenamesb()),
    )


def _is_match(msg: notmuch2.Message) -> bool:
    """Whether the search that built this message's thread matched it (and shows it).
    libnotmuch flags it; the bindings read the EXCLUDED flag this way but do not offer
    MATCH, and asking notmuch again for the page's matches cost 0.8 ms a page."""
    return bool(_capi.lib.notmuch_message_get_flag(msg._msg_p,
                                                   _capi.lib.NOTMUCH_MESSAGE_FLAG_MATCH))


def _property(msg: notmuch2.Message, key: str) -> str | None:
    try:
        return str(msg.properties[key])
    except KeyError:
        return None


def _skipped(it: Iterator[notmuch2.Message], count: int) -> Iterator[notmuch2.Message]:
    """The iterator moved past ``count`` messages without reading them: each message the
    bindings hand out is a document libnotmuch loads (~15 us), and a page deep in a search
    (or in a second of thousands, see reads._whole_edges) skipped tens of thousands.  The
    bindings move on only by handing a message out: libnotmuch's own step is called here
    (a page 20,000 deep: 15 ms, against 170 ms handing out each)."""
    iter_p = it._iter_p  # type: ignore[attr-defined]
    for _ in range(count):
        if not _capi.lib.notmuch_messages_valid(iter_p):
            break
        _capi.lib.notmuch_messages_move_to_next(iter_p)
    return it


def _sort(order: str) -> notmuch2.Database.SORT:
    return {
        "newest": notmuch2.Database.SORT.NEWEST_FIRST,
        "oldest": notmuch2.Database.SORT.OLDEST_FIRST,
        "message_id": notmuch2.Database.SORT.MESSAGE_ID,
        "none": notmuch2.Database.SORT.UNSORTED,
    }[order]


def _check_thread(owner: int) -> None:
    if threading.get_ident() != owner:
        raise RuntimeError("a notmuch handle was used from a thread other than its own")


# ---------------------------------------------------------------------------------------------
# Reads


# File times come from a clock that ticks every few milliseconds (the kernel's coarse
# clock): a marker stamped this close to an open may have been written during it.
MARKER_CLOCK_SLACK_NS = 20_000_000


# How many times in all a read runs when another program keeps committing while it runs
# (see Reader._retrying), and its first pause before it runs again (then 2x, 4x, ...).
READ_TRIES = 5
RETRY_PAUSE = 0.005


class Reader:
    """A read-only handle that is reopened whenever the database has committed since it opened.

    Use it from one thread only (libnotmuch is not thread-safe).  A read that another
    program's commits break runs again on a new snapshot (``_retrying``), and the reads that
    make one answer share one (``in_one_snapshot``); listings of threads
    stop at the first such commit (``_threads``): two make libnotmuch hand back a freed
    thread, which aborts the process.  A process that writes too runs its reads outside its
    own commits (``Writer(committing=...)``).
    """

    def __init__(self, config_path: str | None = None) -> None:
        self.config_path = config_path
        self._owner = threading.get_ident()
        self._db: notmuch2.Database | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._xapian_marker: Path | None = None
        # The config file libnotmuch read on open (search.exclude_tags and the rest): edited,
        # it is read again, although no commit tells.
        self._config_file = find_notmuch_config(config_path)
        self._config_stamp: tuple[int, int, int] | None = None  # taken as the handle opens
        # count_soon's thread and the Reader of its own it reads with (see count_soon).
        self._counter: concurrent.futures.ThreadPoolExecutor | None = None
        self._counter_local = threading.local()
        self._all_tags: tuple[str, ...] | None = None  # of the open snapshot (see all_tags)
        self._pinned = False  # inside in_one_snapshot: the open snapshot stays

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the handle, and stop the counting thread after its count in progress."""
        self._release()
        if self._counter is not None:
            self._counter.submit(self._close_counting_reader).result()
            self._counter.shutdown(wait=True)
            self._counter = None

    def _release(self) -> None:
        self._all_tags = None
        if self._db is not None:
            self._db.close()
            self._db = None

    def _marker_stamp(self) -> tuple[int, int, int] | None:
        # Xapian rewrites "iamglass" (by rename) on every commit: a stat tells us cheaply
        # whether our snapshot is stale, without reopening on every call.
        return file_stamp(self._xapian_marker)

    def _find_marker(self, db: notmuch2.Database) -> Path | None:
        for folder in xapian_folders(Path(os.fsdecode(db.path))):
            if (candidate := folder / "iamglass").exists():
                return candidate
        return None

    @property
    def db(self) -> notmuch2.Database:
        _check_thread(self._owner)
        if self._db is not None and not self._pinned:
            stamp = self._marker_stamp()
            if (stamp is None or stamp != self._stamp
                    or file_stamp(self._config_file) != self._config_stamp):
                self._release()
        if self._db is None:
            self._open_snapshot()
        assert self._db is not None
        return self._db

    def _open_snapshot(self) -> None:
        # The marker is read before the database opens: a commit landing in between then
        # makes the next call reopen, where a stamp read after would match the newer commit
        # and keep the older snapshot until the one after it.  The first open cannot know
        # where the marker is; a marker written while it ran is not trusted.
        stamp, started = self._marker_stamp(), time.time_ns()
        self._config_stamp = file_stamp(self._config_file)
        self._db = _open(self.config_path, notmuch2.Database.MODE.READ_ONLY)
        if self._xapian_marker is None:
            self._xapian_marker = self._find_marker(self._db)
            stamp = self._marker_stamp()
            if stamp is not None and stamp[1] >= started - MARKER_CLOCK_SLACK_NS:
                stamp = None
        self._stamp = stamp

    def _retrying(self, fn: Callable[[notmuch2.Database], T]) -> T:
        """Run a read on the current snapshot.  A read that fails or stops (see _threads)
        after another program committed runs again on a new snapshot, after a pause that
        doubles each time, up to READ_TRIES times in all; a Xapian error with no commit
        behind it is tried once more.  Any other error is the caller's (a bad query)."""
        if self._pinned:
            return self._on_pinned(fn)
        xapian_retried = False
        for attempt in range(READ_TRIES):
            try:
                return fn(self.db)
            except _SnapshotMoved:
                moved = True
            except notmuch2.NotmuchError as exc:
                moved = self._snapshot_moved()
                if not moved:
                    if (not isinstance(exc, notmuch2.XapianError) or xapian_retried
                            or attempt == READ_TRIES - 1):
                        raise
                    xapian_retried = True
            self._release()
            if moved:
                time.sleep(RETRY_PAUSE * 2 ** attempt)
        raise IndexKeptChanging(READ_TRIES)  # each of the tries found a commit behind it

    def in_one_snapshot(self, read: Callable[[], T]) -> T:
        """``read``, every read of this handle in it on one snapshot: the reads that make up
        one answer (a page, then the counts and ids of the dates at its edges) would each
        see the index as it then stood, and mail indexed in between shifted one against
        the other.  A commit that breaks one of them runs ``read`` again whole, on a new
        snapshot (as ``_retrying`` runs a single read)."""
        self.db  # the first open finds the marker
        if self._pinned or self._xapian_marker is None:
            # Without a marker (a chert index) no commit can be seen: a snapshot held would
            # fail once overwritten as if the query were bad, so each read opens its own.
            return read()

        def pinned(db: notmuch2.Database) -> T:
            self._pinned = True
            try:
                return read()
            finally:
                self._pinned = False
        return self._retrying(pinned)

    def _on_pinned(self, fn: Callable[[notmuch2.Database], T]) -> T:
        """A read inside ``in_one_snapshot``: one that fails after a commit stops the whole,
        which runs again on a new snapshot; any other error is this read's own."""
        try:
            return fn(self.db)
        except notmuch2.NotmuchError:
            if self._snapshot_moved():
                raise _SnapshotMoved from None
            raise

    def _snapshot_moved(self) -> bool:
        """Whether the database has committed since this snapshot opened (one stat)."""
        return self._xapian_marker is not None and self._marker_stamp() != self._stamp

    def _threads(self, threads: Iterable[notmuch2.Thread]) -> Iterator[notmuch2.Thread]:
        """The threads of a listing, each built only while the index is as this snapshot saw
        it.  libnotmuch builds a thread with a query of its own; once two commits have
        overwritten the snapshot, that query fails and libnotmuch 0.37 returns the thread it
        has just freed (lib/thread.cc), whose use or release aborts the process.  One commit
        leaves the snapshot readable, so the walk stops at the first (a stat per thread) and
        the read starts again on a new snapshot (``_retrying``)."""
        it = iter(threads)
        while True:
            if self._snapshot_moved():
                raise _SnapshotMoved
            try:
                thread = next(it)
            except StopIteration:
                return
            yield thread

    def changed_at(self) -> float | None:
        """When the database last committed (epoch seconds), from Xapian's marker file; None
        when it cannot be told.  Cheap: one stat."""
        self.db  # opens (or reopens) the handle and finds the marker
        if self._xapian_marker is None:
            return None
        try:
            return self._xapian_marker.stat().st_mtime
        except OSError:
            return None

    def commit_stamp(self) -> str | None:
        """Names the database's last commit, as Xapian's marker file stands: two equal stamps
        mean no commit in between (a removal included, which leaves the revision as it
        was).  None when it cannot be told."""
        self.db  # opens (or reopens) the handle; its stamp was taken before it opened
        return None if self._stamp is None else ":".join(str(part) for part in self._stamp)

    def revision(self) -> Revision:
        rev = self._retrying(lambda db: db.revision())
        return Revision(rev.rev, os.fsdecode(rev.uuid))

    def setting(self, key: str, default: str = "") -> str:
        def get(db: notmuch2.Database) -> str:
            try:
                return db.config[key]
            except KeyError:
                return default
        return self._retrying(get)

    def exclude_tags(self) -> tuple[str, ...]:
        """``search.exclude_tags`` from the config (the bindings do not apply it themselves),
        read as notmuch reads a list: ``deleted; spam`` hides spam too."""
        return tuple(config_list(self.setting("search.exclude_tags")))

    def search_exclusions(self) -> tuple[str, ...]:
        """The tags a search leaves out unless it names them: ``search.exclude_tags``, or
        DEFAULT_EXCLUDED where the config names none (the DSL and the mirror agree on it)."""
        return self.exclude_tags() or DEFAULT_EXCLUDED

    def count(self, query: str, exclude_tags: Sequence[str] | None = None) -> int:
        excl = self.exclude_tags() if exclude_tags is None else exclude_tags
        return self._query(lambda db: db.count_messages(_checked(query), exclude_tags=excl))

    def count_soon(self, query: str, exclude_tags: Sequence[str] | None = None
                   ) -> concurrent.futures.Future[int]:
        """``count`` started on a thread of its own, with a read handle of its own, while the
        caller reads a page on this one: notmuch matches the query for each (the count and
        the sorted page are both linear in the matches), so on two cores the total costs
        next to nothing.  ``result()`` gives the count or raises as ``count`` does.  The two
        handles may stand one commit apart for a moment; the count is then off by what that
        commit changed."""
        excl = self.exclude_tags() if exclude_tags is None else tuple(exclude_tags)
        self.db  # opened here first: libnotmuch's one-time set-up on open is not safe to race
        if self._counter is None:
            self._counter = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="notmuch-count")
        return self._counter.submit(self._count_on_counter, query, excl)

    def _count_on_counter(self, query: str, exclude_tags: Sequence[str]) -> int:
        reader = getattr(self._counter_local, "reader", None)
        if reader is None:
            reader = self._counter_local.reader = Reader(self.config_path)
        return reader.count(query, exclude_tags=exclude_tags)

    def _close_counting_reader(self) -> None:
        reader = getattr(self._counter_local, "reader", None)
        if reader is not None:
            reader.close()
            self._counter_local.reader = None

    def _query(self, fn: Callable[[notmuch2.Database], T]) -> T:
        try:
            return self._retrying(fn)
        except notmuch2.NotmuchError as exc:
            raise _rejected(exc) from None

    def messages(self, query: str, *, exclude_tags: Sequence[str] | None = None,
                 sort: str = "newest", offset: int = 0, limit: int | None = None) -> list[IndexedMessage]:
        """One page of matching messages; nothing but the index is read."""
        excl = self.exclude_tags() if exclude_tags is None else exclude_tags

        def page(db: notmuch2.Database) -> list[IndexedMessage]:
            it = db.messages(_checked(query), exclude_tags=excl, sort=_sort(sort))
            return [_indexed(m) for m in itertools.islice(_skipped(it, offset), limit)]
        return self._query(page)

    def message_ids(self, query: str, *, exclude_tags: Sequence[str] = ()) -> list[str]:
        return self._query(lambda db: _ids(db, query, exclude_tags))

    def page_ids(self, query: str, *, exclude_tags: Sequence[str], sort: str = "newest",
                 offset: int = 0, limit: int) -> list[str]:
        """The Message-IDs of one sorted page: the ids alone are cheap (a Xapian value each);
        everything else about a listed message comes from the sidecar mirror."""
        def page(db: notmuch2.Database) -> list[str]:
            it = db.messages(_checked(query), exclude_tags=exclude_tags, sort=_sort(sort))
            return [_message_id(m) for m in itertools.islice(_skipped(it, offset), limit)]
        return self._query(page)

    def find(self, message_id: str) -> IndexedMessage | None:
        def get(db: notmuch2.Database) -> IndexedMessage | None:
            try:
                return _indexed(_find(db, message_id))
            except LookupError:
                return None
        return self._retrying(get)

    def find_first(self, message_ids: Iterable[str]) -> IndexedMessage | None:
        """The first of these Message-IDs the index has (a caller's forms of one id, see
        query.id_forms), or None."""
        return next(filter(None, map(self.find, message_ids)), None)

    def unknown_files(self, paths: Sequence[str]) -> list[str]:
        """Those of these files the index has no message for (a lookup of the file's name)."""
        def get(db: notmuch2.Database) -> list[str]:
            unknown = []
            for path in paths:
                try:
                    db.get(path)
                except LookupError:
                    unknown.append(path)
                except notmuch2.NotmuchError:  # a name libnotmuch cannot place: not ours
                    continue
            return unknown
        return self._retrying(get)

    def is_ghost(self, message_id: str) -> bool:
        """Whether notmuch knows this Message-ID only from replies (see :func:`_find`)."""
        def get(db: notmuch2.Database) -> bool:
            try:
                return bool(db.find(message_id).ghost)
            except LookupError:
                return False
        return self._retrying(get)

    def find_many(self, message_ids: Sequence[str]) -> list[IndexedMessage | None]:
        """Several messages by Message-ID in one snapshot; None for those not in the index."""
        def get(db: notmuch2.Database) -> list[IndexedMessage | None]:
            found: list[IndexedMessage | None] = []
            for mid in message_ids:
                try:
                    found.append(_indexed(_find(db, mid)))
                except LookupError:
                    found.append(None)
            return found
        return self._retrying(get)

    def property(self, message_id: str, key: str) -> str | None:
        """A message property (the first value); None if unset or the message is unknown."""
        def get(db: notmuch2.Database) -> str | None:
            try:
                return _property(_find(db, message_id), key)
            except LookupError:
                return None
        return self._retrying(get)

    def count_threads(self, query: str, exclude_tags: Sequence[str] | None = None) -> int:
        excl = self.exclude_tags() if exclude_tags is None else exclude_tags
        return self._query(lambda db: db.count_threads(query, exclude_tags=excl))

    def threads(self, query: str, *, exclude_tags: Sequence[str] | None = None,
                sort: str = "newest", offset: int = 0, limit: int | None = None) -> list[ThreadSummary]:
        """One page of the threads of the matching messages, as libnotmuch builds them.  A
        page past the first (or the rest of the listing, without ``limit``) is built from the
        query narrowed to its own threads (found in the messages): libnotmuch would build, to
        skip them, every thread before it."""
        excl = self.exclude_tags() if exclude_tags is None else exclude_tags

        def page(db: notmuch2.Database) -> list[ThreadSummary]:
            if not offset:
                return self._summaries(db, query, excl, sort, limit)
            ids = _message_threads(db, query, excl, sort,
                                   None if limit is None else offset + limit)[offset:]
            return self._summaries(db, _of_threads(query, ids), excl, sort) if ids else []
        return self._query(page)

    def threads_of(self, query: str, thread_ids: Sequence[str], *,
                   exclude_tags: Sequence[str]) -> list[ThreadSummary]:
        """These threads of the matching messages, as libnotmuch builds them, in the order
        given (those with no match left out)."""
        def build(db: notmuch2.Database) -> list[ThreadSummary]:
            built = {t.thread_id: t for t in self._summaries(
                db, _of_threads(query, thread_ids), exclude_tags, "none")}
            return [built[t] for t in thread_ids if t in built]
        return self._query(build) if thread_ids else []

    def _summaries(self, db: notmuch2.Database, query: str, exclude_tags: Sequence[str],
                   sort: str, limit: int | None = None) -> list[ThreadSummary]:
        it = self._threads(db.threads(_checked(query), exclude_tags=exclude_tags,
                                      sort=_sort(sort)))
        return [_summary(t) for t in itertools.islice(it, limit)]

    def threads_ranked_at(self, that_date: str, newer: str, *, exclude_tags: Sequence[str],
                          offset: int, limit: int) -> list[str]:
        """The threads whose newest match is of one date -- they match ``that_date`` and not
        ``newer`` (the same search, of that date and of the dates after it) -- in the order
        the mirror ranks them, by the greatest Message-ID of their matches of that date,
        greatest first: those from ``offset``, so many.  Read from that date's messages
        alone (their ids and threads, no thread built), sorted by Message-ID (ascending
        only), from the end: the threads whose greatest Message-ID stands among the last
        ``tail`` messages rank first, whatever comes before them, so only as many are read
        (grown until they hold the page).  Of those, the threads with a newer match are
        looked up in chunks, as far as the page needs."""
        wanted = offset + limit

        def ranked(db: notmuch2.Database) -> list[str]:
            total, tail = db.count_messages(_checked(that_date), exclude_tags=exclude_tags), wanted
            while True:
                it = db.messages(_checked(that_date), exclude_tags=exclude_tags,
                                 sort=_sort("message_id"))
                last: dict[str, None] = {}  # each thread where its greatest Message-ID stands
                for msg in _skipped(it, max(total - tail, 0)):
                    thread = str(msg.threadid)
                    last.pop(thread, None)
                    last[thread] = None
                kept = _without_later(db, list(reversed(last)), newer, exclude_tags, wanted)
                if len(kept) >= wanted or tail >= total:
                    return kept[offset:wanted]
                tail *= 4
        return self._query(ranked)

    def count_ranked_through(self, that_date: str, message_id: str, *,
                             exclude_tags: Sequence[str], ascending: bool = False,
                             newer: str | None = None) -> int:
        """How many of one date's matches (``that_date``) the mirror ranks before the
        Message-ID ``message_id`` or at it -- greatest first, or ``ascending`` -- whether or
        not that message matches; given ``newer`` (see :meth:`threads_ranked_at`), how many
        threads ranked at that date by their greatest Message-ID there.  Read from that
        date's messages alone (their ids, and the threads of those counted), sorted by
        Message-ID: where a page ended stays countable after its last item moved or left."""
        def through(mid: str) -> bool:
            return mid <= message_id if ascending else mid >= message_id

        def counted(db: notmuch2.Database) -> int:
            it = db.messages(_checked(that_date), exclude_tags=exclude_tags,
                             sort=_sort("message_id"))
            ranked = (msg for msg in it if through(_message_id(msg)))
            if newer is None:
                return sum(1 for _ in ranked)
            threads = list(dict.fromkeys(str(msg.threadid) for msg in ranked))
            return len(_without_later(db, threads, newer, exclude_tags, len(threads)))
        return self._query(counted)

    def threads_listed_before(self, that_date: str, thread_id: str, newer: str, *,
                              exclude_tags: Sequence[str], most: int,
                              listed_by: str | None = None) -> tuple[int, str] | None:
        """How many threads libnotmuch lists before the thread ``thread_id`` among those
        ranked at one date (see :meth:`threads_ranked_at`; ``that_date`` holds the thread's
        messages of that date, whether they match or not), whether it still ranks there or
        not: libnotmuch lists one date's threads where their first match comes in the
        messages' order, which within one date is the order it indexed them (by document
        id, the unsorted one).  Read from at most ``most`` of that date's messages (their
        threads, no thread built), with the Message-ID of the thread's first message there
        (where it stood); None where the thread is not among them.  Given ``listed_by``
        (the message libnotmuch listed the thread by), the threads before that message,
        the thread too where a match of it comes earlier (its Message-ID given then)."""
        excluded = set(exclude_tags)

        def place(db: notmuch2.Database) -> tuple[int, str] | None:
            seen: dict[str, None] = {}
            first: str | None = None  # the thread's match before ``listed_by``
            # read whatever their tags: the thread's own messages a search leaves out now
            # (deleted since) still say where it stood.  Others are left out as the search
            # leaves them out (also where it names such a tag, which notmuch then keeps:
            # fewer threads before it, a repeat)
            it = db.messages(_checked(that_date), exclude_tags=(), sort=_sort("none"))
            for msg in itertools.islice(it, most):
                thread, mid = str(msg.threadid), str(msg.messageid)
                if thread == thread_id and listed_by in (None, mid):
                    before = list(seen)
                    return (len(_without_later(db, before, newer, exclude_tags, len(before))),
                            first or mid)
                if excluded.isdisjoint(msg.tags):
                    seen[thread] = None
                    first = first or (mid if thread == thread_id else None)
            return None
        return self._query(place)

    def thread_ids(self, query: str, *, exclude_tags: Sequence[str] | None = None) -> list[str]:
        """The threads of every matching message, in no particular order: read from the
        messages (2-6x quicker than building every thread, and no thread is built)."""
        excl = self.exclude_tags() if exclude_tags is None else exclude_tags
        return self._query(lambda db: _message_threads(db, query, excl, "none"))

    def thread(self, thread_id: str) -> list[ThreadNode]:
        """A whole thread in reply order (depth-first), excluded messages included; none for
        what cannot be a thread id (notmuch would read `{...}` as a query)."""
        return self.thread_start(thread_id, None)[0]

    def thread_start(self, thread_id: str, most: int | None) -> tuple[list[ThreadNode], int]:
        """The first ``most`` messages of a thread (all for None) as :meth:`thread` has them,
        and how many the thread has (libnotmuch counts them as it builds the thread): of the
        others only the Message-ID is read, so showing the start of a thread of 20,000 does
        not read every message of it."""
        if not THREAD_ID.fullmatch(thread_id):
            return [], 0

        def walk(db: notmuch2.Database) -> tuple[list[ThreadNode], int]:
            threads = list(self._threads(db.threads(f"thread:{quote(thread_id)}",
                                                    exclude_tags=())))
            if not threads:
                return [], 0
            return _reply_order(threads[0], most), len(threads[0])
        return self._query(walk)

    def all_tags(self) -> list[str]:
        """Every tag in the index, sorted; read once per snapshot (a tag pattern's search
        asks for them on every call, 0.1-0.2 ms a read)."""
        self.db  # reopens (dropping what this snapshot read) when the index has moved on
        if self._all_tags is None:
            self._all_tags = self._retrying(lambda db: tuple(sorted(str(t) for t in db.tags)))
        return list(self._all_tags)

    def known_files(self, paths: Iterable[str | os.PathLike[str]]) -> frozenset[str]:
        """The paths (as given, decoded with ``os.fspath``) that the index has as a message file.

        A lookup by file name in one snapshot; no message file is opened.  The background
        indexer uses it to tell its own writes (already in the index) from new arrivals.
        """
        wanted = [os.fspath(p) for p in paths]

        def lookup(db: notmuch2.Database) -> frozenset[str]:
            found = set()
            for path in wanted:
                try:
                    db.get(path)
                except LookupError:
                    continue
                found.add(path)
            return frozenset(found)
        return self._retrying(lookup)


def _reply_order(thread: notmuch2.Thread, most: int | None) -> list[ThreadNode]:
    """The first ``most`` messages of ``thread`` (all for None) depth first, replies in
    libnotmuch's order; of the others only the Message-ID is read."""
    # Each message's handle taken from the thread's flat list, by id: a handle reached
    # through replies() of replies() checks every handle above it on each use, recursing
    # once per level, so a chain of replies some hundreds deep (a long list discussion)
    # would exhaust Python's recursion limit.  Of replies() only the ids are read.
    handles = {str(msg.messageid): msg for msg in thread}
    nodes: list[ThreadNode] = []
    stack: list[tuple[str, int, str | None]] = [
        (str(top.messageid), 0, None) for top in reversed(list(thread.toplevel()))]
    while stack and (most is None or len(nodes) < most):
        mid, depth, parent = stack.pop()
        msg = handles.pop(mid, None)  # popped: each message once
        if msg is None:
            continue
        nodes.append(ThreadNode(_indexed(msg), depth, parent))
        replies = [str(reply.messageid) for reply in msg.replies()]
        stack += [(reply, depth + 1, mid) for reply in reversed(replies)]
    return nodes


def _summary(thread: notmuch2.Thread) -> ThreadSummary:
    members = [(m, _is_match(m)) for m in thread]
    return ThreadSummary(
        thread_id=str(thread.threadid),
        subject=str(thread.subject),
        authors=thread_authors((author_of(_header(m, "from")), matched) for m, matched in members),
        oldest=thread.first,
        newest=thread.last,
        message_count=len(thread),
        matched_count=thread.matched,
        tags=frozenset(str(x) for x in thread.tags),
        rank_id=rank_id((m.date, _message_id(m)) for m, matched in members if matched),
        # (a thread's messages come oldest first, ties in index order)
        listed_by=listed_by((m.date, _message_id(m)) for m, matched in members if matched),
    )


# How many candidate threads _without_later asks about at once (``thread:`` terms joined
# by OR): it stops once it has the page, so a chunk bounds what it reads past it.
THREADS_PER_QUERY = 500


def _of_threads(query: str, thread_ids: Sequence[str]) -> str:
    """``query`` narrowed to these threads."""
    return all_of(query, " OR ".join(f"thread:{quote(t)}" for t in thread_ids))


def _without_later(db: notmuch2.Database, threads: Sequence[str], newer: str,
                   exclude_tags: Sequence[str], wanted: int) -> list[str]:
    """The first ``wanted`` of these threads (or all) with no message matching ``newer``,
    looked up in chunks of THREADS_PER_QUERY."""
    kept: list[str] = []
    for at in range(0, len(threads), THREADS_PER_QUERY):
        chunk = threads[at:at + THREADS_PER_QUERY]
        later = set(_message_threads(db, _of_threads(newer, chunk), exclude_tags, "none"))
        kept += [t for t in chunk if t not in later]
        if len(kept) >= wanted:
            break
    return kept


def _message_threads(db: notmuch2.Database, query: str, exclude_tags: Sequence[str],
                     sort: str, count: int | None = None) -> list[str]:
    """The threads of the matching messages (the first ``count``, or all), each where its
    first matching message comes in the messages' order, as libnotmuch lists threads; no
    thread is built."""
    seen: dict[str, None] = {}
    for msg in db.messages(_checked(query), exclude_tags=exclude_tags, sort=_sort(sort)):
        seen.setdefault(str(msg.threadid), None)
        if len(seen) == count:
            break
    return list(seen)


def _ids(db: notmuch2.Database, query: str, exclude_tags: Sequence[str] = ()) -> list[str]:
    return [_message_id(m) for m in db.messages(_checked(query), exclude_tags=exclude_tags)]


# ---------------------------------------------------------------------------------------------
# Writes


def _require_files(msg: notmuch2.Message) -> None:
    """A flag tag change renames the message's files, and libnotmuch skips a file that is gone
    without a word -- the next ``notmuch new`` would then take the tag back from the file's old
    flags.  So refuse, before anything changes, while the index names a missing file."""
    for name in msg.filenamesb():
        if not os.path.lexists(name):
            raise StaleFiles.naming(name)


@dataclass
class TagChange:
    applied: list[str]
    not_found: list[str]


class WriteTxn:
    """What a write batch may do.  Lives only inside :meth:`Writer.run`, on the writer thread."""

    def __init__(self, db: notmuch2.Database) -> None:
        self._db = db
        self.sync_flags = config_bool(db.config.get("maildir.synchronize_flags"), True)

    def revision(self) -> int:
        """The database's revision as this session sees it (its own changes included)."""
        return int(self._db.revision().rev)

    def message_ids(self, query: str) -> list[str]:
        try:
            return _ids(self._db, query)
        except notmuch2.NotmuchError as exc:
            raise _rejected(exc) from None

    def saved_search(self, name: str) -> str | None:
        """The query of notmuch's saved search ``name`` (``query.NAME``), None if there is none."""
        return self._db.config.get(f"query.{name}")

    def get(self, message_id: str) -> IndexedMessage | None:
        try:
            return _indexed(_find(self._db, message_id))
        except LookupError:
            return None

    def tags_and_from(self, message_id: str) -> tuple[frozenset[str], str] | None:
        """A message's tags and From header, from one lookup (cheaper than :meth:`get`: the
        index keeps both with the document); None if it is not indexed."""
        try:
            msg = _find(self._db, message_id)
        except LookupError:
            return None
        return frozenset(str(t) for t in msg.tags), _header(msg, "from")

    def _apply(self, msg: notmuch2.Message, add: Sequence[str], remove: Sequence[str]) -> bool:
        before = frozenset(str(t) for t in msg.tags)
        after = (before - set(remove)) | set(add)
        if after == before:
            return False
        flag_change = self.sync_flags and bool((before ^ after) & FLAG_TAGS)
        if flag_change:
            _require_files(msg)
        # The CLI's order (tag-util.c): freeze, change tags, thaw, then rename the files so
        # their Maildir flags say the same as the tags.
        with msg.frozen():
            for tag in remove:
                msg.tags.discard(tag)
            for tag in add:
                msg.tags.add(tag)
        if flag_change:
            msg.tags.to_maildir_flags()
            behind = _file_behind(msg.filenames(), after)
            if behind is not None:  # libnotmuch skips a file it cannot rename, without a word
                with msg.frozen():
                    for tag in after - before:
                        msg.tags.discard(tag)
                    for tag in before - after:
                        msg.tags.add(tag)
                msg.tags.to_maildir_flags()  # the files it did rename, back
                if not os.path.lexists(behind):  # renamed by mbsync since _require_files
                    raise StaleFiles.naming(behind)
                raise FlagsNotWritten(f"{behind} could not be renamed to carry the Maildir "
                                      "flags of the new tags (is its folder writable?); the "
                                      "tags were left as they were")
        return True

    def change_tags(self, message_ids: Iterable[str], add: Sequence[str] = (),
                    remove: Sequence[str] = ()) -> TagChange:
        """Add and remove tags on messages by Message-ID; files are renamed to match."""
        result = TagChange(applied=[], not_found=[])
        for mid in message_ids:
            try:
                msg = _find(self._db, mid)
            except LookupError:
                result.not_found.append(mid)
                continue
            self._apply(msg, add, remove)
            result.applied.append(mid)
        return result

    def update(self, message_id: str, *, add: Sequence[str] = (), remove: Sequence[str] = (),
               properties: dict[str, str | None] | None = None) -> bool:
        """Tags and properties of one message in a single document rewrite (each thaw
        rewrites the Xapian document, the cost that dominates tagging); False if it is gone.
        A property set to None is removed.  Not for flag tags: use :meth:`change_tags`, which
        renames the files."""
        if (set(add) | set(remove)) & FLAG_TAGS:
            raise ValueError("flag tags change files: use change_tags")
        try:
            msg = _find(self._db, message_id)
        except LookupError:
            return False
        with msg.frozen():
            for key, value in (properties or {}).items():
                del msg.properties[key]
                if value is not None:
                    msg.properties[key] = value
            for tag in remove:
                msg.tags.discard(tag)
            for tag in add:
                msg.tags.add(tag)
        return True

    def set_property(self, message_id: str, key: str, value: str) -> bool:
        """Replace a message property; False if the message is gone."""
        return self.update(message_id, properties={key: value})

    def get_property(self, message_id: str, key: str) -> str | None:
        """A message property (the first value if several); None if unset or the message is gone."""
        try:
            return _property(_find(self._db, message_id), key)
        except LookupError:
            return None

    def add_file(self, path: str | os.PathLike[str], *, sync_flags: bool = True) -> IndexedMessage:
        added = self._db.add(path, sync_flags=sync_flags and self.sync_flags)
        return _indexed(added.msg)

    def index_files(self, paths: Sequence[str], new_tags: Sequence[str],
                    final: Callable[[WriteTxn, Mapping[str, frozenset[str]],
                                     Mapping[str, Sequence[str]], Mapping[str, str]],
                                    Mapping[str, Iterable[str]]],
                    plain: Callable[[str], bool] = lambda _path: False) -> AddedFiles:
        """Index files the way ``notmuch new`` does, except that each new message is written
        with its final tags at once instead of being rewritten later.

        ``notmuch new`` indexes a file, then gives a new message ``new.tags`` (``unread``
        only without the Seen flag) and, with ``maildir.synchronize_flags``, the tags its
        files' flags stand for; another copy of a known message only updates those flag
        tags.  Here the same tags are worked out for the whole batch (``given``), ``final``
        turns them (with each message's files and From header) into the tags each new
        message ends with --
        it may query this session, the batch is indexed -- and each is written once.  Use it
        inside an all-or-nothing session (:meth:`Writer.run`): a batch cut short must not
        leave untagged mail.

        ``plain``: whether a file's message will likely end with just the tags ``notmuch new``
        gives it (the rules change nothing).  Those tags are written at once, through the
        handle that indexed it, as ``notmuch new`` writes them, and not again below unless
        the rules want otherwise: a handle found later must read the document's whole term
        list back to change it, which costs about half as much again as indexing it."""
        added, born, froms = AddedFiles(), {}, {}
        written: dict[str, frozenset[str]] = {}
        for path in paths:
            try:
                msg, copy = self._db.add(path)
            except notmuch2.FileNotEmailError:
                added.not_mail.append(path)
                continue
            except notmuch2.FileError:
                added.unreadable.append(path)
                continue
            mid = msg.messageid
            if not copy:
                added.messages[mid] = [path]
                born[mid] = frozenset(str(t) for t in msg.tags)  # attachment, signed, ...
                froms[mid] = _header(msg, "from")
                if plain(path):  # before the next file, which may merge its thread
                    written[mid] = self._new_tags(born[mid], [path], new_tags)
                    _set_tags(msg, written[mid])
            elif mid in added.messages:  # a second copy in this batch: read with it below
                added.messages[mid].append(path)
            else:
                added.copies += 1
                if self.sync_flags:  # as notmuch new does for a copy of known mail
                    msg.tags.from_maildir_flags()
        given = {mid: self._new_tags(born[mid], files, new_tags)
                 for mid, files in added.messages.items()}
        wanted = {mid: frozenset(tags)
                  for mid, tags in final(self, given, added.messages, froms).items()}
        # Written already, unless a copy later in the batch or a rule changed what they get.
        left = {mid: files for mid, files in added.messages.items()
                if not written.get(mid) == given[mid] == wanted.get(mid, given[mid])}
        if left:
            self._write_tags(left, given, wanted)
        return added

    def _new_tags(self, born: frozenset[str], files: Sequence[str],
                  new_tags: Sequence[str]) -> frozenset[str]:
        """The tags ``notmuch new`` would have given a new message with these files."""
        flags = maildir_flags(files if self.sync_flags else files[:1])
        tags = set(born)
        tags.update(t for t in new_tags if t != "unread" or "S" not in (flags or ""))
        if self.sync_flags:
            tags = with_flag_tags(tags, flags)
        return frozenset(tags)

    def _write_tags(self, messages: Mapping[str, Sequence[str]],
                    given: Mapping[str, frozenset[str]],
                    wanted: Mapping[str, frozenset[str]]) -> None:
        # Fresh handles, from one query: the handle db.add returned holds the document as it
        # was indexed, and a later file of the batch may have merged its thread since --
        # writing that copy back would undo the merge.  (One query, not a find per message:
        # each lookup of a term the session changed makes Xapian flush its pending changes.)
        # The query's handles live only while it is iterated: each is written on the way.
        left = set(messages)
        for msg in self._db.messages(id_query(messages), exclude_tags=()):
            self._write_final(msg, given, wanted)
            left.discard(msg.messageid)
        for mid in sorted(left):  # an id the query did not find (never seen): looked up alone
            self._write_final(_find(self._db, mid), given, wanted)

    def _write_final(self, msg: notmuch2.Message, given: Mapping[str, frozenset[str]],
                     wanted: Mapping[str, frozenset[str]]) -> None:
        mid = msg.messageid
        want = wanted.get(mid, given[mid])
        _set_tags(msg, want)
        # A flag tag a rule changed: the files are renamed to say the same (as tagging does);
        # the flags' own tags need no rename.
        if self.sync_flags and (given[mid] ^ want) & FLAG_TAGS:
            msg.tags.to_maildir_flags()

    def remove_file(self, path: str | os.PathLike[str]) -> bool:
        """Forget one file; True when the message still has other files."""
        return self._db.remove(path)


def _set_tags(msg: notmuch2.Message, want: frozenset[str]) -> None:
    """Give a message exactly these tags, in one write."""
    with msg.frozen():
        have = frozenset(str(t) for t in msg.tags)
        for tag in have - want:
            msg.tags.discard(tag)
        for tag in want - have:
            msg.tags.add(tag)


# notmuch's table of Maildir flags and the tags they stand for; Seen is the inverse of unread.
_FLAG_TAGS = (("D", "draft", False), ("F", "flagged", False), ("P", "passed", False),
              ("R", "replied", False), ("S", "unread", True))
_MAILDIR_LEAVES = ("cur", "new")
_INFO = ":2,"


def _flags_of_tags(tags: Iterable[str]) -> set[str]:
    """The letters of notmuch's flag table that these tags stand for."""
    have = set(tags)
    return {letter for letter, tag, inverted in _FLAG_TAGS if (tag in have) != inverted}


def flags_saying(tags: Iterable[str], flags: str) -> str:
    """A file's Maildir flags made to say what ``tags`` say, as to_maildir_flags would
    rename it: the letters of notmuch's table set from the tags, any others kept."""
    table = {letter for letter, _, _ in _FLAG_TAGS}
    return "".join(sorted({c for c in flags if c not in table} | _flags_of_tags(tags)))


def _file_behind(filenames: Iterable[str | os.PathLike[str]], tags: frozenset[str]
                 ) -> str | None:
    """A file of the message in a ``cur``/``new`` directory whose Maildir flags do not say
    what ``tags`` say (as to_maildir_flags would have renamed it), or None."""
    want = _flags_of_tags(tags)
    for name in (os.fsdecode(f) for f in filenames):
        if os.path.basename(os.path.dirname(name)) not in _MAILDIR_LEAVES:
            continue
        flags = os.path.basename(name).partition(_INFO)[2]
        if {letter for letter, _, _ in _FLAG_TAGS if letter in flags} != want:
            return name
    return None


def maildir_flags(filenames: Iterable[str]) -> str | None:
    """The Maildir flags of a message's files together, as libnotmuch reads them: only files
    in a ``cur``/``new`` directory count; one in ``new/`` without an info part counts as no
    flags; None when no file says anything (then the flags decide no tag)."""
    combined: str | None = None
    for name in filenames:
        leaf = os.path.basename(os.path.dirname(name))
        if leaf not in _MAILDIR_LEAVES:
            continue
        _, sep, flags = os.path.basename(name).partition(_INFO)
        if sep:
            combined = (combined or "") + flags
        elif leaf == "new":
            combined = combined or ""
    return combined


def with_flag_tags(tags: Iterable[str], flags: str | None) -> set[str]:
    """``tags`` after ``notmuch_message_maildir_flags_to_tags`` with these combined flags."""
    out = set(tags)
    if flags is None:
        return out
    for flag, tag, inverse in _FLAG_TAGS:
        if (flag in flags) != inverse:
            out.add(tag)
        else:
            out.discard(tag)
    return out


@dataclass
class AddedFiles:
    """What :meth:`WriteTxn.index_files` did with one batch of files."""

    messages: dict[str, list[str]] = field(default_factory=dict)  # new: Message-ID -> files
    copies: int = 0  # files of messages indexed already (another copy of the same mail)
    not_mail: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # gone or unreadable since listed


@dataclass
class _Job:
    fn: Callable[[WriteTxn], object]
    opened: threading.Event
    done: threading.Event
    lock: threading.Lock
    abandoned: bool = False
    started: bool = False
    all_or_nothing: bool = False
    result: object = None
    error: BaseException | None = None


# libnotmuch 0.37 cannot survive a commit that fails inside an atomic section: its close
# then cancels a Xapian transaction that is already gone, and the C++ exception aborts the
# whole process.  A write session therefore starts only with this much space free, far more
# than a batch's commit needs.
MIN_FREE_BYTES = 8 * 2**20


def _check_space(db: notmuch2.Database) -> None:
    where = str(db.path)
    stat = os.statvfs(where)
    free = stat.f_bavail * stat.f_frsize
    if free < MIN_FREE_BYTES:
        raise DiskFull(free, where)


def _close_reporting(db: notmuch2.Database, job: _Job) -> None:
    """Close a write session; close() commits, and fails on a full disk: the caller must hear
    of it, and the writer thread must live on (a caller waiting for ``done`` would wait forever).

    The handle is destroyed either way: a close that failed leaves Xapian's write lock held
    until the handle is freed, and notmuch2's atomic context keeps it in a reference cycle
    only the garbage collector breaks -- until then every write of this process was "busy"."""
    try:
        db.close()
    except notmuch2.NotmuchError as exc:
        job.error = job.error or WriteNotSaved(exc)
    finally:
        with contextlib.suppress(notmuch2.NotmuchError):
            db._destroy()  # notmuch2 offers no public destroy; its __del__ calls this


class Writer:
    """Runs write batches one at a time on a dedicated thread, each in its own short
    read-write session: open, ``atomic()``, the batch, close.

    The open may block while another process holds the lock; the caller waits at most
    ``lock_timeout`` seconds for it and then gets :class:`DatabaseBusy`.  A batch that was given
    up on is never started later.
    """

    def __init__(self, config_path: str | None = None, lock_timeout: float = WRITE_LOCK_TIMEOUT,
                 *, committing: contextlib.AbstractContextManager[object] | None = None) -> None:
        """``committing``: held from when a batch has the database open until it has closed
        it (committed), never while waiting for the lock; readers in this process that hold
        it too never see one of our commits land in the middle of a read (see Reader)."""
        self.config_path = config_path
        self.lock_timeout = lock_timeout
        self._committing = committing if committing is not None else contextlib.nullcontext()
        self._deadlines = threading.local()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._opening: _Job | None = None  # the job whose read-write open is under way
        self._thread = threading.Thread(target=self._loop, name="notmuch-writer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the writer thread, once the batches under way are done -- not waiting for one
        given up on while its open blocks for the lock: the thread ends once it gets the
        lock, writing nothing, and the caller, told "busy" already, must not wait on."""
        self._jobs.put(None)
        opening = self._opening
        if opening is None or not opening.abandoned:
            self._thread.join(timeout=self.lock_timeout + 5)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def deadline(self, at: float, *, extend: bool = False,
                 asked: float | None = None) -> Iterator[None]:
        """Batches run from this thread inside the block wait for the lock until ``at`` (a
        ``time.monotonic()`` time) at the latest: a caller that queued before reaching the
        Writer is answered "busy" within its own bound.  ``extend``: until ``at``, past the
        caller's bound and ``lock_timeout`` -- for a session that files what was done outside
        already (a message sent), which giving up would leave unfiled.  ``asked``: when the
        caller asked, the start of the wait "busy" reports (else the wait for the lock)."""
        outer = getattr(self._deadlines, "at", None)
        outer_extends = getattr(self._deadlines, "extend", False)
        outer_asked = getattr(self._deadlines, "asked", None)
        self._deadlines.at = at if outer is None or extend else min(at, outer)
        self._deadlines.extend = extend
        # When the caller asked, for "gave up after": a call queued behind others waited there.
        self._deadlines.asked = asked if outer_asked is None else outer_asked
        try:
            yield
        finally:
            self._deadlines.at = outer
            self._deadlines.extend = outer_extends
            self._deadlines.asked = outer_asked

    def busy(self, waited: float) -> DatabaseBusy:
        """"Busy" after ``waited`` seconds for the lock (see :meth:`waited`)."""
        return DatabaseBusy(self.waited(waited))

    def waited(self, waited: float) -> float:
        """How long a caller giving up after ``waited`` seconds for a lock was kept waiting:
        inside a :meth:`deadline` that knows when it asked, the time since (a queue, other
        steps before the lock), else ``waited``."""
        asked = getattr(self._deadlines, "asked", None)
        return waited if asked is None else max(waited, time.monotonic() - asked)

    def time_left(self) -> float | None:
        """Seconds until this thread's deadline (see :meth:`deadline`); None without one."""
        deadline = getattr(self._deadlines, "at", None)
        return None if deadline is None else deadline - time.monotonic()

    def lock_wait(self, lock_timeout: float | None = None) -> float:
        """How long a batch run from this thread now waits for the lock: ``lock_timeout``
        (default the Writer's), cut to this thread's deadline -- or up to it, where that
        extends (see :meth:`deadline`).  A lock taken before notmuch's waits as long."""
        wait = self.lock_timeout if lock_timeout is None else lock_timeout
        left = self.time_left()
        if left is None:
            return wait
        return max(0.0, left if getattr(self._deadlines, "extend", False) else min(wait, left))

    def run(self, fn: Callable[[WriteTxn], T], *, lock_timeout: float | None = None,
            all_or_nothing: bool = False) -> T:
        """Run ``fn`` inside one atomic read-write session and return what it returns.

        If ``fn`` raises, what it wrote so far is committed -- unless ``all_or_nothing``, when
        the session is closed inside its atomic section, which makes libnotmuch cancel it:
        nothing of the batch is saved (for batches whose half would be worse than none)."""
        left = self.time_left()
        if left is not None and left <= 0:  # the time went on waiting before this call
            raise self.busy(0.0)  # nothing is tried
        wait = self.lock_wait(lock_timeout)
        job = _Job(fn=fn, opened=threading.Event(), done=threading.Event(), lock=threading.Lock(),
                   all_or_nothing=all_or_nothing)
        self._jobs.put(job)
        if not job.opened.wait(wait):
            with job.lock:
                if not job.started:
                    job.abandoned = True
                    raise self.busy(wait)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._run_job(job)

    def _open_rw(self, job: _Job) -> notmuch2.Database | None:
        # Without retry_lock libnotmuch fails at once instead of blocking: retry until the
        # caller has given up, so both builds behave the same.
        delay = 0.05
        while True:
            with job.lock:
                if job.abandoned:
                    return None
            try:
                self._opening = job
                return _open(self.config_path, notmuch2.Database.MODE.READ_WRITE)
            except _WriteLocked:
                pass
            finally:
                self._opening = None
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _run_job(self, job: _Job) -> None:
        db = None
        try:
            db = self._open_rw(job)
            with job.lock:
                if db is None or job.abandoned:
                    return
                job.started = True
            job.opened.set()
            _check_space(db)
            # close() commits too: readers wait for it as for the atomic section's end.
            with self._committing:
                try:
                    atomic = db.atomic()
                    atomic.__enter__()
                    try:
                        job.result = job.fn(WriteTxn(db))
                    except BaseException:
                        if not job.all_or_nothing:  # else closed inside the section: cancelled
                            atomic.__exit__(None, None, None)
                        raise
                    atomic.__exit__(None, None, None)
                finally:
                    _close_reporting(db, job)
                    db = None
        except notmuch2.XapianError as exc:  # the commit at the end of atomic()
            job.error = WriteNotSaved(exc)
        except BaseException as exc:  # handed to the caller's thread
            job.error = exc
        finally:
            if db is not None:
                _close_reporting(db, job)
            job.opened.set()
            job.done.set()


# How long write_lock_held tries to open the database read-write, and an index run's own
# indexing before notmuch new (which then waits, said) does: a free lock is had at once.
LOCK_PROBE_WAIT = 1.0


def write_lock_held(config_path: str | None, wait: float = LOCK_PROBE_WAIT) -> bool:
    """Whether another program (a mail client, a notmuch new) holds the write lock now: a
    read-write session that writes nothing, given up after ``wait`` seconds.  For telling
    the user what a ``notmuch new`` about to start will wait for -- it waits silently."""
    with Writer(config_path, lock_timeout=wait) as writer:
        try:
            writer.run(lambda txn: None)
        except DatabaseBusy:
            return True
        except NotmuchAccessError:  # a full disk, a damaged index: notmuch new says it itself
            pass
    return False
