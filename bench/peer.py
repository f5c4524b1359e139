"""fmail-nm side by side with a peer: the pinned PyPI ``mcp-server-notmuch`` (notmuch CLI per
call), on the same Maildir and notmuch database, in the same run, through the same clients.

The peer is installed into a virtualenv of its own in the bench cache (never into the project's
environment).  For each request -- a word search, a sender search, a one-month range, one
message, a 9-message thread, a tool that reads nothing -- both servers are timed through the
``mcp`` SDK's ``Client`` (which checks structured results against output schemas) and through
a bare JSON-RPC client, and the bytes a model receives are counted: the text block and the
structured content apart.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

PEER = "mcp-server-notmuch==3.0.0"
INSTALL_TIMEOUT = 600


def peer_venv(cache: Path) -> Path:
    """The peer's own virtualenv (created and installed on first use); its server command."""
    venv = cache / ("peer-" + PEER.replace("==", "-"))
    command = venv / "bin" / "mcp-server-notmuch"
    if not command.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", PEER], check=True,
                       timeout=INSTALL_TIMEOUT)
    return command


@dataclass(frozen=True)
class Request:
    """One request, as each server spells it."""

    label: str
    ours: tuple[str, dict[str, Any]]
    peer: tuple[str, dict[str, Any]]


def requests(searches: dict[str, str], message_id: str, thread_id: str) -> list[Request]:
    """``searches``: label -> (our DSL query, the notmuch query it compiles to), as
    ``"dsl\\tnotmuch"``; the peer gets the notmuch query, so both search the same thing."""
    out = []
    for label, both in searches.items():
        dsl, nm = both.split("\t")
        out.append(Request(label, ("search_emails", {"query": dsl, "limit": 50}),
                           ("mail_search", {"query": nm, "limit": 50})))
    out.append(Request("read one message", ("get_email", {"id": message_id}),
                       ("mail_read_message", {"message_id": message_id})))
    out.append(Request("read a 9-message thread", ("get_thread", {"thread_id": thread_id}),
                       ("mail_read_thread", {"thread_id": thread_id})))
    out.append(Request("a tool that reads nothing", ("list_available_accounts", {}),
                       ("mail_list_scopes", {})))
    return out


@dataclass
class Side:
    sdk_ms: dict[str, float] = field(default_factory=dict)
    raw_ms: dict[str, float] = field(default_factory=dict)
    text_bytes: dict[str, int] = field(default_factory=dict)
    structured_bytes: dict[str, int] = field(default_factory=dict)
    tool_list_bytes: int = 0


@dataclass
class SideBySide:
    ours: Side
    peer: Side
    labels: list[str]

    def rows(self) -> list[tuple[str, str]]:
        out = []
        for label in self.labels:
            o, p = self.ours, self.peer
            out.append((f"{label}: SDK ms ours / peer", _pair(o.sdk_ms[label], p.sdk_ms[label], ".2f")))
            out.append((f"{label}: bare ms ours / peer", _pair(o.raw_ms[label], p.raw_ms[label], ".2f")))
            peer_whole = p.text_bytes[label] + p.structured_bytes[label]
            out.append((f"{label}: text bytes ours / peer whole",
                        _pair(o.text_bytes[label], peer_whole, "d")))
            out.append((f"{label}: structured bytes ours / peer whole",
                        _pair(o.structured_bytes[label], peer_whole, "d")))
        out.append(("tool list bytes ours / peer", _pair(self.ours.tool_list_bytes,
                                                         self.peer.tool_list_bytes, "d")))
        return out


def _pair(a: float, b: float, fmt: str) -> str:
    ratio = f"{a / b:.2f}x" if b else "-"
    return f"{a:{fmt}} / {b:{fmt}} = {ratio}"


def p50(samples: Sequence[float]) -> float:
    ordered = sorted(samples)
    return round(ordered[len(ordered) // 2] * 1000, 3)


async def _timed(fn: Callable[[], Awaitable[object]], n: int) -> float:
    for _ in range(3):
        await fn()
    samples = []
    loop = asyncio.get_running_loop()
    for _ in range(n):
        start = loop.time()
        await fn()
        samples.append(loop.time() - start)
    return p50(samples)


async def sdk_side(argv: Sequence[str], env: dict[str, str], cwd: Path,
                   calls: Sequence[tuple[str, tuple[str, dict[str, Any]]]], n: int) -> Side:
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    side = Side()
    params = StdioServerParameters(command=argv[0], args=list(argv[1:]),
                                   env={**os.environ, **env}, cwd=str(cwd))
    async with Client(params) as client:
        tools = (await client.list_tools()).tools
        side.tool_list_bytes = sum(len(t.model_dump_json(by_alias=True, exclude_none=True))
                                   for t in tools)
        for label, (tool, args) in calls:
            async def call(tool: str = tool, args: dict[str, Any] = args) -> Any:
                result = await client.call_tool(tool, args)
                if result.is_error:
                    raise RuntimeError(f"{tool} {args} failed: {result.content}")
                return result
            result = await call()
            side.text_bytes[label] = sum(len(getattr(c, "text", "").encode()) for c in result.content)
            side.structured_bytes[label] = wire_json_bytes(result.structured_content)
            side.sdk_ms[label] = await _timed(call, n)
    return side


def wire_json_bytes(value: Any) -> int:
    """Bytes of a structured result as the JSON-RPC message carries it (compact UTF-8 JSON,
    as the SDK serialises it); 0 for none."""
    if value is None:
        return 0
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def raw_side(argv: Sequence[str], env: dict[str, str], cwd: Path,
             calls: Sequence[tuple[str, tuple[str, dict[str, Any]]]], n: int, side: Side) -> None:
    from .run import RawStdio, latencies

    client = RawStdio.for_argv(list(argv), env, cwd)
    try:
        client.start()
        for label, (tool, args) in calls:
            side.raw_ms[label] = latencies(
                partial(client.request, "tools/call", {"name": tool, "arguments": args}), n).p50
    finally:
        client.close()


def measure(ours: Sequence[str], peer: Sequence[str], env: dict[str, str], cwd: Path,
            reqs: Sequence[Request], n: int) -> SideBySide:
    """Both servers, one after the other for each client, on the same setup."""
    mine = [(r.label, r.ours) for r in reqs]
    theirs = [(r.label, r.peer) for r in reqs]
    result = SideBySide(asyncio.run(sdk_side(ours, env, cwd, mine, n)),
                        asyncio.run(sdk_side(peer, env, cwd, theirs, n)),
                        [r.label for r in reqs])
    raw_side(ours, env, cwd, mine, n, result.ours)
    raw_side(peer, env, cwd, theirs, n, result.peer)
    return result
