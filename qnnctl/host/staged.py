"""What is staged for an SDK, read from the cache's runtime records without changing them, and the
ELF header facts that decide whether the loader takes a staged library. `qnnctl env` reads this.
"""

from __future__ import annotations

import re
from pathlib import Path

from qnnctl.records import TYPE_CHECKING, Record
from qnnctl.sdk.cache import MANIFEST_NAME, Cache, read_manifest
from qnnctl.sdk.hosts import this_host
from qnnctl.sdk.layout import Sdk
from qnnctl.sdk.stores import first_unsafe, folder_problem

if TYPE_CHECKING:
    from typing import Any

_ELF_MAGIC = b"\x7fELF"


class ElfIdentity(Record):
    """What makes two ELF objects loadable into the same process: class, byte order, machine."""

    bits: int
    little_endian: bool
    machine: int


def elf_identity(path: Path) -> ElfIdentity | None:
    """The class, byte order and machine from an ELF header; None for anything else."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(20)
    except OSError:
        return None
    if len(head) < 20 or not head.startswith(_ELF_MAGIC) or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    little = head[5] == 1
    machine = int.from_bytes(head[18:20], "little" if little else "big")
    return ElfIdentity(bits=32 if head[4] == 1 else 64, little_endian=little, machine=machine)


def loader_stops_at(path: Path, want: ElfIdentity) -> bool:
    """Whether the loader, looking for a library of `want`'s kind, stops at `path`: an ELF
    object of another class or machine it passes over, but any other file ends the search
    (and the load, with an error)."""
    if not path.is_file():
        return False
    identity = elf_identity(path)
    return identity is None or identity == want


def parse_dotted_version(text: str) -> tuple[int, ...] | None:
    """(2, 36) from "2.36", (2, 2, 5) from "2.2.5"; None when `text` does not start with one."""
    match = re.match(r"\s*(\d+(?:\.\d+)*)", text)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


LIBCXX = "libcxx"


GLIBC = "glibc"


TRIO = ("libc++.so.1", "libc++abi.so.1", "libunwind.so.1")

# Set in the environment of a program started under the staged loader, so that it does
# not start itself under the loader a second time.
LOADER_GUARD = "QNNCTL_STAGED_LOADER"


LOADER = "ld-linux-x86-64.so.2"


Version = tuple[int, ...]


class Staged(Record):
    """A complete staged runtime: `root/lib` holds the libraries, `root/.qnnctl.json` says what."""

    root: Path
    manifest: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.manifest.get("kind", ""))

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def lib_dir(self) -> Path:
        return self.root / "lib"

    @property
    def loader(self) -> Path | None:
        relative = self.manifest.get("loader")
        return self.root / str(relative) if relative else None

    @property
    def glibc_version(self) -> Version | None:
        """The version of a staged glibc, as its manifest records it."""
        return parse_dotted_version(str(self.manifest.get("glibc_version", "")))


def staged_runtimes(cache: Cache) -> list[Staged]:
    """Every complete staged runtime, the most recently staged first."""
    if not cache.runtime.is_dir():
        return []
    found = []
    for entry in cache.runtime.iterdir():
        manifest = read_manifest(entry)
        if manifest is not None and manifest.get("kind") in (LIBCXX, GLIBC):
            found.append(Staged(entry, manifest))
    return sorted(found, key=_staged_order, reverse=True)


def _staged_order(staged: Staged) -> tuple[int, str]:
    when = staged.manifest.get("staged_ns")
    return (when if isinstance(when, int) else 0, staged.name)


def current(cache: Cache, kind: str) -> Staged | None:
    """The runtime of `kind` in use: the one staged last."""
    return next((s for s in staged_runtimes(cache) if s.kind == kind), None)


def refuse_unsafe_stage(staged: Staged, *files: Path) -> None:
    """IntegrityError (exit 4) when another user could change the staged runtime's libraries,
    its record, `files` (its loader), or a folder down to them: they run as this user, as an
    SDK's do, and are refused as an SDK folder is."""
    problem = folder_problem(staged.lib_dir) or first_unsafe((staged.root / MANIFEST_NAME, *files))
    if problem is not None:
        raise problem.refusal(f"the host runtime staged at {staged.root} is not used",
                              "put code there that runs as you")


def sdk_identity() -> ElfIdentity:
    """What the SDK's host libraries are, and what they can load: 64-bit little-endian, of this
    host's machine (x86-64, AArch64: qnnctl.sdk.hosts)."""
    return ElfIdentity(64, True, this_host().elf_machine)


def staged_lib_dirs(cache: Cache, sdk: Sdk | None) -> list[Path]:
    """Staged folders to put on LD_LIBRARY_PATH for `sdk`: the libc++ trio, never glibc.

    Empty when nothing is staged, or when the SDK ships the trio itself (releases before 2.23):
    the loader stops at the SDK's own files, found first. One it passes over (a library of
    another machine) leaves the staged trio as the one its libraries load.
    """
    staged = current(cache, LIBCXX)
    if staged is None:
        return []
    if sdk is not None:
        want = sdk_identity()
        if all(loader_stops_at(sdk.lib_dir / name, want) for name in TRIO):
            return []
    refuse_unsafe_stage(staged)
    return [staged.lib_dir]


def staged_loader(cache: Cache) -> tuple[Path, Path] | None:
    """(staged ld-linux-x86-64.so.2, the folder of its glibc), or None when none is staged."""
    staged = current(cache, GLIBC)
    if staged is None or staged.loader is None or not staged.loader.is_file():
        return None
    refuse_unsafe_stage(staged, staged.loader)
    return staged.loader, staged.lib_dir


def loader_library_path(cache: Cache, sdk: Sdk | None, glibc_lib: Path) -> list[str]:
    """What the staged loader searches first: its glibc, the staged trio, the SDK's libraries."""
    dirs: list[str] = []
    for folder in (glibc_lib, *staged_lib_dirs(cache, sdk), *([sdk.lib_dir] if sdk else [])):
        if str(folder) not in dirs:
            dirs.append(str(folder))
    return dirs
