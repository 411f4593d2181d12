"""The SDK-backed provider against the fake Claude API: streaming, progress, error classification,
and the Bedrock / Vertex clients' requests (URL, path, body, auth), all over real loopback HTTP."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import anthropic
import anyio
import anyio.abc
import httpx2
import pytest

from mcp_backfill.assembly import provider_settings
from mcp_backfill.config import Config, Secret
from mcp_backfill.errors import ConfigError, ProviderError
from mcp_backfill.protocol import INTERNAL_ERROR, INVALID_PARAMS
from mcp_backfill.providers import ProviderSettings, make_provider
from mcp_backfill.providers.anthropic import (
    AnthropicProvider,
    credentials_unreachable,
    retry_after_seconds,
    settle_client,
    without_lone_surrogates,
)
from mcp_backfill.providers.platforms import (
    api_http_client,
    bedrock_model_id,
    check_dependencies,
    make_client,
    module_available,
    vertex_model_id,
)
from mcp_backfill.providers.retry import RetryingProvider, RetryPolicy
from mcp_backfill.sampling.provider import StreamProgress
from mcp_backfill.sampling.spend import Charge, Reservation
from tests.fake_claude import (
    FakeClaude,
    error_reply,
    garbage_stream_reply,
    hang_reply,
    raw_reply,
    sse_event,
    stream_error_reply,
    text_reply,
    tool_use_reply,
    truncated_stream_reply,
)
from tests.harness import TEST_API_KEY

pytestmark = pytest.mark.anyio

REQUEST: dict[str, Any] = {
    "model": "claude-sonnet-5-5",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "hello"}],
}


@pytest.fixture
async def provider(fake_claude: FakeClaude) -> AsyncIterator[AnthropicProvider]:
    client = anthropic.AsyncAnthropic(api_key=TEST_API_KEY, base_url=fake_claude.url, max_retries=0)
    provider = AnthropicProvider(client, secrets=[TEST_API_KEY])
    yield provider
    await provider.aclose()


async def test_a_settled_client_has_done_its_first_requests_chores(fake_claude: FakeClaude) -> None:
    """`settle_client` does ahead what the SDK does on a client's first request (its platform, in a
    worker thread of its own; its tracer) and nothing on the wire changes."""
    seen: list[dict[str, str]] = []
    for settled in (False, True):
        client = anthropic.AsyncAnthropic(api_key=TEST_API_KEY, base_url=fake_claude.url, max_retries=0)
        assert client._platform is None
        if settled:
            settle_client(client)
            assert client._platform is not None
            assert not isinstance(client._lazy_tracer, anthropic.NotGiven)
        fake_claude.enqueue(text_reply("ok"))
        provider = AnthropicProvider(client)
        assert (await provider.create_message(REQUEST))["content"][0]["text"] == "ok"
        await provider.aclose()
        headers = fake_claude.requests[-1].headers
        seen.append({k: v for k, v in headers.items() if k.startswith("x-stainless")})
    assert seen[0] == seen[1]
    assert seen[1]["x-stainless-os"]


async def failure(provider: AnthropicProvider) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await provider.create_message(REQUEST)
    return caught.value


async def test_streams_and_reports_progress(fake_claude: FakeClaude, provider: AnthropicProvider) -> None:
    fake_claude.enqueue(tool_use_reply("lookup", {"key": "alpha"}, text="Looking it up.", chunks=4))
    seen: list[StreamProgress] = []

    async def record(progress: StreamProgress) -> None:
        seen.append(progress)

    message = await provider.create_message(REQUEST, on_progress=record)
    assert [block["type"] for block in message["content"]] == ["text", "tool_use"]
    assert message["request_id"].startswith("req_fake_")
    counts = [p.characters for p in seen if not p.done]
    assert counts == sorted(counts)
    assert len(counts) >= 4
    final = seen[-1]
    assert final.done
    assert final.output_tokens == message["usage"]["output_tokens"]
    assert final.characters == len("Looking it up.") + len(json.dumps({"key": "alpha"}))
    assert [p for p in seen if p.done] == [final]


@pytest.mark.parametrize(
    ("reply", "error_type", "status"),
    [
        (stream_error_reply("overloaded_error", "Overloaded"), "overloaded_error", 200),
        (garbage_stream_reply(), "malformed_response", None),
        (truncated_stream_reply(), "incomplete_stream", None),
        (truncated_stream_reply(abrupt=True), "connection_error", None),
        (error_reply(529, "overloaded_error", "Overloaded"), "overloaded_error", 529),
        (error_reply(500, "api_error", "boom"), "api_error", 500),
        (error_reply(429, "rate_limit_error", "slow down"), "rate_limit_error", 429),
    ],
    ids=["mid-stream-overloaded", "garbage", "truncated", "dropped", "529", "500", "429"],
)
async def test_transient_failures_are_retryable(
    fake_claude: FakeClaude,
    provider: AnthropicProvider,
    reply: Any,
    error_type: str,
    status: int | None,
) -> None:
    fake_claude.enqueue(reply)
    error = await failure(provider)
    assert error.retryable
    assert error.code == INTERNAL_ERROR
    assert error.data is not None
    assert error.data["type"] == error_type
    assert error.data.get("status") == status
    assert error.data["provider"] == "anthropic"


async def test_request_faults_are_final(fake_claude: FakeClaude, provider: AnthropicProvider) -> None:
    fake_claude.enqueue(
        error_reply(400, "invalid_request_error", "prompt is too long"),
        error_reply(401, "authentication_error", f"invalid x-api-key {TEST_API_KEY}"),
        error_reply(500, "api_error", "do not retry me", should_retry=False),
    )
    bad_request, unauthorized, told_not_to = [await failure(provider) for _ in range(3)]
    assert (bad_request.code, bad_request.retryable) == (INVALID_PARAMS, False)
    assert (unauthorized.code, unauthorized.retryable) == (INTERNAL_ERROR, False)
    assert TEST_API_KEY not in unauthorized.message
    assert "***" in unauthorized.message
    assert told_not_to.retryable is False


async def test_an_error_body_whose_type_and_code_quote_the_key_is_redacted_in_the_errors_data(
    fake_claude: FakeClaude, provider: AnthropicProvider
) -> None:
    """A gateway's error body quoting the key in its `type` and `error_code`, not its message: the
    message was redacted, but the error's data (sent to the server, written to the audit log) gave
    both fields as they came."""
    fake_claude.enqueue(
        error_reply(
            401,
            f"invalid_key:{TEST_API_KEY}",
            "refused",
            details={"error_code": f"revoked:{TEST_API_KEY}"},
        )
    )
    unauthorized = await failure(provider)
    assert unauthorized.data is not None
    assert TEST_API_KEY not in json.dumps(unauthorized.data), unauthorized.data
    assert (unauthorized.data["type"], unauthorized.data["error_code"]) == ("invalid_key:***", "revoked:***")


async def test_retry_after_is_read(fake_claude: FakeClaude, provider: AnthropicProvider) -> None:
    fake_claude.enqueue(
        error_reply(529, "overloaded_error", "Overloaded", retry_after=7),
        error_reply(429, "rate_limit_error", "slow", headers={"retry-after-ms": "250"}),
    )
    assert (await failure(provider)).retry_after == 7.0
    assert (await failure(provider)).retry_after == 0.25


def test_retry_after_forms() -> None:
    assert retry_after_seconds({}) is None
    assert retry_after_seconds({"retry-after": "3"}) == 3.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    when = datetime(2026, 10, 21, 7, 28, 10, tzinfo=UTC)
    date = "Wed, 21 Oct 2026 07:28:10 GMT"
    assert retry_after_seconds({"retry-after": date}, now=when.timestamp() - 100) == pytest.approx(100.0)
    assert retry_after_seconds({"retry-after": date}, now=when.timestamp() + 5) == 0.0


def test_a_retry_after_date_in_minus_zero_is_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """RFC 5322's `-0000` is UTC with no source zone named: Python reads it as a naive datetime,
    which `timestamp()` took for the machine's local time (hours off, the retry waiting the cap)."""
    import time

    when = datetime(2026, 10, 21, 7, 28, 10, tzinfo=UTC)
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        wait = retry_after_seconds(
            {"retry-after": "Wed, 21 Oct 2026 07:28:10 -0000"}, now=when.timestamp() - 100
        )
    finally:
        monkeypatch.undo()
        time.tzset()
    assert wait == pytest.approx(100.0)


