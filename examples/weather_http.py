"""The weather example (weather_server.py) served over streamable HTTP at /mcp.

An HTTP upstream for `mcp-backfill serve --upstream-url` and for `mcp-backfill --upstream-url`; it is
the upstream service of compose.yaml. On loopback (the default) the SDK checks Host/Origin against
DNS rebinding by itself; on any other address give the Host values clients use, e.g.
`--host 0.0.0.0 --allowed-hosts weather:8000` on a container network.

    python examples/weather_http.py --port 8000
    mcp-backfill serve --provider mock --port 8080 --upstream-url http://127.0.0.1:8000/mcp
"""

import argparse

from mcp.server.transport_security import TransportSecuritySettings

from weather_server import server


def security_settings(allowed_hosts: str) -> TransportSecuritySettings | None:
    """None lets the SDK decide (it protects loopback binds); otherwise only the listed Hosts pass."""
    hosts = [item.strip() for item in allowed_hosts.split(",") if item.strip()]
    if not hosts:
        return None
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts)


def main() -> None:
    parser = argparse.ArgumentParser(description="The weather example MCP server over streamable HTTP.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    parser.add_argument(
        "--allowed-hosts",
        default="",
        help="comma-separated Host header values to accept (DNS-rebinding protection), e.g. weather:8000",
    )
    args = parser.parse_args()
    server.run(
        "streamable-http",
        host=args.host,
        port=args.port,
        transport_security=security_settings(args.allowed_hosts),
    )


if __name__ == "__main__":
    main()
