"""What a shared library needs from the dynamic loader, and where the loader would find it.

`read_elf` reads the dynamic section (DT_NEEDED, DT_RPATH, DT_RUNPATH) and the highest
`GLIBC_x.y` symbol version a library requires. `Resolver` looks for each needed library in
the order ld.so(8) uses; `Scanner` follows what the libraries need, library by library, and
reports what is missing.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from qnnctl.errors import IntegrityError
from qnnctl.host.staged import ElfIdentity, elf_identity, loader_stops_at, parse_dotted_version
from qnnctl.records import TYPE_CHECKING, Record
from qnnctl.sdk.hosts import this_host

if TYPE_CHECKING:
    from typing import Any

# Where ld.so looks last, on this host (qnnctl.sdk.hosts: Debian's multiarch folders first).
DEFAULT_DIRS: tuple[str, ...] = this_host().system_dirs

# How a library was found (Found.via); the last two are the host's own libraries.
VIA_PATH = "path"
VIA_RPATH = "RPATH"
VIA_LD_LIBRARY_PATH = "LD_LIBRARY_PATH"
VIA_RUNPATH = "RUNPATH"
VIA_CACHE = "ld.so.cache"
VIA_DEFAULT = "default folder"
SYSTEM_VIAS = frozenset({VIA_CACHE, VIA_DEFAULT})

_GLIBC_VERSION = re.compile(r"^GLIBC_(\d+(?:\.\d+)+)$")
_GLIBCXX_VERSION = re.compile(r"^GLIBCXX_(\d+(?:\.\d+)+)$")
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_STRSZ = 0, 1, 5, 10
_DT_VERNEED, _DT_VERNEEDNUM = 0x6FFFFFFE, 0x6FFFFFFF
# Bounds for a damaged or hostile library: names (PATH_MAX) and how many are read.
_MAX_NAME = 4096
_FIRST_READ = 128  # most names end within it
_MAX_NEEDED = 1024


class ElfInfo(Record):
    """The dynamic-linking facts of one shared library."""

    path: Path
    identity: ElfIdentity
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]  # DT_RPATH folders, $ORIGIN expanded; empty when DT_RUNPATH is set
    runpath: tuple[str, ...]  # DT_RUNPATH folders, $ORIGIN expanded
    glibc: tuple[int, ...] | None  # the highest GLIBC_x.y symbol version it needs
    glibcxx: tuple[int, ...] | None = None  # the highest GLIBCXX_x.y.z (GNU libstdc++) it needs

    @property
    def has_runpath(self) -> bool:
        return bool(self.runpath)


def _not_elf(path: Path) -> IntegrityError:
    return IntegrityError(f"{path} is not an ELF file", hint="reinstall the SDK it belongs to")


def _unreadable(path: Path, why: Exception) -> IntegrityError:
    return IntegrityError(f"cannot read the ELF dynamic section of {path}: {why}",
                          hint="the file is damaged or truncated; reinstall the SDK it belongs to")


def needed_libraries(path: Path) -> tuple[str, ...]:
    """The DT_NEEDED names of an ELF object, found as ld.so finds them: through its program
    headers, PT_DYNAMIC and the PT_LOAD segment that holds the string table.

    `install` and `lower` only ask whether the SDK names libc++; `read_elf` serves doctor's
    full report. IntegrityError for a file that is not an ELF object or cannot be read as one.
    """
    return _read_dynamic(path, versions=False)[0]


def glibc_needed(path: Path) -> tuple[int, ...] | None:
    """The highest GLIBC_x.y symbol version `path` needs (what `read_elf(path).glibc` says), read
    as needed_libraries reads: through DT_VERNEED, without pyelftools, which `lower` does not
    import. IntegrityError as needed_libraries."""
    return _read_dynamic(path, versions=True)[1]


def _read_dynamic(path: Path, versions: bool) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    """(DT_NEEDED names, the highest GLIBC version needed, when `versions`) of an ELF object."""
    # Kept beside pyelftools, which bounds no name (a 132 KB file: 200 MB); see bench/README.md.
    identity = elf_identity(path)
    if identity is None:
        raise _not_elf(path)
    order = "<" if identity.little_endian else ">"
    wide = identity.bits == 64
    # Elf64_Phdr: type, flags, offset, vaddr, paddr, filesz, ...; Elf32_Phdr: type, offset,
    # vaddr, paddr, filesz, ...: where type, offset, vaddr and filesz sit in each.
    header = struct.Struct(order + ("IIQQQQQQ" if wide else "IIIIIIII"))
    picks = (0, 2, 3, 5) if wide else (0, 1, 2, 4)
    entry = struct.Struct(order + ("qQ" if wide else "iI"))  # Elf_Dyn: d_tag, d_val
    # Elf_Verneed (version, count, file, aux, next) and Elf_Vernaux (hash, flags, other, name,
    # next): the same 16 bytes in both classes.
    verneed, vernaux = struct.Struct(order + "HHIII"), struct.Struct(order + "IHHII")
    try:
        with open(path, "rb") as handle:
            length = os.fstat(handle.fileno()).st_size

            def read(offset: int, size: int) -> bytes:
                # Sizes come from the file: a damaged one must not make us allocate gigabytes.
                if offset < 0 or size < 0 or offset + size > length:
                    raise ValueError("the file ends early")
                handle.seek(offset)
                data = handle.read(size)
                if len(data) != size:
                    raise ValueError("the file ends early")
                return data

            phoff, = struct.unpack(order + ("Q" if wide else "I"), read(32 if wide else 28, 8 if wide else 4))
            phentsize, phnum = struct.unpack(order + "HH", read(54 if wide else 42, 4))
            if phentsize < header.size:
                raise ValueError(f"program headers of {phentsize} bytes")
            table = read(phoff, phentsize * phnum)
            loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
            dynamic: tuple[int, int] | None = None
            for index in range(phnum):
                fields = header.unpack_from(table, index * phentsize)
                kind, offset, vaddr, filesz = (fields[i] for i in picks)
                if kind == _PT_LOAD:
                    loads.append((vaddr, offset, filesz))
                elif kind == _PT_DYNAMIC:
                    dynamic = (offset, filesz)
            if dynamic is None:
                return (), None  # linked statically: it needs nothing
            raw = read(dynamic[0], dynamic[1] - dynamic[1] % entry.size)
            names: dict[int, None] = {}  # offsets of the names, each once, in order
            strtab = strsz = needs = needs_count = None
            for tag, value in entry.iter_unpack(raw):
                if tag == _DT_NULL:
                    break
                if tag == _DT_NEEDED and len(names) < _MAX_NEEDED:
                    names[value] = None
                elif tag == _DT_STRTAB:
                    strtab = value
                elif tag == _DT_STRSZ:
                    strsz = value
                elif tag == _DT_VERNEED:
                    needs = value
                elif tag == _DT_VERNEEDNUM:
                    needs_count = value
            if not names and not (versions and needs is not None and needs_count):
                return (), None

            def file_offset(address: int, what: str) -> int:
                start = next((offset + address - vaddr for vaddr, offset, filesz in loads
                              if vaddr <= address < vaddr + filesz), None)
                if start is None:
                    raise ValueError(f"the {what} is in no loaded segment")
                return start

            if strtab is None or strsz is None:
                raise ValueError("DT_NEEDED without a string table")
            table_at = file_offset(strtab, "string table")
            if table_at + strsz > length:
                raise ValueError("the file ends early")

            def string(offset: int, what: str) -> str:
                # Each name alone: a C++ library's string table runs to megabytes, and `lower`
                # reads every library of the SDK on every run.
                if not 0 <= offset < strsz:
                    raise ValueError(f"a {what} name outside the string table")
                for size in (_FIRST_READ, _MAX_NAME):
                    data = read(table_at + offset, min(size, strsz - offset))
                    end = data.find(b"\0")
                    if end >= 0:
                        return data[:end].decode("utf-8", "surrogateescape")
                raise ValueError(f"a {what} name without an end")

            found = tuple(string(name, "DT_NEEDED") for name in names)
            if not versions or needs is None or not needs_count:
                return found, None
            highest: tuple[int, ...] | None = None
            place = file_offset(needs, "version needs table")
            for _ in range(min(needs_count, _MAX_NEEDED)):
                _version, count, _file, aux, following = verneed.unpack(read(place, verneed.size))
                at = place + aux
                for _ in range(min(count, _MAX_NEEDED)):
                    _hash, _flags, _other, name, later = vernaux.unpack(read(at, vernaux.size))
                    version = glibc_of(string(name, "symbol version"))
                    if version is not None and (highest is None or version > highest):
                        highest = version
                    if not later:
                        break
                    at += later
                if not following:
                    break
                place += following
            return found, highest
    except (OSError, ValueError, struct.error) as exc:
        raise _unreadable(path, exc) from None


def glibc_of(version_name: str) -> tuple[int, ...] | None:
    """(2, 34) for the symbol version "GLIBC_2.34"; None for GLIBC_PRIVATE and the rest."""
    match = _GLIBC_VERSION.match(version_name)
    return parse_dotted_version(match.group(1)) if match else None


def glibcxx_of(version_name: str) -> tuple[int, ...] | None:
    """(3, 4, 29) for the symbol version "GLIBCXX_3.4.29" (GNU libstdc++); None for the rest."""
    match = _GLIBCXX_VERSION.match(version_name)
    return parse_dotted_version(match.group(1)) if match else None


def format_version(version: Sequence[int]) -> str:
    return ".".join(str(part) for part in version)


def expand_origin(entry: str, origin: Path) -> str:
    """Replace $ORIGIN / ${ORIGIN} with the library's folder.

    ld.so also knows $LIB and $PLATFORM; they are left as they are, so such a folder is
    simply not found.
    """
    return entry.replace("${ORIGIN}", str(origin)).replace("$ORIGIN", str(origin))


def split_search_path(value: str, origin: Path | None = None, seps: str = ":") -> tuple[str, ...]:
    """The folders of an RPATH, RUNPATH or LD_LIBRARY_PATH value, in order.

    An empty entry means the current directory, for the loader as for the shell.
    """
    parts = re.split("[" + re.escape(seps) + "]", value)
    return tuple(expand_origin(part, origin) if origin is not None else part for part in parts)


def read_elf(path: Path) -> ElfInfo:
    """Read the dynamic section and the GLIBC version needs of `path`.

    Raises IntegrityError when the file is not an ELF shared library that can be read.
    """
    identity = elf_identity(path)
    if identity is None:
        raise _not_elf(path)
    origin = Path(os.path.abspath(path)).parent
    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    soname: str | None = None
    highest: tuple[int, ...] | None = None
    # lazy: pyelftools takes 20-30 ms to import; `lower` reads what it needs with the two readers
    # above, and only doctor's and `which`'s full reports read here
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection, DynamicSegment  # lazy: as the line above
    from elftools.elf.elffile import ELFFile  # lazy: as above
    from elftools.elf.gnuversions import GNUVerNeedSection  # lazy: as above

    highest_cxx: tuple[int, ...] | None = None
    try:
        with open(path, "rb") as handle:
            elf = ELFFile(handle)
            # pyelftools sets the tag attributes (needed, rpath...) at run time.
            dynamic: list[Any] = [s for s in elf.iter_sections() if isinstance(s, DynamicSection)]
            if not dynamic:
                # A library stripped of its section headers still has its PT_DYNAMIC segment.
                dynamic = [s for s in elf.iter_segments() if isinstance(s, DynamicSegment)]
            for section in dynamic:
                for tag in section.iter_tags():
                    kind = tag.entry.d_tag
                    if kind == "DT_NEEDED":
                        needed.append(str(tag.needed))
                    elif kind == "DT_RPATH":
                        rpath.extend(split_search_path(str(tag.rpath), origin))
                    elif kind == "DT_RUNPATH":
                        runpath.extend(split_search_path(str(tag.runpath), origin))
                    elif kind == "DT_SONAME":
                        soname = str(tag.soname)
            for versions in elf.iter_sections():
                if not isinstance(versions, GNUVerNeedSection):
                    continue
                for _verneed, auxiliaries in versions.iter_versions():
                    for aux in auxiliaries:
                        version = glibc_of(str(aux.name))
                        if version is not None and (highest is None or version > highest):
                            highest = version
                        cxx = glibcxx_of(str(aux.name))
                        if cxx is not None and (highest_cxx is None or cxx > highest_cxx):
                            highest_cxx = cxx
    except (ELFError, OSError, ValueError, KeyError) as exc:
        raise _unreadable(path, exc) from None
    if runpath:
        # ld.so ignores DT_RPATH in an object that also has DT_RUNPATH, for every search.
        rpath = []
    return ElfInfo(
        path=path,
        identity=identity,
        soname=soname,
        needed=tuple(needed),
        rpath=tuple(rpath),
        runpath=tuple(runpath),
        glibc=highest,
        glibcxx=highest_cxx,
    )


def glibc_provided_by(libc: Path) -> tuple[int, ...] | None:
    """The newest GLIBC_x.y symbol version a libc.so.6 defines."""
    return newest_defined(libc, glibc_of)


def glibcxx_provided_by(libstdcxx: Path) -> tuple[int, ...] | None:
    """The newest GLIBCXX_x.y.z symbol version a libstdc++.so.6 defines."""
    return newest_defined(libstdcxx, glibcxx_of)


def newest_defined(library: Path, parse: Callable[[str], tuple[int, ...] | None]) -> tuple[int, ...] | None:
    """The newest of the symbol versions `library` defines that `parse` reads; None for none."""
    # lazy: as in read_elf, pyelftools only for doctor's reports and staging, never for `lower`
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile  # lazy: as the line above
    from elftools.elf.gnuversions import GNUVerDefSection  # lazy: as above

    newest: tuple[int, ...] | None = None
    try:
        with open(library, "rb") as handle:
            for section in ELFFile(handle).iter_sections():
                if isinstance(section, GNUVerDefSection):
                    for _, auxiliaries in section.iter_versions():
                        for aux in auxiliaries:
                            version = parse(str(aux.name))
                            if version and (newest is None or version > newest):
                                newest = version
    except (ELFError, OSError, ValueError):
        return None
    return newest


# -- finding libraries the way ld.so does ---------------------------------------------------------


class Found(Record):
    """Where the loader would find `name` for one library: a path and the rule that found it."""

    name: str
    path: Path | None
    via: str | None
    error: str | None = None  # set when the loader would stop at `path` with this error

    @property
    def missing(self) -> bool:
        return self.path is None

    @property
    def system(self) -> bool:
        return self.via in SYSTEM_VIAS


class Resolver:
    """The dynamic loader's search, for a given LD_LIBRARY_PATH, cache and default folders.

    Order (ld.so(8)): a name holding a slash is a path; DT_RPATH of the library and of the
    libraries that loaded it (only when the library has no DT_RUNPATH); LD_LIBRARY_PATH;
    the library's own DT_RUNPATH; the ldconfig cache; the default folders. A candidate of
    another ELF class or machine is passed over, as the loader does.
    """

    def __init__(
        self,
        ld_library_path: str | None,
        ld_cache: Mapping[str, Sequence[str]],
        default_dirs: Sequence[str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        # ld.so splits LD_LIBRARY_PATH at ':' and ';'.
        self.ld_library_path = split_search_path(ld_library_path, seps=":;") if ld_library_path else ()
        self.ld_cache = ld_cache
        self.default_dirs = tuple(this_host().system_dirs if default_dirs is None else default_dirs)
        self.cwd = cwd or Path.cwd()

    def _candidate(self, folder: str, name: str, want: ElfIdentity) -> Path | None:
        base = Path(folder) if folder else self.cwd
        if not base.is_absolute():
            base = self.cwd / base
        path = base / name
        return path if loader_stops_at(path, want) else None

    def find(self, name: str, chain: Sequence[ElfInfo]) -> Found:
        """Where `name`, needed by `chain[0]` (loaded by chain[1], ...), would be found."""
        needer = chain[0]
        want = needer.identity
        if "/" in name:
            path = Path(name) if Path(name).is_absolute() else self.cwd / name
            return _found(name, path, VIA_PATH) if path.is_file() else Found(name, None, None)
        if not needer.has_runpath:
            for loader in chain:
                for folder in loader.rpath:
                    hit = self._candidate(folder, name, want)
                    if hit is not None:
                        return _found(name, hit, VIA_RPATH)
        for via, folders in ((VIA_LD_LIBRARY_PATH, self.ld_library_path), (VIA_RUNPATH, needer.runpath)):
            for folder in folders:
                hit = self._candidate(folder, name, want)
                if hit is not None:
                    return _found(name, hit, via)
        for cached in self.ld_cache.get(name, ()):
            path = Path(cached)
            if loader_stops_at(path, want):
                return _found(name, path, VIA_CACHE)
        for folder in self.default_dirs:
            hit = self._candidate(folder, name, want)
            if hit is not None:
                return _found(name, hit, VIA_DEFAULT)
        return Found(name, None, None)


def _found(name: str, path: Path, via: str) -> Found:
    if elf_identity(path) is None:
        return Found(name, path, via, error=f"{path} is not an ELF library (the loader stops there)")
    return Found(name, path, via)


class Closure:
    """What a set of libraries needs, followed through every library found outside the host's
    own folders (those come with the host and bring what they need). A plain class: `lower`
    reads the SDK's libraries on every run, and dataclasses costs it a few milliseconds to import."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots
        self.libraries: dict[Path, ElfInfo] = {}  # read, roots included
        self.found: dict[Path, list[Found]] = {}  # library -> its DT_NEEDED, found
        self.missing: dict[str, list[Path]] = {}  # name -> libraries needing it
        self.broken: dict[str, str] = {}  # name -> why the file found is unusable
        self.unreadable: dict[Path, str] = {}  # library -> why it cannot be read

    def highest_glibc(self) -> tuple[tuple[int, ...], Path] | None:
        """The highest GLIBC version any library here needs, and the first library needing it."""
        best: tuple[tuple[int, ...], Path] | None = None
        for path, info in self.libraries.items():
            if info.glibc is not None and (best is None or info.glibc > best[0]):
                best = (info.glibc, path)
        return best


