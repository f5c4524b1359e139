"""`fmail-nm run`, the always-on service, as a real process: mail dropped into the Maildir is
found through its MCP endpoint without any manual step, and SIGTERM leaves everything in step."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from .conftest import MailEnv, notmuch_lock_held, search_rows
from .imapbed import free_port

TOKEN = "run-test-token"
ARRIVAL = b"""From: Dana Fox <dana.fox@example.net>
To: Alex Morgan <alex@example.org>
Subject: Arrived while the service ran
Date: Tue, 01 Dec 2026 09:00:00 +0000
Message-ID: <arrival-1@example.net>

Hello from the watcher test.
"""


@pytest.fixture
def service(indexed: MailEnv) -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fmail_nm", "run", "--port", str(port),
                             "--no-push", "--tools", "all"],
                            env={**os.environ, **indexed.env, "FMAIL_TOKEN": TOKEN},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"service did not start: {proc.stdout.read()}")  # type: ignore[union-attr]
            time.sleep(0.1)
    try:
        yield proc, f"http://127.0.0.1:{port}/mcp"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


async def call(client: Client, tool: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    result = await client.call_tool(tool, args or {})
    assert not result.is_error, result.content
    return result.structured_content  # type: ignore[return-value]


@pytest.mark.anyio
async def test_mail_dropped_into_the_maildir_is_served_and_sigterm_leaves_all_in_step(
        indexed: MailEnv, service: tuple[subprocess.Popen[str], str]) -> None:
    proc, url = service
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"},
                                  timeout=httpx2.Timeout(30.0)) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            status = await call(client, "get_sync_status")
            assert status["running"] is True and status["status"]["service"]["pid"] == proc.pid
            shown = (await client.call_tool("get_sync_status", {})).content[0].text  # type: ignore[union-attr]
            assert shown.startswith(f"fmail-nm service: running (pid {proc.pid}, since ")

            (indexed.mail_root / "personal" / "INBOX" / "new" / "1796300000.1_1.host").write_bytes(ARRIVAL)
            deadline = time.monotonic() + 90
            found: dict[str, Any] = {"total": 0}
            # notmuch new commits the message (tagged "new") before its post-new hook tags it:
            # wait for the whole pipeline, not just the first sight of it.
            def settled(result: dict[str, Any]) -> bool:
                return result["total"] == 1 and "new" not in search_rows(result)[0]["tags"]
            while not settled(found) and time.monotonic() < deadline:
                found = await call(client, "search_emails", {"query": "id:arrival-1@example.net"})
                if not settled(found):
                    time.sleep(0.5)
            assert settled(found), f"the new message was never indexed and tagged: {found}"
            mail = await call(client, "get_email", {"id": search_rows(found)[0]["id"]})
            assert mail["folders"] == ["personal/INBOX"]
            assert "inbox" in search_rows(found)[0]["tags"]  # our tagging pass ran on it
            rows = await call(client, "query_emails", {
                "sql_query": "SELECT subject FROM emails WHERE message_id='arrival-1@example.net'"})
            assert rows["rows"] == [["Arrived while the service ran"]]
            runs = (await call(client, "get_sync_status"))["status"]["index"]["runs"]
            assert runs >= 1

            # An account added to fmail.toml while the service runs: its mail is indexed,
            # the tools know it and the status lists it, without a restart.
            extra = indexed.mail_root / "extra" / "INBOX"
            for sub in ("cur", "new", "tmp"):
                (extra / sub).mkdir(parents=True)
            (extra / "new" / "1796400000.1_1.host").write_bytes(
                ARRIVAL.replace(b"arrival-1@", b"extra-1@"))
            with indexed.fmail_config.open("a") as toml:
                toml.write('\n[[accounts]]\nname = "extra"\naddresses = ["alex@extra.example"]\n'
                           'maildir = "extra"\n\n[accounts.folders]\ninbox = "INBOX"\n')
            deadline = time.monotonic() + 60
            while True:
                names = [a["name"] for a in
                         (await call(client, "list_available_accounts"))["accounts"]]
                found = await call(client, "search_emails", {"query": "in:inbox",
                                                             "account": "extra"}) \
                    if "extra" in names else {"total": 0}
                if found["total"] == 1 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert "extra" in names and found["total"] == 1, (names, found)
            status = (await call(client, "get_sync_status"))["status"]
            assert [a["name"] for a in status["accounts"]] == ["personal", "work", "extra"]

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    stopped = indexed.fmail("status", check=False)
    assert stopped.returncode == 3 and "not running" in stopped.stdout.lower()
    assert indexed.fmail("sidecar", "check").stdout.strip().endswith("sidecar matches notmuch")
    assert "No new mail" in indexed.notmuch("new", "--no-hooks").stdout


def burst_message(n: int) -> bytes:
    return (f"From: Burst Sender <burst{n}@example.net>\nTo: alex@example.org\n"
            f"Subject: burst {n}\nDate: Tue, 01 Dec 2026 10:{n % 60:02d}:00 +0000\n"
            f"Message-ID: <burst-{n}@example.net>\n\nmessage {n}\n").encode()


def test_sigterm_during_a_burst_leaves_index_files_and_sidecar_in_step(
        indexed: MailEnv, service: tuple[subprocess.Popen[str], str]) -> None:
    proc, _ = service
    inbox_new = indexed.mail_root / "personal" / "INBOX" / "new"
    for n in range(300):
        (inbox_new / f"1796500000.{n}_1.host").write_bytes(burst_message(n))
    # Stop once the service has started on the burst (the first messages are in the index);
    # the assertions below hold whether or not it got further.
    deadline = time.monotonic() + 60
    while indexed.notmuch("count", "subject:burst").stdout.strip() == "0":
        assert time.monotonic() < deadline, "the service never started indexing the burst"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    # Whatever the service finished is consistent: the sidecar mirrors the index exactly ...
    assert indexed.fmail("sidecar", "check").stdout.strip().endswith("sidecar matches notmuch")
    # ... and nothing was lost: the next index takes the rest, all 300 are there, tagged.
    indexed.fmail("index", "--quiet")
    assert indexed.notmuch("count", "subject:burst").stdout.strip() == "300"
    assert indexed.notmuch("count", "subject:burst AND tag:new").stdout.strip() == "0"
    assert len(list(inbox_new.iterdir())) + len(list((inbox_new.parent / "cur").iterdir())) >= 300
    assert indexed.fmail("sidecar", "check").stdout.strip().endswith("sidecar matches notmuch")


def _notmuch_new_of(pid: int) -> int | None:
    for child in os.listdir("/proc"):
        try:
            args = open(f"/proc/{child}/cmdline", "rb").read().split(b"\0")
            ppid = int(open(f"/proc/{child}/stat").read().rpartition(")")[2].split()[1])
        except (OSError, ValueError):
            continue
        if ppid == pid and b"notmuch" in args[0] and b"new" in args:
            return int(child)
    return None


def _alive(pid: int) -> bool:
    try:  # a zombie is gone: it does nothing more
        return open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _wait(predicate: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_second_stop_signal_during_shutdown_leaves_the_shutdown_to_finish(
        indexed: MailEnv, service: tuple[subprocess.Popen[str], str], sig: signal.Signals) -> None:
    """A SIGTERM (or Ctrl-C) repeated while the service shuts down (here: waiting for an index
    run whose notmuch new waits for a lock another program holds) is ignored: the shutdown is
    bounded well within systemd's stop timeout, and raised in the middle of it the signal
    skipped the steps that end the service's own runs and mark it stopped."""
    proc, _ = service
    with notmuch_lock_held() as holder:
        (indexed.mail_root / "personal" / "INBOX" / "new" / "1796300000.1_1.host").write_bytes(
            ARRIVAL)
        new = _wait(lambda: _notmuch_new_of(proc.pid), "the index run's notmuch new")
        proc.send_signal(sig)
        seen = []
        assert proc.stdout is not None
        while not (line := proc.stdout.readline()).startswith("fmail-nm: INFO: stopping:"):
            assert line, f"the service ended before its shutdown said so: {''.join(seen)}"
            seen.append(line)
        assert proc.poll() is None  # still waiting for the index run
        proc.send_signal(sig)
        out = "".join(seen) + proc.communicate(timeout=120)[0]
        left_running = _alive(new)
        holder.release()
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    assert not left_running, out
    stopped = indexed.fmail("status", check=False)
    assert stopped.returncode == 3 and "not running" in stopped.stdout.lower(), stopped.stdout


