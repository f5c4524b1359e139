"""iCalendar data (RFC 5545) as the few lines a reader asks about: what the event is, when,
where, who organizes it, who is invited and who answered, whether it repeats or is cancelled.

A hand-written reader of that subset rather than the ``icalendar`` package: a summary needs
content lines, parameters, TEXT escapes and the date forms, about what this module holds,
while the package would add a dependency (with python-dateutil and a time-zone database),
build the whole object tree of any size it is given, and raise on some of the malformed
content lines mail carries. Times are
shown as written, in their own zone: converting them would need the VTIMEZONE rules, which a
reader does not need to tell when a meeting is.

Pure and never raises; the input is untrusted, so what is read is capped (bytes, lines,
events, attendees, field lengths) and every field shown goes through the same one-line and
tidy helpers as the rest of a message's text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from .text import one_line, tidy

__all__ = ["CalendarSummary", "summarize_calendar", "unfold"]

MAX_CHARS = 512 * 1024  # of iCalendar text read: a summary's worth is far less
MAX_LINES = 20_000  # content lines read, after unfolding
MAX_DEPTH = 8  # components nested in one another (VCALENDAR > VEVENT > VALARM is 3)
MAX_EVENTS = 10  # events shown; more are counted
MAX_ATTENDEES = 12  # attendees shown per event; more are counted
FIELD_CHARS = 200  # a one-line field (title, place, address, rule)
URL_CHARS = 400
DESCRIPTION_CHARS = 1000
HTML_DESCRIPTION_CHARS = 16 * 1024  # of an HTML description rendered (html2text: ≈ 1.5 ms/KB)
MAX_DATES = 8  # dates shown of an event's EXDATE or RDATE; more are counted


@dataclass(frozen=True)
class CalendarSummary:
    text: str
    problems: list[str]  # what could not be read, for the caller's notes or defects
    from_html: bool = False  # a description was rendered from HTML


HtmlToText = Callable[[str], str]
"""HTML in, tidy text out; never raises (``mime.html_text`` with a renderer)."""


def summarize_calendar(data: str, method: str = "",
                       render_html: HtmlToText | None = None) -> CalendarSummary | None:
    """A short summary of every event in ``data``; None when it holds no event to summarize
    (the caller shows the raw text instead). ``method`` is the iTIP method of the MIME part
    (its Content-Type parameter), for data that names none; ``render_html`` reads an event's
    HTML description (X-ALT-DESC) when it has no plain one."""
    try:
        calendar = _read(data)
    except Exception:  # noqa: BLE001 - last line of defence for untrusted input
        return None
    if not calendar.events:
        return None
    calendar.method = calendar.method or one_line(method).upper()[:FIELD_CHARS]
    try:
        return _summary(calendar, render_html)
    except Exception:  # noqa: BLE001
        return None


# --------------------------------------------------------------------------------------------
# Reading content lines


Params = dict[str, str]


@dataclass
class _Event:
    first: dict[str, tuple[Params, str]] = field(default_factory=dict)  # first of each name
    attendees: list[tuple[Params, str]] = field(default_factory=list)
    more_attendees: int = 0
    dates: dict[str, list[tuple[Params, str]]] = field(default_factory=dict)  # _DATE_LISTS
    more_dates: dict[str, int] = field(default_factory=dict)


@dataclass
class _Calendar:
    method: str = ""
    events: list[_Event] = field(default_factory=list)
    more_events: int = 0
    problems: list[str] = field(default_factory=list)


_FOLD = re.compile(r"\n[ \t]")
_FOLD_BYTES = re.compile(rb"(?:\r\n|\n|\r)[ \t]")


def unfold(data: bytes) -> bytes:
    """Content lines unfolded before they are decoded: RFC 5545 folds at 75 octets, and some
    writers fold inside a multi-octet UTF-8 character, which decoding each half would break."""
    return _FOLD_BYTES.sub(b"", data)


_NAME = re.compile(r"[A-Za-z0-9-]+")
_PARAM_VALUE = r'(?:"[^"]*"|[^";:,]*)'
_PARAM = re.compile(rf';([A-Za-z0-9-]+)=({_PARAM_VALUE}(?:,{_PARAM_VALUE})*)')


def _read(data: str) -> _Calendar:
    calendar = _Calendar()
    if len(data) > MAX_CHARS:
        data = data[:MAX_CHARS]
        calendar.problems.append(f"calendar data read only to its first {MAX_CHARS // 1024} KB")
    lines = _FOLD.sub("", data.replace("\r\n", "\n").replace("\r", "\n")).split("\n", MAX_LINES)
    if len(lines) > MAX_LINES:
        lines.pop()
        calendar.problems.append(f"calendar data read only to its first {MAX_LINES} lines")
    unreadable = 0
    stack: list[str] = []  # the components the line is in, outermost first
    event: _Event | None = None
    for line in lines:
        if not line.strip():
            continue
        parsed = _content_line(line)
        if parsed is None:
            unreadable += 1
            continue
        name, params, value = parsed
        if name in ("BEGIN", "END"):
            event = _nest(calendar, stack, name, value.strip().upper(), event)
        elif event is not None and _in_event(stack):
            _keep(event, name, params, value)
        elif stack == ["VCALENDAR"] and name == "METHOD":
            calendar.method = one_line(value).upper()[:FIELD_CHARS]
    if unreadable:
        calendar.problems.append(f"{unreadable} calendar line(s) could not be read")
    if stack:
        calendar.problems.append("calendar data ends inside " + stack[-1])
    return calendar


def _content_line(line: str) -> tuple[str, Params, str] | None:
    """name, parameters (names upper-cased, quotes removed) and value of one unfolded line;
    None when it is not a content line."""
    name = _NAME.match(line)
    if name is None:
        return None
    params: Params = {}
    pos = name.end()
    while pos < len(line) and line[pos] == ";":
        param = _PARAM.match(line, pos)
        if param is None:
            return None
        param_value = _caret_unescape(param.group(2).replace('"', ""))
        params.setdefault(param.group(1).upper(), param_value)
        pos = param.end()
    if pos >= len(line) or line[pos] != ":":
        return None
    return name.group().upper(), params, line[pos + 1:]


_CARET_ESCAPE = re.compile(r"\^([n^'])")
_CARET_CHARS = {"n": "\n", "^": "^", "'": '"'}


def _caret_unescape(value: str) -> str:
    """A parameter value as meant: RFC 6868's ``^n`` is a line break, ``^^`` a caret and
    ``^'`` a double quote (which a quoted value cannot hold otherwise)."""
    return _CARET_ESCAPE.sub(lambda m: _CARET_CHARS[m.group(1)], value)


