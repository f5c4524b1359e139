"""A real IMAP test bed: a private Dovecot on loopback plus mbsync configured against it.

No mocks: tests and benchmarks start a real ``dovecot`` (2.3) bound to ``127.0.0.1:<free port>``
with a self-contained configuration in a directory the caller gives, seed mail by IMAP
``APPEND``, sync it to a local Maildir with a real ``mbsync``, and read the server's state back
with :mod:`imaplib`.  Nothing under ``/etc/dovecot``, ``/run/dovecot`` or ``/var/lib/dovecot``
is read or written.

Import it as ``from . import imapbed`` inside the ``tests`` package, or put ``tests/`` on
``sys.path`` and ``import imapbed`` from a benchmark script: it depends on the standard
library only.  Typical use::

    with ImapServer(tmp_path / "imap") as server:
        uid = append(server, "alex", "INBOX", raw_message_bytes, flags=("\\Seen",))
        cfg = write_mbsync_config(tmp_path / "mbsyncrc", server, "alex", tmp_path / "mail")
        run_mbsync(cfg, "alex")                  # pulls into tmp_path/mail/alex/INBOX/cur/
        state = fetch_state(server, "alex")      # {"INBOX": [ServerMessage(...)], ...}

Layout of the server directory (``workdir``)::

    dovecot.conf  passwd  dovecot.log  dovecot.stderr  state/  run/ (sockets; see below)
    users/<user>/Maildir/        the user's server-side mail (Dovecot's default Maildir++
                                 layout: INBOX is the Maildir root, folders are ".Sent" etc.)

Running as root versus as an ordinary user
-----------------------------------------
Dovecot never lets a mail process (``imap``) run as uid 0 -- ``first_valid_uid = 0`` does not
help ("userdb returned 0 as uid" / "Mail access not allowed for root") -- and ``imap-login``
refuses root too.  So:

* **as root** (CI): internal processes (auth, config, log, ...) run as root, login processes
  as ``dovenull`` (or ``nobody``), and mail processes as ``nobody``.  ``nobody`` cannot reach a
  Maildir under pytest's ``/tmp/pytest-of-root`` (mode 0700), so the mail processes are
  *chrooted* into ``users/<user>`` (userdb ``home=<users>/%u/./`` + ``valid_chroot_dirs``);
  the chroot happens while still root, so the 0700 parents do not matter.  The server-side
  ``users/<user>`` trees are therefore owned by ``nobody``.
* **as an ordinary user**: Dovecot runs every process as that user (internal, login and mail
  user all set to it, no chroot for login or mail processes).

Unix sockets are limited to ~108 bytes, so when ``workdir`` is long (deep pytest tmp paths)
the runtime ``base_dir`` is a short private directory under the system temp dir instead of
``workdir/run``; it is removed by :meth:`ImapServer.stop`.

What mbsync (isync 1.4.4) does with this configuration -- pinned by ``test_imapbed.py``
----------------------------------------------------------------------------------------
* Local files are ``<root>/<account>/<Folder>/{cur,new}/<time>.<pid>_<n>.<host>,U=<uid>:2,<fl>``;
  unseen messages land in ``new/`` (``:2,`` with no flags), seen ones in ``cur/``.
* Local copies are not byte-identical to the server's: CRLF becomes LF and mbsync inserts an
  ``X-TUID:`` header.  ``CopyArrivalDate yes`` sets the file mtime to the INTERNALDATE.
* A file moved to another folder must lose ``,U=<n>``, else mbsync fails with "UID <n> is
  beyond highest assigned UID" (and the original is still deleted from the server).
* mbsync sleeps ~1 s ("Maildir notice: sleeping due to recent directory modification") when a
  Maildir changed within the current second, so a push right after a rename costs a second.
* ``SSLType`` (not ``TLSType``, which is isync 1.5) and an explicit ``AuthMechs PLAIN LOGIN``:
  the default ``*`` excludes cleartext mechanisms on an unencrypted connection.

OAuth2: ``ImapServer(..., tokens={user: token})`` also takes SASL ``XOAUTH2`` and
``OAUTHBEARER`` with that access token, the way a provider does: Dovecot's ``oauth2`` passdb asks
a small introspection endpoint the bed serves on loopback (:class:`_Introspection`) whether the
bearer token is active and whose it is.  Passwords then serve ``PLAIN``/``LOGIN`` only.

Only Dovecot 2.3 is supported (2.4 changed the configuration format); a 2.4 binary gives a
clear :class:`ImapBedError`.
"""

