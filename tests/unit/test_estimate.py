"""The reservation estimate: exact on the output side, erring high on the input side."""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_backfill.sampling import media
from mcp_backfill.sampling.estimate import (
    MAX_IMAGE_TOKENS,
    OVERHEAD_TOKENS,
    PDF_PAGE_TOKENS,
    TOOL_SYSTEM_PROMPT_TOKENS,
    estimate_input_tokens,
    image_tokens,
    reservation_for,
)
from mcp_backfill.sampling.spend import Reservation


def user(*content: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(content)}


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ({"max_tokens": 50, "messages": [user({"type": "text", "text": "abcdef"})]}, Reservation(8 + 2, 50)),
        ({"max_tokens": 1, "messages": [user({"type": "text", "text": "abcdefg"})]}, Reservation(8 + 3, 1)),
        ({"max_tokens": 10, "system": "ü" * 3, "messages": []}, Reservation(2, 10)),  # 6 UTF-8 bytes
        (
            {
                "max_tokens": 10,
                "messages": [user({"type": "image", "source": {"type": "base64", "data": "x" * 10**6}})],
            },
            Reservation(OVERHEAD_TOKENS + MAX_IMAGE_TOKENS, 10),
        ),
        (
            {
                "max_tokens": 10,
                "messages": [user({"type": "document", "source": {"type": "base64", "data": "A" * 3000}})],
            },
            Reservation(OVERHEAD_TOKENS + 1000, 10),
        ),
        (
            {"max_tokens": 10, "tools": [{"name": "t", "input_schema": {}}], "messages": []},
            Reservation(TOOL_SYSTEM_PROMPT_TOKENS + OVERHEAD_TOKENS + 11, 10),  # 33 bytes of JSON
        ),
        ({"messages": "not a list"}, Reservation(0, 0)),
    ],
)
def test_reservations(request_: dict[str, Any], expected: Reservation) -> None:
    assert reservation_for(request_) == expected


texts = st.text(max_size=200)


@given(st.lists(texts, max_size=5), texts)
def test_the_input_estimate_is_at_least_a_token_per_four_bytes_and_grows_with_the_prompt(
    parts: list[str], more: str
) -> None:
    messages = [user({"type": "text", "text": part}) for part in parts]
    estimate = estimate_input_tokens({"messages": messages})
    size = sum(len(part.encode("utf-8", "surrogatepass")) for part in parts)
    assert estimate >= size / 4
    longer = estimate_input_tokens({"messages": [*messages, user({"type": "text", "text": more})]})
    assert longer >= estimate + OVERHEAD_TOKENS


def png(width: int, height: int) -> str:
    """The head of a PNG of that size (signature and IHDR: what a size is read from)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + chunk + b"\0" * 64).decode()


def jpeg(width: int, height: int) -> str:
    """The head of a baseline JPEG of that size, an EXIF segment before its frame header (SOF0)."""
    exif = b"Exif\0\0" + b"\0" * 60_000  # a thumbnail in the EXIF data: the frame header comes later
    app1 = b"\xff\xe1" + struct.pack(">H", 2 + len(exif)) + exif
    sof0 = (
        b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    )
    return base64.b64encode(b"\xff\xd8" + app1 + sof0 + b"\xff\xda" + b"\0" * 64).decode()


def gif(width: int, height: int) -> str:
    return base64.b64encode(b"GIF89a" + struct.pack("<HH", width, height) + b"\0" * 64).decode()


def webp(width: int, height: int) -> str:
    """An extended-format WebP (VP8X) head of that size."""
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\0" * 4 + (width - 1).to_bytes(3, "little")
    vp8x += (height - 1).to_bytes(3, "little")
    return base64.b64encode(b"RIFF" + struct.pack("<I", 1000) + b"WEBP" + vp8x + b"\0" * 64).decode()


def image_request(data: str, media_type: str = "image/png") -> dict[str, Any]:
    block = {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"max_tokens": 1, "messages": [user(block)]}


@pytest.mark.parametrize(
    ("data", "media_type"),
    [
        (png(2576, 1456), "image/png"),
        (jpeg(2576, 1456), "image/jpeg"),
        (gif(2576, 1456), "image/gif"),
        (webp(2576, 1456), "image/webp"),
        (png(8000, 8000), "image/png"),  # scaled down to the same most
        ("not an image Claude could read the size of", "image/png"),
    ],
    ids=["png", "jpeg", "gif", "webp", "over-8000px", "unreadable"],
)
def test_an_image_reserves_what_claudes_largest_vision_bills_for_it(data: str, media_type: str) -> None:
    """Claude models since Opus 4.7 read an image at up to 2576 px on its long edge, a token per
    28x28-px patch, up to 4,784 tokens (earlier ones at 1568 px, about 1,600 tokens): a 2576x1456
    screenshot is billed 92 x 52 = 4,784 input tokens. It reserved 1,600, so a call cancelled before
    Claude's stream began was charged a third of what it may have cost."""
    assert estimate_input_tokens(image_request(data, media_type)) == OVERHEAD_TOKENS + MAX_IMAGE_TOKENS
    assert MAX_IMAGE_TOKENS >= 92 * 52


