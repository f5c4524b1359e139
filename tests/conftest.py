"""Shared test set-up: a private copy of the fixture mail, indexed by real notmuch.

Every test runs with HOME and the XDG directories pointing into its own temp dir, so neither
the machine's nor the developer's own mail setup is ever read or changed.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

# Tests assert behaviour, never timing: no per-example deadline for property tests (a
# loaded machine misses Hypothesis's default 200 ms, and CI would fail on speed).
settings.register_profile("behaviour-only", deadline=None)
settings.load_profile("behaviour-only")

# A test run started in the background of a shell without job control (`cmd &` in a script,
# nohup) inherits SIGINT ignored, and so would every fmail-nm and notmuch it starts -- where
# the Ctrl-C tests need it delivered.  A handler of our own is reset to the default in each
# child at exec; an ignored signal would stay ignored.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parent.parent
FIXTURE_MAILDIR = REPO / "fixtures" / "maildir"
FIXTURE_FMAIL_TOML = REPO / "fixtures" / "fmail.toml"
USER_ADDRESSES = ["alex@example.org", "alex.morgan@example.org", "amorgan@acme.test"]


@dataclass
class MailEnv:
    """An isolated mail setup: fixture copy, notmuch config, fmail.toml, XDG dirs."""

    base: Path
    mail_root: Path
    notmuch_config: Path
    fmail_config: Path
    env: dict[str, str]

    def notmuch(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        if args[:1] == ("new",):
            # Every folder listed: a delivery a test makes just after the last scan can land
            # in the second notmuch recorded for its folder, and be passed over (see
            # run_notmuch_new's full_scan): a race of the machine, not the behaviour tested.
            args = ("new", "--full-scan", *args[1:])
        return subprocess.run(["notmuch", *args], env={**os.environ, **self.env}, text=True,
                              capture_output=True, timeout=120, check=check)

    def fmail(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        import sys
        return subprocess.run([sys.executable, "-m", "fmail_nm", *args],
                              env={**os.environ, **self.env}, text=True, capture_output=True,
                              timeout=300, check=check)

    def config(self):  # type: ignore[no-untyped-def]
        from fmail_nm.app import load_config
        return load_config()


LOCK_HOLDER = """
import sys, notmuch2
db = notmuch2.Database(mode=notmuch2.Database.MODE.READ_WRITE)
print("locked", flush=True)
sys.stdin.read()
db.close()
"""


class LockHolder:
    """Another process holding the notmuch write lock, as ``notmuch new`` or a mail client do."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        import sys
        self.proc = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "locked"

    def release(self) -> None:
        """Close the database and wait for the process to end."""
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=30)


def stderr_lines(proc: subprocess.Popen[str], n: int, *, within: float) -> list[str]:
    """The first ``n`` lines ``proc`` writes to stderr, as many as came within ``within``
    seconds and "" for the rest: a command that waits without a word must fail its test, not
    hang it."""
    lines: queue.Queue[str] = queue.Queue()
    stream = proc.stderr
    assert stream is not None

    def read() -> None:
        for _ in range(n):
            lines.put(stream.readline())

    threading.Thread(target=read, daemon=True).start()
    got: list[str] = []
    deadline = time.monotonic() + within
    try:
        while len(got) < n:
            got.append(lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
    except queue.Empty:
        pass
    return got + [""] * (n - len(got))


@contextmanager
def notmuch_lock_held(env: dict[str, str] | None = None) -> Iterator[LockHolder]:
    holder = LockHolder(env)
    try:
        yield holder
    finally:
        holder.proc.kill()
        holder.proc.wait(timeout=10)


def damage_index(env: MailEnv) -> tuple[Path, bytes]:
    """Zero the index's posting lists (a disk error, a copy taken mid-write): Xapian refuses
    to open the database.  The damaged file and its bytes, to check that nothing rewrites it."""
    postlist = env.mail_root / ".notmuch" / "xapian" / "postlist.glass"
    postlist.write_bytes(bytes(postlist.stat().st_size))
    return postlist, postlist.read_bytes()


def isolated_env(base: Path) -> dict[str, str]:
    home = base / "home"
    home.mkdir(parents=True, exist_ok=True)
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "NOTMUCH_CONFIG": str(base / "notmuch-config"),
        "FMAIL_CONFIG": str(base / "fmail.toml"),
    }


def make_mail_env(base: Path, *, init: bool = True) -> MailEnv:
    mail_root = base / "mail"
    shutil.copytree(FIXTURE_MAILDIR, mail_root, symlinks=True)
    shutil.copyfile(FIXTURE_FMAIL_TOML, base / "fmail.toml")
    env = isolated_env(base)
    mail_env = MailEnv(base=base, mail_root=mail_root, notmuch_config=base / "notmuch-config",
                       fmail_config=base / "fmail.toml", env=env)
    return mail_env


