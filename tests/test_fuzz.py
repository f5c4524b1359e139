"""Fuzzing with hypothesis against the real parts.

* Searches generated from the DSL's grammar (fields, quotes, parentheses, OR, negation, dates,
  unicode, values made to escape) and as random text, compiled and run against real notmuch in
  process: each gives results or a DSL error, never another exception, and no value reaches
  notmuch as query syntax -- checked by a message only the query's own words can reach, and by
  the algebra of the results (``a b`` is the intersection, ``a OR b`` the union, ``-a`` the
  complement).  test_dsl_notmuch.py covers single values; this covers whole queries.
* Malformed MIME written into a Maildir, indexed by real ``notmuch new`` with the post-new
  hook, and read through get_email, get_thread and get_attachment (in process, each call
  bounded, and a sample through the `mcp` client): an answer or a clear CallerError only.
"""

from __future__ import annotations

import base64
import concurrent.futures
import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import notmuch2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.client.client import Client

from fmail_nm.app import load_config
from fmail_nm.dsl import DslError, compile_query
from fmail_nm.errors import CallerError
from fmail_nm.store.notmuch import Reader
from fmail_nm.tools import reads

from .conftest import SLOW_TIMEOUT, MailEnv
from .test_dsl_notmuch import (  # noqa: F401  (env and db are fixtures used here)
    CTX,
    MESSAGES,
    SECRET_WORDS,
    VALUES,
    WEIRD_TAGS,
    db,
    dsl_quote,
    env,
    ids,
)
from .test_server_writes import server_params

T = TypeVar("T")
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                      HealthCheck.too_slow])
ALL_IDS = {m[0] for m in MESSAGES}


# =========================================================================== DSL

@dataclass(frozen=True)
class Q:
    """A generated search: its text, and whether it may match the secret message (a value of
    the secret's own words, a negation, a date)."""

    text: str
    may_reach_secret: bool


# Xapian keeps letters, digits and "_" in words, but its Unicode tables lag behind Python's
# outside the BMP: it indexed nothing of "\U0002ceb0" (CJK extension F).  Such characters are
# treated as no word here (a value made of them could otherwise reach any message).
_NOT_INDEXED = re.compile("[\U00010000-\U0010ffff]")


def _words(value: str) -> set[str]:
    return {w.lower() for w in re.findall(r"\w+", _NOT_INDEXED.sub(" ", value))}


PHRASE_FIELDS = ["from", "to", "cc", "bcc", "subject", "body", "filename"]
# The secret message: tags secret, archived; personal/Archive; no attachment; no list.
TERM_REACHING_SECRET = {
    "tag": {"secret", "archived"}, "label": {"secret", "archived"}, "id": {"secret@t"},
    "is": {"read", "archived"}, "in": {"archive", "personal/archive", "anywhere"},
    "account": {"personal"},
}
TERM_FIELDS = ["tag", "label", "id", "is", "in", "account", "list", "thread", "has"]
DATE_FIELDS = ["after", "before", "on"]
PERIOD_FIELDS = ["newer_than", "older_than"]

_word_text = st.text(st.characters(min_codepoint=0x61, max_codepoint=0x7A), min_size=1,
                     max_size=8).filter(lambda w: w.upper() not in ("OR", "AND", "NOT"))
# The whole of Unicode: a phrase with no character Xapian indexes is a DSL error, so even
# values Xapian would drop cannot widen a search.
_unicode_value = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=12)
_value = st.one_of(VALUES, st.sampled_from(sorted(SECRET_WORDS)), _unicode_value)
_date = st.one_of(
    st.builds(lambda y, m, d, sep: f"{y}{sep}{m:02d}{sep}{d:02d}", st.integers(1900, 2100),
              st.integers(0, 13), st.integers(0, 32), st.sampled_from(["-", "/"])),
    st.builds(lambda y, m: f"{y}-{m}", st.integers(1, 99999), st.integers(0, 99)),
    st.integers(0, 10**13).map(str),
    st.sampled_from(["2026", "2026-03", "yesterday", "", "0000-00-00", "2026-02-30", "-1"]),
    _unicode_value,
)
_period = st.one_of(st.builds(lambda n, u: f"{n}{u}", st.integers(0, 10**7),
                              st.sampled_from(list("hdwmyHDWMYs") + ["", "mo"])),
                    _unicode_value)


