"""Pure tests of the search DSL compiler (no notmuch needed; see test_dsl_notmuch.py)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fmail_nm.dsl import (
    DSL_HELP,
    MAX_DEPTH,
    MAX_QUERY_CHARS,
    MAX_TOKENS,
    CompiledQuery,
    DslContext,
    DslError,
    compile_query,
    list_names,
)

NOW = datetime(2026, 3, 15, 12, 0, 0, tzinfo=UTC)
FOLDERS = [
    "personal/INBOX",
    "personal/Archive",
    "personal/Trash",
    "personal/Receipts",
    "work/INBOX",
    "work/Sent",
    "work/Junk",
    "work/Archive",
    "work/Drafts",
]
CTX = DslContext(
    now=NOW,
    accounts={"personal": "personal", "work": "work/"},
    folder_roles={
        "inbox": ["personal/INBOX", "work/INBOX"],
        "sent": ["work/Sent"],
        "drafts": ["work/Drafts"],
        "trash": ["personal/Trash"],
        "junk": ["work/Junk"],
        "archive": ["personal/Archive", "work/Archive"],
    },
    folders=FOLDERS,
)
BARE_CTX = DslContext(now=NOW, accounts={"solo": ""}, folder_roles={})
DEFAULT_EXCLUDED = ("deleted", "spam")


def q(text: str, ctx: DslContext = CTX) -> str:
    return compile_query(text, ctx).query


def excluded(text: str, ctx: DslContext = CTX) -> tuple[str, ...]:
    return compile_query(text, ctx).exclude_tags


def err(text: str, ctx: DslContext = CTX) -> DslError:
    with pytest.raises(DslError) as info:
        compile_query(text, ctx)
    return info.value


def epoch(*args: int, tz: timezone | ZoneInfo = UTC) -> int:
    return int(datetime(*args, tzinfo=tz).timestamp())


# --------------------------------------------------------------------------- text and fields


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "*"),
        ("   \t\n", "*"),
        ("*", "*"),
        ("hello", '"hello"'),
        ('"hello world"', '"hello world"'),
        ("e-mail", '"e-mail"'),
        ("hello world", '"hello" AND "world"'),
        ('"say \\"hi\\""', '"say hi"'),
        ("café 中文", '"café" AND "中文"'),
        ("https://example.org/a", '"https: example.org a"'),
        ("10:30", '"10:30"'),
        ("T10:30", '"T10:30"'),
        ("foo - bar", '"foo" AND "bar"'),
        ("!!! foo", '"foo"'),
        ("a&b", '"a&b"'),
    ],
)
def test_full_text(text: str, expected: str) -> None:
    assert q(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("from:alice", 'from:"alice"'),
        ("from:alice@example.org", 'from:"alice@example.org"'),
        ('from:"Alice Liddell"', 'from:"Alice Liddell"'),
        ("From:alice", 'from:"alice"'),
        ("to:bob", 'to:"bob"'),
        ("cc:carol", 'to:"carol"'),
        ("bcc:dave", 'to:"dave"'),
        ("subject:invoice", 'subject:"invoice"'),
        ('subject:"Q3 report"', 'subject:"Q3 report"'),
        ("body:lunch", 'body:"lunch"'),
        ("filename:pdf", 'attachment:"pdf" OR mimetype:"application/pdf"'),
        ("filename:plan.pdf", 'attachment:"plan.pdf"'),
        ("from: alice", 'from:"alice"'),
        ('from: "Alice L"', 'from:"Alice L"'),
    ],
)
def test_phrase_fields(text: str, expected: str) -> None:
    assert q(text) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # Characters that notmuch's from:/subject: processor would reinterpret are blanked:
        # none of them is ever part of a word, so the phrase matches the same words.
        ('x\\" OR tag:secret OR \\"y', 'from:"x OR tag:secret OR y"'),
        ("x\u201c OR tag:secret OR \u201dy", 'from:"x OR tag:secret OR y"'),  # “ ”
        ("bob) OR (tag:x", 'from:"bob OR tag:x"'),
        ("(OR)", 'from:"OR"'),
        ("/a.*b/", 'from:"a. b"'),
        ("/abc", 'from:"abc"'),
        ("tag:secret*", 'from:"tag:secret"'),
        ("tag:sec*ret", 'from:"tag:sec ret"'),
        ("a\x00b\nc\td", 'from:"a b c d"'),
        ("back\\\\slash", 'from:"back\\slash"'),
    ],
)
def test_phrase_values_cannot_escape(value: str, expected: str) -> None:
    assert q(f'from:"{value}"') == expected


def test_phrase_value_without_words_is_an_error() -> None:
    e = err('subject:"!!!"')
    assert e.position == 8
    assert "letters or digits" in e.expected


@pytest.mark.parametrize("text", ['from:"0\ud800"', "tag:\udfff", "x \ud83d", 'raw:"tag:\ud800"'])
def test_a_lone_surrogate_is_an_error(text: str) -> None:
    # JSON can carry one ("\ud800"); notmuch cannot encode it.
    assert "surrogate" in err(text).expected


@pytest.mark.parametrize("value", ["\U00030000", "\u9fd6\u9fd7", "\U00010570 !", "\u1c90"])
def test_phrase_value_of_letters_xapian_does_not_index_is_an_error(value: str) -> None:
    # Letters to Python's Unicode tables, not to Xapian's: the phrase would be left empty.
    assert "letters or digits" in err(f'to:"{value}"').expected
    assert q(f'to:"{value}a"') == f'to:"{value}a"'  # with one it does index, the value stays


@pytest.mark.parametrize("value", ["\u0234", "\U00030000", "\u9fd6\u9fd7", "\u1c90"])
@pytest.mark.parametrize("form", ['"{}"', "{}", 'a "{}"', '-"{}"'])
def test_a_search_word_of_letters_xapian_may_not_index_is_an_error(value: str, form: str) -> None:
    # Dropped like punctuation, it would leave the search without it: all mail, or "a" alone
    # (ȴ is a letter since Unicode 4.0; found by the --runslow DSL fuzz suite).
    assert "newer than Unicode 3.2" in err(form.format(value)).expected
    assert q(f'"{value}a"') == f'"{value}a"'


def test_punctuation_alone_is_ignored_as_gmail_does() -> None:
    assert q('a "!!!"') == q("a - :") == '"a"'


@pytest.mark.parametrize("text", ["😀", '"😀"', "-", ":", '""', "\\", "#", "-!!!", "(!!!)",
                                  "!!! OR ??"])
def test_a_search_with_nothing_to_search_is_refused(text: str) -> None:
    """Every term ignored left "all mail"; notmuch finds nothing for an emoji.  Only an
    empty search (or notmuch's `*`) is all mail."""
    assert err(text).position == 0
    assert q("") == q("*") == "*"


@pytest.mark.parametrize("text", ["invoice 😀", 'invoice "😀"', "invoice €", "invoice OR ™",
                                  "invoice -😀", "invoice \u200b", "invoice \ufe0f",
                                  "invoice \u2764\ufe0f", "€ invoice →"])
def test_a_symbol_among_words_is_ignored_as_notmuch_does(text: str) -> None:
    # notmuch indexes no symbol, emoji or invisible character: like punctuation, it is no
    # part of what a search can find.
    assert q(text) == '"invoice"'
    assert q("invoice 😀x") == '"invoice" AND "😀x"'


@pytest.mark.parametrize(("text", "expected"), [
    ("invo*", "invo*"),
    ("Invo* -paid", 'invo* AND NOT "paid"'),
    ("from:anna (inv* OR rech*)", 'from:"anna" AND (inv* OR rech*)'),
    ("über*", "über*"),
    # Xapian lowercases each character on its own: a final Σ is σ, İ is i.
    ("ΟΔΟΣ*", "οδοσ*"),
    ("İstanbu*", "istanbu*"),
    # Marks and connectors are part of a word to Xapian; the length counts letters, digits
    # and _ (a word character: x_y* is three).
    ("foo_bar*", "foo_bar*"),
    ("cafe\u0301t*", "cafe\u0301t*"),
    ("ab_c*", "ab_c*"),
    ("x_y*", "x_y*"),
    ("ab_*", "ab_*"),
    # Joined into one word as Xapian joins them: ' & anywhere, . , between digits.
    ("O'Brie*", "o'brie*"),
    ("rock\u2019n\u2019ro*", "rock\u2019n\u2019ro*"),
    ("AT&T*", "at&t*"),
    ("3.5*", "3.5*"),
    ("1,000*", "1,000*"),
])
def test_a_trailing_star_searches_words_starting_with_the_word(text: str, expected: str) -> None:
    assert q(text) == expected


@pytest.mark.parametrize("text", ["in*", "e-mail*", "and*", "invo**", "**", "*invo*", "x_*",
                                  "e\u0301\u0301\u0301*", "o'*", "o''brie*", "'brie*", "inv€*",
                                  "\u30fbabc*", "x.org*", "3'5*", "3.*"])
def test_a_star_after_anything_but_a_plain_word_is_an_error(text: str) -> None:
    assert "before a trailing '*'" in err(text).expected


@pytest.mark.parametrize("text", ["x.org*", "e-mail*", "3'5*"])
def test_a_star_after_a_word_xapian_splits_says_to_quote_it(text: str) -> None:
    # Xapian would search the parts as a phrase and drop the star: the phrase is what works.
    assert "quote other punctuation for the phrase" in err(text).expected


@pytest.mark.parametrize("text", ["from:anna*", "body:(inv* OR x)", "subject: invo*"])
def test_unquoted_field_values_are_whole_words(text: str) -> None:
    assert "whole words" in err(text).expected


@pytest.mark.parametrize(("text", "expected"), [
    ('subject:"Server down ***"', 'subject:"Server down"'),
    ('subject:"invo*"', 'subject:"invo"'),
    ('body:("inv*" OR x)', 'body:"inv" OR body:"x"'),
])
def test_a_star_in_a_quoted_field_value_is_punctuation_of_the_phrase(text: str,
                                                                     expected: str) -> None:
    assert q(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("from:(alice OR bob)", 'from:"alice" OR from:"bob"'),
        ("subject:(dinner movie)", 'subject:"dinner" AND subject:"movie"'),
        ('subject:("q3 report" -draft)', 'subject:"q3 report" AND NOT subject:"draft"'),
        ("from:(alice to:bob)", 'from:"alice" AND to:"bob"'),
        ("is:(unread OR flagged)", 'tag:"unread" OR tag:"flagged"'),
        ("from: (a OR b) c", '(from:"a" OR from:"b") AND "c"'),
    ],
)
def test_field_groups(text: str, expected: str) -> None:
    assert q(text) == expected


