"""The tagging pass: the rules from fmail.toml applied to the messages of an index run.

Which messages: those the sidecar mirror marked ``needs_tagging`` when it first saw them (see
``passes.mirror``) -- with ``new`` in notmuch's ``new.tags`` (afew-style setups) the messages
tagged ``new``, otherwise the ones that were not in the mirror before this run.  The mark is
cleared only after the batch's write session committed, so a pass that dies is redone.

What they get: the tags the rules give a message that arrived tagged ``new`` -- whatever
``new.tags`` says.  Per batch, the rules are evaluated against each message's *expected* tags
(its flag tags, ``list`` and ``list/<list-id>`` from the List-Id the mirror parsed, then every
rule in order: a rule's ``tag:`` terms are answered from those expected tags, its other terms
by notmuch), and each message whose final tags differ from what ``notmuch new`` gave it is
rewritten once.  With the notmuch default ``new.tags=inbox;unread`` most new mail already has
its final tags and is not touched at all; with ``new`` every message is rewritten once, since
``new`` must go.  Defaults: mail in a Drafts folder gets ``draft``; other mail from the user
gets ``sent``; mail in a Trash, Junk or Archive folder gets ``deleted``, ``spam`` or
``archived``; all of those leave the inbox, and everything else that is not list mail is in
the inbox.  A tag of the user's own in ``new.tags`` that no
rule gives (``work`` in ``unread;inbox;work``) stays; one a rule gives that the message lacks
when the pass reaches it (mail ``notmuch insert -inbox`` delivered, or archived by hand before
a pass ran) stays off.

Each batch is one short write session, so a mail client or ``notmuch tag`` never waits long.
"""

from __future__ import annotations

import functools
import queue
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .. import tags
from ..config import FOLDER_PLACEHOLDER, Config, TagRule
from ..message.headers import canonical_address, is_own_address, search_forms
from ..progress import TAGGING, ProgressCallback
from ..store import sidecar
from ..store.maildir import in_role
from ..store.notmuch import Reader, Writer, WriteTxn
from ..store.notmuch_config import config_list
from ..store.query import MATCH_NOTHING, all_of, folders_query, id_query, me_query
from ..store.threads import sender

BATCH_SIZE = 200


@dataclass
class TaggingReport:
    messages: int = 0
    batches: int = 0
    rewritten: int = 0  # messages whose tags had to change after notmuch new
    placed: int = 0  # messages moved behind our back whose place tags had to change
    tagged: dict[str, int] = field(default_factory=dict)

    def count(self, names: Sequence[str], n: int = 1) -> None:
        for tag in names:
            self.tagged[tag] = self.tagged.get(tag, 0) + n




def rule_query(rule: TagRule, config: Config, me: Sequence[str], txn: WriteTxn) -> str:
    """A rule's query with ``{me}`` (the user's addresses ``me``: see :func:`me_among`) and
    ``{folder:ROLE}`` expanded for this setup, and notmuch's saved searches (``query:NAME``)
    written out, so that their tag terms too are answered from the tags worked out
    (:func:`_answered_from`): notmuch would read the database, which holds what ``notmuch
    new`` wrote in the pass, nothing yet in the first index, and some in a delivery."""
    roles = config.roles()
    query = rule.query.replace("{me}", me_query(me))
    query = FOLDER_PLACEHOLDER.sub(lambda m: folders_query(roles.get(m.group(1), [])), query)
    return _with_saved_searches(query, txn.saved_search)


# A saved search's term (query:NAME), and how deep saved searches naming others are written out.
_SAVED_SEARCH = re.compile(r"(?<![\w:.-])query:([^\s()\"]+)", re.I)
SAVED_SEARCH_DEPTH = 8


def _with_saved_searches(query: str, lookup: Callable[[str], str | None],
                         depth: int = SAVED_SEARCH_DEPTH) -> str:
    """``query`` with each saved search it names replaced by its own query, in parentheses
    (as notmuch reads it); a name notmuch does not know is left for notmuch to refuse."""
    def written_out(match: re.Match[str]) -> str:
        saved = lookup(match.group(1))
        if saved is None or depth == 0:
            return match.group(0)
        return f"({_with_saved_searches(saved, lookup, depth - 1)})"
    return _SAVED_SEARCH.sub(written_out, query)


