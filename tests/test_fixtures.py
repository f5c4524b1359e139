"""The fixture mail tree (fixtures/maildir): it regenerates byte for byte, the committed copy is
current, it has the shape mbsync gives a Maildir, it holds the messages other tests name, and
real notmuch indexes it without complaint."""

from __future__ import annotations

import email
import email.policy
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from email.message import EmailMessage
from email.utils import getaddresses, parsedate_to_datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATOR = ROOT / "fixtures" / "generate.py"
COMMITTED = ROOT / "fixtures" / "maildir"
README = ROOT / "fixtures" / "README.md"

FOLDERS = {
    "personal": {"INBOX", "Sent", "Drafts", "Trash", "Junk", "Archive"},
    "work": {"INBOX", "Sent", "Trash"},
}
STATE_FILES = {".uidvalidity", ".mbsyncstate"}
NAME_RE = re.compile(r"^(?P<epoch>\d{10})\.(?P<pid>\d+)_(?P<seq>\d+)\.fixturehost,U=(?P<uid>\d+)"
                     r"(?P<info>:2,(?P<flags>[A-Z]*))?$")
ALLOWED_DOMAIN = re.compile(r"(^|\.)(example\.(com|net|org)|[a-z0-9-]+\.test)$")
BIG = 5 * 1024 * 1024

# Message-ID -> the folders ("account/folder/cur|new") holding a copy.  Other tests name these.
EXPECTED = {
    **{f"thread-deep-{i}@example.{'org' if i in (2, 5, 7) else 'net'}":
       {f"personal/{'Sent' if i in (2, 5, 7) else 'INBOX'}/cur"} for i in range(1, 9)},
    **{f"work-deep-{i}@acme.test": {f"work/{'Sent' if i % 2 == 0 else 'INBOX'}/cur"}
       for i in range(1, 8)},
    "unanswered-1@example.com": {"personal/INBOX/cur"},
    "unanswered-2@example.org": {"personal/Sent/cur"},
    "answered-1@example.org": {"personal/Sent/cur"},
    "answered-2@example.com": {"personal/INBOX/cur"},
    "school-trip-1@example.com": {"personal/INBOX/cur"},
    "multi-rcpt-1@example.com": {"personal/INBOX/cur"},
    "both-accounts-1@example.com": {"personal/INBOX/cur", "work/INBOX/cur"},
    "self-cc-1@example.org": {"personal/Sent/cur", "personal/INBOX/cur"},
    "fwd-orig-1@example.com": {"personal/INBOX/cur"},
    "fwd-1@example.org": {"personal/Sent/cur"},
    "wedding-1@example.net": {"personal/Archive/cur"},
    "wedding-2@example.org": {"personal/Sent/cur"},
    "html-only-1@coop.example.com": {"personal/INBOX/cur"},
    "alt-1@example.net": {"personal/INBOX/cur"},
    "attach-pdf-1@brightline.example.com": {"personal/INBOX/cur"},
    "attach-png-1@example.net": {"personal/INBOX/cur"},
    "attach-txt-1@example.com": {"personal/INBOX/cur"},
    "charset-latin1@example.com": {"personal/INBOX/cur"},
    "charset-cp1252@example.net": {"personal/INBOX/cur"},
    "charset-iso2022jp@example.net": {"personal/INBOX/cur"},
    "charset-unknown@example.com": {"personal/INBOX/cur"},
    "rfc2047-utf8@example.net": {"personal/INBOX/cur"},
    "rfc2047-latin1@example.net": {"personal/INBOX/cur"},
    "no-subject-1@example.net": {"personal/INBOX/cur"},
    "no-date-1@parcelgo.example.net": {"personal/INBOX/cur"},
    "broken-boundary-1@example.net": {"personal/INBOX/cur"},
    "broken-base64-1@example.net": {"personal/INBOX/cur"},
    "big-attachment-1@acme.test": {"work/INBOX/cur"},
    "invite-1@acme.test": {"work/INBOX/cur"},
    "draft-1@example.org": {"personal/Drafts/cur"},
    "draft-2@example.org": {"personal/Drafts/cur"},
    "trash-1@bookshelf.example.com": {"personal/Trash/cur"},
    "trash-2@example.net": {"personal/Trash/cur"},
    "work-trash-1@acme.test": {"work/Trash/cur"},
    "junk-1@prizes.example.net": {"personal/Junk/cur"},
    "junk-4@parcel-notify.example.com": {"personal/Junk/new"},
    "mum-visit-2026@example.net": {"personal/INBOX/new"},
    "tom-hotfix@acme.test": {"work/INBOX/new"},
    **{f"list-rust-{i}@example.{'com' if i % 2 else 'net'}": {"personal/INBOX/cur"}
       for i in range(1, 7)},
    "list-rust-7@example.com": {"personal/INBOX/new"},
    "list-hike-1@example.net": {"personal/INBOX/cur"},
}
# Maildir flags of the single (or every) copy, where a test relies on them.
EXPECTED_FLAGS = {
    "thread-deep-1@example.net": "RS",
    "thread-deep-6@example.net": "FRS",
    "unanswered-1@example.com": "RS",
    "fwd-orig-1@example.com": "PS",
    "attach-pdf-1@brightline.example.com": "FS",
    "html-only-1@coop.example.com": "",
    "draft-1@example.org": "D",
    "draft-2@example.org": "DS",
    "trash-1@bookshelf.example.com": "ST",
    "work-trash-1@acme.test": "ST",
    "thread-deep-2@example.org": "S",
}


