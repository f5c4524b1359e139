"""Files delivered since the last index run are parsed while ``notmuch new`` runs, and the
mirror takes those parses instead of parsing again -- with rows exactly as a parse afterwards
would give them."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from fmail_nm.passes.mirror import Parsed, check, sync_sidecar
from fmail_nm.passes.prefetch import STAMP_NAME, Prefetch, arrived_since
from fmail_nm.service.index import run_index
from fmail_nm.store import sidecar
from fmail_nm.store.notmuch import Reader

from .conftest import MailEnv, notmuch_lock_held
from .test_background import WAIT, _gone


def delivered(folder: Path, n: int, *, list_id: str | None = None) -> Path:
    """A message delivered as an MDA or mbsync does it: written in tmp/, renamed into new/."""
    name = f"{time.time_ns()}.{os.getpid()}_{n}.prefetchhost"
    headers = (f"From: Sam Lee <sam@example.net>\nTo: Alex Morgan <alex@example.org>, "
               f"Kim <kim@example.com>\nSubject: delivery {n}\n"
               f"Date: Tue, 02 Jan 2024 10:0{n}:00 +0000\nMessage-ID: <prefetch-{n}@example.net>\n")
    if list_id:
        headers += f"List-Id: Team <{list_id}>\n"
    for sub in ("tmp", "new"):
        (folder / sub).mkdir(exist_ok=True)
    tmp = folder / "tmp" / name
    tmp.write_bytes((headers + f"\nThe body of delivery {n}.\n").encode())
    return tmp.rename(folder / "new" / name)


def test_files_added_or_renamed_since_a_time_are_found_new_first(mail_env: MailEnv) -> None:
    inbox = mail_env.mail_root / "personal" / "INBOX"
    old = sorted((inbox / "cur").iterdir())[0]
    since = time.time()
    time.sleep(0.05)
    fresh = delivered(inbox, 1)
    (inbox / "tmp" / "half-written").write_bytes(b"Subject: not yet\n")
    renamed = old.rename(old.with_name(old.name + "F"))  # a mail client flags it
    found = list(arrived_since(mail_env.mail_root, since))
    assert found == [str(fresh), str(renamed)]
    assert list(arrived_since(mail_env.mail_root, time.time() + 60)) == []


def test_a_stopped_prefetch_parses_none_of_the_deliveries_left(mail_env: MailEnv) -> None:
    # A run that failed or was stopped at shutdown stops its prefetch: waiting for every
    # delivery's parse (up to MAX_FILES) held the service's shutdown past its grace.
    inbox = mail_env.mail_root / "personal" / "INBOX"
    since = time.time()
    time.sleep(0.05)
    files = [str(delivered(inbox, n)) for n in range(5)]
    prefetch = Prefetch(mail_env.mail_root, mail_env.base / "prefetch-data", fallback=since).start()
    assert set(files) <= set(prefetch.deliveries() or [])
    prefetch.stop()
    assert prefetch.take() == {}


def test_an_index_run_stopped_at_shutdown_waits_for_no_delivery_parse(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose notmuch new the shutdown stopped stops its prefetch: waiting for every
    delivery's parse (up to MAX_FILES) held the service's shutdown past its grace.  The first
    parse here lasts until the prefetch is told to stop, as a slow one would."""
    from fmail_nm.passes import mirror
    from fmail_nm.service import index
    from fmail_nm.store.notmuch_cli import NEW_RUNS

    made: list[Prefetch] = []

    class Seen(Prefetch):
        def start(self) -> Prefetch:
            made.append(self)
            return super().start()

    parse, parsing, cut_short = mirror.parse_file, threading.Event(), []

    def slow_parse(names: list[str]) -> Parsed:
        if not cut_short:
            parsing.set()
            cut_short.append(made[0]._stop.wait(WAIT))
        return parse(names)

    monkeypatch.setattr(index, "Prefetch", Seen)
    monkeypatch.setattr(mirror, "parse_file", slow_parse)
    inbox = indexed.mail_root / "work" / "INBOX"
    for n in range(3):  # fewer than DELIVERY_MIN_FILES: notmuch new's to index
        delivered(inbox, n)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            run_index(indexed.config(), show_progress=False)
        except BaseException as exc:
            raised.append(exc)

    with notmuch_lock_held(indexed.env):  # notmuch new waits for it, as the parse goes on
        runner = threading.Thread(target=run)
        runner.start()
        assert parsing.wait(WAIT)
        NEW_RUNS.stop_all(1.0, final=True)  # the shutdown
        runner.join()
    assert [type(exc) for exc in raised] == [index.IndexingStopped]
    assert cut_short == [True]  # the parse under way was told to stop, not waited out
    assert len(made[0].take()) == 1  # no parse after it


