"""The Claude Messages API through the official `anthropic` SDK, always streaming.

One class serves every backend the SDK has a client for (the Claude API, Bedrock, Vertex): they
share the Messages surface and differ only in URL, auth and model ids (see `platforms`).
Streaming avoids the SDK's non-streaming guard for large `max_tokens`, keeps long generations
from idling out, reports progress as it goes, and lets cancellation close the HTTP stream. The
SDK's own retries are off: `RetryingProvider` owns retrying, against a deadline.
"""

from __future__ import annotations

import base64
import datetime
import email.utils
import functools
import json
import logging
import re
import socket
import time
import urllib.parse
import weakref
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, cast

import anthropic
import anyio
import httpx2
from anthropic.lib._tracing import messages_create_request_attributes

from mcp_backfill.errors import ProviderError
from mcp_backfill.jsonrpc import decode
from mcp_backfill.logs import Redactor, get_logger
from mcp_backfill.protocol import INTERNAL_ERROR, INVALID_PARAMS, SSE_TYPE
from mcp_backfill.providers.message_stream import MessageFold
from mcp_backfill.sampling.provider import ProgressCallback, StreamProgress, UsageMeter
from mcp_backfill.transports.http_upstream.settings import goes_through_a_proxy

# Statuses that mean "this request is wrong", so the server, not the operator, must act.
REQUEST_FAULT_STATUSES = frozenset({400, 413, 422})
# Worth another try (the SDK's own list): timeouts, conflicts, rate limits, every 5xx incl. 529.
RETRYABLE_STATUSES = frozenset({408, 409, 429})
# A mid-stream `event: error` arrives on a 200 response; these types are transient (Claude API
# error types, and the exception frames Bedrock sends inside its event stream).
RETRYABLE_STREAM_ERRORS = frozenset(
    {
        "overloaded_error",
        "api_error",
        "rate_limit_error",
        "timeout_error",
        "modelStreamErrorException",
        "throttlingException",
        "internalServerException",
        "serviceUnavailableException",
        "modelTimeoutException",
    }
)

# The most of an error text the API (or a gateway in front of it) sent that an error message quotes.
ERROR_TEXT_LIMIT = 500
# The content types of a streamed answer: server-sent events, and Bedrock's event stream.
BEDROCK_STREAM_TYPE = "application/vnd.amazon.eventstream"
STREAM_TYPES = frozenset({SSE_TYPE, BEDROCK_STREAM_TYPE})
UTF8_BOM = b"\xef\xbb\xbf"
# The most of a JSON answer instead of a stream (a gateway's message or error) that is read.
WHOLE_BODY_LIMIT = 64 * 1024 * 1024
# How long the body may take to end after `message_stop` before the whole message is taken as it is.
AFTER_STOP_SECONDS = 1.0

# Failures that mean the request never reached the API, not billed: no connection was made, none
# of the pool's came free in time, or the proxy refused to open the tunnel to the API (httpcore2
# raises `ProxyError` only then, and for a SOCKS handshake). Not a `WriteTimeout`: the request was
# handed to the socket, whose buffer is still flushed when the connection closes, so it may have
# reached the API.
NEVER_SENT = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout, httpx2.ProxyError)

AnyClient = anthropic.AsyncAnthropic | anthropic.AsyncAnthropicBedrock | anthropic.AsyncAnthropicVertex


# Where each backend's credentials come from, for the message that says they were refused.
CREDENTIALS = {
    "anthropic": "ANTHROPIC_API_KEY",
    "bedrock": "the AWS credentials (AWS_BEARER_TOKEN_BEDROCK, AWS_PROFILE...)",
    "vertex": "the Google credentials (MCP_BACKFILL_VERTEX_ACCESS_TOKEN or Application Default Credentials)",
}
# The settings that name each backend's API host, for the message that says its name does not resolve.
API_HOST_SETTINGS = {
    "anthropic": "ANTHROPIC_BASE_URL",
    "bedrock": "ANTHROPIC_BEDROCK_BASE_URL or the region (AWS_REGION, AWS_DEFAULT_REGION or the profile's)",
    "vertex": "ANTHROPIC_VERTEX_BASE_URL or the region (CLOUD_ML_REGION)",
}
# Where each backend's client fetches its credentials, for the message that says that host's name
# does not resolve (a typo: the setting that holds it is the one to fix).
CREDENTIALS_HOSTS = {
    "bedrock": (
        "where the AWS credentials come from (AWS_ENDPOINT_URL_STS, or the region and the role, SSO or "
        "endpoint_url settings of AWS_PROFILE's profile)"
    ),
    "vertex": (
        "the token endpoint of the Google credentials (the token_uri or token_url of the "
        "GOOGLE_APPLICATION_CREDENTIALS file)"
    ),
}


# The scope the SDK asks Application Default Credentials for (its `CLOUD_PLATFORM_SCOPE`).
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


class NoVertexProject(ValueError):
    """Neither `ANTHROPIC_VERTEX_PROJECT_ID` nor the credentials name a project: no call was made."""


async def load_vertex_credentials(client: AnyClient) -> None:
    """A Vertex client without a ready token loads its Application Default Credentials now, as the
    SDK would, but keeps them before their first refresh: the SDK's own loading refreshes them
    before it hands them over, so when that refresh was refused by a token endpoint quoting the
    request, the refresh token and client secret were nowhere the redaction could find them
    (`client_secrets`). The project is the one they name (a service account's,
    `GOOGLE_CLOUD_PROJECT`, gcloud's) when `ANTHROPIC_VERTEX_PROJECT_ID` names none: the SDK asks
    for the project before it loads the credentials, so without this every call failed with "No
    project_id was given". Raises `NoVertexProject` at once, nothing refreshed, when there is no project.
    Blocking work (reading files, the token request) runs in a worker thread, as the SDK's does."""
    if not isinstance(client, anthropic.AsyncAnthropicVertex) or client.access_token is not None:
        return
    # Credentials that never had a token (their first refresh failed) are read again, as the SDK
    # did: a fixed file (`gcloud auth application-default login` again) needs no restart.
    if client.credentials is None or not getattr(client.credentials, "token", None):
        known = client.project_id is not None
        made = _MADE.setdefault(client, deque(maxlen=_MADE_KEPT))
        credentials, project = await anyio.to_thread.run_sync(_default_credentials, known, made)
        record_credentials_made(credentials)
        client.credentials = credentials
        if client.project_id is None and project:
            client.project_id = project
    if client.project_id is None:  # user credentials name none
        raise NoVertexProject(
            "Could not resolve project_id: set ANTHROPIC_VERTEX_PROJECT_ID (the Google Cloud project)"
        )


