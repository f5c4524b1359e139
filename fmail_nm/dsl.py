"""Gmail-shaped search DSL compiled to a notmuch infix query.

Pure module: no I/O and no notmuch import, so every rule is testable in isolation.

Safety model (verified against notmuch 0.37, see tests/test_dsl_notmuch.py):
- Phrase fields (from:, subject:, ...) are NOT made safe by doubling quotes: notmuch's field
  processor for from:/subject: unquotes the value and re-parses it wrapped in new quotes, so
  `from:"x"" OR tag:secret OR ""y"` really ORs in tag:secret.  A leading `/` means regex, a
  trailing `*` skips the re-quoting (`from:"path:**"` matches every message), `..` is read
  as a range, a value without a space is re-parsed without quotes, where `(OR)` is a
  syntax error, and Xapian ends a phrase at `“` or `”` as at `"`.  None of these is ever
  part of a Xapian word, so we replace them with spaces: the phrase matches exactly the
  same words and cannot escape.
- A phrase needs a character Xapian indexes: its term generator drops what its Unicode
  tables (Unicode 9 in Xapian 1.4) do not call a letter or digit, and a phrase left empty
  matches messages it does not name.  Python's tables are newer, so only letters and digits
  of Unicode 3.2 (``unicodedata.ucd_3_2_0``, a subset of every Xapian's) count.
- Term fields (tag:, folder:, path:, id:, thread:) match exact strings, so their values are
  kept verbatim: quoted infix when plain, else `sexp:"(tag ""...."")"`, whose strings are
  always literal (no regex, wildcard or `thread:{...}` subquery).
- `*` must stand alone in notmuch (`(*)` matches nothing, `x AND *` is a syntax error), and
  juxtaposed terms with the same boolean prefix are ORed, so we never emit `*` inside an
  expression and always join with an explicit AND.
"""

from __future__ import annotations

import calendar
import functools
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, tzinfo

from . import tags
from .config import THREAD_ID, folder_term
from .errors import CallerError

__all__ = ["DSL_HELP", "MAX_DEPTH", "MAX_QUERY_CHARS", "MAX_TOKENS", "CompiledQuery",
           "DslContext", "DslError", "compile_query", "list_names"]

# Limits checked before any parsing, so no input can make compiling (or Xapian's own parse of
# the result) slow or large: Xapian's memory grows faster than linearly with the number of
# terms (a 100 KB query took 4.6 GB), and the parser recurses once per nesting level.
MAX_QUERY_CHARS = 4096
MAX_TOKENS = 200
MAX_DEPTH = 32

DSL_HELP = """\
Query syntax (empty = all mail). Whole words (inv* = starting inv) and "exact phrases", any case.
from: to: (cc: bcc: = to:, all recipients) subject: body: filename: (attachment names);
  from:(a OR b) applies to each word; from:me to:me = the user's own addresses.
is:unread is:read is:flagged(=starred) replied forwarded sent draft inbox archived list blocked
  spam deleted; has:attachment (and any PDF), has:invitation (calendar); tag:x = label:x;
  account:work; list:rust-users (List-Id)
in:inbox sent drafts archive trash spam(=junk) anywhere, or a folder: in:Receipts in:work/Receipts
after:2026-03-01 (on or after) before:2026-04 (before) on:2026-03-15; dates YYYY-MM-DD,
  YYYY/MM/DD, YYYY-MM, YYYY, today, yesterday, unix seconds, local midnight;
  newer_than:3d older_than:1y (h d w m=months y)
id:<message-id> thread:<thread-id>; raw:"<query in notmuch's syntax>".
a b = AND; a OR b = a | b = {a b}; -a = NOT a; ( ); NOT > AND > OR; lowercase or/and/not
  are words; a AROUND 5 b: within 5 words ("a AROUND 5 b": a first).
Spam and deleted mail are hidden unless the query names them (is:spam, in:trash, ...) or
  says in:anywhere. Quote values with spaces: from:"Ann Lee" (\\" for a quote), and text
  with a colon: "Re: lunch".
Examples:
  from:alice is:unread newer_than:7d
  subject:(invoice OR receipt) has:attachment after:2026-01-01
  in:inbox -is:list -from:noreply
  (from:bob OR to:bob) before:2026/03/01
  account:work in:sent older_than:2m"""


@dataclass(frozen=True)
class DslContext:
    """Everything the compiler needs to know about the mailbox; no I/O behind it but the
    uid lookup the caller supplies."""

    now: datetime
    accounts: Mapping[str, str]
    folder_roles: Mapping[str, Sequence[str]]
    folders: Sequence[str] = ()
    # folder -> the server's name for it in its account ("[Gmail]/All Mail" for a Maildir++
    # store's ".[Gmail].All Mail"): what the user and the model call it.
    folder_names: Mapping[str, str] = field(default_factory=dict)
    excluded_tags: Sequence[str] = ("deleted", "spam")
    # account -> its INBOX outside its folder (mbsync's Inbox outside the store's Path)
    account_inboxes: Mapping[str, str] = field(default_factory=dict)
    # The user's addresses (sub-addresses too) of from:me, or (``received``) of to:me, cc:me
    # and bcc:me: asked for only by a query that says "me" (finding them reads the mirror).
    own_addresses: Callable[[bool], Sequence[str]] = lambda received: ()
    # A uid (the id every listing shows) -> its Message-ID, or None: id:<uid> finds it.
    message_id_of_uid: Callable[[str], str | None] = lambda uid: None

    def __post_init__(self) -> None:
        # Day boundaries and relative periods are computed in now's zone: a naive clock
        # would silently use the host's zone and shift every date by hours.
        if self.now.tzinfo is None or self.now.utcoffset() is None:
            raise ValueError("DslContext.now must be timezone-aware")


class DslError(CallerError):
    """A search the user (or LLM) can fix: says where, what was expected, what was found."""

    def __init__(self, position: int, expected: str, got: str) -> None:
        self.position = position
        self.expected = expected
        self.got = got
        super().__init__(f"bad search at position {position}: expected {expected} (got {got})")


@dataclass(frozen=True)
class CompiledQuery:
    query: str
    exclude_tags: tuple[str, ...]
    # The moment (epoch seconds) newer_than:/older_than: counted back from, for a search
    # that has them: a later page of the search compiles it at that moment again, so its
    # query -- and the set it pages through -- is the first page's.
    anchor: int | None = None


# --------------------------------------------------------------------------- tokens