# --------------------------------------------------------------------------------------------

def generate(out: Path) -> None:
    subprocess.run([sys.executable, str(GENERATOR), "--out", str(out)], check=True,
                   capture_output=True, timeout=120)


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fixtures") / "maildir"
    generate(out)
    return out


@pytest.fixture(scope="module")
def mails(tree: Path) -> list[tuple[str, Path, EmailMessage]]:
    """(account/folder/sub, path, parsed message) for every message file."""
    out = []
    for p in sorted(tree.glob("*/*/*/*")):
        if p.parent.name in ("cur", "new"):
            with p.open("rb") as fh:
                msg = email.message_from_binary_file(fh, policy=email.policy.default)
            out.append((p.parent.relative_to(tree).as_posix(), p, msg))
    return out


def msgid(msg: EmailMessage) -> str | None:
    raw = msg.get("Message-ID")
    return str(raw).strip().strip("<>") if raw else None


def by_id(mails, mid: str) -> list[tuple[str, Path, EmailMessage]]:
    return [m for m in mails if msgid(m[2]) == mid]


# --------------------------------------------------------------------------------------------
# determinism

def test_generator_is_deterministic(tree: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    generate(again)
    first, second = snapshot(tree), snapshot(again)
    assert sorted(first) == sorted(second)
    assert [k for k in first if first[k] != second[k]] == []
    dirs = lambda root: sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                               if p.is_dir())
    assert dirs(tree) == dirs(again)


def test_committed_tree_matches_generator(tree: Path) -> None:
    if not COMMITTED.is_dir():
        pytest.skip("fixtures/maildir not present")
    # A git checkout lacks the empty tmp/ (and empty new/) dirs, so compare files only.
    committed, fresh = snapshot(COMMITTED), snapshot(tree)
    assert sorted(committed) == sorted(fresh), "run: python fixtures/generate.py"
    assert [k for k in fresh if committed[k] != fresh[k]] == [], "run: python fixtures/generate.py"


# --------------------------------------------------------------------------------------------
# shape

def test_layout_is_mbsync_like(tree: Path) -> None:
    assert {p.name for p in tree.iterdir()} == set(FOLDERS)
    for account, folders in FOLDERS.items():
        assert {p.name for p in (tree / account).iterdir()} == folders
        for folder in folders:
            fdir = tree / account / folder
            assert {p.name for p in fdir.iterdir()} == {"cur", "new", "tmp"} | STATE_FILES
            assert list((fdir / "tmp").iterdir()) == []
            names = [(sub, p.name) for sub in ("cur", "new") for p in (fdir / sub).iterdir()]
            uids = []
            for sub, name in names:
                m = NAME_RE.match(name)
                assert m, name
                uids.append(int(m["uid"]))
                if sub == "cur":
                    assert m["info"], name
                    flags = m["flags"]
                    assert flags == "".join(sorted(set(flags))) and set(flags) <= set("DFPRST")
                else:
                    assert not m["flags"], f"{name}: new/ carries no flags"
            assert sorted(uids) == list(range(1, len(uids) + 1)), fdir
            uidvalidity, maxuid = (fdir / ".uidvalidity").read_text().split("\n")[:2]
            assert uidvalidity.isdigit() and int(maxuid) == len(uids)
            state = (fdir / ".mbsyncstate").read_text()
            assert state.startswith("FarUidValidity ")
            assert f"\nNearUidValidity {uidvalidity}\n" in state
            assert len(state.split("\n\n", 1)[1].splitlines()) == len(uids)
    # both spellings of a file in new/: mbsync's ":2," and a delivery agent's bare name
    new_names = [p.name for p in tree.glob("*/*/new/*")]
    assert any(n.endswith(":2,") for n in new_names) and any(":2," not in n for n in new_names)


