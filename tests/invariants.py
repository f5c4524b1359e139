"""What must hold for a mail tree after any fault and its recovery, checked from the outside.

Used by the fault-injection suite (tests/test_faults.py).  Each check returns a list of
problems (empty when all holds), so a trial can report every broken rule at once with its
seed.  Nothing here goes through fmail-nm's own readers: the files are read from disk, the
index through notmuch2, the server through IMAP.

* **Copies**: every message file, as bytes, per account (moves and flag renames keep the
  bytes; a Message-ID may have several files; a copy a write took out of its folder into the
  folder's hold is still a copy).  Nothing lost, nothing duplicated means the same multiset of
  (account, content digest) as before the fault.
* **Index**: notmuch knows exactly the files on disk and exactly the Message-IDs it knew.
* **Flags**: each message's flag tags are what its files' Maildir flags say, the way notmuch
  reads them (a flag counts when any file with a ``:2,`` part has it): unread/S (inverted),
  flagged/F, replied/R, draft/D, passed/P.
* **Places**: ``deleted``, ``spam``, ``archived`` exactly when a file is in a Trash, Junk or
  Archive folder; ``inbox`` only with a file in an inbox folder.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import notmuch2

from fmail_nm.store.maildir import is_held

# (account directory, sha1 of the file's bytes)
Copy = tuple[str, str]
FLAG_OF_TAG = {"flagged": "F", "replied": "R", "draft": "D", "passed": "P"}
ROLE_TAG = {"trash": "deleted", "junk": "spam", "archive": "archived"}
_MESSAGE_ID = re.compile(rb"^Message-ID:[ \t]*<?([^>\r\n]*)>?", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Tree:
    """Where a mail setup lives and which folders have which role (relative to the root)."""

    mail_root: Path
    notmuch_config: Path
    roles: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class Baseline:
    """The state every trial must come back to: the copies and the indexed Message-IDs."""

    copies: Counter[Copy]
    message_ids: frozenset[str]
    names: Mapping[str, str]  # digest -> Message-ID, for readable problem reports

    def lost(self, now: Counter[Copy]) -> int:
        """How many file copies the baseline had that are gone now."""
        return sum((self.copies - now).values())


def message_files(mail_root: Path) -> list[Path]:
    """Every message file under the root (in ``cur/`` or ``new/``; ``tmp/`` is not mail yet)."""
    return sorted(p for p in mail_root.rglob("*") if p.parent.name in ("cur", "new")
                  and p.is_file() and ".notmuch" not in p.parts)


def held_files(mail_root: Path) -> list[Path]:
    """Every file in a folder's hold: out of the index and of mbsync's sight, kept for undo."""
    return sorted(p for p in mail_root.rglob("*") if is_held(p) and p.is_file())


def content_digest(data: bytes) -> str:
    """The digest of a message's bytes, line ends made alike (mbsync may store CRLF as LF)."""
    return hashlib.sha1(data.replace(b"\r\n", b"\n")).hexdigest()


def disk_copies(mail_root: Path) -> tuple[Counter[Copy], dict[str, str]]:
    copies: Counter[Copy] = Counter()
    names: dict[str, str] = {}
    for path in message_files(mail_root) + held_files(mail_root):
        data = path.read_bytes()
        digest = content_digest(data)
        copies[(path.relative_to(mail_root).parts[0], digest)] += 1
        found = _MESSAGE_ID.search(data[:20_000])
        names[digest] = found.group(1).decode(errors="replace") if found else f"(no id) {path}"
    return copies, names


def _open(tree: Tree) -> notmuch2.Database:
    return notmuch2.Database(mode=notmuch2.Database.MODE.READ_ONLY,
                             config=str(tree.notmuch_config))


def indexed(tree: Tree) -> dict[str, tuple[frozenset[str], tuple[str, ...]]]:
    """Message-ID -> (tags, files) for every message in the index, excluded tags included."""
    db = _open(tree)
    try:
        return {m.messageid: (frozenset(m.tags), tuple(sorted(str(f) for f in m.filenames())))
                for m in db.messages("*", exclude_tags=())}
    finally:
        db.close()


def take_baseline(tree: Tree) -> Baseline:
    copies, names = disk_copies(tree.mail_root)
    baseline = Baseline(copies=copies, message_ids=frozenset(indexed(tree)), names=names)
    problems = check_local(tree, baseline)
    assert not problems, "the baseline itself breaks the invariants:\n" + "\n".join(problems)
    return baseline


# ---------------------------------------------------------------------------------------------
# The checks


def check_local(tree: Tree, baseline: Baseline) -> list[str]:
    """Every local invariant: copies, index against disk, flags and places against tags."""
    copies, names = disk_copies(tree.mail_root)
    problems = copy_problems(baseline, copies, {**baseline.names, **names})
    messages = indexed(tree)
    problems += index_problems(tree, baseline, messages)
    for mid, (tags, files) in sorted(messages.items()):
        problems += flag_problems(mid, tags, files)
        problems += place_problems(tree, mid, tags, files)
    return problems


