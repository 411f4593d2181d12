"""Upstream servers the scenarios put behind the proxy (run as scripts, not imported)."""