def _leaf_phrase(field_: str, value: str) -> Q:
    return Q(f"{field_}:{dsl_quote(value)}", _words(value) <= SECRET_WORDS)


def _leaf_term(field_: str, value: str) -> Q:
    reach = value.lower().strip("/").strip("<>") in TERM_REACHING_SECRET.get(field_, set())
    return Q(f"{field_}:{dsl_quote(value)}", reach or field_ == "thread")


def _leaf_bare_phrase(value: str) -> Q:
    return Q(dsl_quote(value), _words(value) <= SECRET_WORDS)


def _leaf_word(word: str) -> Q:
    return Q(word, word in SECRET_WORDS)


# Values each field takes, so that most generated queries compile (one bad value fails all).
VALID = {"is": ["unread", "read", "flagged", "starred", "replied", "sent", "draft", "inbox",
                "archived", "list", "blocked", "spam", "deleted", "forwarded"],
         "in": ["inbox", "sent", "drafts", "archive", "trash", "spam", "anywhere", "Archive",
                "personal/Archive", "work/INBOX", "Junk"],
         "has": ["attachment"], "account": ["personal", "work"],
         "list": ["rust-users", "rust-users.lists.example.org"],
         "tag": ["secret", "inbox", "unread", "spam", *WEIRD_TAGS], "id": ["at@t", "secret@t"]}
VALID["label"] = VALID["tag"]
_valid_date = st.builds(lambda y, m, d: f"{y}-{m:02d}-{d:02d}", st.integers(1990, 2030),
                        st.integers(1, 12), st.integers(1, 28))
_valid_period = st.builds(lambda n, u: f"{n}{u}", st.integers(0, 400), st.sampled_from("hdwmy"))


def _mostly(valid: st.SearchStrategy[str], other: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """``valid`` four times in five, else ``other``."""
    return st.integers(0, 4).flatmap(lambda k: valid if k else other)


def _term_leaf(field_: str) -> st.SearchStrategy[Q]:
    return st.builds(_leaf_term, st.just(field_),
                     _mostly(st.sampled_from(VALID.get(field_, ["x"])), _value))


LEAVES = st.one_of(
    st.builds(_leaf_phrase, st.sampled_from(PHRASE_FIELDS), _value),
    st.sampled_from(TERM_FIELDS).flatmap(_term_leaf),
    st.builds(lambda f, v: Q(f"{f}:{dsl_quote(v)}", True), st.sampled_from(DATE_FIELDS),
              _mostly(_valid_date, _date)),
    st.builds(lambda f, v: Q(f"{f}:{dsl_quote(v)}", True), st.sampled_from(PERIOD_FIELDS),
              _mostly(_valid_period, _period)),
    st.builds(_leaf_bare_phrase, _value),
    st.builds(_leaf_word, _word_text),
)


def _and(kids: list[Q]) -> Q:
    joiner = " AND " if len(kids) % 2 else " "
    return Q(joiner.join(f"({k.text})" for k in kids), all(k.may_reach_secret for k in kids))


def _or(kids: list[Q]) -> Q:
    joiner = " | " if len(kids) % 2 else " OR "
    return Q(joiner.join(f"({k.text})" for k in kids), any(k.may_reach_secret for k in kids))


def _not(kid: Q, minus: bool) -> Q:
    return Q(("-" if minus else "NOT ") + f"({kid.text})", True)


QUERIES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, min_size=2, max_size=4).map(_and),
        st.lists(inner, min_size=2, max_size=4).map(_or),
        st.builds(_not, inner, st.booleans()),
    ),
    max_leaves=12,
)


def _dropped(text: str) -> bool:
    """Whether the search is dropped whole, as a bare phrase of punctuation is (Gmail ignores
    it too; alone, it is refused): it is then neutral in AND and OR, and its negation is
    dropped as well, so the set algebra does not apply to it."""
    try:
        return (compile_query(f"in:anywhere -({text})", CTX).query
                == compile_query(f"in:anywhere ({text})", CTX).query == "*")
    except DslError:
        return False


def _run(db: notmuch2.Database, text: str) -> set[str] | None:
    """The ids a search finds (with the exclusions it compiles to), None for a DSL error."""
    try:
        compiled = compile_query(text, CTX)
    except DslError:
        return None
    return ids(db, compiled.query, compiled.exclude_tags)


