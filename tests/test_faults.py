"""Fault injection: SIGKILL of the MCP server and of ``fmail-nm run`` at seeded random points
(writes, moves, sidecar syncs, index runs, mbsync pushes), the disk filling up (or a file
size limit refusing the server's writes), and Dovecot killed mid-push -- each trial followed
by recovery and the invariants of tests/invariants.py: every message exactly once (locally
and on the server), tags and files in step, the sidecar clean.

Every trial is seeded (``SEED`` plus its number; the seed is in every assertion message) and
bounded.  A trial starts from a copy of one indexed template tree, so no trial pays for
``fmail-nm init``; the IMAP trials go on from the converged state the previous one left.
``--runslow`` runs many more trials of each suite.
"""

from __future__ import annotations

import contextlib
import imaplib
import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from . import imapbed
from .conftest import MailEnv, make_mail_env, run_init
from .invariants import (
    Baseline,
    Tree,
    check_local,
    content_digest,
    disk_copies,
    server_problems,
    take_baseline,
)
from .syncbed import ACCOUNT, FLAGGED, SEEN, SyncBed, sync_bed  # noqa: F401  (a fixture)
from .imapbed import free_port


SEED = int(os.environ.get("FMAIL_FAULT_SEED", "1612"))
TOKEN = "fault-test-token"
TRIAL_BOUND = 90.0  # seconds for one trial, recovery included: longer is a hang
CALL_BOUND = 30.0  # one MCP call to a live server
# pytest-timeout gives every test 300 s (pyproject.toml); the --runslow variants run ten times
# the trials, each bounded on its own.  (Marks are fixed at import, hence sys.argv.)
SUITE_BOUND = pytest.mark.timeout(6 * 3600 if "--runslow" in sys.argv else 300)


def seeded(offset: int, trials: int) -> Iterator[tuple[int, random.Random]]:
    """Each trial's seed (for the assertion messages) and its random source."""
    for trial in range(trials):
        seed = SEED * 1000 + offset + trial
        yield seed, random.Random(seed)


# ---------------------------------------------------------------------------------------------
# The tree: one indexed template, copied back before each trial


@dataclass
class Template:
    """An indexed copy of the fixture mail at ``live``; :meth:`restore` puts it back as it was
    right after ``fmail-nm init`` (same paths, so the configs stay valid)."""

    live: MailEnv
    pristine: Path
    tree: Tree
    baseline: Baseline

    def restore(self) -> None:
        shutil.rmtree(self.live.base)
        shutil.copytree(self.pristine, self.live.base, symlinks=True)


def tree_of(env: MailEnv) -> Tree:
    from fmail_nm.app import load_config
    config = load_config(env.fmail_config)
    return Tree(mail_root=config.mail_root, notmuch_config=env.notmuch_config,
                roles={role: tuple(f) for role, f in config.roles().items()})


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Template]:
    root = tmp_path_factory.mktemp("faults")
    env = make_mail_env(root / "tree")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.env.items():
            mp.setenv(key, value)
        run_init(env)
        shutil.copytree(env.base, root / "pristine", symlinks=True)
        tree = tree_of(env)
        yield Template(env, root / "pristine", tree, take_baseline(tree))


@pytest.fixture
def live(template: Template, monkeypatch: pytest.MonkeyPatch) -> Template:
    """The template with its env in this process too (for the in-process checks)."""
    for key, value in template.live.env.items():
        monkeypatch.setenv(key, value)
    return template


# ---------------------------------------------------------------------------------------------
# The processes


def start_service(env: MailEnv, *args: str) -> tuple[subprocess.Popen[str], str]:
    """``fmail-nm <args> --port P`` in its own process group; returns it and its MCP URL once
    the port answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "fmail_nm", *args, "--port", str(port),
                             "--tools", "all"],
                            env={**os.environ, **env.env, "FMAIL_TOKEN": TOKEN},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                kill_group(proc)
                raise AssertionError(f"fmail-nm {args[0]} did not start: {proc.stderr.read()}")  # type: ignore[union-attr]
            time.sleep(0.05)


def kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def wait_group_gone(pgid: int, timeout: float) -> bool:
    """Wait for the children a killed process left behind (``notmuch new``, mbsync) to end on
    their own, as they do under a service manager that kills only the main process."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), whatever session it runs in."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        # Each thread has its own list: the service starts children from worker threads.
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError):
                kids = [int(k) for k in (task / "children").read_text().split()]
                found += kids
                todo += kids
    return found


def children_named(pid: int, name: str) -> list[int]:
    """Descendants of ``pid`` whose command is ``name``."""
    named = []
    for kid in descendants(pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{kid}/comm").read_text().strip() == name:
                named.append(kid)
    return named


def wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in pids):
            return True
        time.sleep(0.02)
    return False


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


