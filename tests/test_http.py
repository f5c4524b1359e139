"""The HTTP transport: a real uvicorn on a free loopback port, the SDK's own client, raw HTTP
for the refusals; the token file; the client-config text."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from anyio.abc import SocketAttribute
from mcp.client.client import Client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer

from fmail_nm.mcp.clientconfig import client_configs
from fmail_nm.mcp.http import allowed_hosts_and_origins, endpoint_url, is_loopback, serve_http
from fmail_nm.mcp.token import load_or_create_token, token_path

from .conftest import MailEnv

from .imapbed import free_port

TOKEN = "test-token-0123456789abcdefghijklmnopqrstuv"

INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "raw", "version": "0"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}


def make_server() -> MCPServer:
    server = MCPServer("t")

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    return server


@asynccontextmanager
async def serving(server: MCPServer, token: str = TOKEN,
                  host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Run serve_http on a free port; yield the endpoint URL; shut down by cancelling."""
    port = free_port()
    ready = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: serve_http(server, host=host, port=port, token=token,
                                         ready=ready.set))
        with anyio.fail_after(10):
            await ready.wait()
        try:
            yield f"http://{host}:{port}/mcp"
        finally:
            tg.cancel_scope.cancel()


def authed_client(token: str = TOKEN) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                              timeout=httpx2.Timeout(10.0))


@pytest.mark.anyio
async def test_sdk_client_over_http_with_token() -> None:
    async with serving(make_server()) as url:
        # Handshake-era client: ClientSession over the streamable HTTP transport.
        async with authed_client() as http:
            async with streamable_http_client(url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    init = await session.initialize()
                    assert init.server_info.name == "t"
                    tools = await session.list_tools()
                    assert [t.name for t in tools.tools] == ["echo"]
                    result = await session.call_tool("echo", {"text": "héllo"})
                    assert not result.is_error
                    assert result.content[0].text == "héllo"
        # The unified Client (default mode "auto": probes the modern protocol first).
        async with authed_client() as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                result = await client.call_tool("echo", {"text": "again"})
                assert result.content[0].text == "again"
        # Without the header the SDK client cannot even connect.
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0)) as http:
            with pytest.raises(Exception):
                with anyio.fail_after(10):
                    async with streamable_http_client(url, http_client=http) as (read, write):
                        async with ClientSession(read, write) as session:
                            await session.initialize()


@pytest.mark.anyio
async def test_refusals() -> None:
    async with serving(make_server()) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0)) as http:
            async def post(headers: dict[str, str]) -> httpx2.Response:
                return await http.post(url, json=INITIALIZE, headers={**MCP_HEADERS, **headers})

            r = await post({})
            assert r.status_code == 401
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert r.json()["error"] == "unauthorized"

            r = await post({"Authorization": "Bearer wrong-token"})
            assert r.status_code == 401
            assert 'error="invalid_token"' in r.headers["www-authenticate"]
            assert r.json() == {"error": "unauthorized", "detail": "wrong token"}

            r = await post({"Authorization": f"Basic {TOKEN}"})
            assert r.status_code == 401

            r = await post({"Authorization": f"Bearer {TOKEN}x"})
            assert r.status_code == 401

            # Auth comes first: a foreign Host without the token is a 401, not a 421.
            r = await post({"Host": "evil.example.com"})
            assert r.status_code == 401

            ok = {"Authorization": f"Bearer {TOKEN}"}
            # A page on a foreign origin (DNS rebinding / CSRF from a browser): 403 from the SDK.
            r = await post({**ok, "Origin": "http://evil.example.com"})
            assert r.status_code == 403
            assert "Origin" in r.text
            # A foreign Host header (rebinding to our port under another name): 421 from the SDK.
            r = await post({**ok, "Host": "evil.example.com"})
            assert r.status_code == 421
            r = await post({**ok, "Host": f"evil.example.com:{port}"})
            assert r.status_code == 421
            r = await post({**ok, "Host": f"localhost.evil.example.com:{port}"})
            assert r.status_code == 421
            # Another local web app's origin (another port): 403.
            r = await post({**ok, "Origin": f"http://127.0.0.1:{port + 1}"})
            assert r.status_code == 403
            # Our own names and origins are accepted.
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
                r = await post({**ok, "Host": host, "Origin": f"http://{host}"})
                assert r.status_code == 200, (host, r.status_code, r.text)
            # A loopback name on another port (the far end of a tunnel): accepted as a Host.
            r = await post({**ok, "Host": f"127.0.0.1:{port + 1}"})
            assert r.status_code == 200
            # Paths other than the endpoint: still behind the token, then 404.
            r = await http.get(url.replace("/mcp", "/other"))
            assert r.status_code == 401
            r = await http.get(url.replace("/mcp", "/other"), headers=ok)
            assert r.status_code == 404


