"""The MCP server with what runs beside it, over stdio or Streamable HTTP."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from mcp.server.mcpserver import MCPServer

from ..config import DEFAULT_TOOL_PROFILE, Config, fmail_command
from ..service.push import PUSH_QUIET, PUSH_RETRY, mbsync_ran
from .server import MailService, build_server

if TYPE_CHECKING:
    import anyio

    from ..app import LiveConfig
    from ..service.mbsync import MbsyncRun
    from ..service.push import PushScheduler
    from ..service.status import ServerPushRecord

log = logging.getLogger(__name__)

# How long the end of a server process waits for threads that are ending anyway (idle
# workers told to stop) before it ends without those still running.
THREADS_END_WAIT = 1.0


def _migrate_sidecar(config: Config) -> None:
    """Bring a sidecar an earlier version wrote up to this version's schema as the server
    starts: the read tools open it read-only, and until an index run migrated it they would
    refuse SQL and read every page from notmuch.  A sidecar that is not there yet, or that
    cannot be migrated, is left for the tools to report."""
    from ..store import sidecar

    path = sidecar.sidecar_path(config.data_dir)
    if not path.exists():
        return
    try:
        with sidecar.opened(path):  # a read-write open migrates
            pass
    except (sidecar.SidecarError, sqlite3.Error, OSError) as exc:  # read-only files, say
        log.warning("the sidecar was not migrated: %s", exc)


@contextlib.contextmanager
def serving(config: Config, *, read_only: bool, push: bool, watch: bool = False,
            tools: str = DEFAULT_TOOL_PROFILE, push_quiet: float = PUSH_QUIET,
            push_retry: float = PUSH_RETRY) -> Iterator[MCPServer]:
    """The server with what runs beside it.

    With ``watch``, the always-on part (:class:`~fmail_nm.service.background.Background`): a watcher
    that indexes new mail as it lands, scheduled pulls, pushes after writes.  Without it, only
    pushes: writes are sent by mbsync ``push_quiet`` seconds after they are made (for accounts
    with an mbsync channel), then re-indexed, because mbsync renames the files it uploads.
    Either way a push that failed is tried again after ``push_retry`` seconds, backing off
    (:class:`~fmail_nm.service.push.PushScheduler`).
    """
    from ..app import LiveConfig
    from ..service.background import AlreadyRunning, Background
    from ..service.push import PushScheduler
    from ..service.status import ServerPushRecord

    _migrate_sidecar(config)
    push = push and not read_only
    live = LiveConfig(config)  # the tools and the background follow the user's edits alike
    background: Background | None = None
    pusher: PushScheduler | None = None
    record: ServerPushRecord | None = None
    service: MailService | None = None
    # From the background's start on: a SIGTERM while the server is built (a service stopped
    # as it starts) left the first pull and index running after us.
    try:
        if watch:
            background = Background(config, push=push, live=live, push_quiet=push_quiet,
                                    push_retry=push_retry)
            try:
                background.start()
            except AlreadyRunning as exc:  # e.g. `fmail-nm run` already watches this mail
                log.warning("%s; serving without watching", exc)
                background = None
        if background is None and push and any(a.mbsync_channel for a in config.accounts):
            pusher = PushScheduler(config, quiet_period=push_quiet, retry=push_retry,
                                   after_push=lambda runs: _reindex(live.current(), runs))
            # for `fmail-nm status`, which knows no other way of this server's pushes
            record = ServerPushRecord(pusher)
            pusher.on_change = record.record
        on_push = (background.request_push if background else
                   _following(live, pusher) if pusher else None)
        server, service = build_server(config, read_only=read_only, tools=tools,
                                       on_push=on_push, background=background, pusher=pusher,
                                       live=live)
        yield server
    finally:
        with _stop_signals_ignored():
            # Tool calls move files on the service's thread: stop it before the background
            # stops -- and stop the background whatever closing the service ran into.
            try:
                if service is not None:
                    service.close()
            finally:
                if background is not None:
                    background.stop()
                if pusher is not None and record is not None:
                    _close_pusher(pusher, record)
                _stop_what_is_left()


def _stop_what_is_left() -> None:
    """End what the bounded waits of the shutdown left running, in sessions of their own
    that outlive this process: a re-index after a push (or a write's) -- notmuch new would
    index on after we are gone and run its post-new hook without us; stopped, it keeps what
    it indexed -- and a push hung on a silent server or an account check of a tool call.
    Sends are not among them: ended midway, a send may or may not have gone.  Both kinds are
    stopped together, for one grace in the shutdown's bound, not one each.  None starts after
    this (a push's next account or its re-index, a tool call left running going on to its
    pull): it would outlive us."""
    from ..runs import stop_together
    from ..service.mbsync import RUNS, STOP_GRACE
    from ..store.notmuch_cli import NEW_RUNS, NEW_STOP_GRACE

    stopped_new, stopped = stop_together([(NEW_RUNS, NEW_STOP_GRACE), (RUNS, STOP_GRACE)],
                                         final=True)
    if stopped_new:
        log.warning("shutdown: stopped %d notmuch new run(s) still going; the next index "
                    "takes up what they left", stopped_new)
    if stopped:
        log.warning("shutdown: stopped %d mbsync or msmtp check run(s) still going (mbsync "
                    "takes an interrupted run up again)", stopped)


@contextlib.contextmanager
def _stop_signals_ignored() -> Iterator[None]:
    """SIGTERM and Ctrl-C ignored while the server shuts down.  The shutdown is bounded
    (the tool calls' CLOSE_TIMEOUT, Background.stop's timeout, then what is left is ended),
    within the time the shipped systemd unit gives a stop before its SIGKILL; a repeated
    signal raised in the middle of it skipped the very steps that end the runs living in
    sessions of their own -- notmuch new, mbsync, which outlive us -- and mark the service
    stopped.  So a second Ctrl-C does not stop faster; SIGKILL still does, leaving those
    runs behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN)
                for sig in (signal.SIGINT, signal.SIGTERM)}
    log.info("stopping: runs in progress get a bounded time to finish; SIGTERM and Ctrl-C "
             "are ignored until the service has stopped")
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _close_pusher(pusher: PushScheduler, record: ServerPushRecord) -> None:
    unpushed = pusher.close(flush=True)
    record.close(unpushed)
    if unpushed:
        log.warning("stopping with writes a failed push left local (%s): the next "
                    "push or `fmail-nm sync` sends them", ", ".join(sorted(unpushed)))