@dataclass
class Killer:
    """SIGKILLs a service at a seeded moment: after ``delay`` seconds, or ``delay`` after an
    ``after_child`` process (mbsync, notmuch) appears under it.  ``whole_group`` also kills
    what the service started, as a service manager's control-group kill does; otherwise its
    children (mbsync runs in a session of its own) finish on their own first."""

    proc: subprocess.Popen[str]
    delay: float
    whole_group: bool
    after_child: str | None = None
    fired: threading.Event = field(default_factory=threading.Event)
    saw_child: bool = False
    orphans: list[int] = field(default_factory=list)

    def start(self) -> Killer:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        if self.after_child is not None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.proc.poll() is None:
                if children_named(self.proc.pid, self.after_child):
                    self.saw_child = True
                    break
                time.sleep(0.005)
        time.sleep(self.delay)
        # mbsync runs in a session of its own: remember it, to wait for it after the kill.
        self.orphans = descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            if self.whole_group:  # as systemd kills a unit's control group: all of it
                os.killpg(self.proc.pid, signal.SIGKILL)
                for pid in self.orphans:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            else:
                os.kill(self.proc.pid, signal.SIGKILL)
        self.fired.set()

    def finish(self) -> None:
        """Wait until the kill happened and whatever survived it has ended (bounded)."""
        assert self.fired.wait(60), "the kill never happened"
        self.proc.wait(timeout=30)
        gone = wait_group_gone(self.proc.pid, 60) and wait_gone(self.orphans, 60)
        if not gone:
            kill_group(self.proc)
            raise AssertionError("a child of the killed service did not end within 60 s")


# ---------------------------------------------------------------------------------------------
# Writes through the MCP client


WRITE_TOOLS = ("update_email_status", "set_flagged", "tag_emails", "archive", "delete_messages",
               "move_to_junk", "restore", "move_to_folder", "undo_last_write")


def random_write(rng: random.Random, mids: list[str]) -> tuple[str, dict[str, Any]]:
    """One write call: a tool and its arguments, on 1-5 messages."""
    tool = rng.choice(WRITE_TOOLS)
    ids = rng.sample(mids, rng.randint(1, 5))
    args: dict[str, Any] = {"ids": ids}
    if tool == "update_email_status":
        args["mark_as"] = rng.choice(["read", "unread"])
    elif tool == "set_flagged":
        args["flagged"] = rng.random() < 0.5
    elif tool == "tag_emails":
        args[rng.choice(["add", "remove"])] = ["fault-test"]
    elif tool == "move_to_folder":
        args["folder"] = rng.choice(["INBOX", "Archive", "Trash"])
    elif tool == "undo_last_write":
        args = {}
    return tool, args