def run_init(mail_env: MailEnv, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    args = ["init", "--mail-root", str(mail_env.mail_root), "--name", "Alex Morgan"]
    for address in USER_ADDRESSES:
        args += ["--address", address]
    return mail_env.fmail(*args, check=check)


@pytest.fixture(autouse=True)
def runs_start_again() -> Iterator[None]:
    """A server's shutdown leaves this process refusing mbsync, msmtp check and notmuch new
    runs for good (``final`` of runs.stop_together, mbsync.stop_running): the next
    test, in the same process, starts afresh."""
    yield
    from fmail_nm.service import mbsync
    from fmail_nm.store import notmuch_cli
    mbsync.RUNS.start_again()
    notmuch_cli.NEW_RUNS.start_again()


@pytest.fixture(scope="session", autouse=True)
def fmail_nm_compiled_once(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every Python the tests start (CLI runs, notmuch hooks, MCP servers, index workers:
    hundreds) reads one compile of fmail_nm: under PYTHONDONTWRITEBYTECODE each compiled
    the package again.  The cache is kept in the session's temp dir, never the source tree."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
        mp.setenv("PYTHONPYCACHEPREFIX", str(tmp_path_factory.mktemp("pycache")))
        yield


@pytest.fixture
def anyio_backend() -> str:
    """The `mcp` client tests run on asyncio."""
    return "asyncio"


@pytest.fixture
def mail_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MailEnv:
    """A fresh, not yet initialised copy of the fixture mail (function scope: tests may write)."""
    env = make_mail_env(tmp_path)
    for key, value in env.env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture(scope="session")
def indexed_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The fixture mail after one real ``fmail-nm init``, for :func:`indexed` to copy (a copy
    costs a few ms; an init, with its index run, most of a second).  Do not write to it."""
    base = tmp_path_factory.mktemp("indexed-template")
    env = make_mail_env(base)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.env.items():
            mp.setenv(key, value)
        run_init(env)
    # Every file that names the tree's own place is one copy_indexed moves along: a new one
    # (init writing its path somewhere else) must be added there, not shared by every copy.
    naming = {str(path.relative_to(base)) for path in base.rglob("*")
              if path.is_file() and not path.is_symlink()
              and str(base).encode() in path.read_bytes()}
    sidecar = "home/.local/share/fmail-nm/sidecar.sqlite3"
    moved = {"notmuch-config", "mail/.notmuch/hooks/post-new", "mail/.notmuch/hooks/post-insert",
             sidecar, sidecar + "-wal"}
    assert "notmuch-config" in naming and naming <= moved, naming
    yield base


def copy_indexed(template: Path, env: MailEnv) -> None:
    """Put ``template`` (a tree :func:`run_init` made) at ``env.base`` as init would have left
    it there: the files as they are, and the places init wrote the tree's own absolute path
    (notmuch's database path, the hook's --config, the sidecar's file names) moved along."""
    import json
    import sqlite3

    old, new = str(template), str(env.base)
    shutil.rmtree(env.mail_root)
    shutil.copytree(template, env.base, symlinks=True, dirs_exist_ok=True)
    hooks = env.mail_root / ".notmuch" / "hooks"
    for text_file in [env.notmuch_config, *(p for p in hooks.iterdir() if p.is_file())]:
        text = text_file.read_text()
        if old in text:
            text_file.write_text(text.replace(old + "/", new + "/"))
    sidecar = Path(env.env["XDG_DATA_HOME"]) / "fmail-nm" / "sidecar.sqlite3"
    db = sqlite3.connect(sidecar)
    try:
        with db:
            db.execute("UPDATE messages SET filenames = replace(filenames, ?, ?)",
                       (json.dumps(old + "/")[1:-1], json.dumps(new + "/")[1:-1]))
        assert db.execute("SELECT count(*) FROM messages WHERE instr(filenames, ?)",
                          (json.dumps(old)[1:-1],)).fetchone() == (0,)
    finally:
        db.close()


@pytest.fixture
def indexed(mail_env: MailEnv, indexed_template: Path) -> MailEnv:
    """The fixture mail after ``fmail-nm init``: config written, hooks installed, indexed
    (a copy of one init's tree: see :func:`copy_indexed`)."""
    copy_indexed(indexed_template, mail_env)
    return mail_env


@pytest.fixture(scope="session")
def shared_indexed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MailEnv]:
    """One indexed copy for read-only tests. Do not write to it."""
    env = make_mail_env(tmp_path_factory.mktemp("shared"))
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.env.items():
            mp.setenv(key, value)
        run_init(env)
        yield env


# --- Reliability suites (fault injection, load, fuzzing) -----------------------------------
# Each reliability test runs a bounded number of seeded trials in the normal suite and more
# with ``--runslow``.  When FMAIL_RELIABILITY_LOG names a file, every test appends one JSON line
# with its figures; ``bench/reliability.py`` runs the suites that way and sums them.

# pytest-timeout's bound for a reliability test: its --runslow variant runs longer than the
# 300 s every other test gets (pyproject.toml).
SLOW_TIMEOUT = 1800


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False,
                     help="run the long variants of the reliability suites")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "reliability: fault injection, load or fuzzing figures")


