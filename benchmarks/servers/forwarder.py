"""The floor for anything placed between a client and a stdio server: `forwarder.py COMMAND...`.

Starts COMMAND and copies bytes both ways with two blocking threads: no parsing, no event loop.
The 1a scenario times it next to the proxy, so "added µs" can be read against what the extra
process and pipe hops alone cost on the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from contextlib import suppress


def pump(source: int, target: int) -> None:
    while data := os.read(source, 1 << 18):
        view = memoryview(data)
        while view:
            view = view[os.write(target, view) :]
    os.close(target)


def main() -> int:
    child = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    assert child.stdin is not None
    assert child.stdout is not None
    threading.Thread(target=pump, args=(child.stdout.fileno(), 1), daemon=True).start()
    with suppress(BrokenPipeError):
        pump(0, child.stdin.fileno())
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
