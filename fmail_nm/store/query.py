"""Building notmuch queries safely, and the ids callers hand us.

notmuch re-parses the values of some prefixes (``from:``, ``subject:``), so doubling quotes is
not enough there: a value that goes into a query is either a plain address checked here or a
quoted term (see :mod:`fmail_nm.dsl` for the search language's own quoting).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ..config import folder_term

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


def me_query(addresses: Sequence[str]) -> str:
    """A notmuch query for "from one of the user's addresses"; matches nothing without any."""
    plain = [a for a in addresses if _PLAIN_ADDRESS.match(a)]
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