# --------------------------------------------------------------------------- is:, has:, tags


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("unread", 'tag:"unread"'),
        ("read", 'NOT tag:"unread"'),
        ("flagged", 'tag:"flagged"'),
        ("starred", 'tag:"flagged"'),
        ("sent", 'tag:"sent"'),
        ("outgoing", 'tag:"sent"'),
        ("replied", 'tag:"replied"'),
        ("forwarded", 'tag:"passed"'),
        ("passed", 'tag:"passed"'),
        ("draft", 'tag:"draft"'),
        ("blocked", 'tag:"blocked"'),
        ("spam", 'tag:"spam"'),
        ("deleted", 'tag:"deleted"'),
        ("inbox", 'tag:"inbox"'),
        ("archived", 'tag:"archived"'),
        ("list", 'tag:"list"'),
        ("UNREAD", 'tag:"unread"'),
    ],
)
def test_is(value: str, expected: str) -> None:
    assert q(f"is:{value}") == expected


def test_is_unknown_lists_values() -> None:
    e = err("is:important")
    assert e.position == 3
    assert "is:unread" in e.expected and "is:starred" in e.expected
    assert e.got == "'important'"


HAS_ATTACHMENT = ('tag:"attachment" OR mimetype:"application/pdf" OR mimetype:"message/rfc822" '
                  'OR mimetype:"text/calendar" OR mimetype:"application/ics"')


