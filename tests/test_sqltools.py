"""query_emails and manage_contacts_sql: results, account scope, and refusals of hostile SQL.

The mirror tables are filled with plain SQL here (the mirror module is not needed), so each
test knows exactly which rows exist.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from fmail_nm.store import sidecar
from fmail_nm.store.notmuch import Reader
from fmail_nm.tools import reads
from fmail_nm.tools import sql as sqltools
from fmail_nm.tools.sql import SqlError, manage_contacts_sql, query_emails

from .conftest import MailEnv

ACCOUNTS = ("personal", "work")
ME = "me@example.org"


def add_email(conn: sqlite3.Connection, mid: str, *, account: str, folder: str, subject: str,
              sender: str, date: str | None, is_read: bool, tags: list[str], thread: str,
              to: str = ME, is_sent: bool = False, list_id: str | None = None,
              copies: Sequence[str] = ()) -> str:
    """One mirrored message, its file in ``account/folder`` and a copy in each of ``copies``
    (folders relative to the mail root, whose first part is the account here)."""
    uid = sidecar.uid_for(mid)
    folders = sorted({f"{account}/{folder}", *copies})
    recipients = [{"name": "", "email": to, "kind": "to"}]
    conn.execute(
        "INSERT INTO messages (message_id, uid, thread_id, account_name, folder, folders, "
        "subject, sender_email, sender_name, recipients, date, date_epoch, body_preview, "
        "is_read, is_flagged, is_replied, is_draft, is_sent, has_attachment, tags, list_id, "
        "size, filenames) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, 0, 0, 0, ?, 0, "
        "?, ?, 100, ?)",
        (mid, uid, thread, account, folder, json.dumps(folders), subject,
         sender, sender.split("@")[0].title(), json.dumps(recipients), date,
         f"preview of {subject}", int(is_read), int(is_sent), json.dumps(sorted(tags)),
         list_id, json.dumps([f"/mail/{account}/{folder}/cur/{mid}"])))
    conn.executemany("INSERT INTO message_tags (message_id, tag) VALUES (?, ?)",
                     [(mid, tag) for tag in tags])
    conn.executemany("INSERT INTO message_folders (message_id, folder) VALUES (?, ?)",
                     [(mid, f) for f in folders])
    return uid


def account_of_folder(folder: str) -> str | None:
    """The fixture's accounts each own the folders under their name."""
    return folder.split("/")[0]


# The unread INBOX mail across both accounts, newest first.
UNREAD_INBOX = ["w1@x", "p1@x", "p3@x", "w2@x"]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "data" / sidecar.SIDECAR_NAME
    with sidecar.opened(path) as conn, sidecar.transaction(conn):
        add_email(conn, "p1@x", account="personal", folder="INBOX", subject="Dinner?",
                  sender="alice@example.com", date="2026-11-30T10:00:00Z", is_read=False,
                  tags=["inbox", "unread"], thread="t1")
        add_email(conn, "p2@x", account="personal", folder="INBOX", subject="Photos",
                  sender="bob@example.com", date="2026-11-29T09:00:00Z", is_read=True,
                  tags=["inbox"], thread="t2")
        add_email(conn, "p3@x", account="personal", folder="INBOX", subject="Tickets",
                  sender="alice@example.com", date="2026-11-28T08:00:00Z", is_read=False,
                  tags=["inbox", "unread", "important"], thread="t3")
        add_email(conn, "p4@x", account="personal", folder="Sent", subject="Re: Photos",
                  sender=ME, to="bob@example.com", date="2026-11-29T10:00:00Z", is_read=True,
                  tags=["sent"], thread="t2", is_sent=True)
        add_email(conn, "w1@x", account="work", folder="INBOX", subject="Budget",
                  sender="boss@acme.test", date="2026-11-30T11:00:00Z", is_read=False,
                  tags=["inbox", "unread"], thread="t4")
        add_email(conn, "w2@x", account="work", folder="INBOX", subject="Offsite",
                  sender="carol@acme.test", date="2026-11-27T12:00:00Z", is_read=False,
                  tags=["inbox", "unread"], thread="t5")
        add_email(conn, "w3@x", account="work", folder="Archive", subject="Old report",
                  sender="carol@acme.test", date="2026-10-01T12:00:00Z", is_read=True,
                  tags=["archived"], thread="t6")
        # A mailing-list thread of 11 messages without a word from me.
        for n in range(11):
            add_email(conn, f"l{n}@x", account="work", folder="Lists", subject="Big debate",
                      sender=f"member{n}@lists.test", date=f"2026-11-{n + 1:02d}T07:00:00Z",
                      is_read=True, tags=["list"], thread="big", list_id="debate.lists.test")
        # Dated now so "unread per sender this month" always finds it.
        add_email(conn, "n1@x", account="work", folder="Lists", subject="News",
                  sender="news@lists.test", date=sidecar.utc_stamp(), is_read=False,
                  tags=["list", "unread"], thread="news")
        conn.execute("INSERT INTO me (email) VALUES (?)", (ME,))
        sidecar.rebuild_threads(conn)  # as the mirror keeps them
        conn.executemany(
            "INSERT INTO contact_stats (email_address, name, first_seen, last_seen, "
            "messages_from, messages_to) VALUES (?, ?, ?, ?, ?, ?)",
            [("alice@example.com", "Alice", "2026-11-28T08:00:00Z", "2026-11-30T10:00:00Z", 2, 0),
             ("bob@example.com", "Bob Stone", "2026-11-29T09:00:00Z", "2026-11-29T09:00:00Z", 1, 1),
             ("ghost@example.net", "Ghost", None, None, 0, 3),
             ("boss@acme.test", "Boss", "2026-11-30T11:00:00Z", "2026-11-30T11:00:00Z", 1, 0),
             ("carol@acme.test", "Carol", "2026-10-01T12:00:00Z", "2026-11-27T12:00:00Z", 2, 0),
             (ME, "Me", "2026-11-29T10:00:00Z", "2026-11-29T10:00:00Z", 1, 0)])
        conn.execute("INSERT INTO contact_info (email_address, name, is_blocked, notes, "
                     "updated_at) VALUES ('bob@example.com', NULL, 0, 'old friend', "
                     "'2026-01-01T00:00:00Z')")
        conn.execute("INSERT INTO contact_info (email_address, name, is_blocked, notes, "
                     "updated_at) VALUES ('spam@x.com', NULL, 0, NULL, '2026-01-01T00:00:00Z')")
        conn.execute("INSERT INTO sync_state (key, value) VALUES ('last_sync', 'x')")
    return path


def dump(path: Path) -> list[str]:
    """Everything in the sidecar, to compare before and after a refused statement."""
    with sidecar.opened(path, readonly=True) as conn:
        return list(conn.iterdump())


def q(path: Path, sql: str, **kwargs: object) -> sqltools.SqlResult:
    return query_emails(path, sql, known_accounts=ACCOUNTS,  # type: ignore[arg-type]
                        folder_account=account_of_folder, **kwargs)


def m(path: Path, sql: str, **kwargs: object) -> sqltools.ContactsResult:
    return manage_contacts_sql(path, sql, known_accounts=ACCOUNTS,  # type: ignore[arg-type]
                               folder_account=account_of_folder, **kwargs)


def uids(*mids: str) -> list[str]:
    return [sidecar.uid_for(mid) for mid in mids]


def column(result: sqltools.SqlResult, name: str) -> list[object]:
    i = result.columns.index(name)
    return [row[i] for row in result.rows]


def help_examples(text: str) -> list[str]:
    return text.split("Examples:\n", 1)[1].splitlines()


# ---------------------------------------------------------------------------------------------
# query_emails: results


def test_the_verbatim_example_returns_unread_inbox_newest_first(db: Path) -> None:
    result = q(db, "SELECT * FROM emails WHERE folder='INBOX' AND is_read=0 "
                   "ORDER BY date DESC LIMIT 10")
    assert column(result, "uid") == uids(*UNREAD_INBOX)
    assert column(result, "subject") == ["Budget", "Dinner?", "Tickets", "Offsite"]
    assert result.columns[:3] == ["uid", "subject", "sender_email"]
    assert result.row_count == 4 and not result.truncated and result.truncated_cells == 0


def test_account_scope_limits_emails_threads_tags(db: Path) -> None:
    inbox = "SELECT uid FROM emails WHERE folder='INBOX' AND is_read=0 ORDER BY date DESC"
    assert column(q(db, inbox, account_name="personal"), "uid") == uids("p1@x", "p3@x")
    assert column(q(db, inbox, account_name="work"), "uid") == uids("w1@x", "w2@x")

    threads = "SELECT thread_id FROM threads ORDER BY thread_id"
    assert column(q(db, threads, account_name="personal"), "thread_id") == ["t1", "t2", "t3"]
    tags = "SELECT tag, message_count, unread_count FROM tags ORDER BY tag"
    assert q(db, tags, account_name="personal").rows == [
        ["important", 1, 1], ["inbox", 3, 2], ["sent", 1, 0], ["unread", 2, 2]]
    email_tags = "SELECT DISTINCT tag FROM email_tags ORDER BY tag"
    assert column(q(db, email_tags, account_name="work"), "tag") == [
        "archived", "inbox", "list", "unread"]
    # Without a scope every account is there; main.emails bypasses the scope (a filter only).
    assert q(db, "SELECT count(*) FROM emails").rows == [[19]]
    assert q(db, "SELECT count(*) FROM main.emails", account_name="personal").rows == [[19]]


def test_account_scope_counts_mail_held_by_two_accounts(db: Path) -> None:
    """A message belongs to every account holding one of its files, as search_emails and
    list_folders count it, though emails.account_name names its primary file's account."""
    with sidecar.opened(db) as conn, sidecar.transaction(conn):
        add_email(conn, "both@x", account="personal", folder="INBOX", subject="To both",
                  sender="dave@example.com", date="2026-11-26T08:00:00Z", is_read=False,
                  tags=["inbox", "unread"], thread="tb", copies=["work/INBOX"])
        sidecar.rebuild_threads(conn)
    for account in ACCOUNTS:
        unread = q(db, "SELECT uid, account_name FROM emails WHERE is_read=0 "
                       "AND folders LIKE '%INBOX%' ORDER BY date DESC", account_name=account)
        assert [sidecar.uid_for("both@x"), "personal"] in unread.rows, account
        assert ["tb"] in q(db, "SELECT thread_id FROM threads", account_name=account).rows
        assert ["both@x"] in q(db, "SELECT message_id FROM email_tags WHERE tag='unread'",
                               account_name=account).rows
    assert q(db, "SELECT message_count, unread_count FROM tags WHERE tag='unread'",
             account_name="work").rows == [[4, 4]]  # w1, w2, n1 and the shared one
    # Without the folders' owners, an account has the messages whose primary file it holds.
    assert query_emails(db, "SELECT count(*) FROM emails WHERE message_id='both@x'",
                        account_name="work").rows == [[0]]


def test_account_scope_survives_a_schema_change_with_many_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scope's TEMP views held every folder name of the account in their text; SQLite
    parses them again after a schema change to the sidecar (a migration by another process)
    under the SQL length limit set after they were made, and refused them."""
    path = tmp_path / "data" / sidecar.SIDECAR_NAME
    with sidecar.opened(path) as conn, sidecar.transaction(conn):
        for i in range(2500):
            add_email(conn, f"m{i}@x", account="work", subject="s", sender="a@b.c",
                      folder=f"Projects/Client's {i:05d}/Correspondence archive",
                      date="2026-01-01T00:00:00Z", is_read=True, tags=["inbox"], thread=f"t{i}")
        add_email(conn, "p1@x", account="personal", folder="INBOX", subject="s", sender="a@b.c",
                  date="2026-01-01T00:00:00Z", is_read=True, tags=["inbox"], thread="p",
                  copies=["work/Projects/Client's 00000/Correspondence archive"])
        sidecar.rebuild_threads(conn)
    policy = sqltools._policy

    def policy_after_a_migration(conn: sqlite3.Connection, *args: Any, **kwargs: Any) -> Any:
        with sidecar.opened(path) as other:
            other.execute("CREATE TABLE IF NOT EXISTS later_migration (x)")
        return policy(conn, *args, **kwargs)

    monkeypatch.setattr(sqltools, "_policy", policy_after_a_migration)
    assert q(path, "SELECT count(*) FROM emails", account_name="work").rows == [[2501]]
    assert q(path, "SELECT count(*) FROM threads", account_name="personal").rows == [[1]]


@pytest.mark.parametrize("sql", ["SELECT * FROM account_folders",
                                 "SELECT count(*) FROM temp.account_folders",
                                 "INSERT INTO account_folders VALUES ('personal/INBOX')",
                                 "DELETE FROM account_folders"])
def test_the_scopes_folder_table_is_not_the_callers(db: Path, sql: str) -> None:
    for tool in (q, m):
        with pytest.raises(SqlError, match="refused"):
            tool(db, sql, account_name="work")
    assert q(db, "SELECT count(*) FROM emails", account_name="work").rows == [[15]]


def test_unknown_account_is_refused(db: Path) -> None:
    with pytest.raises(SqlError, match="unknown account 'nope'; known accounts: personal, work"):
        q(db, "SELECT 1", account_name="nope")
    # Without a list from the caller, the accounts in the mirror are the known ones.
    with pytest.raises(SqlError, match="known accounts: personal, work"):
        query_emails(db, "SELECT 1", account_name="nope")
    assert query_emails(db, "SELECT count(*) FROM emails", account_name="work").rows == [[15]]


def test_every_documented_example_runs(db: Path) -> None:
    examples = help_examples(sqltools.SCHEMA_HELP)
    assert examples[0] == ("SELECT * FROM emails WHERE folder='INBOX' AND is_read=0 "
                           "ORDER BY date DESC LIMIT 10")
    results = [q(db, sql) for sql in examples]
    assert column(results[0], "uid") == uids(*UNREAD_INBOX)
    assert ["news@lists.test", 1] in results[1].rows
    assert results[2].rows == [["Re: Photos", "2026-11-29T10:00:00Z"]]
    assert len(results) == 3


def test_help_texts_stay_compact() -> None:
    assert len(sqltools.SCHEMA_HELP.encode()) <= 1800
    assert len(sqltools.CONTACTS_HELP.encode()) <= 1800


def real_columns(path: Path) -> dict[str, tuple[str, ...]]:
    with sidecar.opened(path, readonly=True) as conn:
        return {view: tuple(row[1] for row in conn.execute(f"PRAGMA table_info({view})"))
                for view in sidecar.PUBLISHED_VIEWS}


def test_every_published_view_is_documented_with_its_real_columns(db: Path) -> None:
    assert set(sqltools.VIEW_NOTES) == set(sidecar.PUBLISHED_VIEWS)  # no stale prose either
    for view, columns in real_columns(db).items():
        assert columns and sqltools.VIEW_NOTES[view].strip()
        line = f"\n{view}({','.join(columns)}): {sqltools.VIEW_NOTES[view]}\n"
        assert line in sqltools.SCHEMA_HELP, view
    contacts = real_columns(db)["contacts"]
    assert f"contacts({','.join(contacts)})" in sqltools.CONTACTS_HELP
    assert sqltools.HARVESTED_COLUMNS == tuple(
        c for c in contacts if c not in sidecar.EDITABLE_CONTACT_COLUMNS + ("email_address",))


def one_account_copy(db: Path, target: Path, account: str) -> Path:
    """The sidecar with every other account's messages (and their tags) deleted."""
    with sidecar.opened(db, readonly=True) as source, sidecar.opened(target) as copy:
        source.backup(copy)
        copy.execute("DELETE FROM messages WHERE account_name IS NOT ?", (account,))
        sidecar.rebuild_threads(copy)  # as a sync would
    return target


