"""The user's own yes, asked through the MCP client, before a tool does what mail content must
never be able to steer the model into.

Adding an account runs a command of the caller's choosing (the password command: now, to log
in, and at every sync) and sends what it prints to servers of the caller's choosing.  A
message that talks the model into it (prompt injection) could run any program of the user's
with any arguments, or send a secret to a server of the sender's.  So ``add_email_account``
asks the user through MCP elicitation -- the client shows the question to the user, not to
the model -- and a client that cannot ask gets the terminal command that does the same, with
nothing written.  The question is the SDK's resolver (``Resolve``), which asks mid-call on
older protocol versions and through an input-required result on newer ones.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from mcp.server.elicitation import AcceptedElicitation, ElicitationResult
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.resolve import Elicit, Resolve
from pydantic import BaseModel, Field

from ..adopt.accounts import AccountError, AccountPlan, NewAccount, add_command
from ..errors import CallerError, FmailError
from .registry import tool_error


class AddAccountAnswer(BaseModel):
    """The form the user answers: one yes/no, so that accepting an empty form is no yes."""

    add: bool = Field(description="Add this account")


class NotConfirmed(CallerError):
    """The user did not say yes (declined, cancelled, or the client cannot ask)."""


def can_ask(ctx: Context) -> bool:
    """Whether the client takes form elicitations: it declared the capability (a bare
    ``elicitation: {}`` from before modes existed means forms; a URL-only one does not)."""
    capabilities = ctx.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def account_question(plan: AccountPlan) -> str:
    """What the user is asked: every value that decides what runs and where the password
    goes, as fmail-nm will use them."""
    lines = [f"Add the mail account {plan.name!r} ({plan.address}) to fmail-nm?",
             f"IMAP: {plan.imap_user} at {plan.imap_host}:{plan.imap_port} "
             f"({_tls(plan.imap_tls)})"]
    if plan.smtp_host:
        lines.append(f"SMTP: {plan.smtp_user} at {plan.smtp_host}:{plan.smtp_port} "
                     f"({_tls(plan.smtp_tls)})")
    secret = ("an OAuth2 access token (XOAUTH2)" if plan.auth == "oauth2" else "the password")
    lines += [f"{'Token' if plan.auth == 'oauth2' else 'Password'} command: "
              f"{plan.password_command}",
              f"It runs now and at every sync, and what it prints is sent to these servers as "
              f"{secret}. Say yes only if you asked for this account."]
    return "\n".join(lines)


def _tls(mode: str) -> str:
    return "no TLS" if mode == "none" else mode.upper()


def account_of_arguments(name: str, address: str, password_command: str, provider: str | None,
                         imap: str | None, imap_user: str | None, smtp: str | None,
                         auth: str | None) -> NewAccount:
    """The account ``add_email_account``'s arguments describe (``auth`` left out: the
    preset's, as for ``fmail-nm account add``; accounts.plan checks it)."""
    try:
        return NewAccount.with_servers(name=name, address=address,
                                       password_command=password_command, provider=provider,
                                       imap=imap, imap_user=imap_user, smtp=smtp, auth=auth)
    except FmailError as exc:
        raise tool_error(exc) from None


# A tool parameter filled with account_of_arguments' NewAccount (one per call).
AccountOfArguments = Annotated[NewAccount, Resolve(account_of_arguments)]


def account_consent(check: Callable[[NewAccount], Awaitable[AccountPlan]]) -> Any:
    """The annotation of ``add_email_account``'s ``answer`` parameter: filled by asking the
    user, never from the model's arguments.  ``check`` validates the account against the
    setup (nothing written), so a bad value is refused before anyone is asked."""
    async def ask(ctx: Context, new: AccountOfArguments) -> Elicit[AddAccountAnswer]:
        try:
            plan = await check(new)
            if not can_ask(ctx):
                raise NotConfirmed(
                    "adding an account runs its password command and sends what it prints to "
                    "its servers, so the user must confirm it, and this MCP client cannot ask "
                    "the user (it does not support elicitation). Nothing was written. The user "
                    f"can add the account in a terminal: {add_command(new)}")
        except FmailError as exc:
            raise tool_error(exc) from None
        return Elicit(account_question(plan), AddAccountAnswer)
    return Annotated[ElicitationResult[AddAccountAnswer], Resolve(ask)]


# accounts.plan names the fields of `fmail-nm account add`; the tool takes imap and smtp as
# [scheme://]host[:port], and a model told of imap_host sends it and is refused as unknown.
_TOOL_TERMS = {"imap_host": "imap (host[:port])", "smtp_host": "smtp (host[:port])",
               "imap_port": "the port of imap (host:port)",
               "smtp_port": "the port of smtp (host:port)",
               "imap_tls none": "imap:// (no TLS)", "smtp_tls none": "smtp:// (no TLS)"}


@contextmanager
def in_tool_terms() -> Iterator[None]:
    """An AccountError raised inside names a leading field of accounts.plan as the tool's
    argument."""
    try:
        yield
    except AccountError as exc:
        message = str(exc)
        for field, argument in _TOOL_TERMS.items():
            if message.startswith(f"{field} "):
                raise AccountError(argument + message.removeprefix(field)) from None
        raise


def require_yes(answer: ElicitationResult[AddAccountAnswer], name: str) -> None:
    """Return if the user accepted with the box ticked; else raise the tool error."""
    if not (isinstance(answer, AcceptedElicitation) and answer.data.add):
        raise tool_error(NotConfirmed(f"the user did not confirm adding the account {name!r}; "
                                      "nothing was written"))
