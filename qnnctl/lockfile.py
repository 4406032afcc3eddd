"""`qnnctl.lock`: the SDK a project runs, pinned by its checksums.

Qualcomm publishes no checksums for its archives, so the values come from the first download
(or from the manifest of an SDK installed from one): trust on first use, said in the file and
on stderr. From then on `install` checks every archive of that version against the lock (a
mismatch is exit 4 and installs nothing), `lock --check` tells CI when the lock and what qnnctl
resolves disagree, and doctor's `lock` check reports it.

The file is TOML (read with `tomllib`, or `tomli` before Python 3.11), written by hand here:
it holds only strings, integers and lists of strings.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from qnnctl.cache import Cache, read_manifest
from qnnctl.errors import EXIT_FAILED, IntegrityError, QnnctlError, UsageError
from qnnctl.sdk import Sdk, find_installed, find_pin, read_build_id, sdk_from_root, select_sdk, selection_origin
from qnnctl.versions import is_full_version

log = logging.getLogger("qnnctl.lockfile")

LOCK_FILE = "qnnctl.lock"
LOCK_SCHEMA = 1
_HEX = frozenset("0123456789abcdef")


class LockError(QnnctlError):
    """A lock that is missing where one is required, cannot be read, or disagrees (exit 1)."""

    exit_code = EXIT_FAILED


class LockedSdk(NamedTuple):
    """What a lock file pins."""

    path: Path
    version: str
    sha256: str
    size: int | None = None
    build_id: str | None = None
    urls: tuple[str, ...] = ()
    central_directory_sha256: str | None = None
    components: tuple[str, ...] | None = None
    locked_at: str | None = None


def is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def find_lock(cwd: Path) -> Path | None:
    """The nearest `qnnctl.lock` at or above `cwd`."""
    for folder in (cwd, *cwd.parents):
        candidate = folder / LOCK_FILE
        if candidate.is_file():
            return candidate
    return None


def lock_destination(cwd: Path) -> Path:
    """Where `qnnctl lock` writes: beside the project's `.qnn-version`, else in `cwd`."""
    pin = find_pin(cwd)
    return (pin.parent if pin is not None else cwd) / LOCK_FILE


