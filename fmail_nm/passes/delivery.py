"""A delivery indexed by fmail-nm itself, just before ``notmuch new``: each new message written
once, with the tags it ends with.

After ``notmuch new`` the tagging pass rewrites the new messages the rules treat as exceptions
-- list mail, the user's own, mail in Trash/Junk/Archive -- and a rewrite of a message indexed
in an earlier session is dear: the first change to a Xapian document loads its whole term list
again.  So the files delivered into Maildir ``new/`` folders since the last run (the prefetch
lists them, :mod:`fmail_nm.passes.prefetch`) are indexed here, when there are enough of them
to pay for a write session of their own (``DELIVERY_MIN_FILES``), as the first index does it
(:func:`fmail_nm.passes.indexing.index_batch`): in one all-or-nothing write session, each new
message given the tags ``notmuch new`` would give, the rules run over them (List-Ids read from
the header blocks), and each written once before the session commits.  The prefetch thread
parses the files for the sidecar while the session commits and ``notmuch new`` runs.

``notmuch new`` runs right after, as always: it finds these files indexed and leaves them
alone, and does the rest -- mail in ``cur/``, renames, removals, new folders, whatever arrived
meanwhile -- which the post-new pass tags as usual; the mirror is told which messages have
their tags already, so it does not mark them for tagging.  (Were the run to die between the two,
the next run's mirror would mark them, and the rules would give them the tags they have.)

Only when nothing else expects to see the new mail first: a post-new hook of the user's (or of
an earlier version) expects ``notmuch new`` to bring it the mail with ``new.tags``, and a
pre-new hook runs before any new mail is indexed (it may move or delete files by their tags);
either way ``notmuch new`` indexes the delivery as before.  So it does when another program
holds the write lock or writes first: this module only saves work, and leaves the waiting, and
what is said of it, to the run of ``notmuch new``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..config import Config
from ..message.headers import list_id, read_head, split_head
from ..progress import INDEXING, ProgressCallback
from ..store.notmuch import (LOCK_PROBE_WAIT, AddedFiles, DatabaseBusy, Reader, Writer,
                             WriteTxn)
from . import DELIVERY_MIN_FILES
from .indexing import Ignored, WrittenMeanwhile, index_batch, unreadable_ignore
from .prefetch import Prefetch
from .tagging import configured_new_tags

log = logging.getLogger(__name__)

HEAD_BYTES = 64 * 1024  # as much of a file as the mirror parses (passes.mirror)


class _ListIds(dict[str, str | None]):
    """Each file's List-Id, read from its header block when first asked: the tags need no
    more, and the whole parse (:func:`fmail_nm.passes.mirror.parse_file`, which gives the
    same List-Id) is left to the prefetch thread while the session commits."""

    def __missing__(self, path: str) -> str | None:
        found = self[path] = file_list_id(path)
        return found


def file_list_id(path: str) -> str | None:
    """A file's List-Id, lower case, or None (none, or the file cannot be read)."""
    try:
        with open(path, "rb") as fh:
            head = read_head(fh, HEAD_BYTES)  # all of the headers, as the mirror reads them
        found = list_id(split_head(head)[0])
    except Exception:  # noqa: BLE001 - untrusted input: unreadable is as good as none
        return None
    return found.lower() if found else None


def why_not(reader: Reader) -> str | None:
    """Why a delivery must be left to ``notmuch new``, as far as the index tells (None: it need
    not); the caller checks the post-new hook (``service.index``)."""
    hook_dir = reader.setting("database.hook_dir")
    if hook_dir and os.path.lexists(os.path.join(hook_dir, "pre-new")):
        return "a pre-new hook runs before new mail is indexed"
    return unreadable_ignore(reader.setting("new.ignore"))


def index_delivery(config: Config, reader: Reader, prefetch: Prefetch, *,
                   on_progress: ProgressCallback | None = None,
                   min_files: int = DELIVERY_MIN_FILES) -> AddedFiles | None:
    """Index the files delivered into ``new/`` since the last run that the index does not know
    yet, if there are at least ``min_files`` (see the module's text); the caller checked
    :func:`why_not`.  None: nothing done (too few, the delivery is not known, or another
    program wrote first)."""
    deliveries = prefetch.deliveries()
    if not deliveries or len(deliveries) < min_files:
        return None
    mail_root = Path(reader.setting("database.mail_root") or config.mail_root)
    ignored = Ignored(reader.setting("new.ignore"))
    files = []
    for name in deliveries:
        try:
            relative = Path(name).relative_to(mail_root).as_posix()
        except ValueError:  # below a symlinked mail root, say: notmuch new's
            continue
        if not ignored.anywhere(relative):
            files.append(name)
    files = reader.unknown_files(files)
    try:
        return _index(config, reader, prefetch, files, on_progress) \
            if len(files) >= min_files else None
    finally:
        prefetch.resume(files)  # what is left to parse: the others are indexed already


def _index(config: Config, reader: Reader, prefetch: Prefetch, files: list[str],
           on_progress: ProgressCallback | None) -> AddedFiles | None:
    revision, new_tags = reader.revision().number, configured_new_tags(reader)
    if on_progress is not None:
        on_progress(INDEXING, 0, len(files))

    def session(txn: WriteTxn) -> AddedFiles:
        added = index_batch(txn, files, _ListIds(), config, new_tags, revision)
        # The thread parses for the mirror while Xapian commits (one long call that lets go
        # of the GIL), not beside the indexing above, which it would slow down.
        prefetch.resume(files)
        return added
    try:
        # Not the Writer's usual wait: notmuch new waits for a lock held elsewhere as long as
        # it takes, and the index run says so (service.index): a wait here would be silent.
        with Writer(config.settings.notmuch_config, lock_timeout=LOCK_PROBE_WAIT) as writer:
            added = writer.run(session, all_or_nothing=True)
    except (WrittenMeanwhile, DatabaseBusy):  # notmuch new indexes it, as it would anyway
        log.info("another program wrote to the notmuch database or holds its write lock; "
                 "notmuch new indexes the delivery")
        return None
    if on_progress is not None:
        on_progress(INDEXING, len(files), len(files))
    return added