@dataclass
class Tally:
    inputs: int = 0
    hangs: int = 0
    failures: list[str] = field(default_factory=list)


@pytest.mark.reliability
@pytest.mark.timeout(SLOW_TIMEOUT)
def test_generated_searches_never_escape(db: notmuch2.Database, reliability: Any) -> None:
    tally = Tally()

    @settings(max_examples=reliability.trials(600, 6000), database=None, **SETTINGS)
    @given(a=QUERIES, b=QUERIES)
    def check(a: Q, b: Q) -> None:
        tally.inputs += 1
        found_a = _run(db, a.text)
        if found_a is None:
            return
        if not a.may_reach_secret:
            assert "secret@t" not in found_a, a.text
        # in:anywhere lifts the exclusions, so the algebra is over every message.
        found_a = _run(db, f"in:anywhere ({a.text})")
        found_b = _run(db, f"in:anywhere ({b.text})")
        if found_a is None or found_b is None or _dropped(a.text) or _dropped(b.text):
            return
        assert _run(db, f"in:anywhere ({a.text}) ({b.text})") == found_a & found_b, (a, b)
        assert _run(db, f"in:anywhere (({a.text}) OR ({b.text}))") == found_a | found_b, (a, b)
        assert _run(db, f"in:anywhere -({a.text})") == ALL_IDS - found_a, a

    check()
    reliability.record("DSL fuzz", inputs=tally.inputs, part="structured")


_SOUP = st.sampled_from(['"', "(", ")", "-", "|", ":", "*", "\\", " ", "OR", "NOT", "AND",
                         "tag:", "from:", "in:", "is:", "after:", "newer_than:", "raw", "..",
                         "{", "}", "/", "\x00", "\n", "é", "中", "\U0001F600", "sexp:", "id:"])
RANDOM_TEXT = st.one_of(st.text(max_size=60), st.lists(_SOUP, max_size=20).map("".join),
                        QUERIES.map(lambda q: q.text))