async def load_aws_credentials(client: AnyClient) -> None:
    """A Bedrock client that signs with SigV4 has boto3 resolve its AWS credentials now, in a worker
    thread, through the session the SDK itself signs with (`aws_session`): resolved there once, they
    are the ones the signing uses, and STS or SSO is asked no more often than before. None found
    raises botocore's own `NoCredentialsError`, where the SDK raises a bare `RuntimeError` that only
    its words told apart (`credentials_failed` still knows them, should the SDK keep its session
    elsewhere: then nothing is done here)."""
    if not isinstance(client, anthropic.AsyncAnthropicBedrock) or client.api_key is not None:
        return
    session = aws_session(client)
    if session is None or session in _AWS_CREDENTIALS_FOUND:
        return
    if await anyio.to_thread.run_sync(session.get_credentials) is None:
        from botocore.exceptions import NoCredentialsError  # type: ignore[import-untyped]

        raise NoCredentialsError()
    _AWS_CREDENTIALS_FOUND.add(session)  # botocore keeps them (refreshing them itself) from now on


# The boto3 sessions that found their credentials: botocore keeps them, never to lose them again.
_AWS_CREDENTIALS_FOUND: weakref.WeakSet[Any] = weakref.WeakSet()


def aws_session(client: anthropic.AsyncAnthropicBedrock) -> Any:
    """The boto3 session the SDK signs `client`'s requests with (one per region, profile and keys,
    kept by the SDK); None when the SDK keeps it elsewhere."""
    try:
        from anthropic.lib.aws._auth import _get_session
    except ImportError:
        return None
    try:
        return _get_session(
            aws_access_key=client.aws_access_key,
            aws_secret_key=client.aws_secret_key,
            aws_session_token=client.aws_session_token,
            region=client.aws_region,
            profile=client.aws_profile,
        )
    except TypeError:  # the SDK's function takes other arguments now
        return None


def _default_credentials(project_known: bool, made: deque[str]) -> tuple[Any, str | None]:
    """google-auth's Application Default Credentials with the scope the SDK asks for, not refreshed
    (but workload identity federation's, which google-auth refreshes to find their project: the
    credentials their token requests carry are kept in `made`). With the project known
    (`ANTHROPIC_VERTEX_PROJECT_ID`), google-auth's warning that the credentials name none, which
    says to set `GOOGLE_CLOUD_PROJECT`, is left out of the log."""
    import google.auth

    quiet = _NoProjectWarning() if project_known else None
    if quiet is not None:
        _GOOGLE_DEFAULT_LOG.addFilter(quiet)
    try:
        keeping = cast(Any, _KeepingRequest(made))  # a transport as google-auth's own is
        credentials, project = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE], request=keeping)
    finally:
        if quiet is not None:
            _GOOGLE_DEFAULT_LOG.removeFilter(quiet)
    return credentials, project if isinstance(project, str) and project else None


# The fields of a token request's form that carry a credential made for it: a workload identity
# federation's subject (and actor) token, a service account's signed assertion.
_GRANT_CREDENTIALS = ("subject_token", "actor_token", "assertion")


class _KeepingRequest:
    """google-auth's HTTP transport (`requests`) for its Application Default Credentials search,
    keeping in `made` the credentials each token request's form carries (`_GRANT_CREDENTIALS`)."""

    def __init__(self, made: deque[str]) -> None:
        from google.auth.transport.requests import Request

        self._request = Request()
        self._made = made

    def __call__(self, url: str, method: str = "GET", body: Any = None, **kwargs: Any) -> Any:
        if isinstance(body, bytes | str):
            form = body.decode(errors="replace") if isinstance(body, bytes) else body
            for name, value in urllib.parse.parse_qsl(form):
                if name in _GRANT_CREDENTIALS and value:
                    self._made.append(value)
        return self._request(url, method=method, body=body, **kwargs)


# The logger google-auth's Application Default Credentials search warns on.
_GOOGLE_DEFAULT_LOG = logging.getLogger("google.auth._default")


