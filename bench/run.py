"""Benchmarks for fmail-nm on real mail (the SpamAssassin corpus, see :mod:`bench.corpus`).

    .venv/bin/python -m bench.run [--sizes 6k,20k] [--json results.json]

Everything runs in a temp directory with HOME, XDG_*, NOTMUCH_CONFIG and FMAIL_CONFIG pointing
into it (as the tests do), so no real mail setup is read or touched.  Per size:

* first index: bare ``notmuch new --no-hooks`` against the same work done by fmail-nm --
  the post-new pass timed step by step in-process (tagging, blocklist, sidecar build) and
  ``fmail-nm init`` end to end (notmuch new with our hook, then init's own checks);
* incremental: ``fmail-nm index`` with nothing, 1 and 100 new messages; ``notmuch tag`` on
  1,000 messages followed by ``fmail-nm sidecar sync``;
* reads in-process: ``reads.search_emails`` / ``reads.get_email``, SQL on the sidecar;
* over MCP stdio with the SDK's client: ``search_emails``, ``get_email``,
  ``list_available_accounts``, the server's peak RSS;
* the notmuch CLI (``notmuch search --format=json --limit=50``) for comparison.

Wall-clock times are medians (p50) over several runs; CPU time (user+sys) is reported beside
the wall time of the heavy steps, since it is less disturbed by other load on the machine.

``--code REF`` measures a git commit instead of the working tree: ``fmail_nm`` and ``hooks``
of REF are extracted into the work directory and put first on PYTHONPATH (for this process,
the ``fmail-nm`` subprocesses and the hook notmuch runs), so edits made meanwhile in the
checkout do not leak into a run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import math
import os
import platform
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from . import corpus

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent
CMD_TIMEOUT = 1800.0
CLI_TIMEOUT = 60.0
NAME = "Bench User"
ADDRESSES = [address for _, address in corpus.ACCOUNTS.values()]
FMAIL_TOML = "\n".join(
    f'[[accounts]]\nname = "{name}"\naddresses = ["{address}"]\nmaildir = "{name}"\n\n'
    f'[accounts.folders]\ninbox = "INBOX"\nsent = "Sent"\njunk = "Junk"\narchive = "Archive"\n'
    for name, (_, address) in corpus.ACCOUNTS.items())

SEARCHES = ("", "in:inbox is:unread", "linux", "from:garym@canada.com",
            "after:2002-09-01 before:2002-10-01")
SQL = {
    "unread INBOX, newest 10": "SELECT * FROM emails WHERE folder = 'INBOX' AND is_read = 0 "
                               "ORDER BY date DESC LIMIT 10",
    "GROUP BY sender, top 20": "SELECT sender_email, count(*) AS n FROM emails "
                               "GROUP BY sender_email ORDER BY n DESC LIMIT 20",
    "threads by last_date, 20": "SELECT * FROM threads ORDER BY last_date DESC LIMIT 20",
}


@dataclass(frozen=True)
class Size:
    """One corpus size: how to write it and how often to repeat the expensive steps."""

    name: str
    total: int | None  # None: the corpus once, as it is
    index_runs: int  # bare notmuch new + the in-process post-new pass
    init_runs: int  # fmail-nm init end to end


SIZES = {
    "1k": Size("1k", 1000, 1, 1),  # a quick smoke run of the bench itself
    "6k": Size("6k", None, 2, 1),
    "20k": Size("20k", 20000, 1, 0),
}


# ---------------------------------------------------------------------------------------------
# Measuring


@dataclass
class Timing:
    wall: float
    cpu: float  # user + system, of the process (and the children it waited for)

    def __str__(self) -> str:
        return f"{self.wall:.2f} s (cpu {self.cpu:.2f} s)"


def median_timing(timings: Sequence[Timing]) -> Timing:
    return Timing(statistics.median(t.wall for t in timings), statistics.median(t.cpu for t in timings))


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Latency:
    """Latencies in milliseconds."""

    p50: float
    p95: float
    n: int

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Latency:
        ms = [s * 1000 for s in seconds]
        return cls(round(percentile(ms, 0.5), 3), round(percentile(ms, 0.95), 3), len(ms))

    def __str__(self) -> str:
        return f"p50 {self.p50:.2f} ms, p95 {self.p95:.2f} ms (n={self.n})"


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def timed_call(fn: Callable[[], T]) -> tuple[T, Timing]:
    """Run ``fn`` in this process; CPU counts every thread of the process."""
    cpu, start = self_cpu(), time.perf_counter()
    result = fn()
    return result, Timing(time.perf_counter() - start, self_cpu() - cpu)


def latencies(fn: Callable[[], object], n: int, warmup: int = 3) -> Latency:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return Latency.of(samples)


async def async_latencies(fn: Callable[[], Awaitable[object]], n: int, warmup: int = 3) -> Latency:
    for _ in range(warmup):
        await fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - start)
    return Latency.of(samples)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# An isolated mail setup


class CommandFailed(RuntimeError):
    pass


@dataclass
class BenchEnv:
    """A Maildir tree (hard links to a template) with its own HOME, XDG dirs and configs."""

    base: Path
    mail_root: Path
    env: dict[str, str]

    @classmethod
    def create(cls, base: Path, template: Path) -> BenchEnv:
        home = base / "home"
        home.mkdir(parents=True)
        # Hard links: renames (flag changes) only touch this tree; file contents never change.
        shutil.copytree(template, base / "mail", copy_function=os.link)
        (base / "fmail.toml").write_text(FMAIL_TOML, encoding="utf-8")
        env = {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "NOTMUCH_CONFIG": str(base / "notmuch-config"),
            "FMAIL_CONFIG": str(base / "fmail.toml"),
        }
        return cls(base=base, mail_root=base / "mail", env=env)

    def run(self, argv: Sequence[str], *, timeout: float = CMD_TIMEOUT,
            stdin: str | None = None) -> tuple[str, Timing]:
        cpu, start = children_cpu(), time.perf_counter()
        done = subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=timeout, input=stdin, check=False, cwd=self.base)
        timing = Timing(time.perf_counter() - start, children_cpu() - cpu)
        if done.returncode != 0:
            raise CommandFailed(f"{' '.join(argv)} failed (exit {done.returncode}):\n"
                                f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done.stdout, timing

    def fmail(self, *args: str, timeout: float = CMD_TIMEOUT) -> tuple[str, Timing]:
        return self.run([sys.executable, "-m", "fmail_nm", *args], timeout=timeout)

    def notmuch(self, *args: str, timeout: float = CMD_TIMEOUT,
                stdin: str | None = None) -> tuple[str, Timing]:
        return self.run(["notmuch", *args], timeout=timeout, stdin=stdin)

    def init_args(self) -> list[str]:
        args = ["init", "--mail-root", str(self.mail_root), "--name", NAME]
        for address in ADDRESSES:
            args += ["--address", address]
        return args

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """This process's environment pointed at this setup (for in-process reads)."""
        saved = {key: os.environ.get(key) for key in self.env}
        os.environ.update(self.env)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def config(self) -> Any:
        from fmail_nm.app import load_config
        with self.active():
            return load_config()