def test_counts_and_named_messages(mails) -> None:
    assert len(mails) >= 150
    assert {loc.split("/")[0] for loc, _, _ in mails} == set(FOLDERS)
    where: dict[str, set[str]] = {}
    for loc, _, msg in mails:
        mid = msgid(msg)
        if mid:
            where.setdefault(mid, set()).add(loc)
    assert len(where) >= 150
    for mid, locs in EXPECTED.items():
        assert where.get(mid) == locs, mid
    for mid, flags in EXPECTED_FLAGS.items():
        for _, path, _ in by_id(mails, mid):
            assert path.name.rsplit(":2,", 1)[1] == flags, mid
    # exactly one message without a Message-ID, one without Subject, one without Date
    assert sum(1 for _, _, m in mails if "Message-ID" not in m) == 1
    assert [msgid(m) for _, _, m in mails if "Subject" not in m] == ["no-subject-1@example.net"]
    assert [msgid(m) for _, _, m in mails if "Date" not in m] == ["no-date-1@parcelgo.example.net"]
    # a handful of each flag
    flags = "".join(p.name.rsplit(":2,", 1)[1] for _, p, _ in mails if ":2," in p.name)
    for f in "DFPRST":
        assert f in flags
    assert sum(1 for loc, _, _ in mails if loc.endswith("/new")) >= 5


def test_dates_and_domains(mails) -> None:
    lo = datetime(2025, 1, 1, tzinfo=timezone.utc)
    hi = datetime(2026, 11, 30, 23, 59, 59, tzinfo=timezone.utc)
    offsets = set()
    for _, path, msg in mails:
        if "Date" in msg:
            d = parsedate_to_datetime(str(msg["Date"]))
            assert lo <= d <= hi, path
            offsets.add(d.utcoffset())
        for h in ("From", "To", "Cc", "Reply-To", "Sender"):
            for _, addr in getaddresses([str(v) for v in msg.get_all(h, [])]):
                assert ALLOWED_DOMAIN.search(addr.rsplit("@", 1)[-1]), (path, h, addr)
        mid = msgid(msg)
        if mid:
            assert ALLOWED_DOMAIN.search(mid.rsplit("@", 1)[-1]), mid
    assert len(offsets) >= 5


def test_threads_are_linked(mails) -> None:
    chain = [f"thread-deep-{i}@example.{'org' if i in (2, 5, 7) else 'net'}" for i in range(1, 9)]
    for i, mid in enumerate(chain[1:], 1):
        (_, _, msg), = by_id(mails, mid)
        assert str(msg["In-Reply-To"]).strip() == f"<{chain[i - 1]}>"
        assert str(msg["References"]).split() == [f"<{c}>" for c in chain[:i]]
    (_, _, last), = by_id(mails, "unanswered-2@example.org")
    assert "alex@example.org" in str(last["From"])
    lists = {str(m["List-Id"]) for _, _, m in mails if "List-Id" in m}
    assert any("rust-users.lists.example.org" in x for x in lists)
    assert any("hikers.lists.example.net" in x for x in lists)
    assert sum(1 for _, _, m in mails if "List-Id" in m) >= 10
    assert all("List-Unsubscribe" in m for _, _, m in mails if "List-Id" in m)


