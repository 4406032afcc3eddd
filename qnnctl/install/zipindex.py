"""Where a zip's parts are: its end records, its central directory, each member's byte range.

What reading a zip piecewise needs, and what makes it safe to: the end of central directory
record (and the zip64 locator and record, for archives past 4 GiB or 65,535 members) says
where the central directory is; the central directory says where each member starts; and each
member's bytes run from its local header to the next member.

One reading: a zip is installed only when every reader of it sees the same members. This
module, Python's zipfile (the extractor) and the local headers read in order (the extractor
that follows a download) must agree, so a zip is refused (IntegrityError, exit 4, the member
named) unless it has exactly one end record, the one both readers choose, whose comment ends
the file; its members tile the file from its first byte to the central directory (each one's
local header, name, extra field, data and at most a data descriptor, nothing else between
them); each local header says what the directory says (name by content, method, flags, CRC-32,
sizes); and no name is given twice.

The layout is APPNOTE.TXT's (PKWARE, 6.3.10, sections 4.3.6-4.3.16), read the way Python's
zipfile reads it, so that both agree on every offset.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

from qnnctl.errors import IntegrityError
from qnnctl.records import Record

_EOCD = struct.Struct("<4s4H2LH")  # end of central directory record, 22 bytes and a comment
_EOCD_SIG = b"PK\x05\x06"
_LOCATOR = struct.Struct("<4sLQL")  # zip64 end of central directory locator, 20 bytes
_LOCATOR_SIG = b"PK\x06\x07"
_ZIP64_END = struct.Struct("<4sQ2H2L4Q")  # zip64 end of central directory record, 56 bytes
_ZIP64_END_SIG = b"PK\x06\x06"
_LOCAL = struct.Struct("<4s5H3L2H")  # a local file header, up to the name
_LOCAL_SIG = b"PK\x03\x04"
_ZIP64_EXTRA = 0x0001
_ENCRYPTED = 0x01
_DESCRIPTOR = 0x08  # the sizes and CRC-32 follow the data, in a data descriptor
_PATCHED = 0x20
_UTF8 = 0x800
MAX_COMMENT = 0xFFFF
# What the end of an archive takes at most: the comment, the record, the zip64 locator and record.
MAX_TAIL = MAX_COMMENT + _EOCD.size + _LOCATOR.size + _ZIP64_END.size
# The most central directory read, fetched by parts and held whole in memory by zipfile, before
# anything can vouch for it: QAIRT 2.42's 10,910 entries take a few MB (46 bytes, a name and extras each).
MAX_DIRECTORY = 64 << 20
# A member's bytes beyond its local header, name and data: an extra field, a data descriptor.
_MAX_EXTRA = 0xFFFF
_MAX_DESCRIPTOR = 24
# A data descriptor: CRC-32 and two sizes of 4 or 8 bytes, with or without its signature.
_DESCRIPTOR_SIZES = (12, 16, 20, 24)


class EndRecords(Record):
    """Where the central directory is, as the end of the archive says."""

    cd_start: int  # where the central directory starts in the file
    cd_size: int
    entries: int
    tail_start: int  # where the end records start (the zip64 record's offset, or the EOCD's)
    zip64: bool


class NeedMore(Exception):
    """The bytes given do not reach back to the end records: read `size` bytes from the end."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def end_records(tail: bytes, size: int) -> EndRecords:
    """Read the end records from `tail`, the last len(tail) bytes of an archive of `size`
    bytes. NeedMore when they start before it; IntegrityError when they make no sense."""
    base = size - len(tail)
    pos = -1
    if len(tail) >= _EOCD.size and tail[-_EOCD.size:-_EOCD.size + 4] == _EOCD_SIG \
            and tail[-2:] == b"\x00\x00":
        pos = len(tail) - _EOCD.size  # no comment: the usual case
    else:
        # A comment follows the record; the last signature whose comment ends the file wins.
        pos = tail.rfind(_EOCD_SIG)
        while pos >= 0:
            if pos + _EOCD.size <= len(tail):
                comment = _EOCD.unpack_from(tail, pos)[7]
                if pos + _EOCD.size + comment == len(tail):
                    break
            pos = tail.rfind(_EOCD_SIG, 0, pos)
    if pos < 0:
        if len(tail) < min(size, MAX_TAIL):
            raise NeedMore(min(size, MAX_TAIL))
        raise _bad("no end of central directory record: not a zip archive, or cut short")
    # zipfile takes the last signature in the file's last 64 KiB, wherever its comment ends: a
    # second record hidden in this one's comment would give it another directory to read.
    if tail.rfind(_EOCD_SIG) != pos:
        raise _bad("more than one end of central directory record (one inside the comment of another)")
    (_, disk, cd_disk, _, entries, cd_size, cd_offset, _) = _EOCD.unpack_from(tail, pos)
    if disk != 0 or cd_disk != 0:
        raise _bad("a multi-part (spanned) archive")
    tail_start = base + pos
    zip64 = False
    locator = pos - _LOCATOR.size
    if locator >= 0 and tail[locator:locator + 4] == _LOCATOR_SIG:
        # As zipfile reads it: the zip64 record sits right before its locator.
        record = locator - _ZIP64_END.size
        if record < 0:
            if base + record >= 0 and len(tail) < size:
                raise NeedMore(min(size, len(tail) - record))
            raise _bad("a zip64 locator with no zip64 record before it")
        (sig, _, _, _, disk64, cd_disk64, _, entries, cd_size, cd_offset) = _ZIP64_END.unpack_from(tail, record)
        if sig != _ZIP64_END_SIG:
            raise _bad("a zip64 locator whose record is not where it should be")
        if disk64 != 0 or cd_disk64 != 0:
            raise _bad("a multi-part (spanned) archive")
        tail_start = base + record
        zip64 = True
    if cd_size > MAX_DIRECTORY:
        raise _bad(f"its central directory of {cd_size} bytes is larger than any SDK's (at most {MAX_DIRECTORY})")
    cd_start = tail_start - cd_size
    if cd_size < 0 or cd_start < 0 or cd_start < cd_offset:
        raise _bad(f"its central directory ({cd_size} bytes at {cd_offset}) does not fit before its end records "
                   f"(at {tail_start})")
    if cd_start != cd_offset:
        # zipfile shifts every offset by the difference (a self-extracting stub before the
        # zip); bytes before the first member are no part of an SDK archive.
        raise _bad(f"{cd_start - cd_offset} bytes before its first member, or between its central directory "
                   "and its end records")
    return EndRecords(cd_start, cd_size, entries, tail_start, zip64)


