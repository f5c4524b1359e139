"""The tagging pass run by the ``post-new`` hook on messages tagged ``new``.

Order of work, per batch of new messages:
1. the recipients are stored (for listings), mailing-list mail (a List-Id header) gets ``list``
   and ``list/<list-id>``, so the list stays queryable (``tag:list/rust-users.lists.example.org``)
   without re-reading files later, and ``new`` is removed -- one document rewrite per message,
   the cost that dominates this pass;
2. the rules from fmail.toml, in order, on the messages of the batch (defaults: mail from the
   user gets ``sent``; mail in a Trash, Junk or Archive folder gets ``deleted``, ``spam`` or
   ``archived``; all of those leave the inbox, and everything else that is not list mail gets
   ``inbox``).  A rule's query need not mention ``tag:new``: it is already off.

Each batch is one short write session, so a mail client or ``notmuch tag`` never waits long.
Running the pass again finds no ``new`` messages and changes nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .body import HeaderInfo, parse_headers
from .config import Config, TagRule
from .nm import MATCH_NOTHING, RECIPIENTS_PROPERTY, Reader, WriteTxn, Writer, id_query, quote

BATCH_SIZE = 200
NEW_TAG = "new"
# from: values are re-parsed by notmuch, so only plain addresses go into a query: no quotes,
# wildcards or regex slashes that could change its meaning.
_PLAIN_ADDRESS = re.compile(r"^[^\s\"*/()\\]+@[^\s\"*/()\\]+$")


@dataclass
class TaggingReport:
    messages: int = 0
    batches: int = 0
    tagged: dict[str, int] = field(default_factory=dict)

    def count(self, tags: Sequence[str], n: int = 1) -> None:
        for tag in tags:
            self.tagged[tag] = self.tagged.get(tag, 0) + n


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
    return "(" + " OR ".join(f"folder:{quote(f)}" for f in folders) + ")"


_FOLDER_PLACEHOLDER = re.compile(r"\{folder:([a-z]+)\}")


def rule_query(rule: TagRule, config: Config) -> str:
    """A rule's query with ``{me}`` and ``{folder:ROLE}`` expanded for this setup."""
    roles = config.roles()
    query = rule.query.replace("{me}", me_query(config.addresses))
    return _FOLDER_PLACEHOLDER.sub(lambda m: folders_query(roles.get(m.group(1), [])), query)


MAX_RECIPIENTS = 5
HEAD_BYTES = 256 * 1024  # enough for any sane header block; the body is never read


def read_head(txn: WriteTxn, message_id: str) -> HeaderInfo:
    """Parse the header block of the message's first readable file."""
    message = txn.get(message_id)
    for name in message.filenames if message else ():
        try:
            with open(name, "rb") as fh:
                return parse_headers(fh.read(HEAD_BYTES))
        except OSError:
            continue
    return HeaderInfo(to=[], cc=[], list_id=None)


# A notmuch property is stored as one Xapian term, and Xapian's terms end at 245 bytes: a longer
# value makes libnotmuch abort the whole process ("Unhandled error modifying message
# property"), so the value stays well below that.  The full list is in the sidecar.
MAX_PROPERTY_BYTES = 200


def recipients_value(head: HeaderInfo) -> str:
    """The first few To/Cc recipients as a JSON list of [name, address], for
    RECIPIENTS_PROPERTY (JSON, because names hold commas, quotes and non-ASCII text), cut to
    fit in MAX_PROPERTY_BYTES: later recipients go first, then long names are shortened."""
    pairs = [[a.name, a.address] for a in [*head.to, *head.cc] if a.address][:MAX_RECIPIENTS]

    def size(value: list[list[str]]) -> int:
        return len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
    while len(pairs) > 1 and size(pairs) > MAX_PROPERTY_BYTES:
        pairs.pop()
    while pairs and size(pairs) > MAX_PROPERTY_BYTES and pairs[0][0]:
        pairs[0][0] = pairs[0][0][: len(pairs[0][0]) // 2]
    if pairs and size(pairs) > MAX_PROPERTY_BYTES:  # an absurd address: show none
        pairs = []
    return json.dumps(pairs, ensure_ascii=False)


# notmuch refuses tags over 200 bytes (and the whole batch with them); a List-Id is untrusted.
MAX_LIST_ID_BYTES = 150


def list_tag_id(list_id: str | None) -> str | None:
    """The List-Id as it goes into the ``list/<id>`` tag: lower-case, cut to fit a tag."""
    if not list_id:
        return None
    cut = list_id.lower().encode("utf-8")[:MAX_LIST_ID_BYTES]
    return cut.decode("utf-8", errors="ignore") or None


def store_recipients(txn: WriteTxn, message_id: str, head: HeaderInfo | None = None) -> None:
    txn.set_property(message_id, RECIPIENTS_PROPERTY,
                     recipients_value(head or read_head(txn, message_id)))


def _read_headers(txn: WriteTxn, ids: Sequence[str], report: TaggingReport) -> None:
    """The one pass over new messages that reads headers notmuch does not keep as values:
    recipients and list tags are stored, and ``new`` removed, in one rewrite per message."""
    for mid in ids:
        head = read_head(txn, mid)
        lid = list_tag_id(head.list_id)
        txn.update(mid, add=("list", f"list/{lid}") if lid else (), remove=(NEW_TAG,),
                   properties={RECIPIENTS_PROPERTY: recipients_value(head)})
        if lid:
            report.count(["list"])


def _apply_rules(txn: WriteTxn, ids: Sequence[str], config: Config, report: TaggingReport) -> None:
    # The batch is the messages that were tagged new; ``new`` is already off them.
    batch = id_query(ids)
    for rule in config.rules:
        query = f"({rule_query(rule, config)}) AND ({batch})"
        matched = txn.message_ids(query)
        if matched:
            txn.change_tags(matched, add=rule.add, remove=rule.remove)
            report.count(rule.add, len(matched))


def _tag_batch(txn: WriteTxn, ids: Sequence[str], config: Config, report: TaggingReport) -> None:
    # One atomic section: a crash leaves every message of the batch still tagged new.
    _read_headers(txn, ids, report)
    _apply_rules(txn, ids, config, report)


def backfill_recipients(reader: Reader, writer: Writer, *, batch_size: int = BATCH_SIZE) -> int:
    """Store recipients for messages indexed before our hook was installed (an adopted setup).
    Reads each such file once; later runs find nothing to do."""
    missing = [m.message_id for m in reader.messages("*", exclude_tags=(), sort="none")
               if m.recipients is None]
    for start in range(0, len(missing), batch_size):
        ids = missing[start:start + batch_size]
        writer.run(lambda txn, ids=ids: [store_recipients(txn, mid) for mid in ids])
    return len(missing)


def run_tagging(config: Config, reader: Reader, writer: Writer, *,
                batch_size: int = BATCH_SIZE) -> TaggingReport:
    """Tag every message tagged ``new``, in batches; returns what was done."""
    report = TaggingReport()
    pending = reader.message_ids(f"tag:{NEW_TAG}")
    for start in range(0, len(pending), batch_size):
        ids = pending[start:start + batch_size]
        writer.run(lambda txn, ids=ids: _tag_batch(txn, ids, config, report))
        report.messages += len(ids)
        report.batches += 1
    return report
