"""Load everything a command needs: fmail.toml, notmuch's resolved settings, the accounts."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path

from .config import (ADDED_ACCOUNTS_FILE, Config, ConfigError, Settings, default_config_path,
                     load_settings, own_config_dir, resolve, users_mbsync_config)
from .store.notmuch import settings_of_database
from .store.notmuch_cli import notmuch_settings, user_settings_as_written
from .store.notmuch_config import (config_list, file_stamp, find_notmuch_config,
                                   new_config_path)

log = logging.getLogger(__name__)

# The notmuch settings a configuration is resolved with (the mail root, the addresses).
NOTMUCH_KEYS = ("database.mail_root", "database.path", "user.primary_email",
                "user.other_email")


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
    nm = settings_of_database(settings.notmuch_config, NOTMUCH_KEYS)
    if nm is None:  # no database yet, or a config notmuch cannot load: notmuch says which
        nm = notmuch_settings(settings.notmuch_config)
    mail_root = nm.get("database.mail_root") or nm.get("database.path")
    if not mail_root and (missing := notmuch_config_not_found(settings)):
        raise ConfigError(f"{missing}; run `fmail-nm init --mail-root DIR` to create it")
    if not mail_root:
        raise ConfigError("notmuch has no database.path; run `fmail-nm init --mail-root DIR`")
    # Not notmuch's guesses (user@hostname): only the addresses its config file names.
    return resolve(settings, Path(mail_root), notmuch_addresses(
        user_settings_as_written(nm, settings.notmuch_config)))


# How soon the MCP server's tools see an edit of the configuration's files, at most.
CONFIG_CHECK_INTERVAL = 1.0

# A file's identity and version as far as a reload cares; None: it is not there.
_Stamp = tuple[int, int, int] | None


def config_files(config: Config) -> tuple[Path | None, ...]:
    """The files a :func:`load_config` of this setup read: fmail.toml, accounts.toml (what
    `fmail-nm account add` writes), the user's mbsync config (accounts and channels come from
    it when fmail.toml names none) and the notmuch config (the mail root, addresses)."""
    settings = config.settings
    return (settings.path or default_config_path(), own_config_dir() / ADDED_ACCOUNTS_FILE,
            users_mbsync_config(settings), find_notmuch_config(settings.notmuch_config))


class LiveConfig:
    """The configuration of a long-running process, loaded again once one of the files it
    came from changed: the user edits fmail.toml (a tagging rule, a pull interval) or adds
    an account in another terminal while the service runs, and the hook -- which loads it per
    run -- and the service must not disagree until a restart.  An edit that does not load (a
    typo half-way through) keeps the last good configuration, said once per version of the
    files.  Whether sending is on stays as the process started (``serve --allow-send`` turns
    it on, and the tools a server offers are fixed when it starts).  Thread-safe."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._sending = config.settings.send.enabled
        self._stamps = self._read_stamps(config)
        self._lock = threading.Lock()
        self._checked = time.monotonic()

    def replace(self, config: Config) -> None:
        """A configuration this process changed itself (an account it added) and wrote."""
        with self._lock:
            self._config = config
            self._stamps = self._read_stamps(config)

    @staticmethod
    def _read_stamps(config: Config) -> tuple[_Stamp, ...]:
        return tuple(file_stamp(path) for path in config_files(config))

    def current(self, max_age: float = 0.0) -> Config:
        """The configuration, its files looked at again unless that was done less than
        ``max_age`` seconds ago (a dozen ``stat`` calls: for a caller as frequent as a tool
        call, which reads it several times, a tenth of a cheap read's time)."""
        with self._lock:
            now = time.monotonic()
            if now - self._checked < max_age:
                return self._config
            self._checked = now
            stamps = self._read_stamps(self._config)
            if stamps == self._stamps:
                return self._config
            self._stamps = stamps
            try:
                fresh = self._load()
            except (ConfigError, OSError) as exc:
                log.warning("the changed configuration does not load, keeping the one in use "
                            "until it is fixed: %s", exc)
                return self._config
            log.info("configuration changed: reloaded (%d account(s))", len(fresh.accounts))
            self._config = fresh
            self._stamps = self._read_stamps(fresh)  # what the new setup reads
            return fresh

    def _load(self) -> Config:
        fresh = load_config(self._config.settings.path)
        if fresh.settings.send.enabled == self._sending:
            return fresh
        send = dataclasses.replace(fresh.settings.send, enabled=self._sending)
        return dataclasses.replace(fresh, settings=dataclasses.replace(fresh.settings, send=send))