_WORD, _PHRASE, _LPAREN, _RPAREN, _LBRACE, _RBRACE = "word", "phrase", "(", ")", "{", "}"
_OR, _AND, _NOT, _MINUS, _EOF = "OR", "AND", "NOT", "-", "end"
_KEYWORDS = {"OR": _OR, "AND": _AND, "NOT": _NOT}
_DELIMS = '()"|'
# Gmail's {a b} (any of them): "{" opens a group only where a term starts (or right after a
# text field's colon: from:{a b}), "}" closes one only while one is open, so that a tag or
# folder named "{y}" stays one word.
_BRACE_FIELD = re.compile(r"(?i)(?:from|to|cc|bcc|subject|body|filename):")


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    pos: int


def _shown(value: str) -> str:
    # Error messages go back to an LLM: keep them short whatever the input.
    return repr(value if len(value) <= 40 else value[:40] + "…")


def _describe(tok: _Tok) -> str:
    if tok.kind == _EOF:
        return "end of query"
    return _shown('"' + tok.text + '"' if tok.kind == _PHRASE else tok.text)


def _lex(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i = 0
    braces = 0  # "{" groups open
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif len(toks) >= MAX_TOKENS:
            raise DslError(i, f"at most {MAX_TOKENS} words, operators and parentheses",
                           "more; split the search or use fewer words")
        elif ch in "()" or ch == "{" or (ch == "}" and braces):
            braces += {"{": 1, "}": -1}.get(ch, 0)
            toks.append(_Tok(ch, ch, i))
            i += 1
        elif ch == "|":
            toks.append(_Tok(_OR, "|", i))
            i += 1
        elif ch == '"':
            i = _lex_phrase(text, i, toks)
        elif ch == "-" and _minus_is_not(text, i):
            toks.append(_Tok(_MINUS, "-", i))
            i += 1
        else:
            i = _lex_word(text, i, toks, braces > 0)
    toks.append(_Tok(_EOF, "", len(text)))
    return toks


def _minus_is_not(text: str, i: int) -> bool:
    # `-` negates only when it starts a term; a lone `-` and `e-mail` are text.
    nxt = text[i + 1] if i + 1 < len(text) else " "
    return not nxt.isspace() and nxt not in ")|"


def _lex_word(text: str, i: int, toks: list[_Tok], in_braces: bool) -> int:
    start = i
    while i < len(text) and not text[i].isspace() and text[i] not in _DELIMS:
        if text[i] == "}" and in_braces:
            break
        if text[i] == "{" and _BRACE_FIELD.fullmatch(text, start, i):
            break  # from:{a b}: the field, then its group
        i += 1
    word = text[start:i]
    toks.append(_Tok(_KEYWORDS.get(word, _WORD), word, start))
    return i


def _lex_phrase(text: str, start: int, toks: list[_Tok]) -> int:
    # Only \" and \\ are escapes, so Windows paths and regexes keep their backslashes.
    out: list[str] = []
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in '"\\':
            out.append(text[i + 1])
            i += 2
        elif ch == '"':
            toks.append(_Tok(_PHRASE, "".join(out), start))
            return i + 1
        else:
            out.append(ch)
            i += 1
    raise DslError(
        start, f"a closing '\"' for the quote opened at position {start}", "end of query"
    )


# --------------------------------------------------------------------------- query tree


@dataclass(frozen=True)
class _Atom:
    text: str


@dataclass(frozen=True)
class _And:
    kids: tuple[_Node, ...]


@dataclass(frozen=True)
class _Or:
    kids: tuple[_Node, ...]


@dataclass(frozen=True)
class _Not:
    kid: _Node


@dataclass(frozen=True)
class _Const:
    name: str


_Node = _Atom | _And | _Or | _Not | _Const
# ALL: no restriction (in:anywhere).  EMPTY: a term with no words, which Xapian drops from
# its parent, so we do the same.  NOTHING: matches no message (e.g. before:1960).
_ALL, _EMPTY, _NOTHING = _Const("all"), _Const("empty"), _Const("nothing")
_NOTHING_QUERY = 'sexp:"(not ())"'


def _mk_and(nodes: Sequence[_Node]) -> _Node:
    if _NOTHING in nodes:
        return _NOTHING
    kids: list[_Node] = []
    for n in nodes:
        kids.extend(
            n.kids if isinstance(n, _And) else [n] if isinstance(n, _Atom | _Or | _Not) else []
        )
    if not kids:
        return _ALL if _ALL in nodes else _EMPTY
    return kids[0] if len(kids) == 1 else _And(tuple(kids))


def _mk_or(nodes: Sequence[_Node]) -> _Node:
    if _ALL in nodes:
        return _ALL
    kids: list[_Node] = []
    for n in nodes:
        kids.extend(
            n.kids if isinstance(n, _Or) else [n] if isinstance(n, _Atom | _And | _Not) else []
        )
    if not kids:
        return _NOTHING if _NOTHING in nodes else _EMPTY
    return kids[0] if len(kids) == 1 else _Or(tuple(kids))


def _mk_not(node: _Node) -> _Node:
    flips: dict[_Node, _Node] = {_ALL: _NOTHING, _NOTHING: _ALL, _EMPTY: _EMPTY}
    if isinstance(node, _Const):
        return flips[node]
    return node.kid if isinstance(node, _Not) else _Not(node)


def _asked_for(node: _Node, positive: bool = True) -> Iterator[_Atom]:
    """The atoms a match must satisfy (under an even number of NOTs)."""
    if isinstance(node, _Atom):
        if positive:
            yield node
    elif isinstance(node, _Not):
        yield from _asked_for(node.kid, not positive)
    elif isinstance(node, _And | _Or):
        for kid in node.kids:
            yield from _asked_for(kid, positive)


def _render(node: _Node) -> str:
    if isinstance(node, _Atom):
        return node.text
    if isinstance(node, _Not):
        inner = _render(node.kid)
        return "NOT " + (f"({inner})" if isinstance(node.kid, _And | _Or) else inner)
    if isinstance(node, _And):
        return _render_and(node)
    if isinstance(node, _Or):
        return " OR ".join(
            f"({_render(k)})" if isinstance(k, _And | _Not) else _render(k) for k in node.kids
        )
    return _NOTHING_QUERY if node is _NOTHING else "*"


def _render_and(node: _And) -> str:
    # Positive terms first reads naturally (`a AND NOT b`); a leading NOT gets parentheses
    # so it can never be read as negating the whole conjunction.
    kids = sorted(node.kids, key=lambda k: isinstance(k, _Not))
    parts = [f"({_render(k)})" if isinstance(k, _Or) else _render(k) for k in kids]
    if isinstance(kids[0], _Not):
        parts[0] = f"({parts[0]})"
    return " AND ".join(parts)


# --------------------------------------------------------------------------- value helpers

# `..` anywhere in a quoted phrase makes Xapian try a range ("Unknown range operation");
# a value without a space is parsed as a query of its own, where `(OR)` is a syntax error.
# Xapian also ends a phrase at a curly double quote (“ or ”), as at a straight one.
_PHRASE_UNSAFE = re.compile(r'["\u201c\u201d*/()\x00-\x1f\x7f]|\.{2,}')
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# Plain values go out as readable `prefix:"value"`; anything notmuch's term processors would
# reinterpret (leading / = regex, leading { = thread subquery, * = wildcard) goes out as sexp.
_INFIX_SAFE = re.compile(r'(?![/{])[^"*\x00-\x1f\x7f]+')


def _letter_or_digit(c: str) -> bool:
    return unicodedata.ucd_3_2_0.category(c)[0] in "LN"


def _has_word(value: str) -> bool:
    """Whether Xapian makes at least one term of the value (see the module docstring)."""
    return any(c == "_" or _letter_or_digit(c) for c in value)


def _has_new_letter(value: str) -> bool:
    """Whether a value with no word (see _has_word) has a letter or digit by today's Unicode
    tables: one Xapian may index (see the module docstring), so dropping it would widen the
    search.  Signs, symbols, emoji and invisible characters are not searchable: ignored, as
    notmuch and Gmail ignore them."""
    return any(unicodedata.category(c)[0] in "LN" for c in value)


_UNSEARCHABLE_NOTE = ("emoji, symbols and characters newer than Unicode 3.2 alone cannot be "
                      "searched")
_UNSEARCHABLE = f"words with letters or digits ({_UNSEARCHABLE_NOTE})"


def _clean_phrase(value: str) -> str:
    # These characters are never part of a Xapian word, so blanking them keeps the phrase's
    # meaning while removing every way out of the quotes (see module docstring).
    return " ".join(_PHRASE_UNSAFE.sub(" ", value).split())


def _phrase_atom(prefix: str, value: str) -> _Atom:
    return _Atom(f'{prefix}:"{value}"' if prefix else f'"{value}"')


def _term_atom(prefix: str, value: str, suffix: str = "") -> _Atom:
    if _INFIX_SAFE.fullmatch(value):
        return _Atom(f'{prefix}:"{value}{suffix}"')
    sexp_string = (value + suffix).replace("\\", "\\\\").replace('"', '\\"')
    sexp = f'({prefix} "{sexp_string}")'
    return _Atom('sexp:"' + sexp.replace('"', '""') + '"')


def _folder_atom(folder: str) -> _Atom:
    return _term_atom("folder", folder_term(folder))


def _bounded_list(names: Sequence[str], limit: int = 30) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", … ({len(names) - limit} more)" if len(names) > limit else "")


