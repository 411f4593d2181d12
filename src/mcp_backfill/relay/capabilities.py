"""The sampling backfill: what the client is told it can do, and who answers a sampling request."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from mcp_backfill.options import Mode

BACKFILLED_SAMPLING: dict[str, Any] = {"tools": {}}


def backfill_capabilities(capabilities: Any, mode: Mode) -> dict[str, Any] | None:
    """The client's capabilities with sampling (with tools) merged in, or None if nothing changes.

    Everything the client declared is kept, including `sampling.context` and unknown keys.
    """
    if mode == "off":
        return None
    declared = capabilities if isinstance(capabilities, dict) else {}
    sampling = declared.get("sampling")
    if isinstance(sampling, dict) and isinstance(sampling.get("tools"), dict):
        return None
    merged = dict(declared)
    merged["sampling"] = {
        **(sampling if isinstance(sampling, dict) else {}),
        **copy.deepcopy(BACKFILLED_SAMPLING),
    }
    return merged


def with_sampling_tasks(capabilities: dict[str, Any]) -> dict[str, Any]:
    """`capabilities` also declaring what the proxy's sampling tasks offer (handshake era): task-
    augmented `sampling/createMessage`, `tasks/list` and `tasks/cancel`; the client's own task
    capabilities are kept. Only for a revision that has tasks (`protocol.TASKS_SINCE`)."""
    tasks = capabilities.get("tasks")
    tasks = dict(tasks) if isinstance(tasks, dict) else {}
    requests = tasks.get("requests")
    requests = dict(requests) if isinstance(requests, dict) else {}
    sampling = requests.get("sampling")
    requests["sampling"] = {**(sampling if isinstance(sampling, dict) else {}), "createMessage": {}}
    tasks["requests"] = requests
    tasks.setdefault("list", {})
    tasks.setdefault("cancel", {})
    return {**capabilities, "tasks": tasks}


def wants_tools(params: dict[str, Any]) -> bool:
    """Does a sampling request use the tools extension (released or draft spelling)? A member
    written as `null` is absent, as the SDK reads it and as the answer is shaped (`has_tools`)."""
    return any(params.get(key) is not None for key in ("tools", "toolChoice", "tool_choice"))


@dataclass
class ClientProfile:
    """What the client declared about sampling (in `initialize`, or in a 2026 request's `_meta`)."""

    sampling: dict[str, Any] | None = None
    elicitation: dict[str, Any] | None = None
    tasks: dict[str, Any] | None = None  # the client's own tasks (e.g. for elicitation)

    @classmethod
    def from_capabilities(cls, capabilities: Any) -> ClientProfile:
        declared = capabilities if isinstance(capabilities, dict) else {}
        sampling, elicitation, tasks = (declared.get(key) for key in ("sampling", "elicitation", "tasks"))
        return cls(
            sampling=sampling if isinstance(sampling, dict) else None,
            elicitation=elicitation if isinstance(elicitation, dict) else None,
            tasks=tasks if isinstance(tasks, dict) else None,
        )

    def lists_tasks(self) -> bool:
        return self.tasks is not None and isinstance(self.tasks.get("list"), dict)

    def can_sample(self, params: dict[str, Any]) -> bool:
        if self.sampling is None:
            return False
        return not wants_tools(params) or isinstance(self.sampling.get("tools"), dict)

    def runs_sampling_tasks(self) -> bool:
        """Did the client declare task-augmented sampling itself?"""
        requests = (self.tasks or {}).get("requests")
        sampling = requests.get("sampling") if isinstance(requests, dict) else None
        return isinstance(sampling, dict) and isinstance(sampling.get("createMessage"), dict)

    def samples_with_tools(self) -> bool:
        return self.sampling is not None and isinstance(self.sampling.get("tools"), dict)


def proxy_answers(mode: Mode, client: ClientProfile, params: dict[str, Any]) -> bool:
    """Does the proxy answer this sampling request, rather than the client?"""
    if mode == "off":
        return False
    return mode == "always" or not client.can_sample(params)