@pytest.fixture(scope="module")
def mailbox_pool(shared_indexed: MailEnv) -> Iterator[Callable[[Callable[[reads.Mailbox], T]], T]]:
    """Runs a function of the fixture mail's Mailbox on the one thread that owns it."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    local: dict[str, reads.Mailbox] = {}

    def job(fn: Callable[[reads.Mailbox], T]) -> T:
        if "mb" not in local:
            config = load_config()
            local["mb"] = reads.Mailbox(config, Reader(config.settings.notmuch_config))
        return fn(local["mb"])

    def run(fn: Callable[[reads.Mailbox], T]) -> T:
        return pool.submit(job, fn).result(timeout=CALL_BOUND)

    yield run
    if "mb" in local:
        pool.submit(local["mb"].reader.close).result(timeout=CALL_BOUND)
    pool.shutdown(wait=True)


@pytest.mark.reliability
@pytest.mark.timeout(SLOW_TIMEOUT)
def test_any_text_searched_through_the_tools_gives_results_or_a_caller_error(
        mailbox_pool: Callable[[Callable[[reads.Mailbox], Any]], Any], reliability: Any) -> None:
    """search_emails and list_threads on the fixture mail: whatever the text (raw: included,
    which passes notmuch syntax through), an answer or a CallerError -- never another
    exception."""
    tally = Tally()

    @settings(max_examples=reliability.trials(300, 3000), database=None, **SETTINGS)
    @given(text=RANDOM_TEXT, raw=st.booleans())
    def check(text: str, raw: bool) -> None:
        tally.inputs += 1
        query = f"raw:{dsl_quote(text)}" if raw else text
        for tool in (lambda mb: reads.search_emails(mb, query, limit=5),
                     lambda mb: reads.list_threads(mb, query, limit=5)):
            try:
                mailbox_pool(tool)
            except CallerError:
                pass

    check()
    reliability.record("DSL fuzz", inputs=tally.inputs, part="tools")


# =========================================================================== MIME

CALL_BOUND = 20.0  # seconds for one read of one message, however broken
CHARSETS = ["utf-8", "iso-8859-1", "x-unknown-charset", "", "utf-7", "iso-2022-jp", "utf-16",
            "utf-32", "cp65001", "unicode-1-1-utf-7", "rot13", "base64", "idna", "zlib",
            "\x00", "utf-8\x00", "é", "windows-1252; x=1", "gb18030", "../../etc/passwd"]
ENCODINGS = ["7bit", "8bit", "binary", "base64", "quoted-printable", "x-uuencode", "bogus",
             "", "BASE64", "quoted-printable; x"]
TYPES = ["text/plain", "text/html", "application/octet-stream", "application/pdf", "image/png",
         "text/calendar", "application/x-bogus", "", "text", "/", "text/plain/extra",
         "message/delivery-status", "text/rfc822-headers", "application/ms-tnef"]
_bytes = st.binary(max_size=300)
_noise = st.one_of(_bytes, st.text(max_size=80).map(lambda t: t.encode("utf-8", "surrogatepass")),
                   st.sampled_from([b"\x00" * 20, b"\xff\xfe" * 10, b"=?utf-8?B?w4k=?=",
                                    b"=?bogus?Q?=FF?=", b"=?utf-8?B?***?=", b"\r", b"\r\n\r\n",
                                    b"--", b"begin 644 x\n", b"%PDF-1.4\n"]))


def _b64_truncated(data: bytes, cut: int) -> bytes:
    return base64.b64encode(data)[: max(0, len(base64.b64encode(data)) - cut)]


def _qp_broken(data: bytes) -> bytes:
    return data.replace(b"a", b"=A").replace(b"e", b"=\n") + b"=F"


# Lines clean_text treats specially (quotes, signatures, inline PGP armor, list footers,
# banners, notices).
_MARKER_LINES = [b"-----BEGIN PGP SIGNED MESSAGE-----", b"Hash: SHA1", b"",
                 b"-----BEGIN PGP SIGNATURE-----", b"-----END PGP SIGNATURE-----", b"- --",
                 b"-- ", b"_" * 47, b"-" * 30, b"-=-=-=-=-=", b"\xe2\x80\x94", b"x mailing list",
                 b"https://x.test/mailman/listinfo/x", b"To unsubscribe from this group",
                 b"> quoted", b"On Mon, Bob wrote:", b"From: a", b"Sent: b", b"To: c",
                 b"CAUTION: This email originated from outside of the organization.",
                 b"This e-mail is confidential and intended solely for the addressee.",
                 b"E-MAIL DISCLAIMER", b"=" * 40]
_body = st.one_of(
    _noise,
    st.builds(lambda lines, n: b"\n".join(lines) * n,
              st.lists(st.sampled_from(_MARKER_LINES), min_size=1, max_size=8),
              st.integers(1, 3000)),
    st.builds(_b64_truncated, _bytes, st.integers(0, 7)),
    st.builds(_qp_broken, _bytes),
    st.just(b"x" * 200_000),
    st.builds(lambda n: b"line\n" * n, st.integers(0, 5000)),
)


def _params(params: list[tuple[str, bytes]]) -> bytes:
    return b"".join(b"; " + k.encode() + b"=" + v for k, v in params)


_param = st.tuples(
    st.sampled_from(["name", "filename", "name*", "filename*0*", "filename*1", "charset",
                     "boundary", "format", "x"]),
    st.one_of(st.sampled_from([b'"unterminated', b"utf-8''%ZZ%", b'"a.txt"', b"", b'""',
                               b"=?utf-8?Q?=E9t=E9.pdf?=", b"\x00", b"\xe9t\xe9.txt",
                               b'"' + b"n" * 3000 + b'"']), _noise),
)


@dataclass(frozen=True)
class Part:
    raw: bytes


def _leaf(ctype: str, charset: str, cte: str, params: list[tuple[str, bytes]], body: bytes,
          disposition: bool) -> Part:
    head = (b"Content-Type: " + ctype.encode() + b"; charset=" + charset.encode("utf-8")
            + _params(params) + b"\n")
    if cte:
        head += b"Content-Transfer-Encoding: " + cte.encode() + b"\n"
    if disposition:
        head += b"Content-Disposition: attachment" + _params(params) + b"\n"
    return Part(head + b"\n" + body)


def _multipart(subtype: str, boundary: bytes, kids: list[Part], declared: str,
               close: bool) -> Part:
    """``declared``: "same" (a correct boundary parameter), "missing", "wrong", "empty"."""
    param = {"same": b'; boundary="' + boundary + b'"', "missing": b"",
             "wrong": b"; boundary=other-" + boundary, "empty": b'; boundary=""'}[declared]
    body = b"".join(b"--" + boundary + b"\n" + k.raw + b"\n" for k in kids)
    if close:
        body += b"--" + boundary + b"--\n"
    return Part(b"Content-Type: multipart/" + subtype.encode() + param + b"\n\n" + body)


def _rfc822(inner: Part, headers: bytes) -> Part:
    return Part(b"Content-Type: message/rfc822\n\n" + headers + inner.raw)


_boundary = st.one_of(st.sampled_from([b"b", b"==", b" ", b"a" * 80, b"x\x00y", b"--", b'"q"']),
                      st.binary(min_size=1, max_size=12).filter(lambda b: b"\n" not in b))
PARTS = st.recursive(
    st.builds(_leaf, st.sampled_from(TYPES), st.sampled_from(CHARSETS),
              st.sampled_from(ENCODINGS), st.lists(_param, max_size=3), _body, st.booleans()),
    lambda inner: st.one_of(
        st.builds(_multipart, st.sampled_from(["mixed", "alternative", "related", "digest",
                                               "signed", "report", "bogus"]),
                  _boundary, st.lists(inner, max_size=4),
                  st.sampled_from(["same", "same", "missing", "wrong", "empty"]),
                  st.booleans()),
        st.builds(_rfc822, inner, st.sampled_from([b"", b"Subject: inner\n\n",
                                                   b"From: \x00\xff\n\n"])),
    ),
    max_leaves=8,
)


def _deep(levels: int, rfc822: bool, leaf: Part) -> Part:
    """Nesting far beyond any real message: multiparts, or a message/rfc822 in itself (a
    forwarded message forwarded again and again: the nearest a file gets to a loop)."""
    part = leaf
    for level in range(levels):
        part = (_rfc822(part, b"Subject: again\n\n") if rfc822
                else _multipart("mixed", f"L{level}".encode(), [part], "same", True))
    return part


_header_value = st.one_of(_noise, st.just(b"h" * 100_000),
                          st.builds(lambda n: b"x\n " * n, st.integers(1, 3000)))
_header = st.tuples(st.sampled_from([b"Subject", b"From", b"To", b"Cc", b"Date", b"References",
                                     b"In-Reply-To", b"Content-Type", b"MIME-Version",
                                     b"X-\x00\xff", b"Reply-To", b"List-Id"]), _header_value)


@st.composite
def messages(draw: st.DrawFn) -> tuple[bytes, bool]:
    """One malformed message, and whether it keeps its own Message-ID line."""
    part = draw(st.one_of(PARTS, st.builds(_deep, st.integers(20, 400), st.booleans(),
                                           PARTS)))
    headers = draw(st.lists(_header, max_size=6))
    keep_id = draw(st.booleans())
    head = b"".join(name + b": " + value + b"\n" for name, value in headers)
    if draw(st.booleans()):  # many header lines
        head += b"".join(b"X-Filler-%d: v\n" % n for n in range(draw(st.integers(0, 5000))))
    return head + b"MIME-Version: 1.0\n" + part.raw, keep_id


@dataclass
class MimeRun:
    env: MailEnv
    pool: concurrent.futures.ThreadPoolExecutor
    tally: Tally
    counter: Iterator[int] = field(default_factory=itertools.count)
    local: dict[str, reads.Mailbox] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)

    def bounded(self, what: str, fn: Callable[[reads.Mailbox], object]) -> None:
        """``fn`` on the Mailbox's own thread: an answer or a CallerError, within the bound."""
        future = self.pool.submit(lambda: fn(self._mailbox()))
        try:
            future.result(timeout=CALL_BOUND)
        except CallerError:
            pass
        except concurrent.futures.TimeoutError:
            self.tally.hangs += 1
            self.tally.failures.append(f"{what}: no answer within {CALL_BOUND}s")

    def deliver(self, raw: bytes, keep_id: bool) -> str:
        n = next(self.counter)
        mid = f"fuzz-{n}@fuzz.test"
        head = f"Message-ID: <{mid}>\n".encode() if keep_id else b""
        folder = self.env.mail_root / "personal" / "INBOX"
        name = f"1700000000.fuzz{n}.host"
        (folder / "tmp" / name).write_bytes(head + raw)
        (folder / "tmp" / name).rename(folder / "new" / name)
        self.written.append(str(folder / "new" / name))
        return name

    def index(self) -> None:
        done = self.env.notmuch("new", check=False)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]

    def indexed_ids(self, names: list[str]) -> list[str]:
        """The Message-IDs notmuch gave the files named (non-mail files are not indexed)."""
        def find(mb: reads.Mailbox) -> list[str]:
            found = mb.reader.messages("folder:personal/INBOX", exclude_tags=())
            return [m.message_id for m in found
                    if any(f.rsplit("/", 1)[-1].split(":2,")[0] in names for f in m.filenames)]
        future = self.pool.submit(lambda: find(self._mailbox()))
        return future.result(timeout=CALL_BOUND)

    def _mailbox(self) -> reads.Mailbox:
        if "mb" not in self.local:
            config = load_config()
            self.local["mb"] = reads.Mailbox(config, Reader(config.settings.notmuch_config))
        return self.local["mb"]

    def read_all(self, mid: str) -> None:
        self.tally.inputs += 1
        self.bounded(f"get_email {mid}", lambda mb: reads.get_email(mb, mid, max_body_chars=500))
        self.bounded(f"get_email full {mid}", lambda mb: reads.get_email(
            mb, mid, max_body_chars=500, body_offset=300, body_format="full"))
        self.bounded(f"get_thread {mid}", lambda mb: reads.get_thread(mb, mid,
                                                                      max_total_chars=2000))
        attachments: list[int] = []

        def listed(mb: reads.Mailbox) -> None:
            attachments.extend(a.index for a in reads.get_email(mb, mid, max_body_chars=1)
                               .attachments)
        self.bounded(f"attachments of {mid}", listed)
        for index in [*attachments[:6], len(attachments), 10**6]:
            self.bounded(f"get_attachment {mid} {index}",
                         lambda mb, i=index: reads.get_attachment(mb, mid, i, max_chars=500))