def _following(live: LiveConfig, pusher: PushScheduler) -> Callable[[Iterable[str]], None]:
    """The pusher's request, with the accounts as the configuration has them now (an
    account added since the server started is pushed too)."""
    def request(accounts: Iterable[str]) -> None:
        pusher.config = live.current()
        pusher.request(accounts)
    return request


def _reindex(config: Config, runs: list[MbsyncRun]) -> None:
    from ..service.index import reindex_for_write
    from ..service.mbsync import ChannelBusy
    if not mbsync_ran(runs):  # nothing renamed (a busy channel: the run holding it indexes)
        return
    try:
        # bounded: a lock held elsewhere would hold the pusher's thread with it
        reindex_for_write(config)
    except ChannelBusy as exc:  # the index that follows that run takes the renames in too
        log.info("not re-indexing after mbsync push: %s", exc)
    except Exception:  # logged; the next write or sync indexes again
        log.exception("re-indexing after mbsync push failed")


def ended(status: int) -> int:
    """``status``, for a server process whose shutdown has run, once the sends under way
    have ended and been filed (each is bounded: its command's timeout, then its filing's
    wait; cut off, a send that went out would stay in Drafts to be sent twice).  Ended at
    once instead when another thread still runs -- a tool call the shutdown left past its
    deadline (a read of a hung file system) -- which Python's exit would join without a
    bound, past the shutdown's and systemd's stop timeout.  Ending it so leaves nothing
    half-written: notmuch (Xapian) and the sidecar (SQLite) keep whole transactions or none
    -- a Writer batch cut midway is not committed, and a file it moved is one rename
    (store.mover) the next index takes in."""
    from ..service.send import SENDS

    SENDS.wait()
    deadline = time.monotonic() + THREADS_END_WAIT
    for thread in _non_daemon_threads():
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [thread.name for thread in _non_daemon_threads()]
    if not left:
        return status
    log.warning("ending without waiting for %d thread(s) still running (%s): what they were "
                "doing is dropped", len(left), ", ".join(left))
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a client gone, its pipe closed
            stream.flush()
    os._exit(status)


def _non_daemon_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate()
            if not thread.daemon and thread is not threading.current_thread()]


def serve_stdio_forever(config: Config, *, read_only: bool = False, push: bool = True,
                        watch: bool = False, tools: str = DEFAULT_TOOL_PROFILE) -> int:
    import anyio

    anyio.run(lambda: serve_stdio(config, read_only=read_only, push=push, watch=watch,
                                  tools=tools))
    return ended(0)


