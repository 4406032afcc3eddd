"""What an SDK's host libraries need of the machine, and what the machine lacks: the libc++ trio
they name in DT_NEEDED, the glibc symbol versions they reference; what `lower` and `setup_sdk()`
ask on every run, so read without pyelftools (qnnctl.host.runtime stages what is missing). Reads;
never writes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from qnnctl.errors import IntegrityError
from qnnctl.host.elf import ElfInfo, Resolver, glibc_needed, needed_libraries
from qnnctl.host.machine import glibc_version, read_ld_cache
from qnnctl.host.staged import TRIO, Version, elf_identity, sdk_identity
from qnnctl.sdk.layout import REQUIRED_LIBS, Sdk

log = logging.getLogger("qnnctl.host.runtime")


def missing_host_libraries(names: Iterable[str], lib_path: Iterable[Path | str]) -> list[str]:
    """The libraries of `names` the SDK's host libraries would not find, searched as ld.so does.

    `lib_path` stands for LD_LIBRARY_PATH (the SDK's own folder); then the loader's cache and
    the default folders. The same resolver as doctor's library check.
    """
    resolver = Resolver(":".join(str(p) for p in lib_path) or None, read_ld_cache())
    # A stand-in for the SDK's libraries, with no RPATH of its own.
    needer = ElfInfo(path=Path("libQnnHtp.so"), identity=sdk_identity(),
                     soname=None, needed=(), rpath=(), runpath=(), glibc=None)
    return [name for name in names if resolver.find(name, (needer,)).missing]


def glibc_needed_by(libraries: Iterable[Path]) -> Version | None:
    """The newest GLIBC_x.y symbol version any of `libraries` references."""
    newest: Version | None = None
    for path in libraries:
        if elf_identity(path) is None:
            continue  # not an ELF file: nothing it needs
        try:
            needed = glibc_needed(path)
        except IntegrityError:
            continue  # doctor reports unreadable libraries; here they need nothing known
        if needed is not None and (newest is None or needed > newest):
            newest = needed
    return newest


def sdk_glibc_requirement(sdk: Sdk) -> Version | None:
    """The newest glibc the SDK's host libraries reference."""
    if not sdk.lib_dir.is_dir():
        return None
    return glibc_needed_by(sorted(p for p in sdk.lib_dir.iterdir() if ".so" in p.name and p.is_file()))


def trio_needed(sdk: Sdk) -> list[str]:
    """The libc++ trio members that the SDK's required host libraries name in DT_NEEDED."""
    needed: set[str] = set()
    for name in REQUIRED_LIBS:
        try:
            needed.update(needed_libraries(sdk.lib_dir / name))
        except Exception as exc:  # an unreadable library is doctor's to report, not ours
            log.debug("cannot read %s: %s", sdk.lib_dir / name, exc)
    return [name for name in TRIO if name in needed]


def glibc_shortfall(sdk: Sdk) -> tuple[Version, Version | None] | None:
    """(needed, host) when the SDK needs a newer glibc than this host's, else None."""
    needed = sdk_glibc_requirement(sdk)
    host = glibc_version()
    if needed is None or (host is not None and host >= needed):
        return None
    return needed, host


def dotted(version: Version | None) -> str:
    """(2, 36) as "2.36"; "unknown" for None."""
    return "unknown" if version is None else ".".join(str(part) for part in version)


def host_glibc_text() -> str:
    return dotted(glibc_version())


def debian_family(os_release: Path = Path("/etc/os-release")) -> bool:
    """Whether the host is Debian or derived from it (where `apt-get download` fetches the trio)."""
    try:
        text = os_release.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    ids: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key in ("ID", "ID_LIKE"):
            ids.update(value.strip().strip("\"'").split())
    return bool(ids & {"debian", "ubuntu"})