def test_mime_content(mails) -> None:
    def one(mid: str) -> EmailMessage:
        (_, _, msg), = by_id(mails, mid)
        return msg

    pypdf = pytest.importorskip("pypdf")
    pdf = next(p for p in one("attach-pdf-1@brightline.example.com").walk()
               if p.get_filename() == "invoice-2026-0042.pdf")
    text = pypdf.PdfReader(io.BytesIO(pdf.get_content()), strict=True).pages[0].extract_text()
    assert "Invoice 2026-0042 total 123.45 EUR" in text

    png = next(p for p in one("attach-png-1@example.net").walk() if p.get_filename() == "bench.png")
    assert png.get_content().startswith(b"\x89PNG\r\n\x1a\n")

    big = next(p for p in one("big-attachment-1@acme.test").walk()
               if p.get_filename() == "dataset.csv")
    assert len(big.get_payload(decode=True)) >= BIG

    alt = one("alt-1@example.net")
    assert alt.get_content_type() == "multipart/alternative"
    plain = alt.get_body(("plain",)).get_content()
    html = alt.get_body(("html",)).get_content()
    assert "19:30" in plain and "19:45" in html and "19:45" not in plain

    html_only = one("html-only-1@coop.example.com")
    assert html_only.get_content_type() == "text/html"
    src = html_only.get_content()
    assert src.count("<a href=") == 2 and "<table" in src and "<script" in src and "<style" in src

    assert "Köln" in one("charset-latin1@example.com").get_content()
    cp = one("charset-cp1252@example.net")
    payload = cp.get_payload(decode=True)
    assert all(b in payload for b in (b"\x93", b"\x94", b"\x80", b"\x85", b"\x96"))
    assert "こんにちは、会議の件です" in one("charset-iso2022jp@example.net").get_content()
    assert str(one("charset-iso2022jp@example.net")["Subject"]) == "会議の件"
    assert one("charset-unknown@example.com").get_content_charset() == "x-unknown-42"
    assert "München" in str(one("rfc2047-utf8@example.net")["Subject"])
    assert str(one("rfc2047-latin1@example.net")["Subject"]) == "Café crème à la gare?"

    fwd = one("fwd-1@example.org")
    inner = next(p for p in fwd.walk() if p.get_content_type() == "message/rfc822")
    assert msgid(inner.get_content()) == "fwd-orig-1@example.com"

    (_, path, broken), = by_id(mails, "broken-boundary-1@example.net")
    body = path.read_bytes().split(b"\n\n", 1)[1]
    assert broken.get_boundary().encode() not in body and b"\n--" in body


def test_readme_is_current() -> None:
    text = README.read_text(encoding="utf-8")
    for mid in EXPECTED:
        assert f"<{mid}>" in text, mid
    table = subprocess.run([sys.executable, str(GENERATOR), "--manifest"], check=True,
                           capture_output=True, text=True, timeout=120).stdout
    assert table in text, "paste `python fixtures/generate.py --manifest` into fixtures/README.md"