@pytest.mark.reliability
@pytest.mark.timeout(SLOW_TIMEOUT)
# Hypothesis warns that a 200 KB generated message makes a long repr: that size is the point.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
def test_malformed_mime_is_indexed_and_read_without_an_exception_or_a_hang(
        indexed: MailEnv, reliability: Any) -> None:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    run = MimeRun(indexed, pool, Tally())
    sample: list[str] = []
    try:
        @settings(max_examples=reliability.trials(30, 400), database=None, **SETTINGS)
        @given(batch=st.lists(messages(), min_size=1, max_size=6))
        def check(batch: list[tuple[bytes, bool]]) -> None:
            names = [run.deliver(raw, keep_id) for raw, keep_id in batch]
            run.index()
            found = run.indexed_ids(names)
            for mid in found:
                run.read_all(mid)
            sample.extend(found[:1])
            assert run.tally.failures == [], run.tally.failures

        check()
        anyio.run(_read_over_mcp, indexed, sample[:8], run.tally)
    finally:
        if "mb" in run.local:
            pool.submit(run.local["mb"].reader.close).result(timeout=CALL_BOUND)
        pool.shutdown(wait=True)
        reliability.record("malformed MIME fuzz", inputs=run.tally.inputs, hangs=run.tally.hangs,
                           files=len(run.written))
    assert run.tally.failures == [], run.tally.failures
    check_after = indexed.fmail("sidecar", "check", check=False)
    assert check_after.returncode == 0, check_after.stdout[-2000:]


async def _read_over_mcp(env: MailEnv, sample: list[str], tally: Tally) -> None:
    """The same reads of a sample through the real server and the SDK's client: each answers
    (an error result is a clear message, not a crash) within the bound."""
    async with Client(server_params(env, "--read-only")) as client:
        for mid in sample:
            for tool, args in [("get_email", {"id": mid, "max_body_chars": 500}),
                               ("get_thread", {"thread_id": mid, "max_total_chars": 2000}),
                               ("get_attachment", {"id": mid, "index": 0, "max_chars": 500})]:
                tally.inputs += 1
                with anyio.move_on_after(CALL_BOUND) as scope:
                    result = await client.call_tool(tool, args)
                if scope.cancelled_caught:
                    tally.hangs += 1
                    tally.failures.append(f"{tool} {mid} over MCP: no answer in {CALL_BOUND}s")
                    continue
                if result.is_error:
                    text = result.content[0].text  # type: ignore[union-attr]
                    assert "Traceback" not in text and "internal" not in text.lower(), text
                else:
                    assert result.structured_content is not None, (tool, mid)

