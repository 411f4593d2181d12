"""MCP as the proxy sees it: method names, protocol revisions, JSON-RPC codes, header names, media types.

Every module that names a piece of the protocol takes it from here, so a rename in a future revision
is one edit. The revision registries and the 2026-07-28 header names are also in the mcp SDK
(`mcp_types.version`, `mcp.shared.inbound`), but importing the SDK costs about half a second and
40 MB that a stdio proxy never needs; the values are written here and a unit test
(`tests/unit/test_protocol.py`) fails when they drift from the installed SDK's.
"""

from __future__ import annotations

import json
from typing import Any, Final

# -- revisions -----------------------------------------------------------------------------------

HANDSHAKE_VERSIONS: Final = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})
"""Revisions negotiated by `initialize` (the handshake era)."""
STATELESS_VERSION: Final = "2026-07-28"
"""The stateless revision: no `initialize`; each request carries its envelope in `params._meta`."""
SUPPORTED_VERSIONS: Final = HANDSHAKE_VERSIONS | {STATELESS_VERSION}


def defines(version: str | None, since: str) -> bool:
    """Does the revision `version` define what arrived in revision `since`? A revision the proxy
    does not know (a newer one) gets the newest shapes, as does a session not negotiated yet."""
    return version is None or version >= since or version not in SUPPORTED_VERSIONS


# -- methods -------------------------------------------------------------------------------------

INITIALIZE: Final = "initialize"
DISCOVER: Final = "server/discover"
SAMPLING: Final = "sampling/createMessage"
TOOLS_CALL: Final = "tools/call"
TOOLS_LIST: Final = "tools/list"
INITIALIZED: Final = "notifications/initialized"
CANCELLED: Final = "notifications/cancelled"
PROGRESS: Final = "notifications/progress"
TOOLS_CHANGED: Final = "notifications/tools/list_changed"
LISTEN: Final = "subscriptions/listen"
"""2026-07-28: a request whose answer is a stream of notifications that never ends by itself."""
PROMPTS_GET: Final = "prompts/get"
INPUT_REQUIRED_METHODS: Final = frozenset({TOOLS_CALL, PROMPTS_GET, "resources/read"})
"""2026-07-28 requests whose result may be `input_required`."""
ELICIT: Final = "elicitation/create"

# Tasks (2025-11-25 only; an extension from 2026-07-28 on): a requestor's `params.task` asks for a
# task, then it polls the receiver with these.
TASKS_GET: Final = "tasks/get"
TASKS_RESULT: Final = "tasks/result"
TASKS_LIST: Final = "tasks/list"
TASKS_CANCEL: Final = "tasks/cancel"
TASKS_STATUS: Final = "notifications/tasks/status"
TASK_METHODS: Final = frozenset({TASKS_GET, TASKS_RESULT, TASKS_LIST, TASKS_CANCEL})
META_RELATED_TASK: Final = "io.modelcontextprotocol/related-task"
TASKS_SINCE: Final = "2025-11-25"
"""The revision that brought tasks (and the `tasks` capabilities)."""
ELICITATION_MODES_SINCE: Final = "2025-11-25"
"""The revision that brought `mode` in `elicitation/create` (and the enum as `oneOf`)."""
PRIMING_EVENTS_SINCE: Final = "2025-11-25"
"""The revision from which a client expects an SSE stream to begin with an empty event with an id."""
PROGRESS_MESSAGE_SINCE: Final = "2025-03-26"
"""The revision that brought `message` in `notifications/progress`."""
NO_BATCHES_SINCE: Final = "2025-06-18"
"""The revision that removed JSON-RPC batches: a peer of it or later reads no JSON array."""

# -- 2026-07-28 envelope and results -------------------------------------------------------------

META_PROTOCOL_VERSION: Final = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_CAPABILITIES: Final = "io.modelcontextprotocol/clientCapabilities"
META_SUBSCRIPTION_ID: Final = "io.modelcontextprotocol/subscriptionId"
ENVELOPE_PREFIX: Final = "io.modelcontextprotocol/"
INPUT_REQUIRED: Final = "input_required"

# -- JSON-RPC error codes ------------------------------------------------------------------------

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
REQUEST_CANCELLED: Final = -32800
"""What the SDK's server answers for a request its client cancelled."""
USER_REJECTED: Final = -1
"""What the sampling spec says a client answers when its user rejects a sampling request."""

# -- HTTP header names (lower case) and media types ----------------------------------------------

SESSION_HEADER: Final = "mcp-session-id"
VERSION_HEADER: Final = "mcp-protocol-version"
METHOD_HEADER: Final = "mcp-method"
NAME_HEADER: Final = "mcp-name"
PARAM_HEADER_PREFIX: Final = "mcp-param-"
LAST_EVENT_ID_HEADER: Final = "last-event-id"

JSON_TYPE: Final = "application/json"
SSE_TYPE: Final = "text/event-stream"
POST_ACCEPT: Final = f"{JSON_TYPE}, {SSE_TYPE}"


def batch_too_large(count: int, limit: int) -> str:
    """The refusal of a client batch of `count` messages, over `--max-batch-messages`."""
    return (
        f"Invalid Request: a batch of {count} messages is over the limit of {limit}; send smaller "
        "batches, or raise --max-batch-messages / MCP_BACKFILL_MAX_BATCH_MESSAGES"
    )


def upstream_batch_too_large(count: int, limit: int) -> str:
    """What the requests answered in an upstream batch of `count` messages, over
    `--max-batch-messages`, get instead (the batch is dropped as a whole)."""
    return (
        f"Upstream MCP server sent a batch of {count} messages, over the limit of {limit}; it was "
        "dropped (raise --max-batch-messages / MCP_BACKFILL_MAX_BATCH_MESSAGES to allow it)"
    )


def cancelled_by_client(request_id: Any) -> str:
    """What the server is told (with `REQUEST_CANCELLED`) for a sampling request it made for the
    client request `request_id`, which the client cancelled: answering it would bill Claude for a
    result nobody reads."""
    shown = json.dumps(request_id, ensure_ascii=False)
    if len(shown) > 64:
        shown = shown[:63] + "…"
    return (
        f"Request cancelled: the client cancelled request {shown}, which this sampling request was "
        "made for; mcp-backfill does not answer it"
    )


def string_or_integer(value: object) -> bool:
    """What MCP allows as a request id or a progress token: a string or an integer (not a boolean)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def progress_token(params: object) -> str | int | None:
    """The `_meta.progressToken` a request asked for notifications with (a string or an integer)."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return token if string_or_integer(token) else None
