"""What is wrong with the proxy variables of the environment, named without their values.

httpx2 reads `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY` when a client is built, and
fails there with its own error, which quotes the URL (credentials and all). Both HTTP clients the
proxy builds (the Claude API's, and the `--upstream-url` one's) name the variable instead.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx2

# The variables httpx2 takes proxies from (through `urllib.request.getproxies`, either case).
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")


def unusable_proxy_variables(environ: Mapping[str, str], client: str) -> str:
    """What is wrong with the proxy variables set in `environ`, by name and reason only; `client`
    says whose settings they are ("The Claude API client")."""
    problems: list[str] = []
    for name in (each for base in PROXY_VARIABLES for each in (base, base.lower())):
        value = environ.get(name)
        if not value:
            continue
        try:
            httpx2.AsyncHTTPTransport(proxy=value if "://" in value else f"http://{value}")
        except ImportError:
            problems.append(f"{name} names a SOCKS proxy, which needs socksio (`pip install socksio`)")
        except httpx2.InvalidURL:
            problems.append(f"{name} is not a valid proxy URL")
        except ValueError:
            problems.append(f"{name} has a scheme other than http, https, socks5 or socks5h")
    if not problems and any(environ.get(name) for name in ("NO_PROXY", "no_proxy")):
        problems.append("NO_PROXY (or no_proxy) lists a host httpx2 cannot read")
    found = (
        "; ".join(problems) or f"one of {', '.join(PROXY_VARIABLES)} or NO_PROXY (either case) cannot be used"
    )
    return f"{client} cannot use the proxy settings in the environment: {found}. Fix or unset it."
