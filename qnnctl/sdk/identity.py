"""Which build an SDK really is: the build id its libraries carry.

QAIRT's libraries hold their build as a string, `v2.51.0.260929181845` (the version, then the
build's hhmmss), the same in the host libraries, the Android stubs and the Hexagon skels of one
build. An archive's name, its top folder and `sdk.yaml` only claim a version; the libraries are
what a process loads, so their build id is the SDK's identity.

Reading it must be cheap (libQnnHtp.so is about 100 MB): the string sits in the read-only data
near its start, so only `.rodata` is searched (found from the section headers), through a map of
the file, stopping at the first match. No dlopen, nothing executed.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Iterable
from pathlib import Path

# `v` + major.minor.patch + yymmdd + hhmmss. It starts with a literal, which lets the regex
# engine skip ahead with a fast substring search (a look-behind first would make it 50x slower).
_BUILD_ID = re.compile(rb"v(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{12})(?![0-9])")
# Where the host SDK keeps the libraries whose build id names the SDK, most telling first.
IDENTITY_LIBS = ("libQnnHtp.so", "libQnnSystem.so", "libQnnHtpPrepare.so", "libQnnCpu.so", "libQnnGpu.so")
_MAX_SECTIONS = 1 << 16


def build_id(path: Path) -> str | None:
    """The build id (`2.51.0.260929181845`) in a library's read-only data, or None.

    Only ELF files carry one (host libraries, Android stubs and Hexagon skels alike); one with
    no `.rodata` section is searched whole.
    """
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, 2)
            if size == 0:
                return None
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                if data[:4] != b"\x7fELF":
                    return None
                start, end = _rodata(data) or (0, size)
                # Read while the map is open: a match refers into it.
                return _first(data, start, end)
    except (OSError, ValueError):
        return None


def _first(data: mmap.mmap, start: int, end: int) -> str | None:
    for found in _BUILD_ID.finditer(data, start, end):
        # Not the tail of a longer dotted number (`1.v2.51...`, `9v2.51...`).
        if found.start() == 0 or data[found.start() - 1] not in b"0123456789.":
            return found.group(1).decode("ascii")
    return None


def _rodata(data: mmap.mmap) -> tuple[int, int] | None:
    """(offset, end) of the `.rodata` section of an ELF file, from its section headers."""
    size = len(data)
    if size < 64 or data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return None
    wide = data[4] == 2
    order = "<" if data[5] == 1 else ">"
    if wide:
        shoff, = struct.unpack_from(order + "Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", data, 0x3A)
        layout = order + "IIQQQQ"  # name, type, flags, addr, offset, size
    else:
        shoff, = struct.unpack_from(order + "I", data, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", data, 0x2E)
        layout = order + "IIIIII"
    if not shoff or not shnum or shnum > _MAX_SECTIONS or shentsize < struct.calcsize(layout):
        return None
    if shoff + shnum * shentsize > size or shstrndx >= shnum:
        return None
    sections = [struct.unpack_from(layout, data, shoff + i * shentsize) for i in range(shnum)]
    names_at, names_size = sections[shstrndx][4], sections[shstrndx][5]
    if names_at + names_size > size:
        return None
    for name, _, _, _, offset, length in sections:
        if name < names_size and data[names_at + name:names_at + name + 8] == b".rodata\x00":
            if offset + length <= size:
                return offset, offset + length
    return None


def version_of_build(build: str) -> str:
    """The SDK version a build id names: `2.51.0.260929181845` -> `2.51.0.260929`."""
    head, _, stamp = build.rpartition(".")
    return f"{head}.{stamp[:6]}"


def sdk_build_ids(lib_dir: Path, names: Iterable[str] = IDENTITY_LIBS) -> dict[str, str]:
    """The build id of each of the SDK's libraries that carries one, by file name.

    One build for all is a coherent SDK; two mean libraries of another release were copied in,
    the field's `Stub lib id mismatch`.
    """
    found = {}
    for name in names:
        path = lib_dir / name
        build = build_id(path) if path.is_file() else None
        if build is not None:
            found[name] = build
    return found


def sdk_build_id(lib_dir: Path, names: Iterable[str] = IDENTITY_LIBS) -> tuple[str, str] | None:
    """(build id, the library it came from) for an SDK's host library folder, or None."""
    for name in names:
        path = lib_dir / name
        if path.is_file():
            found = build_id(path)
            if found is not None:
                return found, name
    return None
