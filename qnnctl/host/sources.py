"""Where the host runtime's bytes come from, each read once: the files and folders given with
--runtime-from, and Debian's packages fetched by `apt-get download` (LLVM's archive: `llvm`).

A source yields a `Scan`: what it is, the sha256 of exactly the bytes read, and the members
kept from it, written under a work folder. A file is opened once, by one open file
description: a tar is hashed as it streams through the reader, a package (.deb, .rpm) is
copied, hashed on the way, into the work folder and read from that private copy. A path is
never hashed and then opened again, so a file renamed over it in between is never what is
staged (the classic time-of-check/time-of-use hole).
"""

from __future__ import annotations

import io
import logging
import os
import posixpath
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qnnctl.errors import IntegrityError, UsageError
from qnnctl.host.needs import debian_family
from qnnctl.host.packages import (
    Collected,
    CollectedFile,
    DebInfo,
    RpmInfo,
    collect,
    deb_info,
    kind_of,
    package_kind,
    package_members,
    rpm_info,
    tar_members,
)
from qnnctl.host.staged import LOADER, TRIO, loader_stops_at, sdk_identity
from qnnctl.host.streams import COPY_BUFFER, HashingReader, copy_hashed
from qnnctl.paths import user_path

log = logging.getLogger("qnnctl.host.runtime")

LIBC = "libc.so.6"
APT_PACKAGES = ("libc++1-14", "libc++abi1-14", "libunwind-14")
APT_TIMEOUT = 600.0

# sha256 of the Debian 12 amd64 builds of the trio, as published in the archive's Packages
# index (pool/main/l/llvm-toolchain-14/*_14.0.6-12_amd64.deb).
PINNED_DEBS: dict[tuple[str, str, str], str] = {
    ("libc++1-14", "1:14.0.6-12", "amd64"):
        "e25732a2aeb5ea0a3b0e069dfefac201659a9b96ad572693c1e22fd85c90abbf",
    ("libc++abi1-14", "1:14.0.6-12", "amd64"):
        "36f947832ba07ae944543dcab6f5a6c1cc1b02741aad2a2165834f35121b88fb",
    ("libunwind-14", "1:14.0.6-12", "amd64"):
        "a3d11439ce2560c0e3314a8f08daeaa901513b560fb4c2fd5a908d04dc3a7657",
}

# Where glibc packages keep the x86_64 libraries ("" is the top of a folder given by path).
GLIBC_DIRS = ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "usr/lib64", "lib",
              "usr/lib", "")
# A folder's files taken as packages, by name: the rest of a folder is read for bare libraries.
PACKAGE_SUFFIXES = (".deb", ".rpm", ".tar", ".tar.xz", ".txz", ".tar.gz", ".tgz", ".tar.bz2", ".tar.zst")
LLVM_TOP = re.compile(r"clang\+llvm-(\d+\.\d+\.\d+)")


@dataclass
class Scan:
    """One source, read: what it is, its digest record, and the members kept from it."""

    label: str
    records: list[dict[str, Any]]
    collected: Collected
    deb: DebInfo | None = None
    rpm: RpmInfo | None = None
    version: str | None = None  # the version of what it holds, when known


def trio_only(name: str) -> bool:
    """The trio's members, by name: libc++.so.1, libc++.so.1.0 and the like."""
    base = posixpath.basename(name)
    return any(base.startswith(soname) for soname in TRIO)


def wanted(name: str) -> bool:
    """Members worth keeping from a package: the trio, and the libraries in lib folders."""
    return trio_only(name) or (posixpath.dirname(name) in GLIBC_DIRS and ".so" in posixpath.basename(name))


def llvm_version(collected: Collected) -> str | None:
    """The LLVM release a package's members come from (their top folder `clang+llvm-X.Y.Z-...`)."""
    for name in collected.names():
        match = LLVM_TOP.search(name)
        if match:
            return match.group(1)
    return None


def find(scan: Scan, soname: str, dirs: Sequence[str] | None = None) -> tuple[str, CollectedFile] | None:
    """The file a member named `soname` (in one of `dirs`) leads to, following links. An ELF object
    of another class or machine than the SDK's libraries (the 32-bit libc of a multilib tree, an
    i386 package's) is passed over, as the loader passes it over; any other file is found, as the
    loader stops at it (and staging refuses it)."""
    want = sdk_identity()
    for name in scan.collected.names():
        if posixpath.basename(name) != soname:
            continue
        if dirs is not None and posixpath.dirname(name) not in dirs:
            continue
        target = scan.collected.resolve(name)
        if target is not None and loader_stops_at(scan.collected.files[target].path, want):
            return name, scan.collected.files[target]
    return None


def holds_glibc(scan: Scan) -> bool:
    return find(scan, LOADER, GLIBC_DIRS) is not None and find(scan, LIBC, GLIBC_DIRS) is not None


# -- checking what was given ---------------------------------------------------------------


def check_sources(paths: Sequence[Path]) -> tuple[Path, ...]:
    """--runtime-from as given, checked before anything is fetched or staged (UsageError for
    a path that is missing or no package), a folder's packages in its place: a folder is read
    for the packages it holds (`apt-get download` fills one with .debs) and for bare libraries."""
    sources: list[Path] = []
    for path in paths:
        path = _check_source(path)
        if not path.is_dir():
            sources.append(path)
            continue
        packages = sorted(entry for entry in path.iterdir()
                          if entry.name.endswith(PACKAGE_SUFFIXES) and entry.is_file())
        libraries = [entry for entry in path.iterdir() if wanted(entry.name) and entry.is_file()]
        if not packages and not libraries:
            raise UsageError(f"--runtime-from {path}: the folder holds no package (.deb, .rpm, .tar.xz) and "
                             f"none of {', '.join(TRIO)}, nor a glibc",
                             hint="give the folder that holds the packages or the libraries, or the files themselves")
        sources.extend(_check_source(package) for package in packages)
        if libraries:
            sources.append(path)
    return tuple(dict.fromkeys(sources))


