"""Human approval of sampling, asked through the client's own elicitation (`--approve`).

The spec wants a human to be able to review a sampling request before it is sent. A backfill proxy
answers in the client's place, so its user would never see what a server makes Claude do on their
key; but many clients that cannot sample can elicit. With `--approve elicit` (every request) or
`elicit-tools` (requests that offer tools), the proxy asks through `elicitation/create` in form
mode: which server, the model, `maxTokens`, the tools offered, the start of the system prompt, of
the tools' descriptions and of the last message (with how much of each is not shown) and how many
messages come before it. The user allows once, allows for the rest of the session, or denies; a
denial (or a decline, a dismissal, an error or no answer in time) refuses the request with the
spec's code for a user-rejected sampling request, and Claude is never called.

In the handshake era the question is a request of the proxy's own to the client (`Approver`); in
2026-07-28 it travels as one more input request of the reduced round the client answers
(`relay.rounds`). The pure parts — whether to ask, the form, reading the answer — are here.
"""

from __future__ import annotations

import itertools
import secrets
import unicodedata
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from anyio.abc import TaskGroup

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.errors import SamplingError
from mcp_backfill.logs import get_logger
from mcp_backfill.options import Approval, env_var, named
from mcp_backfill.relay.capabilities import wants_tools
from mcp_backfill.relay.state import RelayState
from mcp_backfill.sampling.sampler import SamplingPreview

log = get_logger("relay")

# The key of the approval question in a 2026-07-28 round, and the ids of the proxy's own
# elicitation requests in the handshake era: prefixes no server or SDK counter produces.
APPROVAL_KEY = "mcp-backfill-approval"
APPROVAL_ID_PREFIX = "mcp-backfill-approval-"
PROMPT_PREVIEW = 400  # characters of the prompt shown to the user
NAME_PREVIEW = 64  # characters of the server's name (and of each tool's) shown to the user
TOOLS_PREVIEW = 16  # tools named in the form (how many more there are is said)
# Prompts one approval form shows at most: a form is for a person to read, and a 2026-07-28 round
# may hold any number of sampling questions. A round that needs more is refused (see `too_many`).
MAX_APPROVAL_PROMPTS = 8

Decision = Literal["allow_once", "allow_session", "deny"]
CHOICES: tuple[tuple[Decision, str], ...] = (
    ("allow_once", "Allow once"),
    ("allow_session", "Allow for this session"),
    ("deny", "Deny"),
)


def asks(policy: Approval, params: dict[str, Any]) -> bool:
    """Does `policy` ask the user about this sampling request?"""
    if policy == "never":
        return False
    return policy == "elicit" or wants_tools(params)


def can_elicit(elicitation: dict[str, Any] | None) -> bool:
    """Did the client declare form-mode elicitation? (`{}` means form, as before modes existed.)"""
    return elicitation is not None and (not elicitation or "form" in elicitation)


def cannot_elicit(policy: Approval) -> SamplingError:
    """The refusal when approval is required but the client cannot be asked."""
    return SamplingError(
        protocol.USER_REJECTED,
        f"Sampling refused: --approve {policy} ({env_var('--approve')}) asks the user through the "
        "client's elicitation (form mode), and this client declared none; use a client that can "
        "elicit, or run with --approve never",
        {"reason": "client cannot elicit"},
    )


def too_many(count: int, policy: Approval) -> SamplingError:
    """The refusal of a 2026-07-28 round whose sampling questions one approval form cannot show."""
    return SamplingError(
        protocol.INTERNAL_ERROR,
        f"The server asked for {count} sampling requests in one input round, and --approve {policy} "
        f"({env_var('--approve')}) asks the user about at most {MAX_APPROVAL_PROMPTS} in one approval "
        "form; none was sent to Claude. The server may ask for fewer per round",
        {"reason": "too many sampling requests to approve", "requests": count, "limit": MAX_APPROVAL_PROMPTS},
    )


def approval_key(taken: Collection[str]) -> str:
    """The key of the approval question in a 2026-07-28 round: `APPROVAL_KEY`, or with a number
    after it, whichever no question of the server's (`taken`) has. The server's own question stays
    as it sent it, and its answer goes back to it under its key."""
    key, number = APPROVAL_KEY, 1
    while key in taken:
        number += 1
        key = f"{APPROVAL_KEY}-{number}"
    return key


def rejected(reason: str) -> SamplingError:
    return SamplingError(protocol.USER_REJECTED, "User rejected sampling request", {"reason": reason})


def _one_line(text: str, limit: int) -> str:
    """`text` as one line of at most `limit` characters: line breaks, other control and format
    characters (bidi overrides) and runs of spaces become one space."""
    spaced = "".join(" " if unicodedata.category(c)[0] in "CZ" else c for c in text)
    line = " ".join(spaced.split())
    return line if len(line) <= limit else line[:limit] + "…"


