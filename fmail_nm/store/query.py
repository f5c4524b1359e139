"""Building notmuch queries safely, and the ids callers hand us.

notmuch re-parses the values of some prefixes (``from:``, ``subject:``), so doubling quotes is
not enough there: a value that goes into a query is either a plain address checked here or a
quoted term (see :mod:`fmail_nm.dsl` for the search language's own quoting).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..config import folder_term
from ..message.headers import search_forms

# notmuch 0.37 rejects "NOT *" as a whole query; this sexp is its spelling of "no message".
MATCH_NOTHING = 'sexp:"(not ())"'

# from: values are re-parsed by notmuch, so only plain addresses go into a query: no quotes,
# wildcards or regex slashes that could change its meaning.
_PLAIN_ADDRESS = re.compile(r"^[^\s\"*/()\\]+@[^\s\"*/()\\]+$")


def quote(value: str) -> str:
    """A notmuch query term value in double quotes; embedded quotes are doubled."""
    return '"' + value.replace('"', '""') + '"'


def all_of(*queries: str) -> str:
    """The conjunction of notmuch queries.  notmuch reads ``*`` (and an empty query) as all
    mail only when it is the whole query: inside parentheses it is a wildcard that matches
    a fraction of the mail, so an all-mail part is left out rather than parenthesised."""
    parts = [q for q in queries if q.strip() not in ("", "*")]
    return " AND ".join(f"({q})" for q in parts) if parts else "*"


def id_query(message_ids: Iterable[str]) -> str:
    return " OR ".join(f"id:{quote(mid)}" for mid in message_ids) or MATCH_NOTHING


def plain_addresses(addresses: Sequence[str]) -> list[str]:
    """The addresses that can go into a ``from:`` query as they are (see _PLAIN_ADDRESS)."""
    return [a for a in addresses if _PLAIN_ADDRESS.match(a)]


def me_query(addresses: Sequence[str]) -> str:
    """A notmuch query for "from one of the user's addresses"; matches nothing without any."""
    plain = plain_addresses(search_forms(addresses))
    if not plain:
        return MATCH_NOTHING
    return "(" + " OR ".join(f"from:{quote(a)}" for a in plain) + ")"


def folders_query(folders: Sequence[str]) -> str:
    """A notmuch query for "in one of these folders"; matches nothing without any."""
    if not folders:
        return MATCH_NOTHING
    return "(" + " OR ".join(f"folder:{quote(folder_term(f))}" for f in folders) + ")"


def clean_id(ref: str) -> str:
    """A Message-ID as notmuch stores it, from what a caller may pass: ``<id>``, ``id:id``."""
    mid = ref.strip()
    if mid.startswith("<") and mid.endswith(">"):
        mid = mid[1:-1]
    return mid[3:] if mid.startswith("id:") else mid


def id_forms(ref: str) -> list[str]:
    """The Message-IDs a caller's ``ref`` may name, the likeliest first: for a JSON string,
    what it reads as -- a listing shows an id that is not one plain word as one, never a
    plain id with quotes, so a sender's Message-ID forged as that very string must not take
    its place; then cleaned (clean_id); then exactly as given -- notmuch keeps a broken
    header's id as it stands, so ``Message-Id: <>`` is the id ``<>`` and ``<x@   >`` keeps
    its spaces."""
    return [form for form in dict.fromkeys((_json_string(ref), clean_id(ref), ref)) if form]


def _json_string(ref: str) -> str:
    """What ``ref`` reads as when it is a JSON string (``"a b@x"``), else ''."""
    if not (len(ref) >= 2 and ref[0] == ref[-1] == '"'):
        return ""
    try:
        value = json.loads(ref)
    except ValueError:
        return ""
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class Conjunction:
    """A query that only asks for tags and a date range: ``tag:a AND date:@x..@y``."""

    tags: tuple[str, ...]
    since: int | None  # Unix seconds, both ends included; None: open
    until: int | None
    # tag:"/regex/" values: each matches a message carrying any tag the pattern finds
    patterns: tuple[str, ...] = ()

    def tag_groups(self, all_tags: Iterable[str]) -> list[tuple[str, ...]]:
        """One group per condition, met by a message that carries any tag of the group."""
        known = list(all_tags)
        return [(tag,) for tag in self.tags] + [
            tuple(t for t in known if re.search(p, t)) for p in self.patterns]


# The regex a tag value may hold to be read here: ASCII literals, escaped "." and "+", ".*",
# "?", groups and anchors -- where POSIX extended regexes (notmuch's, on bytes) and Python's
# (on characters) match the same tags.
_SIMPLE_REGEX = re.compile(r"(?:[A-Za-z0-9_/@-]|\\[.+]|\.\*|[?()^$])+")


_ATOM = re.compile(r"""\s*(?:
      (?P<paren>[()])
    | (?P<and>AND)(?=[\s()]|$)
    | tag:(?:"(?P<quoted>(?:[^"]|"")*)"|(?P<bare>[\w.+-]+))(?=[\s()]|$)
    | date:(?:@(?P<since>\d+))?\.\.(?:@(?P<until>\d+))?(?=[\s()]|$)
    | from:"(?P<sender>[^"\s@]+@[^"\s@]+)"(?=[\s()]|$)
    )""", re.VERBOSE)


def conjunction(query: str) -> Conjunction | None:
    """The tags and dates of ``query`` when it is nothing but tags and dates joined by AND
    (``*`` alone is all mail), else None.  A ``/regex/`` tag value is read when it is simple
    (see _SIMPLE_REGEX; the DSL's ``list:`` is); other patterns (any other regex, a ``*``) and
    open-ended or pre-1970 date ranges are not: notmuch answers those itself.  (Parentheses
    do not change a conjunction's meaning.)"""
    read = _read_conjunction(query)
    return read[1] if read is not None and not read[0] else None


def sender_conjunction(query: str) -> tuple[str, Conjunction] | None:
    """For ``from:"<address>"`` joined by AND with tags and dates only: the address (in
    lower case, as the mirror keeps senders) and the rest; else None.  notmuch reads such a
    ``from:`` as words of the From header, so the mirror's senders only estimate its matches."""
    read = _read_conjunction(query)
    if read is None or len(set(read[0])) != 1:
        return None
    return read[0][0], read[1]


def _read_conjunction(query: str) -> tuple[list[str], Conjunction] | None:
    """The ``from:`` addresses and the tags and dates of a conjunction (see conjunction)."""
    if query.strip() == "*":
        return [], Conjunction((), None, None)
    senders: list[str] = []
    tags: list[str] = []
    patterns: list[str] = []
    since: list[int] = []
    until: list[int] = []
    depth, pos, expect_atom = 0, 0, True
    while pos < len(query.rstrip()):
        match = _ATOM.match(query, pos)
        if match is None or match.end() == pos:
            return None
        pos = match.end()
        if match["paren"]:
            depth += 1 if match["paren"] == "(" else -1
            if depth < 0:
                return None
        elif match["and"]:
            if expect_atom:
                return None
            expect_atom = True
        elif not expect_atom:
            return None  # two atoms without AND: leave notmuch's default operator to notmuch
        else:
            expect_atom = False
            if match.group(0).lstrip().startswith("tag:"):
                tag = match["bare"] or (match["quoted"] or "").replace('""', '"')
                if len(tag) > 2 and tag[0] == tag[-1] == "/" and _SIMPLE_REGEX.fullmatch(tag[1:-1]):
                    patterns.append(tag[1:-1])
                elif not tag or tag.startswith("/") or "*" in tag:
                    return None
                else:
                    tags.append(tag)
            elif match["since"] or match["until"]:
                if match["since"]:
                    since.append(int(match["since"]))
                if match["until"]:
                    until.append(int(match["until"]))
            elif match["sender"]:
                senders.append(match["sender"].lower())
            else:
                return None
    if depth or expect_atom:
        return None
    low = max(since) if since else None
    if (until and low is None) or low == 0:
        return None  # notmuch's own reading of a range that starts at or before 1970
    return senders, Conjunction(tuple(dict.fromkeys(tags)), low, min(until) if until else None,
                                tuple(dict.fromkeys(patterns)))
