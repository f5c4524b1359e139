"""The Streamable HTTP transport: bearer-token auth, DNS-rebinding protection, loopback only.

Layers, outermost first:

1. :class:`BearerAuthMiddleware` — every HTTP request needs ``Authorization: Bearer <token>``
   (constant-time compare); otherwise 401 before anything else runs.
2. The SDK's transport security (inside the streamable HTTP transport): a ``Host`` header that is
   not one of ours gets **421**, an ``Origin`` that is not one of ours gets **403**, a POST that
   is not ``application/json`` gets 400.
3. The SDK's Starlette app, whose lifespan runs the session manager (``session_manager.run()``);
   uvicorn is started with ``lifespan="on"`` so that can never be skipped silently.

:func:`serve_http` refuses a non-loopback bind address unless ``allow_remote`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import anyio
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

logger = logging.getLogger(__name__)

DEFAULT_PATH = "/mcp"
GRACEFUL_SHUTDOWN_SECONDS = 3  # uvicorn takes whole seconds
"""How long uvicorn waits for open responses (a client's SSE stream) before cancelling them."""

# uvicorn's words for the cancel of what its graceful shutdown did not see end, in its log
# line and in the cancel's message (see _GraceCancelsSaid).
_GRACE_CANCEL = "timeout graceful shutdown exceeded"

_WILDCARD_HOSTS = {"", "0.0.0.0", "::"}
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


# The bearer token, or what gives it as it stands now (a token file a server follows).
Token = str | Callable[[], str]


def _token_source(token: Token) -> Callable[[], str]:
    return (lambda: token) if isinstance(token, str) else token


class BearerAuthMiddleware:
    """Pure ASGI middleware: HTTP (and websocket) requests must carry the bearer token.

    Lifespan events pass straight through, so the wrapped app's startup/shutdown still runs.
    A missing or wrong token gets ``401`` with ``WWW-Authenticate: Bearer`` and a JSON body.
    """

    def __init__(self, app: ASGIApp, token: Token) -> None:
        self._token = _token_source(token)
        if not self._token():
            raise ValueError("BearerAuthMiddleware needs a non-empty token")
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        problem = self._check(scope)
        if problem is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        error, detail = problem
        body = json.dumps({"error": "unauthorized", "detail": detail}).encode("utf-8")
        challenge = 'Bearer realm="fmail-nm"'
        if error:
            challenge += f', error="{error}"'
        await send({
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode("ascii")),
                (b"www-authenticate", challenge.encode("ascii")),
                (b"cache-control", b"no-store"),
            ],
        })
        await send({"type": "http.response.body", "body": body})

    def _check(self, scope: Scope) -> tuple[str, str] | None:
        """None when authorised, else (RFC 6750 error code or '', human detail)."""
        values = [v for k, v in scope.get("headers", []) if k.lower() == b"authorization"]
        if not values:
            return "", "missing 'Authorization: Bearer <token>' header"
        if len(values) > 1:
            return "invalid_request", "more than one Authorization header"
        scheme, _, credentials = values[0].strip().partition(b" ")
        if scheme.lower() != b"bearer" or not credentials.strip():
            return "invalid_request", "the Authorization header must be 'Bearer <token>'"
        if not hmac.compare_digest(credentials.strip(), self._token().encode("utf-8")):
            return "invalid_token", "wrong token"
        return None


def bare_host(host: str) -> str:
    """``host`` without the brackets a URL puts around an IPv6 address: ``[::1]`` -> ``::1``."""
    name = host.strip()
    return name[1:-1] if name.startswith("[") and name.endswith("]") else name


def url_host(host: str) -> str:
    """``host`` as a URL or a ``Host`` header writes it: an IPv6 address in brackets."""
    name = bare_host(host)
    return f"[{name}]" if ":" in name else name


def is_wildcard(host: str) -> bool:
    """True for a bind address that listens on every interface: ``0.0.0.0``, ``::``, none."""
    return bare_host(host) in _WILDCARD_HOSTS