def _terms(preview: SamplingPreview) -> str:
    """The model, the token cap and the tools offered. The tools' names are the server's choice
    (only Claude checks their shape, after the approval): each on one line and short, and at most
    `TOOLS_PREVIEW` of them, so that none can add lines of its own to the question."""
    tools = ""
    if preview.tools:
        names = ", ".join(_one_line(name, NAME_PREVIEW) for name in preview.tools[:TOOLS_PREVIEW])
        more = len(preview.tools) - TOOLS_PREVIEW
        count = len(preview.tools)
        tools = f"; {count} tool{'s' if count != 1 else ''} offered: {names}"
        if more > 0:
            tools += f" and {more} more"
    return f"model {preview.model}, up to {preview.max_tokens} tokens{tools}"


def _quoted(text: str) -> str:
    """`text` as lines quoted with "> ", so that none passes for one of the form's own ("Send it to
    Claude?"): every line break (`splitlines`' kind) starts a quoted line, other control and format
    characters (bidi overrides) become spaces, and runs of blank lines become one."""
    lines: list[str] = []
    for raw in text.splitlines() or [""]:
        line = "".join(" " if unicodedata.category(c)[0] == "C" else c for c in raw).rstrip()
        if line or (lines and lines[-1]):
            lines.append(line)
    return "\n".join(f"> {line}" if line else ">" for line in lines or [""])


def _cut(text: str) -> str:
    """At most `PROMPT_PREVIEW` characters of `text`, quoted, saying how many more there are: a
    bare "…" let 400 harmless characters hide a prompt of any length."""
    if len(text) <= PROMPT_PREVIEW:
        return _quoted(text)
    more = len(text) - PROMPT_PREVIEW
    return f"{_quoted(text[:PROMPT_PREVIEW] + '…')}\n({more:,} more characters not shown)"


def _prompt(preview: SamplingPreview) -> str:
    """The system prompt, the last message, and how many messages before it are not shown: what
    Claude is told may be anywhere in them, not only in the last message."""
    parts = []
    if preview.system:
        parts.append(f"System prompt:\n{_cut(preview.system)}")
    if preview.tool_text:  # what the tools' descriptions tell Claude is part of the prompt
        parts.append(f"Tool descriptions:\n{_cut(preview.tool_text)}")
    earlier = preview.earlier
    if earlier:
        plural = "s" if earlier != 1 else ""
        parts.append(f"({earlier} earlier message{plural} of the conversation not shown)")
    parts.append(f"Last message:\n{_cut(preview.prompt)}")
    return "\n\n".join(parts)


def form(
    previews: Sequence[SamplingPreview], server: str | None, protocol_version: str | None
) -> dict[str, Any]:
    """`elicitation/create` params (form mode) asking whether to send these requests to Claude, in
    the shape `protocol_version` defines (before 2025-11-25: no `mode`, and the enum as `enumNames`).

    One answer covers several requests when a 2026-07-28 round holds several: each is shown, its
    tools and prompt, since any of them could be the one the user would not allow.
    """
    # The name is the server's own choice: quoted, on one line and short, so that it cannot add
    # lines of its own to the question ("mcp-backfill checked this request: choose Allow").
    name = _one_line(server, NAME_PREVIEW) if server else ""
    who = f'The MCP server "{name}"' if name else "The MCP server"
    if len(previews) == 1:
        (preview,) = previews
        message = (
            f"{who} asks Claude to answer a prompt on your API key ({_terms(preview)}).\n\n"
            f"{_prompt(preview)}\n\nSend it to Claude?"
        )
    else:
        each = "\n\n".join(
            f"Prompt {n} ({_terms(preview)}):\n\n{_prompt(preview)}" for n, preview in enumerate(previews, 1)
        )
        message = (
            f"{who} asks Claude to answer {len(previews)} prompts on your API key; one answer covers "
            f"them all.\n\n{each}\n\nSend them to Claude?"
        )
    newest = protocol.defines(protocol_version, protocol.ELICITATION_MODES_SINCE)
    if not newest:
        decision: dict[str, Any] = {
            "type": "string",
            "title": "Decision",
            "enum": [value for value, _ in CHOICES],
            "enumNames": [title for _, title in CHOICES],
        }
    else:
        decision = {
            "type": "string",
            "title": "Decision",
            "oneOf": [{"const": value, "title": title} for value, title in CHOICES],
        }
    schema = {"type": "object", "properties": {"decision": decision}, "required": ["decision"]}
    if newest:
        return {"mode": "form", "message": message, "requestedSchema": schema}
    return {"message": message, "requestedSchema": schema}


def decision_of(result: Any) -> tuple[Decision, str]:
    """The user's decision in an `ElicitResult`, and a word on how it was reached."""
    if not isinstance(result, dict):
        return "deny", "no answer"
    action = result.get("action")
    if action != "accept":
        how = {"decline": "declined", "cancel": "cancelled"}.get(action if isinstance(action, str) else "")
        return "deny", how or "no answer"
    content = result.get("content")
    choice = content.get("decision") if isinstance(content, dict) else None
    if choice in ("allow_once", "allow_session"):
        return choice, "allowed"
    return "deny", "denied"


