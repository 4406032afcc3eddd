"""A response's body read as its bytes arrive, and the pace it must keep to be read on.

A read's timeout is met by a server that sends a byte a minute: every read gets its byte in
time, and the whole would never come, holding a download, and the version's lock, for ever.
So a body is read as its bytes land, not a block at a time (a read that waits to fill a block
waits for ever), and each piece is checked as it lands: against a pace (a whole download) or
a deadline (a range, qnnctl.net.ranged). What breaks off is resumed, as a dropped connection is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from qnnctl.net.failures import BodyBroke
from qnnctl.net.http import Response
from qnnctl.words import human_size


def blocks(response: Response, size: int, check: Callable[[int], None]) -> Iterator[bytes]:
    """The body in blocks of `size` (the last one shorter), read as the bytes arrive: `check` is
    told of each piece as it lands, after the block it completes is handed on, and may raise to
    break the body off.

    The bytes are those sent, never decoded: qnnctl asks for them as stored (`identity`), a body
    encoded all the same is not the archive and fails its checks, and what is resumed by offset
    and hashed is what came. No decompression bomb of a hostile server is ever inflated here."""
    block = bytearray()
    while piece := response.read1(size - len(block)):
        if len(piece) == size:  # a whole block at once, as most reads bring it: not copied again
            yield piece
        else:
            block += piece
            if len(block) == size:
                yield bytes(block)
                block.clear()
        check(len(piece))
    if block:
        yield bytes(block)


class TooSlow(BodyBroke):
    """A body that came slower than its pace."""


class Pace:
    """At least `least` bytes in every `window` seconds, as curl's --speed-limit and --speed-time:
    a body slower than that is broken off (TooSlow), to be resumed."""

    def __init__(self, least: int, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.least = least
        self.window = window
        self.clock = clock
        self.since = clock()
        self.got = 0

    def __call__(self, n: int) -> None:
        """Count `n` bytes that came; TooSlow when the window they close held fewer than `least`."""
        self.got += n
        now = self.clock()
        if now - self.since < self.window:
            return
        if self.got < self.least:
            raise TooSlow(f"less than {human_size(self.least)} came in {self.window:g} s")
        self.since = now
        self.got = 0
