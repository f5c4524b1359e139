"""Watch the Maildir tree and report message files that arrived, left or changed, in batches.

One recursive watch on the mail root: inotify adds a watch for every directory created later,
so a folder mbsync creates after start is covered without a restart.  Only files directly in a
Maildir's ``new/`` or ``cur/`` count -- ``tmp/`` is where deliveries are still being written
(a folder made and removed there counts neither), ``.notmuch/`` is the database, and dotfiles
are mbsync's state and locks.

Events are debounced (:class:`~fmail_nm.service.debounce.Debouncer`): mbsync or a burst of
deliveries makes hundreds of events in a second, and one ``notmuch new`` handles them all.
After the first event the watcher waits until ``quiet`` seconds pass without another, but never
longer than ``max_delay`` after the first, then hands the distinct paths to ``on_batch`` on its
own thread (one batch at a time).

A file written straight into ``new/`` or ``cur/`` -- not in ``tmp/`` and renamed, as Maildir
wants, but by ``cp`` or ``rsync --inplace`` on a slow disk -- is handed over when its writer
closes it (inotify's ``IN_CLOSE_WRITE``), not when it is created or written to, and until then
:meth:`MailWatcher.writing` names it, so that the service holds back every index run: ``notmuch
new`` would index the part written so far, under a made-up id while the Message-ID is not there
yet, and never read that file name again.  A write held open longer than ``write_wait`` holds
back nothing more.  A file created by ``link()`` (the Maildir delivery without a rename) is not
empty, and counts as arrived.  Polling sees no closes: it hands over what it sees created or
changed.

When the kernel's inotify queue overflows (``fs.inotify.max_queued_events``) events are lost;
watchdog then rebuilds its watches but tells no handler, so the watcher's own observer calls
``on_overflow`` -- the service answers with a full index run, which finds what was missed.

When inotify is not available or runs out of watches (``fs.inotify.max_user_watches``) the
watcher polls instead -- slower to notice, and it stats the whole tree every interval, but it
does not silently miss folders.  That holds for a folder made while it runs, too (mbsync
creating a new IMAP folder): watchdog only logs one it could not watch, so the watcher looks
after each watch it adds, and switches to polling, with a full index run, when one is missing.
Polling is not for good: every ``INOTIFY_RETRY`` seconds, doubled after each try that fails (up
to ``INOTIFY_RETRY_MAX``), it tries inotify again -- the limit may have been raised, or other
programs freed their watches -- and once the whole tree fits it stops polling and has
everything indexed, which finds what arrived during the switch.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from watchdog.events import (
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer as NativeObserver
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

try:
    from watchdog.observers.inotify import InotifyObserver
except ImportError:  # not Linux: the native observer is something else, with no watch limit
    InotifyObserver = None  # type: ignore[assignment,misc]
try:  # watchdog 7's recursive watch, which handles IN_Q_OVERFLOW (older ones drop it)
    from watchdog.observers.inotify import _INVALID_WD, InotifyEmitter, InotifyWatchGroup
    from watchdog.observers.inotify_c import InotifyFD
except ImportError:  # then only the service's safety interval makes up for lost events
    InotifyWatchGroup = None  # type: ignore[assignment,misc]

from ..config import Config, each_directory_once
from .debounce import Debouncer

log = logging.getLogger(__name__)

WATCH_LIMIT_SYSCTL = "fs.inotify.max_user_watches"
INSTANCE_LIMIT_SYSCTL = "fs.inotify.max_user_instances"
POLL_INTERVAL = 2.0
# Polling after inotify ran out: when to try inotify again, and the longest wait between tries.
INOTIFY_RETRY = 300.0
INOTIFY_RETRY_MAX = 3600.0
WRITE_WAIT = 60.0  # how long a file being written straight into new/ or cur/ holds index runs
# Created, moved (both ends), deleted, and written (modified: a write going on, with inotify;
# closed after writing: its end); and folders removed or moved (one moved out of the tree
# sends nothing for its files).
_EVENTS: list[type[FileSystemEvent]] = [FileCreatedEvent, FileDeletedEvent, FileMovedEvent,
                                        FileModifiedEvent, FileClosedEvent, DirDeletedEvent,
                                        DirMovedEvent]
_MAILDIR_SUBDIRS = ("new", "cur")


def is_message_path(path: str, mail_root: str, ignore: Iterable[str] = ()) -> bool:
    """Whether a path is a message file notmuch indexes: directly in a ``new/`` or ``cur/``
    below the mail root, not a dotfile or lock, not inside ``.notmuch`` or an ignored tree."""
    head, name = os.path.split(path)
    if not name or name.startswith(".") or name.endswith(".lock"):
        return False
    if os.path.basename(head) not in _MAILDIR_SUBDIRS:
        return False
    return _in_mail_tree(path, mail_root, ignore)


def _in_mail_tree(path: str, mail_root: str, ignore: Iterable[str]) -> bool:
    """Whether a path lies below the mail root, outside ``.notmuch`` and the ignored trees."""
    if not _inside(path, mail_root) or path == mail_root:
        return False
    if ".notmuch" in os.path.relpath(path, mail_root).split(os.sep):
        return False
    return not any(_inside(path, tree) for tree in ignore)


def _inotify_watch_count() -> int | None:
    """Inotify watches this process holds, from /proc (None where that cannot be read)."""
    total = 0
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            if "inotify" not in os.readlink(f"/proc/self/fd/{fd}"):
                continue
            with open(f"/proc/self/fdinfo/{fd}", encoding="ascii", errors="replace") as info:
                total += sum(1 for line in info if line.startswith("inotify wd:"))
        except OSError:
            continue
    return total


def count_dirs(root: str) -> int:
    """Directories a recursive inotify watch covers: symlinked ones followed, as the watch
    and notmuch new follow them, each directory once (inotify has one watch per inode);
    unreadable ones are skipped (watchdog skips them too, so they must not look like a
    shortfall)."""
    total = 0
    for here, dirnames in each_directory_once(root):
        total += 1
        dirnames[:] = [d for d in dirnames
                       if os.access(os.path.join(here, d), os.R_OK | os.X_OK)]
    return max(total, 1)


def linked_trees(root: str) -> list[str]:
    """The symlinked directories in the tree whose target lies outside it (each target
    once): notmuch new indexes through them, a recursive inotify watch does not.  A link
    back into the tree is left out -- its folders are watched already."""
    real_root = os.path.realpath(root)
    found: list[str] = []
    targets: set[str] = set()
    for here, dirnames, _ in os.walk(root):  # links are listed, not entered
        for name in dirnames:
            path = os.path.join(here, name)
            target = os.path.realpath(path)
            if (os.path.islink(path) and not _inside(target, real_root)
                    and target not in targets and os.path.isdir(target)):
                targets.add(target)
                found.append(path)
    return found


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: MailWatcher, *, sees_closes: bool) -> None:
        self.watcher = watcher
        self.sees_closes = sees_closes  # inotify: a write's end is told

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            # A folder moved out of the tree sends this event alone, none for its files.
            if event.event_type in ("deleted", "moved"):
                dest = os.fsdecode(event.dest_path) if event.dest_path else ""
                self.watcher._folder_left(os.fsdecode(event.src_path), dest)
            return
        paths = [os.fsdecode(event.src_path)]
        if isinstance(event, FileMovedEvent) and event.dest_path:
            # A move is an arrival at dest_path and a departure from src_path.
            paths.append(os.fsdecode(event.dest_path))
        if self.sees_closes:
            going_on = [self.watcher._note_write(event.event_type, path) for path in paths]
            if any(going_on):  # handed over on its close
                return
        self.watcher._add(paths, event.event_type)


if InotifyObserver is not None and InotifyWatchGroup is not None:
    @dataclass
    class _OverflowGroup(InotifyWatchGroup):
        """watchdog's recursive watch, which also says when the kernel dropped events and
        when a folder got no watch."""

        on_overflow: Callable[[], None] = lambda: None
        on_unwatched: Callable[[str], None] = lambda folder: None

        def on_queue_overflow(self) -> None:
            super().on_queue_overflow()  # rebuilds the watches
            self.on_overflow()

        def _add_callback(self, path: bytes) -> None:
            super()._add_callback(path)
            # Once running, watchdog only logs a folder it could not watch (out of watches);
            # one gone again or unreadable meanwhile needs none.
            if not self.is_active:  # starting: watchdog raises, and the watcher polls
                return
            node = self._find_node_by_path(path)
            if ((node is None or node.wd == _INVALID_WD) and os.path.isdir(path)
                    and os.access(path, os.R_OK | os.X_OK)):
                self.on_unwatched(os.fsdecode(path))

    class _OverflowEmitter(InotifyEmitter):
        def __init__(self, *args: Any, on_overflow: Callable[[], None],
                     on_unwatched: Callable[[str], None], **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._on_overflow = on_overflow
            self._on_unwatched = on_unwatched

        def on_thread_start(self) -> None:
            # InotifyEmitter.on_thread_start, with the group that reports an overflow.
            self._inotify = _OverflowGroup(
                self._inotify_fd, os.fsencode(self.watch.path),
                is_recursive=self.watch.is_recursive,
                event_mask=self.get_event_mask_from_filter(),
                follow_symlink=self.watch.follow_symlink, on_overflow=self._on_overflow,
                on_unwatched=self._on_unwatched)

    class _ClosingInotifyFD(InotifyFD):
        """watchdog's inotify instance, closed however early it is stopped.  watchdog 7.1
        closes it on its reader's thread, and a stop before that thread's first read ends
        the thread with the instance still open: about one in three observers stopped at
        once (a try of inotify that ran out of watches) kept theirs, until the user's
        limit of instances (128 by default) was gone, for every program."""

        _resources_closed = False

        def _close_resources(self) -> None:
            self._resources_closed = True
            super()._close_resources()

        def run(self) -> None:
            try:
                super().run()
            finally:
                with self._lock:
                    if self._closed and not self._resources_closed:
                        self._close_resources()

    class _OverflowObserver(InotifyObserver):
        """The inotify observer, calling ``on_overflow`` after the kernel's queue overflowed
        and ``on_unwatched`` with a folder it could not watch."""

        def __init__(self, on_overflow: Callable[[], None],
                     on_unwatched: Callable[[str], None]) -> None:
            super().__init__()
            # Made here, so that schedule() uses it instead of watchdog's own (see above).
            self._inotify_fd = _ClosingInotifyFD()
            self._inotify_fd.start()
            self._emitter_kwargs["inotify_fd"] = self._inotify_fd
            # BaseObserver builds each watch's emitter from these two.
            self._emitter_class = _OverflowEmitter
            self._emitter_kwargs["on_overflow"] = on_overflow
            self._emitter_kwargs["on_unwatched"] = on_unwatched


def _native_observer(on_overflow: Callable[[], None],
                     on_unwatched: Callable[[str], None]) -> BaseObserver:
    """The platform's observer; on Linux the one that reports an overflowed inotify queue
    and a folder left unwatched."""
    if (InotifyObserver is not None and InotifyWatchGroup is not None
            and NativeObserver is InotifyObserver):
        return _OverflowObserver(on_overflow, on_unwatched)
    return NativeObserver()


class MailWatcher:
    """Debounced batches of changed message paths below ``config.mail_root``.

    ``force_polling`` skips inotify (and is how the polling path is tested); ``ignore`` lists
    further trees to leave out (e.g. a notmuch database kept inside the mail root under
    another name than ``.notmuch``); ``on_overflow`` is called when inotify lost events
    (its queue overflowed, or the mail root was removed and is watched anew), which only a
    full index run can make up for, and ``on_folder_gone``
    (with the folder) when a folder left the tree -- moved elsewhere, which tells nothing of
    the files it took along.
    """

    def __init__(self, config: Config, on_batch: Callable[[list[Path]], None], *,
                 quiet: float = 1.0, max_delay: float = 10.0, force_polling: bool = False,
                 poll_interval: float = POLL_INTERVAL, write_wait: float = WRITE_WAIT,
                 ignore: Iterable[Path] = (),
                 on_overflow: Callable[[], None] = lambda: None,
                 on_folder_gone: Callable[[str], None] = lambda folder: None) -> None:
        self.mail_root = os.fspath(config.mail_root)
        self.on_batch = on_batch
        self.on_overflow = on_overflow
        self.on_folder_gone = on_folder_gone
        self.quiet = quiet
        self.max_delay = max(max_delay, quiet)
        self.force_polling = force_polling
        self.poll_interval = poll_interval
        self.write_wait = write_wait
        self.ignore = tuple(os.fspath(p) for p in ignore)
        self.mode: str | None = None  # "inotify" or "polling" once started
        self._debouncer: Debouncer[str] | None = None  # the delivering thread, once started
        self._observer: BaseObserver | None = None
        self._stopping = threading.Event()
        self._guard: threading.Thread | None = None
        self._observer_lock = threading.Lock()  # the observer is replaced when the root is
        self._root_id: tuple[int, int] | None = None  # the watched root's (device, inode)
        # A rewatch is under way; its own lock, as an observer's thread asks for one while
        # _observer_lock may be held by a start that waits for that thread.
        self._rewatching = False
        # One asked for while a replacement (or a try of inotify) was under way: that one may
        # have started before what asked (a folder it could not watch), so one more follows.
        self._rewatch_again = False
        self._rewatch_lock = threading.Lock()
        self._writes: dict[str, float] = {}  # file being written in place -> since (monotonic)
        self._writes_lock = threading.Lock()
        # Polling because inotify could not watch the tree: the wait before trying it again,
        # and when (monotonic); None while not polling for that reason.
        self._retry_wait = INOTIFY_RETRY
        self._retry_at: float | None = None

    # -- public ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._debouncer is not None:
            raise RuntimeError("the watcher was already started")
        # watchdog warns (harmlessly) when a folder created with its subfolders at once, as
        # mbsync does, gets the same watch twice; that is noise in a service's log.
        warnings.filterwarnings("ignore", message="Callback with id .* already exists",
                                category=RuntimeWarning, module="watchdog")
        # Before the observer, so its first event has somewhere to go.
        self._debouncer = Debouncer(self._deliver, quiet=self.quiet, max_wait=self.max_delay,
                                    name="mail-watcher")
        try:
            self._observer = self._start_observer()
        except BaseException:
            self._debouncer.close()
            raise
        self._guard = threading.Thread(target=self._guard_root, name="mail-root-guard",
                                       daemon=True)
        self._guard.start()
        log.info("watching %s for new mail (%s)", self.mail_root, self.mode)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop watching; events not yet handed over are dropped (the next ``notmuch new``
        finds those files anyway).  Waits at most ``timeout`` for a batch being handed over."""
        deadline = time.monotonic() + timeout
        if self._debouncer is not None:
            dropped = self._debouncer.close(flush=False, timeout=0)
            if dropped:
                log.debug("watcher stopped with %d event(s) not handed over", len(dropped))
        self._stopping.set()
        with self._observer_lock:
            observer = self._observer
        if observer is not None:
            observer.stop()
            observer.join(max(0.0, deadline - time.monotonic()))
        # A try of inotify under way on the guard's thread holds an inotify instance until
        # it has failed or been stopped (it sees the stop): done before stop() returns.
        if self._guard is not None and self._guard is not threading.current_thread():
            self._guard.join(max(0.0, deadline - time.monotonic()))
        if self._debouncer is not None:
            self._debouncer.join(max(0.0, deadline - time.monotonic()))

    def pending(self) -> int:
        """Distinct paths waiting for the debounce or being handed over."""
        if self._debouncer is None:
            return 0
        state = self._debouncer.state()
        return len(state.pending) + len(state.in_flight)

    def writing(self) -> list[str]:
        """Message files being written in place (created empty or written to, not closed yet),
        for less than ``write_wait`` seconds: a writer keeping a file open longer holds back
        nothing.  Always empty when polling."""
        now = time.monotonic()
        with self._writes_lock:
            return [path for path, since in self._writes.items()
                    if now - since < self.write_wait]

    @property
    def batches(self) -> int:
        """Batches handed to ``on_batch`` so far."""
        return self._debouncer.state().batches if self._debouncer is not None else 0

    # -- the observer --------------------------------------------------------------------------

    def _schedule(self, observer: BaseObserver, *, linked: bool = False) -> None:
        handler = _Handler(self, sees_closes=_is_inotify(observer))
        observer.schedule(handler, self.mail_root, recursive=True, event_filter=_EVENTS)
        # inotify does not follow symlinks, but notmuch new does: a folder kept on another
        # disk and linked into the tree gets a watch of its own, under its path in the tree.
        # (Polling stats through links already.)
        for path in linked_trees(self.mail_root) if linked else ():
            observer.schedule(handler, path, recursive=True, event_filter=_EVENTS,
                              follow_symlink=True)

    def _start_observer(self) -> BaseObserver:
        self._root_id = _identity(self.mail_root)
        if not self.force_polling:
            observer = self._start_native()
            if observer is not None:
                self.mode = _native_mode(observer)
                return observer
        polling = PollingObserver(timeout=self.poll_interval)
        self._schedule(polling)
        polling.start()
        self.mode = "polling"
        if not self.force_polling:
            self._retry_wait = INOTIFY_RETRY
            self._retry_at = time.monotonic() + self._retry_wait
        return polling

    def _start_native(self, level: int = logging.WARNING) -> BaseObserver | None:
        """The platform's observer, or None (logged at ``level``) when it cannot watch the
        tree."""
        before = _inotify_watch_count()
        expected = count_dirs(self.mail_root)
        observer = _native_observer(self._overflowed, self._unwatched)
        try:
            self._schedule(observer, linked=True)
            observer.start()
        except OSError as exc:
            # Stopped, not just dropped: its inotify instance and reader thread would outlive
            # it, one more for each try while polling, until the user's instance limit is
            # used up for every program.
            observer.stop()
            log.log(level, "cannot watch %s with inotify (%s); polling every %gs instead. %s",
                    self.mail_root, exc, self.poll_interval, _limit_advice(exc.errno))
            return None
        after = _inotify_watch_count()
        if before is not None and after is not None and _is_inotify(observer):
            added = after - before
            # watchdog skips (silently) a subfolder it could not watch; a shortfall that is not
            # explained by folders removed meanwhile means the watch limit was hit (counted
            # again only then: each count walks the whole tree).
            if added < expected and added < count_dirs(self.mail_root):
                observer.stop()
                observer.join(5)
                log.log(level, "inotify could watch only %d of %d folders under %s; polling "
                        "every %gs instead. %s", added, expected, self.mail_root,
                        self.poll_interval, _limit_advice(errno.ENOSPC))
                return None
        return observer

    # -- debounce ------------------------------------------------------------------------------

    def _add(self, paths: list[str], kind: str) -> None:
        wanted = [p for p in paths if is_message_path(p, self.mail_root, self.ignore)]
        if not wanted or self._debouncer is None:
            return
        log.debug("mail event %s: %s", kind, " -> ".join(wanted))
        self._debouncer.add(wanted)  # refused (dropped) once stopping

    def _note_write(self, kind: str, path: str) -> bool:
        """Follow a file written in place; True while its writer is still at it (its close
        hands it over).  Any other event ends the write: closed, deleted or renamed."""
        if not is_message_path(path, self.mail_root, self.ignore):
            return False
        going_on = kind == "modified" or (kind == "created" and _is_empty(path))
        with self._writes_lock:
            if going_on:
                self._writes.setdefault(path, time.monotonic())  # from its first write
            else:
                self._writes.pop(path, None)
        return going_on

    def _folder_left(self, folder: str, moved_to: str) -> None:
        """A folder of the tree removed or moved: moved within the tree, its files' own
        events tell; moved out, nothing else does."""
        if folder == self.mail_root and not moved_to:
            self._root_gone()
            return
        if (not _in_mail_tree(folder, self.mail_root, self.ignore)
                or _inside(moved_to, self.mail_root) or _in_maildir_tmp(folder, self.mail_root)):
            return
        log.debug("folder left the mail tree: %s", folder)
        try:
            self.on_folder_gone(folder)
        except Exception:  # the observer thread must keep running
            log.exception("handling a folder that left the mail tree failed")

    def _guard_root(self) -> None:
        """Notice a mail root moved away (``mv ~/Mail ~/Mail.old``, a backup put in its place):
        inotify says nothing of it -- the watches follow the moved directory, whose events
        then pass for the root's -- so its identity is compared every poll interval.  Polling
        for want of inotify watches, it also tries inotify again when that is due."""
        while not self._stopping.wait(self.poll_interval):
            with self._observer_lock:
                watched = self._root_id
                retry_at = self._retry_at if self.mode == "polling" else None
            with self._rewatch_lock:
                rewatching = self._rewatching
            if not rewatching and watched is not None and _identity(self.mail_root) != watched:
                self._root_gone()
            elif retry_at is not None and time.monotonic() >= retry_at:
                self._retry_native()

    def _retry_native(self) -> None:
        """Try inotify again while polling, and switch to it when it watches the whole tree
        (then everything is indexed: what arrived during the switch may be half seen)."""
        with self._rewatch_lock:  # a rewatch replaces the observer too
            if self._rewatching or self._stopping.is_set():
                return
            self._rewatching = True
        try:
            switched = self._switch_to_native()
        finally:
            self._rewatch_done()
        if not switched:
            return
        log.info("inotify watches all of %s again; stopped polling, indexing everything",
                 self.mail_root)
        try:
            self.on_overflow()
        except Exception:
            log.exception("asking for an index after leaving polling failed")

    def _switch_to_native(self) -> bool:
        """Replace the polling observer by a native one that watches the whole tree; False
        (and the next try later) when there is none yet.  The native one starts before the
        polling one stops, so no delivery falls between them."""
        native = self._start_native(level=logging.DEBUG)  # the fallback warned already
        if native is None:
            self._retry_wait = min(self._retry_wait * 2, INOTIFY_RETRY_MAX)
            self._retry_at = time.monotonic() + self._retry_wait
            log.debug("inotify still cannot watch %s; trying again in %gs", self.mail_root,
                      self._retry_wait)
            return False
        with self._observer_lock:
            if self._stopping.is_set():  # stop() stops the observer it found
                old: BaseObserver | None = native
            else:
                old, self._observer = self._observer, native
                self.mode = _native_mode(native)
                self._retry_at = None
        if old is not None:
            old.stop()
            old.join(5)
        return old is not native

    def _root_gone(self) -> None:
        """The mail root itself was removed or moved away (replaced by a restored backup,
        ``rm -rf`` and a fresh pull): the watches went with it.  Watch again once it is back
        and have everything indexed."""
        if self._rewatch_soon():  # the removal's event and the guard may both tell
            log.warning("the mail root %s was removed or moved; watching it again once it is "
                        "back", self.mail_root)

    def _unwatched(self, folder: str) -> None:
        """A folder made while running got no watch (out of inotify watches): its mail would
        go unseen, so the tree is watched anew -- polled, when inotify still cannot watch it
        all -- and everything indexed."""
        if self._rewatch_soon():  # said once, not for each of the folder's subfolders
            log.warning("cannot watch the new folder %s with inotify (watch limit reached); "
                        "watching %s anew, which polls if inotify cannot take it all. %s",
                        folder, self.mail_root, _limit_advice(errno.ENOSPC))

    def _rewatch_soon(self) -> bool:
        """Replace the observer on a thread of its own (the observer's thread may be the
        caller) -- after the replacement or try of inotify under way, if any; False when one
        is waiting for that already."""
        with self._rewatch_lock:
            if self._rewatch_again or self._stopping.is_set():
                return False
            if self._rewatching:
                self._rewatch_again = True  # see _rewatch_done
                return True
            self._rewatching = True
        self._start_rewatch()
        return True

    def _start_rewatch(self) -> None:
        threading.Thread(target=self._rewatch, name="mail-rewatch", daemon=True).start()

    def _rewatch(self) -> None:
        try:
            self._watch_again()
        finally:
            self._rewatch_done()

    def _rewatch_done(self) -> None:
        """A replacement or try of inotify ended: the one asked for meanwhile starts now."""
        with self._rewatch_lock:
            again = self._rewatch_again and not self._stopping.is_set()
            self._rewatch_again = False
            self._rewatching = again  # handed on to that one
        if again:
            self._start_rewatch()

    def _watch_again(self) -> None:
        with self._observer_lock:
            old, self._observer = self._observer, None
        if old is not None:
            old.stop()
            old.join(5)
        while not os.path.isdir(self.mail_root):
            if self._stopping.wait(self.poll_interval):
                return
        with self._observer_lock:
            if self._stopping.is_set():
                return
            try:
                self._observer = self._start_observer()
            except Exception:  # the safety index still runs; the log says why
                log.exception("cannot watch %s again", self.mail_root)
                return
        log.info("watching %s again (%s); indexing everything", self.mail_root, self.mode)
        try:
            self.on_overflow()  # what landed meanwhile was seen by no watch
        except Exception:
            log.exception("asking for an index after watching anew failed")

    def _overflowed(self) -> None:
        log.warning("inotify lost events under %s (its queue overflowed, see "
                    "fs.inotify.max_queued_events); indexing everything", self.mail_root)
        try:
            self.on_overflow()
        except Exception:  # the observer thread must keep running
            log.exception("handling an inotify queue overflow failed")

    def _deliver(self, batch: list[str]) -> None:
        try:
            self.on_batch([Path(p) for p in batch])
        except Exception:  # keep watching; the next batch or index run catches up
            log.exception("handling %d changed mail file(s) failed", len(batch))


