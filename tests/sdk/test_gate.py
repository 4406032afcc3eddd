"""The one gate, tried as an attacker would: a locked SDK installed by parts, whole, from a
file, and components added later, against archives built to walk around each check.

A project locks the genuine archive on one machine; on another, the mirror serves what an
attacker made of it. The trojan `libQnnHtp.so` is a real shared library whose constructor
writes a file when it is loaded: that file must never appear, whatever qnnctl is asked.
"""

from __future__ import annotations

import hashlib
import io
import struct
import zipfile
import zlib
from pathlib import Path

import pytest

from qnnctl.errors import IntegrityError
from qnnctl.install.zipindex import central_directory_sha256, end_records
from qnnctl.sdk import gate
from qnnctl.sdk.cache import read_manifest
from tests.conftest import run_qnnctl
from tests.forge import keep_crc32
from tests.httpserver import FaultServer
from tests.sdkfactory import VERSION, SdkSpec, build_archive, compile_shared

PATH = f"/{VERSION}/v{VERSION}.zip"
TOP = f"qairt/{VERSION}/"
HTP = "lib/x86_64-linux-clang/libQnnHtp.so"
STUB = "lib/aarch64-android/libQnnHtp.so"
LIBRARY_SIZE = 64 << 10  # both libraries padded to it: an ELF file loads with bytes after it


def trojan_library(folder: Path, mark: Path) -> bytes:
    """A real libQnnHtp.so whose constructor writes `mark` when it is loaded."""
    return compile_shared(folder / "trojan" / "libQnnHtp.so", (
        "#include <stdio.h>\n"
        "int f(void) { return 1; }\n"
        "__attribute__((constructor)) static void ran(void) {\n"
        f'    FILE *mark = fopen("{mark}", "w"); if (mark) {{ fputs("ran", mark); fclose(mark); }}\n'
        "}\n")).read_bytes()


class Kit:
    """The genuine archive, a trojan library of the same size and where it would leave its mark."""

    def __init__(self, folder: Path) -> None:
        self.mark = folder / "trojan-ran"
        genuine = compile_shared(folder / "genuine" / "libQnnHtp.so").read_bytes()
        trojan = trojan_library(folder, self.mark)
        assert max(len(genuine), len(trojan)) < LIBRARY_SIZE
        self.genuine_lib = genuine.ljust(LIBRARY_SIZE, b"\0")
        self.trojan_lib = trojan.ljust(LIBRARY_SIZE, b"\0")
        spec = SdkSpec(extra_files={HTP: self.genuine_lib, "docs/guide.txt": b"a guide\n" * 1000})
        # The two libraries stored, not deflated, as archivers store what does not compress.
        self.genuine = stored(build_archive(folder, "zip", spec).read_bytes(), {TOP + HTP, TOP + STUB})
        self.other = stored(build_archive(folder / "other", "zip", SdkSpec(extra_files={
            HTP: self.trojan_lib, "docs/guide.txt": b"another guide\n"})).read_bytes(), set())


def stored(data: bytes, names: set[str]) -> bytes:
    """The zip `data` written again, members in `names` stored rather than deflated."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            content = source.read(info)
            info.compress_type = zipfile.ZIP_STORED if info.filename in names else zipfile.ZIP_DEFLATED
            target.writestr(info, content)
    return out.getvalue()


def directory_of(data: bytes) -> bytes:
    records = end_records(data, len(data))
    return data[records.cd_start:records.tail_start]


def directory_digest(data: bytes) -> str:
    return central_directory_sha256(lambda offset, size: data[offset:offset + size], end_records(data, len(data)))


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Kit:
    return Kit(tmp_path_factory.mktemp("gate"))


@pytest.fixture
def locked(kit: Kit, server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project that locked the genuine archive (installed whole, then `qnnctl lock`), now on
    a machine whose cache is empty; the lock's path."""
    kit.mark.unlink(missing_ok=True)
    server.add(PATH, kit.genuine)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    assert run_qnnctl("install", VERSION).returncode == 0
    made = run_qnnctl("lock", VERSION)
    assert made.returncode == 0, made.stderr
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(tmp_path / "victim"))
    return Path(made.stdout.strip())


def refused(*args: str) -> str:
    """Run qnnctl; it must refuse with exit 4 and install nothing. Its stderr."""
    result = run_qnnctl(*args)
    assert (result.returncode, result.stdout) == (4, ""), result.stderr
    assert "nothing was installed" in result.stderr or "was not installed" in result.stderr, result.stderr
    return result.stderr


