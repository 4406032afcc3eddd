"""`qnnctl lock` and `qnnctl lock --check`: the project's lock written from an SDK (installed
first when it is not), and compared with what qnnctl resolves.

Above the install pipeline, which it calls; qnnctl.sdk.lockfile, below it, reads locks and hands
what they pin down to the install's gate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qnnctl.errors import QnnctlError, UsageError
from qnnctl.fleet.mirror import fetch_archive
from qnnctl.host.build import runtime_digests
from qnnctl.install.pipeline import InstallRequest, install
from qnnctl.net.urls import redact
from qnnctl.records import Record
from qnnctl.sdk.cache import MANIFEST_NAME, Cache
from qnnctl.sdk.evidence import own_manifest
from qnnctl.sdk.gate import is_sha256
from qnnctl.sdk.layout import Sdk, read_build_id
from qnnctl.sdk.lockfile import (
    LockedSdk,
    LockError,
    disagreements,
    lock_destination,
    read_lock,
    write_lock,
)
from qnnctl.sdk.members import tree_digests
from qnnctl.sdk.select import (
    LOCK_FILE,
    find_installed,
    find_lock,
    named_sdk,
    pin_conflict,
    select_sdk,
    selection_origin,
)
from qnnctl.sdk.versions import is_full_version
from qnnctl.sdk.vouchers import vouchers

log = logging.getLogger("qnnctl.sdk.lockfile")


class Written(Record):
    path: Path
    lock: LockedSdk
    trust: str
    replaced: LockedSdk | None


def _resolve(spec: str | None, environ: Mapping[str, str], cwd: Path, cache: Cache) -> tuple[str, Sdk | None, str]:
    """(version, the SDK installed for it or None, why that version) as qnnctl resolves it now."""
    selection = select_sdk(spec, environ, cwd, cache, mirror=True)
    if selection.caller_managed:
        raise UsageError("QNN_SDK_ROOT is exported but empty: the caller manages the SDK, so there is none to lock",
                         hint="give the version: `qnnctl lock VERSION`")
    why = selection.why
    if selection.root is not None:
        sdk = named_sdk(selection.root, selection_origin(selection))
        if not is_full_version(sdk.version):
            raise UsageError(f"cannot tell the version of the SDK at {sdk.root}",
                             hint="give the version: `qnnctl lock VERSION`")
        return sdk.version, sdk, why
    version = selection.version or ""
    return version, find_installed(version, cache, environ), why


def make_lock(spec: str | None, environ: Mapping[str, str], cwd: Path, cache: Cache,
              terminal: bool = False) -> Written:
    """Write the project's lock for the SDK `spec` names (or the one qnnctl resolves).

    The values come from the manifest of the SDK installed for that version when it records
    them; else the SDK is installed (an SDK on disk without them: its archive is fetched once
    and hashed).
    """
    version, sdk, _ = _resolve(spec, environ, cwd, cache)
    manifest = own_manifest(sdk, cache) if sdk is not None else None
    if sdk is None:
        # The lock being written is not checked against the one it replaces.
        result = install(InstallRequest(spec=version), cache, environ, cwd, vouchers(environ, cwd, lock=False),
                         terminal=terminal)
        sdk = result.sdk
        manifest = own_manifest(sdk, cache) if sdk is not None else None
        fresh = True
    else:
        fresh = False
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # From the manifest of an SDK installed from the whole archive, which records what the lock
    # pins; else from the archive, fetched once (an SDK installed by parts, or by an earlier
    # qnnctl that recorded no component digests, a link, a store).
    if manifest is not None and is_sha256(manifest.get("sha256")) and isinstance(manifest.get("size"), int) \
            and manifest.get("partial") is not True and manifest.get("components") is None and sdk is not None:
        lock = _from_manifest(manifest, version, sdk, stamp)
        source = lock.urls[0] if lock.urls else "an unrecorded source"
        trust = (f"These values were computed from the archive qnnctl downloaded now from {source}."
                 if fresh else
                 f"These values were recorded when SDK {version} was installed from {source} "
                 f"({manifest.get('installed_at', 'at an unrecorded time')}).")
    else:
        where = f"{sdk.root} ({sdk.origin})" if sdk is not None else "the SDK in use"
        log.info("SDK %s at %s has no recorded checksum; fetching its archive once to compute it", version, where)
        fetched = fetch_archive(version, cache, environ, terminal=terminal, keep=False, check_lock=False)
        lock = LockedSdk(path=Path(), version=version, sha256=fetched.sha256, size=fetched.size,
                         build_id=fetched.build_id, urls=(fetched.url,), locked_at=stamp,
                         central_directory_sha256=fetched.central_directory_sha256,
                         components=_components_of(manifest), component_sha256=fetched.components)
        trust = (f"These values were computed from the archive qnnctl downloaded now from {fetched.url} "
                 f"(the SDK in use, {where}, records none).")
        built = read_build_id(sdk.root) if sdk is not None else None
        if built is not None and fetched.build_id is not None and built != fetched.build_id:
            log.warning("the SDK in use at %s is build %s, but the archive is build %s", where, built,
                        fetched.build_id)
    path = lock_destination(cwd)
    previous = None
    if path.is_file():
        try:
            previous = read_lock(path)
        except LockError:
            previous = None
    # The host runtime staged here, as it is now: `install --locked --runtime` refuses others.
    lock = lock._replace(path=path, runtime_sha256=runtime_digests(cache) or None)
    write_lock(path, lock, trust)
    return Written(path, lock, trust, previous)


def _from_manifest(manifest: Mapping[str, Any], version: str, sdk: Sdk | None, stamp: str) -> LockedSdk:
    build = manifest.get("build_id")
    if not isinstance(build, str) and sdk is not None:
        build = read_build_id(sdk.root)
    source = manifest.get("source")
    digests = manifest.get("component_sha256")
    if not isinstance(digests, dict) and sdk is not None:
        # Installed whole by a qnnctl that recorded no component digests: its files as they are.
        log.info("computing the digest of each component of SDK %s from its files at %s", version, sdk.root)
        digests = tree_digests(sdk.root, skip={MANIFEST_NAME})
    cd = manifest.get("central_directory_sha256")
    return LockedSdk(
        path=Path(),
        version=version,
        sha256=str(manifest["sha256"]),
        size=int(manifest["size"]),
        build_id=build if isinstance(build, str) else None,
        # Recorded redacted; one written by an earlier qnnctl may not be.
        urls=(redact(source),) if isinstance(source, str) else (),
        central_directory_sha256=cd if is_sha256(cd) else None,
        components=_components_of(manifest),
        locked_at=stamp,
        component_sha256={str(k): str(v) for k, v in digests.items()} if isinstance(digests, dict) else None,
    )


def _components_of(manifest: Mapping[str, Any] | None) -> tuple[str, ...] | None:
    """The components an SDK was installed with, for the lock to name (None: all of them)."""
    components = (manifest or {}).get("components")
    return tuple(str(c) for c in components) if isinstance(components, list) else None


class Verdict(Record):
    """The lock against what qnnctl resolves: `problems` empty when they agree."""

    lock: LockedSdk
    version: str
    why: str
    sdk: Sdk | None
    problems: list[str]


def verdict(spec: str | None, environ: Mapping[str, str], cwd: Path, cache: Cache) -> Verdict | None:
    """The project's lock compared with the resolution; None when there is no lock."""
    path = find_lock(cwd)
    if path is None:
        return None
    lock = read_lock(path)
    version, sdk, why = _resolve(spec, environ, cwd, cache)
    return Verdict(lock, version, why, sdk, disagreements(lock, version, sdk, cache))


