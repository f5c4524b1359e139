"""Load: 20 MCP clients over Streamable HTTP against one real `fmail-nm serve` process, for a
bounded time, while `notmuch new` (with the post-new hook) runs again and again on newly
delivered mail and another process takes the notmuch write lock on and off.

What must hold: no call hangs (each is bounded), every write is either applied (checked in the
index afterwards) or answered "database busy", reads keep answering while the lock is held,
the server's peak memory stays bounded, and afterwards nothing is lost or duplicated, tags and
Maildir flags agree and `fmail-nm sidecar check` is clean.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import notmuch2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from fmail_nm.store.notmuch import WRITE_LOCK_TIMEOUT

from .conftest import SLOW_TIMEOUT, LockHolder, MailEnv
from .imapbed import free_port
from .test_server import wait_for_port

CLIENTS = 20
# Clients that only read: the server writes one batch at a time, so while another program
# holds the lock every other client may be waiting in a queued write, and then no one would
# ask the reads that must go on meanwhile.
READING_CLIENTS = 2
MESSAGES_PER_CLIENT = 2
TOKEN = "load-test-token-0123456789abcdefghijklmnop"
SEED = 16_03
# A read waits for nothing but other reads; a write may wait WRITE_LOCK_TIMEOUT for the lock.
READ_BOUND = 10.0
WRITE_BOUND = WRITE_LOCK_TIMEOUT + 10.0
# Peak RSS of the server process (VmHWM) over the whole run, for the ~170-message fixture:
# the design's budget is 200 MiB at 100k messages.
MAX_SERVER_HWM_KIB = 200 * 1024
BUSY = "database busy"
FLAG_OF_TAG = {"draft": "D", "flagged": "F", "passed": "P", "replied": "R"}
SEARCHES = ["in:inbox", "is:unread", "from:anna", "has:attachment", "is:flagged",
            "subject:invoice OR subject:meeting", "in:anywhere newer_than:2y", "-is:read",
            "in:archive", "tag:load-0"]


@dataclass
class Expected:
    """What a client's message must look like in the index once the run is over."""

    unread: bool
    flagged: bool
    folder: str  # the account's INBOX or Archive
    tagged: bool = False
    unknown: bool = False  # a write to it hung: its outcome is not known


@dataclass
class Figures:
    calls: int = 0
    reads: int = 0
    writes: int = 0
    applied: int = 0
    busy: int = 0
    hangs: int = 0
    failures: list[str] = field(default_factory=list)
    read_spans: list[tuple[float, float, str]] = field(default_factory=list)
    holds: list[tuple[float, float]] = field(default_factory=list)
    index_runs: int = 0
    delivered: list[str] = field(default_factory=list)


# --- the index, read directly -----------------------------------------------------------------

def snapshot(env: MailEnv) -> dict[str, tuple[frozenset[str], tuple[str, ...]]]:
    """Every message of the index: its tags and its files."""
    with notmuch2.Database(mode=notmuch2.Database.MODE.READ_ONLY,
                           config=env.env["NOTMUCH_CONFIG"]) as db:
        return {m.messageid: (frozenset(m.tags), tuple(sorted(str(f) for f in m.filenames())))
                for m in db.messages("*")}


def flag_disagreements(snap: dict[str, tuple[frozenset[str], tuple[str, ...]]]) -> list[str]:
    """Files whose Maildir flags say something else than the message's tags."""
    problems = []
    for mid, (tags, files) in snap.items():
        for name in files:
            if ":2," not in name:
                continue  # a delivery agent's name in new/: no flags yet
            flags = name.rsplit(":2,", 1)[1]
            want = {flag for tag, flag in FLAG_OF_TAG.items() if tag in tags}
            if "unread" not in tags:
                want.add("S")
            have = set(flags) & set("DFPRS")
            if have != want:
                problems.append(f"{mid}: {Path(name).name} has {''.join(sorted(have))!r}, "
                                f"tags {sorted(tags)}")
    return problems


def folder_of(env: MailEnv, filename: str) -> str:
    return str(Path(filename).parent.parent.relative_to(env.mail_root))


