"""The blocklist acting on mail: a pass that makes the ``blocked``/``spam`` tags (and, where an
account wants it, the Junk folder) agree with the blocked addresses in the sidecar.

The blocklist lives in the sidecar (``contact_info.is_blocked``); the notmuch tags follow it.
:func:`apply_blocklist` makes them agree exactly: mail from a blocked address gets ``blocked``
and ``spam`` (so it leaves default searches and the inbox), and mail tagged ``blocked`` whose
sender is no longer blocked loses both again (``spam`` stays on mail that sits in a Junk
folder).  It runs after every tagging pass, so new mail from a blocked sender is caught, and
after every blocklist change.  Addresses are compared exactly, lower-cased: notmuch's
``from:`` only preselects candidates, because it also matches names and longer addresses.
"""

from __future__ import annotations

import email.utils
import functools
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import Config
from ..store import maildir, sidecar
from ..store.maildir import in_role
from ..store.notmuch import IndexedMessage, Reader, Writer, WriteTxn
from ..store.query import quote
from ..store.sidecar import chunks
from ..tags import BLOCK_HIDES, BLOCK_TAGS, BLOCKED
from . import changes
from .changes import ORIGIN_PROPERTY, WriteContext, WriteOutcome

# Message property: JSON {"added": [...], "removed": [...]}, the tags blocking changed.
BLOCK_PROPERTY = "fmail.blocked"
QUERY_CHUNK = 100  # addresses per notmuch query, to keep queries short
WRITE_BATCH = 200


@dataclass
class BlockReport:
    tagged: int = 0
    untagged: int = 0
    # The audit records of the Junk moves (accounts with blocked_to_junk), for a caller that
    # records them in an entry of its own.
    moves: list[dict[str, Any]] = field(default_factory=list)


def sender_of(message: IndexedMessage) -> str:
    return email.utils.parseaddr(message.from_header)[1].lower()


def _blocked_candidates(reader: Reader, blocked: Sequence[str]) -> list[str]:
    found: list[str] = []
    wanted = set(blocked)
    for chunk in chunks(blocked, QUERY_CHUNK):
        query = "(" + " OR ".join(f"from:{quote(a)}" for a in chunk) + f") AND NOT tag:{BLOCKED}"
        found.extend(m.message_id for m in reader.messages(query, exclude_tags=(), sort="none")
                     if sender_of(m) in wanted)
    return found


def messages_from(reader: Reader, addresses: Sequence[str]) -> list[IndexedMessage]:
    """The messages whose sender is exactly one of these addresses."""
    wanted = set(addresses)
    found: list[IndexedMessage] = []
    for chunk in chunks(sorted(wanted), QUERY_CHUNK):
        query = " OR ".join(f"from:{quote(a)}" for a in chunk)
        found.extend(m for m in reader.messages(query, exclude_tags=(), sort="none")
                     if sender_of(m) in wanted)
    return found


def _in_batches(writer: Writer, ids: Sequence[str], one: Callable[[WriteTxn, str], None]) -> int:
    """Run ``one`` per message in short write sessions, so a mail client never waits long;
    returns the count."""
    def batch(txn: WriteTxn, chunk: Sequence[str]) -> None:
        for mid in chunk:
            one(txn, mid)
    for chunk in chunks(ids, WRITE_BATCH):
        writer.run(functools.partial(batch, chunk=chunk))
    return len(ids)


def _block_one(txn: WriteTxn, mid: str) -> None:
    """Tag one message blocked+spam and take it out of the inbox (other notmuch clients may
    not exclude spam), recording exactly which tags this changed, so unblocking undoes only
    that -- a spam tag the user had set stays."""
    message = txn.get(mid)
    if message is None:
        return
    added = [t for t in BLOCK_TAGS if t not in message.tags]
    removed = [t for t in BLOCK_HIDES if t in message.tags]
    txn.update(mid, add=added, remove=removed, properties={
        BLOCK_PROPERTY: json.dumps({"added": added, "removed": removed})})