@pytest.mark.parametrize("encode", [png, jpeg, gif, webp])
def test_a_small_image_reserves_what_its_size_is_billed(encode: Any) -> None:
    """Not the most an image can cost: a request of many icons still fits a budget it fits."""
    media_type = f"image/{encode.__name__}"
    tokens = estimate_input_tokens(image_request(encode(300, 200), media_type)) - OVERHEAD_TOKENS
    assert tokens == max(11 * 8, -(-300 * 200 // 750))  # patches, or the older models' pixels / 750


def test_lossy_and_lossless_webp_sizes_are_read() -> None:
    lossy = b"VP8 " + struct.pack("<I", 100) + b"\0\0\0\x9d\x01\x2a" + struct.pack("<HH", 300, 200)
    bits = (300 - 1) | (200 - 1) << 14
    lossless = b"VP8L" + struct.pack("<I", 100) + b"\x2f" + struct.pack("<I", bits)
    for chunk in (lossy, lossless):
        data = base64.b64encode(b"RIFF" + struct.pack("<I", 1000) + b"WEBP" + chunk + b"\0" * 16).decode()
        assert image_tokens({"type": "base64", "data": data}) == 11 * 8


@pytest.mark.parametrize(
    "walk",
    [b"\xff" * (1024 * 1024), b"\xff\x01" * (512 * 1024), b"\xff\xe0\x00\x02" * (256 * 1024)],
    ids=["fill-bytes", "standalone-markers", "empty-segments"],
)
def test_a_jpeg_of_countless_markers_is_not_walked_to_the_end(walk: bytes) -> None:
    """A JPEG's segments were walked a marker at a time for up to 1 MiB: a megabyte of fill bytes
    (or of markers with no segment, or of empty segments) before the frame header took a million
    steps, 0.6 s of the event loop for one image of 1.4 MB, 14 s for a 32 MiB request of them. No
    encoder writes more than a few dozen segments before the frame header; past `JPEG_STEPS`, the
    size counts as unreadable (the most an image is billed is reserved)."""
    data = base64.b64encode(b"\xff\xd8" + walk + b"\xff\xc0\x00\x11\x08\x00\x10\x00\x10\x03").decode()
    decoded: list[int] = []
    real = binascii.a2b_base64

    def counting(chunk: Any, **kwargs: Any) -> bytes:
        decoded.append(len(chunk))
        return real(chunk, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(binascii, "a2b_base64", counting)
        assert image_tokens({"type": "base64", "data": data}) == MAX_IMAGE_TOKENS
    assert sum(decoded) <= 64 * 1024


def test_a_jpeg_with_some_fill_bytes_is_read() -> None:
    head = base64.b64decode(jpeg(300, 200))
    data = base64.b64encode(head[:2] + b"\xff" * 100 + head[2:]).decode()
    assert image_tokens({"type": "base64", "data": data}) == 11 * 8


def test_the_size_of_wrapped_base64_or_a_data_url_is_read() -> None:
    wrapped = base64.encodebytes(base64.b64decode(jpeg(300, 200))).decode()
    for data in (wrapped, "data:image/png;base64," + png(300, 200)):
        assert image_tokens({"type": "base64", "data": data}) == 11 * 8


def pdf(pages: int, *, object_stream: bool = False) -> str:
    """A small PDF of `pages` empty pages, its page objects plain or packed in a compressed object
    stream (as PDF 1.5 writers pack them)."""
    kids = " ".join(f"{3 + n} 0 R" for n in range(pages))
    page_objects = [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>"] * pages
    body = b"1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n"
    body += f"2 0 obj << /Type /Pages /Kids [{kids}] /Count {pages} >> endobj\n".encode()
    if object_stream:
        offsets, packed = [], b""
        for n, page in enumerate(page_objects):
            offsets.append(f"{3 + n} {len(packed)}")
            packed += page + b"\n"
        head = (" ".join(offsets) + " ").encode()
        stream = zlib.compress(head + packed)
        body += (
            (
                f"{3 + pages} 0 obj << /Type /ObjStm /N {pages} /First {len(head)} /Filter /FlateDecode "
                f"/Length {len(stream)} >>\nstream\n"
            ).encode()
            + stream
            + b"\nendstream\nendobj\n"
        )
    else:
        for n, page in enumerate(page_objects):
            body += f"{3 + n} 0 obj ".encode() + page + b" endobj\n"
    return base64.b64encode(b"%PDF-1.7\n" + body + b"trailer << /Root 1 0 R >>\n%%EOF\n").decode()


@pytest.mark.parametrize("object_stream", [False, True], ids=["plain", "object-stream"])
def test_a_pdf_reserves_every_page_claude_reads(object_stream: bool) -> None:
    """Claude reads each page of a PDF as an image and as its text: a page costs 1,500 to 3,000
    tokens, at least what its image does (1,600 for a scanned page). A PDF reserved a token per 3
    base64 characters, some 300 tokens for this 3-page PDF of 700 bytes (about 7,000 billed), so a
    call cancelled before Claude's stream began was charged a twentieth of what it may have cost."""
    data = pdf(3, object_stream=object_stream)
    source = {"type": "base64", "media_type": "application/pdf", "data": data}
    document = {"type": "document", "source": source}
    tokens = estimate_input_tokens({"messages": [user(document)]}) - OVERHEAD_TOKENS
    assert tokens >= 3 * 1600
    assert tokens == 3 * PDF_PAGE_TOKENS


def test_a_pdf_of_many_compressed_streams_inflates_a_bounded_amount() -> None:
    """Each object stream was inflated up to 4 MiB, with no bound on their number: 200 streams of a
    few kilobytes (deflate packs 4 MiB of one byte into 4 KB) had the event loop inflate 800 MiB to
    count pages. All of a PDF's streams together now inflate at most `PDF_INFLATE_BUDGET`."""
    bomb = zlib.compress(b" " * media.PDF_OBJECT_STREAM_BYTES, 9)
    body = b"".join(
        f"{n} 0 obj << /Type /ObjStm /Filter /FlateDecode >>\nstream\n".encode() + bomb + b"\nendstream\n"
        for n in range(200)
    )
    data = base64.b64encode(b"%PDF-1.7\n" + body).decode()
    inflated: list[int] = []
    real = zlib.decompressobj

    class Counting:
        def __init__(self) -> None:
            self._inner = real()

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def decompress(self, data: Any, max_length: int = 0) -> bytes:
            out = self._inner.decompress(data, max_length)
            inflated.append(len(out))
            return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(zlib, "decompressobj", Counting)
        assert media.pdf_pages(data) == 0
    assert sum(inflated) <= media.PDF_INFLATE_BUDGET


def _corrupt_streams() -> bytes:
    """Streams that inflate to just under the per-stream cap, then turn out corrupt (an invalid
    block type): the inflater raises, and what it inflated went uncounted."""
    inflater = zlib.compressobj(9)
    bomb = inflater.compress(b" " * (media.PDF_OBJECT_STREAM_BYTES - 1)) + inflater.flush(zlib.Z_SYNC_FLUSH)
    return b"".join(
        f"{n} 0 obj << /Type /ObjStm >>\nstream\n".encode() + bomb + b"\x06\xff\xff\nendstream\n"
        for n in range(40)
    )


def _unending_streams() -> bytes:
    """Streams of empty stored deflate blocks that never end: each inflates nothing and reads on
    through the rest of the file, past every later `/ObjStm` (quadratic reading, no output)."""
    marker = b"/ObjStm\nstream\n\x78\x01"  # a zlib header right after `stream`
    empty = b"\x00\x00\x00\xff\xff" * 2000  # non-final stored blocks of no bytes
    header = b"\x00" + struct.pack("<HH", len(marker), len(marker) ^ 0xFFFF)  # stored: the next marker
    return marker + empty + (header + marker + empty) * 150


@pytest.mark.parametrize("streams", [_corrupt_streams, _unending_streams], ids=["corrupt", "unending"])
def test_a_pdf_of_crafted_compressed_streams_costs_a_bounded_amount(streams: Any) -> None:
    """The inflate budget counted only what a stream gave back: a corrupt stream, which raises
    after inflating nearly 4 MiB, was charged nothing (40 such streams: 160 MiB inflated), and one
    of empty blocks that never ends reads through the rest of the file inflating nothing (a 20 MB
    PDF: 7 s of the event loop). What the inflater reads and writes is now charged, whatever the
    stream turns out to be."""
    data = base64.b64encode(b"%PDF-1.7\n" + streams()).decode()
    work: list[int] = []
    real = zlib.decompressobj

    class Measured:
        """A real inflater that records what it reads and writes, in steps, so that what a call
        does before it raises is counted too."""

        def __init__(self) -> None:
            self._inner = real()

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def decompress(self, data: Any, max_length: int = 0) -> bytes:
            pending, pieces, produced = memoryview(data), [], 0
            while True:
                room = 65536 if not max_length else min(65536, max_length - produced)
                unused = len(self._inner.unused_data)
                piece = self._inner.decompress(pending, room)
                tail = self._inner.unconsumed_tail
                work.append(len(pending) - len(tail) - (len(self._inner.unused_data) - unused) + len(piece))
                pieces.append(piece)
                produced += len(piece)
                pending = memoryview(tail)
                if self._inner.eof or not tail or (max_length and produced >= max_length):
                    return b"".join(pieces)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(zlib, "decompressobj", Measured)
        media.pdf_pages(data)
    assert sum(work) <= media.PDF_INFLATE_BUDGET + 2 * media.PDF_INFLATE_STEP
