"""The hosts qnnctl runs on, as data: per machine, the SDK folders that hold its libraries and
tools, what those libraries need of the system, and which machine this is.

Every command reads the host from here: the layout (`Sdk.lib_dir`), the `host` component of an
install by parts, the exports of `qnnctl env`, doctor's checks and the refusal of a host the SDK
has no libraries for. A new host is one more row.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from qnnctl.errors import UnsupportedHostError
from qnnctl.records import Record

# For tests only: the machine qnnctl takes itself to run on (`aarch64`, or with the system,
# `Darwin/arm64`), so that a synthetic SDK of another architecture, or the refusal of another
# host, can be checked on this one, as QNNCTL_FORCE_CPU_VENDOR does the CPU.
FORCE_MACHINE_VARIABLE = "QNNCTL_FORCE_MACHINE"

EM_X86_64 = 62  # an ELF header's e_machine (the System V ABI's list)
EM_AARCH64 = 183


class HostPlatform(Record):
    """One host the SDK has libraries for: where they are, what they are, what they need."""

    machine: str  # the name platform.machine() gives, normalised
    name: str  # for people: "Linux x86_64"
    lib_dir: str  # below the SDK root
    bin_dir: str
    elf_machine: int  # what every host library's ELF header must say
    loader: str  # the dynamic loader its libraries name
    system_dirs: tuple[str, ...]  # where ld.so looks last (Debian/Ubuntu multiarch first)
    # The C++ runtime the libraries are built against, and the sonames of it they need.
    cxx_runtime: str
    cxx_libraries: tuple[str, ...]
    glibcxx: tuple[int, ...] | None  # the newest GLIBCXX_ symbol version they reference, if any
    # Libraries the system must provide, with the Debian/Ubuntu package that does.
    packages: Mapping[str, str]
    source: str  # where the row's facts come from, and when they were read


HOSTS: tuple[HostPlatform, ...] = (
    HostPlatform(
        machine="x86_64", name="Linux x86_64",
        lib_dir="lib/x86_64-linux-clang", bin_dir="bin/x86_64-linux-clang",
        elf_machine=EM_X86_64, loader="ld-linux-x86-64.so.2",
        system_dirs=("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"),
        cxx_runtime="libc++",
        cxx_libraries=("libc++.so.1", "libc++abi.so.1", "libunwind.so.1"),
        glibcxx=None,
        packages={"libc++.so.1": "libc++1-14", "libc++abi.so.1": "libc++abi1-14", "libunwind.so.1": "libunwind-14"},
        source="the QAIRT 2.37.0.250724, 2.42.0.251225, 2.47.0 and 2.51.0 archives' layout and the "
        "x86_64 libraries of onnxruntime-qnn 2.3.0 and 2.7.0 (read 2025-2026): clang builds, DT_NEEDED "
        "libc++.so.1, libc++abi.so.1, libunwind.so.1",
    ),
    HostPlatform(
        machine="aarch64", name="Linux aarch64",
        lib_dir="lib/aarch64-oe-linux-gcc11.2", bin_dir="bin/aarch64-oe-linux-gcc11.2",
        elf_machine=EM_AARCH64, loader="ld-linux-aarch64.so.1",
        system_dirs=("/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib",
                     "/usr/lib"),
        cxx_runtime="GNU libstdc++",
        cxx_libraries=("libstdc++.so.6",),
        glibcxx=(3, 4, 29),
        packages={"libstdc++.so.6": "libstdc++6", "libatomic.so.1": "libatomic1"},
        # The folder: QAIRT 2.31 to 2.49 SDKs used on aarch64 Linux boards put the host libraries
        # in lib/aarch64-oe-linux-gcc11.2 (public build scripts and ONNX Runtime's QNN EP notes,
        # read 2026-12), as Qualcomm's own quic/ai-engine-direct-helper says in its release notes
        # for QNN SDK 2.28.0.241029 on QCS8550.LE.1.0 (gcc 11.2.0): "use the libraries below under
        # path ...\QAIRT\2.28.0.241029\lib\aarch64-oe-linux-gcc11.2" (libQnnHtp, libQnnHtpPrepare,
        # libQnnHtpV68Stub, libQnnSystem; github.com/quic/ai-engine-direct-helper/releases, read
        # 2026-12). The SDK's reference docs do not list it: the backend table of the QAIRT 2.39
        # SDK's docs (docs/QNN/general/backend.html) names x86_64-linux-clang and the Android and
        # Windows targets only, and qairt-dev's setup page (docs.qualcomm.com 80-87189-2, read
        # 2026-12) names Linux-aarch64 (Ubuntu 24.04) as a platform, not a folder.
        # lib/aarch64-ubuntu-gcc9.4 is GCC 9's build: it cannot reference GLIBCXX_3.4.29, which
        # the 2.51 libraries measured do, so it is not taken as this host's folder.
        source="the aarch64 libraries of onnxruntime_qnn-2.7.0-cp311-cp311-manylinux_2_34_aarch64.whl "
        "(QAIRT 2.51, read 2026-12): ELF AArch64, GCC 11.3, GLIBCXX_3.4.29, GLIBC_2.34, libatomic.so.1 "
        "(libQnnSystem); folder lib/aarch64-oe-linux-gcc11.2 from SDKs 2.28-2.49 as used on Qualcomm "
        "Linux boards (named so in Qualcomm's quic/ai-engine-direct-helper release notes for QNN SDK "
        "2.28.0.241029; not in the SDK's reference docs)",
    ),
)

_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "aarch64_be": "aarch64_be"}


def supported_names() -> str:
    """The hosts qnnctl supports, for messages: "Linux x86_64 or Linux aarch64"."""
    return " or ".join(host.name for host in HOSTS)


def this_system(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(system, machine) of this process: ("Linux", "aarch64"). The machine is normalised
    (amd64: x86_64, arm64: aarch64); a 32-bit Python on a 64-bit kernel is its own 32-bit machine.
    QNNCTL_FORCE_MACHINE (tests only) replaces the machine, or `system/machine` both."""
    environ = os.environ if environ is None else environ
    system = {"linux": "Linux", "darwin": "Darwin", "win32": "Windows", "cygwin": "Windows"}.get(
        sys.platform, sys.platform)
    uname = getattr(os, "uname", None)  # not on Windows, where the machine does not matter
    machine = uname().machine if uname is not None else environ.get("PROCESSOR_ARCHITECTURE", "")
    machine = _ALIASES.get(machine.lower(), machine.lower())
    if sys.maxsize <= 2**32 and machine in ("x86_64", "aarch64"):
        machine = "i686" if machine == "x86_64" else "armv8l"
    forced_system, _, forced = environ.get(FORCE_MACHINE_VARIABLE, "").strip().rpartition("/")
    forced = forced.lower()
    return forced_system or system, _ALIASES.get(forced, forced) or machine


def host_for(system: str, machine: str) -> HostPlatform | None:
    """The row for `machine` on `system`, or None for a host the SDK has no libraries for."""
    if system != "Linux":
        return None
    machine = _ALIASES.get(machine.lower(), machine.lower())
    return next((host for host in HOSTS if host.machine == machine), None)


def require_supported_host(system: str | None = None, machine: str | None = None) -> HostPlatform:
    """The host's row (this machine's, or the given pair's); UnsupportedHostError (exit 5),
    naming the hosts qnnctl supports, for one the SDK has no libraries for."""
    here_system, here_machine = this_system()
    system = here_system if system is None else system
    machine = here_machine if machine is None else machine
    host = host_for(system, machine)
    if host is None:
        raise UnsupportedHostError(system, machine, supported_names())
    return host


def this_host(environ: Mapping[str, str] | None = None) -> HostPlatform:
    """This machine's row, or x86_64's on a host qnnctl does not support, where every command
    that needs the host's libraries refuses first (require_supported_host):
    what reads paths only, such as `qnnctl list`, still works."""
    system, machine = this_system(environ)
    return host_for(system, machine) or HOSTS[0]