def nothing_ran(kit: Kit, tmp_path: Path) -> None:
    """Nothing installed, and the trojan never loaded: not by install, env, doctor or lower."""
    assert not (tmp_path / "victim" / "sdks" / VERSION).exists()
    assert run_qnnctl("env", VERSION).returncode != 0
    assert run_qnnctl("doctor", "--sdk", VERSION, "--offline").returncode != 0
    assert run_qnnctl("lower", "--sdk", VERSION, "--no-install", "--", "true").returncode != 0
    assert not kit.mark.exists()


def test_the_trojan_is_a_real_library_that_leaves_its_mark(kit: Kit, tmp_path: Path) -> None:
    """What the tests below prove rests on this: loading the trojan writes the mark."""
    import ctypes

    library = tmp_path / "libQnnHtp.so"
    library.write_bytes(kit.trojan_lib)
    kit.mark.unlink(missing_ok=True)
    ctypes.CDLL(str(library))
    assert kit.mark.read_text() == "ran"
    kit.mark.unlink()


def test_a_server_that_ignores_range_serves_another_build(kit: Kit, server: FaultServer, locked: Path,
                                                           tmp_path: Path) -> None:
    """Walk-around 1: the fallback to the whole archive is checked against the lock too."""
    server.add(PATH, kit.other)
    server.ignore_ranges = True
    said = refused("install", VERSION, "--locked", "--components", "host")
    assert f"its sha256 is {hashlib.sha256(kit.other).hexdigest()}, the lock pins" in said
    nothing_ran(kit, tmp_path)


def test_a_lock_without_component_digests_is_no_way_around(kit: Kit, server: FaultServer, locked: Path,
                                                           tmp_path: Path) -> None:
    """Walk-around 2: a lock that pins no digest of the components asked for (schema 1, or
    written without them) makes qnnctl fetch the whole archive and check it, not trust parts."""
    text = locked.read_text()
    lines = [line for line in text.splitlines() if not line.startswith("central_directory_sha256")]
    lines = lines[:lines.index("[sdk.component_sha256]")]
    locked.write_text("\n".join(lines).replace("schema = 2", "schema = 1") + "\n")
    server.add(PATH, kit.other)
    said = refused("install", VERSION, "--locked", "--components", "host")
    assert "pins the whole archive's sha256 and no component's: downloading the whole archive" in said
    assert f"its sha256 is {hashlib.sha256(kit.other).hexdigest()}, the lock pins" in said
    nothing_ran(kit, tmp_path)


def two_readings(genuine: bytes, trojan_lib: bytes, member: str = TOP + HTP) -> bytes:
    """The genuine members and, after them, a trojan member; the genuine central directory, byte
    for byte, with an end record whose comment ends the file (what a reader that takes that
    record sees); inside that comment a second directory, naming the trojan for libQnnHtp.so,
    and a second end record, which Python's zipfile takes as the last in the file."""
    records = end_records(genuine, len(genuine))
    members = genuine[:records.cd_start]
    directory = genuine[records.cd_start:records.tail_start]
    name = member.encode()
    crc = zlib.crc32(trojan_lib)
    trojan_at = len(members)
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, len(trojan_lib), len(trojan_lib),
                        len(name), 0) + name + trojan_lib
    second: list[bytes] = []
    with zipfile.ZipFile(io.BytesIO(genuine)) as zf:
        for info in zf.infolist():
            entry = directory_entry(directory, info)
            if info.filename == member:
                entry = (entry[:10] + struct.pack("<H", 0) + entry[12:16]
                         + struct.pack("<3L", crc, len(trojan_lib), len(trojan_lib)) + entry[28:42]
                         + struct.pack("<L", trojan_at) + entry[46:])
            second.append(entry)
    cd_at = trojan_at + len(local)
    count = records.entries
    second_at = cd_at + len(directory) + 22
    second_cd = b"".join(second)
    second_end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(second_cd), second_at, 5)
    comment = second_cd + second_end
    first_end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(directory), cd_at, len(comment))
    return members + local + directory + first_end + comment


def directory_entry(directory: bytes, info: zipfile.ZipInfo) -> bytes:
    """The central directory entry of `info`, as the archive holds it."""
    at = 0
    while at < len(directory):
        name_len, extra_len, comment_len = struct.unpack("<3H", directory[at + 28:at + 34])
        end = at + 46 + name_len + extra_len + comment_len
        if directory[at + 46:at + 46 + name_len] == info.orig_filename.encode():
            return directory[at:end]
        at = end
    raise AssertionError(f"{info.filename} is not in the directory")


