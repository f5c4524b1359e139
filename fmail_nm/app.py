"""Load everything a command needs: fmail.toml, notmuch's resolved settings, the accounts."""

from __future__ import annotations

from pathlib import Path

from .config import Config, ConfigError, Settings, load_settings, resolve
from .store.notmuch_cli import notmuch_settings, user_settings_as_written
from .store.notmuch_config import config_list, find_notmuch_config, new_config_path


def notmuch_addresses(nm: dict[str, str]) -> tuple[str, ...]:
    primary = nm.get("user.primary_email", "")
    # A list as notmuch reads it: `other_email=a@x; b@y` names b@y, not " b@y".
    return tuple(a for a in [primary.strip(), *config_list(nm.get("user.other_email"))] if a)


def notmuch_config_not_found(settings: Settings) -> str | None:
    """``notmuch config not found: PATH`` when libnotmuch would find no config file for
    fmail.toml's setup, naming where it looked last; None when it finds one."""
    if find_notmuch_config(settings.notmuch_config) is not None:
        return None
    return f"notmuch config not found: {new_config_path(settings.notmuch_config)}"


def load_config(path: str | Path | None = None) -> Config:
    """fmail.toml (or defaults) resolved against the notmuch setup libnotmuch would use."""
    settings = load_settings(path)
    nm = notmuch_settings(settings.notmuch_config)
    mail_root = nm.get("database.mail_root") or nm.get("database.path")
    if not mail_root and (missing := notmuch_config_not_found(settings)):
        raise ConfigError(f"{missing}; run `fmail-nm init --mail-root DIR` to create it")
    if not mail_root:
        raise ConfigError("notmuch has no database.path; run `fmail-nm init --mail-root DIR`")
    # Not notmuch's guesses (user@hostname): only the addresses its config file names.
    return resolve(settings, Path(mail_root), notmuch_addresses(
        user_settings_as_written(nm, settings.notmuch_config)))
