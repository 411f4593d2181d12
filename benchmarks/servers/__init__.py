"""Upstream servers and floors the scenarios put behind or in place of the proxy (each run as its own
process)."""
