"""The hand-written MIME splitter (fmail_nm.message.mime) against the standard library parser.

``mime`` cuts multipart bodies with ``bytes.find`` instead of the stdlib's line-by-line feed
parser (see its docstring for why). These tests check that, on well-formed mail, both see the
same leaf parts in the same order, with the same content types and the same transfer-decoded
bytes (the stdlib's ``get_payload(decode=True)``). A message/rfc822 part is followed into on
both sides; other message/* parts are compared by content type only, since the stdlib parses
them into header blocks and offers no bytes to compare.

Where the two are *meant* to differ is malformed mail: the stdlib reports a defect and gives
up (e.g. a wrong boundary makes the whole body one text part), while ``mime`` recovers (guesses
the boundary). So the fixture test compares only messages for which the stdlib registers no
defect on any part, and asserts that this is nearly all of them.
"""

from __future__ import annotations

import email
import email.parser
import email.policy
import email.utils
import re
from dataclasses import dataclass
from email.message import EmailMessage, Message
from email.policy import Policy
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fmail_nm.message.headers import (HeaderInfo, _bare_addresses, list_author,
                                      parse_addresses, split_head)
from fmail_nm.message.mime import decoded_leaves, parse_message, parse_summary
from fmail_nm.message.text import preview_html_text

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "maildir"
NOT_COMPARED = None  # the payload slot of a message/* part other than message/rfc822

Leaf = tuple[str, bytes | None]


# ------------------------------------------------------------------------------------------
# The two views of a message


def ours(raw: bytes) -> list[Leaf]:
    leaves: list[Leaf] = []
    for ctype, data in decoded_leaves(raw):
        if ctype.startswith("message/"):
            leaves.append((ctype, NOT_COMPARED))
            if ctype == "message/rfc822":
                leaves.extend(ours(data))
        else:
            leaves.append((ctype, data))
    return leaves


def stdlib(part: Message) -> list[Leaf]:
    ctype = part.get_content_type()
    if part.get_content_maintype() == "multipart" and part.is_multipart():
        return [leaf for child in part.get_payload() for leaf in stdlib(child)]
    if part.get_content_maintype() == "message":
        inner = part.get_payload(0) if ctype == "message/rfc822" and part.is_multipart() else None
        return [(ctype, NOT_COMPARED), *(stdlib(inner) if inner is not None else [])]
    data = part.get_payload(decode=True)
    assert isinstance(data, bytes)
    return [(ctype, data)]


def stdlib_parse(raw: bytes, policy: Policy) -> tuple[list[Leaf], list[str]]:
    """The stdlib's leaves and every defect it registered (decoding payloads can add some)."""
    msg = email.message_from_bytes(raw, policy=policy)
    leaves = stdlib(msg)
    defects = [type(d).__name__ for part in msg.walk() for d in part.defects]
    return leaves, defects


# ------------------------------------------------------------------------------------------
# Generated messages, built with the stdlib email package


# Text each charset can carry: ASCII plus characters that need the charset.
ALPHABETS = {
    "utf-8": None,  # anything (hypothesis' "utf-8" codec filter: no lone surrogates)
    "iso-8859-1": None,
    "windows-1252": "€‘’“”…–—éàüß",
    "iso-8859-15": "€ŠšŽžŒœŸéàü",
    "koi8-r": "абвгдежзийклмнопрстуфхцчшщыьэюяАБВ",
    "shift_jis": "日本語のテキストかなカナ漢字",
    "us-ascii": "",
}
ASCII = "".join(chr(c) for c in range(0x20, 0x7F)) + "\n\t"


@st.composite
def text_content(draw: st.DrawFn) -> tuple[str, str]:
    charset = draw(st.sampled_from(sorted(ALPHABETS)))
    if charset == "utf-8":
        chars = st.characters(codec="utf-8")
    elif charset == "iso-8859-1":
        chars = st.characters(codec="latin-1")
    else:
        chars = st.sampled_from(ASCII + ALPHABETS[charset])
    return charset, draw(st.text(chars, max_size=300))


FILENAMES = st.builds(str.__add__, st.sampled_from("aZé日"), st.text(st.sampled_from("abcXYZ019 ._-äé日"), max_size=20))


