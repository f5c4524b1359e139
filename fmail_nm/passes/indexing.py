"""Files indexed by fmail-nm itself, the way ``notmuch new`` would index them, each new message
written once with its final tags: what the first index (:mod:`fmail_nm.passes.first_index`)
and a delivery (:mod:`fmail_nm.passes.delivery`) share -- notmuch's ``new.ignore`` rules and
one batch in one write session.

Kept light to import (no parser, no sidecar mirror): a delivery is indexed at the very start
of an index run, before anything else is loaded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from ..config import Config
from ..errors import BackendError
from ..store.maildir import notmuch_folder
from ..store.notmuch import AddedFiles, WriteTxn
from .tagging import final_tags


class Ignored:
    """notmuch's ``new.ignore``: names ignored anywhere, and ``/regex/`` patterns matched
    against the path below the mail root.  A pattern Python cannot read makes indexing
    notmuch new's job (``why_not`` of the first index and of a delivery)."""

    def __init__(self, setting: str) -> None:
        entries = [e.strip() for e in setting.split(";") if e.strip()]
        self.names = frozenset(e for e in entries if not _is_regex(e))
        self.patterns = [_posix_readable(e[1:-1]) for e in entries if _is_regex(e)]

    def __call__(self, relative: str) -> bool:
        return os.path.basename(relative) in self.names or any(
            p.search(relative) for p in self.patterns)

    def anywhere(self, relative: str) -> bool:
        """Whether ``notmuch new`` would skip this path below the mail root: it tests each
        folder on the way down, then the file."""
        parts = relative.split("/")
        return any(self("/".join(parts[:n])) for n in range(1, len(parts) + 1))


def unreadable_ignore(setting: str) -> str | None:
    """Why fmail-nm cannot follow this ``new.ignore`` itself (a pattern Python's ``re`` cannot
    read), or None."""
    try:
        Ignored(setting)
    except re.error as exc:
        return f"new.ignore has a pattern Python cannot read ({exc})"
    return None


# A POSIX class, collating element or equivalence class inside brackets (``[[:digit:]]``,
# ``[^a[:space:]]``, ``[[.-.]]``, ``[[=e=]]``): a class to notmuch's regcomp, a set of
# characters to Python.  (``[.]`` is a dot to both.)
_POSIX_BRACKET = re.compile(r"(?<!\\)\[[^]]*\[[:.=]")


def _posix_readable(pattern: str) -> re.Pattern[str]:
    """A ``/regex/`` of ``new.ignore`` as Python reads it, if notmuch (POSIX extended regular
    expressions) reads it the same way; else ``re.error``."""
    if _POSIX_BRACKET.search(pattern):
        raise re.error("a POSIX class such as [[:digit:]] is a set of characters to Python",
                       pattern)
    return re.compile(pattern)


def _is_regex(entry: str) -> bool:
    return len(entry) >= 2 and entry.startswith("/") and entry.endswith("/")


class WrittenMeanwhile(BackendError):
    """Another program wrote to the database since the caller last looked (a ``notmuch new``
    that ran meanwhile indexes files this run has not reached, with only ``new.tags``).  The
    callers stop there and leave the rest to notmuch new and the post-new pass."""


def index_batch(txn: WriteTxn, paths: Sequence[str], list_ids: Mapping[str, str | None],
                config: Config, new_tags: frozenset[str], revision: int) -> AddedFiles:
    """Index these files (:meth:`~fmail_nm.store.notmuch.WriteTxn.index_files`), each new
    message written once with the tags the rules give it -- if the database is still at
    ``revision``.  ``list_ids``: each file's List-Id (lower case), asked for the first file
    of each new message only."""
    if txn.revision() != revision:
        raise WrittenMeanwhile()
    inboxes = frozenset(config.roles().get("inbox", ()))

    def plain(path: str) -> bool:
        """Mail in an inbox folder from no list: what the default rules leave as notmuch new
        tagged it (a guess: a wrong one costs a second write, never a wrong tag)."""
        return notmuch_folder(path, config.mail_root) in inboxes and not list_ids[path]

    def final(txn: WriteTxn, given: Mapping[str, frozenset[str]],
              files: Mapping[str, Sequence[str]],
              from_headers: Mapping[str, str]) -> dict[str, set[str]]:
        by_message = {mid: list_ids[names[0]] for mid, names in files.items()}
        return final_tags(txn, given, by_message, from_headers, config, new_tags)
    return txn.index_files(paths, sorted(new_tags), final, plain)