def _nest(calendar: _Calendar, stack: list[str], begin_or_end: str, component: str,
          event: _Event | None) -> _Event | None:
    """Follow BEGIN/END; the event being read, if any, after the line."""
    if begin_or_end == "BEGIN":
        if component == "VEVENT" and component in stack:  # the last one's END is missing
            calendar.problems.append("an event in the calendar data has no END")
            del stack[stack.index(component):]
        if len(stack) >= MAX_DEPTH:  # no summary needs it; deeper lines read as outside
            return event
        stack.append(component)
        if _in_event(stack):  # not in VALARM, VTIMEZONE and the rest: those are not shown
            if len(calendar.events) < MAX_EVENTS:
                event = _Event()
                calendar.events.append(event)
            else:
                calendar.more_events += 1
                event = None
        return event
    if component in stack:  # an END without its BEGIN is ignored
        del stack[len(stack) - 1 - stack[::-1].index(component):]
    return event if _in_event(stack) else None


def _in_event(stack: list[str]) -> bool:
    """Whether a line is an event's own property (a lone VEVENT, without its VCALENDAR
    around it, is read too)."""
    return stack in (["VCALENDAR", "VEVENT"], ["VEVENT"])


def _keep(event: _Event, name: str, params: Params, value: str) -> None:
    if name == "ATTENDEE":
        if len(event.attendees) < MAX_ATTENDEES:
            event.attendees.append((params, value))
        else:
            event.more_attendees += 1
    elif name in _DATE_LISTS:
        _keep_dates(event, name, params, value)
    else:
        event.first.setdefault(name, (params, value))