from __future__ import annotations

import datetime as _dt
import grp
import http.server
import imaplib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

__all__ = [
    "DEFAULT_USERS",
    "SPECIAL_FOLDERS",
    "ImapBedError",
    "ImapServer",
    "MbsyncError",
    "ServerMessage",
    "append",
    "create_folder",
    "fetch_state",
    "find_program",
    "free_port",
    "mbsync_section",
    "run_mbsync",
    "write_mbsync_config",
]

HOST = "127.0.0.1"
#: Test accounts created by default: login name -> password.
DEFAULT_USERS: Mapping[str, str] = {"alex": "secret", "work": "secret"}
#: Folders Dovecot auto-creates (and subscribes) for every user, with their SPECIAL-USE flag.
SPECIAL_FOLDERS: Mapping[str, str] = {
    "Sent": "\\Sent",
    "Drafts": "\\Drafts",
    "Trash": "\\Trash",
    "Junk": "\\Junk",
    "Archive": "\\Archive",
}
_SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")
#: Services with a default ``chroot`` in Dovecot 2.3 (``doveconf -d``); imap-login is
#: handled with its listener.
_CHROOTED_SERVICES = (
    "aggregator", "anvil", "director", "imap-urlauth-login", "ipc", "old-stats",
    "pop3-login", "submission-login",
)
_MAX_BASE_DIR_LEN = 60  # leaves room for "/token-login/imap-urlauth-..." within sun_path (108)


class ImapBedError(RuntimeError):
    """The test bed could not do what was asked (missing program, Dovecot failed, ...)."""


class MbsyncError(subprocess.CalledProcessError):
    """``mbsync`` exited non-zero; ``str()`` includes its stdout and stderr."""

    def __str__(self) -> str:
        return (
            f"{super().__str__()}\n--- mbsync stdout ---\n{self.stdout or ''}"
            f"--- mbsync stderr ---\n{self.stderr or ''}"
        )


class ServerMessage(NamedTuple):
    """One message as the IMAP server sees it."""

    message_id: str  #: the Message-ID header value, angle brackets included ("" if missing)
    flags: frozenset[str]  #: IMAP flags, e.g. ``frozenset({"\\Seen"})`` (``\\Recent`` dropped)
    uid: int  #: the IMAP UID in its folder


def find_program(name: str) -> str:
    """Return the path of ``name`` on ``$PATH`` or in the sbin directories, else raise.

    ``dovecot`` lives in ``/usr/sbin``, which an ordinary user's ``$PATH`` often lacks.
    """
    extra = os.pathsep.join(_SBIN_DIRS)
    found = shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + extra)
    if found is None:
        hint = {
            "dovecot": "install Dovecot 2.3 (Debian: apt-get install dovecot-imapd)",
            "mbsync": "install isync (Debian: apt-get install isync)",
        }.get(name, f"install {name}")
        raise ImapBedError(f"{name!r} not found on PATH or in {', '.join(_SBIN_DIRS)}: {hint}")
    return found


