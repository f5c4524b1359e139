"""SQL over the sidecar: ``query_emails`` reads mail, ``manage_contacts_sql`` edits contacts.

Both are plain functions (the MCP layer wraps them).  The model writes arbitrary SQL, so every
statement runs behind several independent fences:

* an authorizer that allows reading the published views only (the internal tables just through
  those views, and only the columns the views themselves read), a short list of harmless
  functions, and -- for ``manage_contacts_sql`` only -- writes to the ``contacts`` view's
  editable columns and, inside its INSTEAD OF triggers, to ``contact_info``;
* ``query_emails`` uses a read-only connection with ``PRAGMA query_only``; a
  ``manage_contacts_sql`` statement that writes nothing runs under ``PRAGMA query_only`` too,
  outside any write transaction;
* one statement per call, checked before SQLite sees it (SQLite would silently stop at the
  first one; Python's sqlite3 refuses the rest, a second fence);
* SQLite limits on value and SQL length, a wall-clock time limit through the progress handler
  (between VM steps) and in the functions that can take long inside one step (printf, LIKE,
  GLOB, instr, replace, the trims: see _Guards), and caps on rows, cell length and total
  result size (a single row's too).

The ``account_name`` scope shadows the views with TEMP views of the same name, holding the
messages with a file in the account's folders; it is a convenience filter (``main.emails``
still sees every account), not a security boundary.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import Field, PrivateAttr

from ..adopt.identity import looks_like_address
from ..clock import utc_stamp
from ..errors import CallerError
from ..message.headers import canonical_address, is_own_address
from ..store import sidecar
from .dto import Dto

MAX_ROWS = 1000
MAX_CELL_CHARS = 2000
MAX_RESULT_BYTES = 300_000     # all cells together, in UTF-8: one call cannot return megabytes
# SQLITE_LIMIT_LENGTH: bigger strings/blobs fail instead of allocating.  Kept well below 1 MB
# because instr() and replace() are quadratic inside one call, where the time limit cannot
# reach (two 1 MB strings take ~8 s; two of 250 KB ~0.5 s).
MAX_VALUE_BYTES = 250_000
MAX_PRINTF_WIDTH = 100_000     # printf('%.*c', n, 'x') loops n times, past any limit
# Built-ins whose one call costs about the product of its first two arguments' lengths, inside
# one VM step, where the progress handler cannot stop it -- and a row can hold thousands of
# calls with no step between them.  Per function, the largest product allowed: ~20-40 ms at
# worst (LIKE, GLOB and the trims compare character by character, ~1 ns per pair; instr and
# replace use memcmp, ~50 times faster).
GUARDED_CALL_COST: dict[str, tuple[tuple[int, ...], int]] = {
    "like": ((2, 3), 25_000_000), "glob": ((2,), 25_000_000),
    "trim": ((2,), 25_000_000), "ltrim": ((2,), 25_000_000), "rtrim": ((2,), 25_000_000),
    "instr": ((2,), 1_000_000_000), "replace": ((3,), 1_000_000_000),
}
# LIKE is shadowed only where one row's calls could outrun the limit: a shadowed LIKE costs
# a Python call per row (a prefix 'g%' over 20k messages: 0.8 -> 8 ms), while over the
# views' own values (a recipient list is the longest, tens of KB) a pattern of at most
# LONG_LITERAL_CHARS takes milliseconds a call.  Guarded: a statement that can build longer
# text (these functions, the || operator, a longer literal) or has more than MAX_NATIVE_LIKES.
TEXT_BUILDERS = frozenset(
    "printf format replace zeroblob randomblob char group_concat string_agg concat concat_ws "
    "hex quote unistr".split())
LONG_LITERAL_CHARS = 1000
MAX_NATIVE_LIKES = 20
# Any character past ASCII may be part of a name in SQLite.
_SQL_TOKEN = re.compile(r"--[^\n]*|/\*.*?(?:\*/|\Z)|'(?:[^']|'')*'?|\"(?:[^\"]|\"\")*\"?"
                        r"|`(?:[^`]|``)*`?|\[[^\]]*\]?|\|\|"
                        r"|[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_$\x80-\U0010ffff]*|.", re.S)
MAX_SQL_CHARS = 100_000
# SQLite copies a CTE's SQL into every place that names it while preparing the statement, and
# a flattened subquery's or CTE's column into every reference to it, and SQLite 3.40 calls
# neither the progress handler nor sqlite3_interrupt meanwhile, nor always the authorizer
# (which checks the time limit too, see _timed): CTEs that each name the one before twice
# take 2^depth copies (1 KB of SQL, 18 deep: 2-5 s to prepare, more than twice that a level
# deeper), 15 nested ``SELECT c+c+c AS c FROM (...)`` 3^15 (16 s).  No SQLite limit stops
# either (the expression depth is not checked after flattening), nor the copies of a result
# column into each use of its alias or number (``ORDER BY 1, 1, ...``: 200 over a 2,000-WHEN
# CASE, 2-3 s).  The copies are counted in the text instead (_copied_tokens); this many take
# 0.01-0.1 s to prepare.
MAX_COPIED_TOKENS = 20_000
PROGRESS_STEPS = 1000          # VM instructions between time-limit checks

READ_KEYWORDS = frozenset({"SELECT", "WITH", "VALUES", "EXPLAIN"})
WRITE_KEYWORDS = frozenset({"INSERT", "REPLACE", "UPDATE", "DELETE"})
# Words that start an SQLite statement; anything else is left to SQLite's syntax error.
STATEMENT_KEYWORDS = READ_KEYWORDS | WRITE_KEYWORDS | frozenset(
    "ALTER ANALYZE ATTACH BEGIN COMMIT CREATE DETACH DROP END PRAGMA REINDEX RELEASE ROLLBACK "
    "SAVEPOINT VACUUM".split())

SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master",
                           "sqlite_temp_schema"})
# Eponymous virtual tables worth having; other pragma_* functions (journal_mode, ...) stay shut.
TABLE_FUNCTIONS = frozenset({"json_each", "json_tree", "pragma_table_info",
                             "pragma_table_xinfo"})
# pragma_table_info runs "PRAGMA table_info" internally; statement-level PRAGMA is refused by
# the keyword check, so these two are reachable only through the table-valued functions.
SCHEMA_PRAGMAS = frozenset({"table_info", "table_xinfo"})

SAFE_FUNCTIONS = frozenset("""
abs char coalesce concat concat_ws format glob hex ifnull iif if instr length like likelihood
likely lower ltrim max min nullif octet_length printf quote random randomblob replace round
rtrim sign soundex sqlite_version substr substring trim typeof unhex unicode unlikely upper
zeroblob
avg count group_concat string_agg sum total
date time datetime julianday unixepoch strftime timediff
current_date current_time current_timestamp
json jsonb json_array jsonb_array json_array_length json_error_position json_extract
jsonb_extract json_insert jsonb_insert json_object jsonb_object json_patch jsonb_patch
json_pretty json_quote json_remove jsonb_remove json_replace jsonb_replace json_set jsonb_set
json_type json_valid json_group_array jsonb_group_array json_group_object jsonb_group_object
-> ->>
acos acosh asin asinh atan atan2 atanh ceil ceiling cos cosh degrees exp floor ln log log10
log2 mod pi pow power radians sin sinh sqrt tan tanh trunc
row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value
nth_value
""".split())

VIEW_LIST = ", ".join(sidecar.PUBLISHED_VIEWS)
READ_HINT = (f"query_emails only reads the published views {VIEW_LIST} "
             "(contacts are changed with manage_contacts_sql)")
CONTACTS_HINT = ("manage_contacts_sql reads the published views and changes only the contacts "
                 "view (columns " + ", ".join(sidecar.EDITABLE_CONTACT_COLUMNS) + ")")

# Authorizer action codes -> words for refusals ("CREATE TEMP TRIGGER", "DROP VIEW", ...).
_ACTION_NAMES: dict[int, str] = {
    getattr(sqlite3, name): name.removeprefix("SQLITE_").replace("_", " ")
    for name in dir(sqlite3)
    if name.startswith(("SQLITE_CREATE_", "SQLITE_DROP_"))
}
_ACTION_NAMES.update({
    sqlite3.SQLITE_ATTACH: "ATTACH", sqlite3.SQLITE_DETACH: "DETACH",
    sqlite3.SQLITE_TRANSACTION: "transaction control (BEGIN/COMMIT/ROLLBACK)",
    sqlite3.SQLITE_SAVEPOINT: "SAVEPOINT", sqlite3.SQLITE_ANALYZE: "ANALYZE",
    sqlite3.SQLITE_REINDEX: "REINDEX", sqlite3.SQLITE_ALTER_TABLE: "ALTER TABLE",
    sqlite3.SQLITE_INSERT: "INSERT", sqlite3.SQLITE_UPDATE: "UPDATE",
    sqlite3.SQLITE_DELETE: "DELETE",
})

# The tool descriptions are generated from the published views' real columns (read from a
# freshly migrated in-memory sidecar, on first use: see __getattr__ at the end), with one line
# of prose per view from VIEW_NOTES.  A published view without a line there makes the build
# fail (describe_views raises), so a new view cannot stay invisible to the model.
SCHEMA_HELP: str            # built on first use by __getattr__
CONTACTS_HELP: str          # built on first use by __getattr__
HARVESTED_COLUMNS: tuple[str, ...]  # contacts columns that come from the mail (not editable)

VIEW_NOTES: dict[str, str] = {
    "emails": ("folder is relative to the account ('INBOX', 'Sent'); recipients is JSON "
               '[{"name","email","kind"}]; tags, folders: JSON lists (use json_each)'),
    "threads": "drafts left out; participants: senders, comma-separated",
    "tags": "per tag",
    "email_tags": "one row per message and tag",
    # (not "edit with manage_contacts_sql": only --tools all offers it)
    "contacts": "is_me: the user's own; drafts left out",
}

# How account_name scopes each published view: unqualified names are shadowed by TEMP views
# holding one account's rows (see _scoped_views).  The rule, taken from the views' columns:
# * a view with an account_name column is filtered on it (WHERE account_name = the account),
#   unless _SCOPED_SELECTS gives it a definition of its own;
# * a view without that column needs an entry in _SCOPED_SELECTS (the SELECT of its
#   one-account copy, {account} standing for the quoted name, {messages} for the SELECT of
#   the account's message_ids, _ACCOUNT_MESSAGES) or in ACCOUNT_INDEPENDENT
#   (saying why one account's view would be the same as every account's);
# * any other published view is an error: account_scopes raises, and with it the build of
#   SCHEMA_HELP (which names the scoped views), so no view is silently left unfiltered.
# tests/test_sqltools.py checks every published view against a one-account sidecar.
#
# A message belongs to every account holding one of its files (as search_emails and
# list_folders count it): its emails.account_name names the account of its primary file only.
# _ACCOUNT_FOLDERS: a TEMP table of the account's folders in the mirror (relative to the mail
# root, owned as the caller says), filled with parameters.  Written into the views' text,
# thousands of folder names passed the SQL length limit under which SQLite parses the TEMP
# views again after any schema change to the sidecar (a migration by another process).
_ACCOUNT_FOLDERS = "account_folders"
_ACCOUNT_MESSAGES = ("SELECT message_id FROM main.emails WHERE account_name = {account} UNION "
                     "SELECT message_id FROM main.message_folders WHERE folder IN "
                     f"(SELECT folder FROM temp.{_ACCOUNT_FOLDERS})")
_SCOPED_SELECTS: dict[str, str] = {
    "emails": "SELECT * FROM main.emails WHERE message_id IN ({messages})",
    # A thread belongs to every account holding one of its messages; its account_name
    # column (the max) names only one of them.
    "threads": "SELECT * FROM main.threads WHERE thread_id IN "
               "(SELECT thread_id FROM main.emails WHERE message_id IN ({messages}))",
    "email_tags": "SELECT * FROM main.email_tags WHERE message_id IN ({messages})",
    # The account's own counts: built again from the tables, like the view itself.
    "tags": "SELECT t.tag, count(*) AS message_count, sum(1 - m.is_read) AS unread_count "
            "FROM main.message_tags t JOIN main.messages m USING (message_id) "
            "WHERE m.message_id IN ({messages}) GROUP BY t.tag",
}
ACCOUNT_INDEPENDENT: dict[str, str] = {
    "contacts": "contacts and their notes, blocks and counts are kept across all accounts",
}

# After the server's own first line ("Read-only SQL (SQLite, one SELECT) ...").
_SCHEMA_HEAD = (f"At most {MAX_ROWS} rows, text cells cut at {MAX_CELL_CHARS} chars, 2 s time "
                "limit.\nViews:\n")
_SCHEMA_TAIL = """\
Dates: ISO 8601 UTC text ('2026-11-30T10:00:00Z'), compare as text or use \
strftime(). Flags: 0/1. Tools take uid or message_id as id. account_name limits \
{scoped} to mail in one account (a filter, not a security boundary).
Examples:
SELECT * FROM emails WHERE folder='INBOX' AND is_read=0 ORDER BY date DESC LIMIT 10
SELECT sender_email, count(*) AS n FROM emails WHERE is_read=0 \
AND date >= strftime('%Y-%m-01T00:00:00Z','now') GROUP BY sender_email ORDER BY n DESC
SELECT e.subject, e.date FROM emails e, json_each(e.recipients) r \
WHERE r.value ->> 'email' = 'bob@example.com'"""

_CONTACTS_HEAD = """\
SQL on the contacts view (SQLite), one statement per call: SELECT, or INSERT/UPDATE/DELETE \
on contacts; other views ({others}) can be read, e.g. in subqueries.
{columns}. Only {editable} can be changed (is_blocked: 0/1); the others are \
harvested from the mail and read-only (ignored on INSERT). """
_CONTACTS_TAIL = """\
Addresses are lower-case. \
DELETE removes your name, notes and block, not the harvested figures. Blocking tags the \
sender's mail blocked+spam (out of the inbox and searches; is:blocked finds it); unblocking \
restores it. A statement changing more than 10 contacts is a dry run (changed, sample) until repeated with confirm_count=changed. The user's own addresses cannot be blocked. undo_last_write reverts a contacts change, names, notes and mail tags included.
Examples:
UPDATE contacts SET notes='met at PyCon' WHERE email_address='bob@example.com'
INSERT INTO contacts (email_address, name, notes) VALUES ('carol@example.com', 'Carol', \
'new client')
UPDATE contacts SET is_blocked=1 WHERE email_address='spam@x.com'"""


def view_columns(conn: sqlite3.Connection, views: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """view -> its column names, from ``PRAGMA table_info``; raises for a missing view."""
    columns: dict[str, tuple[str, ...]] = {}
    for view in views:
        names = tuple(row[0] for row in conn.execute(
            "SELECT name FROM pragma_table_info(?) ORDER BY cid", (view,)))
        if not names:
            raise RuntimeError(f"published view {view!r} is not in the sidecar schema")
        columns[view] = names
    return columns


def describe_views(columns: Mapping[str, Sequence[str]],
                   notes: Mapping[str, str] = VIEW_NOTES) -> str:
    """One line per view: ``name(col,...): prose``; raises for a view without prose."""
    missing = [view for view in columns if not notes.get(view)]
    if missing:
        raise RuntimeError(f"published view(s) {', '.join(missing)} have no line in "
                           "VIEW_NOTES: say in one line what a row is, for SCHEMA_HELP")
    return "".join(f"{view}({','.join(cols)}): {notes[view]}\n"
                   for view, cols in columns.items())


def account_scopes(columns: Mapping[str, Sequence[str]],
                   selects: Mapping[str, str] = _SCOPED_SELECTS,
                   independent: Mapping[str, str] = ACCOUNT_INDEPENDENT
                   ) -> dict[str, str | None]:
    """view -> the SELECT of its one-account copy ({account} for the quoted account name,
    {messages} for its messages), None for an account-independent view; raises for a view
    the rule above cannot scope."""
    stale = sorted((selects.keys() | independent.keys()) - columns.keys())
    both = sorted(selects.keys() & independent.keys())
    if stale or both:
        raise RuntimeError(f"account scope rules for unpublished views {stale} or declared "
                           f"both scoped and account-independent {both}")
    scopes: dict[str, str | None] = {}
    for view, cols in columns.items():
        if view in selects:
            scopes[view] = selects[view]
        elif view in independent:
            scopes[view] = None
        elif "account_name" in cols:
            scopes[view] = f"SELECT * FROM main.{view} WHERE account_name = {{account}}"
        else:
            raise RuntimeError(
                f"published view {view!r} has no account_name column: give its one-account "
                "SELECT in _SCOPED_SELECTS or say in ACCOUNT_INDEPENDENT why it needs none")
    return scopes


@functools.cache
def _published_columns() -> dict[str, tuple[str, ...]]:
    """The published views' columns in a freshly migrated in-memory sidecar (~2 ms, once)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        sidecar.add_functions(conn)
        sidecar.migrate(conn, Path(":memory:"))
        return view_columns(conn, sidecar.PUBLISHED_VIEWS)
    finally:
        conn.close()