def test_has() -> None:
    assert q("has:attachment") == HAS_ATTACHMENT
    assert q("has:attachments") == HAS_ATTACHMENT
    e = err("has:drive")
    assert (e.position, e.expected) == (4, "has:attachment or has:invitation")
    assert q("has:invitation") == 'mimetype:"text/calendar" OR mimetype:"application/ics"'
    assert q("filename:pdf") == 'attachment:"pdf" OR mimetype:"application/pdf"'
    assert q("filename:report.pdf") == 'attachment:"report.pdf"'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tag:work", 'tag:"work"'),
        ("label:work", 'tag:"work"'),
        ("tag:Work", 'tag:"Work"'),
        ('tag:"we ird"', 'tag:"we ird"'),
        ("tag:list/rust-users.example.org", 'tag:"list/rust-users.example.org"'),
        ('tag:"x)OR(y"', 'tag:"x)OR(y"'),
        # Values that notmuch's tag processor would read as regex or wildcard go out as sexp,
        # whose quoted strings are always literal.
        ('tag:"sec\\"ret"', 'sexp:"(tag ""sec\\""ret"")"'),
        ("tag:/x/", 'sexp:"(tag ""/x/"")"'),
        ("tag:star*", 'sexp:"(tag ""star*"")"'),
        ("tag:{y}", 'sexp:"(tag ""{y}"")"'),
        ('tag:"a\\\\b"', 'tag:"a\\b"'),
        ('tag:"a\\\\b\\""', 'sexp:"(tag ""a\\\\b\\"""")"'),
    ],
)
def test_tags(text: str, expected: str) -> None:
    assert q(text) == expected


def test_tag_with_control_character_is_an_error() -> None:
    e = err('tag:"a\nb"')
    assert e.position == 4
    assert "control characters" in e.expected


# --------------------------------------------------------------------------- in:, account:, list:


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("in:inbox", 'tag:"inbox"'),
        ("in:INBOX", 'tag:"inbox"'),
        ("in:sent", 'folder:"work/Sent" OR tag:"sent"'),
        ("in:drafts", 'folder:"work/Drafts" OR tag:"draft"'),
        ("in:draft", 'folder:"work/Drafts" OR tag:"draft"'),
        ("in:trash", 'folder:"personal/Trash" OR tag:"deleted"'),
        ("in:spam", 'folder:"work/Junk" OR tag:"spam"'),
        ("in:junk", 'folder:"work/Junk" OR tag:"spam"'),
        ("in:archive", 'folder:"personal/Archive" OR folder:"work/Archive" OR tag:"archived"'),
        ("in:anywhere", "*"),
        ("in:anywhere from:bob", 'from:"bob"'),
        ("in:Receipts", 'folder:"personal/Receipts"'),
        ("in:receipts", 'folder:"personal/Receipts"'),
        ("in:personal/receipts", 'folder:"personal/Receipts"'),
        ("in:work/archive", 'folder:"work/Archive"'),
        ("in:work/Junk", 'folder:"work/Junk"'),
    ],
)
def test_in(text: str, expected: str) -> None:
    assert q(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("in:sent", 'tag:"sent"'),
        ("in:trash", 'tag:"deleted"'),
        ("in:spam", 'tag:"spam"'),
        ("in:drafts", 'tag:"draft"'),
        ("in:archive", 'tag:"archived"'),
    ],
)
def test_in_role_without_folders_is_the_tag(text: str, expected: str) -> None:
    assert q(text, BARE_CTX) == expected


def test_in_role_accepts_spam_key_for_junk() -> None:
    ctx = DslContext(now=NOW, accounts={}, folder_roles={"spam": ["x/Spam"]}, folders=["x/Spam"])
    assert q("in:junk", ctx) == 'folder:"x/Spam" OR tag:"spam"'


def test_in_folder_with_odd_name() -> None:
    ctx = DslContext(now=NOW, accounts={}, folder_roles={}, folders=['a/Say "hi"', "a/Sent Items"])
    assert q('in:"say \\"hi\\""', ctx) == 'sexp:"(folder ""a/Say \\""hi\\"""")"'
    assert q('in:"sent items"', ctx) == 'folder:"a/Sent Items"'


def test_in_unknown_folder_lists_known_ones() -> None:
    e = err("from:x in:Nowhere")
    assert e.position == 10
    assert "in:inbox" in e.expected and "personal/Receipts" in e.expected
    assert e.got == "'Nowhere'"


def test_in_unknown_folder_list_is_bounded() -> None:
    many = [f"acct/F{i:03}" for i in range(200)]
    ctx = DslContext(now=NOW, accounts={}, folder_roles={}, folders=many)
    e = err("in:nope", ctx)
    assert "more)" in e.expected and len(e.expected) < 1000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("account:work", 'path:"work/**"'),
        ("account:Personal", 'path:"personal/**"'),
        ("account:work is:unread", 'path:"work/**" AND tag:"unread"'),
    ],
)
def test_account(text: str, expected: str) -> None:
    assert q(text) == expected


def test_account_at_mail_root_is_no_restriction() -> None:
    assert q("account:solo", BARE_CTX) == "*"


def test_account_with_odd_prefix_uses_sexp() -> None:
    ctx = DslContext(now=NOW, accounts={"odd": "we*ird"}, folder_roles={})
    assert q("account:odd", ctx) == 'sexp:"(path ""we*ird/**"")"'


def test_account_unknown() -> None:
    e = err("account:gmail")
    assert e.position == 8
    assert "personal, work" in e.expected


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("list:rust-users", "rust-users"),
        ("list:Rust-Users", "rust-users"),
        ("list:rust-users@lists.example.org", "rust-users\\.lists\\.example\\.org"),
        ("list:<rust-users.lists.example.org>", "rust-users\\.lists\\.example\\.org"),
        ("list:a+b", "a\\+b"),
    ],
)
def test_list(text: str, pattern: str) -> None:
    assert q(text) == f'tag:"/^list/(.*\\.)?{pattern}(\\..*)?$/"'


@pytest.mark.parametrize("value", ['"a b"', "a*", "a/b", '"x/"', "(", ".x"])
def test_list_rejects_non_list_ids(value: str) -> None:
    with pytest.raises(DslError):
        compile_query(f"list:{value}", CTX)