@pytest.mark.parametrize("account", ACCOUNTS)
def test_every_published_view_is_account_scoped(db: Path, tmp_path: Path, account: str) -> None:
    """account_name gives exactly what the view shows on a sidecar holding that account alone,
    unless the view is declared account-independent, with a reason."""
    alone = one_account_copy(db, tmp_path / "alone" / sidecar.SIDECAR_NAME, account)
    for view, columns in real_columns(db).items():
        order = ", ".join(str(i + 1) for i in range(len(columns)))
        sql = f"SELECT * FROM {view} ORDER BY {order}"
        everything, scoped = q(db, sql).rows, q(db, sql, account_name=account).rows
        if view in sqltools.ACCOUNT_INDEPENDENT:
            assert sqltools.ACCOUNT_INDEPENDENT[view].strip(), view
            assert scoped == everything, view
        else:
            assert scoped == q(alone, sql).rows, view
            assert scoped != everything and scoped, view  # the fixture has both accounts


def test_a_view_published_without_prose_or_scope_fails_loudly(tmp_path: Path) -> None:
    with sidecar.opened(tmp_path / sidecar.SIDECAR_NAME) as conn:
        conn.execute("CREATE VIEW gadgets AS SELECT uid, tags FROM messages")
        conn.execute("CREATE VIEW widgets AS SELECT uid, account_name FROM messages")
        columns = sqltools.view_columns(conn, [*sidecar.PUBLISHED_VIEWS, "gadgets", "widgets"])
        with pytest.raises(RuntimeError, match="not in the sidecar schema"):
            sqltools.view_columns(conn, ["emails", "nonesuch"])
    assert columns["gadgets"] == ("uid", "tags")
    with pytest.raises(RuntimeError, match="gadgets, widgets have no line in VIEW_NOTES"):
        sqltools.describe_views(columns)
    notes = {**sqltools.VIEW_NOTES, "gadgets": "g", "widgets": "w"}
    assert "\ngadgets(uid,tags): g\n" in sqltools.describe_views(columns, notes)
    # No account_name column and no rule: refused.  With the column: filtered on it.
    with pytest.raises(RuntimeError, match="'gadgets' has no account_name column"):
        sqltools.account_scopes(columns)
    scopes = sqltools.account_scopes({v: c for v, c in columns.items() if v != "gadgets"})
    assert scopes["widgets"] == "SELECT * FROM main.widgets WHERE account_name = {account}"
    assert scopes["contacts"] is None
    # A rule for a view that is not published is stale: refused too.
    with pytest.raises(RuntimeError, match="unpublished views"):
        sqltools.account_scopes({"emails": columns["emails"]})


def test_comments_and_one_trailing_semicolon_are_fine(db: Path) -> None:
    sql = "-- newest first\nSELECT subject FROM emails /* ; */ ORDER BY date DESC LIMIT 1; -- done"
    assert q(db, sql).rows == [["News"]]
    assert q(db, "SELECT ';' AS semi;").rows == [[";"]]


def test_json_each_and_schema_functions_work(db: Path) -> None:
    result = q(db, "SELECT DISTINCT t.value FROM emails, json_each(emails.tags) t "
                   "WHERE emails.account_name='personal' ORDER BY 1")
    assert column(result, "value") == ["important", "inbox", "sent", "unread"]
    # Reading schema information is harmless: pragma_table_info is allowed.
    info = q(db, "SELECT name FROM pragma_table_info('threads')")
    assert column(info, "name")[:3] == ["thread_id", "subject", "message_count"]


def test_row_cap_marks_truncated(db: Path) -> None:
    result = q(db, "SELECT * FROM emails a, emails b, emails c, emails d", limit=10)
    assert result.row_count == 10 and len(result.rows) == 10 and result.truncated
    assert len(result.columns) == 4 * 21
    exact = q(db, "SELECT uid FROM emails", limit=19)
    assert exact.row_count == 19 and not exact.truncated


def test_long_cells_are_cut(db: Path) -> None:
    result = q(db, "SELECT printf('%.*c', 5000, 'x') AS long, 'short' AS short, zeroblob(3) AS b")
    long, short, blob = result.rows[0]
    assert long == "x" * sqltools.MAX_CELL_CHARS + "…"
    assert short == "short" and blob == "x'000000'"
    assert result.truncated_cells == 1


def test_errors_name_the_problem(db: Path) -> None:
    with pytest.raises(SqlError, match="no such table: mails; query_emails only reads"):
        q(db, "SELECT * FROM mails")
    with pytest.raises(SqlError, match="no such column: sender"):
        q(db, "SELECT sender FROM emails")
    with pytest.raises(SqlError, match="SQL syntax error: .*syntax error"):
        q(db, "SELECT * FRM emails")
    with pytest.raises(SqlError, match="SQL syntax error: incomplete input"):
        q(db, "SELECT * FROM emails WHERE")
    with pytest.raises(SqlError, match="parameters"):
        q(db, "SELECT * FROM emails WHERE uid = ?")
    with pytest.raises(SqlError, match="empty SQL"):
        q(db, "  -- nothing\n")


def test_missing_sidecar_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SqlError, match="no sidecar database"):
        q(tmp_path / "none.sqlite3", "SELECT 1")
    with pytest.raises(SqlError, match="no sidecar database"):
        m(tmp_path / "none.sqlite3", "SELECT 1")
    assert not (tmp_path / "none.sqlite3").exists()


# ---------------------------------------------------------------------------------------------
# query_emails: hostile SQL. Each is refused with a clear reason and changes nothing.

HOSTILE_READS = [
    ("INSERT INTO emails (uid) VALUES ('x')", "INSERT statements are not allowed"),
    ("UPDATE emails SET is_read = 1", "UPDATE statements are not allowed"),
    ("DELETE FROM emails", "DELETE statements are not allowed"),
    ("INSERT INTO messages (message_id) VALUES ('x')", "INSERT statements are not allowed"),
    ("UPDATE messages SET is_read = 1", "UPDATE statements are not allowed"),
    ("DELETE FROM contact_info", "DELETE statements are not allowed"),
    ("UPDATE contacts SET is_blocked = 1", "UPDATE statements are not allowed"),
    # Behind a WITH, the keyword check lets them through: the authorizer refuses.
    ("WITH x AS (SELECT 1) DELETE FROM messages", "DELETE on messages is not allowed"),
    ("WITH x AS (SELECT 1) UPDATE contact_info SET notes = 'x'",
     "UPDATE on contact_info is not allowed"),
    ("WITH x AS (SELECT 1) INSERT INTO emails (uid) VALUES ('x')", "INSERT on emails"),
    ("DROP VIEW emails", "DROP statements are not allowed"),
    ("EXPLAIN DROP VIEW emails", "changing the schema"),
    ("PRAGMA writable_schema = 1", "PRAGMA statements are not allowed"),
    ("PRAGMA journal_mode", "PRAGMA statements are not allowed"),
    ("PRAGMA journal_mode = DELETE", "PRAGMA statements are not allowed"),
    ("EXPLAIN PRAGMA writable_schema = 1", "PRAGMA writable_schema is not allowed"),
    ("SELECT * FROM pragma_journal_mode", "pragma function pragma_journal_mode"),
    ("SELECT * FROM pragma_writable_schema", "pragma function pragma_writable_schema"),
    ("SELECT load_extension('x')", r"function load_extension\(\) is not allowed"),
    ("SELECT fts3_tokenizer('simple')", r"function fts3_tokenizer\(\) is not allowed"),
    ("SELECT 1; DROP VIEW emails", "only one statement per call"),
    ("SELECT 1; SELECT 2", "only one statement per call"),
    ("CREATE TEMP TABLE t (x)", "CREATE statements are not allowed"),
    ("CREATE TEMP VIEW v AS SELECT 1", "CREATE statements are not allowed"),
    ("CREATE TEMP TRIGGER tr AFTER INSERT ON contact_info BEGIN SELECT 1; END",
     "CREATE statements are not allowed"),
    ("EXPLAIN CREATE TEMP TABLE t (x)", "changing the schema"),
    ("EXPLAIN CREATE TEMP VIEW v AS SELECT 1", "changing the schema"),
    ("SELECT zeroblob(2000000000)", "length limit"),
    ("SELECT length(randomblob(2000000000))", "length limit"),
    ("SELECT replace(hex(zeroblob(100000)), '0', 'xx')", "length limit"),
    ("SELECT printf('%.*c', 2000000000, 'x')", "printf/format widths and precisions above"),
    ("SELECT format('%2000000000c', 'x')", "printf/format widths"),
    ("SELECT printf('%s %.*c', 'a', '2e9', 'x')", "printf/format widths"),
    ("SELECT * FROM messages", "reading the internal table messages is not allowed; "
                               "query_emails only reads the published views emails"),
    ("SELECT count(*) FROM contact_info", "reading the internal table contact_info"),
    ("SELECT * FROM audit_log", "reading the internal table audit_log"),
    ("SELECT * FROM emails WHERE uid IN (SELECT value FROM sync_state)",
     "reading the internal table sync_state"),
    # A CTE or alias named like a view must not reach what the views do not show.
    ("WITH emails AS (SELECT filenames FROM messages) SELECT * FROM emails",
     "reading messages.filenames is not allowed"),
    ("WITH threads AS (SELECT * FROM audit_log) SELECT * FROM threads",
     "reading audit_log"),
    ("SELECT * FROM (SELECT * FROM sync_state) AS emails", "internal table sync_state"),
    ("VACUUM INTO '/tmp/fmail-sqltools-vacuum.db'", "VACUUM statements are not allowed"),
    ("BEGIN", "BEGIN statements are not allowed"),
    ("BEGIN IMMEDIATE", "BEGIN statements are not allowed"),
    ("COMMIT", "COMMIT statements are not allowed"),
    ("SAVEPOINT s", "SAVEPOINT statements are not allowed"),
    ("ROLLBACK", "ROLLBACK statements are not allowed"),
    ("ANALYZE", "ANALYZE statements are not allowed"),
    ("REINDEX", "REINDEX statements are not allowed"),
    ("ALTER TABLE messages ADD COLUMN x", "ALTER statements are not allowed"),
    ("DETACH DATABASE temp", "DETACH statements are not allowed"),
]


@pytest.mark.parametrize(("sql", "phrase"), HOSTILE_READS)
def test_query_emails_refuses(db: Path, sql: str, phrase: str) -> None:
    before = dump(db)
    with pytest.raises(SqlError, match=phrase):
        q(db, sql)
    assert dump(db) == before


def test_attach_refused_and_no_file_created(db: Path, tmp_path: Path) -> None:
    target = tmp_path / "new.db"
    before = dump(db)
    for sql, phrase in [(f"ATTACH DATABASE '{target}' AS x", "ATTACH statements"),
                        (f"EXPLAIN ATTACH DATABASE '{target}' AS x", "ATTACH is not allowed")]:
        with pytest.raises(SqlError, match=phrase):
            q(db, sql)
    assert not target.exists()
    assert dump(db) == before


def test_vacuum_into_creates_no_file(db: Path, tmp_path: Path) -> None:
    target = tmp_path / "copy.db"
    with pytest.raises(SqlError, match="VACUUM statements are not allowed"):
        q(db, f"VACUUM INTO '{target}'")
    # EXPLAIN compiles VACUUM without running it; still nothing may appear.
    q(db, f"EXPLAIN VACUUM INTO '{target}'")
    assert not target.exists()


def test_recursive_query_stops_at_the_time_limit(db: Path) -> None:
    sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c"
    with pytest.raises(SqlError, match=r"query stopped after 0\.5 s \(time limit\)"):
        q(db, sql, time_limit=0.5)


def doubling(depth: int, step: str) -> str:
    """CTEs t1..t<depth>, each naming the one before twice in ``step`` (written for t1 over
    t0): SQLite copies a CTE's SQL wherever it is named, 2^depth times here, while it
    prepares the statement."""
    ctes = ["t0 AS (SELECT 1 AS x)"] + [
        f"t{i} AS " + step.replace("t0", f"t{i - 1}") for i in range(1, depth + 1)]
    return "WITH " + ", ".join(ctes) + " "


def nested(depth: int) -> str:
    """The same, one CTE named ``t`` inside the next: SQLite takes the nearest ``t``."""
    sql = "SELECT 1 AS x"
    for _ in range(depth):
        sql = f"WITH t AS ({sql}) SELECT x FROM t UNION ALL SELECT x FROM t"
    return f"WITH t16 AS ({sql}) "


