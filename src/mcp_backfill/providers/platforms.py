"""The SDK clients behind `--provider anthropic|bedrock|vertex`, and the model ids each one uses.

Every client comes from the anthropic SDK itself, so the request body, streaming and errors are
the same everywhere; only the URL, the auth and the model id differ:

* anthropic: `https://api.anthropic.com/v1/messages` or `ANTHROPIC_BASE_URL` (a gateway), with
  `ANTHROPIC_API_KEY` as a bearer token;
* bedrock (`pip install 'mcp-backfill[bedrock]'`): `POST /model/{id}/invoke-with-response-stream`
  on `bedrock-runtime.{region}.amazonaws.com` (or `ANTHROPIC_BEDROCK_BASE_URL`), authenticated
  with `AWS_BEARER_TOKEN_BEDROCK`, else SigV4 from the standard AWS chain (`AWS_ACCESS_KEY_ID` /
  `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN`, `AWS_PROFILE`, instance roles); region from
  `AWS_REGION` / `AWS_DEFAULT_REGION` or the profile. The stream is AWS event-stream framed, which
  needs botocore, so the extra is required whatever the auth;
* vertex (`pip install 'mcp-backfill[vertex]'`): `POST .../projects/{project}/locations/{region}/
  publishers/anthropic/models/{id}:streamRawPredict` (or `ANTHROPIC_VERTEX_BASE_URL`), region from
  `CLOUD_ML_REGION`, project from `ANTHROPIC_VERTEX_PROJECT_ID` or the credentials, a bearer token
  from `MCP_BACKFILL_VERTEX_ACCESS_TOKEN` (e.g. `gcloud auth print-access-token`) or else Google
  Application Default Credentials (google-auth, the extra).

Model ids: the proxy chooses among Claude API ids (`--model`, `--allowed-models`); Bedrock and
Vertex name the same models differently, so known ids are mapped (`BEDROCK_MODEL_IDS`,
`VERTEX_MODEL_IDS`, other `claude-*` ids by the same rule). An id that already looks
provider-native (it contains `.`, `:`, `@` or `/`, e.g. a Bedrock inference profile
`us.anthropic.claude-sonnet-5-5` or a dated Vertex id `claude-sonnet-5-5@20260101`) is sent as is.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping

import anthropic
import httpx2

from mcp_backfill.errors import ConfigError
from mcp_backfill.providers import ProviderSettings
from mcp_backfill.proxy_variables import unusable_proxy_variables

BEDROCK_MODEL_IDS: dict[str, str] = {
    "claude-opus-5-5": "anthropic.claude-opus-5-5",
    "claude-sonnet-5-5": "anthropic.claude-sonnet-5-5",
    "claude-haiku-5-5": "anthropic.claude-haiku-5-5",
}
VERTEX_MODEL_IDS: dict[str, str] = {
    "claude-opus-5-5": "claude-opus-5-5",
    "claude-sonnet-5-5": "claude-sonnet-5-5",
    "claude-haiku-5-5": "claude-haiku-5-5",
}

_NATIVE_MARKERS = (".", ":", "@", "/")

# How long an idle connection to the API is kept for the next request (httpx2's default: 5 s).
# Sampling requests often come 5-60 s apart (the client's own model takes its turn between tool
# calls), and a new connection to a remote API costs a DNS lookup and TCP and TLS handshakes, tens
# to hundreds of milliseconds. httpcore2 notices a connection the API closed meanwhile (its socket
# reads as ended) before reusing it, and opens a new one instead.
API_KEEPALIVE_SECONDS = 60.0


def api_http_client() -> httpx2.AsyncClient:
    """The SDK's own HTTP client (its TCP keep-alive probes, proxies from the environment, limits),
    with idle connections kept `API_KEEPALIVE_SECONDS`, and no redirect followed: on one to another
    origin httpx2 drops `Authorization` but would carry the gateway's own headers (`--api-header`) and
    the whole prompt there. A redirect is an error like any other status.

    Raises `ConfigError` naming the proxy variable httpx2 cannot use (never quoting its value, which
    may hold credentials)."""
    default = anthropic.DEFAULT_CONNECTION_LIMITS
    limits = httpx2.Limits(
        max_connections=default.max_connections,
        max_keepalive_connections=default.max_keepalive_connections,
        keepalive_expiry=API_KEEPALIVE_SECONDS,
    )
    try:
        return anthropic.DefaultAsyncHttpxClient(limits=limits, follow_redirects=False)
    except (httpx2.InvalidURL, ValueError, ImportError):
        raise ConfigError(unusable_proxy_variables(os.environ, "The Claude API client")) from None


# How long the warm-up waits for the API to answer the request that opens its first connection.
CONNECT_AHEAD_TIMEOUT = 10.0


async def open_api_connection(http: httpx2.AsyncClient, base_url: str) -> int:
    """Open the connection the first sampling request will use, ahead of it: a `HEAD` of the API's
    base URL with no credentials, none of the configured headers and no body, not following a
    redirect. Whatever the status (the API answers 404), the connection then waits in `http`'s pool,
    DNS lookup, TCP and TLS handshakes done (unless the API closes it). Returns the status."""
    response = await http.head(base_url, timeout=CONNECT_AHEAD_TIMEOUT, follow_redirects=False)
    return response.status_code


def is_native_id(model: str) -> bool:
    """Already a Bedrock/Vertex id (or an ARN): send it unchanged."""
    return any(marker in model for marker in _NATIVE_MARKERS)


def bedrock_model_id(model: str) -> str:
    if is_native_id(model):
        return model
    return BEDROCK_MODEL_IDS.get(model, f"anthropic.{model}" if model.startswith("claude-") else model)


def vertex_model_id(model: str) -> str:
    if is_native_id(model):
        return model
    return VERTEX_MODEL_IDS.get(model, model)


def module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def check_dependencies(
    provider: str, environ: Mapping[str, str], *, vertex_token: bool = False, bedrock_key: bool = False
) -> None:
    """Refuse to start when the provider's optional dependencies are missing: say which extra."""
    missing: list[str] = []
    if provider == "bedrock":
        # botocore decodes Bedrock's event-stream framing; boto3 resolves AWS credentials for SigV4.
        missing = [m for m in ("botocore",) if not module_available(m)]
        if not (bedrock_key or environ.get("AWS_BEARER_TOKEN_BEDROCK")) and not module_available("boto3"):
            missing.append("boto3")
    elif provider == "vertex" and not (vertex_token or environ.get("MCP_BACKFILL_VERTEX_ACCESS_TOKEN")):
        missing = [] if module_available("google.auth") else ["google-auth"]
    if missing:
        # A ready credential spares the package that only fetches or signs with credentials (not botocore).
        spared = _READY_CREDENTIALS.get(provider, ("", ""))
        raise ConfigError(
            f"--provider {provider} needs {' and '.join(missing)}: "
            f"install it with `pip install 'mcp-backfill[{provider}]'`"
            + (spared[1] if missing == [spared[0]] else "")
        )


