"""Benchmarks for fmail-nm on real mail (the SpamAssassin corpus, see :mod:`bench.corpus`).

    .venv/bin/python -m bench.run [--sizes 6k,20k] [--only index,reads] [--json results.json]
    .venv/bin/python -m bench.run --sizes 20k --compare-tags REF

Everything runs in a temp directory with HOME, XDG_*, NOTMUCH_CONFIG and FMAIL_CONFIG pointing
into it (as the tests do), so no real mail setup is read or touched.  Per size, in parts
(``--only``):

* ``index`` -- first index: bare ``notmuch new --no-hooks`` on a fresh database, then the
  post-new hook alone (``bench/hookprobe.py``: ``fmail-nm hook post-new`` with the steps that
  ``passes.post_new`` calls timed inside it), and ``fmail-nm init`` end to end on an identical
  copy of the tree; each step in its own process, with that process's wall time, CPU time and
  peak RSS (``os.wait4``).  Incremental: ``fmail-nm index`` with nothing, 1 and 100 new
  messages against ``notmuch new --no-hooks`` (then the hook alone) for the same delivery on
  an identical copy of the indexed setup; ``notmuch tag`` on 1,000 messages followed by
  ``fmail-nm sidecar sync``;
* ``reads`` -- in-process ``reads.search_emails`` / ``reads.get_email``, SQL on the sidecar;
  over MCP stdio with the SDK's client and a bare JSON-RPC client, their calls alternating
  (``search_emails``, ``get_email``, ``list_available_accounts``, the server's peak RSS); side
  by side with a peer server (bench/peer.py), call for call likewise; over Streamable HTTP
  with the SDK's client (a loopback port); the notmuch CLI
  (``notmuch search --format=json --limit=50``) for comparison;
* ``tags`` -- (``--compare-tags REF``) the same tree indexed by ``fmail-nm init`` of REF and of
  the code measured, and the two ``notmuch dump --include=tags`` compared message by message.

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
import re
import resource
import secrets
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from . import corpus, peer

REPO = Path(__file__).resolve().parent.parent
HOOKPROBE = Path(__file__).resolve().parent / "hookprobe.py"
MEASURE = Path(__file__).resolve().parent / "measure.py"
STARTUP_PYTHONPATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
CMD_TIMEOUT = 3600.0
CLI_TIMEOUT = 60.0
NAME = "Bench User"
ADDRESSES = [address for _, address in corpus.ACCOUNTS.values()]
FMAIL_TOML = "\n".join(
    f'[[accounts]]\nname = "{name}"\naddresses = ["{address}"]\nmaildir = "{name}"\n\n'
    f'[accounts.folders]\ninbox = "INBOX"\nsent = "Sent"\njunk = "Junk"\narchive = "Archive"\n'
    for name, (_, address) in corpus.ACCOUNTS.items())

SEARCHES = ("", "in:inbox is:unread", "linux", "from:garym@canada.com",
            "after:2002-09-01 before:2002-10-01")
# list_threads pages (20 threads): its default, and one list's threads.
THREAD_LISTINGS = ("in:inbox", "list:ilug.linux.ie")
SQL = {
    "unread INBOX, newest 10": "SELECT * FROM emails WHERE folder = 'INBOX' AND is_read = 0 "
                               "ORDER BY date DESC LIMIT 10",
    "GROUP BY sender, top 20": "SELECT sender_email, count(*) AS n FROM emails "
                               "GROUP BY sender_email ORDER BY n DESC LIMIT 20",
    "threads by last_date, 20": "SELECT * FROM threads ORDER BY last_date DESC LIMIT 20",
}
PARTS = ("index", "reads", "tags")
DELIVERIES = (0, 1, 100)  # new messages per incremental `fmail-nm index` / `notmuch new`
INCREMENTAL_TARGET_S = 0.3  # fmail-nm index may take at most this much longer than notmuch new


@dataclass(frozen=True)
class Size:
    """One corpus size: how to write it and how often to repeat the expensive steps."""

    name: str
    total: int | None  # None: the corpus once, as it is
    index_runs: int  # bare notmuch new + the post-new hook alone
    init_runs: int  # fmail-nm init end to end
    rebuild: bool = True  # also time `fmail-nm sidecar rebuild`


SIZES = {
    "1k": Size("1k", 1000, 1, 1),  # a quick smoke run of the bench itself
    "6k": Size("6k", None, 2, 1),
    "20k": Size("20k", 20000, 1, 1),
    # The corpus 17 times (Message-IDs rewritten per copy, see bench.corpus), ~510 MiB of mail.
    "100k": Size("100k", 100000, 1, 1, rebuild=False),
}


# ---------------------------------------------------------------------------------------------
# Measuring


@dataclass
class Timing:
    wall: float
    cpu: float  # user + system, of the process (and the children it waited for)
    # Max RSS of a step run in its own process (os.wait4's ru_maxrss, see bench/measure.py:
    # the step's process, or the largest of the processes it waited for -- notmuch, the hook).
    peak_rss_mib: float | None = None

    def __str__(self) -> str:
        rss = "" if self.peak_rss_mib is None else f", peak RSS {self.peak_rss_mib:.0f} MiB"
        return f"{self.wall:.2f} s (cpu {self.cpu:.2f} s{rss})"


def median_timing(timings: Sequence[Timing]) -> Timing:
    rss = [t.peak_rss_mib for t in timings if t.peak_rss_mib is not None]
    return Timing(statistics.median(t.wall for t in timings),
                  statistics.median(t.cpu for t in timings), max(rss) if rss else None)


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


def fetch_all(conn: sqlite3.Connection, sql: str) -> list[Any]:
    return conn.execute(sql).fetchall()


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


async def timed_pairs(ours: Callable[[], Awaitable[object]],
                      theirs: Callable[[], Awaitable[object]],
                      n: int, warmup: int = 3) -> tuple[list[float], list[float]]:
    """Two sides timed in pairs of calls made back to back: on a shared machine the load drifts
    within seconds, so sides timed one after the other compare two different machines.  The first
    of each pair switches (ours, theirs, theirs, ours, ...) so that neither side always runs
    first, on the cache the other warmed or in the moment after it.  Seconds per call;
    ``ours[i]`` and ``theirs[i]`` are one pair."""
    mine: list[float] = []
    other: list[float] = []
    for i in range(warmup + n):
        pair = [(ours, mine), (theirs, other)]
        for fn, samples in pair if i % 2 == 0 else pair[::-1]:
            start = time.perf_counter()
            await fn()
            if i >= warmup:
                samples.append(time.perf_counter() - start)
    return mine, other


def as_async(fn: Callable[[], object]) -> Callable[[], Awaitable[object]]:
    """A blocking call (the bare client's) as a coroutine, to pair it with :func:`timed_pairs`;
    it never yields, so it costs a function call."""
    async def call() -> object:
        return fn()
    return call


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# An isolated mail setup


class CommandFailed(RuntimeError):
    pass


def copy_setup(src: Path, dst: Path) -> None:
    """Copy a whole setup directory: the mail files as hard links (their contents never change,
    and a rename in one tree leaves the other alone), everything else -- the Xapian database
    in ``mail/.notmuch``, the sidecar, configs, hooks -- as real copies, with the directories'
    mtimes kept (``notmuch new`` decides by them which directories to scan)."""
    mail, database = src / "mail", src / "mail" / ".notmuch"

    def copy(source: str, dest: str) -> None:
        path = Path(source)
        if path.is_relative_to(mail) and not path.is_relative_to(database):
            os.link(source, dest)
        else:
            shutil.copy2(source, dest)
    shutil.copytree(src, dst, symlinks=True, copy_function=copy)


@dataclass
class BenchEnv:
    """A Maildir tree (hard links to a template) with its own HOME, XDG dirs and configs."""

    base: Path
    mail_root: Path
    env: dict[str, str]

    @classmethod
    def create(cls, base: Path, template: Path, code: Path | None = None) -> BenchEnv:
        """``code``: a directory with another ``fmail_nm`` to put first on PYTHONPATH for this
        setup's commands (and the hook notmuch runs), instead of the one measured."""
        home = base / "home"
        home.mkdir(parents=True)
        # Hard links: renames (flag changes) only touch this tree; file contents never change.
        shutil.copytree(template, base / "mail", copy_function=os.link)
        (base / "fmail.toml").write_text(FMAIL_TOML, encoding="utf-8")
        env = cls._environment(base)
        if code is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(code), *STARTUP_PYTHONPATH])
        return cls(base=base, mail_root=base / "mail", env=env)

    @classmethod
    def existing(cls, base: Path) -> BenchEnv:
        """A setup an earlier run built and kept (``--keep``), as it was left."""
        if not (base / "notmuch-config").is_file() or not (base / "mail").is_dir():
            raise SystemExit(f"{base} is not a setup kept by --keep (no notmuch-config or mail)")
        return cls(base=base, mail_root=base / "mail", env=cls._environment(base))

    @staticmethod
    def _environment(base: Path) -> dict[str, str]:
        home = base / "home"
        return {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "NOTMUCH_CONFIG": str(base / "notmuch-config"),
            "FMAIL_CONFIG": str(base / "fmail.toml"),
        }

    def run(self, argv: Sequence[str], *, timeout: float = CMD_TIMEOUT,
            stdin: str | None = None) -> tuple[str, Timing]:
        """A command whose cost is not the point (or is timed from outside, as the CLI
        latencies are): wall time and the CPU of the children reaped meanwhile."""
        cpu, start = children_cpu(), time.perf_counter()
        done = subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=timeout, input=stdin, check=False, cwd=self.base)
        timing = Timing(time.perf_counter() - start, children_cpu() - cpu)
        if done.returncode != 0:
            raise CommandFailed(f"{' '.join(argv)} failed (exit {done.returncode}):\n"
                                f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done.stdout, timing

    def step(self, argv: Sequence[str], *, timeout: float = CMD_TIMEOUT,
             stdin: str | None = None) -> tuple[str, Timing]:
        """One measured step in its own process, started by ``bench/measure.py`` (which says why
        the bench cannot fork it itself): wall time, and from ``os.wait4`` the CPU time of that
        process and the ones it waited for, and the peak RSS of the largest of them."""
        with contextlib.ExitStack() as stack:
            out, err = (stack.enter_context(tempfile.TemporaryFile()) for _ in range(2))
            feed: Any = subprocess.DEVNULL
            if stdin is not None:
                feed = stack.enter_context(tempfile.TemporaryFile())
                feed.write(stdin.encode("utf-8"))
                feed.seek(0)
            report = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "measure.json"
            proc = subprocess.Popen([sys.executable, "-S", "-I", str(MEASURE), str(report), *argv],
                                    env={**os.environ, **self.env}, cwd=self.base, stdin=feed,
                                    stdout=out, stderr=err)
            timed_out = ""
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()  # the command dies with the launcher (see bench/measure.py)
                proc.wait()
                timed_out = f", stopped after {timeout:g} s"
            out.seek(0)
            err.seek(0)
            stdout = out.read().decode("utf-8", "replace")
            stderr = err.read().decode("utf-8", "replace")
            measured = json.loads(report.read_text()) if report.is_file() else None
        if proc.returncode != 0 or measured is None:
            raise CommandFailed(f"{' '.join(argv)} failed (exit {proc.returncode}{timed_out}):\n"
                                f"{stdout[-2000:]}{stderr[-2000:]}")
        return stdout, Timing(measured["wall"], measured["cpu"], measured["maxrss_kib"] / 1024)

    def fmail(self, *args: str, timeout: float = CMD_TIMEOUT) -> tuple[str, Timing]:
        return self.run([sys.executable, "-m", "fmail_nm", *args], timeout=timeout)

    def fmail_step(self, *args: str, timeout: float = CMD_TIMEOUT) -> tuple[str, Timing]:
        return self.step([sys.executable, "-m", "fmail_nm", *args], timeout=timeout)

    def notmuch(self, *args: str, timeout: float = CMD_TIMEOUT,
                stdin: str | None = None) -> tuple[str, Timing]:
        return self.run(["notmuch", *args], timeout=timeout, stdin=stdin)

    def hook_probe(self) -> tuple[Timing, dict[str, Timing]]:
        """The post-new hook alone, in its own process, and the time of each step inside it
        (see ``bench/hookprobe.py``)."""
        report = self.base / "hookprobe.json"
        _, timing = self.step([sys.executable, str(HOOKPROBE), str(report)])
        steps = json.loads(report.read_text(encoding="utf-8"))["steps"]
        return timing, {name: Timing(s["wall"], s["cpu"]) for name, s in steps.items()}

    def init_args(self) -> list[str]:
        args = ["init", "--mail-root", str(self.mail_root), "--name", NAME]
        for address in ADDRESSES:
            args += ["--address", address]
        return args

    def count(self) -> int:
        return int(self.notmuch("count", "--exclude=false", "*")[0])

    def restore(self, snapshot: Path) -> None:
        """Put this setup back exactly as ``snapshot`` (a :func:`copy_setup` of it) was."""
        shutil.rmtree(self.base)
        copy_setup(snapshot, self.base)
        os.sync()  # no writeback of the copied database during the next measured step

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
class FirstIndexRun:
    notmuch_new: Timing  # bare `notmuch new --no-hooks` on a fresh database, own process
    hook: Timing  # then the post-new hook alone, own process (start-up included)
    steps: dict[str, Timing]  # inside the hook: each function passes.post_new calls


def bare_then_hook(env: BenchEnv) -> FirstIndexRun:
    """What fmail-nm's first index is made of, one process each: ``notmuch new --no-hooks``
    (the same as notmuch without fmail-nm), then the post-new hook notmuch would have run."""
    env.fmail(*env.init_args(), "--no-index")  # notmuch config and hooks, no indexing
    _, bare = env.step(["notmuch", "new", "--no-hooks"])
    hook, steps = env.hook_probe()
    return FirstIndexRun(bare, hook, steps)


@dataclass
class FirstIndex:
    messages: int
    runs: list[FirstIndexRun]
    init_end_to_end: list[Timing]
    sidecar_rebuild: Timing | None = None
    # `fmail-nm index` on an empty database after `init --no-index`: fmail-nm's own first index
    own_first_index: list[Timing] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        bare = median_timing([r.notmuch_new for r in self.runs])
        hook = median_timing([r.hook for r in self.runs])
        names = list(dict.fromkeys(name for r in self.runs for name in r.steps))
        steps = {name: median_timing([r.steps[name] for r in self.runs if name in r.steps])
                 for name in names}
        out: dict[str, Any] = {
            "messages": self.messages,
            "bare_notmuch_new": bare,
            "hook": hook,
            "hook_steps": steps,
            # interpreter start, imports, opening the database, whatever post_new does itself
            "hook_outside_steps_wall": round(hook.wall - sum(s.wall for s in steps.values()), 3),
            "notmuch_new_plus_hook_wall": round(bare.wall + hook.wall, 3),
            "ratio_notmuch_new_plus_hook": round((bare.wall + hook.wall) / bare.wall, 2),
            "ratio_cpu": round((bare.cpu + hook.cpu) / bare.cpu, 2),
            "sidecar_rebuild_cli": self.sidecar_rebuild,
        }
        if self.init_end_to_end:
            init = median_timing(self.init_end_to_end)
            out["fmail_init"] = init
            out["ratio_init"] = round(init.wall / bare.wall, 2)
            out["ratio_init_cpu"] = round(init.cpu / bare.cpu, 2)
            out["init_minus_new_and_hook_wall"] = round(init.wall - bare.wall - hook.wall, 3)
        if self.own_first_index:
            own = median_timing(self.own_first_index)
            out["own_first_index"] = own
            out["ratio_own_first_index"] = round(own.wall / bare.wall, 2)
            out["ratio_own_first_index_cpu"] = round(own.cpu / bare.cpu, 2)
        out["peak_rss_mib"] = {"bare_notmuch_new": bare.peak_rss_mib, "hook": hook.peak_rss_mib,
                               "fmail_init": out["fmail_init"].peak_rss_mib
                               if "fmail_init" in out else None,
                               "own_first_index": out["own_first_index"].peak_rss_mib
                               if "own_first_index" in out else None}
        return out


def first_index(ws: Workspace, tree: Path, size: Size, *, want_dump: bool = False
                ) -> tuple[FirstIndex, BenchEnv, str | None]:
    """Returns the measurements, an indexed setup (the last bare-then-hook run) to go on with
    and, if ``want_dump``, the sorted tag dump of the first ``fmail-nm init`` setup."""
    runs: list[FirstIndexRun] = []
    inits: list[Timing] = []
    owns: list[Timing] = []
    dump: str | None = None
    env: BenchEnv | None = None
    for i in range(size.index_runs):
        env = BenchEnv.create(ws.fresh(f"split{i}"), tree)
        log(f"first index, run {i + 1}/{size.index_runs}: bare notmuch new, then the hook alone")
        runs.append(bare_then_hook(env))
        log(f"  notmuch new {runs[-1].notmuch_new}; hook {runs[-1].hook}: " + ", ".join(
            f"{name} {t.wall:.2f} s" for name, t in runs[-1].steps.items()))
        if i < size.init_runs:
            init_env = BenchEnv.create(ws.fresh(f"init{i}"), tree)
            log(f"first index, run {i + 1}: fmail-nm init end to end")
            _, timing = init_env.fmail_step(*init_env.init_args())
            inits.append(timing)
            log(f"  fmail-nm init {timing}")
            if want_dump and dump is None:
                dump = tag_dump(init_env)
            shutil.rmtree(init_env.base)
            own_env = BenchEnv.create(ws.fresh(f"own{i}"), tree)
            own_env.fmail(*own_env.init_args(), "--no-index")
            log(f"first index, run {i + 1}: fmail-nm index on the empty database")
            _, timing = own_env.fmail_step("index", "--quiet")
            owns.append(timing)
            log(f"  fmail-nm index (first) {timing}")
            shutil.rmtree(own_env.base)
        if i + 1 < size.index_runs:
            shutil.rmtree(env.base)
    assert env is not None
    messages = env.count()
    rebuild = None
    if size.rebuild:
        log("sidecar rebuild (CLI)")
        _, rebuild = env.fmail_step("sidecar", "rebuild")
        log(f"  fmail-nm sidecar rebuild {rebuild}")
    return FirstIndex(messages, runs, inits, rebuild, owns), env, dump


# ---------------------------------------------------------------------------------------------
# Incremental work


@dataclass
class SameDelivery:
    """One delivery of ``count`` new messages, indexed twice from identical copies of the same
    indexed setup: by ``fmail-nm index``, and by bare notmuch followed by the hook alone."""

    count: int
    index: Timing  # fmail-nm index (notmuch new with the hook, then its own post-new pass)
    bare: Timing  # notmuch new --no-hooks
    hook: Timing  # then fmail-nm hook post-new, alone
    tags_differ: int = 0  # delivered messages whose final tags differ between the two ways

    @property
    def extra(self) -> float:
        """How much longer ``fmail-nm index`` took than bare ``notmuch new``."""
        return self.index.wall - self.bare.wall


@dataclass
class Incremental:
    deliveries: dict[int, list[SameDelivery]]
    tag_1000: Timing
    sync_after_tag_1000: Timing
    flag_1000: Timing
    sync_after_flag_1000: Timing

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for count, rounds in self.deliveries.items():
            extra = [r.extra for r in rounds]
            out[f"{count}_new"] = {
                "fmail_index": median_timing([r.index for r in rounds]),
                "bare_notmuch_new": median_timing([r.bare for r in rounds]),
                "hook_alone": median_timing([r.hook for r in rounds]),
                "index_minus_bare_wall": round(statistics.median(extra), 3),
                "index_minus_bare_each": [round(e, 3) for e in extra],
                "within_target": statistics.median(extra) <= INCREMENTAL_TARGET_S,
                "tags_differ": max(r.tags_differ for r in rounds),
            }
        out.update(tag_1000=self.tag_1000, sync_after_tag_1000=self.sync_after_tag_1000,
                   flag_1000=self.flag_1000, sync_after_flag_1000=self.sync_after_flag_1000)
        return out


def deliver(env: BenchEnv, messages: Sequence[corpus.Message], skip: frozenset[str],
            count: int, batch: int) -> None:
    corpus.write_new_mail(env.mail_root, messages, count=count, batch=batch, skip=skip)


def quote(value: str) -> str:
    """A notmuch query term value in double quotes (embedded quotes doubled)."""
    return '"' + value.replace('"', '""') + '"'


def delivered_tags(env: BenchEnv) -> dict[str, frozenset[str]]:
    """The tags of the messages in the delivery folder (see :func:`deliver`)."""
    out, _ = env.notmuch("dump", "--include=tags", "--", "path:work/INBOX/new")
    return parse_dump(out)


def tag_batch_file(ids: Sequence[str], change: str) -> str:
    return "".join(f"{change} -- id:{quote(mid)}\n" for mid in ids)


def sample_ids(env: BenchEnv, n: int) -> list[str]:
    out, _ = env.notmuch("search", "--output=messages", "--exclude=false", f"--limit={n}",
                         "folder:work/INBOX OR folder:home/INBOX")
    return [line.removeprefix("id:") for line in out.splitlines() if line]


def same_deliveries(ws: Workspace, env: BenchEnv, messages: Sequence[corpus.Message],
                    skip: frozenset[str], runs: int) -> dict[int, list[SameDelivery]]:
    """For each delivery size, ``runs`` rounds of: put the setup back as it was, deliver,
    ``fmail-nm index``; put it back again, deliver the same files, ``notmuch new --no-hooks``,
    then ``fmail-nm hook post-new``.  The order alternates between rounds."""
    snapshot = ws.fresh("snapshot")
    copy_setup(env.base, snapshot)
    out: dict[int, list[SameDelivery]] = {}
    try:
        for count in DELIVERIES:
            for r in range(runs):
                batch = 100  # new-100-*: the same files each round, apart from other deliveries
                got: dict[str, Timing] = {}
                tags: dict[str, dict[str, frozenset[str]]] = {}
                for which in (("index", "bare") if r % 2 == 0 else ("bare", "index")):
                    env.restore(snapshot)
                    if count:
                        deliver(env, messages, skip, count, batch)
                    if which == "index":
                        got["index"] = env.fmail_step("index", "--quiet")[1]
                    else:
                        got["bare"] = env.step(["notmuch", "new", "--no-hooks"])[1]
                        got["hook"] = env.fmail_step("hook", "post-new")[1]
                    tags[which] = delivered_tags(env)
                differ = sum(tags["index"].get(mid) != have for mid, have in tags["bare"].items())
                one = SameDelivery(count, got["index"], got["bare"], got["hook"],
                                   differ + len(tags["index"].keys() - tags["bare"].keys()))
                out.setdefault(count, []).append(one)
                log(f"  {count} new, round {r + 1}/{runs}: fmail-nm index {one.index.wall:.2f} s; "
                    f"notmuch new {one.bare.wall:.2f} s (+ hook {one.hook.wall:.2f} s); "
                    f"index - notmuch new = {one.extra:+.2f} s")
    finally:
        shutil.rmtree(snapshot)
    return out


def incremental(ws: Workspace, env: BenchEnv, messages: Sequence[corpus.Message],
                skip: frozenset[str], runs: int = 3) -> Incremental:
    log(f"incremental: fmail-nm index vs notmuch new for the same delivery of "
        f"{', '.join(map(str, DELIVERIES))} messages")
    deliveries = same_deliveries(ws, env, messages, skip, runs)
    ids = sample_ids(env, 1000)
    tags, tag_syncs, flags, flag_syncs = [], [], [], []
    for i in range(runs):
        log(f"incremental: notmuch tag on {len(ids)} messages + sidecar sync (round {i + 1}/{runs})")
        tags.append(env.notmuch("tag", "--batch", stdin=tag_batch_file(ids, f"+bench{i}"))[1])
        tag_syncs.append(env.fmail_step("sidecar", "sync")[1])
        # flagged maps to the F flag: every file is renamed, the sidecar sees new file names
        flags.append(env.notmuch("tag", "--batch",
                                 stdin=tag_batch_file(ids, "-flagged" if i % 2 else "+flagged"))[1])
        flag_syncs.append(env.fmail_step("sidecar", "sync")[1])
    return Incremental(deliveries, median_timing(tags), median_timing(tag_syncs),
                       median_timing(flags), median_timing(flag_syncs))


# ---------------------------------------------------------------------------------------------
# Same final tags


def tag_dump(env: BenchEnv) -> str:
    """``notmuch dump --include=tags``, the message lines sorted (comment lines first)."""
    out, _ = env.notmuch("dump", "--include=tags")
    lines = out.splitlines()
    return "\n".join([line for line in lines if line.startswith("#")]
                     + sorted(line for line in lines if line and not line.startswith("#"))) + "\n"


_DUMP_LINE = re.compile(r"^\s*((?:\+\S+\s+)*)-- (.*)$")  # +tag +tag -- id:<message-id>


def parse_dump(text: str) -> dict[str, frozenset[str]]:
    """Message id (as the dump writes it) -> tags, from a ``batch-tag`` dump."""
    tags: dict[str, frozenset[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _DUMP_LINE.match(line)
        if match is None:
            raise ValueError(f"not a batch-tag dump line: {line!r}")
        tags[match.group(2).removeprefix("id:")] = frozenset(
            unquote(op[1:]) for op in match.group(1).split())
    return tags


@dataclass
class TagDiff:
    reference: str
    current: str
    messages_reference: int  # messages in the dump (all of them, tagged or not)
    messages_current: int
    differing: int  # messages whose tags are not the same (or that only one dump has)
    only_in_reference: int
    only_in_current: int
    by_tag: dict[str, dict[str, int]]  # tag -> messages that have it only in the reference / current
    examples: list[str]
    reference_init: Timing | None = None  # `fmail-nm init` of the reference, when run here
    current_init: Timing | None = None


def compare_dumps(reference: str, current: str, ref_label: str, cur_label: str,
                  examples: int = 5) -> TagDiff:
    ref, cur = parse_dump(reference), parse_dump(current)
    differing = sorted(mid for mid in ref.keys() | cur.keys()
                       if ref.get(mid, frozenset()) != cur.get(mid, frozenset()))
    by_tag: dict[str, dict[str, int]] = {}
    for mid in differing:
        before, after = ref.get(mid, frozenset()), cur.get(mid, frozenset())
        for tag in before - after:
            by_tag.setdefault(tag, {"only_reference": 0, "only_current": 0})["only_reference"] += 1
        for tag in after - before:
            by_tag.setdefault(tag, {"only_reference": 0, "only_current": 0})["only_current"] += 1
    shown = []
    for mid in differing[:examples]:
        if mid not in ref or mid not in cur:
            side = "current" if mid not in ref else "reference"
            only = ref.get(mid, cur.get(mid, frozenset()))
            shown.append(f"id:{mid}: only in the {side} dump ({' '.join(sorted(only))})")
        else:
            was, now = ref[mid], cur[mid]
            change = [f"-{t}" for t in sorted(was - now)] + [f"+{t}" for t in sorted(now - was)]
            shown.append(f"id:{mid}: {' '.join(change)} (reference: {' '.join(sorted(was))})")
    return TagDiff(ref_label, cur_label, len(ref), len(cur), len(differing),
                   len(ref.keys() - cur.keys()), len(cur.keys() - ref.keys()),
                   dict(sorted(by_tag.items())), shown)


def extract_code(ref: str, dest: Path) -> str:
    """Extract ``fmail_nm`` and ``hooks`` (as ``fmail_nm.hooks``) of a git ref into ``dest``;
    returns the commit id."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                            capture_output=True, text=True, check=True,
                            timeout=CLI_TIMEOUT).stdout.strip()
    data = subprocess.run(["git", "-C", str(REPO), "archive", commit, "fmail_nm", "hooks"],
                          capture_output=True, check=True, timeout=CLI_TIMEOUT).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    (dest / "hooks").rename(dest / "fmail_nm" / "hooks")
    compile_like_an_install(dest / "fmail_nm")
    return commit


def compile_like_an_install(package: Path) -> None:
    """Byte-compile the code measured, as ``pip install`` does: without it every ``fmail-nm``
    process (and the hook) would compile its modules afresh -- ~50 ms a start here -- which
    no installed copy pays.  PYTHONDONTWRITEBYTECODE, if set, is ignored by ``compileall``."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True,
                   capture_output=True, timeout=CLI_TIMEOUT)


def dump_header(size: str, label: str, messages: int, left_out: int) -> str:
    return (f"# fmail-nm bench tags: size={size} messages={messages} left_out={left_out} "
            f"code={label}\n")


def dump_size(text: str) -> str | None:
    match = re.search(r"^# fmail-nm bench tags: size=(\S+)", text, re.MULTILINE)
    return match.group(1) if match else None


@dataclass
class TagSpec:
    """What ``--compare-tags`` names: a saved dump (file, or directory of ``tags-<size>-*``
    dumps), or a git ref to index the tree with."""

    value: str
    ref_code: Path | None = None  # the ref's extracted code, once extracted
    commit: str | None = None

    def saved_dump(self, size: str) -> Path | None:
        path = Path(self.value)
        if path.is_file():
            return path
        if path.is_dir():
            found = sorted(path.glob(f"tags-{size}-*.dump"))
            if len(found) != 1:
                raise SystemExit(f"--compare-tags {path}: expected one tags-{size}-*.dump there, "
                                 f"found {len(found)}")
            return found[0]
        return None


def compare_tags(ws: Workspace, tree: Path, size: Size, spec: TagSpec, *,
                 current: str | None, cur_label: str, left_out: int,
                 dump_dir: Path | None) -> tuple[TagDiff, str]:
    """Index ``tree`` with the reference (unless ``spec`` is a saved dump) and, unless
    ``current`` is given already, with the code measured; compare the tags.  Returns the
    comparison and the current dump (with its header line)."""
    current_init = None
    if current is None:
        env = BenchEnv.create(ws.fresh("tags-current"), tree)
        log(f"tags: fmail-nm init with {cur_label}")
        _, current_init = env.fmail_step(*env.init_args())
        log(f"  fmail-nm init {current_init}")
        current = dump_header(size.name, cur_label, env.count(), left_out) + tag_dump(env)
        shutil.rmtree(env.base)
    reference_init = None
    saved = spec.saved_dump(size.name)
    if saved is not None:
        reference = saved.read_text(encoding="utf-8")
        ref_label = str(saved)
        if dump_size(reference) not in (None, size.name):
            log(f"  warning: {saved} is a dump of size {dump_size(reference)}, not {size.name}")
    else:
        if spec.ref_code is None:
            spec.ref_code = ws.root / "ref-code"
            spec.commit = extract_code(spec.value, spec.ref_code)
        commit = spec.commit or "?"
        ref_label = f"commit {commit[:10]} ({spec.value})"
        env = BenchEnv.create(ws.fresh("tags-reference"), tree, code=spec.ref_code)
        log(f"tags: fmail-nm init with {ref_label}")
        _, reference_init = env.fmail_step(*env.init_args())
        log(f"  fmail-nm init {reference_init}")
        reference = dump_header(size.name, ref_label, env.count(), left_out) + tag_dump(env)
        shutil.rmtree(env.base)
        if dump_dir is not None:
            save_dump(dump_dir, size.name, commit[:10], reference)
    diff = compare_dumps(reference, current, ref_label, cur_label)
    diff.reference_init, diff.current_init = reference_init, current_init
    return diff, current


def save_dump(dump_dir: Path, size: str, slug: str, text: str) -> Path:
    dump_dir.mkdir(parents=True, exist_ok=True)
    path = dump_dir / f"tags-{size}-{slug}.dump"
    path.write_text(text, encoding="utf-8")
    log(f"wrote the tag dump {path}")
    return path


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
    list_threads: dict[str, Latency] = field(default_factory=dict)
    unanswered: Latency | None = None  # find_unanswered_threads, 20
    # libnotmuch alone, for each search: its count and its newest 50 ids, one after the
    # other, on a handle of its own -- what a page whose ids, order and total come from
    # notmuch costs before any fmail-nm code runs.
    notmuch_floor: dict[str, Latency] = field(default_factory=dict)
    # ... and its count alone: the least any exact total of the search costs.
    notmuch_count: dict[str, Latency] = field(default_factory=dict)
    # The second page of each search (50) and thread listing (20), by its cursor: a later
    # page checks that the item before it is still there (reads._resumed_page).
    later_pages: dict[str, Latency] = field(default_factory=dict)


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


def notmuch_page(db: Any, query: str, exclude_tags: Sequence[str], limit: int = 50
                 ) -> tuple[int, list[str]]:
    """The total and the newest ``limit`` ids of a notmuch query, from libnotmuch alone."""
    import notmuch2
    total = db.count_messages(query, exclude_tags=exclude_tags)
    ids = []
    for message in db.messages(query, exclude_tags=exclude_tags,
                               sort=notmuch2.Database.SORT.NEWEST_FIRST):
        ids.append(message.messageid)
        if len(ids) == limit:
            break
    return total, ids


def notmuch_floor(queries: Mapping[str, tuple[str, Sequence[str]]], n: int
                  ) -> tuple[dict[str, Latency], dict[str, Latency]]:
    """notmuch_page's latency for each search (its notmuch query and exclusions), and that
    of its count alone."""
    import notmuch2
    db = notmuch2.Database(mode=notmuch2.Database.MODE.READ_ONLY,
                           config=notmuch2.Database.CONFIG.SEARCH)
    try:
        pages = {q: latencies(partial(notmuch_page, db, nm_query, excl), n)
                 for q, (nm_query, excl) in queries.items()}
        counts = {q: latencies(partial(db.count_messages, nm_query, exclude_tags=excl), n)
                  for q, (nm_query, excl) in queries.items()}
        return pages, counts
    finally:
        db.close()


def reads_in_process(env: BenchEnv, n: int) -> Reads:
    from fmail_nm.store.notmuch import Reader
    from fmail_nm.store.sidecar import sidecar_path
    from fmail_nm.tools import reads

    config = env.config()
    with env.active(), Reader(None) as reader:
        mb = reads.Mailbox(config, reader)
        search, totals, compiled = {}, {}, {}
        nm_queries = {}
        for q in SEARCHES:
            found = reads.search_emails(mb, q, limit=50)
            totals[q], compiled[q] = found.total, found.query
            search[q] = latencies(partial(reads.search_emails, mb, q, limit=50), n)
            dsl = mb.compile(q)
            nm_queries[q] = (reads.scoped_query(mb, dsl), dsl.exclude_tags)
        floor, counted = notmuch_floor(nm_queries, n)
        ids = page_ids(mb, n + 3)
        it = iter(ids * 2)
        got = latencies(lambda: reads.get_email(mb, next(it)), n)
        threads = {q: latencies(partial(reads.list_threads, mb, q, limit=20), n)
                   for q in THREAD_LISTINGS}
        unanswered = latencies(lambda: reads.find_unanswered_threads(mb, limit=20), n)
        later = later_pages(mb, n)
        side = sidecar_path(config.data_dir)  # data_dir follows $XDG_DATA_HOME
    sql, tool, notes = sql_latencies(side, n, [a.name for a in config.accounts])
    return Reads(search, totals, compiled, got, sql, tool, notes, threads, unanswered, floor,
                 counted, later)


def later_pages(mb: Any, n: int) -> dict[str, Latency]:
    """The second page of each search and thread listing that has one, by its cursor."""
    from fmail_nm.tools import reads
    out = {}
    for q in SEARCHES:
        cursor = reads.search_emails(mb, q, limit=50).next_cursor
        if cursor:
            out[f"search_emails {q or '(all)'!r}"] = latencies(
                partial(reads.search_emails, mb, q, limit=50, cursor=cursor), n)
    for q in THREAD_LISTINGS:
        cursor = reads.list_threads(mb, q, limit=20).next_cursor
        if cursor:
            out[f"list_threads {q!r}, 20"] = latencies(
                partial(reads.list_threads, mb, q, limit=20, cursor=cursor), n)
    return out


def sql_latencies(path: Path, n: int, accounts: Sequence[str]
                  ) -> tuple[dict[str, Latency], dict[str, Latency] | None, list[str]]:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        plain = {label: latencies(partial(fetch_all, conn, sql), n)
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
        tool[label] = latencies(partial(sqltools.query_emails, path, sql, known_accounts=accounts), n)
    return plain, tool, notes


# ---------------------------------------------------------------------------------------------
# Over MCP (stdio, Streamable HTTP)


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
    http: dict[str, Latency] = field(default_factory=dict)
    peer: peer.SideBySide | None = None


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
    """Our server through the SDK's client and, up at the same time, through the bare JSON-RPC
    client (:class:`RawStdio`), their calls paired (:func:`timed_pairs`) so that the two
    clients' figures see the same load."""
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=SERVE[1:],
                                   env={**os.environ, **env.env}, cwd=str(env.base))
    bare = RawStdio(env)
    try:
        bare.start()  # before the SDK's server starts: its start-up and RSS are measured alone
        before = child_pids()
        start = time.perf_counter()
        async with Client(params) as client:
            tools = (await client.list_tools()).tools
            startup = time.perf_counter() - start
            server = next(iter(child_pids() - before), None)
            tool_bytes = {t.name: len(t.model_dump_json(exclude_none=True)) for t in tools}

            async def both(tool: str, sdk_args: Callable[[], dict[str, Any]],
                           raw_args: Callable[[], dict[str, Any]]) -> tuple[Latency, Latency]:
                sdk, raw = await timed_pairs(
                    lambda: checked_call(client, tool, sdk_args()),
                    as_async(lambda: bare.request("tools/call",
                                                  {"name": tool, "arguments": raw_args()})), n)
                return Latency.of(sdk), Latency.of(raw)
            search: dict[str, Latency] = {}
            raw: dict[str, Latency] = {}
            for q in SEARCHES[:3]:
                args: Callable[[], dict[str, Any]] = partial(dict, query=q, limit=50)
                search[q], raw[f"search_emails {q or '(all)'!r}"] = await both(
                    "search_emails", args, args)
            # each server process reads each message once, as it would when asked by a model
            sdk_ids, raw_ids = iter(ids), iter(ids)
            got, raw["get_email"] = await both("get_email", lambda: {"id": next(sdk_ids)},
                                               lambda: {"id": next(raw_ids)})
            noop, raw["list_available_accounts"] = await both("list_available_accounts", dict, dict)
            page = await checked_call(client, "search_emails", {"query": "", "limit": 50})
            json_bytes = peer.wire_json_bytes(page.structured_content)
            wire_bytes = len(page.model_dump_json(by_alias=True, exclude_none=True).encode())
            hwm, rss = memory_mib(server) if server else (None, None)
    finally:
        bare.close()
    text_bytes = len(env.notmuch("search", "--format=text", "--output=summary", "--limit=50",
                                 "*")[0].encode())
    return McpResults(search, got, noop, round(startup, 3), hwm, rss, sum(tool_bytes.values()),
                      tool_bytes, json_bytes, wire_bytes, text_bytes, raw)


async def checked_call(client: Any, tool: str, args: dict[str, Any]) -> Any:
    """``tools/call`` with the SDK's client; a tool error raises."""
    result = await client.call_tool(tool, args)
    if result.is_error:
        raise RuntimeError(f"{tool} {args} failed: {result.content}")
    return result


async def http_latencies(env: BenchEnv, n: int, ids: Sequence[str]) -> dict[str, Latency]:
    """Calls of :func:`mcp_session` over Streamable HTTP (``serve --transport http`` on a free
    loopback port, the SDK's client): what the HTTP transport adds per call, which stdio
    cannot show (a Nagle delay on every response once did)."""
    import httpx2
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client

    token, port = secrets.token_urlsafe(32), free_port()
    with tempfile.TemporaryFile() as stderr:
        server = subprocess.Popen([*SERVE_HTTP, "--port", str(port)],
                                  env={**os.environ, **env.env, "FMAIL_TOKEN": token},
                                  cwd=env.base, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_listening(server, port, stderr)
            async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                           timeout=httpx2.Timeout(60.0)) as http,
                        Client(streamable_http_client(f"http://{HTTP_HOST}:{port}/mcp",
                                                      http_client=http)) as client):
                call = partial(checked_call, client)
                it = iter(list(ids) * 2)
                return {
                    "search_emails 'linux'": await async_latencies(
                        partial(call, "search_emails", {"query": "linux", "limit": 50}), n),
                    "get_email": await async_latencies(
                        lambda: call("get_email", {"id": next(it)}), n),
                    "list_available_accounts": await async_latencies(
                        partial(call, "list_available_accounts", {}), n),
                }
        finally:
            server.terminate()
            server.wait(timeout=30)


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HTTP_HOST, 0))
        return int(sock.getsockname()[1])


