"""The sidecar SQLite file: what notmuch cannot hold, beside a rebuildable mirror of the index.

It lives in the data directory (``$XDG_DATA_HOME/fmail-nm/sidecar.sqlite3``) in WAL mode, so
readers (``query_emails``) never wait for the sync that writes it.  Its schema is versioned by
``PRAGMA user_version`` and migrated forward on every read-write open.

What is in it:

* the mirror (``messages`` with ``message_tags``, ``message_folders``, ``message_addresses``),
  rebuilt from notmuch at any time by :mod:`fmail_nm.mirror`;
* ``contact_info`` -- the user's own notes, names and blocklist: the only data that exists
  nowhere else (``fmail-nm contacts export`` saves it);
* ``contact_stats`` -- figures harvested from the mirror (first/last seen, message counts)
  over the mail sent or received, drafts and spam left out (a blocked sender's own mail
  aside), a Bcc counted on the user's own mail only, the author of list mail whose From
  the list rewrote counted as its sender;
* ``blocked_mail`` -- how each blocked message was before the block, for unblocking (and
  for unblocking again after an undone unblock): kept until the message leaves notmuch;
* ``sync_state`` and ``audit_log`` -- the writes of the last ``AUDIT_KEEP_DAYS``, and every
  send, each with the MCP session that made it;
* what pages read from the mirror (``messages.is_excluded`` and its date index, the counts
  triggers keep in ``mirror_counts``, ``shown_days``, ``tag_counts`` and ``tag_pairs``).

The SQL tools see published views only (``emails``, ``threads``, ``tags``, ``email_tags``,
``contacts``); ``contacts`` is writable through INSTEAD OF triggers that touch ``contact_info``
and nothing else.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..clock import utc_now, utc_stamp
from ..errors import BackendError
from ..message.headers import canonical_address, search_forms
from ..private import private_dir, private_file, tighten
from .threads import ThreadMember, author

SIDECAR_NAME = "sidecar.sqlite3"
BUSY_TIMEOUT_MS = 5000
# What the WAL file is cut back to when a writer starts it over.  The server's reader keeps it
# from being removed with the last writer, so without a limit it stays as large as the largest
# transaction ever made it (a rebuild: the whole mirror); SQLite's own checkpoints keep it
# near 4 MiB (1,000 pages) otherwise, which the limit leaves as it is.
JOURNAL_SIZE_LIMIT = 4 << 20

# Views (and the one writable view) the SQL tools may read; everything else is internal.
PUBLISHED_VIEWS = ("emails", "threads", "tags", "email_tags", "contacts")
CONTACT_TRIGGERS = ("contacts_insert", "contacts_update", "contacts_delete")
EDITABLE_CONTACT_COLUMNS = ("name", "is_blocked", "notes")

# One row of ``threads`` per thread, from its mirrored messages: version 1's view, and since
# version 3 what the mirror stores for the threads each batch touched (passes.mirror).  As
# versions 1 and 3 wrote it; THREAD_ROWS below is today's.
_THREAD_ROWS_V1 = """
SELECT thread_id,
       (SELECT subject FROM messages f WHERE f.thread_id = m.thread_id
        ORDER BY date, message_id LIMIT 1) AS subject,
       count(*) AS message_count,
       sum(1 - is_read) AS unread_count,
       sum(is_sent) AS sent_count,
       min(date) AS first_date,
       max(date) AS last_date,
       (SELECT sender_email FROM messages l WHERE l.thread_id = m.thread_id
        ORDER BY date DESC, message_id DESC LIMIT 1) AS last_sender_email,
       (SELECT is_sent FROM messages l WHERE l.thread_id = m.thread_id
        ORDER BY date DESC, message_id DESC LIMIT 1) AS last_from_me,
       group_concat(DISTINCT sender_email) AS participants,
       max(account_name) AS account_name
FROM messages m
WHERE {where}
GROUP BY thread_id
"""

# The contacts view (but its is_me column) and the triggers that make it writable, as
# version 1 wrote them: a version that makes the view again makes them again too.
_CONTACTS_VIEW = """
CREATE VIEW contacts AS
SELECT e.email_address,
       coalesce(i.name, s.name) AS name,
       coalesce(i.is_blocked, 0) AS is_blocked,
       i.notes,
       s.first_seen, s.last_seen,
       coalesce(s.messages_from, 0) AS messages_from,
       coalesce(s.messages_to, 0) AS messages_to,
       {is_me} AS is_me
FROM (SELECT email_address FROM contact_info UNION SELECT email_address FROM contact_stats) e
LEFT JOIN contact_info i USING (email_address)
LEFT JOIN contact_stats s USING (email_address);
"""
_IS_ME_V1 = "(e.email_address IN (SELECT email FROM me))"
_CONTACTS_UPDATE = """
CREATE TRIGGER contacts_update INSTEAD OF UPDATE ON contacts
BEGIN
    INSERT INTO contact_info (email_address, name, is_blocked, notes, updated_at)
    VALUES (OLD.email_address,
            CASE WHEN NEW.name IS OLD.name
                 THEN (SELECT name FROM contact_info WHERE email_address = OLD.email_address)
                 ELSE NEW.name END,
            NEW.is_blocked, NEW.notes, strftime('%Y-%m-%dT%H:%M:%SZ', 'now'))
    ON CONFLICT (email_address) DO UPDATE SET
        name = excluded.name, is_blocked = excluded.is_blocked, notes = excluded.notes,
        updated_at = excluded.updated_at;
END;
"""
_CONTACTS_DELETE = """
CREATE TRIGGER contacts_delete INSTEAD OF DELETE ON contacts
BEGIN
    DELETE FROM contact_info WHERE email_address = OLD.email_address;
END;
"""

_V1 = """
CREATE TABLE sync_state (key TEXT PRIMARY KEY, value TEXT NOT NULL);

CREATE TABLE messages (
    message_id     TEXT PRIMARY KEY,
    uid            TEXT NOT NULL UNIQUE,
    thread_id      TEXT NOT NULL,
    account_name   TEXT,
    folder         TEXT,             -- primary folder, relative to the account ("INBOX")
    folders        TEXT NOT NULL,    -- JSON list of "account/folder" paths of every file
    subject        TEXT NOT NULL,
    sender_email   TEXT NOT NULL,
    sender_name    TEXT NOT NULL,
    recipients     TEXT NOT NULL,    -- JSON [{"name", "email", "kind": "to"|"cc"|"bcc"}]
    date           TEXT,             -- ISO 8601 UTC, NULL when the message has no usable Date
    date_epoch     INTEGER,
    body_preview   TEXT NOT NULL,
    is_read        INTEGER NOT NULL,
    is_flagged     INTEGER NOT NULL,
    is_replied     INTEGER NOT NULL,
    is_draft       INTEGER NOT NULL,
    is_sent        INTEGER NOT NULL,
    has_attachment INTEGER NOT NULL,
    tags           TEXT NOT NULL,    -- JSON list, sorted
    list_id        TEXT,
    size           INTEGER,
    filenames      TEXT NOT NULL     -- JSON list, as notmuch has them
);
CREATE INDEX messages_thread ON messages(thread_id);
CREATE INDEX messages_date ON messages(date);
CREATE INDEX messages_sender ON messages(sender_email);
CREATE INDEX messages_folder ON messages(account_name, folder);

CREATE TABLE message_tags (
    message_id TEXT NOT NULL REFERENCES messages(message_id) ON DELETE CASCADE,
    tag        TEXT NOT NULL,
    PRIMARY KEY (tag, message_id)
) WITHOUT ROWID;
CREATE INDEX message_tags_message ON message_tags(message_id);

-- folder relative to the mail root, as notmuch's folder: term matches it ("" for the root
-- until version 4, "." since)
CREATE TABLE message_folders (
    message_id TEXT NOT NULL REFERENCES messages(message_id) ON DELETE CASCADE,
    folder     TEXT NOT NULL,
    PRIMARY KEY (folder, message_id)
) WITHOUT ROWID;
CREATE INDEX message_folders_message ON message_folders(message_id);

CREATE TABLE message_addresses (
    message_id TEXT NOT NULL REFERENCES messages(message_id) ON DELETE CASCADE,
    role       TEXT NOT NULL CHECK (role IN ('from', 'to', 'cc')),
    email      TEXT NOT NULL,
    name       TEXT NOT NULL,
    PRIMARY KEY (email, role, message_id)
) WITHOUT ROWID;
CREATE INDEX message_addresses_message ON message_addresses(message_id);

CREATE TABLE me (email TEXT PRIMARY KEY) WITHOUT ROWID;

CREATE TABLE contact_info (
    email_address TEXT PRIMARY KEY CHECK (email_address = lower(trim(email_address))
                                          AND email_address LIKE '%_@_%'),
    name          TEXT,
    is_blocked    INTEGER NOT NULL DEFAULT 0 CHECK (is_blocked IN (0, 1)),
    notes         TEXT,
    updated_at    TEXT NOT NULL
);

CREATE TABLE contact_stats (
    email_address TEXT PRIMARY KEY,
    name          TEXT,
    first_seen    TEXT,
    last_seen     TEXT,
    messages_from INTEGER NOT NULL,
    messages_to   INTEGER NOT NULL
);

CREATE TABLE audit_log (
    id        INTEGER PRIMARY KEY,
    at        TEXT NOT NULL,
    action    TEXT NOT NULL,
    params    TEXT NOT NULL,   -- JSON: what the caller asked for
    changes   TEXT NOT NULL,   -- JSON: per message, tags and files before and after
    undone_at TEXT
);

CREATE VIEW emails AS
SELECT uid, subject, sender_email, sender_name, recipients, date, body_preview, is_read,
       folder, account_name,
       message_id, thread_id, tags, is_flagged, is_replied, is_draft, is_sent, has_attachment,
       list_id, size, folders
FROM messages;

CREATE VIEW email_tags AS
SELECT m.uid, t.message_id, t.tag FROM message_tags t JOIN messages m USING (message_id);

CREATE VIEW tags AS
SELECT t.tag, count(*) AS message_count, sum(1 - m.is_read) AS unread_count
FROM message_tags t JOIN messages m USING (message_id)
GROUP BY t.tag;

CREATE VIEW threads AS
""" + _THREAD_ROWS_V1.format(where="1") + """;

""" + _CONTACTS_VIEW.format(is_me=_IS_ME_V1) + """
CREATE TRIGGER contacts_insert INSTEAD OF INSERT ON contacts
BEGIN
    SELECT raise(ABORT, 'contact already has notes or a block entry; use UPDATE')
    WHERE EXISTS (SELECT 1 FROM contact_info WHERE email_address = lower(trim(NEW.email_address)));
    INSERT INTO contact_info (email_address, name, is_blocked, notes, updated_at)
    VALUES (lower(trim(NEW.email_address)), NEW.name, coalesce(NEW.is_blocked, 0), NEW.notes,
            strftime('%Y-%m-%dT%H:%M:%SZ', 'now'));
END;
""" + _CONTACTS_UPDATE + _CONTACTS_DELETE

# Version 2: which mirrored messages still wait for the tagging pass (set by the mirror for
# messages new to it, cleared once the pass committed their tags; see passes.tagging).
_V2 = """
ALTER TABLE messages ADD COLUMN needs_tagging INTEGER NOT NULL DEFAULT 0;
CREATE INDEX messages_needs_tagging ON messages(message_id) WHERE needs_tagging = 1;
"""

_THREAD_COLUMNS = ("thread_id", "subject", "message_count", "unread_count", "sent_count",
                   "first_date", "last_date", "last_sender_email", "last_from_me",
                   "participants", "account_name")
_INSERT_THREADS_V3 = f"INSERT INTO thread_rows ({', '.join(_THREAD_COLUMNS)}) "

# Version 3: ``threads`` was a view aggregating every thread on every read (linear in the
# mailbox: 128 ms at 20k messages for the newest 20); it becomes a table the mirror keeps,
# indexed by last activity, behind a view of the same name and columns.
_V3 = f"""
DROP VIEW threads;
CREATE TABLE thread_rows (
    thread_id         TEXT PRIMARY KEY,
    subject           TEXT,
    message_count     INTEGER NOT NULL,
    unread_count      INTEGER NOT NULL,
    sent_count        INTEGER NOT NULL,
    first_date        TEXT,
    last_date         TEXT,
    last_sender_email TEXT,
    last_from_me      INTEGER,
    participants      TEXT,
    account_name      TEXT
);
CREATE INDEX thread_rows_last_date ON thread_rows(last_date);
CREATE INDEX messages_thread_date ON messages(thread_id, date, message_id);
{_INSERT_THREADS_V3}{_THREAD_ROWS_V1.format(where="1")};
CREATE VIEW threads AS SELECT {", ".join(_THREAD_COLUMNS)} FROM thread_rows;
"""

# Version 4: a mail root that is itself a Maildir is the folder "." in the mirror as it is in
# the tools (it was notmuch's "").  Only rows naming it change; "" sorted first in a message's
# folders, "." is sorted in among the others as the mirror sorts them.
_V4 = """
UPDATE message_folders SET folder = '.' WHERE folder = '';
UPDATE messages SET folders = (
    SELECT '[' || group_concat(json_quote(name), ', ') || ']' FROM (
        SELECT CASE value WHEN '' THEN '.' ELSE value END AS name
        FROM json_each(messages.folders) ORDER BY name))
