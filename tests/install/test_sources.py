"""The door and an archive on disk as a source, in the tests' own process: an archive opened once
and read again only through that open file (or a private copy, when others could change it),
and the door's two moments, the whole archive and the tree written, against what is expected.
(test_door.py runs the same through installs and commands, as an attacker would.)"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from qnnctl.errors import IntegrityError, UsageError
from qnnctl.install import sources
from qnnctl.install.door import admit_archive, admit_listing, admit_tree, observed_tree
from qnnctl.install.sources import BLOCK, others_can_write, pinned_file
from qnnctl.sdk.gate import Expected
from qnnctl.sdk.members import tree_digests
from tests.conftest import require_tool
from tests.sdkfactory import build_sdk_tree

HTP = "lib/x86_64-linux-clang/libQnnHtp.so"


def _info(uid: int, mode: int) -> os.stat_result:
    return os.stat_result((stat.S_IFREG | mode, 1, 1, 1, uid, 0, 0, 0, 0, 0))


def _expected(**pins: object) -> Expected:
    return Expected("qnnctl.lock", "the lock", "pins", "mend the lock", **pins)  # type: ignore[arg-type]


# -- who could change a file ------------------------------------------------------------------


def test_a_file_of_this_user_or_roots_writable_by_them_alone_is_safe() -> None:
    me = os.geteuid()
    assert not others_can_write(_info(me, 0o644))
    assert not others_can_write(_info(0, 0o755))
    assert not others_can_write(_info(1234, 0o600), uid=1234)
    assert not others_can_write(_info(me, 0o600), uid=me)


def test_a_file_is_judged_for_the_user_qnnctl_runs_as(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run by an ordinary user (4321 here): that user's own file is safe, another's is not."""
    monkeypatch.setattr(os, "geteuid", lambda: 4321)
    assert not others_can_write(_info(4321, 0o644))
    assert others_can_write(_info(4322, 0o644))
    assert not others_can_write(_info(0, 0o644))


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o620, 0o602, 0o777])
def test_a_file_its_group_or_others_can_write_is_not(mode: int) -> None:
    assert others_can_write(_info(os.geteuid(), mode))
    assert others_can_write(_info(0, mode))


def test_a_file_of_another_user_is_not_safe_whatever_its_mode() -> None:
    assert others_can_write(_info(os.geteuid() + 1, 0o600))
    assert others_can_write(_info(1234, 0o400), uid=1235)
    assert others_can_write(_info(os.geteuid() + 4321, 0o600), uid=os.geteuid() + 4322)


# -- an archive opened once -------------------------------------------------------------------


def _archive(tmp_path: Path, data: bytes, mode: int = 0o644) -> Path:
    path = tmp_path / "downloads" / "v2.zip"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("size", [0, 1, BLOCK, BLOCK + 1, 2 * BLOCK + 17])
def test_an_own_archive_is_read_through_its_open_file(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    given = _archive(tmp_path, data)
    with pinned_file(given, tmp_path / "pinned") as pinned:
        assert (pinned.given, pinned.sha256, pinned.size, pinned.copied) == (
            given, hashlib.sha256(data).hexdigest(), size, False)
        assert pinned.path == tmp_path / "pinned" / "v2.zip"
        assert pinned.path.is_symlink()
        assert os.readlink(pinned.path).startswith("/proc/self/fd/")
        assert stat.S_IMODE((tmp_path / "pinned").stat().st_mode) == 0o700
        # Another archive renamed over the path given: the bytes hashed are still what is read.
        other = tmp_path / "downloads" / "evil.zip"
        other.write_bytes(b"evil")
        other.rename(given)
        assert pinned.path.read_bytes() == data
        fd = int(os.readlink(pinned.path).rsplit("/", 1)[1])
        assert not os.get_inheritable(fd)
    with pytest.raises(OSError, match="Bad file descriptor"):  # closed with the context
        os.fstat(fd)


@pytest.mark.parametrize("mode", [0o664, 0o666, 0o646])
@pytest.mark.parametrize("size", [0, BLOCK - 1, 2 * BLOCK + 17])
def test_an_archive_others_can_write_is_copied_as_it_is_hashed(tmp_path: Path, mode: int, size: int) -> None:
    data = os.urandom(size)
    given = _archive(tmp_path, data, mode)
    with pinned_file(given, tmp_path / "pinned") as pinned:
        assert (pinned.sha256, pinned.size, pinned.copied) == (hashlib.sha256(data).hexdigest(), size, True)
        assert pinned.path == tmp_path / "pinned" / "v2.zip"
        assert not pinned.path.is_symlink()
        assert stat.S_IMODE(pinned.path.stat().st_mode) == 0o600
        given.write_bytes(b"changed by another")
        assert pinned.path.read_bytes() == data


def test_a_copy_survives_writes_that_take_part_of_a_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """os.write may write less than it is given (a signal, a full pipe, some file systems)."""
    data = os.urandom(BLOCK + 5000)
    given = _archive(tmp_path, data, 0o666)
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, view: real_write(fd, view[:4096]))
    with pinned_file(given, tmp_path / "pinned") as pinned:
        monkeypatch.undo()
        assert pinned.path.read_bytes() == data
        assert pinned.sha256 == hashlib.sha256(data).hexdigest()


