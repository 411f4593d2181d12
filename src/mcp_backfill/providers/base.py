"""The provider interface: Claude-shaped request in, Claude-shaped message out.

Keeping both sides in the Messages API's own JSON shape means conversion from and to MCP happens
in exactly one place (`sampling.convert`), whatever the backend.
"""

from __future__ import annotations

from typing import Any, Protocol


class Provider(Protocol):
    """A backend able to answer one Messages API request.

    `request` holds the keyword arguments of `messages.create` (`model`, `max_tokens`, `messages`,
    and optionally `system`, `tools`, `tool_choice`, `stop_sequences`, `metadata`). The return
    value is the final message as JSON (`id`, `type`, `role`, `model`, `content`, `stop_reason`,
    `stop_sequence`, `usage`, optionally `stop_details` and `request_id`). Failures raise
    `SamplingError`. Cancelling the calling task must abort the underlying call promptly.
    """

    name: str

    async def create_message(self, request: dict[str, Any]) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...
