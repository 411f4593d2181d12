"""Hypothesis profiles for the property tests (tests/unit/test_properties_*.py).

`ci` (the default) keeps the property files to a few seconds on two shared cores; `thorough` is for
a local hunt: `HYPOTHESIS_PROFILE=thorough .venv/bin/pytest -n 0 tests/unit/test_properties_*.py`.
No example database: nothing is written into the work tree, and failures print a reproduction blob.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=1000,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
