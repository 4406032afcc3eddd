"""The host runtime the SDK's libraries need: the libc++ trio, and glibc where the host's is old.

The SDK's host libraries are built with clang against libc++ (`libc++.so.1`, `libc++abi.so.1`,
`libunwind.so.1`, no longer shipped with the SDK) and reference recent glibc symbol versions.
What a host lacks is staged into `$QNNCTL_CACHE_DIR/runtime/<name>-<version>/lib` the way an
SDK is installed: check, lock, check again, build in tmp/, rename into place; a folder counts
only once its manifest exists. The libc++ trio comes from the files given by the user
(--runtime-from: then nothing is fetched, and each file is used or said why not); without
them, from `apt-get download` on a Debian-family host, else the LLVM 14.0.0 release archive,
streamed so that only the three libraries ever reach the disk (a megabyte out of 575).

A staged glibc is never put on LD_LIBRARY_PATH (a libc that does not match the running loader
crashes every program); it is used only by starting a program under its own loader,
`<ld.so> --library-path <dirs> PROGRAM ...` (see `qnnctl.run.lower.reexec_command`).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import posixpath
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import requests
import urllib3
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection

from qnnctl.errors import DownloadError, IntegrityError, QnnctlError, UsageError
from qnnctl.files import remove_tree
from qnnctl.host.elf import glibc_of
from qnnctl.host.machine import glibc_version
from qnnctl.host.needs import glibc_shortfall, missing_host_libraries, trio_needed
from qnnctl.host.packages import (
    Collected,
    CollectedFile,
    HashingReader,
    collect,
    deb_info,
    package_kind,
    package_members,
    rpm_info,
    tar_members,
)
from qnnctl.host.staged import (
    GLIBC,
    LIBCXX,
    TRIO,
    Staged,
    Version,
    current,
    staged_lib_dirs,
)
from qnnctl.net.download import (
    BACKOFF_MAX,
    CONNECT_TIMEOUT,
    READ_TIMEOUT,
    Retry,
    backoff_delay,
    file_sha256,
    make_session,
    retry_after,
    retryable_status,
)
from qnnctl.net.retry import describe
from qnnctl.net.urls import redact
from qnnctl.paths import fsync_dir, user_path, write_json_atomic
from qnnctl.sdk.cache import MANIFEST_NAME, Cache
from qnnctl.sdk.layout import Sdk
from qnnctl.sdk.work import remove_stale_work, version_lock, work_folder
from qnnctl.version import __version__

if TYPE_CHECKING:
    from qnnctl.host.packages import Collected, CollectedFile, DebInfo, RpmInfo

log = logging.getLogger("qnnctl.host.runtime")

RUNTIME_SCHEMA = 1
LOCK_KEY = "runtime"
APT_PACKAGES = ("libc++1-14", "libc++abi1-14", "libunwind-14")
APT_TIMEOUT = 600.0
LLVM_VERSION = "14.0.0"
LLVM_URL = (
    f"https://github.com/llvm/llvm-project/releases/download/llvmorg-{LLVM_VERSION}/"
    f"clang+llvm-{LLVM_VERSION}-x86_64-linux-gnu-ubuntu-18.04.tar.xz"
)
LLVM_URL_ENV = "QNNCTL_LLVM_URL"  # another copy of the release archive (a mirror)
LLVM_ATTEMPTS = 3
LOADER = "ld-linux-x86-64.so.2"
LIBC = "libc.so.6"

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
_SONAME = re.compile(r"^(?:ld-linux-x86-64\.so\.2|lib[^/]+\.so(?:\.\d+)+)$")
_LLVM_TOP = re.compile(r"clang\+llvm-(\d+\.\d+\.\d+)")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9.+_-]")


# -- staging what the SDK needs ----------------------------------------------------------


def ensure_trio(cache: Cache, sdk: Sdk, environ: Mapping[str, str]) -> RuntimeResult | None:
    """Stage the libc++ trio when the SDK needs it and neither the host nor the cache has it.

    This is what `install` and `lower` do on their own; `install --runtime` stages whatever
    is missing, needed or not.
    """
    wanted = trio_needed(sdk)
    if not wanted or not missing_host_libraries(wanted, [sdk.lib_dir, *staged_lib_dirs(cache, sdk)]):
        return None
    log.info("the SDK's libraries need %s, which this host lacks; staging them "
             "(what `qnnctl install --runtime` does)", ", ".join(wanted))
    return stage_runtime(cache, sdk, RuntimeRequest(), environ)


def glibc_provided_by(libc: Path) -> Version | None:
    """The newest GLIBC_x.y symbol version a libc.so.6 defines."""
    newest: Version | None = None
    try:
        with open(libc, "rb") as handle:
            for section in ELFFile(handle).iter_sections():
                if isinstance(section, GNUVerDefSection):
                    for _, auxiliaries in section.iter_versions():
                        for aux in auxiliaries:
                            version = glibc_of(str(aux.name))
                            if version and (newest is None or version > newest):
                                newest = version
    except (ELFError, OSError, ValueError):
        return None
    return newest


def _dotted(version: Version | None) -> str:
    return "unknown" if version is None else ".".join(str(part) for part in version)


def _host_glibc_text() -> str:
    return _dotted(glibc_version())


def _debian_family(os_release: Path = Path("/etc/os-release")) -> bool:
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


# -- staging -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeRequest:
    sources: tuple[Path, ...] = ()  # --runtime-from: .deb, .rpm, .tar.xz or folders
    force: bool = False  # stage even when the host or an earlier stage already provides it
    use_apt: bool = True
    llvm_url: str | None = None  # default: $QNNCTL_LLVM_URL, else the LLVM release
    backoff_base: float = 1.0


# What happened to each part: "host" (the host has it), "reused", "staged", "not-needed",
# or "missing" (needed, but no source for it was given).
@dataclass(frozen=True)
class RuntimeResult:
    libcxx: Staged | None
    libcxx_action: str
    glibc: Staged | None
    glibc_action: str


@dataclass
class _Scan:
    """One source, read: what it is, its digest record, and the members kept from it."""

    label: str
    records: list[dict[str, Any]]
    collected: Collected
    deb: DebInfo | None = None
    rpm: RpmInfo | None = None
    version: str | None = None  # the version of what it holds, when known


@dataclass
class _Plan:
    trio_missing: bool  # the host (with the SDK's own folder) lacks part of the trio
    trio: bool  # stage the trio now
    glibc_needed: Version | None  # the SDK needs this glibc and the host's is older
    glibc: bool  # stage glibc now, if a source for it was given


def stage_runtime(
    cache: Cache, sdk: Sdk | None, request: RuntimeRequest, environ: Mapping[str, str]
) -> RuntimeResult:
    """Stage what `sdk` needs and the host lacks; see the module's docstring."""
    sources = check_sources(request.sources)
    plan = _plan(cache, sdk, request, bool(sources))
    committed: dict[str, Staged] = {}
    unused: dict[str, str] = {}  # source -> why it was not used
    if plan.trio or plan.glibc:
        cache.ensure()
        with version_lock(cache, LOCK_KEY, "staging the host runtime"):
            if not request.force:
                plan = _plan(cache, sdk, request, bool(sources))
                if not plan.trio and not plan.glibc:
                    log.info("another qnnctl staged the runtime meanwhile")
            if plan.trio or plan.glibc:
                remove_stale_work(cache, LOCK_KEY)
                with work_folder(cache.tmp / f"{LOCK_KEY}.{uuid.uuid4().hex[:12]}") as work:
                    committed, unused = _stage(cache, sdk, request, environ, sources, plan, work)
    if not plan.trio and not plan.glibc:
        # Nothing is staged, so nothing is read: what each file holds does not matter.
        reason = f"{_trio_unneeded(cache, plan)}, and {_glibc_unneeded(cache, plan)}"
        unused = {str(source): reason for source in sources}
    for source, reason in unused.items():
        log.warning("--runtime-from %s is not used: %s", source, reason)
    return _result(cache, plan, committed)


