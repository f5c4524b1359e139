"""The blocklist acting on mail: a pass that makes the ``blocked``/``spam`` tags (and, where an
account wants it, the Junk folder) agree with the blocked addresses in the sidecar.

The blocklist lives in the sidecar (``contact_info.is_blocked``); the notmuch tags follow it.
:func:`apply_blocklist` makes them agree exactly: mail from a blocked address gets ``blocked``
and ``spam`` (so it leaves default searches and the inbox), and mail tagged ``blocked`` whose
sender is no longer blocked is put back as it was before the block -- from the sidecar's
record of each message's tags and folders just before it (``blocked_mail``), written before
the block's tags are.  It runs after every tagging pass, so new mail from a blocked sender is
caught, and after every blocklist change.  Addresses are compared exactly, lower-cased, their
domain in Unicode (:func:`canonical_address`): notmuch's ``from:`` only preselects
candidates, because it also matches names and longer addresses.  List mail whose From the
list rewrote to its own address is its author's (counted as from them, see
:func:`~fmail_nm.message.headers.list_author`): blocked with its author, found in the
mirror, which the post-new pass brings up to date before the blocklist runs.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import Config
from ..message.headers import canonical_address
from ..store import maildir, sidecar
from ..store.maildir import in_role
from ..store.notmuch import IndexedMessage, Reader, Writer, WriteTxn
from ..store.query import quote
from ..store.sidecar import PreBlock, chunks
from ..store.threads import sender
from ..tags import BLOCK_HIDES, BLOCK_TAGS, BLOCKED
from .tagging import folder_place_tags

if TYPE_CHECKING:  # the write engine is imported only where mail moves (see apply_blocklist)
    from . import changes
    from .changes import WriteContext, WriteOutcome

# Message property an earlier version kept what blocking changed in (JSON {"added": [...],
# "removed": [...]}); still read for mail it blocked, and cleared on unblocking.
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
    """The sender's address as the mirror reads it (:func:`store.threads.sender`)."""
    return canonical_address(sender(message.from_header)[1])


def _blocked_candidates(reader: Reader, blocked: Sequence[str]) -> list[str]:
    found: list[str] = []
    wanted = set(blocked)
    for chunk in chunks(blocked, QUERY_CHUNK):
        query = "(" + " OR ".join(f"from:{quote(a)}" for a in chunk) + f") AND NOT tag:{BLOCKED}"
        found.extend(m.message_id for m in reader.messages(query, exclude_tags=(), sort="none")
                     if sender_of(m) in wanted)
    return found


def messages_from(reader: Reader, sidecar_file: Path,
                  addresses: Sequence[str]) -> list[IndexedMessage]:
    """The messages whose sender is exactly one of these addresses (in any form of their
    domain), or whose list author is."""
    wanted = {canonical_address(a) for a in addresses}
    found: list[IndexedMessage] = []
    for chunk in chunks(sorted(wanted), QUERY_CHUNK):
        query = " OR ".join(f"from:{quote(a)}" for a in chunk)
        found.extend(m for m in reader.messages(query, exclude_tags=(), sort="none")
                     if sender_of(m) in wanted)
    have = {m.message_id for m in found}
    return found + _in_notmuch(reader, _authored(sidecar_file, sorted(wanted)) - have)


def _authored(sidecar_file: Path, addresses: Sequence[str]) -> set[str]:
    """The list mail the mirror names one of these (canonical) addresses the author of."""
    if not addresses:
        return set()
    with sidecar.opened(sidecar_file) as conn:
        return sidecar.authored_by(conn, addresses)


def _in_notmuch(reader: Reader, ids: Iterable[str]) -> list[IndexedMessage]:
    """Those of the messages notmuch has (the mirror may still hold mail it dropped)."""
    return [m for m in reader.find_many(sorted(ids)) if m is not None]


Batch = Callable[[Sequence[str], WriteTxn], None]


def _in_batches(writer: Writer, ids: Sequence[str], batch: Batch) -> int:
    """Run ``batch`` on the messages in short write sessions, so a mail client never waits
    long; returns the count."""
    for chunk in chunks(ids, WRITE_BATCH):
        writer.run(functools.partial(batch, chunk))
    return len(ids)