@dataclass(frozen=True)
class TextLeaf:
    subtype: str
    charset: str
    content: str
    cte: str
    filename: str | None


@dataclass(frozen=True)
class BinaryLeaf:
    mimetype: str
    data: bytes
    cte: str
    filename: str | None


@dataclass(frozen=True)
class Multipart:
    subtype: str
    children: tuple[Node, ...]


@dataclass(frozen=True)
class Embedded:
    inner: Node


Node = TextLeaf | BinaryLeaf | Multipart | Embedded


@st.composite
def text_leaves(draw: st.DrawFn) -> TextLeaf:
    charset, content = draw(text_content())
    ctes = ["quoted-printable", "base64", "8bit"] + (["7bit"] if content.isascii() else [])
    return TextLeaf(
        subtype=draw(st.sampled_from(["plain", "html"])),
        charset=charset,
        content=content,
        cte=draw(st.sampled_from(ctes)),
        filename=draw(st.none() | FILENAMES),
    )


@st.composite
def binary_leaves(draw: st.DrawFn) -> BinaryLeaf:
    data = draw(st.binary(max_size=600))
    ctes = ["base64", "quoted-printable"] + (["7bit"] if data.isascii() else [])
    return BinaryLeaf(
        mimetype=draw(st.sampled_from(["application/pdf", "application/octet-stream", "image/png"])),
        data=data,
        cte=draw(st.sampled_from(ctes)),
        filename=draw(st.none() | FILENAMES),
    )


def _containers(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
    multiparts = st.builds(
        Multipart,
        st.sampled_from(["mixed", "alternative", "related"]),
        st.lists(children, min_size=1, max_size=4).map(tuple),
    )
    return multiparts | st.builds(Embedded, children)


TREES: st.SearchStrategy[Node] = st.recursive(text_leaves() | binary_leaves(), _containers, max_leaves=10)


def build(node: Node) -> EmailMessage:
    msg = EmailMessage()
    if isinstance(node, TextLeaf):
        disposition = "attachment" if node.filename else None
        msg.set_content(node.content, subtype=node.subtype, charset=node.charset, cte=node.cte,
                        disposition=disposition, filename=node.filename)
    elif isinstance(node, BinaryLeaf):
        maintype, subtype = node.mimetype.split("/")
        msg.set_content(node.data, maintype, subtype, cte=node.cte, disposition="attachment",
                        filename=node.filename)
    elif isinstance(node, Embedded):
        inner = build(node.inner)
        inner["Subject"] = "forwarded"
        msg.set_content(inner)
    else:
        msg["Content-Type"] = f"multipart/{node.subtype}"
        for child in node.children:
            msg.attach(build(child))
    return msg


def leaf_count(node: Node) -> int:
    if isinstance(node, Multipart):
        return sum(leaf_count(child) for child in node.children)
    if isinstance(node, Embedded):
        return 1 + leaf_count(node.inner)
    return 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=TREES, linesep=st.sampled_from(["\n", "\r\n"]))
def test_generated_messages_split_like_the_stdlib(tree: Node, linesep: str) -> None:
    msg = build(tree)
    msg["Subject"] = "generated"
    raw = msg.as_bytes(policy=email.policy.default.clone(linesep=linesep))
    expected, defects = stdlib_parse(raw, email.policy.default)
    assert defects == []  # well-formed by construction: the comparison is meaningful
    assert len(expected) == leaf_count(tree)
    assert ours(raw) == expected


# ------------------------------------------------------------------------------------------
# Header blocks: split_head builds a plain block's fields itself, as the stdlib would


def stdlib_head(raw: bytes) -> tuple[list[tuple[str, str]], list[str], bytes]:
    """The header block the stdlib reads where split_head cuts it: the raw fields, the
    defects, and the body (the lines it took for no header, then the rest)."""
    match = re.search(rb"\n\r?\n", raw)
    end, start = (match.start() + 1, match.end()) if match else (len(raw), len(raw))
    head = email.parser.BytesParser(policy=email.policy.compat32).parsebytes(
        raw[:end], headersonly=True)
    # _payload is the only exact copy of those lines (get_payload decodes 8-bit text lossily).
    leftover = head._payload.encode("utf-8", "surrogateescape")
    return list(head.raw_items()), [type(d).__name__ for d in head.defects], leftover + raw[start:]