def _stage(cache: Cache, sdk: Sdk | None, request: RuntimeRequest, environ: Mapping[str, str],
           sources: Sequence[Path], plan: _Plan, work: Path) -> tuple[dict[str, Staged], dict[str, str]]:
    """Read every source and build every tree first, so that a failure stages nothing.

    Returns what was staged, and why each source that contributed nothing was not used. A
    source that holds neither the trio nor a glibc is refused.
    """
    scans = [_scan(source, work / f"src{i}") for i, source in enumerate(sources)]
    trees = []
    if plan.trio:
        built = _build_trio(scans, work, request, environ)
        if built is not None:
            trees.append(built)
    if plan.glibc:
        built = _build_glibc(scans, work, plan.glibc_needed, sdk)
        if built is not None:
            trees.append(built)
    unused = _unused_sources(cache, plan, scans, trees)
    committed = {}
    for tree, name, manifest in trees:
        committed[str(manifest["kind"])] = _commit(tree, name, manifest, cache, work)
    return committed, unused


def _unused_sources(cache: Cache, plan: _Plan, scans: Sequence[_Scan],
                    trees: Sequence[tuple[Path, str, dict[str, Any]]]) -> dict[str, str]:
    """Why each source no tree was built from is not used; UsageError for one that holds nothing of use."""
    used = {str(record["source"]) for _, _, manifest in trees for record in manifest["sources"]}
    taken = {str(manifest["kind"]): ", ".join(str(r["source"]) for r in manifest["sources"])
             for _, _, manifest in trees}
    unused = {}
    for scan in scans:
        if any(str(record["source"]) in used for record in scan.records):
            continue
        holds_trio = any(_find(scan, soname) is not None for soname in TRIO)
        holds_glibc = _find(scan, LOADER, GLIBC_DIRS) is not None and _find(scan, LIBC, GLIBC_DIRS) is not None
        reasons = []
        if holds_trio:
            reasons.append(f"the libc++ trio came from {taken[LIBCXX]}" if LIBCXX in taken
                           else _trio_unneeded(cache, plan))
        if holds_glibc:
            reasons.append(f"the glibc came from {taken[GLIBC]}" if GLIBC in taken
                           else _glibc_unneeded(cache, plan))
        if not reasons:
            raise UsageError(
                f"--runtime-from {scan.label} holds none of {', '.join(TRIO)}, and no glibc "
                f"({LOADER} with {LIBC})",
                hint="give the packages, the LLVM 14 archive or a folder that hold them; nothing was staged",
            )
        unused[scan.label] = ", and ".join(reasons)
    return unused


