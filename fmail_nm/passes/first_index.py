"""The first index of a mailbox, done by fmail-nm itself: each new message written once, with
the tags it ends with.

``notmuch new`` gives every new message ``new.tags``; the tagging pass then rewrites the
exceptions -- list mail, the user's own, mail in Trash/Junk/Archive -- and on a mailing-list
reader's mailbox the exceptions are most of the mail, each rewrite costing about as much as the
write ``notmuch new`` did.  On an empty database fmail-nm indexes the files itself instead,
through libnotmuch, in batches: each batch's files are indexed, the tags ``notmuch new`` would
give are worked out, the tagging rules run over them (``passes.tagging.final_tags``, the same
rules and the same answers as after ``notmuch new``), and each message is written once.  Worker
processes parse the files a little ahead of the writer (List-Id for the list tags), and a
process of its own builds the sidecar's mirror of each committed batch from those parses while
the next batch is written.

Each batch is one all-or-nothing write session: a run that dies leaves whole batches, and the
next ``fmail-nm index`` finds the rest with ``notmuch new`` and tags them as new mail.  Another
program may take the write lock between two batches (mbsync's post-sync ``notmuch new``, which
would index the files not reached yet with ``new.tags`` alone): the next batch sees that the
revision moved, and the first index stops there, leaving the rest to ``notmuch new`` and the
post-new pass -- the sidecar then takes everything changed after our last batch for new mail.
So it does when a batch cannot have the lock at once: ``notmuch new`` waits for it, said.

Only when nothing else expects to see the new mail: the database holds no message, and the
post-new hook is ours and leaves the pass to ``fmail-nm index`` (a hook of the user's chained
before ours, or one of an earlier version, gets ``notmuch new`` as before).  ``notmuch new``
still runs right after: it records the folders it has seen, runs the user's pre-new hook, and
indexes what was left out here (symlinked folders, mail delivered meanwhile), which the
post-new pass then tags as usual.
"""

from __future__ import annotations

import functools
import logging
import math
import multiprocessing
import os
import queue
from collections import ChainMap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Config
from ..errors import BackendError
from ..progress import INDEXING, ProgressCallback
from ..store import sidecar
from ..store.notmuch import (LOCK_PROBE_WAIT, AddedFiles, DatabaseBusy, Reader, Writer,
                             WriteTxn)
from .mirror import SETUP_REVISION, Mirror, Parsed, exit_with_parent, parse_in_order, sync_lock
from .indexing import Ignored, WrittenMeanwhile, index_batch, unreadable_ignore
from .tagging import configured_new_tags

log = logging.getLogger(__name__)

BATCH_SIZE = 500  # files per write session: about a second of libnotmuch's work


class FirstIndexFailed(BackendError):
    """A folder under the mail root could not be read (the files are listed before any is
    indexed, so nothing was)."""


@dataclass
class FirstIndex:
    files: int = 0
    added: int = 0  # new messages
    copies: int = 0  # files that were another copy of a message
    not_mail: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    revision: int = 0  # the database's revision once done
    mirrored: bool = False  # the sidecar's mirror has it all (else the next sync builds it)
    interrupted: bool = False  # another program wrote meanwhile: the rest is left to the pass

    def count(self, added: AddedFiles) -> None:
        self.added += len(added.messages)
        self.copies += added.copies
        self.not_mail += added.not_mail
        self.unreadable += added.unreadable


def why_not(reader: Reader) -> str | None:
    """Why this index run must leave the first index to ``notmuch new``, as far as the index
    tells (None: it need not); the caller checks the hooks (``service.index``)."""
    if reader.count("*", exclude_tags=()) > 0:
        return "the database is not empty"
    return unreadable_ignore(reader.setting("new.ignore"))


