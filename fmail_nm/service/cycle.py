"""A sync cycle: mbsync, then index -- what ``fmail-nm sync`` and a push from the CLI run.

:func:`sync` chains :func:`fmail_nm.service.mbsync.run_mbsync` with
:func:`fmail_nm.service.index.index_between_syncs` (``notmuch new`` with hooks and the post-new
pass, once no other mbsync run of ours is half-way), then a caller's ``after_index``.  Indexing
runs even when mbsync failed: local mail is the truth.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ..clock import utc_now
from ..config import Config
from ..store.notmuch import NotmuchAccessError
from .index import INDEX_TIMEOUT, IndexSummary, index_between_syncs
from .mbsync import (
    LOCK_TIMEOUT,
    MBSYNC_TIMEOUT,
    ChannelBusy,
    Direction,
    MbsyncNotInstalled,
    MbsyncRun,
    not_run,
    run_mbsync,
    selected_accounts,
)

log = logging.getLogger(__name__)


@dataclass
class SyncReport:
    """What :func:`sync` did.  ``ok`` means every channel synced and the index is current."""

    runs: list[MbsyncRun]
    started: datetime
    finished: datetime
    index: IndexSummary | None = None
    index_error: str | None = None
    after_index_error: str | None = None

    @property
    def mbsync_ok(self) -> bool:
        return not self.failed()

    @property
    def ok(self) -> bool:
        return self.mbsync_ok and self.index_error is None and self.after_index_error is None

    def failed(self) -> list[MbsyncRun]:
        """The mbsync runs that failed (an account without a channel is not a failure)."""
        return [r for r in self.runs if r.channel and not r.ok]

    def errors(self) -> list[str]:
        """What went wrong, one line each: the failed runs, then indexing."""
        out = [r.describe() for r in self.failed()]
        if self.index_error:
            out.append(f"indexing failed: {self.index_error}")
        if self.after_index_error:
            out.append(f"after indexing: {self.after_index_error}")
        return out


def _mbsync_or_report(config: Config, account: str | None, direction: Direction,
                      timeout: float, lock_timeout: float) -> list[MbsyncRun]:
    try:
        return run_mbsync(config, account, direction, timeout=timeout, lock_timeout=lock_timeout)
    except MbsyncNotInstalled as exc:
        # Indexing what is on disk is still worth doing; the report carries the reason.
        return [not_run(a, direction, str(exc), skipped=False)
                for a in selected_accounts(config, account)]


def sync(config: Config, account: str | None = None, direction: Direction = "both", *,
         after_index: Callable[[], None] | None = None,
         timeout: float = MBSYNC_TIMEOUT, lock_timeout: float = LOCK_TIMEOUT,
         index_timeout: float = INDEX_TIMEOUT,
         on_lock_wait: Callable[[], None] | None = None,
         on_channel_wait: Callable[[list[str]], None] | None = None) -> SyncReport:
    """mbsync, then ``notmuch new`` with hooks and the post-new pass, then ``after_index()``.

    mbsync failures (server down, bad password, busy channel) are in the report with mbsync's
    own words; indexing and ``after_index`` run regardless, on whatever the Maildir holds --
    a push also renames files (a new message gets its ``,U=<n>``), so it needs indexing too.
    An unknown account or a bad direction raises before anything runs.  ``index_timeout``
    bounds the index: the wait for another mbsync run of ours (another account's, the
    service's) to end, then ``notmuch new``, which waits silently while another program holds
    the write lock; ``on_lock_wait`` is told when it is about to (see :func:`run_index`),
    ``on_channel_wait`` which channels it waits for first, if any (see
    :func:`~fmail_nm.service.index.wait_between_syncs`).
    """
    if account is not None:
        config.account(account)
    started = utc_now()
    report = SyncReport(runs=_mbsync_or_report(config, account, direction, timeout, lock_timeout),
                        started=started, finished=started)
    try:
        # Our own runs are done; another account's may be half-way (the service's pull).
        report.index = index_between_syncs(config, index_timeout, on_lock_wait=on_lock_wait,
                                           on_channel_wait=on_channel_wait)
    except (ChannelBusy, NotmuchAccessError, OSError, subprocess.SubprocessError) as exc:
        report.index_error = str(exc)
    if after_index is not None:
        try:
            after_index()
        except Exception as exc:  # reported, and logged with its traceback
            log.exception("after-index step failed")
            report.after_index_error = f"{type(exc).__name__}: {exc}"
    report.finished = utc_now()
    return report