def test_list_names_are_the_fewest_first_labels_that_list_finds_alone() -> None:
    known = ["golang-nuts.googlegroups.com", "announce.python.org", "announce.rust-lang.org",
             "python.org", "iiu.iiu.taint.org", "Odd.example.org", "x.example.org"]
    assert list_names([*known, "gone.example.org"], known) == {
        "golang-nuts.googlegroups.com": "golang-nuts",
        "announce.python.org": "announce.python",  # list:announce finds two lists
        "announce.rust-lang.org": "announce.rust-lang",
        "iiu.iiu.taint.org": "iiu",  # one list holds the label twice
        "x.example.org": "x",
    }  # list:python.org finds announce.python.org too: no name finds python.org alone;
    # list: takes no capitals; a list not among the known ones is not named


def test_a_list_name_finds_its_list_alone() -> None:
    """The names are what list: matches: whole labels anywhere in the List-Id."""
    known = ["dev.example.org", "example.dev.net", "user.dev.org"]
    names = list_names(known, known)
    for list_id, name in names.items():
        pattern = re.compile(q(f"list:{name}").removeprefix('tag:"/').removesuffix('/"'))
        assert [k for k in known if pattern.search(f"list/{k}")] == [list_id], name
    assert names == {"dev.example.org": "dev.example", "example.dev.net": "example.dev",
                     "user.dev.org": "user"}


# --------------------------------------------------------------------------- ids and raw


def test_ids() -> None:
    assert q("id:abc@example.org") == 'id:"abc@example.org"'
    assert q("id:<abc@example.org>") == 'id:"abc@example.org"'
    assert q("rfc822msgid:abc@x") == 'id:"abc@x"'
    assert q('id:"/weird{id}@x"') == 'sexp:"(id ""/weird{id}@x"")"'
    assert q("thread:0000000000000a1f") == 'thread:"0000000000000a1f"'
    assert q("thread:thread:00ab") == 'thread:"00ab"'
    assert err("id:<>").position == 3
    e = err('thread:"{tag:secret}"')
    assert e.position == 7 and "thread id" in e.expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('raw:"tag:foo and not tag:bar"', "(tag:foo and not tag:bar)"),
        ("raw:tag:foo", "(tag:foo)"),
        ('raw:"*"', "*"),
        ('from:bob raw:"date:2w.."', 'from:"bob" AND (date:2w..)'),
        ('raw:"subject:\\"(a\\""', '(subject:"(a")'),
    ],
)
def test_raw(text: str, expected: str) -> None:
    assert q(text) == expected


@pytest.mark.parametrize(
    "text", ['raw:"a) OR (b"', 'raw:"(a"', 'raw:"a)"', 'raw:"\\"a"', 'raw:"  "', 'raw:"a\x00"']
)
def test_raw_errors(text: str) -> None:
    assert err(text).position == 4


# --------------------------------------------------------------------------- dates


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("after:2026-03-01", f"date:@{epoch(2026, 3, 1)}.."),
        ("after:2026/03/01", f"date:@{epoch(2026, 3, 1)}.."),
        ("after:2026/3/1", f"date:@{epoch(2026, 3, 1)}.."),
        ("newer:2026-03-01", f"date:@{epoch(2026, 3, 1)}.."),
        ("after:2026-03", f"date:@{epoch(2026, 3, 1)}.."),
        ("after:2026", f"date:@{epoch(2026, 1, 1)}.."),
        ("before:2026-03-01", f"date:..@{epoch(2026, 3, 1) - 1}"),
        ("older:2026-03-01", f"date:..@{epoch(2026, 3, 1) - 1}"),
        ("before:2026/04", f"date:..@{epoch(2026, 4, 1) - 1}"),
        ("before:2026", f"date:..@{epoch(2026, 1, 1) - 1}"),
        ("on:2026-03-15", f"date:@{epoch(2026, 3, 15)}..@{epoch(2026, 3, 16) - 1}"),
        ("on:2026-02-28", f"date:@{epoch(2026, 2, 28)}..@{epoch(2026, 3, 1) - 1}"),
        ("on:2026-12-31", f"date:@{epoch(2026, 12, 31)}..@{epoch(2027, 1, 1) - 1}"),
        ("on:2026-12", f"date:@{epoch(2026, 12, 1)}..@{epoch(2027, 1, 1) - 1}"),
        ("on:2024", f"date:@{epoch(2024, 1, 1)}..@{epoch(2025, 1, 1) - 1}"),
        ("after:1772323200", "date:@1772323200.."),
        ("before:1772323200", "date:..@1772323199"),
        ("after:1960", "date:@0.."),
        ("after:0001-01-01", "date:@0.."),
        ("before:1970-01-01", 'sexp:"(not ())"'),
        ("before:1970-01-01 OR tag:x", 'tag:"x"'),
        ("after:9999-12-31", f"date:@{epoch(9999, 12, 31)}.."),
        ("before:9999", f"date:..@{epoch(9999, 1, 1) - 1}"),
        ("on:9999", f"date:@{epoch(9999, 1, 1)}..@253402387199"),
        ("on:2024-02-29", f"date:@{epoch(2024, 2, 29)}..@{epoch(2024, 3, 1) - 1}"),
        (
            "after:2026-01-01 before:2026-02-01",
            f"date:@{epoch(2026, 1, 1)}.. AND date:..@{epoch(2026, 2, 1) - 1}",
        ),
    ],
)
def test_absolute_dates(text: str, expected: str) -> None:
    assert q(text) == expected


def test_after_and_before_partition_time() -> None:
    after = q("after:2026-03-01").removeprefix("date:@").removesuffix("..")
    before = q("before:2026-03-01").removeprefix("date:..@")
    assert int(after) == int(before) + 1