@pytest.mark.parametrize("how", ["parts", "whole", "file", "file-parts"])
def test_two_readers_of_one_archive_never_disagree(kit: Kit, server: FaultServer, locked: Path, tmp_path: Path,
                                                   how: str) -> None:
    """Walk-around 3: the locked central directory kept byte for byte, a trojan member before it
    and a second directory hidden in the end record's comment. Python's zipfile reads the trojan;
    qnnctl refuses the archive on every way in."""
    attack = two_readings(kit.genuine, kit.trojan_lib)
    with zipfile.ZipFile(io.BytesIO(attack)) as zf:  # what makes it an attack
        assert zf.read(TOP + HTP) == kit.trojan_lib
    assert directory_of(kit.genuine) in attack
    server.add(PATH, attack)
    if how != "parts":
        locked.unlink()  # the lock's sha256 of the whole archive would refuse it first
    archive = tmp_path / f"v{VERSION}.zip"
    archive.write_bytes(attack)
    args = {"parts": ("install", VERSION, "--components", "host"), "whole": ("install", VERSION),
            "file": ("install", "--file", str(archive)),
            "file-parts": ("install", "--file", str(archive), "--components", "host")}[how]
    said = refused(*args)
    if how == "parts":
        # The lock pins the archive's size too, and the attack is longer: refused from the probe's
        # Content-Range, before a byte of it is kept (the two readings are refused below otherwise).
        assert (f"is longer than {len(kit.genuine)} bytes, the size {locked} pins (it says the file is "
                f"{len(attack)} bytes)") in said, said
    else:
        assert "more than one end of central directory record" in said
    nothing_ran(kit, tmp_path)


def crc_kept(genuine: bytes, name: str, replacement: bytes) -> bytes:
    """The archive with the stored member `name` replaced by `replacement` (of its size), whose
    last four bytes are chosen to keep the member's CRC-32: the central directory and the local
    header do not change by a byte."""
    with zipfile.ZipFile(io.BytesIO(genuine)) as zf:
        info = zf.getinfo(name)
        assert info.compress_type == zipfile.ZIP_STORED
        assert len(replacement) == info.file_size
        forged = keep_crc32(replacement, len(replacement) - 4, info.CRC)
        assert forged != zf.read(info)
    data_at = info.header_offset + 30 + len(info.orig_filename.encode()) + len(info.extra)
    attack = genuine[:data_at] + forged + genuine[data_at + len(forged):]
    assert directory_digest(attack) == directory_digest(genuine)
    with zipfile.ZipFile(io.BytesIO(attack)) as zf:
        assert zf.testzip() is None  # every CRC-32 checks
        assert zf.read(name) == forged
    return attack


def test_a_member_whose_crc32_was_kept_is_refused_by_its_sha256(kit: Kit, server: FaultServer, locked: Path,
                                                                  tmp_path: Path) -> None:
    """Walk-around 4: the trojan takes the genuine library's place with its CRC-32 restored; the
    lock's digest of the host component, over each member's sha256, does not match."""
    server.add(PATH, crc_kept(kit.genuine, TOP + HTP, kit.trojan_lib))
    said = refused("install", VERSION, "--locked", "--components", "host")
    assert "does not match" in said
    assert "the digest of its component host is" in said
    nothing_ran(kit, tmp_path)


def test_an_honest_install_by_parts_and_components_added_later_are_checked(
        kit: Kit, server: FaultServer, locked: Path, tmp_path: Path) -> None:
    """Under --locked, host by parts installs; android added later from an archive whose stub
    was changed with its CRC-32 kept is refused (the SDK keeps only host); the genuine one is
    added."""
    served_before = server.served_for(PATH)
    host = run_qnnctl("install", VERSION, "--locked", "--components", "host")
    assert host.returncode == 0, host.stderr
    root = Path(host.stdout.strip())
    assert (root / HTP).read_bytes() == kit.genuine_lib
    assert (read_manifest(root) or {}).get("partial") is True  # by parts: Range requests
    assert {served.status for served in server.served_for(PATH)[len(served_before):]} == {206}
    server.add(PATH, crc_kept(kit.genuine, TOP + STUB, b"\x7fEVIL-androidstub"))
    said = refused("install", VERSION, "--locked", "--components", "android")
    assert "the digest of its component android is" in said
    assert not (root / STUB).exists()
    assert (root / HTP).read_bytes() == kit.genuine_lib
    server.add(PATH, kit.genuine)
    added = run_qnnctl("install", VERSION, "--locked", "--components", "android")
    assert added.returncode == 0, added.stderr
    assert (root / STUB).read_bytes() == b"\x7fELF-android-stub"
    checked = run_qnnctl("lock", "--check")
    assert checked.returncode == 0, checked.stderr
    assert "matches" in checked.stderr


