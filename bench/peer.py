"""fmail-nm side by side with a peer: the pinned PyPI ``mcp-server-notmuch`` (notmuch CLI per
call), on the same Maildir and notmuch database, in the same run, through the same clients.

The peer is installed into a virtualenv of its own in the bench cache (never into the project's
environment).  For each request -- a word search, a sender search, a one-month range, one
message, a 9-message thread, a tool that reads nothing -- both servers are timed through the
``mcp`` SDK's ``Client`` (which checks structured results against output schemas) and through
a bare JSON-RPC client, both servers up at once and their calls alternating, and the bytes a model
receives are counted: the text block and the structured content apart.  Each time row reads
"ours p50 / peer p50 = ratio, pairs R": R is the median of the ratios of the pairs of calls made
back to back, the figure that load drifting on a shared machine moves least.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp.client.stdio import StdioServerParameters

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
    # The median of ours/peer over each pair of calls made back to back (see ``measure``)
    sdk_pair_ratio: dict[str, float] = field(default_factory=dict)
    raw_pair_ratio: dict[str, float] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, str]]:
        out = []
        for label in self.labels:
            o, p = self.ours, self.peer
            out.append((f"{label}: SDK ms ours / peer",
                        _pair(o.sdk_ms[label], p.sdk_ms[label], ".2f")
                        + f", pairs {self.sdk_pair_ratio[label]:.2f}x"))
            out.append((f"{label}: bare ms ours / peer",
                        _pair(o.raw_ms[label], p.raw_ms[label], ".2f")
                        + f", pairs {self.raw_pair_ratio[label]:.2f}x"))
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


def median(samples: Sequence[float]) -> float:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2]


def p50(samples: Sequence[float]) -> float:
    """Seconds in, milliseconds out."""
    return round(median(samples) * 1000, 3)


def pair_ratio(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """The median of ``ours[i] / theirs[i]``: each pair ran within the same few milliseconds, so
    a load that comes and goes slows both of a pair and cancels out of its ratio, where it can
    move one side's p50 and not the other's."""
    return round(median([a / b for a, b in zip(ours, theirs, strict=True)]), 3)


def wire_json_bytes(value: Any) -> int:
    """Bytes of a structured result as the JSON-RPC message carries it (compact UTF-8 JSON,
    as the SDK serialises it); 0 for none."""
    if value is None:
        return 0
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def _params(argv: Sequence[str], env: dict[str, str], cwd: Path) -> StdioServerParameters:
    from mcp.client.stdio import StdioServerParameters
    return StdioServerParameters(command=argv[0], args=list(argv[1:]), env={**os.environ, **env},
                                 cwd=str(cwd))


async def _measure(ours: Sequence[str], peer: Sequence[str], env: dict[str, str], cwd: Path,
                   reqs: Sequence[Request], n: int) -> SideBySide:
    from mcp.client.client import Client

    from .run import RawStdio, as_async, checked_call, timed_pairs

    result = SideBySide(Side(), Side(), [r.label for r in reqs])
    sides = (result.ours, result.peer)
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(Client(_params(argv, env, cwd)))
                   for argv in (ours, peer)]
        raws = []
        for argv in (ours, peer):
            raw = RawStdio.for_argv(list(argv), env, cwd)
            stack.callback(raw.close)
            raw.start()
            raws.append(raw)
        for side, client in zip(sides, clients):
            tools = (await client.list_tools()).tools
            side.tool_list_bytes = sum(len(t.model_dump_json(by_alias=True, exclude_none=True))
                                       for t in tools)
        for r in reqs:
            sdk = [partial(checked_call, client, *call)
                   for client, call in zip(clients, (r.ours, r.peer))]
            for side, call in zip(sides, sdk):
                got = await call()
                side.text_bytes[r.label] = sum(len(getattr(c, "text", "").encode())
                                               for c in got.content)
                side.structured_bytes[r.label] = wire_json_bytes(got.structured_content)
            mine, theirs = await timed_pairs(sdk[0], sdk[1], n)
            result.ours.sdk_ms[r.label], result.peer.sdk_ms[r.label] = p50(mine), p50(theirs)
            result.sdk_pair_ratio[r.label] = pair_ratio(mine, theirs)
            bare = [as_async(partial(raw.request, "tools/call", {"name": tool, "arguments": args}))
                    for raw, (tool, args) in zip(raws, (r.ours, r.peer))]
            mine, theirs = await timed_pairs(bare[0], bare[1], n)
            result.ours.raw_ms[r.label], result.peer.raw_ms[r.label] = p50(mine), p50(theirs)
            result.raw_pair_ratio[r.label] = pair_ratio(mine, theirs)
    return result


def measure(ours: Sequence[str], peer: Sequence[str], env: dict[str, str], cwd: Path,
            reqs: Sequence[Request], n: int) -> SideBySide:
    """Both servers up at once, on the same setup, each through both clients; for each request
    their calls alternate (:func:`bench.run.timed_pairs`), so drifting load on a shared machine
    falls on both sides alike instead of on whichever ran during the busier minute."""
    return asyncio.run(_measure(ours, peer, env, cwd, reqs, n))
