"""Contacts the user keeps, and the blocklist that acts on mail.

The blocklist lives in the sidecar (``contact_info.is_blocked``); the notmuch tags follow it.
:func:`apply_blocklist` makes them agree exactly: mail from a blocked address gets ``blocked``
and ``spam`` (so it leaves default searches and the inbox), and mail tagged ``blocked`` whose
sender is no longer blocked loses both again (``spam`` stays on mail that sits in a Junk
folder).  It runs after every tagging pass, so new mail from a blocked sender is caught, and
after every blocklist change.  Addresses are compared exactly, lower-cased: notmuch's
``from:`` only preselects candidates, because it also matches names and longer addresses.
"""

from __future__ import annotations

import csv
import email.utils
import io
import json
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TextIO

from . import mover, sidecar, writes
from .config import Config
from .mirror import chunks, notmuch_folder
from .nm import IndexedMessage, Reader, Writer, WriteTxn, quote
from .sqltools import ContactsResult
from .writes import WriteContext, WriteOutcome

BLOCK_TAGS = ("blocked", "spam")
BLOCK_HIDES = ("inbox",)  # tags blocking takes away
# Message property: JSON {"added": [...], "removed": [...]}, the tags blocking changed.
BLOCK_PROPERTY = "fmail.blocked"
QUERY_CHUNK = 100  # addresses per notmuch query, to keep queries short
WRITE_BATCH = 200
CSV_FIELDS = ("email_address", "name", "is_blocked", "notes")


@dataclass
class BlockReport:
    tagged: int = 0
    untagged: int = 0


def sender_of(message: IndexedMessage) -> str:
    return email.utils.parseaddr(message.from_header)[1].lower()


def _blocked_candidates(reader: Reader, blocked: Sequence[str]) -> list[str]:
    found: list[str] = []
    wanted = set(blocked)
    for chunk in chunks(blocked, QUERY_CHUNK):
        query = "(" + " OR ".join(f"from:{quote(a)}" for a in chunk) + ") AND NOT tag:blocked"
        found.extend(m.message_id for m in reader.messages(query, exclude_tags=(), sort="none")
                     if sender_of(m) in wanted)
    return found


def _in_junk(config: Config, message: IndexedMessage) -> bool:
    junk = set(config.roles().get("junk", []))
    return any(notmuch_folder(name, config.mail_root) in junk for name in message.filenames)


def _in_batches(writer: Writer, ids: Sequence[str], one: Callable[[WriteTxn, str], None]) -> int:
    """Run ``one`` per message in short write sessions, so a mail client never waits long;
    returns the count."""
    def batch(txn: WriteTxn, chunk: Sequence[str]) -> None:
        for mid in chunk:
            one(txn, mid)
    for chunk in chunks(ids, WRITE_BATCH):
        writer.run(lambda txn, chunk=chunk: batch(txn, chunk))
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
    if _in_junk(config, message):
        added, removed = ["blocked"], []
    txn.update(mid, add=removed, remove=sorted({"blocked", *added}),
               properties={BLOCK_PROPERTY: ""})


def apply_blocklist(config: Config, reader: Reader, writer: Writer, blocked: Iterable[str], *,
                    after_write: Callable[[WriteOutcome], None] | None = None) -> BlockReport:
    """Make the ``blocked``/``spam`` tags agree with the blocklist; returns what changed.

    In accounts with ``blocked_to_junk``, newly blocked mail is also moved to the Junk folder
    and, once unblocked, moved back (the write tools' moves: audited, undoable, pushed through
    ``after_write``)."""
    report = BlockReport()
    addresses = sorted({a.lower() for a in blocked})
    to_tag = _blocked_candidates(reader, addresses) if addresses else []
    wanted = set(addresses)
    stale = [m for m in reader.messages("tag:blocked", exclude_tags=(), sort="none")
             if sender_of(m) not in wanted]
    report.tagged += _in_batches(writer, to_tag, _block_one)
    ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir), after_write)
    _junk_moves(ctx, to_tag, writes.move_to_junk)
    _junk_moves(ctx, [m.message_id for m in stale if _moved_to_junk(config, reader, m)],
                writes.restore)
    report.untagged += _in_batches(writer, [m.message_id for m in stale],
                                   lambda txn, mid: _release_one(config, txn, mid))
    return report


def _junk_moves(ctx: WriteContext, ids: Sequence[str],
                action: Callable[..., writes.WriteResult]) -> None:
    """Run a move for the messages of accounts that keep blocked mail in Junk."""
    by_account: dict[str, list[str]] = {}
    mb = ctx.mailbox()
    for message in ctx.reader.find_many(list(ids)):
        account = mover.primary_account(mb, message) if message is not None else None
        if account is not None and account.blocked_to_junk and "junk" in account.folders:
            by_account.setdefault(account.name, []).append(message.message_id)  # type: ignore[union-attr]
    for name, account_ids in by_account.items():
        for chunk in chunks(account_ids, writes.MAX_BATCH):
            action(ctx, chunk, account=name)


def _moved_to_junk(config: Config, reader: Reader, message: IndexedMessage) -> bool:
    """In Junk because a move put it there (restore knows where from), not by the server's
    own filter -- only those go back when their sender is unblocked."""
    return _in_junk(config, message) and reader.property(
        message.message_id, writes.ORIGIN_PROPERTY) is not None


def _messages_from(reader: Reader, addresses: Sequence[str]) -> list[IndexedMessage]:
    wanted = set(addresses)
    found: list[IndexedMessage] = []
    for chunk in chunks(sorted(wanted), QUERY_CHUNK):
        query = " OR ".join(f"from:{quote(a)}" for a in chunk)
        found.extend(m for m in reader.messages(query, exclude_tags=(), sort="none")
                     if sender_of(m) in wanted)
    return found


