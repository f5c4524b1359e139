"""How tools are registered: annotations, compact schemas and results, plain argument errors,
and the one mapping of fmail-nm's errors to what the model reads.

Every tool result has structured content checked against its output schema by the client,
and a text block written for the model (``tools.render``); the schemas are trimmed and flat so
the whole tool list stays small and the client's check stays cheap.  A tool registered here
gets all of that without code of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError as McpToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from ..config import TOOL_PROFILES as PROFILES
from ..errors import BackendError, FmailError
from ..tools import render

# destructive and idempotent hints mean nothing for a tool that changes nothing (MCP spec).
READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
# The writes leave out the hints that hold the spec's default (readOnlyHint and
# idempotentHint false): every byte of the tool list is read by the model.
# Writes that can be reverted by setting the opposite state (read/unread, tags, archive).
WRITE = ToolAnnotations(destructive_hint=False, idempotent_hint=True, open_world_hint=False)
# Writes that take mail out of sight (Trash, Junk) or drop the user's notes.
DESTRUCTIVE = ToolAnnotations(destructive_hint=True, idempotent_hint=True, open_world_hint=False)
# Saving a draft or undoing: a new change each time (not idempotent), nothing leaves the machine.
DRAFT = ToolAnnotations(destructive_hint=False, open_world_hint=False)
UNDO = DRAFT
# Sending: mail leaves for other people and cannot be taken back.
SEND = ToolAnnotations(destructive_hint=True, open_world_hint=True)


def tool_error(exc: FmailError) -> McpToolError:
    """The error the model reads.  A caller error says what to change in the request; a
    backend error says the request was fine, so the model does not rewrite it over a busy or
    broken mail store (see errors.py)."""
    if isinstance(exc, BackendError):
        return McpToolError(f"fmail-nm could not do this (not a problem with the request): "
                            f"{exc}")
    return McpToolError(str(exc))


def _compact_schema(schema: Any, *, output: bool = False) -> Any:
    """A generated JSON schema trimmed: no "title" (it repeats the property name) and
    ``anyOf [{type: T}, {type: null}]`` as ``type: [T, null]``.  An output schema is also made
    flat: every ``$ref`` inlined (no ``$defs``), no annotations, and the fields spelled out
    for the result but not deeper, where a value is checked for its type only, and a list for
    being a list (not item by item).  That keeps the tool list small, and the client checks
    every result against the schema: a flat one is quick to check."""
    defs = schema.get("$defs", {}) if isinstance(schema, dict) else {}
    return _trim(schema, defs, OUTPUT_DEPTH if output else None)


# How many levels of an output's objects have their fields in the schema: the result's own.
OUTPUT_DEPTH = 1


def _trim(node: Any, defs: dict[str, Any], depth: int | None) -> Any:
    """``depth``: None for an input schema; for an output schema, the levels of fields left."""
    if isinstance(node, list):
        return [_trim(item, defs, depth) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if depth is not None and isinstance(ref, str) and ref.startswith("#/$defs/"):
        return _trim(defs[ref.removeprefix("#/$defs/")], defs, depth)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            if depth is None or depth > 0:
                inner = None if depth is None else depth - 1
                out[key] = {name: _trim(prop, defs, inner) for name, prop in value.items()}
        elif key == "required" and depth == 0:
            continue
        elif key in (_OUTPUT_ANNOTATIONS if depth is not None else _INPUT_UNSHOWN):
            continue
        elif key == "items" and depth is not None and _types_only(_trim(value, defs, depth)):
            # A list whose items have no fields spelled out is checked as a list: the client
            # builds a validator for every item it checks (a 50-row search page cost the SDK's
            # client 2 ms a call), to learn no more than the field's description says.
            continue
        elif not (key == "default" and value in (None, "", [], False)):  # optional says it
            out[key] = _trim(value, defs, depth)
    return _nullable(out)


def _types_only(schema: Any) -> bool:
    """A schema that checks a value's type and nothing else (or nothing at all: ``{}``)."""
    return isinstance(schema, dict) and set(schema) <= {"type"}


def _scalar(schema: Any) -> bool:
    return isinstance(schema, dict) and set(schema) == {"type"} and schema["type"] in (
        "string", "integer", "number", "boolean")


# Keywords that annotate without constraining ("format" is not checked by default either).
_OUTPUT_ANNOTATIONS = frozenset({"title", "$defs", "description", "default", "format",
                                 "readOnly"})
# Left out of the input schemas the client sees: a title repeats the property name, and the
# caps on string lengths and list sizes are for hostile input, not guidance (the server still
# enforces them, with an error that says so: arguments are validated against the function's
# own model, not this schema).
_INPUT_UNSHOWN = frozenset({"title", "maxLength", "maxItems"})


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    """``anyOf [X, {type: null}]`` as X with ``type: [T, "null"]`` when X has one type: the
    same set of values (X's other keywords apply to T only) unless X lists values (enum)."""
    options = node.get("anyOf")
    if isinstance(options, list) and all(_scalar(o) or o == {"type": "array"} or
                                         o == {"type": "null"} for o in options):
        # A choice of bare types is one "type" list: the same values, fewer bytes.
        merged = {k: v for k, v in node.items() if k != "anyOf"}
        return {**merged, "type": [o["type"] for o in options]}
    if not (isinstance(options, list) and len(options) == 2 and {"type": "null"} in options):
        return node
    other = next(o for o in options if o != {"type": "null"})
    if not isinstance(other.get("type"), str) or {"enum", "const"} & set(other):
        return node
    merged = {k: v for k, v in node.items() if k != "anyOf"}
    return {**merged, **other, "type": [other["type"], "null"]}