@functools.cache
def _account_scopes() -> dict[str, str | None]:
    return account_scopes(_published_columns())


@functools.cache
def _generated() -> dict[str, Any]:
    """SCHEMA_HELP, CONTACTS_HELP and HARVESTED_COLUMNS, built from the migrated schema."""
    columns = _published_columns()
    scoped = [view for view, select in _account_scopes().items() if select is not None]
    contacts = columns["contacts"]
    editable = sidecar.EDITABLE_CONTACT_COLUMNS
    return {
        "SCHEMA_HELP": (_SCHEMA_HEAD + describe_views(columns)
                        + _SCHEMA_TAIL.replace("{scoped}", ", ".join(scoped))),
        "CONTACTS_HELP": _CONTACTS_HEAD.format(
            others=", ".join(v for v in sidecar.PUBLISHED_VIEWS if v != "contacts"),
            columns=f"contacts({','.join(contacts)})", editable=", ".join(editable),
        ) + _CONTACTS_TAIL,
        "HARVESTED_COLUMNS": tuple(c for c in contacts
                                   if c not in editable and c != "email_address"),
    }


# The account holding a folder (relative to the mail root), None for none: Config's ownership.
FolderAccount = Callable[[str], str | None]


class SqlError(CallerError):
    """A statement was refused or failed; the text says what and why, for the model to fix."""


class SqlResult(Dto):
    columns: list[str]
    rows: list[list[Any]]
    row_count: int = Field(description="rows returned")
    truncated: bool = Field(description="more rows existed (limit or size cap)")
    truncated_cells: int = Field(default=0, description="text cells cut at 2000 chars (end in …)")


class ContactsResult(SqlResult):
    changed: int = Field(description="contacts whose name, block or notes changed")
    blocked: list[str] = Field(description="addresses newly blocked")
    unblocked: list[str] = Field(description="addresses newly unblocked")
    dry_run: bool = Field(default=False, description="nothing changed: confirm_count=changed")
    sample: list[str] = Field(default_factory=list)
    audit_id: int | None = None
    # What the statement changed, row by row, for the audit log (not part of the answer).
    _contact_changes: list[dict[str, Any]] = PrivateAttr(default_factory=list)

    @property
    def contact_changes(self) -> list[dict[str, Any]]:
        return self._contact_changes


# A statement that changes more contacts than this needs confirm_count, like a bulk write.
CONFIRM_ABOVE = 10
_CONTACT_FIELDS = ("email_address", "name", "is_blocked", "notes")


class _RolledBack(Exception):
    """Raised inside the transaction to roll a statement back and return its result (a dry
    run, or a rehearsal)."""

    def __init__(self, result: ContactsResult) -> None:
        self.result = result


# What a write does to contact_info, noted row by row as it does it by TEMP triggers (this
# connection's own): each contact's row before its first change and after its last.  An
# edit's diff then costs what it changed, not two reads of every contact inside the write
# lock (0.4-1 s at 100k contacts, that the indexer and the tagging hook waited out).
_LOG = "contact_log"
TRACKING_TRIGGERS = ("contact_log_insert", "contact_log_update", "contact_log_delete",
                     "contact_log_inserted", "contact_log_updated", "contact_log_deleted")
# The row of an address as it stands (none: 0 and NULLs), at its first change only: not by
# INSERT OR IGNORE, which an upsert's DO UPDATE turns into an ABORT in the triggers it fires.
# quote(): NULL is an address too (refused later), and a NULL key would not be one row.
_NOTE_BEFORE = (f"INSERT INTO {_LOG} (k, email_address, existed, name, is_blocked, notes) "
                "SELECT quote({a}), {a}, i.email_address IS NOT NULL, i.name, i.is_blocked, "
                "i.notes FROM (SELECT 1) LEFT JOIN contact_info i ON i.email_address = {a} "
                f"WHERE NOT EXISTS (SELECT 1 FROM {_LOG} WHERE k = quote({{a}}));")
_NOTE_AFTER = (f"UPDATE {_LOG} SET now = {{now}}, now_name = {{r}}.name, "
               "now_blocked = {r}.is_blocked, now_notes = {r}.notes "
               "WHERE k = quote({r}.email_address);")
_TRACKING = [
    f"CREATE TEMP TABLE IF NOT EXISTS {_LOG} (k TEXT PRIMARY KEY, email_address, existed, "
    "name, is_blocked, notes, now, now_name, now_blocked, now_notes)",
    # BEFORE INSERT: an INSERT OR REPLACE deletes the row it replaces without a DELETE trigger.
    "CREATE TEMP TRIGGER IF NOT EXISTS contact_log_insert BEFORE INSERT ON contact_info BEGIN "
    + _NOTE_BEFORE.format(a="NEW.email_address") + " END",
    "CREATE TEMP TRIGGER IF NOT EXISTS contact_log_update BEFORE UPDATE ON contact_info BEGIN "
    + _NOTE_BEFORE.format(a="OLD.email_address") + _NOTE_BEFORE.format(a="NEW.email_address")
    + " END",
    "CREATE TEMP TRIGGER IF NOT EXISTS contact_log_delete BEFORE DELETE ON contact_info BEGIN "
    + _NOTE_BEFORE.format(a="OLD.email_address") + " END",
    "CREATE TEMP TRIGGER IF NOT EXISTS contact_log_inserted AFTER INSERT ON contact_info BEGIN "
    + _NOTE_AFTER.format(now=1, r="NEW") + " END",
    "CREATE TEMP TRIGGER IF NOT EXISTS contact_log_updated AFTER UPDATE ON contact_info BEGIN "
    + _NOTE_AFTER.format(now=0, r="OLD") + _NOTE_AFTER.format(now=1, r="NEW") + " END",
    "CREATE TEMP TRIGGER IF NOT EXISTS contact_log_deleted AFTER DELETE ON contact_info BEGIN "
    + _NOTE_AFTER.format(now=0, r="OLD") + " END",
]


def track_contacts(conn: sqlite3.Connection) -> None:
    """Note from now on what this connection's writes do to contact_info (see
    :func:`tracked_contacts`).  Takes no lock of the sidecar's: TEMP objects are the
    connection's own."""
    for statement in _TRACKING:
        conn.execute(statement)
    conn.execute(f"DELETE FROM temp.{_LOG}")


