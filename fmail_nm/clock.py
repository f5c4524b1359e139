"""Time as fmail-nm writes it: aware UTC datetimes and the two text forms it stores."""

from __future__ import annotations

from datetime import datetime, timezone


def utc_now() -> datetime:
    """Now, as an aware UTC datetime (the default clock wherever one can be injected)."""
    return datetime.now(timezone.utc)


def iso_from_epoch(epoch: int | None) -> str | None:
    """``2026-12-03T07:26:50Z`` for a notmuch date; None for 0, which notmuch reports for a
    message without a (parseable) Date header."""
    if not epoch:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc_stamp(moment: datetime | None = None) -> str:
    """A moment (default now) as the sidecar stores it: ISO 8601, UTC, seconds, ``Z``."""
    return (moment or utc_now()).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
