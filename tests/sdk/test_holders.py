"""Holds in the tests' own process: the locks this process and its children take on real SDK
folders, read back from /proc as the holders an uninstall names; the exclusive lock of an
uninstall or a reinstall, and a hold of an SDK removed or replaced while it was being set up.
(test_holds.py runs the same through `qnnctl lower` pipelines and real commands.)"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from qnnctl.errors import IntegrityError, QnnctlError
from qnnctl.run.environment import resolve_and_hold
from qnnctl.sdk import holds
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.holds import (
    HeldError,
    Holder,
    describe_holders,
    exclusive,
    held_and_removed,
    held_by,
    hold_sdk,
    holders_of,
)
from qnnctl.sdk.lockfile import LockedSdk, write_lock
from tests.conftest import require_tool
from tests.sdkfactory import OTHER_VERSION, VERSION, build_sdk_tree, install_tree_into_cache

# A child that sleeps until it is ended; its arguments follow, for its command line. Its command
# line is read once Popen returns, which is after the exec.
SLEEPER = "import time; time.sleep(120)"


def _own_command(pid: int) -> str:
    """Process `pid`'s command line as a holder shows it (cut at 120 columns: see the tests below)."""
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        words = handle.read().rstrip(b"\0").split(b"\0")
    text = shlex.join(word.decode() for word in words)
    return text if len(text) <= 120 else text[:117] + "..."


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


@contextmanager
def _locked(path: Path, operation: int = fcntl.LOCK_SH) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, operation)
        yield fd
    finally:
        os.close(fd)


@contextmanager
def _child(tmp_path: Path, *args: str, fds: tuple[int, ...] = ()) -> Iterator[subprocess.Popen[bytes]]:
    """A Python child that has inherited `fds`, ended when the block ends."""
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, *args], pass_fds=fds)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _can_lock(path: Path, operation: int) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


# -- who holds an SDK -------------------------------------------------------------------------


def test_a_holder_is_described_by_its_pid_and_command() -> None:
    assert Holder(12, "sh -c 'ls x'").describe() == "PID 12 (sh -c 'ls x')"
    assert Holder(12, "").describe() == "PID 12"
    assert describe_holders([Holder(12, "sh"), Holder(13, "")]) == "PID 12 (sh), PID 13"
    assert describe_holders([]) == "another process"


@pytest.mark.parametrize("doing", ["removed", "replaced"])
def test_a_held_sdk_is_said_with_its_holders_and_how_to_wait(tmp_path: Path, doing: str) -> None:
    error = HeldError(VERSION, tmp_path, [Holder(12, "sh"), Holder(13, "")], doing)
    assert str(error) == f"SDK {VERSION} ({tmp_path}) is in use by PID 12 (sh), PID 13; it was not {doing}"
    wait = "the same `qnnctl install` with --wait" if doing == "replaced" else f"`qnnctl uninstall --wait {VERSION}`"
    assert error.hint == f"run it again once that process has ended, or {wait} to wait for it"
    assert (error.version, error.root, error.holders) == (VERSION, tmp_path, [Holder(12, "sh"), Holder(13, "")])
    assert isinstance(error, QnnctlError)


def test_a_free_folder_and_a_missing_one_have_no_holders(cache: Cache) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    assert holders_of(root) == []
    assert held_by(cache, VERSION) == []
    assert holders_of(cache.root / "nothing") == []
    with _locked(root / "lib"):  # a lock on another folder holds not this one
        assert holders_of(root) == []


def test_this_process_holding_an_sdk_is_named_with_its_command(cache: Cache) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    other = install_tree_into_cache(cache.root, OTHER_VERSION)
    with _locked(root):
        assert holders_of(root) == [Holder(os.getpid(), _own_command(os.getpid()))]
        assert held_by(cache, VERSION) == [Holder(os.getpid(), _own_command(os.getpid()))]
        assert held_by(cache, OTHER_VERSION) == []
        assert holders_of(other) == []
    assert holders_of(root) == []