def free_port(host: str = HOST) -> int:
    """Return a TCP port on ``host`` that was free a moment ago (bind to port 0, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no {path.name})"
    return "\n".join(text.splitlines()[-lines:]) or f"({path.name} is empty)"


def _quote_mailbox(name: str) -> str:
    """Quote a mailbox name for an IMAP command (imaplib sends arguments verbatim)."""
    if not name.isascii():
        raise ValueError(f"mailbox names must be ASCII in this test bed: {name!r}")
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


class ImapServer:
    """A private Dovecot 2.3 IMAP server on ``127.0.0.1:<port>``, configured in ``workdir``.

    Use as a context manager (``with ImapServer(path) as server:``) or call :meth:`start` /
    :meth:`stop` yourself.  :meth:`stop` then :meth:`start` brings the server back on the same
    port with the same mail, to simulate an outage.  Leaving the ``with`` block stops the server
    and deletes ``workdir`` -- unless an exception is propagating or ``cleanup=False``, in
    which case ``workdir`` (with ``dovecot.log``) is kept for inspection.

    Args:
        workdir: directory owned by the bed (created if missing); pytest's ``tmp_path / "imap"``.
        users: login name -> password; defaults to :data:`DEFAULT_USERS`.
        port: TCP port; by default a free one is picked once and kept across restarts.
        start_timeout: seconds to wait for the IMAP greeting before giving up.
        cleanup: delete ``workdir`` when the ``with`` block ends without an exception.  Pass
            False from pytest fixtures: a failed test does not raise through a fixture, and
            pytest prunes its own tmp dirs anyway -- so the log survives for inspection.
        tokens: login name -> the OAuth2 access token accepted for it (XOAUTH2, OAUTHBEARER).
        tls: (certificate, key) PEM files: the port speaks IMAPS (implicit TLS) instead.
    """

    host: str = HOST

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        users: Mapping[str, str] | None = None,
        port: int | None = None,
        start_timeout: float = 15.0,
        cleanup: bool = True,
        tokens: Mapping[str, str] | None = None,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self.workdir = Path(workdir).absolute()
        if re.search(r'[\s"%#\\]', str(self.workdir)):
            raise ValueError(
                f"workdir must not contain whitespace, quotes, '%', '#' or backslashes "
                f"(Dovecot config syntax): {self.workdir}"
            )
        self.cleanup = cleanup
        self.users: dict[str, str] = dict(DEFAULT_USERS if users is None else users)
        for name, password in self.users.items():
            if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
                raise ValueError(f"test user names must be simple ASCII words: {name!r}")
            if not re.fullmatch(r"[^\s:]+", password):
                raise ValueError(f"test passwords must not contain ':' or whitespace: {name!r}")
        self.port: int = port if port is not None else free_port()
        self.start_timeout = start_timeout
        self.config_path = self.workdir / "dovecot.conf"
        self.log_path = self.workdir / "dovecot.log"
        self.stderr_path = self.workdir / "dovecot.stderr"
        self.users_dir = self.workdir / "users"
        self._proc: subprocess.Popen[bytes] | None = None
        self._base_dir: Path | None = None
        self._base_dir_is_private = False
        self.tokens: dict[str, str] = dict(tokens or {})
        self.tls = tls
        self._introspection: _Introspection | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> ImapServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(graceful=False)
        if exc_type is None and self.cleanup:
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def running(self) -> bool:
        """True while the Dovecot master process we started is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Write the configuration, start Dovecot, and wait for an IMAP greeting.

        Raises :class:`ImapBedError` (with the Dovecot log) if it does not come up in time.
        """
        if self.running:
            return
        dovecot = find_program("dovecot")
        self._check_version(dovecot)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.tokens and self._introspection is None:
            self._introspection = _Introspection(self.tokens)
        self._prepare_dirs()
        self.config_path.write_text(self._render_config())
        pid_file = self._runtime_dir() / "master.pid"
        pid_file.unlink(missing_ok=True)  # a stale pid (after a kill) would block the start

        try:
            self._launch(dovecot)
        except BaseException:
            self.stop()  # never leave a half-started Dovecot behind
            raise

    def _launch(self, dovecot: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            with open(self.stderr_path, "ab") as err:
                self._proc = subprocess.Popen(
                    [dovecot, "-F", "-c", str(self.config_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=err,
                    stderr=err,
                    start_new_session=True,  # its own process group, for a clean stop()
                    preexec_fn=_die_with_parent,
                )
            failure = self._wait_for_greeting(deadline)
            if failure is None:
                return
            in_use = "in use" in _tail(self.log_path, 10) + _tail(self.stderr_path, 10)
            self._terminate()
            # The port can be briefly unavailable right after a restart: retry until deadline.
            if not (in_use and time.monotonic() < deadline):
                raise ImapBedError(
                    f"Dovecot did not come up on {self.host}:{self.port}: {failure}\n"
                    f"--- {self.log_path} ---\n{_tail(self.log_path)}\n"
                    f"--- {self.stderr_path} ---\n{_tail(self.stderr_path)}"
                )
            time.sleep(0.2)

    def stop(self, timeout: float = 10.0, *, graceful: bool = True) -> None:
        """Stop Dovecot (SIGTERM, then SIGKILL after ``timeout``) and wait for it to exit.

        A graceful stop takes about a second (Dovecot's log process drains).  The mail and
        the configuration stay in ``workdir``, so :meth:`start` resumes on the same port.
        ``graceful=False`` kills it at once: for a teardown, where nothing reads the log of
        the shutdown and no client is left to be told.
        """
        self._terminate(timeout, graceful=graceful)
        if self._introspection is not None:
            self._introspection.stop()
            self._introspection = None
        if self._base_dir is not None and self._base_dir_is_private:
            shutil.rmtree(self._base_dir, ignore_errors=True)
            self._base_dir = None

    def _terminate(self, timeout: float = 10.0, *, graceful: bool = True) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if graceful and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout)
            # Dovecot's master kills its children on shutdown; make sure of it for our own
            # process group only (nothing else is in it: start_new_session=True).
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(timeout)

    # -- clients -------------------------------------------------------------------------------

    def imap(self, user: str, timeout: float = 10.0) -> imaplib.IMAP4:
        """Return an :class:`imaplib.IMAP4` client logged in as ``user`` (use it in ``with``)."""
        client = (imaplib.IMAP4(self.host, self.port, timeout=timeout) if self.tls is None else
                  imaplib.IMAP4_SSL(self.host, self.port, timeout=timeout,
                                    ssl_context=self._trusting()))
        try:
            client.login(user, self.users[user])
        except BaseException:
            client.shutdown()
            raise
        return client

    def maildir(self, user: str) -> Path:
        """The server-side Maildir of ``user`` (Maildir++ layout; for debugging, not for tests
        of sync behaviour -- assert through IMAP with :func:`fetch_state`)."""
        return self.users_dir / user / "Maildir"

    def log(self) -> str:
        """The Dovecot log so far (include it in assertion messages)."""
        return _tail(self.log_path, 10_000)

    # -- internals -----------------------------------------------------------------------------

    @staticmethod
    def _check_version(dovecot: str) -> None:
        out = subprocess.run(
            [dovecot, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
        if not out.startswith("2.3"):
            raise ImapBedError(f"this test bed writes a Dovecot 2.3 config; {dovecot} is {out!r}")

    def _wait_for_greeting(self, deadline: float) -> str | None:
        """Poll until the port answers ``* OK``; return None, or why it did not."""
        last = "no attempt"
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                return f"dovecot exited with status {code}"
            try:
                with socket.create_connection((self.host, self.port), timeout=2) as plain:
                    sock = (plain if self.tls is None else
                            self._trusting().wrap_socket(plain, server_hostname=self.host))
                    greeting = sock.makefile("rb").readline()
                    if greeting.startswith(b"* OK"):
                        sock.sendall(b"x LOGOUT\r\n")
                        return None
                    last = f"unexpected greeting {greeting!r}"
            except OSError as err:
                last = f"{type(err).__name__}: {err}"
            time.sleep(0.05)
        return f"no IMAP greeting within {self.start_timeout:g} s (last: {last})"

    def _runtime_dir(self) -> Path:
        if self._base_dir is None:
            candidate = self.workdir / "run"
            if len(str(candidate)) <= _MAX_BASE_DIR_LEN:
                self._base_dir, self._base_dir_is_private = candidate, False
            else:
                self._base_dir = Path(tempfile.mkdtemp(prefix="imapbed-"))
                self._base_dir_is_private = True
        return self._base_dir

    def _identities(self) -> dict[str, str | int]:
        """Who runs what: see the module docstring."""
        if os.geteuid() == 0:
            try:
                mail = pwd.getpwnam("nobody")
            except KeyError:
                raise ImapBedError("running as root needs a 'nobody' user for mail") from None
            login = "dovenull" if _user_exists("dovenull") else "nobody"
            return {
                "internal_user": "root",
                "internal_group": grp.getgrgid(0).gr_name,
                "login_user": login,
                "mail_uid": mail.pw_uid,
                "mail_gid": mail.pw_gid,
            }
        me = pwd.getpwuid(os.geteuid())
        return {
            "internal_user": me.pw_name,
            "internal_group": grp.getgrgid(os.getegid()).gr_name,
            "login_user": me.pw_name,
            "mail_uid": me.pw_uid,
            "mail_gid": os.getegid(),
        }

    def _prepare_dirs(self) -> None:
        ids = self._identities()
        (self.workdir / "state").mkdir(exist_ok=True)
        self._runtime_dir().mkdir(parents=True, exist_ok=True)
        self.users_dir.mkdir(exist_ok=True)
        for user in self.users:
            home = self.users_dir / user
            home.mkdir(exist_ok=True)
            if os.geteuid() == 0:  # the chroot root must belong to the (unprivileged) mail user
                os.chown(home, int(ids["mail_uid"]), int(ids["mail_gid"]))
        passwd = self.workdir / "passwd"
        passwd.write_text("".join(f"{u}:{{PLAIN}}{p}::::::\n" for u, p in self.users.items()))
        passwd.chmod(0o600)
        if self._introspection is not None:
            oauth2 = self.workdir / "oauth2.conf.ext"
            # mode "auth": a GET with "Authorization: Bearer <token>", as for Microsoft's
            # endpoint; the answer's username must be the one the client logged in as.
            oauth2.write_text(f"introspection_mode = auth\n"
                              f"introspection_url = {self._introspection.url}\n"
                              "force_introspection = yes\nusername_attribute = username\n"
                              "active_attribute = active\nactive_value = true\n")

    def _render_config(self) -> str:
        ids = self._identities()
        as_root = os.geteuid() == 0
        users = self.users_dir
        if as_root:
            home = f"{users}/%u/./"  # "/./": chroot into the user's dir (see module docstring)
            chroot_lines = f"valid_chroot_dirs = {users}\n"
            login_chroot = ""
        else:
            home = f"{users}/%u"
            chroot_lines = ""
            login_chroot = "  chroot =\n"
        # A non-root master cannot chroot: clear every service's default chroot.
        no_chroot = "".join(
            f"service {name} {{\n  chroot =\n}}\n" for name in _CHROOTED_SERVICES
        ) if not as_root else ""
        mailboxes = "".join(
            f"  mailbox {name} {{\n    auto = subscribe\n    special_use = {flag}\n  }}\n"
            for name, flag in SPECIAL_FOLDERS.items()
        )
        return f"""\
# Generated by tests/imapbed.py -- a private, loopback-only Dovecot 2.3 for tests.
protocols = imap
listen = {self.host}
base_dir = {self._runtime_dir()}
state_dir = {self.workdir / "state"}
instance_name = imapbed-{self.port}
log_path = {self.log_path}
info_log_path = {self.log_path}
{self._ssl_settings()}
disable_plaintext_auth = no
auth_mechanisms = plain login{" xoauth2 oauthbearer" if self.tokens else ""}
{self._oauth2_settings()}shutdown_clients = yes
default_internal_user = {ids["internal_user"]}
default_internal_group = {ids["internal_group"]}
default_login_user = {ids["login_user"]}
first_valid_uid = {ids["mail_uid"]}
first_valid_gid = {ids["mail_gid"]}
{chroot_lines}mail_location = maildir:~/Maildir
mail_fsync = never

passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {self.workdir / "passwd"}
{"  mechanisms = plain login" + chr(10) if self.tokens else ""}}}
{self._oauth2_passdb()}userdb {{
  driver = static
  args = uid={ids["mail_uid"]} gid={ids["mail_gid"]} home={home}
}}