@pytest.mark.anyio
async def test_a_loopback_address_other_than_127_0_0_1_is_served_under_its_own_name() -> None:
    """Bound to 127.0.0.2 (loopback, so no --allow-remote), the server is reached as
    127.0.0.2:PORT: that Host and Origin are ours; a foreign name still is not."""
    async with serving(make_server(), host="127.0.0.2") as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        async with authed_client() as http:
            async def post(headers: dict[str, str]) -> httpx2.Response:
                return await http.post(url, json=INITIALIZE, headers={**MCP_HEADERS, **headers})

            r = await post({"Origin": f"http://127.0.0.2:{port}"})
            assert r.status_code == 200, (r.status_code, r.text)
            assert (await post({"Host": "evil.test"})).status_code == 421
            assert (await post({"Host": f"evil.test:{port}"})).status_code == 421
            assert (await post({"Origin": "http://evil.test"})).status_code == 403


@pytest.mark.anyio
async def test_server_shuts_down_and_port_is_free_again() -> None:
    server = make_server()
    async with serving(server) as url:
        pass
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    # The socket is closed: binding the same port again works (SO_REUSEADDR as uvicorn does).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    # A second run of the same MCPServer works (each run builds a fresh session manager).
    async with serving(server) as url2:
        async with authed_client() as http:
            r = await http.post(url2, json=INITIALIZE, headers=MCP_HEADERS)
            assert r.status_code == 200


