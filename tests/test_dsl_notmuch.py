"""The compiled queries against a real notmuch 0.37 database (a dozen messages in a temp dir).

These prove what the pure tests can only assert textually: that every generated query parses,
means what the DSL says at date boundaries, and that no value can reach a message it names
only in its text (the `secret` message).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from fmail_nm.dsl import DslContext, DslError, compile_query

notmuch2 = pytest.importorskip("notmuch2")
NOTMUCH = shutil.which("notmuch")
pytestmark = pytest.mark.skipif(NOTMUCH is None, reason="needs the notmuch CLI")

FOLDERS = [
    "personal/INBOX",
    "personal/Archive",
    "personal/Trash",
    "work/INBOX",
    "work/Sent",
    "work/Junk",
    "work/Archive",
]
CTX = DslContext(
    now=datetime(2026, 3, 1, 1, 0, 0, tzinfo=UTC),
    accounts={"personal": "personal", "work": "work"},
    folder_roles={
        "inbox": ["personal/INBOX", "work/INBOX"],
        "sent": ["work/Sent"],
        "trash": ["personal/Trash"],
        "junk": ["work/Junk"],
        "archive": ["personal/Archive", "work/Archive"],
    },
    folders=FOLDERS,
)
WEIRD_TAGS = ['sec"ret', "a\\b", "/x/", "{y}", "we ird", "star*", "ü", "x)OR(y"]
SECRET_WORDS = {
    "zed",
    "quill",
    "zq",
    "zoe",
    "hidden",
    "invalid",
    "quarterly",
    "numbers",
    "nothing",
    "to",
    "see",
    "here",
}
# notmuch indexes a part's MIME type as words of the message ("text", "plain"): every
# message, the secret too, has them.
SECRET_WORDS |= {
    "text",
    "plain",
    "2025",
    "06",
    "01",
    "12",
    "00",
    "0000",
    "jun",
    "sun",
    "secret",
    "x",
    "me",
}  # header noise

# (message-id, folder, date, from, subject, body, tags, extra headers)
MESSAGES = [
    (
        "before@t",
        "personal/INBOX",
        "Sat, 28 Feb 2026 23:59:59 +0000",
        "Bob <bob@ex.org>",
        "boundary before",
        "plain words",
        ["inbox", "unread"],
        "",
    ),
    (
        "at@t",
        "personal/INBOX",
        "Sun, 01 Mar 2026 00:00:00 +0000",
        "Alice <alice@ex.org>",
        "boundary at",
        "lunch plans",
        ["inbox"],
        "",
    ),
    (
        "endmar@t",
        "work/INBOX",
        "Tue, 31 Mar 2026 23:59:59 +0000",
        "Carol <carol@ex.org>",
        "e-mail test",
        "status",
        ["inbox", "unread"],
        "",
    ),
    (
        "apr@t",
        "work/INBOX",
        "Wed, 01 Apr 2026 00:00:00 +0000",
        "Dave <dave@ex.org>",
        "april fools",
        "joke",
        ["inbox"],
        "",
    ),
    (
        "secret@t",
        "personal/Archive",
        "Sun, 01 Jun 2025 12:00:00 +0000",
        "Zed Quill <zq@hidden.invalid>",
        "quarterly numbers",
        "nothing to see here",
        ["secret", "archived"],
        "",
    ),
    (
        "list@t",
        "personal/INBOX",
        "Sat, 14 Mar 2026 10:00:00 +0000",
        "Rusty <rusty@ex.org>",
        "rust release",
        "new version",
        ["inbox", "list", "list/rust-users.lists.example.org"],
        "List-Id: Rust users <rust-users.lists.example.org>\n",
    ),
    (
        "spam@t",
        "work/Junk",
        "Fri, 13 Mar 2026 10:00:00 +0000",
        "Spammer <win@ex.org>",
        "you won",
        "click",
        ["spam"],
        "",
    ),
    (
        "trash@t",
        "personal/Trash",
        "Thu, 12 Mar 2026 10:00:00 +0000",
        "Old <old@ex.org>",
        "old stuff",
        "bye",
        ["deleted"],
        "",
    ),
    (
        "sent@t",
        "work/Sent",
        "Wed, 11 Mar 2026 10:00:00 +0000",
        "Me <me@ex.org>",
        "my reply",
        "thanks",
        ["sent", "replied"],
        "",
    ),
    (
        "weird@t",
        "work/Archive",
        "Tue, 10 Mar 2026 10:00:00 +0000",
        "Wendy <wendy@ex.org>",
        'Hello "world"',
        "odd tags",
        [*WEIRD_TAGS, "archived"],
        "",
    ),
]
ATTACHMENT = (
    'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="b1"\n\n'
    "--b1\nContent-Type: text/plain\n\n"
    "the plan attached\n--b1\nContent-Type: application/pdf\n"
    'Content-Disposition: attachment; filename="plan.pdf"\nContent-Transfer-Encoding: base64\n\n'
    "JVBERi0xLjQK\n--b1--\n"
)


def _write_message(
    root: Path, msg: tuple[str, str, str, str, str, str, list[str], str], n: int
) -> None:
    mid, folder, date, sender, subject, body, _tags, extra = msg
    to = "Zoe <zoe@hidden.invalid>" if mid == "secret@t" else "me@ex.org"
    head = (
        f"From: {sender}\nTo: {to}\nSubject: {subject}\nMessage-ID: <{mid}>\nDate: {date}\n{extra}"
    )
    text = head + ("\n" + body + "\n" if mid != "apr@t" else ATTACHMENT)
    for sub in ("cur", "new", "tmp"):
        (root / folder / sub).mkdir(parents=True, exist_ok=True)
    (root / folder / "cur" / f"{n}.fixture:2,S").write_text(text)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("dslmail")
    for n, msg in enumerate(MESSAGES):
        _write_message(root / "mail", msg, n)
    config = root / "notmuch-config"
    config.write_text(
        f"[database]\npath={root / 'mail'}\n[new]\ntags=new\n[maildir]\nsynchronize_flags=false\n"
    )
    environ = {**os.environ, "NOTMUCH_CONFIG": str(config)}
    subprocess.run([NOTMUCH or "notmuch", "new", "--quiet"], env=environ, check=True, timeout=60)
    with notmuch2.Database(
        str(root / "mail"),
        mode=notmuch2.Database.MODE.READ_WRITE,
        config=notmuch2.Database.CONFIG.EMPTY,
    ) as db:
        for mid, *_rest, tags, _extra in MESSAGES:
            msg = db.find(mid)
            msg.tags.discard("new")
            for tag in tags:
                msg.tags.add(tag)
    return {"NOTMUCH_CONFIG": str(config), "MAIL": str(root / "mail")}


@pytest.fixture(scope="module")
def db(env: dict[str, str]) -> Iterator[notmuch2.Database]:
    handle = notmuch2.Database(
        env["MAIL"], mode=notmuch2.Database.MODE.READ_ONLY, config=notmuch2.Database.CONFIG.EMPTY
    )
    yield handle
    handle.close()


@pytest.fixture(scope="module")
def tags_by_id(db: notmuch2.Database) -> dict[str, set[str]]:
    return {m.messageid: set(m.tags) for m in db.messages("*")}


def ids(db: notmuch2.Database, query: str, exclude: tuple[str, ...] = ()) -> set[str]:
    return {m.messageid for m in db.messages(query, exclude_tags=list(exclude))}


def search(db: notmuch2.Database, text: str, ctx: DslContext = CTX) -> set[str]:
    """What the MCP layer will do: compile, then search with the compiled exclusions."""
    compiled = compile_query(text, ctx)
    return ids(db, compiled.query, compiled.exclude_tags)


def at(*args: int) -> DslContext:
    return DslContext(now=datetime(*args, tzinfo=UTC), accounts={}, folder_roles={})


ALL_VISIBLE = {m[0] for m in MESSAGES} - {"spam@t", "trash@t"}


# --------------------------------------------------------------------------- semantics


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ALL_VISIBLE),
        ("from:alice", {"at@t"}),
        ("from:alice@ex.org", {"at@t"}),
        ("from:(alice OR bob)", {"at@t", "before@t"}),
        ("to:zoe", {"secret@t"}),
        ("cc:zoe", {"secret@t"}),
        ('subject:"boundary at"', {"at@t"}),
        ('subject:"Hello \\"world\\""', {"weird@t"}),
        ("subject:e-mail", {"endmar@t"}),
        ("e-mail", {"endmar@t"}),
        ("body:lunch", {"at@t"}),
        ("lunch", {"at@t"}),
        ("filename:plan.pdf", {"apr@t"}),
        ("filename:pdf", {"apr@t"}),
        ("has:attachment", {"apr@t"}),
        ("is:unread", {"before@t", "endmar@t"}),
        ("is:read in:inbox", {"at@t", "apr@t", "list@t"}),
        ("is:replied", {"sent@t"}),
        ("in:sent", {"sent@t"}),
        ("in:Sent", {"sent@t"}),
        ("in:archive", {"secret@t", "weird@t"}),
        ("in:personal/archive", {"secret@t"}),
        ("in:trash", {"trash@t"}),
        ("in:spam", {"spam@t"}),
        ("in:Junk", {"spam@t"}),
        ("is:spam", {"spam@t"}),
        ("tag:deleted", {"trash@t"}),
        ("in:anywhere", {m[0] for m in MESSAGES}),
        ("account:work", {"endmar@t", "apr@t", "sent@t", "weird@t"}),
        ("account:work in:anywhere", {"endmar@t", "apr@t", "sent@t", "weird@t", "spam@t"}),
        ("list:rust-users", {"list@t"}),
        ("list:rust-users@lists.example.org", {"list@t"}),
        ("list:lists.example.org", {"list@t"}),
        ("list:rust", set()),
        ("list:users", set()),
        ("id:at@t", {"at@t"}),
        ("rfc822msgid:<at@t>", {"at@t"}),
        ("from:alice OR from:bob -is:unread", {"at@t"}),
        ("{from:alice from:bob}", {"at@t", "before@t"}),
        ("plans AROUND 1 lunch", {"at@t"}),
        ("lunch AROUND plans -is:unread", {"at@t"}),
        ("lunch AROUND 3 status", set()),
        ('"lunch AROUND 1 plans"', {"at@t"}),  # quoted: the first word stays first
        ('"plans AROUND 1 lunch"', set()),
        ('"plans AROUND lunch" OR "lunch plans"', {"at@t"}),
        ("from:{alice bob} -is:unread", {"at@t"}),
        ("-is:unread -in:anywhere", set()),
        ('raw:"from:alice or from:carol"', {"at@t", "endmar@t"}),
        ('raw:"tag:spam"', {"spam@t"}),
        ("lun*", {"at@t"}),  # a word prefix
        ("BOUNDAR* -from:bob", {"at@t"}),
        ("lunch OR *", ALL_VISIBLE),
        ('"lunch \u201d OR zed OR \u201c plans"', set()),  # a curly quote ends no phrase
    ],
)
def test_semantics(db: notmuch2.Database, text: str, expected: set[str]) -> None:
    assert search(db, text) == expected


ME_CTX = replace(CTX, own_addresses=lambda received: ("me@ex.org", "Alice@EX.org"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("from:me", {"sent@t", "at@t"}),
        ("from: me is:replied", {"sent@t"}),
        ("from:(me OR bob)", {"sent@t", "at@t", "before@t"}),
        ("-from:me", ALL_VISIBLE - {"sent@t", "at@t"}),
        ("to:me", ALL_VISIBLE - {"secret@t"}),
        ("cc:me in:archive", {"weird@t"}),
        ('from:"me"', {"sent@t"}),  # in quotes, the word: the sender named "Me"
    ],
)
def test_me_is_the_users_addresses(db: notmuch2.Database, text: str, expected: set[str]) -> None:
    assert search(db, text, ME_CTX) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("after:2026-03-01", {"at@t", "endmar@t", "apr@t", "list@t", "sent@t", "weird@t"}),
        ("after:2026/03/01 before:2026-03-02", {"at@t"}),
        ("before:2026-03-01", {"before@t", "secret@t"}),
        ("on:2026-02-28", {"before@t"}),
        ("on:2026-03-01", {"at@t"}),
        ("on:2026-03 -in:archive", {"at@t", "endmar@t", "list@t", "sent@t"}),
        (
            "before:2026-04",
            {"before@t", "at@t", "endmar@t", "list@t", "sent@t", "weird@t", "secret@t"},
        ),
        ("after:2026-04", {"apr@t"}),
        ("after:2026-03-31 before:2026-04-01", {"endmar@t"}),
        ("on:2025", {"secret@t"}),
        ("after:2026 before:2026-03", {"before@t"}),
        ("after:1772323200", {"at@t", "endmar@t", "apr@t", "list@t", "sent@t", "weird@t"}),
        ("before:1772323200", {"before@t", "secret@t"}),
        ("after:1960 from:alice", {"at@t"}),
        ("before:1960", set()),
    ],
)
def test_date_boundaries(db: notmuch2.Database, text: str, expected: set[str]) -> None:
    assert search(db, text) == expected


@pytest.mark.parametrize(
    ("clock", "text", "expected"),
    [
        # Exactly one hour after at@t: its date equals the cutoff, so it is newer (inclusive).
        (
            (2026, 3, 1, 1, 0, 0),
            "newer_than:1h",
            {"at@t", "endmar@t", "apr@t", "list@t", "sent@t", "weird@t"},
        ),
        ((2026, 3, 1, 1, 0, 0), "older_than:1h", {"before@t", "secret@t"}),
        ((2026, 3, 1, 1, 0, 1), "newer_than:1h -after:2026-03-02", set()),
        ((2026, 3, 1, 1, 0, 1), "older_than:1h after:2026-02-01", {"before@t", "at@t"}),
        ((2026, 3, 2, 0, 0, 0), "newer_than:1d before:2026-03-02", {"at@t"}),
        ((2026, 3, 8, 0, 0, 0), "newer_than:1w before:2026-03-02", {"at@t"}),
        ((2026, 4, 1, 0, 0, 0), "newer_than:1m before:2026-03-02", {"at@t"}),
        ((2026, 4, 1, 0, 0, 0), "older_than:1m before:2026-03-02", {"before@t", "secret@t"}),
        ((2026, 6, 1, 12, 0, 0), "newer_than:1y before:2026", {"secret@t"}),
        ((2026, 6, 1, 12, 0, 1), "newer_than:1y before:2026", set()),
    ],
)
def test_relative_dates_with_injected_clock(
    db: notmuch2.Database, clock: tuple[int, ...], text: str, expected: set[str]
) -> None:
    assert search(db, text, at(*clock)) == expected


def test_default_exclusions_hide_spam_and_deleted(db: notmuch2.Database) -> None:
    assert "spam@t" not in search(db, "account:work")
    assert "trash@t" not in search(db, "account:personal")
    assert "trash@t" in search(db, "account:personal in:anywhere")


@pytest.mark.parametrize("tag", WEIRD_TAGS)
def test_weird_tags_match_exactly(db: notmuch2.Database, tag: str) -> None:
    quoted = '"' + tag.replace("\\", "\\\\").replace('"', '\\"') + '"'
    assert search(db, f"tag:{quoted}") == {"weird@t"}
    assert search(db, f"label:{quoted} from:wendy") == {"weird@t"}


def test_queries_paste_into_the_cli(env: dict[str, str]) -> None:
    # The query string is meant for humans too: it must work as-is with `notmuch count`.
    texts = [
        'tag:"sec\\"ret"',
        "list:rust-users",
        "after:2026-03-01 before:2026-03-02",
        "in:trash",
        "-is:unread is:inbox",
    ]
    counts = []
    for text in texts:
        query = compile_query(text, CTX).query
        out = subprocess.run(
            [NOTMUCH or "notmuch", "count", "--", query],
            env={**os.environ, "NOTMUCH_CONFIG": env["NOTMUCH_CONFIG"]},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        counts.append(int(out.stdout))
    assert counts == [1, 1, 1, 1, 3]


# --------------------------------------------------------------------------- injection


INJECTIONS = [
    'x" OR tag:secret OR "y',
    'x"" OR tag:secret OR ""y',
    ") OR (tag:secret",
    "bob) OR (tag:secret",
    "tag:secret",
    "tag:secret*",
    "is:secret",
    "thread:{tag:secret}",
    "{tag:secret}",
    "/.*/",
    "/.*",
    "*",
    '" OR * OR "',
    'sexp:"(tag secret)"',
    "\\",
    '\\"',
    "\x00tag:secret",
    "a\nOR tag:secret",
    "-",
    "*tag:secret*",
    "path:**",
    "folder:personal/Archive",
    "id:secret@t",
    "mid:/.*/",
    "date:..",
    "query:x",
    "lastmod:0..",
]
_TOKENS = [
    '"',
    '""',
    "(",
    ")",
    "*",
    "/",
    "\\",
    "{",
    "}",
    ":",
    " ",
    "-",
    "|",
    "\x00",
    "\n",
    "OR",
    "AND",
    "NOT",
    "tag:",
    "secret",
    "bob",
    "ü",
    "中",
    "is:",
    "sexp:",
    "..",
    "@",
]
VALUES = st.one_of(
    st.sampled_from(INJECTIONS),
    st.lists(st.sampled_from(_TOKENS), min_size=1, max_size=10).map("".join),
    # The whole of Unicode: Xapian drops from a phrase what its (older) Unicode tables do not
    # call a letter or digit, and a phrase left empty must never match.
    st.text(st.characters(), min_size=1, max_size=20),
)
PHRASE_OPS = ["from", "to", "cc", "bcc", "subject", "body", "filename"]


def dsl_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _words(value: str) -> set[str]:
    return {w.lower() for w in re.findall(r"\w+", value)}


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(op=st.sampled_from(PHRASE_OPS), value=VALUES)
@example(op="to", value="\U00030000")  # plane 3: no Unicode table of Xapian 1.4 has it
@example(op="to", value="\u9fd6")  # a CJK ideograph of Unicode 10
@example(op="to", value="\U00010570 \u1c90")  # Vithkuqi (14.0), Georgian Mtavruli (11.0)
@example(op="from", value="(OR)")  # no space: notmuch parses it unquoted, a syntax error
@example(op="subject", value="(and)")
@example(op="to", value="x\u201d OR tag:secret OR \u201cy")  # Xapian's other quotes
def test_phrase_values_never_reach_the_secret(db: notmuch2.Database, op: str, value: str) -> None:
    # Only a value made of the secret message's own words may match it.
    assume(not _words(value) <= SECRET_WORDS)
    try:
        compiled = compile_query(f"{op}:{dsl_quote(value)}", CTX)
    except DslError:
        return
    assert "secret@t" not in ids(db, compiled.query)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    op=st.sampled_from(["tag", "label", "id", "in", "account", "list", "thread", "is"]),
    value=VALUES,
)
def test_term_values_match_exactly(
    db: notmuch2.Database, tags_by_id: dict[str, set[str]], op: str, value: str
) -> None:
    try:
        compiled = compile_query(f"{op}:{dsl_quote(value)}", CTX)
    except DslError:
        return
    found = ids(db, compiled.query)
    if op in ("tag", "label"):
        assert found == {mid for mid, tags in tags_by_id.items() if value in tags}
    elif op == "id":
        assert found <= {value.strip("<>")}
    else:
        legit = {
            "is": {"read", "archived"},
            "in": {"archive", "personal/archive", "anywhere"},
            "account": {"personal"},
        }
        assert "secret@t" not in found or value.lower().strip("/") in legit.get(op, set())


# --------------------------------------------------------------------------- every query parses

_SOUP = st.sampled_from(
    [
        "from:",
        "to:",
        "subject:",
        "body:",
        "filename:",
        "is:",
        "in:",
        "tag:",
        "label:",
        "list:",
        "after:",
        "before:",
        "on:",
        "newer_than:",
        "older_than:",
        "id:",
        "thread:",
        "account:",
        "has:",
        "OR",
        "AND",
        "NOT",
        "-",
        "|",
        "(",
        ")",
        '"',
        "\\",
        " ",
        "*",
        ":",
        "/",
        "{",
        "}",
        "unread",
        "read",
        "inbox",
        "trash",
        "spam",
        "anywhere",
        "Archive",
        "work",
        "2026-03-01",
        "2026",
        "3d",
        "1m",
        "x",
        "e-mail",
        "tag:spam",
        "\x00",
        "\n",
        "ü",
        "@",
        ".",
        "bob@ex.org",
        "attachment",
        "0000000000000001",
        "rust-users",
    ]
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.one_of(st.lists(_SOUP, max_size=14).map("".join), st.text(max_size=30)))
def test_every_compiled_query_is_accepted_by_notmuch(db: notmuch2.Database, text: str) -> None:
    assume("raw:" not in text.lower())  # raw: is the user's own notmuch syntax, by design
    try:
        compiled = compile_query(text, CTX)
    except DslError:
        return
    db.count_messages(compiled.query, exclude_tags=list(compiled.exclude_tags))


INLINE_PDF = (
    "From: Apple Mail <a@ex.org>\nTo: me@ex.org\nSubject: the invoice\nMessage-ID: <inline-pdf@t>\n"
    "Date: Mon, 02 Mar 2026 10:00:00 +0000\nMIME-Version: 1.0\n"
    'Content-Type: multipart/mixed; boundary="b1"\n\n--b1\nContent-Type: text/plain\n\nhere\n'
    '--b1\nContent-Type: application/pdf; name="inv.pdf"\n'
    'Content-Disposition: inline; filename="inv.pdf"\nContent-Transfer-Encoding: base64\n\n'
    "JVBERi0xLjQK\n--b1--\n"
)


INLINE_FORWARD = (
    "From: d@ex.org\nSubject: Fwd: minutes\nMessage-ID: <inline-forward@t>\nMIME-Version: 1.0\n"
    'Content-Type: multipart/mixed; boundary="b1"\n\n--b1\nContent-Type: text/plain\n\nbelow\n'
    "--b1\nContent-Type: message/rfc822\nContent-Disposition: inline\n\n"
    "From: e@ex.org\nSubject: minutes\nMessage-ID: <minutes@t>\n\nthe minutes\n--b1--\n"
)


def _indexed(tmp_path: Path, *messages: str) -> Path:
    """A notmuch database of the messages, one file each; its mail root."""
    (tmp_path / "mail" / "cur").mkdir(parents=True)
    for n, message in enumerate(messages, 1):
        (tmp_path / "mail" / "cur" / f"{n}.x:2,S").write_text(message)
    config = tmp_path / "notmuch-config"
    config.write_text(f"[database]\npath={tmp_path / 'mail'}\n")
    subprocess.run([NOTMUCH or "notmuch", "new", "--quiet"], check=True, timeout=60,
                   env={**os.environ, "NOTMUCH_CONFIG": str(config)})
    return tmp_path / "mail"


def test_has_finds_a_pdf_sent_inline_and_an_invitation(tmp_path: Path) -> None:
    """Apple Mail sends files with "Content-Disposition: inline", which notmuch does not tag
    attachment; a PDF is found by its type, and so are a forward sent inline and an
    invitation, which get_email lists as attachments too. An invitation is found by its own."""
    mail = _indexed(
        tmp_path, INLINE_PDF, "From: b@ex.org\nSubject: plain\nMessage-ID: <plain@t>\n\nno file\n",
        "From: c@ex.org\nSubject: sprint review\nMessage-ID: <invite@t>\nMIME-Version: 1.0\n"
        "Content-Type: text/calendar; method=REQUEST\n\nBEGIN:VCALENDAR\nBEGIN:VEVENT\n"
        "SUMMARY:Review\nEND:VEVENT\nEND:VCALENDAR\n",
        INLINE_FORWARD)
    with notmuch2.Database(str(mail), config=notmuch2.Database.CONFIG.EMPTY) as db:
        assert ids(db, "tag:attachment") == set()
        assert search(db, "has:attachment") == {"inline-pdf@t", "inline-forward@t", "invite@t"}
        assert search(db, "has:invitation") == {"invite@t"}
        assert search(db, "filename:pdf") == search(db, "filename:.PDF") == {"inline-pdf@t"}
        assert search(db, "filename:inv.pdf") == set()  # an inline file's name: not indexed


def _plain(mid: str, subject: str, body: str) -> str:
    return (f"From: ops@ex.org\nSubject: {subject}\nMessage-ID: <{mid}>\nMIME-Version: 1.0\n"
            f"Content-Type: text/plain; charset=utf-8\n\n{body}\n")


def test_what_notmuch_finds_as_typed_the_dsl_finds(tmp_path: Path) -> None:
    mail = _indexed(tmp_path, _plain("stars@t", "Server down ***", "The server is down."),
                    _plain("euro@t", "Rechnung 100 €", "Bitte zahlen."),
                    _plain("tokens@t", "Build notes",
                           "foo_bar_baz, x_yz, the cafe\u0301teria, ΟΔΟΣ and İstanbul"),
                    _plain("joined@t", "Call", "qux_bar met O'Brien of AT&T on version 3.5"),
                    _plain("split@t", "Call", "qux bar met OBrien, Brie of AT T on 3 5 x.org"))
    cases = {
        # Words Xapian joins with ' & (and . between digits), as one word or its prefix.
        "O'Brie*": {"joined@t"}, "at&t*": {"joined@t"}, "3.5*": {"joined@t"},
        "O'Brien": {"joined@t"},
        # Prefixes of the words notmuch indexes, lowercased as Xapian does.
        "ΟΔΟΣ*": {"tokens@t"}, "İstanbu*": {"tokens@t"}, "foo_bar*": {"tokens@t"},
        "cafe\u0301t*": {"tokens@t"}, "x_y*": {"tokens@t"},
        # A symbol or invisible character among words: notmuch ignores it.
        "Rechnung 100 €": {"euro@t"}, "Rechnung \u200b 100": {"euro@t"},
    }
    with notmuch2.Database(str(mail), config=notmuch2.Database.CONFIG.EMPTY) as db:
        for text, expected in cases.items():
            assert ids(db, text) == expected, text
            assert search(db, text) == expected, text
        # The words themselves, which notmuch lowercases itself, in quotes or next to NEAR.
        assert search(db, "ΟΔΟΣ AROUND 2 İstanbul") == search(db, "ΟΔΟΣ") == {"tokens@t"}
        assert search(db, "qux_bar AROUND 7 3.5") == {"joined@t"}
        assert search(db, "qux_bar AROUND 6 3.5") == set()
        assert search(db, "at&t AROUND 2 O'Brien") == {"joined@t"}
        assert search(db, '"version AROUND 1 3.5"') == {"joined@t"}
        # In quotes, a star is punctuation of the phrase.
        assert search(db, 'subject:"Server down ***"') == {"stars@t"}