_WRITER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
print("open", flush=True)
sys.stdin.readline()
os.pwrite(fd, b"written through a descriptor opened before the chmod", 0)
print("written", flush=True)
sys.stdin.readline()
"""


def test_a_writer_from_before_a_chmod_gets_a_copy(tmp_path: Path) -> None:
    """A file made 0644 while another process still holds it open for writing (it was 0666 when
    that process opened it): the mode says no one else can write, the open descriptor can."""
    data = os.urandom(2 * BLOCK + 17)
    given = _archive(tmp_path, data, 0o666)
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(given)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        assert writer.stdin is not None
        assert writer.stdout.readline() == "open\n"
        given.chmod(0o644)
        with pinned_file(given, tmp_path / "pinned") as pinned:
            assert (pinned.sha256, pinned.copied) == (hashlib.sha256(data).hexdigest(), True)
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert writer.stdout.readline() == "written\n"
            assert given.read_bytes() != data
            assert pinned.path.read_bytes() == data
    finally:
        writer.kill()
        writer.wait()


def test_the_lease_that_tells_is_given_back(tmp_path: Path) -> None:
    """Asking whether anyone writes the file leaves no lease behind: a process that opens the
    archive for writing afterwards (or while it is read) is not made to wait for qnnctl."""
    # A lease left behind would be broken by the open below, with a SIGIO that ends this process.
    previous = signal.signal(signal.SIGIO, signal.SIG_IGN)
    try:
        given = _archive(tmp_path, os.urandom(1000))
        with pinned_file(given, tmp_path / "pinned") as pinned:
            assert not pinned.copied
            opening = "import os, sys; os.close(os.open(sys.argv[1], os.O_WRONLY))"
            opened = subprocess.run([sys.executable, "-c", opening, str(given)], timeout=10, check=False)
            assert opened.returncode == 0
    finally:
        signal.signal(signal.SIGIO, previous)


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOLCK, errno.EACCES])
def test_where_leases_cannot_tell_an_archive_is_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      code: int) -> None:
    """A file system without leases (some network ones), or a file this user does not own."""
    def no_lease(fd: int, command: int, arg: int = 0) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "fcntl", no_lease)
    data = os.urandom(BLOCK + 3)
    with pinned_file(_archive(tmp_path, data), tmp_path / "pinned") as pinned:
        assert pinned.copied
        assert pinned.path.read_bytes() == data


@pytest.mark.parametrize("folder", ["tmp", "/dev/shm", "/proc/self"])
def test_the_file_system_is_the_one_the_mount_table_names(tmp_path: Path, folder: str) -> None:
    """What each file is on, as util-linux's findmnt says it: ext4 here, tmpfs, proc."""
    findmnt = require_tool("findmnt")
    where = tmp_path if folder == "tmp" else Path(folder)
    path = where / "status" if folder == "/proc/self" else where / f"probe-{os.getpid()}"
    if folder != "/proc/self":
        path.write_bytes(b"x")
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            told = subprocess.run([findmnt, "-n", "-o", "FSTYPE", "--target", str(path)], capture_output=True,
                                  text=True, check=True).stdout.split()[0]
            assert sources.file_system(fd) == told.encode()
        finally:
            os.close(fd)
    finally:
        if folder != "/proc/self":
            path.unlink()