def _toml_loads(text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    loaded: dict[str, Any] = tomllib.loads(text)  # tomli (before 3.11) may have no stubs here
    return loaded


# What a lock may be: `qnnctl lock` writes a few hundred bytes, two levels deep. The TOML
# parser recurses once per "[" or "{", and a lock comes with a project that anyone may have
# written: a bigger or deeper one is refused before it is parsed.
_LOCK_MAX_BYTES = 1 << 20
_LOCK_MAX_DEPTH = 16


def _toml_depth(text: str) -> int:
    """How deep arrays and inline tables nest in TOML `text` (strings and comments skipped)."""
    depth = deepest = i = 0
    while i < len(text):
        c = text[i]
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth = max(depth - 1, 0)
        elif c == "#":
            i = text.find("\n", i)
            if i < 0:
                break
        elif c in "\"'":
            quote = c * 3 if text.startswith(c * 3, i) else c
            j = i + len(quote)
            while j < len(text) and not text.startswith(quote, j):
                j += 2 if c == '"' and text[j] == "\\" else 1  # only basic strings escape
            i = j + len(quote) - 1
        i += 1
    return deepest


def read_lock(path: Path) -> LockedSdk:
    """The lock at `path`; LockError (exit 1) naming the file when it is not one."""
    hint = f"fix it, or write it again with `qnnctl lock` (in {path.parent})"
    try:
        with path.open("rb") as f:
            raw = f.read(_LOCK_MAX_BYTES + 1)
        if len(raw) > _LOCK_MAX_BYTES:
            raise LockError(f"{path} is larger than a lock can be ({_LOCK_MAX_BYTES} bytes)", hint=hint)
        text = raw.decode("utf-8")
        if _toml_depth(text) > _LOCK_MAX_DEPTH:
            raise LockError(f"{path} nests arrays or tables deeper than a lock can ({_LOCK_MAX_DEPTH} levels)",
                            hint=hint)
        data = _toml_loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise LockError(f"cannot read the lock {path}: {exc}", hint=hint) from None
    except ValueError as exc:  # tomllib.TOMLDecodeError
        raise LockError(f"{path} is not TOML: {exc}", hint=hint) from None
    except RecursionError:  # what the depth check missed: still the file's fault, not qnnctl's
        raise LockError(f"{path} nests too deep to be read", hint=hint) from None
    schema = data.get("schema")
    if schema != LOCK_SCHEMA:
        raise LockError(f"{path} has schema {schema!r}; this qnnctl reads schema {LOCK_SCHEMA}", hint=hint)
    sdk = data.get("sdk")
    if not isinstance(sdk, dict):
        raise LockError(f"{path} has no [sdk] table", hint=hint)
    version, sha256 = sdk.get("version"), sdk.get("sha256")
    if not isinstance(version, str) or not is_full_version(version):
        raise LockError(f"{path}: sdk.version {version!r} is not an SDK version", hint=hint)
    if not is_sha256(sha256):
        raise LockError(f"{path}: sdk.sha256 {sha256!r} is not a sha256 digest (64 lowercase hex digits)",
                        hint=hint)
    size, build, cd = sdk.get("size"), sdk.get("build_id"), sdk.get("central_directory_sha256")
    urls, components = sdk.get("urls", []), sdk.get("components")
    return LockedSdk(
        path=path,
        version=version,
        sha256=str(sha256),
        size=size if isinstance(size, int) and not isinstance(size, bool) else None,
        build_id=build if isinstance(build, str) else None,
        urls=tuple(u for u in urls if isinstance(u, str)) if isinstance(urls, list) else (),
        central_directory_sha256=cd if is_sha256(cd) else None,
        components=tuple(c for c in components if isinstance(c, str)) if isinstance(components, list) else None,
        locked_at=sdk.get("locked_at") if isinstance(sdk.get("locked_at"), str) else None,
    )


def _toml_string(value: str) -> str:
    # A JSON string is a TOML basic string: the same quotes and escapes (\uXXXX included).
    return json.dumps(value)


def render_lock(lock: LockedSdk, trust: str) -> str:
    """The file's text: a comment that says where the values came from, then the values."""
    from qnnctl import __version__

    comment = [
        "qnnctl.lock: the QAIRT SDK this project uses, pinned by its checksums.",
        f"Written by `qnnctl lock` (qnnctl {__version__}); commit it. `qnnctl install` checks every",
        "archive of this version against it (a mismatch exits 4 and installs nothing), and",
        "`qnnctl lock --check` exits 1 when it and what qnnctl resolves disagree.",
        "",
        "Trust on first use: Qualcomm publishes no checksums for its archives. " + trust,
        "Nothing else vouches for these values: check them once against a copy you trust.",
    ]
    lines = [f"# {line}".rstrip() for line in _wrap(comment)]
    lines += ["", f"schema = {LOCK_SCHEMA}", "", "[sdk]", f"version = {_toml_string(lock.version)}"]
    if lock.build_id is not None:
        lines.append(f"build_id = {_toml_string(lock.build_id)}")
    lines.append(f"sha256 = {_toml_string(lock.sha256)}")
    if lock.size is not None:
        lines.append(f"size = {lock.size}")
    if lock.central_directory_sha256 is not None:
        lines.append(f"central_directory_sha256 = {_toml_string(lock.central_directory_sha256)}")
    if lock.components is not None:
        lines.append("components = [" + ", ".join(_toml_string(c) for c in lock.components) + "]")
    lines.append("urls = [" + ", ".join(_toml_string(u) for u in lock.urls) + "]")
    if lock.locked_at is not None:
        lines.append(f"locked_at = {_toml_string(lock.locked_at)}")
    return "\n".join(lines) + "\n"


def _wrap(lines: list[str], width: int = 96) -> list[str]:
    import textwrap

    out: list[str] = []
    for line in lines:
        out.extend(textwrap.wrap(line, width, break_on_hyphens=False, break_long_words=False) or [""])
    return out


def _write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


# -- comparing a lock with an SDK ------------------------------------------------------------


def disagreements(lock: LockedSdk, version: str, sdk: Sdk | None) -> list[str]:
    """How the lock and an SDK of `version` (installed at `sdk`, if it is) disagree; [] if not."""
    name = lock.path.name
    if version != lock.version:
        return [f"{name} pins SDK {lock.version}, not {version}"]
    if sdk is None:
        return []
    found: list[str] = []
    recorded = (read_manifest(sdk.root) or {}).get("sha256")
    if is_sha256(recorded) and recorded != lock.sha256:
        found.append(f"SDK {version} at {sdk.root} ({sdk.origin}) was installed from an archive whose sha256 is "
                     f"{recorded}; {name} pins {lock.sha256}")
    # An SDK installed in parts (`install --components`) has no archive sha256; its central
    # directory's stands for the archive it came from.
    directory = (read_manifest(sdk.root) or {}).get("central_directory_sha256")
    if is_sha256(directory) and lock.central_directory_sha256 is not None and \
            directory != lock.central_directory_sha256:
        found.append(f"SDK {version} at {sdk.root} ({sdk.origin}) was installed from an archive whose central "
                     f"directory's sha256 is {directory}; {name} pins {lock.central_directory_sha256}")
    build = read_build_id(sdk.root)
    if build is not None and lock.build_id is not None and build != lock.build_id:
        found.append(f"the libraries of SDK {version} at {sdk.root} ({sdk.origin}) are build {build}; "
                     f"{name} pins build {lock.build_id}")
    return found


def checked_by(lock: LockedSdk, sdk: Sdk) -> str | None:
    """What an installed SDK was checked against the lock by; None when it has nothing to check."""
    manifest = read_manifest(sdk.root) or {}
    if is_sha256(manifest.get("sha256")):
        return "the sha256 of the archive it was installed from"
    if lock.central_directory_sha256 is not None and manifest.get("central_directory_sha256") == \
            lock.central_directory_sha256:
        return "the sha256 of the central directory of the archive it was installed from in parts"
    if lock.build_id is not None and read_build_id(sdk.root) is not None:
        return "its libraries' build id"
    return None


def _lock_for(version: str, cwd: Path, required: bool) -> LockedSdk | None:
    """The project's lock when it speaks of `version`; LockError when `required` (--locked) and
    there is no lock, or it pins another version."""
    path = find_lock(cwd)
    if path is None:
        if required:
            raise LockError(f"--locked: there is no {LOCK_FILE} in {cwd} or any folder above it",
                            hint="write one with `qnnctl lock` (and commit it), or drop --locked")
        return None
    lock = read_lock(path)
    if lock.version != version:
        if required:
            raise LockError(f"--locked: {path} pins SDK {lock.version}, not {version}",
                            hint=f"install {lock.version} (`qnnctl use {lock.version}` pins it for the project), "
                            f"or lock {version} with `qnnctl lock {version}`")
        log.info("%s pins SDK %s; SDK %s is not checked against it", path, lock.version, version)
        return None
    return lock


def check_reused(sdk: Sdk, cwd: Path, required: bool) -> None:
    """An SDK `install` found on disk, checked against the project's lock (exit 4 on a mismatch)."""
    lock = _lock_for(sdk.version, cwd, required)
    if lock is None:
        return
    problems = disagreements(lock, sdk.version, sdk)
    if problems:
        raise IntegrityError(
            "; ".join(problems),
            hint=f"reinstall the locked archive: `qnnctl install --force {sdk.version}`, or, if the SDK in use "
            f"is the one to trust, write the lock again: `qnnctl lock {sdk.version}`",
        )
    how = checked_by(lock, sdk)
    if how is None:
        log.warning("SDK %s at %s (%s) has no recorded sha256 and its libraries no build id to check against "
                    "%s; used unchecked", sdk.version, sdk.root, sdk.origin, lock.path)
    else:
        log.debug("SDK %s at %s matches %s by %s", sdk.version, sdk.root, lock.path, how)


def expected_for_download(version: str, cwd: Path, required: bool) -> LockedSdk | None:
    """The lock an archive of `version` about to be installed must match, if any."""
    return _lock_for(version, cwd, required)


def check_archive(lock: LockedSdk | None, digest: str, size: int, shown: str) -> None:
    """IntegrityError (exit 4) when an archive does not match the lock."""
    if lock is None:
        return
    if digest != lock.sha256:
        raise IntegrityError(
            f"the archive from {shown} does not match {lock.path}: its sha256 is {digest}, the lock pins "
            f"{lock.sha256}; nothing was installed",
            hint="the archive or the mirror serving it changed; if the new archive is the one to trust, "
            f"write the lock again with `qnnctl lock {lock.version}`",
        )
    if lock.size is not None and size != lock.size:  # pragma: no cover - a sha256 match with another size
        raise IntegrityError(f"the archive from {shown} is {size} bytes; {lock.path} pins {lock.size}")


# -- `qnnctl lock` and `qnnctl lock --check` -------------------------------------------------


class Written(NamedTuple):
    path: Path
    lock: LockedSdk
    trust: str
    replaced: LockedSdk | None


def _resolve(spec: str | None, environ: Mapping[str, str], cwd: Path, cache: Cache) -> tuple[str, Sdk | None, str]:
    """(version, the SDK installed for it or None, why that version) as qnnctl resolves it now."""
    selection = select_sdk(spec, environ, cwd, cache)
    if selection.caller_managed:
        raise UsageError("QNN_SDK_ROOT is exported but empty: the caller manages the SDK, so there is none to lock",
                         hint="give the version: `qnnctl lock VERSION`")
    why = f"{selection.reason}: {selection.detail}"
    if selection.root is not None:
        sdk = sdk_from_root(selection.root, selection_origin(selection))
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
    manifest = read_manifest(sdk.root) if sdk is not None else None
    if sdk is None:
        from qnnctl.install import InstallRequest, install

        # The lock being written is not checked against the one it replaces.
        result = install(InstallRequest(spec=version, check_lock=False), cache, environ, cwd, terminal=terminal)
        sdk = result.sdk
        manifest = read_manifest(sdk.root) if sdk is not None else None
        fresh = True
    else:
        fresh = False
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if manifest is not None and is_sha256(manifest.get("sha256")) and isinstance(manifest.get("size"), int):
        lock = _from_manifest(manifest, version, sdk, stamp)
        source = lock.urls[0] if lock.urls else "an unrecorded source"
        trust = (f"These values were computed from the archive qnnctl downloaded now from {source}."
                 if fresh else
                 f"These values were recorded when SDK {version} was installed from {source} "
                 f"({manifest.get('installed_at', 'at an unrecorded time')}).")
    else:
        from qnnctl.mirror import fetch_archive

        where = f"{sdk.root} ({sdk.origin})" if sdk is not None else "the SDK in use"
        log.info("SDK %s at %s has no recorded checksum; fetching its archive once to compute it", version, where)
        fetched = fetch_archive(version, cache, environ, terminal=terminal, keep=False, check_lock=False)
        lock = LockedSdk(path=Path(), version=version, sha256=fetched.sha256, size=fetched.size,
                         build_id=fetched.build_id, urls=(fetched.url,), locked_at=stamp)
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
    lock = lock._replace(path=path)
    _write_atomic(path, render_lock(lock, trust))
    return Written(path, lock, trust, previous)


def _from_manifest(manifest: Mapping[str, Any], version: str, sdk: Sdk | None, stamp: str) -> LockedSdk:
    build = manifest.get("build_id")
    if not isinstance(build, str) and sdk is not None:
        build = read_build_id(sdk.root)
    source = manifest.get("source")
    components = manifest.get("components")
    cd = manifest.get("central_directory_sha256")
    from qnnctl.urls import redact

    return LockedSdk(
        path=Path(),
        version=version,
        sha256=str(manifest["sha256"]),
        size=int(manifest["size"]),
        build_id=build if isinstance(build, str) else None,
        # Recorded redacted; one written by an earlier qnnctl may not be.
        urls=(redact(source),) if isinstance(source, str) else (),
        central_directory_sha256=cd if is_sha256(cd) else None,
        components=tuple(str(c) for c in components) if isinstance(components, list) else None,
        locked_at=stamp,
    )


class Verdict(NamedTuple):
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
    return Verdict(lock, version, why, sdk, disagreements(lock, version, sdk))


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



def require_lock(cwd: Path) -> Path:
    """`install --locked`: the project's lock, or LockError (exit 1) when it has none."""
    path = find_lock(cwd)
    if path is None:
        raise LockError(f"--locked: there is no {LOCK_FILE} in {cwd} or any folder above it",
                        hint="write one with `qnnctl lock` (and commit it), or drop --locked")
    return path