def wait_listening(server: subprocess.Popen[bytes], port: int, stderr: Any,
                   timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((HTTP_HOST, port), timeout=1).close()
            return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                stderr.seek(0)
                raise RuntimeError(f"serve --transport http did not listen on {port}:\n"
                                   f"{stderr.read().decode('utf-8', 'replace')[-2000:]}") from None
            time.sleep(0.05)


# fmail-nm's server with every tool (the no-op measured, list_available_accounts, is not in the
# default profile).
SERVE = [sys.executable, "-m", "fmail_nm", "serve", "--transport", "stdio", "--tools", "all"]
HTTP_HOST = "127.0.0.1"
SERVE_HTTP = [sys.executable, "-m", "fmail_nm", "serve", "--transport", "http", "--host", HTTP_HOST,
              "--tools", "all"]


class RawStdio:
    """A bare JSON-RPC client on the server's stdio (no SDK, no result validation): what the
    server and the transport cost, without the Python client's own work."""

    def __init__(self, env: BenchEnv) -> None:
        self._open(SERVE, env.env, env.base)

    @classmethod
    def for_argv(cls, argv: list[str], env: dict[str, str], cwd: Path) -> RawStdio:
        """Any stdio MCP server (the peer of bench/peer.py)."""
        client = cls.__new__(cls)
        client._open(argv, env, cwd)
        return client

    def _open(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            argv, env={**os.environ, **env}, cwd=cwd, stdin=subprocess.PIPE,
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


# ---------------------------------------------------------------------------------------------
# The notmuch CLI, for comparison


def cli_latencies(env: BenchEnv, compiled: dict[str, str], n: int) -> dict[str, Latency]:
    out = {}
    for q in SEARCHES[:3]:
        argv = ["notmuch", "search", "--format=json", "--limit=50", compiled[q]]
        out[q] = latencies(partial(env.run, argv, timeout=CLI_TIMEOUT), n, warmup=2)
    return out




# ---------------------------------------------------------------------------------------------
# One size, all of it


@dataclass
class SizeResult:
    size: str
    messages_written: int
    first_index: dict[str, Any] | None
    incremental: dict[str, Any] | None
    incremental_runs: Incremental | None
    reads: Reads | None
    mcp: McpResults | None
    cli: dict[str, Latency] | None
    tags: TagDiff | None
    load_before: str
    load_after: str
    elapsed_s: float


@dataclass
class Plan:
    """What to run, for every size."""

    parts: frozenset[str]
    samples: int
    keep: bool = False
    tags: TagSpec | None = None
    dump_dir: Path | None = None
    code_label: str = ""
    code_slug: str = ""
    reads_on: Path | None = None  # a kept setup to measure the reads on (no tree, no index)


def build_tree(ws: Workspace, size: Size, messages: Sequence[corpus.Message],
               skip: frozenset[str]) -> tuple[Path, int]:
    tree = ws.root / f"tree-{size.name}"
    n = corpus.write_tree(tree, messages, total=size.total, skip=skip)
    log(f"wrote {n} messages ({size.name}) under {tree}; "
        f"{warm_page_cache(tree) / 2**20:.0f} MiB read to warm the page cache")
    return tree, n


def run_size(ws: Workspace, size: Size, messages: Sequence[corpus.Message],
             skip: frozenset[str], plan: Plan) -> SizeResult:
    started = time.perf_counter()
    load_before = load_average()
    env: BenchEnv | None = None
    if plan.reads_on is not None:
        return reads_on_kept(size, plan, load_before, started)
    tree, written = build_tree(ws, size, messages, skip)
    summary = inc = inc_summary = rd = mcp = cli = diff = None
    current_dump = None
    if "index" in plan.parts:
        want_dump = "tags" in plan.parts or plan.dump_dir is not None
        first, env, dump = first_index(ws, tree, size, want_dump=want_dump)
        if dump is not None:
            current_dump = dump_header(size.name, plan.code_label, first.messages, len(skip)) + dump
        summary = first.summary()
        log(f"first index: {json.dumps(to_json(summary))}")
        inc = incremental(ws, env, messages, skip)
        inc_summary = inc.summary()
        log(f"incremental: {json.dumps(to_json(inc_summary))}")
    if "reads" in plan.parts:
        if env is None:
            env = BenchEnv.create(ws.fresh("reads"), tree)
            log("indexing for the reads: fmail-nm init")
            env.fmail_step(*env.init_args())
        rd, mcp, cli = measure_reads(env, plan.samples)
    if "tags" in plan.parts:
        assert plan.tags is not None
        diff, current_dump = compare_tags(ws, tree, size, plan.tags, current=current_dump,
                                          cur_label=plan.code_label, left_out=len(skip),
                                          dump_dir=plan.dump_dir)
        log(f"tags: {diff.differing} of {diff.messages_current} messages differ from "
            f"{diff.reference}")
    if plan.dump_dir is not None and current_dump is not None:
        save_dump(plan.dump_dir, size.name, plan.code_slug, current_dump)
    if env is not None:
        if plan.keep:
            log(f"kept the indexed setup: {env.base} (environment: {json.dumps(env.env)})")
        else:
            shutil.rmtree(env.base)
    if not plan.keep:
        shutil.rmtree(tree)
    return SizeResult(size.name, written, summary, inc_summary, inc, rd, mcp, cli, diff,
                      load_before, load_average(), round(time.perf_counter() - started, 1))


def reads_on_kept(size: Size, plan: Plan, load_before: str, started: float) -> SizeResult:
    """The reads part on a setup an earlier run kept, left as it is: minutes instead of a
    new tree and a first index (at 100k, a quarter of an hour) while the code changes."""
    assert plan.reads_on is not None
    env = BenchEnv.existing(plan.reads_on)
    written = env.count()
    # This machine reclaims the page cache within minutes: a kept setup measured cold reads
    # everything from disk (2x slower at 100k, the mirror's pages included).
    log(f"reads on the kept setup {env.base} ({written} messages); "
        f"{warm_page_cache(env.base) / 2**20:.0f} MiB read to warm the page cache")
    rd, mcp, cli = measure_reads(env, plan.samples)
    return SizeResult(size.name, written, None, None, None, rd, mcp, cli, None,
                      load_before, load_average(), round(time.perf_counter() - started, 1))


def measure_reads(env: BenchEnv, samples: int) -> tuple[Reads, McpResults, dict[str, Latency]]:
    log("reads in-process")
    rd = reads_in_process(env, samples)
    log("MCP over stdio, the SDK's client and a bare JSON-RPC client in turn")
    ids = page_ids_for(env, samples + 3)
    mcp = asyncio.run(mcp_session(env, samples, ids))
    log("MCP over HTTP")
    mcp.http = asyncio.run(http_latencies(env, samples, ids))
    log("notmuch CLI")
    cli = cli_latencies(env, rd.compiled, max(10, samples // 3))
    log(f"side by side with {peer.PEER}")
    mcp.peer = side_by_side(env, rd.compiled, samples)
    return rd, mcp, cli


# The searches of the side-by-side comparison (bench/peer.py), by label.
PEER_SEARCHES = {"word search": "linux", "sender search": "from:garym@canada.com",
                 "one-month range": "after:2002-09-01 before:2002-10-01"}
THREAD_SIZE = 9


def side_by_side(env: BenchEnv, compiled: dict[str, str], n: int) -> peer.SideBySide:
    """fmail-nm and the peer on this setup; the peer searches the notmuch query ours compiles,
    both read the newest message (by Message-ID) and the newest 9-message thread."""
    command = peer.peer_venv(corpus.cache_dir())
    summary = json.loads(env.notmuch("search", "--format=json", "--output=summary", "*")[0])
    thread = next(t["thread"] for t in summary if t["total"] == THREAD_SIZE)
    message_id = env.notmuch("search", "--output=messages", "--limit=1", "*")[0].strip()
    message_id = message_id.removeprefix("id:")
    searches = {label: f"{q}\t{compiled[q]}" for label, q in PEER_SEARCHES.items()}
    reqs = peer.requests(searches, message_id, thread)
    return peer.measure(SERVE, [str(command), "--notmuch-config", env.env["NOTMUCH_CONFIG"]],
                        env.env, env.base, reqs, n)


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


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} MiB"


def index_rows(f: dict[str, Any]) -> list[tuple[str, str]]:
    rss = f["peak_rss_mib"]
    out = [
        ("messages indexed", str(f["messages"])),
        ("bare notmuch new --no-hooks", secs(f["bare_notmuch_new"])),
        ("post-new hook alone (own process)", secs(f["hook"])),
    ]
    out += [(f"  hook: {name}", secs(t)) for name, t in f["hook_steps"].items()]
    out += [
        ("  hook: outside those (start-up, imports, ...)", f"{f['hook_outside_steps_wall']:.2f} s"),
        ("notmuch new + hook", f"{f['notmuch_new_plus_hook_wall']:.2f} s"),
        ("(notmuch new + hook) / bare  [<= 1.25]",
         f"{f['ratio_notmuch_new_plus_hook']}x (cpu {f['ratio_cpu']}x)"),
        ("fmail-nm init end to end", secs(f.get("fmail_init"))),
        ("fmail-nm init / bare  [<= 1.25]",
         f"{f['ratio_init']}x (cpu {f['ratio_init_cpu']}x)" if "ratio_init" in f else "-"),
        ("  init - (notmuch new + hook)", f"{f['init_minus_new_and_hook_wall']:.2f} s"
         if "init_minus_new_and_hook_wall" in f else "-"),
        ("fmail-nm index, empty database (its own first index)", secs(f.get("own_first_index"))),
        ("  / bare  [<= 1.25]", f"{f['ratio_own_first_index']}x "
         f"(cpu {f['ratio_own_first_index_cpu']}x)" if "ratio_own_first_index" in f else "-"),
        ("peak RSS: bare notmuch new", mib(rss["bare_notmuch_new"])),
        ("peak RSS: post-new hook", mib(rss["hook"])),
        ("peak RSS: fmail-nm init (largest process)", mib(rss["fmail_init"])),
        ("peak RSS: fmail-nm index, first (largest process)", mib(rss.get("own_first_index"))),
        ("fmail-nm sidecar rebuild", secs(f["sidecar_rebuild_cli"])),
    ]
    return out


def incremental_rows(inc: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for count in DELIVERIES:
        d = inc[f"{count}_new"]
        what = "nothing new" if count == 0 else f"{count} new"
        out += [
            (f"fmail-nm index, {what}", secs(d["fmail_index"])),
            (f"  {what}: notmuch new --no-hooks, same mail", secs(d["bare_notmuch_new"])),
            (f"  {what}: then the hook alone", secs(d["hook_alone"])),
            (f"  {what}: index - notmuch new  [<= +{INCREMENTAL_TARGET_S} s]",
             f"{d['index_minus_bare_wall']:+.2f} s"
             + ("" if d["within_target"] else " MISSED")),
            (f"  {what}: final tags differ, index vs notmuch new + hook",
             str(d.get("tags_differ", "-"))),
            (f"  {what}: peak RSS index / notmuch new / hook",
             " / ".join(mib(d[k].peak_rss_mib)
                        for k in ("fmail_index", "bare_notmuch_new", "hook_alone"))),
        ]
    out += [
        ("notmuch tag, 1,000 msgs (tag only)", secs(inc["tag_1000"])),
        ("  then fmail-nm sidecar sync (tags)", secs(inc["sync_after_tag_1000"])),
        ("notmuch tag, 1,000 msgs (+/-flagged: renames)", secs(inc["flag_1000"])),
        ("  then fmail-nm sidecar sync (renames)", secs(inc["sync_after_flag_1000"])),
    ]
    return out


def read_rows(r: SizeResult) -> list[tuple[str, str]]:
    assert r.reads is not None and r.mcp is not None and r.cli is not None
    out = []
    for q, lat in r.reads.search.items():
        out.append((f"in-process search_emails {q or '(all)'!r} [total]",
                    f"{ms(lat)} [{r.reads.totals[q]}]"))
    for q, lat in r.reads.notmuch_floor.items():
        out.append((f"libnotmuch alone: count + newest 50 ids {q or '(all)'!r}", ms(lat)))
    for q, lat in r.reads.notmuch_count.items():
        out.append((f"libnotmuch alone: count {q or '(all)'!r}", ms(lat)))
    out.append(("in-process get_email  [< 4 ms]", ms(r.reads.get_email)))
    for q, lat in r.reads.list_threads.items():
        out.append((f"in-process list_threads {q!r}, 20", ms(lat)))
    if r.reads.unanswered is not None:
        out.append(("in-process find_unanswered_threads, 20", ms(r.reads.unanswered)))
    for label, lat in r.reads.later_pages.items():
        out.append((f"in-process page 2: {label}", ms(lat)))
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
    for label, lat in r.mcp.http.items():
        out.append((f"MCP over HTTP {label}", ms(lat)))
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
        *(r.mcp.peer.rows() if r.mcp.peer is not None else []),
    ]
    return out


def rows(r: SizeResult) -> list[tuple[str, str]]:
    out = [("messages written", str(r.messages_written))]
    if r.first_index is not None:
        out += index_rows(r.first_index)
    if r.incremental is not None:
        out += incremental_rows(r.incremental)
    if r.reads is not None:
        out += read_rows(r)
    if r.tags is not None:
        out += [("tags: messages differing from the reference", str(r.tags.differing)),
                ("tags: init of the reference", secs(r.tags.reference_init))]
    out += [
        ("load average before / after", f"{r.load_before} / {r.load_after}"),
        ("time for this size", f"{r.elapsed_s:.0f} s"),
    ]
    return out


def print_table(results: Sequence[SizeResult]) -> None:
    columns = [dict(rows(r)) for r in results]
    labels = list(dict.fromkeys(label for r in results for label, _ in rows(r)))
    width = max(len(label) for label in labels)
    header = f"{'(wall s (cpu s) | ms p50 / p95)':<{width}}  " + "  ".join(
        f"{r.size:>24}" for r in results)
    print(header)
    print("-" * len(header))
    for label in labels:
        print(f"{label:<{width}}  " + "  ".join(f"{c.get(label, '-'):>24}" for c in columns))


def print_tags(results: Sequence[SizeResult]) -> None:
    for r in results:
        d = r.tags
        if d is None:
            continue
        print(f"\nsame final tags ({r.size}): {d.current}\n  against {d.reference}: "
              f"{d.differing} message(s) differ ({d.messages_reference} / {d.messages_current} "
              f"messages in the dumps; only in the reference {d.only_in_reference}, only in the "
              f"current {d.only_in_current})")
        for tag, n in d.by_tag.items():
            print(f"  {tag}: only in the reference on {n['only_reference']}, "
                  f"only in the current on {n['only_current']}")
        for example in d.examples:
            print(f"  e.g. {example}")


def snapshot_code(ref: str, dest: Path) -> str:
    """Extract ``fmail_nm`` and ``hooks`` of a git ref into ``dest`` (see :func:`extract_code`),
    put ``dest`` first on the import path of this process and its children; returns the
    commit id."""
    if "fmail_nm" in sys.modules:
        raise RuntimeError("fmail_nm was imported before the snapshot was put on the path")
    commit = extract_code(ref, dest)
    sys.path.insert(0, str(dest))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(dest), *STARTUP_PYTHONPATH])
    return commit


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT, check=False).stdout.strip()


