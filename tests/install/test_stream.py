"""Extracting a zip while it downloads: real downloads from a loopback server, real threads.

The SDK archives here are small, so each test lowers the size from which qnnctl streams.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import logging
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, cast

import pytest

import qnnctl.install.memberdata
import qnnctl.install.stream
import qnnctl.net.download
from qnnctl.errors import IntegrityError
from qnnctl.files import space_margin
from qnnctl.install.archive import Streamed, extract
from qnnctl.install.memberdata import COPY_BUFFER
from qnnctl.install.pipeline import InstallRequest, InstallResult, install
from qnnctl.install.stream import ZipStream
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.vouchers import vouchers
from tests.conftest import PAYLOAD, give_default_acl, with_default_sigint
from tests.httpserver import Fault, FaultServer
from tests.install.test_archive import (
    HOSTILE,
    Member,
    _assert_nothing_escaped,
    _victim,
    chmods_under_umask,
    hostile_archive,
)
from tests.install.test_install import _assert_complete_sdk, _cache_is_tidy
from tests.sdkfactory import VERSION, SdkSpec, add_zip_entry, build_archive, build_sdk_tree, manifest_digest

# Their outcome depends on the standard library (reading a zip while it arrives).
pytestmark = pytest.mark.stdlib

PATH = f"/{VERSION}/v{VERSION}.zip"
TOP = f"qairt/{VERSION}"
STREAMED = "files were extracted while downloading"
# Many files in several folders, so that the threads have work to share.
MANY = {f"share/d{i % 7}/f{i}.txt": (b"%d " % i) * (50 + i % 300) for i in range(300)}


@pytest.fixture(autouse=True)
def stream_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qnnctl.install.stream, "STREAM_MIN", 0)
    # The archives here are small: read the body in 4 KiB pieces and hand the stream every
    # 8 KiB, rather than 64 KiB and 1 MiB, so that a slow server makes them stream.
    monkeypatch.setattr(qnnctl.net.download, "NET_CHUNK", 4 << 10)
    monkeypatch.setattr(qnnctl.net.download, "CHUNK", 8 << 10)


class Log(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def find(self, text: str) -> list[str]:
        return [m for m in self.messages if text in m]

    def streamed(self) -> tuple[int, int]:
        """(files extracted while downloading, files) as the install reported them."""
        found = [re.match(rf"(\d+) of (\d+) {STREAMED}", m) for m in self.messages]
        counts = [(int(m[1]), int(m[2])) for m in found if m]
        assert len(counts) == 1, self.messages
        return counts[0]


@pytest.fixture
def log() -> Iterator[Log]:
    """qnnctl's debug messages (attached to its own logger: the CLI may stop propagation)."""
    handler = Log()
    logger = logging.getLogger("qnnctl")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _install() -> InstallResult:
    return install(InstallRequest(spec=VERSION), Cache.from_env(os.environ), os.environ, Path.cwd(),
                   vouchers(os.environ, Path.cwd()))