def me_among(config: Config, from_headers: Iterable[str]) -> tuple[str, ...]:
    """The user's addresses for rules over the messages with these From headers: fmail.toml's,
    and the sub-addresses of theirs these messages are from (is_own_address, the first From
    address, as the mirror's is_sent has it).  Terms of their own, notmuch's regex form of
    ``from:`` being a scan of every sender; the rules only ever ask about these messages."""
    mine = search_forms(config.addresses)
    senders = (sender(header)[1] for header in from_headers if "+" in header)
    return tuple(dict.fromkeys(
        (*mine, *(canonical_address(s) for s in senders if is_own_address(s, mine)))))


# notmuch refuses tags over 200 bytes (and the whole batch with them); a List-Id is untrusted.
MAX_LIST_ID_BYTES = 150


def list_tag_id(list_id: str | None) -> str | None:
    """The List-Id as it goes into the ``list/<id>`` tag: lower-case, cut to fit a tag."""
    if not list_id:
        return None
    cut = list_id.lower().encode("utf-8")[:MAX_LIST_ID_BYTES]
    return cut.decode("utf-8", errors="ignore") or None


def _folder_rule(rule: TagRule) -> bool:
    """A rule that says something about where a message lives (it names a folder)."""
    return bool(FOLDER_PLACEHOLDER.search(rule.query)) or any(
        term in rule.query for term in ("folder:", "path:"))


def place_tag_names(config: Config) -> frozenset[str]:
    """The tags that say where a message lives under these rules: the standard place tags
    (inbox, deleted, spam, archived) and every tag a folder rule adds or removes."""
    names = set(tags.PLACE_TAGS)
    for rule in config.rules:
        if _folder_rule(rule):
            names.update(rule.add, rule.remove)
    return frozenset(names)


def folder_place_tags(config: Config) -> frozenset[str]:
    """The place tags only where a message's files are says: :func:`place_tag_names` less
    the flag tags (``draft``), which the files' own flags say too."""
    return place_tag_names(config) - tags.FLAG_TAGS


def filed_tags(config: Config) -> frozenset[str]:
    """The tags that say a message is filed in a folder, which only a move may change: the
    standard ones (archived, deleted, spam) and every tag a folder rule adds.  Not ``inbox``:
    notmuch's own triage tag, which its users take off to file mail where it is; nor a tag
    a folder rule only takes off (a ``todo`` that archiving ends is still the user's)."""
    added = {t for rule in config.rules if _folder_rule(rule) for t in rule.add}
    return frozenset((set(tags.PLACE_TAGS) | added) - tags.FLAG_TAGS - {tags.INBOX})


def _draft_tags(config: Config) -> frozenset[str]:
    """The tags the rules give or take because a message is (not) a draft: ``sent`` and
    ``inbox`` by default."""
    names: set[str] = set()
    for rule in config.rules:
        if any((quoted or plain) == tags.DRAFT
               for quoted, _regex, plain in _TAG_TERM.findall(rule.query)):
            names.update(rule.add, rule.remove)
    return frozenset(names)


def _retagged_on_move(config: Config, filenames: Sequence[str],
                      dragged_draft: bool) -> tuple[frozenset[str], frozenset[str]]:
    """The tags a move takes off before the rules run again, and those it lets the rules
    change (:func:`place_tags`).  Mail in a Drafts folder is a draft, as mail arriving there
    is: the rules may give it ``draft``, and say again what they give or take because it is
    one (``sent`` and ``inbox`` by default).  A draft whose copy moved to Sent was sent
    elsewhere (a phone, a webmail): it is no draft any more -- with flag sync off nothing
    else takes the tag off.  A draft of the user's filed anywhere else (the Archive, the
    Trash) is still one that was never sent, its D flag too; but someone else's mail a move
    into Drafts made a draft (``dragged_draft``: dragged there by mistake) is mail like any
    other again once it leaves."""
    place = place_tag_names(config)
    kept = place - {tags.DRAFT}
    retold = place | {tags.DRAFT} | _draft_tags(config)
    if in_role(config, filenames, "drafts"):
        return kept | _draft_tags(config), retold
    if in_role(config, filenames, "sent") or dragged_draft:
        return place | {tags.DRAFT}, retold
    return kept, kept


