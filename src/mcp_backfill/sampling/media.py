"""Base64 payloads of images, audio and documents, measured and unwrapped without decoding them."""

from __future__ import annotations

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