class Scanner:
    """Reads each library once and follows what it needs."""

    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver
        self._read: dict[Path, ElfInfo | str] = {}

    def read(self, path: Path) -> ElfInfo | str:
        """The library's facts, or why it cannot be read."""
        key = Path(os.path.realpath(path))
        if key not in self._read:
            try:
                self._read[key] = read_elf(path)
            except IntegrityError as exc:
                self._read[key] = exc.message
        return self._read[key]

    def closure(self, roots: Sequence[Path]) -> Closure:
        result = Closure(roots=list(roots))
        queue: list[tuple[Path, tuple[ElfInfo, ...]]] = [(root, ()) for root in roots]
        seen: set[Path] = set()
        while queue:
            path, loaders = queue.pop(0)
            key = Path(os.path.realpath(path))
            if key in seen:
                continue
            seen.add(key)
            info = self.read(path)
            if isinstance(info, str):
                result.unreadable[path] = info
                continue
            result.libraries[path] = info
            chain = (info, *loaders)
            found = [self.resolver.find(name, chain) for name in info.needed]
            result.found[path] = found
            for hit in found:
                if hit.path is None:
                    result.missing.setdefault(hit.name, []).append(path)
                elif hit.error is not None:
                    result.broken[hit.name] = hit.error
                elif not hit.system:
                    queue.append((hit.path, chain))
        return result