def tracked_contacts(conn: sqlite3.Connection
                     ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The rows of the contacts changed since :func:`track_contacts`, before and after (a
    contact without a row missing), as :func:`contact_diff` takes them."""
    before: dict[str, dict[str, Any]] = {}
    after: dict[str, dict[str, Any]] = {}
    for row in conn.execute(f"SELECT email_address, existed, name, is_blocked, notes, now, "
                            f"now_name, now_blocked, now_notes FROM temp.{_LOG}"):
        address, existed, was, now, is_now = row[0], row[1], row[2:5], row[5], row[6:]
        if existed:
            before[address] = dict(zip(_CONTACT_FIELDS, (address, *was)))
        if now == 1 or (now is None and existed):  # None: untouched (an INSERT OR IGNORE)
            after[address] = dict(zip(_CONTACT_FIELDS, (address, *(is_now if now else was))))
    return before, after


def contact_diff(before: dict[str, dict[str, Any]],
                  after: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per changed contact: its user-kept row before and after (None: no row)."""
    return [{"contact": address, "before": before.get(address), "after": after.get(address)}
            for address in sorted(before.keys() | after.keys(), key=lambda a: (a is None, a or ""))
            if before.get(address) != after.get(address)]


# The columns of a contact an undo turns back one by one, and a contact without a row of
# its own as the contacts view shows it (no name of the user's, not blocked, no notes).
_UNDONE_COLUMNS = ("name", "is_blocked", "notes")
_NO_ROW: dict[str, Any] = {"name": None, "is_blocked": 0, "notes": None}


def later_contact_writes(conn: sqlite3.Connection,
                         entry: sidecar.AuditEntry) -> dict[str, dict[str, str]]:
    """Per contact of ``entry``, the columns that writes after it (not undone, by anyone)
    changed, each with the latest one's name (``audit 9 (contacts)``); a write
    that made or deleted the row changed them all."""
    found: dict[str, dict[str, str]] = {}
    addresses = [change["contact"] for change in entry.contact_rows]
    for audit_id, action, change in sidecar.later_changes(conn, entry.id, addresses,
                                                          key="contact"):
        columns = found.setdefault(change["contact"], {})
        for column in _UNDONE_COLUMNS:
            if _changed(change, column):
                columns[column] = f"audit {audit_id} ({action})"
    return found


def _changed(change: dict[str, Any], column: str) -> bool:
    """Whether a recorded contacts change changed ``column`` (making or deleting the row
    changed them all)."""
    before, after = change["before"], change["after"]
    return before is None or after is None or before[column] != after[column]


def _undone_before(entry: sidecar.AuditEntry, change: dict[str, Any],
                   past: Sequence[sidecar.EarlierChange]) -> tuple[dict[str, Any], bool]:
    """``change`` with its before as it was before the earlier writes (``past``, newest
    first) undone after ``entry`` was made, whose undo left the columns ``entry`` changed
    again as it set them (see passes.changes.UndoneBefore); and whether there was no row
    then (it goes again when it says nothing).  Each column is followed back while each
    write's after is what the next one found."""
    none_row = {"email_address": change["contact"], **_NO_ROW}
    before, nones = dict(change["before"] or none_row), []
    for column in (c for c in _UNDONE_COLUMNS if _changed(change, c)):
        since, none = entry.id, change["before"] is None
        for earlier in (e for e in past if _changed(e.change, column)):
            if (not earlier.undone_after(since)
                    or (earlier.change["after"] or _NO_ROW)[column] != before[column]):
                break
            before[column] = (earlier.change["before"] or _NO_ROW)[column]
            since, none = earlier.audit_id, earlier.change["before"] is None
        nones.append(none)
    made = any(nones) if nones else change["before"] is None
    if before == (change["before"] or none_row):
        return change, made
    return {**change, "before": before}, made


def restore_contacts(conn: sqlite3.Connection, entry: sidecar.AuditEntry) -> list[str]:
    """Put back what a recorded contacts write changed (for undo): of each contact, only the
    columns the write changed, and of those only the ones no later write (not undone) changed
    since.  The others stand -- undoing a rename must not lift the block another session set
    since, which would let the sender's mail in again, nor undoing that block take back the
    rename's own undo -- and the lines returned name them.  What earlier writes undone since
    changed does not come back (see _undone_before)."""
    kept: list[str] = []
    with sidecar.transaction(conn):
        later = later_contact_writes(conn, entry)
        past: dict[str, list[sidecar.EarlierChange]] = {}
        for earlier in sidecar.earlier_changes(
                conn, entry, [c["contact"] for c in entry.contact_rows], key="contact"):
            past.setdefault(earlier.change["contact"], []).append(earlier)
        for recorded in entry.contact_rows:
            change, made = _undone_before(entry, recorded, past.get(recorded["contact"], []))
            since = later.get(change["contact"], {})
            if change["after"] is None and not since:  # the write deleted the row: back whole
                _put_row(conn, change["before"])
                if made:  # no row before the writes undone: none now, if it says nothing
                    _drop_if_empty(conn, change["contact"])
            elif left := _put_columns(conn, change, since, made):
                kept.append(f"{change['contact']}: left as a later write set it: {left}")
    return kept


def _put_row(conn: sqlite3.Connection, row: dict[str, Any]) -> None:
    conn.execute(
        "INSERT INTO contact_info (email_address, name, is_blocked, notes, updated_at) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (email_address) DO UPDATE SET name = excluded.name, "
        "is_blocked = excluded.is_blocked, notes = excluded.notes, "
        "updated_at = excluded.updated_at",
        (row["email_address"], row["name"], row["is_blocked"], row["notes"], utc_stamp()))


def _put_columns(conn: sqlite3.Connection, change: dict[str, Any],
                 since: dict[str, str], made: bool) -> str:
    """Turn back the columns ``change`` changed that are not in ``since`` (the later writes
    per column); says which it left, and by which write.  ``made``: there was no row before
    (the write, or an earlier one undone since, made it)."""
    before, after = change["before"] or _NO_ROW, change["after"] or _NO_ROW
    changed = [column for column in _UNDONE_COLUMNS if before[column] != after[column]]
    back = [column for column in changed if column not in since]
    if back:
        conn.execute(f"UPDATE contact_info SET {', '.join(f'{c} = ?' for c in back)}, "
                     "updated_at = ? WHERE email_address = ?",
                     (*(before[c] for c in back), utc_stamp(), change["contact"]))
    if made and (back or not since):  # gone again if it says nothing now (a later write
        # that made it again changed every column)
        _drop_if_empty(conn, change["contact"])
    return ", ".join(f"{column} ({since[column]})" for column in changed if column in since)


def _drop_if_empty(conn: sqlite3.Connection, address: str) -> None:
    conn.execute("DELETE FROM contact_info WHERE email_address = ? AND name IS NULL "
                 "AND is_blocked = 0 AND notes IS NULL", (address,))


# ---------------------------------------------------------------------------------------------
# Public functions


def query_emails(sidecar_file: Path, sql_query: str, account_name: str | None = None,
                 limit: int = 100, *, known_accounts: Sequence[str] = (),
                 folder_account: FolderAccount | None = None,
                 time_limit: float = 2.0) -> SqlResult:
    """Run one read-only statement over the published views and return capped rows.

    ``account_name`` (checked against ``known_accounts``, or the accounts in the mirror when
    none are given) scopes the unqualified views (all but the account-independent ones) to
    the messages with a file in one of its folders (``folder_account`` tells which folders
    are its; without it, to those of its primary files).
    Raises :class:`SqlError` for anything refused or failing.
    """
    statement = _single_statement(sql_query, READ_KEYWORDS, READ_HINT)
    with _session(sidecar_file, _Scope(account_name, known_accounts, folder_account),
                  readonly=True) as conn:
        conn.execute("PRAGMA query_only = 1")
        policy = _policy(conn, READ_HINT)
        fetched = _execute(conn, statement, policy, _clamp(limit), _deadline(time_limit))
    return SqlResult(**fetched.fields())


def manage_contacts_sql(sidecar_file: Path, sql_query: str, account_name: str | None = None,
                        *, known_accounts: Sequence[str] = (),
                        folder_account: FolderAccount | None = None, time_limit: float = 2.0,
                        limit: int = 100, confirm_count: int | None = None,
                        own_addresses: Sequence[str] = (), rehearse: bool = False,
                        before_write: Callable[[], None] | None = None) -> ContactsResult:
    """Run one SELECT, INSERT, UPDATE or DELETE on the ``contacts`` view: a write in a
    transaction, a read (as SQLite compiles it: see :func:`_writes_contacts`) read-only.

    Writes reach ``contact_info`` only through the view's INSTEAD OF triggers and only the
    columns in :data:`sidecar.EDITABLE_CONTACT_COLUMNS`.  The result says how many rows
    changed and which addresses became blocked or unblocked, so the caller can retag mail.
    ``account_name`` scopes the other views as in :func:`query_emails`.
    Raises :class:`SqlError`; a failing statement leaves the sidecar unchanged, as does one
    ``rehearse``-d: rolled back, its result says what it would change.  ``before_write`` is
    called before a statement that writes the contacts view starts (the caller's undo lock,
    taken before the sidecar's: see passes.changes.until_recorded); a read runs without it.
    """
    statement = _single_statement(sql_query, READ_KEYWORDS | WRITE_KEYWORDS, CONTACTS_HINT)
    deadline = _deadline(time_limit)  # for the probe and the run, not the waits between
    try:
        with _session(sidecar_file, _Scope(account_name, known_accounts, folder_account),
                      readonly=False) as conn:
            # Before the policy, which tells the log from a CTE of the caller's; and before
            # the write lock, which is for the statement alone.
            track_contacts(conn)
            policy = _policy(conn, CONTACTS_HINT, edits_contacts=True)
            if not _writes_contacts(conn, statement.text, policy, deadline):
                # No write lock (the mirror sync and the post-new hook write on meanwhile) and
                # no contacts read to diff; query_only fails a write the probe missed.
                conn.execute("PRAGMA query_only = 1")
                return _contacts_result(
                    _execute(conn, statement, policy, _clamp(limit), deadline), [])
            if before_write is not None:
                before_write()
            with sidecar.transaction(conn):
                fetched = _execute(conn, statement, policy, _clamp(limit), deadline)
                if not _explains(statement.text):  # a plan's rows are no contacts returned
                    _refuse_returning(policy, fetched)
                with _limited(conn, deadline):  # what it changed: read, as it, in the limit
                    rows_before, rows_after = tracked_contacts(conn)
                    rows_after = _without_empty_rows(conn, rows_before, rows_after)
                    diff = contact_diff(rows_before, rows_after)
                    _refuse_non_addresses(diff)
                    result = _contacts_result(fetched, diff)
                    _refuse_own(conn, result.blocked, own_addresses)
                if len(diff) > CONFIRM_ABOVE and confirm_count != len(diff):
                    _unconfirmed(result, diff, confirm_count)
                if rehearse:
                    raise _RolledBack(result)
    except _RolledBack as stop:
        return stop.result
    result._contact_changes = diff
    return result


def _writes_contacts(conn: sqlite3.Connection, statement: str, policy: _Policy,
                     deadline: _Deadline) -> bool:
    """Whether ``statement`` writes the contacts view, as SQLite compiles it: the authorizer
    sees each write when the statement is prepared (a WITH ... UPDATE too), and EXPLAIN
    prepares it without running any of it -- Python's sqlite3 has no sqlite3_stmt_readonly.
    A refusal found then is raised, as running it would."""
    if _explains(statement):
        return False  # it shows a plan and runs nothing (EXPLAIN EXPLAIN is no SQL)
    probe = replace(policy)  # its own record of refusals and writes
    prefix = "EXPLAIN "
    # Room for the prefix: a statement SQLite would take must not be too long to probe.
    limit = conn.getlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, limit + len(prefix))
    conn.set_authorizer(_timed(probe, deadline))
    deadline.start()
    try:
        conn.execute(prefix + statement).close()
    except (sqlite3.Error, sqlite3.Warning) as exc:
        raise _translate(exc, probe, deadline) from None
    finally:
        deadline.stop()
        conn.set_authorizer(None)
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, limit)
    return probe.wrote_contacts