def pick_messages(env: MailEnv, snap: dict[str, tuple[frozenset[str], tuple[str, ...]]],
                  rng: random.Random) -> list[list[str]]:
    """Disjoint sets of personal inbox messages (that account has an Archive) with one file
    each, one set per client."""
    candidates = sorted(mid for mid, (tags, files) in snap.items()
                        if len(files) == 1 and folder_of(env, files[0]) == "personal/INBOX"
                        and "inbox" in tags and not tags & {"spam", "deleted", "draft"})
    rng.shuffle(candidates)
    need = CLIENTS * MESSAGES_PER_CLIENT
    assert len(candidates) >= need, len(candidates)
    return [candidates[i::CLIENTS][:MESSAGES_PER_CLIENT] for i in range(CLIENTS)]


# --- what runs beside the clients -------------------------------------------------------------

@dataclass
class Weather:
    """`notmuch new` over fresh deliveries and a foreign write lock, each on its own thread,
    until ``stop`` is set."""

    env: MailEnv
    rng: random.Random
    figures: Figures
    long_holds: int  # holds longer than the write-lock timeout: writes must answer "busy"
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)

    def deliver(self, n: int) -> None:
        mid = f"load-new-{n}@example.net"
        inbox = self.env.mail_root / "personal" / "INBOX"
        text = (f"From: Load <load@example.net>\nTo: alex@example.org\nSubject: delivered {n}\n"
                f"Message-ID: <{mid}>\nDate: Mon, 02 Nov 2026 10:00:00 +0000\n\nbody {n}\n")
        tmp = inbox / "tmp" / f"{time.time():.6f}.load{n}.host"
        tmp.write_text(text)
        tmp.rename(inbox / "new" / tmp.name)
        self.figures.delivered.append(mid)

    def index_loop(self) -> None:
        n = 0
        while not self.stop.is_set():
            self.deliver(n)
            n += 1
            done = self.env.notmuch("new", check=False)
            # The post-new pass gives up on a write lock held too long, as it should; the
            # next run tags what it left (checked after the run).
            if done.returncode != 0 and BUSY not in done.stderr:
                self.errors.append(f"notmuch new: {done.returncode} {done.stderr[-500:]}")
            self.figures.index_runs += 1
            self.stop.wait(self.rng.uniform(0.2, 1.5))

    def lock_loop(self) -> None:
        long_left = self.long_holds
        while not self.stop.wait(self.rng.uniform(0.5, 2.0)):
            seconds = (WRITE_LOCK_TIMEOUT + 2.0 if long_left and self.rng.random() < 0.3
                       else self.rng.uniform(0.5, 3.0))
            long_left -= seconds > WRITE_LOCK_TIMEOUT
            holder = LockHolder(self.env.env)
            start = time.monotonic()
            try:
                self.stop.wait(seconds)
            finally:
                self.figures.holds.append((start, time.monotonic()))
                holder.release()

    @property
    def faults(self) -> int:
        return len(self.figures.holds) + self.figures.index_runs


# --- the clients ------------------------------------------------------------------------------

