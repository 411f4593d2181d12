"""Redaction cannot be escaped around: a secret with quotes, backslashes, non-ASCII or control
characters is replaced in every form it takes in a log line (JSON or text), an audit line, or a repr."""

from __future__ import annotations

import base64
import io
import json
import logging
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_backfill.cli import parse_config
from mcp_backfill.logs import Redactor, configure_logging, get_logger
from mcp_backfill.sampling.audit import AuditLog, AuditRecord

tricky = st.text(
    alphabet=st.sampled_from(['"', "\\", "'", "é", "\n", "\t", "\x00", "\u2028", "a", "Z", "9", "/", " "]),
    min_size=4,
    max_size=24,
)
secrets = st.one_of(tricky, st.text(min_size=4, max_size=24))


def forms(secret: str) -> list[str]:
    return [
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret)[1:-1],
    ]


def logged(secret: str, fmt: str) -> str:
    stream = io.StringIO()
    configure_logging("info", fmt, [secret], stream=stream)
    try:
        log = get_logger("test")
        log.warning("failed with %s", secret, extra={"detail": {"echo": secret}, "raw": repr(secret)})
        try:
            raise ValueError(secret)
        except ValueError:
            log.exception("boom %r", secret)
    finally:
        configure_logging("info", "text", [])
        logging.getLogger().handlers.clear()
    return stream.getvalue()


@given(secrets)
def test_no_form_of_a_secret_survives_the_json_log(secret: str) -> None:
    output = logged(secret, "json")
    for form in forms(secret):
        assert form not in output


@given(secrets)
def test_no_form_of_a_secret_survives_the_text_log(secret: str) -> None:
    output = logged(secret, "text")
    for form in forms(secret):
        assert form not in output


def test_a_secret_with_a_quote_and_a_backslash_is_redacted_in_json() -> None:
    secret = 'sk-"quoted\\slashed'
    line = json.dumps({"error": f"upstream said {secret}"})
    assert secret not in json.loads(Redactor([secret]).redact(line))["error"]
    assert "***" in Redactor([secret]).redact(line)


