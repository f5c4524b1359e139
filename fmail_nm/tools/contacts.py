"""Contacts the user keeps: edits (SQL through ``tools.sql``, or the CLI's block/unblock and
CSV import), their effect on mail, and CSV export/import of what lives only in the sidecar.

Every edit that changes contacts goes through :func:`apply_contacts_change`, the one place that
retags the affected mail (the blocklist pass), records contact rows and mail changes as ONE
audit entry (so ``undo_last_write`` reverts both, Junk moves included), and tells the
follow-up (sidecar sync, mbsync push).
"""

from __future__ import annotations

import csv
import email.utils
import io
import sqlite3
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

from ..clock import utc_stamp
from ..errors import BackendError, CallerError
from ..message.headers import canonical_address
from ..passes.blocklist import (
    BlockReport,
    apply_blocklist,
    messages_from,
    read_blocklist,
)
from ..passes.changes import (
    ORIGIN_PROPERTY,
    UndoUnderWay,
    WriteContext,
    change_record,
    until_recorded,
)
from ..store import sidecar
from ..store.notmuch import NotmuchAccessError
from . import sql
from .render import counted

CSV_FIELDS = ("email_address", "name", "is_blocked", "notes")


@dataclass
class ContactsChange:
    """What an edit did to the contacts: row by row before and after (the audit's contact
    rows, see :func:`tools.sql.contact_diff`)."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def addresses_reblocked(self) -> list[str]:
        """The addresses the edit blocked or unblocked."""
        blocked, unblocked = sql.block_changes(self.rows)
        return sorted({*blocked, *unblocked})


@contextmanager
def tracked(conn: sqlite3.Connection) -> Iterator[ContactsChange]:
    """Record what the edits made inside the block change in the contacts (as they make
    them: see tools.sql.track_contacts, no read of every contact)."""
    change = ContactsChange()
    sql.track_contacts(conn)
    yield change
    change.rows = sql.contact_diff(*sql.tracked_contacts(conn))


@dataclass(frozen=True)
class MailEffect:
    """What a contacts edit did to mail, and its audit entry (None: nothing changed)."""

    audit_id: int | None
    tagged: int = 0  # messages newly tagged blocked
    untagged: int = 0  # messages released


def apply_contacts_change(ctx: WriteContext, action: str, params: dict[str, Any],
                          rows: Sequence[dict[str, Any]]) -> MailEffect:
    """After contacts changed (``rows``: contact rows before/after): apply the blocklist to the
    mail of the addresses whose block changed, and record contact rows and mail changes --
    tags, Junk moves -- as one audit entry, which ``undo_last_write`` reverts exactly.
    The caller holds ``until_recorded`` from before it saved the rows.
    """
    affected = ContactsChange(list(rows)).addresses_reblocked()
    before = messages_from(ctx.reader, ctx.sidecar_file, affected) if affected else []
    origins = {m.message_id: ctx.reader.property(m.message_id, ORIGIN_PROPERTY) for m in before}
    report = BlockReport()
    if affected:
        try:
            report = apply_blocklist(ctx.config, ctx.reader, ctx.writer,
                                     read_blocklist(ctx.config), after_write=ctx.after_write,
                                     audit=False, reindex=ctx.reindex)
        except NotmuchAccessError as exc:  # the contacts are saved: say so, keep them undoable
            with sidecar.opened(ctx.sidecar_file) as conn:
                sidecar.record_write(conn, action, params, list(rows), ctx.session)
            raise MailNotRetagged(exc) from None
    moved = {c["message_id"]: c for c in report.moves}
    records = []
    for old, new in zip(before, ctx.reader.find_many([m.message_id for m in before])):
        if new is None:
            continue
        record = change_record(ctx.config, old, new, [], origins[old.message_id],
                               ctx.reader.property(old.message_id, ORIGIN_PROPERTY))
        if record is not None:
            record["moves"] = moved.pop(old.message_id, {}).get("moves", [])
            records.append(record)
    records += moved.values()  # moved mail of senders the edit did not name (stale blocks)
    if not records and not rows:
        return MailEffect(None)
    with sidecar.opened(ctx.sidecar_file) as conn:
        entry = sidecar.record_write(conn, action, params, [*records, *rows],
                                     ctx.session)
    return MailEffect(entry, report.tagged, report.untagged)


class MailNotRetagged(BackendError):
    """The contacts change is saved, but notmuch could not be written to retag its mail."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(
            f"the contacts change is saved (undo_last_write takes it back), but its mail could "
            f"not be retagged now ({exc}); the next index run applies the blocklist to it")