# The gate's own rules, on the descriptions it compares: each way in above ends in these.

A = "a" * 64
B = "b" * 64
LOCK = gate.Expected("project/qnnctl.lock", "the lock", "pins", "run `qnnctl lock` again", sha256=A, size=10,
                     components={"host": "h" * 64, "android": "d" * 64}, central_directory_sha256="c" * 64)
PARTS = gate.Expected("the archive host came from", "it", "says", "install the whole SDK again",
                      central_directory_sha256="c" * 64, by_directory=True)


def refusal(expected: list[gate.Expected], observed: gate.Observed) -> IntegrityError:
    with pytest.raises(IntegrityError) as refused:
        gate.check(expected, observed)
    assert refused.value.exit_code == 4
    return refused.value


@pytest.mark.parametrize(("value", "digest"), [
    (A, True), ("0123456789abcdef" * 4, True), (A[:63], False), (A + "a", False), ("A" * 64, False),
    ("g" * 64, False), ("X" * 64, False), (b"a" * 64, False), (None, False), ("", False)])
def test_a_sha256_is_64_lowercase_hex_digits(value: object, digest: bool) -> None:
    assert gate.is_sha256(value) is digest


def test_sha256_given_on_the_command_line_is_an_expectation() -> None:
    assert gate.given_sha256(None) is None
    assert gate.given_sha256(A) == gate.Expected(
        "--sha256", "--sha256", "expects", "check the --sha256 value, or the archive's source", sha256=A)


def test_sources_that_pin_two_sha256s_are_refused_before_anything_is_fetched() -> None:
    given = gate.given_sha256(B)
    assert given is not None
    gate.agree([])
    gate.agree([LOCK, PARTS, LOCK._replace(source="the index")])  # one sha256, and one source with none
    with pytest.raises(IntegrityError) as refused:
        gate.agree([PARTS, LOCK, given])
    assert refused.value.exit_code == 4
    assert refused.value.message == (f"project/qnnctl.lock expects sha256 {A}, but --sha256 expects {B}; "
                                     "nothing was fetched")
    assert refused.value.hint == ("find out which is right; `qnnctl lock VERSION` writes the lock again, "
                                  "`qnnctl mirror DIR VERSION` the mirror's index")
    with pytest.raises(IntegrityError, match=f"^project/qnnctl.lock expects sha256 {A}, but --sha256 expects {B};"):
        gate.agree([LOCK, LOCK, given])


def test_an_install_by_parts_is_whole_when_a_source_cannot_check_its_parts() -> None:
    assert gate.why_whole([], ["host"]) is None
    assert gate.why_whole([LOCK, PARTS], ["host", "android"]) is None
    assert gate.why_whole([PARTS._replace(sha256=A)], ["host"]) is None  # the directory alone vouches for it
    whole_only = gate.given_sha256(A)
    assert whole_only is not None
    assert gate.why_whole([LOCK, whole_only], ["host"]) == (
        "--sha256 expects the whole archive's sha256 and no component's")
    index = LOCK._replace(source="the mirror's index", says="says", components={"host": "h" * 64})
    assert gate.why_whole([PARTS, index], ["host", "android", "docs"]) == (
        "the mirror's index says no digest of android, docs")
    assert gate.why_whole([index._replace(sha256=None)], ["docs"]) == "the mirror's index says no digest of docs"


def test_an_install_by_parts_on_another_host_than_x86_64_is_of_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """Digests partition an SDK as on x86_64 on every host: elsewhere, components' digests cannot
    check some components, and the whole SDK is installed (and checked whole)."""
    given = gate.given_sha256(A)
    assert given is not None
    monkeypatch.setenv("QNNCTL_FORCE_MACHINE", "x86_64")
    assert gate.why_all([LOCK, PARTS], ["host"]) is None
    monkeypatch.setenv("QNNCTL_FORCE_MACHINE", "aarch64")
    said = ("components' digests as on Linux x86_64, which do not cover this Linux aarch64 host's components")
    assert gate.why_all([LOCK, PARTS], ["host"]) == f"project/qnnctl.lock pins {said}"
    assert gate.why_all([given, PARTS, LOCK], ["host", "android"]) == f"project/qnnctl.lock pins {said}"
    index = LOCK._replace(source="the mirror's index", says="says", components={})
    assert gate.why_all([index, LOCK], ["docs"]) == f"the mirror's index says {said}"
    assert gate.why_all([LOCK], ["all"]) is None  # the whole SDK asked for already
    assert gate.why_all([LOCK], ["host", "all"]) is None
    assert gate.why_all([given, PARTS], ["host"]) is None  # nothing here pins components
    assert gate.why_all([], ["host"]) is None