class _NoProjectWarning(logging.Filter):
    """Drops google-auth's "No project ID could be determined" warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No project ID could be determined")


def credentials_unreachable(exc: BaseException) -> bool:
    """Did the client fail to get its credentials for a reason that may pass, before it sent
    anything: google-auth could not reach the token endpoint (`TransportError`: refused, reset, a
    timeout) or was answered with an error it calls retryable (a 5xx after its own retries); boto3
    could not reach the service that issues them (STS for a role, SSO...: botocore's connection
    errors, refused, closed or timed out) or was answered that it is unavailable or throttling
    (a 5xx, `Throttling`). The request itself is signed offline: these come only from fetching
    credentials."""
    try:
        from botocore import exceptions as botocore_errors  # type: ignore[import-untyped]
    except ImportError:  # no botocore: not the Bedrock client
        pass
    else:
        if isinstance(exc, botocore_errors.ConnectionError | botocore_errors.HTTPClientError):
            return True
        if isinstance(exc, botocore_errors.ClientError):  # answered: an outage or throttling passes
            return _aws_error_passes(exc.response)
    try:
        from google.auth import exceptions as google_auth
    except ImportError:  # no google-auth: not the Vertex client's Application Default Credentials
        return False
    if isinstance(exc, google_auth.TransportError):
        return True
    if isinstance(exc, google_auth.OAuthError):  # user or workload identity credentials' endpoint
        return _oauth_error_passes(exc.args[1] if len(exc.args) > 1 else None)
    return isinstance(exc, google_auth.RefreshError) and bool(getattr(exc, "retryable", False))


# The OAuth 2.0 error codes that say a token request may succeed later (RFC 6749 section 5.2, and
# the ones google-auth itself retries a service account's refresh on).
OAUTH_TRANSIENT_ERRORS = frozenset({"server_error", "temporarily_unavailable", "internal_failure"})


def _oauth_error_passes(body: object) -> bool:
    """Does the body of a token endpoint's error (google-auth's `OAuthError`, raised for user and
    workload identity credentials without the status) say it may pass? An OAuth refusal names its
    error (`invalid_grant`: final unless it is a transient one); Google's own API errors give their
    status code (a 5xx or 429 passes); anything else is no answer of the endpoint's (a load
    balancer's error page), as when it cannot be reached."""
    if not isinstance(body, str | bytes):  # not the endpoint's answer: nothing to tell by
        return False
    try:
        data = json.loads(body)
    except ValueError:
        return True
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, str):
        return error in OAUTH_TRANSIENT_ERRORS
    if isinstance(error, dict):
        code = error.get("code")
        return isinstance(code, int) and (code >= 500 or code == 429)
    return not isinstance(data, dict)


# The error codes with which an AWS service (STS, SSO) says a request may succeed later: throttled
# or timed out (botocore's own retry lists); any 5xx says so too.
AWS_TRANSIENT_ERROR_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "RequestThrottled",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "IDPCommunicationError",
    }
)


def _aws_error_passes(response: object) -> bool:
    """Does an AWS service's error answer (botocore's `ClientError.response`) say it may pass: a
    5xx or 429 status, or a throttling or timeout code (STS throttles with a 400)?"""
    if not isinstance(response, Mapping):
        return False
    metadata, error = response.get("ResponseMetadata"), response.get("Error")
    status = metadata.get("HTTPStatusCode") if isinstance(metadata, Mapping) else None
    code = error.get("Code") if isinstance(error, Mapping) else None
    return (isinstance(status, int) and (status >= 500 or status == 429)) or code in AWS_TRANSIENT_ERROR_CODES


# What the SDK's Bedrock and Vertex clients raise, as a `RuntimeError`, when they found no
# credentials at all (boto3's chain came back empty; google-auth gave no token).
_SDK_NO_CREDENTIALS = ("Could not resolve AWS credentials", "Could not resolve API token")


def credentials_failed(exc: BaseException) -> bool:
    """Did the client fail to get its credentials, for good: none found (boto3's chain empty, no
    Application Default Credentials), a profile or key file that cannot be used, a refresh refused?
    botocore raises only there (the request is signed offline; its event-stream errors come once
    the answer streams), as google-auth does."""
    if google_credentials_failed(exc):
        return True
    if isinstance(exc, RuntimeError) and str(exc).startswith(_SDK_NO_CREDENTIALS):
        return True
    try:
        from botocore import exceptions as botocore_errors
    except ImportError:
        return False
    return isinstance(exc, botocore_errors.BotoCoreError | botocore_errors.ClientError)


def google_credentials_failed(exc: BaseException) -> bool:
    """Did google-auth fail to load or refresh Application Default Credentials (none found, a
    refresh refused, its token endpoint out of reach)? Claude's endpoint was not called."""
    try:
        from google.auth import exceptions as google_auth
    except ImportError:
        return False
    return isinstance(exc, google_auth.GoogleAuthError)


def name_not_resolved(exc: BaseException) -> bool:
    """Did a connection fail because the host name does not resolve?"""
    seen: BaseException | None = exc
    for _ in range(8):  # the cause chain: SDK error -> httpx2 error -> OSError
        if seen is None:
            return False
        if isinstance(seen, socket.gaierror):  # not EAI_AGAIN ("temporary failure"): worth a retry
            return seen.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME))
        seen = seen.__cause__ or seen.__context__
    return False


# The options of the SDK's own Messages call that name its tracing span (`messages.stream()` and
# `messages.create()` pass these), for the same call made through `post` (see `message_stream`).
MESSAGES_CALL_OPTIONS: dict[str, Any] = {
    "span_name": "anthropic.messages.create",
    "span_route": "/v1/messages",
    "span_attributes": messages_create_request_attributes,
}


class IdleStream(httpx2.ReadTimeout):
    """A stream that sent nothing but pings (or comments) for longer than the read timeout: the
    read timeout it kept from tripping, read as one (the stream broke off, retryable)."""