def _check_source(path: Path) -> Path:
    """The source's resolved path; UsageError for one that is missing or no package at all.

    Checked before anything else, so that a file is refused even when nothing is to be staged.
    What this reads is only a first look: staging reads the file again, once, and uses what
    it read then.
    """
    path = user_path(path)
    if not path.exists():
        raise UsageError(f"--runtime-from {path}: no such file or folder")
    if not path.is_dir():
        try:
            package_kind(path)
        except UsageError as exc:
            raise UsageError(f"--runtime-from {path}: not a .deb, .rpm or tar archive", hint=exc.hint) from None
        except OSError as exc:
            raise UsageError(f"--runtime-from {path}: cannot read it ({exc.strerror or exc})") from None
    return path.resolve()


# -- reading one source --------------------------------------------------------------------


def scan(source: Path, dest: Path, label: str | None = None) -> Scan:
    """Read one source (file or folder), check its digest, keep the members that matter."""
    if source.is_dir():
        return scan_folder(source, dest)
    return scan_file(source, dest, label or str(source))


def scan_file(source: Path, dest: Path, label: str) -> Scan:
    """A package or tar archive, opened once: the digest recorded is of the bytes staged."""
    dest.mkdir(parents=True, exist_ok=True)
    private: Path | None = None
    with open(source, "rb") as handle:
        kind = kind_of(handle.read(512), source)
        handle.seek(0)
        if kind == "tar":
            # Hashed on the way through the reader: every byte read once, by one reader.
            hashing = HashingReader(handle)
            collected = collect(tar_members(io.BufferedReader(hashing, COPY_BUFFER), source.name), wanted,
                                dest, source.name)
            hashing.drain()
            digest, size = hashing.sha256.hexdigest(), hashing.size
        else:
            # A .deb or RPM is read with seeks: from a private copy, hashed as it is written.
            private = dest / "package"
            digest, size = copy_hashed(handle, private)
    record: dict[str, Any] = {"source": label, "sha256": digest, "size": size}
    if private is None:
        return Scan(label, [record], collected, version=llvm_version(collected))
    deb = rpm = None
    version = None
    if kind == "deb":
        deb = deb_info(private, source.name)
        record.update(package=deb.package, version=deb.version, architecture=deb.architecture)
        pinned = PINNED_DEBS.get((deb.package, deb.version, deb.architecture))
        if pinned is not None:
            if digest != pinned:
                raise IntegrityError(
                    f"sha256 mismatch for {source.name} ({deb.package} {deb.version} "
                    f"{deb.architecture}): expected {pinned}, got {digest}",
                    hint="this is not the package Debian published; nothing was staged",
                )
            record["pinned"] = True
        version = deb.version.partition(":")[2] or deb.version
    else:
        with open(private, "rb") as copy:
            rpm = rpm_info(copy, source.name)
        record.update(package=rpm.name, version=f"{rpm.version}-{rpm.release}", architecture=rpm.arch)
        version = f"{rpm.version}-{rpm.release}"
    collected = collect(package_members(private, source.name), wanted, dest, source.name)
    private.unlink()
    return Scan(label, [record], collected, deb, rpm, version)


def scan_folder(folder: Path, dest: Path) -> Scan:
    """A folder given by the user: its libraries, links followed on disk (it is trusted); each
    file copied into `dest` and hashed on the way, so what is recorded is what is staged."""
    dest.mkdir(parents=True, exist_ok=True)
    collected = Collected()
    records = []
    for entry in sorted(folder.iterdir()):
        if not wanted(entry.name) or not entry.exists():
            continue
        real = entry.resolve()
        if not real.is_file():
            continue
        target = dest / str(len(collected.files))
        with open(real, "rb") as handle:
            digest, size = copy_hashed(handle, target)
        collected.files[entry.name] = CollectedFile(target, digest, size, 0o755)
        records.append({"source": str(entry), "sha256": digest, "size": size})
    return Scan(str(folder), records, collected)


# -- Debian's packages, through apt ----------------------------------------------------------


def apt_download(folder: Path) -> list[Path] | None:
    """The trio's .debs fetched by `apt-get download` (no root needed), or None if it fails.

    apt checks each package against the sha256 in the Packages list of the signed Release
    file it fetched; `scan_file` checks the builds it knows against PINNED_DEBS as well.
    """
    apt = shutil.which("apt-get")
    if apt is None or not debian_family():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    log.info("fetching %s with apt-get download", " ".join(APT_PACKAGES))
    env = dict(os.environ, LC_ALL="C")
    try:
        proc = subprocess.run([apt, "download", *APT_PACKAGES], cwd=folder, capture_output=True,
                              text=True, timeout=APT_TIMEOUT, env=env, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("apt-get download failed: %s", exc)
        return None
    debs = sorted(folder.glob("*.deb"))
    if proc.returncode != 0 or len(debs) < len(APT_PACKAGES):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        log.info("apt-get download failed (exit %d): %s", proc.returncode, last)
        return None
    return debs