def mail_files(mail_root: Path, ignored: Ignored) -> list[str]:
    """The files ``notmuch new`` would index below ``mail_root``, in the order it would: in
    each folder (entries by inode number, as notmuch sorts a folder it has not seen) first
    every sub-folder, depth first, then the files.  The order matters where notmuch's result
    depends on it: with ``maildir.synchronize_flags`` off, ``unread`` follows the first copy
    of a message read.  ``.notmuch`` and a Maildir's ``tmp`` are skipped, as notmuch does;
    symlinked folders are left to the ``notmuch new`` that follows."""
    files: list[str] = []
    _walk(str(mail_root), "", ignored, files)
    return files


def _walk(folder: str, below: str, ignored: Ignored, files: list[str]) -> None:
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda e: e.inode())
    except OSError as exc:  # notmuch new stops here too, and says why
        raise FirstIndexFailed(f"cannot read {folder}: {exc.strerror}") from None
    dirs = {e.name for e in entries if e.is_dir()}
    maildir = {"cur", "new", "tmp"} <= dirs
    for entry in entries:
        if entry.is_dir(follow_symlinks=False) and not ignored(below + entry.name) and not (
                entry.name == ".notmuch" or (maildir and entry.name == "tmp")):
            _walk(entry.path, below + entry.name + "/", ignored, files)
    files += [e.path for e in entries if e.is_file() and not ignored(below + e.name)]


# What the indexing process tells the follower: a batch's parses (before the batch is
# written, so they are there whenever the batch is), that batch number N has committed, or
# that all is done (None).
_Parses = tuple[int, dict[str, Parsed]]
_Note = _Parses | int | None
# How long no note comes before a dead follower's notes are taken to be all read.
NOTES_QUIET = 0.5


class _MirrorFollower:
    """Builds the sidecar's mirror of the batches committed so far in a process of its own,
    while the next ones are indexed: the mirror's rows then cost the first index little more
    than its last batch.  A process, not a thread: building rows is Python, and a thread doing
    it would take the GIL from the writer thread between every libnotmuch call.  It gets each
    batch's parses (it parses nothing) and marks nothing for tagging (the mail has its tags).
    If it fails, the next sync builds the mirror from scratch."""

    def __init__(self, config: Config) -> None:
        context = multiprocessing.get_context("spawn")  # this process has threads
        self._notes: multiprocessing.Queue[_Note] = context.Queue()
        self._process: multiprocessing.process.BaseProcess | None = context.Process(
            target=follow, args=(config, self._notes), name="fmail-mirror", daemon=True)
        try:
            self._process.start()
        except OSError as exc:  # no process to spare: the mirror is built after the index
            log.warning("the sidecar cannot follow the first index (%s); it is built after", exc)
            self._process = None

    def parsed(self, batch: int, parsed: dict[str, Parsed]) -> None:
        self._tell((batch, parsed))

    def committed(self, batch: int) -> None:
        self._tell(batch)

    def _tell(self, note: _Note) -> None:
        # Nothing for a follower that is gone (killed, out of memory, failed): notes would
        # pile up here, a batch's parses each.
        if self._process is not None and self._process.is_alive():
            self._notes.put(note)

    def finish(self) -> bool:
        """Sync once more, for the last batch, and stop; whether the mirror has it all."""
        if self._process is None:
            return False
        self._tell(None)
        self._process.join()
        if self._process.exitcode != 0:
            self._drop_notes()
        return self._process.exitcode == 0

    def _drop_notes(self) -> None:
        """Notes the follower never read, taken off their pipe and dropped (the next sync
        builds the mirror): the queue's feeder thread waited for room in a pipe no one read,
        holding the batches' parses for as long as the process ran (a service's first index)
        and keeping it from exiting.  Read past the queue's own lock, which a follower killed
        while waiting for a note holds for good."""
        reader = self._notes._reader  # type: ignore[attr-defined]
        try:
            while reader.poll(NOTES_QUIET):
                reader.recv_bytes()
        except (OSError, EOFError):
            pass
        self._notes.cancel_join_thread()  # what it may still hold is of no use either
        self._notes.close()