async def test_connection_refused_is_retryable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before use: nothing listens there
    client = anthropic.AsyncAnthropic(
        api_key=TEST_API_KEY, base_url=f"http://127.0.0.1:{port}", max_retries=0
    )
    provider = AnthropicProvider(client)
    try:
        error = await failure(provider)
    finally:
        await provider.aclose()
    assert error.retryable
    assert error.data is not None
    assert error.data["type"] == "connection_error"


# --------------------------------------------------------------------------------------------------
# Bedrock and Vertex: the SDK's own clients, pointed at the fake through their base-URL variables
# --------------------------------------------------------------------------------------------------


def platform_config(provider: str, **kwargs: Any) -> ProviderSettings:
    """What the proxy builds a provider from, for a `Config` with these fields."""
    config = Config(upstream_command=("server",), provider=provider, **kwargs)  # type: ignore[arg-type]
    return provider_settings(config)


async def test_bedrock_request_and_event_stream(
    fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_BEDROCK_BASE_URL", fake_claude.url)
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    fake_claude.enqueue(text_reply("hello from bedrock", chunks=5))
    settings = platform_config(
        "bedrock", api_headers=(("X-Team", "search"),), bedrock_api_key=Secret(TEST_API_KEY)
    )
    provider = make_provider(settings)
    seen: list[StreamProgress] = []

    async def record(progress: StreamProgress) -> None:
        seen.append(progress)

    try:
        message = await provider.create_message(REQUEST, on_progress=record)
    finally:
        await provider.aclose()
    assert message["content"] == [{"type": "text", "text": "hello from bedrock"}]
    assert seen[-1].done
    assert seen[-1].characters == len("hello from bedrock")
    [request] = fake_claude.platform_requests
    assert request.path == "/model/anthropic.claude-sonnet-5-5/invoke-with-response-stream"
    assert request.headers["authorization"] == f"Bearer {TEST_API_KEY}"
    assert request.headers["x-team"] == "search"
    body = json.loads(request.raw_body)
    assert "model" not in body
    assert "stream" not in body
    assert body["anthropic_version"]
    assert body["max_tokens"] == 100
    assert body["messages"] == REQUEST["messages"]


async def test_bedrock_mid_stream_exception_is_retryable(
    fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_BEDROCK_BASE_URL", fake_claude.url)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    fake_claude.enqueue(stream_error_reply("overloaded_error", "Model is busy"), text_reply("second try"))
    provider = make_provider(
        platform_config("bedrock", retry_base_delay=0.0, bedrock_api_key=Secret(TEST_API_KEY))
    )
    try:
        message = await provider.create_message({**REQUEST, "model": "us.anthropic.claude-opus-5-5"})
    finally:
        await provider.aclose()
    assert message["content"][0]["text"] == "second try"
    paths = [r.path for r in fake_claude.platform_requests]
    assert paths == ["/model/us.anthropic.claude-opus-5-5/invoke-with-response-stream"] * 2


async def test_vertex_request(fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_VERTEX_BASE_URL", fake_claude.url)
    monkeypatch.setenv("CLOUD_ML_REGION", "us-east5")
    monkeypatch.setenv("ANTHROPIC_VERTEX_PROJECT_ID", "my-project")
    fake_claude.enqueue(text_reply("hello from vertex"))
    provider = make_provider(platform_config("vertex", vertex_access_token=Secret(TEST_API_KEY)))
    try:
        message = await provider.create_message({**REQUEST, "model": "claude-haiku-5-5"})
    finally:
        await provider.aclose()
    assert message["content"] == [{"type": "text", "text": "hello from vertex"}]
    [request] = fake_claude.platform_requests
    assert request.path == (
        "/projects/my-project/locations/us-east5/publishers/anthropic/models/claude-haiku-5-5:streamRawPredict"
    )
    assert request.headers["authorization"] == f"Bearer {TEST_API_KEY}"
    body = json.loads(request.raw_body)
    assert "model" not in body
    assert body["stream"] is True
    assert body["anthropic_version"]


async def test_platform_hang_is_cut_by_the_deadline(
    fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_VERTEX_BASE_URL", fake_claude.url)
    monkeypatch.setenv("CLOUD_ML_REGION", "global")
    monkeypatch.setenv("ANTHROPIC_VERTEX_PROJECT_ID", "p")
    fake_claude.enqueue(hang_reply("still thinking"))
    config = platform_config("vertex", vertex_access_token=Secret(TEST_API_KEY), sampling_timeout=0.5)
    provider = make_provider(config)
    try:
        with pytest.raises(ProviderError) as caught:
            await provider.create_message(REQUEST)
    finally:
        await provider.aclose()
    assert caught.value.data is not None
    assert caught.value.data["type"] == "timeout"
    assert caught.value.data["gave_up"] == "deadline"
    assert await fake_claude.await_disconnects(1)


def test_model_id_mapping() -> None:
    assert bedrock_model_id("claude-sonnet-5-5") == "anthropic.claude-sonnet-5-5"
    assert bedrock_model_id("claude-future-9") == "anthropic.claude-future-9"
    assert bedrock_model_id("global.anthropic.claude-opus-5-5") == "global.anthropic.claude-opus-5-5"
    assert bedrock_model_id("arn:aws:bedrock:us-east-1:1:inference-profile/x") == (
        "arn:aws:bedrock:us-east-1:1:inference-profile/x"
    )
    assert vertex_model_id("claude-opus-5-5") == "claude-opus-5-5"
    assert vertex_model_id("claude-opus-5-5@20260101") == "claude-opus-5-5@20260101"


def test_missing_extras_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "botocore", None)
    with pytest.raises(ConfigError, match=r"mcp-backfill\[bedrock\]"):
        check_dependencies("bedrock", {"AWS_BEARER_TOKEN_BEDROCK": "t"})
    with pytest.raises(ConfigError, match=r"mcp-backfill\[bedrock\]"):
        make_client(platform_config("bedrock"), {})


def test_bedrock_without_boto3_names_the_api_key_that_does_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """boto3 signs with SigV4 only: without it, a Bedrock API key does (as a ready token does for
    Vertex without google-auth), and the refusal said only to install the extra."""
    monkeypatch.setitem(sys.modules, "boto3", None)  # botocore alone installed
    with pytest.raises(ConfigError, match=r"mcp-backfill\[bedrock\].*AWS_BEARER_TOKEN_BEDROCK"):
        check_dependencies("bedrock", {})
    check_dependencies("bedrock", {"AWS_BEARER_TOKEN_BEDROCK": "bedrock-api-key"})


def test_vertex_without_google_auth_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "google.auth", None)  # as if the vertex extra were not installed
    with pytest.raises(ConfigError, match=r"mcp-backfill\[vertex\].*MCP_BACKFILL_VERTEX_ACCESS_TOKEN"):
        check_dependencies("vertex", {})
    check_dependencies("vertex", {"MCP_BACKFILL_VERTEX_ACCESS_TOKEN": "ya29.token"})


async def test_a_client_that_cannot_call_is_a_clear_final_error(
    fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No credentials at all: the SDK refuses before sending anything.
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE", "ANTHROPIC_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    client = anthropic.AsyncAnthropic(api_key=None, base_url=fake_claude.url, max_retries=0)
    provider = AnthropicProvider(client)
    try:
        error = await failure(provider)
    finally:
        await provider.aclose()
    assert error.retryable is False
    assert error.data == {"provider": "anthropic", "type": "client_error"}
    assert "could not make the call" in error.message
    assert fake_claude.requests == []


def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, where: Any, region: str) -> None:
    """An environment where boto3's chain finds no AWS credentials (empty shared files, no instance
    metadata), in a region of its own: the SDK keeps one boto3 session per region and keys."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_BEARER_TOKEN_BEDROCK",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ):
        monkeypatch.delenv(name, raising=False)
    for name in ("credentials", "config"):
        (where / name).write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(where / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(where / "config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_REGION", region)


async def test_no_aws_credentials_are_told_by_botocores_resolver_not_by_the_sdks_words(
    fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The SDK's Bedrock client says boto3 found no AWS credentials with a bare `RuntimeError`, which
    was told apart by its text alone: an SDK that words it otherwise (as here) made it "the client
    could not make the call", without the settings to check. The credentials are resolved first,
    through the session the SDK signs with, and none found is botocore's `NoCredentialsError`."""
    pytest.importorskip("boto3")
    from anthropic.lib.bedrock import _client as sdk_bedrock

    no_aws_credentials(monkeypatch, tmp_path, "ap-southeast-4")
    monkeypatch.setenv("ANTHROPIC_BEDROCK_BASE_URL", fake_claude.url)
    signer = sdk_bedrock.get_auth_headers  # type: ignore[attr-defined]

    def reworded(**kwargs: Any) -> dict[str, str]:
        try:
            return signer(**kwargs)
        except RuntimeError:
            raise RuntimeError("No AWS credentials were found") from None

    monkeypatch.setattr(sdk_bedrock, "get_auth_headers", reworded)
    provider = make_provider(platform_config("bedrock", retry_max_attempts=3))
    try:
        with pytest.raises(ProviderError) as caught:
            await provider.create_message(REQUEST)
    finally:
        await provider.aclose()
    error = caught.value
    assert error.message.startswith("The bedrock client could not get its credentials: "), error.message
    assert "check the AWS credentials (AWS_BEARER_TOKEN_BEDROCK, AWS_PROFILE...)" in error.message
    assert (error.retryable, (error.data or {}).get("attempts")) == (False, 1), error.data
    assert fake_claude.requests == []


async def test_the_installed_sdks_words_for_no_aws_credentials_are_still_recognised(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """What the installed SDK's signer raises when boto3 finds no credentials is still told for
    what it is, should it come past the resolution ahead of it (credentials gone in between)."""
    pytest.importorskip("boto3")
    from anthropic.lib.aws._auth import get_auth_headers

    from mcp_backfill.providers.anthropic import credentials_failed

    no_aws_credentials(monkeypatch, tmp_path, "ap-southeast-5")
    with pytest.raises(Exception) as caught:  # noqa: PT011 (whatever the SDK raises)
        get_auth_headers(
            method="POST",
            url="https://bedrock-runtime.ap-southeast-5.amazonaws.com/model/x/invoke",
            headers=httpx2.Headers(),
            aws_access_key=None,
            aws_secret_key=None,
            aws_session_token=None,
            region="ap-southeast-5",
            profile=None,
            data=b"{}",
            service_name="bedrock",
        )
    assert credentials_failed(caught.value), repr(caught.value)


async def test_a_redirect_is_not_followed_with_the_gateways_headers_and_the_prompt() -> None:
    """The SDK's client follows redirects; to another origin httpx2 drops `Authorization` but carried
    the operator's gateway headers and the whole prompt (307 keeps the body) wherever it pointed."""
    gateway_key = "gw-secret-0123456789"
    with FakeClaude(api_key=TEST_API_KEY) as gateway, FakeClaude() as elsewhere:
        elsewhere.enqueue(text_reply("hi from elsewhere"))
        gateway.enqueue(
            error_reply(307, "redirect", "moved", headers={"location": f"{elsewhere.url}/v1/messages"})
        )
        settings = ProviderSettings(
            name="anthropic",
            retry=RetryPolicy(1, 0.01, 0.01, 10.0),
            secrets=(TEST_API_KEY, gateway_key),
            api_key=TEST_API_KEY,
            base_url=gateway.url,
            headers=(("X-Gateway-Key", gateway_key),),
            vertex_access_token=None,
        )
        provider = AnthropicProvider(make_client(settings), secrets=settings.secrets)
        try:
            error = await failure(provider)
        finally:
            await provider.aclose()
        assert elsewhere.requests == []
    assert "307" in error.message
    assert error.retryable is False


async def test_an_error_page_is_quoted_in_part(fake_claude: FakeClaude, provider: AnthropicProvider) -> None:
    """A gateway's 256 KB error page used to become the whole error message (and log line)."""
    fake_claude.enqueue(error_reply(502, "api_error", "<html>" + "x" * 256_000 + "</html>"))
    error = await failure(provider)
    assert len(error.message) < 1000


async def test_a_temporary_name_resolution_failure_is_retried(
    fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EAI_AGAIN (a resolver that timed out) was taken for a name that does not resolve: final, with
    advice to check ANTHROPIC_BASE_URL. The name here resolves (to 127.0.0.1) on the second try."""
    real = socket.getaddrinfo
    failures = [socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")]

    def flaky(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ("claude-gateway.test", b"claude-gateway.test"):
            if failures:
                raise failures.pop()
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", flaky)
    fake_claude.enqueue(text_reply("resolved on the second try"))
    port = fake_claude.url.rsplit(":", 1)[1]
    client = anthropic.AsyncAnthropic(
        api_key=TEST_API_KEY, base_url=f"http://claude-gateway.test:{port}", max_retries=0
    )
    provider = RetryingProvider(
        AnthropicProvider(client, secrets=[TEST_API_KEY]), RetryPolicy(3, 0.0, 0.0, 30.0)
    )
    try:
        message = await provider.create_message(REQUEST)
    finally:
        await provider.aclose()
    assert message["content"][0]["text"] == "resolved on the second try"


# --------------------------------------------------------------------------------------------------
# Proxy variables the API's HTTP client cannot use
# --------------------------------------------------------------------------------------------------

PROXY_SECRET = "proxy-pass-5150"


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("HTTPS_PROXY", f"http://user:{PROXY_SECRET}@proxy.test:notaport", "not a valid proxy URL"),
        ("https_proxy", f"ftp://user:{PROXY_SECRET}@proxy.test:21", "scheme"),
        ("ALL_PROXY", f"socks5://user:{PROXY_SECRET}@127.0.0.1:1080", "socksio"),
    ],
)
def test_an_unusable_proxy_variable_is_named_and_not_quoted(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, reason: str
) -> None:
    """httpx2 reads the proxy variables when the client is built and fails there with its own
    error, quoting the URL (credentials and all); the proxy names the variable instead."""
    if reason == "socksio" and module_available("socksio"):
        pytest.skip("socksio is installed here")
    for other in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(other, raising=False)
        monkeypatch.delenv(other.lower(), raising=False)
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        api_http_client()
    message = str(caught.value)
    assert name in message
    assert reason in message
    assert PROXY_SECRET not in message
    assert "proxy.test" not in message


def test_an_unusable_no_proxy_is_named_and_not_blamed_on_proxies_that_are_not_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for other in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(other, raising=False)
        monkeypatch.delenv(other.lower(), raising=False)
    monkeypatch.setenv("NO_PROXY", "internal.test,http://[::1")
    with pytest.raises(ConfigError) as caught:
        api_http_client()
    message = str(caught.value)
    assert "NO_PROXY (or no_proxy) lists a host" in message
    assert "HTTPS_PROXY" not in message


# --------------------------------------------------------------------------------------------------
# Streams no real API sends (a gateway's, a broken proxy's): a clear error, and the call charged
# --------------------------------------------------------------------------------------------------


def started(usage: dict[str, int] | None = None) -> bytes:
    message: dict[str, Any] = {
        "id": "msg_raw",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 50, "output_tokens": 1} if usage is None else usage,
    }
    return sse_event("message_start", {"type": "message_start", "message": message})


def text_block(index: int, text: str) -> list[bytes]:
    start = {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
    delta = {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}
    return [sse_event("content_block_start", start), sse_event("content_block_delta", delta)]


def ended(output_tokens: int = 7) -> list[bytes]:
    delta = {"stop_reason": "end_turn", "stop_sequence": None}
    return [
        sse_event(
            "message_delta",
            {"type": "message_delta", "delta": delta, "usage": {"output_tokens": output_tokens}},
        ),
        sse_event("message_stop", {"type": "message_stop"}),
    ]


async def metered_failure(provider: AnthropicProvider) -> tuple[ProviderError, dict[str, int]]:
    charge = Charge(Reservation(60, 100))
    with pytest.raises(ProviderError) as caught:
        await provider.create_message(REQUEST, meter=charge)
    return caught.value, charge.cost()


async def test_a_second_message_start_is_a_malformed_stream_and_charged(
    fake_claude: FakeClaude, provider: AnthropicProvider
) -> None:
    """A `message_start` after the content began was taken for an error of the client before the
    call ("could not make the call", not retried) instead of a malformed stream Claude billed."""
    fake_claude.enqueue(raw_reply(started(), *text_block(0, "Hello"), started(), *ended()))
    error, cost = await metered_failure(provider)
    assert error.data is not None
    assert error.data["type"] == "malformed_response"
    assert "message_start" in error.message
    assert error.retryable
    assert cost == {**cost, "input_tokens": 50, "output_tokens": 100}


async def test_a_stream_of_nothing_but_pings_ends_within_the_read_timeout(fake_claude: FakeClaude) -> None:
    """With `--sampling-timeout 0` the SDK's read timeout (600 s) is the only bound on a call; a
    stream that sends pings (or comments) and nothing else kept it from ever tripping, so the call
    held its concurrency slot and its reservation for as long as the pings went on. Pings are
    no progress: the read timeout bounds the time between two events that are not pings."""
    client = anthropic.AsyncAnthropic(
        api_key=TEST_API_KEY, base_url=fake_claude.url, max_retries=0, timeout=1.0
    )
    provider = AnthropicProvider(client, secrets=[TEST_API_KEY])
    pings = [sse_event("ping", {"type": "ping"}), b": keep-alive\n\n"] * 400  # 40 s of them
    fake_claude.enqueue(raw_reply(started(), *text_block(0, "Hel"), *pings, part_delay=0.05, hang=True))
    began = anyio.current_time()
    try:
        error, cost = await metered_failure(provider)
    finally:
        await provider.aclose()
    assert anyio.current_time() - began < 20
    assert error.retryable
    assert cost["input_tokens"] == 50  # the call began: it is charged


JSON = {"content-type": "application/json"}


async def test_an_error_in_a_200_json_body_is_that_error(
    fake_claude: FakeClaude, provider: AnthropicProvider
) -> None:
    """A gateway answering the stream with a JSON error body and 200 was reported as a stream that
    "ended before the message was complete", the error itself (here a final one) never said."""
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "model: not allowed"}}
    fake_claude.enqueue(
        raw_reply(json.dumps(body), headers=JSON),
        raw_reply(
            json.dumps({**body, "error": {"type": "overloaded_error", "message": "Overloaded"}}), headers=JSON
        ),
    )
    final, transient = await failure(provider), await failure(provider)
    assert final.data is not None
    assert transient.data is not None
    assert (final.data["type"], final.retryable) == ("invalid_request_error", False)
    assert "model: not allowed" in final.message
    assert (transient.data["type"], transient.retryable) == ("overloaded_error", True)


async def test_a_whole_message_instead_of_a_stream_is_the_answer(
    fake_claude: FakeClaude, provider: AnthropicProvider
) -> None:
    """A gateway that ignores `stream: true` and answers the message as JSON: that is the answer
    (and what it reports is charged), not a broken stream retried and billed again."""
    message = {
        "id": "msg_whole",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [{"type": "text", "text": "Hi", "citations": None}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": None},
    }
    fake_claude.enqueue(raw_reply(json.dumps(message), headers=JSON))
    charge = Charge(Reservation(60, 100))
    answer = await provider.create_message(REQUEST, meter=charge)
    assert answer["content"] == [{"type": "text", "text": "Hi"}]
    assert answer["stop_reason"] == "end_turn"
    assert answer["usage"] == {"input_tokens": 5, "output_tokens": 2}
    assert charge.cost() == {**charge.cost(), "input_tokens": 5, "output_tokens": 2}
    assert len(fake_claude.message_requests) == 1


@pytest.mark.parametrize("tool_input", [[1, 2], "{}", None, 3])
async def test_a_whole_message_whose_tool_input_is_no_object_is_malformed(
    fake_claude: FakeClaude, provider: AnthropicProvider, tool_input: Any
) -> None:
    """As in a stream: a tool call's input that is no object would reach the server as `{}`."""
    block = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": tool_input}
    message = {
        "id": "msg_whole",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [block],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 5, "output_tokens": 2},
    }
    fake_claude.enqueue(raw_reply(json.dumps(message), headers=JSON))
    error, cost = await metered_failure(provider)
    assert error.data is not None
    assert error.data["type"] == "malformed_response"
    assert cost == {**cost, "input_tokens": 5, "output_tokens": 100}  # a malformed answer: all of it


async def test_a_page_instead_of_a_stream_is_named(
    fake_claude: FakeClaude, provider: AnthropicProvider
) -> None:
    fake_claude.enqueue(
        raw_reply(f"<html>Sign in {TEST_API_KEY}</html>", headers={"content-type": "text/html"})
    )
    error, cost = await metered_failure(provider)
    assert error.data is not None
    assert error.data["type"] == "malformed_response"
    assert "text/html" in error.message
    assert "Sign in" in error.message
    assert TEST_API_KEY not in error.message
    assert cost["output_tokens"] == 100  # the gateway may have had Claude answer it


async def test_a_message_stopped_without_its_delta_is_not_charged_the_starts_placeholder(
    fake_claude: FakeClaude, provider: AnthropicProvider
) -> None:
    """`message_start` reports 1 output token, a placeholder `message_delta` replaces with the
    real count: a stream that stopped without one was answered (with no stop reason) and charged
    that 1 token, whatever Claude wrote."""
    fake_claude.enqueue(
        raw_reply(
            started(),
            *text_block(0, "A long essay" * 200),
            sse_event("message_stop", {"type": "message_stop"}),
        )
    )
    error, cost = await metered_failure(provider)
    assert error.data is not None
    assert error.data["type"] == "malformed_response"
    assert "message_delta" in error.message
    assert cost == {**cost, "input_tokens": 50, "output_tokens": 100}


async def test_a_redirect_costs_nothing(fake_claude: FakeClaude) -> None:
    """A redirect (say a gateway's `http://` sending every request to its `https://`) is not
    followed and nothing answered the prompt; it was charged the whole reservation all the same,
    so a misconfigured gateway URL ran the budgets down without a token spent."""
    moved = {"location": "https://gateway.test/v1/messages", "content-type": "text/html"}
    fake_claude.enqueue(raw_reply("<html>Moved</html>", status=301, headers=moved))
    client = anthropic.AsyncAnthropic(
        api_key=TEST_API_KEY, base_url=fake_claude.url, max_retries=0, http_client=api_http_client()
    )
    provider = AnthropicProvider(client, secrets=[TEST_API_KEY])
    try:
        error, cost = await metered_failure(provider)
    finally:
        await provider.aclose()
    assert "301" in error.message
    assert error.retryable is False
    assert cost == dict.fromkeys(cost, 0)


async def test_an_answer_whose_usage_was_stripped_is_charged_its_reservation(
    fake_claude: FakeClaude, provider: AnthropicProvider
) -> None:
    """A gateway that strips `usage` (`{}` in `message_start` and `message_delta`): the complete
    answer was charged 0 tokens."""
    ending = {"stop_reason": "end_turn", "stop_sequence": None}
    fake_claude.enqueue(
        raw_reply(
            started({}),
            *text_block(0, "Hello"),
            sse_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            sse_event("message_delta", {"type": "message_delta", "delta": ending, "usage": {}}),
            sse_event("message_stop", {"type": "message_stop"}),
        )
    )
    charge = Charge(Reservation(60, 100))
    answer = await provider.create_message(REQUEST, meter=charge)
    assert answer["content"] == [{"type": "text", "text": "Hello"}]
    assert charge.cost() == {**charge.cost(), "input_tokens": 60, "output_tokens": 100}


async def test_a_stream_opening_with_a_byte_order_mark_is_read(
    fake_claude: FakeClaude, provider: AnthropicProvider
) -> None:
    """An event stream may start with a UTF-8 byte order mark, which readers must drop: it made the
    first field `\\ufeffevent`, so `message_start` was lost and the stream taken for malformed."""
    stream = [started(), *text_block(0, "Hello"), *ended()]
    fake_claude.enqueue(
        raw_reply(b"\xef\xbb\xbf" + stream[0], *stream[1:]),
        raw_reply(b"\xef", b"\xbb", b"\xbf" + stream[0], *stream[1:]),  # in pieces
    )
    for _ in range(2):
        answer = await provider.create_message(REQUEST)
        assert answer["content"] == [{"type": "text", "text": "Hello"}]


async def test_a_stream_that_ends_after_message_delta_without_message_stop_is_the_answer(
    fake_claude: FakeClaude, provider: AnthropicProvider
) -> None:
    """`message_delta` is the message's end (why it stopped, the final usage); `message_stop` only
    says so again. A gateway that leaves it out had every answer retried as incomplete, and billed
    each time, where the SDK's own stream takes the message."""
    block_stop = sse_event("content_block_stop", {"type": "content_block_stop", "index": 0})
    delta, _ = ended(7)
    fake_claude.enqueue(raw_reply(started(), *text_block(0, "Hello"), block_stop, delta))
    charge = Charge(Reservation(60, 100))
    answer = await provider.create_message(REQUEST, meter=charge)
    assert answer["content"] == [{"type": "text", "text": "Hello"}]
    assert answer["stop_reason"] == "end_turn"
    assert charge.cost() == {**charge.cost(), "input_tokens": 50, "output_tokens": 7}
    assert len(fake_claude.message_requests) == 1


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        (raw_reply(started(), sse_event("error", {"type": "error", "error": {"type": {"a": 1}}})), 200),
        (
            raw_reply(
                json.dumps({"type": "error", "error": {"type": ["x"], "message": {"m": 1}}}),
                status=529,
                headers=JSON,
            ),
            529,
        ),
    ],
    ids=["mid-stream-type-object", "529-type-and-message-objects"],
)
async def test_an_error_body_of_the_wrong_shape_is_a_provider_error(
    fake_claude: FakeClaude, provider: AnthropicProvider, reply: Any, status: int
) -> None:
    """An error whose `type` or `message` is no string (a gateway's) made the proxy fail with a
    TypeError of its own ("Internal error in mcp-backfill"), the API's status and retry lost."""
    fake_claude.enqueue(reply)
    error = await failure(provider)
    assert error.data is not None
    assert error.data["status"] == status
    assert error.data["type"] is None
    assert error.retryable is (status == 529)
    assert f"Claude API error ({status} error)" in error.message


async def test_an_event_field_of_the_wrong_type_is_a_malformed_stream(
    fake_claude: FakeClaude, provider: AnthropicProvider
) -> None:
    """A text delta that is no string failed the fold with a TypeError, reported as "the client
    could not make the call" (not retried) for a call Claude had billed."""
    start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    bad = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 42}}
    fake_claude.enqueue(
        raw_reply(
            started(),
            sse_event("content_block_start", start),
            sse_event("content_block_delta", bad),
            *ended(),
        )
    )
    error, cost = await metered_failure(provider)
    assert error.data is not None
    assert error.data["type"] == "malformed_response"
    assert error.retryable
    assert cost == {**cost, "input_tokens": 50, "output_tokens": 100}