def test_dates_use_the_clock_time_zone() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    ctx = DslContext(now=datetime(2026, 3, 15, tzinfo=berlin), accounts={}, folder_roles={})
    assert q("after:2026-03-01", ctx) == f"date:@{epoch(2026, 3, 1, tz=berlin)}.."
    assert epoch(2026, 3, 1, tz=berlin) == epoch(2026, 2, 28, 23)
    # 2026-03-29 is the day Berlin switches to summer time: it lasts 23 hours.
    start, end = epoch(2026, 3, 29, tz=berlin), epoch(2026, 3, 30, tz=berlin)
    assert end - start == 23 * 3600
    assert q("on:2026-03-29", ctx) == f"date:@{start}..@{end - 1}"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-02-30", "a real calendar date"),
        ("2026-13", "a real calendar date"),
        ("2026-00-10", "a real calendar date"),
        ("0000", "a real calendar date"),
        ("2025-02-29", "a real calendar date"),
        ("tomorrow", "a date like"),
        ("2026-03/01", "a date like"),
        ("26-03-01", "a date like"),
        ("2026-3-1x", "a date like"),
        ("3d", "a date like"),
    ],
)
def test_bad_dates(value: str, expected: str) -> None:
    e = err(f"after:{value}")
    assert e.position == 6
    assert e.expected.startswith(expected)


@pytest.mark.parametrize(
    ("text", "cutoff"),
    [
        ("newer_than:1h", epoch(2026, 3, 15, 11)),
        ("newer_than:36h", epoch(2026, 3, 14, 0)),
        ("newer_than:3d", epoch(2026, 3, 12, 12)),
        ("newer_than:3D", epoch(2026, 3, 12, 12)),
        ("newer_than:2w", epoch(2026, 3, 1, 12)),
        ("newer_than:1m", epoch(2026, 2, 15, 12)),
        ("newer_than:1M", epoch(2026, 2, 15, 12)),
        ("newer_than:3m", epoch(2025, 12, 15, 12)),
        ("newer_than:15m", epoch(2024, 12, 15, 12)),
        ("newer_than:1y", epoch(2025, 3, 15, 12)),
        ("newer_than:0d", epoch(2026, 3, 15, 12)),
    ],
)
def test_newer_than(text: str, cutoff: int) -> None:
    assert q(text) == f"date:@{cutoff}.."
    # older_than is the exact complement: strictly before the same cutoff.
    assert q(text.replace("newer", "older")) == f"date:..@{cutoff - 1}"


def test_relative_months_clamp_to_month_end() -> None:
    ctx = DslContext(now=datetime(2026, 3, 31, 8, 30, tzinfo=UTC), accounts={}, folder_roles={})
    assert q("newer_than:1m", ctx) == f"date:@{epoch(2026, 2, 28, 8, 30)}.."
    leap = DslContext(now=datetime(2028, 2, 29, tzinfo=UTC), accounts={}, folder_roles={})
    assert q("older_than:1y", leap) == f"date:..@{epoch(2027, 2, 28) - 1}"


def test_relative_ignores_sub_second_clock() -> None:
    ctx = DslContext(
        now=datetime(2026, 3, 15, 12, 0, 0, 999999, tzinfo=UTC), accounts={}, folder_roles={}
    )
    assert q("newer_than:1h", ctx) == f"date:@{epoch(2026, 3, 15, 11)}.."


def test_relative_in_other_zone_keeps_wall_clock_for_months() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    ctx = DslContext(now=datetime(2026, 4, 15, 12, tzinfo=berlin), accounts={}, folder_roles={})
    assert q("newer_than:1m", ctx) == f"date:@{epoch(2026, 3, 15, 12, tz=berlin)}.."


@pytest.mark.parametrize("text", ["newer_than:999999y", "newer_than:60y", "newer_than:999999d"])
def test_huge_periods_clamp_to_the_epoch(text: str) -> None:
    assert q(text) == "date:@0.."
    assert q(text.replace("newer", "older")) == 'sexp:"(not ())"'


@pytest.mark.parametrize("value", ["3", "d", "3x", "3min", "-3d", "1.5d", "1234567d", "3 d"])
def test_bad_periods(value: str) -> None:
    e = err(f'newer_than:"{value}"')
    assert e.position == 11
    assert "period" in e.expected


# --------------------------------------------------------------------------- logic


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a b", '"a" AND "b"'),
        ("a AND b", '"a" AND "b"'),
        ("a OR b", '"a" OR "b"'),
        ("a | b", '"a" OR "b"'),
        ("a|b", '"a" OR "b"'),
        ("a or b", '"a" AND "or" AND "b"'),
        ("-a", 'NOT "a"'),
        ("NOT a", 'NOT "a"'),
        ("--a", '"a"'),
        ("NOT -a", '"a"'),
        ("a -b", '"a" AND NOT "b"'),
        ("-a b", '"b" AND NOT "a"'),
        ("-a -b", '(NOT "a") AND NOT "b"'),
        ("a b OR c", '("a" AND "b") OR "c"'),
        ("a OR b c", '"a" OR ("b" AND "c")'),
        ("a OR b AND c OR d", '"a" OR ("b" AND "c") OR "d"'),
        ("NOT a b", '"b" AND NOT "a"'),
        ("NOT a OR b", '(NOT "a") OR "b"'),
        ("-(a OR b) c", '"c" AND NOT ("a" OR "b")'),
        ("(a OR b) (c OR d)", '("a" OR "b") AND ("c" OR "d")'),
        ("((a))", '"a"'),
        ("(a (b (c OR d)))", '"a" AND "b" AND ("c" OR "d")'),
        ('-"a b"', 'NOT "a b"'),
        ("-from:x", 'NOT from:"x"'),
        ("x -in:trash", '"x" AND NOT (folder:"personal/Trash" OR tag:"deleted")'),
        ("a OR in:anywhere", "*"),
        ("a in:anywhere", '"a"'),
        ("-in:anywhere", 'sexp:"(not ())"'),
        ("a OR -in:anywhere", '"a"'),
        ("!!! OR a", '"a"'),
        ("a OR *", "*"),
        ("a *", '"a"'),
        ("-*", 'sexp:"(not ())"'),
        ("from:a OR from:b", 'from:"a" OR from:"b"'),
        ("is:read is:flagged", 'tag:"flagged" AND NOT tag:"unread"'),
    ],
)
def test_logic_and_precedence(text: str, expected: str) -> None:
    assert q(text) == expected


def test_combination() -> None:
    got = q("from:alice (subject:invoice OR has:attachment) -is:list after:2026-01-01 account:work")
    assert got == (
        f'from:"alice" AND (subject:"invoice" OR {HAS_ATTACHMENT}) AND '
        f'date:@{epoch(2026, 1, 1)}.. AND path:"work/**" AND NOT tag:"list"'
    )