class StreamedEvents:
    """The events of a streamed Messages answer, decoded to JSON, in order (`message_stream`'s).

    An `error` event raises the SDK's own `APIStatusError` for it, as the SDK's stream does. A JSON
    answer instead of a stream (a gateway's) is taken for what it is: an error body raises that
    error, a whole message gives the events of its stream (other JSON-labelled bodies are read as
    events); a body without a single event is a `ValueError` that names its type and quotes it."""

    def __init__(self, client: AnyClient, response: httpx2.Response) -> None:
        self.request_id: str | None = response.headers.get("request-id")
        self.request = response.request  # as sent, its credentials included
        self._client = client
        self._response = response
        # The SDK's read timeout bounds the wait for each byte; pings (and comments) are bytes, so
        # the time between two events that are not pings gets the same bound (`IdleStream`).
        timeout = client.timeout
        self._idle_limit = timeout.read if isinstance(timeout, httpx2.Timeout) else timeout
        self._events = self._decode()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._events

    async def aclose(self) -> None:
        await self._events.aclose()

    async def _decode(self) -> AsyncGenerator[Any, None]:
        media_type = self._response.headers.get("content-type", "").partition(";")[0].strip().lower()
        chunks: AsyncIterator[bytes] = self._response.aiter_bytes()
        if media_type.endswith("json"):  # a gateway's answer as one JSON value, or a mislabelled stream
            raw = await _read_whole(chunks, media_type)
            whole = self._whole_message(raw)
            if whole is not None:
                for event in whole:
                    yield event
                return
            chunks = _once(raw)
        head = bytearray()  # the body's first bytes, quoted if it holds no event at all
        # Server-sent events may open with a UTF-8 byte order mark, which is not the first field's.
        bom = b"" if media_type == BEDROCK_STREAM_TYPE else UTF8_BOM

        idle_limit = self._idle_limit
        events = 0

        async def body() -> AsyncIterator[bytes]:
            opening: bytes | None = b""
            seen, idle_since = -1, 0.0  # the events counted at the last chunk; since when none came
            async for chunk in chunks:
                if events != seen:  # an event since the last chunk: the common case, no clock read
                    seen, idle_since = events, 0.0
                elif idle_limit is not None:  # pings, comments or part of an event only
                    now = time.monotonic()
                    if not idle_since:
                        idle_since = now
                    elif now - idle_since > idle_limit:
                        raise IdleStream(f"nothing but pings for more than {idle_limit:g} s")
                if len(head) < ERROR_TEXT_LIMIT:
                    head.extend(chunk[: ERROR_TEXT_LIMIT - len(head)])
                if opening is not None:  # the opening bytes, until there are enough to tell
                    opening += chunk
                    if len(opening) < len(bom) and bom.startswith(opening):
                        continue
                    chunk = opening.removeprefix(bom)
                    opening = None
                yield chunk
            if opening:
                yield opening

        decoder = self._client._make_sse_decoder()  # server-sent events, or Bedrock's event stream
        try:
            async for sse in decoder.aiter_bytes(body()):
                if sse.event == "error":
                    raise self._error_event(sse.data)
                if sse.event is None or sse.event == "ping" or not sse.data:
                    continue
                events += 1
                yield decode(sse.data.encode())
        except Exception as exc:
            if not _broken_frame(exc):
                raise
            # A malformed stream, as a broken server-sent event is: the call was made.
            raise ValueError(f"a broken AWS event-stream frame ({type(exc).__name__}: {exc})") from None
        if not events and media_type not in STREAM_TYPES and head:
            excerpt = bytes(head).decode(errors="replace")
            raise ValueError(f"a {media_type or 'untyped'} answer, not an event stream: {excerpt}")

    def _whole_message(self, raw: bytes) -> list[dict[str, Any]] | None:
        """A JSON body that is an error raises that error; a message gives the events of its
        stream; anything else None (it may be a stream labelled JSON)."""
        try:
            body = decode(raw)
        except ValueError:
            return None
        kind = body.get("type") if isinstance(body, dict) else None
        if kind == "error":
            raise self._error_event(raw.decode())
        if kind != "message" or not isinstance(body, dict):
            return None
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        ending = {field: body.get(field) for field in ("stop_reason", "stop_sequence", "stop_details")}
        return [
            {"type": "message_start", "message": {**body, **dict.fromkeys(ending)}},
            {"type": "message_delta", "delta": ending, "usage": usage},
            {"type": "message_stop"},
        ]

    def _error_event(self, data: str) -> anthropic.APIStatusError:
        body: object = data
        try:
            body = decode(data.encode())
            message = f"{body}"
        except ValueError:
            message = data or f"Error code: {self._response.status_code}"
        return self._client._make_status_error(message, body=body, response=self._response)


def _broken_frame(exc: Exception) -> bool:
    """Is `exc` botocore's for an AWS event-stream frame it cannot read (a checksum that does not
    match, a length out of bounds)? It is no `ValueError`."""
    try:
        from botocore.eventstream import ParserError  # type: ignore[import-untyped]
    except ImportError:  # no botocore, no Bedrock stream
        return False
    return isinstance(exc, ParserError)


async def _read_whole(chunks: AsyncIterator[bytes], media_type: str) -> bytes:
    raw = bytearray()
    async for chunk in chunks:
        raw += chunk
        if len(raw) > WHOLE_BODY_LIMIT:
            raise ValueError(f"a {media_type} answer of more than {WHOLE_BODY_LIMIT} bytes, not a stream")
    return bytes(raw)


async def _once(raw: bytes) -> AsyncIterator[bytes]:
    yield raw


log = get_logger("provider")

# Half of a UTF-16 surrogate pair. JSON may hold one as an escape (`"\ud83d"`: a JavaScript
# server's string cut within an emoji); UTF-8, which the request body is, has no form for it.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(value: Any) -> tuple[Any, int]:
    """`value` with each lone surrogate as U+FFFD, and how many there were (the same objects
    when none). Walked only once the SDK failed to encode a body: the common path pays nothing."""
    if isinstance(value, str):
        return _LONE_SURROGATE.subn("\ufffd", value)
    if isinstance(value, dict):
        pairs = [(without_lone_surrogates(k), without_lone_surrogates(v)) for k, v in value.items()]
        found = sum(k[1] + v[1] for k, v in pairs)
        return ({k[0]: v[0] for k, v in pairs} if found else value), found
    if isinstance(value, list):
        items = [without_lone_surrogates(item) for item in value]
        found = sum(count for _, count in items)
        return ([item for item, _ in items] if found else value), found
    return value, 0


@asynccontextmanager
async def message_stream(client: AnyClient, request: dict[str, Any]) -> AsyncIterator[StreamedEvents]:
    """One streamed Messages call, made as `client.messages.stream(**request)` makes it (the same
    body, auth, headers, platform routing and tracing span) through the SDK's documented `post` with
    `cast_to=httpx2.Response`, which leaves the answer's bytes to us: `MessageFold` folds its events
    at a fraction of what the SDK's typed events and snapshot cost (see `message_stream`'s module).
    A status error raises the SDK's exceptions, as before. The response is closed on the way out."""
    body = {**request, "stream": True}
    try:
        response = await _post_messages(client, body)
    except UnicodeEncodeError:  # raised building the body: nothing was sent
        body, replaced = without_lone_surrogates(body)
        if not replaced:
            raise
        log.warning(
            "lone surrogates in a sampling request sent to Claude as U+FFFD (UTF-8 has no form for them)",
            extra={"replaced": replaced},
        )
        response = await _post_messages(client, body)
    events = StreamedEvents(client, response)
    try:
        yield events
    finally:
        try:
            await events.aclose()
        finally:
            await response.aclose()