class Extent(Record):
    """Where one member's bytes are: from its local header to at most the next member.

    A tuple, not a dataclass: there is one per member, 10,000 of them in a real release."""

    info: zipfile.ZipInfo
    start: int  # its local header
    end: int  # past the last byte it may need: the next member (or the directory), or less
    limit: int  # where the next member (or the directory) starts: its bytes end there exactly

    @property
    def size(self) -> int:
        return self.end - self.start


def raw_name(info: zipfile.ZipInfo) -> bytes:
    """A member's name as the archive stores it."""
    return info.orig_filename.encode("utf-8" if info.flag_bits & _UTF8 else "cp437")


def extents(infos: Iterable[zipfile.ZipInfo], cd_start: int) -> dict[str, Extent]:
    """Each member's byte range, by its ZipInfo's id; IntegrityError (nothing installed) for
    members that overlap one another, leave bytes before the first or run into the central
    directory, and for a name given twice.

    A member needs at least its local header, its name and its compressed data; it may hold
    an extra field and a data descriptor up to where the next one begins (`check_local_header`
    makes sure it holds nothing else). Two members that share bytes are how a zip bomb packs
    more than it holds; two of one name are read as the first by one tool and the last by
    another. No archiver makes either.
    """
    ordered = sorted(infos, key=lambda i: i.header_offset)
    found: dict[str, Extent] = {}
    names: set[str] = set()
    if ordered and ordered[0].header_offset != 0:
        raise _bad(f"{ordered[0].header_offset} bytes before its first member, {ordered[0].filename!r}")
    if not ordered and cd_start != 0:
        raise _bad(f"{cd_start} bytes before its central directory, and no member")
    for index, info in enumerate(ordered):
        start = info.header_offset
        if info.filename in names:
            raise _bad(f"{info.filename!r} is in it twice")
        names.add(info.filename)
        least = start + _LOCAL.size + len(raw_name(info)) + info.compress_size
        limit = ordered[index + 1].header_offset if index + 1 < len(ordered) else cd_start
        if start < 0:
            raise _bad(f"{info.filename!r} starts before the archive")
        if least > limit:
            what = "overlaps the next member" if index + 1 < len(ordered) else \
                "runs past the start of the central directory"
            raise _bad(f"{info.filename!r} ({info.compress_size} bytes at {start}) {what} (at {limit})")
        end = min(limit, least + _MAX_EXTRA + _MAX_DESCRIPTOR)
        found[_key(info)] = Extent(info, start, end, limit)
    return found