def place_tags(txn: WriteTxn, config: Config, message_id: str) -> bool:
    """Give a message whose files were just moved the place tags the rules give mail arriving
    where its files are now -- the user's rules from fmail.toml, not a copy of the defaults,
    so a move and ``notmuch new`` always agree.  Writes only when its tags must change;
    returns whether they did.

    Only place tags change (:func:`place_tag_names`): the rules run on the message with those
    taken off, and what they add or remove among them is kept; other tags (sent, unread, the
    user's own) stay as they are -- but a draft sent elsewhere is retagged as sent mail, and
    mail moved into Drafts as a draft (see :func:`_retagged_on_move`).  One more exception: a
    move into a folder that is no account's inbox files the message, so it leaves the inbox
    whatever a catch-all rule says."""
    message = txn.get(message_id)
    if message is None:
        return False
    # Without the user's addresses no draft can be told from mail dragged into Drafts: each
    # stays one, as a draft of the user's does.
    me = me_among(config, [message.from_header])
    dragged = tags.DRAFT in message.tags and bool(config.addresses) and not txn.message_ids(
        all_of(me_query(me), id_query([message_id])))
    taken_off, place = _retagged_on_move(config, message.filenames, dragged)
    # The rules' tag terms are answered from the tags worked out so far (as in _tag_batch),
    # their other terms by notmuch: nothing is written until the outcome is known.
    expected = {message_id: set(message.tags - taken_off)}
    only = id_query([message_id])
    for rule in config.rules:
        add = {t for t in rule.add if t in place}
        remove = {t for t in rule.remove if t in place}
        query = _answered_from(rule_query(rule, config, me, txn), [message_id], expected)
        if (add or remove) and txn.message_ids(all_of(query, only)):
            expected[message_id] = (expected[message_id] | add) - remove
    if not in_role(config, message.filenames, "inbox"):
        expected[message_id].discard(tags.INBOX)
    add_now = expected[message_id] - message.tags
    remove_now = (message.tags & place) - expected[message_id]
    if not add_now and not remove_now:
        return False
    txn.change_tags([message_id], add=sorted(add_now), remove=sorted(remove_now))
    return True


def settle_places(txn: WriteTxn, config: Config, message_ids: Sequence[str]) -> int:
    """Place tags for messages whose files changed folders behind fmail-nm's back -- moved by
    mbsync or another client, or by a write of ours that died before notmuch committed it --
    so tags and folders agree again; returns how many changed."""
    return sum(place_tags(txn, config, mid) for mid in message_ids)


# A rule's tag terms: tag:x, is:x, tag:"x y" (quotes doubled inside), tag:/regex/ -- also
# after a - that starts a term (-tag:x): notmuch would answer that one from the
# database, where a batch's mail may hold tags written before its last copy was indexed.
_TAG_TERM = re.compile(r'(?<![\w:.])(?<![\w:.-]-)(?:tag|is):(?:"((?:[^"]|"")*)"|/((?:[^/\\]|\\.)*)/|([^\s()"]+))')
_QUOTED = re.compile(r'"(?:[^"]|"")*"')


def _answered_from(query: str, ids: Sequence[str], expected: Mapping[str, set[str]]) -> str:
    """``query`` with every tag term replaced by the batch messages whose *expected* tags
    satisfy it, so notmuch answers the rest (folders, senders, headers) and the tags come
    from the rules applied so far.  Quoted phrases are left alone."""
    def members(match: re.Match[str]) -> str:
        quoted, regex, plain = match.groups()
        if regex is not None:
            try:
                pattern = re.compile(regex)
            except re.error:  # notmuch's regex dialect is not Python's: this one matches none
                return MATCH_NOTHING
            hits = [m for m in ids if any(pattern.search(t) for t in expected[m])]
        else:
            name = quoted.replace('""', '"') if quoted is not None else plain
            hits = [m for m in ids if name in expected[m]]
        return f"({id_query(hits)})" if hits else MATCH_NOTHING

    out, last = [], 0
    for quoted in _QUOTED.finditer(query):
        # a quoted phrase that is itself a tag term's value is part of that term
        if _TAG_TERM.match(query, max(0, quoted.start() - 4)) or _TAG_TERM.match(
                query, max(0, quoted.start() - 3)):
            continue
        out.append(_TAG_TERM.sub(members, query[last:quoted.start()]))
        out.append(quoted.group(0))
        last = quoted.end()
    out.append(_TAG_TERM.sub(members, query[last:]))
    return "".join(out)