UNION_STEP = "(SELECT x FROM t0 UNION ALL SELECT x FROM t0)"
# Each took 0.4-2 s to prepare before the copies were counted, and runs in milliseconds.
COPIED_CTES = [
    doubling(16, "NOT MATERIALIZED " + UNION_STEP),
    doubling(16, UNION_STEP),
    doubling(16, "MATERIALIZED (SELECT (SELECT x FROM t0) + (SELECT x FROM \"t0\") AS x)"),
    doubling(12, "(SELECT a.x FROM t0 a, [t0] b)"),
    # named before they are defined, and quoted every way SQLite reads as a name
    "WITH " + ", ".join([f"t{i} AS (SELECT x FROM `t{i - 1}` UNION ALL SELECT x FROM 't{i - 1}')"
                         for i in range(16, 0, -1)] + ["t0 AS (SELECT 1 AS x)"]) + " ",
    nested(16),
]


@pytest.mark.parametrize("ctes", COPIED_CTES)
def test_ctes_copied_past_a_cap_are_refused_before_sqlite_prepares_them(
        db: Path, ctes: str) -> None:
    """The time limit cannot reach SQLite while it prepares: such a statement would hold the
    call for seconds, doubling with each CTE more."""
    before = dump(db)
    refused = "refused: SQLite copies a CTE wherever it is named.*time limit"
    last = "t16" if "t16 " in ctes else "t12"
    with pytest.raises(SqlError, match=refused):
        q(db, f"{ctes} SELECT x FROM {last} LIMIT 1")
    with pytest.raises(SqlError, match=refused):
        m(db, f"{ctes} UPDATE contacts SET notes = (SELECT x FROM {last} LIMIT 1) "
              "WHERE email_address = 'bob@example.com'", before_write=lambda: None)
    assert dump(db) == before


def test_ctes_of_one_name_are_counted_in_memory_as_small_as_the_sql(db: Path) -> None:
    """Thousands of CTEs of one name, each naming it a few times (no SQL: SQLite would refuse
    the names, but the count comes first): listing each CTE a mention may name took 130 MB
    here, and 2 GB and seconds for 84 KB of SQL, before SQLite saw any of it."""
    sql = "WITH " + ",".join(["a AS(a a a a)"] * 2000) + " SELECT * FROM a"
    tracemalloc.start()
    try:
        with pytest.raises(SqlError, match="the copies pass 20,000 tokens"):
            q(db, sql)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 * len(sql)  # bytes: a few lists of the SQL's tokens (~80 now)