@contextlib.asynccontextmanager
async def mcp_client(url: str) -> AsyncIterator[Client]:
    """An MCP client of the service at ``url`` (from :func:`start_service`)."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"},
                                  timeout=httpx2.Timeout(CALL_BOUND)) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


@dataclass
class Stream:
    calls: int = 0
    answered: int = 0
    hangs: int = 0
    errors: list[str] = field(default_factory=list)


async def write_stream(url: str, rng: random.Random, mids: list[str], killer: Killer | None,
                       *, max_calls: int = 10_000, pause: float = 0.0) -> Stream:
    """Call write tools until the server dies (or ``max_calls``).  A call to a live server that
    does not answer within CALL_BOUND is a hang; a call cut off by the kill is expected (the
    client is given up half a second after the kill, instead of waiting out its retries)."""
    stream = Stream()

    def dead() -> bool:
        return killer is not None and killer.fired.is_set()

    async def calls() -> None:
        async with mcp_client(url) as client:
            while stream.calls < max_calls and not dead():
                tool, args = random_write(rng, mids)
                stream.calls += 1
                try:
                    with anyio.fail_after(CALL_BOUND):
                        result = await client.call_tool(tool, args)
                except TimeoutError:
                    stream.hangs += not dead()
                    return
                if result.is_error:
                    stream.errors.append(f"{tool}: {result.content}")
                stream.answered += 1
                if pause:
                    await anyio.sleep(pause)

    async def give_up_after_kill(scope: anyio.CancelScope) -> None:
        while not dead():
            await anyio.sleep(0.02)
        await anyio.sleep(0.5)
        scope.cancel()

    with anyio.move_on_after(TRIAL_BOUND) as bound:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(give_up_after_kill, tg.cancel_scope)
                await calls()
                tg.cancel_scope.cancel()
        except Exception:
            if not dead():
                raise
    stream.hangs += bound.cancelled_caught
    return stream


# ---------------------------------------------------------------------------------------------
# Recovery and the checks


def recover(env: MailEnv, rng: random.Random) -> str:
    """What a user (or their next cron run) does after a crash: ``notmuch new`` with its hooks,
    or ``fmail-nm index``; both must succeed."""
    if rng.random() < 0.5:
        done = env.notmuch("new", check=False)
        how = "notmuch new"
    else:
        done = env.fmail("index", "--quiet", check=False)
        how = "fmail-nm index"
    assert done.returncode == 0, f"{how} failed after the fault: {done.stdout}{done.stderr}"
    return how


def sidecar_problems(env: MailEnv) -> list[str]:
    check = env.fmail("sidecar", "check", check=False)
    if check.returncode == 0 and check.stdout.strip().endswith("sidecar matches notmuch"):
        return []
    return [f"sidecar check: {check.stdout}{check.stderr}"]


def assert_whole(env: MailEnv, tree: Tree, baseline: Baseline, where: str) -> int:
    """Every local invariant and a clean sidecar; returns the copies lost (0, or it fails)."""
    problems = check_local(tree, baseline) + sidecar_problems(env)
    lost = baseline.lost(disk_copies(tree.mail_root)[0])
    assert not problems, f"{where}:\n" + "\n".join(problems)
    return lost


# ---------------------------------------------------------------------------------------------
# SIGKILL of the MCP server during writes, moves and the sidecar syncs after them


@pytest.mark.reliability
@SUITE_BOUND
@pytest.mark.anyio
async def test_sigkill_server_during_writes(live: Template, reliability: Any) -> None:
    trials = reliability.trials(7, 140)
    mids = sorted(live.baseline.message_ids)
    faults = hangs = lost = 0
    for seed, rng in seeded(0, trials):
        live.restore()
        proc, url = start_service(live.live, "serve", "--transport", "http", "--no-push")
        killer = Killer(proc, rng.uniform(0.05, 1.2), whole_group=rng.random() < 0.5).start()
        try:
            stream = await write_stream(url, rng, mids, killer)
        finally:
            killer.finish()
        hangs += stream.hangs
        assert stream.hangs == 0, f"seed {seed}: a write did not answer within {CALL_BOUND} s"
        faults += 1
        how = recover(live.live, rng)
        lost += assert_whole(live.live, live.tree, live.baseline,
                             f"seed {seed}: after {stream.answered} writes, SIGKILL at "
                             f"{killer.delay:.3f} s, {how}")
    reliability.record("SIGKILL server during writes", trials=trials, faults=faults, lost=lost,
                       hangs=hangs)
    assert lost == 0 and hangs == 0


# ---------------------------------------------------------------------------------------------
# SIGKILL of `fmail-nm run` while it indexes new mail (notmuch new, tagging, sidecar sync)


def arrival(n: int, seed: int) -> bytes:
    return (f"From: Arrival {n} <arrival{n}@example.net>\nTo: Alex Morgan <alex@example.org>\n"
            f"Subject: arrived {seed} {n}\nDate: Wed, 02 Dec 2026 10:{n % 60:02d}:00 +0000\n"
            f"Message-ID: <arrival-{seed}-{n}@example.net>\n\nmessage {n} of trial {seed}\n"
            ).encode()


def deliver(mail_root: Path, folder: str, name: str, data: bytes) -> bool:
    """Maildir delivery (tmp/, then a rename into new/); False when the disk refused it."""
    staged = mail_root / folder / "tmp" / name
    try:
        staged.write_bytes(data)
        staged.rename(mail_root / folder / "new" / name)
    except OSError:
        staged.unlink(missing_ok=True)
        return False
    return True


def with_arrivals(baseline: Baseline, arrived: dict[str, bytes]) -> Baseline:
    """The baseline plus delivered messages (account directory -> bytes... keyed by file)."""
    copies = Counter(baseline.copies)
    names = dict(baseline.names)
    ids = set(baseline.message_ids)
    for where, data in arrived.items():
        digest = content_digest(data)
        copies[(where.split("/")[0], digest)] += 1
        mid = data.split(b"Message-ID: <")[1].split(b">")[0].decode()
        names[digest] = mid
        ids.add(mid)
    return Baseline(copies=copies, message_ids=frozenset(ids), names=names)


@pytest.mark.reliability
@SUITE_BOUND
@pytest.mark.anyio
async def test_sigkill_run_during_index(live: Template, reliability: Any) -> None:
    trials = reliability.trials(4, 100)
    mids = sorted(live.baseline.message_ids)
    faults = hangs = lost = 0
    for seed, rng in seeded(500, trials):
        live.restore()
        proc, url = start_service(live.live, "run", "--no-push")
        arrived: dict[str, bytes] = {}
        for n in range(rng.randint(5, 80)):
            folder = rng.choice(["personal/INBOX", "work/INBOX", "personal/Archive"])
            data = arrival(n, seed)
            assert deliver(live.live.mail_root, folder, f"17964{seed}.{n}_1.host", data)
            arrived[f"{folder}/{n}"] = data
        # Kill while the watcher's index run (notmuch new, the hook's pass, the sidecar) goes
        # on: a moment after notmuch starts, or at a random time while writes go on (their
        # file events keep the watcher waiting for a quiet second, up to ten).
        writing = rng.random() < 0.4
        after = None if writing else "notmuch"
        killer = Killer(proc, rng.uniform(0.0, 2.5 if writing else 0.8),
                        whole_group=rng.random() < 0.5, after_child=after).start()
        try:
            if writing:
                stream = await write_stream(url, rng, mids, killer, pause=0.05)
                hangs += stream.hangs
                assert stream.hangs == 0, f"seed {seed}: a write did not answer"
        finally:
            killer.finish()
        faults += 1
        how = recover(live.live, rng)
        expected = with_arrivals(live.baseline, arrived)
        lost += assert_whole(live.live, live.tree, expected,
                             f"seed {seed}: {len(arrived)} arrivals, SIGKILL "
                             f"{killer.delay:.3f} s after {after or 'start'}, {how}")
    reliability.record("SIGKILL run during index", trials=trials, faults=faults, lost=lost,
                       hangs=hangs)
    assert lost == 0 and hangs == 0


# ---------------------------------------------------------------------------------------------
# The IMAP trials: Dovecot and mbsync on loopback (tests/syncbed.py); each trial goes on from
# the converged state the one before left, so the expected state is the seeded messages.


SEEDED_ON_SERVER = 30
PULL_EVERY_MINUTES = 0.02  # `fmail-nm run` pulls (both ways) every 1.2 s in these trials
MBSYNC_NOTICE = re.compile(r"^\S+ notice: ")


@dataclass
class ImapTrials:
    bed: SyncBed
    tree: Tree
    baseline: Baseline
    mids: list[str]


@pytest.fixture
def imap_trials(sync_bed: SyncBed) -> ImapTrials:
    bed = sync_bed
    toml = bed.mail_env.fmail_config
    toml.write_text(toml.read_text().replace(
        "[mbsync]\n", f"[mbsync]\npull_interval_minutes = {PULL_EVERY_MINUTES}\n"))
    rng = random.Random(SEED)
    for n in range(1, SEEDED_ON_SERVER + 1):
        folder = rng.choice(["INBOX"] * 4 + ["Archive", "Trash", "Junk"])
        flags = [f for f in (SEEN, FLAGGED) if rng.random() < 0.4]
        bed.seed(n, folder=folder, flags=flags)
    bed.init()
    report = bed.sync()
    assert report.ok, report.errors()
    tree = tree_of(bed.mail_env)
    mids = [bed.mid(n) for n in range(1, SEEDED_ON_SERVER + 1)]
    return ImapTrials(bed, tree, take_baseline(tree), mids)


def server_snapshot(bed: SyncBed) -> dict[str, list[tuple[str, frozenset[str]]]]:
    found: dict[str, list[tuple[str, frozenset[str]]]] = {}
    for folder, messages in bed.server_state().items():
        for msg in messages:
            found.setdefault(msg.message_id.strip("<>"), []).append((folder, msg.flags))
    return found


def converge(t: ImapTrials, where: str) -> int:
    """The next sync after a fault: it must succeed, leave nothing for another mbsync run to
    do or say, and leave both sides whole and agreeing.  Returns the copies lost (0)."""
    report = t.bed.sync()
    assert report.ok, f"{where}: the next sync failed: {report.errors()}"
    before = server_snapshot(t.bed)
    again = imapbed.run_mbsync(t.bed.mbsync_config, ACCOUNT, check=False)
    said = [line for line in (again.stdout + again.stderr).splitlines()
            if not MBSYNC_NOTICE.match(line)]
    assert again.returncode == 0 and not said, f"{where}: mbsync not settled: {again}"
    after = server_snapshot(t.bed)
    assert after == before, f"{where}: a second mbsync run still changed the server"
    lost = assert_whole(t.bed.mail_env, t.tree, t.baseline, where)
    problems = server_problems(after, t.mids, t.tree, ACCOUNT)
    assert not problems, f"{where}: on the server:\n" + "\n".join(problems)
    return lost


@pytest.mark.reliability
@SUITE_BOUND
@pytest.mark.anyio
@pytest.mark.imap
async def test_sigkill_server_and_run_during_mbsync_push(imap_trials: ImapTrials,
                                                         reliability: Any) -> None:
    t = imap_trials
    trials = reliability.trials(5, 100)
    faults = hangs = lost = during_mbsync = 0
    for seed, rng in seeded(700, trials):
        service = rng.choice(["serve", "run"])
        args = ["serve", "--transport", "http"] if service == "serve" else ["run"]
        proc, url = start_service(t.bed.mail_env, *args)
        # Kill a moment after mbsync starts (the push after the writes; for run also its
        # scheduled syncs), or at a random point among the writes.
        at_mbsync = rng.random() < 0.6
        killer = Killer(proc, rng.uniform(0.0, 0.3) if at_mbsync else rng.uniform(0.05, 1.5),
                        whole_group=rng.random() < 0.5,
                        after_child="mbsync" if at_mbsync else None).start()
        try:
            stream = await write_stream(url, rng, t.mids, killer,
                                        max_calls=rng.randint(1, 6) if at_mbsync else 10_000)
        finally:
            killer.finish()
        hangs += stream.hangs
        assert stream.hangs == 0, f"seed {seed}: a write did not answer within {CALL_BOUND} s"
        faults += 1
        during_mbsync += killer.saw_child
        how = recover(t.bed.mail_env, rng)
        lost += converge(t, f"seed {seed}: {service}, {stream.answered} writes, SIGKILL "
                            f"{killer.delay:.3f} s after {'mbsync' if at_mbsync else 'start'}"
                            f" (seen: {killer.saw_child}), {how}")
    reliability.record("SIGKILL server/run during mbsync push", trials=trials, faults=faults,
                       lost=lost, hangs=hangs, during_mbsync=during_mbsync)
    assert lost == 0 and hangs == 0
    assert during_mbsync, "no kill landed while mbsync ran: the trials missed the push"


# ---------------------------------------------------------------------------------------------
# Dovecot killed in the middle of a push


def local_writes(t: ImapTrials, rng: random.Random) -> int:
    """A seeded batch of moves and flag changes, made in-process: what the next push carries."""
    from fmail_nm.passes.changes import WriteContext
    from fmail_nm.store import sidecar
    from fmail_nm.tools import writes

    config = t.bed.reload()
    done = 0
    with t.bed.reader() as reader, t.bed.writer() as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        for _ in range(rng.randint(2, 5)):
            ids = rng.sample(t.mids, rng.randint(3, 12))
            action = rng.choice(["delete", "archive", "junk", "restore", "read", "unread", "flag"])
            if action in ("read", "unread"):
                result = writes.set_read(ctx, ids, action == "read")
            elif action == "flag":
                result = writes.set_flagged(ctx, ids, rng.random() < 0.5)
            else:
                fn = {"delete": writes.delete_messages, "archive": writes.archive,
                      "junk": writes.move_to_junk, "restore": writes.restore}[action]
                result = fn(ctx, ids)
            done += len(result.applied or [])
    return done


def wait_serving(bed: SyncBed, where: str) -> None:
    """Wait until the restarted Dovecot serves every folder again, not just its greeting: after
    a SIGKILL it may first have to recover its own indexes and locks (that is Dovecot's part;
    the push after it is ours)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            bed.server_state()
            return
        except (OSError, imaplib.IMAP4.error, imapbed.ImapBedError) as exc:
            assert time.monotonic() < deadline, f"{where}: Dovecot never came back: {exc}"
            time.sleep(0.5)