# AROUND's largest distance, and the one a bare AROUND means (as in Gmail).
MAX_AROUND, DEFAULT_AROUND = 50, 5
_AROUND = "AROUND"
_DISTANCE = re.compile(r"[0-9]{1,6}")  # ASCII digits: str.isdigit() also takes "²"


# Gmail's "a AROUND 5 b" in quotes: the first word stays first (notmuch's ADJ/5).
_QUOTED_AROUND = re.compile(r"\s*(\S+)\s+AROUND(?:\s+([0-9]{1,6}))?\s+(\S+)\s*")


def _proximity(first: _Tok, number: _Tok | None, second: _Tok, *, ordered: bool) -> _Node:
    """``first`` and ``second`` at most ``number`` (DEFAULT_AROUND) words apart; with
    ``ordered`` in that order."""
    distance = DEFAULT_AROUND
    if number is not None:
        distance = int(number.text) if _DISTANCE.fullmatch(number.text) else 0
        if not 1 <= distance <= MAX_AROUND:
            raise DslError(number.pos, f"a distance from 1 to {MAX_AROUND} after AROUND",
                           _shown(number.text))
    words = [_near_word(tok) for tok in (first, second)]
    return _Atom(f"({words[0]} {'ADJ' if ordered else 'NEAR'}/{distance} {words[1]})")


# Words notmuch's parser reads as its operators in any case: NEAR cannot take them.
_XAPIAN_OPERATORS = frozenset({"and", "or", "not", "xor", "near", "adj"})


def _word_char(c: str) -> bool:
    """Whether Xapian's query parser takes the character as part of a word (letters, digits,
    marks and connectors such as ``_``), not as query syntax; in every Unicode version from
    3.2 to today's (see the module docstring)."""
    return all(category[0] in "LNM" or category == "Pc"
               for category in (unicodedata.ucd_3_2_0.category(c), unicodedata.category(c)))


def _xapian_lower(word: str) -> str:
    """The word lowercased as Xapian indexes it: each character on its own, by the simple
    mapping (str.lower makes a final Σ ς, and İ two characters where Xapian makes it i)."""
    return "".join(c.lower()[0] for c in word)


# What joins two word characters into one term, for Xapian's query parser and its indexer
# alike (1.4's check_infix and check_infix_digit): ' & and a few like them anywhere, . , ;
# and a few like them between digits; invisible ones are dropped from the term.
_INFIX = frozenset("'&\u00b7\u05f4\u2027\u2019\u201b")
_DIGIT_INFIX = frozenset(",.;\u037e\u0589\u060d\u07f8\u2044\ufe10\ufe13\ufe14")
_IGNORED_INFIX = frozenset("\u200b\u200c\u200d\u2060\ufeff")


def _digit(c: str) -> bool:
    return unicodedata.ucd_3_2_0.category(c) == unicodedata.category(c) == "Nd"


def _joins(word: str, i: int) -> bool:
    """Whether word[i], not a word character, joins its neighbours into one term."""
    if not 0 < i < len(word) - 1 or not (_word_char(word[i - 1]) and _word_char(word[i + 1])):
        return False
    digits = _digit(word[i - 1]) and _digit(word[i + 1])
    return word[i] in (_DIGIT_INFIX if digits else _INFIX) or word[i] in _IGNORED_INFIX


def _one_term(word: str) -> bool:
    """Whether Xapian's query parser reads the word as one term, as its indexer does: word
    characters, single joining characters between them (o'brien, at&t, 3.5, 1,000)."""
    return bool(word) and all(_word_char(c) or _joins(word, i) for i, c in enumerate(word))


def _near_word(tok: _Tok) -> str:
    """A word NEAR can take: one Xapian term (see _one_term; it reads anything else as query
    syntax), with a character it indexes, and none of its operators."""
    word = _xapian_lower(tok.text)
    if not _one_term(word) or not _has_word(word):
        raise DslError(tok.pos, "a plain word (letters and digits, or joined as in o'brien, "
                                "at&t, 3.5) each side of AROUND", _shown(tok.text))
    if word in _XAPIAN_OPERATORS:
        raise DslError(tok.pos, "a word other than and, or, not, xor, near or adj each side of "
                                "AROUND", _shown(tok.text))
    return word