def _accepted_socket(client_address: tuple[str, int]) -> socket.socket:
    """This process's end of a TCP connection whose other end is ``client_address``."""
    for name in os.listdir("/proc/self/fd"):
        try:
            candidate = socket.fromfd(int(name), socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            if candidate.getpeername() == client_address:
                return candidate
        except OSError:
            pass
        candidate.close()
    raise AssertionError(f"no accepted connection from {client_address}")


@pytest.mark.anyio
async def test_accepted_connections_send_without_waiting_for_acks() -> None:
    """An answer goes out in several small writes (headers, then each event): with Nagle's
    algorithm on, each after the first waited for the client's delayed ACK, some 40 ms on
    every call of a kept-alive connection after its first."""
    async with serving(make_server()) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert (await stream.receive()).startswith(b"HTTP/1.1 ")
            server_end = _accepted_socket(stream.extra(SocketAttribute.local_address))
            with server_end:
                assert server_end.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


class _SignalReraised(Exception):
    pass


def _reraised(signum: int, frame: object) -> None:
    raise _SignalReraised(signum)


@pytest.mark.anyio
async def test_sigterm_shuts_down_gracefully_and_returns() -> None:
    """SIGTERM (systemd stop) ends serve_http normally, so the caller's cleanup runs; the
    previous handler is restored and the signal is not re-raised (uvicorn's default would)."""
    previous = signal.signal(signal.SIGTERM, _reraised)
    try:
        port = free_port()
        ready = anyio.Event()
        returned = anyio.Event()

        async def run() -> None:
            await serve_http(make_server(), host="127.0.0.1", port=port, token=TOKEN,
                             ready=ready.set)
            returned.set()

        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await ready.wait()
                os.kill(os.getpid(), signal.SIGTERM)
                await returned.wait()
        assert signal.getsignal(signal.SIGTERM) is _reraised
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.anyio
async def test_busy_port_is_an_oserror() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(OSError):
            await serve_http(make_server(), host="127.0.0.1", port=port, token=TOKEN)


def test_a_run_that_cannot_listen_names_the_port_and_starts_nothing(indexed: MailEnv) -> None:
    """`fmail-nm run` on a busy port: an error that names the port, before the watcher, the
    startup index and the status file (whose last run it would have written over) start."""
    status = indexed.config().data_dir / "status.json"
    status.write_text('{"kept": "the last run"}')
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = indexed.fmail("run", "--port", str(port), "--no-push", check=False)
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert status.read_text() == '{"kept": "the last run"}'


@pytest.mark.anyio
async def test_remote_bind_refused_without_allow_remote() -> None:
    for host in ("0.0.0.0", "::", "192.0.2.1", "example.org"):
        with pytest.raises(ValueError, match="allow-remote"):
            await serve_http(make_server(), host=host, port=free_port(), token=TOKEN)
    with pytest.raises(ValueError):
        await serve_http(make_server(), host="127.0.0.1", port=free_port(), token="")


@pytest.mark.anyio
async def test_allow_remote_warns(caplog: pytest.LogCaptureFixture) -> None:
    """Bound to 0.0.0.0 with allow_remote: loud warning, still token-guarded, loopback works."""
    port = free_port()
    ready = anyio.Event()
    with caplog.at_level(logging.WARNING, logger="fmail_nm.mcp.http"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: serve_http(make_server(), host="0.0.0.0", port=port,
                                             token=TOKEN, allow_remote=True, ready=ready.set))
            with anyio.fail_after(10):
                await ready.wait()
            async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0)) as http:
                url = f"http://127.0.0.1:{port}/mcp"
                r = await http.post(url, json=INITIALIZE, headers=MCP_HEADERS)
                assert r.status_code == 401
                r = await http.post(url, json=INITIALIZE,
                                    headers={**MCP_HEADERS, "Authorization": f"Bearer {TOKEN}"})
                assert r.status_code == 200
            tg.cancel_scope.cancel()
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert any("beyond this machine" in m for m in warnings)
    assert not any(TOKEN in rec.getMessage() for rec in caplog.records)


@pytest.mark.anyio
async def test_a_wildcard_bind_announces_an_endpoint_it_serves() -> None:
    """Bound to 0.0.0.0, the announced URL names this machine (0.0.0.0 is no address another
    machine can connect to), and a request naming it as Host is served, not refused with 421."""
    port = free_port()
    ready = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: serve_http(make_server(), host="0.0.0.0", port=port, token=TOKEN,
                                         allow_remote=True, ready=ready.set))
        with anyio.fail_after(10):
            await ready.wait()
        try:
            announced = endpoint_url("0.0.0.0", port)
            host = httpx2.URL(announced).netloc.decode()
            async with authed_client() as http:
                r = await http.post(f"http://127.0.0.1:{port}/mcp", json=INITIALIZE,
                                    headers={**MCP_HEADERS, "Host": host})
            assert r.status_code == 200, (announced, r.status_code, r.text[:200])
            assert host == f"{socket.gethostname()}:{port}"
        finally:
            tg.cancel_scope.cancel()


def test_the_client_configs_of_a_wildcard_bind_name_this_machine(indexed: MailEnv) -> None:
    """What `serve --host 0.0.0.0` prints: configs with this machine's name, never 0.0.0.0,
    and what a client on another machine uses."""
    from fmail_nm.mcp.serving import connection_help
    text = connection_help(indexed.config(), host="0.0.0.0", port=8765, show_token=False)
    assert "0.0.0.0" not in text
    assert f"http://{socket.gethostname()}:8765/mcp" in text
    assert "other machines use this host's name" in text
    assert "other machines" not in connection_help(indexed.config(), host="127.0.0.1",
                                                   port=8765, show_token=False)