def endpoint_url(host: str, port: int, path: str = DEFAULT_PATH) -> str:
    """The URL of the endpoint served on ``host`` (bracketed or not) and ``port``.

    For a wildcard bind, this machine's name: ``0.0.0.0`` is no address another machine can
    connect to, and no ``Host`` the server accepts (see :func:`allowed_hosts_and_origins`).
    """
    name = (socket.gethostname() or _LOOPBACK_NAMES[0]) if is_wildcard(host) else host
    return f"http://{_host_port(name, port)}{path}"


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ::1 (bracketed or not, IPv4-mapped too)."""
    name = bare_host(host).split("%", 1)[0]  # drop an IPv6 zone id
    if name.lower().rstrip(".") == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _host_port(host: str, port: int) -> str:
    """The ``Host`` header form of host:port (IPv6 in brackets)."""
    return f"{url_host(host)}:{port}"


def allowed_hosts_and_origins(host: str, port: int,
                              extra_hosts: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """The ``Host`` values and ``Origin`` values the server accepts.

    Always the three loopback names on ``port`` (as a ``Host``, on any port: see below);
    plus the bind address, loopback or not (a client of 127.0.0.2 names 127.0.0.2); plus this
    machine's names when bound to a wildcard address; plus ``extra_hosts`` (a name or
    ``name:port``; without a port, ``port`` is assumed).
    """
    names = list(_LOOPBACK_NAMES)
    if is_wildcard(host):
        # Not the wildcard address itself: a rebinding page's Host is its own name, so 0.0.0.0
        # would do no harm, but also no good -- another machine cannot connect to it, a local
        # client has the loopback names, and endpoint_url announces this machine's name.
        # Lower case too: clients (httpx, browsers) send a Host in lower case, and a machine's
        # name (Johns-MacBook) often is not.
        machine = [socket.gethostname(), socket.getfqdn()]
        names += machine + [name.lower() for name in machine]
    else:
        names.append(bare_host(host))
    hosts: list[str] = []
    for name in filter(None, names):  # a machine may have no name
        hosts.append(_host_port(name, port))
        if port == 80:  # clients leave the default port out of the Host header
            hosts.append(url_host(name))
    for extra in extra_hosts:
        extra = extra.strip()
        if not extra:
            continue
        if extra.startswith("["):
            has_port = "]:" in extra
        else:
            has_port = extra.count(":") == 1  # more than one: a bare IPv6 address
        hosts.append(extra if has_port else _host_port(extra, port))
    hosts = list(dict.fromkeys(hosts))
    origins = [f"http://{h}" for h in hosts]
    # A loopback name on another port: a client at the far end of a tunnel (ssh -L 9000:...)
    # or a local proxy.  No rebinding risk (that needs a name the attacker resolves), so the
    # Host may name any port; origins stay exact (another port is another local web app).
    hosts += [url_host(name) + ":*" for name in _LOOPBACK_NAMES]
    return hosts, origins


def build_http_app(server: MCPServer, *, token: Token, host: str, port: int,
                   path: str = DEFAULT_PATH, extra_hosts: Iterable[str] = ()) -> ASGIApp:
    """The ASGI app serving ``server`` at ``path``: bearer auth around the SDK's app.

    DNS-rebinding protection is always on (see :func:`allowed_hosts_and_origins`). The returned
    app's lifespan must run (uvicorn does that) — it starts the SDK's session manager, which can
    be started only once, so build a fresh app for every server run.
    """
    hosts, origins = allowed_hosts_and_origins(host, port, extra_hosts)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=origins,
    )
    inner = server.streamable_http_app(streamable_http_path=path, transport_security=security,
                                       host=host)
    return BearerAuthMiddleware(inner, token)


class _GraceCancelsSaid(logging.Filter):
    """On uvicorn's log: the requests still open when its graceful shutdown is over -- a
    tool call still running, a client's stream -- said in one line, not a traceback each.
    uvicorn cancels them, then logs each task's CancelledError as an "Exception in ASGI
    application"; only that cancel, its message uvicorn's own, is dropped: any other
    exception still comes with its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, asyncio.CancelledError) and _GRACE_CANCEL in str(exc):
            return False
        if record.exc_info is None and _GRACE_CANCEL in record.getMessage():
            count = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg = ("stopping: cancelled %s request(s) still open after the %d s grace "
                          "(a tool call still running, or a client's open stream); their "
                          "clients get no answer")
            record.args = (count, GRACEFUL_SHUTDOWN_SECONDS)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _say_grace_cancels(log: logging.Logger) -> None:
    if not any(isinstance(f, _GraceCancelsSaid) for f in log.filters):
        log.addFilter(_GraceCancelsSaid())