def test_the_processes_that_share_a_hold_are_named_each_in_order(cache: Cache, tmp_path: Path) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    with _locked(root) as fd:
        os.set_inheritable(fd, True)
        with _child(tmp_path, "first", fds=(fd,)) as one, _child(tmp_path, "second", fds=(fd,)) as two:
            os.set_inheritable(fd, False)
            named = holders_of(root)
            assert [h.pid for h in named] == sorted([os.getpid(), one.pid, two.pid])
            commands = {h.pid: h.command for h in named}
            assert commands[one.pid] == shlex.join([sys.executable, "-c", SLEEPER, "first"])
    assert holders_of(root) == []


def test_a_hold_handed_on_is_named_by_who_keeps_it_not_who_took_it(cache: Cache, tmp_path: Path) -> None:
    """A pipeline inherits the descriptor of `qnnctl lower`'s hold: /proc/locks names the one that
    took the lock, the descriptors name those that still hold it."""
    root = install_tree_into_cache(cache.root, VERSION)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    with _child(tmp_path, fds=(fd,)) as child:
        os.close(fd)
        assert [h.pid for h in holders_of(root)] == [child.pid]


def test_a_process_waiting_for_a_lock_holds_nothing(cache: Cache, tmp_path: Path) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    waiting = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
               "open(sys.argv[2], 'w').close(); fcntl.flock(fd, fcntl.LOCK_EX)")
    with _locked(root):
        started = tmp_path / "waiter"
        proc = subprocess.Popen([sys.executable, "-c", waiting, str(root), str(started)])
        try:
            _wait_for(started)
            deadline = time.monotonic() + 30
            while " -> " not in Path("/proc/locks").read_text() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert holders_of(root) == [Holder(os.getpid(), _own_command(os.getpid()))]
        finally:
            proc.kill()
            proc.wait()


def test_a_long_command_is_cut_and_its_control_characters_escaped(cache: Cache, tmp_path: Path) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    with _locked(root) as fd:
        os.set_inheritable(fd, True)
        with _child(tmp_path, "a\tb\x1b", "é", os.fsdecode(b"caf\xe9"), "C:\\", "X", fds=(fd,)) as short, \
                _child(tmp_path, "x" * 200, fds=(fd,)) as long:
            commands = {h.pid: h.command for h in holders_of(root)}
    said = shlex.join([sys.executable, "-c", SLEEPER, "a\tb\x1b", "é", "caf\ufffd", "C:\\", "X"])  # not UTF-8: replaced
    assert commands[short.pid] == said.replace("\t", "\\t").replace("\x1b", "\\x1b")
    whole = shlex.join([sys.executable, "-c", SLEEPER, "x" * 200])
    assert commands[long.pid] == whole[:117] + "..."
    assert len(commands[long.pid]) == 120


def test_a_command_of_exactly_the_width_is_not_cut(cache: Cache, tmp_path: Path) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    prefix = shlex.join([sys.executable, "-c", SLEEPER, ""])[:-2]
    pad = 120 - len(prefix)
    if pad < 1:
        pytest.skip("the test's own command line is longer than the width")
    with _locked(root) as fd:
        os.set_inheritable(fd, True)
        with _child(tmp_path, "y" * pad, fds=(fd,)) as child:
            commands = {h.pid: h.command for h in holders_of(root)}
    assert commands[child.pid] == prefix + "y" * pad
    assert len(commands[child.pid]) == 120


