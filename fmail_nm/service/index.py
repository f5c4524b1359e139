"""``fmail-nm index``: ``notmuch new`` (hooks included), then the post-new pass
(:func:`fmail_nm.passes.post_new.post_new`) for anything the hook did not reach (e.g. when the
hook is not installed), then a summary."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from ..config import Config
from ..passes.post_new import post_new
from ..passes.tagging import TaggingReport, backfill_recipients
from ..store.notmuch import NotmuchAccessError, Reader, Writer
from ..store.notmuch_cli import run_notmuch_new

_PROGRESS = re.compile(r"Processed (\d+)(?: of (\d+))? files?")
_ADDED = re.compile(r"Added (\d+) new messages?")


@dataclass(frozen=True)
class IndexSummary:
    added: int
    total: int
    counts: dict[str, int]
    tagging: TaggingReport
    notmuch_output: str

    def describe(self) -> str:
        """One line for a person: ``indexed: 3 new, 169 messages in all (inbox 98, ...)``."""
        counts = ", ".join(f"{tag} {n}" for tag, n in self.counts.items())
        return f"indexed: {self.added} new, {self.total} messages in all ({counts})"


class IndexingFailed(NotmuchAccessError):
    """notmuch new failed; the message carries its output.  (A NotmuchAccessError, so a
    :class:`~fmail_nm.errors.BackendError`: the request was fine, the machinery failed.)"""


def progress_bar(line: str, width: int = 30) -> str | None:
    """Render notmuch's progress line as a bar, or None if the line is not progress."""
    match = _PROGRESS.search(line)
    if not match:
        return None
    done = int(match.group(1))
    total = int(match.group(2)) if match.group(2) else 0
    if not total:
        return f"indexing: {done} files"
    filled = min(width, width * done // total)
    return f"indexing [{'#' * filled}{'.' * (width - filled)}] {done}/{total} files"


def _terminal_progress(line: str) -> None:
    bar = progress_bar(line)
    if bar is not None:
        sys.stderr.write("\r" + bar)
        sys.stderr.flush()


def summary_counts(reader: Reader) -> dict[str, int]:
    return {tag: reader.count(f"tag:{tag}", exclude_tags=())
            for tag in ("inbox", "unread", "sent", "list", "flagged", "attachment")}


def run_index(config: Config, *, show_progress: bool | None = None, backfill: bool = False,
              on_line: Callable[[str], None] | None = None,
              timeout: float | None = None) -> IndexSummary:
    """``backfill`` (init does it) also stores recipients for messages indexed before our hook
    existed; it walks the whole index, so the regular index run leaves it out.

    ``timeout`` bounds ``notmuch new`` (hooks included): a run still going after that long --
    typically waiting silently for a write lock another program holds -- is stopped and
    reported as :class:`IndexingFailed` instead of hanging the caller."""
    notmuch_config = config.settings.notmuch_config
    interactive = sys.stderr.isatty() if show_progress is None else show_progress
    handler = on_line or (_terminal_progress if interactive else None)
    result = run_notmuch_new(notmuch_config, as_tty=interactive, on_line=handler, timeout=timeout)
    if interactive:
        sys.stderr.write("\n")
    if result.timed_out:
        raise IndexingFailed(
            f"notmuch new did not finish within {timeout:g}s and was stopped; another program "
            f"(a mail client, another notmuch new) may be holding the notmuch write lock")
    if result.returncode != 0:
        raise IndexingFailed(f"notmuch new failed (exit {result.returncode}):\n{result.output.strip()}")
    added = int(m.group(1)) if (m := _ADDED.search(result.output)) else 0
    with Reader(notmuch_config) as reader, Writer(notmuch_config) as writer:
        if backfill:
            backfill_recipients(reader, writer)
        report = post_new(config, reader, writer)
        return IndexSummary(added=added, total=reader.count("*", exclude_tags=()),
                            counts=summary_counts(reader), tagging=report.tagging,
                            notmuch_output=result.output)