async def _post_messages(client: AnyClient, body: dict[str, Any]) -> httpx2.Response:
    await load_vertex_credentials(client)
    await load_aws_credentials(client)
    return await client.post(
        "/v1/messages",
        body=body,
        cast_to=httpx2.Response,
        stream=True,
        options=cast(Any, MESSAGES_CALL_OPTIONS),
    )


async def _rest_of_stream(events: StreamedEvents, fold: MessageFold, redact: Callable[[str], str]) -> None:
    """What follows `message_stop`: normally the body's end at once, read so that the connection
    can be used again. The message is whole: a connection that breaks off now, a body that does not
    end within `AFTER_STOP_SECONDS` (a gateway keeping it open), or an event that has no place there
    (an `error`) costs it nothing (it was retried, and billed again, or cut off at the deadline and
    thrown away); what has no place there is logged."""
    with anyio.move_on_after(AFTER_STOP_SECONDS):
        try:
            async for event in events:
                fold.add(event)
        except httpx2.HTTPError:
            pass
        except (anthropic.APIStatusError, ValueError) as exc:  # an `error` event, an unknown one
            _trailer_ignored("message_stop", exc, redact)


def _trailer_ignored(
    after: str, exc: anthropic.APIStatusError | ValueError, redact: Callable[[str], str]
) -> None:
    """The whole message came, then something the stream should not hold: the message is the
    answer (a retry would be billed again for it), and the operator is told, in the endpoint's
    words without the credentials (`redact`: the provider's, which knows those the client found
    or minted itself, as the log does not)."""
    log.warning(
        f"Claude API stream went on after {after} with something it should not hold; the message, "
        "complete, is the answer",
        extra={"error": redact(str(exc))[:200]},
    )


async def streamed_message(client: AnyClient, request: dict[str, Any]) -> dict[str, Any]:
    """One streamed call and the message its events fold into, with nothing reported on the way
    (the priming's; `AnthropicProvider.create_message` is the full one)."""
    async with message_stream(client, request) as events:
        fold = MessageFold()
        async for event in events:
            fold.add(event)
        return fold.message()


def minted_token(client: AnyClient) -> str | None:
    """The access token the client minted itself (Vertex's, from Application Default Credentials),
    a secret no setting holds; None when it has none."""
    token = getattr(getattr(client, "credentials", None), "token", None)
    return token if isinstance(token, str) and token else None


# The request headers that carry the credentials an SDK client put on a call: the bearer token or
# SigV4 signature (`Authorization`), an API key, and the AWS session token.
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "x-amz-security-token")


def sent_credentials(request: httpx2.Request | None) -> tuple[str, ...]:
    """The credentials on `request` as the SDK client sent it, wherever it found them (a Vertex
    token it minted, AWS credentials from a profile, the shared credentials file, an SSO cache or
    an instance role): an endpoint's error may quote them, and no setting holds them. Of a value
    with a scheme (`Bearer TOKEN`), what follows the scheme."""
    if request is None:
        return ()
    found: list[str] = []
    for name in CREDENTIAL_HEADERS:
        for value in request.headers.get_list(name):
            scheme, space, rest = value.strip().partition(" ")
            found.append(rest.strip() if space and name == "authorization" else value)
            if name == "authorization" and scheme.upper().startswith("AWS4-"):
                found.extend(sigv4_parts(rest))
    return tuple(found)


def sigv4_parts(parameters: str) -> tuple[str, ...]:
    """The values of a SigV4 `Authorization` header's parameters (`Credential=AKIA…/date/region/
    service/aws4_request, SignedHeaders=…, Signature=<hex>`, after the scheme) that an endpoint's
    error may quote apart from the rest: the signature, the credential and its access key id."""
    found: list[str] = []
    for part in parameters.split(","):
        name, _, value = part.strip().partition("=")
        if name == "Signature" and value:
            found.append(value)
        elif name == "Credential" and value:
            found.extend((value, value.partition("/")[0]))
    return tuple(each for each in found if each)


def failed_request(exc: BaseException) -> httpx2.Request | None:
    """The request an SDK (or httpx2) error is about, if it names one."""
    try:
        request = getattr(exc, "request", None)  # httpx2's raises RuntimeError when it has none
    except RuntimeError:
        return None
    return request if isinstance(request, httpx2.Request) else None


# The secrets of Google credentials loaded from an Application Default Credentials file (a user's
# refresh token and OAuth client secret, a workload identity pool's client secret), which a token
# endpoint's refusal may quote.
_GOOGLE_CREDENTIAL_SECRETS = ("refresh_token", "client_secret", "_refresh_token", "_client_secret")
# How deep credentials that stand on others are looked into (impersonation over user credentials).
_SOURCE_DEPTH = 4


# How many of the latest credentials made for a refresh are kept to be redacted, per owner (one a
# refresh, hourly: the last few cover a refusal quoted while the next is made).
_MADE_KEPT = 4
# What each recording signer signed, base64url as a JWT carries it; the subject tokens each
# workload identity federation's credentials read (`record_credentials_made`); and what the token
# requests of a client's credentials search carried (`_KeepingRequest`).
_MADE: weakref.WeakKeyDictionary[object, deque[str]] = weakref.WeakKeyDictionary()