# Per provider, the package only its own fetching or signing of credentials needs, and what spares it.
_READY_CREDENTIALS = {
    "vertex": (
        "google-auth",
        " (or set MCP_BACKFILL_VERTEX_ACCESS_TOKEN to skip Application Default Credentials)",
    ),
    "bedrock": ("boto3", " (or set AWS_BEARER_TOKEN_BEDROCK, a Bedrock API key, to skip SigV4 signing)"),
}


def make_client(
    settings: ProviderSettings,
    environ: Mapping[str, str] | None = None,
    *,
    http_client: httpx2.AsyncClient | None = None,
) -> anthropic.AsyncAnthropic | anthropic.AsyncAnthropicBedrock | anthropic.AsyncAnthropicVertex:
    """The SDK client for `settings.name`, with the SDK's own retries off (the proxy retries), over
    `http_client` (default: a new `api_http_client()`)."""
    environ = os.environ if environ is None else environ
    http_client = api_http_client() if http_client is None else http_client
    headers = dict(settings.headers)
    # The SDK's read timeout is a second line of defence; the sampling deadline normally acts first.
    timeout = settings.retry.deadline or 600.0
    if settings.name == "bedrock":
        key = settings.bedrock_api_key
        check_dependencies("bedrock", environ, bedrock_key=key is not None)
        try:
            return anthropic.AsyncAnthropicBedrock(
                api_key=key,  # (None: SigV4; the SDK would read AWS_BEARER_TOKEN_BEDROCK as it is)
                max_retries=0,
                timeout=timeout,
                default_headers=headers or None,
                http_client=http_client,
            )
        except ValueError as exc:  # no region
            raise ConfigError(f"--provider bedrock: {exc}") from None
    if settings.name == "vertex":
        token = settings.vertex_access_token
        check_dependencies("vertex", environ, vertex_token=token is not None)
        if token is not None and not environ.get("ANTHROPIC_VERTEX_PROJECT_ID"):
            # Application Default Credentials name a project; a ready token does not.
            raise ConfigError(
                "--provider vertex with MCP_BACKFILL_VERTEX_ACCESS_TOKEN needs ANTHROPIC_VERTEX_PROJECT_ID "
                "(the Google Cloud project to call Claude in): a ready token names no project"
            )
        try:
            return anthropic.AsyncAnthropicVertex(
                access_token=token,
                max_retries=0,
                timeout=timeout,
                default_headers=headers or None,
                http_client=http_client,
            )
        except ValueError as exc:  # no region
            raise ConfigError(f"--provider vertex: {exc}") from None
    if settings.api_key is None:  # Config refuses this already; kept for the type checker
        raise ConfigError("ANTHROPIC_API_KEY is required by the anthropic provider")
    return anthropic.AsyncAnthropic(
        api_key=settings.api_key,
        base_url=settings.base_url,
        max_retries=0,
        timeout=timeout,
        default_headers=headers or None,
        http_client=http_client,
    )