def _trio_unneeded(cache: Cache, plan: _Plan) -> str:
    """Why no libc++ trio is staged now (the plan stages none)."""
    staged = current(cache, LIBCXX)
    if plan.trio_missing and staged is not None:
        return f"the libc++ trio is already staged in {staged.lib_dir} (--force stages it again)"
    if plan.trio_missing:
        return "no libc++ trio could be staged"
    return f"this host (or the SDK) has {', '.join(TRIO)} (--force stages them all the same)"


def _glibc_unneeded(cache: Cache, plan: _Plan) -> str:
    """Why no glibc is staged now (the plan stages none)."""
    if plan.glibc_needed is None:
        return (f"this host's glibc {_host_glibc_text()} covers what the SDK needs, so no glibc is "
                "staged (--force stages one all the same)")
    staged = current(cache, GLIBC)
    have = _dotted(staged.glibc_version) if staged is not None else "none"
    return f"glibc {have} is already staged, and covers what the SDK needs (--force stages it again)"


def _result(cache: Cache, plan: _Plan, committed: dict[str, Staged]) -> RuntimeResult:
    libcxx = committed.get(LIBCXX) or current(cache, LIBCXX)
    if LIBCXX in committed:
        libcxx_action = "staged"
    elif plan.trio and plan.trio_missing and libcxx is None:
        # Files were given and none holds the trio: nothing is fetched behind the user's back.
        libcxx_action = "missing"
        libcxx = None
        log.warning(
            "the SDK's libraries need %s, which this host lacks, and none of the files given with "
            "--runtime-from holds them; add them (the %s packages, the LLVM %s archive or a folder "
            "of the three), or run `qnnctl install --runtime` without --runtime-from to fetch them",
            ", ".join(TRIO), ", ".join(APT_PACKAGES), LLVM_VERSION,
        )
    elif plan.trio_missing and libcxx is not None:
        libcxx_action = "reused"
        log.info("libc++ runtime already staged in %s", libcxx.lib_dir)
    else:
        libcxx_action = "host"
        libcxx = None
        log.info("%s resolve on this host; nothing to stage", ", ".join(TRIO))
    glibc = committed.get(GLIBC) or current(cache, GLIBC)
    if GLIBC in committed:
        glibc_action = "staged"
    elif plan.glibc_needed is None:
        glibc_action = "not-needed"
        glibc = None
    elif plan.glibc:
        glibc_action = "missing"
        glibc = None
        log.warning(
            "the SDK needs glibc %s and this host has %s; give a glibc package (.deb or .rpm, "
            "%s or newer) with --runtime-from to stage one",
            _dotted(plan.glibc_needed), _host_glibc_text(), _dotted(plan.glibc_needed),
        )
    else:
        glibc_action = "reused"
        if glibc is not None:
            log.info("glibc %s already staged in %s", glibc.manifest.get("glibc_version"), glibc.lib_dir)
    return RuntimeResult(libcxx, libcxx_action, glibc, glibc_action)