def test_generator_refuses_to_delete_foreign_dirs(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    res = subprocess.run([sys.executable, str(GENERATOR), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and (tmp_path / "precious.txt").read_text() == "keep me"


# --------------------------------------------------------------------------------------------
# real notmuch

NOTMUCH = shutil.which("notmuch")


def _nm(env: dict[str, str], *args: str) -> str:
    res = subprocess.run(["notmuch", *args], env=env, capture_output=True, timeout=120)
    assert res.returncode == 0, (args, res.stderr)
    # notmuch passes undecodable bytes through, even inside JSON (see the x-unknown-42 part)
    return res.stdout.decode("utf-8", "surrogateescape")


@pytest.mark.skipif(NOTMUCH is None, reason="notmuch not installed")
def test_notmuch_indexes_the_tree(tree: Path, mails, tmp_path: Path) -> None:
    mail = tmp_path / "mail"
    shutil.copytree(tree, mail)
    cfg = tmp_path / "notmuch-config"
    cfg.write_text(
        f"[database]\npath={mail}\n"
        "[user]\nname=Alex Morgan\nprimary_email=alex@example.org\n"
        "other_email=alex.morgan@example.org;amorgan@acme.test\n"
        "[new]\ntags=new\n"
        "ignore=.mbsyncstate;.mbsyncstate.journal;.mbsyncstate.new;.mbsyncstate.lock;.uidvalidity\n"
        "[search]\nexclude_tags=deleted;spam\n"
        "[maildir]\nsynchronize_flags=true\n")
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "XDG_CONFIG_HOME": str(home / ".config"), "NOTMUCH_CONFIG": str(cfg), "LANG": "C.UTF-8"}

    res = subprocess.run(["notmuch", "new"], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr
    assert "non-mail" not in out and "Warning" not in out and "Error" not in out, out

    ids = {msgid(m) for _, _, m in mails} - {None}
    no_id = [p for _, p, m in mails if "Message-ID" not in m]
    assert int(_nm(env, "count", "*")) == len(ids) + len(no_id)
    assert int(_nm(env, "count", "--output=files", "*")) == len(mails)

    def thread_ids(mid: str, *opts: str) -> list[str]:
        return _nm(env, "search", "--output=messages", *opts, f"thread:{{id:{mid}}}").split()

    deep = [f"id:thread-deep-{i}@example.{'org' if i in (2, 5, 7) else 'net'}" for i in range(1, 9)]
    assert sorted(thread_ids("thread-deep-1@example.net")) == sorted(deep)
    assert len(thread_ids("work-deep-1@acme.test")) == 7
    assert sorted(thread_ids("list-rust-1@example.com")) == [
        "id:list-rust-1@example.com", "id:list-rust-2@example.net", "id:list-rust-3@example.com"]
    assert thread_ids("unanswered-1@example.com", "--sort=newest-first")[0] == \
        "id:unanswered-2@example.org"
    assert thread_ids("answered-1@example.org", "--sort=newest-first")[0] == \
        "id:answered-2@example.com"

    files = _nm(env, "search", "--output=files", "id:both-accounts-1@example.com").split()
    assert sorted(f.split("/mail/")[1].split("/")[0] for f in files) == ["personal", "work"]
    assert len(_nm(env, "search", "--output=files", "id:self-cc-1@example.org").split()) == 2

    sha1 = hashlib.sha1(no_id[0].read_bytes()).hexdigest()
    assert _nm(env, "search", "--output=messages", 'subject:"plum cake"').split() == [
        f"id:notmuch-sha1-{sha1}"]
    nodate = json.loads(_nm(env, "show", "--format=json", "--body=false",
                            "id:no-date-1@parcelgo.example.net"))
    assert nodate[0][0][0]["timestamp"] == 0  # the root of its own thread

    def tags(mid: str) -> set[str]:
        return set(_nm(env, "search", "--output=tags", f"id:{mid}").split())

    assert "replied" in tags("thread-deep-1@example.net")
    assert "passed" in tags("fwd-orig-1@example.com")
    assert {"draft", "unread"} <= tags("draft-1@example.org")
    assert "flagged" in tags("attach-pdf-1@brightline.example.com")
    assert "unread" in tags("mum-visit-2026@example.net")
    assert "unread" in tags("html-only-1@coop.example.com")
    assert "unread" not in tags("thread-deep-2@example.org")
    for mid in ("attach-pdf-1@brightline.example.com", "attach-png-1@example.net",
                "attach-txt-1@example.com", "big-attachment-1@acme.test"):
        assert "attachment" in tags(mid), mid
    # notmuch descends into a message/rfc822 part instead of treating it as an attachment
    assert "attachment" not in tags("fwd-1@example.org")

    for query, n in (("subject:会議の件", 1), ("Köln", 1), ("subject:München", 1),
                     ('subject:"Café crème"', 1), ("attachment:dataset.csv", 1),
                     ("mimetype:text/calendar", 1), ("folder:personal/Junk", 4)):
        assert int(_nm(env, "count", query)) == n, query

    # the x-unknown-42 part comes out of `notmuch show --format=json` as raw, invalid UTF-8
    unknown = _nm(env, "show", "--format=json", "id:charset-unknown@example.com")
    assert "\udca4" in unknown  # byte 0xa4, surrogate-escaped

    for mid in list(EXPECTED) + [f"notmuch-sha1-{sha1}"]:
        body = "false" if mid == "big-attachment-1@acme.test" else "true"
        shown = json.loads(_nm(env, "show", "--format=json", f"--body={body}",
                               "--entire-thread=false", f"id:{mid}"))
        assert _shown_ids(shown) == [mid]


def _shown_ids(node: object) -> list[str]:
    """Ids of the messages in `notmuch show --format=json` output (non-matches are null)."""
    if isinstance(node, dict):
        return [node["id"]] if "id" in node else []
    if isinstance(node, list):
        return [i for child in node for i in _shown_ids(child)]
    return []