def _without_empty_rows(conn: sqlite3.Connection, before: dict[str, dict[str, Any]],
                        after: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``after`` less the rows the statement added that hold nothing (no name, block or notes)
    for a harvested contact, deleted: the contacts view shows it the same without one, but the
    UPDATE trigger writes a row for every contact it touches, so "unblock everyone" counted
    (and kept) every harvested contact as changed."""
    empty = [address for address, row in after.items()
             if address not in before and row["name"] is None and not row["is_blocked"]
             and row["notes"] is None]
    harvested: set[str] = set()
    for part in sidecar.chunks(empty):
        harvested.update(row[0] for row in conn.execute(
            "SELECT email_address FROM contact_stats WHERE email_address IN "
            f"({', '.join('?' * len(part))})", part))
    conn.executemany("DELETE FROM contact_info WHERE email_address = ?",
                     ((address,) for address in harvested))
    return {address: row for address, row in after.items() if address not in harvested}


def _explains(statement: str) -> bool:
    """Whether ``statement`` is an EXPLAIN (QUERY PLAN): SQLite prepares what it explains,
    and its authorizer sees the writes in it, but runs none of them."""
    return _leading_word(statement, _skip_blank(statement, 0)).upper() == "EXPLAIN"


def _refuse_returning(policy: _Policy, fetched: _Fetched) -> None:
    """A write with RETURNING is refused (and rolled back): on a view changed through INSTEAD
    OF triggers SQLite returns the statement's NEW row, not the contact as saved -- NULL for
    every column an UPDATE does not set, an INSERT's address as written, not as stored."""
    if policy.wrote_contacts and fetched.columns:
        raise SqlError("refused: RETURNING is not supported on contacts (SQLite would return "
                       "NULL for the columns an UPDATE does not set); nothing was changed: "
                       "make the change without it, then SELECT from contacts")


def _refuse_non_addresses(diff: Sequence[dict[str, Any]]) -> None:
    """A contact row the statement wrote must be one address alone: no mail could ever match
    'Bank <x@y>' or a NULL, and a NULL address broke every later contacts write."""
    for change in diff:
        address = change["contact"]
        if change["after"] is None or (address is not None and looks_like_address(address)
                                       and address == address.strip()):
            continue
        raise SqlError(f"refused: {address!r} is not an e-mail address; a contact's "
                       "email_address is the address alone (name@example.org), its name goes "
                       "in name; nothing was changed")


def block_changes(diff: Sequence[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The addresses a contacts diff (see :func:`contact_diff`) blocked and unblocked."""
    def blocked(row: dict[str, Any] | None) -> bool:
        return bool(row and row["is_blocked"])
    return ([d["contact"] for d in diff if blocked(d["after"]) and not blocked(d["before"])],
            [d["contact"] for d in diff if blocked(d["before"]) and not blocked(d["after"])])


def _contacts_result(fetched: _Fetched, diff: list[dict[str, Any]]) -> ContactsResult:
    blocked, unblocked = block_changes(diff)
    return ContactsResult(**fetched.fields(), changed=len(diff), blocked=blocked,
                          unblocked=unblocked)


def own_among(conn: sqlite3.Connection, addresses: Iterable[str],
              also: Sequence[str] = ()) -> list[str]:
    """Those of ``addresses`` that are the user's own (the ``me`` view, and ``also``), in
    whichever form their domain is written, their sub-addresses too (is_own_address)."""
    mine = {canonical_address(a) for a in also} | {
        canonical_address(row[0]) for row in conn.execute("SELECT email FROM me")}
    return sorted(a for a in set(addresses) if is_own_address(a, mine))


def _refuse_own(conn: sqlite3.Connection, blocked: Sequence[str], own: Sequence[str]) -> None:
    if hit := own_among(conn, blocked, own):
        raise SqlError(f"refused: {', '.join(hit[:5])} {'is' if len(hit) == 1 else 'are'} the "
                       "user's own address(es) and can never be blocked; nothing was changed "
                       "(add AND is_me = 0 to the WHERE clause)")


def _unconfirmed(result: ContactsResult, diff: list[dict[str, Any]],
                 confirm_count: int | None) -> None:
    count = result.changed
    if confirm_count is not None:
        raise SqlError(f"confirm_count {confirm_count} does not match the {count} contacts the "
                       "statement changes now; nothing was changed")
    result.dry_run = True
    result.sample = [d["contact"] for d in diff[:5]]
    # Nothing was blocked or unblocked: a bulk statement's every address (thousands) would
    # cost the model its context for what the count and the sample say.
    result.blocked, result.unblocked = [], []
    raise _RolledBack(result)


# ---------------------------------------------------------------------------------------------
# The statement check


@dataclass(frozen=True)
class _Statement:
    """The caller's one statement, and whether LIKE must be guarded in it (see
    _needs_guarded_like): both checks read the tokens it is split into once (0.4 s for
    100 KB of SQL)."""

    text: str
    guards_like: bool


def _single_statement(sql: str, allowed: frozenset[str], hint: str) -> _Statement:
    """The one statement in ``sql`` (comments and a trailing ``;`` are fine), else SqlError."""
    if len(sql) > MAX_SQL_CHARS:
        raise SqlError(f"refused: the SQL is longer than {MAX_SQL_CHARS:,} characters")
    start = _skip_blank(sql, 0)
    if start == len(sql):
        raise SqlError("empty SQL: write one statement, e.g. SELECT * FROM emails LIMIT 10")
    keyword = _leading_word(sql, start).upper()
    if keyword in STATEMENT_KEYWORDS and keyword not in allowed:
        raise SqlError(f"refused: {keyword} statements are not allowed; {hint}")
    first, rest = _split_first(sql)
    if _skip_blank(rest, 0) != len(rest):
        raise SqlError("refused: only one statement per call is allowed (found more SQL after "
                       "the first ';'); send each statement in its own call")
    tokens = _statement_tokens(first)
    if _copied_tokens(tokens) > MAX_COPIED_TOKENS:
        raise SqlError("refused: SQLite copies a CTE wherever it is named, a subquery's or "
                       "CTE's column into each reference to it and a result column into each "
                       "use of its alias or number, and here the copies pass "
                       f"{MAX_COPIED_TOKENS:,} tokens (each level naming the one below twice "
                       "doubles them): too many to prepare within the time limit; name each "
                       "CTE, column, alias and number fewer times or nest fewer levels")
    return _Statement(first, _needs_guarded_like(tokens))


def _skip_blank(text: str, i: int) -> int:
    """Index of the first character at or after ``i`` that is not whitespace, ``;`` or a
    comment."""
    while i < len(text):
        if text[i].isspace() or text[i] == ";":
            i += 1
        elif text.startswith(("--", "/*"), i):
            i = _skip_comment(text, i)
        else:
            break
    return i


def _leading_word(text: str, i: int) -> str:
    end = i
    while end < len(text) and (text[end].isalpha() or text[end] == "_"):
        end += 1
    return text[i:end]


def _split_first(sql: str) -> tuple[str, str]:
    """Split at the first ``;`` outside strings, quoted identifiers and comments.

    Statements with inner semicolons (CREATE TRIGGER) never get here: the keyword check has
    refused them already.
    """
    i, n = 0, len(sql)
    closers = {"'": "'", '"': '"', "`": "`", "[": "]"}
    while i < n:
        ch = sql[i]
        if ch in closers:
            # A doubled quote ('it''s') reads as two adjacent literals here: same split point.
            end = sql.find(closers[ch], i + 1)
            i = n if end < 0 else end + 1
        elif sql.startswith(("--", "/*"), i):
            i = _skip_comment(sql, i)
        elif ch == ";":
            return sql[:i], sql[i + 1:]
        else:
            i += 1
    return sql, ""


def _skip_comment(text: str, i: int) -> int:
    # SQLite lets an unterminated /* comment run to the end of the text.
    closer = "\n" if text.startswith("--", i) else "*/"
    end = text.find(closer, i + 2)
    return len(text) if end < 0 else end + len(closer)


# Unquoted, these are never a column's name (SQLite refuses them as names).
_NOT_COLUMNS = frozenset("""
    ALL AND AS BETWEEN CASE COLLATE DISTINCT ELSE ESCAPE EXCEPT EXISTS FROM GROUP HAVING IN
    INTERSECT IS JOIN LIMIT NOT NULL ON OR ORDER SELECT THEN UNION USING VALUES WHEN WHERE
""".split())
_COMPOUNDS = frozenset({"UNION", "INTERSECT", "EXCEPT"})
# The clauses after the result columns, where a name may be an alias or a number a column's.
_CLAUSES = frozenset({"FROM", "WHERE", "GROUP", "HAVING", "ORDER", "LIMIT", "WINDOW"})
_UNKEPT = frozenset({"FROM", "WHERE", "GROUP", "HAVING", "ORDER", "(", ")", ",", ".", "SELECT",
                     "AS"})
_SUBQUERY_STARTS = frozenset({"SELECT", "VALUES", "WITH"})
_NO_COLUMNS: Mapping[str, int] = MappingProxyType({})


@dataclass(eq=False, slots=True)
class _Column:
    """A result column from token ``first`` to ``last``: the name a reference may give it
    (``sure`` where SQLite surely names it so, an alias or a column named bare; else SQLite
    names it by its text, and the last word may still be an alias written without AS), its
    own tokens, the names in it that may be columns read, and what the subqueries and CTEs
    in it bring in."""

    first: int
    last: int = -1
    name: str | None = None
    sure: bool = False
    weight: int = 0
    refs: dict[str, int] = field(default_factory=dict)
    read: int = 0


@dataclass(eq=False, slots=True)
class _Part:
    """One SELECT of a compound: its own tokens (not its subqueries'), its result columns,
    the clause being read, the names that may refer to a column read (a correlated
    subquery's too: they may be this part's), those after its result columns (where an
    alias may be one), the result-column numbers of its GROUP BY and ORDER BY, the
    subqueries it reads and the CTEs it names (once per mention), the tokens those bring in
    once copied and the most a copy of each of their columns brings in."""

    tokens: int = 0
    columns: list[_Column] = field(default_factory=list)
    clause: str = ""  # SELECT while in the result columns, then FROM, WHERE, ...
    refs: dict[str, int] = field(default_factory=dict)
    late: dict[str, int] = field(default_factory=dict)
    numbers: dict[int, int] = field(default_factory=dict)
    subqueries: list[_Body] = field(default_factory=list)
    names: list[tuple[str, _Column | None]] = field(default_factory=list)
    read: int = 0
    kept: int = 0  # of MATERIALIZED CTEs, read as tables: their columns are not copied
    found: dict[str, int] = field(default_factory=dict)
    unnamed: int = 0  # a column read whose name is not known (``*``, no alias)
    arms: int = 1  # copies of the part: per SELECT of each UNION ALL it reads in FROM
    spread: int = 0  # what a single such UNION ALL brings in: its SELECTs are not copied again

    def follow(self, word: str, i: int) -> None:
        """Follow token ``i`` at the part's own depth: a result column starts after SELECT
        (and DISTINCT or ALL) and after each ``,`` between them."""
        if word == "SELECT" and not self.clause or word == "," and self.clause == "SELECT":
            self.clause = "SELECT"
            self.columns.append(_Column(first=i + 1))
        elif word in ("DISTINCT", "ALL") and self.clause == "SELECT" and len(self.columns) == 1:
            self.columns[0].first = max(self.columns[0].first, i + 1)
        elif word in _CLAUSES:
            self.clause = word

    def column(self) -> _Column | None:
        return self.columns[-1] if self.clause == "SELECT" else None

    def floor(self) -> int:
        """Its tokens once prepared, less the copies into its references: cheap to count."""
        return self.tokens + self.kept + self.read

    def copies(self) -> int:
        """Tokens once prepared: SQLite copies a column read into each reference to it (that
        column alone where its name is known, else all the part reads at most) and a result
        column into each use of its alias or number (that column alone, with its copies).
        Counting all a part reads per reference refused a 4 KB report grouping on an 80-WHEN
        CASE over a CTE (7 ms to prepare)."""
        costs = [self.cost(column) for column in self.columns]
        aliased: dict[str, int] = {}
        for column, cost in zip(self.columns, costs):
            if column.name is not None:
                aliased[column.name] = max(aliased.get(column.name, 0), cost)
        # A column read moves into its first reference: the copies are of the others.
        # Flattening a UNION ALL copies the part into each of its SELECTs: a 2000-WHEN CASE
        # naming its column once, over 300 SELECTs of emails, took 14 s to prepare.
        return (self.floor() + (self.arms - 1) * (self.floor() - self.spread)
                + sum((n - 1) * self.ref(name) for name, n in self.refs.items())
                + sum(n * aliased.get(name, 0) for name, n in self.late.items())
                + sum(n * costs[k - 1] for k, n in self.numbers.items() if 0 < k <= len(costs)))

    def cost(self, column: _Column, one: bool = False) -> int:
        """A copy of ``column``, with what it copies in; ``one``: a copy of one of the
        columns a ``*`` in it stands for."""
        return (column.weight + column.read
                + sum(n * self.ref(name, one) for name, n in column.refs.items()))

    def ref(self, name: str, one: bool = False) -> int:
        """The most a reference to ``name`` copies in (``*``: all the part reads, or where
        ``one`` the most one column read does)."""
        if name == "*" and not one:
            return self.read
        found = max(self.found.values(), default=0) if name == "*" else self.found.get(name, 0)
        return min(self.read, max(found, self.unnamed))

    def add(self, source: _Body, cost: int, column: _Column | None) -> int:
        """Count ``source`` read, its copy costing ``cost``, in ``column`` if it is in one;
        returns the work done."""
        if column is not None:
            column.read += cost
        if source.materialized:
            self.kept += cost
            return 1
        self.read += cost
        if source.reader is not None:
            # An expression's subquery (scalar, IN, EXISTS) is not flattened into the part:
            # its columns are none of the part's.  Taking them as unnamed ones priced every
            # reference of a CTE chain, each step filtering on ``(SELECT avg(n) FROM ...)``
            # of the one before, at all the step read (37,539 for 2.6 ms to prepare).
            return 1
        if source.arms > 1:
            # SQLite flattens each into the part, one into each copy made for those before
            # (a join of three 10-SELECT UNION ALLs: 1000 copies).  Only a single one's
            # SELECTs are sure to be split among the copies, not copied into each.
            self.spread = cost if self.arms == 1 else 0
            self.arms *= source.arms
        if source.cost is None:  # named in itself: not copied, its columns not known
            self.unnamed = max(self.unnamed, cost)
            return 1
        self.unnamed = max(self.unnamed, source.unnamed)
        for name, copy in source.found.items():
            self.found[name] = max(self.found.get(name, 0), copy)
        return 1 + len(source.found)


@dataclass(eq=False, slots=True)
class _Body:
    """The statement, a subquery or a CTE (``name AS (body)``, or a WINDOW: counting
    high), as token indexes of its "(" and ")"; once counted, its cost and the most a copy
    of each of its columns brings in.  A subquery outside FROM (``reader`` set) may name
    the columns its reader reads, one in FROM (``within`` set) those of the queries around
    the one reading it (``outward``): SQLite copies them into it too.  So may a CTE defined
    in a subquery (``nested`` there), once per copy of it."""

    at: int  # the CTE's name; -1 for the statement and subqueries
    start: int
    end: int
    listed: tuple[str, ...] = ()  # a CTE's column names, if it lists them
    depth: int = 0  # parentheses around its own tokens
    parts: list[_Part] = field(default_factory=lambda: [_Part()])
    cost: int | None = None
    found: Mapping[str, int] = field(default_factory=lambda: _NO_COLUMNS)  # none till counted
    unnamed: int = 0
    arms: int = 1  # its SELECTs once the UNION ALLs read in their FROMs are flattened
    materialized: bool = False
    inlined: bool = False  # NOT MATERIALIZED
    reader: _Part | None = None
    within: _Body | None = None
    outward: dict[str, int] | None = None  # made when needed: thousands of bodies
    nested: list[tuple[_Body, dict[str, int]]] | None = None  # CTEs in it, with their names
    column: _Column | None = None  # of the part it sits in

    def finish(self) -> int:
        self.cost = sum(part.copies() for part in self.parts)
        self.arms = sum(part.arms for part in self.parts)
        self.found, self.unnamed = _column_copies(self)
        return self.cost


def _statement_tokens(statement: str) -> list[str]:
    """``statement``'s tokens, without blanks and comments: what every check reads."""
    return [t for t in _SQL_TOKEN.findall(statement)
            if not (t.isascii() and t.isspace()) and not t.startswith(("--", "/*"))]


def _copied_tokens(tokens: Sequence[str]) -> int:
    """How many tokens SQLite copies while it prepares the statement of ``tokens``, counted
    high: a CTE's SQL wherever the CTE is named; a subquery's or CTE's column into each
    reference to it when it flattens the one into the query reading it (correlated
    references too), and that query into each SELECT of a UNION ALL it flattens; a result
    column into each reference to its alias or number; and so
    on in the copies, adding up at each level.  Each part of a compound counts its own
    tokens, all it reads once, and per reference the copy of the column it may name (see
    _Part.copies).  Any word naming a CTE counts as naming every CTE of that name; a CTE is
    not copied into itself (recursion; SQLite takes no circular reference).  The count
    stops once past MAX_COPIED_TOKENS.
    """
    words = [t.upper() for t in tokens]
    names = [_token_name(t) for t in tokens]
    weights = [_weight(words, i) for i in range(len(words))]
    whole = _Body(at=-1, start=-1, end=len(tokens))
    bodies = _bodies(words, names)
    by_name: dict[str, list[_Body]] = {}
    for cte in bodies:
        if cte.at >= 0:
            by_name.setdefault(names[cte.at], []).append(cte)
    cap = MAX_COPIED_TOKENS + sum(weights)
    text = _Words(tokens, words, names)
    spread = _scan(whole, bodies, text, by_name.keys(), weights, cap)
    if spread > cap:
        return spread
    _fence_shared(bodies, text, by_name)
    return max(0, _cost(whole, by_name, cap) - sum(weights))


@functools.cache
def _fences_shared_ctes() -> bool:
    """Whether the SQLite linked in materializes a CTE read twice or more (unless NOT
    MATERIALIZED) rather than flatten it into the queries reading it: 3.40 does; asked,
    as the rule may change."""
    probe = ("EXPLAIN QUERY PLAN WITH u AS (SELECT 1 AS c UNION ALL SELECT 2) "
             "SELECT c FROM u UNION ALL SELECT c FROM u")
    with closing(sqlite3.connect(":memory:")) as conn:
        return any("MATERIALIZE" in str(row[-1]) for row in conn.execute(probe))


def _fence_shared(bodies: Sequence[_Body], text: _Words,
                 by_name: Mapping[str, Sequence[_Body]]) -> None:
    """Where SQLite fences a CTE read twice or more (see _fences_shared_ctes), count each CTE
    of the statement's own WITH that it surely reads twice as MATERIALIZED: its columns are
    not copied into the references to it, nor the queries reading it into its SELECTs (its
    SQL still is, into each).  Counting its copies as flattened counted a chain of ten
    CTEs, each joining the one before to itself, at 2.9 million tokens (8 ms to prepare).
    Surely read: named by a name only one CTE has, after FROM or JOIN, outside the CTE
    itself and outside any expression's subquery (the parser drops ``0 AND EXISTS (SELECT
    ... FROM t)``), in the statement or in a CTE surely read (SQLite reads no CTE that
    nothing names), and that name and the CTE's ASCII (SQLite folds no other case: the
    Kelvin sign names no CTE ``k``); reads SQLite makes that this misses only count high."""
    tokens, words, names = text.tokens, text.words, text.names
    reads: dict[_Body | None, list[int]] = {}  # by the CTE each read is in (None: in none)
    around: list[tuple[_Body, _Body | None, bool]] = []  # each body open, its CTE, dropped
    outer: set[_Body] = set()
    upcoming = iter(bodies)
    body = next(upcoming, None)
    for i in range(len(words)):
        while around and around[-1][0].end < i:
            around.pop()
        cte, dropped = around[-1][1:] if around else (None, False)
        if body is not None and body.start == i:
            nested = body.at < 0
            around.append((body, cte if nested else body,
                           nested and (dropped or body.reader is not None)))
            body = next(upcoming, None)
        named = by_name.get(names[i], ())
        if not around and len(named) == 1 and named[0].at == i:
            outer.add(named[0])
        if (len(named) == 1 and not dropped and i >= 2 and words[i - 1] in ("FROM", "JOIN")
                and tokens[i].isascii() and tokens[named[0].at].isascii()
                and words[i - 2] != "DISTINCT" and words[i + 1:i + 2] not in (["."], ["("])):
            reads.setdefault(cte, []).append(i)
    times: dict[_Body, int] = {}
    pending: list[_Body | None] = [None]
    while pending:
        for i in reads.get(pending.pop(), ()):
            read = by_name[names[i]][0]
            if read in outer and not read.start <= i <= read.end:
                times[read] = times.get(read, 0) + 1
                if times[read] == 1:
                    pending.append(read)
    fenced = _fences_shared_ctes()
    for cte, n in times.items():
        cte.materialized = cte.materialized or fenced and n >= 2 and not cte.inlined


@dataclass(frozen=True)
class _Words:
    """A statement's tokens, upper-cased, and as the names they may be (see _token_name)."""

    tokens: Sequence[str]
    words: Sequence[str]
    names: Sequence[str]


def _scan(whole: _Body, bodies: Sequence[_Body], text: _Words, ctes: Set[str],
          weights: Sequence[int], cap: int) -> int:
    """Fill in the parts of ``whole`` and ``bodies`` from ``text``; returns the work of
    carrying subqueries' names out, or some count past ``cap`` once it passes (names carried
    out of thousands of nested subqueries, or CTEs' mentions counted in each: seconds of
    work)."""
    tokens, words, names = text.tokens, text.words, text.names
    defined_at = {cte.at for cte in bodies}
    inside, upcoming = [whole], iter(bodies)  # in order of their "("
    in_cte: list[_Body | None] = [None]  # the innermost CTE around each of ``inside``
    in_subquery = [False]  # whether a subquery is around each: a CTE there may be correlated
    mentions: dict[str, list[tuple[int, _Body | None]]] = {}  # and the CTE each is in
    uses = _Uses(mentions, names, cap)
    body = next(upcoming, None)
    depth = spread = 0
    for i, name in enumerate(names):
        depth -= words[i] == ")"
        while inside[-1].end < i:
            in_cte.pop()
            in_subquery.pop()
            spread += _carried(inside.pop(), inside[-1], uses)
        if spread + uses.scanned > cap:
            return spread + uses.scanned
        if body is not None and body.start == i:
            _enter(body, inside[-1], words, depth)
            inside.append(body)
            in_cte.append(body if body.at >= 0 else in_cte[-1])
            in_subquery.append(in_subquery[-1] or body.at < 0)
            body = next(upcoming, None)
        elif words[i] in _COMPOUNDS:
            inside[-1].parts.append(_Part())
        part = inside[-1].parts[-1]
        if depth == inside[-1].depth:
            part.follow(words[i], i)
        depth += words[i] == "("
        part.tokens += weights[i]
        column = part.column()
        if column is not None and i >= column.first:
            column.weight += weights[i]
            column.last = i
        if name in ctes and i not in defined_at:
            part.names.append((name, column))
            if in_subquery[-1]:  # correlated: see _carried
                mentions.setdefault(name, []).append((i, in_cte[-1]))
        if _may_be_column(tokens, words, i):
            key = "*" if tokens[i] == "*" else name
            for refs in (part.refs, column.refs if column else None,
                         part.late if part.clause not in ("", "SELECT") else None):
                if refs is not None:
                    refs[key] = refs.get(key, 0) + 1
        elif number := _column_number(part, words, i):
            part.numbers[number] = part.numbers.get(number, 0) + 1
    while len(inside) > 1 and spread + uses.scanned <= cap:
        spread += _carried(inside.pop(), inside[-1], uses)
    for part in (part for each in (whole, *bodies) for part in each.parts):
        for column in part.columns:
            column.name, column.sure = _column_name(text, column)
    return spread + uses.scanned


def _enter(body: _Body, within: _Body, words: Sequence[str], depth: int) -> None:
    """Start ``body`` at its "(" (at ``depth``) in the last part of ``within``."""
    body.depth = depth + 1
    if body.at < 0:
        part = within.parts[-1]
        part.subqueries.append(body)
        body.column = part.column()
        opened = body.start
        while opened and words[opened - 1] == "(":  # FROM ((SELECT ...) AS t): in FROM too
            opened -= 1
        before = words[opened - 1] if opened else ""
        if before in ("FROM", "JOIN") or before == "," and part.clause == "FROM":
            body.within = within
        else:
            body.reader = part


@dataclass(eq=False)
class _Uses:
    """Each mention of a CTE's name in a subquery, in order, with the CTE it is in (None: in
    none); the copies of each CTE worked out so far (see _named_copies), and how many
    mentions that read (thousands of subqueries nested, each defining a CTE, each counting
    all the mentions inside it: seconds)."""

    mentions: Mapping[str, Sequence[tuple[int, _Body | None]]]
    names: Sequence[str]
    cap: int
    copies: dict[tuple[int, str], int] = field(default_factory=dict)  # by "(" and name
    scanned: int = 0

    def within(self, name: str, scope: _Body) -> Sequence[tuple[int, _Body | None]]:
        """The mentions of ``name`` inside ``scope``."""
        each = self.mentions.get(name, ())
        first = bisect.bisect_right(each, scope.start, key=lambda mention: mention[0])
        end = bisect.bisect_left(each, scope.end, lo=first, key=lambda mention: mention[0])
        self.scanned += end - first
        return each[first:end]


def _carried(body: _Body, around: _Body, uses: _Uses) -> int:
    """Carry the names in subquery ``body`` into the part reading it, or from FROM past it
    (SQLite copies the columns a query reads into the references to them in its subqueries
    too); those of a CTE defined in ``around`` (a subquery: they may be its reader's)
    once per copy of the CTE, counted once ``around`` is read through; returns the work."""
    refs = dict(body.outward or {})
    for part in body.parts:
        _count(refs, part.refs)
    for cte, names in body.nested or ():
        times = _named_copies(cte, body, uses)
        _count(refs, {name: n * times for name, n in names.items()})
    if body.at >= 0 and around.start >= 0:
        around.nested = [*(around.nested or ()), (body, refs)]
    if body.within is not None:
        body.within.outward = _count(body.within.outward or {}, refs)
    if body.reader is not None:
        _count(body.reader.refs, refs)
        if body.column is not None:
            _count(body.column.refs, refs)
        if body.reader.clause not in ("", "SELECT"):
            _count(body.reader.late, refs)
    return len(refs)


def _named_copies(cte: _Body, scope: _Body, uses: _Uses) -> int:
    """How many copies of ``cte`` (defined in subquery ``scope``) SQLite makes, at most
    ``uses.cap``: one per mention of its name in ``scope`` outside the CTEs there, and per
    copy of a CTE there a mention is in (of that name, or in a circle: once).  Worked out
    per name, once, without recursion: CTEs may name each other thousands deep."""
    copies, names = uses.copies, uses.names

    def around(name: str) -> list[str | None]:
        """The name of the CTE in ``scope`` each mention of ``name`` there is in, else None."""
        return [names[u.at] if u is not None and u.start > scope.start else None
                for _, u in uses.within(name, scope)]

    first = names[cte.at]
    if (scope.start, first) in copies:
        return copies[scope.start, first]
    each = around(first)
    stack = [(first, each, iter(each))]
    visiting = {first}
    while stack:
        name, each, pending = stack[-1]
        outer = next((u for u in pending if u is not None and (scope.start, u) not in copies
                      and u not in visiting), None)
        if outer is not None:
            visiting.add(outer)
            each = around(outer)
            stack.append((outer, each, iter(each)))
            continue
        stack.pop()
        visiting.discard(name)
        copies[scope.start, name] = min(uses.cap, sum(
            1 if u is None else copies.get((scope.start, u), 1) for u in each))
    return copies[scope.start, first]


def _count(counts: dict[str, int], more: Mapping[str, int]) -> dict[str, int]:
    """``counts`` with ``more`` added (a dict: thousands of Counters take long to make)."""
    for key, n in more.items():
        counts[key] = counts.get(key, 0) + n
    return counts


def _column_number(part: _Part, words: Sequence[str], i: int) -> int:
    """The result column that token ``i`` starts the number of in GROUP BY or ORDER BY
    (SQLite copies that column into it as into a use of its alias), else 0.  Each ASCII
    digit is a token."""
    if part.clause not in ("GROUP", "ORDER") or words[i - 1] not in ("BY", ","):
        return 0
    digits = itertools.takewhile(lambda word: word.isascii() and word.isdigit(),
                                 words[i:i + 10])
    return int("".join(digits) or "0")


def _column_name(text: _Words, column: _Column) -> tuple[str | None, bool]:
    """The name ``column`` may be referred to by, and whether SQLite surely names it so (an
    alias, a column named bare or qualified); else it names it by its text, and the last
    word may be an alias without AS."""
    tokens, words, names = text.tokens, text.words, text.names
    first, last = column.first, column.last
    if last < first or tokens[last] == "*":
        return None, False
    if last > first and words[last - 1] == "AS":
        return names[last], True
    if not _may_be_column(tokens, words, last):
        return None, False
    return names[last], last == first or words[last - 1] == "."


def _column_copies(body: _Body) -> tuple[dict[str, int], int]:
    """The most a copy of each of ``body``'s columns brings in, by name (each SELECT's of a
    compound added: flattening one copies them all), and the most of a column whose name is
    not known (all the body's cost for VALUES or a WINDOW)."""
    parts = body.parts
    if any(not part.columns for part in parts):
        return {}, body.cost or 0
    if any("*" in c.refs for part in parts for c in part.columns):
        # Where the columns a ``*`` stands for are is not known: a reference may copy the
        # most of any one column of each part.  All the body (its ``WHERE x <= (SELECT
        # ...)`` too) per reference counted a CTE chain ending ``SELECT * FROM s5 WHERE ...``
        # at 27,639 (2.6 ms to prepare).
        return {}, sum(max(part.cost(c, one=True) for c in part.columns) for part in parts)
    costs = [0] * max(len(part.columns) for part in parts)
    for part in parts:
        for k, column in enumerate(part.columns):
            costs[k] += part.cost(column)
    found: dict[str, int] = {}
    unnamed = max(costs[len(parts[0].columns):], default=0)
    for k, column in enumerate(parts[0].columns):
        name, sure = ((body.listed[k], True) if k < len(body.listed)
                      else (column.name, column.sure))
        if name is not None:
            found[name] = max(found.get(name, 0), costs[k])
        if not sure:
            unnamed = max(unnamed, costs[k])
    return found, unnamed


def _weight(words: Sequence[str], i: int) -> int:
    """What SQLite keeps of token ``i`` as nodes: a number is one (not one per digit); the
    punctuation, clauses and alias around a result column nothing."""
    word, before = words[i], words[i - 1] if i else ""
    return int(not (word in _UNKEPT or word.isdigit() and before.isdigit()
                    or before == "AS" and word != "("))


def _may_be_column(tokens: Sequence[str], words: Sequence[str], i: int) -> bool:
    """Whether token ``i`` may refer to a column: not a keyword, function, table, alias
    being defined or qualifier (``t`` of ``t.x``); ``*`` outside ``count(*)`` may be all."""
    before = words[i - 1] if i else ""
    if tokens[i] == "*":
        return before != "("
    first = tokens[i][0]
    if not (first in "\"`[_" or first.isalpha() or not first.isascii()):
        return False  # punctuation, a number, a string ('x' is a name only where no column is)
    after = words[i + 1] if i + 1 < len(words) else ""
    return (words[i] not in _NOT_COLUMNS and after not in (".", "(")
            and before not in ("AS", "FROM", "JOIN"))


def _cost(whole: _Body, by_name: Mapping[str, Sequence[_Body]], cap: int) -> int:
    """``whole``'s tokens once prepared (see _copied_tokens), or some count past ``cap``;
    each body's worked out once, without recursion (subqueries may nest thousands deep in the
    SQL SQLite takes)."""
    copying, steps = {whole}, 0
    stack: list[tuple[_Body, Iterator[tuple[_Part, _Body, _Column | None]],
                      tuple[_Part, _Column | None] | None]] = [
        (whole, _read(whole, by_name), None)]
    while stack and steps <= cap:
        body, reads, into = stack[-1]
        step = next(reads, None)
        steps += 1  # each adds a token at least, once, to the count of the statement
        if step is None:
            stack.pop()
            copying.discard(body)
            cost = body.finish()
            if into is not None:
                steps += into[0].add(body, cost, into[1])
                if into[0].floor() > cap:
                    return into[0].floor()
            if cost > cap:
                return cost
            continue
        part, source, column = step
        if source.cost is not None or source in copying:
            # A name copied into itself stays as written: one token.  Counted, so that every
            # step counts and thousands of CTEs of one name stop the count soon.
            steps += part.add(source, source.cost or 1, column)
            if part.floor() > cap:
                return part.floor()
        else:
            copying.add(source)
            stack.append((source, _read(source, by_name), (part, column)))
    return steps if whole.cost is None else whole.cost


def _read(body: _Body, by_name: Mapping[str, Sequence[_Body]]
          ) -> Iterator[tuple[_Part, _Body, _Column | None]]:
    """Each subquery of each part of ``body``, and every CTE each mention may name, with the
    result column it is in, lazily: mentions times CTEs of that name can be 100 million in
    100 KB of SQL."""
    for part in body.parts:
        yield from ((part, sub, sub.column) for sub in part.subqueries)
        yield from ((part, named, column) for name, column in part.names
                    for named in by_name[name])


def _bodies(words: Sequence[str], names: Sequence[str]) -> list[_Body]:
    """Each ``name [(columns)] AS [NOT] [MATERIALIZED] (body)`` in ``words`` (upper-case
    tokens; ``names`` as names): a CTE, or a WINDOW (counting high); and each other
    ``(SELECT``, ``(VALUES`` or ``(WITH``: a subquery; in order of their "("."""
    pairs = _paren_pairs(words)
    found = []
    for i in range(1, len(words)):
        start = i + 1
        start += words[start:start + 1] == ["NOT"]
        materialized = words[start:start + 1] == ["MATERIALIZED"]
        start += materialized
        if words[i] != "AS" or words[start:start + 1] != ["("]:
            continue
        listed = pairs.get(i - 1, i - 1) if words[i - 1] == ")" else i
        at = listed - 1
        if at >= 0:
            found.append(_Body(at=at, start=start, end=pairs[start],
                               listed=tuple(names[k] for k in range(listed + 1, i - 1)
                                            if words[k] != ","),
                               materialized=materialized and start == i + 2,
                               inlined=words[i + 1] == "NOT"))
    starts = {body.start for body in found}
    found += [_Body(at=-1, start=i, end=pairs[i]) for i, word in enumerate(words[:-1])
              if word == "(" and words[i + 1] in _SUBQUERY_STARTS and i not in starts]
    return sorted(found, key=lambda body: body.start)


def _paren_pairs(words: Sequence[str]) -> dict[int, int]:
    """Index of each "(" -> its ")" and back; one left open closes at the end."""
    pairs: dict[int, int] = {}
    opened: list[int] = []
    for i, word in enumerate(words):
        if word == "(":
            opened.append(i)
        elif word == ")" and opened:
            pairs[i] = opened.pop()
            pairs[pairs[i]] = i
    pairs.update((i, len(words)) for i in opened)
    return pairs


def _token_name(token: str) -> str:
    """The name a token may be, as SQLite compares names: unquoted ('x' is a name too where
    only a name fits; a doubled quote is one), ASCII case folded (lower() folds more: counting
    high)."""
    quote = token[0]
    closer = {"'": "'", '"': '"', "`": "`", "[": "]"}.get(quote)
    if closer is None:
        return token.lower()
    inner = token[1:-1] if len(token) > 1 and token.endswith(closer) else token[1:]
    return (inner if quote == "[" else inner.replace(closer * 2, closer)).lower()


# ---------------------------------------------------------------------------------------------
# Connection set-up


@dataclass(frozen=True)
class _Scope:
    """What ``account_name`` asks for, with what it is checked and resolved against."""

    account_name: str | None
    known_accounts: Sequence[str]
    folder_account: FolderAccount | None


@contextmanager
def _session(path: Path, scope: _Scope, *, readonly: bool) -> Iterator[sqlite3.Connection]:
    """A private connection, scoped and limited, closed afterwards; SQLite errors of our own
    statements become SqlError too (the caller's are translated in :func:`_execute`)."""
    conn = _open(path, readonly=readonly)
    try:
        _prepare(conn, scope)
        yield conn
    except sqlite3.Error as exc:
        raise _translate(exc, None, None) from None
    finally:
        conn.close()


def _open(path: Path, *, readonly: bool) -> sqlite3.Connection:
    if not path.exists():  # a read-write open would create an empty sidecar
        raise SqlError(f"no sidecar database at {path}; run `fmail-nm index` first")
    try:
        conn = sidecar.connect(path, readonly=readonly)
    except sidecar.SidecarError as exc:
        raise SqlError(str(exc)) from None
    except sqlite3.Error as exc:  # a writer holding the lock while connect() migrates
        raise _translate(exc, None, None) from None
    # Cells built by the caller's SQL may be invalid UTF-8 (CAST(x'ff' AS TEXT)).
    conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
    return conn


def _prepare(conn: sqlite3.Connection, scope: _Scope) -> None:
    """Account scope and limits, set before the authorizer (which would refuse the DDL)."""
    account = _checked_account(conn, scope.account_name, scope.known_accounts)
    if account is not None:
        conn.execute(f"CREATE TEMP TABLE {_ACCOUNT_FOLDERS} (folder TEXT PRIMARY KEY)")
        conn.executemany(f"INSERT INTO temp.{_ACCOUNT_FOLDERS} VALUES (?)", (
            (folder,) for folder in _account_folders(conn, account, scope.folder_account)))
        for statement in _scoped_views(account):
            conn.execute(statement)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_CHARS)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)  # a second fence behind the authorizer


def _checked_account(conn: sqlite3.Connection, account_name: str | None,
                     known_accounts: Sequence[str]) -> str | None:
    if not account_name:
        return None
    known = list(known_accounts) or [row[0] for row in conn.execute(
        "SELECT DISTINCT account_name FROM messages WHERE account_name IS NOT NULL")]
    if account_name not in known:
        listed = ", ".join(sorted(known)) or "(none)"
        raise SqlError(f"unknown account {account_name!r}; known accounts: {listed}")
    return account_name


def _account_folders(conn: sqlite3.Connection, account: str,
                     folder_account: FolderAccount | None) -> list[str]:
    """The mirror's folders (relative to the mail root) that hold the account's files."""
    if folder_account is None:
        return []
    return [folder for (folder,) in conn.execute(
        "SELECT DISTINCT folder FROM message_folders") if folder_account(folder) == account]


def _scoped_views(account: str) -> list[str]:
    """TEMP views that shadow the published ones for unqualified names in this connection
    (which views, and how: see _SCOPED_SELECTS)."""
    return [f"CREATE TEMP VIEW {view} AS " + select.replace(
                "{messages}", _ACCOUNT_MESSAGES).replace("{account}", _quoted(account))
            for view, select in _account_scopes().items() if select is not None]


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _policy(conn: sqlite3.Connection, hint: str, *, edits_contacts: bool = False) -> _Policy:
    tables = frozenset(row[0] for row in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' "
        "UNION SELECT name FROM sqlite_temp_master WHERE type = 'table'"))
    return _Policy(view_reads=_view_reads(conn), tables=tables, hint=hint,
                   edits_contacts=edits_contacts)