namespace inbox {{
  inbox = yes
  separator = /
{mailboxes}}}

protocol imap {{
  mail_max_userip_connections = 100
}}

service imap-login {{
  inet_listener imap {{
    address = {self.host}
    port = {self.port}
{"    ssl = yes" + chr(10) if self.tls else ""}  }}
  inet_listener imaps {{
    port = 0
  }}
{login_chroot}}}
{no_chroot}"""

    def _trusting(self) -> ssl.SSLContext:
        """A client context that trusts this server's own certificate (and nothing else)."""
        assert self.tls is not None
        context = ssl.create_default_context(cafile=str(self.tls[0]))
        context.check_hostname = False
        return context

    def _ssl_settings(self) -> str:
        if self.tls is None:
            return "ssl = no"
        cert, key = self.tls
        return f"ssl = yes\nssl_cert = <{cert}\nssl_key = <{key}"

    def _oauth2_settings(self) -> str:
        if not self.tokens:
            return ""
        # Refused tokens are what the OAuth2 tests try: answer them without the delay that
        # slows down password guessing.  (Dovecot's per-IP penalty still delays every login
        # after a failure, 2 s and more, until one succeeds: try refused tokens last.)
        return "auth_failure_delay = 0\n"

    def _oauth2_passdb(self) -> str:
        if not self.tokens:
            return ""
        return f"""passdb {{
  driver = oauth2
  mechanisms = xoauth2 oauthbearer
  args = {self.workdir / "oauth2.conf.ext"}
}}
"""