# A folder's files taken as packages, by name: the rest of a folder is read for bare libraries.
_PACKAGE_SUFFIXES = (".deb", ".rpm", ".tar", ".tar.xz", ".txz", ".tar.gz", ".tgz", ".tar.bz2", ".tar.zst")


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
                          if entry.name.endswith(_PACKAGE_SUFFIXES) and entry.is_file())
        libraries = [entry for entry in path.iterdir() if _wanted(entry.name) and entry.is_file()]
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


def _plan(cache: Cache, sdk: Sdk | None, request: RuntimeRequest, have_sources: bool) -> _Plan:
    """What to stage now. Reads the host and the cache; writes nothing."""
    lib_path = [sdk.lib_dir] if sdk is not None else []
    trio_missing = bool(missing_host_libraries(TRIO, lib_path))
    trio = request.force or (trio_missing and current(cache, LIBCXX) is None)
    shortfall = glibc_shortfall(sdk) if sdk is not None else None
    needed = shortfall[0] if shortfall is not None else None
    if needed is not None:
        staged = current(cache, GLIBC)
        provided = staged.glibc_version if staged is not None else None
        glibc = request.force or provided is None or provided < needed
    else:
        # Only --force stages a glibc package the host does not need.
        glibc = request.force and have_sources
    return _Plan(trio_missing, trio, needed, glibc)


# -- reading sources ---------------------------------------------------------------------


def _trio_only(name: str) -> bool:
    """The trio's members, by name: libc++.so.1, libc++.so.1.0 and the like."""
    base = posixpath.basename(name)
    return any(base.startswith(soname) for soname in TRIO)


def _wanted(name: str) -> bool:
    """Members worth keeping from a package: the trio, and the libraries in lib folders."""
    return _trio_only(name) or (posixpath.dirname(name) in GLIBC_DIRS and ".so" in posixpath.basename(name))