def _release_one(config: Config, txn: WriteTxn, mid: str) -> None:
    """Undo what :func:`_block_one` changed; mail in a Junk folder keeps spam and stays out
    of the inbox.  Mail blocked before the change was recorded loses blocked and spam."""
    message = txn.get(mid)
    if message is None:
        return
    try:
        recorded = json.loads(txn.get_property(mid, BLOCK_PROPERTY) or "null")
        added, removed = list(recorded["added"]), list(recorded["removed"])
    except (ValueError, TypeError, KeyError):
        added, removed = list(BLOCK_TAGS), []
    if in_role(config, message.filenames, "junk"):
        added, removed = [BLOCKED], []
    txn.update(mid, add=removed, remove=sorted({BLOCKED, *added}),
               properties={BLOCK_PROPERTY: ""})


def apply_blocklist(config: Config, reader: Reader, writer: Writer, blocked: Iterable[str], *,
                    after_write: Callable[[WriteOutcome], None] | None = None,
                    audit: bool = True) -> BlockReport:
    """Make the ``blocked``/``spam`` tags agree with the blocklist; returns what changed.

    In accounts with ``blocked_to_junk``, newly blocked mail is also moved to the Junk folder
    and, once unblocked, moved back: the write engine's moves, told to ``after_write`` (sidecar
    sync, push).  With ``audit`` each move batch is its own audit entry; without, the caller
    records ``report.moves`` in its own (a contacts edit is one undoable entry)."""
    report = BlockReport()
    addresses = sorted({a.lower() for a in blocked})
    to_tag = _blocked_candidates(reader, addresses) if addresses else []
    wanted = set(addresses)
    stale = [m for m in reader.messages(f"tag:{BLOCKED}", exclude_tags=(), sort="none")
             if sender_of(m) not in wanted]
    report.tagged += _in_batches(writer, to_tag, _block_one)
    ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir), after_write)
    report.moves += _junk_moves(ctx, to_tag, "junk", changes.move_to_role_step, audit)
    report.moves += _junk_moves(ctx, [m.message_id for m in stale if _moved_to_junk(config, reader, m)],
                                "restore", lambda _, account: changes.restore_step(account),
                                audit)
    report.untagged += _in_batches(writer, [m.message_id for m in stale],
                                   lambda txn, mid: _release_one(config, txn, mid))
    return report


def _junk_moves(ctx: WriteContext, ids: Sequence[str], action: str,
                step: Callable[[str, str | None], changes.Step],
                audit: bool) -> list[dict[str, Any]]:
    """Move the messages of accounts that keep blocked mail in Junk, per account, in short
    write sessions; returns the audit records of what moved."""
    by_account: dict[str, list[str]] = {}
    for message in ctx.reader.find_many(list(ids)):
        if message is None:
            continue
        account = maildir.primary_account(ctx.config, message)
        if account is not None and account.blocked_to_junk and "junk" in account.folders:
            by_account.setdefault(account.name, []).append(message.message_id)
    moved: list[dict[str, Any]] = []
    for name, account_ids in by_account.items():
        for chunk in chunks(account_ids, WRITE_BATCH):
            run = changes.apply if audit else _unrecorded
            report = run(ctx, action, {"ids": chunk, "account": name, "by": "blocklist"},
                         chunk, step("junk", name))
            moved += report.changes
    return moved


def _unrecorded(ctx: WriteContext, action: str, params: dict[str, Any], ids: Sequence[str],
                step: changes.Step) -> changes.BatchReport:
    report = changes.run(ctx, ids, step)
    changes.notify(ctx, action, report.changes)
    return report


def _moved_to_junk(config: Config, reader: Reader, message: IndexedMessage) -> bool:
    """In Junk because a move put it there (restore knows where from), not by the server's
    own filter -- only those go back when their sender is unblocked."""
    return (in_role(config, message.filenames, "junk")
            and reader.property(message.message_id, ORIGIN_PROPERTY) is not None)


def read_blocklist(config: Config) -> set[str]:
    """The blocked addresses (none when there is no sidecar yet)."""
    path = sidecar.sidecar_path(config.data_dir)
    if not path.exists():
        return set()
    with sidecar.opened(path) as conn:
        return sidecar.blocked_addresses(conn)
