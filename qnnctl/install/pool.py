"""Work shared out between threads and forked processes, as an extraction writes its files.

`in_threads()` runs jobs in threads of this process; `in_processes()` deals them out to forked
children (or threads, where this process may not fork) and collects their results, each child
dying with this process. `extraction_threads()` says how many workers an extraction uses.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import pickle
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, NoReturn, TypeVar

from qnnctl.threads import start_daemon, wait_ended

log = logging.getLogger("qnnctl.install.archive")

MIN_THREADS = 2
MAX_THREADS = 8
_T = TypeVar("_T")
_R = TypeVar("_R")
_STATUS_LOST = -1  # the wait status of a child that someone else reaped: no real one is negative


def proc_status(field: str) -> str | None:
    """One field of /proc/self/status (Linux), or None."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key == field:
                    return value.strip()
    except OSError:
        pass
    return None


class Stopped(Exception):
    """Another extraction thread failed, so this one stops early."""


def extraction_threads() -> int:
    """How many threads write files: inflating, checksums and file writes release the GIL, and
    creating many small files is mostly kernel time, which runs on every core."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(MIN_THREADS, min(cores, MAX_THREADS))


def in_threads(jobs: Iterable[_T], run: Callable[[_T, threading.Event], None], threads: int,
               stop: threading.Event | None = None) -> None:
    """Call `run(job, stop)` for each job in `threads` threads, this one included.

    The first failure sets `stop` and is raised here once every thread has finished: when
    this returns or raises, nothing is being written any more. Jobs are taken one at a time
    under a lock, so `jobs` may be a generator that waits for its next job.
    """
    pending = iter(jobs)
    take = threading.Lock()
    stop = stop or threading.Event()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            while not stop.is_set():
                with take:
                    job = next(pending, None)
                if job is None:
                    return
                run(job, stop)
        except Stopped:
            pass
        except BaseException as exc:  # raised again in the calling thread
            errors.append(exc)
            stop.set()

    helpers = [start_daemon(worker, f"qnnctl-extract-{i}") for i in range(threads - 1)]
    worker()
    interrupted = wait_ended(helpers, stop.set)  # Ctrl-C while waiting: stop the others, still wait
    if interrupted is not None:
        raise interrupted
    if errors:
        raise errors[0]


def in_processes(jobs: Sequence[_T], run: Callable[[_T, threading.Event], _R],
                 weight: Callable[[_T], int], workers: int) -> dict[_T, _R]:
    """`run(job, stop)` for every job, in `workers` processes when this one may fork; the
    results by job.

    Threads share one interpreter lock, and two threads that each make thousands of short
    system calls hand it back and forth thousands of times: on two cores, two processes
    extract 100 MB in 2,000 files in 0.16 s where two threads take 0.23 s. The jobs are
    dealt into shares of about equal weight; this process does the first, a forked child
    each of the others, and each child sends back its results (or its exception) through a
    pipe. A child dies with this process. Forking copies only the calling thread, so a
    process running other threads (an application that called the library) uses threads.
    Either way the heaviest jobs go first, so that no worker is left alone with one at the end.
    """
    jobs = sorted(jobs, key=weight, reverse=True)
    threads = proc_status("Threads")
    if workers < 2 or len(jobs) < 2 or threads != "1":
        if workers > 1 and len(jobs) > 1:
            log.debug("%d jobs in %d threads (this process runs %s threads)", len(jobs), workers, threads)
        results: dict[_T, _R] = {}
        in_threads(jobs, lambda job, stop: results.__setitem__(job, run(job, stop)), workers)
        return results
    shares: list[list[_T]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for job in jobs:
        lightest = loads.index(min(loads))
        shares[lightest].append(job)
        loads[lightest] += weight(job)
    log.debug("%d jobs in %d processes", len(jobs), workers)
    own = shares[0]
    children: list[_Child] = []
    failures: list[Exception] = []
    try:
        for share in shares[1:]:
            if share and not _Child.start(share, run, children):
                own = own + share  # the system refused a process: this one does that share too
        results = {job: run(job, threading.Event()) for job in own}
        for child in children:  # every child is waited for, whichever fails
            try:
                results.update(child.collect())
            except Exception as exc:
                failures.append(exc)
    finally:
        with _sigint_blocked():  # after a failure or Ctrl-C here: none keeps writing
            for child in children:
                child.kill()
    if failures:
        raise failures[0]
    return results


@contextmanager
def _sigint_blocked() -> Iterator[signal.Signals]:
    """Ctrl-C held back (delivered on leaving) while a child is forked, recorded or reaped:
    a KeyboardInterrupt in between would lose track of it, or raise in the child."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield signal.SIGINT
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class _Child:
    """A forked process running a share of `in_processes()`'s jobs."""

    def __init__(self, pid: int, result: int) -> None:
        self.pid = pid
        self.result = result  # the read end of the pipe that brings its results; -1 once closed
        self.status: int | None = None  # its wait status once reaped (_STATUS_LOST if not ours)

    @classmethod
    def start(cls, share: list[_T], run: Callable[[_T, threading.Event], _R], children: list[_Child]) -> bool:
        """Fork a child for `share` and add it to `children`; False when the system refuses."""
        parent = os.getpid()
        collecting = gc.isenabled()
        with _sigint_blocked():
            read_end, write_end = os.pipe()
            # The child never collects: it would run finalizers of this process's garbage.
            gc.disable()
            try:
                pid = os.fork()
            except OSError as exc:  # too many processes, or no memory for another
                log.debug("cannot start an extraction process: %s", exc)
                os.close(read_end)
                os.close(write_end)
                return False
            finally:
                if collecting and os.getpid() == parent:
                    gc.enable()
            if pid == 0:
                _child(share, run, parent, read_end, write_end)  # never returns
            os.close(write_end)
            children.append(cls(pid, read_end))
        return True

    def collect(self) -> dict[Any, Any]:
        """Wait for the child; its results, or its exception raised here."""
        chunks = []
        while chunk := os.read(self.result, 1 << 16):
            chunks.append(chunk)
        status = self._reap()
        try:
            # From our own child, through a pipe no one else holds.
            kind, value = pickle.loads(b"".join(chunks))  # noqa: S301
        except Exception:
            raise RuntimeError(f"an extraction process ended without a result ({_ended(status)})") from None
        if kind == "error":
            raise value
        return dict(value)

    def kill(self) -> None:
        """Stop and reap the child, unless it was collected already."""
        if self.status is None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)  # not reaped, so the pid is still its own
            self._reap()

    def _reap(self) -> int:
        # Its end of the pipe is closed: it is exiting, or killed. Ctrl-C waits for the
        # status to be recorded, so that a reaped pid (which another process may take
        # next) is never signalled.
        with _sigint_blocked():
            if self.result >= 0:
                os.close(self.result)
                self.result = -1
            try:
                _, self.status = os.waitpid(self.pid, 0)
            except ChildProcessError:  # reaped by someone else (an application's SIGCHLD handler)
                self.status = _STATUS_LOST
        return self.status