def kill_dovecot(server: imapbed.ImapServer) -> None:
    """SIGKILL Dovecot's master and every process it started (its own process group)."""
    proc = server._proc  # the bed starts Dovecot in a session of its own
    assert proc is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.reliability
@SUITE_BOUND
@pytest.mark.imap
def test_imap_server_killed_mid_push(imap_trials: ImapTrials, reliability: Any) -> None:
    t = imap_trials
    trials = reliability.trials(4, 80)
    faults = lost = hangs = failed_pushes = 0
    for seed, rng in seeded(900, trials):
        changed = local_writes(t, rng)
        push = subprocess.Popen([sys.executable, "-m", "fmail_nm", "sync", "--push"],
                                env={**os.environ, **t.bed.env}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.monotonic() + 30
        while not children_named(push.pid, "mbsync") and push.poll() is None:
            assert time.monotonic() < deadline, f"seed {seed}: mbsync never started"
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.08))
        kill_dovecot(t.bed.server)
        faults += 1
        try:
            out, err = push.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            hangs += 1
            kill_group(push)
            raise AssertionError(f"seed {seed}: the push hung after Dovecot died") from None
        where = f"seed {seed}: {changed} changes, Dovecot killed mid-push"
        if push.returncode != 0:
            failed_pushes += 1
            assert "Traceback" not in err and "mbsync" in err and "push" in err, (
                f"{where}: the failed push says: {err!r}")
        # Nothing lost here while the server is down ...
        problems = check_local(t.tree, t.baseline)
        assert not problems, f"{where}, before the restart:\n" + "\n".join(problems)
        # ... and once it is back, the next push (then a full sync) converges.
        t.bed.server.start()
        wait_serving(t.bed, where)
        again = t.bed.mail_env.fmail("sync", "--push", check=False)
        assert again.returncode == 0, f"{where}: the push after the restart: {again.stderr}"
        lost += converge(t, where)
    reliability.record("IMAP killed mid-push", trials=trials, faults=faults, lost=lost,
                       hangs=hangs, failed_pushes=failed_pushes)
    assert lost == 0 and hangs == 0
    assert failed_pushes, "no push was cut off: the kills all came too late"


