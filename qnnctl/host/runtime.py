"""The host runtime the SDK's libraries need: the libc++ trio, and glibc where the host's is old.

The SDK's host libraries are built with clang against libc++ (`libc++.so.1`, `libc++abi.so.1`,
`libunwind.so.1`, no longer shipped with the SDK) and reference recent glibc symbol versions.
What a host lacks (`needs`) is staged into `$QNNCTL_CACHE_DIR/runtime/<name>-<version>/lib`
the way an SDK is installed: check, lock, check again, build in tmp/, rename into place; a
folder counts only once its manifest exists. The bytes come from sources (`sources`, `llvm`)
that each hash exactly what they yield: the files given by the user (--runtime-from: then
nothing is fetched, and each file is used or said why not); without them, `apt-get download`
on a Debian-family host (apt checks them against its signed lists), else LLVM's 14.0.0
release archive, held to its published sha256. The trees are built (`build`) and held to the
project's lock when it pins the runtime, all before the first is committed.

A staged glibc is never put on LD_LIBRARY_PATH (a libc that does not match the running loader
crashes every program); it is used only by starting a program under its own loader,
`<ld.so> --library-path <dirs> PROGRAM ...` (see `qnnctl.run.lower.reexec_command`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path

from qnnctl.errors import IntegrityError, UsageError
from qnnctl.host.build import RuntimePins, Tree, check_pinned, commit, glibc_tree, staged_files, trio_tree
from qnnctl.host.llvm import LLVM_VERSION, llvm_source, stream_llvm
from qnnctl.host.needs import dotted, glibc_shortfall, host_glibc_text, missing_host_libraries, trio_needed
from qnnctl.host.packages import CollectedFile
from qnnctl.host.sources import (
    APT_PACKAGES,
    LIBC,
    Scan,
    apt_download,
    check_sources,
    find,
    holds_glibc,
    scan,
)
from qnnctl.host.staged import GLIBC, LIBCXX, LOADER, TRIO, Staged, Version, current, staged_lib_dirs
from qnnctl.net.urls import redact
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.hosts import HOSTS, this_host
from qnnctl.sdk.layout import Sdk
from qnnctl.sdk.lockfile import locked_runtime
from qnnctl.sdk.work import remove_stale_work, version_lock, work_folder

log = logging.getLogger("qnnctl.host.runtime")

LOCK_KEY = "runtime"


@dataclass(frozen=True)
class RuntimeRequest:
    sources: tuple[Path, ...] = ()  # --runtime-from: .deb, .rpm, .tar.xz or folders
    force: bool = False  # stage even when the host or an earlier stage already provides it
    use_apt: bool = True
    llvm_url: str | None = None  # default: $QNNCTL_LLVM_URL, else the LLVM release
    llvm_sha256: str | None = None  # default: $QNNCTL_LLVM_SHA256, else the published one
    backoff_base: float = 1.0
    pins: RuntimePins | None = None  # what the project's lock pins of the runtime


# What happened to each part: "host" (the host has it), "reused", "staged", "not-needed",
# or "missing" (needed, but no source for it was given).
@dataclass(frozen=True)
class RuntimeResult:
    libcxx: Staged | None
    libcxx_action: str
    glibc: Staged | None
    glibc_action: str


@dataclass
class _Plan:
    trio_missing: bool  # the host (with the SDK's own folder) lacks part of the trio
    trio: bool  # stage the trio now
    glibc_needed: Version | None  # the SDK needs this glibc and the host's is older
    glibc: bool  # stage glibc now, if a source for it was given


def ensure_trio(cache: Cache, sdk: Sdk, environ: Mapping[str, str], cwd: Path) -> RuntimeResult | None:
    """Stage the libc++ trio when the SDK needs it and neither the host nor the cache has it,
    held to what the project's lock (found from `cwd`) pins of it, as `install --runtime` is.

    This is what `install` and `lower` do on their own; `install --runtime` stages whatever
    is missing, needed or not.
    """
    wanted = trio_needed(sdk)
    if not wanted or not missing_host_libraries(wanted, [sdk.lib_dir, *staged_lib_dirs(cache, sdk)]):
        return None
    log.info("the SDK's libraries need %s, which this host lacks; staging them "
             "(what `qnnctl install --runtime` does)", ", ".join(wanted))
    return stage_runtime(cache, sdk, RuntimeRequest(pins=lock_pins(sdk.version, cwd)), environ)


def lock_pins(version: str, cwd: Path) -> RuntimePins | None:
    """What the project's lock (found from `cwd`) pins of the host runtime staged beside SDK
    `version`; None when it locks no such runtime."""
    found = locked_runtime(version, cwd)
    return RuntimePins(str(found[0]), found[1]) if found is not None else None


def require_stageable_host() -> None:
    """UsageError on a host whose SDK libraries need no libc++ (aarch64: the system's GNU
    libstdc++, glibc and libatomic, which qnnctl does not stage)."""
    host = this_host()
    if host.cxx_runtime != HOSTS[0].cxx_runtime:
        packages = " ".join(dict.fromkeys(host.packages.values()))
        raise UsageError(
            f"--runtime stages libc++ and glibc for {HOSTS[0].name}; on {host.name} the SDK's libraries "
            f"use the system's {host.cxx_runtime} and glibc, which qnnctl does not stage",
            hint=f"install them with the system's packages (Debian/Ubuntu: `sudo apt-get install {packages}`); "
            "`qnnctl doctor` says what is missing")


def stage_runtime(
    cache: Cache, sdk: Sdk | None, request: RuntimeRequest, environ: Mapping[str, str]
) -> RuntimeResult:
    """Stage what `sdk` needs and the host lacks; see the module's docstring. Only on a host
    whose SDK libraries are built against libc++ (x86_64): the GNU libstdc++ the aarch64
    libraries need comes with the system and is not staged."""
    require_stageable_host()
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
            _check_kept(cache, plan, request.pins)
            if plan.trio or plan.glibc:
                remove_stale_work(cache, LOCK_KEY)
                with work_folder(cache.tmp / f"{LOCK_KEY}.{uuid.uuid4().hex[:12]}") as work:
                    committed, unused = _stage(cache, sdk, request, environ, sources, plan, work)
    else:
        _check_kept(cache, plan, request.pins)
    if not plan.trio and not plan.glibc:
        # Nothing is staged, so nothing is read: what each file holds does not matter.
        reason = f"{_trio_unneeded(cache, plan)}, and {_glibc_unneeded(cache, plan)}"
        unused = {str(source): reason for source in sources}
    for source, reason in unused.items():
        log.warning("--runtime-from %s is not used: %s", source, reason)
    return _result(cache, plan, committed)


def _check_kept(cache: Cache, plan: _Plan, pins: RuntimePins | None) -> None:
    """What stays staged (not staged again now), hashed and held to the lock when it pins it."""
    check_staged(cache, pins, restaged={kind for kind, again in ((LIBCXX, plan.trio), (GLIBC, plan.glibc)) if again})


def check_staged(cache: Cache, pins: RuntimePins | None, restaged: Set[str] = frozenset()) -> None:
    """What is staged (but the kinds in `restaged`), hashed as the loader would map it and held to
    `pins` where they pin its kind: IntegrityError (exit 4) for another."""
    if pins is None:
        return
    for kind in (LIBCXX, GLIBC):
        staged = current(cache, kind)
        if staged is not None and kind not in restaged:
            check_pinned(kind, staged_files(staged), pins, f"the runtime staged in {staged.root}",
                         fix="stage the locked one again: `qnnctl install --runtime --force --runtime-from FILE`")


def hold_staged_to_lock(cache: Cache, version: str, cwd: Path) -> None:
    """In a project whose lock (found from `cwd`) pins the host runtime staged beside SDK
    `version`, the runtime staged now must be the one it pins, whoever staged it and from where
    (exit 4 otherwise): what `install`, `lower` and the library put on the loader's path is held
    to the lock as what they stage is."""
    check_staged(cache, lock_pins(version, cwd))


def _stage(cache: Cache, sdk: Sdk | None, request: RuntimeRequest, environ: Mapping[str, str],
           sources: Sequence[Path], plan: _Plan, work: Path) -> tuple[dict[str, Staged], dict[str, str]]:
    """Read every source and build every tree first, so that a failure stages nothing.

    Returns what was staged, and why each source that contributed nothing was not used. A
    source that holds neither the trio nor a glibc is refused.
    """
    scans = [scan(source, work / f"src{i}") for i, source in enumerate(sources)]
    trees: list[Tree] = []
    if plan.trio:
        built = _build_trio(scans, work, request, environ)
        if built is not None:
            trees.append(built)
    if plan.glibc:
        glibc = glibc_tree(scans, work, plan.glibc_needed, sdk)
        if glibc is not None:
            trees.append(glibc)
    unused = _unused_sources(cache, plan, scans, trees)
    # A kind planned but not built (the sources lack it) stays as it was staged: held to the lock as kept.
    check_staged(cache, request.pins, restaged={str(tree.manifest["kind"]) for tree in trees})
    for tree in trees:
        sources_of = ", ".join(str(record["source"]) for record in tree.manifest["sources"])
        check_pinned(str(tree.manifest["kind"]), tree.manifest["files"], request.pins,
                     f"what would be staged from {sources_of}")
    committed = {}
    for tree in trees:
        committed[str(tree.manifest["kind"])] = commit(tree, cache, work)
    return committed, unused


def _unused_sources(cache: Cache, plan: _Plan, scans: Sequence[Scan], trees: Sequence[Tree]) -> dict[str, str]:
    """Why each source no tree was built from is not used; UsageError for one that holds nothing of use."""
    used = {str(record["source"]) for tree in trees for record in tree.manifest["sources"]}
    taken = {str(tree.manifest["kind"]): ", ".join(str(r["source"]) for r in tree.manifest["sources"])
             for tree in trees}
    unused = {}
    for source in scans:
        if any(str(record["source"]) in used for record in source.records):
            continue
        holds_trio = any(find(source, soname) is not None for soname in TRIO)
        reasons = []
        if holds_trio:
            reasons.append(f"the libc++ trio came from {taken[LIBCXX]}" if LIBCXX in taken
                           else _trio_unneeded(cache, plan))
        if holds_glibc(source):
            reasons.append(f"the glibc came from {taken[GLIBC]}" if GLIBC in taken
                           else _glibc_unneeded(cache, plan))
        if not reasons:
            raise UsageError(
                f"--runtime-from {source.label} holds none of {', '.join(TRIO)}, and no glibc "
                f"({LOADER} with {LIBC}) (libraries of another class or machine than the SDK's do not count)",
                hint="give the packages, the LLVM 14 archive or a folder that hold them; nothing was staged",
            )
        unused[source.label] = ", and ".join(reasons)
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
        return (f"this host's glibc {host_glibc_text()} covers what the SDK needs, so no glibc is "
                "staged (--force stages one all the same)")
    staged = current(cache, GLIBC)
    have = dotted(staged.glibc_version) if staged is not None else "none"
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
            dotted(plan.glibc_needed), host_glibc_text(), dotted(plan.glibc_needed),
        )
    else:
        glibc_action = "reused"
        if glibc is not None:
            log.info("glibc %s already staged in %s", glibc.manifest.get("glibc_version"), glibc.lib_dir)
    return RuntimeResult(libcxx, libcxx_action, glibc, glibc_action)


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


def _trio_from(scans: Sequence[Scan]) -> dict[str, tuple[Scan, CollectedFile]]:
    found: dict[str, tuple[Scan, CollectedFile]] = {}
    for soname in TRIO:
        for source in scans:
            hit = find(source, soname)
            if hit is not None:
                found[soname] = (source, hit[1])
                break
    return found


def _build_trio(scans: Sequence[Scan], work: Path, request: RuntimeRequest,
                environ: Mapping[str, str]) -> Tree | None:
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
    used: Sequence[Scan] = scans
    if not found:
        used = []
        debs = apt_download(work / "apt") if request.use_apt else None
        if debs is not None:
            used = [scan(deb, work / f"apt{i}", label=f"apt-get download {deb.name}") for i, deb in enumerate(debs)]
            found = _trio_from(used)
            if len(found) < len(TRIO):
                log.info("the packages apt-get fetched lack %s", ", ".join(n for n in TRIO if n not in found))
                found = {}
        if not found:
            url, expected = llvm_source(environ, request.llvm_url, request.llvm_sha256)
            used = [stream_llvm(url, expected, work / "llvm", request.backoff_base)]
            found = _trio_from(used)
            if len(found) < len(TRIO):
                raise IntegrityError(
                    f"{redact(url)} does not hold {', '.join(n for n in TRIO if n not in found)}",
                    hint="check QNNCTL_LLVM_URL; it must be the LLVM 14 release archive for Linux x86_64",
                )
    contributing = [source for source in used if any(s is source for s, _ in found.values())]
    version = next((s.version for s in contributing if s.deb and s.deb.package == APT_PACKAGES[0]), None)
    version = version or next((s.version for s in contributing if s.version), None)
    return trio_tree({soname: file for soname, (_, file) in found.items()}, contributing, version, work)