def _ended(status: int) -> str:
    """How a child ended, from its wait status, in words."""
    if status == _STATUS_LOST:
        return "its exit status went to another handler of SIGCHLD"
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def _child(share: list[_T], run: Callable[[_T, threading.Event], _R], parent: int, read_end: int,
           write_end: int) -> NoReturn:
    """A forked child's whole life: its share, then the results (or the exception) to the
    parent, then `os._exit`: nothing of the parent's code that called fork() runs again here.
    A signal that stops it before it sends anything leaves the parent no result, which it
    reports as such."""
    status = 1
    try:
        payload: tuple[str, Any]
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            os.close(read_end)
            _die_with(parent)
            stop = threading.Event()
            payload = ("ok", {job: run(job, stop) for job in share})
            status = 0
        except BaseException as exc:  # sent to the parent, which raises it
            payload = ("error", exc)
        _send(write_end, payload)
    finally:
        os._exit(status)


def _die_with(parent: int) -> None:
    """Have the kernel kill this (forked) process when its parent dies: a killed qnnctl
    leaves nothing writing into its work folder."""
    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(1)


def _send(fd: int, payload: tuple[str, Any]) -> None:
    try:
        data = pickle.dumps(payload)
        if payload[0] == "error":
            pickle.loads(data)  # noqa: S301 - an exception that pickles may still not unpickle
    except Exception:  # one that does not come back: its text still reaches the parent
        exc = payload[1]
        data = pickle.dumps(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.close(fd)