def code_version() -> tuple[str, str]:
    """Which fmail_nm is measured: the checkout's commit and its uncommitted files, or a path;
    and a short name for file names."""
    import fmail_nm
    where = Path(fmail_nm.__file__).resolve().parent
    if where.parent != REPO:
        return str(where), "other"
    head = _git("rev-parse", "--short", "HEAD")
    dirty = _git("status", "--short", "fmail_nm", "hooks").replace("\n", ", ")
    label = f"working tree at {head}" + (f" + {dirty}" if dirty else "")
    return label, f"worktree-{head}" + ("-dirty" if dirty else "")


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


def parse_parts(only: str | None, compare: bool) -> frozenset[str]:
    if only is None:  # a tag comparison alone is its own job; otherwise everything but it
        return frozenset({"tags"} if compare else {"index", "reads"})
    parts = frozenset(p.strip() for p in only.split(",") if p.strip())
    unknown = parts - set(PARTS)
    if unknown or not parts:
        raise SystemExit(f"--only: expected a comma-separated list of {', '.join(PARTS)}")
    if "tags" in parts and not compare:
        raise SystemExit("--only tags needs --compare-tags REF")
    return parts | ({"tags"} if compare else set())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="6k,20k", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--only", metavar="PARTS",
                        help=f"comma-separated, of {', '.join(PARTS)} (default: index,reads; "
                             f"with --compare-tags alone: tags)")
    parser.add_argument("--samples", type=int, default=50, help="calls per latency measurement")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--keep-crashers", action="store_true",
                        help="keep the messages that crash the post-new hook (see bench.corpus)")
    parser.add_argument("--workdir", type=Path, help="where to build (default: a temp dir, removed)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the last indexed setup of each size (needs --workdir)")
    parser.add_argument("--reads-on", metavar="DIR", type=Path,
                        help="measure the reads on a setup kept by an earlier --keep run (its "
                             "NN-reads or NN-… directory) instead of building one; with "
                             "--only reads and one size")
    parser.add_argument("--code", metavar="REF",
                        help="measure this git commit of fmail_nm instead of the working tree")
    parser.add_argument("--compare-tags", metavar="REF|DUMP",
                        help="index the same tree with this git commit's fmail_nm too (or take "
                             "a dump saved by --dump-tags: a file, or the directory) and compare "
                             "notmuch dump --include=tags with the code measured")
    parser.add_argument("--dump-tags", metavar="DIR", type=Path,
                        help="write the sorted tag dumps (tags-<size>-<code>.dump) here")
    args = parser.parse_args(argv)
    if args.keep and not args.workdir:
        parser.error("--keep needs --workdir (the default temp dir is removed)")
    parts = parse_parts(args.only, args.compare_tags is not None)
    sizes = [SIZES[s.strip()] for s in args.sizes.split(",") if s.strip()]
    if args.reads_on and (parts != {"reads"} or len(sizes) != 1):
        parser.error("--reads-on needs --only reads and one size (the kept setup's)")
    if args.compare_tags and Path(args.compare_tags).is_file() and len(sizes) > 1:
        parser.error("--compare-tags FILE compares one size; give the directory for several")
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        root = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fmail-bench-")))
        root.mkdir(parents=True, exist_ok=True)
        if args.code:
            commit = snapshot_code(args.code, root / "code")
            code, slug = f"commit {commit[:10]} ({args.code})", commit[:10]
        else:
            code, slug = code_version()
            compile_like_an_install(REPO / "fmail_nm")
        log(f"measuring fmail_nm from {code}; parts: {', '.join(sorted(parts))}")
        messages = corpus.load_messages(corpus.corpus_dir())
        skip = frozenset() if args.keep_crashers else corpus.crashers(messages)
        if skip:
            log(f"left out {len(skip)} message(s) that crash the post-new hook: "
                f"{', '.join(sorted(skip))}")
        ws = Workspace(root)
        plan = Plan(parts, args.samples, args.keep,
                    TagSpec(args.compare_tags) if args.compare_tags else None,
                    args.dump_tags, code, slug, args.reads_on)
        results = [run_size(ws, size, messages, skip, plan) for size in sizes]
    info = {**machine(), "code": code, "parts": ",".join(sorted(parts))}
    print(f"\nfmail-nm benchmarks: {info['cpus']} x {info['cpu_model']}, {info['notmuch']}, "
          f"Python {info['python']}; fmail_nm: {code}; {time.perf_counter() - started:.0f} s in all\n")
    print_table(results)
    print_tags(results)
    for r in results:
        for note in r.reads.notes if r.reads else []:
            print(f"note ({r.size}): {note}")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "left_out": sorted(skip),
                                         "seconds": round(time.perf_counter() - started, 1),
                                         "results": to_json(results)}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
