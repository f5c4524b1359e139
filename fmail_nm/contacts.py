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
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TextIO

from . import mover, sidecar, writes
from .config import Config
from .mirror import chunks, notmuch_folder
from .nm import IndexedMessage, Reader, Writer, quote
from .writes import WriteContext, WriteOutcome

BLOCK_TAGS = ("blocked", "spam")
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


def _change_tags(writer: Writer, ids: Sequence[str], *, add: Sequence[str] = (),
                 remove: Sequence[str] = ()) -> int:
    """Tag in short write sessions, so a mail client never waits long; returns the count."""
    for chunk in chunks(ids, WRITE_BATCH):
        writer.run(lambda txn, chunk=chunk: txn.change_tags(chunk, add=add, remove=remove))
    return len(ids)


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
    report.tagged += _change_tags(writer, to_tag, add=BLOCK_TAGS)
    ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir), after_write)
    _junk_moves(ctx, to_tag, writes.move_to_junk)
    _junk_moves(ctx, [m.message_id for m in stale if _moved_to_junk(config, reader, m)],
                writes.restore)
    now = [m for m in reader.find_many([m.message_id for m in stale]) if m]  # restore moved some
    keep_spam = [m.message_id for m in now if _in_junk(config, m)]
    drop_spam = [m.message_id for m in now if not _in_junk(config, m)]
    report.untagged += _change_tags(writer, keep_spam, remove=("blocked",))
    report.untagged += _change_tags(writer, drop_spam, remove=BLOCK_TAGS)
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
