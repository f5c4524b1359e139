"""A real SMTP server on loopback (aiosmtpd) behind a real msmtp, for the send tests.

``SmtpBed(tmp).start()`` listens on 127.0.0.1 on a free port and writes an msmtprc (mode
0600, no TLS, no auth) with one msmtp account per address given; ``send_settings()`` is the
``[send]`` table that points fmail-nm's send command at it.  Every message the server takes
is kept in ``received`` with its envelope and exact bytes; ``reject`` makes it refuse the
next ones with an SMTP error, as a server refusing a recipient does.

``tokens={user: token}`` makes it a server that takes mail only after ``AUTH XOAUTH2`` with
that OAuth2 access token (over plain TCP: loopback), and answers any other token as Gmail
does: a 334 challenge holding a JSON error, then 535 once the client answered it.

``release.clear()`` makes it a slow server: it holds its answer to each message's DATA
until ``release`` is set again (``arrived`` is set once a message is in).

``tls=(certificate, key)`` makes it a server that takes mail only after STARTTLS, showing
that certificate (PEM files, as ``tests.test_accounts.self_signed`` makes them).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import email
import email.policy
import json
import ssl
import threading
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import MISSING, AuthResult

from .imapbed import HOST, free_port


@dataclass(frozen=True)
class Received:
    mail_from: str
    rcpt_tos: tuple[str, ...]
    data: bytes

    def message(self) -> EmailMessage:
        parsed = email.message_from_bytes(self.data, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        return parsed


class _Handler:
    def __init__(self, bed: SmtpBed) -> None:
        self.bed = bed

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,
                          rcpt_options: Any) -> str:
        if self.bed.tokens and not session.authenticated:
            return "530 5.7.0 Authentication required"
        if self.bed.reject is not None:
            return self.bed.reject
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def auth_XOAUTH2(self, server: Any, args: list[str]) -> AuthResult:
        """SASL XOAUTH2: ``user=<user>^Aauth=Bearer <token>^A^A``, base64, as the initial
        response or after an empty challenge."""
        try:
            blob = (base64.b64decode(args[1], validate=True) if len(args) == 2
                    else await server.challenge_auth(""))
        except binascii.Error:
            blob = b""
        if blob is MISSING:  # the client gave up (and was answered)
            return AuthResult(success=False, handled=True)
        fields = dict(part.split("=", 1) for part in bytes(blob).decode("utf-8", "replace")
                      .split("\x01") if "=" in part)
        user, token = fields.get("user", ""), fields.get("auth", "").removeprefix("Bearer ")
        if token and self.bed.tokens.get(user) == token:
            return AuthResult(success=True, auth_data=user)
        error = json.dumps({"status": "401", "schemes": "bearer", "scope": "mail"})
        if await server.challenge_auth(error) is MISSING:
            return AuthResult(success=False, handled=True)
        return AuthResult(success=False, handled=False,
                          message="535 5.7.8 Authentication unsuccessful")

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.bed.arrived.set()
        while not self.bed.release.is_set():  # the server's loop answers the others meanwhile
            await asyncio.sleep(0.05)
        with self.bed.lock:
            self.bed.received.append(Received(envelope.mail_from, tuple(envelope.rcpt_tos),
                                              bytes(envelope.original_content)))
        return "250 OK: queued"


class SmtpBed:
    def __init__(self, base: Path, addresses: dict[str, str],
                 tokens: dict[str, str] | None = None,
                 tls: tuple[Path, Path] | None = None) -> None:
        """``addresses``: msmtp account name -> its from address; ``tokens``: login ->
        the OAuth2 access token it must sign in with (XOAUTH2) before it may send; ``tls``:
        the certificate and key it shows after STARTTLS, which it then requires."""
        self.base = Path(base)
        self.addresses = addresses
        self.port = free_port()
        self.rc = self.base / "msmtprc"
        self.received: list[Received] = []
        self.reject: str | None = None
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.release.set()
        self.arrived = threading.Event()
        self.tokens = dict(tokens or {})
        # AUTH is offered without TLS only when asked for (loopback, test tokens); that it is
        # required then is _Handler's to say (aiosmtpd warns about auth_required without TLS).
        starttls: dict[str, Any] = {}
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*tls)
            starttls = {"tls_context": context, "require_starttls": True}
        self.controller = Controller(_Handler(self), hostname=HOST, port=self.port,
                                     auth_require_tls=not self.tokens, **starttls)

    def start(self) -> SmtpBed:
        self.base.mkdir(parents=True, exist_ok=True)
        lines = ["defaults", "auth off", "tls off", f"host {HOST}", f"port {self.port}", ""]
        for account, address in self.addresses.items():
            lines += [f"account {account}", f"from {address}", ""]
        self.rc.write_text("\n".join(lines))
        self.rc.chmod(0o600)  # msmtp refuses a config others can read
        self.controller.start()
        return self

    def stop(self) -> None:
        self.controller.stop()

    def command(self, *extra: str) -> list[str]:
        return ["msmtp", "-C", str(self.rc), *extra]

    def send_settings(self, **options: object) -> str:
        """A ``[send]`` table (TOML) for fmail.toml: enabled, this bed's command, options."""
        lines = ["[send]", "enabled = true", f"command = {self.command()!r}".replace("'", '"')]
        for key, value in options.items():
            rendered = str(value).lower() if isinstance(value, bool) else repr(value)
            lines.append(f"{key} = {rendered}".replace("'", '"'))
        return "\n".join(lines) + "\n"
