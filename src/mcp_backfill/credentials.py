"""What in a URL or a header is a credential, and a URL without its credentials for messages.

Credentials are found by name (`CREDENTIAL_NAME`): an upstream header, or a URL query parameter,
named like one holds one. Every credential found is kept out of logs and errors like the API key.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus, urlsplit, urlunsplit

# Names of upstream headers and URL query parameters whose values are credentials: kept out of the
# logs like the API key.
CREDENTIAL_NAME = re.compile(r"auth|token|key|secret|cookie|session|password", re.IGNORECASE)


def url_credentials(url: str) -> tuple[str, ...]:
    """The credentials in `url`: its password, and the values of query parameters named like one
    (redis-py takes `?password=`, and hands any other parameter, e.g. `ssl_password`, to its
    connection). Each as written and decoded, the form a client library may repeat in an error."""
    parts = urlsplit(url)
    found = [parts.password or "", *(_credential_value(piece) for piece in parts.query.split("&"))]
    return tuple(dict.fromkeys(each for value in found for each in (value, unquote_plus(value)) if each))


def hide_url_credentials(url: str) -> str:
    """`url` with `***` for each credential `url_credentials` finds, for messages and logs. Nothing
    else is parsed (a port that is not a number is shown as written)."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    query = (
        f"{piece.partition('=')[0]}=***" if _credential_value(piece) else piece
        for piece in parts.query.split("&")
    )
    return urlunsplit(parts._replace(netloc=f"{user}{colon and ':***'}{at}{host}", query="&".join(query)))


def _credential_value(piece: str) -> str:
    """The value of one `name=value` of a query if the name is a credential's, else ''."""
    name, _, value = piece.partition("=")
    return value if CREDENTIAL_NAME.search(unquote_plus(name)) else ""