def _scan(source: Path, dest: Path, label: str | None = None) -> _Scan:
    """Read one source (file or folder), check its digest, keep the members that matter."""
    label = label or str(source)
    if source.is_dir():
        return _scan_folder(source, dest)
    kind = package_kind(source)
    digest = file_sha256(source)
    record: dict[str, Any] = {"source": label, "sha256": digest, "size": source.stat().st_size}
    deb = rpm = None
    version = None
    if kind == "deb":
        deb = deb_info(source)
        key = (deb.package, deb.version, deb.architecture)
        record.update(package=deb.package, version=deb.version, architecture=deb.architecture)
        pinned = PINNED_DEBS.get(key)
        if pinned is not None:
            if digest != pinned:
                raise IntegrityError(
                    f"sha256 mismatch for {source.name} ({deb.package} {deb.version} "
                    f"{deb.architecture}): expected {pinned}, got {digest}",
                    hint="this is not the package Debian published; nothing was staged",
                )
            record["pinned"] = True
        version = deb.version.partition(":")[2] or deb.version
    elif kind == "rpm":
        with open(source, "rb") as handle:
            rpm = rpm_info(handle, source.name)
        record.update(package=rpm.name, version=f"{rpm.version}-{rpm.release}", architecture=rpm.arch)
        version = f"{rpm.version}-{rpm.release}"
    collected = collect(package_members(source), _wanted, dest, source.name)
    scan = _Scan(label, [record], collected, deb, rpm, version)
    if kind == "tar":
        scan.version = _llvm_version(collected)
    return scan


def _scan_folder(folder: Path, dest: Path) -> _Scan:
    """A folder given by the user: its libraries, links followed on disk (it is trusted)."""
    dest.mkdir(parents=True, exist_ok=True)
    collected = Collected()
    records = []
    for entry in sorted(folder.iterdir()):
        if not _wanted(entry.name) or not entry.exists():
            continue
        real = entry.resolve()
        if not real.is_file():
            continue
        target = dest / str(len(collected.files))
        shutil.copyfile(real, target)
        digest = file_sha256(target)
        size = target.stat().st_size
        collected.files[entry.name] = CollectedFile(target, digest, size, 0o755)
        records.append({"source": str(entry), "sha256": digest, "size": size})
    return _Scan(str(folder), records, collected)


def _llvm_version(collected: Collected) -> str | None:
    for name in collected.names():
        match = _LLVM_TOP.search(name)
        if match:
            return match.group(1)
    return None


def _find(scan: _Scan, soname: str, dirs: Sequence[str] | None = None) -> tuple[str, CollectedFile] | None:
    """The file a member named `soname` (in one of `dirs`) leads to, following links."""
    for name in scan.collected.names():
        if posixpath.basename(name) != soname:
            continue
        if dirs is not None and posixpath.dirname(name) not in dirs:
            continue
        target = scan.collected.resolve(name)
        if target is not None:
            return name, scan.collected.files[target]
    return None


def _apt_download(folder: Path) -> list[Path] | None:
    """The trio's .debs fetched by `apt-get download` (no root needed), or None if it fails."""
    apt = shutil.which("apt-get")
    if apt is None or not _debian_family():
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


def _stream_llvm(url: str, dest: Path, backoff_base: float) -> _Scan:
    """Stream the release archive once, keeping only the trio; retry from the start."""
    session = make_session()
    attempt = 0
    while True:
        attempt += 1
        target = dest / f"attempt{attempt}"
        try:
            return _stream_once(session, url, target)
        except Retry as retry:
            remove_tree(target)
            if attempt >= LLVM_ATTEMPTS:
                raise DownloadError(
                    f"streaming {redact(url)} failed after {attempt} attempts: {retry.reason}",
                    hint="check the network and proxy settings, set QNNCTL_LLVM_URL to a mirror, "
                    "or give the libraries with --runtime-from",
                ) from None
            delay = retry.delay if retry.delay is not None else backoff_delay(attempt, backoff_base)
            delay = min(delay, BACKOFF_MAX)  # a server's Retry-After is a request, not an order
            log.warning("%s; retrying in %.1fs", retry.reason, delay)
            time.sleep(delay)