class _Introspection:
    """An OAuth2 token introspection endpoint on loopback (a thread): a GET with
    ``Authorization: Bearer <token>`` answers ``{"active": true, "username": <its user>}``
    for a known token, ``{"active": false}`` for any other."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        owners = {token: user for user, token in tokens.items()}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                user = owners.get(token)
                body = json.dumps({"active": True, "username": user} if user
                                  else {"active": False}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet: Dovecot's log says what it concluded

        self.server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        self.url = f"http://{HOST}:{self.server.server_address[1]}/introspect"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies (Linux ``PR_SET_PDEATHSIG``).

    So a test run that is killed outright leaves no Dovecot behind.  The signal fires when the
    *thread* that started the server exits: start servers from a long-lived thread.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 == PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# -- seeding and inspecting the server ---------------------------------------------------------


def append(
    server: ImapServer,
    user: str,
    folder: str,
    raw: bytes,
    flags: Iterable[str] = (),
    date: _dt.datetime | float | None = None,
) -> int:
    """APPEND ``raw`` (an RFC 5322 message) to ``folder`` of ``user``; return its new UID.

    ``flags`` are IMAP flags such as ``"\\Seen"``; ``date`` becomes the INTERNALDATE (a
    timezone-aware datetime or a POSIX timestamp; default: now).  The folder must exist
    (the special folders always do); bare ``\\n`` line ends are sent as ``\\r\\n``.
    """
    flag_list = "(" + " ".join(flags) + ")"
    when = imaplib.Time2Internaldate(date) if date is not None else None
    with server.imap(user) as client:
        typ, data = client.append(_quote_mailbox(folder), flag_list, when, raw)
        if typ != "OK":
            raise ImapBedError(f"APPEND to {folder!r} failed: {data!r}")
        match = re.search(rb"\[APPENDUID \d+ (\d+)\]", data[0] or b"")
        if match is None:
            raise ImapBedError(f"APPEND to {folder!r}: no APPENDUID in {data!r}")
        return int(match.group(1))


def create_folder(server: ImapServer, user: str, folder: str) -> None:
    """CREATE and SUBSCRIBE ``folder`` (hierarchy separator ``/``) for ``user``."""
    with server.imap(user) as client:
        typ, data = client.create(_quote_mailbox(folder))
        if typ != "OK":
            raise ImapBedError(f"CREATE {folder!r} failed: {data!r}")
        client.subscribe(_quote_mailbox(folder))


_LIST_RE = re.compile(rb'^\((?P<attrs>[^)]*)\) (?:NIL|"(?:[^"\\]|\\.)*") (?P<name>.*)$')
_FETCH_UID_RE = re.compile(rb"\bUID (\d+)")
_FETCH_FLAGS_RE = re.compile(rb"\bFLAGS \(([^)]*)\)")
_MESSAGE_ID_RE = re.compile(rb"^Message-ID:[ \t]*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)


def _list_folders(client: imaplib.IMAP4) -> list[str]:
    typ, data = client.list()
    if typ != "OK":
        raise ImapBedError(f"LIST failed: {data!r}")
    names: list[str] = []
    for item in data:
        if isinstance(item, tuple):  # name sent as a literal
            head, literal = item
            if b"\\noselect" not in head.lower():
                names.append(literal.decode())
            continue
        if item is None:
            continue
        match = _LIST_RE.match(item)
        if match is None:
            raise ImapBedError(f"unparsable LIST line: {item!r}")
        if b"\\noselect" in match.group("attrs").lower():
            continue
        name = match.group("name")
        if name.startswith(b'"'):
            name = re.sub(rb"\\(.)", rb"\1", name[1:-1])
        names.append(name.decode())
    return names


def fetch_state(server: ImapServer, user: str) -> dict[str, list[ServerMessage]]:
    """Return every selectable folder of ``user`` -> its messages (in UID order).

    Read-only (EXAMINE + BODY.PEEK): inspecting the server does not change any flag.
    """
    state: dict[str, list[ServerMessage]] = {}
    with server.imap(user) as client:
        for folder in _list_folders(client):
            typ, data = client.select(_quote_mailbox(folder), readonly=True)
            if typ != "OK":
                raise ImapBedError(f"EXAMINE {folder!r} failed: {data!r}")
            messages: list[ServerMessage] = []
            if int(data[0] or b"0") > 0:
                typ, data = client.uid(
                    "FETCH", "1:*", "(UID FLAGS BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])"
                )
                if typ != "OK":
                    raise ImapBedError(f"FETCH in {folder!r} failed: {data!r}")
                messages = _parse_fetch(data)
            state[folder] = sorted(messages, key=lambda m: m.uid)
            client.close()
    return state


def _parse_fetch(data: Sequence[object]) -> list[ServerMessage]:
    """Turn imaplib's FETCH result into messages.

    imaplib returns ``(b'1 (UID 4 FLAGS (\\Seen) BODY[...] {21}', b'<header literal>')``
    tuples, each followed by the bytes that close it (``b')'``, or ``b' FLAGS (...))'`` when a
    server orders the items differently); a response without a literal is plain bytes.
    """
    records: list[tuple[bytes, bytes]] = []  # (response text without literals, header)
    for item in data:
        if isinstance(item, tuple):
            records.append((item[0], item[1]))
        elif isinstance(item, bytes):
            if records and not re.match(rb"\d+ \(", item):
                records[-1] = (records[-1][0] + item, records[-1][1])
            else:
                records.append((item, b""))
    messages: list[ServerMessage] = []
    for meta, header in records:
        uid = _FETCH_UID_RE.search(meta)
        flags = _FETCH_FLAGS_RE.search(meta)
        if uid is None or flags is None:
            raise ImapBedError(f"unparsable FETCH response: {meta!r}")
        mid = _MESSAGE_ID_RE.search(header)
        messages.append(
            ServerMessage(
                message_id=mid.group(1).decode(errors="replace") if mid else "",
                flags=frozenset(f for f in flags.group(1).decode().split() if f != "\\Recent"),
                uid=int(uid.group(1)),
            )
        )
    return messages


# -- mbsync ------------------------------------------------------------------------------------


def _mbsync_quote(value: str) -> str:
    """Escape a value for a double-quoted mbsyncrc string."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def mbsync_section(
    server: ImapServer,
    user: str,
    local_root: str | os.PathLike[str],
    channel_name: str | None = None,
    *,
    account: str | None = None,
    expunge: str = "Both",
    create: str = "Both",
    patterns: str = "*",
    timeout: int = 10,
) -> str:
    """Return the mbsyncrc text for one account (IMAPAccount, stores, Channel).

    ``account`` (default: ``user``) names the local directory ``<local_root>/<account>/`` and
    the stores; ``channel_name`` defaults to ``account``.  Concatenate sections for several
    accounts in one file, or use :func:`write_mbsync_config` with ``append=True``.
    """
    account = account or user
    channel = channel_name or account
    root = Path(local_root).absolute() / account
    return f"""\
IMAPAccount {account}
Host {server.host}
Port {server.port}
User {user}
Pass "{_mbsync_quote(server.users[user])}"
# isync 1.4 spells it SSLType (TLSType is 1.5+).  Cleartext mechanisms must be named
# explicitly: '*' excludes them without TLS.
SSLType None
AuthMechs PLAIN LOGIN
Timeout {timeout}

IMAPStore {account}-remote
Account {account}

MaildirStore {account}-local
Path "{_mbsync_quote(str(root) + "/")}"
Inbox "{_mbsync_quote(str(root / "INBOX"))}"
SubFolders Verbatim

Channel {channel}
Far :{account}-remote:
Near :{account}-local:
Patterns {patterns}
Create {create}
Expunge {expunge}
SyncState *
CopyArrivalDate yes

"""