# Header lines, plain and not: continuations, an empty value, 8-bit text, a bare CR, a line
# no header, a "From " line, a colon-first line, a vertical tab, a blank or DEL in a name,
# control bytes in a value, a CR before the line end.
HEAD_LINES = [b"Subject: hi", b"X-A:b", b"To:   x@y.z,", b" cont", b"\tcont", b"  ", b"X:",
              b"Content-Type: text/plain;", b' charset="utf-8"', b"X-C: a:b:c",
              "X-8: \u00e9t\u00e9".encode(), b"X: a\rb", b"From bob", b":novalue",
              b"bad line", b"\x0bX: v", b"X-\xe9: v", b"Subject : x", b"X\x7f: v",
              b"X: \x00\x0b\x0c\x1c", b"X: a\r"]


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(st.tuples(st.sampled_from(HEAD_LINES), st.sampled_from([b"\n", b"\r\n"])),
                      max_size=12),
       ending=st.sampled_from([b"\nbody\n", b"\r\nbody\r\n", b"", b"\n"]))
def test_header_blocks_split_like_the_stdlib(lines: list[tuple[bytes, bytes]],
                                             ending: bytes) -> None:
    raw = b"".join(line + sep for line, sep in lines) + ending
    if raw.startswith((b"\n", b"\r\n")):
        return  # no header block at all: split_head does not parse one
    fields, defects, body = stdlib_head(raw)
    headers, ours_body = split_head(raw)
    assert (list(headers.raw_items()), [type(d).__name__ for d in headers.defects],
            ours_body) == (fields, defects, body)


def test_fixture_header_blocks_split_like_the_stdlib() -> None:
    for path in fixture_files():
        raw = path.read_bytes()
        headers, body = split_head(raw)
        assert (list(headers.raw_items()), [type(d).__name__ for d in headers.defects],
                body) == stdlib_head(raw), path


def test_header_lookups_follow_changes_like_the_stdlib() -> None:
    """split_head's headers look fields up through an index of their names: it follows a
    field added, deleted or replaced as the stdlib's lookups do."""
    raw = (b"Received: by x\nContent-Type: text/plain; charset=us-ascii\nSubject: s\n"
           b"Received: by y\nContent-Disposition: inline; filename=a.txt\n\nbody\n")
    ours_head, _ = split_head(raw)
    theirs = email.parser.BytesParser(policy=email.policy.compat32).parsebytes(raw)
    # A caller may change the parameter list it is handed: what is read later is not.
    changes = [lambda m: m.get_params(unquote=False).clear(),
               lambda m: m.set_param("charset", "utf-8"), lambda m: m.__delitem__("subject"),
               lambda m: m.add_header("X-New", "1"), lambda m: m.__delitem__("content-type"),
               lambda m: m.__setitem__("Content-Type", "text/html; charset=latin1"),
               lambda m: m.replace_header("content-disposition", "attachment; filename=b"),
               lambda m: m.set_boundary("b1"), lambda m: m.set_type("multipart/mixed"),
               lambda m: m.set_charset("iso-8859-1"), lambda m: m.set_raw("Received", "by z"),
               # As many fields as before, others: no lookup in between sees the count change.
               lambda m: (m.__delitem__("x-new"), m.add_header("Subject", "t"))]
    names = ["content-type", "SUBJECT", "x-new", "received", "content-disposition", "x-none"]
    for change in [lambda m: None, *changes]:
        change(ours_head)
        change(theirs)
        assert [(n in ours_head, ours_head.get(n), ours_head.get_all(n)) for n in names] == [
            (n in theirs, theirs.get(n), theirs.get_all(n)) for n in names]
        assert (ours_head.get_content_charset(), ours_head.get_filename(),
                ours_head.get_params(), ours_head.get_boundary()) == (
            theirs.get_content_charset(), theirs.get_filename(), theirs.get_params(),
            theirs.get_boundary())