class Workspace:
    """Numbered scratch directories under one temp root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._n = 0

    def fresh(self, label: str) -> Path:
        self._n += 1
        return self.root / f"{self._n:02d}-{label}"


def warm_page_cache(tree: Path) -> int:
    """Read every file once, so the first timed run does not pay for a cold disk."""
    size = 0
    for path in tree.rglob("*"):
        if path.is_file():
            size += len(path.read_bytes())
    return size


# ---------------------------------------------------------------------------------------------
# First index


@dataclass
class PostNewSplit:
    notmuch_new: Timing
    tagging: Timing
    blocklist: Timing
    sidecar: Timing
    init_backfill: Timing  # what init adds after the hook: a walk over every message

    @property
    def hook(self) -> Timing:
        parts = (self.tagging, self.blocklist, self.sidecar)
        return Timing(sum(p.wall for p in parts), sum(p.cpu for p in parts))


def post_new_split(env: BenchEnv) -> PostNewSplit:
    """Bare ``notmuch new``, then the hook's steps one by one in this process: the same calls,
    in the same order, as ``passes.post_new.post_new`` (plus the walk ``init`` adds)."""
    from fmail_nm.passes.blocklist import apply_blocklist, read_blocklist
    from fmail_nm.passes.mirror import sync_sidecar
    from fmail_nm.passes.tagging import backfill_recipients, run_tagging
    from fmail_nm.store.notmuch import Reader, Writer

    env.fmail(*env.init_args(), "--no-index")
    _, bare = env.notmuch("new", "--no-hooks")
    config = env.config()
    with env.active(), Reader(None) as reader, Writer(None) as writer:
        report, tagging = timed_call(lambda: run_tagging(config, reader, writer))
        _, blocklist = timed_call(
            lambda: apply_blocklist(config, reader, writer, read_blocklist(config)))
        _, sidecar = timed_call(lambda: sync_sidecar(config, reader))
        _, backfill = timed_call(lambda: backfill_recipients(reader, writer))
    log(f"  tagged {report.messages} messages in {report.batches} batches")
    return PostNewSplit(bare, tagging, blocklist, sidecar, backfill)


@dataclass
class FirstIndex:
    messages: int
    runs: list[PostNewSplit]
    init_end_to_end: list[Timing]
    sidecar_rebuild: Timing | None = None

    def summary(self) -> dict[str, Any]:
        bare = median_timing([r.notmuch_new for r in self.runs])
        hook = median_timing([r.hook for r in self.runs])
        out: dict[str, Any] = {
            "messages": self.messages,
            "bare_notmuch_new": bare,
            "tagging": median_timing([r.tagging for r in self.runs]),
            "blocklist": median_timing([r.blocklist for r in self.runs]),
            "sidecar_build": median_timing([r.sidecar for r in self.runs]),
            "init_backfill": median_timing([r.init_backfill for r in self.runs]),
            "hook_total": hook,
            "ratio_notmuch_new_plus_hook": round((bare.wall + hook.wall) / bare.wall, 2),
            "ratio_cpu": round((bare.cpu + hook.cpu) / bare.cpu, 2),
            "sidecar_rebuild_cli": self.sidecar_rebuild,
        }
        if self.init_end_to_end:
            init = median_timing(self.init_end_to_end)
            out["fmail_init"] = init
            out["ratio_init"] = round(init.wall / bare.wall, 2)
        return out


def first_index(ws: Workspace, tree: Path, size: Size) -> tuple[FirstIndex, BenchEnv]:
    """Returns the measurements and an indexed setup (from the last split run) to go on with."""
    runs: list[PostNewSplit] = []
    inits: list[Timing] = []
    env: BenchEnv | None = None
    for i in range(size.index_runs):
        env = BenchEnv.create(ws.fresh(f"split{i}"), tree)
        log(f"first index, run {i + 1}/{size.index_runs}: bare notmuch new + post-new pass")
        runs.append(post_new_split(env))
        log(f"  notmuch new {runs[-1].notmuch_new}, tagging {runs[-1].tagging}, "
            f"sidecar {runs[-1].sidecar}")
        if i < size.init_runs:
            init_env = BenchEnv.create(ws.fresh(f"init{i}"), tree)
            log(f"first index, run {i + 1}: fmail-nm init end to end")
            _, timing = init_env.fmail(*init_env.init_args())
            inits.append(timing)
            log(f"  fmail-nm init {timing}")
            shutil.rmtree(init_env.base)
        if i + 1 < size.index_runs:
            shutil.rmtree(env.base)
    assert env is not None
    messages = int(env.notmuch("count", "--exclude=false", "*")[0])
    log("sidecar rebuild (CLI)")
    _, rebuild = env.fmail("sidecar", "rebuild")
    return FirstIndex(messages, runs, inits, rebuild), env


# ---------------------------------------------------------------------------------------------
# Incremental work


@dataclass
class Incremental:
    index_nothing_new: Timing
    index_1_new: Timing
    index_100_new: Timing
    notmuch_new_100: Timing
    hook_100: Timing
    tag_1000: Timing
    sync_after_tag_1000: Timing
    flag_1000: Timing
    sync_after_flag_1000: Timing


def deliver(env: BenchEnv, messages: Sequence[corpus.Message], skip: frozenset[str],
            count: int, batch: int) -> None:
    corpus.write_new_mail(env.mail_root, messages, count=count, batch=batch, skip=skip)


def tag_batch_file(ids: Sequence[str], change: str) -> str:
    from fmail_nm.store.query import quote
    return "".join(f"{change} -- id:{quote(mid)}\n" for mid in ids)


def sample_ids(env: BenchEnv, n: int) -> list[str]:
    out, _ = env.notmuch("search", "--output=messages", "--exclude=false", f"--limit={n}",
                         "folder:work/INBOX OR folder:home/INBOX")
    return [line.removeprefix("id:") for line in out.splitlines() if line]


def incremental(env: BenchEnv, messages: Sequence[corpus.Message], skip: frozenset[str],
                runs: int = 3) -> Incremental:
    log("incremental: fmail-nm index with nothing new")
    idle = median_timing([env.fmail("index", "--quiet")[1] for _ in range(runs)])
    one, hundred = [], []
    batch = 0
    for _ in range(runs):
        log(f"incremental: 1 and 100 new messages (round {batch // 2 + 1}/{runs})")
        deliver(env, messages, skip, 1, batch)
        one.append(env.fmail("index", "--quiet")[1])
        deliver(env, messages, skip, 100, batch + 1)
        hundred.append(env.fmail("index", "--quiet")[1])
        batch += 2
    deliver(env, messages, skip, 100, batch)
    _, bare = env.notmuch("new", "--no-hooks")
    _, hook = env.fmail("hook", "post-new")
    ids = sample_ids(env, 1000)
    tags, tag_syncs, flags, flag_syncs = [], [], [], []
    for i in range(runs):
        log(f"incremental: notmuch tag on {len(ids)} messages + sidecar sync (round {i + 1}/{runs})")
        tags.append(env.notmuch("tag", "--batch", stdin=tag_batch_file(ids, f"+bench{i}"))[1])
        tag_syncs.append(env.fmail("sidecar", "sync")[1])
        # flagged maps to the F flag: every file is renamed, the sidecar sees new file names
        flags.append(env.notmuch("tag", "--batch",
                                 stdin=tag_batch_file(ids, "-flagged" if i % 2 else "+flagged"))[1])
        flag_syncs.append(env.fmail("sidecar", "sync")[1])
    return Incremental(idle, median_timing(one), median_timing(hundred), bare, hook,
                       median_timing(tags), median_timing(tag_syncs), median_timing(flags),
                       median_timing(flag_syncs))


# ---------------------------------------------------------------------------------------------
# Reads in-process


@dataclass
class Reads:
    search: dict[str, Latency]
    totals: dict[str, int]
    compiled: dict[str, str]
    get_email: Latency
    sql: dict[str, Latency]
    query_emails_tool: dict[str, Latency] | None
    notes: list[str] = field(default_factory=list)


def page_ids(mb: Any, n: int) -> list[str]:
    from fmail_nm.tools import reads
    ids: list[str] = []
    cursor = None
    while len(ids) < n:
        page = reads.search_emails(mb, "", limit=50, cursor=cursor)
        ids += [r.id for r in page.results]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    return ids[:n]


def reads_in_process(env: BenchEnv, n: int) -> Reads:
    from fmail_nm.store.notmuch import Reader
    from fmail_nm.store.sidecar import sidecar_path
    from fmail_nm.tools import reads

    config = env.config()
    with env.active(), Reader(None) as reader:
        mb = reads.Mailbox(config, reader)
        search, totals, compiled = {}, {}, {}
        for q in SEARCHES:
            found = reads.search_emails(mb, q, limit=50)
            totals[q], compiled[q] = found.total, found.query
            search[q] = latencies(lambda q=q: reads.search_emails(mb, q, limit=50), n)
        ids = page_ids(mb, n + 3)
        it = iter(ids * 2)
        got = latencies(lambda: reads.get_email(mb, next(it)), n)
        side = sidecar_path(config.data_dir)  # data_dir follows $XDG_DATA_HOME
    sql, tool, notes = sql_latencies(side, n, [a.name for a in config.accounts])
    return Reads(search, totals, compiled, got, sql, tool, notes)


def sql_latencies(path: Path, n: int, accounts: Sequence[str]
                  ) -> tuple[dict[str, Latency], dict[str, Latency] | None, list[str]]:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        plain = {label: latencies(lambda s=sql: conn.execute(s).fetchall(), n)
                 for label, sql in SQL.items()}
    finally:
        conn.close()
    try:
        from fmail_nm.tools import sql as sqltools
    except ImportError:
        return plain, None, ["fmail_nm.tools.sql not present: query_emails not timed"]
    tool = {}
    notes = []
    for label, sql in SQL.items():
        try:
            sqltools.query_emails(path, sql, known_accounts=accounts)
        except Exception as exc:  # noqa: BLE001 - a tool being written in parallel
            notes.append(f"query_emails refused {label!r}: {exc}")
            continue
        tool[label] = latencies(lambda s=sql: sqltools.query_emails(path, s, known_accounts=accounts), n)
    return plain, tool, notes


# ---------------------------------------------------------------------------------------------
# Over MCP stdio


@dataclass
class McpResults:
    search: dict[str, Latency]
    get_email: Latency
    list_available_accounts: Latency
    startup_s: float
    server_vm_hwm_mib: float | None
    server_vm_rss_mib: float | None
    tool_list_bytes: int
    tool_bytes: dict[str, int]
    search_50_json_bytes: int  # structuredContent alone
    search_50_wire_bytes: int  # the whole tools/call result (content + structuredContent)
    search_50_text_bytes: int  # notmuch search --format=text --output=summary --limit=50 '*'
    raw: dict[str, Latency] = field(default_factory=dict)


def child_pids() -> set[int]:
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (task / "children").read_text().split())
    return pids


def memory_mib(pid: int) -> tuple[float | None, float | None]:
    fields: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmHWM"), fields.get("VmRSS")


async def mcp_session(env: BenchEnv, n: int, ids: Sequence[str]) -> McpResults:
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "fmail_nm", "serve", "--transport", "stdio"],
                                   env={**os.environ, **env.env}, cwd=str(env.base))
    before = child_pids()
    start = time.perf_counter()
    async with Client(params) as client:
        tools = (await client.list_tools()).tools
        startup = time.perf_counter() - start
        server = next(iter(child_pids() - before), None)
        tool_bytes = {t.name: len(t.model_dump_json(exclude_none=True)) for t in tools}

        async def call(tool: str, args: dict[str, Any]) -> Any:
            result = await client.call_tool(tool, args)
            if result.is_error:
                raise RuntimeError(f"{tool} failed: {result.content}")
            return result
        search = {q: await async_latencies(
            lambda q=q: call("search_emails", {"query": q, "limit": 50}), n)
            for q in SEARCHES[:3]}
        it = iter(list(ids) * 2)
        got = await async_latencies(lambda: call("get_email", {"id": next(it)}), n)
        noop = await async_latencies(lambda: call("list_available_accounts", {}), n)
        page = await call("search_emails", {"query": "", "limit": 50})
        json_bytes = len(json.dumps(page.structured_content, ensure_ascii=False).encode())
        wire_bytes = len(page.model_dump_json(by_alias=True, exclude_none=True).encode())
        hwm, rss = memory_mib(server) if server else (None, None)
    text_bytes = len(env.notmuch("search", "--format=text", "--output=summary", "--limit=50",
                                 "*")[0].encode())
    return McpResults(search, got, noop, round(startup, 3), hwm, rss, sum(tool_bytes.values()),
                      tool_bytes, json_bytes, wire_bytes, text_bytes)


class RawStdio:
    """A bare JSON-RPC client on the server's stdio (no SDK, no result validation): what the
    server and the transport cost, without the Python client's own work."""

    def __init__(self, env: BenchEnv) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fmail_nm", "serve", "--transport", "stdio"],
            env={**os.environ, **env.env}, cwd=env.base, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, encoding="utf-8")
        self._id = 0

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._id += 1
        self._send({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params})
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the server closed its stdout")
            message = json.loads(line)
            if message.get("id") == self._id:
                if "error" in message or message["result"].get("isError"):
                    raise RuntimeError(f"{method} failed: {line[:500]}")
                return dict(message["result"])

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def start(self) -> None:
        from mcp.types import LATEST_PROTOCOL_VERSION
        self.request("initialize", {"protocolVersion": LATEST_PROTOCOL_VERSION, "capabilities": {},
                                    "clientInfo": {"name": "fmail-bench", "version": "0"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def raw_latencies(env: BenchEnv, n: int, ids: Sequence[str]) -> dict[str, Latency]:
    client = RawStdio(env)
    try:
        client.start()

        def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
            return client.request("tools/call", {"name": name, "arguments": args})
        out = {f"search_emails {q or '(all)'!r}": latencies(
            lambda q=q: call("search_emails", {"query": q, "limit": 50}), n) for q in SEARCHES[:3]}
        it = iter(list(ids) * 2)
        out["get_email"] = latencies(lambda: call("get_email", {"id": next(it)}), n)
        out["list_available_accounts"] = latencies(lambda: call("list_available_accounts", {}), n)
        return out
    finally:
        client.close()


# ---------------------------------------------------------------------------------------------
# The notmuch CLI, for comparison


def cli_latencies(env: BenchEnv, compiled: dict[str, str], n: int) -> dict[str, Latency]:
    out = {}
    for q in SEARCHES[:3]:
        argv = ["notmuch", "search", "--format=json", "--limit=50", compiled[q]]
        out[q] = latencies(lambda argv=argv: env.run(argv, timeout=CLI_TIMEOUT), n, warmup=2)
    return out


# ---------------------------------------------------------------------------------------------
# One size, all of it


@dataclass
class SizeResult:
    size: str
    messages: int
    first_index: dict[str, Any]
    incremental: Incremental
    reads: Reads
    mcp: McpResults
    cli: dict[str, Latency]
    load_before: str
    load_after: str


def build_tree(ws: Workspace, size: Size, messages: Sequence[corpus.Message],
               skip: frozenset[str]) -> Path:
    tree = ws.root / f"tree-{size.name}"
    n = corpus.write_tree(tree, messages, total=size.total, skip=skip)
    log(f"wrote {n} messages ({size.name}) under {tree}; "
        f"{warm_page_cache(tree) / 2**20:.0f} MiB read to warm the page cache")
    return tree


def run_size(ws: Workspace, size: Size, messages: Sequence[corpus.Message],
             skip: frozenset[str], n: int, keep: bool = False) -> SizeResult:
    load_before = load_average()
    tree = build_tree(ws, size, messages, skip)
    first, env = first_index(ws, tree, size)
    summary = first.summary()
    log(f"first index: {json.dumps(summary, default=str)}")
    inc = incremental(env, messages, skip)
    log("reads in-process")
    rd = reads_in_process(env, n)
    log("MCP over stdio")
    ids = page_ids_for(env, n + 3)
    mcp = asyncio.run(mcp_session(env, n, ids))
    log("MCP over stdio, bare JSON-RPC client")
    mcp.raw = raw_latencies(env, n, ids)
    log("notmuch CLI")
    cli = cli_latencies(env, rd.compiled, max(10, n // 3))
    if keep:
        log(f"kept the indexed setup: {env.base} (environment: {json.dumps(env.env)})")
    else:
        shutil.rmtree(env.base)
    return SizeResult(size.name, first.messages, summary, inc, rd, mcp, cli, load_before,
                      load_average())


def page_ids_for(env: BenchEnv, n: int) -> list[str]:
    from fmail_nm.store.notmuch import Reader
    from fmail_nm.tools import reads
    config = env.config()
    with env.active(), Reader(None) as reader:
        return page_ids(reads.Mailbox(config, reader), n)


# ---------------------------------------------------------------------------------------------
# Reporting


def ms(latency: Latency | None) -> str:
    return "-" if latency is None else f"{latency.p50:.2f} / {latency.p95:.2f}"


def secs(timing: Timing | None) -> str:
    return "-" if timing is None else f"{timing.wall:.2f} s ({timing.cpu:.2f})"


def rows(r: SizeResult) -> list[tuple[str, str]]:
    f = r.first_index
    out = [
        ("messages indexed", str(r.messages)),
        ("bare notmuch new --no-hooks", secs(f["bare_notmuch_new"])),
        ("  post-new: tagging pass", secs(f["tagging"])),
        ("  post-new: blocklist", secs(f["blocklist"])),
        ("  post-new: sidecar build", secs(f["sidecar_build"])),
        ("  post-new: total", secs(f["hook_total"])),
        ("(notmuch new + post-new) / bare  [<= 1.25]", f"{f['ratio_notmuch_new_plus_hook']}x "
                                                       f"(cpu {f['ratio_cpu']}x)"),
        ("fmail-nm init end to end", secs(f.get("fmail_init"))),
        ("fmail-nm init / bare  [<= 1.25]", f"{f['ratio_init']}x" if "ratio_init" in f else "-"),
        ("  init's extra recipients walk", secs(f["init_backfill"])),
        ("fmail-nm sidecar rebuild", secs(f["sidecar_rebuild_cli"])),
        ("fmail-nm index, nothing new", secs(r.incremental.index_nothing_new)),
        ("fmail-nm index, 1 new  [~2 s to searchable]", secs(r.incremental.index_1_new)),
        ("fmail-nm index, 100 new", secs(r.incremental.index_100_new)),
        ("  100 new: notmuch new --no-hooks", secs(r.incremental.notmuch_new_100)),
        ("  100 new: fmail-nm hook post-new", secs(r.incremental.hook_100)),
        ("notmuch tag, 1,000 msgs (tag only)", secs(r.incremental.tag_1000)),
        ("  then fmail-nm sidecar sync", secs(r.incremental.sync_after_tag_1000)),
        ("notmuch tag, 1,000 msgs (+/-flagged: renames)", secs(r.incremental.flag_1000)),
        ("  then fmail-nm sidecar sync", secs(r.incremental.sync_after_flag_1000)),
    ]
    for q, lat in r.reads.search.items():
        out.append((f"in-process search_emails {q or '(all)'!r} [total]",
                    f"{ms(lat)} [{r.reads.totals[q]}]"))
    out.append(("in-process get_email  [< 4 ms]", ms(r.reads.get_email)))
    for label, lat in r.reads.sql.items():
        out.append((f"sqlite3 {label}", ms(lat)))
    for label, lat in (r.reads.query_emails_tool or {}).items():
        out.append((f"sqltools.query_emails {label}", ms(lat)))
    for q, lat in r.mcp.search.items():
        out.append((f"MCP search_emails {q or '(all)'!r}  [3-5 ms]", ms(lat)))
    out += [
        ("MCP get_email  [< 4 ms]", ms(r.mcp.get_email)),
        ("MCP list_available_accounts  [~0.8 ms]", ms(r.mcp.list_available_accounts)),
    ]
    for label, lat in r.mcp.raw.items():
        out.append((f"bare JSON-RPC {label}", ms(lat)))
    for q, lat in r.cli.items():
        out.append((f"notmuch search --format=json --limit=50 {q or '*'!r}", ms(lat)))
    out += [
        ("MCP server startup to tool list", f"{r.mcp.startup_s:.2f} s"),
        ("MCP server peak RSS (VmHWM)  [< 200 MiB @100k]",
         f"{r.mcp.server_vm_hwm_mib:.0f} MiB" if r.mcp.server_vm_hwm_mib else "-"),
        ("tool list bytes  [< ~20 KB]", str(r.mcp.tool_list_bytes)),
        ("50 results: structuredContent bytes", str(r.mcp.search_50_json_bytes)),
        ("50 results: whole tools/call result bytes", str(r.mcp.search_50_wire_bytes)),
        ("50 results: notmuch text summary bytes", str(r.mcp.search_50_text_bytes)),
        ("load average before / after", f"{r.load_before} / {r.load_after}"),
    ]
    return out


def print_table(results: Sequence[SizeResult]) -> None:
    labels = [label for label, _ in rows(results[0])]
    columns = [dict(rows(r)) for r in results]
    width = max(len(label) for label in labels)
    header = f"{'(wall s (cpu s) | ms p50 / p95)':<{width}}  " + "  ".join(
        f"{r.size:>22}" for r in results)
    print(header)
    print("-" * len(header))
    for label in labels:
        print(f"{label:<{width}}  " + "  ".join(f"{c.get(label, '-'):>22}" for c in columns))


def snapshot_code(ref: str, dest: Path) -> str:
    """Extract ``fmail_nm`` and ``hooks`` (as ``fmail_nm.hooks``) of a git ref into ``dest``,
    put ``dest`` first on the import path of this process and its children; returns the
    commit id."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", ref], capture_output=True,
                            text=True, check=True, timeout=CLI_TIMEOUT).stdout.strip()
    data = subprocess.run(["git", "-C", str(REPO), "archive", commit, "fmail_nm", "hooks"],
                          capture_output=True, check=True, timeout=CLI_TIMEOUT).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    (dest / "hooks").rename(dest / "fmail_nm" / "hooks")
    if "fmail_nm" in sys.modules:
        raise RuntimeError("fmail_nm was imported before the snapshot was put on the path")
    sys.path.insert(0, str(dest))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(dest), *filter(None, [os.environ.get("PYTHONPATH")])])
    return commit


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT, check=False).stdout.strip()


def code_version() -> str:
    """Which fmail_nm is measured: the checkout's commit and its uncommitted files, or a path."""
    import fmail_nm
    where = Path(fmail_nm.__file__).resolve().parent
    if where.parent != REPO:
        return str(where)
    dirty = _git("status", "--short", "fmail_nm", "hooks").replace("\n", ", ")
    return f"working tree at {_git('rev-parse', '--short', 'HEAD')}" + (f" + {dirty}" if dirty else "")


def machine() -> dict[str, str]:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "?")
    notmuch = subprocess.run(["notmuch", "--version"], capture_output=True, text=True,
                             timeout=CLI_TIMEOUT, check=False).stdout.strip()
    return {"cpus": str(os.cpu_count()), "cpu_model": cpu, "python": platform.python_version(),
            "kernel": platform.release(), "notmuch": notmuch}


def to_json(value: Any) -> Any:
    if isinstance(value, (Timing, Latency)):
        return asdict(value)
    if hasattr(value, "__dataclass_fields__"):
        return {k: to_json(v) for k, v in vars(value).items()}
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="6k,20k", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--samples", type=int, default=50, help="calls per latency measurement")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--keep-crashers", action="store_true",
                        help="keep the messages that crash the post-new hook (see bench.corpus)")
    parser.add_argument("--workdir", type=Path, help="where to build (default: a temp dir, removed)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the last indexed setup of each size (needs --workdir)")
    parser.add_argument("--code", metavar="REF",
                        help="measure this git commit of fmail_nm instead of the working tree")
    args = parser.parse_args(argv)
    if args.keep and not args.workdir:
        parser.error("--keep needs --workdir (the default temp dir is removed)")
    sizes = [SIZES[s.strip()] for s in args.sizes.split(",") if s.strip()]
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        root = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fmail-bench-")))
        if args.code:
            code = f"commit {snapshot_code(args.code, root / 'code')[:10]} ({args.code})"
        else:
            code = code_version()
        log(f"measuring fmail_nm from {code}")
        messages = corpus.load_messages(corpus.corpus_dir())
        skip = frozenset() if args.keep_crashers else corpus.crashers(messages)
        if skip:
            log(f"left out {len(skip)} message(s) that crash the post-new hook: "
                f"{', '.join(sorted(skip))}")
        ws = Workspace(root)
        results = [run_size(ws, size, messages, skip, args.samples, args.keep) for size in sizes]
    info = {**machine(), "code": code}
    print(f"\nfmail-nm benchmarks: {info['cpus']} x {info['cpu_model']}, {info['notmuch']}, "
          f"Python {info['python']}; fmail_nm: {code}; {time.perf_counter() - started:.0f} s in all\n")
    print_table(results)
    for r in results:
        for note in r.reads.notes:
            print(f"note ({r.size}): {note}")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "left_out": sorted(skip),
                                         "results": to_json(results)}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