def _output_schema(tool: Tool) -> Any:
    """The schema of what the tool sends: a result model's serialised form (its computed
    fields in, excluded fields out), which the SDK's own schema (of the input form) is not."""
    model = tool.fn_metadata.output_model
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model.model_json_schema(mode="serialization")
    return tool.fn_metadata.output_schema


def _result(result: BaseModel) -> CallToolResult:
    """A tool result: the structured content without fields that hold their default (the
    output schema does not require those), and the text the model reads (tools.render)."""
    data = result.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    return CallToolResult(content=[TextContent(type="text", text=render.text_of(result, data))],
                          structured_content=data)


def _lean_result(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The tool answering with :func:`_result`; the output schema still comes from ``fn``'s
    return annotation, which ``wraps`` keeps."""
    @functools.wraps(fn)
    async def tool(*args: Any, **kwargs: Any) -> CallToolResult:
        return _result(await fn(*args, **kwargs))
    return tool


def plain_validation_error(exc: ValidationError) -> str:
    """Argument errors in plain words: which argument, what is wrong, without pydantic's
    headings, input echo (which may be 100 KB) or documentation links."""
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in error.get("loc", ())) or "arguments"
        problems.append(f"{where}: {error.get('msg', 'invalid value')}")
    return "invalid arguments: " + "; ".join(problems)


def argument_problem(arguments: dict[str, Any], parameters: dict[str, Any]) -> str | None:
    """What the server cannot take as given in these arguments, or None.  The SDK drops an
    argument the tool does not have, so a misspelt ``dry_run`` or ``is_read`` would write, or
    write the opposite; and the values end up in libnotmuch's C strings, which a NUL cuts
    short (``flagged\\0x`` is the tag ``flagged``; ``<id>\\0x`` acts on ``<id>``); and a
    boolean is not a number (see _takes_bool).  Checked
    here rather than in the schema: every byte of the tool list is read by the model."""
    known = parameters.get("properties", {})
    if unknown := [name for name in arguments if name not in known]:
        return (f"unknown argument {', '.join(map(repr, unknown))}: this tool takes "
                f"{', '.join(known) or 'no arguments'}")
    for name, value in arguments.items():
        if _holds_nul(value):
            return f"{name}: holds a NUL character (\\x00); remove it"
        if isinstance(value, bool) and not _takes_bool(known[name]):
            return f"{name}: {str(value).lower()} is not a number; give an integer"
    return None


def _takes_bool(schema: Any) -> bool:
    """Whether a parameter's (compact) schema lets a boolean through.  Pydantic takes true
    as 1 for an integer, which JSON Schema does not: ``limit: true`` read one message,
    ``index: true`` attachment 1, ``confirm_count: true`` confirmed a one-message write."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    kinds = {kind} if isinstance(kind, str) else set(kind or ())
    return not kinds & {"integer", "number"} or "boolean" in kinds


def _holds_nul(value: Any) -> bool:
    """Whether a JSON value holds a NUL in any string, however deeply nested (a loop, not
    recursion: the nesting is the caller's)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
    return False


# The HTTP session the tool call being run came in on (set by _Tool.run for the call's task):
# writes record it, and undo_last_write reverts the session's own.  None where the request
# has none -- stdio, whose one session is the server process's, and the sessionless protocol
# of 2026-07-28.
CALLING_SESSION: ContextVar[str | None] = ContextVar("calling_session", default=None)


def _session_of(context: Any) -> str | None:
    """The HTTP session id a request came with -- on the handshake protocols only, where the
    transport checked that it names the session the request came in on."""
    if context is None or context.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return None
    headers = context.headers
    return headers.get(MCP_SESSION_ID_HEADER) if headers is not None else None


class _Tool(Tool):
    """A tool whose argument errors read as plain sentences (see plain_validation_error), and
    that refuses arguments it would otherwise drop or cut short (see argument_problem); it
    runs with CALLING_SESSION set."""

    async def run(self, arguments: dict[str, Any], context: Any,
                  convert_result: bool = False) -> Any:
        problem = argument_problem(arguments, self.parameters)
        if problem is not None:
            raise McpToolError(f"invalid arguments: {problem}")
        token = CALLING_SESSION.set(_session_of(context))
        try:
            return await super().run(arguments, context, convert_result)
        except McpToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise McpToolError(plain_validation_error(exc.__cause__)) from None
            raise
        finally:
            CALLING_SESSION.reset(token)


class ToolList(list[Tool]):
    """Collects the tools of one profile with their annotations, trimmed schemas and lean
    results (see _result)."""

    def __init__(self, profile: str = "all") -> None:
        super().__init__()
        if profile not in PROFILES:
            raise ValueError(f"unknown tool profile {profile!r}; one of {', '.join(PROFILES)}")
        self.profile = profile

    def tool(self, annotations: ToolAnnotations = READ_ONLY, description: str | None = None, *,
             profile: str = "all", report: bool = False,
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a tool if it belongs to this list's profile (``profile``: the smallest
        that holds it).  ``report``: the result is a short report the model reads as text (a
        write's outcome): its output schema says only that it is an object, which keeps ten
        write tools from repeating the same fields in the tool list."""
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if PROFILES.index(profile) > PROFILES.index(self.profile):
                return fn
            # A docstring's indentation would be sent to the model with every tool list.
            text = description or " ".join((fn.__doc__ or "").split())
            tool = _Tool.from_function(_lean_result(fn), description=text,
                                      annotations=annotations)
            tool.parameters = _compact_schema(tool.parameters)
            tool.fn_metadata.output_schema = ({"type": "object"} if report else _compact_schema(
                _output_schema(tool), output=True))
            # The structured content is a dump of the model the function returned, already
            # validated: the SDK's second validation of it would only cost time.
            tool.fn_metadata.output_model = None
            self.append(tool)
            return fn
        return register
