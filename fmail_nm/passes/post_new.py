"""The post-new pass: what follows every ``notmuch new`` -- the hook runs it, and
:func:`fmail_nm.service.index.run_index` runs it again for anything the hook did not reach.

``NEW_SINCE_ENV`` (:mod:`fmail_nm.passes`) carries the revision before the run from
``run_index`` to the hook; ``PASS_AFTER_ENV`` tells the hook that ``run_index`` runs the pass
itself (in its own process, with everything already imported), so the hook need not start a
second fmail-nm."""

from __future__ import annotations

import functools
import logging
import math
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from ..config import Config
from ..progress import ProgressCallback
from ..store import sidecar
from ..store.notmuch import Reader, Writer, WriteTxn
from .blocklist import BlockReport, apply_blocklist, read_blocklist
from .holds import take_places
from .mirror import Gone, MirrorReport, Parsed, sync_sidecar
from .tagging import Tagger, TaggingReport, configured_new_tags, run_tagging, settle_places

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PostNewReport:
    tagging: TaggingReport
    blocklist: BlockReport
    mirror: MirrorReport


def post_new(config: Config, reader: Reader, writer: Writer, *,
             new_since: int | None = None,
             on_progress: ProgressCallback | None = None,
             prefetched: Mapping[str, Parsed] | None = None,
             tagged: frozenset[str] = frozenset(),
             sync_wait: float = math.inf) -> PostNewReport:
    """What follows every ``notmuch new``: mirror the new mail into the sidecar (each new file
    parsed once, there), tag what the mirror marked as new -- batch by batch, alongside the
    mirror -- give mail whose files changed folders the place tags of where it is now, apply
    the blocklist, and mirror the final tags; a held copy of a message the index dropped takes
    its place (:mod:`fmail_nm.passes.holds`); then drop the audit entries past their days
    (:func:`~fmail_nm.store.sidecar.prune_audit_log`).  ``new_since``: the notmuch revision
    before the index run, when known; ``prefetched``: files parsed while notmuch new ran;
    ``tagged``: new messages that have their final tags already (indexed by
    :mod:`fmail_nm.passes.delivery`); ``sync_wait``: the seconds a sidecar sync running
    elsewhere is waited for, by each of the pass's two syncs, then
    :class:`~fmail_nm.passes.mirror.SyncInProgress` (from the second: the mail is tagged, the
    next pass mirrors its tags)."""
    # A connection held open through the pass: each step opens and closes its own, and SQLite
    # checkpoints the WAL whenever the last connection to it closes (several ms each time).
    with sidecar.opened(sidecar.sidecar_path(config.data_dir)) as conn:
        report = _post_new(config, reader, writer, new_since=new_since,
                           on_progress=_serialized(on_progress), prefetched=prefetched,
                           tagged=tagged, sync_wait=sync_wait)
        _prune_audit_log(conn)  # here, not on each write: a pass writes the sidecar anyway
        return report


def _prune_audit_log(conn: sqlite3.Connection) -> None:
    """Drop the audit entries past their days -- or leave them to the next pass where the
    sidecar is busy (another process writing it): the pass's mail is tagged and mirrored,
    and must not read as failed for housekeeping after it."""
    try:
        sidecar.prune_audit_log(conn)
    except sqlite3.OperationalError as exc:
        if not sidecar.is_busy(exc):
            raise
        log.warning("audit log not pruned this pass (%s); the next pass prunes it", exc)


def _post_new(config: Config, reader: Reader, writer: Writer, *, new_since: int | None,
              on_progress: ProgressCallback | None,
              prefetched: Mapping[str, Parsed] | None,
              tagged: frozenset[str], sync_wait: float) -> PostNewReport:
    # The tagging pass starts on each batch the mirror has committed while the mirror goes on;
    # whatever it did not reach (or a pass that died before left marked) is tagged after.
    moved: list[str] = []
    gone: dict[str, Gone] = {}
    with Tagger(config, writer, configured_new_tags(reader), on_progress=on_progress) as tagger:
        first = sync_sidecar(config, reader, new_since=new_since, on_progress=on_progress,
                             on_marked=tagger.add, on_moved=moved.extend,
                             on_gone=gone.update, prefetched=prefetched, tagged=tagged,
                             wait=sync_wait)
    # A held copy must never be the last: one of a message the index dropped takes its place,
    # with the tags it had (so the mirror below must not tag it as new mail).
    back = writer.run(functools.partial(take_places, config=config, gone=gone)) if gone else []
    tagging = run_tagging(config, reader, writer, on_progress=on_progress,
                          report=tagger.report)
    # Files that changed folders behind our back (another client, or a write of ours killed
    # before notmuch committed it) get the place tags of where they are now.
    if moved:
        tagging.placed = writer.run(functools.partial(settle_places, config=config,
                                                      message_ids=moved))
    blocklist = apply_blocklist(config, reader, writer, read_blocklist(config))
    second = sync_sidecar(config, reader, on_progress=on_progress, tagged=frozenset(back),
                          wait=sync_wait)
    mirror = MirrorReport(full=first.full, upserted=first.upserted + second.upserted,
                          parsed=first.parsed + second.parsed,
                          prefetched=first.prefetched + second.prefetched,
                          removed=first.removed + second.removed, revision=second.revision,
                          uuid=second.uuid)
    return PostNewReport(tagging, blocklist, mirror)


def _serialized(callback: ProgressCallback | None) -> ProgressCallback | None:
    if callback is None:
        return None
    lock = threading.Lock()

    def call(phase: str, done: int, total: int) -> None:
        with lock:
            callback(phase, done, total)
    return call


# Versions before the sidecar held recipients kept the first few in this notmuch property.
OLD_RECIPIENTS_PROPERTY = "fmail.recipients"
DROP_BATCH = 500


def drop_old_recipients(reader: Reader, writer: Writer) -> int:
    """Remove the old recipients property from a database indexed by an earlier version (the
    sidecar has the recipients); a cheap query once none is left.  Returns how many lost it."""
    # A property has no value index; sexp's starts-with finds "key=<anything>" by term prefix.
    ids = reader.message_ids(f'sexp:"(property (starts-with {OLD_RECIPIENTS_PROPERTY}=))"')
    for start in range(0, len(ids), DROP_BATCH):
        writer.run(functools.partial(_drop, ids=ids[start:start + DROP_BATCH]))
    return len(ids)


def _drop(txn: WriteTxn, ids: list[str]) -> None:
    for mid in ids:
        txn.update(mid, properties={OLD_RECIPIENTS_PROPERTY: None})
