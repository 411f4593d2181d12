"""Providers through the real proxy process: gateway headers, Bedrock and Vertex, missing extras.

Bedrock and Vertex run through the anthropic SDK's own clients, pointed at the fake Claude API with
their standard base-URL variables; the fake speaks their URL layout (and Bedrock's event-stream
framing), so the whole request path is exercised offline.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.e2e.faults_support import ask_sampling, echo_session
from tests.fake_claude import (
    FakeClaude,
    bedrock_chunk,
    error_reply,
    raw_reply,
    sse_event,
    stream_frames,
    text_reply,
)
from tests.harness import ROOT, TEST_API_KEY, proxy_argv, proxy_env, python_server

pytestmark = pytest.mark.anyio

GATEWAY_SECRET = "gw-secret-0123456789"


def platform_env(provider: str, fake: FakeClaude, region: str) -> dict[str, str]:
    """Bedrock (with a Bedrock API key) or Vertex (with a ready token) pointed at the fake."""
    if provider == "bedrock":
        return {
            "ANTHROPIC_BEDROCK_BASE_URL": fake.url,
            "AWS_REGION": region,
            "AWS_BEARER_TOKEN_BEDROCK": TEST_API_KEY,
        }
    return {
        "ANTHROPIC_VERTEX_BASE_URL": fake.url,
        "CLOUD_ML_REGION": region,
        "ANTHROPIC_VERTEX_PROJECT_ID": "proj-42",
        "MCP_BACKFILL_VERTEX_ACCESS_TOKEN": TEST_API_KEY,
    }


async def test_gateway_headers_from_flags(fake_claude: FakeClaude) -> None:
    options = ("--api-header", f"X-Gateway-Key: {GATEWAY_SECRET}", "--api-header", "X-Route: team-a, eu")
    async with echo_session(fake_claude, *options) as session:
        answer = await ask_sampling(session)
        log = session.stderr()
    assert "result" in answer
    [request] = fake_claude.message_requests
    assert request.headers["x-gateway-key"] == GATEWAY_SECRET
    assert request.headers["x-route"] == "team-a, eu"
    assert request.headers["authorization"] == f"Bearer {TEST_API_KEY}"
    assert GATEWAY_SECRET not in log


async def test_a_gateway_quoting_the_bare_token_of_a_header_is_redacted(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """The gateway refuses `Bearer <token>` and names the token alone in its error: the error the
    server gets, the log and the audit log show `***`."""
    fake_claude.enqueue(error_reply(401, "authentication_error", f"invalid gateway token {GATEWAY_SECRET}"))
    audit = tmp_path / "audit.jsonl"
    options = (
        *("--api-header", f"X-Gateway-Authorization: Bearer {GATEWAY_SECRET}"),
        *("--retry-max-attempts", "1", "--audit-log", str(audit)),
    )
    async with echo_session(fake_claude, *options) as session:
        answer = await ask_sampling(session)
        await session.close_stdin()
        await session.wait(30)
        log = session.stderr()
    assert "invalid gateway token ***" in answer["error"]["message"], answer
    places = {"to the server": answer["error"]["message"], "log": log, "audit": audit.read_text()}
    assert [where for where, text in places.items() if GATEWAY_SECRET in text] == []


async def test_gateway_headers_from_the_environment(fake_claude: FakeClaude) -> None:
    env = {"MCP_BACKFILL_API_HEADERS": f"X-Gateway-Key: {GATEWAY_SECRET}\nX-Route: team-b"}
    async with echo_session(fake_claude, env=env) as session:
        answer = await ask_sampling(session)
    assert "result" in answer
    [request] = fake_claude.message_requests
    assert (request.headers["x-gateway-key"], request.headers["x-route"]) == (GATEWAY_SECRET, "team-b")


async def test_bedrock_through_the_proxy(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("answered on bedrock"))
    env = platform_env("bedrock", fake_claude, "eu-central-1")
    async with echo_session(None, "--provider", "bedrock", env=env) as session:
        answer = await ask_sampling(session)
        log = session.stderr()
    assert answer["result"]["content"] == {"type": "text", "text": "answered on bedrock"}
    assert answer["result"]["model"] == "anthropic.claude-sonnet-5-5"
    [request] = fake_claude.platform_requests
    assert request.path == "/model/anthropic.claude-sonnet-5-5/invoke-with-response-stream"
    assert request.headers["authorization"] == f"Bearer {TEST_API_KEY}"
    assert "model" not in request.body
    assert TEST_API_KEY not in log


async def test_a_corrupted_bedrock_frame_is_retried_as_a_malformed_stream(fake_claude: FakeClaude) -> None:
    """An AWS event-stream frame that fails its checksum (botocore's `ChecksumMismatch`, not a
    `ValueError`) was taken for the client refusing to make the call: not retried, though the call
    had been made (and billed), where the Claude API's malformed stream is retried."""
    broken = bytearray(bedrock_chunk(b'event: ping\ndata: {"type": "ping"}\n\n'))
    broken[-1] ^= 0xFF  # the message's CRC
    headers = {"content-type": "application/vnd.amazon.eventstream"}
    fake_claude.enqueue(raw_reply(bytes(broken), headers=headers), text_reply("answered after a retry"))
    env = platform_env("bedrock", fake_claude, "us-east-1")
    async with echo_session(None, "--provider", "bedrock", "--retry-base-delay", "0.01", env=env) as session:
        answer = await ask_sampling(session)
    assert answer.get("result", {}).get("content") == {"type": "text", "text": "answered after a retry"}, (
        answer
    )
    assert len(fake_claude.platform_requests) == 2


async def test_a_bedrock_api_key_with_a_trailing_line_break_is_used_without_it(
    fake_claude: FakeClaude,
) -> None:
    """As ANTHROPIC_API_KEY is: the SDK read AWS_BEARER_TOKEN_BEDROCK itself, untrimmed (a secret
    mounted as an environment variable often ends with a line break), so its header could not be
    sent and every call failed as "Claude API unreachable: Illegal header value", retried each time."""
    env = {
        **platform_env("bedrock", fake_claude, "us-east-1"),
        "AWS_BEARER_TOKEN_BEDROCK": f"{TEST_API_KEY}\n",
    }
    async with echo_session(None, "--provider", "bedrock", env=env) as session:
        answer = await ask_sampling(session)
    assert "result" in answer, answer
    [request] = fake_claude.platform_requests
    assert request.headers["authorization"] == f"Bearer {TEST_API_KEY}"