@dataclass
class LoadClient:
    number: int
    client: Client
    rng: random.Random
    mine: dict[str, Expected]
    everyone: list[str]
    attachment: str
    figures: Figures
    account_of: dict[str, str]
    reads_only: bool = False

    async def call(self, tool: str, args: dict[str, Any], bound: float) -> Any:
        """The tool's result, or None when it did not answer within ``bound`` (a hang)."""
        self.figures.calls += 1
        with anyio.move_on_after(bound) as scope:
            return await self.client.call_tool(tool, args)
        assert scope.cancelled_caught
        self.figures.hangs += 1
        self.figures.failures.append(f"client {self.number}: {tool} {args} hung (>{bound}s)")
        return None

    async def read(self) -> None:
        tool, args = self.rng.choice([
            ("search_emails", {"query": self.rng.choice(SEARCHES), "limit": 20}),
            ("get_email", {"id": self.rng.choice(self.everyone), "max_body_chars": 2000}),
            ("get_thread", {"thread_id": self.rng.choice(self.everyone), "max_total_chars": 8000}),
            ("list_threads", {"query": "in:inbox", "limit": 10}),
            ("query_emails", {"sql_query": "SELECT uid, subject FROM emails "
                                           "ORDER BY date DESC LIMIT 5"}),
            ("list_folders", {}),
            ("find_unanswered_threads", {"limit": 5}),
            ("get_attachment", {"id": self.attachment, "index": 0, "max_chars": 2000}),
        ])
        self.figures.reads += 1
        start = time.monotonic()
        result = await self.call(tool, args, READ_BOUND)
        if result is None:
            return
        if result.is_error:
            self.figures.failures.append(f"client {self.number}: {tool} {args}: "
                                         f"{result.content[0].text}")
        else:
            self.figures.read_spans.append((start, time.monotonic(), tool))

    def choose_write(self, mid: str, state: Expected) -> tuple[str, dict[str, Any], Expected]:
        account = self.account_of[mid]
        options = [
            ("update_email_status", {"ids": [mid], "mark_as": "unread" if not state.unread
                                     else "read"},
             Expected(not state.unread, state.flagged, state.folder, state.tagged)),
            ("set_flagged", {"ids": [mid], "flagged": not state.flagged},
             Expected(state.unread, not state.flagged, state.folder, state.tagged)),
            ("tag_emails", {"ids": [mid], **({"remove": [f"load-{self.number}"]} if state.tagged
                                            else {"add": [f"load-{self.number}"]})},
             Expected(state.unread, state.flagged, state.folder, not state.tagged)),
        ]
        if state.folder.endswith("/INBOX"):
            options.append(("archive", {"ids": [mid]},
                            Expected(state.unread, state.flagged, f"{account}/Archive",
                                     state.tagged)))
        else:
            options.append(("move_to_folder", {"ids": [mid], "folder": "INBOX"},
                            Expected(state.unread, state.flagged, f"{account}/INBOX",
                                     state.tagged)))
        return self.rng.choice(options)

    async def write(self) -> None:
        mid = self.rng.choice(sorted(self.mine))
        state = self.mine[mid]
        if state.unknown:
            return
        tool, args, after = self.choose_write(mid, state)
        self.figures.writes += 1
        result = await self.call(tool, args, WRITE_BOUND)
        if result is None:
            state.unknown = True
            return
        text = result.content[0].text if result.content else ""
        if result.is_error and BUSY in text:
            self.figures.busy += 1
        elif result.is_error or result.structured_content.get("applied") != [mid]:
            self.figures.failures.append(f"client {self.number}: {tool} {args}: {text} "
                                         f"{result.structured_content}")
            state.unknown = True
        else:
            self.figures.applied += 1
            self.mine[mid] = after

    async def run(self, until: float) -> None:
        while time.monotonic() < until:
            if self.rng.random() < 0.5 or self.reads_only:
                await self.read()
            else:
                await self.write()
            await anyio.sleep(self.rng.uniform(0, 0.05))


# --- the server -------------------------------------------------------------------------------

@pytest.fixture
def load_server(indexed: MailEnv) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    env = {**os.environ, **indexed.env, "FMAIL_TOKEN": TOKEN, "PYTHONFAULTHANDLER": "1"}
    log = (indexed.base / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "fmail_nm", "serve", "--transport", "http",
                             "--port", str(port), "--tools", "all", "--no-push"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port(proc, port)
        yield f"http://127.0.0.1:{port}/mcp", proc
        assert proc.poll() is None, (indexed.base / "server.log").read_text()[-3000:]
    finally:
        log.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def peak_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))


async def run_clients(url: str, clients: list[LoadClient], until: float,
                      make: Any) -> None:
    async with anyio.create_task_group() as tg:
        for load in clients:
            tg.start_soon(make, url, load, until)


async def one_client(url: str, load: LoadClient, until: float) -> None:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"},
                                  timeout=httpx2.Timeout(WRITE_BOUND + 10)) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            load.client = client
            await load.run(until)


# --- the test ---------------------------------------------------------------------------------