def _view_reads(conn: sqlite3.Connection) -> frozenset[tuple[str, str, str]]:
    """(table, column, view) for every internal column the published views read (the scope's
    TEMP views, the account's folders too).

    The authorizer names the innermost view behind a read, but a CTE named ``emails`` gets the
    same name; allowing only the columns the real views read keeps such a CTE from reaching
    anything the views do not already show.  Probed, so the rule follows schema migrations.
    """
    seen: set[tuple[str, str, str]] = set()

    def record(action: int, table: str | None, column: str | None, db: str | None,
               context: str | None) -> int:
        if action == sqlite3.SQLITE_READ and db in ("main", "temp") and table and context:
            seen.add((table, column or "", context))
        return sqlite3.SQLITE_OK

    conn.set_authorizer(record)
    try:
        for view in sidecar.PUBLISHED_VIEWS:
            for name in (f"main.{view}", view):  # the latter is the TEMP view when scoped
                conn.execute(f"SELECT * FROM {name} LIMIT 0").close()
    finally:
        conn.set_authorizer(None)
    return frozenset(seen)


def _clamp(limit: int) -> int:
    return max(1, min(int(limit), MAX_ROWS))


# ---------------------------------------------------------------------------------------------
# The authorizer


# What _Policy._check returns for "skip silently" (SQLITE_IGNORE), unlike a refusal text.
_IGNORE = "<ignore>"


