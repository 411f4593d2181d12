"""`HandedOver`: what the lane held for a request it handed to the app, let go of once."""

from __future__ import annotations

import gc
import weakref
from typing import Any, cast

from mcp_backfill.sidecar.lane import HandedOver


class _Lane:
    def __init__(self) -> None:
        self.released = 0

    def release(self) -> None:
        self.released += 1


def test_the_lane_is_let_go_of_once_and_then_no_longer_referred_to() -> None:
    """The request's scope holds the `HandedOver`, and the lane the request: were the lane still
    referred to once released, every request handed over would be garbage only the collector frees."""
    lane = _Lane()
    handed = HandedOver(cast(Any, None), cast(Any, None), lane.release)
    seen = weakref.ref(lane)
    gc.disable()
    try:
        handed.release()
        assert lane.released == 1
        del lane
        assert seen() is None
        handed.release()  # the handler's `finally` after some other release: nothing more
    finally:
        gc.enable()
