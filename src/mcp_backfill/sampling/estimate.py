"""What a Claude call may cost at most, estimated before it is made: its `Reservation`.

The output side is exact: Claude generates at most `max_tokens` (thinking included). The input side
is an estimate that errs high, since it only matters when a call ends before Claude reports its
usage (the reservation is then what is charged) and while the call is in flight (it holds budget):

* text (system prompt, text blocks, tool definitions and inputs, tool results, any JSON) counts one
  token per 3 UTF-8 bytes, rounded up — English runs at about 4 bytes a token, code and most other
  scripts at 2 to 3;
* an image counts what Claude bills for its size (read from its header) on the model that bills
  the most for it: a token per 28x28-pixel patch (Claude models since Opus 4.7, reading images of
  up to 2576 pixels on the long edge, `MAX_IMAGE_TOKENS` at most) or width x height / 750 tokens
  (earlier models, reading them at up to 1568 pixels); an image whose size cannot be read counts
  `MAX_IMAGE_TOKENS`;
* a document counts 1 token per 3 bytes of its text, or per 3 base64 characters of its data; a PDF
  at least `PDF_PAGE_TOKENS` per page (Claude reads each page as an image and as its text: 1,500
  to 3,000 tokens a page, whatever the file's size), its pages counted from its page objects, plain
  or in compressed object streams (at least one);
* every message and tool adds `OVERHEAD_TOKENS`, and tools add Claude's tool-use system prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp_backfill.jsonrpc import compact_text
from mcp_backfill.sampling.media import image_size, pdf_pages
from mcp_backfill.sampling.spend import Reservation

__all__ = [
    "BYTES_PER_TOKEN",
    "MAX_IMAGE_TOKENS",
    "PDF_PAGE_TOKENS",
    "estimate_input_tokens",
    "image_tokens",
    "reservation_for",
]

BYTES_PER_TOKEN = 3
MAX_IMAGE_TOKENS = 4784
"""The most Claude bills for one image: a 2576x1456 image (or any scaled down to fit that many
28x28-pixel patches) on the models that read images at up to 2576 pixels on the long edge."""
PDF_PAGE_TOKENS = 3000
"""The most a PDF page costs as Claude reads it (its image and its text), as Claude's PDF guide says."""
PATCH_PIXELS = 28
PIXELS_PER_TOKEN = 750
"""Earlier models' rule: an image of width x height pixels is about width x height / 750 tokens."""
OVERHEAD_TOKENS = 8
TOOL_SYSTEM_PROMPT_TOKENS = 350


def reservation_for(request: Mapping[str, Any]) -> Reservation:
    """The reservation of one Messages API request (`messages.create` keyword arguments)."""
    max_tokens = request.get("max_tokens")
    output = max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else 0
    return Reservation(estimate_input_tokens(request), max(0, output))


def estimate_input_tokens(request: Mapping[str, Any]) -> int:
    tally = _Tally()
    tally.any(request.get("system"))
    tools = request.get("tools")
    if isinstance(tools, list) and tools:
        tally.tokens += TOOL_SYSTEM_PROMPT_TOKENS + OVERHEAD_TOKENS * len(tools)
        tally.json(tools)
    messages = request.get("messages")
    for message in messages if isinstance(messages, list) else ():
        tally.tokens += OVERHEAD_TOKENS
        tally.any(message.get("content") if isinstance(message, Mapping) else message)
    return tally.tokens


def image_tokens(source: Any) -> int:
    """What Claude may bill for an image block's `source` at most, whichever model reads it."""
    data = source.get("data") if isinstance(source, Mapping) else None
    size = image_size(data) if isinstance(data, str) else None
    if size is None:
        return MAX_IMAGE_TOKENS
    width, height = size
    patches = -(-width // PATCH_PIXELS) * -(-height // PATCH_PIXELS)  # scaling down only lowers it
    return max(1, min(MAX_IMAGE_TOKENS, max(patches, -(-width * height // PIXELS_PER_TOKEN))))


class _Tally:
    def __init__(self) -> None:
        self.tokens = 0

    def text(self, text: str) -> None:
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        self.tokens += -(-size // BYTES_PER_TOKEN)

    def json(self, value: Any) -> None:
        self.text(compact_text(value))

    def any(self, value: Any) -> None:
        """A string, a content block, a list of them, or any other JSON."""
        if isinstance(value, str):
            self.text(value)
        elif isinstance(value, list):
            for item in value:
                self.any(item)
        elif isinstance(value, Mapping):
            self.block(value)
        elif value is not None:
            self.json(value)

    def block(self, block: Mapping[str, Any]) -> None:
        kind = block.get("type")
        source = block.get("source")
        if kind == "image":
            self.tokens += image_tokens(source)
        elif kind == "document" and isinstance(source, Mapping):
            before = self.tokens
            for key in ("data", "text"):
                if isinstance(source.get(key), str):
                    self.text(source[key])
            if isinstance(source.get("content"), list):
                self.any(source["content"])
            if source.get("media_type") == "application/pdf" and isinstance(source.get("data"), str):
                pages = max(1, pdf_pages(source["data"]))
                self.tokens = max(self.tokens, before + pages * PDF_PAGE_TOKENS)
        elif kind == "text" and isinstance(block.get("text"), str):
            self.text(block["text"])
        elif kind == "tool_result":
            self.any(block.get("content"))
        else:
            self.json({key: value for key, value in block.items() if key != "cache_control"})
