"""The first index of a mailbox, done by fmail-nm itself: each new message written once, with
the tags it ends with.

``notmuch new`` gives every new message ``new.tags``; the tagging pass then rewrites the
exceptions -- list mail, the user's own, mail in Trash/Junk/Archive -- and on a mailing-list
reader's mailbox the exceptions are most of the mail, each rewrite costing about as much as the
write ``notmuch new`` did.  On an empty database fmail-nm indexes the files itself instead,
through libnotmuch, in batches: each batch's files are indexed, the tags ``notmuch new`` would
give are worked out, the tagging rules run over them (``passes.tagging.final_tags``, the same
rules and the same answers as after ``notmuch new``), and each message is written once.  The
files are parsed by worker processes meanwhile (List-Id for the list tags; the mirror takes the
rest), so the sidecar's build afterwards parses nothing.

Each batch is one all-or-nothing write session: a run that dies leaves whole batches, and the
next ``fmail-nm index`` finds the rest with ``notmuch new`` and tags them as new mail.

Only when nothing else expects to see the new mail: the database holds no message, and the
post-new hook is ours and leaves the pass to ``fmail-nm index`` (a hook of the user's chained
before ours, or one of an earlier version, gets ``notmuch new`` as before).  ``notmuch new``
still runs right after: it records the directories it has seen, runs the user's pre-new hook,
and indexes what was left out here (dot files, ``tmp`` folders, symlinked folders), which the
post-new pass then tags as usual.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..adopt.hooks import CHAINED_SUFFIX, defers_pass
from ..config import Config
from ..progress import INDEXING, ProgressCallback
from ..store import sidecar
from ..store.notmuch import AddedFiles, Reader, Writer, WriteTxn
from .mirror import SETUP_REVISION, Parsed, parse_in_order, sync_lock
from .tagging import configured_new_tags, final_tags

BATCH_SIZE = 500  # files per write session: about a second of libnotmuch's work
SKIP_DIRS = frozenset({".notmuch", "tmp"})


@dataclass
class FirstIndex:
    files: int = 0
    added: int = 0  # new messages
    copies: int = 0  # files that were another copy of a message
    not_mail: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    revision: int = 0  # the database's revision once done
    parsed: dict[str, Parsed] = field(default_factory=dict)  # by file name, for the mirror

    def count(self, added: AddedFiles) -> None:
        self.added += len(added.messages)
        self.copies += added.copies
        self.not_mail += added.not_mail
        self.unreadable += added.unreadable


class Ignored:
    """notmuch's ``new.ignore``: names ignored anywhere, and ``/regex/`` patterns matched
    against the path below the mail root.  A pattern Python cannot read makes the first
    index notmuch new's job (:func:`why_not`)."""

    def __init__(self, setting: str) -> None:
        entries = [e.strip() for e in setting.split(";") if e.strip()]
        self.names = frozenset(e for e in entries if not _is_regex(e))
        self.patterns = [re.compile(e[1:-1]) for e in entries if _is_regex(e)]

    def __call__(self, relative: str) -> bool:
        return os.path.basename(relative) in self.names or any(
            p.search(relative) for p in self.patterns)


def _is_regex(entry: str) -> bool:
    return len(entry) >= 2 and entry.startswith("/") and entry.endswith("/")


def why_not(reader: Reader) -> str | None:
    """Why this index run must leave the first index to ``notmuch new`` (None: it need not)."""
    if reader.count("*", exclude_tags=()) > 0:
        return "the database is not empty"
    hook_dir = reader.setting("database.hook_dir")
    if hook_dir:
        hook = Path(hook_dir) / "post-new"
        if (hook.exists() or hook.is_symlink()) and not defers_pass(hook):
            return "a post-new hook other than fmail-nm's current one expects notmuch new"
        if (Path(hook_dir) / ("post-new" + CHAINED_SUFFIX)).exists():
            return "a post-new hook of yours runs after notmuch new"
    try:
        Ignored(reader.setting("new.ignore"))
    except re.error as exc:
        return f"new.ignore has a pattern Python cannot read ({exc})"
    return None


def mail_files(mail_root: Path, ignored: Ignored) -> list[str]:
    """The files ``notmuch new`` would index below ``mail_root``, less any it might not:
    ``tmp`` folders and dot files are left out (notmuch new picks up mail among them right
    after), and symlinked folders are not followed."""
    files: list[str] = []
    for top, dirs, names in os.walk(mail_root):
        below = os.path.relpath(top, mail_root)
        below = "" if below == "." else below + "/"
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")
                         and not ignored(below + d))
        files += [os.path.join(top, n) for n in sorted(names)
                  if not n.startswith(".") and not ignored(below + n)]
    return files


def _index_batch(txn: WriteTxn, paths: Sequence[str], parsed: Mapping[str, Parsed],
                 config: Config, new_tags: frozenset[str]) -> AddedFiles:
    def final(txn: WriteTxn, given: Mapping[str, frozenset[str]],
              files: Mapping[str, Sequence[str]]) -> dict[str, set[str]]:
        list_ids = {mid: parsed[names[0]].list_id for mid, names in files.items()}
        return final_tags(txn, given, list_ids, config, new_tags)
    return txn.index_files(paths, sorted(new_tags), final)


def index_first(config: Config, reader: Reader, writer: Writer, *,
                on_progress: ProgressCallback | None = None,
                batch_size: int = BATCH_SIZE) -> FirstIndex:
    """Index every mail file of an empty database (see the module's text); the caller checked
    :func:`why_not`.  The sidecar's next sync builds the mirror from scratch and marks none
    of this mail for tagging: it has its tags."""
    mail_root = Path(reader.setting("database.mail_root") or config.mail_root)
    files = mail_files(mail_root, Ignored(reader.setting("new.ignore")))
    new_tags = configured_new_tags(reader)
    report = FirstIndex(files=len(files))
    path = sidecar.sidecar_path(config.data_dir)
    # No sidecar sync meanwhile: it would take this mail for new mail still to be tagged.
    with sync_lock(path, wait=True):
        parses = parse_in_order(files)
        if on_progress is not None:
            on_progress(INDEXING, 0, len(files))
        try:
            for start in range(0, len(files), batch_size):
                batch = files[start:start + batch_size]
                report.parsed.update(zip(batch, parses))
                added = writer.run(functools.partial(
                    _index_batch, paths=batch, parsed=report.parsed, config=config,
                    new_tags=new_tags), all_or_nothing=True)
                report.count(added)
                if on_progress is not None:
                    on_progress(INDEXING, start + len(batch), len(files))
        finally:
            parses.close()
        report.revision = reader.revision().number
        with sidecar.opened(path) as conn, sidecar.transaction(conn):
            sidecar.set_state(conn, "notmuch_uuid", None)  # a full build: nothing is lost,
            sidecar.set_state(conn, SETUP_REVISION, str(report.revision))  # the db was empty
    return report