# Dates left out of a repeating event, and dates it has besides its rule: each property may
# come many times, each time with a list of dates.
_DATE_LISTS = ("EXDATE", "RDATE")


def _keep_dates(event: _Event, name: str, params: Params, value: str) -> None:
    kept = event.dates.setdefault(name, [])
    room = MAX_DATES - len(kept)
    values = value.split(",", room) if room > 0 else [value]
    if len(values) > room:  # the last item holds the rest of the list, unsplit
        event.more_dates[name] = event.more_dates.get(name, 0) + values.pop().count(",") + 1
    kept.extend((params, item) for item in values)


# --------------------------------------------------------------------------------------------
# The summary


_TITLES = {
    "REQUEST": "Invitation", "CANCEL": "Cancelled", "REPLY": "Reply",
    "PUBLISH": "Event", "": "Event", "COUNTER": "Counter-proposal",
    "DECLINECOUNTER": "Counter-proposal declined", "ADD": "Added occurrences",
    "REFRESH": "Asks for the latest version",
}


def _summary(calendar: _Calendar, render_html: HtmlToText | None) -> CalendarSummary:
    blocks = ["\n".join(_event_lines(calendar.method, event, render_html))
              for event in calendar.events]
    if calendar.more_events:
        blocks.append(f"and {calendar.more_events} more events")
    from_html = render_html is not None and any(
        not _plain_description(event) and _html_description(event) for event in calendar.events)
    return CalendarSummary("\n\n".join(blocks), list(dict.fromkeys(calendar.problems)),
                           from_html)


def _event_lines(method: str, event: _Event, render_html: HtmlToText | None) -> list[str]:
    title = _TITLES.get(method, f"Event (method {method})")
    lines = [f"{title}: {_text(event, 'SUMMARY', FIELD_CHARS) or '(no title)'}"]
    labelled = [
        ("When", _when(event)),
        ("Occurrence", _moment_text(event, "RECURRENCE-ID")),
        ("Repeats", _capped(_one_line(event, "RRULE"), FIELD_CHARS)),
        ("Except", _date_list(event, "EXDATE")),
        ("Also on", _date_list(event, "RDATE")),
        ("Where", _text(event, "LOCATION", FIELD_CHARS)),
        ("Status", _status(event, method)),
        ("Organizer", _person(*event.first["ORGANIZER"]) if "ORGANIZER" in event.first else ""),
        ("Answer" if method == "REPLY" else "Attendees", _attendees(event, method)),
        ("URL", _capped(_one_line(event, "URL"), URL_CHARS)),
        ("Comment", _text(event, "COMMENT", FIELD_CHARS)),
    ]
    lines.extend(f"{label}: {value}" for label, value in labelled if value)
    if description := _description(event, render_html):
        lines.append(f"Description: {description}")
    return lines


def _value(event: _Event, name: str) -> str:
    return event.first[name][1] if name in event.first else ""


def _one_line(event: _Event, name: str) -> str:
    return one_line(_value(event, name))


def _text(event: _Event, name: str, limit: int) -> str:
    return _capped(one_line(_unescape(_value(event, name)[:limit * 4])), limit)


def _description(event: _Event, render_html: HtmlToText | None) -> str:
    """The plain description, else (an event some clients describe only in HTML) the HTML
    one rendered as text."""
    text = _plain_description(event)
    if not text and render_html is not None and (html := _html_description(event)):
        text = render_html(_unescape(html))
    return _capped(text, DESCRIPTION_CHARS)


def _plain_description(event: _Event) -> str:
    return tidy(_unescape(_value(event, "DESCRIPTION")[:DESCRIPTION_CHARS * 4]))