def test_the_whole_archive_is_checked_by_sha256_and_size() -> None:
    gate.check([LOCK], gate.Observed("https://mirror/sdk.zip", sha256=A, size=10))
    gate.check([LOCK._replace(size=None)], gate.Observed("https://mirror/sdk.zip", sha256=A, size=11))
    gate.check([LOCK], gate.Observed("https://mirror/sdk.zip", sha256=A))
    wrong = refusal([LOCK, PARTS], gate.Observed("https://mirror/sdk.zip", sha256=B, size=10))
    assert wrong.message == (f"the archive from https://mirror/sdk.zip does not match project/qnnctl.lock: "
                             f"its sha256 is {B}, the lock pins {A}; nothing was installed")
    assert wrong.hint == "run `qnnctl lock` again"
    longer = refusal([LOCK], gate.Observed("sdk.zip", sha256=A, size=11))
    assert longer.message == ("project/qnnctl.lock contradicts itself: the archive from sdk.zip has the sha256 the "
                              "lock pins, but its size is 11, and the lock pins 10; nothing was installed")
    # Read whole, the archive's sha256 decides; its components, once extracted, and its central
    # directory must then be the ones the lock pins, or the lock contradicts itself (an edited lock
    # vouches for nothing).
    gate.check([LOCK], gate.Observed("sdk.zip", sha256=A, size=10, components={"host": "h" * 64},
                                     central_directory_sha256="c" * 64))
    directory = refusal([LOCK], gate.Observed("sdk.zip", sha256=A, size=10, central_directory_sha256="x" * 64))
    assert directory.message == (
        f"project/qnnctl.lock contradicts itself: the archive from sdk.zip has the sha256 the lock pins, but its "
        f"central directory's sha256 is {'x' * 64}, and the lock pins {'c' * 64}; nothing was installed")
    contradicted = refusal([LOCK], gate.Observed("sdk.zip", sha256=A, size=10, components={"host": "x" * 64}))
    assert contradicted.message == (
        f"project/qnnctl.lock contradicts itself: the archive from sdk.zip has the sha256 the lock pins, but the "
        f"digest of its component host is {'x' * 64}, and the lock pins {'h' * 64}; nothing was installed")
    assert contradicted.hint == "run `qnnctl lock` again"
    unpinned = refusal([LOCK], gate.Observed("sdk.zip", sha256=A, components={"docs": "x" * 64}))
    assert "the digest of its component docs is " + "x" * 64 + ", and the lock pins none" in unpinned.message


def test_every_source_is_checked() -> None:
    index = LOCK._replace(source="the mirror's index", name="the index", says="says", sha256=B)
    wrong = refusal([LOCK, index], gate.Observed("sdk.zip", sha256=A, size=10))
    assert wrong.message.startswith("the archive from sdk.zip does not match the mirror's index: its sha256 is ")


def test_parts_are_checked_by_their_digests() -> None:
    host = {"host": "h" * 64}
    gate.check([LOCK], gate.Observed("sdk.zip", components=host))
    gate.check([LOCK], gate.Observed("sdk.zip", components=host, central_directory_sha256="c" * 64))
    gate.check([LOCK], gate.Observed("sdk.zip", components={"android": "d" * 64, "host": "h" * 64}))
    changed = refusal([LOCK], gate.Observed("sdk.zip", components={"android": "d" * 64, "host": "e" * 64}))
    assert changed.message == ("the archive from sdk.zip does not match project/qnnctl.lock: the digest of its "
                               f"component host is {'e' * 64}, the lock pins {'h' * 64}; nothing was installed")
    assert changed.hint == "run `qnnctl lock` again"
    unknown = refusal([LOCK], gate.Observed("sdk.zip", components={"docs": "f" * 64, "host": "h" * 64}))
    assert unknown.message == ("the archive from sdk.zip cannot be checked against project/qnnctl.lock: "
                               "it has no digest of the component docs; nothing was installed")
    assert unknown.hint == "run `qnnctl lock` again"
    # The parts' digests match, and the directory they were read from is another one.
    moved = refusal([LOCK], gate.Observed("sdk.zip", components=host, central_directory_sha256="9" * 64))
    assert moved.message == ("the archive from sdk.zip does not match project/qnnctl.lock: its central "
                             f"directory's sha256 is {'9' * 64}, the lock pins {'c' * 64}; nothing was installed")


