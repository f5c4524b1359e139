"""Held copies that became a message's last: each takes the place of the files it was held for.

A copy in a hold (:func:`fmail_nm.store.maildir.ensure_hold`) is out of the index and of the
server, kept aside because its message had another file where it was bound.  When that file
goes too (the phone deleted the copy there, mbsync removed it here, notmuch dropped the
message), the held copy is the last one anywhere, and the hold would prune it.  The post-new
pass hands the messages the index dropped here before the mirror forgets them: a held copy of
one moves into a folder of its account the message was last in (else back into its own
folder), as a file mbsync uploads, and is indexed with the tags the message had.

Not a message last in Trash or Junk folders only: its file there went with an emptied Trash
(or Junk) -- deleted on purpose, here and there.  Its held copy stays held, and the prune
keeps it (its message has no indexed file), out of the index and of the server.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from ..config import ROOT_FOLDER, Config
from ..store import maildir, mover
from ..store.notmuch import WriteTxn
from .mirror import Gone
from .tagging import place_tags

log = logging.getLogger(__name__)


def take_places(txn: WriteTxn, config: Config, gone: Mapping[str, Gone]) -> list[str]:
    """Index again each message of ``gone`` that has a held copy, through that copy (the
    first one found, when it has several); returns their Message-IDs."""
    back: list[str] = []
    for path in maildir.held_files(config):
        message_id = maildir.held_message_id(path)
        last = gone.get(message_id) if message_id is not None else None
        if message_id is None or last is None or txn.get(message_id) is not None:
            continue
        if _thrown_away(config, last):
            continue
        try:
            _take_place(txn, config, path, message_id, last)
        except mover.MoveError as exc:  # it stays held, and the prune keeps it
            log.warning("held copy %s of <%s> could not take its place: %s",
                        path, message_id, exc)
            continue
        back.append(message_id)
    return back


def _thrown_away(config: Config, last: Gone) -> bool:
    """Whether the message was last in Trash or Junk folders only."""
    roles = config.roles()
    bins = set(roles.get("trash", [])) | set(roles.get("junk", []))
    return bool(last.folders) and all(folder in bins for folder in last.folders)


def _take_place(txn: WriteTxn, config: Config, path: Path, message_id: str,
                last: Gone) -> None:
    home = maildir.held_folder(config.mail_root, path) or ROOT_FOLDER
    account = config.account_for_path(home)
    # Another folder of its account first: the copy left its own one on purpose (a mirror
    # not synced since that write still names it).
    folder = next((f for f in last.folders
                   if f != home and config.account_for_path(f) == account), home)
    mover.move_file(txn, path, maildir.ensure_maildir(config, folder), last.tags or None)
    if last.tags:
        txn.change_tags([message_id], add=sorted(last.tags))
    place_tags(txn, config, message_id)