def record_contacts_write(ctx: WriteContext, sql_query: str, result: ContactsResult, *,
                          after_write: Callable[[WriteOutcome], None] | None = None) -> int:
    """After a contacts statement: apply the blocklist to the mail it affects and record both
    -- contact rows and mail tags, before and after -- as one audit entry, which
    ``undo_last_write`` reverts exactly.  Returns the entry's id."""
    affected = sorted({*result.blocked, *result.unblocked})
    before = _messages_from(ctx.reader, affected) if affected else []
    if affected:
        apply_blocklist(ctx.config, ctx.reader, ctx.writer, read_blocklist(ctx.config),
                        after_write=after_write)
    after = ctx.reader.find_many([m.message_id for m in before])
    changes = [c for old, new in zip(before, after) if new is not None
               if (c := writes.change_record(ctx.config, old, new, [], None, None)) is not None]
    with sidecar.opened(ctx.sidecar_file) as conn:
        return sidecar.record_write(conn, "contacts", {"sql": sql_query[:2000]},
                                    [*changes, *result.contact_changes])


def read_blocklist(config: Config) -> set[str]:
    """The blocked addresses (none when there is no sidecar yet)."""
    path = sidecar.sidecar_path(config.data_dir)
    if not path.exists():
        return set()
    with sidecar.opened(path) as conn:
        return sidecar.blocked_addresses(conn)


# ---------------------------------------------------------------------------------------------
# Editing contacts (the CLI; the MCP tool goes through manage_contacts_sql)


def normalize_address(text: str) -> str:
    address = email.utils.parseaddr(text)[1].strip().lower()
    if "@" not in address or address.startswith("@") or address.endswith("@"):
        raise ValueError(f"not an email address: {text!r}")
    return address


def set_blocked(conn: sqlite3.Connection, addresses: Iterable[str], blocked: bool) -> list[str]:
    """Block or unblock addresses (adding them as contacts if new); returns them normalized."""
    normalized = sorted({normalize_address(a) for a in addresses})
    mine = {row[0] for row in conn.execute("SELECT email FROM me")}
    if blocked and (own := [a for a in normalized if a in mine]):
        raise ValueError(f"{', '.join(own)}: the user's own address(es) cannot be blocked")
    with sidecar.transaction(conn):
        for address in normalized:
            conn.execute(
                "INSERT INTO contact_info (email_address, is_blocked, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (email_address) DO UPDATE SET is_blocked = excluded.is_blocked, "
                "updated_at = excluded.updated_at", (address, int(blocked), sidecar.utc_stamp()))
    return normalized


def search(conn: sqlite3.Connection, text: str = "", *, blocked_only: bool = False,
           limit: int = 50) -> list[sqlite3.Row]:
    conn.row_factory = sqlite3.Row
    try:
        pattern = f"%{text.lower()}%"
        return list(conn.execute(
            "SELECT * FROM contacts WHERE (email_address LIKE ? OR lower(coalesce(name, '')) LIKE ?) "
            "AND (? = 0 OR is_blocked = 1) "
            "ORDER BY messages_from + messages_to DESC, email_address LIMIT ?",
            (pattern, pattern, int(blocked_only), limit)))
    finally:
        conn.row_factory = None


def export_csv(conn: sqlite3.Connection, out: TextIO) -> int:
    """Write what exists only in the sidecar (names, notes, the blocklist) as CSV."""
    writer = csv.writer(out)
    writer.writerow(CSV_FIELDS)
    rows = conn.execute(f"SELECT {', '.join(CSV_FIELDS)} FROM contact_info ORDER BY email_address")
    count = 0
    for row in rows:
        writer.writerow(["" if v is None else v for v in row])
        count += 1
    return count


def import_csv(conn: sqlite3.Connection, source: TextIO) -> int:
    """Merge a CSV written by :func:`export_csv`; rows replace what is there for their address.
    All or nothing: a bad row aborts the import with its line number."""
    reader = csv.DictReader(source)
    missing = [f for f in ("email_address",) if f not in (reader.fieldnames or [])]
    if missing:
        raise ValueError("the CSV has no email_address column (expected: " + ",".join(CSV_FIELDS) + ")")
    count = 0
    with sidecar.transaction(conn):
        for line, row in enumerate(reader, start=2):
            try:
                address = normalize_address(row.get("email_address") or "")
                blocked = (row.get("is_blocked") or "0").strip().lower() in ("1", "true", "yes")
            except ValueError as exc:
                raise ValueError(f"line {line}: {exc}") from None
            conn.execute(
                "INSERT INTO contact_info (email_address, name, is_blocked, notes, updated_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (email_address) DO UPDATE SET "
                "name = excluded.name, is_blocked = excluded.is_blocked, notes = excluded.notes, "
                "updated_at = excluded.updated_at",
                (address, row.get("name") or None, int(blocked), row.get("notes") or None,
                 sidecar.utc_stamp()))
            count += 1
    return count


def format_rows(rows: Sequence[sqlite3.Row]) -> str:
    out = io.StringIO()
    for row in rows:
        flags = " [blocked]" if row["is_blocked"] else ""
        flags += " [me]" if row["is_me"] else ""
        name = f"{row['name']} " if row["name"] else ""
        out.write(f"{name}<{row['email_address']}>{flags}  from {row['messages_from']}, "
                  f"to {row['messages_to']}, last {row['last_seen'] or '-'}")
        if row["notes"]:
            out.write(f"  notes: {row['notes']}")
        out.write("\n")
    return out.getvalue()