def manage_contacts(ctx: WriteContext, sql_query: str, account_name: str | None = None, *,
                    confirm_count: int | None = None) -> sql.ContactsResult:
    """The ``manage_contacts_sql`` tool: the statement (see :func:`tools.sql.manage_contacts_sql`
    for what is allowed and when it needs ``confirm_count``), then its effect on mail."""
    def run(rehearse: bool, before_write: Callable[[], None] | None) -> sql.ContactsResult:
        return sql.manage_contacts_sql(
            ctx.sidecar_file, sql_query, account_name,
            known_accounts=[a.name for a in ctx.config.accounts],
            folder_account=ctx.config.account_name_for_path, confirm_count=confirm_count,
            own_addresses=ctx.config.addresses, rehearse=rehearse, before_write=before_write)

    with ExitStack() as held:  # the rows saved, then the mail retagged, then the record
        result = _run_once(ctx, held, run, lambda done: bool(done.changed and not done.dry_run))
        if not result.dry_run and result.changed:
            result.audit_id = apply_contacts_change(ctx, "contacts", {"sql": sql_query[:2000]},
                                                    result.contact_changes).audit_id
    return result


T = TypeVar("T")


def _run_once(ctx: WriteContext, held: ExitStack[bool | None],
              run: Callable[[bool, Callable[[], None] | None], T],
              changes: Callable[[T], bool]) -> T:
    """``run(rehearse, before_write)`` once, for real, the undo lock (see until_recorded)
    entered into ``held`` when it calls ``before_write`` -- at once, if no undo holds it.
    While one does, a run that ``changes`` nothing (a read, a refusal, an edit that finds
    things as they are) answers from a rehearsal, rolled back, without waiting for the undo;
    only a change waits for it, then runs again for real."""
    try:
        return run(False, lambda: held.enter_context(until_recorded(ctx, wait=0.0)))
    except UndoUnderWay:
        rehearsal = run(True, None)
        if not changes(rehearsal):
            return rehearsal
        held.enter_context(until_recorded(ctx))
        return run(False, None)


def edit_contacts(ctx: WriteContext, action: str, params: dict[str, Any],
                  edit: Callable[[sqlite3.Connection], T]) -> tuple[T, MailEffect]:
    """Run an edit on the sidecar's contacts (the CLI's block, unblock, import), then its
    effect on mail, as :func:`manage_contacts` does.  Returns the edit's value and that
    effect.  ``edit`` may run twice (see _run_once: rehearsed while an undo is under way),
    so it reads its input afresh each time (a file's text, not a stream read once)."""
    def run(rehearse: bool, before_write: Callable[[], None] | None
            ) -> tuple[T, list[dict[str, Any]]]:
        if before_write is not None:
            before_write()
        # The contacts read and changed in one transaction: a change another writer made
        # meanwhile must not count as this edit's, nor its undo take that change back.
        with sidecar.opened(ctx.sidecar_file) as conn, \
                sidecar.enclosing(conn, keep=not rehearse), tracked(conn) as change:
            value = edit(conn)
        return value, change.rows

    with ExitStack() as held:  # as manage_contacts holds the undo lock
        value, rows = _run_once(ctx, held, run, lambda done: bool(done[1]))
        return value, apply_contacts_change(ctx, action, params, rows)


