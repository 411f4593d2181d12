"""Base64 payloads of images, audio and documents, measured and unwrapped without decoding them
(an image's size is read from the few bytes of its header that hold it)."""

from __future__ import annotations

import binascii
import re
import zlib

_WHITESPACE = ("\n", "\r", " ", "\t")


def strip_data_url(data: str) -> str:
    """Some servers send `data:<mime>;base64,<data>`; the API and the size limits want the bare base64."""
    if data.startswith("data:") and ";base64," in data[:100]:
        return data.split(";base64,", 1)[1]
    return data


def decoded_size(data: str) -> int:
    """Decoded size of base64 data (a `data:` URL prefix allowed) without decoding it."""
    data = strip_data_url(data)
    length = len(data)
    # Wrapped base64 (MIME, PEM) breaks its first line within 76 characters; unwrapped data is
    # not scanned again, which keeps this cheap for tens of megabytes.
    if any(c in data[:128] for c in _WHITESPACE):
        length -= sum(data.count(c) for c in _WHITESPACE)
    padding = data.rstrip()[-2:].count("=")
    return max(0, length * 3 // 4 - padding)


# How far into an image its size is looked for: a JPEG's frame header may follow an EXIF segment of
# up to 64 KiB (a thumbnail), an ICC profile and a few more.
SIZE_SEARCH_BYTES = 1024 * 1024
# How many markers (fill bytes included) of a JPEG are walked to find its frame header: encoders
# write a few dozen segments before it; a crafted file of a megabyte of fill bytes, a step each,
# took a million steps (0.6 s of the event loop for one image).
JPEG_STEPS = 1024
# JPEG markers whose segment is a frame header (SOF0-SOF15 but DHT, JPG and DAC) and holds the size.
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def image_size(data: str) -> tuple[int, int] | None:
    """(width, height) in pixels of a PNG, JPEG, GIF or WebP given as base64 (a `data:` URL prefix
    allowed), read from its header; None when it cannot be read there. Only the bytes looked at
    are decoded (a JPEG's segments are walked by their lengths, not decoded)."""
    data = strip_data_url(data)
    if any(c in data[:128] for c in _WHITESPACE):  # wrapped base64 (see `decoded_size`)
        data = "".join(data[: SIZE_SEARCH_BYTES * 3 // 2].split())
    read = _Base64Reader(data)
    head = read(0, 30)
    if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR" and len(head) >= 24:
        return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return int.from_bytes(head[6:8], "little"), int.from_bytes(head[8:10], "little")
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp_size(head)
    if head[:2] == b"\xff\xd8":
        return _jpeg_size(read)
    return None


class _Base64Reader:
    """Bytes of unwrapped base64 data, decoded a few at a time; b"" where they cannot be."""

    def __init__(self, data: str) -> None:
        self._data = data

    def __call__(self, at: int, count: int) -> bytes:
        first = at // 3 * 4
        chunk = self._data[first : first + -(-(at % 3 + count) // 3) * 4]
        chunk = chunk[: len(chunk) - len(chunk) % 4]
        try:
            decoded = binascii.a2b_base64(chunk, strict_mode=True)
        except (binascii.Error, ValueError):  # not base64 (padding mid-way, a foreign character)
            return b""
        return decoded[at % 3 : at % 3 + count]


def _webp_size(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8X" and len(head) >= 30:
        return int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1
    if chunk == b"VP8L" and len(head) >= 25 and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 " and len(head) >= 30 and head[23:26] == b"\x9d\x01\x2a":
        return int.from_bytes(head[26:28], "little") & 0x3FFF, int.from_bytes(head[28:30], "little") & 0x3FFF
    return None


def _jpeg_size(read: _Base64Reader) -> tuple[int, int] | None:
    """The size in a JPEG's frame header, found by walking its segments from the start (at most
    `JPEG_STEPS` markers, within its first `SIZE_SEARCH_BYTES`)."""
    at = 2
    for _ in range(JPEG_STEPS):
        if at >= SIZE_SEARCH_BYTES:
            return None
        segment = read(at, 9)
        if len(segment) < 4 or segment[0] != 0xFF:
            return None
        marker = segment[1]
        if marker == 0xFF:  # a fill byte
            at += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD7:  # no segment of their own
            at += 2
        elif marker in (0xD9, 0xDA):  # the image ends, or its data starts, before any frame header
            return None
        elif marker in _JPEG_FRAMES:
            if len(segment) < 9:
                return None
            return int.from_bytes(segment[7:9], "big"), int.from_bytes(segment[5:7], "big")
        else:
            length = int.from_bytes(segment[2:4], "big")
            if length < 2:
                return None
            at += 2 + length
    return None


# A page object of a PDF (`/Type /Page`, not the page tree's `/Type /Pages`).
_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z0-9])")
# How much of one compressed object stream is inflated to look for page objects in it, and how many
# bytes the inflater may read and write for all of one PDF's together (a small PDF of many highly
# compressed streams would otherwise have the event loop inflate gigabytes: a thousand to one is
# deflate's ratio for runs of one byte; a stream that turns out corrupt raises after inflating all
# it could, and one of empty blocks reads on through the rest of the file, writing nothing).
PDF_OBJECT_STREAM_BYTES = 4 * 1024 * 1024
PDF_INFLATE_BUDGET = 16 * 1024 * 1024
PDF_INFLATE_STEP = 64 * 1024
"""The inflater is fed and emptied this many bytes at a time, each step charged to the budget."""


def pdf_pages(data: str) -> int:
    """How many pages a PDF given as base64 has, as far as its page objects can be counted: plain
    ones, and those packed in compressed object streams (PDF 1.5 and later); 0 if none was found
    (not a PDF, or one this cannot read)."""
    data = strip_data_url(data)
    if any(c in data[:128] for c in _WHITESPACE):
        data = "".join(data.split())
    try:
        raw = binascii.a2b_base64(data[: len(data) - len(data) % 4])
    except (binascii.Error, ValueError):
        return 0
    pages, view = len(_PDF_PAGE.findall(raw)), memoryview(raw)
    budget = PDF_INFLATE_BUDGET
    at = raw.find(b"/ObjStm")
    while at != -1 and budget > 0:  # each object stream's data follows `stream` after its dictionary
        begin = raw.find(b"stream", at)
        if begin == -1:
            break
        begin += len(b"stream")
        begin += 2 if raw[begin : begin + 2] == b"\r\n" else 1
        inflated, spent = _inflate(view[begin:], budget)
        budget -= spent
        pages += len(_PDF_PAGE.findall(inflated))
        at = raw.find(b"/ObjStm", begin)
    return pages


def _inflate(data: memoryview, budget: int) -> tuple[bytes, int]:
    """Up to `PDF_OBJECT_STREAM_BYTES` inflated from the start of `data` (what came before an error
    included), and the bytes the inflater read and wrote for it, at most about `budget`."""
    inflater, pieces = zlib.decompressobj(), []
    spent = produced = fed = 0
    pending = data[:0]
    while spent < budget and produced < PDF_OBJECT_STREAM_BYTES and not inflater.eof:
        if not pending:
            if fed >= len(data):
                break
            pending = data[fed : fed + PDF_INFLATE_STEP]
            fed += len(pending)
        room = min(PDF_INFLATE_STEP, PDF_OBJECT_STREAM_BYTES - produced)
        try:
            piece = inflater.decompress(pending, room)
        except zlib.error:  # corrupt: what it inflated before is counted, and searched
            spent += len(pending)
            break
        tail = inflater.unconsumed_tail
        spent += len(pending) - len(tail) + len(piece)
        produced += len(piece)
        pieces.append(piece)
        pending = memoryview(tail)
    return b"".join(pieces), spent