@dataclass
class _Policy:
    """The authorizer: remembers the first refusal so the error can say what was refused."""

    view_reads: frozenset[tuple[str, str, str]]
    tables: frozenset[str]  # the real tables in main and temp, to tell them from CTE names
    hint: str
    edits_contacts: bool = False
    refusal: str | None = field(default=None, init=False)
    # Internal tables this statement has read through a published view so far.
    via_views: set[str] = field(default_factory=set, init=False)
    # Whether the statement writes the contacts view (a SELECT's rows are its answer).
    wrote_contacts: bool = field(default=False, init=False)

    def __call__(self, action: int, arg1: str | None, arg2: str | None, db: str | None,
                 context: str | None) -> int:
        refused = self._check(action, arg1 or "", arg2 or "", db, context)
        if refused is None:
            return sqlite3.SQLITE_OK
        if refused is _IGNORE:
            return sqlite3.SQLITE_IGNORE
        if self.refusal is None:
            self.refusal = refused
        return sqlite3.SQLITE_DENY

    def _check(self, action: int, arg1: str, arg2: str, db: str | None,
               context: str | None) -> str | None:
        if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE):
            return None
        if action == sqlite3.SQLITE_READ:
            # SQLite names the view behind a read as the statement spells it (``Emails``).
            return self._read(arg1.lower(), arg2.lower(), db, context and context.lower())
        if action == sqlite3.SQLITE_FUNCTION:
            ok = arg2.lower() in SAFE_FUNCTIONS or self._trigger_function(arg2.lower(), context)
            return None if ok else self._refuse(f"the function {arg2}()")
        if action == sqlite3.SQLITE_PRAGMA:
            ok = arg1.lower() in SCHEMA_PRAGMAS
            return None if ok else self._refuse(f"PRAGMA {arg1}")
        if action in (sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE):
            return self._write(action, arg1.lower(), arg2.lower(), db, context)
        return self._refuse(_ACTION_NAMES.get(action, f"operation {action}"))

    def _read(self, table: str, column: str, db: str | None, context: str | None) -> str | None:
        if db not in (None, "main", "temp"):
            return self._refuse(f"reading {db}.{table}")
        if table in SCHEMA_TABLES:
            # The schema would list the internal tables the published views hide.  Setting
            # up json_each reads only the rowid of its (never run) schema update.
            return None if column == "rowid" else self._refuse(f"reading the schema table {table}")
        if table in sidecar.PUBLISHED_VIEWS or table in TABLE_FUNCTIONS:
            return None
        if context is not None and (table, column, context) in self.view_reads:
            self.via_views.add(table)
            return None
        if column == "" and (table in self.via_views or table not in self.tables):
            # A query using none of a source's columns (count(*)) reads it with no column:
            # for a CTE or subquery under its own name, and -- once SQLite has flattened a
            # view -- for the table behind that view, with no view name.  Only a row count
            # the view shows anyway; a bare count(*) FROM messages stays refused.
            return None
        if self.edits_contacts and context in (*sidecar.CONTACT_TRIGGERS, *TRACKING_TRIGGERS) \
                and (table, column, "contacts") in self.view_reads:
            # The triggers read contact_info; a CTE named like one gets the same context, so
            # only the columns the contacts view shows anyway (not updated_at).
            return None
        if self._tracking(table, db, context) and column == "k":
            # The triggers read the log's key alone; a CTE named like one gets the same
            # context, so no more: the addresses the statement itself changed so far.
            return None
        if table.startswith("pragma_"):
            return self._refuse(f"the pragma function {table}()")
        return self._refuse(f"reading the internal table {table}"
                            if context is None else f"reading {table}.{column}")

    def _write(self, action: int, table: str, column: str, db: str | None,
               context: str | None) -> str | None:
        verb = _ACTION_NAMES[action]
        if action == sqlite3.SQLITE_UPDATE and table in SCHEMA_TABLES and context is None \
                and db in ("main", "temp"):
            # Setting up an eponymous virtual table (json_each) parses a CREATE TABLE whose
            # schema update is never run; ignoring it keeps json_each usable.  A real UPDATE
            # of sqlite_master is refused by SQLite itself (writable_schema is unreachable).
            return _IGNORE
        if table in SCHEMA_TABLES:
            return self._refuse("changing the schema (CREATE, DROP, ALTER)")
        if not self.edits_contacts:
            return self._refuse(f"{verb} on {table}")
        if context in sidecar.CONTACT_TRIGGERS and table == "contact_info" and db == "main":
            return None
        if self._tracking(table, db, context):
            return None
        if table == "contacts" and db in (None, "main") and context is None:
            self.wrote_contacts = True
            return self._contacts_write(action, column)
        return self._refuse(f"{verb} on {table}")

    def _tracking(self, table: str, db: str | None, context: str | None) -> bool:
        """Our own TEMP triggers noting what the statement does to contact_info (see
        track_contacts), in their own TEMP table; the caller's SQL makes no trigger, so it
        writes the table in none, but a CTE of its own named like one reads as it does."""
        return (self.edits_contacts and context in TRACKING_TRIGGERS and table == _LOG
                and db == "temp")

    def _trigger_function(self, name: str, context: str | None) -> bool:
        """The schema's own functions (canonical addresses), called by the contacts view's
        triggers; never by the caller's SQL."""
        return (self.edits_contacts and context in sidecar.CONTACT_TRIGGERS
                and name in sidecar.SQL_FUNCTIONS)

    def _contacts_write(self, action: int, column: str) -> str | None:
        if action != sqlite3.SQLITE_UPDATE or column in sidecar.EDITABLE_CONTACT_COLUMNS:
            return None
        editable = ", ".join(sidecar.EDITABLE_CONTACT_COLUMNS)
        if column == "email_address":
            return ("refused: email_address identifies the contact and cannot be updated; "
                    f"DELETE the contact and INSERT it under the new address (editable: "
                    f"{editable})")
        return (f"refused: contacts.{column} is read-only: harvested figures "
                f"({', '.join(_generated()['HARVESTED_COLUMNS'])}) come from the mail; "
                f"editable: {editable}")

    def _refuse(self, what: str) -> str:
        return f"refused: {what} is not allowed; {self.hint}"