def test_a_wildcard_bind_accepts_its_name_in_lower_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients send a Host in lower case; a machine's name often has capitals."""
    monkeypatch.setattr(socket, "gethostname", lambda: "Johns-MacBook")
    hosts, _ = allowed_hosts_and_origins("0.0.0.0", 9000)
    assert "Johns-MacBook:9000" in hosts and "johns-macbook:9000" in hosts
    assert endpoint_url("::", 9000) == "http://Johns-MacBook:9000/mcp"


def test_is_loopback() -> None:
    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST",
                 "::ffff:127.0.0.1"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "", "192.168.1.10", "10.0.0.1", "example.org",
                 "localhost.example.org", "128.0.0.1"):
        assert not is_loopback(host), host


def test_allowed_hosts_and_origins() -> None:
    hosts, origins = allowed_hosts_and_origins("127.0.0.1", 8765)
    assert hosts == ["127.0.0.1:8765", "localhost:8765", "[::1]:8765",
                     "127.0.0.1:*", "localhost:*", "[::1]:*"]
    assert origins == ["http://127.0.0.1:8765", "http://localhost:8765", "http://[::1]:8765"]
    hosts, _ = allowed_hosts_and_origins("192.168.1.10", 8765, extra_hosts=["mail.lan", "fd00::1"])
    assert "192.168.1.10:8765" in hosts and "mail.lan:8765" in hosts and "[fd00::1]:8765" in hosts
    hosts, _ = allowed_hosts_and_origins("0.0.0.0", 9000)
    assert "0.0.0.0:9000" not in hosts and f"{socket.gethostname()}:9000" in hosts


# --- token -------------------------------------------------------------------------------

def test_token_created_private_and_stable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FMAIL_TOKEN", raising=False)
    data_dir = tmp_path / "data" / "fmail-nm"
    old_umask = os.umask(0o000)  # the worst case: files would be world-writable
    try:
        token = load_or_create_token(data_dir)
    finally:
        os.umask(old_umask)
    path = token_path(data_dir)
    assert path == data_dir / "http-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert len(token) >= 40 and token.strip() == token
    assert load_or_create_token(data_dir) == token
    assert path.read_text().strip() == token
    assert [p.name for p in data_dir.iterdir()] == ["http-token"]  # no temp files left


def test_token_env_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FMAIL_TOKEN", "from-the-environment")
    assert load_or_create_token(tmp_path / "d") == "from-the-environment"
    assert not token_path(tmp_path / "d").exists()
    monkeypatch.setenv("FMAIL_TOKEN", "")
    assert load_or_create_token(tmp_path / "d") != ""
    assert token_path(tmp_path / "d").exists()


def test_loose_token_file_tightened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("FMAIL_TOKEN", raising=False)
    path = token_path(tmp_path)
    path.write_text("my-old-token\n")
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="fmail_nm.mcp.token"):
        assert load_or_create_token(tmp_path) == "my-old-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert any("0600" in rec.getMessage() for rec in caplog.records)
    assert not any("my-old-token" in rec.getMessage() for rec in caplog.records)


def test_empty_token_file_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FMAIL_TOKEN", raising=False)
    path = token_path(tmp_path)
    path.write_text("")
    path.chmod(0o600)
    token = load_or_create_token(tmp_path)
    assert token and path.read_text().strip() == token


