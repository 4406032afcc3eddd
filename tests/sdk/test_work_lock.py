"""The install lock (`qnnctl.sdk.work`): one installer per version across processes, held by
flock(2) on a file of the cache's `locks/`, dropped by the kernel with its holder.

Each holder here is another process (a Python, or the `filelock` package that qnnctl once used,
which takes the same flock and so still keeps an older qnnctl and this one apart)."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import qnnctl.sdk.work as work
from qnnctl.errors import QnnctlError
from qnnctl.sdk.cache import Cache
from tests.conftest import require_tool

HOLD = """
import sys
from pathlib import Path
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.work import version_lock
with version_lock(Cache(Path(sys.argv[1])), sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()
"""


def _holder(cache: Cache, key: str) -> subprocess.Popen[str]:
    """Another process that holds the lock of `key` until its stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(cache.root), key], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "held\n"
    return proc


def _release_later(proc: subprocess.Popen[str], seconds: float) -> threading.Event:
    """Tell the holder to end `seconds` from now; the event is set just before."""
    released = threading.Event()

    def release() -> None:
        released.set()
        assert proc.stdin is not None
        proc.stdin.close()

    threading.Timer(seconds, release).start()
    return released


def _free(cache: Cache, key: str) -> bool:
    with work.lock_if_free(cache, key) as free:
        return free


@pytest.fixture
def cache(tmp_path: Path) -> Cache:
    return Cache(tmp_path / "cache")


def test_a_lock_another_process_holds_is_not_free_until_it_ends(cache: Cache) -> None:
    proc = _holder(cache, "2.37.0.250724")
    try:
        assert not _free(cache, "2.37.0.250724")
        assert _free(cache, "2.36.0.250627")  # each version has a lock of its own
        assert (cache.locks / "2.37.0.250724.pid").read_text() == f"{proc.pid}\n"
    finally:
        proc.communicate("")
    assert proc.returncode == 0
    assert _free(cache, "2.37.0.250724")
    assert not (cache.locks / "2.37.0.250724.pid").exists()


def test_a_holder_killed_holds_nothing(cache: Cache) -> None:
    proc = _holder(cache, "file")
    assert not _free(cache, "file")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert _free(cache, "file")


def test_the_lock_is_taken_once_in_a_process_too(cache: Cache) -> None:
    """flock belongs to an open file, not to a process: a second look from the same process, as
    `clean` makes while an install of it runs, finds the lock taken."""
    with work.version_lock(cache, "2.37.0.250724"), work.lock_if_free(cache, "2.37.0.250724") as free:
        assert not free


def test_a_lock_held_by_the_filelock_package_is_respected(cache: Cache) -> None:
    """An older qnnctl, which took the same lock through `filelock`, and this one exclude each other."""
    from filelock import FileLock

    cache.locks.mkdir(parents=True)
    with FileLock(str(cache.lock_path("2.37.0.250724"))).acquire(timeout=5):
        assert not _free(cache, "2.37.0.250724")
    assert _free(cache, "2.37.0.250724")
    with work.lock_if_free(cache, "2.37.0.250724") as free:
        assert free
        from filelock import Timeout
        with pytest.raises(Timeout):
            FileLock(str(cache.lock_path("2.37.0.250724"))).acquire(timeout=0)