# A holder that blanks its own command line (as daemons that rename themselves do): it takes a
# shared lock on argv[1], zeroes its arguments in place, says so on stdout and sleeps.
BLANKER = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0 || flock(fd, LOCK_SH) != 0) return 1;
    char *end = argv[argc - 1] + strlen(argv[argc - 1]);
    memset(argv[0], 0, (size_t)(end - argv[0]));
    puts("ready");
    fflush(stdout);
    sleep(120);
    return 0;
}
"""


def test_a_holder_whose_command_line_is_blank_is_named_by_its_pid_alone(cache: Cache, tmp_path: Path) -> None:
    cc = require_tool("cc")
    (tmp_path / "blanker.c").write_text(BLANKER)
    subprocess.run([cc, "-o", str(tmp_path / "blanker"), str(tmp_path / "blanker.c")], check=True)
    root = install_tree_into_cache(cache.root, VERSION)
    proc = subprocess.Popen([str(tmp_path / "blanker"), str(root)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        assert Path(f"/proc/{proc.pid}/cmdline").read_bytes().strip(b"\0") == b""
        assert holders_of(root) == [Holder(proc.pid, "")]
        assert describe_holders(holders_of(root)) == f"PID {proc.pid}"
    finally:
        proc.kill()
        proc.wait()


def test_a_lock_taken_through_another_name_of_a_file_is_named_as_proc_locks_names_it(tmp_path: Path) -> None:
    """Only /proc/locks says who holds a lock whose descriptors name the file otherwise (another
    hard link of it here; another user's descriptors, which cannot be read, likewise)."""
    one = tmp_path / "one"
    one.write_text("")
    two = tmp_path / "two"
    os.link(one, two)
    fd = os.open(one, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        assert holders_of(two) == [Holder(os.getpid(), _own_command(os.getpid()))]
    finally:
        os.close(fd)
    assert holders_of(two) == []


# -- an uninstall's or a reinstall's exclusive lock -------------------------------------------


def test_exclusive_on_a_free_sdk_keeps_everyone_out_until_it_ends(cache: Cache) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    with exclusive(VERSION, root, "removed"):
        assert not _can_lock(root, fcntl.LOCK_SH)
    assert _can_lock(root, fcntl.LOCK_EX)


def test_exclusive_on_a_folder_not_there_does_what_it_guards(cache: Cache) -> None:
    ran = []
    with exclusive(VERSION, cache.root / "sdks" / VERSION, "removed"):
        ran.append(True)
    assert ran == [True]


@pytest.mark.parametrize("doing", ["removed", "replaced"])
def test_exclusive_on_a_held_sdk_names_its_holders_and_does_nothing(cache: Cache, doing: str) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    ran = []
    with _locked(root), pytest.raises(HeldError) as raised:
        with exclusive(VERSION, root, doing):
            ran.append(True)
    assert ran == []
    assert raised.value.holders == [Holder(os.getpid(), _own_command(os.getpid()))]
    assert str(raised.value).endswith(f"; it was not {doing}")
    assert raised.value.__cause__ is None
    assert raised.value.__cause__ is None
    assert raised.value.__context__ is None or raised.value.__suppress_context__  # no EWOULDBLOCK shown with it
    assert _can_lock(root, fcntl.LOCK_EX)  # its own descriptor was closed


def test_exclusive_that_waits_goes_on_once_the_holder_has_let_go(cache: Cache) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    let_go = threading.Timer(0.3, os.close, (fd,))
    let_go.start()
    began = time.monotonic()
    with exclusive(VERSION, root, "removed", wait=True):
        assert time.monotonic() - began >= 0.25
        assert not _can_lock(root, fcntl.LOCK_SH)
    let_go.join()
    assert _can_lock(root, fcntl.LOCK_EX)


# -- a hold: on the folder found, checked again once held ------------------------------------


def test_a_hold_is_a_shared_lock_on_the_sdks_folder(cache: Cache) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    fd = hold_sdk(root, cache)
    assert fd is not None
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(root))
        assert not os.get_inheritable(fd)
        assert _can_lock(root, fcntl.LOCK_SH)
        assert not _can_lock(root, fcntl.LOCK_EX)
        assert holders_of(root) == [Holder(os.getpid(), _own_command(os.getpid()))]
    finally:
        os.close(fd)


def test_a_folder_outside_the_cache_is_held_without_a_manifest(tmp_path: Path, cache: Cache) -> None:
    root = build_sdk_tree(tmp_path / "store" / VERSION)
    fd = hold_sdk(root, cache)
    assert fd is not None
    os.close(fd)


def test_an_sdk_of_the_cache_without_its_manifest_is_not_held(cache: Cache) -> None:
    """A folder of the cache with no manifest is one an uninstall or an install is moving."""
    root = install_tree_into_cache(cache.root, VERSION)
    (root / ".qnnctl.json").unlink()
    with pytest.raises(QnnctlError) as raised:
        hold_sdk(root, cache)
    assert str(raised.value) == f"SDK {VERSION} was removed from qnnctl's cache while it was being set up"
    assert raised.value.hint == "run the same command again, which installs it again"
    assert _can_lock(root, fcntl.LOCK_EX)  # nothing left held


def test_a_folder_removed_before_it_was_held_is_said_by_its_path(tmp_path: Path, cache: Cache) -> None:
    root = tmp_path / "store" / VERSION
    with pytest.raises(QnnctlError) as raised:
        hold_sdk(root, cache)
    assert str(raised.value) == f"SDK {root} was removed from {root} while it was being set up"


def test_a_hold_waits_for_a_lock_held_past_its_time_then_names_who_holds_it(
        cache: Cache, monkeypatch: pytest.MonkeyPatch) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    monkeypatch.setattr(holds, "HOLD_WAIT", 1.0)
    with _locked(root, fcntl.LOCK_EX):
        started = time.monotonic()
        with pytest.raises(QnnctlError) as raised:
            hold_sdk(root, cache)
        waited = time.monotonic() - started
    assert str(raised.value) == (f"the SDK at {root} is locked by PID {os.getpid()} ({_own_command(os.getpid())}) "
                                 "for longer than 1 s; it was not used")
    assert raised.value.hint == ("let that process end (an uninstall or `install --force` of it), then run the "
                                 "same command again")
    assert waited >= 1.0


def test_a_hold_is_taken_soon_after_the_lock_it_waited_for_is_let_go(cache: Cache) -> None:
    """A hold waits in short steps: an SDK moved in a moment is used a moment later."""
    root = install_tree_into_cache(cache.root, VERSION)
    result: list[object] = []
    taken: list[float] = []

    def hold() -> None:
        result.append(_try_hold(root, cache))
        taken.append(time.monotonic())

    with _locked(root, fcntl.LOCK_EX):
        holding = threading.Thread(target=hold)
        holding.start()
        time.sleep(0.3)
        released = time.monotonic()
    holding.join(30)
    [fd] = result
    assert isinstance(fd, int)
    os.close(fd)
    assert taken[0] - released < 0.5


def test_an_sdk_removed_while_a_hold_waited_is_not_held(cache: Cache) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    result: list[object] = []
    with _locked(root, fcntl.LOCK_EX):
        holding = threading.Thread(target=lambda: result.append(_try_hold(root, cache)))
        holding.start()
        time.sleep(0.2)
        shutil.rmtree(root)
    holding.join(30)
    assert isinstance(result[0], QnnctlError)
    assert str(result[0]) == f"SDK {VERSION} was removed from qnnctl's cache while it was being set up"


def _try_hold(root: Path, cache: Cache) -> int | QnnctlError | None:
    try:
        return hold_sdk(root, cache)
    except QnnctlError as exc:
        return exc


def test_an_sdk_replaced_while_a_hold_waited_is_held_at_its_new_folder(cache: Cache) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    result: list[object] = []
    with _locked(root, fcntl.LOCK_EX):
        holding = threading.Thread(target=lambda: result.append(_try_hold(root, cache)))
        holding.start()
        time.sleep(0.2)
        root.rename(cache.root / "aside")
        install_tree_into_cache(cache.root, VERSION)
    holding.join(30)
    [fd] = result
    assert isinstance(fd, int)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(root))
    finally:
        os.close(fd)