# Xapian expands a prefix to every word starting with it, unbounded in notmuch: a short one
# would make a query of much of the index's vocabulary.
MIN_PREFIX = 3


def _word_prefix(value: str, pos: int) -> _Atom:
    """``invo*``: words starting with one word (Xapian's wildcard, which reads anything but
    one term as query syntax, and drops the star after a word it splits)."""
    stem = _xapian_lower(value[:-1])
    if not _one_term(stem) or stem in _XAPIAN_OPERATORS:
        raise DslError(pos, "one word before a trailing '*' (words starting with it): "
                       "letters and digits, joined only as in o'brien, at&t or 3.5; quote "
                       "other punctuation for the phrase (\"e-mail\", \"x.org\")", _shown(value))
    # A joining character pins the stem at both ends: 3.5 is as narrow as three letters, and
    # so is _, a word character to Xapian (x_y* finds x_yz).
    if sum(_has_word(c) or c in _INFIX or c in _DIGIT_INFIX for c in stem) < MIN_PREFIX:
        raise DslError(pos, f"a word of {MIN_PREFIX} or more letters, digits or '_' before a "
                       "trailing '*' (words starting with it)", _shown(value))
    return _Atom(stem + "*")


# --------------------------------------------------------------------------- dates

_DATE_RE = re.compile(r"(\d{4})(?:([-/])(\d{1,2})(?:\2(\d{1,2}))?)?")
_EPOCH_RE = re.compile(r"\d{5,12}")
_DAY_WORDS = {"today": 0, "yesterday": 1}
_PERIOD_RE = re.compile(r"(\d{1,6})([hdwmy])", re.IGNORECASE)
# 10000-01-02T00:00:00Z, beyond anything notmuch stores: it keeps the last day of 9999 in
# a zone west of UTC as it is (up to 10000-01-01T23:59:59Z); ranges that ended at 10000-01-01
# missed such mail, and a page counting where a date starts (reads._whole_edges) dropped it.
_MAX_EPOCH = 253402387200
_SECONDS = {"h": 3600, "d": 86400, "w": 7 * 86400}


def _local_epoch(tz: tzinfo | None, year: int, month: int, day: int) -> int:
    if year > 9999:
        return _MAX_EPOCH
    return int(datetime(year, month, day, tzinfo=tz).timestamp())


def _parse_date(value: str, pos: int, tz: tzinfo | None) -> tuple[int, int]:
    """Return [start, end) epochs of the day, month or year (or second) named by value."""
    if _EPOCH_RE.fullmatch(value):
        return int(value), int(value) + 1
    m = _DATE_RE.fullmatch(value)
    expected = "a date like 2026-03-01, 2026/03/01, 2026-03, 2026, today or unix seconds"
    if not m:
        raise DslError(pos, expected, _shown(value))
    year, month, day = int(m[1]), int(m[3] or 0), int(m[4] or 0)
    if not _valid_date(year, month, day, has_month=m[3] is not None, has_day=m[4] is not None):
        raise DslError(pos, "a real calendar date", _shown(value))
    if m[4]:
        return local_day(date(year, month, day), tz)
    if m[3]:
        ny, nm = (year + 1, 1) if month == 12 else (year, month + 1)
        return _local_epoch(tz, year, month, 1), _local_epoch(tz, ny, nm, 1)
    return _local_epoch(tz, year, 1, 1), _local_epoch(tz, year + 1, 1, 1)


def local_day(day: date, tz: tzinfo | None) -> tuple[int, int]:
    """[start, end) epochs of the day in the zone: from its midnight (or, where a switch
    skips midnight, from when its clock resumes) to the next day's."""
    return (_local_epoch(tz, day.year, day.month, day.day),
            _next_day(tz, day.year, day.month, day.day))


def _next_day(tz: tzinfo | None, year: int, month: int, day: int) -> int:
    # Computed from the calendar, not +86400, so DST days (23 h / 25 h) end at midnight.
    last = calendar.monthrange(year, month)[1]
    if day < last:
        return _local_epoch(tz, year, month, day + 1)
    ny, nm = (year + 1, 1) if month == 12 else (year, month + 1)
    return _local_epoch(tz, ny, nm, 1)


def _valid_date(year: int, month: int, day: int, has_month: bool, has_day: bool) -> bool:
    if year < 1 or (has_month and not 1 <= month <= 12):
        return False
    return not has_day or 1 <= day <= calendar.monthrange(year, month)[1]


def _months_ago(now: datetime, months: int) -> int:
    total = now.year * 12 + now.month - 1 - months
    year, month0 = divmod(total, 12)
    if year < 1970:
        return -1  # clamped by the range helpers: nothing is stored before the epoch
    day = min(now.day, calendar.monthrange(year, month0 + 1)[1])
    return int(now.replace(year=year, month=month0 + 1, day=day).timestamp())


def _period_cutoff(value: str, pos: int, name: str, now: datetime) -> int:
    m = _PERIOD_RE.fullmatch(value)
    if not m:
        raise DslError(
            pos, f"a period after '{name}:' like 12h, 3d, 2w, 6m (months) or 1y", _shown(value)
        )
    count, unit = int(m[1]), m[2].lower()
    if unit in _SECONDS:
        return int(now.timestamp()) - count * _SECONDS[unit]
    return _months_ago(now, count * (12 if unit == "y" else 1))


def _since(epoch: int) -> _Node:
    # notmuch rejects negative @epochs; nothing is dated before 1970 anyway.
    return _Atom(f"date:@{max(epoch, 0)}..")


def _before(epoch: int) -> _Node:
    # @a..@b is inclusive at both ends with whole seconds, so "< epoch" is "..@epoch-1".
    # (A date like date:..2026-03-01 would be rounded up to the end of that day.)
    return _NOTHING if epoch <= 0 else _Atom(f"date:..@{min(epoch, _MAX_EPOCH) - 1}")


def _between(start: int, end: int) -> _Node:
    if end <= 0:
        return _NOTHING
    return _Atom(f"date:@{max(start, 0)}..@{min(end, _MAX_EPOCH) - 1}")


def date_range_query(start: int, end: int) -> str:
    """notmuch's query for the mail dated ``start`` <= date < ``end`` (Unix seconds), as the
    DSL's own dates put it: notmuch refuses a negative @epoch, and files mail dated before
    1970 where it files undated mail, at 0."""
    return _render(_between(start, end))


# --------------------------------------------------------------------------- vocabulary