# --------------------------------------------------------------------------- exclusions


@pytest.mark.parametrize(
    ("text", "exclude"),
    [
        ("", DEFAULT_EXCLUDED),
        ("from:spam", DEFAULT_EXCLUDED),
        ("spam", DEFAULT_EXCLUDED),
        ("tag:spam", ("deleted",)),
        ("label:deleted", ("spam",)),
        ("is:spam", ("deleted",)),
        ("is:deleted", ("spam",)),
        ("is:blocked", ("deleted",)),  # blocked mail is tagged spam too
        ("tag:blocked", ("deleted",)),
        ("-is:blocked", DEFAULT_EXCLUDED),  # leaving blocked mail out shows no spam
        ("is:unread -tag:blocked", DEFAULT_EXCLUDED),
        ("-(-is:blocked)", ("deleted",)),
        ("is:unread OR -is:blocked", DEFAULT_EXCLUDED),
        ("-is:spam", ("deleted",)),
        ("in:trash", ("spam",)),
        ("in:spam", ("deleted",)),
        ("in:junk", ("deleted",)),
        ("in:personal/Trash", ("spam",)),
        ("in:Junk", ("deleted",)),
        ("in:Archive", DEFAULT_EXCLUDED),
        ("in:anywhere", ()),
        ("in:trash in:spam", ()),
        ('raw:"tag:spam"', ("deleted",)),
        ('raw:"is:deleted or tag:spam"', ()),
        ('raw:"tag:\\"spam\\""', ("deleted",)),
        ('raw:"sexp:\\"(tag spam)\\""', ("deleted",)),
        ('raw:"tag:spammy"', DEFAULT_EXCLUDED),
        ('raw:"subject:spam"', DEFAULT_EXCLUDED),
    ],
)
def test_exclusion_lifting(text: str, exclude: tuple[str, ...]) -> None:
    assert excluded(text) == exclude


def test_custom_excluded_tags_keep_their_order() -> None:
    ctx = DslContext(
        now=NOW, accounts={}, folder_roles={}, excluded_tags=("muted", "spam", "deleted")
    )
    assert excluded("", ctx) == ("muted", "spam", "deleted")
    assert excluded("tag:muted", ctx) == ("spam", "deleted")
    assert excluded("in:anywhere", ctx) == ()


def test_in_trash_without_trash_folders_lifts_deleted() -> None:
    assert excluded("in:trash", BARE_CTX) == ("spam",)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("text", "position", "expected", "got"),
    [
        ("from:", 5, "a value after 'from:'", "end of query"),
        ("from: OR x", 6, "a value after 'from:'", "'OR'"),
        ("from: to:bob", 6, "a value after 'from:'", "'to:bob'"),
        ("from:)", 5, "a value after 'from:'", "')'"),
        ('from:""', 5, "a value after 'from:'", "an empty value"),
        ("raw:", 4, "a value after 'raw:'", "end of query"),
        ("(a", 2, "')' to close the '(' at position 0", "end of query"),
        ("a (b (c) d", 10, "')' to close the '(' at position 2", "end of query"),
        ("a)", 1, "a search term or the end of the query", "a ')' with no matching '('"),
        ("()", 1, "a search term inside '( )'", "')'"),
        ('x "abc', 2, "a closing '\"' for the quote opened at position 2", "end of query"),
        ('"abc\\"', 0, "a closing '\"' for the quote opened at position 0", "end of query"),
        ("a OR", 4, "a search term after 'OR'", "end of query"),
        ("a |", 3, "a search term after '|'", "end of query"),
        ("a OR OR b", 5, "a search term after 'OR'", "'OR'"),
        ("OR a", 0, "a search term", "'OR'"),
        ("a AND", 5, "a search term after 'AND'", "end of query"),
        ("a AND ) b", 6, "a search term after 'AND'", "')'"),
        ("AND a", 0, "a search term", "'AND'"),
        ("NOT", 3, "a search term after 'NOT'", "end of query"),
        ("a NOT OR b", 6, "a search term after 'NOT'", "'OR'"),
        ("(a OR)", 5, "a search term after 'OR'", "')'"),
        ("newer_than:3x", 11, "a period after 'newer_than:'", "'3x'"),
        ("after:2026-02-30", 6, "a real calendar date", "'2026-02-30'"),
        ("is:nope", 3, "one of is:", "'nope'"),
        ("in:nowhere", 3, "a known folder:", "'nowhere'"),
        ("x size:10M", 2, "sizes are not in the search index", "'size:'"),
        ("x sizzle:10M", 2, "a known operator (", "'sizzle:'"),
        ("Re: lunch", 0, "a known operator (", "'Re:'"),
        ("tag:x)OR(y", 5, "a search term or the end of the query", "a ')' with no matching '('"),
    ],
)
def test_errors(text: str, position: int, expected: str, got: str) -> None:
    e = err(text)
    assert e.position == position
    assert e.expected.startswith(expected)
    assert e.got == got
    assert str(e) == f"bad search at position {position}: expected {e.expected} (got {got})"


def test_error_message_format() -> None:
    e = err("from:")
    assert str(e) == "bad search at position 5: expected a value after 'from:' (got end of query)"
    assert isinstance(e, ValueError)


def test_unknown_operator_lists_known_ones() -> None:
    e = err("foo:bar")
    for op in ("from:", "subject:", "is:", "in:", "newer_than:", "raw:", "list:", "account:"):
        assert op in e.expected


def test_long_token_is_shortened_in_errors() -> None:
    e = err("in:" + "x" * 500)
    assert len(e.got) < 50


def test_naive_clock_is_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        DslContext(now=datetime(2026, 1, 1), accounts={}, folder_roles={})


# --------------------------------------------------------------------------- help text


def test_help_is_compact_and_complete() -> None:
    assert len(DSL_HELP) < 1500  # it is in every tool list a client reads
    ops = ["from:", "to:", "cc:", "bcc:", "subject:", "body:", "filename:", "is:unread", "is:read"]
    ops += [
        "has:attachment",
        "in:anywhere",
        "tag:",
        "label:",
        "list:",
        "account:",
        "after:",
        "before:",
    ]
    ops += ["on:", "newer_than:", "older_than:", "id:", "thread:", "raw:", "OR", "NOT", " | "]
    for op in ops:
        assert op in DSL_HELP, op