# ---------------------------------------------------------------------------------------------
# The disk full: the whole setup (mail, notmuch database, sidecar) on a small tmpfs


DISK_SIZE = "24m"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of DISK_SIZE mounted for this test (root only; skipped where mount is refused)."""
    if os.geteuid() != 0:
        pytest.skip("the disk-full trials mount a tmpfs, which needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE},mode=0700",
                           "tmpfs", str(mount)], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def fill(disk: Path, slack: int) -> Path:
    """Fill the disk with one file, then give back ``slack`` bytes; returns the file."""
    filler = disk / "filler"
    chunk = b"\0" * (1 << 16)
    with open(filler, "ab", buffering=0) as out:
        with contextlib.suppress(OSError):
            while True:
                out.write(chunk)
        out.truncate(max(0, out.tell() - slack))
    return filler


@contextlib.contextmanager
def filling(disk: Path, per_second: int) -> Iterator[None]:
    """The disk fills up at about ``per_second`` bytes a second while the block runs (then
    stays full), as when another program writes a big file."""
    stop = threading.Event()

    def grow() -> None:
        chunk = b"\0" * (per_second // 50)
        with open(disk / "filler", "ab", buffering=0) as out:
            while not stop.wait(0.02):
                with contextlib.suppress(OSError):
                    out.write(chunk)
    thread = threading.Thread(target=grow, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def clear_failure(done: subprocess.CompletedProcess[str]) -> str | None:
    """None when a command either worked or failed with a one-line error (no traceback)."""
    if done.returncode == 0:
        return None
    if "Traceback" in done.stderr or not done.stderr.strip():
        return f"exit {done.returncode}, stderr {done.stderr!r}"
    return None


@pytest.mark.reliability
@SUITE_BOUND
@pytest.mark.anyio
async def test_disk_full_during_writes_and_indexing(small_disk: Path, tmp_path: Path,
                                                    reliability: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_mail_env(small_disk / "tree")
    for key, value in env.env.items():
        monkeypatch.setenv(key, value)
    run_init(env)
    pristine = tmp_path / "pristine"
    shutil.copytree(env.base, pristine, symlinks=True)
    tree = tree_of(env)
    baseline = take_baseline(tree)
    mids = sorted(baseline.message_ids)
    trials = reliability.trials(5, 80)
    faults = lost = hangs = refused = 0
    for seed, rng in seeded(300, trials):
        shutil.rmtree(env.base)
        shutil.copytree(pristine, env.base, symlinks=True)
        proc, url = start_service(env, "serve", "--transport", "http", "--no-push")
        # Full from the start, or filling up while the writes and the index run.
        growing = rng.random() < 0.5
        slack = rng.randint(8 << 20, 10 << 20) if growing else rng.choice([0, 4096, 65536])
        filler = fill(small_disk, slack)
        with filling(small_disk, 8 << 20) if growing else contextlib.nullcontext():
            try:
                stream = await write_stream(url, rng, mids, None,
                                            max_calls=rng.randint(3, 15), pause=0.05)
                assert proc.poll() is None, f"seed {seed}: the server died on a full disk"
            finally:
                kill_group(proc)
            hangs += stream.hangs
            assert stream.hangs == 0, f"seed {seed}: a write hung on a full disk"
            unclear = [e for e in stream.errors if "Traceback" in e]
            assert not unclear, f"seed {seed}: {unclear}"
            arrived: dict[str, bytes] = {}
            for n in range(rng.randint(1, 40)):
                folder = rng.choice(["personal/INBOX", "work/INBOX"])
                if deliver(env.mail_root, folder, f"17967{seed}.{n}_1.host", arrival(n, seed)):
                    arrived[f"{folder}/{n}"] = arrival(n, seed)
            index = env.fmail("index", "--quiet", check=False)
        assert clear_failure(index) is None, f"seed {seed}: index on a full disk: " \
                                             f"{clear_failure(index)}"
        refused += index.returncode != 0 or bool(stream.errors)
        faults += 1
        filler.unlink()
        where = (f"seed {seed}: {slack} bytes free, {stream.answered} writes "
                 f"({len(stream.errors)} refused), {len(arrived)} arrivals, index exit "
                 f"{index.returncode}, then the space freed")
        recovery = env.fmail("index", "--quiet", check=False)
        assert recovery.returncode == 0, f"{where}: {recovery.stderr}"
        lost += assert_whole(env, tree, with_arrivals(baseline, arrived), where)
    reliability.record("disk full", trials=trials, faults=faults, lost=lost, hangs=hangs,
                       refused=refused)
    assert lost == 0 and hangs == 0
    assert refused, "the disk never ran out: no write or index run was refused"


# ---------------------------------------------------------------------------------------------
# What the trials found, pinned down on their own


def test_a_file_moved_behind_our_back_gets_the_place_tags_of_its_folder(indexed: MailEnv) -> None:
    """A write killed between its rename and notmuch's commit, or a move another client made
    and mbsync pulled: ``notmuch new`` only sees a file in another folder.  The post-new pass
    must give the message the place tags of that folder (it used to keep the old ones)."""
    mid = "tom-hotfix@acme.test"  # work/INBOX, in the inbox
    (source,) = indexed.notmuch("search", "--output=files", f"id:{mid}").stdout.split()
    trash = indexed.mail_root / "work" / "Trash" / "cur" / (Path(source).name.split(":")[0] + ":2,")
    os.rename(source, trash)
    indexed.fmail("index", "--quiet")
    tags = set(indexed.notmuch("search", "--exclude=false", "--output=tags", f"id:{mid}").stdout.split())
    assert "deleted" in tags and "inbox" not in tags, tags
    back = indexed.mail_root / "work" / "INBOX" / "cur" / trash.name
    os.rename(trash, back)
    indexed.notmuch("new")  # the hook's pass, as after mbsync
    tags = set(indexed.notmuch("search", "--exclude=false", "--output=tags", f"id:{mid}").stdout.split())
    assert "inbox" in tags and "deleted" not in tags, tags
    assert indexed.fmail("sidecar", "check").stdout.strip().endswith("sidecar matches notmuch")


def test_a_write_with_too_little_disk_space_is_refused_and_the_writer_lives_on(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a full disk libnotmuch's commit fails, and closing the database after a failed
    atomic section aborts the process: a write session must not start without room."""
    from fmail_nm.app import load_config
    from fmail_nm.passes.changes import WriteContext
    from fmail_nm.store import notmuch as store
    from fmail_nm.store import sidecar
    from fmail_nm.tools import writes

    mid = "tom-hotfix@acme.test"  # unread, in work/INBOX/new
    config = load_config()
    files = indexed.notmuch("search", "--output=files", f"id:{mid}").stdout
    with store.Reader(config.settings.notmuch_config) as reader, \
            store.Writer(config.settings.notmuch_config) as writer:
        ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
        monkeypatch.setattr(store, "MIN_FREE_BYTES", 2**62)
        with pytest.raises(store.DiskFull, match="disk full: only .* nothing was changed"):
            writes.set_read(ctx, [mid], True)
        assert indexed.notmuch("search", "--output=files", f"id:{mid}").stdout == files
        assert "unread" in indexed.notmuch("search", "--exclude=false", "--output=tags", f"id:{mid}").stdout
        monkeypatch.setattr(store, "MIN_FREE_BYTES", 0)
        assert writes.set_read(ctx, [mid], True).applied == [mid]  # the same writer goes on
    assert "unread" not in indexed.notmuch("search", "--exclude=false", "--output=tags", f"id:{mid}").stdout


