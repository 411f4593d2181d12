"""A streamed Messages API answer folded into the message it describes, as plain JSON.

The SDK's stream helper makes a typed event of every server-sent event and folds each into a typed
snapshot of the message, which the proxy then dumped back to JSON: about 1.2 ms of CPU per answer
on the benchmarks' machine, a third of the proxy's CPU per sampling request. The proxy needs
only the final message as JSON, the usage as it grows, and how much text has come. `MessageFold`
folds the events' JSON directly, into the message the SDK's `accumulate_event` builds as
`model_dump(mode="json", exclude_none=True)` gives it (a property test holds the two together).
Where a malformed stream makes them differ, the fold raises `ValueError` (the provider's "malformed
stream", worth a retry):

- a tool block's input is parsed once, when the block stops (the SDK parses the JSON so far at
  every delta, leniently): input that is not a whole, valid JSON object by then is an error — unless the
  message stopped for a reason that ends generation wherever it is (`CUT_SHORT`: the token limit,
  a refusal, the context window), which cut the tool call short: the call is left out of the
  message (where the SDK keeps what it could parse), as no server should run half of one;
- an event out of order (a delta before its block's start, after its stop — a tool's input would
  be what came after — or for an index never started, a block started at another index than the
  next, anything before `message_start`, a second `message_start`, a `message_stop` before
  `message_delta`, which alone reports the output's tokens: `message_start`'s are a placeholder,
  anything but a `ping` after `message_stop`).

Fields whose value is null are left out of every object in the message, as the SDK's dump leaves
them out of every object it has a model for, with one exception: a tool's input, free-form JSON the
model wrote, is kept exactly as it came (as the SDK keeps it).
"""

from __future__ import annotations

from typing import Any

from mcp_backfill.jsonrpc import decode

# The blocks whose input arrives as `input_json_delta` pieces (the SDK's `TRACKS_TOOL_INPUT`).
TOOL_INPUT_BLOCKS = frozenset({"tool_use", "server_tool_use"})
# What a `content_block_delta` adds to its block: the delta's type -> (the block's type, its field).
APPENDED = {
    "text_delta": ("text", "text"),
    "thinking_delta": ("thinking", "thinking"),
}
# The stop reasons that end generation wherever it is, even in the middle of a tool call's input.
CUT_SHORT = frozenset({"max_tokens", "refusal", "model_context_window_exceeded"})
# The delta fields whose length is the progress a delta reports.
PROGRESS_FIELDS = ("text", "partial_json", "thinking")
# The usage counters a `message_delta` carries only when they apply (else the start's stay).
OPTIONAL_USAGE = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "server_tool_use",
    "output_tokens_details",
)