def _key(info: zipfile.ZipInfo) -> str:
    # Names may repeat (the last one wins on extraction); offsets, once checked, do not.
    return f"{info.header_offset}:{info.filename}"


def extent_of(found: dict[str, Extent], info: zipfile.ZipInfo) -> Extent:
    return found[_key(info)]


def check_local_header(read_at: Callable[[int, int], bytes], extent: Extent) -> None:
    """The member's local header must say what the central directory says: the same name,
    method and flags, and (unless they follow the data) the same CRC-32 and sizes; and its
    data must end where the next member starts, or a data descriptor before it (a flag says
    which). IntegrityError otherwise."""
    info = extent.info
    head = read_at(extent.start, _LOCAL.size)
    (sig, _, flags, method, _, _, crc, csize, usize, name_len, extra_len) = _LOCAL.unpack(head)
    name = info.filename
    if sig != _LOCAL_SIG:
        raise _disagrees(name, "no local header where the directory says it starts")
    data = extent.start + _LOCAL.size + name_len + extra_len
    if data + info.compress_size > extent.end:
        raise _disagrees(name, f"its data ({info.compress_size} bytes from {data}) runs past its range "
                         f"(to {extent.end})")
    rest = read_at(extent.start + _LOCAL.size, name_len + extra_len)
    if rest[:name_len] != raw_name(info):
        raise _disagrees(name, f"its local header names it {rest[:name_len]!r}")
    if method != info.compress_type:
        raise _disagrees(name, f"compression method {method}, not {info.compress_type}")
    if flags & (_ENCRYPTED | _PATCHED):
        raise _disagrees(name, "it is encrypted or patched data")
    if (flags & _DESCRIPTOR) != (info.flag_bits & _DESCRIPTOR):
        raise _disagrees(name, "one of them says the sizes follow the data, the other not")
    if flags != info.flag_bits:
        raise _disagrees(name, f"flags {flags:#06x}, not {info.flag_bits:#06x}")
    left = extent.limit - (data + info.compress_size)
    if left not in (_DESCRIPTOR_SIZES if flags & _DESCRIPTOR else (0,)):
        raise _bad(f"{name!r} is followed by {left} bytes that are none of its own (before the next member "
                   f"at {extent.limit})")
    if not flags & _DESCRIPTOR:
        if 0xFFFFFFFF in (csize, usize):
            usize, csize = zip64_sizes(rest[name_len:], usize, csize)
        if (crc, csize, usize) != (info.CRC, info.compress_size, info.file_size):
            raise _disagrees(name, f"CRC-32 {crc:08x}, {csize} bytes compressed, {usize} bytes, where the "
                             f"directory has {info.CRC:08x}, {info.compress_size} and {info.file_size}")


def zip64_sizes(extra: bytes, usize: int, csize: int) -> tuple[int, int]:
    """The sizes a zip64 extra field holds for the fields set to 0xFFFFFFFF."""
    while len(extra) >= 4:
        kind, length = struct.unpack("<HH", extra[:4])
        if length > len(extra) - 4:
            raise _bad(f"an extra field of {length} bytes where {len(extra) - 4} are left")
        if kind == _ZIP64_EXTRA:
            values = list(struct.unpack(f"<{length // 8}Q", extra[4 : 4 + length - length % 8]))
            if usize == 0xFFFFFFFF:
                if not values:
                    raise _bad("a zip64 extra field shorter than the sizes it stands for")
                usize = values.pop(0)
            if csize == 0xFFFFFFFF:
                if not values:
                    raise _bad("a zip64 extra field shorter than the sizes it stands for")
                csize = values.pop(0)
            break
        extra = extra[4 + length:]
    return usize, csize