def _stream_once(session: Any, url: str, dest: Path) -> _Scan:
    shown = redact(url)  # QNNCTL_LLVM_URL may name a mirror with a password or a token
    log.info("streaming %s (only the three libraries are kept)", shown)
    try:
        response = session.get(url, stream=True, timeout=(CONNECT_TIMEOUT, READ_TIMEOUT))
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise Retry(f"cannot reach {shown}: {describe(exc)}") from None
    except requests.RequestException as exc:
        raise DownloadError(f"request to {shown} failed: {describe(exc)}") from None
    with response:
        status = response.status_code
        if retryable_status(status):
            raise Retry(f"HTTP {status} from {shown}", retry_after(response.headers.get("Retry-After")))
        if status != 200:
            raise DownloadError(
                f"HTTP {status} from {shown}",
                hint="check QNNCTL_LLVM_URL, or give the libraries with --runtime-from",
            )
        if "text/html" in response.headers.get("Content-Type", "").lower():
            raise DownloadError(f"{shown} answered with an HTML page, not the LLVM archive",
                                hint="check QNNCTL_LLVM_URL and proxy settings")
        hashing = HashingReader(response.raw)
        try:
            collected = collect(tar_members(io.BufferedReader(hashing, 1 << 20), shown), _trio_only, dest, shown)
            hashing.drain()
        except (requests.RequestException, urllib3.exceptions.HTTPError, ConnectionError) as exc:
            raise Retry(f"the connection to {shown} broke: {describe(exc)}") from None
    record = {"source": shown, "sha256": hashing.sha256.hexdigest(), "size": hashing.size}
    return _Scan(shown, [record], collected, version=_llvm_version(collected))


# -- building ----------------------------------------------------------------------------


def _safe_name(text: str) -> str:
    return _UNSAFE_NAME.sub("_", text)


def _place(file: CollectedFile, target: Path) -> None:
    with open(file.path, "rb") as handle:
        if handle.read(4) != b"\x7fELF":
            raise IntegrityError(f"{target.name} in the package is not an ELF library",
                                 hint="give the package that holds the library itself; nothing was staged")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(file.path, target)
    except OSError:
        shutil.copyfile(file.path, target)
    # Libraries are mapped, but the loader is also run as a program: it needs its exec bit.
    os.chmod(target, 0o755)  # noqa: S103


def _trio_from(scans: Sequence[_Scan]) -> dict[str, tuple[_Scan, CollectedFile]]:
    found: dict[str, tuple[_Scan, CollectedFile]] = {}
    for soname in TRIO:
        for scan in scans:
            hit = _find(scan, soname)
            if hit is not None:
                found[soname] = (scan, hit[1])
                break
    return found


def _build_trio(
    scans: Sequence[_Scan], work: Path, request: RuntimeRequest, environ: Mapping[str, str]
) -> tuple[Path, str, dict[str, Any]] | None:
    """The trio's tree from the given sources; fetched only when none were given. None: they lack it."""
    found = _trio_from(scans)
    if found and len(found) < len(TRIO):
        absent = [n for n in TRIO if n not in found]
        raise UsageError(
            f"the files given with --runtime-from hold {', '.join(found)} but not {', '.join(absent)}",
            hint="give all three libraries (from one LLVM release) or none of them",
        )
    if not found and scans:
        return None  # the files given are what the user wants used: nothing is fetched
    used: Sequence[_Scan] = scans
    if not found:
        used = []
        debs = _apt_download(work / "apt") if request.use_apt else None
        if debs is not None:
            used = [_scan(deb, work / f"apt{i}", label=f"apt-get download {deb.name}")
                    for i, deb in enumerate(debs)]
            found = _trio_from(used)
            if len(found) < len(TRIO):
                log.info("the packages apt-get fetched lack %s",
                         ", ".join(n for n in TRIO if n not in found))
                found = {}
        if not found:
            url = request.llvm_url or environ.get(LLVM_URL_ENV) or LLVM_URL
            used = [_stream_llvm(url, work / "llvm", request.backoff_base)]
            found = _trio_from(used)
            if len(found) < len(TRIO):
                raise IntegrityError(
                    f"{redact(url)} does not hold {', '.join(n for n in TRIO if n not in found)}",
                    hint="check QNNCTL_LLVM_URL; it must be the LLVM 14 release archive for Linux x86_64",
                )
    tree = work / "libcxx"
    files = {}
    for soname, (_, file) in found.items():
        _place(file, tree / "lib" / soname)
        files[f"lib/{soname}"] = file.sha256
    contributing = [scan for scan in used if any(s is scan for s, _ in found.values())]
    version = next((s.version for s in contributing if s.deb and s.deb.package == APT_PACKAGES[0]), None)
    version = version or next((s.version for s in contributing if s.version), None)
    if version is None:
        version = "local-" + hashlib.sha256("".join(sorted(files.values())).encode()).hexdigest()[:12]
    manifest = _manifest(LIBCXX, contributing, files)
    return tree, _safe_name(f"{LIBCXX}-{version}"), manifest


