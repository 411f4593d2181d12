"""`python -m benchmarks` (what `scripts/bench` runs)."""

import sys

from benchmarks.cli import main

sys.exit(main())