def test_a_write_the_damaged_sidecar_cannot_record_says_it_was_done(indexed: MailEnv) -> None:
    """notmuch commits a write before its audit record is written: a sidecar that is no
    database by then must not make the write read as failed (the caller would do it again),
    and the way out is named, as a read names it: each write after would fail the same."""
    from fmail_nm.app import load_config
    from fmail_nm.passes.changes import UnrecordedWrite, WriteContext
    from fmail_nm.store import notmuch as store
    from fmail_nm.store import sidecar
    from fmail_nm.tools import writes

    mid = "tom-hotfix@acme.test"  # unread
    config = load_config()
    path = sidecar.sidecar_path(config.data_dir)
    for extra in ("-wal", "-shm"):
        path.with_name(path.name + extra).unlink(missing_ok=True)
    path.write_bytes(b"this is not an SQLite file " * 1000)
    with store.Reader(config.settings.notmuch_config) as reader, \
            store.Writer(config.settings.notmuch_config) as writer:
        ctx = WriteContext(config, reader, writer, path)
        with pytest.raises(UnrecordedWrite, match="set_read was done, but the "
                           "sidecar could not record it.*file is not a database") as failed:
            writes.set_read(ctx, [mid], True)
    assert f"the sidecar {path} cannot be read" in str(failed.value)
    assert "fmail-nm sidecar rebuild" in str(failed.value)
    assert "unread" not in indexed.notmuch("search", "--exclude=false", "--output=tags",
                                           f"id:{mid}").stdout