# ---------------------------------------------------------------------------------------------
# Editing contacts (the CLI; the MCP tool goes through manage_contacts_sql)


def normalize_address(text: str) -> str:
    """The address in ``text`` as contacts keep it: lower-cased, its domain in Unicode (see
    :func:`message.headers.canonical_address`)."""
    address = canonical_address(email.utils.parseaddr(text)[1])
    if "@" not in address or address.startswith("@") or address.endswith("@"):
        raise CallerError(f"not an email address: {text!r}")
    return address


def _refuse_own(conn: sqlite3.Connection, blocked: Iterable[str]) -> None:
    if own := sql.own_among(conn, blocked):
        raise CallerError(f"{', '.join(own)}: the user's own address(es) cannot be blocked; "
                          "nothing was changed")


def set_blocked(conn: sqlite3.Connection, addresses: Iterable[str], blocked: bool) -> list[str]:
    """Block or unblock addresses (adding them as contacts if new); returns them normalized."""
    normalized = sorted({normalize_address(a) for a in addresses})
    if blocked:
        _refuse_own(conn, normalized)
    with sidecar.transaction(conn):
        for address in normalized:
            conn.execute(
                "INSERT INTO contact_info (email_address, is_blocked, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (email_address) DO UPDATE SET is_blocked = excluded.is_blocked, "
                "updated_at = excluded.updated_at", (address, int(blocked), utc_stamp()))
    return normalized


def search(conn: sqlite3.Connection, text: str = "", *, blocked_only: bool = False,
           limit: int = 50) -> list[sqlite3.Row]:
    """Contacts whose address or name contains ``text``, compared :func:`folded` (SQLite's
    lower() and LIKE fold ASCII only, and LIKE would read ``_`` and ``%`` as wildcards)."""
    conn.row_factory = sqlite3.Row
    conn.create_function("fmail_folded", 1, folded, deterministic=True)
    try:
        return list(conn.execute(
            "SELECT * FROM contacts WHERE (instr(fmail_folded(email_address), ?) "
            "OR instr(fmail_folded(coalesce(name, '')), ?)) AND (? = 0 OR is_blocked = 1) "
            "ORDER BY messages_from + messages_to DESC, email_address LIMIT ?",
            (folded(text), folded(text), int(blocked_only), limit)))
    finally:
        conn.row_factory = None