def test_a_token_replaced_while_the_server_runs_is_the_one_it_accepts(
        indexed: MailEnv) -> None:
    """The documented way to replace the token is to delete the file; ``fmail-nm token``
    then makes a new one.  A server already running must accept that one (the user's
    clients get it) and refuse the old, without a restart; while the file is missing it
    keeps the token it had."""
    env = {k: v for k, v in {**os.environ, **indexed.env}.items() if k != "FMAIL_TOKEN"}
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fmail_nm", "serve", "--transport", "http",
                             "--port", str(port), "--no-push"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"

    def initialize(token: str) -> int:
        return httpx2.post(url, json=INITIALIZE, timeout=10.0,
                           headers={**MCP_HEADERS, "Authorization": f"Bearer {token}"}).status_code

    def fmail_token() -> str:
        return subprocess.run([sys.executable, "-m", "fmail_nm", "token"], env=env, text=True,
                              capture_output=True, timeout=60, check=True).stdout.strip()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
                time.sleep(0.1)
        first = fmail_token()
        assert initialize(first) == 200
        path = token_path(indexed.config().data_dir)
        path.unlink()
        assert initialize(first) == 200
        second = fmail_token()
        assert second != first and path.exists()
        assert initialize(second) == 200
        assert initialize(first) == 401
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("host", ["[::1]", "::1"])
def test_an_ipv6_loopback_host_is_served_and_announced_as_a_valid_url(
        indexed: MailEnv, host: str) -> None:
    """`--host [::1]` and `--host ::1` alike: every URL the server prints is
    http://[::1]:PORT/mcp, and an MCP client of that URL is served."""
    env = {k: v for k, v in {**os.environ, **indexed.env}.items() if k != "FMAIL_TOKEN"}
    port = free_port()
    url = f"http://[::1]:{port}/mcp"
    proc = subprocess.Popen([sys.executable, "-m", "fmail_nm", "serve", "--transport", "http",
                             "--host", host, "--port", str(port), "--no-push"], env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        announced: list[str] = []
        for line in proc.stdout:  # to the end of the client configuration
            announced.append(line)
            if line.startswith("The bearer token is"):
                break
        else:
            pytest.fail(proc.communicate(timeout=30)[1][-1500:])
        assert set(re.findall(r"""http://[^\s"',]+""", "".join(announced))) == {url}
        token = subprocess.run([sys.executable, "-m", "fmail_nm", "token"], env=env, text=True,
                               capture_output=True, timeout=60, check=True).stdout.strip()

        async def list_tools() -> list[str]:
            async with authed_client(token) as http:
                async with streamable_http_client(url, http_client=http) as (read, write):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        return [t.name for t in (await session.list_tools()).tools]

        assert "search_emails" in anyio.run(list_tools)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- client configs ----------------------------------------------------------------------

def test_client_configs_with_token() -> None:
    command = ["/opt/venv/bin/python", "-m", "fmail_nm", "serve", "--transport", "stdio"]
    url = "http://127.0.0.1:8765/mcp"
    text = client_configs(command=command, url=url, token="tok_EN-123",
                          env={"FMAIL_CONFIG": "/home/u/fmail.toml"})
    assert ("claude mcp add --transport stdio --env FMAIL_CONFIG=/home/u/fmail.toml fmail -- "
            "/opt/venv/bin/python -m fmail_nm serve --transport stdio") in text
    assert (f'claude mcp add --transport http fmail {url} '
            '--header "Authorization: Bearer tok_EN-123"') in text
    assert "npx @modelcontextprotocol/inspector -e FMAIL_CONFIG=/home/u/fmail.toml -- " \
           "/opt/venv/bin/python" in text
    assert "Streamable HTTP" in text and "mcp-remote" in text
    assert "Bearer tok_EN-123" in text
    # The Claude Desktop stdio snippet is valid JSON with command/args/env.
    start = text.index("{", text.index("claude_desktop_config.json"))
    snippet, _ = json.JSONDecoder().raw_decode(text[start:].replace("\n    ", "\n"))
    entry = snippet["mcpServers"]["fmail"]
    assert entry == {"command": command[0], "args": command[1:],
                     "env": {"FMAIL_CONFIG": "/home/u/fmail.toml"}}


def test_client_configs_without_token() -> None:
    text = client_configs(command=["fmail-nm", "serve"], url="http://127.0.0.1:9/mcp", token=None)
    assert "Bearer <token>" in text
    text = client_configs(command=["fmail-nm", "serve"], url="http://127.0.0.1:9/mcp", token=None,
                          token_file="/home/u/.local/share/fmail-nm/http-token")
    assert '--header "Authorization: Bearer $(cat /home/u/.local/share/fmail-nm/http-token)"' in text
    assert "--allow-http" not in text
    remote = client_configs(command=["fmail-nm"], url="http://mail.lan:8765/mcp", token=None)
    assert "--allow-http" in remote
