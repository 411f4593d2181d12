"""Loads `benchmarks/probe.py` into a sidecar started with this directory first on its PYTHONPATH
(by `benchmarks/critical_path.py`); does nothing unless a probe variable is set."""

import os
import sys

if os.environ.get("BENCH_PROBE_TRACE") or os.environ.get("BENCH_PROBE_SPIN"):
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    sys.path.insert(0, root)
    from benchmarks.probe import install

    install()