def record_credentials_made(credentials: object) -> None:
    """Have `credentials` (and those they stand on) keep the credentials they make for each refresh,
    for `_held_secrets`; a token endpoint's refusal may quote them, and no setting holds them:

    - a service account's refresh sends a JWT its private key signed (the `assertion`), which
      stands for the key until it expires: its signer's signatures are kept (only the signer's
      `sign` is wrapped, on the instance, so google-auth still tells its algorithm by its class);
    - workload identity federation (`external_account`) exchanges a subject token, read from a file,
      a URL or a program each time (a CI job's or a cluster's OIDC token): each one read is kept.
    """
    for _ in range(_SOURCE_DEPTH):
        if credentials is None:
            break
        signer = getattr(credentials, "_signer", None)
        _record_results(signer, "sign", lambda signature: base64.urlsafe_b64encode(signature).rstrip(b"="))
        _record_results(credentials, "retrieve_subject_token", lambda token: token)
        credentials = getattr(credentials, "_source_credentials", None)


def _record_results(owner: object, method: str, shown: Callable[[Any], object]) -> None:
    """Wrap `owner.method` on the instance so that what it returns, as `shown` makes it, is kept in
    `_MADE[owner]`; once per owner."""
    made_by = getattr(owner, method, None)
    if owner is None or not callable(made_by) or owner in _MADE:
        return
    made: deque[str] = deque(maxlen=_MADE_KEPT)
    _MADE[owner] = made

    def recording(*args: Any, **kwargs: Any) -> Any:
        result = made_by(*args, **kwargs)
        value = shown(result)
        value = value.decode(errors="replace") if isinstance(value, bytes) else value
        if isinstance(value, str) and value:
            made.append(value)
        return result

    setattr(owner, method, recording)


def _held_secrets(credentials: object) -> tuple[str, ...]:
    """The secrets Google `credentials` hold (also as the `Basic` header they go in), and those of
    the credentials they stand on (`_source_credentials`: an impersonated service account's source,
    the user's credentials that `gcloud auth application-default login
    --impersonate-service-account` keeps)."""
    found: list[str] = []
    for _ in range(_SOURCE_DEPTH):
        if credentials is None:
            break
        held = (getattr(credentials, name, None) for name in _GOOGLE_CREDENTIAL_SECRETS)
        found.extend(value for value in held if isinstance(value, str) and value)
        found.extend(_basic_credentials(credentials))
        for owner in (getattr(credentials, "_signer", None), credentials):
            found.extend(_MADE.get(owner, ()) if owner is not None else ())
        credentials = getattr(credentials, "_source_credentials", None)
    return tuple(dict.fromkeys(found))


def _basic_credentials(credentials: object) -> tuple[str, ...]:
    """The OAuth client's id and secret as google-auth sends them to the token endpoint of user and
    workload identity credentials, `Authorization: Basic base64(id:secret)`: the secret is one
    decoding away, and an endpoint's refusal may quote the header."""
    client_id = getattr(credentials, "_client_id", None)
    secret = getattr(credentials, "_client_secret", None)
    if not isinstance(client_id, str) or not client_id or not isinstance(secret, str) or not secret:
        return ()
    return (base64.b64encode(f"{client_id}:{secret}".encode()).decode(),)


def client_secrets(client: AnyClient, request: httpx2.Request | None = None) -> tuple[str, ...]:
    """What the client holds or sent that no setting names: its minted token, the secrets of the
    credentials it loaded (Application Default Credentials), and the credentials on `request` (the
    one a failure is about)."""
    token = minted_token(client)
    loaded = _held_secrets(getattr(client, "credentials", None)) + tuple(_MADE.get(client, ()))
    return ((token,) if token else ()) + loaded + sent_credentials(request)