def test_help_examples_compile() -> None:
    examples = DSL_HELP.split("Examples:\n", 1)[1].splitlines()
    assert len(examples) >= 4
    for line in examples:
        assert isinstance(compile_query(line.strip(), CTX), CompiledQuery)


# --------------------------------------------------------------------------- properties

_PIECES = st.sampled_from(
    [
        "from:",
        "to:",
        "subject:",
        "is:",
        "in:",
        "tag:",
        "list:",
        "after:",
        "before:",
        "on:",
        "newer_than:",
        "older_than:",
        "raw:",
        "id:",
        "thread:",
        "account:",
        "has:",
        "filename:",
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
        "  ",
        "*",
        ":",
        "/",
        "{",
        "}",
        "unread",
        "read",
        "inbox",
        "trash",
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
        "中",
        "@",
        ".",
        "bob@ex.org",
    ]
)


@settings(max_examples=1500, deadline=None)
@given(st.lists(_PIECES, max_size=12).map("".join))
def test_any_token_soup_compiles_or_raises_dsl_error(text: str) -> None:
    try:
        result = compile_query(text, CTX)
    except DslError as e:
        assert 0 <= e.position <= len(text)
        return
    assert isinstance(result, CompiledQuery)
    assert result.query
    assert set(result.exclude_tags) <= set(DEFAULT_EXCLUDED)


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=60))
def test_any_text_compiles_or_raises_dsl_error(text: str) -> None:
    try:
        compile_query(text, CTX)
    except DslError as e:
        assert 0 <= e.position <= len(text)


def dsl_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=40))
def test_quoted_phrase_values_never_carry_quotes_or_controls(value: str) -> None:
    for op in ("from", "to", "cc", "bcc", "subject", "body", "filename"):
        try:
            query = q(f"{op}:{dsl_quote(value)}")
        except DslError:
            continue
        field = "to" if op in ("cc", "bcc") else "attachment" if op == "filename" else op
        if op == "filename":  # filename:pdf adds a constant term for PDFs sent inline
            query = query.removesuffix(' OR mimetype:"application/pdf"')
        assert query.startswith(f'{field}:"') and query.endswith('"')
        inner = query[len(field) + 2 : -1]
        assert '"' not in inner and "*" not in inner and "/" not in inner
        assert not any(ord(c) < 32 or ord(c) == 127 for c in inner)
        assert inner == inner.strip()