def folded(text: str) -> str:
    """``text`` case-folded and without accents, as one types a name on any keyboard:
    "Muller" finds "MÜLLER", "strasse" finds "Straße"."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def export_csv(conn: sqlite3.Connection, out: TextIO) -> int:
    """Write what exists only in the sidecar (names, notes, the blocklist) as CSV."""
    writer = csv.writer(out)
    writer.writerow(CSV_FIELDS)
    rows = conn.execute(f"SELECT {', '.join(CSV_FIELDS)} FROM contact_info ORDER BY email_address")
    count = 0
    for row in rows:
        writer.writerow(["" if v is None else _cell_out(v) for v in row])
        count += 1
    return count


# A cell a spreadsheet would run as a formula (notes and names may come from mail, through
# the model): written with a leading ' (OWASP's advice), which import_csv takes off again --
# also before quotes that precede such a character, so that a cell starting '= keeps its own.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell_out(value: object) -> object:
    return "'" + value if isinstance(value, str) and _quotable(value) else value


def _cell_in(value: str | None) -> str | None:
    return value[1:] if value and value.startswith("'") and _quotable(value) else value


def _quotable(value: str) -> bool:
    return value.lstrip("'").startswith(_FORMULA_START)


def import_csv(conn: sqlite3.Connection, source: TextIO) -> int:
    """Merge a CSV written by :func:`export_csv`; a row sets, for its address, the fields
    whose columns the file has: a column left out keeps what is there (a names-only list
    neither erases notes nor unblocks).  An empty cell empties a name or notes; an empty
    is_blocked cell keeps the block as it is.  All or nothing: a bad row aborts the import
    with its line number."""
    reader = csv.DictReader(source, strict=True)
    try:
        fields = reader.fieldnames or []
    except csv.Error as exc:
        raise CallerError(f"line {reader.line_num}: not CSV ({exc})") from None
    if "email_address" not in fields:
        raise CallerError("the CSV has no email_address column (expected: " + ",".join(CSV_FIELDS) + ")")
    lines: dict[str, int] = {}  # address -> the line of its row
    newly_blocked = []
    with sidecar.transaction(conn):
        for row in _rows(reader):
            try:
                _whole(row)
                address = normalize_address(_cell_in(row["email_address"]) or "")
                blocked = _flag(row.get("is_blocked"))
                _once(lines, address, reader.line_num)
            except ValueError as exc:  # the line the row ends on, as an editor shows it
                raise CallerError(f"line {reader.line_num}: {exc}") from None
            if blocked:
                newly_blocked.append(address)
            _merge(conn, address, _present(row, blocked))
        _refuse_own(conn, newly_blocked)  # inside the transaction: refused means none applied
    return len(lines)


def _whole(row: dict[Any, Any]) -> None:
    """A row with more cells than the header (an unquoted comma in a note) or fewer is a bad
    row: DictReader would drop the extra cells, or read the missing ones as empty."""
    columns = [key for key in row if key is not None]
    cells = sum(row[key] is not None for key in columns) + len(row.get(None) or ())
    if cells != len(columns):
        quote = " (a comma inside a name or note needs the cell in double quotes)"
        raise ValueError(f"{counted(cells, 'cell')} for the header's {len(columns)} columns"
                         + (quote if cells > len(columns) else ""))


def _present(row: dict[str, str], blocked: bool | None) -> dict[str, Any]:
    """The fields the row sets: its columns other than email_address, is_blocked left out
    when its cell is empty."""
    fields: dict[str, Any] = {}
    if "name" in row:
        fields["name"] = _cell_in(row["name"]) or None
    if blocked is not None:
        fields["is_blocked"] = int(blocked)
    if "notes" in row:
        fields["notes"] = _cell_in(row["notes"]) or None
    return fields


def _merge(conn: sqlite3.Connection, address: str, fields: dict[str, Any]) -> None:
    """Add the contact or set these fields of it; a new contact takes the table's defaults
    for the rest (no name or notes, not blocked)."""
    columns = ["email_address", *fields, "updated_at"]
    conn.execute(
        f"INSERT INTO contact_info ({', '.join(columns)}) VALUES "
        f"({', '.join('?' for _ in columns)}) ON CONFLICT (email_address) DO UPDATE SET "
        + ", ".join(f"{column} = excluded.{column}" for column in columns[1:]),
        (address, *fields.values(), utc_stamp()))


def _once(lines: dict[str, int], address: str, line: int) -> None:
    """Note the address's line; a second row for it is a bad row: which of the two the user
    meant (a block, or its undoing) is not for the import to guess."""
    if address in lines:
        raise ValueError(f"{address} is on line {lines[address]} already; keep one row for it")
    lines[address] = line


def _rows(reader: csv.DictReader[str]) -> Iterator[dict[str, str]]:
    """The rows, or a CallerError at the first that is not CSV (an unterminated quote, a
    field over the csv module's limit): the import is then all undone."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise CallerError(f"line {reader.line_num}: not CSV ({exc}); nothing was "
                              "imported") from None
        yield row


_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


def _flag(value: str | None) -> bool | None:
    """An is_blocked cell: 1/true/yes or 0/false/no; None for an empty cell or no column
    (the block stays as it is); anything else is a bad row, not a silent unblock."""
    text = (value or "").strip().lower()
    if not text:
        return None
    if text not in _TRUE + _FALSE:
        raise ValueError(f"is_blocked must be 1 or 0 (or true/false, yes/no), not {value!r}")
    return text in _TRUE


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