def test_a_wait_is_said_once_naming_the_holder_then_the_lock_is_taken(cache: Cache, caplog: pytest.LogCaptureFixture,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(work, "LOCK_WAIT_NOTICE", 0.3)
    proc = _holder(cache, "2.37.0.250724")
    released = _release_later(proc, 1.0)
    caplog.set_level(logging.INFO, logger="qnnctl.sdk.work")
    started = time.monotonic()
    with work.version_lock(cache, "2.37.0.250724", "staging the host runtime"):
        waited = time.monotonic() - started
        assert released.is_set()  # taken only once the holder was told to end
        assert (cache.locks / "2.37.0.250724.pid").read_text() == f"{os.getpid()}\n"
    proc.wait(timeout=30)  # reaped here, not by whoever waits for any child next
    assert waited >= 0.3
    assert [r.getMessage() for r in caplog.records] == [
        f"waiting for another qnnctl (process {proc.pid}) to finish staging the host runtime"]


def test_a_lock_free_within_the_notice_is_taken_without_a_word(cache: Cache, caplog: pytest.LogCaptureFixture) -> None:
    proc = _holder(cache, "2.37.0.250724")
    released = _release_later(proc, 0.2)
    caplog.set_level(logging.INFO, logger="qnnctl.sdk.work")
    with work.version_lock(cache, "2.37.0.250724"):
        assert released.is_set()
    proc.wait(timeout=30)
    assert caplog.records == []


def test_the_lock_file_is_never_writable_by_others(cache: Cache) -> None:
    old = os.umask(0)
    try:
        assert _free(cache, "2.37.0.250724")
    finally:
        os.umask(old)
    assert cache.lock_path("2.37.0.250724").stat().st_mode & 0o777 == 0o644


def test_a_lock_file_this_user_cannot_write_is_taken_all_the_same(tmp_path: Path) -> None:
    """In a shared cache another user made the lock file (0444 here): reading it is enough. As
    root, the taker is another user (root may write anywhere), whose folders must be reachable
    by it, which tmp_path (under a 0700 folder) is not."""
    as_root = os.geteuid() == 0
    prefix = [require_tool("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups"] if as_root else []
    shared = Path(tempfile.mkdtemp(prefix="qnnctl-shared-")) if as_root else tmp_path
    try:
        shared.chmod(0o755)
        cache = Cache(shared / "cache")
        cache.locks.mkdir(parents=True)
        path = cache.lock_path("2.37.0.250724")
        path.write_text("")
        path.chmod(0o444)
        script = ("import sys; from pathlib import Path; from qnnctl.sdk.cache import Cache; "
                  "from qnnctl.sdk.work import lock_if_free\n"
                  "with lock_if_free(Cache(Path(sys.argv[1])), '2.37.0.250724') as free: print(free)")
        taken = subprocess.run([*prefix, sys.executable, "-c", script, str(cache.root)], capture_output=True,
                               text=True, timeout=60)
        assert (taken.returncode, taken.stdout) == (0, "True\n"), taken.stderr
        assert path.read_text() == ""
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_the_command_that_clears_a_lock_in_the_way_is_quoted(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "a cache's folder")
    cache.locks.mkdir(parents=True)
    cache.lock_path("file").mkdir()
    with pytest.raises(QnnctlError) as raised:
        with work.lock_if_free(cache, "file"):
            pytest.fail("a lock taken on a folder")
    assert raised.value.hint is not None
    command = raised.value.hint.split("`")[1]
    assert shlex.split(command) == ["rm", str(cache.lock_path("file"))]


def test_a_link_in_the_locks_place_is_refused_and_not_followed(cache: Cache) -> None:
    """Whoever can write the cache's locks/ could put a link there to a file of the user's:
    opening the lock would then create or truncate that file."""
    cache.locks.mkdir(parents=True)
    victim = cache.root.parent / "victim"
    victim.write_text("precious\n")
    cache.lock_path("2.37.0.250724").symlink_to(victim)
    cache.lock_path("file").symlink_to(cache.root.parent / "made")
    for key in ("2.37.0.250724", "file"):
        with pytest.raises(QnnctlError) as raised:
            with work.version_lock(cache, key):
                pytest.fail("a lock taken through a link")
        assert str(raised.value) == f"cannot open the lock {cache.lock_path(key)} (a link)"
        assert raised.value.hint == (f"remove it (`rm {cache.lock_path(key)}`) if nothing else should be there, "
                                     "then run the same command again")
    assert victim.read_text() == "precious\n"
    assert not (cache.root.parent / "made").exists()
    assert not (cache.locks / "2.37.0.250724.pid").exists()


def test_a_fifo_or_a_folder_in_the_locks_place_is_refused_not_waited_on(cache: Cache) -> None:
    """Opening a FIFO to read waits for a writer: a lock that never comes, without a word."""
    cache.locks.mkdir(parents=True)
    os.mkfifo(cache.lock_path("2.37.0.250724"))
    cache.lock_path("file").mkdir()
    for key, why in (("2.37.0.250724", "not a file"), ("file", os.strerror(errno.EISDIR))):
        with pytest.raises(QnnctlError) as raised:
            with work.lock_if_free(cache, key):
                pytest.fail("a lock taken on what is not a file")
        assert str(raised.value) == f"cannot open the lock {cache.lock_path(key)} ({why})"
    assert stat.S_ISFIFO(cache.lock_path("2.37.0.250724").lstat().st_mode)


def test_the_process_id_beside_the_lock_is_never_written_through_a_link(cache: Cache) -> None:
    cache.locks.mkdir(parents=True)
    victim = cache.root.parent / "victim"
    victim.write_text("precious\n")
    (cache.locks / "2.37.0.250724.pid").symlink_to(victim)
    with work.version_lock(cache, "2.37.0.250724"):
        assert victim.read_text() == "precious\n"
    assert victim.read_text() == "precious\n"
    assert not (cache.locks / "2.37.0.250724.pid").is_symlink()  # the link itself removed with the lock


def test_a_fifo_for_the_process_id_is_neither_written_nor_read_waiting(cache: Cache, caplog: pytest.LogCaptureFixture,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a FIFO waits for the other end: the holder writing its id, the waiter reading it
    for its notice, would each wait for ever."""
    monkeypatch.setattr(work, "LOCK_WAIT_NOTICE", 0.2)
    cache.locks.mkdir(parents=True)
    os.mkfifo(cache.locks / "2.37.0.250724.pid")
    proc = _holder(cache, "2.37.0.250724")  # its id not written: no reader
    released = _release_later(proc, 0.6)
    caplog.set_level(logging.INFO, logger="qnnctl.sdk.work")
    with work.version_lock(cache, "2.37.0.250724", "mirroring it"):
        assert released.is_set()
    proc.wait(timeout=30)
    assert [r.getMessage() for r in caplog.records] == ["waiting for another qnnctl to finish mirroring it"]


@pytest.mark.parametrize("written", ["ended", "0", "-7", "x", "1"])
def test_the_notice_names_the_holder_only_while_that_process_runs(written: str, cache: Cache,
                                                                  caplog: pytest.LogCaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The process id beside the lock is the last holder's, or anything: named only when it is a
    process that runs now (process 1 always does)."""
    if written == "ended":
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        written = str(gone.pid)
    monkeypatch.setattr(work, "LOCK_WAIT_NOTICE", 0.1)
    cache.locks.mkdir(parents=True)
    held = os.open(cache.lock_path("2.37.0.250724"), os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(held, fcntl.LOCK_EX)  # another open file: another holder, in this process
    (cache.locks / "2.37.0.250724.pid").write_text(f"{written}\n")
    threading.Timer(0.4, os.close, args=(held,)).start()
    caplog.set_level(logging.INFO, logger="qnnctl.sdk.work")
    with work.version_lock(cache, "2.37.0.250724"):
        pass
    named = " (process 1)" if written == "1" else ""
    assert [r.getMessage() for r in caplog.records] == [f"waiting for another qnnctl{named} to finish installing "
                                                        "2.37.0.250724"]


def test_the_process_id_file_is_never_writable_by_others(cache: Cache) -> None:
    old = os.umask(0)
    try:
        with work.version_lock(cache, "2.37.0.250724"):
            assert (cache.locks / "2.37.0.250724.pid").stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)


def test_a_file_system_without_locks_is_named(cache: Cache, monkeypatch: pytest.MonkeyPatch) -> None:
    """flock(2) fails with ENOLCK where a file system keeps no locks (some network mounts): said as
    such, with where else to put the cache, rather than as an unexpected error."""
    def no_locks(fd: int, kind: int) -> bool:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(work, "try_flock", no_locks)
    with pytest.raises(QnnctlError) as raised:
        with work.lock_if_free(cache, "file"):
            pytest.fail("a lock taken where none can be")
    assert str(raised.value) == (f"cannot lock {cache.lock_path('file')} ({os.strerror(errno.ENOLCK)}): "
                                 "the cache's file system takes no locks")
    assert raised.value.hint == "set QNNCTL_CACHE_DIR to a folder on a local disk"