def check_lock(spec: str | None, environ: Mapping[str, str], cwd: Path, cache: Cache) -> Verdict:
    """`qnnctl lock --check`: LockError (exit 1) when there is no lock or it disagrees."""
    found = verdict(spec, environ, cwd, cache)
    if found is None:
        raise LockError(f"there is no {LOCK_FILE} in {cwd} or any folder above it",
                        hint="write one with `qnnctl lock`, and commit it")
    if found.problems:
        hint = f"`qnnctl lock {found.version}` writes the lock for SDK {found.version}"
        if found.version != found.lock.version:
            hint = (f"pin the locked version with `qnnctl use {found.lock.version}`, or {hint} "
                    f"(qnnctl chose {found.version}: {found.why})")
        raise LockError("; ".join(found.problems), hint=hint)
    return found


def pinned_notes(version: str, environ: Mapping[str, str], cwd: Path, cache: Cache) -> list[str]:
    """What a newly written pin of `version` disagrees with: the SDKs on disk (it is not
    installed), the project's qnnctl.lock (it pins another), this shell (set up by `qnnctl
    env` for another SDK, which every command but `env` keeps using)."""
    notes = []
    if find_installed(version, cache, environ) is None:
        notes.append(f"SDK {version} is not installed; `qnnctl install` installs it")
    lock_path = find_lock(cwd)
    try:
        lock = read_lock(lock_path) if lock_path is not None else None
    except QnnctlError:
        lock = None  # `qnnctl lock --check` and `doctor` say what is wrong with it
    if lock_path is not None and lock is not None and lock.version != version:
        notes.append(f"{lock_path} pins SDK {lock.version}, not {version}: `qnnctl lock --check` and `qnnctl "
                     f"install --locked` fail until `qnnctl lock` writes it again for {version}")
    conflict = pin_conflict(environ, cwd, cache)
    if conflict is not None:
        notes.append(f"{conflict.said()}; {conflict.switch()}")
    return notes