def _html_description(event: _Event) -> str:
    """The value of X-ALT-DESC;FMTTYPE=text/html (Outlook's), cut to what is rendered."""
    params, value = event.first.get("X-ALT-DESC", ({}, ""))
    if params.get("FMTTYPE", "").strip().lower() != "text/html":
        return ""
    return value[:HTML_DESCRIPTION_CHARS]


_ESCAPE = re.compile(r"\\(.)", re.S)


def _unescape(value: str) -> str:
    r"""A TEXT value as written: ``\n`` and ``\N`` are line breaks, ``\,`` ``\;`` ``\\``
    their character (and any other escaped character itself, as lenient readers do)."""
    return _ESCAPE.sub(lambda m: "\n" if m.group(1) in "nN" else m.group(1), value)


def _capped(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def _status(event: _Event, method: str) -> str:
    status = _one_line(event, "STATUS").lower()[:FIELD_CHARS]
    if status == "confirmed" or (status == "cancelled" and method == "CANCEL"):
        return ""  # the default, or said by the title already
    return status


def _person(params: Params, value: str) -> str:
    """"Name <address>", or the address alone when there is no other name."""
    address = value.strip()
    if address[:7].lower() == "mailto:":
        address = address[7:]
    address = _capped(one_line(address), FIELD_CHARS)
    name = _capped(one_line(params.get("CN", "")), FIELD_CHARS)
    if not name or name.lower() == address.lower():
        return address
    if _SPECIALS.search(name):  # "Raman, Priya" in a list separated by commas
        name = '"' + name.replace('"', "") + '"'
    return f"{name} <{address}>" if address else name


_SPECIALS = re.compile(r'[,;<>"]')


_ROLES = {"OPT-PARTICIPANT": "optional", "NON-PARTICIPANT": "for information"}
_KINDS = {"ROOM": "room", "RESOURCE": "resource", "GROUP": "group"}


def _attendees(event: _Event, method: str) -> str:
    shown = [_attendee(params, value, method) for params, value in event.attendees]
    if event.more_attendees:
        shown.append(f"and {event.more_attendees} more")
    return ", ".join(shown)


def _attendee(params: Params, value: str, method: str) -> str:
    """An attendee with what sets them apart: their answer (a pending one goes unsaid, except
    in a reply, where the answer is the point), an optional role, a room."""
    answer = params.get("PARTSTAT", "NEEDS-ACTION").upper()
    kind = _KINDS.get(params.get("CUTYPE", "").upper(), "")
    marks = [
        kind or _ROLES.get(params.get("ROLE", "").upper(), ""),  # a room takes no part
        "" if answer == "NEEDS-ACTION" and method != "REPLY"
        else _capped(one_line(answer.lower().replace("-", " ")), FIELD_CHARS),
    ]
    said = ", ".join(mark for mark in marks if mark)
    return _person(params, value) + (f" ({said})" if said else "")


# --------------------------------------------------------------------------------------------
# Dates and times, shown as written: no zone conversion


@dataclass(frozen=True)
class _Moment:
    at: date | datetime
    zone: str  # "UTC", a TZID as written, or "" for a floating time or a date

    @property
    def all_day(self) -> bool:
        return not isinstance(self.at, datetime)


_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_DATE_TIME = re.compile(r"(\d{4})(\d{2})(\d{2})(?:T(\d{2})(\d{2})(\d{2})(Z?))?")
_DURATION = re.compile(r"([+-]?)P(?:(\d{1,6})W)?(?:(\d{1,6})D)?"
                       r"(?:T(?:(\d{1,6})H)?(?:(\d{1,6})M)?(?:(\d{1,8})S)?)?")


def _moment(event: _Event, name: str) -> _Moment | str | None:
    """A property's date or time; the value as written when it is not one; None if absent."""
    if name not in event.first:
        return None
    return _parsed_moment(*event.first[name])


def _parsed_moment(params: Params, value: str) -> _Moment | str:
    value = value.strip()
    found = _DATE_TIME.fullmatch(value)
    try:
        if found is None:
            raise ValueError(value)
        year, month, day, hour, minute, second, utc = found.groups()
        if hour is None:
            return _Moment(date(int(year), int(month), int(day)), "")
        at = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second))
    except ValueError:
        return _capped(one_line(value), FIELD_CHARS)
    return _Moment(at, "UTC" if utc else _capped(one_line(params.get("TZID", "")), FIELD_CHARS))


