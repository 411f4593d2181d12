"""What in a URL or a header is a credential, and a URL without its credentials for messages.

Credentials are found by name (`CREDENTIAL_NAME`): an upstream header, or a URL query parameter,
named like one holds one (a query parameter also under a few names of its own,
`CREDENTIAL_QUERY_NAMES`). Every credential found is kept out of logs and errors like the API key.

A command's arguments are shown with their credentials masked (`shown_args`): the upstream command
in the proxy's log and `check`, and a config's entries in `mcp-backfill clients`. There a name counts
as a credential's when one of its words (`api_key`, `apiKey`, `X-Api-Key` all have `key`) is a
credential word and its last word does not say it names a file or an identifier
(`ANTHROPIC_API_KEY_FILE` is a path, shown).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from urllib.parse import unquote, unquote_plus, urlsplit

# Names of upstream headers and URL query parameters whose values are credentials: kept out of the
# logs like the API key.
CREDENTIAL_NAME = re.compile(r"auth|token|key|secret|cookie|session|password", re.IGNORECASE)
# URL query parameters that hold a credential under another name: a signature (an Azure SAS's
# `sig`, a presigned URL's), the credential a presigned URL was signed with, an Azure Functions key
# (`code`, which a function's URL carries).
CREDENTIAL_QUERY_NAMES = frozenset(
    {
        "sig",
        "signature",
        "code",
        "x-amz-signature",
        "x-amz-credential",
        "x-goog-signature",
        "x-goog-credential",
    }
)

MASK = "***"
_WORDS = {
    "apikey",
    "auth",
    "authorization",
    "bearer",
    "cookie",
    "credential",
    "credentials",
    "key",
    "pass",
    "passwd",
    "password",
    "pat",
    "pwd",
    "secret",
    "token",
}
_NOT_SECRET = {"dir", "file", "id", "name", "path", "url"}
_ASSIGNMENT = re.compile(r"^(-{0,2}[A-Za-z0-9_.-]+)=(.+)$", re.DOTALL)
_HEADER = re.compile(r"^([A-Za-z0-9_-]+):\s*(.+)$", re.DOTALL)
_REFERENCE = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\bBearer\b|\bBasic\b")


def url_credentials(url: str) -> tuple[str, ...]:
    """The credentials in `url`: its password, and the values of query parameters named like one
    (redis-py takes `?password=`, and hands any other parameter, e.g. `ssl_password`, to its
    connection). Each as written and decoded, the form a client library may repeat in an error."""
    parts = urlsplit(url)
    found = [parts.password or "", *(_credential_value(piece) for piece in parts.query.split("&"))]
    return tuple(dict.fromkeys(each for value in found for each in (value, unquote_plus(value)) if each))


def url_secrets(url: str | None) -> tuple[str, ...]:
    """What in a URL the proxy connects to may be a credential (`--upstream-url`, an OTLP endpoint):
    `url_credentials`, a user name given alone (`https://TOKEN@host`), and the user information as
    it goes on the wire, `Authorization: Basic base64(user:password)`, which the server's error page
    may quote (the password is one decoding away)."""
    if not url:
        return ()
    parts = urlsplit(url)
    alone = parts.username if parts.password is None and parts.username else ""
    basic = ""
    if parts.username or parts.password:  # as httpx2 and the lean transport encode it
        userpass = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        basic = base64.b64encode(userpass.encode("utf-8", "surrogatepass")).decode()
    return tuple(dict.fromkeys(each for each in (alone, *url_credentials(url), basic) if each))


def hide_url_credentials(url: str) -> str:
    """`url` with `***` for each credential `url_credentials` finds, for messages and logs. Nothing
    else is parsed (a port that is not a number is shown as written)."""
    parts = urlsplit(url)
    cut = _cut_short(url, parts.netloc)
    if cut is not None:
        return hide_url_credentials(cut)
    userinfo, at, host = parts.netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    pieces = parts.query.split("&")
    query = [f"{piece.partition('=')[0]}=***" if _credential_value(piece) else piece for piece in pieces]
    if not colon and query == pieces:
        return url
    # Put together by hand: `urlunsplit` writes `unix:///x` (no host) as `unix:/x`.
    slashes = "//" if url.startswith(f"{parts.scheme}://") else ""
    rebuilt = f"{parts.scheme}:{slashes}{user}{colon and ':***'}{at}{host}{parts.path}"
    return (
        rebuilt
        + (f"?{'&'.join(query)}" if parts.query else "")
        + (f"#{parts.fragment}" if parts.fragment else "")
    )


def _cut_short(url: str, netloc: str) -> str | None:
    """`url` with `***` for a password holding an unencoded `/`, `?` or `#`, which ends the
    authority where urllib reads it (`redis://user:s3cr#et@host` has the host `user` and the port
    `s3cr`); None for another URL. Such an authority has no `@`, a port that is no number, and an
    `@` after it: all from its colon to the URL's last `@` is hidden (a URL no client can use)."""
    if "@" in netloc or ":" not in netloc.rpartition("]")[2]:
        return None
    port = netloc.rpartition("]")[2].rpartition(":")[2]
    before, found, after = url.partition(netloc)
    if port.isdigit() or not found or "@" not in after:
        return None
    return f"{before}{netloc.partition(':')[0]}:***@{after.rpartition('@')[2]}"


