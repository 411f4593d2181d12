"""`python -m mcp_backfill` is the same as the `mcp-backfill` command."""

import sys

from mcp_backfill.cli import main

sys.exit(main())