async def test_an_event_stream_labelled_json_is_still_read(
    fake_claude: FakeClaude, provider: AnthropicProvider
) -> None:
    """A gateway that labels the event stream `application/json`: its events are what they are."""
    block_stop = sse_event("content_block_stop", {"type": "content_block_stop", "index": 0})
    fake_claude.enqueue(raw_reply(started(), *text_block(0, "Hello"), block_stop, *ended(), headers=JSON))
    answer = await provider.create_message(REQUEST)
    assert answer["content"] == [{"type": "text", "text": "Hello"}]


async def test_a_call_that_never_got_a_connection_is_not_charged(fake_claude: FakeClaude) -> None:
    """`PoolTimeout`: no connection of the pool came free in time, so nothing was sent (a
    `WriteTimeout`, by contrast, leaves the request in the socket's buffer, flushed on close: it
    may have reached the API). It was charged the whole reservation, as a call that may have been
    billed."""
    http_client = httpx2.AsyncClient(limits=httpx2.Limits(max_connections=1))
    client = anthropic.AsyncAnthropic(
        api_key=TEST_API_KEY,
        base_url=fake_claude.url,
        max_retries=0,
        http_client=http_client,
        timeout=httpx2.Timeout(30.0, pool=0.2),
    )
    provider = AnthropicProvider(client, secrets=[TEST_API_KEY])
    fake_claude.enqueue(hang_reply("still thinking"))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(provider.create_message, REQUEST)  # holds the pool's one connection
            assert await fake_claude.await_requests(1)
            error, cost = await metered_failure(provider)
            tg.cancel_scope.cancel()
    finally:
        await provider.aclose()
    assert error.data is not None
    assert error.data["type"] == "timeout"
    assert len(fake_claude.requests) == 1  # the second call never reached the API
    assert not any(cost.values()), cost