async def test_a_bedrock_api_key_from_a_file(fake_claude: FakeClaude, tmp_path: Path) -> None:
    """`AWS_BEARER_TOKEN_BEDROCK_FILE`, as `ANTHROPIC_API_KEY_FILE` and the Vertex token's: a key
    mounted as a file (a Kubernetes or Docker secret) had to be copied into the environment, where
    the proxy's whole process tree can read it."""
    key_file = tmp_path / "bedrock-key"
    key_file.write_text(f"{TEST_API_KEY}\n")
    env = {
        **platform_env("bedrock", fake_claude, "us-east-1"),
        "AWS_BEARER_TOKEN_BEDROCK_FILE": str(key_file),
    }
    del env["AWS_BEARER_TOKEN_BEDROCK"]
    async with echo_session(None, "--provider", "bedrock", env=env) as session:
        answer = await ask_sampling(session)
        log = session.stderr()
    assert "result" in answer, answer
    [request] = fake_claude.platform_requests
    assert request.headers["authorization"] == f"Bearer {TEST_API_KEY}"
    assert TEST_API_KEY not in log


def test_a_bedrock_api_key_of_two_lines_is_refused_at_startup() -> None:
    argv = proxy_argv("--provider", "bedrock", upstream=[sys.executable, "-c", "pass"])
    env = proxy_env(AWS_BEARER_TOKEN_BEDROCK=f"{TEST_API_KEY}\nsecond-line", AWS_REGION="us-east-1")
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "AWS_BEARER_TOKEN_BEDROCK holds a line break" in done.stderr
    assert TEST_API_KEY not in done.stderr
    assert done.stdout == ""


async def test_bedrock_with_a_native_model_id(fake_claude: FakeClaude) -> None:
    env = platform_env("bedrock", fake_claude, "us-east-1")
    native = "us.anthropic.claude-haiku-5-5"
    async with echo_session(None, "--provider", "bedrock", "--model", native, env=env) as session:
        answer = await ask_sampling(session)
    assert "result" in answer
    [request] = fake_claude.platform_requests
    assert request.path == f"/model/{native}/invoke-with-response-stream"


async def test_vertex_through_the_proxy(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("answered on vertex"))
    env = platform_env("vertex", fake_claude, "europe-west1")
    async with echo_session(None, "--provider", "vertex", env=env) as session:
        answer = await ask_sampling(session)
        log = session.stderr()
    assert answer["result"]["content"] == {"type": "text", "text": "answered on vertex"}
    [request] = fake_claude.platform_requests
    assert request.path == (
        "/projects/proj-42/locations/europe-west1/publishers/anthropic/models/claude-sonnet-5-5:streamRawPredict"
    )
    assert request.headers["authorization"] == f"Bearer {TEST_API_KEY}"
    assert TEST_API_KEY not in log


AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY-secret-key"
AWS_SESSION = "IQoJb3JpZ2luX2VjEFAKE/session+token/from=the/credentials+file0123456789"