def ruled_new_tags(new_tags: frozenset[str], rules: Sequence[TagRule]) -> frozenset[str]:
    """The tags of ``new.tags`` that a new message is worked out without.  With ``new`` among
    them, ``new`` alone (as it always was); otherwise those the rules give, as if ``new.tags``
    had been ``new``: which mail is in the inbox is the rules' to say.  A tag of the user's own
    that no rule gives (``new.tags=unread;inbox;work``) stays as notmuch gave it, and so do the
    flag tags (the files' flags give those)."""
    if tags.NEW in new_tags:
        return frozenset({tags.NEW})
    given_by_rules = {tag for rule in rules for tag in rule.add}
    return (new_tags & given_by_rules) - tags.FLAG_TAGS


def expected_tags(current: frozenset[str], ruled: frozenset[str],
                  list_id: str | None) -> set[str]:
    """A new message's tags before the rules, plus its list tags: what notmuch gave it less
    the ``ruled`` tags of ``new.tags`` (:func:`ruled_new_tags`)."""
    expected = set(current - ruled)
    if (lid := list_tag_id(list_id)) is not None:
        expected |= {tags.LIST, f"{tags.LIST}/{lid}"}
    return expected


def final_tags(txn: WriteTxn, given: Mapping[str, frozenset[str]],
               list_ids: Mapping[str, str | None], from_headers: Mapping[str, str],
               config: Config, new_tags: frozenset[str]) -> dict[str, set[str]]:
    """The tags new messages end with: from what ``notmuch new`` gave them (``given``), their
    list tags (``list_ids``), then every rule in order (``{me}`` with the sub-addresses of
    their ``from_headers``) -- a rule's tag terms answered from the tags worked
    out so far, its other terms by notmuch over these messages.  A ruled tag of ``new.tags``
    a message lacks was taken off before the pass (``notmuch insert -inbox``, the user
    archiving mail indexed without the hook): it stays off."""
    ids = sorted(given)
    ruled = ruled_new_tags(new_tags, config.rules)
    expected = {mid: expected_tags(given[mid], ruled, list_ids.get(mid)) for mid in ids}
    scope, me = id_query(ids), me_among(config, (from_headers[mid] for mid in ids))
    for rule in config.rules:
        if not ids:
            break
        query = _answered_from(rule_query(rule, config, me, txn), ids, expected)
        for mid in txn.message_ids(all_of(query, scope)):
            expected[mid] = (expected[mid] | set(rule.add)) - set(rule.remove)
    return {mid: expected[mid] - (ruled - given[mid]) for mid in ids}


def _tag_batch(txn: WriteTxn, batch: Mapping[str, str | None], config: Config,
               new_tags: frozenset[str], report: TaggingReport) -> None:
    """One batch in one write session: expected tags through every rule, then at most one
    rewrite per message (a second only if a rule changes a Maildir flag tag)."""
    found = {mid: got for mid in batch if (got := txn.tags_and_from(mid)) is not None}
    current = {mid: have for mid, (have, _) in found.items()}
    ids = sorted(current)
    expected = final_tags(txn, current, batch, {mid: got[1] for mid, got in found.items()},
                          config, new_tags)
    for mid in ids:
        add, remove = expected[mid] - current[mid], current[mid] - expected[mid]
        if not add and not remove:
            continue
        report.rewritten += 1
        report.count(sorted(add))
        flags = (add | remove) & tags.FLAG_TAGS
        txn.update(mid, add=sorted(add - flags), remove=sorted(remove - flags))
        if flags:
            txn.change_tags([mid], add=sorted(add & flags), remove=sorted(remove & flags))