def test_an_sdk_replaced_again_and_again_is_given_up_after_three_tries(cache: Cache,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Each time the hold is granted, the folder at the path is another: the third time, no more."""
    root = install_tree_into_cache(cache.root, VERSION)
    real = fcntl.flock
    granted: list[int] = []

    def replacing(fd: int, operation: int) -> None:
        real(fd, operation)
        granted.append(fd)
        aside = cache.root / f"aside-{len(granted)}"
        root.rename(aside)
        shutil.copytree(aside, root, symlinks=True)

    monkeypatch.setattr(fcntl, "flock", replacing)
    with pytest.raises(QnnctlError, match="was removed from qnnctl's cache"):
        hold_sdk(root, cache)
    assert len(granted) == 3


# -- a held SDK removed by hand ----------------------------------------------------------------


def test_a_held_sdk_removed_by_hand_is_found_with_its_holders(cache: Cache, tmp_path: Path) -> None:
    removed = install_tree_into_cache(cache.root, VERSION)
    kept = install_tree_into_cache(cache.root, OTHER_VERSION)
    assert held_and_removed(cache) == {}
    with _locked(removed), _locked(removed), _locked(kept):
        shutil.rmtree(removed)
        assert held_and_removed(cache) == {VERSION: [Holder(os.getpid(), _own_command(os.getpid()))]}
    assert held_and_removed(cache) == {}


def test_a_hold_on_a_descriptor_numbered_after_one_that_closed_is_found(cache: Cache) -> None:
    """The listing of this process's descriptors names the one that listing opened, closed by the
    time it is read: the descriptors after it are read all the same."""
    root = install_tree_into_cache(cache.root, VERSION)
    low = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(low, fcntl.LOCK_SH)
    high = os.dup2(low, 900, inheritable=False)  # numbered after any descriptor a listing opens
    os.close(low)
    try:
        shutil.rmtree(root)
        assert held_and_removed(cache) == {VERSION: [Holder(os.getpid(), _own_command(os.getpid()))]}
    finally:
        os.close(high)


def test_a_removed_sdk_open_without_a_lock_is_not_held(cache: Cache) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        shutil.rmtree(root)
        assert held_and_removed(cache) == {}
    finally:
        os.close(fd)


def test_a_removed_folder_inside_an_sdk_is_no_sdk(cache: Cache) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    with _locked(root / "lib"):
        shutil.rmtree(root / "lib")
        assert held_and_removed(cache) == {}


def test_a_held_folder_removed_outside_the_cache_is_not_its_sdk(tmp_path: Path, cache: Cache) -> None:
    install_tree_into_cache(cache.root, VERSION)
    outside = build_sdk_tree(tmp_path / "store" / VERSION)
    with _locked(outside):
        shutil.rmtree(outside)
        assert held_and_removed(cache) == {}


def test_several_processes_holding_a_removed_sdk_are_each_named(cache: Cache, tmp_path: Path) -> None:
    root = install_tree_into_cache(cache.root, VERSION)
    with _locked(root) as fd:
        os.set_inheritable(fd, True)
        with _child(tmp_path, fds=(fd,)) as child:
            shutil.rmtree(root)
            found = held_and_removed(cache)
    assert sorted(h.pid for h in found[VERSION]) == sorted([os.getpid(), child.pid])
    assert list(found) == [VERSION]


# -- held, then checked against the project's lock ---------------------------------------------


def _with_archive(root: Path, sha256: str) -> None:
    """What an install of an archive with this sha256 records in the SDK's manifest."""
    manifest = root / ".qnnctl.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "sha256": sha256, "size": 1}))


class _Waiting(logging.Handler):
    """Set once a hold says it waits for the lock of a move."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("waiting for "):
            self.seen.set()


def test_an_sdk_replaced_while_its_hold_waited_is_checked_against_the_lock(cache: Cache, tmp_path: Path) -> None:
    """`lower` and `setup_sdk()` hold the SDK, then check it against the project's lock: a
    reinstall of another archive that holds the folder when they look (its exclusive lock) and
    puts its own in place is refused once the hold is granted, not used unchecked."""
    root = install_tree_into_cache(cache.root, VERSION)
    _with_archive(root, "a" * 64)
    project = tmp_path / "project"
    project.mkdir()
    lock = project / "qnnctl.lock"
    write_lock(lock, LockedSdk(path=lock, version=VERSION, sha256="a" * 64, size=1), "Pinned.")
    environ = {"QNNCTL_CACHE_DIR": str(cache.root)}
    _, sdk, fd = resolve_and_hold(VERSION, environ, project, cache, allow_install=False)
    assert sdk is not None
    assert sdk.root == root  # the locked archive's SDK is used
    assert fd is not None
    os.close(fd)

    result: list[object] = []

    def resolve() -> None:
        try:
            result.append(resolve_and_hold(VERSION, environ, project, cache, allow_install=False))
        except QnnctlError as exc:
            result.append(exc)

    waiting = _Waiting()
    logger = logging.getLogger(holds.__name__)
    logger.addHandler(waiting)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with _locked(root, fcntl.LOCK_EX):
            resolving = threading.Thread(target=resolve)
            resolving.start()
            assert waiting.seen.wait(30), "the hold never waited"
            root.rename(cache.root / "aside")
            install_tree_into_cache(cache.root, VERSION)
            _with_archive(root, "b" * 64)
    finally:
        logger.removeHandler(waiting)
        logger.setLevel(level)
    resolving.join(30)
    [refused] = result
    assert isinstance(refused, IntegrityError), refused
    assert f"qnnctl.lock pins {'a' * 64}" in str(refused)
    assert holders_of(root) == []  # no hold is left on the folder it refused
