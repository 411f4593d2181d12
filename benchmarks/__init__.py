"""Benchmarks: what the proxy costs, measured against a direct connection in the same run."""