async def test_a_call_a_proxy_refused_to_tunnel_is_not_charged() -> None:
    """An HTTPS proxy (`HTTPS_PROXY`) that refuses the `CONNECT` (407, 403): the tunnel to the API
    was never opened, so the request was never sent; it was charged the whole reservation."""
    seen: list[bytes] = []

    async def refuse(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive()
            seen.append(head.split(b" ", 1)[0])
            await stream.send(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    http_client = httpx2.AsyncClient(proxy=f"http://127.0.0.1:{port}")
    client = anthropic.AsyncAnthropic(
        api_key=TEST_API_KEY, base_url="https://claude.test", max_retries=0, http_client=http_client
    )
    provider = AnthropicProvider(client, secrets=[TEST_API_KEY])
    try:
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, refuse)
            error, cost = await metered_failure(provider)
            tg.cancel_scope.cancel()
    finally:
        await provider.aclose()
    assert seen == [b"CONNECT"]
    assert error.data is not None
    assert error.data["type"] == "connection_error"
    assert not any(cost.values()), cost


def test_without_lone_surrogates_replaces_each_and_keeps_a_clean_request_as_it_is() -> None:
    clean = {"messages": [{"role": "user", "content": [{"type": "text", "text": "whole \U0001f600"}]}]}
    assert without_lone_surrogates(clean) == (clean, 0)
    assert without_lone_surrogates(clean)[0] is clean
    broken = {"a\ud800": ["x\udc00y", {"k": "\ud83d\ud83d"}, 3, None]}
    assert without_lone_surrogates(broken) == ({"a\ufffd": ["x\ufffdy", {"k": "\ufffd\ufffd"}, 3, None]}, 4)


@pytest.mark.parametrize(
    ("body", "passes"),
    [
        ('{"error": "invalid_grant", "error_description": "Bad Request"}', False),
        ('{"error": "temporarily_unavailable"}', True),
        ('{"error": {"code": 503, "message": "unavailable", "status": "UNAVAILABLE"}}', True),
        ('{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}}', True),
        ('{"error": {"code": 400, "status": "INVALID_ARGUMENT"}}', False),
        ("<html><title>502 Bad Gateway</title></html>", True),
    ],
)
def test_a_token_endpoint_error_for_user_credentials_passes_only_when_it_says_so(
    body: str, passes: bool
) -> None:
    """google-auth raises `OAuthError` for user and workload identity credentials, with the body
    but not the status: an OAuth refusal is final, an outage (or a page from something in front of
    the endpoint) may pass, as a service account's retryable `RefreshError` does."""
    from google.auth import exceptions

    refusal = exceptions.OAuthError("Error code ...", body)  # type: ignore[no-untyped-call]
    assert credentials_unreachable(refusal) is passes