WHERE folders LIKE '[""%';
"""

# Version 5: whether a search leaves a message out (spam, deleted: notmuch's
# search.exclude_tags, recorded in sync_state as EXCLUSIONS_KEY) is a column, ``is_excluded``,
# so the pages notmuch would have to count or sort whole -- all mail by date, a date range,
# the newest threads of a tag -- are read along one index; ``mirror_counts`` keeps the number
# of messages and of those a search shows, so "all mail" has its total without a count.  The
# migration records the default exclusions; a mirror sync recomputes the column when the
# config names others.  ``shown_days`` counts them by UTC day (a date range's total is then
# a few dozen rows, not one per message).
_V5 = """
ALTER TABLE messages ADD COLUMN is_excluded INTEGER NOT NULL DEFAULT 0;
UPDATE messages SET is_excluded = EXISTS (SELECT 1 FROM message_tags t
    WHERE t.message_id = messages.message_id AND t.tag IN ('deleted', 'spam'));
INSERT INTO sync_state (key, value) VALUES ('exclude_tags', '["deleted", "spam"]')
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
CREATE INDEX messages_excluded_date ON messages(is_excluded, date_epoch);
CREATE TABLE mirror_counts (name TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO mirror_counts (name, n) VALUES
    ('messages', (SELECT count(*) FROM messages)),
    ('shown', (SELECT count(*) FROM messages WHERE is_excluded = 0));
CREATE TABLE shown_days (day INTEGER PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO shown_days (day, n) SELECT date_epoch / 86400, count(*) FROM messages
    WHERE is_excluded = 0 AND date_epoch IS NOT NULL GROUP BY 1;
CREATE TRIGGER messages_count_insert AFTER INSERT ON messages
BEGIN
    UPDATE mirror_counts SET n = n + 1
    WHERE name = 'messages' OR (name = 'shown' AND NEW.is_excluded = 0);
    INSERT INTO shown_days (day, n) SELECT NEW.date_epoch / 86400, 1
    WHERE NEW.is_excluded = 0 AND NEW.date_epoch IS NOT NULL
    ON CONFLICT (day) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER messages_count_delete AFTER DELETE ON messages
BEGIN
    UPDATE mirror_counts SET n = n - 1
    WHERE name = 'messages' OR (name = 'shown' AND OLD.is_excluded = 0);
    UPDATE shown_days SET n = n - 1 WHERE OLD.is_excluded = 0 AND day = OLD.date_epoch / 86400;
END;
CREATE TRIGGER messages_count_update AFTER UPDATE OF is_excluded, date_epoch ON messages
WHEN OLD.is_excluded <> NEW.is_excluded OR OLD.date_epoch IS NOT NEW.date_epoch
BEGIN
    UPDATE mirror_counts SET n = n + OLD.is_excluded - NEW.is_excluded WHERE name = 'shown';
    UPDATE shown_days SET n = n - 1 WHERE OLD.is_excluded = 0 AND day = OLD.date_epoch / 86400;
    INSERT INTO shown_days (day, n) SELECT NEW.date_epoch / 86400, 1
    WHERE NEW.is_excluded = 0 AND NEW.date_epoch IS NOT NULL
    ON CONFLICT (day) DO UPDATE SET n = n + 1;
END;
"""
EXCLUSIONS_KEY = "exclude_tags"

# Version 6: messages per tag, kept by triggers, so a tag's share of the mailbox is one read
# (a search for tags reads the mirror as far as that share says; list_tags); and the date
# index of shown mail carries each message's id and thread, so reading along it never
# visits the table.
_V6 = """
DROP INDEX messages_excluded_date;
CREATE INDEX messages_excluded_date ON messages(is_excluded, date_epoch, message_id, thread_id);
CREATE TABLE tag_counts (tag TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO tag_counts (tag, n) SELECT tag, count(*) FROM message_tags GROUP BY tag;
CREATE TRIGGER message_tags_count_insert AFTER INSERT ON message_tags
BEGIN
    INSERT INTO tag_counts (tag, n) VALUES (NEW.tag, 1)
    ON CONFLICT (tag) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER message_tags_count_delete AFTER DELETE ON message_tags
BEGIN
    UPDATE tag_counts SET n = n - 1 WHERE tag = OLD.tag;
END;
"""

# Version 7: per tag, also the messages a search shows (no excluded tag), so a search for one
# tag has its total without a count.  A message's row is deleted before the cascade deletes
# its tags (which then no longer find it): its shown tags are taken off before the delete.
_V7 = """
ALTER TABLE tag_counts ADD COLUMN shown INTEGER NOT NULL DEFAULT 0;
UPDATE tag_counts SET shown = (SELECT count(*) FROM message_tags t JOIN messages m
    USING (message_id) WHERE t.tag = tag_counts.tag AND m.is_excluded = 0);
DROP TRIGGER message_tags_count_insert;
DROP TRIGGER message_tags_count_delete;
CREATE TRIGGER message_tags_count_insert AFTER INSERT ON message_tags
BEGIN
    INSERT INTO tag_counts (tag, n, shown) VALUES (NEW.tag, 1, coalesce((SELECT 1 - is_excluded
        FROM messages WHERE message_id = NEW.message_id), 0))
    ON CONFLICT (tag) DO UPDATE SET n = n + 1, shown = shown + excluded.shown;
END;
CREATE TRIGGER message_tags_count_delete AFTER DELETE ON message_tags
BEGIN
    UPDATE tag_counts SET n = n - 1, shown = shown - coalesce((SELECT 1 - is_excluded
        FROM messages WHERE message_id = OLD.message_id), 0)
    WHERE tag = OLD.tag;
END;
CREATE TRIGGER messages_tags_shown_update AFTER UPDATE OF is_excluded ON messages
WHEN OLD.is_excluded <> NEW.is_excluded
BEGIN
    UPDATE tag_counts SET shown = shown + OLD.is_excluded - NEW.is_excluded
    WHERE tag IN (SELECT tag FROM message_tags WHERE message_id = NEW.message_id);
END;
CREATE TRIGGER messages_tags_shown_delete BEFORE DELETE ON messages
WHEN OLD.is_excluded = 0
BEGIN
    UPDATE tag_counts SET shown = shown - 1
    WHERE tag IN (SELECT tag FROM message_tags WHERE message_id = OLD.message_id);
END;
"""

# Version 8: per pair of tags (``tag`` < ``other``), the messages carrying both and those of
# them a search shows, so a search for two tags -- "unread in the inbox", the commonest
# triage question -- has its total without a notmuch count (linear in the matches).  A
# message's pairs are found through its other tag rows: an inserted tag pairs with those
# already there, a deleted one with those left, so a message's k tags make k(k-1)/2 pairs
# whichever order they come and go in.
_V8 = """
CREATE TABLE tag_pairs (
    tag   TEXT NOT NULL,
    other TEXT NOT NULL,
    n     INTEGER NOT NULL,
    shown INTEGER NOT NULL,
    PRIMARY KEY (tag, other)
) WITHOUT ROWID;
INSERT INTO tag_pairs (tag, other, n, shown)
    SELECT a.tag, b.tag, count(*), sum(1 - m.is_excluded)
    FROM message_tags a JOIN message_tags b ON b.message_id = a.message_id AND b.tag > a.tag
    JOIN messages m ON m.message_id = a.message_id
    GROUP BY a.tag, b.tag;
CREATE TRIGGER message_tags_pair_insert AFTER INSERT ON message_tags
BEGIN
    INSERT INTO tag_pairs (tag, other, n, shown)
    SELECT min(NEW.tag, t.tag), max(NEW.tag, t.tag), 1, coalesce((SELECT 1 - is_excluded
        FROM messages WHERE message_id = NEW.message_id), 0)
    FROM message_tags t WHERE t.message_id = NEW.message_id AND t.tag <> NEW.tag
    ON CONFLICT (tag, other) DO UPDATE SET n = n + 1, shown = shown + excluded.shown;
END;
CREATE TRIGGER message_tags_pair_delete AFTER DELETE ON message_tags
BEGIN
    UPDATE tag_pairs SET n = n - 1, shown = shown - coalesce((SELECT 1 - is_excluded
        FROM messages WHERE message_id = OLD.message_id), 0)
    WHERE (tag, other) IN (SELECT min(OLD.tag, t.tag), max(OLD.tag, t.tag) FROM message_tags t
                           WHERE t.message_id = OLD.message_id AND t.tag <> OLD.tag);
END;
CREATE TRIGGER messages_pairs_shown_update AFTER UPDATE OF is_excluded ON messages
WHEN OLD.is_excluded <> NEW.is_excluded
BEGIN
    UPDATE tag_pairs SET shown = shown + OLD.is_excluded - NEW.is_excluded
    WHERE (tag, other) IN (SELECT a.tag, b.tag FROM message_tags a JOIN message_tags b
                           ON b.message_id = a.message_id AND b.tag > a.tag
                           WHERE a.message_id = NEW.message_id);
END;
CREATE TRIGGER messages_pairs_shown_delete BEFORE DELETE ON messages
WHEN OLD.is_excluded = 0
BEGIN
    UPDATE tag_pairs SET shown = shown - 1
    WHERE (tag, other) IN (SELECT a.tag, b.tag FROM message_tags a JOIN message_tags b
                           ON b.message_id = a.message_id AND b.tag > a.tag
                           WHERE a.message_id = OLD.message_id);
END;
"""

# Version 9: a sender's shown mail by date, so a ``from:`` search learns from the mirror
# whether the newest mail holds a page of it before asking notmuch to look there (the
# one-column index it replaces is its prefix).
_V9 = """
DROP INDEX messages_sender;
CREATE INDEX messages_sender ON messages(sender_email, is_excluded, date_epoch);
"""

# Version 10: each thread's last word -- its newest message that is not deleted, spam or a
# draft -- kept with the thread's row (not published), so "threads whose last word is mine",
# find_unanswered_threads, is read along an index instead of from each thread's messages.
# A message without a date is older than any with one, as notmuch has it at time 0.
_LAST_WORD = """(SELECT {value} FROM messages l WHERE l.thread_id = m.thread_id AND NOT EXISTS (
            SELECT 1 FROM message_tags t WHERE t.message_id = l.message_id
            AND t.tag IN ('deleted', 'spam', 'draft'))
        ORDER BY date DESC, message_id DESC LIMIT 1)"""
_LAST_WORD_COLUMNS = ("last_word_id", "last_word_date", "last_word_sender")

def _with_last_word(thread_rows: str, sender: str = "sender_email") -> str:
    return thread_rows.replace("\nFROM messages m\n", (
        ",\n       " + _LAST_WORD.format(value="message_id") + " AS last_word_id"
        ",\n       " + _LAST_WORD.format(value="coalesce(date_epoch, 0)") + " AS last_word_date"
        ",\n       " + _LAST_WORD.format(value=sender) + " AS last_word_sender"
        "\nFROM messages m\n"))


_THREAD_ROW_COLUMNS = (*_THREAD_COLUMNS, *_LAST_WORD_COLUMNS)
_INSERT_THREADS = f"INSERT INTO thread_rows ({', '.join(_THREAD_ROW_COLUMNS)}) "
_V10 = f"""
ALTER TABLE thread_rows ADD COLUMN last_word_id TEXT;
ALTER TABLE thread_rows ADD COLUMN last_word_date INTEGER;
ALTER TABLE thread_rows ADD COLUMN last_word_sender TEXT;
DELETE FROM thread_rows;
{_INSERT_THREADS}{_with_last_word(_THREAD_ROWS_V1).format(where="1")};
CREATE INDEX thread_rows_last_word ON thread_rows(last_word_sender, last_word_date);
"""

# Version 11: each blocked message as it was before its sender was blocked -- its tags and the
# folders of its files -- so that unblocking puts it back exactly (passes.blocklist).
_V11 = """
CREATE TABLE blocked_mail (
    message_id TEXT PRIMARY KEY,
    tags       TEXT NOT NULL,   -- JSON list
    folders    TEXT NOT NULL    -- JSON list, relative to the mail root
) WITHOUT ROWID;
"""

# Sync state: the contact figures may be wrong and are all recounted by the next mirror sync
# (set while a sync applies its batches, and by a migration that changes what they count).
STATS_DIRTY = "stats_dirty"

# Version 12: contact figures leave drafts out (passes.mirror), so the figures counted before
# are recounted (a sidecar that has none yet is counted by its first build); and a message's
# blocked_mail record goes when the mirror drops the message, so those of messages dropped
# before go now -- unless the mirror is being built, when a message may be missing from it
# only because it is not mirrored yet.
_V12 = f"""
INSERT INTO sync_state (key, value) SELECT '{STATS_DIRTY}', '1'
    WHERE EXISTS (SELECT 1 FROM contact_stats)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
DELETE FROM blocked_mail WHERE message_id NOT IN (SELECT message_id FROM messages)
    AND EXISTS (SELECT 1 FROM sync_state WHERE key = 'notmuch_uuid')
    AND NOT EXISTS (SELECT 1 FROM sync_state WHERE key IN ('window', 'full_build_new_since'));
"""

# Version 13: ``has_attachment`` says whether get_email lists an attachment (a PDF sent inline,
# a forwarded message, an invitation), no longer only notmuch's "attachment" tag, and a
# message whose only text is an invitation or Markdown has it as its preview: the mirror
# parses again the files of the rows that can have changed -- those REPARSED_ROWS selects
# (a row with the tag keeps it; only an empty preview was missing text) -- in Message-ID
# order, REPARSE_KEY holding the last one done (passes.mirror).  An empty mirror has none.
REPARSE_KEY = "reparse_after"
REPARSED_ROWS = "has_attachment = 0 OR body_preview = ''"
_V13 = f"""
INSERT INTO sync_state (key, value) SELECT '{REPARSE_KEY}', '' WHERE EXISTS (SELECT 1 FROM messages)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
"""

# Version 14: a draft is not sent mail: ``is_sent`` (from one of the user's addresses) is 0 for
# a draft, and a thread's last sender (``last_sender_email``, ``last_from_me``) and
# ``participants`` are those of the mail exchanged -- a reply still in Drafts does not give
# the user the last word.  The drafts' rows change and every thread row is computed again.
_THREAD_ROWS_V14 = _THREAD_ROWS_V1.replace(
    "WHERE l.thread_id = m.thread_id\n", "WHERE l.thread_id = m.thread_id AND l.is_draft = 0\n"
).replace("group_concat(DISTINCT sender_email)",
          "group_concat(DISTINCT CASE WHEN is_draft = 0 THEN sender_email END)")
_V14 = f"""
UPDATE messages SET is_sent = 0 WHERE is_draft = 1 AND is_sent = 1;
DELETE FROM thread_rows;
{_INSERT_THREADS}{_with_last_word(_THREAD_ROWS_V14).format(where="1")};
"""

# Version 15: the user's own mail is told by the sender's canonical address (its domain in
# ACE or in Unicode alike, passes.mirror.my_addresses); mail whose sender wrote the other form
# was not ``is_sent``.  Emptying ``me`` makes the next sync store the addresses again and
# recompute is_sent, the thread rows and the contact figures from them.
_V15 = """
DELETE FROM me;
"""

# Version 16: a thread's last word keeps its sender's canonical address (SQL_FUNCTIONS), the
# form find_unanswered_threads compares the user's addresses in, as is_sent does: the user's
# reply written with the domain in the other form (ACE or Unicode) is the user's last word.
_THREAD_ROWS_V16 = _with_last_word(_THREAD_ROWS_V14, sender="canonical_address(sender_email)")
_V16 = f"""
DELETE FROM thread_rows;
{_INSERT_THREADS}{_THREAD_ROWS_V16.format(where="1")};
"""

# Version 17: a contact inserted through the view keeps its address canonical (its domain in
# Unicode, as the harvested figures and the CLI name it): one written in ACE (xn--) stayed a
# second contact beside the harvested one.  Those kept so far follow, unless that form has a
# row of its own already (the two rows stay as they were; the blocklist reads either).  And a
# sender named 'Last, First' in an encoded word was mirrored as 'last' (store.threads.sender):
# where the mirror holds a sender that is no address, the next sync reads every message from
# the index again (the files are not parsed again) -- as its first build did, from revision 0.
# A contact named by an address ("bob@x" <bob@x>) is named anew (passes.mirror._STATS).
_CONTACTS_INSERT_V17 = """
CREATE TRIGGER contacts_insert INSTEAD OF INSERT ON contacts
BEGIN
    SELECT raise(ABORT, 'contact already has notes or a block entry; use UPDATE')
    WHERE EXISTS (SELECT 1 FROM contact_info
                  WHERE email_address = canonical_address(NEW.email_address));
    INSERT INTO contact_info (email_address, name, is_blocked, notes, updated_at)
    VALUES (canonical_address(NEW.email_address), NEW.name, coalesce(NEW.is_blocked, 0),
            NEW.notes, strftime('%Y-%m-%dT%H:%M:%SZ', 'now'));
END;
"""
_V17 = f"""
INSERT INTO sync_state (key, value) SELECT '{STATS_DIRTY}', '1'
    WHERE EXISTS (SELECT 1 FROM contact_stats WHERE instr(name, '@') > 0)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
DELETE FROM sync_state WHERE key IN ('revision', 'window')
    AND EXISTS (SELECT 1 FROM messages WHERE sender_email != '' AND instr(sender_email, '@') = 0);
DROP TRIGGER contacts_insert;
{_CONTACTS_INSERT_V17.strip()}
UPDATE OR IGNORE contact_info SET email_address = canonical_address(email_address)
    WHERE email_address != canonical_address(email_address);
"""

# Version 18: the mirror keeps a message's Bcc (``recipients`` kind "bcc", ``message_addresses``
# role 'bcc'): those the user wrote to in Bcc are contacts the user wrote to, while the Bcc of
# mail received makes no contact (passes.mirror._STATS).  The table is made again to let its
# role be 'bcc'.  Only the user's own mail -- sent, tagged sent, or a draft, which may be sent
# later under its Message-ID -- has its files parsed again (BCC_REPARSED_ROWS), not the
# mailbox: mail received that was mirrored before keeps its recipients without a Bcc (which no
# figure counts) until a rebuild, and ``sidecar check --files`` names it.  Over a schema set
# back (as tests of an older version set it), the list authors of version 23 are left out for
# its parse to read again.
BCC_REPARSE_KEY = "reparse_bcc_after"
BCC_REPARSED_ROWS = ("is_sent = 1 OR is_draft = 1 OR message_id IN "
                     "(SELECT message_id FROM message_tags WHERE tag = 'sent')")
_V18 = f"""
CREATE TABLE message_addresses_v18 (
    message_id TEXT NOT NULL REFERENCES messages(message_id) ON DELETE CASCADE,
    role       TEXT NOT NULL CHECK (role IN ('from', 'to', 'cc', 'bcc')),
    email      TEXT NOT NULL,
    name       TEXT NOT NULL,
    PRIMARY KEY (email, role, message_id)
) WITHOUT ROWID;
INSERT INTO message_addresses_v18 (message_id, role, email, name)
    SELECT message_id, role, email, name FROM message_addresses WHERE role != 'author';
DROP TABLE message_addresses;
ALTER TABLE message_addresses_v18 RENAME TO message_addresses;
CREATE INDEX message_addresses_message ON message_addresses(message_id);
INSERT INTO sync_state (key, value) SELECT '{BCC_REPARSE_KEY}', ''
    WHERE EXISTS (SELECT 1 FROM messages)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
"""

# Version 19: a thread's row is the mail exchanged, every column of it: its subject, counts,
# dates and participants leave drafts out, as its last sender has since version 14 -- a reply
# still in Drafts made ``last_date`` today beside the last sender of a week before, and a
# draft was an unread message.  A thread of drafts alone has no row.  Every row is computed
# again, as versions 14 and 16 did.
_THREAD_ROWS_V19 = (
    _THREAD_ROWS_V1.replace("\nWHERE {where}\n", "\nWHERE m.is_draft = 0 AND ({where})\n")
    .replace("f.thread_id = m.thread_id\n", "f.thread_id = m.thread_id AND f.is_draft = 0\n")
    .replace("l.thread_id = m.thread_id\n", "l.thread_id = m.thread_id AND l.is_draft = 0\n"))
THREAD_ROWS = _with_last_word(_THREAD_ROWS_V19, sender="canonical_address(sender_email)")
_V19 = f"""
DELETE FROM thread_rows;
{_INSERT_THREADS}{THREAD_ROWS.format(where="1")};
"""

# Version 20: the parts of an encrypted message are not files (mime.is_file); mirrored before,
# a PGP/MIME or S/MIME message kept its has_attachment, as a sync parses again only mail that
# changed.  notmuch tags such mail "encrypted": those rows are parsed again, from the answer of
# notmuch's "attachment" tag (a parse only ever adds to it, see passes.mirror).
ENCRYPTED_REPARSE_KEY = "reparse_encrypted_after"
ENCRYPTED_REPARSED_ROWS = ("message_id IN "
                           "(SELECT message_id FROM message_tags WHERE tag = 'encrypted')")
_V20 = f"""
UPDATE messages SET has_attachment = 0 WHERE {ENCRYPTED_REPARSED_ROWS}
    AND message_id NOT IN (SELECT message_id FROM message_tags WHERE tag = 'attachment');
INSERT INTO sync_state (key, value) SELECT '{ENCRYPTED_REPARSE_KEY}', ''
    WHERE EXISTS (SELECT 1 FROM messages WHERE {ENCRYPTED_REPARSED_ROWS})
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
"""

# Version 21: contact figures leave spam out, but for a blocked sender's own figures
# (passes.mirror._COUNTED): they are recounted.
_V21 = f"""
INSERT INTO sync_state (key, value) SELECT '{STATS_DIRTY}', '1'
    WHERE EXISTS (SELECT 1 FROM contact_stats)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
"""

# Version 22: what reads the audit log by kind (the send limit, a draft sent already) or by age
# (its pruning) reads an index: months of writes make tens of thousands of entries.  Kept
# runnable again, as the scripts before it are, over a schema set back to an older version.
_V22 = """
CREATE INDEX IF NOT EXISTS audit_log_action ON audit_log(action, at);
CREATE INDEX IF NOT EXISTS audit_log_at ON audit_log(at);
"""

# Version 23: list mail whose From the list rewrote to its own address (DMARC mitigation:
# "Alice Smith via dev-list" <dev@lists.example.org>) names its author in X-Original-From or
# Reply-To: ``message_addresses`` keeps that author in the role 'author' (counted as mail from
# them, passes.mirror._STATS; no listing shows it), and the list's address no longer takes
# the author's name.  The table is made again to let its role be 'author'; list mail whose
# sender may be the list's (AUTHOR_REPARSED_ROWS, a superset of what headers.list_author
# reads as rewritten) has its files parsed again.
AUTHOR_REPARSE_KEY = "reparse_author_after"
AUTHOR_REPARSED_ROWS = ("list_id IS NOT NULL AND (sender_name LIKE '% via %' "
                        "OR replace(sender_email, '@', '.') = list_id)")
_V23 = f"""
CREATE TABLE message_addresses_new (
    message_id TEXT NOT NULL REFERENCES messages(message_id) ON DELETE CASCADE,
    role       TEXT NOT NULL CHECK (role IN ('from', 'to', 'cc', 'bcc', 'author')),
    email      TEXT NOT NULL,
    name       TEXT NOT NULL,
    PRIMARY KEY (email, role, message_id)
) WITHOUT ROWID;
INSERT INTO message_addresses_new (message_id, role, email, name)
    SELECT message_id, role, email, name FROM message_addresses;
DROP TABLE message_addresses;
ALTER TABLE message_addresses_new RENAME TO message_addresses;
CREATE INDEX message_addresses_message ON message_addresses(message_id);
INSERT INTO sync_state (key, value) SELECT '{AUTHOR_REPARSE_KEY}', ''
    WHERE EXISTS (SELECT 1 FROM messages WHERE {AUTHOR_REPARSED_ROWS})
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
"""


def is_mine_sql(address: str) -> str:
    """SQL for "the canonical address ``address`` (an SQL expression) is the user's", by the
    ``me`` table, as message.headers.is_own_address has it."""
    return f"""EXISTS (SELECT 1 FROM me WHERE me.email = {address}
       OR (instr(me.email, '+') = 0
           AND substr({address}, 1, instr(me.email, '@'))
               = substr(me.email, 1, instr(me.email, '@') - 1) || '+'
           AND substr({address}, -(length(me.email) - instr(me.email, '@') + 1))
               = substr(me.email, instr(me.email, '@'))))"""


# Version 24: is_me holds for the user's sub-addresses too (me+lists@x of me@x, an address of
# the user's without "+"), as message.headers.is_own_address has it: the blocklist refuses
# them as the user's, saying to add is_me = 0.  Dropping the view drops its triggers.
_IS_ME_V24 = is_mine_sql("e.email_address")
_V24 = ("DROP VIEW contacts;" + _CONTACTS_VIEW.format(is_me=_IS_ME_V24) + _CONTACTS_INSERT_V17
        + _CONTACTS_UPDATE + _CONTACTS_DELETE)

# Version 25: an mbsync Inbox outside the store's Path is the account's INBOX (config.Account.
# outside_inbox); the mirror kept the mail there as no account's (emails.account_name NULL).
# Where any message has no account, the next sync reads every message from the index again
# (the files are not parsed again), as version 17 did.
_V25 = """
DELETE FROM sync_state WHERE key IN ('revision', 'window')
    AND EXISTS (SELECT 1 FROM messages WHERE account_name IS NULL);
"""

# Version 26: mail from a sub-address of the user's (me+lists@x of me@x) is the user's own mail
# (is_sent, passes.mirror), as is_me has it since version 24.  Emptying ``me`` makes the next
# sync recompute is_sent, the thread rows and the contact figures, as version 15 did.
_V26 = """
DELETE FROM me;
"""

# Version 27: a From named "<name> via <list>" on an address neither the list's nor its host's
# is the author's own (headers.list_rewrote), and a Reply-To on the host of the address a list
# sent from is the host's (a Discourse site's reply-by-email address): version 23 read either
# as the author of the mail.  Where such list mail is mirrored, the list mail whose sender may
# be the list's (AUTHOR_REPARSED_ROWS) is parsed again.
_V27 = f"""
INSERT INTO sync_state (key, value) SELECT '{AUTHOR_REPARSE_KEY}', ''
    WHERE EXISTS (SELECT 1 FROM messages WHERE list_id IS NOT NULL
                  AND sender_name LIKE '% via %' AND replace(sender_email, '@', '.') != list_id)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
"""

# The audit log's indexes since version 28, made again with the table by each version that
# makes it again.
_AUDIT_LOG_INDEXES = """
CREATE INDEX audit_log_action ON audit_log(action, at);
CREATE INDEX audit_log_at ON audit_log(at);
CREATE INDEX audit_log_session ON audit_log(session, id);
"""

# Version 28: each write records the MCP session it was made in (NULL: made outside one -- the
# CLI, a pass -- or before this version), so that undo_last_write reverts the caller's own
# latest write (passes.changes.undo_last).  The table is made again, as version 23 made
# message_addresses, so the script stays runnable over a schema set back.
_V28 = """
CREATE TABLE audit_log_new (
    id        INTEGER PRIMARY KEY,
    at        TEXT NOT NULL,
    action    TEXT NOT NULL,
    params    TEXT NOT NULL,
    changes   TEXT NOT NULL,
    undone_at TEXT,
    session   TEXT
);
INSERT INTO audit_log_new (id, at, action, params, changes, undone_at)
    SELECT id, at, action, params, changes, undone_at FROM audit_log;
DROP TABLE audit_log;
ALTER TABLE audit_log_new RENAME TO audit_log;
""" + _AUDIT_LOG_INDEXES

# Version 29: an undone entry records the newest entry there was when it was undone
# (``undone_upto``), so that undo knows whether an earlier write was undone before or after a
# later one was made (passes.changes.undone_before) -- the times, to the second, could not say
# within one second, and then a change made elsewhere in between came undone too.  Entries
# undone before this version count as undone before anything after them was made: what undo
# did before.  Made again, as version 28 made it.
_V29 = """
CREATE TABLE audit_log_new (
    id          INTEGER PRIMARY KEY,
    at          TEXT NOT NULL,
    action      TEXT NOT NULL,
    params      TEXT NOT NULL,
    changes     TEXT NOT NULL,
    undone_at   TEXT,
    session     TEXT,
    undone_upto INTEGER
);
INSERT INTO audit_log_new (id, at, action, params, changes, undone_at, session, undone_upto)
    SELECT id, at, action, params, changes, undone_at, session,
           CASE WHEN undone_at IS NOT NULL THEN id END FROM audit_log;
DROP TABLE audit_log;
ALTER TABLE audit_log_new RENAME TO audit_log;
""" + _AUDIT_LOG_INDEXES + """
CREATE INDEX audit_log_undone ON audit_log(undone_upto) WHERE undone_upto IS NOT NULL;
"""

# Version 30: an entry whose mail was reverted before its contact rows records the newest
# entry at its mail's revert too (``mail_undone_upto``; a message reverted before a retry's
# re-index, in its change): a write recorded between the two was made after the one and
# before the other (see mark_undone).  NULL: as ``undone_upto``.
_V30 = """
CREATE TABLE audit_log_new (
    id               INTEGER PRIMARY KEY,
    at               TEXT NOT NULL,
    action           TEXT NOT NULL,
    params           TEXT NOT NULL,
    changes          TEXT NOT NULL,
    undone_at        TEXT,
    session          TEXT,
    undone_upto      INTEGER,
    mail_undone_upto INTEGER
);
INSERT INTO audit_log_new (id, at, action, params, changes, undone_at, session, undone_upto)
    SELECT id, at, action, params, changes, undone_at, session, undone_upto FROM audit_log;
DROP TABLE audit_log;
ALTER TABLE audit_log_new RENAME TO audit_log;
""" + _AUDIT_LOG_INDEXES + """
CREATE INDEX audit_log_undone ON audit_log(undone_upto) WHERE undone_upto IS NOT NULL;
"""

# Version 31: a send started and not yet ended, by its draft's Message-ID (send_started): a
# process killed while its command ran may have sent the draft without filing it, and only
# this row then tells the next send_email so.  Kept runnable over a schema set back.
_V31 = """
CREATE TABLE IF NOT EXISTS sends_started (
    message_id TEXT PRIMARY KEY,
    at         TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class Reparse:
    """Rows of the mirror that a migration has parsed again from their files: ``rows``
    selects them (SQL on ``messages``), in Message-ID order; ``key`` (in sync_state) holds
    the last one done, '' before the first, and goes when all are (passes.mirror)."""

    key: str
    rows: str


REPARSES = (Reparse(REPARSE_KEY, REPARSED_ROWS), Reparse(BCC_REPARSE_KEY, BCC_REPARSED_ROWS),
            Reparse(ENCRYPTED_REPARSE_KEY, ENCRYPTED_REPARSED_ROWS),
            Reparse(AUTHOR_REPARSE_KEY, AUTHOR_REPARSED_ROWS))

# Index i holds the script that takes the schema from version i to i + 1.
MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10, _V11, _V12,
                               _V13, _V14, _V15, _V16, _V17, _V18, _V19, _V20, _V21,
                               _V22, _V23, _V24, _V25, _V26, _V27, _V28,
                               _V29, _V30, _V31)
SCHEMA_VERSION = len(MIGRATIONS)


def _sql_canonical_address(value: Any) -> Any:
    """canonical_address for SQL: what is not text (a NULL a caller's INSERT gives the contacts
    view) goes through as it is, for the constraints and checks after it to refuse."""
    return canonical_address(value) if isinstance(value, str) else value


# Python functions the schema's SQL calls: its migrations, every write of thread rows and
# their check, the contacts view's INSERT trigger (no caller's SQL may call them).
SQL_FUNCTIONS: dict[str, Callable[[Any], Any]] = {"canonical_address": _sql_canonical_address}


class SidecarError(BackendError):
    """The sidecar file cannot be used (newer schema, corrupt, unwritable)."""


def sidecar_path(data_dir: Path) -> Path:
    return data_dir / SIDECAR_NAME


def failure_text(exc: sqlite3.Error, where: str) -> str:
    """What an SQLite error on the sidecar ``where`` names means to the user: SQLite's bare
    words ("database disk image is malformed") read as if the notmuch database were broken --
    whose rebuild would lose tags.  Names the file and the way out."""
    if is_busy(exc):
        return (f"{where} is busy ({exc}): another fmail-nm (the service, the notmuch post-new "
                "hook, another command) is writing to it; retry in a moment (a later "
                "`fmail-nm index` takes up any mail this run indexed but did not mirror)")
    if is_damaged(exc):
        return (f"{where} cannot be read ({exc}); your mail and the notmuch index are not "
                "affected: `fmail-nm sidecar rebuild` moves the damaged file aside and builds "
                "it again from notmuch (`fmail-nm doctor` says more)")
    if is_internal(exc):
        return (f"internal error in fmail-nm: its own SQL on {where} failed ({exc}); not a "
                "problem with the request nor a sign of a damaged file -- please report it")
    return f"{where}: {exc}"


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is the sidecar held by another connection (busy, locked)."""
    return _primary_code(exc) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def is_damaged(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is the sidecar file damaged or no SQLite database."""
    return _primary_code(exc) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def is_internal(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is fmail-nm's own SQL at fault (an unknown table or column, a syntax
    error, a misused connection), not the file nor another process."""
    return (isinstance(exc, (sqlite3.ProgrammingError, sqlite3.InterfaceError))
            or _primary_code(exc) in (sqlite3.SQLITE_ERROR, sqlite3.SQLITE_MISUSE,
                                      sqlite3.SQLITE_RANGE))


def _primary_code(exc: sqlite3.Error) -> int:
    return (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF


def readable(path: Path) -> str | None:
    """Why the sidecar file cannot be read as a database (damaged, not SQLite), else None."""
    try:
        with opened(path, readonly=True) as conn:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except SidecarError:
        return None  # missing, or a newer schema: said elsewhere
    except sqlite3.DatabaseError as exc:
        return str(exc)
    return None


def set_aside(path: Path) -> Path:
    """Move a damaged sidecar (and its WAL) aside, to build a new one; where it went.  Its
    contact notes, blocks and write log stay in that file, for `sqlite3 <file> .recover`."""
    aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
    for suffix in ("-wal", "-shm"):
        extra = path.with_name(path.name + suffix)
        if extra.exists():
            extra.rename(aside.with_name(aside.name + suffix))
    path.rename(aside)
    return aside


def uid_for(message_id: str) -> str:
    """The ``uid`` of a message: a short, stable key derived from its Message-ID, so it stays
    the same across sidecar rebuilds and machines (64 bits: collisions are not a concern
    below billions of messages)."""
    # Imported here: loading it loads OpenSSL, and the hook of a notmuch new that found nothing
    # mirrors no new message.
    import hashlib

    return hashlib.sha256(message_id.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection to the sidecar; read-write opens create and migrate it."""
    if readonly:
        if not path.exists():
            raise SidecarError(f"no sidecar database at {path}; run `fmail-nm index` first")
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None,
                               check_same_thread=False)
    else:
        private_dir(path.parent)
        private_file(path)
        for journal in ("-wal", "-shm"):
            tighten(path.with_name(path.name + journal))
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    add_functions(conn)
    if readonly:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            conn.close()
            raise _newer_schema(path, version)
        if version != SCHEMA_VERSION:
            conn.close()
            raise SidecarError(f"the sidecar at {path} has schema {version}, this fmail-nm "
                               f"expects {SCHEMA_VERSION}; run `fmail-nm index` to migrate it")
        return conn
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
    migrate(conn, path)
    return conn


def add_functions(conn: sqlite3.Connection) -> None:
    """The Python functions the schema's SQL calls, on a new connection."""
    for name, function in SQL_FUNCTIONS.items():
        conn.create_function(name, 1, function, deterministic=True)


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    # Look before taking the write lock: opening must not wait for a busy writer when there
    # is nothing to migrate.
    if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
        return
    with transaction(conn):
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise _newer_schema(path, version)
        for script in MIGRATIONS[version:]:
            for statement in _statements(script):
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _newer_schema(path: Path, version: int) -> SidecarError:
    # No migration goes back, and "run `fmail-nm index`" would only fail the same way.
    return SidecarError(f"the sidecar at {path} was written by a newer fmail-nm "
                        f"(schema {version} > {SCHEMA_VERSION}); upgrade fmail-nm to use it")


def _statements(script: str) -> Iterator[str]:
    """Split a trusted schema script into statements (triggers hold inner semicolons)."""
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                yield buffer
            buffer = ""
    if buffer.strip():
        raise SidecarError("incomplete statement in a schema script")


# The connections inside enclosing(): on them alone a transaction nests, as a savepoint.
# (A set, not a WeakSet: sqlite3.Connection takes no weak reference; enclosing() lets go.)
_enclosed: set[sqlite3.Connection] = set()


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any error -- a failed COMMIT too,
    so that nothing half-done stays open on the connection.  Inside :func:`enclosing`, a
    savepoint of its transaction (rolled back on an error), kept or not with it.  Any other
    transaction already open makes it fail, as SQLite does: one left open on a long-lived
    connection must not turn each later transaction into a savepoint that never commits."""
    if conn in _enclosed:
        with _savepoint(conn):
            yield conn
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        _roll_back(conn)
        raise


@contextmanager
def _savepoint(conn: sqlite3.Connection) -> Iterator[None]:
    """A savepoint of the transaction :func:`enclosing` opened, which must still be open."""
    _still_enclosed(conn)
    conn.execute("SAVEPOINT nested")
    try:
        yield
    except BaseException:
        if conn.in_transaction:  # else SQLite rolled back the whole one: nothing to undo
            conn.execute("ROLLBACK TO nested")
            conn.execute("RELEASE nested")
        raise
    conn.execute("RELEASE nested")


def _still_enclosed(conn: sqlite3.Connection) -> None:
    """Fails once SQLite has rolled back the enclosing transaction itself (an error such as
    SQLITE_FULL, or a trigger's RAISE(ROLLBACK), that the block went on after): a savepoint
    would then begin a transaction of its own, committed when released -- in a rehearsal
    too -- and the rest of the block would write apart from what was rolled back."""
    if not conn.in_transaction:
        raise SidecarError("the sidecar rolled back the transaction after an error; "
                           "nothing more is written in it")


def _roll_back(conn: sqlite3.Connection) -> None:
    # SQLite may have rolled back already (SQLITE_FULL, an I/O error, RAISE(ROLLBACK)):
    # a ROLLBACK then fails, and its error would hide the one that ended the transaction.
    if conn.in_transaction:
        conn.execute("ROLLBACK")


@contextmanager
def enclosing(conn: sqlite3.Connection, *, keep: bool) -> Iterator[None]:
    """One transaction (``BEGIN IMMEDIATE``) around what the block reads and the
    transactions it opens (savepoints of this one, see :func:`transaction`): committed at
    the end if ``keep``, else rolled back -- a rehearsal shows what it would change, and
    changes nothing; rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    _enclosed.add(conn)
    try:
        yield
        if keep:
            conn.execute("COMMIT")
    finally:
        _enclosed.discard(conn)
        _roll_back(conn)


@contextmanager
def opened(path: Path, *, readonly: bool = False) -> Iterator[sqlite3.Connection]:
    conn = connect(path, readonly=readonly)
    try:
        yield conn
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# Sync state


def get_state(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM sync_state WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def set_state(conn: sqlite3.Connection, key: str, value: str | None) -> None:
    if value is None:
        conn.execute("DELETE FROM sync_state WHERE key = ?", (key,))
    else:
        conn.execute("INSERT INTO sync_state (key, value) VALUES (?, ?) "
                     "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value))


# ---------------------------------------------------------------------------------------------
# Contacts the user keeps


def pending_tagging(conn: sqlite3.Connection) -> list[tuple[str, str | None]]:
    """(Message-ID, List-Id) of the messages waiting for the tagging pass, in id order."""
    return [(row[0], row[1]) for row in conn.execute(
        "SELECT message_id, list_id FROM messages WHERE needs_tagging = 1 ORDER BY message_id")]


def mark_tagged(conn: sqlite3.Connection, message_ids: Sequence[str]) -> None:
    with transaction(conn):
        conn.executemany("UPDATE messages SET needs_tagging = 0 WHERE message_id = ?",
                         [(mid,) for mid in message_ids])


def recipients_of(data_dir: Path, message_ids: Sequence[str]) -> dict[str, list[dict[str, str]]]:
    """The mirrored recipients of these messages (those the mirror has): To, Cc and Bcc,
    each with its ``kind``."""
    path = sidecar_path(data_dir)
    if not message_ids or not path.exists():
        return {}
    found: dict[str, list[dict[str, str]]] = {}
    with opened(path, readonly=True) as conn:
        for start in range(0, len(message_ids), 500):
            chunk = list(message_ids[start:start + 500])
            marks = ",".join("?" * len(chunk))
            for mid, recipients in conn.execute(
                    f"SELECT message_id, recipients FROM messages WHERE message_id IN ({marks})",
                    chunk):
                found[mid] = json.loads(recipients)
    return found


def refresh_threads(conn: sqlite3.Connection, thread_ids: Iterable[str]) -> None:
    """Recompute the ``threads`` rows of these threads from their mirrored messages (a thread
    whose messages are all gone loses its row)."""
    for chunk in chunks(sorted(set(thread_ids))):
        marks = ",".join("?" * len(chunk))
        conn.execute(f"DELETE FROM thread_rows WHERE thread_id IN ({marks})", chunk)
        conn.execute(_INSERT_THREADS + THREAD_ROWS.format(where=f"thread_id IN ({marks})"),
                     chunk)


def rebuild_threads(conn: sqlite3.Connection) -> None:
    """Recompute every ``threads`` row (after a change that touches all, e.g. the user's
    addresses, which decide ``sent_count``)."""
    conn.execute("DELETE FROM thread_rows")
    conn.execute(_INSERT_THREADS + THREAD_ROWS.format(where="1"))


def thread_problems(conn: sqlite3.Connection) -> list[str]:
    """Every difference between the ``threads`` table and its messages (empty: exact)."""
    def rows(sql: str) -> dict[str, tuple[Any, ...]]:
        # group_concat's order follows the scan, which differs between the two reads
        return {r[0]: (*r[:9], sorted((r[9] or "").split(",")), *r[10:])
                for r in conn.execute(sql)}
    want = rows(THREAD_ROWS.format(where="1"))
    have = rows(f"SELECT {', '.join(_THREAD_ROW_COLUMNS)} FROM thread_rows")
    return [f"thread {t}: row {have.get(t)} but its messages say {want.get(t)}"
            for t in sorted(set(want) | set(have)) if want.get(t) != have.get(t)]


def chunks(items: Sequence[str], size: int = 500) -> Iterator[list[str]]:
    """``items`` in lists of at most ``size`` (SQLite takes at most 999 parameters)."""
    for start in range(0, len(items), size):
        yield list(items[start:start + size])


# ---------------------------------------------------------------------------------------------
# Pages read from the mirror


# What a listing shows of a message, in this order (see tools.reads).
# the last, the date a page ranked the message by (undated mail at 0, as notmuch files it)
LISTING_COLUMNS = ("message_id", "uid", "thread_id", "date", "sender_name", "sender_email",
                   "subject", "tags", "recipients", "has_attachment", "coalesce(date_epoch, 0)")


@dataclass(frozen=True)
class MirrorState:
    uuid: str | None  # the notmuch database the mirror was built from
    revision: int | None  # every change up to this notmuch revision is mirrored


def mirror_state(conn: sqlite3.Connection) -> MirrorState:
    state = dict(conn.execute("SELECT key, value FROM sync_state "
                              "WHERE key IN ('notmuch_uuid', 'revision')").fetchall())
    revision = state.get("revision")
    return MirrorState(state.get("notmuch_uuid"), int(revision) if revision else None)


def listing_rows(conn: sqlite3.Connection,
                 message_ids: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """The LISTING_COLUMNS of these messages (those the mirror has), by Message-ID: one
    primary-key read for a page."""
    found: dict[str, tuple[Any, ...]] = {}
    for chunk in chunks(message_ids):
        marks = ",".join("?" * len(chunk))
        for row in conn.execute(f"SELECT {', '.join(LISTING_COLUMNS)} FROM messages "
                                f"WHERE message_id IN ({marks})", chunk):
            found[row[0]] = row
    return found


def dates_of(conn: sqlite3.Connection, message_ids: Sequence[str]) -> dict[str, int]:
    """The mirror's dates (epoch seconds) of these messages, those it has, by Message-ID;
    undated mail (NULL in the mirror) at 0, where notmuch has it."""
    found: dict[str, int] = {}
    for chunk in chunks(message_ids):
        marks = ",".join("?" * len(chunk))
        found.update(conn.execute(f"SELECT message_id, coalesce(date_epoch, 0) FROM messages "
                                  f"WHERE message_id IN ({marks})", chunk))
    return found


def recorded_exclusions(conn: sqlite3.Connection) -> frozenset[str]:
    """The tags the ``is_excluded`` column stands for (what searches left out at the last sync)."""
    value = get_state(conn, EXCLUSIONS_KEY)
    return frozenset(json.loads(value)) if value else frozenset()


def follow_exclusions(conn: sqlite3.Connection, tags: Sequence[str]) -> bool:
    """Make the ``is_excluded`` column stand for these tags (the config's search.exclude_tags
    changed): one pass over the mirror, nothing when they are the recorded ones.  Inside the
    caller's transaction.  True when the column was recomputed."""
    wanted = sorted(set(tags))
    if recorded_exclusions(conn) == frozenset(wanted):
        return False
    marks = ",".join("?" * len(wanted)) or "NULL"
    conn.execute(f"UPDATE messages SET is_excluded = EXISTS (SELECT 1 FROM message_tags t WHERE "
                 f"t.message_id = messages.message_id AND t.tag IN ({marks}))", wanted)
    set_state(conn, EXCLUSIONS_KEY, json.dumps(wanted))
    return True


@dataclass(frozen=True)
class Span:
    """Dates (Unix seconds, both ends included) a page is limited to; None: open."""

    since: int | None = None
    until: int | None = None

    def clause(self) -> tuple[str, list[int]]:
        """The WHERE terms (each starting with AND) and their parameters."""
        bounds = [(op, value) for op, value in ((">=", self.since), ("<=", self.until))
                  if value is not None]
        return "".join(f" AND date_epoch {op} ?" for op, _ in bounds), [v for _, v in bounds]


ALL_DATES = Span()


def shown_page(conn: sqlite3.Connection, *, span: Span = ALL_DATES, oldest_first: bool,
               offset: int, limit: int) -> list[str]:
    """One page, by date, of the messages a search shows (no excluded tag) within ``span``,
    as Message-IDs: read along ``messages_excluded_date``, so nothing is sorted (messages
    without a date come last, as notmuch has them at time 0; those of one date in the order
    of their Message-IDs, see reads._page_in_mirror_order)."""
    where, args = span.clause()
    order = "ASC" if oldest_first else "DESC"
    page = conn.execute(
        f"SELECT message_id FROM messages INDEXED BY messages_excluded_date WHERE is_excluded = 0"
        f"{where} ORDER BY date_epoch {order}, message_id {order} LIMIT ? OFFSET ?",
        [*args, limit, offset])
    return [row[0] for row in page]


DAY = 86400  # seconds: shown_days counts by day of the epoch (UTC)


def shown_count(conn: sqlite3.Connection, span: Span = ALL_DATES) -> int:
    """How many messages a search shows within ``span``: kept by triggers for all dates and
    per whole day in a span; the partial days at its ends are counted along the index."""
    if span == ALL_DATES:
        return mirror_count(conn, "shown")
    if span.since is None or span.since < 1 or span.until is None:
        return _indexed_count(conn, span)
    first_day = -(-span.since // DAY)  # the first day that starts inside the span
    end_day = (span.until + 1) // DAY  # the day that ends past it
    if first_day >= end_day:
        return _indexed_count(conn, span)
    whole = conn.execute("SELECT coalesce(sum(n), 0) FROM shown_days WHERE day >= ? AND day < ?",
                         (first_day, end_day)).fetchone()[0]
    return (int(whole) + _indexed_count(conn, Span(span.since, first_day * DAY - 1))
            + _indexed_count(conn, Span(end_day * DAY, span.until)))


def excluded_count(conn: sqlite3.Connection, span: Span = ALL_DATES) -> int:
    """How many messages within ``span`` a search leaves out (they carry an excluded tag)."""
    if span == ALL_DATES:
        return mirror_count(conn, "messages") - mirror_count(conn, "shown")
    return _indexed_count(conn, span, excluded=True)


def _indexed_count(conn: sqlite3.Connection, span: Span, *, excluded: bool = False) -> int:
    if span.since is not None and span.until is not None and span.since > span.until:
        return 0
    where, args = span.clause()
    return int(conn.execute(f"SELECT count(*) FROM messages INDEXED BY messages_excluded_date "
                            f"WHERE is_excluded = {int(excluded)}{where}", args).fetchone()[0])


def mirror_count(conn: sqlite3.Connection, name: str) -> int:
    """A count the triggers keep: ``messages`` (all) or ``shown`` (no excluded tag)."""
    return int(conn.execute("SELECT n FROM mirror_counts WHERE name = ?", (name,)).fetchone()[0])


def count_problems(conn: sqlite3.Connection) -> list[str]:
    """Differences between the kept counts and the messages (empty: exact)."""
    actual = {"messages": conn.execute("SELECT count(*) FROM messages").fetchone()[0],
              "shown": conn.execute("SELECT count(*) FROM messages "
                                    "WHERE is_excluded = 0").fetchone()[0]}
    problems = [f"mirror_counts: {name} is {mirror_count(conn, name)}, the messages say {n}"
                for name, n in actual.items() if mirror_count(conn, name) != n]
    tags = {tag: (n, shown) for tag, n, shown in conn.execute(
        "SELECT tag, count(*), sum(1 - m.is_excluded) FROM message_tags JOIN messages m "
        "USING (message_id) GROUP BY tag")}
    kept_tags = {tag: (n, shown) for tag, n, shown in conn.execute(
        "SELECT tag, n, shown FROM tag_counts WHERE n <> 0 OR shown <> 0")}
    problems += [f"tag_counts: {tag} is {kept_tags.get(tag, (0, 0))} (messages, shown), the "
                 f"messages say {tags.get(tag, (0, 0))}"
                 for tag in sorted(set(tags) | set(kept_tags))
                 if tags.get(tag, (0, 0)) != kept_tags.get(tag, (0, 0))]
    pairs = {(tag, other): (n, shown) for tag, other, n, shown in conn.execute(
        "SELECT a.tag, b.tag, count(*), sum(1 - m.is_excluded) FROM message_tags a "
        "JOIN message_tags b ON b.message_id = a.message_id AND b.tag > a.tag "
        "JOIN messages m ON m.message_id = a.message_id GROUP BY a.tag, b.tag")}
    kept_pairs = {(tag, other): (n, shown) for tag, other, n, shown in conn.execute(
        "SELECT tag, other, n, shown FROM tag_pairs WHERE n <> 0 OR shown <> 0")}
    problems += [f"tag_pairs: {pair} is {kept_pairs.get(pair, (0, 0))} (messages, shown), "
                 f"the messages say {pairs.get(pair, (0, 0))}"
                 for pair in sorted(set(pairs) | set(kept_pairs))
                 if pairs.get(pair, (0, 0)) != kept_pairs.get(pair, (0, 0))]
    days = dict(conn.execute("SELECT date_epoch / 86400, count(*) FROM messages "
                             "WHERE is_excluded = 0 AND date_epoch IS NOT NULL GROUP BY 1"))
    kept = dict(conn.execute("SELECT day, n FROM shown_days WHERE n <> 0"))
    problems += [f"shown_days: day {day} is {kept.get(day, 0)}, the messages say {days.get(day, 0)}"
                 for day in sorted(set(days) | set(kept)) if days.get(day, 0) != kept.get(day, 0)]
    return problems


def tagged_count(conn: sqlite3.Connection, tags: Sequence[str]) -> int:
    """Messages carrying these tags, one count per tag (a message with two counts twice),
    spam and deleted mail included, as the triggers keep them: a tag's share."""
    marks = ",".join("?" * len(tags)) or "NULL"
    return int(conn.execute(f"SELECT coalesce(sum(n), 0) FROM tag_counts WHERE tag IN ({marks})",
                            list(tags)).fetchone()[0])


def kept_tag_counts(conn: sqlite3.Connection, tags: Iterable[str]) -> tuple[int, int] | None:
    """For one tag or two: how many messages carry all of them, and how many of those a
    search shows, as the triggers keep them (``tag_counts``, ``tag_pairs``).  None for
    more tags (nothing keeps those counts)."""
    wanted = sorted(set(tags))
    if len(wanted) == 1:
        row = conn.execute("SELECT n, shown FROM tag_counts WHERE tag = ?", wanted).fetchone()
    elif len(wanted) == 2:
        row = conn.execute("SELECT n, shown FROM tag_pairs WHERE tag = ? AND other = ?",
                           wanted).fetchone()
    else:
        return None
    return (0, 0) if row is None else (int(row[0]), int(row[1]))


def tag_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Messages per tag, as the triggers keep them."""
    return dict(conn.execute("SELECT tag, n FROM tag_counts WHERE n > 0"))


def tagged_page(conn: sqlite3.Connection, tag_groups: Sequence[Sequence[str]], *,
                span: Span = ALL_DATES, oldest_first: bool, offset: int, limit: int,
                scan: int) -> list[str] | None:
    """One page, by date, of the shown messages within ``span`` that carry a tag of every
    group, as Message-IDs, looked for among the ``scan`` first shown messages in that order
    only: None when those hold too few for the page and are not the whole span."""
    rows, whole = _shown_carrying(conn, tag_groups, span, oldest_first, scan)
    if len(rows) < offset + limit and not whole:
        return None
    return [mid for mid, _ in rows[offset:offset + limit]]


def newest_threads(conn: sqlite3.Connection, tag_groups: Sequence[Sequence[str]], *,
                   span: Span = ALL_DATES, want: int, scan: int) -> list[str] | None:
    """The first ``want`` threads, newest first, of the shown messages within ``span`` that
    carry a tag of every group (a thread ranks by its newest such message, as notmuch ranks
    threads), looked for among the ``scan`` newest shown messages only: None when that
    window holds fewer than ``want`` of them and is not the whole span."""
    rows, whole = _shown_carrying(conn, tag_groups, span, False, scan)
    threads = list(dict.fromkeys(thread for _, thread in rows))
    if len(threads) < want and not whole:
        return None
    return threads[:want]


def _shown_carrying(conn: sqlite3.Connection, tag_groups: Sequence[Sequence[str]], span: Span,
                    oldest_first: bool, scan: int) -> tuple[list[tuple[str, str]], bool]:
    """(Message-ID, thread) of the shown messages within ``span`` that carry a tag of every
    group, among the ``scan`` first shown messages by date; and whether those were all."""
    where, args = span.clause()
    order = "ASC" if oldest_first else "DESC"
    carries, tags = _carries(tag_groups)
    # One statement, the tags checked as the index is read; the limit written out (as a
    # parameter, SQLite plans the read for any number of rows).
    rows = conn.execute(
        f"SELECT m.message_id, m.thread_id, {carries} FROM (SELECT message_id, thread_id "
        f"FROM messages INDEXED BY messages_excluded_date WHERE is_excluded = 0{where} "
        f"ORDER BY date_epoch {order}, message_id {order} LIMIT {int(scan)}) m",
        [*tags, *args]).fetchall()
    return [(mid, thread) for mid, thread, hit in rows if hit], len(rows) < scan


def _carries(tag_groups: Sequence[Sequence[str]]) -> tuple[str, list[str]]:
    """SQL true when message ``m`` carries a tag of every group, and its parameters."""
    sql = " AND ".join(
        "EXISTS (SELECT 1 FROM message_tags t WHERE t.message_id = m.message_id AND t.tag IN "
        f"({','.join('?' * len(group))}))" for group in tag_groups) or "1"
    return sql, [tag for group in tag_groups for tag in group]


def thread_members(conn: sqlite3.Connection, thread_ids: Sequence[str],
                   tag_groups: Sequence[Sequence[str]], *,
                   span: Span = ALL_DATES) -> dict[str, list[ThreadMember]]:
    """Every mirrored message of these threads, oldest first (ties in the order the mirror
    took them in, which follows the index's), marked matched when a search for a tag of
    every group within ``span`` shows it: what a thread listing needs, in one read."""
    where, args = span.clause()
    carries, tags = _carries(tag_groups)
    found: dict[str, list[ThreadMember]] = {}
    for chunk in chunks(thread_ids):
        marks = ",".join("?" * len(chunk))
        rows = conn.execute(
            f"SELECT thread_id, coalesce(date_epoch, 0), message_id, subject, sender_name, "
            f"sender_email, tags, is_excluded = 0{where} AND {carries} FROM messages m "
            f"WHERE thread_id IN ({marks}) ORDER BY thread_id, coalesce(date_epoch, 0), rowid",
            [*args, *tags, *chunk])
        for thread, date_, message_id, subject, name, address, tags_json, matched in rows:
            found.setdefault(thread, []).append(ThreadMember(
                date=date_, message_id=message_id, subject=subject, author=author(name, address),
                tags=frozenset(json.loads(tags_json)), matched=bool(matched)))
    return found


def sender_date_at_rank(conn: sqlite3.Connection, address: str,
                        tag_groups: Sequence[Sequence[str]], rank: int) -> int | None:
    """The date of the ``rank``-th newest (1 the newest) shown message from ``address`` that
    carries a tag of every group, read along the sender index; None when there are fewer."""
    carries, tags = _carries(tag_groups)
    row = conn.execute(
        f"SELECT date_epoch FROM messages m INDEXED BY messages_sender "
        f"WHERE sender_email = ? AND is_excluded = 0 AND date_epoch IS NOT NULL AND {carries} "
        f"ORDER BY date_epoch DESC LIMIT 1 OFFSET ?", [address, *tags, rank - 1]).fetchone()
    return None if row is None else int(row[0])


@dataclass(frozen=True)
class LastWord:
    """A thread's last word: its newest message that is not deleted, spam or a draft."""

    thread_id: str
    message_id: str
    date: int  # 0 when it has no usable Date, as notmuch keeps it
    message_count: int  # every mirrored message of the thread, drafts too (as notmuch's)


def last_words(conn: sqlite3.Connection, addresses: Sequence[str], *, since: int | None,
               until: int | None, offset: int, limit: int,
               passed_over: Sequence[int] = ()) -> tuple[int, list[LastWord]]:
    """The threads whose last word is from one of ``addresses`` (canonical, see
    :func:`canonical_address`), dated within ``since`` .. ``until``, but the thread rows
    ``passed_over`` (rowids): how many, and one page of them, newest first.  Read along the
    index of the last words the mirror keeps with each thread (schema versions 10 and 16),
    which holds the rowid too."""
    where = (f"last_word_sender IN ({','.join('?' * len(addresses)) or 'NULL'})"
             " AND last_word_date >= ? AND last_word_date <= ?"
             f" AND rowid NOT IN ({','.join('?' * len(passed_over))})")
    args = [*addresses, -2**63 if since is None else since,
            2**63 - 1 if until is None else until, *passed_over]
    total = conn.execute(f"SELECT count(*) FROM thread_rows INDEXED BY thread_rows_last_word "
                         f"WHERE {where}", args).fetchone()[0]
    # The page's rows by rowid, chosen along the index alone (it holds the date and rowid).
    chosen = [r[0] for r in conn.execute(
        f"SELECT rowid FROM thread_rows INDEXED BY thread_rows_last_word WHERE {where} "
        f"ORDER BY last_word_date DESC, rowid DESC LIMIT ? OFFSET ?", [*args, limit, offset])]
    # (the row's message_count leaves drafts out: a page's threads are counted whole here)
    rows = {r[0]: r[1:] for r in conn.execute(
        f"SELECT rowid, thread_id, last_word_id, last_word_date, (SELECT count(*) FROM messages "
        f"m WHERE m.thread_id = thread_rows.thread_id) FROM thread_rows "
        f"WHERE rowid IN ({','.join('?' * len(chosen)) or 'NULL'})", chosen)}
    return int(total), [LastWord(*rows[rowid]) for rowid in chosen]


_RECIPIENT_ROLES = "('to', 'cc', 'bcc')"


# How many addresses from:me or to:me searches by: the configured ones (never cut) and the
# sub-addresses that fit.  Each is a notmuch term, a query's cost grows faster than its terms,
# and mail names as many as anyone likes -- spam to made-up alex+xyz@ addresses too.
MAX_ME_TERMS = 32
# A sub-address's uses: the user's own mail (is_sent) sent from it, or mail sent to it.
_SUB_ADDRESS_USES = {False: "a.role = 'from' AND m.is_sent = 1",
                     True: f"a.role IN {_RECIPIENT_ROLES}"}


def own_addresses(conn: sqlite3.Connection | None, addresses: Iterable[str], *,
                  received: bool = False) -> tuple[str, ...]:
    """The user's ``addresses`` in canonical form, then sub-addresses of theirs
    (is_own_address) up to MAX_ME_TERMS in all: those of the user's mail (is_sent) or, with
    ``received``, those mail went to (To, Cc, Bcc), counting mail no search leaves out (spam,
    deleted); the most mail first, then the oldest first (a new address does not displace
    old ones it ties with); in order, so that a search's query -- and its cursors -- changes
    only when they do.  notmuch finds a sub-address by a term of its own, its regex form
    being a scan of every sender; the others are the user's where each message is looked at
    (is_own_address), not in a search."""
    mine = search_forms(addresses)
    if conn is None:
        return mine
    used: list[tuple[str, int, int]] = []
    for local, _, domain in dict.fromkeys(a.rpartition("@") for a in mine):
        if "+" not in local:
            used += _sub_address_uses(conn, local, domain, received)
    used.sort(key=lambda u: (-u[1], u[2], u[0]))
    room = max(0, MAX_ME_TERMS - len(mine))
    return tuple(dict.fromkeys((*mine, *sorted(u[0] for u in used[:room]))))


def _sub_address_uses(conn: sqlite3.Connection, local: str, domain: str,
                      received: bool) -> list[tuple[str, int, int]]:
    """The sub-addresses of ``local@domain`` with how much mail of theirs (see
    :func:`own_addresses`) and the oldest one's date: read along message_addresses' key,
    every address starting "local+" ("," the character after "+"), each looked up in
    messages (CROSS JOIN: SQLite would rather walk every message not left out)."""
    return conn.execute(
        f"SELECT a.email, count(*), min(coalesce(m.date_epoch, 0)) FROM message_addresses a "
        f"CROSS JOIN messages m ON m.message_id = a.message_id "
        f"WHERE a.email > ? AND a.email < ? AND substr(a.email, -?) = ? "
        f"AND m.is_excluded = 0 AND {_SUB_ADDRESS_USES[received]} GROUP BY a.email",
        (f"{local}+", f"{local},", len(domain) + 1, f"@{domain}")).fetchall()


def last_words_to(conn: sqlite3.Connection, addresses: Sequence[str]) -> dict[int, set[str]]:
    """The thread rows whose last word went to one of these addresses (canonical; To, Cc or
    Bcc): by rowid, everyone it went to.  Read from the addresses along the primary key of
    message_addresses."""
    found: dict[int, set[str]] = {}
    for chunk in chunks(addresses):
        for rowid, email in conn.execute(
                f"SELECT t.rowid, o.email FROM message_addresses a "
                f"JOIN messages m ON m.message_id = a.message_id "
                f"JOIN thread_rows t ON t.thread_id = m.thread_id "
                f"AND t.last_word_id = a.message_id "
                f"JOIN message_addresses o ON o.message_id = a.message_id "
                f"AND o.role IN {_RECIPIENT_ROLES} "
                f"WHERE a.email IN ({','.join('?' * len(chunk))}) "
                f"AND a.role IN {_RECIPIENT_ROLES}", chunk):
            found.setdefault(rowid, set()).add(email)
    return found


def day_at_rank(conn: sqlite3.Connection, rank: int) -> int | None:
    """The start (Unix seconds, UTC) of the newest day from which on the mailbox shows at
    least ``rank`` dated messages, read from the kept counts by day: a few rows, where
    stepping along the date index read ``rank`` entries (0.8 ms for 21,000); None when it
    shows fewer."""
    seen = 0
    for day, shown in conn.execute("SELECT day, n FROM shown_days ORDER BY day DESC"):
        seen += shown
        if seen >= rank:
            return int(day) * DAY
    return None


def thread_figures(conn: sqlite3.Connection, thread_ids: Sequence[str],
                   excluded_tags: Sequence[str]) -> dict[str, tuple[int, bool]]:
    """Per thread of a page, in one read: its unread messages, leaving out those with an
    excluded tag (spam, deleted), and whether any message has a file attached."""
    found: dict[str, tuple[int, bool]] = {}
    tag_marks = ",".join("?" * len(excluded_tags)) or "NULL"
    for chunk in chunks(thread_ids):
        marks = ",".join("?" * len(chunk))
        for thread_id, unread, attached in conn.execute(
                f"SELECT thread_id, sum(CASE WHEN is_read = 0 THEN NOT EXISTS (SELECT 1 FROM "
                f"message_tags t WHERE t.message_id = m.message_id AND t.tag IN ({tag_marks})) "
                f"ELSE 0 END), max(has_attachment) FROM messages m "
                f"WHERE thread_id IN ({marks}) GROUP BY thread_id",
                [*excluded_tags, *chunk]):
            found[thread_id] = (unread, bool(attached))
    return found


def attached_messages(conn: sqlite3.Connection, message_ids: Sequence[str]) -> set[str]:
    """Those of these messages the mirror found a file attached to."""
    found: set[str] = set()
    for chunk in chunks(message_ids):
        marks = ",".join("?" * len(chunk))
        found.update(row[0] for row in conn.execute(
            f"SELECT message_id FROM messages WHERE message_id IN ({marks}) "
            f"AND has_attachment = 1", chunk))
    return found


MIRROR_CACHE_KIB = 16384


class MirrorReader:
    """A read-only connection to the sidecar kept open across calls (opening one costs more
    than reading a page), reopened when the file is replaced, closed when it is emptied;
    None while there is no usable sidecar (not built yet, emptied, or a schema this code
    does not read), so callers read notmuch."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._key: tuple[int, int] | None = None
        self._pinned: sqlite3.Connection | None = None  # inside snapshot()
        self._opened = 0  # connections opened so far

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One read transaction around everything read inside, so the several reads of one
        tool call (a page, its total, its rows) see one state of the mirror while a sync
        commits beside them; the connection stays the same throughout."""
        conn = self.connection() if self._pinned is None else None
        if conn is None:  # no mirror, or already inside one
            yield
            return
        conn.execute("BEGIN")
        self._pinned = conn
        try:
            yield
        finally:
            self._pinned = None
            try:
                conn.execute("COMMIT")
            except sqlite3.Error:
                pass  # closed meanwhile (a replaced sidecar): nothing held

    def connection(self) -> sqlite3.Connection | None:
        if self._pinned is not None:
            return self._pinned
        st = self._file()
        if st is None:
            return None
        if self._conn is None or self._key != (st.st_dev, st.st_ino):
            self.close()
            try:
                self._conn = connect(self.path, readonly=True)
            except (SidecarError, sqlite3.Error):
                return None
            # A page touches a few hundred rows and index entries spread over the file; with
            # SQLite's default 2,000-page cache, one page's reads evict the next one's at
            # 100k messages (twice the time of a cached read).
            self._conn.execute(f"PRAGMA cache_size = -{MIRROR_CACHE_KIB}")
            self._key = (st.st_dev, st.st_ino)
            self._opened += 1
        return self._conn

    def _file(self) -> os.stat_result | None:
        """The file's status; None, the connection closed, when it holds no mirror: gone, or
        emptied (truncated, deleted and made anew).  A connection kept open on an emptied file
        keeps every writer from making it anew (SQLITE_BUSY) until it closes; once it is
        closed, the next sync migrates the file, as the server's start does, and fills it."""
        try:
            st = os.stat(self.path)
        except OSError:
            st = None
        if st is None or st.st_size == 0:
            self.close()
            return None
        return st

    def let_go_if_emptied(self) -> None:
        """Close the connection if the file is gone or emptied (see _file), before a sync."""
        if self._pinned is None:
            self._file()

    def version(self) -> tuple[int, int] | None:
        """Which state of the mirror reads see, changing with every commit another connection
        makes (PRAGMA data_version) and with every connection opened; None with no mirror."""
        conn = self.connection()
        if conn is None:
            return None
        return self._opened, conn.execute("PRAGMA data_version").fetchone()[0]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = self._key = None


def blocked_addresses(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute(
        "SELECT email_address FROM contact_info WHERE is_blocked = 1")}


def authored_by(conn: sqlite3.Connection, addresses: Sequence[str]) -> set[str]:
    """The list mail the mirror names one of these addresses (canonical) the author of: mail
    whose From the list rewrote to its own address (role 'author').  Read along the primary
    key, which starts with the address."""
    found: set[str] = set()
    for chunk in chunks(addresses):
        found.update(row[0] for row in conn.execute(
            f"SELECT message_id FROM message_addresses WHERE role = 'author' "
            f"AND email IN ({','.join('?' * len(chunk))})", chunk))
    return found


@dataclass(frozen=True)
class PreBlock:
    """A message as it was just before its sender was blocked."""

    tags: frozenset[str]
    folders: frozenset[str]  # of its files, relative to the mail root


def save_pre_block(conn: sqlite3.Connection, states: Mapping[str, PreBlock]) -> None:
    """Record how these messages are before a block changes them.  A row stays after
    unblocking -- an undone unblock blocks the message again, and its next unblock needs the
    row -- and the message's next block replaces it; it goes with the message
    (:func:`forget_pre_block`)."""
    with transaction(conn):
        conn.executemany(
            "INSERT INTO blocked_mail (message_id, tags, folders) VALUES (?, ?, ?) "
            "ON CONFLICT (message_id) DO UPDATE SET tags = excluded.tags, "
            "folders = excluded.folders",
            [(mid, json.dumps(sorted(state.tags), ensure_ascii=False),
              json.dumps(sorted(state.folders), ensure_ascii=False))
             for mid, state in states.items()])


def forget_pre_block(conn: sqlite3.Connection, message_ids: Sequence[str]) -> None:
    """Drop the records of messages gone from notmuch: nothing is left to unblock.  Called by
    the mirror when it drops them, not on every delete from ``messages`` -- a full rebuild
    empties the mirror while the mail, blocked or not, is still there."""
    for chunk in chunks(message_ids):
        marks = ", ".join("?" * len(chunk))
        conn.execute(f"DELETE FROM blocked_mail WHERE message_id IN ({marks})", chunk)


def pre_block_states(conn: sqlite3.Connection, message_ids: Sequence[str]) -> dict[str, PreBlock]:
    """The recorded pre-block state of those of these messages that have one."""
    found: dict[str, PreBlock] = {}
    for chunk in chunks(message_ids):
        marks = ", ".join("?" * len(chunk))
        for mid, tags, folders in conn.execute(
                f"SELECT message_id, tags, folders FROM blocked_mail WHERE message_id IN ({marks})",
                chunk):
            found[mid] = PreBlock(frozenset(json.loads(tags)), frozenset(json.loads(folders)))
    return found


_UID = re.compile(r"^[0-9a-f]{16}$")


def looks_like_uid(text: str) -> bool:
    return bool(_UID.match(text))


def lookup_uids(data_dir: Path, uids: Sequence[str]) -> dict[str, str]:
    """uid -> Message-ID from the sidecar in ``data_dir`` (empty when there is none yet)."""
    path = sidecar_path(data_dir)
    if not path.exists():
        return {}
    with opened(path, readonly=True) as conn:
        return resolve_uids(conn, uids)


def resolve_uids(conn: sqlite3.Connection, uids: Sequence[str]) -> dict[str, str]:
    """uid -> Message-ID for the uids the mirror knows."""
    found: dict[str, str] = {}
    for start in range(0, len(uids), 500):
        chunk = list(uids[start:start + 500])
        marks = ",".join("?" * len(chunk))
        for uid, mid in conn.execute(
                f"SELECT uid, message_id FROM messages WHERE uid IN ({marks})", chunk):
            found[uid] = mid
    return found


# ---------------------------------------------------------------------------------------------
# Audit log of writes


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: str
    action: str
    params: dict[str, Any]
    changes: list[dict[str, Any]]
    undone_at: str | None
    session: str | None = None  # the MCP session that made it; None: made outside one

    @property
    def contact_rows(self) -> list[dict[str, Any]]:
        """A contacts write's contact rows ("contact": before and after), recorded beside the
        mail changes it caused."""
        return [change for change in self.changes if "contact" in change]


_ENTRY_COLUMNS = "id, at, action, params, changes, undone_at, session"


def record_write(conn: sqlite3.Connection, action: str, params: dict[str, Any],
                 changes: list[dict[str, Any]], session: str | None = None) -> int:
    with transaction(conn):
        cur = conn.execute(
            "INSERT INTO audit_log (at, action, params, changes, session) VALUES (?, ?, ?, ?, ?)",
            (utc_stamp(), action, json.dumps(params, ensure_ascii=False),
             json.dumps(changes, ensure_ascii=False), session))
    return int(cur.lastrowid or 0)


def _entry(row: sqlite3.Row | tuple[Any, ...]) -> AuditEntry:
    return AuditEntry(id=row[0], at=row[1], action=row[2], params=json.loads(row[3]),
                      changes=json.loads(row[4]), undone_at=row[5], session=row[6])


# A write whose params carry this key is recorded but never reverted (a sent message, a saved
# draft); the value says why.  Undo marks it undone all the same, to reach the writes before
# it -- yet what it did stands.
NOT_UNDOABLE = "not_undoable"


def _reverted_upto(key: str = "") -> str:
    """The newest entry an undo saw when it reverted the entry (see mark_undone) -- for a
    change on a message (``c.value``), when it reverted that message; NULL for one undo
    passed over (see NOT_UNDOABLE)."""
    upto = ("coalesce(json_extract(c.value, '$.undone_upto'), mail_undone_upto, undone_upto)"
            if key == "message_id" else "undone_upto")
    return f"CASE WHEN json_extract(params, '$.{NOT_UNDOABLE}') IS NULL THEN {upto} END"


# An entry undo may still revert: not undone, and not a pass's own doing (params name it "by").
_LEFT_TO_UNDO = "undone_at IS NULL AND json_extract(params, '$.by') IS NULL"


def last_write(conn: sqlite3.Connection, session: str | None, *,
               others: bool = False) -> AuditEntry | None:
    """The latest write the user asked for that has not been undone, made in the MCP session
    ``session`` (None: outside any session, as the CLI writes) -- with ``others``, the latest
    made anywhere else.  An entry whose params name a pass it was made ``by`` (the blocklist
    moving new mail of a blocked sender) is fmail-nm's own doing, which undo passes over."""
    made = "session IS NOT ?" if others else "session IS ?"
    row = conn.execute(f"SELECT {_ENTRY_COLUMNS} FROM audit_log WHERE {made} "
                       f"AND {_LEFT_TO_UNDO} ORDER BY id DESC LIMIT 1", (session,)).fetchone()
    return None if row is None else _entry(row)


def write_left(conn: sqlite3.Connection, entry_id: int) -> AuditEntry | None:
    """The write ``entry_id`` if it is one the user asked for and has not been undone (see
    :func:`last_write`), whoever made it."""
    if not -2**63 <= entry_id < 2**63:  # a JSON number past SQLite's integers names no entry
        return None
    row = conn.execute(f"SELECT {_ENTRY_COLUMNS} FROM audit_log WHERE id = ? "
                       f"AND {_LEFT_TO_UNDO}",
                       (entry_id,)).fetchone()
    return None if row is None else _entry(row)


# Up to this many ids, the entries whose text holds none of them (JSON-encoded, as record_write
# wrote them) are passed over before any is read as JSON: one scan of the text per id, where
# reading every entry as JSON costs about as much as six such scans -- past that, it is cheaper.
FILTER_IDS_UP_TO = 6


def _changes_on(conn: sqlite3.Connection, where: str, params: tuple[Any, ...],
                ids: Sequence[str], key: str, order: str) -> list[tuple[Any, ...]]:
    """(entry id, action, the newest entry when it was reverted (see _reverted_upto), the
    change) of the entries ``where`` picks, per change whose ``key`` is one of ``ids``."""
    filtered = len(ids) <= FILTER_IDS_UP_TO
    if filtered:
        # Both encodings: text written with ensure_ascii and without (the needle is a
        # pre-filter only -- json_each below decides).
        needles = {json.dumps(i, ensure_ascii=ascii) for i in ids for ascii in (True, False)}
        where += " AND EXISTS (SELECT 1 FROM json_each(?) n WHERE instr(a.changes, n.value))"
        params += (json.dumps(sorted(needles)),)
    # Filtered, the entries are picked first (MATERIALIZED): joined, SQLite read each as JSON
    # before the filter; unfiltered, a copy of them would only cost time.
    rows = conn.execute(
        f"WITH a AS {'' if filtered else 'NOT '}MATERIALIZED (SELECT * FROM audit_log a "
        f"WHERE {where}) SELECT a.id, a.action, {_reverted_upto(key)}, c.value "
        "FROM a, json_each(a.changes) c WHERE json_extract(c.value, ?) "
        f"IN (SELECT value FROM json_each(?)) ORDER BY a.id {order}",
        (*params, f"$.{key}", json.dumps(list(ids)))).fetchall()
    return [(int(i), str(action), upto, json.loads(change))
            for i, action, upto, change in rows]


def later_changes(conn: sqlite3.Connection, entry_id: int, message_ids: Sequence[str],
                  key: str = "message_id") -> list[tuple[int, str, dict[str, Any]]]:
    """What the writes after entry ``entry_id`` that are not undone -- by anyone, passes
    included -- changed on ``message_ids``: (entry id, action, the message's change), oldest
    first.  ``key="contact"``: on those contacts (the contact rows of contacts writes)."""
    return [(i, action, change) for i, action, _, change in _changes_on(
        conn, "a.id > ? AND a.undone_at IS NULL", (entry_id,), message_ids, key, "ASC")]


@dataclass(frozen=True)
class EarlierChange:
    """A change an entry before another recorded on one of its messages (or contacts);
    ``undone_upto`` the newest entry its undo saw (see mark_undone), None while what it did
    stands (not undone, or passed over by undo)."""

    audit_id: int
    undone_upto: int | None
    change: dict[str, Any]

    def undone_after(self, later: int) -> bool:
        """Whether it was undone after the later entry ``later`` was made -- so that its undo
        left what that write changed again."""
        return self.undone_upto is not None and self.undone_upto >= later


def earlier_changes(conn: sqlite3.Connection, entry: AuditEntry, ids: Sequence[str],
                    key: str = "message_id") -> list[EarlierChange]:
    """What the entries before ``entry`` -- undone or not -- changed on ``ids``, newest first
    (``key`` as in :func:`later_changes`); none when no entry before it was undone after it
    was made (see EarlierChange.undone_after), as is usual: then none of them matters to its
    undo, and that is known without reading them as JSON."""
    # The partial index audit_log_undone answers this (``+id``: not the rowid's range, which
    # spans the whole log); named with INDEXED BY, the query would fail without it -- a
    # sidecar copied or mended without that index must still undo.  ``undone_upto`` is never
    # before ``mail_undone_upto`` or a change's own: it answers for the mail too.
    if conn.execute("SELECT 1 FROM audit_log WHERE undone_upto >= ? "
                    f"AND +id < ? AND {_reverted_upto()} IS NOT NULL LIMIT 1",
                    (entry.id, entry.id)).fetchone() is None:
        return []
    return [EarlierChange(i, upto, change) for i, _, upto, change in _changes_on(
        conn, "a.id < ?", (entry.id,), ids, key, "DESC")]


def newest_entry(conn: sqlite3.Connection) -> int:
    """The id of the newest audit entry (0 when there is none)."""
    return int(conn.execute("SELECT coalesce(max(id), 0) FROM audit_log").fetchone()[0])


def mark_undone(conn: sqlite3.Connection, entry_id: int, upto: int,
                reverted: Mapping[str, int] | None = None) -> None:
    """Record entry ``entry_id`` undone, its undo having seen the entries up to ``upto``
    (:func:`newest_entry` as it read what stands): one recorded after that was made after
    the undo, though recorded before this mark.  ``reverted``: as of each message, per
    Message-ID, where its revert read earlier (the mail before the contact rows, a message
    before the re-index that a retry reverted others after): the newest in
    ``mail_undone_upto``, an older one in its change's ``undone_upto``."""
    reverted = reverted or {}
    mail = max(reverted.values(), default=None)
    with transaction(conn):
        older = {mid: at for mid, at in reverted.items() if at != mail}
        if older:
            _note_reverted(conn, entry_id, older)
        conn.execute("UPDATE audit_log SET undone_at = ?, undone_upto = ?, "
                     "mail_undone_upto = ? WHERE id = ?",
                     (utc_stamp(), upto, mail, entry_id))


def _note_reverted(conn: sqlite3.Connection, entry_id: int, upto: Mapping[str, int]) -> None:
    """Each change of entry ``entry_id`` on a message of ``upto`` records the newest entry at
    its revert (read by _reverted_upto): rare, so kept in the change, not a column."""
    (changes,) = conn.execute("SELECT changes FROM audit_log WHERE id = ?",
                              (entry_id,)).fetchone()
    noted = [{**c, "undone_upto": upto[c["message_id"]]} if c.get("message_id") in upto else c
             for c in json.loads(changes)]
    conn.execute("UPDATE audit_log SET changes = ? WHERE id = ?",
                 (json.dumps(noted, ensure_ascii=False), entry_id))


def sent_at(conn: sqlite3.Connection, ref: str) -> str | None:
    """When the message with this Message-ID or uid was sent (its ``send`` entry), None if
    never.  By uid too: a message its server filed in Sent has no copy here to resolve it by."""
    for message_id, at in conn.execute("SELECT json_extract(params, '$.id'), at FROM audit_log "
                                       "WHERE action = 'send' ORDER BY id DESC"):
        if ref in (message_id, uid_for(message_id)):
            return str(at)
    return None


def send_started(conn: sqlite3.Connection, message_id: str, at: str, *,
                 seen: str | None) -> bool:
    """Record, committed before its command runs, that the draft's send began at ``at`` --
    if, under the write lock, it is still unsent and its started record is still ``seen``
    (None: none).  False, recording nothing, when another send of it began or ended since
    the caller looked: two server processes sharing this sidecar would both send it."""
    with transaction(conn):
        if sent_at(conn, message_id) is not None or started_at(conn, message_id) != seen:
            return False
        conn.execute("INSERT INTO sends_started (message_id, at) VALUES (?, ?) ON CONFLICT "
                     "(message_id) DO UPDATE SET at = excluded.at", (message_id, at))
    return True


def send_ended(conn: sqlite3.Connection, message_id: str) -> None:
    """Forget the draft's started send: it failed with nothing sent, or it was filed."""
    with transaction(conn):
        conn.execute("DELETE FROM sends_started WHERE message_id = ?", (message_id,))


def started_at(conn: sqlite3.Connection, message_id: str) -> str | None:
    """When a send of the draft began that never ended (the process killed, the command
    timed out, the filing failed): it may or may not have gone out.  None if none."""
    row = conn.execute("SELECT at FROM sends_started WHERE message_id = ?",
                       (message_id,)).fetchone()
    return None if row is None else str(row[0])


# How long the audit log keeps a write: undo_last_write reaches back this far (a held copy is
# gone after maildir.HOLD_DAYS already).  A send is kept for good: its entry refuses sending
# its draft again, and sends are few and small.
AUDIT_KEEP_DAYS = 90
# Entries one transaction of the pruning deletes, and transactions one pruning takes: the
# write lock is held a few milliseconds at a time, and a backlog goes over several passes.
PRUNE_BATCH = 50
PRUNE_BATCHES = 40


def prune_audit_log(conn: sqlite3.Connection) -> int:
    """Delete the audit entries older than ``AUDIT_KEEP_DAYS``, sends apart; how many went."""
    cutoff = utc_stamp(utc_now() - timedelta(days=AUDIT_KEEP_DAYS))
    # Most passes find nothing to prune: a read says so without taking the write lock.
    if conn.execute("SELECT 1 FROM audit_log INDEXED BY audit_log_at WHERE at < ? "
                    "AND action <> 'send' LIMIT 1", (cutoff,)).fetchone() is None:
        return 0
    removed = 0
    for _ in range(PRUNE_BATCHES):
        with transaction(conn):
            batch = conn.execute(
                "DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log INDEXED BY "
                "audit_log_at WHERE at < ? AND action <> 'send' LIMIT ?)",
                (cutoff, PRUNE_BATCH)).rowcount
        removed += batch
        if batch < PRUNE_BATCH:
            break
    return removed


def count_writes(conn: sqlite3.Connection, action: str, since: str) -> int:
    """How many writes of one kind the audit log holds from ``since`` (a utc_stamp) on,
    undone or not: the send limit counts what left, not what is still undoable."""
    row = conn.execute("SELECT count(*) FROM audit_log WHERE action = ? AND at >= ?",
                       (action, since)).fetchone()
    return int(row[0])