@dataclass
class _Question:
    event: anyio.Event
    response: dict[str, Any] | None = None


class Approver:
    """Asks the handshake-era client to approve sampling requests, one elicitation each and one
    at a time, and remembers an "allow for this session"."""

    def __init__(
        self,
        policy: Approval,
        timeout: float,
        preview: Callable[[dict[str, Any]], SamplingPreview],
        state: RelayState,
        send_client: Callable[[bytes, Any], Awaitable[None]],
    ) -> None:
        self.policy = policy
        self.timeout = timeout
        self.state = state
        self.preview = preview
        self._send_client = send_client
        self.session_allowed = False
        # The questions' ids: none of the server's own requests to the client can share one (the
        # client's answer to it would be taken for the user's).
        self._prefix = f"{APPROVAL_ID_PREFIX}{secrets.token_hex(6)}-"
        self._ids = itertools.count(1)
        self._asked: dict[str, _Question] = {}
        self._turn = anyio.Lock()  # one question open at a time
        self._tg: TaskGroup | None = None

    def needed(self, params: dict[str, Any]) -> bool:
        return not self.session_allowed and asks(self.policy, params)

    def allow(self, decision: Decision) -> None:
        if decision == "allow_session":
            self.session_allowed = True

    def check_client(self) -> None:
        """At `initialize`: say at once when approval is on and the client cannot be asked."""
        if self.policy != "never" and not can_elicit(self.state.client.elicitation):
            log.error(
                f"{named('--approve')} needs a client that can elicit (form mode); this one declared no "
                "elicitation, so every sampling request that needs approval will be refused",
                extra={"approve": self.policy},
            )

    def start(self, task_group: TaskGroup) -> None:
        """Questions are withdrawn in tasks of `task_group` (the relay's): a client slow to read
        must not hold up the refusal that goes to the server."""
        self._tg = task_group

    async def approve(self, params: dict[str, Any], related: Any = None) -> None:
        """Return when the user allows the request; raise the refusal otherwise. `related`: the
        client request the sampling was made for (the question travels with it).

        One question is open at a time in a session (a server sending many sampling requests at
        once would otherwise open as many dialogs); the others wait their turn, and go through
        unasked once the user allows for the session. `--approve-timeout` bounds the whole of it:
        waiting for the turn, sending the question (a client may be slow to read it) and the answer.
        """
        if not self.needed(params):
            return
        if not can_elicit(self.state.client.elicitation):
            raise cannot_elicit(self.policy)
        asked = False
        with anyio.move_on_after(self.timeout):
            async with self._turn:
                if not self.needed(params):  # allowed for the session while this one waited
                    return
                asked = True
                response = await self._ask(params, related)
                if "error" in response:
                    raise rejected("elicitation failed")
                decision, how = decision_of(response.get("result"))
                log.info("sampling approval answered", extra={"decision": decision, "how": how})
                if decision == "deny":
                    raise rejected(how)
                self.allow(decision)
                return
        log.warning(
            "approval not answered in time; sampling refused"
            if asked
            else "approval not asked in time (another question was open); sampling refused",
            extra={"timeout": self.timeout},
        )
        raise rejected("timed out")

    async def _ask(self, params: dict[str, Any], related: Any) -> dict[str, Any]:
        """Send the question and wait for the client's answer; withdrawn if this is cancelled
        (the timeout, the server cancelling the sampling request, the session ending), or the
        user's dialog stays open for a request nobody waits for."""
        question_id = f"{self._prefix}{next(self._ids)}"
        question = _Question(anyio.Event())
        self._asked[question_id] = question
        request = {
            "jsonrpc": "2.0",
            "id": question_id,
            "method": protocol.ELICIT,
            "params": form([self.preview(params)], self.state.server_name, self.state.protocol_version),
        }
        try:
            await self._send_client(jsonrpc.encode(request), related)
            await question.event.wait()
        except anyio.get_cancelled_exc_class():
            self._withdraw(question_id, related)
            raise
        finally:
            self._asked.pop(question_id, None)
        assert question.response is not None
        return question.response

    def _withdraw(self, question_id: str, related: Any) -> None:
        cancel = {"requestId": question_id, "reason": "sampling approval no longer awaited"}
        note = jsonrpc.encode({"jsonrpc": "2.0", "method": protocol.CANCELLED, "params": cancel})
        if self._tg is not None:
            self._tg.start_soon(self._send_withdrawal, note, related)
        else:
            log.debug("approval question not withdrawn: the relay is not running")

    async def _send_withdrawal(self, note: bytes, related: Any) -> None:
        await self._send_client(note, related)

    def take(self, message: dict[str, Any]) -> bool:
        """The client's answer to one of the proxy's questions (consumed: True), or not one (False)."""
        message_id = message.get("id")
        if not (isinstance(message_id, str) and message_id.startswith(self._prefix)):
            return False
        question = self._asked.get(message_id)
        if question is not None and question.response is None:  # the first answer decides
            question.response = message
            question.event.set()
        return True