@pytest.mark.anyio
async def test_audit_lines_redact_escaped_secrets(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    secret = 'key"with\\odd\u00e9chars'
    audit = AuditLog(str(path), include_content=True, secrets=[secret])
    async with audit.running():
        record = AuditRecord(request_id=1, session="s")
        record.fail(-32603, f"provider echoed {secret}")
        audit.record(record, params={"x": secret})
    text = path.read_text()
    assert json.loads(text)["error"]["message"] == "provider echoed ***"
    for form in forms(secret):
        assert form not in text


def test_credentials_in_the_otlp_variables_are_secrets() -> None:
    """The SDK's warning about a failed export quotes the URL it tried, query string included, and
    a collector's key may sit in the URL or in the exporter's headers."""
    env = {
        "ANTHROPIC_API_KEY": "sk-ant-unit-secret",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://otel:pass%2Fword@c.example/v1/traces?token=tok%2B1&x=1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1",  # unusable: nothing to find, nothing raised
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=key-0123,Authorization=Bearer%20bearer-4567",
    }
    secrets = set(parse_config(["--", "s"], env).secrets())
    assert {"otel", "pass%2Fword", "pass/word", "tok%2B1", "tok+1"} <= secrets
    assert {"key-0123", "Bearer%20bearer-4567", "Bearer bearer-4567", "bearer-4567"} <= secrets
    # The exporter sends the user information as `Authorization: Basic base64(user:password)`.
    assert base64.b64encode(b"otel:pass/word").decode() in secrets
    line = "Max retries exceeded with url: /v1/traces?token=tok%2B1&x=1"
    assert Redactor(secrets).redact(line) == "Max retries exceeded with url: /v1/traces?token=***&x=1"
    assert parse_config(["--", "s"], {"ANTHROPIC_API_KEY": "sk-ant-unit-secret"}).telemetry_secrets == ()


def test_only_credential_named_query_values_of_the_otlp_endpoint_are_secrets() -> None:
    """`?debug=true` is no credential: taken for one, every `true` in a JSON log or audit line
    became `***` and the line stopped being JSON."""
    env = {
        "ANTHROPIC_API_KEY": "sk-ant-unit-secret",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/?debug=true&region=eu-west&token=abcdef123456",
    }
    secrets = parse_config(["--", "s"], env).secrets()
    assert "abcdef123456" in secrets
    assert not {"true", "eu-west"} & set(secrets)
    line = json.dumps({"method": "sampling/createMessage", "isError": True})
    assert json.loads(Redactor(secrets).redact(line)) == {"method": "sampling/createMessage", "isError": True}


@given(secrets)
def test_a_secret_in_json_with_escaped_slashes_is_redacted(secret: str) -> None:
    """JSON may escape `/` as `\\/` (PHP's `json_encode` does, by default): a server quoting a
    credential that holds a slash (a base64 token) in such an error reached the client whole."""
    line = json.dumps({"error": f"bad credentials: {secret}"}).replace("/", "\\/")
    redacted = Redactor([secret]).redact(line)
    assert secret not in json.loads(redacted)["error"]


@pytest.mark.parametrize(
    "quoted",
    [
        "refresh_token=1%2F%2F0gAbc-def%2Bghi%3D&grant_type=refresh_token",  # a form, as sent
        "refresh_token=1%2f%2f0gAbc-def%2bghi%3d",  # lower-case escapes
        "GET /token/1//0gAbc-def%2Bghi%3D HTTP/1.1",  # in a URL's path, `/` kept
    ],
)
def test_a_percent_encoded_secret_is_redacted(quoted: str) -> None:
    """A Google refresh token (`1//0g…`) goes to the token endpoint form-encoded, its slashes as
    `%2F`: an endpoint refusing it with the request quoted had the token reach the server, the log
    and the audit log, as only its plain and escaped forms were replaced."""
    secret = "1//0gAbc-def+ghi="
    redacted = Redactor([secret]).redact(quoted)
    assert "0gAbc" not in redacted, redacted
    assert "***" in redacted


@given(secrets)
def test_no_percent_encoded_form_of_a_secret_survives(secret: str) -> None:
    try:
        encoded = [urllib.parse.quote_plus(secret, safe=""), urllib.parse.quote(secret, safe="")]
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8 form to encode
        return
    for form in encoded:
        assert form not in Redactor([secret]).redact(f"quoted: {form}.")


@pytest.mark.parametrize("text", ["\u009b31mred", "\u202eevil\u202c", "\u2066x\u2069", "\x1b[2J", "a\u0085b"])
def test_json_log_lines_carry_no_raw_control_or_direction_characters(text: str) -> None:
    """A value a client controls (a client or tool name, a model hint) logged as JSON: C0 controls
    were escaped, but C1 ones (U+009B is a terminal's CSI) and bidi overrides went out raw, for a
    terminal or a log viewer to act on."""
    from mcp_backfill.logs import JsonFormatter

    record = logging.makeLogRecord({"msg": "sampling answered", "levelname": "INFO", "tool": text})
    line = JsonFormatter().format(record)
    assert json.loads(line)["tool"] == text
    assert not any(
        0x80 <= ord(c) <= 0x9F or 0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069 for c in line
    )
    assert "\x1b" not in line


def test_google_auth_logs_go_through_the_redacting_log_after_its_first_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """google-auth turns off the propagation of the `google` logger at its first HTTP request unless
    that logger was configured: from then on its warnings went around the proxy's log to Python's
    last-resort handler, unredacted and not in the log's format. Its debug log of each token
    request (the form, a service account's signed assertion in it, and the headers) stays off
    whatever the root logger's level."""
    google_helpers = pytest.importorskip("google.auth._helpers")
    google = logging.getLogger("google")
    monkeypatch.setattr(google, "propagate", True)
    monkeypatch.setattr(google, "level", logging.NOTSET)
    monkeypatch.setattr(google_helpers, "_LOGGING_INITIALIZED", False)  # as in a fresh process
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", root.level)
    secret = "sk-ant-google-warning-secret"
    stream = io.StringIO()
    configure_logging("info", "json", [secret], stream=stream)
    root.setLevel(logging.DEBUG)  # a library user's, say
    transport = logging.getLogger("google.auth.transport.requests")
    form = b"grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=eyJhead.eyJbody.sig"
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Authorization": "Basic c2VjcmV0"}
    google_helpers.request_log(transport, "POST", "https://oauth2.example/token", form, headers)
    logging.getLogger("google.auth._default").warning("refused with %s", secret)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["msg"] for line in lines] == ["refused with ***"], lines
    assert google.propagate