_PHRASE_FIELDS = {
    "from": "from",
    "to": "to",
    # notmuch indexes To, Cc and Bcc together under to:, it has no cc:/bcc: prefixes.
    "cc": "to",
    "bcc": "to",
    "subject": "subject",
    "body": "body",
    "filename": "attachment",
}
_ADDRESS_FIELDS = frozenset({"from", "to", "cc", "bcc"})
# notmuch tags (and indexes the file names of) only parts sent with "Content-Disposition:
# attachment"; Apple Mail sends files inline, so a PDF, which is never a message's own
# text, is found by its type for has:attachment and filename:pdf.
_INLINE_PDF = _Atom('mimetype:"application/pdf"')
# has:invitation: the iCalendar types (message.mime reads the same ones; this layer
# cannot import it).
_INVITATION_TYPES = ("text/calendar", "application/ics")
# has:attachment finds, besides the tag and a PDF, the other parts sent inline that get_email
# lists as attachments and notmuch indexes by type: a forwarded message, an invitation.
_INLINE_ATTACHMENT_TYPES = ("message/rfc822", *_INVITATION_TYPES)


def _types_atoms(kinds: Sequence[str]) -> list[_Node]:
    return [_Atom(f'mimetype:"{kind}"') for kind in kinds]
# is:<word> -> the tag it means (Gmail's words and notmuch's own tag names).
_IS_TAGS = {
    "unread": tags.UNREAD,
    "flagged": tags.FLAGGED,
    "starred": tags.FLAGGED,
    "replied": tags.REPLIED,
    "forwarded": tags.PASSED,
    "passed": tags.PASSED,
    "sent": tags.SENT,
    "outgoing": tags.SENT,
    "draft": tags.DRAFT,
    "inbox": tags.INBOX,
    "archived": tags.ARCHIVED,
    "list": tags.LIST,
    "blocked": tags.BLOCKED,
    "spam": tags.SPAM,
    "deleted": tags.DELETED,
}

# Tags that always come with another one, so asking for the first must lift the second's
# exclusion too.
_IMPLIED_TAGS = {tags.BLOCKED: tuple(t for t in tags.BLOCK_TAGS if t != tags.BLOCKED)}
_IS_VALUES = sorted([*_IS_TAGS, "read"])
# Folder roles: DSL name -> (role key(s) in DslContext.folder_roles, the tag with that meaning).
_ROLES: dict[str, tuple[tuple[str, ...], str]] = {
    "sent": (("sent",), tags.SENT),
    "drafts": (("drafts", "draft"), tags.DRAFT),
    "draft": (("drafts", "draft"), tags.DRAFT),
    "trash": (("trash",), tags.ROLE_TAGS["trash"]),
    "spam": (("junk", "spam"), tags.ROLE_TAGS["junk"]),
    "junk": (("junk", "spam"), tags.ROLE_TAGS["junk"]),
    "archive": (("archive",), tags.ROLE_TAGS["archive"]),
}
_IN_KEYWORDS = ["inbox", "sent", "drafts", "trash", "spam", "junk", "archive", "anywhere"]
_DATE_OPS = {"after", "before", "on", "newer", "older"}
_OPERATORS = sorted(
    [*_PHRASE_FIELDS, "is", "has", "in", "tag", "label", "list", "account", *_DATE_OPS]
    + ["newer_than", "older_than", "id", "rfc822msgid", "thread", "raw"]
)
# Gmail operators this mailbox cannot answer, and what to ask instead.
_SIZES = ("sizes are not in the search index: query_emails has them (SELECT uid, subject, "
          "size FROM emails WHERE size > 5000000 ORDER BY size DESC)")
_GMAIL_ONLY = {
    "larger": _SIZES, "smaller": _SIZES, "size": _SIZES,
    "deliveredto": "to: (it matches To, Cc and Bcc)",
    "category": "is:list or list:NAME (Gmail's categories do not exist here)",
}
# notmuch's own prefixes, which a model that knows notmuch writes: the operator meant here.
_NOTMUCH_ONLY = {
    "folder": "in:NAME (a folder as list_folders names it)",
    "path": "in:NAME (a folder as list_folders names it)",
    "date": "after:, before: or on: (YYYY/MM/DD), or newer_than:/older_than: (7d, 2m, 1y)",
    "mimetype": "has:attachment or filename:EXT",
}
_RAW_HINT = ', or raw:"<notmuch query>" for notmuch\'s own {}:'
_OP_RE = re.compile(r"([A-Za-z][A-Za-z0-9_]*):(.*)", re.DOTALL)
_LIST_RE = re.compile(r"[a-z0-9][a-z0-9._+=-]*")


def list_names(shown: Iterable[str], known: Iterable[str]) -> dict[str, str]:
    """Each ``shown`` list id (of a ``list/<id>`` tag) by its fewest leading labels that
    list:NAME finds alone among the ``known`` ones (the user's lists): ``golang-nuts`` for
    golang-nuts.googlegroups.com.  An id no shorter name finds alone is left out."""
    lists = tuple(sorted(set(known)))
    holders = _holders(lists)
    names = {}
    for list_id in set(shown).intersection(lists):
        labels = list_id.split(".")
        name = next((name for name in (".".join(labels[:n]) for n in range(1, len(labels)))
                     if holders[name] == 1 and _LIST_RE.fullmatch(name)), None)
        if name is not None:
            names[list_id] = name
    return names


@functools.lru_cache(maxsize=4)  # the user's lists change seldom; a page asks each time
def _holders(lists: tuple[str, ...]) -> Mapping[str, int]:
    """How many of the lists each run of labels names: list:NAME finds the ids that hold
    NAME's labels as a run of their own (see _list)."""
    holders: dict[str, int] = {}
    for run in (run for list_id in lists for run in _label_runs(list_id)):
        holders[run] = holders.get(run, 0) + 1
    return holders


def _label_runs(list_id: str) -> set[str]:
    """Every run of whole dot-separated labels of a list id: what list: finds it by."""
    labels = list_id.split(".")
    return {".".join(labels[i:j]) for i in range(len(labels))
            for j in range(i + 1, len(labels) + 1)}


# --------------------------------------------------------------------------- parser


