"""Logging to stderr only (stdout is the protocol), as text or JSON lines, with secrets redacted."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import urllib.parse
from collections.abc import Iterable
from typing import Any, TextIO

LOGGER_NAME = "mcp_backfill"
_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
# The encoders of a line's fields, made once (`json.dumps` with options builds one per call).
_FIELD = json.JSONEncoder(default=str)
_LINE = json.JSONEncoder(default=str, ensure_ascii=False)
# What a JSON line escapes beyond JSON's own C0 controls: C1 controls (U+009B is a terminal's CSI)
# and bidirectional overrides and isolates, which a terminal or a log viewer would act on.
_UNSHOWN = re.compile("[\u007f-\u009f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def get_logger(name: str = "") -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.{name}" if name else LOGGER_NAME)


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")}


class TextFormatter(logging.Formatter):
    """`2026-11-22T10:00:00Z mcp-backfill WARNING message key=value …`: readable in a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"{stamp}Z mcp-backfill {record.levelname} {record.getMessage()}"
        fields = _extra_fields(record)
        if fields:
            line += " " + " ".join(f"{k}={_FIELD.encode(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line, extra fields merged in, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_extra_fields(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return _UNSHOWN.sub(_escaped, _LINE.encode(entry))


class Redactor:
    """Replaces every secret value with `***` in finished text, whatever its source.

    A secret can reach text escaped: as a JSON string (a `"` becomes `\\"`, a non-ASCII character
    `\\uXXXX` when ASCII is forced, a `/` perhaps `\\/`), as a Python repr, or percent-encoded as a
    form or a URL carried it (a Google refresh token `1//0g…` goes to the token endpoint as
    `1%2F%2F0g…`, and an endpoint's refusal may quote the request). Every such form of each secret
    is replaced, longest first, so a secret with quotes or backslashes cannot slip past in an
    encoded line.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if len(secret) >= 4:
                forms.update(_encoded_forms(secret))
        self._forms = tuple(sorted(forms, key=len, reverse=True))

    def redact(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, "***")
        return redact_aws_signing(text)


# AWS signing material, whoever's it is: the parts of a SigV4 `Authorization` value
# (`Credential=AKIA…/date/region/service/aws4_request`, `Signature=<hex>`), a presigned URL's
# `X-Amz-Credential`, `X-Amz-Security-Token` and `X-Amz-Signature` (`=` perhaps percent-encoded),
# and the `X-Amz-Security-Token` header as a text or JSON quotes it. An endpoint's error may quote
# any of them apart from the header they came in (which the value redaction knows whole), or a
# presigned URL the proxy never made. The value ends where a header's parts, a query's parameters,
# a JSON string or a quote end, so a JSON line stays JSON.
_AWS_SIGNING = re.compile(
    r"(?i:(?<![A-Za-z0-9-])("
    r"(?:(?:X-Amz-)?(?:Signature|Credential)|X-Amz-Security-Token)(?:=|%3D)"  # a header's part, a query's
    r"|X-Amz-Security-Token\\?[\"']?\s*:\s*\\?[\"']?"  # the header, in text or (escaped) JSON
    r"))(?:[^\s&,;\"'<>\\]|\\/)+"  # to a part's, a parameter's, a string's end (`\/`: JSON's `/`)
)
# What each match holds, looked for first: a plain substring search costs little, where the
# regular expression scanned every log and audit line whole (a few megabytes of base64 image data
# in an audit line with `--audit-content` took tens of milliseconds).
_AWS_SIGNING_WORDS = ("ignature", "IGNATURE", "redential", "REDENTIAL", "ecurity-", "ECURITY-")


def redact_aws_signing(text: str) -> str:
    """`text` with `***` for the AWS signing material in it (`_AWS_SIGNING`)."""
    if any(word in text for word in _AWS_SIGNING_WORDS):
        text = _AWS_SIGNING.sub(r"\1***", text)
    return text


def _encoded_forms(secret: str) -> set[str]:
    """`secret` as a text may hold it: as it is, its Python repr, percent-encoded; and each of
    these as a JSON string holds it (so a repr quoted in a JSON line too)."""
    plain = {secret, repr(secret)[1:-1], ascii(secret)[1:-1]}
    return plain | {form for each in plain for form in _json_forms(each)} | _percent_encoded(secret)


def _json_forms(text: str) -> set[str]:
    """`text` inside a JSON string: non-ASCII escaped or not, and as the JSON log writes it (non-ASCII
    as it is but C1 controls and bidirectional marks escaped, `_UNSHOWN`); each also with `/` as
    `\\/`, as some encoders (PHP's) write it."""
    as_json = {json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]}
    as_json.add(_UNSHOWN.sub(_escaped, json.dumps(text, ensure_ascii=False)[1:-1]))
    return as_json | {form.replace("/", "\\/") for form in as_json}


def _percent_encoded(secret: str) -> set[str]:
    """`secret` as a form (`application/x-www-form-urlencoded`: a space is `+`) and a URL encode it,
    with every reserved character encoded or `/` kept, in upper and lower case hex digits."""
    try:
        encoded = {
            urllib.parse.quote_plus(secret, safe=""),
            urllib.parse.quote(secret, safe=""),
            urllib.parse.quote(secret, safe="/"),
        }
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8, no percent-encoded form
        return set()
    return encoded | {_PERCENT_ESCAPE.sub(lambda m: m.group().lower(), form) for form in encoded}


_PERCENT_ESCAPE = re.compile("%[0-9A-F]{2}")


class RedactingHandler(logging.StreamHandler[TextIO]):
    def __init__(self, stream: TextIO, redactor: Redactor) -> None:
        super().__init__(stream)
        self._redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        return self._redactor.redact(super().format(record))


# google-auth's logger. At its first HTTP request google-auth turns off its propagation unless it was
# configured (`google.auth._helpers.is_logging_enabled`): its warnings then went around the
# redacting handler to Python's last-resort one. Configured here, at WARNING, it propagates, and
# google-auth's debug log of each token request (the form, with a signed assertion or a refresh
# token, and the headers) is never made, whatever the root logger's level.
GOOGLE_LOGGER_NAME = "google"


def configure_logging(
    level: str, fmt: str, secrets: Iterable[str] = (), stream: TextIO | None = None
) -> None:
    """Route all logging (ours and libraries') to stderr in the chosen format."""
    handler = RedactingHandler(stream or sys.stderr, Redactor(secrets))
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    google = logging.getLogger(GOOGLE_LOGGER_NAME)
    google.setLevel(logging.WARNING)
    google.propagate = True
    get_logger().setLevel(level.upper())