def test_the_systemd_unit_lets_the_service_stop_its_own_runs() -> None:
    """systemd's default KillMode sends SIGTERM to every process of the service: a notmuch
    new under way dies with everything it indexed.  The unit signals fmail-nm alone and
    waits long enough for its stop (the HTTP server's wait for open responses, the tool
    calls' wait, the background's deadline, then notmuch new's and mbsync's graces, and the
    wait of each stop for runs its SIGKILL has not ended yet), and the process then ends
    without the tool calls still running."""
    import configparser
    import inspect
    from pathlib import Path

    from fmail_nm.mcp.http import GRACEFUL_SHUTDOWN_SECONDS
    from fmail_nm.mcp.server import CLOSE_TIMEOUT
    from fmail_nm.mcp.serving import THREADS_END_WAIT
    from fmail_nm.runs import KILL_WAIT
    from fmail_nm.service.background import Background
    from fmail_nm.service.mbsync import STOP_GRACE
    from fmail_nm.store.notmuch_cli import NEW_STOP_GRACE

    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(Path(__file__).parent.parent / "config" / "fmail-nm.service")
    service = unit["Service"]
    assert service["KillMode"] == "mixed"
    assert service["KillSignal"] == "SIGTERM"
    stop = inspect.signature(Background.stop).parameters["timeout"].default
    # Every wait of the shutdown, one after the other (see serve_http, Background.stop and
    # serving): each stop of a registry's runs is its grace and KILL_WAIT.
    mbsync_stop, new_stop = STOP_GRACE + KILL_WAIT, NEW_STOP_GRACE + KILL_WAIT
    background = (stop  # its deadline
                  + mbsync_stop + STOP_GRACE  # the pulls still going, then all pullers
                  + new_stop + NEW_STOP_GRACE)  # the index run, then its thread
    # what the waits above left running: both kinds stopped together
    server = max(NEW_STOP_GRACE, STOP_GRACE) + KILL_WAIT
    # then the process ends, not waiting past THREADS_END_WAIT for a tool call left running
    worst = GRACEFUL_SHUTDOWN_SECONDS + CLOSE_TIMEOUT + background + server + THREADS_END_WAIT
    assert float(service["TimeoutStopSec"]) > worst
