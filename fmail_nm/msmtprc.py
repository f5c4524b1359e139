"""Read the accounts of an msmtp configuration: which ``from`` addresses msmtp can send as.

Only ``account``, ``defaults``, ``from`` and ``host`` are kept (an account inherits from
``defaults`` and from the account it names after ``:``); passwords and ``passwordeval`` are
never read.  fmail-nm uses this to find the user's addresses and to check that each of them
has an account to send with.
"""

from __future__ import annotations

import fnmatch
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class MsmtpAccount:
    name: str
    from_address: str | None  # may be a pattern (msmtp 1.8.22+: ``from *@example.org``)
    host: str | None

    def sends_as(self, address: str) -> bool:
        if not self.from_address:
            return False
        return fnmatch.fnmatch(address.lower(), self.from_address.lower())


@dataclass(frozen=True)
class MsmtpConfig:
    path: Path
    accounts: dict[str, MsmtpAccount] = field(default_factory=dict)

    def account_for(self, address: str) -> MsmtpAccount | None:
        return next((a for a in self.accounts.values() if a.sends_as(address)), None)


def default_path() -> Path | None:
    """The file msmtp itself would read: ``~/.msmtprc``, else ``$XDG_CONFIG_HOME/msmtp/config``."""
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "msmtp" / "config"
    for candidate in (Path.home() / ".msmtprc", xdg):
        if candidate.is_file():
            return candidate
    return None


def _value(raw: str) -> str:
    try:
        parts = shlex.split(raw)
    except ValueError:
        return raw.strip()
    return " ".join(parts)


def parse(path: Path) -> MsmtpConfig:
    """Parse an msmtp configuration file; unknown commands are ignored."""
    config = MsmtpConfig(path=path)
    defaults: dict[str, str] = {}
    current: dict[str, str] | None = None
    settings: dict[str, dict[str, str]] = {}
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, rest = (line.split(None, 1) + [""])[:2]  # apart by spaces or tabs
        rest = rest.strip()
        if key == "defaults":
            current = defaults
        elif key == "account":
            name, _, parents = rest.partition(":")
            current = dict(defaults)
            for parent in parents.replace(",", " ").split():
                current.update(settings.get(parent.strip(), {}))
            settings[name.strip()] = current
        elif current is not None and key in ("from", "host"):
            current[key] = _value(rest)
    for name, values in settings.items():
        config.accounts[name] = MsmtpAccount(name=name, from_address=values.get("from"),
                                             host=values.get("host"))
    return config