@dataclass
class Reliability:
    """How many trials a reliability test runs, and where it reports what survived."""

    slow: bool
    test_id: str

    def trials(self, ci: int, slow: int) -> int:
        """``ci`` trials in the normal suite, ``slow`` with ``--runslow``."""
        return slow if self.slow else ci

    def record(self, suite: str, *, trials: int = 0, faults: int = 0, inputs: int = 0,
               lost: int = 0, hangs: int = 0, **extra: object) -> None:
        """Append this test's figures to FMAIL_RELIABILITY_LOG (a no-op when it is unset)."""
        import json
        log = os.environ.get("FMAIL_RELIABILITY_LOG")
        if not log:
            return
        line = {"suite": suite, "test": self.test_id, "slow": self.slow, "trials": trials,
                "faults": faults, "inputs": inputs, "lost": lost, "hangs": hangs, **extra}
        with open(log, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


@pytest.fixture
def reliability(request: pytest.FixtureRequest) -> Reliability:
    return Reliability(slow=bool(request.config.getoption("--runslow")),
                       test_id=request.node.nodeid)


def search_rows(page: dict[str, object]) -> list[dict[str, object]]:
    """A search page's structured ``rows`` as dicts keyed by its ``columns``."""
    columns = page["columns"]
    return [dict(zip(columns, row)) for row in page["rows"]]  # type: ignore[call-overload, union-attr]


# Takes a sidecar of today's schema back to version 4's, as the previous release left it.
BACK_TO_SCHEMA_4 = """
DROP INDEX audit_log_action; DROP INDEX audit_log_at;
DROP INDEX audit_log_session; ALTER TABLE audit_log DROP COLUMN session;
DROP TABLE blocked_mail;
DROP INDEX thread_rows_last_word; ALTER TABLE thread_rows DROP COLUMN last_word_id;
ALTER TABLE thread_rows DROP COLUMN last_word_date; ALTER TABLE thread_rows DROP COLUMN last_word_sender;
DROP INDEX messages_sender; CREATE INDEX messages_sender ON messages(sender_email);
DROP TRIGGER message_tags_pair_insert; DROP TRIGGER message_tags_pair_delete;
DROP TRIGGER messages_pairs_shown_update; DROP TRIGGER messages_pairs_shown_delete;
DROP TABLE tag_pairs;
DROP TRIGGER message_tags_count_insert; DROP TRIGGER message_tags_count_delete;
DROP TRIGGER messages_tags_shown_update; DROP TRIGGER messages_tags_shown_delete;
DROP TABLE tag_counts;
DROP TRIGGER messages_count_insert; DROP TRIGGER messages_count_delete;
DROP TRIGGER messages_count_update; DROP TABLE mirror_counts; DROP TABLE shown_days;
DROP INDEX messages_excluded_date; ALTER TABLE messages DROP COLUMN is_excluded;
DELETE FROM sync_state WHERE key = 'exclude_tags';
PRAGMA user_version = 4;
"""


# What `fmail-nm init` installed as post-new before the user's own hook was kept under its own
# name (it was run as post-new.before-fmail-nm, beside ours): installations made then must keep
# working, and the next init moves them.
EARLIER_POST_NEW_HOOK = """#!/bin/sh
# fmail-nm hook: post-new
# Installed by `fmail-nm init`. notmuch runs it after `notmuch new`, with NOTMUCH_CONFIG set and
# the database closed, so it may write. A post-new hook that was here before is kept next to
# this file as post-new.before-fmail-nm and runs first; its exit status is kept.
# `fmail-nm index` sets FMAIL_PASS_AFTER=1: it runs the pass itself once notmuch new is done,
# so this hook does not start a second fmail-nm.
here=$(dirname "$0")
status=0
if [ -x "$here/post-new.before-fmail-nm" ]; then
    "$here/post-new.before-fmail-nm" "$@" || status=$?
fi
if [ "${FMAIL_PASS_AFTER:-}" != 1 ]; then
    @FMAIL_NM@ hook post-new || status=$?
fi
exit "$status"
"""

# One script for both of notmuch's hooks, linked into the hook folder as pre-new and post-new,
# telling them apart by the name it was run as (as many users' hook scripts do); each run
# appends its branch to $HOOK_LOG.
MULTICALL_HOOK = """#!/bin/sh
case "$(basename "$0")" in
    pre-new) echo pre-new >> "$HOOK_LOG" ;;
    post-new) echo post-new >> "$HOOK_LOG" ;;
    *) echo "run as $0" >> "$HOOK_LOG"; exit 1 ;;
esac
"""


def link_multicall_hook(hook_dir: Path, script: Path, *, relative: bool = False) -> None:
    """``script`` (written with MULTICALL_HOOK) linked into ``hook_dir`` as pre-new and post-new."""
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(MULTICALL_HOOK)
    script.chmod(0o755)
    hook_dir.mkdir(parents=True, exist_ok=True)
    for name in ("pre-new", "post-new"):
        (hook_dir / name).symlink_to(os.path.relpath(script, hook_dir) if relative else script)