def _build_glibc(
    scans: Sequence[_Scan], work: Path, needed: Version | None, sdk: Sdk | None
) -> tuple[Path, str, dict[str, Any]] | None:
    chosen = None
    for scan in scans:
        loader = _find(scan, LOADER, GLIBC_DIRS)
        libc = _find(scan, LIBC, GLIBC_DIRS)
        if loader is not None and libc is not None:
            chosen = (scan, libc[0])
            break
    if chosen is None:
        return None
    scan, libc_member = chosen
    # The folder that holds libc.so.6 first, so its copies win over same-named others.
    first = posixpath.dirname(libc_member)
    order = [first, *(d for d in GLIBC_DIRS if d != first)]
    tree = work / "glibc"
    files: dict[str, str] = {}
    for folder in order:
        for name in scan.collected.names():
            base = posixpath.basename(name)
            if posixpath.dirname(name) != folder or not _SONAME.match(base) or f"lib/{base}" in files:
                continue
            target = scan.collected.resolve(name)
            if target is None:
                continue
            file = scan.collected.files[target]
            _place(file, tree / "lib" / base)
            files[f"lib/{base}"] = file.sha256
    provided = glibc_provided_by(tree / "lib" / LIBC)
    if needed is not None and (provided is None or provided < needed):
        what = f"SDK {sdk.version}" if sdk is not None else "the SDK"
        raise QnnctlError(
            f"{scan.label} holds glibc {_dotted(provided)}; {what} needs {_dotted(needed)} or newer",
            hint="give a newer glibc package with --runtime-from; nothing was staged",
        )
    version = scan.version or f"{_dotted(provided)}-local"
    manifest = _manifest(GLIBC, [scan], files)
    manifest["loader"] = f"lib/{LOADER}"
    manifest["glibc_version"] = _dotted(provided)
    return tree, _safe_name(f"{GLIBC}-{version}"), manifest


def _manifest(kind: str, scans: Sequence[_Scan], files: dict[str, str]) -> dict[str, Any]:
    return {
        "schema": RUNTIME_SCHEMA,
        "kind": kind,
        "sources": [record for scan in scans for record in scan.records],
        "files": files,
        "loader": None,
        "staged_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "staged_ns": time.time_ns(),
        "qnnctl_version": __version__,
    }


def _commit(tree: Path, name: str, manifest: dict[str, Any], cache: Cache, work: Path) -> Staged:
    """Write the manifest last, then rename the tree into runtime/. Caller holds the lock."""
    manifest = dict(manifest, name=name)
    write_json_atomic(tree / MANIFEST_NAME, manifest)
    destination = cache.runtime / name
    cache.runtime.mkdir(parents=True, exist_ok=True)
    if destination.exists() or destination.is_symlink():
        # An older stage of the same name (--force) or an incomplete one: move it aside.
        os.replace(destination, work / f"old-{name}")
    os.replace(tree, destination)
    fsync_dir(cache.runtime)
    label = "libc++ runtime" if manifest["kind"] == LIBCXX else f"glibc {manifest.get('glibc_version')}"
    log.info("staged %s into %s", label, destination / "lib")
    return Staged(destination, manifest)