def _profiled_calls(fn: Callable[[], object]) -> int:
    """Python function calls made by fn: a deterministic measure of work (no timing)."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        fn()
    except DslError:
        pass
    finally:
        sys.setprofile(None)
    return calls


@settings(max_examples=150, deadline=None)
@given(st.lists(_PIECES, min_size=1, max_size=40), st.integers(min_value=1, max_value=400))
def test_long_queries_compile_in_work_and_size_proportional_to_the_input(
        pieces: list[str], repeat: int) -> None:
    text = " ".join(pieces * repeat)[:MAX_QUERY_CHARS]
    try:
        result = compile_query(text, CTX)
    except DslError as e:
        assert 0 <= e.position <= len(text)
    else:
        # Each input character yields a bounded number of output characters (folder roles
        # and list: expand to a fixed-size term) -- never a blow-up.
        assert len(result.query) <= 40 * len(text) + 100
    assert _profiled_calls(lambda: compile_query(text, CTX)) <= 60 * len(text) + 500


def test_inputs_past_the_limits_are_refused_with_where_and_why() -> None:
    with pytest.raises(DslError, match=f"at most {MAX_QUERY_CHARS} characters"):
        compile_query("a " * 51_200, CTX)
    with pytest.raises(DslError, match=f"at most {MAX_TOKENS} words"):
        compile_query("a " * (MAX_TOKENS + 1), CTX)
    assert compile_query("a " * MAX_TOKENS, CTX).query.count('"a"') == MAX_TOKENS
    with pytest.raises(DslError, match=f"at most {MAX_DEPTH} nested"):
        compile_query("(" * (MAX_DEPTH + 1) + "a" + ")" * (MAX_DEPTH + 1), CTX)
    with pytest.raises(DslError, match=f"at most {MAX_DEPTH} nested"):
        compile_query("NOT " * (MAX_DEPTH + 1) + "a", CTX)
    assert compile_query("(" * MAX_DEPTH + "a" + ")" * MAX_DEPTH, CTX).query == '"a"'
    # The refusal of an oversized query costs nothing like its size.
    assert _profiled_calls(lambda: compile_query("a " * 51_200, CTX)) < 50



def test_from_me_is_each_of_the_users_addresses() -> None:
    ctx = DslContext(now=NOW, accounts={}, folder_roles={},
                     own_addresses=lambda received: ("alex@example.org", "a.m@work.test"))
    assert q("from:me", ctx) == 'from:"alex@example.org" OR from:"a.m@work.test"'
    assert q("to:ME is:unread", ctx) == '(to:"alex@example.org" OR to:"a.m@work.test") AND tag:"unread"'
    assert q('from:"me"', ctx) == 'from:"me"'  # quoted: the word
    assert q("me", ctx) == '"me"'  # alone: the word


def test_to_me_is_each_of_the_addresses_the_user_receives_at() -> None:
    """Sub-addresses the user sends from and those mail goes to are told apart: each search
    keeps to its own few (sidecar.own_addresses)."""
    ctx = DslContext(now=NOW, accounts={}, folder_roles={}, own_addresses=lambda received: (
        ("alex@example.org", "alex+shop@example.org") if received else ("alex@example.org",)))
    assert q("from:me", ctx) == 'from:"alex@example.org"'
    assert q("to:me", ctx) == q("cc:me", ctx) == q("bcc:me", ctx) == (
        'to:"alex@example.org" OR to:"alex+shop@example.org"')


def test_from_me_without_addresses_says_where_to_set_them() -> None:
    with pytest.raises(DslError) as raised:
        compile_query("is:unread from:me", CTX)
    assert raised.value.position == 15
    assert "fmail.toml" in raised.value.expected and "user.primary_email" in raised.value.expected


@pytest.mark.parametrize(("text", "expected"), [
    ("{from:amy from:david}", 'from:"amy" OR from:"david"'),
    ("from:{amy david}", 'from:"amy" OR from:"david"'),
    ("from: {amy | david}", 'from:"amy" OR from:"david"'),
    ("{a b} c", '("a" OR "b") AND "c"'),
    ("-{from:amy from:david}", 'NOT (from:"amy" OR from:"david")'),
    ("subject:{invoice receipt} has:attachment",
     f'(subject:"invoice" OR subject:"receipt") AND ({HAS_ATTACHMENT})'),
    ("tag:{y} x", 'sexp:"(tag ""{y}"")" AND "x"'),  # a tag named {y}: one word
])
def test_braces_are_any_of_their_terms(text: str, expected: str) -> None:
    assert q(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("larger:5M", "query_emails has them (SELECT uid, subject, size FROM emails WHERE size > "),
    ("is:unread smaller:10k", "sizes are not in the search index"),
    ("deliveredto:me@example.org", "to: (it matches To, Cc and Bcc)"),
    ("category:promotions", "is:list or list:NAME"),
    # notmuch's own, as a model that knows notmuch writes them
    ("folder:work/INBOX", 'in:NAME (a folder as list_folders names it), or raw:"<notmuch '
                          "query>\" for notmuch's own folder:"),
    ("is:unread date:2026-01-01..", "after:, before: or on: (YYYY/MM/DD)"),
    ("mimetype:text/calendar", "has:attachment or filename:EXT, or raw:"),
])
def test_gmail_operators_without_an_answer_here_say_what_to_use(text: str, expected: str) -> None:
    assert expected in err(text).expected


@pytest.mark.parametrize(("text", "expected"), [
    ("holiday AROUND 10 vacation", "(holiday NEAR/10 vacation)"),
    ("Holiday AROUND vacation is:unread", '(holiday NEAR/5 vacation) AND tag:"unread"'),
    ("Renewal AROUND 2 CONTRACT", "(renewal NEAR/2 contract)"),
    ("ΟΔΟΣ AROUND 2 İstanbul", "(οδοσ NEAR/2 istanbul)"),  # as Xapian lowercases
    # Any one word, as Xapian reads it: connectors, marks, joining ' & and . between digits.
    ("foo_bar AROUND x", "(foo_bar NEAR/5 x)"),
    ("O'Brien AROUND 3 AT&T", "(o'brien NEAR/3 at&t)"),
    ('"3.5 AROUND cafe\u0301"', "(3.5 ADJ/5 cafe\u0301)"),
    # One term wherever a word is: negated, or one of { }.
    ("-holiday AROUND vacation x", '"x" AND NOT (holiday NEAR/5 vacation)'),
    ("{holiday AROUND 2 vacation trip}", '(holiday NEAR/2 vacation) OR "trip"'),
    # Gmail: in quotes, the first word stays first
    ('"secret AROUND 25 birthday"', "(secret ADJ/25 birthday)"),
    ('" Secret  AROUND Birthday " is:unread', '(secret ADJ/5 birthday) AND tag:"unread"'),
    ('"secret around 25 birthday"', '"secret around 25 birthday"'),  # a phrase: AROUND is upper-case
    ('subject:"a AROUND b"', 'subject:"a AROUND b"'),
])
def test_around_is_near(text: str, expected: str) -> None:
    assert q(text) == expected


CHAINED_AROUND = ("one AROUND between two words, not a chain (join pairs with AND: a AROUND b "
                  "AND b AROUND c)")
NEAR_WORD = ("a plain word (letters and digits, or joined as in o'brien, at&t, 3.5) each side "
             "of AROUND")


@pytest.mark.parametrize(("text", "pos", "expected"), [
    ("{a b", 4, "'}' to close the '{' at position 0"),
    ("{a AND b}", 3, "terms of which any may match inside '{ }'"),
    ("{}", 1, "a search term inside '{ }'"),
    ("a AROUND", 8, "a word after AROUND"),
    ("a AROUND 0 b", 9, "a distance from 1 to 50 after AROUND"),
    ("a AROUND \u00b2 b", 9, "a distance from 1 to 50 after AROUND"),
    ("e-mail AROUND 2 b", 0, NEAR_WORD),
    ("a AROUND 2 from:b", 11, NEAR_WORD),
    ("o'' AROUND 2 b", 0, NEAR_WORD),
    ("a AROUND x.org", 9, NEAR_WORD),
    ("and AROUND 2 b", 0, "a word other than and, or, not, xor, near or adj each side of AROUND"),
    ("a AROUND Near", 9, "a word other than and, or, not, xor, near or adj each side of AROUND"),
    ('x "e-mail AROUND 2 b"', 3, NEAR_WORD),
    ('"a AROUND 99 b"', 10, "a distance from 1 to 50 after AROUND"),
    # A second AROUND was a word to find, narrowing the search without saying so.
    ("a AROUND b AROUND c", 11, CHAINED_AROUND),
    ("a AROUND 2 b AROUND 3 c", 13, CHAINED_AROUND),
    # In a field's group "AROUND" was a name to find: { } then matched any of the three.
    ("from:(a AROUND b)", 8, "AROUND between plain words, outside a field's ( ) or { }"),
    ("subject:{a AROUND 2 b}", 11, "AROUND between plain words, outside a field's ( ) or { }"),
])
def test_brace_and_around_errors(text: str, pos: int, expected: str) -> None:
    e = err(text)
    assert (e.position, e.expected) == (pos, expected)


@pytest.mark.parametrize(("text", "same_as"), [
    ("on:today", "on:2026-03-15"),
    ("on:Yesterday", "on:2026-03-14"),
    ("after:yesterday is:unread", "after:2026-03-14 is:unread"),
    ("before:today", "before:2026-03-15"),
])
def test_today_and_yesterday_are_days_of_the_users_zone(text: str, same_as: str) -> None:
    compiled = compile_query(text, CTX)
    assert compiled.query == q(same_as)
    assert compiled.anchor == int(NOW.timestamp())  # later pages keep the same days
