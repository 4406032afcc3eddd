"""Facts about the machine qnnctl runs on."""

from __future__ import annotations

import logging
import os
import re
import shutil
import struct
import threading

from qnnctl.host.staged import parse_dotted_version
from qnnctl.sdk.hosts import host_for

# The machine is read in one place, qnnctl.sdk.hosts.this_system (below the SDK's layout, which
# needs it too), and refused there (require_supported_host).


def is_supported_host(system: str, machine: str) -> bool:
    return host_for(system, machine) is not None


# -- CPU vendor ------------------------------------------------------------------------

CPUINFO = "/proc/cpuinfo"
# The implementer byte of an Arm CPU's MIDR, which /proc/cpuinfo shows on aarch64 as
# "CPU implementer : 0x41" (there is no vendor_id line there). Names from the Linux kernel's
# arch/arm64/include/asm/cputype.h (ARM_CPU_IMP_*); an unknown code is shown as it is. None of
# them is AMD's, whose MKLDNN trouble is on its x86 CPUs.
ARM_IMPLEMENTERS = {
    0x41: "ARM", 0x42: "Broadcom", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon",
    0x4E: "NVIDIA", 0x50: "APM", 0x51: "Qualcomm", 0x61: "Apple", 0x6D: "Microsoft", 0xC0: "Ampere",
}

_vendor_lock = threading.Lock()
_vendor: list[str | None] = []  # filled once per process: [vendor or None]


def read_cpu_vendor(info: dict[str, object]) -> str | None:
    """The vendor from a py-cpuinfo result; releases disagree on the key, so read both."""
    for key in ("vendor_id_raw", "vendor_id"):
        value = info.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def vendor_from_cpuinfo(text: str) -> str | None:
    """The vendor named by the text of /proc/cpuinfo: x86's `vendor_id` ("AuthenticAMD"),
    aarch64's `CPU implementer` by name ("ARM implementer 0x41"); None when it names neither."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "vendor_id" and value:
            return value
        if key == "CPU implementer" and value:
            try:
                code = int(value, 0)
            except ValueError:
                return f"implementer {value}"
            return f"{ARM_IMPLEMENTERS.get(code, 'unknown')} implementer {code:#04x}"
    return None


def cpu_vendor() -> str | None:
    """The CPU vendor string (e.g. "AuthenticAMD"), read once per process.

    From /proc/cpuinfo where the kernel provides it: a file read, microseconds. py-cpuinfo,
    which caches nothing and spends about a second in a subprocess per call, only where that
    file is missing. Raises ModuleNotFoundError when it is, and py-cpuinfo is not installed.
    """
    if _vendor:
        return _vendor[0]
    with _vendor_lock:
        if not _vendor:
            _vendor.append(_read_vendor())
    return _vendor[0]


def _read_vendor() -> str | None:
    try:
        with open(CPUINFO, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        pass  # no /proc (another system, a sandbox without it): ask py-cpuinfo
    else:
        return vendor_from_cpuinfo(text)
    import cpuinfo  # lazy: py-cpuinfo probes the CPU in a subprocess; only where /proc/cpuinfo is missing

    return read_cpu_vendor(dict(cpuinfo.get_cpu_info()))


def is_amd(vendor: str | None) -> bool:
    return vendor is not None and "amd" in vendor.lower()


# -- C library and dynamic loader ----------------------------------------------------------

LD_SO_CACHE = "/etc/ld.so.cache"
_CACHE_MAGIC_NEW = b"glibc-ld.so.cache1.1"
_CACHE_MAGIC_OLD = b"ld.so-1.7.0"
_CACHE_HEADER_NEW = 48  # magic+version, nlibs, len_strings, flags, pad, extension, unused[3]
_CACHE_ENTRY_NEW = 24  # flags, key, value, osversion, hwcap
_CACHE_ENTRY_OLD = 12  # flags, key, value


def glibc_version() -> tuple[int, ...] | None:
    """The version of the glibc this process runs on; None when the C library is not glibc."""
    try:
        # glibc's own confstr(_CS_GNU_LIBC_VERSION), "glibc 2.36"; other C libraries lack the name.
        said = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        return None
    name, _, version = (said or "").partition(" ")
    return parse_dotted_version(version) if name == "glibc" else None


def parse_ld_cache(data: bytes) -> dict[str, list[str]] | None:
    """soname -> paths from the bytes of an ld.so.cache, in the cache's order.

    None when the data is in no format known here (the caller then asks `ldconfig -p`).
    Entries of every architecture are kept: the caller checks each candidate's ELF header,
    as the loader does.
    """
    start = data.find(_CACHE_MAGIC_NEW)
    if start < 0 or (start and not data.startswith(_CACHE_MAGIC_OLD)):
        return None
    if len(data) < start + _CACHE_HEADER_NEW:
        return None
    flags = data[start + 28]
    # glibc records the byte order it wrote in: 2 little, 3 big; 0 means "the host's".
    order = {2: "<", 3: ">"}.get(flags, "=")
    nlibs, _len_strings = struct.unpack_from(order + "II", data, start + 20)
    table = start + _CACHE_HEADER_NEW
    if len(data) < table + nlibs * _CACHE_ENTRY_NEW:
        return None

    def string(offset: int) -> str:
        # Offsets count from the start of the new-format header.
        begin = start + offset
        end = data.find(b"\0", begin)
        return data[begin:end if end >= 0 else len(data)].decode("utf-8", "surrogateescape")

    entries: dict[str, list[str]] = {}
    for index in range(nlibs):
        _flags, key, value = struct.unpack_from(order + "iII", data, table + index * _CACHE_ENTRY_NEW)
        if start + max(key, value) >= len(data):
            return None
        entries.setdefault(string(key), []).append(string(value))
    return entries


def parse_ldconfig_output(text: str) -> dict[str, list[str]]:
    """soname -> paths from the output of `ldconfig -p`."""
    line_re = re.compile(r"^\s+(\S+) \(([^)]*)\) => (.+)$")
    entries: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = line_re.match(line)
        if match:
            entries.setdefault(match.group(1), []).append(match.group(3).strip())
    return entries


def read_ld_cache(path: str = LD_SO_CACHE) -> dict[str, list[str]]:
    """The dynamic loader's cache of library locations (what `ldconfig -p` lists).

    Parsed from the file when its format is the current one, else read from `ldconfig -p`;
    empty when neither works (musl, or a container without a cache).
    """
    log = logging.getLogger("qnnctl.host.machine")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return {}
    parsed = parse_ld_cache(data)
    if parsed is not None:
        return parsed
    candidates = (shutil.which("ldconfig"), "/sbin/ldconfig", "/usr/sbin/ldconfig")
    ldconfig = next((p for p in candidates if p and os.path.isfile(p)), None)
    if ldconfig is None:
        log.debug("%s is in an unknown format and ldconfig is not installed", path)
        return {}
    # lazy: `qnnctl lower` reads the loader's cache on every run, and only a cache in a format not
    # read here takes a child process
    import subprocess

    try:
        result = subprocess.run([ldconfig, "-C", path, "-p"], capture_output=True, text=True,
                                timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("ldconfig -p failed: %s", exc)
        return {}
    return parse_ldconfig_output(result.stdout)