def _identity(path: str) -> tuple[int, int] | None:
    """A directory's (device, inode), or None when it is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _in_maildir_tmp(path: str, mail_root: str) -> bool:
    """Whether a path below the mail root is a Maildir's ``tmp/`` or lies in it: notmuch new
    skips that tree (a ``tmp`` beside ``cur`` and ``new``), so nothing in it was indexed -- a
    folder a client or mbsync made and removed there asks for no index run."""
    head = path
    while head != mail_root and _inside(head, mail_root):
        head, name = os.path.split(head)
        if name == "tmp" and all(os.path.isdir(os.path.join(head, sub))
                                 for sub in _MAILDIR_SUBDIRS):
            return True
    return False


def _is_empty(path: str) -> bool:
    """Whether a file is empty -- one created to be written, not linked in; False when it is
    gone (its deletion is told next)."""
    try:
        return os.stat(path).st_size == 0
    except OSError:
        return False


def _inside(path: str, tree: str) -> bool:
    return bool(path) and (path == tree or path.startswith(tree.rstrip(os.sep) + os.sep))


def _is_inotify(observer: BaseObserver) -> bool:
    return InotifyObserver is not None and isinstance(observer, InotifyObserver)


def _native_mode(observer: BaseObserver) -> str:
    return "inotify" if _is_inotify(observer) else "native"


def _limit_advice(err: int | None) -> str:
    if err == errno.EMFILE:
        return (f"Raise the inotify instance limit, e.g. `sudo sysctl "
                f"{INSTANCE_LIMIT_SYSCTL}=1024`.")
    return (f"Raise the inotify watch limit, e.g. `sudo sysctl {WATCH_LIMIT_SYSCTL}=524288` "
            f"(and in /etc/sysctl.d/ to keep it).")
