"""qnnctl's own threads, and waiting for them through a Ctrl-C.

A thread is waited for through an Event it sets as it ends, never through Thread.join: before
Python 3.13 (3.11 here, at least), a join that a Ctrl-C interrupts can mark the thread as ended
while it still runs (CPython issue 90882), and whoever waited would go on while it still writes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable


def start_daemon(target: Callable[[], None], name: str) -> threading.Event:
    """Run `target` in a daemon thread named `name`; the Event it sets when it has ended."""
    ended = threading.Event()

    def run() -> None:
        try:
            target()
        finally:
            ended.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    return ended


def wait_ended(ended: Iterable[threading.Event], interrupt: Callable[[], None]) -> BaseException | None:
    """Wait until every thread has ended. An exception raised while waiting (a Ctrl-C) calls
    `interrupt`, which tells the threads to stop, and the waiting goes on: the first such
    exception is returned, for the caller to raise once nothing runs any more."""
    interrupted: BaseException | None = None
    for event in ended:
        while True:
            try:
                event.wait()
                break
            except BaseException as exc:
                interrupted = interrupted or exc
                interrupt()
    return interrupted
