"""The packages host libraries come in: .deb, RPM and tar, read through maintained libraries.

python-debian's DebFile finds a .deb's parts and Deb822 reads its control file; arpy reads
the `ar` table under it, rpmfile an RPM's lead and headers; tarfile reads every tar. What
stays here is what they lack: bounds they do not check, zstd in-process (the readers and
decompressors are in `streams`), and the cpio payload of an RPM with its hard links (see
rpm_members).

Every reader yields the package's members one at a time, in archive order, as `Member`s;
`collect()` keeps only the members a caller asks for. Nothing is written by member name:
wanted files land under numbered names in a folder of the caller's choosing, and links are
kept as data and followed inside the package (`Collected.resolve`), never on disk.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import lzma
import os
import posixpath
import stat
import struct
import tarfile
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import arpy
from debian.arfile import ArError
from debian.deb822 import Deb822
from debian.debfile import INFO_PART, PART_EXTS, DebFile
from rpmfile.errors import RPMError
from rpmfile.headers import get_headers

from qnnctl.errors import IntegrityError, UsageError
from qnnctl.host.streams import (
    BZIP2_MAGIC,
    COPY_BUFFER,
    GZIP_MAGIC,
    XZ_MAGIC,
    ZSTD_MAGIC,
    Bounded,
    HashingReader,
    Passthrough,
    bounded_tar,
    buffered,
    corrupt,
    decompressed,
    peek,
    read_exact,
)

if TYPE_CHECKING:
    from debian.debfile import DebFile

log = logging.getLogger("qnnctl.host.packages")

AR_MAGIC = b"!<arch>\n"
RPM_LEAD_MAGIC = b"\xed\xab\xee\xdb"
RPM_HEADER_MAGIC = b"\x8e\xad\xe8\x01"
CPIO_NEWC = (b"070701", b"070702")
MAX_LINK_HOPS = 40
# Errors the standard decompressors and tarfile raise on damaged input.
CORRUPT = (tarfile.TarError, EOFError, lzma.LZMAError, zlib.error, gzip.BadGzipFile, struct.error)

FILE = "file"
SYMLINK = "symlink"
HARDLINK = "hardlink"
DIRECTORY = "dir"
OTHER = "other"


@dataclass
class Member:
    """One entry of a package. `data` is readable only until the next member is asked for."""

    name: str  # normalized: no leading "./" or "/"
    kind: str  # FILE, SYMLINK, HARDLINK, DIRECTORY or OTHER
    size: int = 0
    mode: int = 0o644
    linkname: str = ""  # symlink target as stored; for a hard link, the member it repeats
    data: IO[bytes] | None = None


def member_name(name: str) -> str:
    """A member path without "./", a leading "/" or "." components."""
    name = posixpath.normpath("/" + name.replace("\x00", "")).lstrip("/")
    return "" if name == "." else name


# -- tar ---------------------------------------------------------------------------------


def tar_members(stream: IO[bytes], source: str) -> Iterator[Member]:
    """The members of a tar stream (plain or compressed), read once, in order."""
    stream = buffered(Passthrough(stream)) if not hasattr(stream, "peek") else stream
    plain = decompressed(stream, peek(stream, 8), source)
    for tf, info in bounded_tar(fileobj=plain, mode="r|"):
        name = member_name(info.name)
        if info.isreg():
            yield Member(name, FILE, info.size, stat.S_IMODE(info.mode), "", tf.extractfile(info))
        elif info.issym():
            yield Member(name, SYMLINK, 0, 0o777, info.linkname)
        elif info.islnk():
            yield Member(name, HARDLINK, 0, stat.S_IMODE(info.mode), member_name(info.linkname))
        elif info.isdir():
            yield Member(name, DIRECTORY, 0, stat.S_IMODE(info.mode))
        else:
            yield Member(name, OTHER)


# -- ar and .deb -------------------------------------------------------------------------


@dataclass(frozen=True)
class ArMember:
    name: str
    offset: int
    size: int


def ar_members(handle: IO[bytes], source: str) -> list[ArMember]:
    """The table of an `ar` archive (the container of a .deb), read by arpy.

    Every size is checked before the next header is asked for: arpy, like python-debian's
    ArFile, steps back on a negative size and reads the same header for ever.
    """
    handle.seek(0, os.SEEK_END)
    total = handle.tell()
    handle.seek(0)
    if handle.read(8) != AR_MAGIC:
        raise UsageError(f"{source} is not an ar archive (.deb)")
    handle.seek(0)
    members: list[ArMember] = []
    try:
        archive = arpy.Archive(fileobj=handle)
        while (header := archive.read_next_header()) is not None:
            if header.name is None:  # a GNU symbol or name table: no member of its own
                continue
            name = header.name.decode("utf-8", errors="surrogateescape")
            if header.size < 0 or header.file_offset + header.size > total:
                raise corrupt(source, f"ar member {name!r} runs past the end of the file")
            members.append(ArMember(name, header.file_offset, header.size))
    except arpy.ArchiveFormatError as exc:
        raise corrupt(source, f"bad ar member header: {exc}") from None
    return members


def _open_deb(handle: IO[bytes], source: str) -> DebFile:
    """A python-debian DebFile over `handle`, once arpy has found every member inside the file."""
    members = ar_members(handle, source)
    if not members or members[0].name != INFO_PART:
        raise corrupt(source, f"the first member is not {INFO_PART}")
    handle.seek(0)
    try:
        deb = DebFile(fileobj=cast(Any, handle))
    except (ArError, ValueError) as exc:  # DebError is an ArError: a missing or doubled part
        raise corrupt(source, exc) from None
    except OSError as exc:
        if exc.errno is not None:  # the disk, not the package
            raise
        raise corrupt(source, exc) from None  # ArFile's "Incorrect file magic" and the like
    if not deb.version.startswith(b"2."):
        raise UsageError(f"{source}: unsupported .deb format version")
    return deb


def _deb_part(deb: DebFile, prefix: str, source: str) -> Iterator[Member]:
    """The members of the control.tar.* or data.tar.* that DebFile found.

    The tar is read here, streamed, rather than through DebPart.tgz(): that runs `unzstd`
    and holds its whole output in memory for a .zst part (what Ubuntu's dpkg writes).
    """
    names = {prefix, *(f"{prefix}.{ext}" for ext in PART_EXTS)}
    name = next(n for n in deb.getnames() if n in names)  # DebFile checked there is one
    yield from tar_members(cast(IO[bytes], deb.getmember(name)), source)


@dataclass(frozen=True)
class DebInfo:
    package: str
    version: str
    architecture: str
    fields: dict[str, str] = field(default_factory=dict)


def parse_control(text: str) -> dict[str, str]:
    """The fields of the first Debian control paragraph (python-debian's Deb822);
    continuation lines join their field, one per line, without their indent."""
    paragraph = Deb822(text.splitlines())
    return {str(key): "\n".join(line.strip() for line in value.splitlines()) for key, value in paragraph.items()}


def deb_info(path: Path, source: str | None = None) -> DebInfo:
    """Package, Version and Architecture from a .deb's control file; `source` names it in errors."""
    source = source or path.name
    with open(path, "rb") as handle:
        deb = _open_deb(handle, source)
        try:
            for entry in _deb_part(deb, "control.tar", source):
                if entry.name == "control" and entry.kind == FILE and entry.data is not None:
                    text = entry.data.read(1 << 20).decode("utf-8", errors="replace")
                    fields = parse_control(text)
                    return DebInfo(fields.get("Package", ""), fields.get("Version", ""),
                                   fields.get("Architecture", ""), fields)
        except CORRUPT as exc:
            raise corrupt(source, exc) from None
    raise corrupt(source, "control.tar holds no control file")


def deb_members(path: Path, source: str | None = None) -> Iterator[Member]:
    """The members of a .deb's data.tar.*, streamed from the file."""
    source = source or path.name
    with open(path, "rb") as handle:
        yield from _deb_part(_open_deb(handle, source), "data.tar", source)


# -- RPM ---------------------------------------------------------------------------------

PGPHASHALGO_SHA256 = 8
# What rpmfile's header reader raises on damaged input; `assert` on the magic among them
# (and under `python -O` not even that, hence the magic checks in rpm_info).
_RPM_DAMAGE = (struct.error, ValueError, TypeError, AssertionError)


@dataclass(frozen=True)
class RpmInfo:
    name: str
    version: str
    release: str
    arch: str
    compressor: str
    payload_offset: int
    payload_sha256: str | None  # of the compressed payload, when the header records one


class _PastTheEnd(Exception):
    pass


class _Exact:
    """A file whose reads return all that is asked or raise _PastTheEnd: rpmfile takes a
    short read for the data it wanted, and sizes come from the file."""

    def __init__(self, handle: IO[bytes], total: int) -> None:
        self.handle = handle
        self.total = total

    def read(self, size: int) -> bytes:
        if size < 0 or self.handle.tell() + size > self.total:
            raise _PastTheEnd
        return self.handle.read(size)

    def tell(self) -> int:
        return self.handle.tell()


def _text(value: Any) -> str:
    """One header value as text: rpmfile gives bytes, a list of them, or ints."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def rpm_info(handle: IO[bytes], source: str) -> RpmInfo:
    """Lead, signature and header (rpmfile reads the tags); leave `handle` at the payload."""
    handle.seek(0, os.SEEK_END)
    total = handle.tell()
    handle.seek(0)
    lead = handle.read(100)
    if len(lead) < 96 or lead[:4] != RPM_LEAD_MAGIC:
        raise UsageError(f"{source} is not an RPM package")
    if lead[4] < 3:
        raise UsageError(f"{source}: RPM format {lead[4]} is too old to read")
    if lead[96:] != RPM_HEADER_MAGIC[: len(lead) - 96]:
        raise corrupt(source, "bad RPM header magic")
    handle.seek(0)
    try:
        (start, end), tags = get_headers(_Exact(handle, total))
    except _PastTheEnd:
        raise corrupt(source, "the RPM header runs past the end of the file") from None
    except (RPMError, *_RPM_DAMAGE) as exc:
        raise corrupt(source, f"bad RPM header: {str(exc) or type(exc).__name__}") from None
    handle.seek(start)
    raw = handle.read(end - start)
    if not raw.startswith(RPM_HEADER_MAGIC):
        raise corrupt(source, "bad RPM header magic")
    header_sha256 = _text(tags.get("sha256"))  # from the signature
    if header_sha256 and hashlib.sha256(raw).hexdigest() != header_sha256.lower():
        raise corrupt(source, "the RPM header does not match its sha256 in the signature")
    payload_format = _text(tags.get("archive_format")) or "cpio"
    if payload_format != "cpio":
        raise UsageError(f"{source}: RPM payload format {payload_format!r} is not supported")
    digest = _text(tags.get("payloaddigest"))
    algo = _text(tags.get("payloaddigestalgo"))
    handle.seek(end)
    return RpmInfo(
        name=_text(tags.get("name")),
        version=_text(tags.get("version")),
        release=_text(tags.get("release")),
        arch=_text(tags.get("arch")),
        compressor=_text(tags.get("archive_compression")) or "gzip",
        payload_offset=end,
        payload_sha256=digest.lower() if digest and algo == str(PGPHASHALGO_SHA256) else None,
    )


def rpm_members(path: Path, source: str | None = None) -> Iterator[Member]:
    """The files of an RPM's cpio payload (xz, zstd, gzip, bzip2 or none), streamed.

    The payload is read here, not through rpmfile.RPMFile: its index of the cpio keeps
    neither inode nor link count (a payload's hard links are lost), takes a payload
    compressed with "none" or "lzma" for gzip, and holds a zstd one whole in memory.
    """
    # rpmfile's reader decompresses an xz payload twice: 44% more CPU on `install --runtime` (bench/README.md).
    source = source or path.name
    with open(path, "rb") as handle:
        info = rpm_info(handle, source)
        hashing = HashingReader(handle)
        raw = buffered(hashing)
        head = peek(raw, 8)
        if info.compressor == "zstd" and not head.startswith(ZSTD_MAGIC):
            raise corrupt(source, "the payload is not zstd data as the header says")
        payload = decompressed(raw, head, source)
        yield from cpio_members(payload, source)
        hashing.drain()
        if info.payload_sha256 is not None and hashing.sha256.hexdigest() != info.payload_sha256:
            raise corrupt(source, "the RPM payload does not match its sha256 in the header")


# -- cpio (newc) -------------------------------------------------------------------------


def cpio_members(stream: IO[bytes], source: str) -> Iterator[Member]:
    """The members of a cpio "newc" stream (the RPM payload format), in order."""
    position = 0
    # newc stores a hard-linked file's data once, with its last name; earlier names are empty.
    pending_links: dict[tuple[int, int, int], list[str]] = {}
    while True:
        header = read_exact(stream, 110)
        position += 110
        magic = header[:6]
        if magic == b"07070X":
            raise UsageError(f"{source}: the payload uses RPM's large-file cpio format, not supported")
        if magic not in CPIO_NEWC:
            raise corrupt(source, f"bad cpio header at payload byte {position - 110}")
        try:
            values = [int(header[6 + 8 * i : 14 + 8 * i], 16) for i in range(13)]
        except ValueError:
            raise corrupt(source, f"bad cpio header at payload byte {position - 110}") from None
        ino, mode, _uid, _gid, nlink, _mtime, size, devmajor, devminor = values[:9]
        name_size = values[11]
        raw_name = read_exact(stream, name_size)
        position += name_size
        pad = (-position) % 4
        read_exact(stream, pad)
        position += pad
        name = raw_name.rstrip(b"\x00").decode("utf-8", errors="surrogateescape")
        if name == "TRAILER!!!":
            return
        data = Bounded(stream, size)
        kind = stat.S_IFMT(mode)
        member_key = (devmajor, devminor, ino)
        clean = member_name(name)
        if kind == stat.S_IFREG:
            if size == 0 and nlink > 1:
                pending_links.setdefault(member_key, []).append(clean)
            else:
                yield Member(clean, FILE, size, stat.S_IMODE(mode), "", buffered(data))
                for other in pending_links.pop(member_key, []):
                    yield Member(other, HARDLINK, 0, stat.S_IMODE(mode), clean)
        elif kind == stat.S_IFLNK:
            target = read_exact(buffered(data), size).decode("utf-8", errors="surrogateescape") if size else ""
            yield Member(clean, SYMLINK, 0, 0o777, target)
        elif kind == stat.S_IFDIR:
            yield Member(clean, DIRECTORY, 0, stat.S_IMODE(mode))
        else:
            yield Member(clean, OTHER)
        data.skip()
        position += size
        pad = (-position) % 4
        read_exact(stream, pad)
        position += pad


# -- one entry point for every kind of package -------------------------------------------


def package_kind(path: Path) -> str:
    """"deb", "rpm" or "tar", from the file's first bytes."""
    with open(path, "rb") as handle:
        return kind_of(handle.read(512), path)


def kind_of(head: bytes, path: Path) -> str:
    """"deb", "rpm" or "tar", from a file's first 512 bytes (`head`); UsageError for anything else."""
    if head.startswith(AR_MAGIC):
        return "deb"
    if head.startswith(RPM_LEAD_MAGIC):
        return "rpm"
    if head.startswith((XZ_MAGIC, GZIP_MAGIC, BZIP2_MAGIC, ZSTD_MAGIC)) or head[257:262] == b"ustar":
        return "tar"
    raise UsageError(
        f"{path} is not a .deb, .rpm or tar archive",
        hint="give a package file (.deb, .rpm, .tar.xz) or a folder holding the libraries",
    )


def package_members(path: Path, source: str | None = None) -> Iterator[Member]:
    """The members of a .deb (its data.tar), an RPM (its payload) or a tar archive."""
    kind = package_kind(path)
    if kind == "deb":
        yield from deb_members(path, source)
    elif kind == "rpm":
        yield from rpm_members(path, source)
    else:
        with open(path, "rb") as handle:
            yield from tar_members(buffered(Passthrough(handle)), source or path.name)


# -- keeping what is wanted --------------------------------------------------------------


@dataclass
class CollectedFile:
    path: Path  # where the bytes were written
    sha256: str
    size: int
    mode: int


@dataclass
class Collected:
    """The wanted members of one package: files on disk, links as data."""

    files: dict[str, CollectedFile] = field(default_factory=dict)
    symlinks: dict[str, str] = field(default_factory=dict)
    hardlinks: dict[str, str] = field(default_factory=dict)

    def names(self) -> list[str]:
        return [*self.files, *self.symlinks, *self.hardlinks]

    def resolve(self, name: str) -> str | None:
        """The file member `name` leads to through the package's own links, or None."""
        resolved: list[str] = []
        queue = deque(part for part in name.split("/"))
        hops = 0
        while queue:
            part = queue.popleft()
            if part in ("", "."):
                continue
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = "/".join([*resolved, part])
            target = self.symlinks.get(candidate)
            if target is not None:
                hops += 1
                if hops > MAX_LINK_HOPS:
                    return None
                if target.startswith("/"):
                    resolved = []
                queue.extendleft(reversed(target.split("/")))
                continue
            resolved.append(part)
        final = "/".join(resolved)
        final = self.hardlinks.get(final, final)
        return final if final in self.files else None


@dataclass(frozen=True)
class Limits:
    """The most a package from a source that could lie may hold, checked against each member's
    header before its bytes are read: it cannot fill the disk, nor the memory with links."""

    members: int  # entries of any kind
    unpacked: int  # bytes its files say they hold, together
    kept: int  # bytes of the wanted files, written together
    names: int  # bytes of the names (and links' targets) of the members kept, held in memory, together


class _Budget:
    """What a package has used of its limits so far."""

    def __init__(self, limits: Limits, source: str) -> None:
        self.limits = limits
        self.source = source
        self.members = self.unpacked = self.kept = self.names = 0

    def take(self, member: Member, kept: bool) -> None:
        self.members += 1
        self._check(self.members, self.limits.members, "entries")
        self.unpacked += member.size
        self._check(self.unpacked, self.limits.unpacked, "bytes in its files")
        if not kept:
            return
        self.names += len(member.name) + len(member.linkname)
        self._check(self.names, self.limits.names, "bytes in the names and link targets qnnctl keeps of it")
        self.kept += member.size if member.kind == FILE else 0
        self._check(self.kept, self.limits.kept, "bytes in the files qnnctl keeps of it")

    def _check(self, used: int, most: int, what: str) -> None:
        if used > most:
            raise IntegrityError(
                f"{self.source} holds more than {most} {what}: more than the package it stands for could",
                hint="it is not the package that was asked for; nothing was staged",
            )


def collect(members: Iterable[Member], wanted: Callable[[str], bool], dest: Path, source: str,
            limits: Limits | None = None) -> Collected:
    """Write the wanted regular files under `dest` (numbered names); keep every link as data.

    Every link is kept, wanted or not, so a wanted name can be followed through folders
    that are themselves links. With `limits`, a member past them is refused (IntegrityError)
    before its bytes are read.
    """
    dest.mkdir(parents=True, exist_ok=True)
    found = Collected()
    budget = _Budget(limits, source) if limits is not None else None
    try:
        for member in members:
            if budget is not None:
                budget.take(member, member.kind == SYMLINK or (member.kind in (FILE, HARDLINK) and wanted(member.name)))
            if member.kind == SYMLINK:
                found.symlinks[member.name] = member.linkname
            elif member.kind == HARDLINK and wanted(member.name):
                found.hardlinks[member.name] = member.linkname
            elif member.kind == FILE and member.data is not None and wanted(member.name):
                found.files[member.name] = _write(member, dest / str(len(found.files)))
    except CORRUPT as exc:
        raise corrupt(source, exc) from None
    return found


def _write(member: Member, target: Path) -> CollectedFile:
    if member.data is None:  # pragma: no cover - callers pass files with data
        raise ValueError(member.name)
    digest = hashlib.sha256()
    size = 0
    with open(target, "wb") as out:
        while block := member.data.read(COPY_BUFFER):
            digest.update(block)
            out.write(block)
            size += len(block)
    if size != member.size:
        raise EOFError(f"{member.name}: {size} of {member.size} bytes")
    return CollectedFile(target, digest.hexdigest(), size, member.mode)