# ---------------------------------------------------------------------------------------------
# Running and fetching


@dataclass
class _Deadline:
    """The progress handler (and the authorizer's check, see _timed): stops the statement once
    the time limit has passed, counting from start() and the time spent before the last
    stop() (by the probe that prepared it already)."""

    seconds: float
    end: float = 0.0
    fired: bool = False
    spent: float = 0.0

    def start(self) -> None:
        self.end = time.monotonic() + self.seconds - self.spent

    def stop(self) -> None:
        self.spent = self.seconds - (self.end - time.monotonic())

    def __call__(self) -> int:
        if time.monotonic() >= self.end:
            self.fired = True
            return 1
        return 0


@dataclass
class _Fetched:
    columns: list[str]
    rows: list[list[Any]]
    truncated: bool
    truncated_cells: int

    def fields(self) -> dict[str, Any]:
        return {"columns": self.columns, "rows": self.rows, "row_count": len(self.rows),
                "truncated": self.truncated, "truncated_cells": self.truncated_cells}


def _deadline(time_limit: float) -> _Deadline:
    if not time_limit > 0:
        raise SqlError("time_limit must be a positive number of seconds")
    return _Deadline(float(time_limit))


def _timed(policy: _Policy, deadline: _Deadline) -> Callable[..., int]:
    """``policy``, refusing everything once the time limit has passed: SQLite calls the
    authorizer while it prepares a statement, where the progress handler never runs (a
    statement SQLite expands a lot can take seconds to prepare: see MAX_COPIED_TOKENS)."""
    def authorize(*args: Any) -> int:
        return sqlite3.SQLITE_DENY if deadline() else policy(*args)
    return authorize