@pytest.mark.reliability
@pytest.mark.timeout(SLOW_TIMEOUT)
@pytest.mark.anyio
async def test_twenty_http_clients_under_index_runs_and_lock_holds(
        indexed: MailEnv, load_server: tuple[str, subprocess.Popen[str]],
        reliability: Any) -> None:
    url, proc = load_server
    seconds = reliability.trials(15, 180)
    seed = SEED + seconds
    rng = random.Random(seed)
    before = snapshot(indexed)
    assert flag_disagreements(before) == [], "the fixture's flags and tags disagree"
    sets = pick_messages(indexed, before, rng)
    everyone = sorted(before)
    attachment = next(mid for mid, (tags, _) in sorted(before.items()) if "attachment" in tags)
    figures = Figures()
    clients = []
    for n, mids in enumerate(sets):
        mine = {mid: Expected(unread="unread" in before[mid][0],
                              flagged="flagged" in before[mid][0],
                              folder=folder_of(indexed, before[mid][1][0])) for mid in mids}
        clients.append(LoadClient(number=n, client=None, rng=random.Random(f"{seed}-{n}"),  # type: ignore[arg-type]
                                  mine=mine, everyone=everyone, attachment=attachment,
                                  figures=figures,
                                  account_of={mid: mine[mid].folder.split("/")[0] for mid in mids},
                                  reads_only=n < READING_CLIENTS))
    weather = Weather(indexed, random.Random(f"{seed}-weather"), figures,
                      long_holds=reliability.trials(1, 6))
    threads = [threading.Thread(target=weather.index_loop, daemon=True),
               threading.Thread(target=weather.lock_loop, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        until = time.monotonic() + seconds
        with anyio.fail_after(seconds + 3 * WRITE_BOUND):
            await run_clients(url, clients, until, one_client)
    finally:
        weather.stop.set()
        for thread in threads:
            thread.join(timeout=WRITE_LOCK_TIMEOUT + 130)
    hwm = peak_rss_kib(proc.pid)
    reliability.record("load (20 HTTP clients)", trials=figures.calls, faults=weather.faults,
                       hangs=figures.hangs, reads=figures.reads, writes=figures.writes,
                       applied=figures.applied, busy=figures.busy, peak_rss_kib=hwm,
                       seed=seed)
    where = f"(seed {seed})"
    assert not any(t.is_alive() for t in threads), where
    assert weather.errors == [], (where, weather.errors)
    assert figures.hangs == 0, (where, figures.holds, figures.failures[:30])
    assert figures.failures == [], (where, figures.failures[:10])
    assert figures.applied > 0 and figures.reads > 0, where
    assert figures.busy > 0, f"no write answered busy: the long lock hold did not happen {where}"
    # Reads go on while another program holds the write lock: each hold of a second or more
    # (while the clients ran) saw reads start and finish inside it.
    for start, end in figures.holds:
        if end - start >= 1.0 and end < until:
            inside = sum(1 for a, b, _ in figures.read_spans if a >= start and b <= end)
            around = [(round(a - start, 2), round(b - a, 2), tool)
                      for a, b, tool in figures.read_spans if b >= start and a <= end]
            assert inside > 0, (f"no read answered during a {end - start:.1f}s lock hold "
                                f"{where}", around)
    assert hwm < MAX_SERVER_HWM_KIB, f"server peak RSS {hwm} KiB {where}"

    # Afterwards: index once more, then nothing lost or duplicated, every write as answered.
    indexed.notmuch("new")
    after = snapshot(indexed)
    assert set(after) == set(before) | set(figures.delivered), where
    for mid, (_, files) in before.items():
        assert len(after[mid][1]) == len(files), (mid, files, after[mid][1], where)
    for mid in figures.delivered:
        assert len(after[mid][1]) == 1, (mid, after[mid], where)
    assert flag_disagreements(after) == [], where
    for load in clients:
        for mid, want in load.mine.items():
            if want.unknown:
                continue
            tags, files = after[mid]
            got = Expected(unread="unread" in tags, flagged="flagged" in tags,
                           folder=folder_of(indexed, files[0]),
                           tagged=f"load-{load.number}" in tags)
            assert got == want, (mid, tags, files, where)
    check = indexed.fmail("sidecar", "check", check=False)
    assert check.returncode == 0 and "sidecar matches notmuch" in check.stdout, (check.stdout,
                                                                                 where)