def write_mbsync_config(
    path: str | os.PathLike[str],
    server: ImapServer,
    user: str,
    local_root: str | os.PathLike[str],
    channel_name: str | None = None,
    *,
    account: str | None = None,
    append: bool = False,
    expunge: str = "Both",
    create: str = "Both",
    patterns: str = "*",
    timeout: int = 10,
) -> Path:
    """Write (or with ``append=True`` extend) an mbsyncrc for ``user``; return its path.

    Local mail goes to ``<local_root>/<account>/`` (``INBOX`` inside it, other folders by
    their IMAP names, ``SubFolders Verbatim``); sync state lives in each folder
    (``SyncState *``).  The file holds a password, so it is made mode 0600.
    """
    target = Path(path)
    text = mbsync_section(
        server,
        user,
        local_root,
        channel_name,
        account=account,
        expunge=expunge,
        create=create,
        patterns=patterns,
        timeout=timeout,
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "a" if append else "w") as fh:
        fh.write(text)
    target.chmod(0o600)
    (Path(local_root).absolute() / (account or user)).mkdir(parents=True, exist_ok=True)
    return target


def run_mbsync(
    config_path: str | os.PathLike[str],
    channel: str,
    *args: str,
    timeout: float = 60,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``mbsync -c <config> [args...] <channel>`` and return the finished process.

    ``args`` are extra mbsync options placed before the channel (``"--pull"``, ``"-V"``,...).
    With ``check=True`` (default) a non-zero exit raises :class:`MbsyncError` carrying
    stdout and stderr.  A hung mbsync is killed after ``timeout`` seconds
    (:class:`subprocess.TimeoutExpired`).
    """
    argv = [find_program("mbsync"), "-c", str(config_path), *args, channel]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        check=False,
    )
    if check and proc.returncode != 0:
        raise MbsyncError(proc.returncode, argv, proc.stdout, proc.stderr)
    return proc