def test_ctes_in_nested_subqueries_are_counted_in_work_as_small_as_the_sql(
        db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 subqueries nested, each defining a CTE: working out each one's copies read all
    the mentions inside it (2 s for 100 KB of SQL, past the time limit, before SQLite saw
    any of it).  That reading counts as work, and the count stops once the work passes."""
    sql = "SELECT a"
    depth = 0
    while len(sql) < sqltools.MAX_SQL_CHARS - 100:
        sql = f"SELECT (WITH x AS ({sql}) SELECT a FROM x, x) AS a"
        depth += 1
    worked_out = 0
    named_copies = sqltools._named_copies

    def counted(*args: Any) -> int:
        nonlocal worked_out
        worked_out += 1
        return named_copies(*args)

    monkeypatch.setattr(sqltools, "_named_copies", counted)
    with pytest.raises(SqlError, match="the copies pass 20,000 tokens"):
        q(db, sql + " FROM emails")
    assert worked_out < depth // 4  # 173 of 2,199 now


def test_ctes_named_several_times_still_run(db: Path) -> None:
    assert q(db, doubling(10, UNION_STEP) + "SELECT count(*) FROM t10").rows == [[1024]]
    assert q(db, doubling(8, "(SELECT a.x FROM t0 a, t0 b)")
             + "SELECT count(*) FROM t8").rows == [[1]]
    # each read twice, so materialized: its column is not copied into the references to it
    # (6 ms to prepare; was counted as 3^8 copies of it, past the cap)
    assert q(db, doubling(8, "(SELECT a.x + a.x + b.x AS x FROM t0 a JOIN t0 b ON a.x = b.x)")
             + "SELECT x FROM t8").rows == [[3 ** 8]]
    # a column named like its CTE; a recursive CTE named twice
    assert q(db, "WITH s AS (SELECT sender_email AS s, count(*) AS n FROM emails GROUP BY 1) "
                 "SELECT s FROM s WHERE s = 'alice@example.com'").rows == [["alice@example.com"]]
    assert q(db, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 5) "
                 "SELECT count(*) FROM c, c AS d").rows == [[25]]
    m(db, "WITH n AS (SELECT 'x' AS v), w AS (SELECT v FROM n UNION ALL SELECT v FROM n) "
          "UPDATE contacts SET notes = (SELECT group_concat(v, '') FROM w) "
          "WHERE email_address = 'bob@example.com'")
    assert contact(db, "bob@example.com")["notes"] == "xx"  # type: ignore[index]


def flattened(depth: int, step: str, first: str = "SELECT 1 AS c FROM emails") -> str:
    """``step`` (over a subquery written ``{}``) nested ``depth`` times: SQLite flattens
    each subquery into the one reading it, copying its column into each reference to it."""
    sql = first
    for _ in range(depth):
        sql = step.format(f"({sql})")
    return sql


def named_once(depth: int, step: str) -> str:
    """The same with CTEs, each named once (so not copied as a CTE) but flattened alike."""
    ctes = ["t0 AS (SELECT 1 AS c FROM emails)"] + [
        f"t{i} AS ({step.format(f't{i - 1}')})" for i in range(1, depth + 1)]
    return "WITH " + ", ".join(ctes) + f" SELECT c FROM t{depth}"


SWITCH = "CASE c " + " ".join(f"WHEN {k} THEN 'v{k}'" for k in range(300)) + " END"
# 3^depth copies of the innermost column: 0.3 s to prepare at 10 deep, 16 s at 15, where the
# time limit cannot stop SQLite; these (runs in milliseconds) are refused by the same count.
FLATTENED = [
    flattened(8, "SELECT c+c+c AS c FROM {}"),
    flattened(8, "SELECT t.c * t.c - t.c AS c FROM {} AS t"),
    flattened(8, "SELECT a+b+c AS a, a+b+c AS b, a+b+c AS c FROM {}",
              "SELECT 1 AS a, 1 AS b, 1 AS c FROM emails"),
    named_once(8, "SELECT c+c+c AS c FROM {}"),
    named_once(8, "SELECT * FROM (SELECT c+c+c AS c FROM {})"),
    # a subquery in FROM inside more parentheses is flattened all the same (11 deep: 1 s)
    flattened(8, "SELECT c+c+c AS c FROM ({} AS t)"),
    # a ``*`` over a step filtered on a scalar subquery copies the step's column alike
    named_once(8, "SELECT * FROM (SELECT c+c+c AS c FROM {}) WHERE c > (SELECT count(*) "
                  "FROM emails)"),
    # 2^14 copies of the innermost column (12 deep: 2^13 in all, 17 ms, is counted ~16,000)
    named_once(14, "SELECT c+c AS c FROM {}"),
    named_once(2, "SELECT " + "+".join(["c"] * 100) + " AS c FROM {}"),
    # an alias copied into each reference to it (2 s to prepare at 2000 WHENs, 200 x's)
    "SELECT CASE " + " ".join(["WHEN uid THEN uid"] * 300) + " END AS x FROM emails "
    "ORDER BY " + ", ".join(["x"] * 40),
    # and a result column into each use of its number (1.7 s to prepare at 2000 WHENs, 200 1's)
    "SELECT CASE " + " ".join(["WHEN uid THEN uid"] * 300) + " END FROM emails "
    "ORDER BY " + ", ".join(["1"] * 40),
    "SELECT " + "uid, " * 11 + "CASE " + " ".join(["WHEN uid THEN uid"] * 300) + " END "
    "FROM emails GROUP BY " + ", ".join(["12"] * 20) + " ORDER BY " + ", ".join(["12"] * 20),
    # an alias without AS, and one after a window's own ORDER BY (each 3 s at 2000 x 200)
    "SELECT CASE " + " ".join(["WHEN uid THEN uid"] * 300) + " END x FROM emails "
    "ORDER BY " + ", ".join(["x"] * 40),
    "SELECT row_number() OVER (ORDER BY uid) AS r, CASE " + " ".join(["WHEN uid THEN uid"] * 300)
    + " END AS x FROM emails ORDER BY " + ", ".join(["x"] * 40),
    # a column copied into a correlated subquery's references (467 characters: 15-25 s), and
    # into those of a subquery in its FROM (575 characters: 2-3 s)
    flattened(10, "SELECT (SELECT c+c+c) AS c FROM {}"),
    flattened(10, "SELECT (SELECT y FROM (SELECT c+c+c AS y)) AS c FROM {}"),
    # and into those of a CTE defined in a correlated subquery, per copy of the CTE (691
    # characters: 1.3 s, 4 s a level deeper)
    flattened(10, "SELECT (WITH x AS (SELECT c+c+c AS y) SELECT y FROM x) AS c FROM {}"),
    # the query around a UNION ALL, copied into each SELECT of it, naming its column once
    # (0.15 s to prepare; a 2000-WHEN CASE over 300 SELECTs of emails: 14 s, and 5 s to stop
    # at the 2 s time limit)
    "SELECT " + SWITCH + " AS x FROM (" + " UNION ALL ".join(["SELECT uid AS c FROM emails"] * 40)
    + ")",
    # over a CTE, and over a subquery whose one SELECT reads such a UNION ALL
    "WITH u AS (" + " UNION ALL ".join(["SELECT uid AS c FROM emails"] * 40) + ") SELECT "
    + SWITCH + " AS x FROM u",
    "SELECT " + SWITCH + " AS x FROM (SELECT c FROM (" + " UNION ALL ".join(
        ["SELECT uid AS c FROM emails"] * 40) + "))",
    # a CTE named twice but read once is flattened all the same: the other name dropped by
    # the parser (``0 AND``), in a CTE nothing reads, or an alias (9 deep: 0.1-0.3 s)
    doubling(9, "(SELECT x+x+x AS x FROM t0 WHERE 0 AND EXISTS (SELECT 1 FROM t0))")
    + "SELECT x FROM t9",
    "WITH t0 AS (SELECT 1 AS x), " + ", ".join(
        f"t{i} AS (SELECT x+x+x AS x FROM t{i - 1}), u{i} AS (SELECT x FROM t{i - 1})"
        for i in range(1, 10)) + " SELECT x FROM t9",
    doubling(9, "(SELECT x+x+x AS x, 1 AS t0 FROM t0)") + "SELECT x FROM t9",
    # a join of UNION ALLs: each copy made for one is copied into each SELECT of the next
    # (3 of 10 SELECTs: 0.6 s to prepare; 6 of 4 under a 1100-WHEN CASE: 2.9 s)
    "SELECT " + SWITCH.replace("CASE c ", "CASE c0 ") + " AS x FROM " + ", ".join(
        "(" + " UNION ALL ".join([f"SELECT uid AS c{j} FROM emails"] * 10) + ")"
        for j in range(3)),
]


def test_a_cte_named_twice_by_a_fold_sqlite_does_not_make_is_counted_as_flattened() -> None:
    """SQLite folds ASCII case only: ``blocKed_mail`` (Kelvin sign) and ``blocked_mail`` are
    a CTE and the view, the CTE read once, so flattened, its column copied into each
    reference (1000 of a 1000-WHEN CASE: 3.7 s to prepare).  The authorizer refuses that view
    before SQLite flattens, but would not refuse a published view with a k in its name."""
    sql = ("WITH bloc\u212aed_mail AS (SELECT " + SWITCH.replace("CASE c ", "CASE uid ")
           + " AS x FROM emails) SELECT " + "+".join(["x"] * 300)
           + " AS y FROM bloc\u212aed_mail JOIN blocked_mail ON 0")
    assert sqltools._copied_tokens(sqltools._statement_tokens(sql)) > sqltools.MAX_COPIED_TOKENS


@pytest.mark.parametrize("sql", FLATTENED)
def test_subqueries_flattened_past_the_cap_are_refused_before_sqlite_prepares_them(
        db: Path, sql: str) -> None:
    before = dump(db)
    refused = "refused: SQLite copies .* the copies pass 20,000 tokens.*time limit"
    with pytest.raises(SqlError, match=refused):
        q(db, sql)
    with pytest.raises(SqlError, match=refused):
        m(db, f"UPDATE contacts SET notes = ({sql} LIMIT 1) "
              "WHERE email_address = 'bob@example.com'", before_write=lambda: None)
    assert dump(db) == before


def test_subqueries_flattened_a_few_levels_still_run(db: Path) -> None:
    assert q(db, flattened(5, "SELECT c+c+c AS c FROM {}") + " ORDER BY c").rows[0] == [243]
    assert q(db, named_once(8, "SELECT c+c AS c FROM {}") + " ORDER BY c").rows[0] == [256]
    # a MATERIALIZED CTE is read as a table: its column is not copied
    assert q(db, named_once(12, "SELECT c+c+c AS c FROM {}").replace(" AS (", " AS MATERIALIZED (")
             + " ORDER BY c").rows[0] == [3 ** 12]
    # result columns named by number
    assert q(db, "SELECT sender_email, count(*) FROM emails GROUP BY 1 ORDER BY 2 DESC, 1 "
                 "LIMIT 2").rows == [["alice@example.com", 2], ["carol@acme.test", 2]]
    # a UNION ALL of many SELECTs under a short query: each copy of it is short
    assert q(db, "SELECT count(c) AS n FROM (SELECT c FROM (" + " UNION ALL ".join(
        ["SELECT uid AS c FROM emails"] * 100) + ")) WHERE c IS NOT NULL").rows[0][0] > 100
    # a column named as its alias is referenced once per use, not once per alias
    assert q(db, "SELECT " + "+".join(["c"] * 500) + " AS c FROM (SELECT 1 AS c)").rows == [
        [500]]


# Analytical queries as a model writes them: several levels of subqueries and CTEs, a dozen
# columns carried through, aliases reused in WHERE, HAVING and ORDER BY.
REALISTIC = [
    # nested subqueries, a dozen columns carried through three levels
    "SELECT sender_email, total, unread, flagged, replied, attachments, first_date, last_date, "
    "folders, threads, share, rnk FROM (SELECT s.*, round(100.0 * total / sum(total) OVER (), 1) "
    "AS share, rank() OVER (ORDER BY total DESC) AS rnk FROM (SELECT sender_email, count(*) AS "
    "total, sum(is_read = 0) AS unread, sum(is_flagged) AS flagged, sum(is_replied) AS replied, "
    "sum(has_attachment) AS attachments, min(date) AS first_date, max(date) AS last_date, "
    "count(DISTINCT folder) AS folders, count(DISTINCT thread_id) AS threads FROM emails GROUP BY "
    "sender_email) AS s) WHERE rnk <= 20 ORDER BY rnk",
    "SELECT uid, subject, sender_email, sender_name, date, folder, account_name, thread_id, size, "
    "is_read, is_flagged, has_attachment FROM (SELECT uid, subject, sender_email, sender_name, "
    "date, folder, account_name, thread_id, size, is_read, is_flagged, has_attachment FROM "
    "(SELECT uid, subject, sender_email, sender_name, date, folder, account_name, thread_id, size, "
    "is_read, is_flagged, has_attachment FROM emails WHERE is_draft = 0) WHERE size > 0) "
    "WHERE date >= '2020-01-01' ORDER BY date DESC LIMIT 50",
    "SELECT day, n, unread, round(1.0 * unread / n, 2) AS ratio FROM (SELECT substr(date, 1, 10) "
    "AS day, count(*) AS n, sum(CASE WHEN is_read = 0 THEN 1 ELSE 0 END) AS unread FROM emails "
    "GROUP BY day) WHERE n > 0 ORDER BY day DESC LIMIT 30",
    "SELECT domain, count(*) AS n, sum(unread) AS unread FROM (SELECT lower(substr(sender_email, "
    "instr(sender_email, '@') + 1)) AS domain, is_read = 0 AS unread FROM emails) GROUP BY domain "
    "HAVING n >= 1 ORDER BY n DESC, domain LIMIT 20",
    "WITH m AS (SELECT strftime('%Y-%m', date) AS month, folder, count(*) AS n FROM emails GROUP BY "
    "1, 2), t AS (SELECT month, sum(n) AS total FROM m GROUP BY month) SELECT m.month, m.folder, "
    "m.n, t.total, round(100.0 * m.n / t.total, 1) AS pct FROM m JOIN t USING (month) ORDER BY "
    "m.month DESC, m.n DESC",
    "SELECT t.thread_id, t.subject, t.message_count, t.unread_count, t.last_date, "
    "t.last_sender_email, t.participants FROM threads t WHERE t.thread_id IN (SELECT thread_id "
    "FROM emails WHERE has_attachment) AND t.unread_count > 0 ORDER BY t.last_date DESC LIMIT 25",
    "SELECT e.uid, e.subject, e.date, c.name, c.notes FROM emails e JOIN contacts c ON "
    "c.email_address = e.sender_email WHERE c.is_blocked = 0 AND e.is_read = 0 ORDER BY e.date "
    "DESC LIMIT 20",
    "SELECT tag, message_count, unread_count, round(100.0 * unread_count / max(message_count, 1), "
    "1) AS unread_pct FROM tags WHERE tag NOT IN ('attachment', 'signed') ORDER BY message_count "
    "DESC",
    "SELECT et.tag, count(*) AS n, count(DISTINCT e.sender_email) AS senders FROM email_tags et "
    "JOIN emails e ON e.uid = et.uid GROUP BY et.tag ORDER BY n DESC",
    "SELECT sender_email, subject, date FROM (SELECT sender_email, subject, date, row_number() "
    "OVER (PARTITION BY sender_email ORDER BY date DESC) AS rn FROM emails) WHERE rn <= 3 ORDER BY "
    "sender_email, date DESC",
    "SELECT email_address, name, messages_from, messages_to, messages_from + messages_to AS total, "
    "CASE WHEN messages_to = 0 THEN 'never replied' WHEN messages_from = 0 THEN 'only written to' "
    "WHEN messages_to > messages_from THEN 'mostly me' ELSE 'mostly them' END AS balance FROM "
    "contacts WHERE is_me = 0 ORDER BY total DESC LIMIT 30",
    "SELECT folder, account_name, count(*) AS n, sum(size) AS bytes, avg(size) AS avg_size, "
    "max(date) AS newest FROM emails GROUP BY folder, account_name ORDER BY bytes DESC",
    "SELECT a.subject, a.date, b.subject AS reply, b.date AS replied_at FROM emails a JOIN emails "
    "b ON a.thread_id = b.thread_id AND b.date > a.date WHERE a.sender_email <> b.sender_email "
    "ORDER BY a.date DESC LIMIT 20",
    "SELECT hour, count(*) AS n FROM (SELECT CAST(strftime('%H', date) AS INTEGER) AS hour FROM "
    "emails) GROUP BY hour ORDER BY hour",
    "SELECT weekday, n, round(100.0 * n / (SELECT count(*) FROM emails), 1) AS pct FROM (SELECT "
    "strftime('%w', date) AS weekday, count(*) AS n FROM emails GROUP BY weekday) ORDER BY weekday",
    "SELECT r.value ->> 'email' AS rcpt, count(*) AS n FROM emails e, json_each(e.recipients) r "
    "WHERE e.is_sent GROUP BY rcpt ORDER BY n DESC LIMIT 10",
    "SELECT list_id, count(*) AS n, sum(is_read = 0) AS unread, max(date) AS last FROM emails WHERE "
    "list_id IS NOT NULL GROUP BY list_id HAVING unread > 0 OR n > 1 ORDER BY unread DESC, n DESC",
    "SELECT sender_email, n, prev_n, n - prev_n AS change FROM (SELECT sender_email, n, "
    "lag(n, 1, 0) OVER (PARTITION BY sender_email ORDER BY month) AS prev_n, month FROM (SELECT "
    "sender_email, strftime('%Y-%m', date) AS month, count(*) AS n FROM emails GROUP BY 1, 2)) "
    "ORDER BY change DESC LIMIT 10",
    "WITH RECURSIVE months(m) AS (SELECT '2026-01' UNION ALL SELECT strftime('%Y-%m', m || "
    "'-01', '+1 month') FROM months WHERE m < '2026-12') SELECT months.m, coalesce(x.n, 0) AS n "
    "FROM months LEFT JOIN (SELECT strftime('%Y-%m', date) AS m, count(*) AS n FROM emails GROUP "
    "BY 1) AS x ON x.m = months.m",
    "SELECT subject, sender_email, date, size FROM emails WHERE size > (SELECT avg(size) * 2 FROM "
    "emails) AND has_attachment ORDER BY size DESC LIMIT 10",
    "SELECT thread_id, count(*) AS n, group_concat(DISTINCT sender_email) AS senders, min(date) AS "
    "started, max(date) AS last FROM emails GROUP BY thread_id HAVING count(DISTINCT "
    "sender_email) > 1 ORDER BY last DESC LIMIT 20",
    "SELECT x.sender_email, x.n, y.n AS replied FROM (SELECT sender_email, count(*) AS n FROM "
    "emails GROUP BY 1) AS x LEFT JOIN (SELECT sender_email, count(*) AS n FROM emails WHERE "
    "is_replied GROUP BY 1) AS y ON x.sender_email = y.sender_email ORDER BY x.n DESC",
    "SELECT * FROM (SELECT * FROM (SELECT * FROM emails WHERE folder LIKE '%INBOX%') WHERE "
    "is_read = 0) WHERE is_flagged OR has_attachment ORDER BY date DESC LIMIT 10",
    "SELECT folder, sum(CASE WHEN size < 10000 THEN 1 ELSE 0 END) AS small, sum(CASE WHEN size "
    ">= 10000 AND size < 100000 THEN 1 ELSE 0 END) AS medium, sum(CASE WHEN size >= 100000 AND "
    "size < 1000000 THEN 1 ELSE 0 END) AS large, sum(CASE WHEN size >= 1000000 THEN 1 ELSE 0 END) "
    "AS huge FROM emails GROUP BY folder",
    "SELECT c.email_address, c.name, c.last_seen, (SELECT count(*) FROM emails e WHERE "
    "e.sender_email = c.email_address AND e.is_read = 0) AS unread, (SELECT max(date) FROM emails "
    "e WHERE e.sender_email = c.email_address AND e.is_flagged) AS last_flagged FROM contacts c "
    "WHERE c.messages_from > 0 ORDER BY unread DESC LIMIT 20",
    "SELECT account_name, folder, n, unread, flagged, 100.0 * unread / n AS unread_pct, 100.0 * "
    "flagged / n AS flagged_pct, newest, oldest, avg_size, biggest, senders FROM (SELECT "
    "account_name, folder, count(*) AS n, sum(is_read = 0) AS unread, sum(is_flagged) AS flagged, "
    "max(date) AS newest, min(date) AS oldest, avg(size) AS avg_size, max(size) AS biggest, "
    "count(DISTINCT sender_email) AS senders FROM emails GROUP BY account_name, folder) ORDER BY "
    "unread_pct DESC, n DESC",
    "SELECT s.sender_email, s.n, s.unread, s.n - s.unread AS read_count, CASE WHEN s.unread * 2 > "
    "s.n THEN 'mostly unread' ELSE 'mostly read' END AS verdict FROM (SELECT sender_email, "
    "count(*) AS n, sum(is_read = 0) AS unread FROM emails GROUP BY sender_email) s WHERE s.n > 0 "
    "ORDER BY s.unread DESC, s.n DESC",
    "WITH base AS (SELECT uid, thread_id, sender_email, date, is_read, is_flagged, has_attachment, "
    "size, folder, account_name, subject, list_id FROM emails), per_thread AS (SELECT thread_id, "
    "count(*) AS n, sum(is_read = 0) AS unread, sum(is_flagged) AS flagged, sum(has_attachment) AS "
    "attachments, sum(size) AS bytes, min(date) AS first, max(date) AS last, count(DISTINCT "
    "sender_email) AS senders, max(list_id) AS list_id, max(subject) AS subject, "
    "max(account_name) AS account FROM base GROUP BY thread_id), ranked AS (SELECT *, "
    "rank() OVER (ORDER BY last DESC) AS recency, rank() OVER (ORDER BY n DESC) AS size_rank FROM "
    "per_thread) SELECT thread_id, subject, account, n, unread, flagged, attachments, bytes, "
    "first, last, senders, list_id, recency, size_rank FROM ranked WHERE recency <= 20 OR "
    "size_rank <= 5 ORDER BY recency",
    "SELECT e.subject, e.date, t.message_count, t.participants FROM emails e JOIN threads t ON "
    "t.thread_id = e.thread_id WHERE e.uid IN (SELECT max(uid) FROM emails GROUP BY thread_id) "
    "ORDER BY e.date DESC LIMIT 15",
    "SELECT sender_email, count(*) FILTER (WHERE is_read = 0) AS unread, count(*) FILTER (WHERE "
    "is_flagged) AS flagged, count(*) FILTER (WHERE has_attachment) AS attachments, count(*) AS "
    "total FROM emails GROUP BY sender_email ORDER BY unread DESC, flagged DESC, total DESC",
    "SELECT d, n, sum(n) OVER (ORDER BY d) AS running, avg(n) OVER (ORDER BY d ROWS BETWEEN 6 "
    "PRECEDING AND CURRENT ROW) AS week_avg FROM (SELECT date(date) AS d, count(*) AS n FROM "
    "emails GROUP BY d) ORDER BY d DESC LIMIT 14",
    "SELECT uid, subject FROM emails WHERE uid IN (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, "
    "15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30) AND subject LIKE '%a%' "
    "ORDER BY uid",
    "SELECT q, count(*) AS n, min(size) AS smallest, max(size) AS largest FROM (SELECT size, "
    "ntile(4) OVER (ORDER BY size) AS q FROM emails) GROUP BY q ORDER BY q",
    "SELECT sender_email, total, unread, total_rank FROM (SELECT sender_email, total, unread, "
    "dense_rank() OVER (ORDER BY total DESC) AS total_rank FROM (SELECT sender_email, total, "
    "unread FROM (SELECT sender_email, count(*) AS total, sum(is_read = 0) AS unread FROM emails "
    "GROUP BY sender_email) WHERE total > 0)) WHERE total_rank <= 10 ORDER BY total_rank, "
    "sender_email",
    # a result column named as the column it cleans up, then filtered on it many times: the
    # alias copies only its own expression (2 ms to prepare; was counted 27,000)
    "SELECT lower(sender_email) AS sender_email, count(*) AS n, max(date) AS last FROM emails "
    "WHERE (" + " OR ".join(f"sender_email LIKE '%@d{i}.example'" for i in range(50)) + ") AND "
    "uid NOT IN (SELECT uid FROM email_tags WHERE tag IN ('spam', 'trash')) GROUP BY "
    "sender_email ORDER BY n DESC",
    # a CTE chain each step reading the one before in FROM and in a scalar subquery of its
    # WHERE: that subquery's unnamed column is no column of the step (2.6 ms to prepare; was
    # counted 37,539)
    "WITH s1 AS (SELECT sender_email AS who, count(*) AS n FROM emails GROUP BY sender_email), "
    "s2 AS (SELECT who, n, (SELECT max(n) FROM s1) AS top FROM s1), "
    "s3 AS (SELECT who, n, top, n * 1.0 / top AS share FROM s2 "
    "WHERE n >= (SELECT avg(n) FROM s2) * 0), "
    "s4 AS (SELECT who, n, share, share - (SELECT min(share) FROM s3) AS spread FROM s3), "
    "s5 AS (SELECT who, n, share, spread, rank() OVER (ORDER BY n DESC) AS rk FROM s4 "
    "WHERE spread >= (SELECT min(spread) FROM s4)), "
    "s6 AS (SELECT * FROM s5 WHERE rk <= (SELECT count(*) FROM s5)) "
    "SELECT who, n, round(share, 3) AS share, rk FROM s6 ORDER BY rk, who",
    # and the like over ``*`` of a step ranked in a scalar subquery per row, bucketed by a
    # 30-WHEN CASE (3 ms to prepare; was counted 22,952)
    "WITH base AS (SELECT uid, CASE " + " ".join(
        f"WHEN sender_email LIKE '%@d{k}.example' THEN 'd{k}'" for k in range(28))
    + " WHEN sender_email LIKE '%@example.com' THEN 'example.com' WHEN sender_email LIKE "
    "'%@acme.test' THEN 'acme.test' ELSE 'other' END AS bucket, is_read FROM emails), "
    "per AS (SELECT bucket, count(*) AS n, sum(is_read = 0) AS unread FROM base GROUP BY bucket), "
    "ranked AS (SELECT p.*, (SELECT count(*) FROM per q WHERE q.n > p.n) + 1 AS rk FROM per p), "
    "top AS (SELECT * FROM ranked WHERE rk <= 10), "
    "shares AS (SELECT t.*, round(100.0 * t.n / (SELECT sum(n) FROM per), 1) AS pct FROM top t) "
    "SELECT bucket, n, unread, rk, pct FROM shares ORDER BY rk, bucket",
    # a view named in other letter cases (SQLite's names ignore ASCII case)
    "SELECT E.Sender_Email AS Sender, COUNT(*) AS Total, SUM(E.Is_Read = 0) AS UnRead "
    "FROM Emails E JOIN THREADS t USING (thread_id) GROUP BY Sender HAVING Total > 0 "
    "ORDER BY UnRead DESC, total DESC, SENDER",
    # quoted identifiers of all four kinds, a 40-WHEN CASE grouped by number, a CTE in a
    # correlated subquery, json_each over the tags, scalar subqueries per row
    "SELECT \"sender_email\" AS \"From\", [subject] AS [Subject Line], `date` AS `When` "
    "FROM \"emails\" AS \"E\" WHERE \"E\".\"is_read\" = 0 ORDER BY \"When\" DESC, \"From\"",
    "SELECT CASE " + " ".join(f"WHEN size < {1000 * (k + 1)} THEN 'b{k:02d}'" for k in range(40))
    + " ELSE 'big' END, count(*) AS n, avg(size) FROM emails GROUP BY 1 ORDER BY 2 DESC, 1",
    "SELECT t.thread_id, (WITH mine AS (SELECT date FROM emails e WHERE e.thread_id = "
    "t.thread_id AND e.is_sent = 1) SELECT max(date) FROM mine) AS my_last FROM threads t",
    "SELECT j.value AS tag, count(*) AS n, sum(e.is_read = 0) AS unread FROM emails e, "
    "json_each(e.tags) j GROUP BY j.value ORDER BY n DESC, tag",
    "SELECT c.email_address, (SELECT count(*) FROM emails e WHERE e.sender_email = "
    "c.email_address) AS sent, (SELECT subject FROM emails e WHERE e.sender_email = "
    "c.email_address ORDER BY date DESC LIMIT 1) AS last_subject FROM contacts c "
    "WHERE c.is_me = 0 ORDER BY sent DESC",
]


@pytest.mark.parametrize("sql", REALISTIC)
def test_realistic_analytical_queries_run(db: Path, sql: str) -> None:
    assert q(db, sql).columns


def test_a_long_case_over_a_cte_grouped_by_its_alias_runs(db: Path) -> None:
    """Each reference to a CTE's column copies that column's expression, not all the CTE
    reads: this (7 ms to prepare) was counted at 26,677 copied tokens and refused."""
    domains = ["example.com", "acme.test"] + [f"d{i}.example" for i in range(78)]
    whens = " ".join(f"WHEN sender LIKE '%@{domain}' THEN '{domain}'" for domain in domains)
    sql = ("WITH base AS (SELECT uid, lower(sender_email) AS sender, coalesce(sender_name, "
           "sender_email) AS who, substr(date, 1, 7) AS month, CASE WHEN size > 1000000 THEN "
           "'huge' WHEN size > 100000 THEN 'large' WHEN size > 10000 THEN 'medium' ELSE 'small' "
           "END AS size_class, is_read = 0 AS unread, is_flagged AS flagged, has_attachment AS "
           "attached, lower(substr(sender_email, instr(sender_email, '@') + 1)) AS domain, "
           "strftime('%w', date) AS weekday, CAST(strftime('%H', date) AS INTEGER) AS hour, "
           "coalesce(list_id, '') AS list, lower(trim(subject)) AS topic, thread_id, folder, "
           "account_name, length(subject) AS subject_len, instr(subject, 'Re:') = 1 AS is_reply, "
           "round(size / 1024.0, 1) AS kb, date FROM emails WHERE is_draft = 0) "
           f"SELECT CASE {whens} ELSE 'other' END AS bucket, count(*) AS n FROM base "
           "GROUP BY bucket HAVING bucket <> 'other' ORDER BY bucket")
    assert q(db, sql).rows == [["acme.test", 3], ["example.com", 3]]


def test_readme_queries_run(db: Path) -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    block = readme.split("```sql\n", 1)[1].split("```", 1)[0]
    statements = [line for line in block.splitlines() if line.strip()]
    assert len(statements) >= 3
    for sql in statements:
        assert q(db, sql).columns


def test_the_time_limit_holds_while_sqlite_prepares(db: Path) -> None:
    """The progress handler only runs once the statement runs; the authorizer stops it earlier
    (a time limit already past stops even SELECT 1, which runs too few steps to be checked)."""
    before = dump(db)
    stopped = r"query stopped after 1e-09 s \(time limit\)"
    with pytest.raises(SqlError, match=stopped):
        q(db, "SELECT 1", time_limit=1e-9)
    waited: list[bool] = []
    for before_write in (None, lambda: waited.append(True)):  # the run; the probe before it
        with pytest.raises(SqlError, match=stopped):
            m(db, "UPDATE contacts SET notes = 'x' WHERE email_address = 'bob@example.com'",
              time_limit=1e-9, before_write=before_write)
    assert not waited and dump(db) == before


ENDLESS = "(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c)"


def test_a_contacts_write_stopped_by_the_time_limit_says_so_and_changes_nothing(
        db: Path) -> None:
    """The time limit interrupts a write of many contacts half-way through its triggers'
    writes: SQLite rolls the whole transaction back itself, and a second ROLLBACK must not
    replace the time-limit error with "cannot rollback"."""
    with sidecar.opened(db) as conn, sidecar.transaction(conn):
        conn.executemany("INSERT INTO contact_info (email_address, is_blocked, notes, "
                         "updated_at) VALUES (?, 0, 'kept', '2026-01-01T00:00:00Z')",
                         ((f"u{n}@example.com",) for n in range(2000)))
    before = dump(db)
    stopped = r"query stopped after 0\.3 s \(time limit\)"
    for sql in [  # one address (not the first) never gets its value; the rest are written
            f"UPDATE contacts SET is_blocked = 1, notes = CASE email_address "
            f"WHEN 'u1999@example.com' THEN {ENDLESS} ELSE 'x' END",
            f"INSERT INTO contacts (email_address) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
            f"SELECT x + 1 FROM c) SELECT 'new' || x || '@example.com' FROM c"]:
        with pytest.raises(SqlError, match=stopped):
            m(db, sql, time_limit=0.3, confirm_count=2000)
    assert dump(db) == before


def test_a_contacts_write_reads_the_contacts_it_changed_without_holding_the_write_lock(
        db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A contacts write read every contact row before and after its statement inside its
    BEGIN IMMEDIATE (0.4 s at 100k contacts), which every other writer of the sidecar -- the
    indexer, the tagging hook -- waited out.  Whenever the write's connection reads the
    contact rows, another writer that waits for no lock gets it; the change is told right."""
    tried: list[bool] = []  # per read of contact_info: whether another writer got the lock
    other = sqlite3.connect(db, timeout=0, isolation_level=None)
    connect = sidecar.connect

    def writes_meanwhile(statement: str) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM contact_info" in statement:
            try:
                other.execute("BEGIN IMMEDIATE")
                other.execute("UPDATE sync_state SET value = 'y' WHERE key = 'last_sync'")
                other.execute("COMMIT")
                tried.append(True)
            except sqlite3.OperationalError:
                tried.append(False)

    def traced(path: Path, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(path, **kwargs)
        conn.set_trace_callback(writes_meanwhile)
        return conn

    monkeypatch.setattr(sidecar, "connect", traced)
    try:
        done = m(db, "UPDATE contacts SET is_blocked = 1, notes = 'spam' "
                     "WHERE email_address IN ('spam@x.com', 'ghost@example.net')")
    finally:
        other.close()
    assert False not in tried
    assert (done.changed, done.blocked) == (2, ["ghost@example.net", "spam@x.com"])
    assert done.contact_changes == [
        {"contact": "ghost@example.net", "before": None,
         "after": {"email_address": "ghost@example.net", "name": None, "is_blocked": 1,
                   "notes": "spam"}},
        {"contact": "spam@x.com",
         "before": {"email_address": "spam@x.com", "name": None, "is_blocked": 0,
                    "notes": None},
         "after": {"email_address": "spam@x.com", "name": None, "is_blocked": 1,
                   "notes": "spam"}}]


def test_a_contacts_write_past_its_time_limit_reading_what_it_changed_changes_nothing(
        db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading what the statement changed (to tell it and record it for undo) ran past the
    time limit unchecked, under the write lock.  It is part of the statement's time: past
    the limit, the time-limit error, and nothing changed."""
    diff = sqltools.contact_diff

    def slow_diff(*args: Any) -> list[dict[str, Any]]:
        time.sleep(0.4)  # past the limit of 0.3 s, whatever the statement took
        return diff(*args)

    monkeypatch.setattr(sqltools, "contact_diff", slow_diff)
    before = dump(db)
    with pytest.raises(SqlError, match=r"query stopped after 0\.3 s \(time limit\)"):
        m(db, "UPDATE contacts SET is_blocked = 1 WHERE email_address = 'spam@x.com'",
          time_limit=0.3)
    assert dump(db) == before


def test_bounded_recursion_is_allowed(db: Path) -> None:
    sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 5) " \
          "SELECT sum(x) FROM c"
    assert q(db, sql).rows == [[15]]


def test_printf_and_format_still_work(db: Path) -> None:
    result = q(db, "SELECT printf('%5.1f|%-3d|%s|%.*c', 3.14159, 7, NULL, 3, 'z'), "
                   "format('%d%%', 42), printf('%q', 'it''s'), printf()")
    assert result.rows == [["  3.1|7  ||zzz", "42%", "it''s", None]]


def test_result_size_is_capped(db: Path) -> None:
    # 1000 rows of 2000-char cells would be megabytes; the total budget stops it early.
    sql = "SELECT printf('%.*c', 1999, 'x') AS a, printf('%.*c', 1999, 'y') AS b " \
          "FROM emails a, emails b, emails c"
    result = q(db, sql, limit=1000)
    assert result.truncated
    assert 0 < result.row_count < 1000
    assert result.row_count * 2 * 1999 <= sqltools.MAX_RESULT_BYTES


def result_bytes(result: sqltools.SqlResult) -> int:
    return sum(len(cell.encode()) for row in result.rows for cell in row)


def test_result_size_is_capped_in_bytes(db: Path) -> None:
    """The cap counted characters: four-byte characters made a result four times as big."""
    sql = "SELECT replace(printf('%.*c', 1999, 'x'), 'x', char(128512)) FROM emails a, emails b"
    result = q(db, sql, limit=1000)
    assert result.truncated and result.row_count > 0
    assert result_bytes(result) <= sqltools.MAX_RESULT_BYTES


# ---------------------------------------------------------------------------------------------
# manage_contacts_sql


def contact(db: Path, address: str) -> dict[str, object] | None:
    result = q(db, f"SELECT * FROM contacts WHERE email_address = '{address}'")
    return dict(zip(result.columns, result.rows[0])) if result.rows else None


def test_block_and_unblock_report_addresses(db: Path) -> None:
    result = m(db, "UPDATE contacts SET is_blocked=1 WHERE email_address='alice@example.com'")
    assert (result.changed, result.blocked, result.unblocked) == (1, ["alice@example.com"], [])
    assert contact(db, "alice@example.com")["is_blocked"] == 1  # type: ignore[index]
    # The harvested name stays when only the block changes.
    assert contact(db, "alice@example.com")["name"] == "Alice"  # type: ignore[index]
    again = m(db, "UPDATE contacts SET is_blocked=1 WHERE email_address='alice@example.com'")
    assert again.blocked == [] and again.unblocked == []
    result = m(db, "UPDATE contacts SET is_blocked=0 WHERE email_address='alice@example.com'")
    assert (result.blocked, result.unblocked) == ([], ["alice@example.com"])


def test_update_name_and_notes_survive(db: Path) -> None:
    m(db, "UPDATE contacts SET name='Robert Stone', notes='met at PyCon' "
          "WHERE email_address='bob@example.com'")
    bob = contact(db, "bob@example.com")
    assert bob is not None
    assert (bob["name"], bob["notes"], bob["messages_from"]) == ("Robert Stone", "met at PyCon", 1)


def test_harvested_figures_and_address_are_read_only(db: Path) -> None:
    before = dump(db)
    for sql in ["UPDATE contacts SET messages_from = 99",
                "UPDATE contacts SET notes = 'x', last_seen = '2030-01-01T00:00:00Z'",
                "UPDATE contacts SET is_me = 1 WHERE email_address='bob@example.com'"]:
        with pytest.raises(SqlError, match="harvested figures .* come from the mail"):
            m(db, sql)
    with pytest.raises(SqlError, match="email_address identifies the contact"):
        m(db, "UPDATE contacts SET email_address='new@example.com' "
              "WHERE email_address='bob@example.com'")
    assert dump(db) == before


def test_insert_then_update(db: Path) -> None:
    result = m(db, "INSERT INTO contacts (email_address, name, notes) "
                   "VALUES (' Dave@Example.com ', 'Dave', 'new client')")
    assert result.changed == 1 and result.blocked == []
    dave = contact(db, "dave@example.com")
    assert dave is not None and (dave["name"], dave["notes"]) == ("Dave", "new client")
    result = m(db, "UPDATE contacts SET notes='signed' WHERE email_address='dave@example.com'")
    assert result.changed == 1
    assert contact(db, "dave@example.com")["notes"] == "signed"  # type: ignore[index]
    with pytest.raises(SqlError, match="already has notes or a block entry; use UPDATE"):
        m(db, "INSERT INTO contacts (email_address, name) VALUES ('dave@example.com', 'D')")


def test_insert_blocked_contact_reports_it(db: Path) -> None:
    result = m(db, "INSERT INTO contacts (email_address, is_blocked) VALUES ('x@spam.test', 1)")
    assert result.blocked == ["x@spam.test"]


@pytest.mark.parametrize("address", ["NULL", "'Bank <no-reply@bank.test>'", "42",
                                     "'x@spam.test' || char(10) || 'y'", "'not an address'"])
def test_a_contact_is_one_address_or_nothing_is_written(db: Path, address: str) -> None:
    """A NULL address was stored and broke every later contacts write; text that is no
    address was 'blocked' although no mail could ever match it."""
    before = dump(db)
    with pytest.raises(SqlError, match="is not an e-mail address|a contact is one e-mail"):
        m(db, f"INSERT INTO contacts (email_address, is_blocked) VALUES ({address}, 1)")
    assert dump(db) == before
    assert m(db, "UPDATE contacts SET notes='still fine' WHERE email_address='bob@example.com'"
             ).changed == 1


@pytest.mark.parametrize("address", ["@spam.test", "spam.test"])
def test_a_domain_block_is_refused_saying_what_a_contact_is(db: Path, address: str) -> None:
    """A model blocking a whole domain got SQLite's CHECK constraint, quoted over two lines."""
    with pytest.raises(SqlError) as refused:
        m(db, f"INSERT INTO contacts (email_address, is_blocked) VALUES ('{address}', 1)")
    assert str(refused.value) == (
        "a contact is one e-mail address (name@example.com): a domain or a pattern cannot be "
        "a contact nor be blocked; block each sender's address (the statement changed nothing)")


def test_whitespace_around_an_inserted_address_is_trimmed(db: Path) -> None:
    """As the CLI and the mail's own headers have it: a tab or line end around the address."""
    result = m(db, "INSERT INTO contacts (email_address, is_blocked) VALUES "
                   "(char(9) || 'X@spam.test' || char(10), 1)")
    assert result.blocked == ["x@spam.test"]


def test_an_address_with_capital_letters_beyond_ascii_is_one_contact(db: Path) -> None:
    """SQLite's lower() lowers ASCII only: 'JOSÉ@…' stayed a contact apart from 'josé@…'."""
    result = m(db, "INSERT INTO contacts (email_address, is_blocked) VALUES "
                   "('JOSÉ@example.net', 1)")
    assert result.blocked == ["josé@example.net"]
    assert contact(db, "josé@example.net")["is_blocked"] == 1  # type: ignore[index]


def test_an_address_inserted_with_its_domain_in_ace_is_kept_in_unicode(db: Path) -> None:
    """Contacts keep a domain in Unicode, as notmuch indexes it and the harvested figures
    name it: an INSERT in ACE (xn--) kept a second contact beside the harvested one, which
    an UPDATE of the contact the model sees could not unblock."""
    ace, unicode = "Bob@XN--BCHER-KVA.example", "bob@b\u00fccher.example"
    result = m(db, f"INSERT INTO contacts (email_address, is_blocked) VALUES ('{ace}', 1)")
    assert result.blocked == [unicode]
    assert contact(db, unicode)["is_blocked"] == 1  # type: ignore[index]
    assert q(db, "SELECT count(*) FROM contacts WHERE email_address LIKE '%xn--%'").rows == [[0]]
    with pytest.raises(SqlError, match="already has notes or a block"):
        m(db, f"INSERT INTO contacts (email_address, notes) VALUES ('{ace}', 'again')")
    assert m(db, f"UPDATE contacts SET is_blocked=0 WHERE email_address='{unicode}'"
             ).unblocked == [unicode]


def test_contacts_kept_in_ace_before_version_17_are_kept_in_unicode(db: Path) -> None:
    """Unless that form has a row of its own: then both stay, as they were."""
    with sidecar.opened(db) as conn:
        for address in ("a@xn--bcher-kva.example", "b@xn--bcher-kva.example",
                        "b@b\u00fccher.example"):
            conn.execute("INSERT INTO contact_info (email_address, is_blocked, updated_at) "
                         "VALUES (?, 1, 'x')", (address,))
        conn.execute("PRAGMA user_version = 16")
    with sidecar.opened(db) as conn:
        assert sorted(sidecar.blocked_addresses(conn)) == [
            "a@b\u00fccher.example", "b@b\u00fccher.example", "b@xn--bcher-kva.example"]


def test_the_users_own_address_is_not_blocked_in_its_other_domain_form(db: Path) -> None:
    """A blocked address catches mail with its domain written in Unicode or in ACE (xn--),
    so the user's own address is refused in either form."""
    before = dump(db)
    with pytest.raises(SqlError, match="own address"):
        m(db, "INSERT INTO contacts (email_address, is_blocked) VALUES "
              "('me@xn--bcher-kva.example', 1)", own_addresses=["me@b\u00fccher.example"])
    assert dump(db) == before


def test_a_sub_address_of_the_users_is_me_as_the_block_refusal_has_it(db: Path) -> None:
    """me+lists@ is the user's (a block of it is refused): is_me says so, so that the refusal's
    remedy (AND is_me = 0) leaves it out, as it leaves out the user's own address.  Someone
    else's address starting with the user's local part is not the user's."""
    with sidecar.opened(db) as conn:
        conn.executemany("INSERT INTO contact_stats (email_address, name, first_seen, last_seen, "
                         "messages_from, messages_to) VALUES (?, NULL, NULL, NULL, 1, 0)",
                         [("me+lists@example.org",), ("me+x@elsewhere.org",),
                          ("mebe+x@example.org",)])
    is_me = q(db, "SELECT email_address, is_me FROM contacts WHERE email_address LIKE '%+%' "
                  "ORDER BY 1").rows
    assert is_me == [["me+lists@example.org", 1], ["me+x@elsewhere.org", 0],
                     ["mebe+x@example.org", 0]]
    with pytest.raises(SqlError, match="own address.*AND is_me = 0"):
        m(db, "UPDATE contacts SET is_blocked=1 WHERE email_address LIKE 'me%'")
    done = m(db, "UPDATE contacts SET is_blocked=1 WHERE email_address LIKE 'me%' AND is_me = 0")
    assert done.blocked == ["me+x@elsewhere.org", "mebe+x@example.org"]


def test_delete_removes_notes_but_not_the_harvested_contact(db: Path) -> None:
    m(db, "UPDATE contacts SET is_blocked=1 WHERE email_address='bob@example.com'")
    result = m(db, "DELETE FROM contacts WHERE email_address='bob@example.com'")
    assert result.changed == 1 and result.unblocked == ["bob@example.com"]
    bob = contact(db, "bob@example.com")
    assert bob is not None
    assert (bob["notes"], bob["is_blocked"], bob["name"]) == (None, 0, "Bob Stone")


def kept_contacts(db: Path) -> list[str]:
    """The addresses with a row of the user's own (name, block, notes)."""
    with sidecar.opened(db, readonly=True) as conn:
        return [row[0] for row in conn.execute(
            "SELECT email_address FROM contact_info ORDER BY 1")]


def test_a_statement_changing_nothing_shown_counts_and_keeps_nothing(db: Path) -> None:
    # Unblocking everyone when no one is blocked: the trigger wrote an empty row for every
    # harvested contact, counted as changed (a dry run past 10) and exported as the user's.
    result = m(db, "UPDATE contacts SET is_blocked = 0")
    assert (result.changed, result.dry_run, result.unblocked) == (0, False, [])
    assert kept_contacts(db) == ["bob@example.com", "spam@x.com"]
    # An empty row is a change where it is all there is of a contact.
    assert m(db, "INSERT INTO contacts (email_address) VALUES ('new@example.com')").changed == 1
    assert m(db, "UPDATE contacts SET notes = 'x' WHERE email_address = 'alice@example.com'"
             ).changed == 1
    assert kept_contacts(db) == ["alice@example.com", "bob@example.com", "new@example.com",
                                 "spam@x.com"]


def test_an_upsert_is_refused_saying_what_to_write_instead(db: Path) -> None:
    before = dump(db)
    with pytest.raises(SqlError, match="ON CONFLICT .* UPDATE contacts"):
        m(db, "INSERT INTO contacts (email_address, notes) VALUES ('bob@example.com', 'x') "
              "ON CONFLICT DO UPDATE SET notes = 'x'")
    assert dump(db) == before


def test_select_returns_rows(db: Path) -> None:
    result = m(db, "SELECT email_address, notes FROM contacts WHERE name LIKE '%Bob%'")
    assert result.rows == [["bob@example.com", "old friend"]]
    assert result.changed == 0 and result.columns == ["email_address", "notes"]


def test_every_contacts_example_runs(db: Path) -> None:
    for sql in help_examples(sqltools.CONTACTS_HELP):
        m(db, sql)
    assert contact(db, "carol@example.com")["notes"] == "new client"  # type: ignore[index]
    assert contact(db, "bob@example.com")["notes"] == "met at PyCon"  # type: ignore[index]
    assert contact(db, "spam@x.com")["is_blocked"] == 1  # type: ignore[index]


def test_account_scope_applies_to_subqueries(db: Path) -> None:
    result = m(db, "UPDATE contacts SET is_blocked=1 WHERE email_address IN "
                   "(SELECT sender_email FROM emails WHERE folder='INBOX')",
               account_name="work")
    assert result.blocked == ["boss@acme.test", "carol@acme.test"]
    with pytest.raises(SqlError, match="unknown account"):
        m(db, "SELECT 1", account_name="home")


WRITES_ELSEWHERE = [
    ("UPDATE emails SET is_read = 1", "refused: cannot modify emails because it is a view; "
                                      "manage_contacts_sql"),
    ("DELETE FROM emails", "cannot modify emails"),
    ("INSERT INTO threads (thread_id) VALUES ('x')", "INSERT on threads is not allowed"),
    ("DELETE FROM messages", "DELETE on messages"),
    ("UPDATE messages SET subject = 'x'", "UPDATE on messages"),
    ("INSERT INTO contact_info (email_address, updated_at) VALUES ('a@b.c', 'x')",
     "INSERT on contact_info"),
    ("UPDATE contact_info SET notes = 'x'", "UPDATE on contact_info"),
    ("UPDATE contact_stats SET messages_from = 0", "UPDATE on contact_stats"),
    ("DELETE FROM me", "DELETE on me"),
    ("DELETE FROM audit_log", "DELETE on audit_log"),
    ("INSERT INTO sync_state (key, value) VALUES ('a', 'b')", "INSERT on sync_state"),
    ("UPDATE sqlite_master SET sql = ''", "may not be modified"),
    ("DROP TRIGGER contacts_update", "DROP statements are not allowed"),
    ("EXPLAIN DROP TRIGGER contacts_update", "DROP TRIGGER is not allowed"),
    ("PRAGMA writable_schema = 1", "PRAGMA statements are not allowed"),
    ("ATTACH DATABASE ':memory:' AS x", "ATTACH statements are not allowed"),
    ("CREATE TEMP TRIGGER tr INSTEAD OF UPDATE ON contacts BEGIN SELECT 1; END",
     "CREATE statements are not allowed"),
    ("SAVEPOINT s", "SAVEPOINT statements are not allowed"),
    ("COMMIT", "COMMIT statements are not allowed"),
    ("UPDATE contacts SET notes = 'x'; DELETE FROM contacts", "only one statement"),
    ("UPDATE contacts SET notes = (SELECT group_concat(filenames) FROM messages)",
     "reading the internal table messages"),
    ("WITH contacts_update AS (SELECT * FROM audit_log) SELECT * FROM contacts_update",
     "reading audit_log"),
    # A CTE named like a trigger reads what the trigger may, and no more than the view shows.
    ("WITH contacts_update AS (SELECT * FROM contact_info) SELECT * FROM contacts_update",
     "reading contact_info.updated_at"),
    ("SELECT * FROM contact_info", "reading the internal table contact_info"),
    # ... and one named like a trigger noting a write's changes reads the key of its log
    # alone (the addresses the statement itself changed so far), as that trigger does.
    ("WITH contact_log_updated AS (SELECT * FROM temp.contact_log) "
     "SELECT * FROM contact_log_updated", "reading contact_log.email_address"),
    ("UPDATE contacts SET notes = (WITH contact_log_insert AS (SELECT group_concat(existed) "
     "FROM temp.contact_log) SELECT * FROM contact_log_insert) WHERE email_address = "
     "'spam@x.com'", "reading contact_log.existed"),
    # SQLite answers RETURNING on the view with its NEW row (the address NULL on an UPDATE)
    ("UPDATE contacts SET is_blocked=1 WHERE email_address='spam@x.com' "
     "RETURNING email_address, is_blocked", "RETURNING is not supported on contacts"),
    ("INSERT INTO contacts (email_address) VALUES ('New@Example.com') RETURNING *",
     "RETURNING is not supported"),
    ("WITH b AS (SELECT 'bob@example.com' AS a) DELETE FROM contacts WHERE email_address IN "
     "(SELECT a FROM b) RETURNING notes", "RETURNING is not supported"),
]


@pytest.mark.parametrize(("sql", "phrase"), WRITES_ELSEWHERE)
def test_manage_contacts_refuses(db: Path, sql: str, phrase: str) -> None:
    """The same refusal whether found when the statement is prepared to tell a write (with
    ``before_write``, as the tool runs it) or when it runs."""
    before = dump(db)
    for before_write in (None, lambda: None):
        with pytest.raises(SqlError, match=phrase):
            m(db, sql, before_write=before_write)
        assert dump(db) == before


@pytest.mark.parametrize(("sql", "writes"), [
    ("SELECT * FROM contacts", False),
    ("WITH b AS (SELECT 1) SELECT email_address FROM contacts, b", False),
    ("EXPLAIN SELECT * FROM contacts", False),
    ("UPDATE contacts SET notes = 'x' WHERE email_address = 'nobody@example.com'", True),
    ("WITH b AS (SELECT 'bob@example.com' AS a) UPDATE contacts SET notes = 'y' "
     "WHERE email_address IN (SELECT a FROM b)", True),
    ("INSERT INTO contacts (email_address) VALUES ('new@example.com')", True),
    ("-- a comment\nDELETE FROM contacts WHERE email_address = 'bob@example.com'", True),
])
def test_before_write_is_called_before_a_write_and_never_for_a_read(
        db: Path, sql: str, writes: bool) -> None:
    """The caller's undo lock is taken for a statement that writes the contacts view (even
    one that turns out to change nothing), before it changes anything, and never for a
    read: SQLite tells which when it prepares the statement."""
    before = dump(db)
    seen: list[list[str]] = []
    m(db, sql, before_write=lambda: seen.append(dump(db)))
    assert seen == ([before] if writes else [])


@pytest.mark.parametrize("sql", [
    "EXPLAIN UPDATE contacts SET notes = 'x' WHERE email_address = 'bob@example.com'",
    "EXPLAIN QUERY PLAN DELETE FROM contacts WHERE email_address = 'bob@example.com'",
])
def test_the_plan_of_a_contacts_write_is_shown_and_changes_nothing(db: Path, sql: str) -> None:
    """EXPLAIN of a write to contacts shows its plan, as of a read: it was refused as if it
    asked for RETURNING (its plan's rows taken for the changed contacts')."""
    before = dump(db)
    result = m(db, sql, before_write=lambda: None)
    assert result.rows and not result.changed
    assert dump(db) == before


def test_a_statement_as_long_as_allowed_is_told_a_write_too(db: Path) -> None:
    """Telling a write from a read prepares ``EXPLAIN`` + the statement: a statement of
    the longest length allowed failed "query string is too large" as the tool runs it,
    while it ran without ``before_write``."""
    head = "UPDATE contacts SET notes = 'long' WHERE email_address = 'bob@example.com' "
    statement = head + "/*" + "x" * (sqltools.MAX_SQL_CHARS - len(head) - 4) + "*/"
    assert len(statement) == sqltools.MAX_SQL_CHARS
    seen: list[bool] = []
    assert m(db, statement, before_write=lambda: seen.append(True)).changed == 1
    assert seen == [True]
    with pytest.raises(SqlError, match="longer than"):
        m(db, statement + " ", before_write=lambda: None)


def test_failing_statement_rolls_back_and_releases_the_lock(db: Path) -> None:
    before = dump(db)
    # alice is updated before the CHECK on bob's row fails: nothing may remain of either.
    with pytest.raises(SqlError, match="CHECK constraint failed"):
        m(db, "UPDATE contacts SET notes='x', is_blocked = CASE WHEN email_address = "
              "'bob@example.com' THEN 2 ELSE 1 END")
    assert dump(db) == before
    with pytest.raises(SqlError, match=r"query stopped after 0\.3 s"):
        m(db, "UPDATE contacts SET notes = (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
              "SELECT x+1 FROM c) SELECT count(*) FROM c)", time_limit=0.3)
    assert dump(db) == before
    # No transaction was left open: another writer gets the lock at once.
    with sidecar.opened(db) as other:
        other.execute("PRAGMA busy_timeout = 0")
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")


def test_second_writer_gives_a_busy_error(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sidecar, "BUSY_TIMEOUT_MS", 100)
    with sidecar.opened(db) as other:
        other.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(SqlError, match="sidecar busy.*retry"):
                m(db, "UPDATE contacts SET notes='x' WHERE email_address='bob@example.com'")
            # Readers are not blocked by the writer (WAL).
            assert q(db, "SELECT notes FROM contacts WHERE email_address='bob@example.com'"
                     ).rows == [["old friend"]]
        finally:
            other.execute("ROLLBACK")
    assert contact(db, "bob@example.com")["notes"] == "old friend"  # type: ignore[index]


SIDECAR_WRITER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
"""


def test_a_contacts_read_does_not_wait_for_another_processes_write_lock(
        db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process writing the sidecar (a mirror sync batch, the post-new hook): a read of
    contacts, even one explaining a write, answers at once; a write still fails busy."""
    monkeypatch.setattr(sidecar, "BUSY_TIMEOUT_MS", 200)
    holder = subprocess.Popen([sys.executable, "-c", SIDECAR_WRITER, str(db)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        read = m(db, "SELECT email_address, notes FROM contacts WHERE notes IS NOT NULL",
                 before_write=lambda: pytest.fail("a read takes no undo lock"))
        assert read.rows == [["bob@example.com", "old friend"]]
        assert (read.changed, read.blocked, read.unblocked) == (0, [], [])
        assert m(db, "SELECT count(*) FROM contacts", rehearse=True).rows == [[7]]
        plan = m(db, "EXPLAIN UPDATE contacts SET is_blocked = 1")
        assert plan.rows and plan.changed == 0
        with pytest.raises(SqlError, match="sidecar busy.*retry"):
            m(db, "UPDATE contacts SET notes = 'x' WHERE email_address = 'bob@example.com'")
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert contact(db, "bob@example.com")["notes"] == "old friend"  # type: ignore[index]


def test_a_write_the_probe_took_for_a_read_fails_and_changes_nothing(
        db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read runs read-only (query_only): were the probe ever wrong, the write would fail
    loudly, never slip through unrecorded."""
    monkeypatch.setattr(sqltools, "_writes_contacts", lambda *args: False)
    before = dump(db)
    for sql in ["UPDATE contacts SET is_blocked = 1 WHERE email_address = 'bob@example.com'",
                "INSERT INTO contacts (email_address, notes) VALUES ('new@example.com', 'x')",
                "DELETE FROM contacts WHERE email_address = 'bob@example.com'"]:
        with pytest.raises(SqlError, match="refused: writing is not allowed"):
            m(db, sql)
    assert dump(db) == before


def test_no_traceback_leaks(db: Path) -> None:
    attempts: list[Callable[[], object]] = [
        lambda: q(db, "SELECT * FROM emails WHERE"),
        lambda: q(db, "SELECT json_extract('{', '$')"),
        lambda: m(db, "INSERT INTO contacts (email_address) VALUES ('not-an-address')"),
    ]
    for attempt in attempts:
        with pytest.raises(SqlError) as info:
            attempt()
        assert "Traceback" not in str(info.value)
        assert info.value.__cause__ is None and info.value.__suppress_context__


def test_counting_through_views_but_not_internal_tables(db: Path) -> None:
    assert q(db, "SELECT count(*) FROM emails").rows == [[19]]
    assert q(db, "SELECT 1 FROM emails LIMIT 1").rows == [[1]]
    assert q(db, "SELECT count(*) FROM contacts").rows == [[7]]
    for sql in ["SELECT count(*) FROM messages", "SELECT 1 FROM audit_log",
                "SELECT count(*) FROM emails, sync_state"]:
        with pytest.raises(SqlError, match="reading the internal table"):
            q(db, sql)


@pytest.mark.parametrize(("tool", "sql"), [("query", sql) for sql, _ in HOSTILE_READS]
                         + [("manage", sql) for sql, _ in WRITES_ELSEWHERE])
def test_the_authorizer_alone_refuses(db: Path, tool: str, sql: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The keyword check is the first fence only: without it everything is still refused."""
    monkeypatch.setattr(sqltools, "STATEMENT_KEYWORDS", frozenset())
    before = dump(db)
    with pytest.raises(SqlError, match="refused|may not be modified"):
        (q if tool == "query" else m)(db, sql)
    assert dump(db) == before


# ---------------------------------------------------------------------------------------------
# Fences inside one call (the time limit, one wide row); is_sent for an ACE domain

# A 240,000-character text of 'a' (printf caps a width at 100,000).
BIG = ("printf('%.*c', 100000, 'a') || printf('%.*c', 100000, 'a') "
       "|| printf('%.*c', 40000, 'a')")


def test_printf_with_a_blob_format_is_checked_like_text(db: Path) -> None:
    # SQLite reads a BLOB format as text: one '%.*c' loops two billion times (~3 s) inside
    # one call, where the progress handler cannot stop it; a 100 KB format holds thousands.
    with pytest.raises(SqlError, match="printf/format widths and precisions above"):
        q(db, "SELECT printf(CAST('%.*c' AS BLOB), 2000000000, 'x')", time_limit=0.3)
    with pytest.raises(SqlError, match="printf/format widths and precisions above"):
        q(db, "SELECT format(x'25323030303030303030306300', 'x')", time_limit=0.3)


# One call each, seconds long: SQLite compares character by character, inside one VM step.
SLOW_CALLS = [
    # trim's characters are scanned for every character of the text
    f"WITH s(a, b) AS (SELECT {BIG}, printf('%.*c', 15000, 'b') || 'a') "
    "SELECT length(ltrim(a, b)) FROM s",
    # a pattern that almost matches at every position
    f"WITH s(a, b) AS (SELECT {BIG}, '%' || printf('%.*c', 20000, 'a') || 'b') "
    "SELECT a LIKE b FROM s",
    # a GLOB character class scanned at every position
    f"WITH s(a, b) AS (SELECT {BIG}, '*[' || printf('%.*c', 20000, 'b') || ']') "
    "SELECT a GLOB b FROM s",
    # memcmp at every position: fast per call, but 60 of them in one row
    "WITH s(a, b) AS (SELECT printf('%.*c', 100000, 'a') || printf('%.*c', 20000, 'a'), "
    "printf('%.*c', 60000, 'a') || 'b') SELECT " + " + ".join(["instr(a, b)"] * 60) + " FROM s",
    # 200 calls of ~20 ms each in one row, with no VM step between them to check the time
    "WITH s(a, b) AS (SELECT printf('%.*c', 50000, 'a'), '%' || printf('%.*c', 399, 'a') "
    "|| 'b') SELECT " + ", ".join(["a LIKE b"] * 200) + " FROM s",
]


@pytest.mark.parametrize("sql", SLOW_CALLS)
def test_slow_function_calls_do_not_outrun_the_time_limit(db: Path, sql: str) -> None:
    with pytest.raises(SqlError, match=r"time limit|could run past the time limit"):
        q(db, sql, time_limit=0.3)


def test_guarded_functions_keep_their_results(db: Path) -> None:
    result = q(db, "SELECT instr('hello', 'll'), instr(x'0102', x'02'), instr(NULL, 'a'), "
                   "instr(12345, 3), replace('a-b-c', '-', '+'), replace(42, '', 'x'), "
                   "typeof(replace(42, '', 'x')), trim('xxhixx', 'x'), ltrim('xxhi', 'x'), "
                   "rtrim('hixx', 'x'), 'ABC' LIKE 'a%', 'a_c' LIKE 'a\\_c' ESCAPE '\\', "
                   "'abc' GLOB 'a[a-c]?', 'abc' GLOB 'A*'")
    assert result.rows == [[3, 2, None, 3, "a+b+c", 42, "integer", "hi", "hi", "hi", 1, 1,
                            1, 0]]
    result = q(db, "SELECT count(*) FROM emails WHERE subject LIKE '%e%' "
                   "AND sender_email GLOB '*@*' AND instr(subject, 'e') > 0")
    assert result.rows == [[18]]


def test_one_wide_row_is_cut_to_the_result_budget(db: Path) -> None:
    # 2000 columns of 1999 characters: 4 million characters in the one row kept "however
    # wide", about 16 MB of structured content and as much text for four-byte characters.
    columns = ", ".join(["x"] * 2000)
    result = q(db, f"SELECT {columns} FROM (SELECT replace(printf('%.*c', 1999, 'x'), 'x', "
                   "char(128512)) AS x)")
    assert result.row_count == 1 and len(result.rows[0]) == 2000
    # an ellipsis (3 bytes) per cut cell at most
    assert result_bytes(result) <= sqltools.MAX_RESULT_BYTES + 3 * 2000
    assert result.truncated_cells > 0
    assert result.rows[0][0] == "\U0001f600" * 1999  # cut between characters, not inside one
    cut = next(cell for cell in result.rows[0] if cell.endswith("…") and cell != "…")
    assert set(cut[:-1]) == {"\U0001f600"}


# The user's address with a non-ASCII domain, as fmail.toml writes it and as mail often does.
IDN_ME, ACE_ME = "alex@b\u00fccher.example", "alex@xn--bcher-kva.example"
IDN_REPLY = """\
From: Alex Morgan <{sender}>
To: Anna <anna@example.net>
Subject: Re: the books
Date: Mon, 30 Nov 2026 10:00:00 +0000
Message-ID: <{mid}>

Here they are.
"""


def _sent_rows(env: MailEnv) -> list[list[object]]:
    path = sidecar.sidecar_path(env.config().data_dir)
    return query_emails(path, "SELECT e.message_id, e.is_sent, t.sent_count, t.last_from_me "
                              "FROM emails e JOIN threads t USING (thread_id) "
                              "WHERE e.message_id LIKE 'idn-%' ORDER BY 1").rows


def _add_my_address(env: MailEnv, address: str) -> None:
    """``address`` one more of the user's, in the personal account in fmail.toml."""
    config = env.fmail_config.read_text()
    env.fmail_config.write_text(config.replace('"alex.morgan@example.org"]',
                                               f'"alex.morgan@example.org", "{address}"]', 1))


def _my_idn_mail_indexed(env: MailEnv, configured: str) -> None:
    """The user's address ``configured`` in fmail.toml; mail from it sent with the domain in
    ACE and in Unicode, indexed; both tagged sent, as notmuch's from: matches both."""
    _add_my_address(env, configured)
    sent = env.mail_root / "personal" / "Sent" / "cur"
    for n, (mid, sender) in enumerate((("idn-ace@x", ACE_ME), ("idn-unicode@x", IDN_ME))):
        (sent / f"179640000{n}.1_{n}.host:2,S").write_text(IDN_REPLY.format(sender=sender,
                                                                            mid=mid))
    env.fmail("index")
    tagged = env.notmuch("search", "--output=messages",
                         "tag:sent and (id:idn-ace@x or id:idn-unicode@x)").stdout
    assert sorted(tagged.split()) == ["id:idn-ace@x", "id:idn-unicode@x"]


def test_my_mail_is_sent_whichever_form_its_domain_is_written_in(indexed: MailEnv) -> None:
    """notmuch matches from:alex@bücher.example for mail written with the ACE domain too, and
    tags it sent; the mirror's is_sent (and the threads' sent_count, last_from_me) must agree."""
    _my_idn_mail_indexed(indexed, IDN_ME)
    assert _sent_rows(indexed) == [["idn-ace@x", 1, 1, 1], ["idn-unicode@x", 1, 1, 1]]


def test_a_mirror_that_missed_my_ace_mail_is_corrected(indexed: MailEnv) -> None:
    """A sidecar that compared senders as written has is_sent = 0 for such mail already;
    the schema migration makes the next sync recompute it."""
    _my_idn_mail_indexed(indexed, IDN_ME)
    path = sidecar.sidecar_path(indexed.config().data_dir)
    with sidecar.opened(path) as conn:  # as the mirror had it before
        conn.execute("UPDATE messages SET is_sent = 0 WHERE message_id = 'idn-ace@x'")
        sidecar.rebuild_threads(conn)
        conn.execute("PRAGMA user_version = 14")  # before version 15 compared canonically
    indexed.fmail("index")
    assert _sent_rows(indexed) == [["idn-ace@x", 1, 1, 1], ["idn-unicode@x", 1, 1, 1]]


def _unanswered(env: MailEnv, **kwargs: Any) -> list[str]:
    """The last words find_unanswered_threads names, read from the mirror (which is current)."""
    with Reader() as reader:
        mb = reads.Mailbox(env.config(), reader)
        assert reads.current_mirror(mb, ("deleted", "spam")) is not None
        found = reads.find_unanswered_threads(mb, limit=500, **kwargs)
    return sorted(t.last for t in found.threads
                  if t.last in (sidecar.uid_for("idn-ace@x"), sidecar.uid_for("idn-unicode@x")))


IDN_LAST_WORDS = sorted([sidecar.uid_for("idn-ace@x"), sidecar.uid_for("idn-unicode@x")])


@pytest.mark.parametrize("configured", [IDN_ME, ACE_ME])
def test_my_last_word_is_mine_whichever_form_its_domain_is_written_in(
        indexed: MailEnv, configured: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mirror kept a thread's last sender as written and find_unanswered_threads compared
    it so (notmuch's answer too): the user's reply written with the domain in the other form
    was not theirs."""
    _my_idn_mail_indexed(indexed, configured)
    assert _unanswered(indexed) == IDN_LAST_WORDS
    assert _unanswered(indexed, address=ACE_ME) == _unanswered(indexed, address=IDN_ME) == \
        IDN_LAST_WORDS
    monkeypatch.setattr(reads, "_unanswered_from_mirror", lambda *args: None)
    assert _unanswered(indexed) == IDN_LAST_WORDS


def test_a_mirror_with_last_words_as_written_is_corrected(indexed: MailEnv) -> None:
    _my_idn_mail_indexed(indexed, IDN_ME)
    path = sidecar.sidecar_path(indexed.config().data_dir)
    with sidecar.opened(path) as conn:  # as the mirror had it before
        conn.execute(f"UPDATE thread_rows SET last_word_sender = '{ACE_ME}' "
                     "WHERE last_word_id = 'idn-ace@x'")
        conn.execute("PRAGMA user_version = 15")  # before version 16 kept it canonical
    indexed.fmail("index")
    assert _unanswered(indexed) == IDN_LAST_WORDS


@pytest.mark.parametrize(("statement", "builds"), [
    ("SELECT subject FROM emails WHERE subject LIKE '%linux%'", False),
    ("SELECT subject FROM emails WHERE subject LIKE 'a || b' -- || printf(", False),
    ('SELECT "format" FROM emails', False),  # a quoted name is no call
    ("SELECT subject FROM emails WHERE subject LIKE '%' || 'x'", True),
    ("SELECT PRINTF/**/('%.*c', 9, 'a') LIKE 'a%'", True),
    ("SELECT group_concat(subject) LIKE '%a%' FROM emails", True),
    ("SELECT 'x' LIKE '" + "a" * 2000 + "'", True),
    ("SELECT x'" + "61" * 1000 + "' LIKE 'a%'", True),
    ('SELECT subject LIKE "' + "a" * 2000 + '" FROM emails', True),
    ("SELECT " + ", ".join(["recipients LIKE p"] * 20) + " FROM emails, (SELECT 'a' AS p)",
     False),
    ("SELECT " + ", ".join(["recipients LIKE p"] * 21) + " FROM emails, (SELECT 'a' AS p)",
     True),  # thousands of calls in one row, each a recipient list against a long pattern
])
def test_like_is_guarded_in_every_statement_whose_calls_could_outrun_the_limit(
        statement: str, builds: bool) -> None:
    """LIKE is shadowed (a Python call per row, ~5x slower) only where text longer than the
    views' own values can reach it, or calls are many: the rule must see every such way."""
    assert sqltools._needs_guarded_like(sqltools._statement_tokens(statement)) is builds


def test_an_address_configured_in_ace_is_mine_in_tags_and_search(indexed: MailEnv) -> None:
    """fmail.toml writing the domain in ACE: notmuch indexes it in Unicode, so `from:` with
    the ACE form matched nothing -- no `sent` tag, and `from:me` found none of it."""
    from fmail_nm.store.notmuch import Reader
    from fmail_nm.tools import reads
    _my_idn_mail_indexed(indexed, ACE_ME)
    assert _sent_rows(indexed) == [["idn-ace@x", 1, 1, 1], ["idn-unicode@x", 1, 1, 1]]
    with Reader() as reader:
        mb = reads.Mailbox(indexed.config(), reader)
        found = reads.search_emails(mb, "from:me subject:books", limit=10)
    assert sorted(item.id for item in found.results) == sorted(
        sidecar.uid_for(mid) for mid in ("idn-ace@x", "idn-unicode@x"))


@pytest.mark.parametrize("configured", [IDN_ME, ACE_ME])
def test_my_address_in_the_other_form_is_not_listed_as_a_recipient(
        indexed: MailEnv, configured: str) -> None:
    """The user's own mail lists whom it went to, the user left out: a copy to the user's
    address with the domain in the other form than fmail.toml's was listed as a recipient --
    in search results, and in unanswered threads from the mirror or (no mirror) notmuch."""
    _add_my_address(indexed, configured)
    other = ACE_ME if configured == IDN_ME else IDN_ME
    (indexed.mail_root / "personal" / "Sent" / "cur" / "1796400009.1_9.host:2,S").write_text(
        f"From: Alex Morgan <{configured}>\nTo: Anna <anna@example.net>\n"
        f"Cc: Alex Morgan <{other}>\nSubject: the shelves\n"
        "Date: Mon, 30 Nov 2026 11:00:00 +0000\nMessage-ID: <idn-cc@x>\n\nMeasured.\n")
    indexed.fmail("index")
    anna, uid = ["Anna <anna@example.net>"], sidecar.uid_for("idn-cc@x")

    def unanswered() -> list[tuple[str, list[str]]]:
        with Reader() as reader:
            found = reads.find_unanswered_threads(reads.Mailbox(indexed.config(), reader),
                                                  limit=500)
        return [(t.last, t.to) for t in found.threads if t.last in ("idn-cc@x", uid)]

    with Reader() as reader:
        found = reads.search_emails(reads.Mailbox(indexed.config(), reader),
                                    'subject:"the shelves"', limit=10)
    assert [(item.id, item.to) for item in found.results] == [(uid, anna)]
    assert unanswered() == [(uid, anna)]
    path = sidecar.sidecar_path(indexed.config().data_dir)
    path.rename(path.with_name("moved-away"))  # no mirror: notmuch answers, To/Cc read there
    assert unanswered() == [("idn-cc@x", anna)]


# The user's sub-address alex+lists@example.org (of alex@example.org in fmail.toml): mail
# received at it, the user's reply sent from it, and mail from alex+lists@ of another domain.
SUB_ME = "alex+lists@example.org"
SUB_MAIL = (
    ("sub-received@x", "INBOX", "Anna <anna@example.net>", f"Alex <{SUB_ME}>", "", ""),
    ("sub-sent@x", "Sent", f"Alex Morgan <{SUB_ME}>", "Anna <anna@example.net>", "Re: ",
     "In-Reply-To: <sub-received@x>\n"),
    ("sub-other@x", "INBOX", "Alex Other <alex+lists@example.net>", "Anna <anna@example.net>",
     "", ""),
)
SUB_LAST_WORD = sidecar.uid_for("sub-sent@x")


def _my_sub_address_mail_indexed(env: MailEnv) -> None:
    for n, (mid, folder, sender, to, re_, extra) in enumerate(SUB_MAIL):
        (env.mail_root / "personal" / folder / "cur" / f"179650000{n}.1_{n}.host:2,S").write_text(
            f"From: {sender}\nTo: {to}\nSubject: {re_}the ferry timetable\n"
            f"Date: Mon, 30 Nov 2026 1{n}:00:00 +0000\nMessage-ID: <{mid}>\n{extra}\n"
            "Timetable attached.\n")
    env.fmail("index")


def _sub_rows(env: MailEnv) -> list[list[object]]:
    path = sidecar.sidecar_path(env.config().data_dir)
    return query_emails(path, "SELECT e.message_id, e.is_sent, t.sent_count, t.last_from_me "
                              "FROM emails e JOIN threads t USING (thread_id) "
                              "WHERE e.message_id LIKE 'sub-%' ORDER BY 1").rows


SUB_ROWS = [["sub-other@x", 0, 0, 0], ["sub-received@x", 0, 1, 1], ["sub-sent@x", 1, 1, 1]]


def test_my_mail_from_a_sub_address_is_sent_in_tags_and_the_mirror(indexed: MailEnv) -> None:
    """Mail the user sent from alex+lists@ is the user's, as alex@ is in fmail.toml: notmuch
    tags it sent (and out of the inbox), and the mirror's is_sent (and the thread's
    sent_count, last_from_me) agree; alex+lists@ of another domain is someone else."""
    _my_sub_address_mail_indexed(indexed)
    tagged = indexed.notmuch("search", "--output=messages", "tag:sent AND mid:/^sub-/").stdout
    assert tagged.split() == ["id:sub-sent@x"]
    assert _sub_rows(indexed) == SUB_ROWS


def test_a_mirror_that_missed_my_sub_address_mail_is_corrected(indexed: MailEnv) -> None:
    """A sidecar that compared senders exactly has is_sent = 0 for such mail already; the
    schema migration makes the next sync recompute it."""
    _my_sub_address_mail_indexed(indexed)
    path = sidecar.sidecar_path(indexed.config().data_dir)
    with sidecar.opened(path) as conn:  # as the mirror had it before
        conn.execute("UPDATE messages SET is_sent = 0 WHERE message_id = 'sub-sent@x'")
        sidecar.rebuild_threads(conn)
        conn.execute("PRAGMA user_version = 25")  # before version 26 took sub-addresses
    indexed.fmail("index")
    assert _sub_rows(indexed) == SUB_ROWS


def test_from_me_and_to_me_find_my_sub_address_mail(indexed: MailEnv) -> None:
    _my_sub_address_mail_indexed(indexed)
    with Reader() as reader:
        mb = reads.Mailbox(indexed.config(), reader)
        found = {text: sorted(item.id for item in reads.search_emails(
            mb, f"{text} subject:ferry", limit=10).results)
            for text in ("from:me", "to:me", "-from:me")}
    assert found == {"from:me": [SUB_LAST_WORD],
                     "to:me": [sidecar.uid_for("sub-received@x")],
                     "-from:me": sorted(sidecar.uid_for(m) for m in ("sub-received@x",
                                                                     "sub-other@x"))}


def test_spam_to_made_up_sub_addresses_does_not_grow_from_me_or_to_me(
        indexed: MailEnv) -> None:
    """Spam from and to made-up alex+xyz@ addresses (a dictionary attack on plus-addressing,
    undetected): from:me and to:me search by at most 32 addresses, the most used first, and
    still find the user's mail sent from alex+lists@ and received at it."""
    inbox, sent = (indexed.mail_root / "personal" / f / "cur" for f in ("INBOX", "Sent"))
    for n in range(60):
        (inbox / f"1796400000.spam{n}.host:2,S").write_text(
            f"From: <alex+x{n:02}@example.org>\nTo: <alex+x{n:02}@example.org>\n"
            f"Subject: your account {n}\nDate: Tue, 01 Dec 2026 09:{n:02}:00 +0000\n"
            f"Message-ID: <spam-{n}@x>\n\nPay up.\n")
    (sent / "1796400000.more.host:2,S").write_text(  # alex+lists@ in use on either side
        f"From: <{SUB_ME}>\nTo: <anna@example.net>, <{SUB_ME}>\nSubject: ferry again\n"
        "Date: Mon, 30 Nov 2026 18:00:00 +0000\nMessage-ID: <sub-more@x>\n\nNoted.\n")
    _my_sub_address_mail_indexed(indexed)
    with Reader() as reader:
        mb = reads.Mailbox(indexed.config(), reader)
        terms = {text: mb.compile(text).query.count(f"{text[:-3]}:") for text in
                 ("from:me", "to:me")}
        found = {text: sorted(item.id for item in reads.search_emails(
            mb, f"{text} subject:ferry", limit=10).results) for text in ("from:me", "to:me")}
    assert all(0 < n <= 32 for n in terms.values()), terms
    assert found == {"from:me": sorted(map(sidecar.uid_for, ("sub-sent@x", "sub-more@x"))),
                     "to:me": sorted(map(sidecar.uid_for, ("sub-received@x", "sub-more@x")))}


def test_my_last_word_from_a_sub_address_is_mine(indexed: MailEnv,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """From the mirror and (no current mirror) from notmuch alike."""
    _my_sub_address_mail_indexed(indexed)

    def unanswered() -> list[str]:
        with Reader() as reader:
            found = reads.find_unanswered_threads(reads.Mailbox(indexed.config(), reader),
                                                  limit=500)
        return [t.last for t in found.threads if t.last in ("sub-sent@x", SUB_LAST_WORD)]

    assert unanswered() == [SUB_LAST_WORD]
    monkeypatch.setattr(reads, "_unanswered_from_mirror", lambda *args: None)
    assert unanswered() == [SUB_LAST_WORD]