class AnthropicProvider:
    """A `Provider` over an anthropic SDK async client (Claude API, Bedrock or Vertex)."""

    def __init__(
        self,
        client: AnyClient,
        *,
        name: str = "anthropic",
        model_id: Callable[[str], str] = str,
        secrets: Iterable[str] = (),
    ) -> None:
        self.name = name
        self._client = client
        self._model_id = model_id
        self._redact_configured = Redactor(secrets).redact

    def _redact(self, text: str, request: httpx2.Request | None = None) -> str:
        """`text` without the configured secrets, nor what the client found or made itself, which no
        setting holds: the token it minted (Vertex's from Application Default Credentials, renewed
        hourly) and the credentials on `request`, the one the failure is about (AWS credentials from
        a profile, the shared credentials file or an SSO cache: the session token goes on the wire)."""
        text = self._redact_configured(text)
        found = client_secrets(self._client, request)
        return Redactor(found).redact(text) if found else text

    async def prime(self) -> None:
        """The second half of the priming, on the proxy's own loop: one canned answer through this
        client's own HTTP client (its connection pool, the loop's socket machinery), from a loopback
        server on an ephemeral port, with a placeholder key. A few milliseconds (the heavy part was
        `prime_sdk`'s); what is left for the first real request is its own connection."""
        if isinstance(self._client, anthropic.AsyncAnthropic):
            await _stream_canned_answer(self._client)

    async def create_message(
        self,
        request: dict[str, Any],
        *,
        on_progress: ProgressCallback | None = None,
        meter: UsageMeter | None = None,
    ) -> dict[str, Any]:
        request = {**request, "model": self._model_id(str(request.get("model", "")))}
        meter = meter or _UNMETERED
        request_id: str | None = None
        streaming = False  # a response has started: what goes wrong now is the stream's fault
        sent: httpx2.Request | None = None  # the request of that response
        meter.begin_attempt()
        try:
            async with message_stream(self._client, request) as events:
                streaming = True
                request_id, sent = events.request_id, events.request
                redacted = functools.partial(self._redact, request=sent)
                fold, completed = MessageFold(), False
                try:
                    async for event in events:
                        kind = fold.add(event)
                        if kind == "content_block_delta":
                            if on_progress is not None:
                                await on_progress(StreamProgress(fold.characters))
                        elif kind in ("message_start", "message_delta"):
                            meter.report(fold.usage())
                        elif kind == "message_stop":
                            completed = True
                            break
                except httpx2.HTTPError:
                    if not fold.ended:
                        raise
                    # The whole message came (`message_delta`): a connection that broke off after it
                    # loses nothing, and a retry would be billed again for it.
                except (anthropic.APIStatusError, ValueError) as exc:
                    if not fold.ended:
                        raise
                    _trailer_ignored("message_delta", exc, redacted)  # an `error` event after it, say
                if completed:
                    await _rest_of_stream(events, fold, redacted)
                if not completed and not fold.ended:  # `message_stop` only says again it ended
                    raise self._error(
                        "Claude API stream ended before the message was complete",
                        "incomplete_stream",
                        request_id,
                        retryable=True,
                    )
                result = fold.message()
        except ProviderError:
            raise
        except anthropic.APIStatusError as exc:
            if exc.response.status_code >= 300:  # refused or redirected: no message, nothing billed
                meter.not_billed()
            raise self._status_error(exc) from None
        except anthropic.APITimeoutError as exc:
            if isinstance(exc.__cause__, NEVER_SENT):
                meter.not_sent()
            raise self._error("Claude API request timed out", "timeout", request_id, retryable=True) from None
        except anthropic.APIConnectionError as exc:
            if isinstance(exc.__cause__, NEVER_SENT):
                meter.not_sent()
            if name_not_resolved(exc):  # retrying will not make the name resolve: say so at once
                raise self._error(
                    f"Claude API host name does not resolve "
                    f"({self._redact(str(exc.__cause__ or exc), failed_request(exc))}); "
                    f"check {API_HOST_SETTINGS.get(self.name, 'ANTHROPIC_BASE_URL')} and this machine's DNS",
                    "name_resolution",
                    request_id,
                    retryable=False,
                ) from None
            raise self._error(
                f"Claude API unreachable: {self._redact(str(exc.__cause__ or exc), failed_request(exc))}",
                "connection_error",
                request_id,
                retryable=True,
            ) from None
        except httpx2.HTTPError as exc:  # the connection broke while the stream was being read
            raise self._error(
                f"Claude API stream broke off: {self._redact(str(exc) or type(exc).__name__, sent)}",
                "connection_error",
                request_id,
                retryable=True,
            ) from None
        except ValueError as exc:
            if streaming:  # an event that is not valid JSON or not a known event shape
                raise self._error(
                    f"Claude API sent a malformed stream: {self._redact(str(exc), sent)[:200]}",
                    "malformed_response",
                    request_id,
                    retryable=True,
                ) from None
            meter.not_sent()  # the client refused the request before sending it
            raise self._client_error(exc, sent) from None
        except Exception as exc:  # e.g. no credentials found by boto3 / google-auth
            if not streaming:  # the client refused before anything was sent
                meter.not_sent()
                if credentials_unreachable(exc):  # may pass, as a connection the API refused
                    if name_not_resolved(exc):  # a typo in a host: retrying will not help
                        raise self._credentials_host_error(exc) from None
                    raise self._credentials_error(exc) from None
                if credentials_failed(exc):  # none found, or refused: say which to check
                    raise self._credentials_refused(exc) from None
            raise self._client_error(exc, sent) from None
        meter.report(result["usage"], final=True)
        if request_id:
            result["request_id"] = request_id
        if on_progress is not None:
            await on_progress(
                StreamProgress(fold.characters, done=True, output_tokens=result["usage"].get("output_tokens"))
            )
        return result

    def _error(
        self, message: str, error_type: str, request_id: str | None, *, retryable: bool
    ) -> ProviderError:
        data: dict[str, Any] = {"provider": self.name, "type": error_type}
        if request_id:
            data["request_id"] = request_id
        return ProviderError(message, data, retryable=retryable)

    def _credentials_error(self, exc: Exception) -> ProviderError:
        """The client could not get its credentials for now (`credentials_unreachable`): retryable."""
        detail = self._redact(f"{type(exc).__name__}: {exc}")[:300]
        return ProviderError(
            f"The {self.name} client could not get its credentials: {detail}; check "
            f"{CREDENTIALS.get(self.name, 'ANTHROPIC_API_KEY')} and the network to where they come from",
            {"provider": self.name, "type": "credentials_unavailable"},
            retryable=True,
        )

    def _credentials_refused(self, exc: Exception) -> ProviderError:
        """The client found no credentials, or they were refused when it fetched its token: final,
        with the settings to check (as a refusal by Claude itself names them)."""
        detail = self._redact(f"{type(exc).__name__}: {exc}")[:300]
        return ProviderError(
            f"The {self.name} client could not get its credentials: {detail}; check "
            f"{CREDENTIALS.get(self.name, 'ANTHROPIC_API_KEY')}",
            {"provider": self.name, "type": "client_error"},
        )

    def _credentials_host_error(self, exc: Exception) -> ProviderError:
        """The host the client gets its credentials from has a name that does not resolve: final,
        as for the API's own host, with the settings that name it."""
        detail = self._redact(f"{type(exc).__name__}: {exc}")[:300]
        where = CREDENTIALS_HOSTS.get(self.name, "where the credentials come from")
        return ProviderError(
            f"The {self.name} client could not get its credentials: a host name does not resolve "
            f"({detail}); check {where} and this machine's DNS",
            {"provider": self.name, "type": "name_resolution"},
            retryable=False,
        )

    def _client_error(self, exc: Exception, sent: httpx2.Request | None) -> ProviderError:
        """The SDK client refused before anything was sent (credentials, an unusable request...)."""
        detail = self._redact(f"{type(exc).__name__}: {exc}", sent)[:300]
        return ProviderError(
            f"The {self.name} client could not make the call: {detail}",
            {"provider": self.name, "type": "client_error"},
        )

    def _status_error(self, exc: anthropic.APIStatusError) -> ProviderError:
        status = exc.status_code
        headers = exc.response.headers
        # The body's fields as the SDK read them, strings only: a gateway's may be any JSON, and may
        # quote a credential in any of them (redacted: they go to the server and the audit log).
        sent = failed_request(exc)
        error_type, error_code, request_id, api_message = (
            self._redact(value, sent) if isinstance(value, str) else None
            for value in (exc.type, exc.error_code, exc.request_id, exc.api_message)
        )
        data: dict[str, Any] = {"provider": self.name, "status": status, "type": error_type}
        if error_code:
            data["error_code"] = error_code
        if request_id:
            data["request_id"] = request_id
        # A gateway's error page may be its whole body: redacted, then cut as every other error text.
        detail = (api_message or self._redact(str(exc.message), sent))[:ERROR_TEXT_LIMIT]
        if status in (401, 403):
            detail += f"; check {CREDENTIALS.get(self.name, 'ANTHROPIC_API_KEY')}"
        return ProviderError(
            f"Claude API error ({status} {error_type or 'error'}): {detail}",
            data,
            code=INVALID_PARAMS if status in REQUEST_FAULT_STATUSES else INTERNAL_ERROR,
            retryable=_is_retryable(status, error_type, headers),
            retry_after=retry_after_seconds(headers),
        )

    async def aclose(self) -> None:
        await self._client.close()


