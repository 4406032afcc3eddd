"""Facts about the machine qnnctl runs on."""

from __future__ import annotations

import platform
import threading

from qnnctl.errors import UnsupportedHostError

SUPPORTED_HOST = "Linux x86_64"
_X86_64 = {"x86_64", "amd64"}


def is_supported_host(system: str, machine: str) -> bool:
    return system == "Linux" and machine.lower() in _X86_64


def require_supported_host(system: str | None = None, machine: str | None = None) -> None:
    """Raise UnsupportedHostError unless the host (or the given pair) is Linux x86_64."""
    system = platform.system() if system is None else system
    machine = platform.machine() if machine is None else machine
    if not is_supported_host(system, machine):
        raise UnsupportedHostError(system, machine)


# -- CPU vendor ------------------------------------------------------------------------

_vendor_lock = threading.Lock()
_vendor: list[str | None] = []  # filled once per process: [vendor or None]


def read_cpu_vendor(info: dict[str, object]) -> str | None:
    """The vendor from a py-cpuinfo result; releases disagree on the key, so read both."""
    for key in ("vendor_id_raw", "vendor_id"):
        value = info.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def cpu_vendor() -> str | None:
    """The CPU vendor string (e.g. "AuthenticAMD"), read once per process.

    py-cpuinfo caches nothing and starts a subprocess on every call, hence the cache.
    Raises ModuleNotFoundError when py-cpuinfo is not installed.
    """
    if _vendor:
        return _vendor[0]
    with _vendor_lock:
        if not _vendor:
            import cpuinfo

            _vendor.append(read_cpu_vendor(dict(cpuinfo.get_cpu_info())))
    return _vendor[0]


def is_amd(vendor: str | None) -> bool:
    return vendor is not None and "amd" in vendor.lower()