def follow(config: Config, notes: multiprocessing.Queue[_Note]) -> None:
    """The mirror follower's process: once batches have committed (several, if they queued up
    while it synced), one sync of what notmuch has committed; a last one after ``None``.  A
    batch's parses are dropped once a sync has certainly taken it: memory stays at a few
    batches, whatever the size of the mailbox."""
    exit_with_parent()  # a killed index run leaves no follower waiting for its notes
    parses: dict[int, dict[str, Parsed]] = {}
    path = sidecar.sidecar_path(config.data_dir)
    with Reader(config.settings.notmuch_config) as reader, sidecar.opened(path) as conn:
        done, last = False, None  # last: the newest batch known to have committed
        while not done:
            note: _Note = notes.get()
            while True:
                if note is None:
                    done = True
                elif isinstance(note, int):
                    last = note  # it committed before the sync below reads the revision
                else:
                    parses[note[0]] = note[1]
                try:
                    note = notes.get_nowait()
                except queue.Empty:
                    break
            if last is None:
                continue
            mirror = Mirror(config, reader, conn, prefetched=ChainMap(*parses.values()),
                            mark_new=False)
            try:
                mirror.sync()
            finally:
                mirror.close()
            for batch in [b for b in parses if b <= last]:  # all in that sync
                del parses[batch]


def index_first(config: Config, reader: Reader, *,
                on_progress: ProgressCallback | None = None,
                batch_size: int = BATCH_SIZE) -> FirstIndex:
    """Index every mail file of an empty database (see the module's text); the caller checked
    :func:`why_not`.  The sidecar's mirror is built alongside and marks none of this mail for
    tagging: it has its tags."""
    mail_root = Path(reader.setting("database.mail_root") or config.mail_root)
    files = mail_files(mail_root, Ignored(reader.setting("new.ignore")))
    new_tags = configured_new_tags(reader)
    report = FirstIndex(files=len(files))
    path = sidecar.sidecar_path(config.data_dir)
    # No other sidecar sync meanwhile: it would take this mail for new mail still to tag.
    with sync_lock(path, wait=math.inf):
        with sidecar.opened(path) as conn, sidecar.transaction(conn):
            sidecar.set_state(conn, "notmuch_uuid", None)  # the mirror starts from scratch
        parses = parse_in_order(files)
        follower = _MirrorFollower(config)
        if on_progress is not None:
            on_progress(INDEXING, 0, len(files))
        ours = reader.revision().number  # the revision our last batch left
        try:
            # A lock held elsewhere is waited for by notmuch new, which the index run says
            # (service.index): a wait here would be silent.
            with Writer(config.settings.notmuch_config, lock_timeout=LOCK_PROBE_WAIT) as writer:
                for number, start in enumerate(range(0, len(files), batch_size)):
                    batch = files[start:start + batch_size]
                    parsed = dict(zip(batch, parses))  # kept only until handed over
                    follower.parsed(number, parsed)
                    list_ids = {name: p.list_id for name, p in parsed.items()}
                    added = writer.run(functools.partial(
                        index_batch, paths=batch, list_ids=list_ids, config=config,
                        new_tags=new_tags, revision=ours), all_or_nothing=True)
                    ours = reader.revision().number  # as committed (a session counts apart)
                    report.count(added)
                    follower.committed(number)
                    if on_progress is not None:
                        on_progress(INDEXING, start + len(batch), len(files))
        except (WrittenMeanwhile, DatabaseBusy):
            # The rest is the pass's, after notmuch new, as for any new mail: all that changed
            # after our last batch is taken for new mail by the next sync (built from scratch:
            # the follower may have mirrored the other program's mail as tagged already).
            report.interrupted = True
            log.info("another program wrote to the notmuch database or holds its write lock "
                     "during the first index; notmuch new and the post-new pass do the rest")
        finally:
            parses.close()
            report.mirrored = follower.finish() and not report.interrupted
        report.revision = reader.revision().number
        if not report.mirrored:
            with sidecar.opened(path) as conn, sidecar.transaction(conn):
                # Built from scratch by the next sync, which tags what came after our mail.
                sidecar.set_state(conn, "notmuch_uuid", None)
                sidecar.set_state(conn, SETUP_REVISION, str(ours))
    return report