class _Parser:
    """Recursive descent, Gmail precedence NOT > AND > OR:
    or := and (OR and)*;  and := unary (AND? unary)*;  unary := (NOT | -)* primary."""

    def __init__(self, text: str, ctx: DslContext) -> None:
        self.text = text
        self.toks = _lex(text)
        self.i = 0
        self.ctx = ctx
        self.lifted: set[str] = set()
        # Atoms of tags that come with others, and those others (_IMPLIED_TAGS).
        self.implying: dict[_Node, tuple[str, ...]] = {}
        self.lift_all = False
        self.used_now = False
        self.depth = 0
        self.handlers: dict[str, Callable[[str, str, int], _Node]] = self._handlers()

    def _handlers(self) -> dict[str, Callable[[str, str, int], _Node]]:
        table: dict[str, Callable[[str, str, int], _Node]] = dict.fromkeys(
            _PHRASE_FIELDS, self._phrase_field
        )
        table.update(dict.fromkeys(["tag", "label"], self._tag))
        table.update(dict.fromkeys(_DATE_OPS, self._date))
        table.update(dict.fromkeys(["newer_than", "older_than"], self._relative))
        table.update(dict.fromkeys(["id", "rfc822msgid"], self._msgid))
        simple = {"is": self._is, "has": self._has, "in": self._in, "list": self._list}
        return table | simple | {"account": self._account, "thread": self._thread, "raw": self._raw}

    # -- token plumbing

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def _advance(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def _starts_term(self) -> bool:
        return self.tok.kind in (_WORD, _PHRASE, _LPAREN, _LBRACE, _NOT, _MINUS)

    def _need_term(self, after: str) -> None:
        if not self._starts_term():
            raise DslError(self.tok.pos, f"a search term after '{after}'", _describe(self.tok))

    # -- grammar

    def parse(self) -> _Node:
        if self.tok.kind == _EOF:
            return _EMPTY  # empty query: all mail
        node = self._or_expr(None)
        if self.tok.kind in (_RPAREN, _RBRACE):
            opening = "(" if self.tok.kind == _RPAREN else "{"
            raise DslError(self.tok.pos, "a search term or the end of the query",
                           f"a '{self.tok.kind}' with no matching '{opening}'")
        if node is _EMPTY:  # every term ignored: a search for nothing must not find all mail
            raise DslError(self.toks[0].pos, "words with letters or digits (punctuation and "
                           "symbols alone are ignored; an empty search is all mail)",
                           _shown(self.text))
        return node

    def _or_expr(self, default: str | None) -> _Node:
        items = [self._and_expr(default)]
        while self.tok.kind == _OR:
            self._need_term(self._advance().text)
            items.append(self._and_expr(default))
        return _mk_or(items)

    def _and_expr(self, default: str | None) -> _Node:
        items = [self._unary(default)]
        while self.tok.kind not in (_EOF, _RPAREN, _RBRACE, _OR):
            if self.tok.kind == _AND:
                self._need_term(self._advance().text)
            items.append(self._unary(default))
        return _mk_and(items)

    def _near_or_primary(self, default: str | None) -> _Node:
        # `a AROUND b` is one term wherever a word is (after -, inside { }): read as two
        # words and "AROUND", it would search that word instead, or ({ }) any of the three.
        after = self.toks[self.i + 1] if self.tok.kind == _WORD else None
        if after is not None and after.text == _AROUND:
            if default is not None:  # from:(a AROUND b) read "AROUND" as a name to find
                raise DslError(after.pos, "AROUND between plain words, outside a field's "
                               "( ) or { }", _shown(after.text))
            return self._around()
        return self._primary(default)

    def _around(self) -> _Node:
        """Gmail's ``a AROUND 5 b``: the two words at most 5 words apart, in either order
        (notmuch's ``NEAR/5``, which takes bare words only)."""
        first = self._advance()
        self._advance()
        number = None
        # Any digits are a distance: ² is also a word, but never the one meant here.
        if self.tok.kind == _WORD and self.tok.text.isdigit():
            number = self._advance()
        if self.tok.kind != _WORD:
            raise DslError(self.tok.pos, "a word after AROUND", _describe(self.tok))
        near = _proximity(first, number, self._advance(), ordered=False)
        # A second AROUND would be a word to find, and Gmail does not say what a chain means.
        if self.tok.kind == _WORD and self.tok.text == _AROUND:
            raise DslError(self.tok.pos, "one AROUND between two words, not a chain (join "
                           "pairs with AND: a AROUND b AND b AROUND c)", _shown(self.tok.text))
        return near

    def _unary(self, default: str | None) -> _Node:
        if self.tok.kind in (_NOT, _MINUS):
            self._need_term(self._advance().text)
            with self._nested():
                return _mk_not(self._unary(default))
        return self._near_or_primary(default)

    @contextmanager
    def _nested(self) -> Iterator[None]:
        # Recursion per ( or NOT: bounded so a deep input gets an error, not a RecursionError.
        if self.depth >= MAX_DEPTH:
            raise DslError(self.tok.pos, f"at most {MAX_DEPTH} nested '( )' or NOT",
                           "deeper nesting")
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def _primary(self, default: str | None) -> _Node:
        tok = self.tok
        if tok.kind == _LPAREN:
            return self._group(default)
        if tok.kind == _LBRACE:
            return self._any_of(default)
        if tok.kind == _PHRASE:
            self._advance()
            ordered = _QUOTED_AROUND.fullmatch(tok.text) if default is None else None
            if ordered is None:
                return self._term(default, tok.text, tok.pos)

            def word(group: int) -> _Tok:  # positions inside the quotes
                return _Tok(_WORD, ordered[group], tok.pos + 1 + ordered.start(group))
            return _proximity(word(1), word(2) if ordered[2] else None, word(3), ordered=True)
        if tok.kind == _WORD:
            self._advance()
            return self._word(default, tok)
        raise DslError(tok.pos, "a search term", _describe(tok))

    def _group(self, default: str | None) -> _Node:
        open_tok = self._advance()
        if self.tok.kind == _RPAREN:
            raise DslError(self.tok.pos, "a search term inside '( )'", "')'")
        with self._nested():
            node = self._or_expr(default)
        if self.tok.kind != _RPAREN:
            raise DslError(
                self.tok.pos,
                f"')' to close the '(' at position {open_tok.pos}",
                _describe(self.tok),
            )
        self._advance()
        return node

    def _any_of(self, default: str | None) -> _Node:
        """Gmail's ``{a b}``: any of the terms (``a OR b``)."""
        open_tok = self._advance()
        items: list[_Node] = []
        with self._nested():
            while self.tok.kind not in (_RBRACE, _EOF):
                if self.tok.kind == _OR and items:
                    self._need_term(self._advance().text)
                elif self.tok.kind == _AND:
                    raise DslError(self.tok.pos, "terms of which any may match inside '{ }'",
                                   "'AND' (use ( ) for all of them)")
                items.append(self._unary(default))
        if self.tok.kind != _RBRACE:
            raise DslError(self.tok.pos, f"'}}' to close the '{{' at position {open_tok.pos}",
                           _describe(self.tok))
        if not items:
            raise DslError(self.tok.pos, "a search term inside '{ }'", "'}'")
        self._advance()
        return _mk_or(items)

    def _word(self, default: str | None, tok: _Tok) -> _Node:
        m = _OP_RE.fullmatch(tok.text)
        name = m[1].lower() if m else ""
        # Unknown `word:` is an error (it is almost always a mistyped operator), except URLs
        # (https://…) and things like times or ids whose "name" has digits (10:30, T10:30).
        if not m or m[2].startswith("//") or (name not in self.handlers and not m[1].isalpha()):
            return self._bare_value(default, tok.text, tok.pos)
        if name in _GMAIL_ONLY:
            raise DslError(tok.pos, _GMAIL_ONLY[name], _shown(m[1] + ":"))
        if name in _NOTMUCH_ONLY:
            raise DslError(tok.pos, _NOTMUCH_ONLY[name] + _RAW_HINT.format(name),
                           _shown(m[1] + ":"))
        if name not in self.handlers:
            known = ", ".join(f"{op}:" for op in _OPERATORS)
            raise DslError(
                tok.pos, f"a known operator ({known}) or quotes around text", _shown(m[1] + ":")
            )
        if m[2]:
            return self._bare_value(name, m[2], tok.pos + len(name) + 1)
        return self._detached_value(name)

    def _detached_value(self, name: str) -> _Node:
        # `from:"a b"`, `from: bob` and `from:(a OR b)` all give from: its value.
        tok = self.tok
        if tok.kind == _LPAREN:
            return self._group(name)
        if tok.kind == _LBRACE:
            return self._any_of(name)
        is_op = (
            tok.kind == _WORD
            and (m := _OP_RE.fullmatch(tok.text)) is not None
            and m[1].lower() in self.handlers
        )
        if tok.kind not in (_WORD, _PHRASE) or is_op:
            raise DslError(tok.pos, f"a value after '{name}:'", _describe(tok))
        self._advance()
        if tok.kind == _PHRASE:
            return self._term(name, tok.text, tok.pos)
        return self._bare_value(name, tok.text, tok.pos)

    # -- terms

    def _bare_value(self, name: str | None, value: str, pos: int) -> _Node:
        """An unquoted value: Gmail's ``me`` after an address field is the user ("me" in
        quotes is the word); with no field, ``*`` is all mail and ``inv*`` a word prefix, and
        a text field's value cannot end in ``*``."""
        if name in _ADDRESS_FIELDS and value.lower() == "me":
            return self._me(name, pos)
        if name is None and value == "*":
            return _ALL  # notmuch's word for all mail
        if name is None and value.endswith("*"):
            return _word_prefix(value, pos)
        if name in _PHRASE_FIELDS and value.endswith("*"):
            # Blanked (see the module docstring), it would search the word, not its prefix;
            # in quotes a star is punctuation of the phrase.
            raise DslError(pos, f"whole words after '{name}:' (inv* without a field finds "
                           "words starting with inv)", _shown(value))
        return self._term(name, value, pos)

    def _me(self, name: str, pos: int) -> _Node:
        me = self.ctx.own_addresses(name != "from")
        if not me:
            raise DslError(pos, f"addresses of the user's for '{name}:me' (addresses in "
                                f"fmail.toml, or notmuch's user.primary_email)", "none set")
        words = (_clean_phrase(address) for address in me)
        return _mk_or([_phrase_atom(_PHRASE_FIELDS[name], text) for text in words
                       if _has_word(text)])

    def _term(self, name: str | None, value: str, pos: int) -> _Node:
        if name is None:
            text = _clean_phrase(value)
            if _has_word(text):
                return _phrase_atom("", text)
            if _has_new_letter(text):
                raise DslError(pos, _UNSEARCHABLE, _shown(value))
            return _EMPTY  # nothing searchable (punctuation, symbols): ignored
        if not value:
            raise DslError(pos, f"a value after '{name}:'", "an empty value")
        return self.handlers[name](name, value, pos)

    def _phrase_field(self, name: str, value: str, pos: int) -> _Node:
        text = _clean_phrase(value)
        if not _has_word(text):
            raise DslError(pos, f"a value with letters or digits after '{name}:' "
                           f"({_UNSEARCHABLE_NOTE})", _shown(value))
        atom = _phrase_atom(_PHRASE_FIELDS[name], text)
        if name == "filename" and text.lower() in ("pdf", ".pdf"):
            return _mk_or([atom, _INLINE_PDF])  # as has:attachment: PDFs sent inline too
        return atom

    def _exact_value(self, name: str, value: str, pos: int) -> str:
        if _CONTROL.search(value):
            raise DslError(
                pos, f"a value after '{name}:' without control characters", _shown(value)
            )
        return value

    def _tag_atom(self, tag: str) -> _Node:
        # Naming an excluded tag means the user wants to see it (notmuch does the same).
        self.lifted.add(tag)
        atom = _term_atom("tag", tag)
        if tag in _IMPLIED_TAGS:  # lifted where asked for, not negated (see compile_query)
            self.implying[atom] = _IMPLIED_TAGS[tag]
        return atom

    def _tag(self, name: str, value: str, pos: int) -> _Node:
        return self._tag_atom(self._exact_value(name, value, pos))

    def _is(self, name: str, value: str, pos: int) -> _Node:
        key = value.lower()
        if key == "read":
            return _mk_not(self._tag_atom("unread"))
        if key not in _IS_TAGS:
            raise DslError(pos, f"one of is:{', is:'.join(_IS_VALUES)}", _shown(value))
        return self._tag_atom(_IS_TAGS[key])

    def _has(self, name: str, value: str, pos: int) -> _Node:
        if value.lower() in ("invitation", "invite"):
            return _mk_or(_types_atoms(_INVITATION_TYPES))
        if value.lower() not in ("attachment", "attachments"):
            raise DslError(pos, "has:attachment or has:invitation", _shown(value))
        return _mk_or([self._tag_atom("attachment"), _INLINE_PDF,
                       *_types_atoms(_INLINE_ATTACHMENT_TYPES)])

    def _in(self, name: str, value: str, pos: int) -> _Node:
        key = value.lower()
        if key == "anywhere":
            self.lift_all = True
            return _ALL
        if key == "inbox":
            return self._tag_atom("inbox")
        if key in _ROLES:
            return self._role(*_ROLES[key])
        return self._folders(value, pos)

    def _role_folders(self, keys: Sequence[str]) -> list[str]:
        return [f for k in keys for f in self.ctx.folder_roles.get(k, ())]

    def _role(self, keys: Sequence[str], tag: str) -> _Node:
        folders = [_folder_atom(f) for f in self._role_folders(keys)]
        return _mk_or([*folders, self._tag_atom(tag)])

    def _folders(self, value: str, pos: int) -> _Node:
        key = value.lower().strip("/")
        hits = [f for f in self.ctx.folders if key in self._folder_keys(f)]
        if not hits:
            names = _bounded_list([f"in:{k}" for k in _IN_KEYWORDS] + list(self.ctx.folders))
            raise DslError(pos, f"a known folder: {names}", _shown(value))
        for tag, keys in (("deleted", ("trash",)), ("spam", ("junk", "spam"))):
            if set(hits) & set(self._role_folders(keys)):
                self.lifted.add(tag)  # in:personal/Trash must show the deleted mail in it
        return _mk_or([_folder_atom(f) for f in hits])

    def _folder_keys(self, folder: str) -> set[str]:
        """What in: finds a folder by, lower-cased: its path under the mail root, its
        server name within its account (the layout on disk aside), and the last level of
        each."""
        names = {folder.lower()}
        if (mailbox := self.ctx.folder_names.get(folder)) is not None:
            names.add(mailbox.lower())
        return names | {n.rsplit("/", 1)[-1] for n in names}

    def _list(self, name: str, value: str, pos: int) -> _Node:
        # The tagging pass tags list mail `list/<list-id>` (lowercased, from List-Id's <…>).
        # notmuch has no wildcard for tags but does take a POSIX regex as tag:"/…/"; the
        # value must match whole dot-separated labels, so list:rust-users finds
        # list/rust-users.lists.example.org but list:rust does not.
        list_id = value.strip("<>").lower().replace("@", ".")
        if not _LIST_RE.fullmatch(list_id):
            raise DslError(
                pos, "a list name like rust-users or rust-users@lists.example.org", _shown(value)
            )
        pattern = re.sub(r"([.+])", r"\\\1", list_id)
        return _Atom(f'tag:"/^list/(.*\\.)?{pattern}(\\..*)?$/"')

    def _account(self, name: str, value: str, pos: int) -> _Node:
        by_name = {k.lower(): v for k, v in self.ctx.accounts.items()}
        if value.lower() not in by_name:
            raise DslError(
                pos, f"a known account: {_bounded_list(sorted(self.ctx.accounts))}", _shown(value)
            )
        prefix = by_name[value.lower()].strip("/")
        if not prefix:
            return _ALL
        own = _term_atom("path", prefix, "/**")
        inbox = {k.lower(): v for k, v in self.ctx.account_inboxes.items()}.get(value.lower())
        return own if inbox is None else _Or((own, _folder_atom(inbox)))

    def _date(self, name: str, value: str, pos: int) -> _Node:
        days_back = _DAY_WORDS.get(value.lower())
        if days_back is not None:  # notmuch's words for the days, in the user's zone
            self.used_now = True
            value = (self.ctx.now.date() - timedelta(days=days_back)).isoformat()
        start, end = _parse_date(value, pos, self.ctx.now.tzinfo)
        if name in ("after", "newer"):
            return _since(start)
        if name in ("before", "older"):
            return _before(start)
        return _between(start, end)

    def _relative(self, name: str, value: str, pos: int) -> _Node:
        self.used_now = True
        cutoff = _period_cutoff(value, pos, name, self.ctx.now)
        return _since(cutoff) if name == "newer_than" else _before(cutoff)

    def _msgid(self, name: str, value: str, pos: int) -> _Node:
        msgid = value[1:-1] if value.startswith("<") and value.endswith(">") else value
        if not msgid:
            raise DslError(pos, f"a message id after '{name}:'", _shown(value))
        atom = _term_atom("id", self._exact_value(name, msgid, pos))
        # A Message-ID may look like a uid: the id as given is still asked for.
        resolved = self.ctx.message_id_of_uid(msgid)
        return atom if resolved is None else _Or((atom, _term_atom("id", resolved)))

    def _thread(self, name: str, value: str, pos: int) -> _Node:
        tid = value.removeprefix("thread:")
        if not THREAD_ID.fullmatch(tid):
            raise DslError(
                pos, "a notmuch thread id (letters and digits) after 'thread:'", _shown(value)
            )
        return _Atom(f'thread:"{tid}"')

    def _raw(self, name: str, value: str, pos: int) -> _Node:
        if "\x00" in value:
            raise DslError(pos, "a raw: query without NUL characters", _shown(value))
        if not value.strip():
            raise DslError(pos, "a notmuch query after 'raw:'", "an empty value")
        if value.strip() == "*":
            return _ALL  # `*` only works alone in notmuch; as a term it is "no restriction"
        _check_raw_parens(value, pos)
        self._lift_from_raw(value)
        return _Atom(f"({value.strip()})")

    def _lift_from_raw(self, raw: str) -> None:
        for tag in self.ctx.excluded_tags:
            if re.search(r'\b(?:tag|is)(?::|\s+)"*' + re.escape(tag) + r"(?![\w/.-])", raw):
                self.lifted.add(tag)


def _check_raw_parens(raw: str, pos: int) -> None:
    # The raw query is wrapped in ( ); an unbalanced one would change how the rest of the
    # user's query groups.  Quoted parts are skipped, as notmuch skips them.
    depth, quoted = 0, False
    for ch in raw:
        quoted = not quoted if ch == '"' else quoted
        if quoted:
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            break
    if depth != 0 or quoted:
        raise DslError(pos, "a raw: query with balanced parentheses and quotes", _shown(raw))


def compile_query(text: str, ctx: DslContext) -> CompiledQuery:
    """Compile a Gmail-shaped search into a notmuch query plus the tags to exclude."""
    if len(text) > MAX_QUERY_CHARS:
        raise DslError(MAX_QUERY_CHARS, f"a search of at most {MAX_QUERY_CHARS} characters",
                       f"{len(text)} characters; narrow it down instead")
    # A lone surrogate (JSON allows "\ud800") is no character: notmuch cannot take it.
    if (bad := _SURROGATE.search(text)) is not None:
        raise DslError(bad.start(), "text without lone surrogates (\\ud800-\\udfff)",
                       _shown(bad.group()))
    parser = _Parser(text, ctx)
    tree = parser.parse()
    # Blocked mail is also tagged spam (see contacts.py): asking for it must show it, and
    # leaving it out (-is:blocked) must not bring spam back.
    for atom in _asked_for(tree):
        parser.lifted.update(parser.implying.get(atom, ()))
    query = _render(tree)
    if parser.lift_all:
        excluded: tuple[str, ...] = ()
    else:
        excluded = tuple(t for t in ctx.excluded_tags if t not in parser.lifted)
    anchor = int(ctx.now.timestamp()) if parser.used_now else None
    return CompiledQuery(query=query, exclude_tags=excluded, anchor=anchor)
