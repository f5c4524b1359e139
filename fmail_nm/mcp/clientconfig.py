"""Ready-to-paste MCP client configuration (Claude Code, Claude Desktop, MCP Inspector).

Everything machine-specific (the command, the URL, the token, the token file) is an input;
the token appears only when the caller passes it.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

SERVER_NAME = "fmail"
TOKEN_PLACEHOLDER = "<token>"
_HEADER_SAFE = re.compile(r"^[A-Za-z0-9._~+/=<>-]+$")


def _sh(args: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def _auth_header_arg(token: str | None, token_file: Path | str | None) -> str:
    """The shell word for ``--header``: literal token, ``$(cat file)``, or a placeholder."""
    if token is not None:
        if _HEADER_SAFE.match(token):
            return f'"Authorization: Bearer {token}"'
        return shlex.quote(f"Authorization: Bearer {token}")
    if token_file is not None:
        return f'"Authorization: Bearer $(cat {shlex.quote(str(token_file))})"'
    return f'"Authorization: Bearer {TOKEN_PLACEHOLDER}"'


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line if line else line for line in text.splitlines())


def _mcp_remote_needs_allow_http(url: str) -> bool:
    """mcp-remote accepts plain http only for localhost/127.0.0.1 unless --allow-http is given."""
    parts = urlsplit(url)
    return parts.scheme == "http" and parts.hostname not in ("localhost", "127.0.0.1")


def client_configs(*, command: list[str], url: str, token: str | None,
                   env: dict[str, str] | None = None,
                   token_file: Path | str | None = None) -> str:
    """Human-readable, ready-to-paste client configs for stdio (``command``) and HTTP (``url``).

    ``token``: shown verbatim when given; otherwise shell snippets read ``token_file`` with
    ``$(cat …)`` when that is given, and everything else shows ``<token>``.
    ``env``: extra environment for the stdio server (e.g. ``FMAIL_CONFIG``).
    """
    if not command:
        raise ValueError("command must not be empty")
    env = dict(env or {})
    token_value = token if token is not None else TOKEN_PLACEHOLDER
    header_arg = _auth_header_arg(token, token_file)
    out: list[str] = []
    add = out.append

    add("MCP client configuration for fmail-nm")
    add("=====================================")
    add("")
    add("1. stdio — the client starts fmail-nm itself (no network, no token needed)")
    add("-------------------------------------------------------------------------")
    add("")
    add("Claude Code (add `--scope user` to have it in every project):")
    env_flags = " ".join(f"--env {shlex.quote(f'{k}={v}')}" for k, v in env.items())
    add("    claude mcp add --transport stdio " + (env_flags + " " if env_flags else "")
        + f"{SERVER_NAME} -- {_sh(command)}")
    add("")
    add("Claude Desktop — merge into claude_desktop_config.json")
    add("(macOS: ~/Library/Application Support/Claude/claude_desktop_config.json,")
    add(" Windows: %APPDATA%\\Claude\\claude_desktop_config.json), then restart Claude Desktop.")
    add("Desktop does not read your shell profile, so the command must be an absolute path:")
    stdio_entry: dict[str, object] = {"command": command[0], "args": list(command[1:])}
    if env:
        stdio_entry["env"] = env
    add(_indent(json.dumps({"mcpServers": {SERVER_NAME: stdio_entry}}, indent=2)))
    add("")
    add("MCP Inspector (opens a browser UI; needs Node.js):")
    env_args = " ".join(f"-e {shlex.quote(f'{k}={v}')}" for k, v in env.items())
    add("    npx @modelcontextprotocol/inspector " + (env_args + " " if env_args else "")
        + f"-- {_sh(command)}")
    add("")
    add(f"2. Streamable HTTP — `fmail-nm serve --transport http` must be running; endpoint {url}")
    add("-" * 78)
    add("Every request needs the header  Authorization: Bearer <token>.")
    add("")
    add("Claude Code:")
    add(f"    claude mcp add --transport http {SERVER_NAME} {shlex.quote(url)} --header {header_arg}")
    add("")
    add("Claude Desktop: its config file only starts local (stdio) servers — the stdio entry")
    add("above is the simple choice. To use the HTTP server anyway, bridge it with mcp-remote")
    add("(needs Node.js); the header is split this way because Desktop on Windows mangles")
    add("arguments that contain spaces:")
    bridge_args = ["-y", "mcp-remote", url, "--transport", "http-only"]
    if _mcp_remote_needs_allow_http(url):
        bridge_args.append("--allow-http")
    bridge_args += ["--header", "Authorization:${FMAIL_AUTH_HEADER}"]
    bridge = {"command": "npx", "args": bridge_args,
              "env": {"FMAIL_AUTH_HEADER": f"Bearer {token_value}"}}
    add(_indent(json.dumps({"mcpServers": {SERVER_NAME: bridge}}, indent=2)))
    if _mcp_remote_needs_allow_http(url):
        add("    (--allow-http: mcp-remote otherwise refuses plain http to anything but localhost;")
        add("     the token and your mail then cross the network unencrypted.)")
    add("")
    add("MCP Inspector, in the browser UI (`npx @modelcontextprotocol/inspector`):")
    add("    Transport Type:  Streamable HTTP")
    add(f"    URL:             {url}")
    add("    Authentication:  header name  Authorization")
    add(f"                     value        Bearer {token_value}")
    add("    Connection Type: Via Proxy (a direct browser connection is refused: the server")
    add("                     rejects requests whose Origin is a foreign web page)")
    add("  or from the command line:")
    add(f"    npx @modelcontextprotocol/inspector --cli {shlex.quote(url)} --transport http "
        f"--header {header_arg} --method tools/list")
    if token is None:
        add("")
        if token_file is not None:
            add(f"Replace {TOKEN_PLACEHOLDER} with the contents of {token_file}.")
        else:
            add(f"Replace {TOKEN_PLACEHOLDER} with the bearer token.")
    add("")
    return "\n".join(out)

