"""A real SMTP server on loopback (aiosmtpd) behind a real msmtp, for the send tests.

``SmtpBed(tmp).start()`` listens on 127.0.0.1 on a free port and writes an msmtprc (mode
0600, no TLS, no auth) with one msmtp account per address given; ``send_settings()`` is the
``[send]`` table that points fmail-nm's send command at it.  Every message the server takes
is kept in ``received`` with its envelope and exact bytes; ``reject`` makes it refuse the
next ones with an SMTP error, as a server refusing a recipient does.
"""

from __future__ import annotations

import email
import email.policy
import threading
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller

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
        if self.bed.reject is not None:
            return self.bed.reject
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self.bed.lock:
            self.bed.received.append(Received(envelope.mail_from, tuple(envelope.rcpt_tos),
                                              bytes(envelope.original_content)))
        return "250 OK: queued"


class SmtpBed:
    def __init__(self, base: Path, addresses: dict[str, str]) -> None:
        """``addresses``: msmtp account name -> its from address."""
        self.base = Path(base)
        self.addresses = addresses
        self.port = free_port()
        self.rc = self.base / "msmtprc"
        self.received: list[Received] = []
        self.reject: str | None = None
        self.lock = threading.Lock()
        self.controller = Controller(_Handler(self), hostname=HOST, port=self.port)

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