def test_a_lock_never_vouches_for_parts_by_their_directory_alone() -> None:
    none_written = refusal([LOCK], gate.Observed("sdk.zip", components={}, central_directory_sha256="c" * 64))
    assert none_written.message == ("the archive from sdk.zip cannot be checked against project/qnnctl.lock: "
                                    "nothing it pins was observed on this way in; nothing was installed")
    assert none_written.hint == "run `qnnctl lock` again"
    directory_only = refusal([LOCK], gate.Observed("sdk.zip", central_directory_sha256="c" * 64))
    assert directory_only.message == (
        "the archive from sdk.zip cannot be checked against project/qnnctl.lock: it pins components' digests, "
        "and none were computed on this way in; nothing was installed")


def test_the_archive_components_came_from_vouches_by_its_directory() -> None:
    gate.check([PARTS], gate.Observed("sdk.zip", central_directory_sha256="c" * 64))
    gate.check([PARTS], gate.Observed("sdk.zip", components={}, central_directory_sha256="c" * 64))
    changed = refusal([PARTS], gate.Observed("sdk.zip", central_directory_sha256="9" * 64))
    assert changed.message == ("the archive from sdk.zip does not match the archive host came from: its central "
                               f"directory's sha256 is {'9' * 64}, it says {'c' * 64}; nothing was installed")
    assert changed.hint == "install the whole SDK again"
    unread = refusal([PARTS], gate.Observed("sdk.zip", components={"host": "h" * 64}))
    assert unread.message == ("the archive from sdk.zip cannot be checked against the archive host came from: "
                              "nothing it pins was observed on this way in; nothing was installed")
    assert unread.hint == "install the whole SDK again"


def test_a_whole_archive_sha256_cannot_check_part_of_an_archive() -> None:
    given = gate.given_sha256(A)
    assert given is not None
    parts = refusal([given], gate.Observed("https://mirror/sdk.zip", components={"host": "h" * 64},
                                           central_directory_sha256="c" * 64))
    assert parts.message == (
        "the archive from https://mirror/sdk.zip cannot be checked against --sha256: it expects only the whole "
        "archive's sha256, and only part of the archive was read; nothing was installed")
    assert parts.hint == "check the --sha256 value, or the archive's source"
    # A lock that pins components too says what else it lacked.
    unread = refusal([LOCK._replace(central_directory_sha256=None)], gate.Observed("sdk.zip"))
    assert unread.message.endswith(": it pins components' digests, and none were computed on this way in; "
                                   "nothing was installed")


def test_a_download_may_stop_at_the_fewest_bytes_pinned_with_a_sha256() -> None:
    """`size_limit`: the smallest size that something pinning the archive's sha256 gives, and who
    gives it, as the message names them; a size given without a sha256 pins nothing."""
    index = gate.Expected("https://mirror/index.json", "the index", "says", "", sha256=A, size=12)
    lock = gate.Expected("project/qnnctl.lock", "the lock", "pins", "", sha256=A, size=10)
    sized = gate.Expected("a listing", "it", "lists", "", size=3)  # no sha256: vouches for no size
    most = (gate.MOST_ARCHIVE, "qnnctl takes as the most any SDK archive is")
    assert gate.size_limit([]) == most
    assert gate.size_limit([sized]) == most
    assert gate.size_limit([sized, index]) == (12, "https://mirror/index.json says")
    assert gate.size_limit([index, lock, sized]) == (10, "project/qnnctl.lock pins")
    assert gate.size_limit([lock, index]) == (10, "project/qnnctl.lock pins")
    # Sizes of 0 and 1 pinned: the smaller, whichever comes first.
    empty = gate.Expected("an empty pin", "it", "pins", "", sha256=A, size=0)
    one = gate.Expected("a one-byte pin", "it", "pins", "", sha256=A, size=1)
    assert gate.size_limit([one, empty]) == (0, "an empty pin pins")
    assert gate.size_limit([empty, one]) == (0, "an empty pin pins")