@contextlib.contextmanager
def _serve_until_streamed(server: FaultServer, monkeypatch: pytest.MonkeyPatch, data: bytes,
                          cache: Path) -> Iterator[None]:
    """Serve `data`: three quarters of it, then the rest once a file was extracted from them
    into the install's work folder (or after a minute): extraction while downloading is seen
    to happen, whatever the machine's load."""
    _serve(server, monkeypatch, data)
    resume = threading.Event()
    server.fail(PATH, Fault.pause(len(data) * 3 // 4, resume))

    def watch() -> None:
        deadline = time.monotonic() + 60
        while not resume.is_set() and time.monotonic() < deadline:
            if any(path.is_file() for path in (cache / "tmp").glob("*/x/**/*")):
                break
            time.sleep(0.005)
        resume.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        resume.set()
        watcher.join()


def _serve(server: FaultServer, monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    server.add(PATH, data)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)


def _archive(tmp_path: Path, spec: SdkSpec | None = None) -> Path:
    folder = tmp_path / "archives"
    folder.mkdir(exist_ok=True)
    return build_archive(folder, "zip", spec or SdkSpec(extra_files=MANY))


def _tree(root: Path) -> dict[str, tuple[int, str]]:
    """Every entry under root: its mode and its content (or link target)."""
    found: dict[str, tuple[int, str]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            found[str(path.relative_to(root))] = (info.st_mode, os.readlink(path))
        elif stat.S_ISREG(info.st_mode) and path.name != ".qnnctl.json":
            found[str(path.relative_to(root))] = (info.st_mode, hashlib.sha256(path.read_bytes()).hexdigest())
        elif stat.S_ISDIR(info.st_mode):
            found[str(path.relative_to(root))] = (info.st_mode, "")
    return found


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


def _held(path: Path) -> bool:
    """Whether this process holds a descriptor open on `path`."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the descriptor listdir itself used is gone
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
    return os.path.realpath(path) in held


# -- the same result as extracting after the download -------------------------------------


def test_streamed_install_is_the_same_as_extracting_afterwards(server: FaultServer, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch, log: Log,
                                                               cache_dir: Path) -> None:
    archive = _archive(tmp_path)
    with _serve_until_streamed(server, monkeypatch, archive.read_bytes(), cache_dir):
        result = _install()
    assert result.sdk is not None
    manifest = _assert_complete_sdk(result.sdk.root)
    with zipfile.ZipFile(archive) as zf:
        files = sum(1 for i in zf.infolist() if stat.S_ISREG(i.external_attr >> 16))
    streamed, total = log.streamed()
    # Members that arrive with the last bytes are left to extract(), which has them all.
    assert total == files
    assert streamed > 0, log.messages
    plain = extract(archive, tmp_path / "plain")
    assert manifest["files"] == plain.files
    assert _tree(result.sdk.root) == _tree(plain.root)
    assert len(server.requests_for(PATH)) == 1


def test_streamed_files_get_exact_modes_under_a_default_acl(server: FaultServer, tmp_path: Path, cache_dir: Path,
                                                           monkeypatch: pytest.MonkeyPatch, log: Log) -> None:
    """A default ACL on the cache takes the umask's place for every folder made in it: files
    are then given their modes explicitly, the streamed ones too."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    give_default_acl(cache_dir)
    archive = _archive(tmp_path)
    _serve(server, monkeypatch, archive.read_bytes())
    server.fail(PATH, Fault.slow(4 << 10, 0.005))
    result = _install()
    assert result.sdk is not None
    assert log.streamed()[0] > 0, log.messages
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            mode = info.external_attr >> 16
            if stat.S_ISREG(mode):
                path = result.sdk.root / info.filename.removeprefix(f"{TOP}/")
                assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(mode), info.filename


def test_resumed_download_streams_on(server: FaultServer, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch, log: Log) -> None:
    # Incompressible, so that whole blocks reach the disk before the connection drops.
    data = _archive(tmp_path, SdkSpec(extra_files={**MANY, "docs/payload.bin": PAYLOAD})).read_bytes()
    _serve(server, monkeypatch, data)
    server.fail(PATH, Fault.drop_after(len(data) // 2))
    result = _install()
    assert result.sdk is not None
    requests = server.requests_for(PATH)
    assert len(requests) == 2
    assert requests[1].headers["Range"].startswith("bytes=")
    assert log.find(STREAMED), log.messages
    assert not log.find("nothing kept"), log.messages
    _assert_complete_sdk(result.sdk.root)


def test_download_killed_while_streaming_then_resumed(server: FaultServer, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> None:
    spec = SdkSpec(extra_files={**MANY, "docs/payload.bin": os.urandom(4 << 20)})
    data = _archive(tmp_path, spec).read_bytes()
    _serve(server, monkeypatch, data)
    server.fail(PATH, Fault.slow(64 << 10, 0.05))
    code = ("import sys, qnnctl.install.stream as a; a.STREAM_MIN = 0; from qnnctl.cli import main; "
            "sys.argv[0] = 'qnnctl'; main()")
    part = cache_dir / "downloads" / f"v{VERSION}.zip.part"
    proc = subprocess.Popen([sys.executable, "-c", code, "install"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        # Files are being written from the part of the archive that is there.
        _wait_until(lambda: any((cache_dir / "tmp").glob(f"{VERSION}.*/x/{TOP}/QNN_README.txt"))
                    and part.exists() and part.stat().st_size >= 1 << 20, "streamed files")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    kept = part.stat().st_size
    assert kept < len(data)

    rerun = subprocess.run([sys.executable, "-c", code, "install"], capture_output=True, text=True,
                           timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert server.requests_for(PATH)[-1].headers["Range"] == f"bytes={kept}-"
    manifest = _assert_complete_sdk(cache_dir / "sdks" / VERSION)
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    _cache_is_tidy(cache_dir)


# -- what is not kept -----------------------------------------------------------------------


def _flip_in_member(data: bytes, name: str) -> bytes:
    """One byte changed inside a member's compressed data (no header touched)."""
    out = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        info = zf.getinfo(name)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    out[start + info.compress_size // 2] ^= 0xFF
    return bytes(out)


def test_member_with_a_bad_crc_is_not_installed(server: FaultServer, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> None:
    spec = SdkSpec(extra_files={"docs/payload.bin": os.urandom(256 << 10)})
    data = _flip_in_member(_archive(tmp_path, spec).read_bytes(), f"{TOP}/docs/payload.bin")
    _serve(server, monkeypatch, data)
    with pytest.raises(IntegrityError, match="corrupt"):
        _install()
    assert list((cache_dir / "sdks").iterdir()) == []
    assert list((cache_dir / "tmp").iterdir()) == []


def _central_entries(data: bytes) -> tuple[int, int, dict[str, slice]]:
    """The central directory of the zip `data`: where it starts, its size, and where each
    member's entry is, by name."""
    end = data.rfind(b"PK\x05\x06")
    _, _, _, _, _, size, offset, _ = struct.unpack("<4s4H2LH", data[end:end + 22])
    entries: dict[str, slice] = {}
    position = offset
    while position < offset + size:
        name_len, extra_len, comment_len = struct.unpack("<3H", data[position + 28:position + 34])
        length = 46 + name_len + extra_len + comment_len
        entries[data[position + 46:position + 46 + name_len].decode()] = slice(position, position + length)
        position += length
    return offset, size, entries


def _drop_from_central_directory(data: bytes, name: str) -> bytes:
    """The archive with `name` left out of its central directory: its local entry stays."""
    offset, _, entries = _central_entries(data)
    kept = [data[entry] for member, entry in entries.items() if member != name]
    directory = b"".join(kept)
    return data[:offset] + directory + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(kept),
                                                    len(kept), len(directory), offset, 0)


def test_member_missing_from_the_central_directory_is_refused(
    server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_dir: Path
) -> None:
    """A reader of local headers sees a member that the central directory does not: two
    readings of one archive, refused whole (its bytes belong to no member of the directory)."""
    spec = SdkSpec(extra_files={**MANY, "share/hidden.txt": b"only in a local header"})
    data = _drop_from_central_directory(_archive(tmp_path, spec).read_bytes(), f"{TOP}/share/hidden.txt")
    _serve(server, monkeypatch, data)
    server.fail(PATH, Fault.slow(4 << 10, 0.005))  # so that the member is streamed
    with pytest.raises(IntegrityError, match=r"is followed by \d+ bytes that are none of its own"):
        _install()
    assert list((cache_dir / "sdks").iterdir()) == []


def _central_crc_changed(data: bytes, name: str) -> bytes:
    """The archive with the CRC-32 its central directory gives `name` changed; the member's
    local header and data stay as they were."""
    _, _, entries = _central_entries(data)
    assert name in entries, f"{name} is not in the central directory"
    at = entries[name].start + 16
    (crc,) = struct.unpack("<L", data[at:at + 4])
    return data[:at] + struct.pack("<L", crc ^ 1) + data[at + 4:]


def test_member_the_central_directory_describes_otherwise_is_refused(
    server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_dir: Path, log: Log
) -> None:
    """Streamed as its local header describes it, the member is then found to disagree with
    the central directory (its CRC-32): refused, as two readings of one archive."""
    name = f"{TOP}/docs/payload.bin"
    spec = SdkSpec(extra_files={**MANY, "docs/payload.bin": os.urandom(256 << 10)})
    _serve(server, monkeypatch, _central_crc_changed(_archive(tmp_path, spec).read_bytes(), name))
    server.fail(PATH, Fault.slow(4 << 10, 0.005))  # so that the member is streamed
    with pytest.raises(IntegrityError, match=f"{name!r} has a local header that disagrees with the central "
                       "directory: CRC-32"):
        _install()
    assert list((cache_dir / "sdks").iterdir()) == []


def _local_member_running_past_the_end(data: bytes, name: str, payload: bytes) -> bytes:
    """A local header for `name`, with `payload` after it, inserted before the central
    directory, declaring more data than the rest of the archive holds. The result is a valid
    zip in which `name` does not exist; only a reader of local headers would see it."""
    end = data.rfind(b"PK\x05\x06")
    signature, disk, cd_disk, here, total, size, offset, comment = struct.unpack(
        "<4s4H2LH", data[end:end + 22])
    encoded = name.encode()
    declared = len(payload) + size + 22 + (4 << 20)
    header = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, declared, declared,
                         len(encoded), 0) + encoded
    moved = offset + len(header) + len(payload)
    return (data[:offset] + header + payload + data[offset:offset + size]
            + struct.pack("<4s4H2LH", signature, disk, cd_disk, here, total, size, moved, comment))


@pytest.mark.parametrize("payload_size", [100, (1 << 20) + 4096])
def test_a_local_member_running_past_the_end_is_refused(
    server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payload_size: int
) -> None:
    name = f"{TOP}/lib/x86_64-linux-clang/libEvil.so"
    data = _local_member_running_past_the_end(_archive(tmp_path).read_bytes(), name, b"E" * payload_size)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.testzip() is None
        assert name not in zf.namelist()
    _serve(server, monkeypatch, data)
    with pytest.raises(IntegrityError, match=r"is followed by \d+ bytes that are none of its own"):
        _install()


@pytest.mark.parametrize("case", [name for name, case in HOSTILE.items() if "zip" in case.formats])
def test_hostile_archive_is_refused_when_streamed(server: FaultServer, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch, cache_dir: Path,
                                                  case: str) -> None:
    victim = _victim(tmp_path)
    archive = hostile_archive(tmp_path, "zip", HOSTILE[case].members(tmp_path))
    _serve(server, monkeypatch, archive.read_bytes())
    with pytest.raises(IntegrityError, match="unsafe archive"):
        _install()
    _assert_nothing_escaped(tmp_path, victim)
    assert list((cache_dir / "sdks").iterdir()) == []
    assert list((cache_dir / "tmp").iterdir()) == []


def _central_order(data: bytes, order: Callable[[list[str]], list[str]]) -> bytes:
    """The archive with the entries of its central directory in the order `order` gives their
    names; the local headers and data stay where they are."""
    offset, size, entries = _central_entries(data)
    directory = b"".join(data[entries[name]] for name in order(list(entries)))
    assert len(directory) == size
    return data[:offset] + directory + data[offset + size:]


def test_a_link_that_stands_for_a_folder_of_other_members_is_extracted_again(
    server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log: Log
) -> None:
    """The link `manual -> docs` comes first in the central directory, `manual/guide.txt` (a
    link too) after it, so the careful way makes the second in `docs`. In the archive's data
    they come the other way round, a member that cannot be streamed between them: streaming
    writes `manual/guide.txt` in a real folder `manual`, and stops before the link `manual`.
    All is extracted again, the careful way, rather than finding that folder in the link's way."""
    guide, manual = f"{TOP}/manual/guide.txt", f"{TOP}/manual"
    archive = _archive(tmp_path)
    with zipfile.ZipFile(archive, "a") as zf:
        add_zip_entry(zf, f"{TOP}/docs/guide.txt", b"old", stat.S_IFREG | 0o644)
        add_zip_entry(zf, guide, b"../QNN_README.txt", stat.S_IFLNK | 0o777)
        zf.writestr(f"{TOP}/share/bzip2.txt", b"not streamed", compress_type=zipfile.ZIP_BZIP2)
        add_zip_entry(zf, manual, b"docs", stat.S_IFLNK | 0o777)

    def manual_first(names: list[str]) -> list[str]:
        names.remove(manual)
        names.insert(names.index(guide), manual)
        return names

    _serve(server, monkeypatch, _central_order(archive.read_bytes(), manual_first))
    server.fail(PATH, Fault.slow(4 << 10, 0.005))  # so that the members are streamed
    result = _install()
    assert result.sdk is not None
    assert f"extracting v{VERSION}.zip again: a link stands for a folder of other members" in log.messages
    root = result.sdk.root
    assert os.readlink(root / "manual") == "docs"
    assert os.readlink(root / "docs/guide.txt") == "../QNN_README.txt"
    files = _assert_complete_sdk(root)["files"]
    assert isinstance(files, dict)
    assert "docs/guide.txt" not in files


# -- zip variants ---------------------------------------------------------------------------


def test_zip64_headers_are_streamed(server: FaultServer, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch, log: Log, cache_dir: Path) -> None:
    staging = tmp_path / "staging"
    build_sdk_tree(staging / TOP, SdkSpec(extra_files=MANY))  # more than a few of the stream's chunks
    archive = tmp_path / "zip64.zip"
    count = 0
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(staging.rglob("*")):
            if path.is_file():
                info = zipfile.ZipInfo(str(path.relative_to(staging)), date_time=(2025, 7, 24, 0, 0, 0))
                info.create_system = 3
                info.external_attr = (stat.S_IFREG | stat.S_IMODE(path.stat().st_mode)) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                # Sizes in a zip64 extra field, 0xFFFFFFFF in the header.
                with zf.open(info, "w", force_zip64=True) as out:
                    out.write(path.read_bytes())
                count += 1
    # Both sizes 0xFFFFFFFF in each local header, as zipfile writes them in Python 3.11.7; 3.11.2
    # (Debian 12's) writes the sizes there as well as in the zip64 field. Set here, so that every
    # Python tests the same headers: what the streaming reader must take from the zip64 field.
    data = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            at = info.header_offset
            name_length = struct.unpack_from("<H", data, at + 26)[0]
            assert data[at + 30 + name_length:at + 32 + name_length] == b"\x01\x00"  # the zip64 field
            data[at + 18:at + 26] = struct.pack("<2L", 0xFFFFFFFF, 0xFFFFFFFF)
    archive.write_bytes(bytes(data))
    with _serve_until_streamed(server, monkeypatch, archive.read_bytes(), cache_dir):
        result = _install()
    assert result.sdk is not None
    streamed, total = log.streamed()
    assert total == count
    assert streamed > 0, log.messages
    assert _tree(result.sdk.root) == _tree(extract(archive, tmp_path / "plain").root)


class _Unseekable:
    """A file zipfile cannot seek in, so that it writes the sizes after each member's data."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out

    def write(self, data: bytes) -> int:
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()

    def tell(self) -> int:
        raise OSError("not seekable")


def test_members_with_data_descriptors_are_extracted_afterwards(server: FaultServer, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                log: Log) -> None:
    staging = tmp_path / "staging"
    build_sdk_tree(staging / TOP)
    archive = tmp_path / "descriptors.zip"
    with open(archive, "wb") as out, zipfile.ZipFile(cast(IO[bytes], _Unseekable(out)), "w") as zf:
        for path in sorted(staging.rglob("*")):
            if path.is_file():
                add_zip_entry(zf, str(path.relative_to(staging)), path.read_bytes(),
                              stat.S_IFREG | stat.S_IMODE(path.stat().st_mode))
    with zipfile.ZipFile(archive) as zf:
        assert all(i.flag_bits & 0x08 for i in zf.infolist())
    _serve(server, monkeypatch, archive.read_bytes())
    result = _install()
    assert result.sdk is not None
    assert not log.find(STREAMED), log.messages  # where each member ends is not in its header
    assert _tree(result.sdk.root) == _tree(extract(archive, tmp_path / "plain").root)


# -- a download that starts over --------------------------------------------------------------


def _crc_suffix(prefix: bytes, target: int) -> bytes:
    """Four bytes that, appended to `prefix`, make its CRC-32 equal `target`."""
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table.append(c)
    by_top = {entry >> 24: index for index, entry in enumerate(table)}
    register = target ^ 0xFFFFFFFF
    indexes = []
    for _ in range(4):
        index = by_top[register >> 24]
        indexes.append(index)
        register = ((register ^ table[index]) << 8) & 0xFFFFFFFF
    state = zlib.crc32(prefix) ^ 0xFFFFFFFF
    suffix = bytearray()
    for index in reversed(indexes):
        byte = (state ^ index) & 0xFF
        suffix.append(byte)
        state = table[(state ^ byte) & 0xFF] ^ (state >> 8)
    assert zlib.crc32(prefix + bytes(suffix)) == target
    return bytes(suffix)


def _archive_with(tmp_path: Path, name: str, content: bytes) -> bytes:
    """An SDK zip holding `content`, stored (not deflated) at `name`, before many other files."""
    staging = tmp_path / f"staging-{hashlib.sha256(content).hexdigest()[:8]}"
    build_sdk_tree(staging / TOP, SdkSpec(extra_files=MANY))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        info = zipfile.ZipInfo(f"{TOP}/{name}", date_time=(2025, 7, 24, 0, 0, 0))
        info.create_system = 3
        info.external_attr = (stat.S_IFREG | 0o644) << 16
        zf.writestr(info, content)
        for path in sorted(staging.rglob("*")):
            if path.is_file():
                add_zip_entry(zf, str(path.relative_to(staging)), path.read_bytes(),
                              stat.S_IFREG | stat.S_IMODE(path.stat().st_mode))
    shutil.rmtree(staging)
    return buffer.getvalue()


def test_download_that_starts_over_discards_what_was_streamed(tmp_path: Path) -> None:
    """The file on the server changed: members already written from the old bytes are not
    kept, even one whose name, place, size and CRC are the same as in the new archive."""
    old = b"old content " * 1000
    new = b"new content " * 1000
    new = new[:-4] + _crc_suffix(new[:-4], zlib.crc32(old))
    first = _archive_with(tmp_path, "docs/guide.txt", old)
    second = _archive_with(tmp_path, "docs/guide.txt", new)
    assert len(first) == len(second)
    assert first != second
    part = tmp_path / "download.part"
    work = tmp_path / "work" / "x"
    stream = ZipStream(work, min_size=0)
    try:
        stream.begin(part, 0, len(first))
        part.write_bytes(first[: len(first) // 2])
        stream.extend(len(first) // 2)
        guide = work / TOP / "docs/guide.txt"
        _wait_until(lambda: guide.exists() and guide.read_bytes() == old, "the old member")
        # Whole again from the start, as when the server ignores Range or the file changed.
        stream.begin(part, 0, len(second))
        part.write_bytes(second)
        stream.extend(len(second))
    finally:
        streamed = stream.close()
    assert streamed is None
    assert not work.exists()  # nothing of it is left to be taken for the new archive's
    archive = tmp_path / "second.zip"
    archive.write_bytes(second)
    result = extract(archive, work)
    assert (result.root / "docs/guide.txt").read_bytes() == new
    assert result.files["docs/guide.txt"] == manifest_digest(new)


def test_partial_file_replaced_by_another_is_not_read_on(tmp_path: Path) -> None:
    """A 416 or a resume at the wrong offset removes the partial file; its successor is a
    new file, and the threads never read on from the old one."""
    data = _archive_with(tmp_path, "docs/guide.txt", b"guide " * 1000)
    part = tmp_path / "download.part"
    work = tmp_path / "work" / "x"
    stream = ZipStream(work, min_size=0)
    try:
        stream.begin(part, 0, len(data))
        part.write_bytes(data[:4096])
        stream.extend(4096)
        part.unlink()
        part.write_bytes(data[:8192])
        stream.begin(part, 8192, len(data))
        stream.extend(8192)
    finally:
        assert stream.close() is None
    assert not work.exists()


def test_abandoned_stream_stops_its_threads(tmp_path: Path, log: Log) -> None:
    data = _archive_with(tmp_path, "docs/guide.txt", b"guide " * 1000)
    part = tmp_path / "download.part"
    work = tmp_path / "work" / "x"
    stream = ZipStream(work, min_size=0)
    stream.begin(part, 0, len(data))
    part.write_bytes(data[: len(data) // 3])
    stream.extend(len(data) // 3)
    # The rest never comes: close() returns at once instead of waiting for it.
    assert stream.close(abandon=True) is None
    assert not [t for t in threading.enumerate() if t.name.startswith("qnnctl-")]
    assert log.find("nothing kept from extracting while downloading") == [
        "nothing kept from extracting while downloading: abandoned"]
    assert not work.exists()
    assert not _held(part)


def test_small_downloads_are_not_streamed(tmp_path: Path) -> None:
    stream = ZipStream(tmp_path / "x", min_size=1 << 30)
    stream.begin(tmp_path / "a.part", 0, 1 << 20)
    stream.extend(1 << 20)
    assert stream.close() is None
    assert not (tmp_path / "x").exists()


# -- what the threads take from the local headers, and where they stop ----------------------


def _stream_work(tmp_path: Path) -> Path:
    """A folder to stream into, as deep below tmp_path as the installer's (cache/tmp/<id>/x)."""
    return tmp_path / "cache" / "tmp" / "w" / "x"


class _Feed:
    """A ZipStream fed by hand, as the downloader feeds it: `upto(n)` writes the archive's
    first n bytes to the partial file and says so."""

    def __init__(self, tmp_path: Path, data: bytes, threads: int | None = None, min_size: int = 0,
                 resume_at: int = 0) -> None:
        self.data = data
        self.part = tmp_path / "download.part"
        self.work = _stream_work(tmp_path)
        self.stream = ZipStream(self.work, threads=threads, min_size=min_size)
        if resume_at:
            self.part.write_bytes(data[:resume_at])  # what an earlier run of the download left
        self.stream.begin(self.part, resume_at, len(data))
        self.written = resume_at

    def upto(self, end: int) -> None:
        with open(self.part, "ab") as out:
            out.write(self.data[self.written:end])
        self.written = end
        self.stream.extend(end)

    def finish(self) -> Streamed | None:
        """The whole archive, then what the stream kept once its threads took all they would."""
        self.upto(len(self.data))
        _wait_until(lambda: not [t for t in threading.enumerate() if t.name == "qnnctl-stream"],
                    "the stream's threads to finish", timeout=20)
        streamed = self.stream.close()
        assert not _held(self.part)  # the partial file is read no more: its space is freed once it is removed
        return streamed


@pytest.fixture
def feed(tmp_path: Path) -> Iterator[Callable[..., _Feed]]:
    made: list[_Feed] = []

    def make(data: bytes, threads: int | None = None, min_size: int = 0, resume_at: int = 0) -> _Feed:
        made.append(_Feed(tmp_path, data, threads, min_size, resume_at))
        return made[-1]

    yield make
    for each in made:  # no thread is left waiting for bytes, whatever the test did
        each.stream.close(abandon=True)


def _zip(*members: tuple[str, bytes], method: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, content in members:
            info = zipfile.ZipInfo(name, date_time=(2025, 7, 24, 0, 0, 0))
            info.compress_type = method
            zf.writestr(info, content)
    return buffer.getvalue()


def _names(streamed: Streamed | None) -> list[str]:
    assert streamed is not None
    return sorted(str(name) for name in streamed.members)


def _data_offset(data: bytes, name: str) -> int:
    """Where a member's data starts: after its local header, name and extra field."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        offset = zf.getinfo(name).header_offset
    name_len, extra_len = struct.unpack("<2H", data[offset + 26:offset + 30])
    return offset + 30 + int(name_len) + int(extra_len)


def _set_flag(flag: int) -> Callable[[bytearray, int], None]:
    def change(out: bytearray, offset: int) -> None:
        out[offset + 6] |= flag

    return change


def _use_method(method: int) -> Callable[[bytearray, int], None]:
    def change(out: bytearray, offset: int) -> None:
        out[offset + 8:offset + 10] = struct.pack("<H", method)

    return change


@pytest.mark.parametrize("change", [_set_flag(0x01), _set_flag(0x08), _set_flag(0x20),
                                    _use_method(zipfile.ZIP_BZIP2), _use_method(zipfile.ZIP_LZMA)],
                         ids=["encrypted", "data descriptor", "patched", "bzip2", "lzma"])
def test_threads_stop_at_a_member_they_cannot_stream(tmp_path: Path, feed: Callable[..., _Feed],
                                                     change: Callable[[bytearray, int], None]) -> None:
    """Each of these alone leaves that member and the rest to extract(): encrypted data,
    sizes that follow the data, patched data, a method other than stored and deflated."""
    data = _zip(("sdk/first.txt", b"first " * 100), ("sdk/odd.txt", b"odd " * 100),
                ("sdk/after.txt", b"after " * 100))
    stream = feed(_patch_local_header(data, "sdk/odd.txt", change))
    assert _names(stream.finish()) == ["sdk/first.txt"]
    assert sorted(p.name for p in (stream.work / "sdk").iterdir()) == ["first.txt"]


def _clear_utf8_flag(data: bytes, name: str) -> bytes:
    """The archive with `name`'s UTF-8 flag cleared, in its local header and its central
    directory entry: zipfile then reads the same bytes of its name as cp437."""
    out = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        offset = zf.getinfo(name).header_offset
    out[offset + 7] &= ~0x08 & 0xFF
    end = data.rfind(b"PK\x05\x06")
    size, start = struct.unpack("<2L", data[end + 12:end + 20])
    position = start
    while position < start + size:
        name_len, extra_len, comment_len = struct.unpack("<3H", data[position + 28:position + 34])
        if struct.unpack("<L", data[position + 42:position + 46])[0] == offset:
            out[position + 9] &= ~0x08 & 0xFF
        position += 46 + name_len + extra_len + comment_len
    return bytes(out)


def test_streamed_names_are_read_as_zipfile_reads_them(tmp_path: Path, feed: Callable[..., _Feed]) -> None:
    """UTF-8 when the member says so, cp437 when not, cut at a NUL, spaces and all: a
    streamed file has the name the central directory gives it, or it would not be kept."""
    data = _zip(("sdk/docs/\u00e9.txt", b"utf-8"), ("sdk/other/\u00e9.txt", b"cp437"),
                ("sdk/docs/read me.txt", b"space"), ("sdk/docs/cut.txt_x_y", b"cut"), ("sdk/last.txt", b"last"))
    data = _clear_utf8_flag(data, "sdk/other/\u00e9.txt")
    assert data.count(b"cut.txt_x_y") == 2  # in the local header and the central directory
    data = data.replace(b"cut.txt_x_y", b"cut.txt\x00x\x00y")
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = sorted(zf.namelist())
    # The same two bytes, c3 a9, as UTF-8 and as cp437.
    assert names == ["sdk/docs/cut.txt", "sdk/docs/read me.txt", "sdk/docs/\u00e9.txt", "sdk/last.txt",
                     "sdk/other/\u251c\u2310.txt"]
    stream = feed(data)
    assert _names(stream.finish()) == names
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for name in names:
            assert (stream.work / name).read_bytes() == zf.read(name), name


def test_streamed_files_the_umask_leaves_whole_are_not_chmod_again(tmp_path: Path, feed: Callable[..., _Feed],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream is made before its folder: the umask still counts, read against the nearest
    folder that exists (whose default ACL the new one would inherit)."""
    data = _zip(("sdk/a.txt", b"a"), ("sdk/b.txt", b"b"), ("sdk/c.txt", b"c"))
    assert not _stream_work(tmp_path).exists()
    with chmods_under_umask(monkeypatch, 0o022) as changed:
        stream = feed(data)
        assert _names(stream.finish()) == ["sdk/a.txt", "sdk/b.txt", "sdk/c.txt"]
    assert stat.S_IMODE((stream.work / "sdk/a.txt").stat().st_mode) == 0o644
    assert changed == []


@pytest.mark.parametrize("third", ["sdk/a.txt", "./"], ids=["a name given twice", "an empty name"])
def test_threads_stop_at_a_name_given_twice_or_empty(tmp_path: Path, feed: Callable[..., _Feed],
                                                     third: str) -> None:
    """extract() writes the last of the members of one name (and skips an empty one): the
    threads leave that to it."""
    with pytest.warns(UserWarning, match="Duplicate name") if third == "sdk/a.txt" else contextlib.nullcontext():
        data = _zip(("sdk/a.txt", b"first a"), ("sdk/b.txt", b"b"), (third, b""), ("sdk/c.txt", b"c"))
    stream = feed(data)
    streamed = stream.finish()
    assert _names(streamed) == ["sdk/a.txt", "sdk/b.txt"]
    assert streamed is not None
    assert streamed.members[PurePosixPath("sdk/a.txt")][0].offset == 0
    assert (stream.work / "sdk/a.txt").read_bytes() == b"first a"


@pytest.mark.parametrize("resumed", [False, True], ids=["from the start", "resumed halfway"])
def test_streamed_files_fit_in_the_space_the_download_leaves(tmp_path: Path, feed: Callable[..., _Feed],
                                                             monkeypatch: pytest.MonkeyPatch, resumed: bool) -> None:
    """What the threads write, with the rest of the download and a margin, fits on the disk:
    they stop at the first member that would take more, exactly at the limit."""
    big = 24 << 20  # stored: the archive is large enough for the margin to grow with what is left
    data = _zip(("sdk/a.bin", b"a" * 1000), ("sdk/b.bin", b"b" * 2000), ("sdk/c.bin", b"c" * 500),
                ("sdk/d.bin", b"d" * 10), ("sdk/big.bin", bytes(big)))
    start = len(data) // 2 if resumed else 0
    left = len(data) - start
    free = 3000 + left + space_margin(left)  # a and b take all there is to take
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=free))
    assert _names(feed(data, resume_at=start).finish()) == ["sdk/a.bin", "sdk/b.bin"]


def test_streamed_folders_are_kept(tmp_path: Path, feed: Callable[..., _Feed], log: Log) -> None:
    """An archive that lists its folders: those streamed are taken as they are, no extraction again."""
    staging = tmp_path / "staging"
    build_sdk_tree(staging / TOP, SdkSpec(extra_files=MANY))
    archive = tmp_path / "folders.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(staging.rglob("*")):
            if path.is_dir():
                add_zip_entry(zf, f"{path.relative_to(staging)}/", b"", stat.S_IFDIR | 0o755)
            elif path.is_file():
                add_zip_entry(zf, str(path.relative_to(staging)), path.read_bytes(),
                              stat.S_IFREG | stat.S_IMODE(path.stat().st_mode))
    stream = feed(archive.read_bytes())
    streamed = stream.finish()
    assert streamed is not None
    assert f"{TOP}/docs" in _names(streamed)
    # Each member with its place in the archive, and for a file its CRC-32, size and sha256; None for a folder.
    with zipfile.ZipFile(archive) as zf:
        infos = {PurePosixPath(info.filename): info for info in zf.infolist()}
        contents = {name: zf.read(info) for name, info in infos.items() if not info.is_dir()}
    for name, (local, written) in streamed.members.items():
        info = infos[name]
        assert local.offset == info.header_offset
        assert written == (None if info.is_dir() else (info.CRC, info.file_size,
                                                       hashlib.sha256(contents[name]).hexdigest())), name
    result = extract(archive, stream.work, stream.stream.close)
    assert not log.find("again"), log.messages
    assert _tree(result.root) == _tree(extract(archive, tmp_path / "plain").root)


def test_a_file_is_started_once_its_header_is_there_or_once_it_all_is(
    tmp_path: Path, feed: Callable[..., _Feed]
) -> None:
    """A member of up to one block is read in one go with its header, once all of it has
    arrived; a larger one is written as its data comes, from the moment its header is there."""
    whole, larger = os.urandom(COPY_BUFFER), os.urandom(COPY_BUFFER + 1)
    data = _zip(("sdk/p.txt", b"p" * 100), ("sdk/whole.bin", whole), ("sdk/larger.bin", larger))
    stream = feed(data)
    first = stream.work / "sdk/p.txt"
    stream.upto(_data_offset(data, "sdk/whole.bin") + COPY_BUFFER - 1)  # all but its last byte
    _wait_until(lambda: first.exists() and first.read_bytes() == b"p" * 100, "the first member")
    time.sleep(0.3)  # time enough to start on the next member, if it were started
    assert not (stream.work / "sdk/whole.bin").exists()
    stream.upto(_data_offset(data, "sdk/larger.bin"))  # up to its data, none of it
    _wait_until((stream.work / "sdk/larger.bin").exists, "the larger member to be started", timeout=10)
    assert _names(stream.finish()) == ["sdk/larger.bin", "sdk/p.txt", "sdk/whole.bin"]
    assert (stream.work / "sdk/whole.bin").read_bytes() == whole
    assert (stream.work / "sdk/larger.bin").read_bytes() == larger


@pytest.mark.parametrize("threads", [1, 2])
def test_a_member_running_past_the_end_keeps_nothing(tmp_path: Path, feed: Callable[..., _Feed],
                                                     log: Log, threads: int) -> None:
    """The data that never comes is waited for until the download ends. One thread: that
    is what fails, a little past the end; two: the next header, far past it, may fail first."""
    data = _local_member_running_past_the_end(_zip(("sdk/a.txt", b"a" * 100)), "sdk/evil.bin", b"E" * 100)
    stream = feed(data, threads)
    stream.upto(len(data))
    # Started (it is larger than a block), and waiting for data that will not come.
    _wait_until((stream.work / "sdk/evil.bin").exists, "the member running past the end")
    assert stream.stream.close() is None
    assert "nothing kept from extracting while downloading: a member runs past the end of the archive" in log.messages
    assert not stream.work.exists()


def test_a_member_with_a_bad_crc_keeps_nothing(tmp_path: Path, feed: Callable[..., _Feed], log: Log) -> None:
    data = _zip(("sdk/a.txt", b"a" * 100), ("sdk/bad.txt", b"bad " * 100), ("sdk/c.txt", b"c" * 100))
    stream = feed(_flip_in_member(data, "sdk/bad.txt"))
    assert stream.finish() is None
    assert ("nothing kept from extracting while downloading: BadZipFile: Bad CRC-32 or size for 'sdk/bad.txt'"
            in log.messages)
    assert not stream.work.exists()


def test_a_download_tried_again_before_any_byte_came_streams_on(tmp_path: Path,
                                                                feed: Callable[..., _Feed]) -> None:
    data = _zip(("sdk/a.txt", b"a" * 100), ("sdk/b.txt", b"b" * 100))
    stream = feed(data)  # begun: the partial file is not there yet
    stream.stream.begin(stream.part, 0, len(data))  # the first try failed before writing it
    assert _names(stream.finish()) == ["sdk/a.txt", "sdk/b.txt"]


def test_a_partial_file_gone_when_the_download_resumes_is_not_read_on(tmp_path: Path,
                                                                      feed: Callable[..., _Feed], log: Log) -> None:
    data = _archive_with(tmp_path, "docs/guide.txt", b"guide " * 1000)
    stream = feed(data)
    stream.upto(4096)
    stream.part.unlink()
    stream.stream.begin(stream.part, 4096, len(data))
    stream.part.write_bytes(data)
    stream.stream.extend(len(data))
    assert stream.stream.close() is None
    assert "nothing kept from extracting while downloading: the download started over" in log.messages
    assert not stream.work.exists()


def test_a_download_resumed_where_it_stopped_streams_on(tmp_path: Path, feed: Callable[..., _Feed]) -> None:
    data = _zip(("sdk/a.txt", b"a" * 3000), ("sdk/b.txt", b"b" * 3000))
    stream = feed(data)
    stream.upto(4096)
    stream.stream.begin(stream.part, 4096, len(data))  # the connection dropped; resumed from there
    assert _names(stream.finish()) == ["sdk/a.txt", "sdk/b.txt"]


def test_a_download_of_the_smallest_size_streamed_is_streamed(tmp_path: Path, feed: Callable[..., _Feed]) -> None:
    data = _zip(("sdk/a.txt", b"a" * 3000))
    assert _names(feed(data, min_size=len(data)).finish()) == ["sdk/a.txt"]


def test_a_download_of_unknown_size_is_not_streamed_even_once_its_size_is_known(tmp_path: Path) -> None:
    """Whether to stream is decided when the download begins: a resume that learns the size
    does not start it."""
    data = _zip(("sdk/a.txt", b"a" * 3000))
    part = tmp_path / "download.part"
    stream = ZipStream(tmp_path / "x", min_size=0)
    stream.begin(part, 0, None)
    part.write_bytes(data[:100])
    stream.extend(100)
    stream.begin(part, 100, len(data))
    with open(part, "ab") as out:
        out.write(data[100:])
    stream.extend(len(data))
    assert not [t for t in threading.enumerate() if t.name == "qnnctl-stream"]
    assert stream.close() is None
    assert not (tmp_path / "x").exists()


def test_streaming_into_a_folder_that_is_there(tmp_path: Path, feed: Callable[..., _Feed]) -> None:
    _stream_work(tmp_path).mkdir(parents=True)
    data = _zip(("sdk/a.txt", b"a" * 3000))
    assert _names(feed(data).finish()) == ["sdk/a.txt"]


def test_a_process_that_exits_without_closing_its_stream_does_not_wait_for_it(tmp_path: Path) -> None:
    """The threads wait for bytes that will not come: they do not keep the process alive."""
    data = _zip(("sdk/a.txt", b"a" * 3000), ("sdk/b.txt", b"b" * 3000))
    code = ("import sys; from pathlib import Path; from qnnctl.install.stream import ZipStream; "
            "part = Path(sys.argv[1]); data = part.read_bytes(); "
            "stream = ZipStream(Path(sys.argv[2]), min_size=0); stream.begin(part, len(data), 2 * len(data)); "
            "stream.extend(len(data)); print('begun')")
    part = tmp_path / "download.part"
    part.write_bytes(data[:4096])
    done = subprocess.run([sys.executable, "-c", code, str(part), str(tmp_path / "x")], capture_output=True,
                          text=True, timeout=20)
    assert (done.returncode, done.stdout, done.stderr) == (0, "begun\n", "")


def test_bytes_reported_before_the_download_begins_start_nothing(tmp_path: Path) -> None:
    stream = ZipStream(tmp_path / "x", min_size=0)
    stream.extend(4096)
    assert stream.close() is None
    assert not (tmp_path / "x").exists()


def _raw_zip(name: str, method: int, compressed: bytes, crc: int, size: int) -> bytes:
    """A zip of one member whose compressed data is given as is."""
    encoded = name.encode()
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(compressed), size,
                        len(encoded), 0) + encoded
    central = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 0, crc, len(compressed), size,
                          len(encoded), 0, 0, 0, 0, 0, 0) + encoded
    offset = len(local) + len(compressed)
    return (local + compressed + central
            + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(central), offset, 0))


def _zeros_zip(size: int, block: bytes) -> bytes:
    """A zip of sdk/zeros.bin, `size` zero bytes deflated to little: quick to download, slow to write."""
    deflate = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    # Each block compressed on its own (a full flush), so the same bytes stand for every one.
    piece = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(size // len(block)):
        crc = zlib.crc32(block, crc)
    return _raw_zip("sdk/zeros.bin", zipfile.ZIP_DEFLATED, piece * (size // len(block)) + b"\x03\x00", crc, size)


def test_a_stop_ends_the_file_being_written(tmp_path: Path, feed: Callable[..., _Feed]) -> None:
    """A member small in the archive and large on disk is written from memory, block after
    block: when the download starts over, the thread writing it stops at the next block."""
    size = 128 << 20
    block = bytes(1 << 20)
    data = _zeros_zip(size, block)
    stream = feed(data)
    stream.upto(len(data))
    target = stream.work / "sdk/zeros.bin"
    _wait_until(lambda: target.exists() and target.stat().st_size >= len(block), "the file to be written")
    with open(target, "rb") as handle:
        stream.stream.begin(stream.part, 0, len(data))  # from the start again
        assert stream.stream.close() is None
        written = os.fstat(handle.fileno()).st_size
    assert written < size
    assert not stream.work.exists()


# -- reading members in threads, after the download ---------------------------------------


def _patch_local_header(data: bytes, name: str, change: Callable[[bytearray, int], None]) -> bytes:
    out = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        change(out, zf.getinfo(name).header_offset)
    return bytes(out)


def _rename_locally(out: bytearray, offset: int) -> None:
    out[offset + 30] ^= 0x20  # the first letter of the name, in the local header only


def _mark_encrypted(out: bytearray, offset: int) -> None:
    out[offset + 6] |= 0x01


@pytest.mark.parametrize("damage", [_rename_locally, _mark_encrypted])
def test_local_header_is_checked(tmp_path: Path, damage: Callable[[bytearray, int], None]) -> None:
    archive = _archive(tmp_path)
    archive.write_bytes(_patch_local_header(archive.read_bytes(), f"{TOP}/QNN_README.txt", damage))
    with pytest.raises(IntegrityError, match=r"QNN_README\.txt' has a local header that disagrees with the central "
                       "directory"):
        extract(archive, tmp_path / "x")


def test_every_compression_method_is_read(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    build_sdk_tree(staging / TOP, SdkSpec(extra_files=MANY))
    archive = tmp_path / "methods.zip"
    methods = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
    expected = {}
    with zipfile.ZipFile(archive, "w") as zf:
        for index, path in enumerate(sorted(p for p in staging.rglob("*") if p.is_file())):
            rel = str(path.relative_to(staging / TOP))
            info = zipfile.ZipInfo(f"{TOP}/{rel}", date_time=(2025, 7, 24, 0, 0, 0))
            info.create_system = 3
            info.external_attr = (stat.S_IFREG | stat.S_IMODE(path.stat().st_mode)) << 16
            info.compress_type = methods[index % len(methods)]
            zf.writestr(info, path.read_bytes())
            expected[rel] = manifest_digest(path.read_bytes())
    result = extract(archive, tmp_path / "x")
    assert result.files == expected
    for rel, digest in expected.items():
        assert manifest_digest((result.root / rel).read_bytes()) == digest


@pytest.mark.parametrize("module", ["zlib", "zlib_ng.zlib_ng"])
def test_either_inflater_gives_the_same_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              module: str) -> None:
    """zlib-ng inflates when it is installed; the result is byte for byte the same."""
    inflater = pytest.importorskip(module)
    monkeypatch.setattr(qnnctl.install.memberdata, "_ZLIB", [inflater])
    archive = _archive(tmp_path, SdkSpec(extra_files={**MANY, "docs/payload.bin": PAYLOAD}))
    result = extract(archive, tmp_path / "x")
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            if stat.S_ISREG(info.external_attr >> 16):
                rel = info.filename.removeprefix(f"{TOP}/")
                assert result.files[rel] == manifest_digest(zf.read(info)), rel


@pytest.mark.parametrize("installed", [True, False], ids=["zlib-ng installed", "without zlib-ng"])
def test_zlib_ng_inflates_when_it_is_installed_else_zlib(monkeypatch: pytest.MonkeyPatch, installed: bool) -> None:
    """zlib-ng is a dependency; an environment that lost it still extracts, with zlib."""
    monkeypatch.setattr(qnnctl.install.memberdata, "_ZLIB", [])
    expected = importlib.import_module("zlib_ng.zlib_ng") if installed else zlib
    if not installed:
        for name in ("zlib_ng", "zlib_ng.zlib_ng"):
            monkeypatch.setitem(sys.modules, name, None)  # importing it raises ImportError
    assert qnnctl.install.memberdata.zlib_module() is expected
    assert qnnctl.install.memberdata._ZLIB == [expected]  # chosen once


_CLOSE_INTERRUPTED = """
import contextlib, logging, os, re, signal, sys, threading, time
from pathlib import Path
from qnnctl.install.stream import ZipStream

def held(path):
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
    return os.path.realpath(path) in found

logging.basicConfig(level=logging.DEBUG, format="%(message)s")
part, work, size = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
# Zeros inflate at gigabytes a second: a block written each 2 ms at most, so that the file is
# still being written when the Ctrl-C comes, however fast this machine is.
real_write = os.write
def paced_write(fd, data):
    time.sleep(0.002)
    return real_write(fd, data)
os.write = paced_write
stream = ZipStream(work, min_size=0)
stream.begin(part, 0, part.stat().st_size)
stream.extend(part.stat().st_size)
target = work / "sdk/zeros.bin"
while not (target.exists() and target.stat().st_size >= 1 << 20):
    time.sleep(0.001)

def waiting():
    # The function's name, or under mutation testing its copy's: x_wait_ended__mutmut_orig (or _N).
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None and (frame.f_globals["__name__"] != "qnnctl.threads"
                                 or not re.fullmatch(r"(x_)?wait_ended(__mutmut_\\w+)?", frame.f_code.co_name)):
        frame = frame.f_back
    return frame is not None

def ctrl_c():  # once close() waits for the thread
    while not waiting():
        time.sleep(0.001)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

threading.Thread(target=ctrl_c, daemon=True).start()
try:
    stream.close()
except KeyboardInterrupt:
    print("interrupted", target.stat().st_size < size)
print(stream.close(abandon=True), work.exists(), held(part))
"""


def test_ctrl_c_while_closing_stops_the_threads_and_keeps_nothing(tmp_path: Path) -> None:
    """Ctrl-C while close() waits for the file being written: the threads stop at the next
    block and the interrupt goes on to the caller; a close() after that, as a cleanup makes,
    keeps nothing and says why, and the partial file is no longer held open."""
    size = 256 << 20
    part = tmp_path / "download.part"
    part.write_bytes(_zeros_zip(size, bytes(1 << 20)))
    # SIGINT at its default: the child sends itself one.
    done = subprocess.run(with_default_sigint([sys.executable, "-c", _CLOSE_INTERRUPTED, str(part),
                                               str(tmp_path / "work" / "x"), str(size)]),
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "interrupted True\nNone False False\n"), done.stderr
    assert done.stderr == "nothing kept from extracting while downloading: interrupted\n"


def test_after_end_the_threads_finish_the_members_in_hand_and_take_no_more(tmp_path: Path) -> None:
    """The download complete (end()), the threads finish the member they are writing and take
    no other: the whole archive is there, and extract() writes the rest faster, in processes."""
    data = _zip(*[(f"sdk/f{i:02d}.txt", b"%d" % i * 3000) for i in range(20)])
    fed = _Feed(tmp_path, data, threads=1)
    writer = fed.stream._writer
    entered, release = threading.Event(), threading.Event()
    write = writer.write

    def held(*args: object, **kwargs: object) -> object:
        entered.set()
        assert release.wait(20)
        return write(*args, **kwargs)  # type: ignore[arg-type]

    writer.write = held  # type: ignore[method-assign,assignment]
    fed.upto(len(data))
    assert entered.wait(20)  # the first member is in hand, every other one is on disk
    fed.stream.end()
    release.set()
    # The thread ends on its own, before close() could tell it anything.
    _wait_until(lambda: not [t for t in threading.enumerate() if t.name == "qnnctl-stream"],
                "the stream's thread to end", timeout=20)
    streamed = fed.stream.close()
    assert _names(streamed) == ["sdk/f00.txt"]
    assert (fed.work / "sdk/f00.txt").read_bytes() == b"0" * 3000
    assert not (fed.work / "sdk/f01.txt").exists()


def test_closing_again_gives_the_same_answer(tmp_path: Path, feed: Callable[..., _Feed]) -> None:
    data = _zip(("sdk/a.txt", b"a" * 3000))
    stream = feed(data)
    streamed = stream.finish()
    assert _names(streamed) == ["sdk/a.txt"]
    assert stream.stream.close() == streamed
    assert not _held(stream.part)


def test_extract_takes_what_was_streamed_once_the_central_directory_is_read(
    tmp_path: Path, feed: Callable[..., _Feed]
) -> None:
    """extract() asks for what the stream wrote (its close(), which waits for the threads) once,
    after it has checked and read the central directory: an archive refused before that never
    waits for them, and its caller stops them (the installer's close(abandon=True))."""
    calls: list[str] = []
    good = _archive_with(tmp_path, "docs/guide.txt", b"guide " * 1000)
    stream = feed(good)
    stream.upto(len(good))

    def finish() -> Streamed | None:
        calls.append("finish")
        return stream.stream.close()

    archive = tmp_path / "good.zip"
    archive.write_bytes(good)
    result = extract(archive, stream.work, finish)
    assert calls == ["finish"]
    assert (result.root / "docs/guide.txt").read_bytes() == b"guide " * 1000

    calls.clear()
    hostile = hostile_archive(tmp_path, "zip", [Member("../escape.txt", "file", b"out")])
    with pytest.raises(IntegrityError):
        extract(hostile, tmp_path / "hostile", finish)
    assert calls == []

    calls.clear()
    tar = build_archive(tmp_path, "tar.gz", SdkSpec())
    extract(tar, tmp_path / "tar", finish)
    assert calls == ["finish"]  # nothing of a tar is streamed; the threads are still stopped


def test_a_member_streamed_from_other_bytes_than_the_archive_is_written_again(
    tmp_path: Path, feed: Callable[..., _Feed]
) -> None:
    """What the stream wrote is kept only where the local header it read is the one the central
    directory describes: a member streamed from other bytes (the same name and size, another
    CRC-32) is written again from the archive extracted, as if nothing had been streamed."""
    name = f"{TOP}/docs/guide.txt"
    stream = feed(_archive_with(tmp_path, "docs/guide.txt", b"guide " * 1000))
    streamed = stream.finish()
    assert name in _names(streamed)
    archive = tmp_path / "archive.zip"
    archive.write_bytes(_archive_with(tmp_path, "docs/guide.txt", b"GUIDE " * 1000))
    result = extract(archive, stream.work, lambda: streamed)
    assert (result.root / "docs/guide.txt").read_bytes() == b"GUIDE " * 1000
    assert _tree(result.root) == _tree(extract(archive, tmp_path / "plain").root)


def test_a_stream_that_kept_nothing_leaves_extract_a_work_folder(tmp_path: Path) -> None:
    """A stream whose download started over keeps nothing and removes the work folder when
    extract() asks for it, after extract() made the folder: extract() makes it again and writes
    every member itself."""
    data = _archive_with(tmp_path, "docs/guide.txt", b"guide " * 1000)
    part = tmp_path / "download.part"
    work = _stream_work(tmp_path)
    stream = ZipStream(work, min_size=0)
    stream.begin(part, 0, len(data))
    part.write_bytes(data)
    stream.extend(len(data))
    stream.begin(part, 0, len(data))  # started over: nothing it wrote can be trusted
    archive = tmp_path / "archive.zip"
    archive.write_bytes(data)
    result = extract(archive, work, stream.close)
    assert not _held(part)
    assert _tree(result.root) == _tree(extract(archive, tmp_path / "plain").root)


def test_a_work_folder_removed_meanwhile_is_no_error_when_nothing_is_kept(tmp_path: Path, log: Log) -> None:
    """close() removes what is left of the work folder when nothing is kept, whatever is left of
    it: here nothing, someone removed it; the download goes on to extract the archive itself."""
    data = _archive_with(tmp_path, "docs/guide.txt", b"guide " * 1000)
    part = tmp_path / "download.part"
    work = tmp_path / "work" / "x"
    stream = ZipStream(work, min_size=0)
    stream.begin(part, 0, len(data))
    part.write_bytes(data[:4096])
    stream.extend(4096)
    shutil.rmtree(work)
    stream.begin(part, 0, len(data))  # started over
    assert stream.close() is None
    assert log.find("nothing kept") == ["nothing kept from extracting while downloading: the download started over"]


def test_a_tar_whose_download_starts_over_is_installed(server: FaultServer, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> None:
    """A tar is never streamed, but its download is followed all the same: when it starts over,
    the stream keeps nothing and removes its folder as extract() takes it, which the tar must
    still be written into."""
    spec = SdkSpec(extra_files={**MANY, "docs/payload.bin": PAYLOAD})
    data = build_archive(tmp_path, "tar.gz", spec).read_bytes()
    _serve(server, monkeypatch, data)
    # The connection drops halfway; the server answers the resume with the whole file.
    server.fail(PATH, Fault.drop_after(len(data) // 2), Fault.ignore_range())
    result = _install()
    assert result.sdk is not None
    assert len(server.requests_for(PATH)) == 2
    manifest = _assert_complete_sdk(result.sdk.root)
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    _cache_is_tidy(cache_dir)


# -- deflate data every reader reads alike --------------------------------------------------------

# Raw deflate data (a dynamic block) whose literal/length code lengths zlib refuses ("invalid
# literal/lengths set"), and ISA-L's inflate decodes all the same, to b"b": found by flipping bits
# in zlib's output. zipfile, `unzip` and qnnctl's own readers of zip entries (link targets,
# zip_digests) inflate with zlib.
LENIENT = bytes.fromhex("edc6410d00000804a0aca7f6cfe0ec211b0f529d33111111111111914f59")


def _with_deflated_member(archive: Path, name: str, raw: bytes, content: bytes) -> bytes:
    """`archive` with a member `name` whose deflated data is `raw`, said to inflate to `content`
    (its CRC-32 and size, in its local header and the central directory alike)."""
    info = zipfile.ZipInfo(name, date_time=(2025, 7, 24, 0, 0, 0))
    info.create_system = 3
    info.external_attr = (stat.S_IFREG | 0o644) << 16
    with zipfile.ZipFile(archive, "a") as zf:
        zf.writestr(info, raw)  # stored, then said to be deflated
    data = bytearray(archive.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as zf:
        info = zf.getinfo(name)
    _, _, entries = _central_entries(bytes(data))
    fields = struct.pack("<H", zipfile.ZIP_DEFLATED), struct.pack("<3L", zlib.crc32(content), len(raw), len(content))
    data[info.header_offset + 8:info.header_offset + 10] = fields[0]
    data[info.header_offset + 14:info.header_offset + 26] = fields[1]
    at = entries[name].start
    data[at + 10:at + 12] = fields[0]
    data[at + 16:at + 28] = fields[1]
    return bytes(data)


@pytest.mark.parametrize("streamed", [False, True], ids=["extracted", "streamed"])
def test_deflate_data_zlib_refuses_is_refused(server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               cache_dir: Path, streamed: bool) -> None:
    """Two readers of one archive must not disagree: data that zipfile (and every reader built on
    zlib) refuses to inflate is not installed, whatever a more lenient inflater makes of it."""
    with pytest.raises(zlib.error, match="invalid literal/lengths set"):
        zlib.decompressobj(-zlib.MAX_WBITS).decompress(LENIENT)
    name = f"{TOP}/lib/x86_64-linux-clang/libLenient.so"
    data = _with_deflated_member(_archive(tmp_path), name, LENIENT, b"b")
    with zipfile.ZipFile(io.BytesIO(data)) as zf, pytest.raises(zlib.error):
        zf.read(name)
    if not streamed:
        archive = tmp_path / "lenient.zip"
        archive.write_bytes(data)
        with pytest.raises(IntegrityError, match="corrupt"):
            extract(archive, tmp_path / "x")
        return
    _serve(server, monkeypatch, data)
    server.fail(PATH, Fault.slow(4 << 10, 0.005))  # so that the member is streamed
    with pytest.raises(IntegrityError, match="corrupt"):
        _install()
    assert list((cache_dir / "sdks").iterdir()) == []


_EXTRACT_WITH = """
import importlib, json, sys
from pathlib import Path
import qnnctl.install.memberdata as memberdata
from qnnctl.install.archive import extract
memberdata._ZLIB[:] = [importlib.import_module(sys.argv[1])]
print(json.dumps(extract(Path(sys.argv[2]), Path(sys.argv[3])).files))
"""


@pytest.mark.parametrize("module", ["zlib", "zlib_ng.zlib_ng"])
def test_bytes_after_the_end_of_deflate_data_are_read_as_zipfile_reads_them(tmp_path: Path, module: str) -> None:
    """A member whose deflate data ends before its compressed size: zipfile ignores the rest,
    and so does the extraction, with every inflater (zlib's kept the rest as input for ever)."""
    pytest.importorskip(module)
    content = bytes(range(256)) * 10_000  # more than a block inflated at a time
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    raw = deflate.compress(content) + deflate.flush() + b"GARBAGE"
    name = f"{TOP}/docs/trailing.bin"
    archive = tmp_path / "trailing.zip"
    archive.write_bytes(_with_deflated_member(_archive(tmp_path), name, raw, content))
    with zipfile.ZipFile(archive) as zf:
        assert zf.read(name) == content
    done = subprocess.run([sys.executable, "-c", _EXTRACT_WITH, module, str(archive), str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["docs/trailing.bin"] == manifest_digest(content)


_CTRL_C_WHILE_CHECKING = """
import os, signal, sys, threading, time
import qnnctl.install.archive as archive, qnnctl.install.stream as stream
from qnnctl.cli import main
stream.STREAM_MIN = 0
# The stream's threads write slowly, so that they still have members in hand once the download
# is over, while the extraction checks the central directory; the Ctrl-C comes then.
real_write = os.write
def paced_write(fd, data):
    if threading.current_thread() is not threading.main_thread():
        time.sleep(0.05)
    return real_write(fd, data)
os.write = paced_write
real_check = archive.check_zip_file
def check_then_ctrl_c(path):
    busy = [t.name for t in threading.enumerate() if t.name.startswith(("qnnctl-stream", "qnnctl-extract"))]
    print("streaming while checking:", bool(busy), file=sys.stderr, flush=True)
    real_check(path)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    time.sleep(5)  # the Ctrl-C lands here
archive.check_zip_file = check_then_ctrl_c
sys.argv[0] = "qnnctl"
try:
    main()
finally:
    # As a process that goes on would see it (a caller of the library): no thread left writing
    # (a thread that has set its end takes a moment to leave threading's list).
    deadline = time.monotonic() + 0.02
    while True:
        left = [t.name for t in threading.enumerate() if t.name.startswith(("qnnctl-stream", "qnnctl-extract"))]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    print("threads left:", left, file=sys.stderr, flush=True)
    time.sleep(1)
"""


def test_ctrl_c_while_the_central_directory_is_checked_leaves_nothing_in_tmp(
    server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_dir: Path
) -> None:
    """Ctrl-C once the download is over, while extract() checks the central directory and the
    stream's threads still write: they are stopped and waited for, nothing stays in the cache's
    tmp folder, and the finished download is kept, so that the next run installs it without
    fetching it again."""
    spec = SdkSpec(extra_files={**MANY, "docs/payload.bin": os.urandom(8 << 20)})
    data = _archive(tmp_path, spec).read_bytes()
    _serve(server, monkeypatch, data)
    interrupted = subprocess.run(with_default_sigint([sys.executable, "-c", _CTRL_C_WHILE_CHECKING, "install"]),
                                 capture_output=True, text=True, timeout=120)
    assert interrupted.returncode == 130, interrupted.stderr
    assert "streaming while checking: True" in interrupted.stderr
    assert "threads left: []" in interrupted.stderr
    assert "qnnctl: interrupted; run the same command again to resume\n" in interrupted.stderr
    time.sleep(0.5)  # no thread of it goes on writing
    assert list((cache_dir / "tmp").iterdir()) == []
    assert list((cache_dir / "sdks").iterdir()) == []
    assert [p.name for p in (cache_dir / "downloads").iterdir() if not p.name.endswith(".json")] == [
        f"v{VERSION}.zip"]
    again = subprocess.run([sys.executable, "-m", "qnnctl", "install"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert len(server.requests_for(PATH)) == 1
    _assert_complete_sdk(cache_dir / "sdks" / VERSION)
    _cache_is_tidy(cache_dir)