async def serve_stdio(config: Config, *, read_only: bool = False, push: bool = True,
                      watch: bool = False, tools: str = DEFAULT_TOOL_PROFILE) -> None:
    """Serve over stdin/stdout until stdin closes or SIGTERM comes, which a client may send
    instead of closing stdin: the server then closes as it would at the end of stdin -- writes
    waiting for their push are pushed or recorded -- before the process ends.  A SIGTERM
    repeated while it closes is ignored.  A client killed mid-call (stdout closed under an
    answer) is an end of stdin too, not a failure."""
    import anyio

    with anyio.open_signal_receiver(signal.SIGTERM) as signals, contextlib.ExitStack() as stack:
        server = stack.enter_context(
            serving(config, read_only=read_only, push=push, watch=watch, tools=tools))
        async with anyio.create_task_group() as group:
            group.start_soon(_close_on_signal, signals, stack)
            try:
                await server.run_stdio_async()
            except* BrokenPipeError:  # the client is gone (killed) while a call was answered
                log.info("the client closed stdout: stopping")
            group.cancel_scope.cancel()  # stdin closed: no signal to wait for


async def _close_on_signal(signals: AsyncIterator[int], stack: contextlib.ExitStack) -> None:
    """Close what runs beside the server, wait for the sends under way as the end of stdin
    does (:func:`ended`), then end the process: stdin is read on a thread no cancellation
    reaches, which would keep it waiting for a client that may never close it.  A repeated
    SIGTERM meanwhile waits in ``signals``, unread."""
    from ..service.send import SENDS

    async for signum in signals:
        log.info("signal %d: stopping", signum)
        stack.close()
        SENDS.wait()
        os._exit(128 + signum)


def _stdio_command(config: Config) -> list[str]:
    return fmail_command(config.settings) + ["serve", "--transport", "stdio"]


def connection_help(config: Config, *, host: str, port: int, show_token: bool) -> str:
    """Ready-to-paste client configuration for this server, stdio and HTTP."""
    from .clientconfig import client_configs
    from .http import endpoint_url, is_wildcard
    from .token import TOKEN_ENV, load_or_create_token, token_path

    token = load_or_create_token(config.data_dir)
    url = endpoint_url(host, port)
    text = client_configs(command=_stdio_command(config), url=url,
                          token=token if show_token else None)
    if is_wildcard(host):
        # The Host header is checked against DNS rebinding: an address is not one of our names.
        text += (f"\nListening on every interface, announced as {url}: clients on other "
                 "machines use this host's name; to use an address instead, serve with "
                 "--host that address.\n")
    if not show_token and os.environ.get(TOKEN_ENV, "").strip():
        text += f"\nThe bearer token is the one set in ${TOKEN_ENV}.\n"
    elif not show_token:
        text += (f"\nThe bearer token is in {token_path(config.data_dir)} "
                 "(print it with `fmail-nm token`).\n")
    return text


def serve_http_forever(config: Config, *, host: str, port: int, allow_remote: bool,
                       show_token: bool = False, read_only: bool = False, push: bool = True,
                       watch: bool = False, tools: str = DEFAULT_TOOL_PROFILE) -> int:
    import anyio

    from .http import check_listen, endpoint_url, serve_http
    from .token import server_token

    # Before the watcher, pulls and their status start: a start that cannot listen changes
    # nothing (it would have run an index and written over the last run's status).
    check_listen(host, port, allow_remote=allow_remote)
    token = server_token(config.data_dir)

    def ready() -> None:
        print(f"fmail-nm: serving {len(config.accounts)} account(s) from {config.mail_root}",
              flush=True)
        print(f"fmail-nm: MCP endpoint {endpoint_url(host, port)} (Streamable HTTP, bearer token)",
              flush=True)
        # The token is printed only where asked (the demo): a service's stdout ends up in logs.
        print(connection_help(config, host=host, port=port, show_token=show_token), flush=True)

    with serving(config, read_only=read_only, push=push, watch=watch, tools=tools) as server:
        anyio.run(lambda: serve_http(server, host=host, port=port, token=token,
                                     allow_remote=allow_remote, ready=ready))
    return ended(0)


def serve_demo(port: int) -> int:
    from ..app import load_config

    # The sample mail has no IMAP server behind it: nothing to push.
    return serve_http_forever(load_config(), host="127.0.0.1", port=port, allow_remote=False,
                              show_token=True, push=False)