SIGNATURE = "d2d705fd11d35dd67d66cf72a44e6d6e37878cff8e25a5ef7b62755555b63ec0"
SESSION_TOKEN = "IQoJb3JpZ2luX2VjEFAKE/session+token=="
SIGNED = (
    "AWS4-HMAC-SHA256 Credential=AKIAFAKEFAKEFAKE0001/20261128/us-west-2/bedrock/aws4_request, "
    f"SignedHeaders=host;x-amz-date;x-amz-security-token, Signature={SIGNATURE}"
)
PRESIGNED = (
    "https://bedrock-runtime.us-west-2.amazonaws.com/model/x?X-Amz-Algorithm=AWS4-HMAC-SHA256"
    "&X-Amz-Credential=ASIAFAKEFAKEFAKE0002%2F20261128%2Fus-west-2%2Fbedrock%2Faws4_request"
    f"&X-Amz-Date=20261128T000000Z&X-Amz-Security-Token={urllib.parse.quote(SESSION_TOKEN, safe='')}"
    f"&X-Amz-Signature={SIGNATURE}&X-Amz-SignedHeaders=host"
)


@pytest.mark.parametrize(
    "quoted",
    [
        SIGNED,
        SIGNED.partition(" ")[2],  # the value without its scheme
        SIGNED.partition(" ")[2].replace(", ", ","),  # re-joined by a gateway
        f"signature mismatch: Signature={SIGNATURE}",
        f"signature mismatch: signature={SIGNATURE}.",
        "Credential=AKIAFAKEFAKEFAKE0001/20261128/us-west-2/bedrock/aws4_request is not authorized",
        PRESIGNED,
        PRESIGNED.replace("=", "%3D"),  # the URL itself a query parameter's value
        json.dumps({"error": {"message": f"refused {PRESIGNED}"}}),
        json.dumps({"headers": {"x-amz-security-token": SESSION_TOKEN, "authorization": SIGNED}}),
        json.dumps(json.dumps({"X-Amz-Security-Token": SESSION_TOKEN})),  # JSON inside a JSON string
        json.dumps({"x-amz-security-token": SESSION_TOKEN}).replace("/", "\\/"),  # `/` escaped (PHP's)
        f"X-Amz-Security-Token: {SESSION_TOKEN}\r\nHost: bedrock",
    ],
)
def test_aws_signing_material_quoted_apart_from_its_header_is_redacted(quoted: str) -> None:
    """A SigV4 signature or credential (with its access key id), a presigned URL's `X-Amz-*` query or
    a session token's header, quoted by an endpoint apart from the `Authorization` value the proxy
    knows whole (or from a request the proxy never made), reached errors and logs: masked whatever
    the secrets the redactor was given; a JSON text stays JSON."""
    redacted = Redactor([]).redact(quoted)
    found = (SIGNATURE, "AKIAFAKEFAKEFAKE0001", "ASIAFAKEFAKEFAKE0002", "session+token", "session%2Btoken")
    for secret in found:
        assert secret not in redacted, (secret, redacted)
    if quoted.startswith(("{", '"')):
        json.loads(redacted)


@pytest.mark.parametrize(
    "text",
    [
        '{"method": "tools/call", "params": {"name": "sign", "arguments": {"x": "Signature"}}}',
        "MySignature=1 and an X-Amz-Date=20261128T000000Z, SignedHeaders=host",
        "AKIA is a prefix; AKIAFAKE is too short",
    ],
)
def test_text_without_aws_signing_material_is_left_as_it_is(text: str) -> None:
    assert Redactor([]).redact(text) == text


unshown = st.text(
    alphabet=st.sampled_from(["é", "\x85", "\u009b", "\u200e", "\u202e", "\u2066", "\u2028", "a", "/", '"']),
    min_size=4,
    max_size=16,
)


@given(unshown)
def test_a_secret_with_characters_the_json_log_escapes_itself_is_redacted(secret: str) -> None:
    """The JSON log writes non-ASCII text as it is but escapes C1 controls and bidirectional marks
    itself (`\\u0085`, `\\u202e`): a secret holding both (`clé\\x85…`) was in the line in a form none
    of its encoded forms had, and read back whole from the line."""
    output = logged(secret, "json")
    for line in output.splitlines():
        if line.startswith("{"):
            read = json.dumps(json.loads(line), ensure_ascii=False)
            for form in (secret, repr(secret)[1:-1]):  # also as the `%r` and traceback quote it
                assert form not in read, line