def _end(event: _Event, start: _Moment | str | None) -> _Moment | str | None:
    """DTEND, or the start plus DURATION (wall-clock arithmetic: the zone's rules are not read)."""
    if "DTEND" in event.first or not isinstance(start, _Moment):
        return _moment(event, "DTEND")
    found = _DURATION.fullmatch(_value(event, "DURATION").strip())
    if found is None or found.group(0) in ("P", "+P", "-P"):
        return None
    sign, weeks, days, hours, minutes, seconds = found.groups()
    length = timedelta(weeks=int(weeks or 0), days=int(days or 0), hours=int(hours or 0),
                       minutes=int(minutes or 0), seconds=int(seconds or 0))
    try:
        return _Moment(start.at + (-length if sign == "-" else length), start.zone)
    except OverflowError:
        return None


def _when(event: _Event) -> str:
    start = _moment(event, "DTSTART")
    if start is None:
        return ""
    end = _end(event, start)
    if isinstance(start, _Moment) and start.all_day and end is None:
        return f"{_date(start.at)} (all day)"  # one day (RFC 5545 3.6.1)
    if isinstance(start, _Moment) and isinstance(end, _Moment):
        if isinstance(start.at, datetime) and isinstance(end.at, datetime):
            return _time_span(start, start.at, end, end.at)
        if start.all_day and end.all_day:
            return _days(start.at, end.at)
    return _shown(start) if end is None else f"{_shown(start)} to {_shown(end)}"


def _time_span(start: _Moment, start_at: datetime, end: _Moment, end_at: datetime) -> str:
    """From start to end, the date and zone said once where both share them."""
    if end.zone != start.zone:
        return f"{_shown(start)} to {_shown(end)}"
    until = _time(end_at) if end_at.date() == start_at.date() else _date_time(end_at)
    return f"{_date_time(start_at)} to {until}{_zone(start)}"


def _days(first: date, end: date) -> str:
    """An all-day event's days: DTEND is the day after the last (RFC 5545 3.6.1)."""
    if end - first > timedelta(days=1):
        return f"{_date(first)} to {_date(end - timedelta(days=1))} (all day)"
    return f"{_date(first)} (all day)"


def _date_list(event: _Event, name: str) -> str:
    """The dates of an EXDATE or RDATE, briefly: the date alone where the time and zone are
    the event's start's (as they are when an occurrence is left out)."""
    start = _moment(event, "DTSTART")
    shown = [_date_of(_parsed_moment(params, value), start)
             for params, value in event.dates.get(name, [])]
    if more := event.more_dates.get(name, 0):
        shown.append(f"and {more} more")
    return ", ".join(shown)


def _date_of(moment: _Moment | str, start: _Moment | str | None) -> str:
    if (isinstance(moment, _Moment) and isinstance(start, _Moment) and moment.zone == start.zone
            and isinstance(moment.at, datetime) and isinstance(start.at, datetime)
            and moment.at.time() == start.at.time()):
        return _date(moment.at.date())
    return _shown(moment)


def _moment_text(event: _Event, name: str) -> str:
    found = _moment(event, name)
    return "" if found is None else _shown(found)


def _shown(moment: _Moment | str) -> str:
    if isinstance(moment, str):
        return moment
    if isinstance(moment.at, datetime):
        return _date_time(moment.at) + _zone(moment)
    return _date(moment.at)


def _zone(moment: _Moment) -> str:
    return f" ({moment.zone})" if moment.zone else ""


def _date(day: date) -> str:
    return f"{_WEEKDAYS[day.weekday()]} {day.isoformat()}"


def _time(at: datetime) -> str:
    return at.strftime("%H:%M:%S" if at.second else "%H:%M")


def _date_time(at: datetime) -> str:
    return f"{_date(at.date())} {_time(at)}"