def copy_problems(baseline: Baseline, now: Counter[Copy], names: Mapping[str, str]) -> list[str]:
    def describe(diff: Counter[Copy]) -> str:
        return ", ".join(f"{names.get(d, d)} in {account} x{n}"
                         for (account, d), n in sorted(diff.items()))
    problems = []
    if lost := baseline.copies - now:
        problems.append(f"lost: {describe(lost)}")
    if extra := now - baseline.copies:
        problems.append(f"duplicated or new: {describe(extra)}")
    return problems


def index_problems(tree: Tree, baseline: Baseline,
                   messages: Mapping[str, tuple[frozenset[str], tuple[str, ...]]]) -> list[str]:
    problems = []
    ids = frozenset(messages)
    if missing := baseline.message_ids - ids:
        problems.append(f"not in the index any more: {sorted(missing)}")
    if extra := ids - baseline.message_ids:
        problems.append(f"new in the index: {sorted(extra)}")
    on_disk = {str(p) for p in message_files(tree.mail_root)}
    in_index = {f for _, files in messages.values() for f in files}
    if gone := in_index - on_disk:
        problems.append(f"indexed files missing on disk: {sorted(gone)}")
    if unindexed := on_disk - in_index:
        problems.append(f"files on disk the index does not know: {sorted(unindexed)}")
    return problems


def maildir_flags(files: Iterable[str]) -> set[str] | None:
    """The union of the files' Maildir flags; None when no file has a ``:2,`` part (notmuch
    then leaves the flag tags as they are)."""
    found: set[str] | None = None
    for name in files:
        base = name.rsplit("/", 1)[-1]
        if ":2," in base:
            found = (found or set()) | set(base.rpartition(":2,")[2])
    return found


def flag_problems(mid: str, tags: frozenset[str], files: Iterable[str]) -> list[str]:
    flags = maildir_flags(files)
    if flags is None:
        return []
    want = {tag for tag, flag in FLAG_OF_TAG.items() if flag in flags}
    if "S" not in flags:
        want.add("unread")
    have = tags & {*FLAG_OF_TAG, "unread"}
    if have != want:
        return [f"{mid}: flag tags {sorted(have)} but files say {sorted(want)} ({list(files)})"]
    return []


def folder_of(tree: Tree, filename: str) -> str:
    return str(Path(filename).parent.parent.relative_to(tree.mail_root))


def place_problems(tree: Tree, mid: str, tags: frozenset[str], files: Iterable[str]) -> list[str]:
    folders = {folder_of(tree, f) for f in files}
    problems = []
    for role, tag in ROLE_TAG.items():
        placed = bool(folders & set(tree.roles.get(role, ())))
        if placed != (tag in tags):
            problems.append(f"{mid}: tag {tag!r} {'missing' if placed else 'set'} with files in "
                            f"{sorted(folders)}")
    if "inbox" in tags and not folders & set(tree.roles.get("inbox", ())):
        problems.append(f"{mid}: tagged inbox with no file in an inbox ({sorted(folders)})")
    return problems


# ---------------------------------------------------------------------------------------------
# The IMAP side


IMAP_FLAG = {"S": "\\Seen", "F": "\\Flagged", "R": "\\Answered", "D": "\\Draft"}


def server_problems(snapshot: Mapping[str, list[tuple[str, frozenset[str]]]],
                    expected: Iterable[str], tree: Tree, account: str) -> list[str]:
    """Every expected message on the server exactly once, in the folder its local file is in,
    with the flags of that file.  ``snapshot``: Message-ID (no brackets) -> [(folder, flags)]."""
    problems = []
    expected = set(expected)
    if missing := expected - set(snapshot):
        problems.append(f"missing on the server: {sorted(missing)}")
    if extra := set(snapshot) - expected:
        problems.append(f"unexpected on the server: {sorted(extra)}")
    local = indexed(tree)
    for mid in sorted(expected & set(snapshot)):
        places = snapshot[mid]
        if len(places) != 1:
            problems.append(f"{mid} is on the server {len(places)} times: {places}")
            continue
        (folder, flags), = places
        files = [f for f in local.get(mid, ((), ()))[1] if folder_of(tree, f).split("/")[0] == account]
        if len(files) != 1:
            problems.append(f"{mid}: {len(files)} local files in {account}: {files}")
            continue
        here = folder_of(tree, files[0]).split("/", 1)[1]
        if here != folder:
            problems.append(f"{mid}: on the server in {folder}, here in {here}")
        local_flags = {IMAP_FLAG[f] for f in (maildir_flags(files) or set()) if f in IMAP_FLAG}
        if set(flags) != local_flags:
            problems.append(f"{mid}: server flags {sorted(flags)}, local {sorted(local_flags)}")
    return problems