def tag_added(txn: WriteTxn, config: Config, message_ids: Sequence[str]) -> None:
    """The rules on messages whose files fmail-nm itself just added (a saved draft, a Sent
    copy): they start from the tags their files' flags gave them, with no ``new.tags``."""
    _tag_batch(txn, dict.fromkeys(message_ids), config, frozenset(), TaggingReport())


def configured_new_tags(reader: Reader) -> frozenset[str]:
    """notmuch's ``new.tags``: what ``notmuch new`` gives every new message."""
    return frozenset(config_list(reader.setting("new.tags", "unread;inbox")))


def tag_pending(config: Config, writer: Writer, pending: Sequence[tuple[str, str | None]],
                new_tags: frozenset[str], report: TaggingReport, *,
                batch_size: int = BATCH_SIZE,
                on_progress: ProgressCallback | None = None) -> None:
    """Tag these (Message-ID, List-Id) pairs in batches of one write session each, clearing
    each batch's marks in the sidecar only once its session committed."""
    path = sidecar.sidecar_path(config.data_dir)
    done = 0
    for start in range(0, len(pending), batch_size):
        batch = dict(pending[start:start + batch_size])
        writer.run(functools.partial(_tag_batch, batch=batch, config=config, new_tags=new_tags,
                                     report=report))
        with sidecar.opened(path) as conn:  # only now: a batch that did not commit is redone
            sidecar.mark_tagged(conn, list(batch))
        done += len(batch)
        report.messages += len(batch)
        report.batches += 1
        if on_progress is not None:
            on_progress(TAGGING, done, len(pending))


def run_tagging(config: Config, reader: Reader, writer: Writer, *,
                batch_size: int = BATCH_SIZE,
                on_progress: ProgressCallback | None = None,
                report: TaggingReport | None = None) -> TaggingReport:
    """Tag the messages the mirror marked as new, in batches; returns what was done (added
    to ``report`` when one is given)."""
    report = TaggingReport() if report is None else report
    with sidecar.opened(sidecar.sidecar_path(config.data_dir)) as conn:
        pending = sidecar.pending_tagging(conn)
    if on_progress is not None and pending:
        on_progress(TAGGING, 0, len(pending))
    tag_pending(config, writer, pending, configured_new_tags(reader), report,
                batch_size=batch_size, on_progress=on_progress)
    return report


class Tagger:
    """Tags the mirror's marked messages on a thread of its own while the mirror goes on with
    the next batch: libnotmuch rewriting documents (the writer's thread, outside the GIL) and
    the mirror parsing files then share the machine instead of taking turns.  Feed it with
    :meth:`add` (the mirror's ``on_marked``); leaving the ``with`` block waits for it and
    raises what it raised.  Marks it did not reach stay in the sidecar for
    :func:`run_tagging`."""

    def __init__(self, config: Config, writer: Writer, new_tags: frozenset[str], *,
                 on_progress: ProgressCallback | None = None) -> None:
        self.config, self.writer, self.new_tags = config, writer, new_tags
        self.on_progress = on_progress  # called from the tagger's thread
        self.report = TaggingReport()
        self._marked = 0  # messages handed over so far: the progress total grows with them
        self._queue: queue.Queue[list[tuple[str, str | None]] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="fmail-tagger", daemon=True)

    def add(self, marked: Sequence[tuple[str, str | None]]) -> None:
        if marked and self._error is None:
            self._marked += len(marked)
            self._queue.put(list(marked))

    def _progress(self, before: int) -> ProgressCallback | None:
        """Progress over everything handed over so far, not just the current chunk."""
        report = self.on_progress
        if report is None:
            return None
        return lambda phase, done, _total: report(phase, before + done, self._marked)

    def __enter__(self) -> Tagger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._queue.put(None)
        self._thread.join()
        if self._error is not None and exc[0] is None:
            raise self._error

    def _loop(self) -> None:
        while (marked := self._queue.get()) is not None:
            if self._error is not None:
                continue  # drain: what was not tagged keeps its mark
            try:
                tag_pending(self.config, self.writer, marked, self.new_tags, self.report,
                            on_progress=self._progress(self.report.messages))
            except BaseException as exc:  # handed to the caller's thread
                self._error = exc