def _folders(config: Config, filenames: Iterable[str]) -> frozenset[str]:
    return frozenset(f for name in filenames
                     if (f := maildir.folder_of(config.mail_root, name)) is not None)


def _block_batch(config: Config, sidecar_file: Path, ids: Sequence[str], txn: WriteTxn) -> None:
    """Tag messages blocked+spam and take them out of the inbox (other notmuch clients may
    not exclude spam).  How each was before is recorded first -- read inside the write
    session, so no other writer changes it in between, and committed before notmuch commits
    the tags, so no blocked message lacks its record."""
    messages = [m for m in map(txn.get, ids) if m is not None]
    with sidecar.opened(sidecar_file) as conn:
        sidecar.save_pre_block(conn, {m.message_id: PreBlock(m.tags, _folders(config, m.filenames))
                                      for m in messages})
    for message in messages:
        txn.update(message.message_id, add=[t for t in BLOCK_TAGS if t not in message.tags],
                   remove=[t for t in BLOCK_HIDES if t in message.tags])


def _released_tags(config: Config, message: IndexedMessage,
                   before: PreBlock) -> tuple[set[str], set[str]]:
    """The tags to add and remove to put a blocked message back as it was before the block.
    Back in the folders it was in then (a Junk move undone), every tag the block or a move
    sets is as it was then; the others -- unread, the user's own -- keep any change made
    since.  Mail in a Junk folder keeps spam and stays out of the inbox; mail moved
    elsewhere while blocked keeps the place tags of where it is, losing what the block added."""
    if in_role(config, message.filenames, "junk"):
        return set(), {BLOCKED}
    if _folders(config, message.filenames) != before.folders:
        return set(), {t for t in BLOCK_TAGS if t not in before.tags} | {BLOCKED}
    managed = {*folder_place_tags(config), *BLOCK_TAGS, *BLOCK_HIDES}
    return (managed & before.tags) - message.tags, (managed & message.tags) - before.tags


def _unrecorded_state(txn: WriteTxn, message: IndexedMessage, config: Config) -> PreBlock:
    """How a message blocked without a record in the sidecar (a sidecar lost and its blocklist
    imported again) was before: its tags now, less what the block added and with what it took
    away, as an earlier version's property says -- else less blocked and spam and, in an
    inbox folder, with the inbox the block took off (as the tagging pass gives mail there),
    in the folders it is in now."""
    try:
        recorded = json.loads(txn.get_property(message.message_id, BLOCK_PROPERTY) or "null")
        added, removed = set(recorded["added"]), set(recorded["removed"])
    except (ValueError, TypeError, KeyError):
        added = set(BLOCK_TAGS)
        removed = set(BLOCK_HIDES) if in_role(config, message.filenames, "inbox") else set()
    return PreBlock((message.tags - added) | removed, _folders(config, message.filenames))


def _release_batch(config: Config, states: Mapping[str, PreBlock], ids: Sequence[str],
                   txn: WriteTxn) -> None:
    for mid in ids:
        message = txn.get(mid)
        if message is None:
            continue
        before = states.get(mid) or _unrecorded_state(txn, message, config)
        add, remove = _released_tags(config, message, before)
        txn.update(mid, add=sorted(add), remove=sorted(remove), properties={BLOCK_PROPERTY: None})


def _pre_block_states(sidecar_file: Path, ids: Sequence[str]) -> dict[str, PreBlock]:
    if not ids:
        return {}
    with sidecar.opened(sidecar_file) as conn:
        return sidecar.pre_block_states(conn, ids)