def test_a_record_failing_on_fmails_own_sql_is_an_internal_error_at_once(
        indexed: MailEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write's record that fails on fmail-nm's own SQL is a fault to report: not a busy
    sidecar to wait out -- the error was read as busy when its words held "locked" -- nor
    a damaged one, nor bare SQLite words."""
    import sqlite3

    from fmail_nm.app import load_config
    from fmail_nm.passes import changes
    from fmail_nm.store import notmuch as store
    from fmail_nm.store import sidecar

    monkeypatch.setattr(changes, "RECORD_WAIT_S", 2)  # what a busy sidecar is waited out for
    config = load_config()
    path = sidecar.sidecar_path(config.data_dir)
    tries = []

    def write(conn: sqlite3.Connection) -> None:
        tries.append(1)
        conn.execute("SELECT * FROM unlocked_mail")  # no such table

    with store.Reader(config.settings.notmuch_config) as reader, \
            store.Writer(config.settings.notmuch_config) as writer:
        ctx = changes.WriteContext(config, reader, writer, path)
        with pytest.raises(changes.UnrecordedWrite) as failed:
            changes._recorded(ctx, "tag was done, but the sidecar could not record it", write)
    assert tries == [1]
    assert str(failed.value).startswith("tag was done, but the sidecar could not record it: "
                                        "internal error in fmail-nm")
    assert "no such table: unlocked_mail" in str(failed.value)
    assert "cannot be read" not in str(failed.value) and "busy" not in str(failed.value)


def limit_file_size(proc: subprocess.Popen[str], size: int | None) -> None:
    """Let ``proc`` write no file past ``size`` bytes from now on (None: lift the limit).
    Python ignores SIGXFSZ: a write past the limit fails with EFBIG, as one on a full disk."""
    _, hard = resource.prlimit(proc.pid, resource.RLIMIT_FSIZE)
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE,
                     (hard if size is None else size, hard))


@pytest.mark.anyio
async def test_a_write_notmuch_could_not_save_leaves_the_write_lock_free(indexed: MailEnv) -> None:
    """A commit that fails must release our own write lock: the handle whose close failed held
    it, and every later write of the server answered "database busy" until a restart."""
    tree = tree_of(indexed)
    baseline = take_baseline(tree)
    mid = "tom-hotfix@acme.test"
    proc, url = start_service(indexed, "serve", "--transport", "http", "--no-push")
    try:
        async with mcp_client(url) as client:
            limit_file_size(proc, 0)
            for name in ("fault-one", "fault-two"):
                failed = await client.call_tool("tag_emails", {"ids": [mid], "add": [name]})
                assert failed.is_error, failed.content
                assert "could not save this write" in failed.content[0].text, failed.content  # type: ignore[union-attr]
            limit_file_size(proc, None)
            done = await client.call_tool("tag_emails", {"ids": [mid], "add": ["fault-three"]})
            assert not done.is_error, done.content
    finally:
        kill_group(proc)
    tags = indexed.notmuch("search", "--exclude=false", "--output=tags", f"id:{mid}").stdout.split()
    assert "fault-three" in tags and "fault-one" not in tags and "fault-two" not in tags, tags
    assert_whole(indexed, tree, baseline, "after two writes notmuch could not save")


# Room for a short draft's file and the sidecar's 32 KiB shared-memory index (a read opens
# it), not for a commit: one that adds a message rewrites dozens of 8 KiB blocks of tables
# ten times this size, each to a free block or the end, never all within their first four.
DRAFT_SIZE_LIMIT = 32 * 1024


def draft_files(env: MailEnv) -> list[Path]:
    return sorted((env.mail_root / "personal" / "Drafts" / "cur").iterdir())


@pytest.mark.anyio
async def test_a_draft_notmuch_could_not_save_leaves_one_version_and_says_which(
        indexed: MailEnv) -> None:
    """A new draft whose commit fails leaves no file behind (the next index made it a second
    draft beside the one saved again); a new version whose commit fails replaced the old file
    already: the error says it is kept, and is not to be saved again."""
    before = draft_files(indexed)
    proc, url = start_service(indexed, "serve", "--transport", "http", "--no-push")
    try:
        async with mcp_client(url) as client:
            saved = await client.call_tool("save_draft", {"to": ["bob@example.net"], "body": "v1"})
            assert not saved.is_error, saved.content
            draft_id = saved.structured_content["id"]  # type: ignore[index]
            shown = await client.call_tool("get_email", {"id": draft_id})
            mid = shown.structured_content["message_id"]  # type: ignore[index]
            with_v1 = draft_files(indexed)
            limit_file_size(proc, DRAFT_SIZE_LIMIT)
            new = await client.call_tool("save_draft", {"to": ["carol@example.net"],
                                                        "body": "another"})
            assert draft_files(indexed) == with_v1
            said = new.content[0].text  # type: ignore[union-attr]
            assert new.is_error and "the draft was not saved, nothing was changed" in said, said
            again = await client.call_tool("save_draft", {"draft_id": draft_id, "body": "v2"})
            said = again.content[0].text  # type: ignore[union-attr]
            assert again.is_error and "do not save it again" in said, said
    finally:
        kill_group(proc)
    assert len(draft_files(indexed)) == len(before) + 1
    indexed.fmail("index", "--quiet")
    found = indexed.notmuch("search", "--output=files", "tag:draft", "and", "to:carol@example.net")
    assert not found.stdout.strip(), found.stdout
    (file,) = indexed.notmuch("search", "--output=files", f"id:{mid}").stdout.split()
    assert Path(file).read_bytes().endswith(b"\r\n\r\nv2\r\n")