def _credential_value(piece: str) -> str:
    """The value of one `name=value` of a query if the name is a credential's, else ''."""
    name, _, value = piece.partition("=")
    name = unquote_plus(name)
    return value if CREDENTIAL_NAME.search(name) or name.lower() in CREDENTIAL_QUERY_NAMES else ""


def literal(value: str) -> bool:
    """Whether a credential's value holds the credential itself, not only references to where the
    client finds it (`${input:token}`, `Bearer ${GITHUB_TOKEN}`), which are shown."""
    return bool(_REFERENCE.sub("", value).strip())


def is_secret_name(name: str) -> bool:
    words = [
        word for word in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()) if word
    ]
    return bool(words) and words[-1] not in _NOT_SECRET and any(word in _WORDS for word in words)


def url_target(url: str) -> str:
    """A URL value masked where it may hold a credential: its user information, and the values of
    query parameters named like one."""
    hidden = hide_url_credentials(url)
    parts = urlsplit(hidden)
    if "@" in parts.netloc:
        hidden = parts._replace(netloc=f"{MASK}@{parts.netloc.rpartition('@')[2]}").geturl()
    return hidden


def masked_arg(arg: str) -> str:
    """One argument, masked where it holds a credential: a URL's, or a `name=value` (`Name: value`)
    whose name is a credential's; each also as the value of an option (`--db=postgres://user:pw@…`,
    `--header=Authorization: Bearer VALUE`, `--env=GITHUB_TOKEN=VALUE`)."""
    for pattern in (_ASSIGNMENT, _HEADER):
        match = pattern.match(arg)
        if match and is_secret_name(match.group(1)) and literal(match.group(2)):
            return arg[: match.start(2)] + MASK
    match = _ASSIGNMENT.match(arg)
    if match and match.group(1).startswith("-"):  # an option's value: masked as an argument of its own
        return arg[: match.start(2)] + masked_arg(match.group(2))
    if match and "://" in match.group(2):  # `DATABASE_URL=postgres://user:password@host/db`
        return arg[: match.start(2)] + url_target(match.group(2))
    return url_target(arg) if "://" in arg else arg


def shown_args(args: Sequence[str]) -> list[str]:
    """A command's arguments with the value of each credential option masked: `--api-key VALUE`,
    `--token=VALUE`, `-e GITHUB_TOKEN=VALUE`, `--header 'Authorization: Bearer VALUE'`, a URL's
    password."""
    shown: list[str] = []
    for index, arg in enumerate(args):
        previous = args[index - 1] if index else ""
        flag = previous.startswith("-") and "=" not in previous and is_secret_name(previous)
        shown.append(MASK if flag and not arg.startswith("-") and literal(arg) else masked_arg(arg))
    return shown