def apply_blocklist(config: Config, reader: Reader, writer: Writer, blocked: Iterable[str], *,
                    after_write: Callable[[WriteOutcome], None] | None = None,
                    audit: bool = True,
                    reindex: Callable[[], object] | None = None) -> BlockReport:
    """Make the ``blocked``/``spam`` tags agree with the blocklist; returns what changed.

    In accounts with ``blocked_to_junk``, newly blocked mail is also moved to the Junk folder
    and, once unblocked, moved back: the write engine's moves, told to ``after_write`` (sidecar
    sync, push), and tried again after ``reindex`` where the index named a file mbsync has
    renamed (see :class:`~fmail_nm.passes.changes.WriteContext`).  With ``audit`` each move
    batch is its own audit entry; without, the caller records ``report.moves`` in its own (a
    contacts edit is one undoable entry)."""
    report = BlockReport()
    addresses = sorted({canonical_address(a) for a in blocked})
    sidecar_file = sidecar.sidecar_path(config.data_dir)
    to_tag = _blocked_candidates(reader, addresses) if addresses else []
    wanted, authored = set(addresses), _authored(sidecar_file, addresses)
    blocked_now = reader.messages(f"tag:{BLOCKED}", exclude_tags=(), sort="none")
    # Authored mail is looked up in notmuch only when not blocked yet: new mail, mostly.
    to_tag += [m.message_id for m in _in_notmuch(
        reader, authored - {m.message_id for m in blocked_now} - set(to_tag))]
    stale = [m for m in blocked_now
             if sender_of(m) not in wanted and m.message_id not in authored]
    if not to_tag and not stale:
        return report  # every pass after new mail, mostly: nothing for the write engine
    from . import changes

    ctx = changes.WriteContext(config, reader, writer, sidecar_file, after_write, reindex=reindex)
    report.tagged += _in_batches(writer, to_tag,
                                 functools.partial(_block_batch, config, ctx.sidecar_file))
    report.moves += _junk_moves(ctx, to_tag, "junk",
                                functools.partial(changes.move_to_role_step, "junk"), audit)
    stale_ids = [m.message_id for m in stale]
    states = _pre_block_states(ctx.sidecar_file, stale_ids)
    back = [m.message_id for m in stale
            if _moved_to_junk_by_block(config, reader, m, states.get(m.message_id))]
    report.moves += _junk_moves(ctx, back, "restore", changes.restore_step, audit)
    report.untagged += _in_batches(writer, stale_ids,
                                   functools.partial(_release_batch, config, states))
    return report


def _junk_moves(ctx: WriteContext, ids: Sequence[str], action: str,
                step: Callable[[changes.Accounts], changes.Step],
                audit: bool) -> list[dict[str, Any]]:
    """Move the messages in the accounts that keep blocked mail in Junk -- every such account
    holding a copy, since the block's tags are the whole message's -- in short write sessions,
    each message in one; returns the audit records of what moved."""
    by_accounts: dict[frozenset[str], list[str]] = {}
    for message in ctx.reader.find_many(list(ids)):
        if message is None:
            continue
        names = frozenset(account.name for account, _ in
                          maildir.copies_by_account(ctx.config, message)
                          if account.blocked_to_junk and "junk" in account.folders)
        if names:
            by_accounts.setdefault(names, []).append(message.message_id)
    from . import changes

    moved: list[dict[str, Any]] = []
    for names, account_ids in by_accounts.items():
        for chunk in chunks(account_ids, WRITE_BATCH):
            run = changes.apply if audit else _unrecorded
            report = run(ctx, action, {"ids": chunk, "accounts": sorted(names),
                                       "by": "blocklist"}, chunk, step(names))
            moved += report.changes
    return moved


def _unrecorded(ctx: WriteContext, action: str, params: dict[str, Any], ids: Sequence[str],
                step: changes.Step) -> changes.BatchReport:
    from . import changes

    report = changes.run(ctx, ids, step)
    changes.notify(ctx, action, report.changes)
    return report


def _moved_to_junk_by_block(config: Config, reader: Reader, message: IndexedMessage,
                            before: PreBlock | None) -> bool:
    """In Junk because a move put it there (restore knows where from), not by the server's
    own filter, and -- as far as the record of the block says -- not in Junk before the
    block: only those go back when their sender is unblocked."""
    if not in_role(config, message.filenames, "junk"):
        return False
    if before is not None and any(maildir.role_of(config, f) == "junk" for f in before.folders):
        return False
    from .changes import ORIGIN_PROPERTY

    return reader.property(message.message_id, ORIGIN_PROPERTY) is not None


def read_blocklist(config: Config) -> set[str]:
    """The blocked addresses (none when there is no sidecar yet)."""
    path = sidecar.sidecar_path(config.data_dir)
    if not path.exists():
        return set()
    with sidecar.opened(path) as conn:
        return sidecar.blocked_addresses(conn)
