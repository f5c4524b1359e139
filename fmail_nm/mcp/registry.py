"""How tools are registered: annotations, compact schemas and results, plain argument errors,
and the one mapping of fmail-nm's errors to what the model reads.

Every tool result has structured content checked against its output schema by the client,
and a text block the model reads; the schemas are trimmed so the whole tool list stays small.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError as McpToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import ValidationError

from ..errors import BackendError, FmailError

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                            open_world_hint=False)
# Writes that can be reverted by setting the opposite state (read/unread, tags, archive).
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True,
                        open_world_hint=False)
# Writes that take mail out of sight (Trash, Junk) or drop the user's notes.
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                              open_world_hint=False)
# Saving a draft: a new file each time (not idempotent), nothing leaves the machine.
DRAFT = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                        open_world_hint=False)
# Sending: mail leaves for other people and cannot be taken back.
SEND = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False,
                       open_world_hint=True)
UNDO = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                       open_world_hint=False)


def tool_error(exc: FmailError) -> McpToolError:
    """The error the model reads.  A caller error says what to change in the request; a
    backend error says the request was fine, so the model does not rewrite it over a busy or
    broken mail store (see errors.py)."""
    if isinstance(exc, BackendError):
        return McpToolError(f"fmail-nm could not do this (not a problem with the request): "
                            f"{exc}")
    return McpToolError(str(exc))


def _compact_schema(schema: Any) -> None:
    """Trim a generated JSON schema in place without changing what it accepts: drop "title"
    (it repeats the property name) and write ``anyOf [{type: T}, {type: null}]`` as
    ``type: [T, null]``.  Keeps the whole tool list small for the model's context."""
    if isinstance(schema, list):
        for item in schema:
            _compact_schema(item)
        return
    if not isinstance(schema, dict):
        return
    if isinstance(schema.get("title"), str):
        del schema["title"]
    options = schema.get("anyOf")
    if (isinstance(options, list) and len(options) == 2 and {"type": "null"} in options):
        other = next(o for o in options if o != {"type": "null"})
        if set(other) == {"type"} and isinstance(other["type"], str):
            del schema["anyOf"]
            schema["type"] = [other["type"], "null"]
    for key, value in schema.items():
        if key == "properties" and isinstance(value, dict):
            for prop in value.values():
                _compact_schema(prop)
        elif key != "properties":
            _compact_schema(value)


def _compact_result(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The tool with its result's text block as compact JSON.  Clients hand the text block to
    the model; the SDK would indent it (about half of it whitespace).  The structured content
    and the output schema (from ``fn``'s annotations, which ``wraps`` keeps) are unchanged."""
    @functools.wraps(fn)
    async def tool(*args: Any, **kwargs: Any) -> CallToolResult:
        result = await fn(*args, **kwargs)
        data = result.model_dump(mode="json", by_alias=True)
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        return CallToolResult(content=[TextContent(type="text", text=text)],
                              structured_content=data)
    return tool


def plain_validation_error(exc: ValidationError) -> str:
    """Argument errors in plain words: which argument, what is wrong, without pydantic's
    headings, input echo (which may be 100 KB) or documentation links."""
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in error.get("loc", ())) or "arguments"
        problems.append(f"{where}: {error.get('msg', 'invalid value')}")
    return "invalid arguments: " + "; ".join(problems)


class _Tool(Tool):
    """A tool whose argument errors read as plain sentences (see plain_validation_error)."""

    async def run(self, arguments: dict[str, Any], context: Any,
                  convert_result: bool = False) -> Any:
        try:
            return await super().run(arguments, context, convert_result)
        except McpToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise McpToolError(plain_validation_error(exc.__cause__)) from None
            raise


class ToolList(list[Tool]):
    """Collects tools with their annotations; the schemas are trimmed to keep the list small."""

    def tool(self, annotations: ToolAnnotations = READ_ONLY,
             description: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            tool = _Tool.from_function(_compact_result(fn), description=description,
                                      annotations=annotations)
            _compact_schema(tool.parameters)
            _compact_schema(tool.output_schema)
            self.append(tool)
            return fn
        return register