def member_kind(info: zipfile.ZipInfo) -> str:
    """"dir", "link", "file" or "special" (a device or a pipe), as the extractor takes it."""
    unix_mode = info.external_attr >> 16 if info.create_system == 3 else 0
    kind = stat.S_IFMT(unix_mode)
    if info.is_dir() or kind == stat.S_IFDIR:
        return "dir"
    if kind == stat.S_IFLNK:
        return "link"
    if kind in (0, stat.S_IFREG):
        return "file"
    return "special"


def central_directory_sha256(read_at: Callable[[int, int], bytes], records: EndRecords) -> str:
    """The sha256 of the central directory's bytes: what a lock can pin for an archive that
    is not downloaded whole."""
    digest = hashlib.sha256()
    offset = records.cd_start
    end = records.cd_start + records.cd_size
    while offset < end:
        block = read_at(offset, min(1 << 20, end - offset))
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()


def file_end_records(path: Path) -> EndRecords:
    """The end records of a zip archive on disk."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        want = min(size, 16 << 10)
        while True:
            handle.seek(size - want)
            try:
                return end_records(handle.read(want), size)
            except NeedMore as more:
                if more.size <= want:
                    raise _bad("its end records cannot be read") from None
                want = more.size


def file_directory_sha256(path: Path) -> str:
    """central_directory_sha256 of a zip archive on disk."""
    return central_directory_sha256(read_file_at(path), file_end_records(path))


def open_zip(path: Path) -> zipfile.ZipFile:
    """zipfile's reading of a zip, with what it cannot read as an IntegrityError: a name
    flagged as UTF-8 that is not, an extra field that breaks off, a bad directory."""
    try:
        return zipfile.ZipFile(path)
    except UnicodeDecodeError as exc:
        raise _bad(f"a member's name is flagged as UTF-8 but is not: {exc.object[:80]!r}") from None
    except (zipfile.BadZipFile, EOFError, struct.error) as exc:
        raise _bad(f"its central directory cannot be read: {exc}") from None


def same_reading(zf: zipfile.ZipFile, records: EndRecords) -> list[zipfile.ZipInfo]:
    """zipfile's members, once it is sure zipfile read the directory these end records
    point to, all of it; IntegrityError when it read another."""
    infos = zf.infolist()
    start = getattr(zf, "start_dir", None)  # set by zipfile as it reads the end records
    if start != records.cd_start or len(infos) != records.entries:
        raise _bad(f"two readings: its end records point to {records.entries} members at {records.cd_start}, "
                   f"zipfile reads {len(infos)} at {start}")
    return infos


def check_zip_file(path: Path) -> EndRecords:
    """A zip on disk, read one way by every reader (see the module's docstring); its end
    records. IntegrityError, naming the member, for anything else."""
    try:
        records = file_end_records(path)
    except IntegrityError as exc:
        raise IntegrityError(f"{path.name} is corrupt or truncated: {exc.message.removeprefix('unsafe archive: ')}",
                             hint="nothing was installed; download the archive again") from None
    with open_zip(path) as zf:
        infos = same_reading(zf, records)
    read_at = read_file_at(path)
    with open(path, "rb") as handle:
        fd = handle.fileno()

        def pread(offset: int, size: int) -> bytes:
            data = os.pread(fd, size, offset)
            if len(data) != size:
                return read_at(offset, size)  # raises: cut short
            return data

        for extent in extents(infos, records.cd_start).values():
            check_local_header(pread, extent)
    return records


def read_file_at(path: Path) -> Callable[[int, int], bytes]:
    """A `read_at(offset, size)` over a file on disk that reads exactly `size` bytes."""
    def read_at(offset: int, size: int) -> bytes:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(size)
        if len(data) != size:
            raise _bad(f"it is cut short at {offset + len(data)}")
        return data

    return read_at


def _bad(what: str) -> IntegrityError:
    return IntegrityError(
        f"unsafe archive: {what}",
        hint="the archive was not installed; get it from a trusted source",
    )


def _disagrees(name: str, what: str) -> IntegrityError:
    return _bad(f"{name!r} has a local header that disagrees with the central directory: {what}")