class _Unmetered:
    """The meter of a caller that does not count (a `UsageMeter` that ignores everything)."""

    def begin_attempt(self) -> None:
        pass

    async def may_retry(self) -> bool:
        return True

    def report(self, usage: Mapping[str, int], *, final: bool = False) -> None:
        pass

    def not_billed(self) -> None:
        pass

    def not_sent(self) -> None:
        pass


_UNMETERED = _Unmetered()


def _is_retryable(status: int, error_type: str | None, headers: Mapping[str, str]) -> bool:
    should_retry = headers.get("x-should-retry")
    if should_retry in ("true", "false"):
        return should_retry == "true"
    if status == 200:
        return error_type in RETRYABLE_STREAM_ERRORS
    return status in RETRYABLE_STATUSES or status >= 500


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """`retry-after-ms`, else `retry-after` (seconds or an HTTP date), as seconds; None if absent."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            return max(0.0, float(raw) * scale)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw:
        try:
            date = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        # `-0000` (UTC, no source zone named) comes back naive: local time to `timestamp()`.
        when = (date if date.tzinfo else date.replace(tzinfo=datetime.UTC)).timestamp()
        return max(0.0, when - (time.time() if now is None else now))
    return None


# One streamed answer with a text block and a tool call, as the Messages API sends it: `prime_sdk`
# plays it to the SDK so that its deferred work is done before the first real request.
_PRIMING_EVENTS: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "message_start",
        {
            "message": {
                "id": "msg_priming",
                "type": "message",
                "role": "assistant",
                "model": "priming",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
        },
    ),
    ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "ok"}}),
    ("content_block_stop", {"index": 0}),
    (
        "content_block_start",
        {"index": 1, "content_block": {"type": "tool_use", "id": "toolu_priming", "name": "t", "input": {}}},
    ),
    ("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta", "partial_json": "{}"}}),
    ("content_block_stop", {"index": 1}),
    (
        "message_delta",
        {"delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 2}},
    ),
    ("message_stop", {}),
)


async def _stream_canned_answer(client: anthropic.AsyncAnthropic) -> None:
    """Serve `_PRIMING_EVENTS` once on an ephemeral loopback port and stream them through a copy of
    `client` pointed there, with a placeholder key, none of the configured headers (the real
    credentials are never sent, not even there) and the SDK's own span sent nowhere; nothing when an
    HTTP proxy from the environment would carry the request."""
    import asyncio
    import json

    body = "".join(
        f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n" for name, data in _PRIMING_EVENTS
    ).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (
        SSE_TYPE.encode(),
        len(body),
    )

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_head = await reader.readuntil(b"\r\n\r\n")
            for line in request_head.lower().split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    await reader.readexactly(int(line.partition(b":")[2]))
            writer.write(head + body)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    if goes_through_a_proxy(url):  # the environment's HTTP proxy would carry it: not worth that
        server.close()
        return
    from opentelemetry.trace import NoOpTracerProvider  # a dependency of the SDK's own tracing

    # The SDK's tracing stays on (its first use imports the propagators: milliseconds the first real
    # request would pay), but its span goes to a tracer that records nothing.
    primer = client.with_options(
        api_key="priming",
        base_url=url,
        max_retries=0,
        set_default_headers={},
        open_telemetry={"tracer_provider": NoOpTracerProvider()},
    )
    request = {
        "model": "priming",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "priming"}],
        "tools": [{"name": "t", "input_schema": {"type": "object"}}],
    }
    async with server:
        await streamed_message(primer, request)


def settle_client(client: AnyClient) -> None:
    """Do now, in the build's worker thread, what the SDK leaves to a client's first request.

    - **Its platform** (the `X-Stainless-OS`/`-Arch` headers): the SDK works it out in a worker
      thread of its own, since on some systems that blocks, so the first sampling answer paid for a
      thread hop, about half a millisecond here: the largest part of what priming left.
    - **Its tracer**, made on first use.

    Priming cannot do this: it streams through a copy of the client. Nothing happens with an SDK
    that keeps these elsewhere.
    """
    if getattr(client, "_platform", ...) is None:
        from anthropic._base_client import get_platform

        client._platform = get_platform()
    getattr(client, "_tracer", None)


def prime_sdk() -> None:
    """Stream one canned answer through a throwaway SDK client on a loop of its own (nothing leaves
    the host, no key is used): the first half of the priming, see `AnthropicProvider.prime`.

    The SDK defers work to its first request: pydantic builds the schemas of the models a request
    goes through on first use, and a few modules are imported then (about 30 ms of CPU here when
    the answer's events were typed models too, the most of what the first sampling answer cost
    beyond later ones). It runs in the build's worker thread so that this CPU time never holds up
    the event loop; uvloop when installed, as the proxy's loop.
    """
    import asyncio

    async def play() -> None:
        async with anthropic.AsyncAnthropic(api_key="priming") as client:
            await _stream_canned_answer(client)

    try:
        import uvloop
    except ImportError:
        asyncio.run(play())
    else:
        uvloop.run(play())
