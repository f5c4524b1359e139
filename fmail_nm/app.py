"""Load everything a command needs: fmail.toml, notmuch's resolved settings, the accounts."""

from __future__ import annotations

from pathlib import Path

from .config import Config, ConfigError, load_settings, resolve
from .store.notmuch_cli import notmuch_settings, user_settings_as_written
from .store.notmuch_config import find_notmuch_config, new_config_path


def notmuch_addresses(nm: dict[str, str]) -> tuple[str, ...]:
    primary = nm.get("user.primary_email", "")
    others = [a for a in nm.get("user.other_email", "").split(";") if a]
    return tuple(a for a in [primary, *others] if a)


def load_config(path: str | Path | None = None) -> Config:
    """fmail.toml (or defaults) resolved against the notmuch setup libnotmuch would use."""
    settings = load_settings(path)
    nm = notmuch_settings(settings.notmuch_config)
    mail_root = nm.get("database.mail_root") or nm.get("database.path")
    if not mail_root and find_notmuch_config(settings.notmuch_config) is None:
        raise ConfigError(f"notmuch config not found: {new_config_path(settings.notmuch_config)}; "
                          "run `fmail-nm init --mail-root DIR` to create it")
    if not mail_root:
        raise ConfigError("notmuch has no database.path; run `fmail-nm init --mail-root DIR`")
    # Not notmuch's guesses (user@hostname): only the addresses its config file names.
    return resolve(settings, Path(mail_root), notmuch_addresses(
        user_settings_as_written(nm, settings.notmuch_config)))
