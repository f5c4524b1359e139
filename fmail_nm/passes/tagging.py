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

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .. import tags
from ..config import Config, TagRule
from ..message.headers import HeaderInfo, parse_headers
from ..store.maildir import in_role
from ..store.notmuch import RECIPIENTS_PROPERTY, Reader, Writer, WriteTxn
from ..store.query import folders_query, id_query, me_query

BATCH_SIZE = 200



@dataclass
class TaggingReport:
    messages: int = 0
    batches: int = 0
    tagged: dict[str, int] = field(default_factory=dict)

    def count(self, tags: Sequence[str], n: int = 1) -> None:
        for tag in tags:
            self.tagged[tag] = self.tagged.get(tag, 0) + n


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
        txn.update(mid, add=("list", f"list/{lid}") if lid else (), remove=(tags.NEW,),
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


def _folder_rule(rule: TagRule) -> bool:
    """A rule that says something about where a message lives (it names a folder)."""
    return bool(_FOLDER_PLACEHOLDER.search(rule.query)) or any(
        term in rule.query for term in ("folder:", "path:"))


def place_tag_names(config: Config) -> frozenset[str]:
    """The tags that say where a message lives under these rules: the standard place tags
    (inbox, deleted, spam, archived) and every tag a folder rule adds or removes."""
    names = set(tags.PLACE_TAGS)
    for rule in config.rules:
        if _folder_rule(rule):
            names.update(rule.add, rule.remove)
    return frozenset(names)


def place_tags(txn: WriteTxn, config: Config, message_id: str) -> None:
    """Give a message whose files were just moved the place tags the rules give mail arriving
    where its files are now -- the user's rules from fmail.toml, not a copy of the defaults,
    so a move and ``notmuch new`` always agree.

    Only place tags change (:func:`place_tag_names`): the rules run on the message with those
    taken off, and what they add or remove among them is kept; other tags (sent, unread, the
    user's own) stay as they are.  One exception: a move into a folder that is no account's
    inbox files the message, so it leaves the inbox whatever a catch-all rule says."""
    message = txn.get(message_id)
    if message is None:
        return
    place = place_tag_names(config)
    txn.change_tags([message_id], remove=sorted(place & message.tags))
    only = id_query([message_id])
    for rule in config.rules:
        add = [t for t in rule.add if t in place]
        remove = [t for t in rule.remove if t in place]
        if (add or remove) and txn.message_ids(f"({rule_query(rule, config)}) AND ({only})"):
            txn.change_tags([message_id], add=add, remove=remove)
    if not in_role(config, message.filenames, "inbox"):
        txn.change_tags([message_id], remove=[tags.INBOX])


def _tag_batch(txn: WriteTxn, ids: Sequence[str], config: Config, report: TaggingReport) -> None:
    # One atomic section: a crash leaves every message of the batch still tagged new.
    _read_headers(txn, ids, report)
    _apply_rules(txn, ids, config, report)


def _store_all(txn: WriteTxn, ids: Sequence[str]) -> None:
    for mid in ids:
        store_recipients(txn, mid)


def backfill_recipients(reader: Reader, writer: Writer, *, batch_size: int = BATCH_SIZE) -> int:
    """Store recipients for messages indexed before our hook was installed (an adopted setup).
    Reads each such file once; later runs find nothing to do."""
    missing = [m.message_id for m in reader.messages("*", exclude_tags=(), sort="none")
               if m.recipients is None]
    for start in range(0, len(missing), batch_size):
        writer.run(functools.partial(_store_all, ids=missing[start:start + batch_size]))
    return len(missing)


def run_tagging(config: Config, reader: Reader, writer: Writer, *,
                batch_size: int = BATCH_SIZE) -> TaggingReport:
    """Tag every message tagged ``new``, in batches; returns what was done."""
    report = TaggingReport()
    pending = reader.message_ids(f"tag:{tags.NEW}")
    for start in range(0, len(pending), batch_size):
        ids = pending[start:start + batch_size]
        writer.run(functools.partial(_tag_batch, ids=ids, config=config, report=report))
        report.messages += len(ids)
        report.batches += 1
    return report