def _execute(conn: sqlite3.Connection, statement: _Statement, policy: _Policy, limit: int,
             deadline: _Deadline) -> _Fetched:
    """Prepare and run the caller's statement under the authorizer and the time limit; fetch
    capped rows."""
    guards = _Guards(policy, deadline)
    guards.install(conn, like=statement.guards_like)
    conn.set_authorizer(_timed(policy, deadline))
    conn.set_progress_handler(deadline, PROGRESS_STEPS)
    deadline.start()
    try:
        cursor = conn.execute(statement.text)
        try:
            return _fetch(cursor, limit)
        finally:
            cursor.close()
    except (sqlite3.Error, sqlite3.Warning) as exc:
        raise _translate(exc, policy, deadline) from None
    finally:
        # Our own statements (COMMIT, ROLLBACK, blocklist) run without the fences.
        conn.set_authorizer(None)
        conn.set_progress_handler(None, 0)
        guards.close()


@contextmanager
def _limited(conn: sqlite3.Connection, deadline: _Deadline) -> Iterator[None]:
    """Our own reads of what the caller's statement did, under its time limit (which they
    count towards, as its own work): past it, the time-limit error, raised inside the
    transaction, rolls the statement back."""
    conn.set_progress_handler(deadline, PROGRESS_STEPS)
    try:
        yield
        if deadline():  # past it between two checks of the progress handler
            raise sqlite3.OperationalError("interrupted")
    except sqlite3.Error as exc:
        raise _translate(exc, None, deadline) from None
    finally:
        conn.set_progress_handler(None, 0)


# A printf conversion's width and precision: "%-08.3f" -> ("08", "3"), "%.*c" -> ("", "*").
_PRINTF_SPEC = re.compile(r"%[-+ 0#,!]*(\*|\d+)?(?:\.(\*|\d+))?")


class _Guards:
    """printf() and format() with widths and precisions capped, and the built-ins of
    GUARDED_CALL_COST with their cost capped, shadowing the built-ins; each call also checks
    the time limit, which the progress handler only checks between VM steps.

    SQLite 3.40 formats ``printf('%.*c', 2000000000, 'x')`` by looping two billion times even
    after the length limit has turned the result into NULL, inside one function call where the
    progress handler cannot stop it.  Checked calls go to the built-in of a private in-memory
    connection with the same length limit.
    """

    def __init__(self, policy: _Policy, deadline: _Deadline) -> None:
        self.policy = policy
        self.deadline = deadline
        self._builtin: sqlite3.Connection | None = None
        self._cursor: sqlite3.Cursor | None = None

    def install(self, conn: sqlite3.Connection, *, like: bool) -> None:
        for name in ("printf", "format"):
            conn.create_function(name, -1, self.printf)
        for name, (arities, budget) in GUARDED_CALL_COST.items():
            if name == "like" and not like:
                continue
            for arity in arities:
                conn.create_function(name, arity, functools.partial(self.costly, name, budget),
                                     deterministic=True)

    def printf(self, *args: Any) -> Any:
        # SQLite reads a BLOB (or number) format as text: check it as that text.
        if args and _too_wide(_as_text(args[0]), args[1:]):
            self._refuse(f"refused: printf/format widths and precisions above "
                         f"{MAX_PRINTF_WIDTH:,} are not allowed")
        return self._call("printf", args)

    def costly(self, name: str, budget: int, *args: Any) -> Any:
        cost = _size(args[0]) * _size(args[1])
        if cost > budget:
            self._refuse(f"refused: {name}() over text this long ({_size(args[0]):,} x "
                         f"{_size(args[1]):,} characters) could run past the time limit; "
                         "shorten one side, e.g. substr(x, 1, 1000)")
        return self._call(name, args)

    def _call(self, name: str, args: Sequence[Any]) -> Any:
        if self.deadline():  # fired: _translate reports the time limit
            raise sqlite3.OperationalError("interrupted")
        if self._cursor is None:
            self._builtin = sqlite3.connect(":memory:")
            self._builtin.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
            self._builtin.text_factory = lambda raw: raw.decode("utf-8", "replace")
            self._cursor = self._builtin.cursor()  # one cursor: LIKE may run once per row
        try:
            return self._cursor.execute(_builtin_call(name, len(args)), args).fetchone()[0]
        except sqlite3.Error as exc:  # the caller's statement only sees "function raised"
            if self.policy.refusal is None:
                self.policy.refusal = str(_translate(exc, None, None))
            raise

    def _refuse(self, why: str) -> None:
        if self.policy.refusal is None:
            self.policy.refusal = why
        raise ValueError(why)

    def close(self) -> None:
        if self._builtin is not None:
            self._builtin.close()


def _needs_guarded_like(tokens: Iterable[str]) -> bool:
    """Whether LIKE must be shadowed in the statement of ``tokens`` (see TEXT_BUILDERS): a
    word naming a TEXT_BUILDERS function anywhere outside strings and comments (erring that
    way costs speed only), ``||``, a long string or blob literal, or many LIKEs."""
    likes = 0
    for token in tokens:
        word = token.lower()
        if token == "||" or word in TEXT_BUILDERS:
            return True
        # "..." is a string too where it names no column (SQLite's leniency)
        if token[0] in "'\"" and len(token) > LONG_LITERAL_CHARS:
            return True
        likes += word == "like"
    return likes > MAX_NATIVE_LIKES


@functools.cache
def _builtin_call(name: str, arity: int) -> str:
    return f"SELECT {name}({', '.join('?' * arity)})"


def _as_text(value: Any) -> str:
    """A value as a format string: its text, a BLOB's bytes read as text (as SQLite does)."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return "" if value is None else str(value)


def _size(value: Any) -> int:
    """The length a guarded built-in works through: characters of text, bytes of a BLOB."""
    return len(value) if isinstance(value, (str, bytes)) else 32


def _too_wide(spec: str, args: Sequence[Any]) -> bool:
    """True if a width or precision in ``spec`` is too big; a ``*`` is checked against every
    numeric argument (conservative: which argument it takes does not matter)."""
    for width, precision in _PRINTF_SPEC.findall(spec):
        for part in (width, precision):
            if part.isdigit() and int(part) > MAX_PRINTF_WIDTH:
                return True
            if part == "*" and any(_number(arg) > MAX_PRINTF_WIDTH for arg in args):
                return True
    return False


def _number(value: Any) -> float:
    """|value| as SQLite would read it as a number (text and blobs too), else 0."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, str):
        digits = re.match(r"\s*[-+]?(\d+(\.\d*)?([eE][-+]?\d+)?)", value)
        value = float(digits.group(1)) if digits else 0.0
    return abs(value) if isinstance(value, (int, float)) else 0.0


def _fetch(cursor: sqlite3.Cursor, limit: int) -> _Fetched:
    columns = [d[0] for d in cursor.description or ()]
    rows: list[list[Any]] = []
    cut = 0
    budget = MAX_RESULT_BYTES
    truncated = False
    while columns:
        row = cursor.fetchone()
        if row is None:
            break
        if len(rows) == limit:
            truncated = True
            break
        cells = [_cell(value) for value in row]
        size = sum(_cell_size(v) for v, _ in cells)
        if size > budget and rows:
            truncated = True
            break
        if size > budget:  # the first row alone: kept, but no wider than the whole budget
            cells = _fit(cells, budget)
        budget -= size
        rows.append([v for v, _ in cells])
        cut += sum(c for _, c in cells)
    return _Fetched(columns, rows, truncated, cut)


def _cell_size(value: Any) -> int:
    """A cell's size in the result, in UTF-8 bytes (a character can take four)."""
    if not isinstance(value, str):
        return 8
    return len(value) if value.isascii() else len(value.encode("utf-8"))


def _fit(cells: Sequence[tuple[Any, int]], budget: int) -> list[tuple[Any, int]]:
    """A row's cells with their text cut to share ``budget`` bytes in column order (2000
    columns of 2000 characters would be megabytes in one row)."""
    fitted: list[tuple[Any, int]] = []
    for value, cut in cells:
        if isinstance(value, str) and _cell_size(value) > max(budget, 0):
            # Cut at a character's start: a character cut in two is dropped whole.
            head = value.encode("utf-8")[:max(budget, 0)].decode("utf-8", "ignore")
            value, cut = head + "…", 1
        budget -= _cell_size(value)
        fitted.append((value, cut))
    return fitted


def _cell(value: Any) -> tuple[Any, int]:
    """A JSON-safe cell, cut to MAX_CELL_CHARS; second item 1 when it was cut."""
    if isinstance(value, float) and not math.isfinite(value):
        # JSON has no infinity: the structured result would say null (an SQL NULL to the
        # reader) and the text Infinity.  Named as text in both.
        return ("Infinity" if value > 0 else "-Infinity" if value < 0 else "NaN"), 0
    if isinstance(value, bytes):
        # Blobs as SQL hex literals; the mirror holds none, but zeroblob() and friends do.
        text = "x'" + value[:MAX_CELL_CHARS].hex() + "'"
        return (text[:MAX_CELL_CHARS] + "…", 1) if len(text) > MAX_CELL_CHARS else (text, 0)
    if isinstance(value, str) and len(value) > MAX_CELL_CHARS:
        return value[:MAX_CELL_CHARS] + "…", 1
    return value, 0


# ---------------------------------------------------------------------------------------------
# Errors


def _translate(exc: BaseException, policy: _Policy | None,
               deadline: _Deadline | None) -> SqlError:
    """One clear SqlError for whatever SQLite or sqlite3 raised (never a traceback)."""
    message = str(exc)
    low = message.lower()
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    hint = READ_HINT if policy is None else policy.hint
    if policy is not None and policy.refusal is not None:
        return SqlError(policy.refusal)
    if deadline is not None and deadline.fired:
        return SqlError(f"query stopped after {deadline.seconds} s (time limit); narrow it "
                        "with WHERE, LIMIT or fewer joins")
    if primary == sqlite3.SQLITE_TOOBIG:
        return SqlError(f"refused: a value grew past {MAX_VALUE_BYTES:,} bytes (length limit); "
                        "select less text, e.g. substr(body_preview, 1, 200)")
    if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return SqlError("sidecar busy: another fmail-nm process is writing it (e.g. a sync); "
                        "retry in a moment")
    if primary == sqlite3.SQLITE_READONLY:
        return SqlError(f"refused: writing is not allowed; {hint}")
    if primary == sqlite3.SQLITE_CONSTRAINT and "email_address like" in low:
        # The contacts table's CHECK, quoted as SQL over two lines: what it means instead.
        return SqlError("a contact is one e-mail address (name@example.com): a domain or a "
                        "pattern cannot be a contact nor be blocked; block each sender's "
                        "address (the statement changed nothing)")
    if primary == sqlite3.SQLITE_CONSTRAINT:
        return SqlError(f"{message} (the statement changed nothing)")
    if "cannot upsert a view" in low:
        return SqlError("refused: INSERT ... ON CONFLICT is not supported on a view; INSERT a "
                        "new contact, UPDATE contacts to change one (the statement changed "
                        "nothing)")
    if "cannot modify" in low:
        return SqlError(f"refused: {message}; {hint}")
    if "one statement" in low:
        return SqlError("refused: only one statement per call is allowed")
    if "bindings" in low:
        return SqlError("parameters (? or :name) are not supported; write values inline as "
                        "'quoted' literals")
    if "no such table" in low or "no such column" in low:
        return SqlError(f"{message}; {hint} (see the tool description for their columns)")
    if "syntax error" in low or "incomplete input" in low or "unrecognized token" in low:
        return SqlError(f"SQL syntax error: {message} (strings go in 'single quotes', "
                        "identifiers in \"double quotes\")")
    return SqlError(f"SQLite error: {message}")


# ---------------------------------------------------------------------------------------------
# Generated names


_GENERATED_NAMES = frozenset({"SCHEMA_HELP", "CONTACTS_HELP", "HARVESTED_COLUMNS"})


def __getattr__(name: str) -> Any:
    """SCHEMA_HELP, CONTACTS_HELP and HARVESTED_COLUMNS, built on first use (PEP 562), so
    importing the module does not migrate a sidecar."""
    if name not in _GENERATED_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = _generated()[name]
    globals()[name] = value
    return value
