"""Time as fmail-nm writes it: aware UTC datetimes and the two text forms it stores; and
the machine's time zone, whose days a search counts in."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone, tzinfo


def utc_now() -> datetime:
    """Now, as an aware UTC datetime (the default clock wherever one can be injected)."""
    return datetime.now(timezone.utc)


# The last second a datetime holds (9999-12-31T23:59:59Z).
LAST_DATETIME = int(datetime.max.replace(microsecond=0, tzinfo=timezone.utc).timestamp())


def iso_from_epoch(epoch: int | None) -> str | None:
    """``2026-12-03T07:26:50Z`` for a notmuch date; None for 0, which notmuch reports for a
    message without a (parseable) Date header."""
    if not epoch:
        return None
    # notmuch keeps a Date of the last day of 9999 west of UTC as it is, in year 10000 UTC,
    # past what datetime holds: such a message (spam) failed the whole index and every read
    # listing it, so it shows as the last second datetime holds
    moment = datetime.fromtimestamp(min(epoch, LAST_DATETIME), timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def utc_stamp(moment: datetime | None = None) -> str:
    """A moment (default now) as the sidecar stores it: ISO 8601, UTC, seconds, ``Z``."""
    return (moment or utc_now()).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class _MachineZone(tzinfo):
    """The machine's time zone, with the offset it has at each moment (the C library's
    rules, as notmuch reads dates): ``astimezone()`` alone fixes one moment's offset, an
    hour off for every date across a DST switch."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        if dt is None:
            return None
        wall = dt.replace(tzinfo=None)
        return wall - _moment(wall).astimezone(timezone.utc).replace(tzinfo=None)

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None  # the C library tells offsets, not which part of one is DST

    def tzname(self, dt: datetime | None) -> str | None:
        return None if dt is None else _moment(dt.replace(tzinfo=None)).tzname()

    def fromutc(self, dt: datetime) -> datetime:
        moment = dt.replace(tzinfo=timezone.utc).astimezone()
        wall = moment.replace(tzinfo=self)
        # A repeated hour's second reading is fold=1 (PEP 495).
        return wall if wall.utcoffset() == moment.utcoffset() else wall.replace(fold=1)


def _moment(wall: datetime) -> datetime:
    """The moment a naive local wall-clock time is, as PEP 495 reads one: fold=0 is the
    first reading of a repeated hour, and a skipped time has the offset before the switch
    (fold=1, after it) -- the other way round from CPython's astimezone()."""
    try:
        moment = wall.astimezone()
        if moment.replace(tzinfo=None) != wall:  # skipped by a switch (DST, or a whole day)
            moment = wall.replace(fold=1 - wall.fold).astimezone()
        return moment
    except (ValueError, OverflowError, OSError):
        # Beyond what the C library reads (0001-01-01): no mail is dated there.
        return wall.replace(tzinfo=timezone.utc)


MACHINE_ZONE: tzinfo = _MachineZone()
