"""An upstream that records the environment it was started with, then serves as `echo_server.py`.

Run it as `python tests/servers/env_dump.py PATH`: it writes its whole environment to PATH as JSON
(atomically: a reader never sees half a file), then replaces itself with the echo server.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

target = Path(sys.argv[1])
partial = target.with_suffix(".partial")
partial.write_text(json.dumps(dict(os.environ)))
partial.replace(target)
echo = Path(__file__).with_name("echo_server.py")
os.execv(sys.executable, [sys.executable, str(echo)])