def aws_profile_env(fake: FakeClaude, where: Path) -> dict[str, str]:
    """Bedrock signed with SigV4 (boto3) by credentials from a profile in the shared credentials
    file, none in the environment: AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE under `where`, no
    instance metadata."""
    credentials, config = where / "credentials", where / "config"
    credentials.write_text(
        "[mcp-tests]\naws_access_key_id = AKIAFAKEFAKEFAKE0001\n"
        f"aws_secret_access_key = {AWS_SECRET}\naws_session_token = {AWS_SESSION}\n"
    )
    config.write_text("[profile mcp-tests]\nregion = us-west-2\n")
    return {
        "ANTHROPIC_BEDROCK_BASE_URL": fake.url,
        "AWS_SHARED_CREDENTIALS_FILE": str(credentials),
        "AWS_CONFIG_FILE": str(config),
        "AWS_PROFILE": "mcp-tests",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


async def test_aws_credentials_from_a_profile_are_redacted(fake_claude: FakeClaude, tmp_path: Path) -> None:
    """Bedrock's AWS session token (and secret key) from a profile, the shared credentials file or an
    SSO cache, not the environment: an endpoint (a gateway) whose error quotes the request's headers
    (`X-Amz-Security-Token`) had the token shown to the server, in the log and the audit log, as only
    the environment's credentials were known to be secrets."""
    pytest.importorskip("boto3")  # the `bedrock` extra's SigV4 signer
    echoed = ("x-amz-security-token",)
    fake_claude.enqueue(error_reply(403, "permission_error", "not allowed", echo_headers=echoed))
    audit = tmp_path / "audit.jsonl"
    env = aws_profile_env(fake_claude, tmp_path)
    options = ("--provider", "bedrock", "--audit-log", str(audit), "--log-level", "debug")
    async with echo_session(None, *options, env=env) as session:
        answer = await ask_sampling(session)
        await session.close_stdin()
        await session.wait(30)
        log = session.stderr()
    assert len(fake_claude.platform_requests) == 1, (answer, log)
    [request] = fake_claude.platform_requests
    assert request.headers["x-amz-security-token"] == AWS_SESSION  # signed with the profile's
    assert request.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIAFAKEFAKEFAKE0001/")
    assert 'not allowed (request headers: {"x-amz-security-token": "***"})' in answer["error"]["message"], (
        answer
    )
    places = {"to the server": json.dumps(answer), "log": log, "audit": audit.read_text()}
    for secret in (AWS_SESSION, AWS_SECRET):
        assert [where for where, text in places.items() if secret in text] == [], secret


PRESIGNED_SIGNATURE = "9f2c4be1d07a3e55b6a1c0ffee0123456789abcdef0123456789abcdef012345"


def quoting_the_signature(way: str) -> Any:
    """A 403 whose message quotes the parts of the SigV4 `Authorization` the request carried (not
    the header whole, which was already redacted), or a presigned URL's query, as a gateway or an
    endpoint's error may: its `Signature=`, its `Credential=` (the access key id), the signature
    alone, or `X-Amz-Credential`/`X-Amz-Security-Token`/`X-Amz-Signature` of a URL."""

    def reply(request: Any) -> Any:
        value = request.headers["authorization"]
        parts = dict(part.strip().partition("=")[::2] for part in value.partition(" ")[2].split(","))
        signature, credential = parts["Signature"], parts["Credential"]
        token = urllib.parse.quote(request.headers["x-amz-security-token"], safe="")
        message = {
            "signature-part": f"signature does not match: Signature={signature}",
            "credential-part": f"not authorized: Credential={credential}, SignedHeaders=host",
            "bare-signature": f"the signature {signature} does not match the one we computed",
            "presigned-url": (
                "cannot fetch https://bedrock-runtime.us-west-2.amazonaws.com/model/x?"
                "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential="
                f"{urllib.parse.quote(credential, safe='')}&X-Amz-Date=20261128T000000Z"
                f"&X-Amz-Security-Token={token}&X-Amz-Signature={PRESIGNED_SIGNATURE}"
                "&X-Amz-SignedHeaders=host"
            ),
        }[way]
        return error_reply(403, "permission_error", message)

    return reply


@pytest.mark.parametrize("log_format", ["text", "json"])
@pytest.mark.parametrize("way", ["signature-part", "credential-part", "bare-signature", "presigned-url"])
async def test_parts_of_a_sigv4_signature_quoted_alone_are_redacted(
    fake_claude: FakeClaude, tmp_path: Path, way: str, log_format: str
) -> None:
    """Bedrock signed with SigV4: an endpoint whose error quotes the `Signature=` or `Credential=`
    of the request's `Authorization` without the rest of the header, the signature alone, or a
    presigned URL's `X-Amz-*` query, had it reach the server, the log and the audit log: only the
    header's whole value (after its scheme) was known to be a secret."""
    pytest.importorskip("boto3")
    fake_claude.enqueue(quoting_the_signature(way))
    audit = tmp_path / "audit.jsonl"
    env = aws_profile_env(fake_claude, tmp_path)
    options = ("--provider", "bedrock", "--audit-log", str(audit), "--log-format", log_format)
    async with echo_session(None, *options, env=env) as session:
        answer = await ask_sampling(session)
        await session.close_stdin()
        await session.wait(30)
        log = session.stderr()
    [request] = fake_claude.platform_requests
    signature = request.headers["authorization"].rpartition("Signature=")[2]
    assert "***" in answer.get("error", {}).get("message", ""), answer
    places = {"to the server": json.dumps(answer), "log": log, "audit": audit.read_text()}
    for secret in (signature, "AKIAFAKEFAKEFAKE0001", PRESIGNED_SIGNATURE, AWS_SESSION):
        quoted = (secret, urllib.parse.quote(secret, safe=""))
        assert [where for where, text in places.items() if any(q in text for q in quoted)] == [], secret


def aws_role_env(fake: FakeClaude, where: Path) -> dict[str, str]:
    """Bedrock signed with SigV4 by a role's credentials: a profile naming `role_arn` and a source
    profile, whose keys boto3 trades for the role's at STS (`AWS_ENDPOINT_URL_STS`: the fake), with
    botocore's own retries off (`max_attempts = 1`) so that each attempt of the proxy's asks once."""
    credentials, config = where / "credentials", where / "config"
    credentials.write_text(
        "[base]\naws_access_key_id = AKIAFAKEBASE00000001\naws_secret_access_key = base-secret\n"
    )
    config.write_text(
        "[profile mcp-role]\nrole_arn = arn:aws:iam::123456789012:role/mcp\nsource_profile = base\n"
        "region = us-west-2\nmax_attempts = 1\n"
    )
    return {
        "ANTHROPIC_BEDROCK_BASE_URL": fake.url,
        "AWS_ENDPOINT_URL_STS": fake.url,
        "AWS_SHARED_CREDENTIALS_FILE": str(credentials),
        "AWS_CONFIG_FILE": str(config),
        "AWS_PROFILE": "mcp-role",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.mark.parametrize("outage", ["sts_outages", "sts_unavailable"])
async def test_an_aws_credentials_service_briefly_out_is_retried_and_charged_nothing(
    fake_claude: FakeClaude, tmp_path: Path, outage: str
) -> None:
    """boto3 could not reach STS for the role's credentials (`sts_outages`: botocore's
    `ConnectionClosedError`), or STS answered `503 ServiceUnavailable` (`sts_unavailable`: its
    `ClientError`); nothing was sent to Claude, and the sampling request failed at once as "the
    client could not make the call", where Google's token endpoint answering a 5xx, and the Claude
    API's own 503, are retried. It is retried like them, and the attempt that never reached Claude
    is charged nothing."""
    pytest.importorskip("boto3")
    fake_claude.enqueue(text_reply("answered after the role's credentials came"))
    setattr(fake_claude, outage, 1)
    audit = tmp_path / "audit.jsonl"
    options = ("--provider", "bedrock", "--audit-log", str(audit), "--retry-base-delay", "0.01")
    async with echo_session(None, *options, env=aws_role_env(fake_claude, tmp_path)) as session:
        answer = await ask_sampling(session)
        await session.close_stdin()
        await session.wait(30)
    content = answer.get("result", {}).get("content")
    assert content == {"type": "text", "text": "answered after the role's credentials came"}, answer
    assert len(fake_claude.sts_requests) == 2
    [request] = fake_claude.platform_requests
    assert request.headers["x-amz-security-token"] == fake_claude.sts_credentials[2]
    [entry] = [json.loads(line) for line in audit.read_text().splitlines()]
    assert entry["charged"] == entry["usage"], entry  # that call only


async def test_an_aws_credentials_endpoint_that_stays_unreachable_is_named(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    pytest.importorskip("boto3")
    fake_claude.sts_outages = 100
    audit = tmp_path / "audit.jsonl"
    options = (
        "--provider",
        "bedrock",
        "--audit-log",
        str(audit),
        "--retry-base-delay",
        "0.01",
        "--retry-max-attempts",
        "3",
    )
    async with echo_session(None, *options, env=aws_role_env(fake_claude, tmp_path)) as session:
        answer = await ask_sampling(session)
        await session.close_stdin()
        await session.wait(30)
    error = answer["error"]
    assert (error["data"]["type"], error["data"]["attempts"]) == ("credentials_unavailable", 3), error
    assert "check the AWS credentials (AWS_BEARER_TOKEN_BEDROCK, AWS_PROFILE...)" in error["message"], error
    assert len(fake_claude.sts_requests) == 3
    assert fake_claude.platform_requests == []
    [entry] = [json.loads(line) for line in audit.read_text().splitlines()]
    assert not any((entry["charged"] or {}).values()), entry


def adc_env(fake: FakeClaude, where: Path, credentials: dict[str, object]) -> dict[str, str]:
    """Application Default Credentials for the real google-auth: `credentials` (a key file's JSON,
    whose `token_uri` is the fake) in a file under `where` named by GOOGLE_APPLICATION_CREDENTIALS.
    Nothing of this machine's reaches google-auth: no project variable (empty is unset to it), a
    scratch home and gcloud configuration, and a metadata server on 127.0.0.1:1 that refuses at
    once, were the search ever to get that far."""
    key_file = where / "application_default_credentials.json"
    key_file.write_text(json.dumps(credentials))
    for scratch in ("home", "gcloud"):
        (where / scratch).mkdir()
    return {
        "ANTHROPIC_VERTEX_BASE_URL": fake.url,
        "CLOUD_ML_REGION": "us-east5",
        "GOOGLE_APPLICATION_CREDENTIALS": str(key_file),
        "GOOGLE_CLOUD_PROJECT": "",
        "GCLOUD_PROJECT": "",
        "HOME": str(where / "home"),
        "CLOUDSDK_CONFIG": str(where / "gcloud"),
        "GCE_METADATA_HOST": "127.0.0.1:1",
        "GCE_METADATA_IP": "127.0.0.1:1",
        "NO_GCE_CHECK": "true",
        "GOOGLE_SDK_EXPERIMENTAL_PYTHON_REGIONAL_ACCESS_BOUNDARY_LOOKUP_ENABLED": "false",
    }


async def test_a_token_minted_from_application_default_credentials_is_redacted(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """The token google-auth mints is a secret as MCP_BACKFILL_VERTEX_ACCESS_TOKEN is: an endpoint (a
    gateway) that quotes it in an error had it shown to the server, in the log and the audit log."""
    minted = fake_claude.api_key = fake_claude.oauth_token
    fake_claude.enqueue(error_reply(403, "permission_error", f"token {minted} may not call this model"))
    audit = tmp_path / "audit.jsonl"
    env = adc_env(fake_claude, tmp_path, fake_claude.service_account_info("proj-42"))
    env["ANTHROPIC_VERTEX_PROJECT_ID"] = "proj-42"  # the token is minted on the first call
    options = ("--provider", "vertex", "--audit-log", str(audit))
    async with echo_session(None, *options, env=env) as session:
        answer = await ask_sampling(session)
        await session.close_stdin()
        await session.wait(30)
        log = session.stderr()
    assert "token *** may not call this model" in answer["error"]["message"], answer
    assert len(fake_claude.token_requests) == 1  # the real google-auth minted it
    [request] = fake_claude.platform_requests
    assert request.headers["authorization"] == f"Bearer {minted}"
    places = {"to the server": str(answer), "log": log, "audit": audit.read_text()}
    assert [where for where, text in places.items() if minted in text] == []


async def test_a_minted_token_quoted_after_a_whole_message_is_kept_out_of_the_log(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """A whole message, then an `error` event quoting the token google-auth minted (a gateway's):
    the message is the answer, and the warning that the stream went on logged the event's text as
    it came, the token in it (the log knows only configured secrets)."""
    minted = fake_claude.api_key = fake_claude.oauth_token
    message = {
        "id": "msg_whole",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [{"type": "text", "text": "all of it"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 12,
            "output_tokens": 4,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    quoting = {"type": "error", "error": {"type": "api_error", "message": f"token {minted} expired"}}
    fake_claude.enqueue(raw_reply(*stream_frames(message)[:-1], sse_event("error", quoting)))
    env = adc_env(fake_claude, tmp_path, fake_claude.service_account_info("proj-42"))
    env["ANTHROPIC_VERTEX_PROJECT_ID"] = "proj-42"
    async with echo_session(None, "--provider", "vertex", env=env) as session:
        answer = await ask_sampling(session)
        await session.close_stdin()
        await session.wait(30)
        log = session.stderr()
    assert answer.get("result", {}).get("content") == {"type": "text", "text": "all of it"}, answer
    assert "went on after message_delta" in log
    assert "token *** expired" in log, log
    assert minted not in log


# A refresh token as Google issues them: `1//0g` and base64url, its slashes `%2F` in a form.
GOOGLE_SHAPED_REFRESH_TOKEN = "1//0gFAKE-refresh_token/of+a/user0123456789abcdef"


async def test_a_token_endpoint_quoting_the_refresh_token_is_redacted(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """User credentials' refresh token and client secret (from the Application Default Credentials
    file, not a setting), quoted in the token endpoint's refusal of a later refresh (the hourly one
    of a proxy that runs on), reached the server, the log and the audit log in "the client could
    not make the call". The refresh token has Google's own shape (`1//0g…`), whose slashes the form
    carries as `%2F`: quoted so, it was not recognised."""
    info = fake_claude.workforce_user_info(refresh_token=GOOGLE_SHAPED_REFRESH_TOKEN)
    fake_claude.api_key = fake_claude.oauth_token
    fake_claude.oauth_expires_in = 60  # within google-auth's refresh threshold: refreshed before each use
    audit = tmp_path / "audit.jsonl"
    env = adc_env(fake_claude, tmp_path, info)
    env["ANTHROPIC_VERTEX_PROJECT_ID"] = "proj-42"
    async with echo_session(None, "--provider", "vertex", "--audit-log", str(audit), env=env) as session:
        first = await ask_sampling(session)
        minted = len(fake_claude.token_requests)
        fake_claude.oauth_echo_errors = True
        answer = await ask_sampling(session)
        await session.close_stdin()
        await session.wait(30)
        log = session.stderr()
    assert "result" in first, first
    assert "invalid_grant" in answer["error"]["message"], answer
    assert len(fake_claude.token_requests) == minted + 1  # the later refresh, refused
    assert "refresh_token=***" in answer["error"]["message"], answer
    places = {"to the server": json.dumps(answer), "log": log, "audit": audit.read_text()}
    for secret in (str(info["refresh_token"]), str(info["client_secret"])):
        for form in (secret, urllib.parse.quote_plus(secret)):
            assert [where for where, text in places.items() if form in text] == [], (form, answer)


async def test_a_token_endpoint_quoting_the_first_refresh_of_user_credentials_is_redacted(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """The first refresh of user credentials (the one that mints the proxy's first token) refused
    by a token endpoint that quotes the request: the refresh token reached the server, the log and
    the audit log, as the SDK refreshes the credentials it loads before it keeps them, where the
    redaction looks (a later refresh was redacted). The client secret goes as `Authorization:
    Basic base64(client_id:client_secret)`, one decoding away: quoted so, it is redacted too."""
    info = fake_claude.workforce_user_info(refresh_token=GOOGLE_SHAPED_REFRESH_TOKEN)
    info["client_secret"] = "GOCSPX-fake/client+secret=0123"
    fake_claude.oauth_echo_errors = True
    audit = tmp_path / "audit.jsonl"
    env = adc_env(fake_claude, tmp_path, info)
    env["ANTHROPIC_VERTEX_PROJECT_ID"] = "proj-42"
    options = ("--provider", "vertex", "--audit-log", str(audit), "--retry-max-attempts", "1")
    async with echo_session(None, *options, env=env) as session:
        answer = await ask_sampling(session)
        await session.close_stdin()
        await session.wait(30)
        log = session.stderr()
    [token_request] = fake_claude.token_requests  # the first refresh, refused
    basic = token_request.headers["authorization"].removeprefix("Basic ")
    assert base64.b64decode(basic).decode() == f"{info['client_id']}:{info['client_secret']}"
    assert "invalid_grant" in answer["error"]["message"], answer
    assert "refresh_token=***" in answer["error"]["message"], answer
    assert "(authorization: Basic ***)" in log, log
    places = {"to the server": json.dumps(answer), "log": log, "audit": audit.read_text()}
    for secret in (str(info["refresh_token"]), str(info["client_secret"]), basic):
        for form in (secret, urllib.parse.quote_plus(secret), urllib.parse.quote(secret, safe="")):
            assert [where for where, text in places.items() if form in text] == [], (form, answer)


async def refused_on_vertex(
    fake_claude: FakeClaude, tmp_path: Path, info: dict[str, object]
) -> tuple[dict[str, Any], dict[str, str]]:
    """One sampling request through the proxy with these Application Default Credentials (project
    `proj-42`, one attempt, an audit log): its answer, and the texts it left (the answer to the
    server, the log, the audit log) by where they went, to look for a secret in."""
    audit = tmp_path / "audit.jsonl"
    env = {**adc_env(fake_claude, tmp_path, info), "ANTHROPIC_VERTEX_PROJECT_ID": "proj-42"}
    options = ("--provider", "vertex", "--audit-log", str(audit), "--retry-max-attempts", "1")
    async with echo_session(None, *options, env=env) as session:
        answer = await ask_sampling(session)
        await session.close_stdin()
        await session.wait(30)
        log = session.stderr()
    return answer, {"to the server": json.dumps(answer), "log": log, "audit": audit.read_text()}


async def test_a_token_endpoint_quoting_the_source_credentials_of_an_impersonation_is_redacted(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """Application Default Credentials that impersonate a service account (`gcloud auth
    application-default login --impersonate-service-account`) hold the user's refresh token in their
    `source_credentials`: a token endpoint refusing its refresh with the request quoted had the
    token reach the server, the log and the audit log, as only the top credentials' secrets were
    looked for."""
    source = fake_claude.workforce_user_info(refresh_token=GOOGLE_SHAPED_REFRESH_TOKEN)
    info: dict[str, object] = {
        "type": "impersonated_service_account",
        "service_account_impersonation_url": (
            "https://iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/"
            "claude@proj-42.iam.gserviceaccount.com:generateAccessToken"
        ),
        "source_credentials": source,
    }
    fake_claude.oauth_echo_errors = True
    answer, places = await refused_on_vertex(fake_claude, tmp_path, info)
    assert len(fake_claude.token_requests) == 1  # the source's refresh, refused
    assert "refresh_token=***" in answer["error"]["message"], answer
    for form in (GOOGLE_SHAPED_REFRESH_TOKEN, urllib.parse.quote_plus(GOOGLE_SHAPED_REFRESH_TOKEN)):
        assert [where for where, text in places.items() if form in text] == [], (form, answer)


async def test_a_token_endpoint_quoting_a_service_accounts_signed_assertion_is_redacted(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """A service account's refresh sends a JWT signed with its private key (the `assertion`), which
    stands for the key until it expires. A token endpoint quoting its signature in a refusal had it
    reach the server, the log and the audit log: only the cut of an error text at 300 characters
    kept it out when the whole form was quoted, and a short refusal is not cut."""
    fake_claude.oauth_quote_signature = True
    info = fake_claude.service_account_info("proj-42")
    answer, places = await refused_on_vertex(fake_claude, tmp_path, info)
    [token_request] = fake_claude.token_requests
    assertion = dict(urllib.parse.parse_qsl(token_request.raw_body.decode()))["assertion"]
    signature = assertion.rpartition(".")[2]
    assert len(signature) > 300, assertion  # an RSA-2048 signature: 342 characters
    assert "JWT signature *** does not verify" in answer["error"]["message"], answer
    assert [where for where, text in places.items() if signature[:40] in text] == [], answer


# A workload identity pool's audience, as the token exchange names it.
WORKLOAD_POOL = "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/ci/providers/oidc"


async def test_a_token_endpoint_quoting_a_workload_identity_subject_token_is_redacted(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """Workload identity federation credentials (`external_account`) exchange a subject token (a
    Kubernetes or CI job's OIDC token, read from a file) at the token endpoint: one quoting it in a
    refusal had it reach the server, the log and the audit log, as no secret list held it."""
    subject_token = f"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJjaSJ9.fake-oidc-signature-{'0123456789' * 4}"
    token_file = tmp_path / "oidc-token"
    token_file.write_text(subject_token)
    info: dict[str, object] = {
        "type": "external_account",
        "audience": WORKLOAD_POOL,
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": fake_claude.url + "/oauth2/token",
        "credential_source": {"file": str(token_file)},
    }
    fake_claude.oauth_quote_signature = True
    answer, places = await refused_on_vertex(fake_claude, tmp_path, info)
    assert len(fake_claude.token_requests) == 1, answer
    assert "subject token *** does not verify" in answer["error"]["message"], answer
    assert [where for where, text in places.items() if "fake-oidc-signature" in text] == [], answer


async def test_application_default_credentials_fixed_after_a_refused_first_refresh_are_read_again(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """The first refresh refused (a revoked refresh token), the operator logs in again (`gcloud auth
    application-default login` writes the file anew): the next sampling request reads the new
    credentials, as before the proxy kept them ahead of the first refresh, without a restart."""
    revoked = {**fake_claude.workforce_user_info(), "refresh_token": "revoked-refresh-token-0123"}
    fake_claude.api_key = fake_claude.oauth_token
    env = {**adc_env(fake_claude, tmp_path, revoked), "ANTHROPIC_VERTEX_PROJECT_ID": "proj-42"}
    options = ("--provider", "vertex", "--retry-max-attempts", "1")
    async with echo_session(None, *options, env=env) as session:
        refused = await ask_sampling(session)
        renewed = fake_claude.workforce_user_info()
        Path(env["GOOGLE_APPLICATION_CREDENTIALS"]).write_text(json.dumps(renewed))
        answer = await ask_sampling(session)
    assert "invalid_grant" in refused["error"]["message"], refused
    assert "result" in answer, answer
    forms = [dict(urllib.parse.parse_qsl(r.raw_body.decode())) for r in fake_claude.token_requests]
    assert [form["refresh_token"] for form in forms] == [revoked["refresh_token"], renewed["refresh_token"]]


async def test_vertex_credentials_that_name_no_project_are_answered_with_the_variable_to_set(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """User credentials (`gcloud auth application-default login`, here a workforce identity
    federation user's, whose token endpoint can be the fake) name no project: the error said
    "Could not resolve project_id", not which variable gives one."""
    env = adc_env(fake_claude, tmp_path, fake_claude.workforce_user_info())
    async with echo_session(None, "--provider", "vertex", env=env) as session:
        answer = await ask_sampling(session)
        ping = await session.request(77, "ping", {})
    assert "ANTHROPIC_VERTEX_PROJECT_ID" in answer["error"]["message"], answer
    assert "result" in ping
    assert fake_claude.token_requests == []  # no token minted for a call that cannot be made
    assert fake_claude.platform_requests == []


async def test_user_credentials_with_the_project_set_log_no_warning_that_none_was_found(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """User credentials name no project, and ANTHROPIC_VERTEX_PROJECT_ID gives it: the log warned
    (google-auth's words) "No project ID could be determined. Consider running `gcloud config set
    project` or setting the GOOGLE_CLOUD_PROJECT environment variable", about a project that was
    set, sending the operator after a variable the proxy does not need."""
    fake_claude.enqueue(text_reply("answered on vertex"))
    fake_claude.api_key = fake_claude.oauth_token
    env = {
        **adc_env(fake_claude, tmp_path, fake_claude.workforce_user_info()),
        "ANTHROPIC_VERTEX_PROJECT_ID": "p",
    }
    async with echo_session(None, "--provider", "vertex", env=env) as session:
        answer = await ask_sampling(session)
        log = session.stderr()
    assert "result" in answer, answer
    assert "No project ID could be determined" not in log, log


@pytest.mark.parametrize(
    ("outage", "credentials"),
    [("oauth_outages", "service_account"), ("oauth_unavailable", "workforce_user")],
)
async def test_a_token_endpoint_briefly_out_is_retried_and_charged_nothing(
    fake_claude: FakeClaude, tmp_path: Path, outage: str, credentials: str
) -> None:
    """google-auth could not reach the token endpoint (`oauth_outages`: its `TransportError`), or
    the token endpoint of user (or workload identity) credentials answered `503 UNAVAILABLE`
    (`oauth_unavailable`: google-auth's `OAuthError`, which says nothing of a retry). Nothing was
    sent to Claude, and the sampling request failed at once as "the client could not make the
    call", where a connection refused by the API itself is retried. It is retried like that, and the
    attempt that never reached the API is charged nothing."""
    fake_claude.enqueue(text_reply("answered after the token came"))
    fake_claude.api_key = fake_claude.oauth_token
    setattr(fake_claude, outage, 1)
    audit = tmp_path / "audit.jsonl"
    info = (
        fake_claude.service_account_info("proj-42")
        if credentials == "service_account"
        else fake_claude.workforce_user_info()
    )
    env = adc_env(fake_claude, tmp_path, info)
    env["ANTHROPIC_VERTEX_PROJECT_ID"] = "proj-42"
    options = ("--provider", "vertex", "--audit-log", str(audit), "--retry-base-delay", "0.01")
    async with echo_session(None, *options, env=env) as session:
        answer = await ask_sampling(session)
        await session.close_stdin()
        await session.wait(30)
    content = answer.get("result", {}).get("content")
    assert content == {"type": "text", "text": "answered after the token came"}, answer
    assert len(fake_claude.token_requests) == 2
    [request] = fake_claude.platform_requests
    assert request.headers["authorization"] == f"Bearer {fake_claude.oauth_token}"
    [entry] = [json.loads(line) for line in audit.read_text().splitlines()]
    assert sum(entry["charged"].values()) == fake_claude.served_tokens() > 0, entry  # that call only


async def test_a_token_endpoint_that_stays_unreachable_is_named(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """Every attempt's token refresh failed: the error says so and what to check, after the
    retries, and nothing is charged (Claude was never called)."""
    fake_claude.oauth_outages = 100
    audit = tmp_path / "audit.jsonl"
    env = adc_env(fake_claude, tmp_path, fake_claude.service_account_info("proj-42"))
    env["ANTHROPIC_VERTEX_PROJECT_ID"] = "proj-42"
    options = (
        "--provider",
        "vertex",
        "--audit-log",
        str(audit),
        "--retry-base-delay",
        "0.01",
        "--retry-max-attempts",
        "3",
    )
    async with echo_session(None, *options, env=env) as session:
        answer = await ask_sampling(session)
        ping = await session.request(77, "ping", {})
        await session.close_stdin()
        await session.wait(30)
    assert "result" in ping
    error = answer["error"]
    assert (error["data"]["type"], error["data"]["attempts"]) == ("credentials_unavailable", 3), error
    assert "Application Default Credentials" in error["message"], error
    assert len(fake_claude.token_requests) == 3
    assert fake_claude.platform_requests == []
    [entry] = [json.loads(line) for line in audit.read_text().splitlines()]
    assert not any((entry["charged"] or {}).values()), entry


# A host name that cannot resolve (`.invalid` is reserved for that), as a typo in one makes.
UNRESOLVABLE = "http://credentials-host.invalid:1"


@pytest.mark.parametrize("provider", ["bedrock", "vertex"])
async def test_a_credentials_endpoint_whose_host_does_not_resolve_fails_at_once_naming_the_setting(
    fake_claude: FakeClaude, tmp_path: Path, provider: str
) -> None:
    """A typo in the host of the token endpoint (the `token_uri` of the key file) or of STS
    (`AWS_ENDPOINT_URL_STS`) was retried as an outage, every attempt of the deadline, and answered
    "check ... and the network", where the Claude API's own host that does not resolve is refused
    at once with the setting to fix named: resolving again will not help."""
    if provider == "bedrock":
        pytest.importorskip("boto3")
        env = {**aws_role_env(fake_claude, tmp_path), "AWS_ENDPOINT_URL_STS": UNRESOLVABLE}
        setting = "AWS_ENDPOINT_URL_STS"
    else:
        info = {**fake_claude.service_account_info("proj-42"), "token_uri": f"{UNRESOLVABLE}/token"}
        env = {**adc_env(fake_claude, tmp_path, info), "ANTHROPIC_VERTEX_PROJECT_ID": "proj-42"}
        setting = "GOOGLE_APPLICATION_CREDENTIALS"
    audit = tmp_path / "audit.jsonl"
    options = ("--provider", provider, "--audit-log", str(audit), "--retry-max-attempts", "4")
    async with echo_session(None, *options, "--retry-base-delay", "0.01", env=env) as session:
        answer = await ask_sampling(session)
        ping = await session.request(77, "ping", {})
        await session.close_stdin()
        await session.wait(30)
    assert "result" in ping
    error = answer["error"]
    assert (error["data"]["type"], error["data"]["attempts"]) == ("name_resolution", 1), error
    assert "does not resolve" in error["message"], error
    assert setting in error["message"], error
    assert fake_claude.platform_requests == []
    [entry] = [json.loads(line) for line in audit.read_text().splitlines()]
    assert not any((entry["charged"] or {}).values()), entry


@pytest.mark.parametrize(
    ("provider", "settings"),
    [
        ("bedrock", ("ANTHROPIC_BEDROCK_BASE_URL", "AWS_REGION")),
        ("vertex", ("ANTHROPIC_VERTEX_BASE_URL", "CLOUD_ML_REGION")),
    ],
)
async def test_a_platform_host_that_does_not_resolve_names_the_platforms_settings(
    fake_claude: FakeClaude, provider: str, settings: tuple[str, str]
) -> None:
    """Bedrock's or Vertex's endpoint host does not resolve (a typo in its base URL or region): the
    error said "check ANTHROPIC_BASE_URL", a variable these clients do not read."""
    env = platform_env(provider, fake_claude, "us-east5")
    env[settings[0]] = "http://platform-host.invalid:1"
    async with echo_session(None, "--provider", provider, "--retry-max-attempts", "3", env=env) as session:
        answer = await ask_sampling(session)
    error = answer["error"]
    assert (error["data"]["type"], error["data"]["attempts"]) == ("name_resolution", 1), error
    assert all(setting in error["message"] for setting in settings), error
    assert "ANTHROPIC_BASE_URL" not in error["message"], error


@pytest.mark.parametrize("case", ["bedrock", "vertex", "vertex-malformed"])
async def test_credentials_that_cannot_be_had_name_the_settings_to_check(
    fake_claude: FakeClaude, tmp_path: Path, case: str
) -> None:
    """No AWS credentials anywhere (boto3 finds none), or a GOOGLE_APPLICATION_CREDENTIALS file that
    is not there or not a key file: the error said "the client could not make the call:
    RuntimeError: Could not resolve AWS credentials from session" (or google-auth's words) and
    nothing of what to set, where `check` names the credentials, and a refusal by Claude names them
    too."""
    provider = case.partition("-")[0]
    if provider == "bedrock":
        pytest.importorskip("boto3")
        (tmp_path / "credentials").write_text("")
        (tmp_path / "config").write_text("")
        env = {
            "ANTHROPIC_BEDROCK_BASE_URL": fake_claude.url,
            "AWS_REGION": "us-east-1",
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
            "AWS_CONFIG_FILE": str(tmp_path / "config"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        settings = "check the AWS credentials (AWS_BEARER_TOKEN_BEDROCK, AWS_PROFILE...)"
    else:
        env = {**adc_env(fake_claude, tmp_path, {}), "ANTHROPIC_VERTEX_PROJECT_ID": "p"}
        if case == "vertex-malformed":
            Path(env["GOOGLE_APPLICATION_CREDENTIALS"]).write_text("{not json")
        else:
            env["GOOGLE_APPLICATION_CREDENTIALS"] = str(tmp_path / "missing.json")
        settings = "check the Google credentials (MCP_BACKFILL_VERTEX_ACCESS_TOKEN or Application Default"
    async with echo_session(None, "--provider", provider, "--retry-max-attempts", "3", env=env) as session:
        answer = await ask_sampling(session)
    error = answer["error"]
    assert error["message"].startswith(f"The {provider} client could not get its credentials: "), error
    assert settings in error["message"], error
    assert error["data"]["attempts"] == 1, error  # looking again will not find them
    assert fake_claude.platform_requests == []


async def test_vertex_takes_its_project_from_application_default_credentials(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """Without ANTHROPIC_VERTEX_PROJECT_ID the project is the one the credentials name, as documented:
    the SDK asked for the project before it loaded the credentials, so every call failed with "No
    project_id was given"."""
    fake_claude.enqueue(text_reply("answered on vertex"))
    fake_claude.api_key = fake_claude.oauth_token
    env = adc_env(fake_claude, tmp_path, fake_claude.service_account_info("proj-adc"))
    async with echo_session(None, "--provider", "vertex", env=env) as session:
        answer = await ask_sampling(session)
    assert answer.get("result", {}).get("content") == {"type": "text", "text": "answered on vertex"}, answer
    [request] = fake_claude.platform_requests
    assert request.path.startswith("/projects/proj-adc/locations/us-east5/publishers/anthropic/models/")
    assert request.headers["authorization"] == f"Bearer {fake_claude.oauth_token}"


@pytest.mark.parametrize("provider", ["bedrock", "vertex"])
async def test_bedrock_and_vertex_connect_ahead_in_the_warm_up(
    fake_claude: FakeClaude, provider: str
) -> None:
    """Built at startup, they too open their connection to the API in the warm-up, with a `HEAD`
    that carries no credentials; the first sampling request goes over it."""
    async with echo_session(
        None, "--provider", provider, env=platform_env(provider, fake_claude, "us-east5")
    ) as session:
        with anyio.fail_after(30):
            while "connected ahead to the API" not in session.stderr():
                await anyio.sleep(0.05)
        [ahead] = fake_claude.requests
        answer = await ask_sampling(session)
    assert "result" in answer
    assert (ahead.method, ahead.path, ahead.raw_body) == ("HEAD", "/", b"")
    assert not {"authorization", "x-api-key"} & set(ahead.headers)
    [request] = fake_claude.platform_requests
    assert request.headers["authorization"] == f"Bearer {TEST_API_KEY}"
    assert request.peer == ahead.peer


# `python -m mcp_backfill` with google-auth impossible to import, as when it is not installed.
HIDE_GOOGLE_AUTH = (
    "import runpy, sys; sys.modules['google.auth'] = None; "
    "runpy.run_module('mcp_backfill', run_name='__main__')"
)


def test_vertex_without_credentials_or_extra_refuses_to_start() -> None:
    """Without the vertex extra (google-auth, a dev dependency here, hidden from this proxy as an
    uninstalled package is) and without a ready token, the proxy names the extra to install."""
    python, dash_m, module, *args = proxy_argv(
        "--provider", "vertex", upstream=python_server("echo_server.py")
    )
    assert (dash_m, module) == ("-m", "mcp_backfill")
    argv = [python, "-c", HIDE_GOOGLE_AUTH, *args]
    env = proxy_env(CLOUD_ML_REGION="us-east5")
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "pip install 'mcp-backfill[vertex]'" in done.stderr
    assert "MCP_BACKFILL_VERTEX_ACCESS_TOKEN" in done.stderr
    assert done.stdout == ""


def test_vertex_with_a_ready_token_but_no_project_refuses_to_start() -> None:
    """A ready token names no project, so without ANTHROPIC_VERTEX_PROJECT_ID no call can be made:
    the proxy started anyway and every sampling request failed ("No project_id was given"), where a
    missing region stops it at startup."""
    argv = proxy_argv("--provider", "vertex", upstream=[sys.executable, "-c", "pass"])
    env = proxy_env(CLOUD_ML_REGION="us-east5", MCP_BACKFILL_VERTEX_ACCESS_TOKEN=TEST_API_KEY)
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "ANTHROPIC_VERTEX_PROJECT_ID" in done.stderr
    assert "MCP_BACKFILL_VERTEX_ACCESS_TOKEN" in done.stderr
    assert TEST_API_KEY not in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("provider", "base_url", "message"),
    [
        ("bedrock", "https://gw-user:gw-password-123@gateway.example", "must not carry credentials"),
        ("vertex", "https://gw-user:gw-password-123@gateway.example/v1", "must not carry credentials"),
        ("bedrock", "bedrock-gateway.example:8443", "http:// or https://"),
    ],
)
def test_a_platform_base_url_that_cannot_work_is_refused_at_startup(
    provider: str, base_url: str, message: str
) -> None:
    """As ANTHROPIC_BASE_URL is: with credentials in it, httpx2 sent them as Basic auth in place of
    the Bedrock API key or the Google token (every call refused, "check the AWS credentials"); without
    a scheme every call was retried as unreachable until --sampling-timeout."""
    variable = {"bedrock": "ANTHROPIC_BEDROCK_BASE_URL", "vertex": "ANTHROPIC_VERTEX_BASE_URL"}[provider]
    argv = proxy_argv("--provider", provider, upstream=[sys.executable, "-c", "pass"])
    env = proxy_env(**{variable: base_url}, AWS_BEARER_TOKEN_BEDROCK="tok", AWS_REGION="us-east-1")
    env.update(
        CLOUD_ML_REGION="us-east5", ANTHROPIC_VERTEX_PROJECT_ID="p", MCP_BACKFILL_VERTEX_ACCESS_TOKEN="tok"
    )
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert variable in done.stderr
    assert message in done.stderr
    assert "gw-password-123" not in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("provider", ["bedrock", "vertex"])
def test_a_plain_http_platform_url_to_another_machine_is_warned_about(provider: str) -> None:
    """As with ANTHROPIC_BASE_URL: the Bedrock API key or the Google token, and every prompt, cross
    the network unencrypted to a plain-`http://` endpoint on another machine, and nothing said so."""
    variable = {"bedrock": "ANTHROPIC_BEDROCK_BASE_URL", "vertex": "ANTHROPIC_VERTEX_BASE_URL"}[provider]
    argv = proxy_argv("--provider", provider, "--no-warm-up", upstream=[sys.executable, "-c", "pass"])
    env = proxy_env(
        **{variable: "http://gateway.internal:8080"}, AWS_BEARER_TOKEN_BEDROCK="tok", AWS_REGION="us-east-1"
    )
    env.update(
        CLOUD_ML_REGION="us-east5", ANTHROPIC_VERTEX_PROJECT_ID="p", MCP_BACKFILL_VERTEX_ACCESS_TOKEN="tok"
    )
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    warning = [line for line in done.stderr.splitlines() if "unencrypted" in line]
    assert len(warning) == 1, done.stderr
    assert variable in warning[0]


def test_bedrock_without_a_region_refuses_to_start() -> None:
    argv = proxy_argv("--provider", "bedrock", upstream=[sys.executable, "-c", "pass"])
    env = proxy_env(AWS_BEARER_TOKEN_BEDROCK="tok", AWS_CONFIG_FILE="/nonexistent")
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        env.pop(name, None)  # whatever this machine has configured
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "--provider bedrock" in done.stderr
    assert "AWS_REGION" in done.stderr


PROXY_SECRET = "proxy-pass-5150"
BAD_PROXY = f"http://user:{PROXY_SECRET}@proxy.test:notaport"


async def test_an_unusable_proxy_variable_fails_sampling_clearly(fake_claude: FakeClaude) -> None:
    """The Claude client is built in the warm-up: a proxy variable httpx2 cannot use made every
    sampling request an internal error with nothing to go on. Now each one is refused with the
    variable's name (never its value), the log says so too, and the rest of the session goes on."""
    async with echo_session(fake_claude, env={"HTTPS_PROXY": BAD_PROXY}) as session:
        first = await ask_sampling(session)
        second = await ask_sampling(session)
        ping = await session.request(77, "ping", {})
        log = session.stderr()
    for answer in (first, second):
        message = answer["error"]["message"]
        assert "HTTPS_PROXY" in message, answer
        assert PROXY_SECRET not in str(answer)
    assert "result" in ping
    assert "HTTPS_PROXY" in log
    assert PROXY_SECRET not in log
    assert fake_claude.message_requests == []


def test_an_unusable_proxy_variable_stops_bedrock_at_startup() -> None:
    argv = proxy_argv("--provider", "bedrock", upstream=[sys.executable, "-c", "pass"])
    env = proxy_env(AWS_BEARER_TOKEN_BEDROCK="tok", AWS_REGION="us-east-1", HTTPS_PROXY=BAD_PROXY)
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "HTTPS_PROXY" in done.stderr
    assert PROXY_SECRET not in done.stderr
    assert done.stdout == ""
