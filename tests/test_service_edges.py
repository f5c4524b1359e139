"""The always-on service and the HTTP transport where setups differ: a symlinked account
folder, a mail root replaced or moved away, a shutdown during a hanging send, a client through a tunnel.
Real parts: the watcher, notmuch, msmtp, uvicorn and the SDK's client."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

import anyio
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import TextContent

from fmail_nm.mcp import server as server_module
from fmail_nm.mcp.http import serve_http
from fmail_nm.mcp.serving import serving
from fmail_nm.passes.changes import WriteContext
from fmail_nm.service import send
from fmail_nm.service import watcher
from fmail_nm.service.background import Background
from fmail_nm.service.status import StatusStore
from fmail_nm.store import sidecar
from fmail_nm.store.notmuch import Reader, Writer
from fmail_nm.store.query import clean_id

from .conftest import MailEnv, notmuch_lock_held
from .imapbed import HOST, free_port
from .smtpbed import SmtpBed
from .test_background import FAST, WAIT, deliver, known, service, wait_for  # noqa: F401
from .test_http import TOKEN, authed_client, make_server
from .test_http import serving as serving_http
from .test_send import PERSONAL, configure
from .test_server import wait_for_port


def test_mail_delivered_into_a_symlinked_folder_is_indexed(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    """An account folder kept on another disk and linked into the mail root: notmuch new (and
    fmail-nm's folder listing) follow the link, so the watcher must too -- else new mail there
    waits for the safety index (15 minutes by default) while the status says "inotify"."""
    work = indexed.mail_root / "work"
    elsewhere = indexed.base / "other-disk" / "work"
    elsewhere.parent.mkdir()
    shutil.move(work, elsewhere)
    work.symlink_to(elsewhere, target_is_directory=True)
    indexed.notmuch("new")
    assert indexed.notmuch("count", "folder:work/INBOX").stdout.strip() != "0"  # still indexed

    bg = service()
    assert bg.watch_mode == "inotify"
    deliver(work / "INBOX", "via-link@example.net", "delivered through a link")

    wait_for(lambda: known("via-link@example.net"), "the message in the linked folder")


@pytest.mark.anyio
async def test_stopping_while_a_send_hangs_still_stops_the_background_service(
        indexed: MailEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server is stopped (SIGTERM, the client quits) while send_email waits on an SMTP
    server that never answers (the send's own limit is minutes): the shutdown must still stop
    the watcher, flush pushes and mark the status stopped -- not give up half-way with a
    TimeoutError that skips all of that."""
    monkeypatch.setattr(server_module, "CLOSE_TIMEOUT", 2)  # 40 s in use
    smtp = SmtpBed(tmp_path / "smtp", PERSONAL).start()
    smtp.stop()  # its msmtprc stays; a server that accepts and never greets takes the port
    silent = socket.create_server((HOST, smtp.port))
    silent.settimeout(WAIT)
    configure(indexed, smtp, direct=True, timeout_seconds=900)
    config = indexed.config()
    served = serving(config, read_only=False, push=False, watch=True)
    server = served.__enter__()
    try:
        async with Client(server) as client, anyio.create_task_group() as tg:
            tg.start_soon(lambda: client.call_tool("send_email", {
                "to": ["bob@example.com"], "subject": "stalled", "body": "hello"}))
            conn, _ = await anyio.to_thread.run_sync(silent.accept)  # msmtp is waiting now
            try:
                await anyio.to_thread.run_sync(served.__exit__, None, None, None)
            finally:
                conn.close()  # msmtp fails at once; the tool call ends
    finally:
        silent.close()
    status = StatusStore(config.data_dir).load()
    assert status is not None and not status.service.running


# A server process with a short close deadline (40 s in use), for a shutdown that must
# end the process once it is past that deadline.
QUICK_CLOSE_SERVER = ("import sys; from fmail_nm.mcp import server; server.CLOSE_TIMEOUT = 2; "
                      "from fmail_nm.cli import main; sys.exit(main(sys.argv[1:]))")
SEND_HELLO = {"to": ["bob@example.com"], "subject": "stalled", "body": "hello"}


def exit_status(proc: subprocess.Popen[str]) -> int:
    """The exit status of a server process told to stop; fails if it lives on well past its
    shutdown's bound (a few seconds here)."""
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the server process still runs long after its shutdown's deadline")


def quick_stdio_server(env: MailEnv, tool: str, arguments: dict[str, Any]) -> subprocess.Popen[str]:
    """A stdio server process (QUICK_CLOSE_SERVER) asked to run ``tool``, over raw JSON-RPC:
    the SDK's client kills its server 2 s after closing stdin, which would hide a hang."""
    proc = subprocess.Popen([sys.executable, "-c", QUICK_CLOSE_SERVER, "serve", "--transport",
                             "stdio", "--no-push"], env={**os.environ, **env.env},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdin is not None
    for message in ({"id": 1, "method": "initialize", "params": {
                        "protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "raw", "version": "0"}}},
                    {"method": "notifications/initialized"},
                    {"id": 2, "method": "tools/call", "params": {
                        "name": tool, "arguments": arguments}}):
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        proc.stdin.flush()
    return proc


def lines_until(stream: IO[str], text: str) -> str:
    """What ``stream`` says up to its first line holding ``text``, or to its end."""
    said = ""
    for line in stream:
        said += line
        if text in line:
            break
    return said


@pytest.mark.parametrize("stop", ["end of stdin", "SIGTERM"])
def test_a_server_process_waits_for_a_send_under_way_and_files_it(
        indexed: MailEnv, tmp_path: Path, stop: str) -> None:
    """The client closes stdin (or sends SIGTERM) while send_email waits for a slow SMTP
    server's answer to the message -- past the shutdown's deadline for tool calls, within the
    send's own limit: the process waits for the send and files it (its "sent already"
    record, the draft out of Drafts) before it ends.  Ended without it, msmtp (in a session
    of its own) delivered the message all the same and the draft stayed in Drafts."""
    smtp = SmtpBed(tmp_path / "smtp", PERSONAL).start()
    configure(indexed, smtp, direct=True, timeout_seconds=900)
    smtp.release.clear()
    proc = quick_stdio_server(indexed, "send_email", SEND_HELLO)
    assert proc.stdin is not None and proc.stderr is not None
    try:
        assert smtp.arrived.wait(WAIT)  # msmtp waits for the answer to the message now
        if stop == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            proc.stdin.close()
        said = lines_until(proc.stderr, "send(s) under way")  # the tool calls' deadline passed
        smtp.release.set()
        assert exit_status(proc) == (128 + signal.SIGTERM if stop == "SIGTERM" else 0)
        (received,) = wait_for(lambda: list(smtp.received), "the message to be taken")
    finally:
        smtp.release.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        smtp.stop()
    said += proc.stderr.read()
    mid = clean_id(str(received.message()["Message-ID"]))
    with sidecar.opened(sidecar.sidecar_path(indexed.config().data_dir)) as conn:
        assert sidecar.sent_at(conn, mid) is not None, said
    files = indexed.notmuch("search", "--output=files", f"id:{mid}").stdout.split()
    assert files and not any("Drafts" in name for name in files), files
    assert "a tool call was still running at shutdown" in said
    assert "Traceback" not in said


def test_a_send_whose_server_process_was_killed_is_not_sent_again_unless_asked(
        indexed: MailEnv, tmp_path: Path) -> None:
    """The server process is killed (SIGKILL: systemd's stop timeout) while msmtp waits for
    the SMTP server's answer to the message: msmtp, in a session of its own, delivers it, and
    the draft stays in Drafts, unfiled.  send_email of that draft is refused, saying it may
    have gone out; with resend_unfinished (the user checked) it goes."""
    smtp = SmtpBed(tmp_path / "smtp", PERSONAL).start()
    configure(indexed, smtp, direct=True, timeout_seconds=900)
    smtp.release.clear()
    proc = quick_stdio_server(indexed, "send_email", SEND_HELLO)
    try:
        assert smtp.arrived.wait(WAIT)  # msmtp waits for the answer to the message now
        proc.kill()
        proc.wait()
        smtp.release.set()
        (received,) = wait_for(lambda: list(smtp.received), "the message to be taken")
        mid = clean_id(str(received.message()["Message-ID"]))
        config = indexed.config()
        with Reader(config.settings.notmuch_config) as reader, \
                Writer(config.settings.notmuch_config) as writer:
            ctx = WriteContext(config, reader, writer, sidecar.sidecar_path(config.data_dir))
            with pytest.raises(send.SendRefused, match="may have gone out") as refused:
                send.send_draft(ctx, mid)
            assert "Sent folder" in str(refused.value)
            assert "resend_unfinished" in str(refused.value) and len(smtp.received) == 1
            done = send.send_draft(ctx, mid, resend_unfinished=True)
        assert done.sent is True and len(smtp.received) == 2
        assert clean_id(str(smtp.received[1].message()["Message-ID"])) == mid
    finally:
        smtp.release.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        smtp.stop()


def pipe_opened_by_reader(path: Path) -> int:
    """Our writing end of the pipe at ``path``, once a reader has opened it."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def hung_file(env: MailEnv) -> tuple[str, Path]:
    """A message (its id) whose file is a pipe no one writes, as a file on a hung network
    file system: a read of it never returns."""
    found = env.notmuch("search", "--output=messages", "--limit=1", "*").stdout.strip()
    path = Path(env.notmuch("search", "--output=files", found).stdout.splitlines()[0])
    path.unlink()
    os.mkfifo(path)
    return found.removeprefix("id:"), path


def test_a_server_process_ends_after_its_shutdown_while_a_read_never_returns(
        indexed: MailEnv) -> None:
    """A read with no bound at all: get_email's read of a hung file never returns -- and
    the process still ends once its shutdown has run."""
    found, path = hung_file(indexed)
    proc = quick_stdio_server(indexed, "get_email", {"id": found})
    assert proc.stdin is not None and proc.stderr is not None
    try:
        writing = pipe_opened_by_reader(path)  # the read thread has it open: it waits now
        try:
            proc.stdin.close()
            assert exit_status(proc) == 0
        finally:
            os.close(writing)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "a tool call was still running at shutdown" in proc.stderr.read()


@pytest.mark.anyio
async def test_the_service_ends_after_its_stop_while_a_read_never_returns(
        indexed: MailEnv, tmp_path: Path) -> None:
    """An HTTP server process stopped (SIGTERM, as systemd stops `fmail-nm run`; served
    without watching, whose first index would drop the hung file) while get_email's read of
    a hung file never returns: the process ends once its bounded shutdown has run, as a
    clean stop -- not at systemd's SIGKILL after the stop timeout."""
    port = free_port()
    log_file = tmp_path / "service.log"
    found, path = hung_file(indexed)
    with log_file.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-c", QUICK_CLOSE_SERVER, "serve",
                                 "--transport", "http", "--port", str(port), "--no-push"],
                                env={**os.environ, **indexed.env, "FMAIL_TOKEN": TOKEN},
                                stdout=log, stderr=log, text=True)
        try:
            await anyio.to_thread.run_sync(wait_for_port, proc, port)
            async with authed_client() as http, Client(streamable_http_client(
                    f"http://127.0.0.1:{port}/mcp", http_client=http)) as client, \
                    anyio.create_task_group() as tg:
                async def read() -> None:
                    with suppress(Exception):  # no answer: the stop cuts the call
                        await client.call_tool("get_email", {"id": found})
                tg.start_soon(read)
                writing = await anyio.to_thread.run_sync(pipe_opened_by_reader, path)
                try:  # the read thread has the file open: it waits now
                    proc.send_signal(signal.SIGTERM)
                    status = await anyio.to_thread.run_sync(exit_status, proc)
                finally:
                    os.close(writing)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert status == 0
    assert "a tool call was still running at shutdown" in log_file.read_text()


def test_closing_leaves_attachment_reads_past_its_deadline_to_finish(
        shared_indexed: MailEnv, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Attachment reads run on threads of their own (a PDF's reader can take seconds).
    Closing waited for them without a bound: past CLOSE_TIMEOUT, which the shutdown's bound
    and systemd's stop timeout count on.  They only read, so those still running at the
    deadline are left to finish and those not begun are dropped."""
    monkeypatch.setattr(server_module, "CLOSE_TIMEOUT", 1)
    _, service = server_module.build_server(shared_indexed.config())
    release = threading.Event()
    began: list[int] = []

    def read(n: int) -> None:  # an attachment read that lasts until the test releases it
        began.append(n)
        release.wait(120)

    def ask(n: int) -> threading.Thread:  # as a tool call does, from a loop of its own
        def call() -> None:
            with suppress(asyncio.CancelledError):
                asyncio.run(service.beside(read, n))
        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        return thread
    callers = [ask(1), ask(2)]
    while len(began) < 2:  # both side threads busy
        time.sleep(0.01)
    callers.append(ask(3))  # queued behind them
    closer = threading.Thread(target=service.close, daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="fmail_nm.mcp.server"):
            closer.start()
            closer.join(60)
            assert not closer.is_alive(), "closing waits for the attachment reads"
    finally:
        release.set()
        closer.join(60)
    for caller in callers:
        caller.join(60)
    assert sorted(began) == [1, 2]  # the one not begun was dropped
    assert "an attachment read was still running at shutdown" in caplog.text


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _forward(listener: socket.socket, target: tuple[str, int]) -> None:
    """What ``ssh -L <port>:127.0.0.1:<target port>`` does on this end: relay each connection."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:  # closed: the tunnel is down
            return
        upstream = socket.create_connection(target)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


@pytest.mark.anyio
async def test_a_client_through_an_ssh_tunnel_on_another_port_is_served() -> None:
    """The way to reach the loopback-only server from another machine is a tunnel (the
    remote-bind warning says so), e.g. ``ssh -L 9000:127.0.0.1:8765``: the client then sends
    ``Host: 127.0.0.1:9000``.  A loopback address is no DNS-rebinding vector (rebinding needs
    a name the attacker resolves), so its port must not matter -- refusing it with 421 makes
    the tunnel unusable unless both ends happen to use the same port."""
    async with serving_http(make_server()) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        local = free_port()
        listener = socket.create_server((HOST, local))
        threading.Thread(target=_forward, args=(listener, (HOST, port)), daemon=True).start()
        try:
            async with authed_client(TOKEN) as http, Client(streamable_http_client(
                    f"http://{HOST}:{local}/mcp", http_client=http)) as client:
                with anyio.fail_after(WAIT):
                    result = await client.call_tool("echo", {"text": "through the tunnel"})
            text = result.content[0]
            assert not result.is_error and isinstance(text, TextContent)
            assert text.text == "through the tunnel"
        finally:
            listener.close()


def test_mail_is_still_watched_after_the_mail_root_was_replaced(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    """The mail root removed and put back while the service runs (restored from a backup,
    ``rm -rf`` and a fresh copy): inotify's watches went with the old directory, so without
    watching anew no delivery is noticed again -- until the safety index, minutes later --
    while the status still says "inotify"."""
    bg = service()
    root = indexed.mail_root
    backup, old = indexed.base / "backup", indexed.base / "old"
    shutil.copytree(root, backup, symlinks=True)
    root.rename(old)  # the copy takes the old one's place, which is then removed
    backup.rename(root)
    shutil.rmtree(old)
    time.sleep(FAST["watch_quiet"] * 3)  # the events of the removal are handed over ...
    assert bg.wait_idle(WAIT)  # ... and handled: what comes next is a delivery of its own

    deliver(root / "personal" / "INBOX", "after-restore@example.net", "after the restore")

    wait_for(lambda: known("after-restore@example.net"), "the delivery after the restore")
    assert bg.wait_idle(WAIT)
    assert bg.status().index.last_ok


def test_mail_is_still_watched_after_the_mail_root_was_moved_away(
        indexed: MailEnv, service: Callable[..., Background]) -> None:
    """The mail root moved aside and a copy put in its place (``mv ~/Mail ~/Mail.old``):
    inotify tells nothing of the move -- its watches follow the old directory -- so only a
    look at the root itself shows the deliveries now land where nothing watches."""
    bg = service()
    root = indexed.mail_root
    copy, aside = indexed.base / "copy", indexed.base / "aside"
    shutil.copytree(root, copy, symlinks=True)
    root.rename(aside)
    copy.rename(root)
    time.sleep(FAST["poll_interval"] * 3)  # the move is noticed and the root watched again ...
    assert bg.wait_idle(WAIT)  # ... and indexed: what comes next is a delivery of its own

    deliver(root / "personal" / "INBOX", "after-move@example.net", "after the move")

    wait_for(lambda: known("after-move@example.net"), "the delivery after the move")
    assert bg.wait_idle(WAIT)
    assert bg.status().index.last_ok


def _limited_inotify(watches: int) -> list[str] | None:
    """A command prefix that runs a program in a user namespace of its own allowed only
    ``watches`` inotify watches (the per-namespace fs.inotify.max_user_watches), or None
    where user namespaces are not available."""
    prefix = ["unshare", "--user", "--map-root-user", "sh", "-c",
              f'echo {watches} > /proc/sys/user/max_inotify_watches && exec "$@"', "sh"]
    try:
        ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None
    return prefix if ok else None


# `python -m fmail_nm`, trying inotify again each second when it polls for want of watches.
_RETRYING_SOON = ["-c", "import runpy; from fmail_nm.service import watcher; "
                  "watcher.INOTIFY_RETRY = 1.0; runpy.run_module('fmail_nm', run_name='__main__')"]


@contextmanager
def _service_with_watches(env: MailEnv, watches: int, log: Path,
                          program: list[str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """`fmail-nm run` with only ``watches`` inotify watches, its log in ``log``; ``program``
    replaces ``-m fmail_nm``."""
    prefix = _limited_inotify(watches)
    if prefix is None:
        pytest.skip("no user namespaces here to lower the inotify watch limit in")
    with log.open("w") as out:
        proc = subprocess.Popen([*prefix, sys.executable, *(program or ["-m", "fmail_nm"]),
                                 "run", "--port", str(free_port()), "--no-push"],
                                env={**os.environ, **env.env}, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "background service started" in log.read_text()
                 or proc.poll() is not None, "the service to start")
        assert proc.poll() is None, log.read_text()
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


@pytest.mark.parametrize("when", ["at start", "for a folder made later"])
def test_mail_is_found_when_inotify_watches_run_out(
        indexed: MailEnv, tmp_path: Path, when: str) -> None:
    """The inotify watch limit too low for the tree, for real: at start the service says so and
    polls; a folder mbsync makes later that gets no watch (watchdog only logs it) must not
    leave its mail unseen until the safety index, minutes later."""
    folders = watcher.count_dirs(str(indexed.mail_root))
    log = tmp_path / "service.log"
    with _service_with_watches(indexed, folders - 2 if when == "at start" else folders + 1, log):
        fresh = indexed.mail_root / "personal" / "Projects"
        for sub in ("cur", "new", "tmp"):
            (fresh / sub).mkdir(parents=True)
        time.sleep(1.0)  # the folder's watches are tried before the delivery lands
        deliver(fresh, "out-of-watches@example.net", "out of watches")

        wait_for(lambda: known("out-of-watches@example.net"), "the delivery to be indexed")
        assert watcher.WATCH_LIMIT_SYSCTL in log.read_text()
        wait_for(lambda: json.loads(indexed.fmail("status", "--json").stdout)
                 ["service"]["watcher"] == "polling", "the status to say it polls")


def test_the_watcher_goes_back_to_inotify_once_watches_are_free(
        indexed: MailEnv, tmp_path: Path) -> None:
    """Polling for want of inotify watches is not for good: once the limit is raised (here in
    the service's own user namespace), the watcher is back on inotify and sees new mail."""
    if not shutil.which("nsenter"):
        pytest.skip("no nsenter here to raise the limit in the service's user namespace")
    folders = watcher.count_dirs(str(indexed.mail_root))
    log = tmp_path / "service.log"

    def watching() -> str:
        return str(json.loads(indexed.fmail("status", "--json").stdout)["service"]["watcher"])

    with _service_with_watches(indexed, folders - 2, log, _RETRYING_SOON) as proc:
        wait_for(lambda: watching() == "polling", "the status to say it polls")
        subprocess.run(["nsenter", "--user", "--target", str(proc.pid), "sh", "-c",
                        f"echo {folders + 100} > /proc/sys/user/max_inotify_watches"],
                       check=True, timeout=30)

        wait_for(lambda: watching() == "inotify", "the watcher to be back on inotify")
        assert "stopped polling" in log.read_text()
        deliver(indexed.mail_root / "personal" / "INBOX", "back-on-inotify@example.net",
                "after the switch")
        wait_for(lambda: known("back-on-inotify@example.net"), "the delivery to be indexed")


# A watcher polling for want of inotify watches, trying inotify again at once each time; once
# it has tried TRIES times it prints the inotify instances this process holds.
_RETRYING_WATCHER = """
import os, sys, threading, time
from fmail_nm.app import load_config
from fmail_nm.service import watcher
tries, tried = int(sys.argv[1]), threading.Event()
start_native = watcher.MailWatcher._start_native
def counted(self, *args, **kwargs):
    observer = start_native(self, *args, **kwargs)
    counted.n += 1
    if counted.n > tries:
        tried.set()
    return observer
counted.n = 0
watcher.MailWatcher._start_native = counted
watcher.INOTIFY_RETRY = watcher.INOTIFY_RETRY_MAX = 0.0
w = watcher.MailWatcher(load_config(), lambda paths: None, poll_interval=0.05)
w.start()
tried.wait(120)
w.stop()
def inotify(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    except FileNotFoundError:  # the listing's own
        return False
# watchdog closes a stopped instance on its reader's thread, a moment after stop(): one
# left open is one still open after that moment (a second is ample).
deadline = time.monotonic() + 10
while (left := sum(map(inotify, os.listdir("/proc/self/fd")))) and time.monotonic() < deadline:
    time.sleep(0.05)
print(w.mode, left)
"""


_STOPPED_AT_ONCE = """
import os, sys, tempfile, time
from watchdog.events import FileSystemEventHandler
from fmail_nm.service import watcher
def instances():
    def inotify(fd):
        try:
            return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
        except FileNotFoundError:  # the listing's own
            return False
    return sum(map(inotify, os.listdir("/proc/self/fd")))
folder = tempfile.mkdtemp()
for started in (False, True) * 20:
    observer = watcher._native_observer(lambda: None, lambda folder: None)
    observer.schedule(FileSystemEventHandler(), folder, recursive=True)
    if started:
        observer.start()
    observer.stop()
    if started:
        observer.join(5)
deadline = time.monotonic() + 10  # closed on the reader's thread, a moment after stop()
while instances() and time.monotonic() < deadline:
    time.sleep(0.05)
print(instances())
"""


def test_an_inotify_observer_stopped_at_once_keeps_no_inotify_instance() -> None:
    """watchdog 7.1 kept the instance of about one in three observers stopped before their
    reader's first read -- as a try of inotify that ran out of watches is."""
    done = subprocess.run([sys.executable, "-c", _STOPPED_AT_ONCE], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"], done.stderr


def test_tries_of_inotify_that_fail_keep_no_inotify_instance(indexed: MailEnv) -> None:
    """Each try that ran out of watches left its inotify instance (and a reader thread)
    behind: retried for days, the user's instance limit (128 by default) ran out, for every
    program."""
    prefix = _limited_inotify(watcher.count_dirs(str(indexed.mail_root)) - 2)
    if prefix is None:
        pytest.skip("no user namespaces here to lower the inotify watch limit in")
    done = subprocess.run([*prefix, sys.executable, "-c", _RETRYING_WATCHER, "5"],
                          env={**os.environ, **indexed.env}, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["polling", "0"], done.stderr


# A watcher polling for want of inotify watches, made to try inotify again by hand: the limit
# is raised to just the tree, and while the switch is under way a folder is made that gets no
# watch.  Prints whether that was told, the mode once settled, and whether mail delivered to
# the folder then was handed over.
_FOLDER_DURING_SWITCH = """
import os, threading, time
from fmail_nm.app import load_config
from fmail_nm.service import watcher
watcher.INOTIFY_RETRY = watcher.INOTIFY_RETRY_MAX = 10.0**6  # tried by hand only
config = load_config()
root = str(config.mail_root)
fresh = os.path.join(root, "personal", "Projects")
noticed, unwatched = threading.Event(), threading.Event()
def batch(paths):
    if any(str(p).startswith(fresh) for p in paths):
        noticed.set()
w = watcher.MailWatcher(config, batch, quiet=0.1, max_delay=0.5, poll_interval=0.1)
w.start()
assert w.mode == "polling", w.mode
told = w._unwatched
def telling(folder):
    told(folder)
    unwatched.set()
w._unwatched = telling
start_native = w._start_native
def switching(*args, **kwargs):
    del w._start_native  # once
    observer = start_native(*args, **kwargs)
    if observer is not None:  # it watches the whole tree: now a folder it cannot watch
        for sub in ("cur", "new", "tmp"):
            os.makedirs(os.path.join(fresh, sub))
        unwatched.wait(30)
    return observer
w._start_native = switching
with open("/proc/sys/user/max_inotify_watches", "w") as limit:
    limit.write(str(watcher.count_dirs(root) + 1))
w._retry_native()
deadline = time.monotonic() + 30
while (w.mode != "polling" or w._rewatching) and time.monotonic() < deadline:
    time.sleep(0.05)
mode = w.mode
with open(os.path.join(fresh, "tmp", "1.2.host"), "w") as out:
    out.write("Message-ID: <during-switch@example.net>\\n\\nHello.\\n")
os.rename(os.path.join(fresh, "tmp", "1.2.host"), os.path.join(fresh, "new", "1.2.host"))
print(unwatched.is_set(), mode, noticed.wait(30))
w.stop()
"""


def test_a_folder_made_while_inotify_is_tried_again_is_not_left_unwatched(
        indexed: MailEnv) -> None:
    """A folder mbsync makes while polling switches back to inotify, which the new observer
    could not watch: the rewatch it asks for came while the switch was under way, and was
    refused -- the folder stayed unwatched, on inotify, until the safety index."""
    prefix = _limited_inotify(watcher.count_dirs(str(indexed.mail_root)) - 2)
    if prefix is None:
        pytest.skip("no user namespaces here to lower the inotify watch limit in")
    done = subprocess.run([*prefix, sys.executable, "-c", _FOLDER_DURING_SWITCH],
                          env={**os.environ, **indexed.env}, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "polling", "True"], done.stderr


def test_a_server_without_the_background_stops_its_notmuch_new_at_shutdown(
        indexed: MailEnv) -> None:
    """`fmail-nm serve` without --watch re-indexes after a push (notmuch new in a session of
    its own).  Waiting for a lock another program holds when the server stops, that notmuch
    new would index on after the server is gone, running its post-new hook without us."""
    from fmail_nm.service.index import IndexingStopped, reindex_for_write

    from .test_background import _gone, _our_notmuch_new

    config = indexed.config()
    served = serving(config, read_only=False, push=True)
    served.__enter__()
    ended: list[BaseException] = []

    def reindex() -> None:  # what the pusher's after_push does once mbsync ran (_reindex)
        try:
            reindex_for_write(config)
        except BaseException as exc:
            ended.append(exc)
    with notmuch_lock_held() as holder:
        deliver(indexed.mail_root / "personal" / "INBOX", "after-push@example.net")
        reindexing = threading.Thread(target=reindex, daemon=True)
        reindexing.start()
        pid = wait_for(_our_notmuch_new, "the re-index's notmuch new to wait for the lock")
        served.__exit__(None, None, None)
        stopped = _gone(pid)
        holder.release()
    reindexing.join(WAIT)
    assert stopped, "notmuch new outlived the server's shutdown"
    assert len(ended) == 1 and isinstance(ended[0], IndexingStopped), ended
    assert not known("after-push@example.net")  # stopped before it indexed anything


def test_a_reindex_asked_for_after_the_servers_shutdown_does_not_start_notmuch_new(
        indexed: MailEnv) -> None:
    """The shutdown stopped the notmuch new runs going, then ended mbsync: a push hung on a
    silent server, ended so, went on to its re-index (mbsync ran), whose notmuch new started
    after the stop and outlived the server.  No notmuch new starts once the server is shut
    down, as no mbsync does."""
    from fmail_nm.service.index import IndexingStopped, reindex_for_write

    config = indexed.config()
    served = serving(config, read_only=False, push=True)
    served.__enter__()
    served.__exit__(None, None, None)
    deliver(indexed.mail_root / "personal" / "INBOX", "after-shutdown@example.net")
    # what the pusher's thread, left running, does once its mbsync is ended (_reindex)
    with pytest.raises(IndexingStopped):
        reindex_for_write(config)
    assert not known("after-shutdown@example.net")


# A run that waits out its polite signal (until SIGKILL): it writes down that signal and, from
# then on, that it is still alive -- lines the SIGKILL to its session ends.
WAITS_OUT_ITS_STOP = """trap 'echo "{sig} $$" >> "$0"; stopped=1' {sig}
echo "start $$" >> "$0"
while :; do
    sleep 0.05
    if [ -n "${{stopped:-}}" ]; then echo "alive $$" >> "$0"; fi
done
"""


def test_the_servers_last_stops_signal_notmuch_new_and_mbsync_together(
        indexed: MailEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shutdown's last stops end what the bounded waits left running: notmuch new, then
    mbsync (and msmtp checks), each given its own grace one after the other -- two graces in
    the shutdown's bound where one does.  Both kinds are signalled first, then waited for
    against one deadline: the run signalled second is signalled while the first is still
    there."""
    from fmail_nm.service import mbsync
    from fmail_nm.store import notmuch_cli

    monkeypatch.setattr(notmuch_cli, "NEW_STOP_GRACE", 1.0)
    log = tmp_path / "runs.log"
    log.touch()
    served = serving(indexed.config(), read_only=False, push=False)
    served.__enter__()
    runs: list[subprocess.Popen[bytes]] = []
    try:
        # Each stands in for a run of its kind (a notmuch new waiting for a lock, an mbsync
        # hung on a silent server), started and tracked as that kind's runs are.
        new = notmuch_cli.NEW_RUNS.start(["sh", "-c", WAITS_OUT_ITS_STOP.format(sig="INT"),
                                          str(log)], start_new_session=True)
        assert new is not None
        runs.append(new)
        runs.append(mbsync.start_tracked(["sh", "-c", WAITS_OUT_ITS_STOP.format(sig="TERM"),
                                          str(log)], start_new_session=True))
        wait_for(lambda: log.read_text().count("start ") == 2, "both runs to start")
    finally:
        served.__exit__(None, None, None)
        for proc in runs:  # what a failed stop left
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = log.read_text().splitlines()
    stopped = [line for line in lines if line.split()[0] in ("INT", "TERM")]
    assert sorted(line.split()[0] for line in stopped) == ["INT", "TERM"], lines
    first = stopped[0].split()[1]
    # the run signalled first was still there once the second was signalled: not killed yet
    assert lines.index(stopped[1]) < max(i for i, line in enumerate(lines)
                                         if line == f"alive {first}"), lines


@pytest.mark.anyio
async def test_an_http_call_cut_by_the_stops_grace_is_said_in_one_line_not_a_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    """A tool call still running when uvicorn's graceful shutdown is over is cancelled: the
    log says so in one line -- uvicorn logged the cancel's traceback, as if the server had
    failed."""
    held, entered = threading.Event(), threading.Event()
    server = make_server()

    @server.tool()
    async def held_call() -> str:
        """Wait until the test lets go."""
        entered.set()
        await anyio.to_thread.run_sync(held.wait)
        return "done"

    # uvicorn's log has handlers of its own, set as it starts, and does not propagate
    uvicorn_log = logging.getLogger("uvicorn")
    port = free_port()
    ready, stopped, stop = anyio.Event(), anyio.Event(), anyio.CancelScope()
    opened = left = -1

    async def serve() -> None:
        with stop:
            await serve_http(server, host=HOST, port=port, token=TOKEN, ready=ready.set)
        stopped.set()
        held.set()  # the server has stopped: the call's thread may end, and with it the call

    def requests_open() -> list[asyncio.Task[Any]]:  # uvicorn's task for each request
        return [t for t in asyncio.all_tasks() if "run_asgi" in t.get_coro().__qualname__]

    try:
        async with anyio.create_task_group() as outer:
            outer.start_soon(serve)
            with anyio.fail_after(WAIT):
                await ready.wait()
            uvicorn_log.addHandler(caplog.handler)
            with suppress(Exception):  # the client's own end, the server gone: not ours
                async with authed_client() as http, Client(streamable_http_client(
                        f"http://{HOST}:{port}/mcp", http_client=http)) as client, \
                        anyio.create_task_group() as tg:
                    async def call() -> None:
                        with suppress(Exception):  # no answer: the stop cuts the call
                            await client.call_tool("held_call", {})
                    tg.start_soon(call)
                    await anyio.to_thread.run_sync(entered.wait, WAIT)
                    opened = len(requests_open())
                    stop.cancel()
                    with anyio.move_on_after(WAIT):
                        await stopped.wait()
                    tg.cancel_scope.cancel()
            with anyio.move_on_after(WAIT):  # the call cancelled has ended, its log written
                while requests_open():
                    await anyio.sleep(0.05)
            left = len(requests_open())
    finally:
        held.set()
        uvicorn_log.removeHandler(caplog.handler)
    said = [r for r in caplog.records if r.name.startswith("uvicorn")
            and r.levelno >= logging.WARNING]
    assert (opened, left) == (1, 0)
    assert [r.getMessage() for r in said if r.exc_info] == []  # no traceback
    assert [r.getMessage() for r in said] == [
        "stopping: cancelled 1 request(s) still open after the 3 s grace (a tool call still "
        "running, or a client's open stream); their clients get no answer"]