def test_a_kernel_without_mount_ids_in_fdinfo_tells_no_file_system(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux before 3.15 gives no mnt_id in /proc/self/fdinfo: nothing to look up, so no type."""
    real_open = open

    def old_kernel(path: object, *args: object, **kwargs: object) -> object:
        if str(path).startswith("/proc/self/fdinfo/"):
            return io.BytesIO(b"pos:\t0\nflags:\t0100000\n")
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    given = _archive(tmp_path, b"PK archive")
    fd = os.open(given, os.O_RDONLY)
    try:
        monkeypatch.setattr("builtins.open", old_kernel)
        assert sources.file_system(fd) is None
    finally:
        os.close(fd)


def test_a_file_system_that_cannot_be_told_counts_no_writers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without /proc's tables (or on a file system not known to count every writer), the bytes
    are copied as they are hashed."""
    data = os.urandom(BLOCK + 3)
    given = _archive(tmp_path, data)
    fd = os.open(given, os.O_RDONLY)
    try:
        assert sources.file_system(fd) in sources.WRITERS_COUNTED  # this machine's test folder
        assert sources.no_other_writer(fd)
        for told in (None, "overlay", "fuse.sshfs", "nfs4"):
            monkeypatch.setattr(sources, "file_system", lambda fd, told=told: told)
            assert not sources.no_other_writer(fd)
    finally:
        os.close(fd)
    real_open = open

    def no_proc(path: object, *args: object, **kwargs: object) -> object:
        if str(path).startswith("/proc/self/"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.undo()
    monkeypatch.setattr("builtins.open", no_proc)
    fd = os.open(given, os.O_RDONLY)
    try:
        assert sources.file_system(fd) is None
    finally:
        os.close(fd)
    monkeypatch.undo()
    with pinned_file(given, tmp_path / "pinned") as pinned:
        assert not pinned.copied


def test_without_proc_an_archive_is_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "_OPEN_FILES", tmp_path / "no-proc")
    data = b"PK archive"
    with pinned_file(_archive(tmp_path, data), tmp_path / "pinned") as pinned:
        assert pinned.copied
        assert not pinned.path.is_symlink()
        assert pinned.path.read_bytes() == data


def test_a_folder_given_as_an_archive_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as raised, pinned_file(tmp_path, tmp_path / "pinned"):
        pass
    assert str(raised.value) == f"{tmp_path} is not a file"
    assert raised.value.hint == "give the path of a downloaded SDK archive"
    assert not (tmp_path / "pinned").exists()


def test_a_missing_archive_is_a_usage_error_with_why(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.zip"
    with pytest.raises(UsageError) as raised, pinned_file(missing, tmp_path / "pinned"):
        pass
    assert str(raised.value) == f"cannot read {missing}: No such file or directory"
    assert raised.value.hint == "give the path of a downloaded SDK archive"
    assert raised.value.__cause__ is None
    assert raised.value.__suppress_context__


def test_a_work_folder_there_already_is_not_used(tmp_path: Path) -> None:
    """The work folder is made, never taken over: someone else's folder of that name is refused."""
    (tmp_path / "pinned").mkdir()
    with pytest.raises(FileExistsError), pinned_file(_archive(tmp_path, b"x"), tmp_path / "pinned"):
        pass


# -- the door's two moments ---------------------------------------------------------------------


def test_the_whole_archive_is_held_to_those_that_pin_it_alone(tmp_path: Path) -> None:
    good = "a" * 64
    components_only = _expected(components={"host": "b" * 64})
    admit_archive([components_only, _expected(sha256=good, size=10)], "v2.zip", good, 10)
    admit_archive([_expected(sha256=good, size=10)], "v2.zip", good)  # size not known: the sha256 alone
    with pytest.raises(IntegrityError, match=f"the archive from v2.zip does not match qnnctl.lock: its sha256 is "
                                             f"{'c' * 64}, the lock pins {good}; nothing was installed"):
        admit_archive([components_only, _expected(sha256=good)], "v2.zip", "c" * 64)
    with pytest.raises(IntegrityError, match="but its size is 11, and the lock pins 10"):
        admit_archive([_expected(sha256=good, size=10)], "v2.zip", good, 11)


def test_a_tree_is_seen_as_written_without_the_manifest(tmp_path: Path) -> None:
    root = build_sdk_tree(tmp_path / "sdk")
    bare = tree_digests(root)
    (root / ".qnnctl.json").write_text("{}")
    seen = observed_tree(root, {}, "v2.zip", "a" * 64, 10, "d" * 64)
    assert (seen.shown, seen.sha256, seen.size, seen.central_directory_sha256) == ("v2.zip", "a" * 64, 10, "d" * 64)
    assert seen.components == bare
    assert observed_tree(root, {}, "v2.zip").sha256 is None


def test_a_tree_is_seen_by_the_sha256_each_file_had_as_written(tmp_path: Path) -> None:
    """The digests of files just written are not read again: what was written is what counts."""
    root = build_sdk_tree(tmp_path / "sdk")
    written = {HTP: "e" * 64}
    seen = observed_tree(root, written, "v2.zip")
    assert seen.components == tree_digests(root, written)
    assert seen.components != tree_digests(root)


def test_a_tree_is_admitted_against_everything_expected(tmp_path: Path) -> None:
    root = build_sdk_tree(tmp_path / "sdk")
    digests = tree_digests(root)
    seen = admit_tree([_expected(components=digests)], root, {}, "v2.zip", "a" * 64, 10, "d" * 64)
    assert seen == observed_tree(root, {}, "v2.zip", "a" * 64, 10, "d" * 64)
    wrong = {**digests, "host": "0" * 64}
    with pytest.raises(IntegrityError, match=f"its component host is {digests['host']}, the lock pins {'0' * 64}"):
        admit_tree([_expected(components=wrong)], root, {}, "v2.zip")
    with pytest.raises(IntegrityError, match=r"qnnctl\.lock contradicts itself"):
        admit_tree([_expected(sha256="a" * 64, components=wrong)], root, {}, "v2.zip", "a" * 64)
    with pytest.raises(IntegrityError, match="its sha256 is " + "b" * 64):
        admit_tree([_expected(sha256="a" * 64, components=digests)], root, {}, "v2.zip", "b" * 64)
    with pytest.raises(IntegrityError, match="but its size is 11, and the lock pins 10"):
        admit_tree([_expected(sha256="a" * 64, size=10)], root, {}, "v2.zip", "a" * 64, 11)
    with pytest.raises(IntegrityError, match="its central directory's sha256 is " + "e" * 64):
        admit_tree([_expected(components=digests, central_directory_sha256="d" * 64)], root, {}, "v2.zip",
                   directory="e" * 64)
    as_written = tree_digests(root, {HTP: "e" * 64})["host"]
    with pytest.raises(IntegrityError, match=f"its component host is {as_written}, the lock pins {digests['host']}"):
        admit_tree([_expected(components=digests)], root, {HTP: "e" * 64}, "v2.zip")


def test_a_listing_is_checked_as_an_extraction_would_be() -> None:
    digests = {"host": "1" * 64, "docs": "2" * 64}
    admit_listing([_expected(sha256="a" * 64, size=10, components=digests, central_directory_sha256="d" * 64)],
                  "v2.zip", "a" * 64, 10, digests, "d" * 64)
    admit_listing([_expected(components=digests)], "v2.zip", "b" * 64, 11, digests, None)
    with pytest.raises(IntegrityError, match=r"qnnctl\.lock contradicts itself"):
        admit_listing([_expected(sha256="a" * 64, components={**digests, "docs": "3" * 64})], "v2.zip", "a" * 64,
                      10, digests, None)
    with pytest.raises(IntegrityError, match="its sha256 is " + "b" * 64):
        admit_listing([_expected(sha256="a" * 64)], "v2.zip", "b" * 64, 10, digests, None)
    with pytest.raises(IntegrityError, match="its size is 11"):
        admit_listing([_expected(sha256="a" * 64, size=10)], "v2.zip", "a" * 64, 11, digests, None)
    with pytest.raises(IntegrityError, match="the archive from v2.zip .* its central directory's sha256 is "
                                             + "e" * 64):
        admit_listing([_expected(components=digests, central_directory_sha256="d" * 64)], "v2.zip", "a" * 64, 10,
                      digests, "e" * 64)
    with pytest.raises(IntegrityError, match="its component docs is " + "2" * 64):
        admit_listing([_expected(components={**digests, "docs": "3" * 64})], "v2.zip", "a" * 64, 10, digests, None)