def test_an_index_run_takes_the_parses_made_while_notmuch_new_ran(indexed: MailEnv) -> None:
    config = indexed.config()
    assert (config.data_dir / STAMP_NAME).is_file()  # fmail-nm init's index run left it
    inbox = indexed.mail_root / "work" / "INBOX"
    for n in range(3):
        delivered(inbox, n, list_id="team.example.com" if n == 0 else None)
    summary = run_index(config, show_progress=False)
    assert (summary.added, summary.parsed_ahead) == (3, 3)
    with Reader() as reader, sidecar.opened(sidecar.sidecar_path(config.data_dir)) as conn:
        assert check(config, reader, conn, parse_files=True) == []
        row = conn.execute("SELECT list_id, body_preview FROM messages WHERE message_id = ?",
                           ("prefetch-0@example.net",)).fetchone()
    assert tuple(row) == ("team.example.com", "The body of delivery 0.")
    assert indexed.notmuch("count", "tag:list AND id:prefetch-0@example.net").stdout.strip() == "1"

    # Without a stamp (notmuch new and the hook indexed everything so far, or it was lost),
    # the files that arrived since the database's last commit are the delivery.
    (config.data_dir / STAMP_NAME).unlink()
    time.sleep(0.05)
    delivered(inbox, 3)
    summary = run_index(config, show_progress=False)
    assert (summary.added, summary.delivered, summary.parsed_ahead) == (1, 0, 1)
    assert (config.data_dir / STAMP_NAME).is_file()
    # Mail that arrived before the last commit is notmuch new's (and parsed by the mirror).
    (config.data_dir / STAMP_NAME).unlink()
    delivered(inbox, 4)
    time.sleep(0.2)  # well beyond the clock's slack
    indexed.notmuch("tag", "+seen-by-mutt", "--", "id:prefetch-0@example.net")
    summary = run_index(config, show_progress=False)
    assert (summary.added, summary.delivered, summary.parsed_ahead) == (1, 0, 0)
    assert indexed.notmuch("count", "id:prefetch-4@example.net").stdout.strip() == "1"


def test_the_mirror_takes_a_parse_only_for_the_file_it_would_read(indexed: MailEnv) -> None:
    """A parse is keyed by file name: one made for another file (renamed since) is not used."""
    config = indexed.config()
    inbox = indexed.mail_root / "work" / "INBOX"
    kept, stale = delivered(inbox, 1), delivered(inbox, 2)
    indexed.notmuch("new", "--no-hooks")
    marked = Parsed(recipients=[], list_id=None, body_preview="parsed ahead", size=1)
    with Reader() as reader:
        report = sync_sidecar(config, reader, prefetched={
            str(kept): marked, str(stale) + ".old-name": marked})
    assert report.prefetched == 1
    with sidecar.opened(sidecar.sidecar_path(config.data_dir)) as conn:
        previews = dict(conn.execute(
            "SELECT message_id, body_preview FROM messages WHERE message_id LIKE 'prefetch-%'"))
    assert previews == {"prefetch-1@example.net": "parsed ahead",
                        "prefetch-2@example.net": "The body of delivery 2."}


def test_parse_workers_end_when_the_process_that_started_them_is_killed(tmp_path: Path) -> None:
    """A parse worker waits for work on a pipe it holds both ends of: `fmail-nm index`
    killed with SIGKILL left its workers waiting for good."""
    import signal
    import subprocess
    import sys

    script = (
        "import os, signal, sys\n"
        "from fmail_nm.passes.mirror import parse_pool\n"
        "pool = parse_pool(2)\n"
        "assert pool is not None\n"
        "list(pool.map(abs, [-1, -2, -3, -4]))\n"
        "print(' '.join(str(p) for p in pool._processes), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    # Output to files: workers that outlive it would hold a pipe open, and run() wait.
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:
        done = subprocess.run([sys.executable, "-c", script], stdout=stdout, stderr=stderr,
                              timeout=60, cwd=tmp_path)
    assert done.returncode == -signal.SIGKILL, err.read_text()
    workers = [int(pid) for pid in out.read_text().split()]
    assert len(workers) == 2
    try:
        deadline = time.monotonic() + 30
        while not all(map(_gone, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(map(_gone, workers)), "parse workers outlived their parent"
    finally:
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