def _bind_socket(host: str, port: int) -> socket.socket:
    """A bound (not yet listening) TCP socket; a busy port is an OSError that names it."""
    bind_host = bare_host(host)
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    if bind_host == "localhost":
        bind_host = "127.0.0.1"
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off only on sockets that say TCP
    # (proto 0 keeps it on), and with it on each small write of an answer after the first
    # waits for the client's delayed ACK, some 40 ms a call.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind_host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {_host_port(host, port)}: {exc.strerror} "
                                 "(another program, or another fmail-nm, has it? choose one "
                                 "with --port)") from None
    except BaseException:
        sock.close()
        raise
    return sock


def check_listen(host: str, port: int, *, allow_remote: bool) -> None:
    """Raise now what serve_http would raise for this address (a refused remote host, a busy
    port), before anything is started beside the server."""
    _check_host(host, allow_remote)
    _bind_socket(host, port).close()


def _check_host(host: str, allow_remote: bool) -> None:
    if not is_loopback(host) and not allow_remote:
        raise ValueError(
            f"refusing to listen on {host!r}: it is not a loopback address, so your mail would be "
            "reachable from other machines. Use --host 127.0.0.1 (the default), or pass "
            "--allow-remote (allow_remote=True) if you really mean it.")


async def serve_http(server: MCPServer, *, host: str, port: int, token: Token,
                     allow_remote: bool = False, path: str = DEFAULT_PATH,
                     ready: Callable[[], None] | None = None,
                     extra_hosts: Iterable[str] = ()) -> None:
    """Serve ``server`` over Streamable HTTP until cancelled, or until SIGINT/SIGTERM arrives
    (in the main thread) — then it shuts down gracefully and returns normally.

    Raises ValueError for a non-loopback ``host`` unless ``allow_remote`` is True, and OSError
    when the address cannot be bound. ``ready`` is called once, when the server is listening.
    Cancelling the calling task shuts uvicorn down gracefully (open streams get
    ``GRACEFUL_SHUTDOWN_SECONDS``) before this coroutine returns.
    Needs the asyncio backend (uvicorn does not run on trio).
    """
    import uvicorn

    if not _token_source(token)():
        raise ValueError("serve_http needs a non-empty bearer token")
    _check_host(host, allow_remote)
    if not is_loopback(host):
        logger.warning(
            "!!! fmail-nm is listening on %s, beyond this machine: anyone who can reach this port "
            "and has the bearer token can use every tool the server offers on your mail (serve "
            "with --read-only to offer no write tools). The connection is plain HTTP — the token and the mail travel unencrypted; put it behind "
            "TLS or an SSH tunnel. !!!", _host_port(host, port))

    class _Server(uvicorn.Server):
        """uvicorn, minus re-raising the stop signal after its graceful shutdown.

        uvicorn restores the previous handlers and then re-raises SIGINT/SIGTERM, which kills
        the process on SIGTERM before any caller's ``finally`` runs. Here a signal only sets
        ``should_exit`` (a second SIGINT forces the exit), and serve_http returns normally.
        """

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit)
                        for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    sock = _bind_socket(host, port)
    actual_port = sock.getsockname()[1]
    try:
        app = build_http_app(server, token=token, host=host, port=actual_port, path=path,
                             extra_hosts=extra_hosts)
    except BaseException:
        sock.close()
        raise
    config = uvicorn.Config(app, host=host, port=actual_port, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS)
    userver = _Server(config)
    # For good, not for this run only: uvicorn logs a cancelled task's traceback once that
    # task has ended, which may be after serve() returned.
    _say_grace_cancels(logging.getLogger("uvicorn.error"))  # where uvicorn logs both
    finished = anyio.Event()
    failure: list[BaseException] = []

    async def run() -> None:
        # Shielded: cancellation is turned into a graceful should_exit below, not a hard stop.
        with anyio.CancelScope(shield=True):
            try:
                await userver.serve(sockets=[sock])
            except SystemExit as exc:  # uvicorn exits on lifespan/startup failure
                failure.append(RuntimeError(
                    f"the HTTP server on {_host_port(host, actual_port)} failed to start "
                    f"(exit {exc.code}); see the log above"))
            finally:
                sock.close()
                finished.set()

    async def announce() -> None:
        while not userver.started and not finished.is_set():
            await anyio.sleep(0.02)
        if userver.started and ready is not None:
            ready()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            tg.start_soon(announce)
            try:
                await finished.wait()
            finally:
                userver.should_exit = True
    finally:
        userver.should_exit = True
    if failure:
        raise failure[0]