# Address lists of bare addresses are read without the stdlib's parser: the same pairs, and
# any other list (a name, a comment, a stray dot or comma, an empty item) left to it.
BARE_LISTS = ["a@b", " a@b\t", "a.b@c.d", "A_B+c-d@D-E.F", "a@b,c@d", "a@b ,\tc@d", "-@-",
              "a@1.2.3.4"]
NOT_BARE_LISTS = ["a..b@c", ".a@b", "a.@b", "a@b.", "a@.b", "a@b..c", "a@b,", ",a@b",
                  "a@b,,c@d", "a b@c", "a@b c", "a@@b", "@b", "a@", "a", "A <a@b>",
                  "a@b (A)", '"a"@b', "a@[1.2.3.4]", "a@b\n", "<a@b>", "x:a@b;"]


@pytest.mark.parametrize("value", BARE_LISTS + NOT_BARE_LISTS)
def test_address_lists_read_as_the_stdlib_reads_them(value: str) -> None:
    theirs = email.utils.getaddresses([value])
    assert [(a.name, a.address) for a in parse_addresses([value], "to", [])] == [
        pair for pair in theirs if pair[1]]
    assert _bare_addresses(value) == (theirs if value in BARE_LISTS else None)


# Address lists near bare ones: around an address, blanks the stdlib skips or keeps (CR, LF,
# vertical tab, no-break space, line separator); in one, letters outside ASCII (the Kelvin sign,
# which [A-Za-z] would match under IGNORECASE), stray dots, dashes, a domain literal, specials.
AROUND = ["", " ", "\t", " \t", "\r", "\n", "\r\n ", "\x0b", "\xa0", "\u2028", ".", "(c)", "<", ">"]
LOCAL_PARTS = ["a", "a.b", "A_B+c-d", "-", "a..b", ".a", "a.", "\u212a", "\xe9", '"a"', "a b", ""]
DOMAINS = ["b", "b.c", "D-E.F", "1.2.3.4", "-", "-b", "b-", "b..c", ".b", "b.", "[1.2.3.4]", "b_c",
           "b+c", "\u212a", "b c", ""]
NEAR_BARE_ADDRESS = st.tuples(st.sampled_from(AROUND), st.sampled_from(LOCAL_PARTS),
                              st.sampled_from(["@", "@@", ""]), st.sampled_from(DOMAINS),
                              st.sampled_from(AROUND)).map("".join)


@settings(max_examples=1000, deadline=None)
@given(value=st.lists(NEAR_BARE_ADDRESS, min_size=1, max_size=4).map(",".join))
def test_a_list_read_as_bare_addresses_is_read_as_the_stdlib_reads_it(value: str) -> None:
    bare = _bare_addresses(value)
    assert bare is None or bare == email.utils.getaddresses([value])


# ------------------------------------------------------------------------------------------
# The fixture mail


def fixture_files() -> list[Path]:
    return sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.parent.name in ("cur", "new"))


@pytest.mark.parametrize("policy", [email.policy.default, email.policy.compat32], ids=["default", "compat32"])
def test_fixture_mail_splits_like_the_stdlib(policy: Policy) -> None:
    files = fixture_files()
    compared = 0
    for path in files:
        raw = path.read_bytes()
        expected, defects = stdlib_parse(raw, policy)
        if defects:  # malformed: the stdlib gives up where mime recovers; nothing to compare
            continue
        assert ours(raw) == expected, path
        compared += 1
    assert len(files) >= 150
    assert compared >= len(files) - 5, f"only {compared} of {len(files)} fixture messages compared"


def test_fixture_mail_summarises_as_the_whole_parse_reads_it() -> None:
    """parse_summary, the indexer's parse of each new message, reads what parse_message
    reads of its recipients, List-Id, list author, body text and attachments."""
    for path in fixture_files():
        raw = path.read_bytes()
        whole = parse_message(raw, preview_html_text)
        summary = parse_summary(raw, preview_html_text)
        assert (summary.fields, summary.text, summary.has_files) == (
            HeaderInfo(to=whole.to, cc=whole.cc, bcc=whole.bcc, list_id=whole.list_id,
                       author=list_author(whole.from_, whole.reply_to, whole.original_from,
                                          whole.list_id)),
            whole.text, whole.has_files), path