class MessageFold:
    """Folds a stream's events, in order, into the message (see the module's docstring).

    `add` takes each decoded event and returns its type; `characters` counts the text, thinking and
    tool input received so far; `usage()` is the usage so far; `message()` the message as it stands
    (complete once `message_stop` was added)."""

    def __init__(self) -> None:
        self._message: dict[str, Any] | None = None
        self._content: list[Any] = []
        self._tool_json: dict[int, list[str]] = {}
        self._text: dict[tuple[int, str], list[str]] = {}  # joined once, not copied at every delta
        self._unparsed: dict[int, str] = {}  # tool blocks whose input is not whole JSON
        self._stopped: set[int] = set()  # blocks a content_block_stop finished
        self._stopped_message = False
        self.ended = False
        """A `message_delta` said why the message stopped and gave its final usage: all of it came."""
        self.characters = 0

    def add(self, event: Any) -> str:
        kind = event.get("type") if isinstance(event, dict) else None
        if not isinstance(kind, str):
            raise ValueError(f"a stream event without a type: {str(event)[:120]}")
        if self._stopped_message and kind != "ping":  # a gateway's second answer, say: not this one's
            raise ValueError(f"a {kind} event after message_stop")
        try:
            if kind == "message_start":
                if self._message is not None:
                    raise ValueError("a second message_start event")
                self._start(event["message"])
            elif kind == "ping":
                pass
            elif kind == "message_stop":
                if self._message is not None and not self.ended:  # its usage is message_start's guess
                    raise ValueError("a message_stop event before message_delta")
                self._stopped_message = True
            elif self._message is None:
                raise ValueError(f"a {kind} event before message_start")
            elif kind == "content_block_delta":
                self._delta(self._index(event), event["delta"])
            elif kind == "content_block_start":
                if event["index"] != len(self._content) or isinstance(event["index"], bool):
                    raise ValueError(
                        f"a content_block_start of index {event['index']!r}, not {len(self._content)}"
                    )
                self._content.append(event["content_block"])
            elif kind == "content_block_stop":
                self._stop(self._index(event))
            elif kind == "message_delta":
                _message_delta(self._message, event["delta"], event["usage"])
                self.ended = True
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"a {kind} event the message cannot take ({type(exc).__name__}: {exc})"
            ) from None
        return kind

    def _index(self, event: dict[str, Any]) -> int:
        """The event's block index, which must be one started (a negative one would be another's)."""
        index = event["index"]
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self._content):
            raise ValueError(f"a {event['type']} event for a block never started (index {index!r})")
        return index

    def _start(self, message: dict[str, Any]) -> None:
        content = message.get("content") or []
        if not isinstance(content, list):
            raise ValueError(f"a message_start whose content is no list: {str(content)[:120]}")
        self._message = message
        self._content = message["content"] = list(content)
        if not isinstance(message.get("usage"), dict):
            message["usage"] = {}

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        if index in self._stopped:  # a tool's input would be replaced by what came after its stop
            raise ValueError(f"a content_block_delta for block {index}, stopped already")
        block = self._content[index]
        kind = delta["type"]
        for field in PROGRESS_FIELDS:
            value = delta.get(field)
            if isinstance(value, str):
                self.characters += len(value)
                break
        if kind in APPENDED:
            block_type, field = APPENDED[kind]
            if block["type"] == block_type:
                self._text.setdefault((index, field), []).append(_string(delta[field], kind))
        elif kind == "input_json_delta":
            if block["type"] in TOOL_INPUT_BLOCKS:
                self._tool_json.setdefault(index, []).append(_string(delta["partial_json"], kind))
        elif kind == "signature_delta":
            if block["type"] == "thinking":
                block["signature"] = delta["signature"]
        elif kind == "citations_delta" and block["type"] == "text":
            block["citations"] = [*(block.get("citations") or ()), delta["citation"]]

    def _stop(self, index: int) -> None:
        self._stopped.add(index)
        block = self._content[index]
        pieces = self._tool_json.pop(index, None)
        if pieces and (raw := "".join(pieces)):
            try:
                value = decode(raw.encode())
            except ValueError:
                value = None
            if isinstance(value, dict):  # a tool's arguments are an object (else the call is lost)
                block["input"] = value
            else:
                self._unparsed[index] = raw  # an error, unless the message was cut short (`message`)

    def usage(self) -> dict[str, Any]:
        """The usage so far, cumulative (what the API said last), without null fields."""
        usage: dict[str, Any] = without_nulls(self._message["usage"] if self._message is not None else {})
        return usage

    def message(self) -> dict[str, Any]:
        """The message as folded so far, null fields left out (see the module's docstring)."""
        if self._message is None:
            raise ValueError("the stream had no message_start")
        for index in list(self._tool_json):  # a tool block the stream never said was finished
            self._stop(index)
        for index, block in enumerate(self._content):  # a whole message's blocks came as they are
            if _is_tool_block(block) and not isinstance(block.get("input"), dict):
                self._unparsed.setdefault(index, str(block.get("input")))
        if self._unparsed and self._message.get("stop_reason") not in CUT_SHORT:
            raw = next(iter(self._unparsed.values()))
            raise ValueError(f"the tool input Claude streamed is not valid JSON, or no object: {raw[:200]}")
        for (index, field), pieces in self._text.items():
            block = self._content[index]
            block[field] = _string(block.get(field) or "", f"a {block['type']} block's {field}") + "".join(
                pieces
            )
        self._text.clear()
        content = [_block(block) for index, block in enumerate(self._content) if index not in self._unparsed]
        return {
            key: content if key == "content" else without_nulls(value)
            for key, value in self._message.items()
            if value is not None
        }


def _message_delta(message: dict[str, Any], delta: dict[str, Any], usage: dict[str, Any]) -> None:
    """The message's end: why it stopped, and the usage's final totals (cumulative: they replace
    the start's, but counters this event leaves out keep the start's value)."""
    for field in ("stop_reason", "stop_sequence", "stop_details"):
        message[field] = delta.get(field)
    for field in ("stop_reason", "stop_sequence"):
        if message[field] is not None:
            _string(message[field], field)
    if delta.get("container") is not None:
        message["container"] = delta["container"]
    totals = message["usage"]
    totals["output_tokens"] = usage.get("output_tokens")
    for field in OPTIONAL_USAGE:
        if usage.get(field) is not None:
            totals[field] = usage[field]


def _is_tool_block(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in TOOL_INPUT_BLOCKS


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} that is no string: {str(value)[:120]}")
    return value


def _block(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    return {
        key: value if key == "input" else without_nulls(value)
        for key, value in block.items()
        if value is not None
    }


def without_nulls(value: Any) -> Any:
    """`value` with every null-valued field of every object in it left out."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value
