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
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qnnctl.errors import EXIT_FAILED, IntegrityError, QnnctlError
from qnnctl.records import Record
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.components import installed_components, parse_components
from qnnctl.sdk.evidence import hashed_digests, own_manifest
from qnnctl.sdk.gate import Expected, is_sha256
from qnnctl.sdk.layout import Sdk, read_build_id
from qnnctl.sdk.limits import nesting_depth
from qnnctl.sdk.select import LOCK_FILE, find_lock, find_pin
from qnnctl.sdk.versions import is_full_version
from qnnctl.version import __version__

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

log = logging.getLogger("qnnctl.sdk.lockfile")

LOCK_SCHEMA = 2  # 2: a digest per component; schema 1 (none) is still read
READ_SCHEMAS = (1, 2)


class LockError(QnnctlError):
    """A lock that is missing where one is required, cannot be read, or disagrees (exit 1)."""

    exit_code = EXIT_FAILED


class LockedSdk(Record):
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
    # component -> digest of its members (qnnctl.sdk.components): what checks an install by parts
    component_sha256: Mapping[str, str] | None = None
    # The host runtime staged beside the SDK (`install --runtime`): kind ("libcxx", "glibc") ->
    # {file under the staged runtime's root -> sha256}; the [runtime.<kind>] tables of the file.
    runtime_sha256: Mapping[str, Mapping[str, str]] | None = None

    def expected(self) -> Expected:
        """What the gate (qnnctl.sdk.gate) holds an archive of the locked version to."""
        return Expected(str(self.path), "the lock", "pins",
                        "the archive or the mirror serving it changed; if the new archive is the one to trust, "
                        f"write the lock again with `qnnctl lock {self.version}`",
                        sha256=self.sha256, size=self.size, components=self.component_sha256,
                        central_directory_sha256=self.central_directory_sha256)


def lock_destination(cwd: Path) -> Path:
    """Where `qnnctl lock` writes: beside the project's `.qnn-version`, else in `cwd`."""
    pin = find_pin(cwd)
    return (pin.parent if pin is not None else cwd) / LOCK_FILE


def _toml_loads(text: str) -> dict[str, Any]:
    loaded: dict[str, Any] = tomllib.loads(text)  # tomli (before 3.11) may have no stubs here
    return loaded


# What a lock may be: `qnnctl lock` writes a few hundred bytes, two levels deep. The TOML
# parser recurses once per "[" or "{", and a lock comes with a project that anyone may have
# written: a bigger or deeper one is refused before it is parsed.
_LOCK_MAX_BYTES = 1 << 20
_LOCK_MAX_DEPTH = 16


def read_lock(path: Path) -> LockedSdk:
    """The lock at `path`; LockError (exit 1) naming the file when it is not one."""
    hint = f"fix it, or write it again with `qnnctl lock` (in {path.parent})"
    try:
        with path.open("rb") as f:
            raw = f.read(_LOCK_MAX_BYTES + 1)
        if len(raw) > _LOCK_MAX_BYTES:
            raise LockError(f"{path} is larger than a lock can be ({_LOCK_MAX_BYTES} bytes)", hint=hint)
        text = raw.decode("utf-8")
        if nesting_depth(text) > _LOCK_MAX_DEPTH:
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
    if schema not in READ_SCHEMAS:
        raise LockError(f"{path} has schema {schema!r}; this qnnctl reads schemas "
                        f"{', '.join(map(str, READ_SCHEMAS))}", hint=hint)
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
    digests = sdk.get("component_sha256")
    if digests is not None and (not isinstance(digests, dict) or not all(map(is_sha256, digests.values()))):
        raise LockError(f"{path}: sdk.component_sha256 must map each component to a sha256 digest", hint=hint)
    runtime = data.get("runtime")
    if runtime is not None and not (isinstance(runtime, dict) and all(
            isinstance(files, dict) and all(map(is_sha256, files.values())) for files in runtime.values())):
        raise LockError(f"{path}: each [runtime.<kind>] table must map a file to a sha256 digest", hint=hint)
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
        component_sha256={str(k): str(v) for k, v in digests.items()} if digests else None,
        runtime_sha256={str(kind): {str(k): str(v) for k, v in files.items()} for kind, files in runtime.items()}
        if runtime else None,
    )


def _toml_string(value: str) -> str:
    # A JSON string is a TOML basic string: the same quotes and escapes (\uXXXX included).
    return json.dumps(value)


def render_lock(lock: LockedSdk, trust: str) -> str:
    """The file's text: a comment that says where the values came from, then the values."""
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
    if lock.component_sha256:
        # What an install of some components is checked against, component by component.
        lines += ["", "[sdk.component_sha256]"]
        lines += [f"{_toml_string(name)} = {_toml_string(digest)}"
                  for name, digest in sorted(lock.component_sha256.items())]
    for kind, files in sorted((lock.runtime_sha256 or {}).items()):
        # The host runtime staged here: `install --locked --runtime` refuses other libraries.
        lines += ["", f"[runtime.{_toml_string(kind)}]"]
        lines += [f"{_toml_string(name)} = {_toml_string(digest)}" for name, digest in sorted(files.items())]
    return "\n".join(lines) + "\n"


def _wrap(lines: list[str], width: int = 96) -> list[str]:
    out: list[str] = []
    for line in lines:
        out.extend(textwrap.wrap(line, width, break_on_hyphens=False, break_long_words=False) or [""])
    return out


def write_lock(path: Path, lock: LockedSdk, trust: str) -> None:
    """Write `lock` to `path` whole or not at all, with `trust` in its comment."""
    _write_atomic(path, render_lock(lock, trust))


def _write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


# -- comparing a lock with an SDK ------------------------------------------------------------


def disagreements(lock: LockedSdk, version: str, sdk: Sdk | None, cache: Cache) -> list[str]:
    """How the lock and an SDK of `version` (installed at `sdk`, if it is) disagree, or why the
    SDK cannot be checked against it; [] when it matches."""
    name = lock.path.name
    if version != lock.version:
        return [f"{name} pins SDK {lock.version}, not {version}"]
    if sdk is None:
        return []
    found, how = compare(lock, sdk, cache)
    if not found and how is None:
        found.append(unchecked(lock, sdk))
    return found


def unchecked(lock: LockedSdk, sdk: Sdk) -> str:
    return (f"SDK {sdk.version} at {sdk.root} ({sdk.origin}) cannot be checked against {lock.path}: qnnctl has no "
            "record of the archive it came from, and the lock pins no digest of its components "
            f"(a lock of schema 1, written before they existed)")


def compare(lock: LockedSdk, sdk: Sdk, cache: Cache) -> tuple[list[str], str | None]:
    """(how an SDK on disk and the lock disagree, what it was checked by: None when nothing
    could be). Nothing vouches for itself (qnnctl.sdk.evidence): the manifest counts only for an
    SDK qnnctl installed into this cache, by the sha256 of the archive it came from and each
    component's digest it records; any other folder (a link, a store, ExecuTorch's cache, another
    cache), whatever file it carries, is checked by hashing what it holds. A lock whose sha256
    matches while a component's digest or its central directory's does not contradicts itself, and is
    refused too."""
    name = lock.path.name
    manifest = own_manifest(sdk, cache) or {}
    found: list[str] = []
    how: str | None = None
    recorded = manifest.get("sha256")
    whole = is_sha256(recorded) and manifest.get("partial") is not True
    if whole:
        how = "the sha256 of the archive it was installed from"
        if recorded != lock.sha256:
            found.append(f"SDK {sdk.version} at {sdk.root} ({sdk.origin}) was installed from an archive whose sha256 "
                         f"is {recorded}; {name} pins {lock.sha256}")
    if lock.component_sha256:
        digests = manifest.get("component_sha256")
        if not isinstance(digests, dict):
            log.info("hashing the files of SDK %s at %s to check them against %s", sdk.version, sdk.root, lock.path)
            digests = hashed_digests(sdk.root, cache)
        held = installed_components(manifest)
        names = sorted(set(digests) | (set(lock.component_sha256) if whole else set())) if held == ("all",) \
            else list(held)
        how = how or f"the digests of its components ({', '.join(names)})"
        for component in names:
            pinned, got = lock.component_sha256.get(component), digests.get(component)
            if pinned != got:
                what = f"{name} contradicts itself: its sha256 is the archive's, but " if whole and not found else ""
                found.append(f"{what}the files of component {component} of SDK {sdk.version} at {sdk.root} "
                             f"({sdk.origin}) have digest {got or 'none'}; {name} pins {pinned or 'none'}")
    directory = manifest.get("central_directory_sha256")
    if whole and recorded == lock.sha256 and lock.central_directory_sha256 not in (None, directory) \
            and is_sha256(directory):
        found.append(f"{name} contradicts itself: its sha256 is the archive's, but the central directory of the "
                     f"archive SDK {sdk.version} at {sdk.root} ({sdk.origin}) was installed from has sha256 "
                     f"{directory}; {name} pins {lock.central_directory_sha256}")
    build = read_build_id(sdk.root)
    if build is not None and lock.build_id is not None and build != lock.build_id:
        found.append(f"the libraries of SDK {sdk.version} at {sdk.root} ({sdk.origin}) are build {build}; "
                     f"{name} pins build {lock.build_id}")
    return found, how


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


def check_reused(sdk: Sdk, cwd: Path, required: bool, cache: Cache) -> None:
    """An SDK `install` found on disk, checked against the project's lock (exit 4 on a mismatch,
    and under --locked when it cannot be checked)."""
    lock = _lock_for(sdk.version, cwd, required)
    if lock is None:
        return
    problems, how = compare(lock, sdk, cache)
    if problems:
        raise IntegrityError(
            "; ".join(problems),
            hint=f"reinstall the locked archive: `qnnctl install --force {sdk.version}`, or, if the SDK in use "
            f"is the one to trust, write the lock again: `qnnctl lock {sdk.version}`",
        )
    if how is None:
        if required:
            raise IntegrityError(
                f"--locked: {unchecked(lock, sdk)}",
                hint=f"write the lock again with `qnnctl lock {sdk.version}` (it then pins each component), or install "
                f"a checked copy: `qnnctl install --force {sdk.version}`",
            )
        log.warning("%s; used unchecked", unchecked(lock, sdk))
    else:
        log.debug("SDK %s at %s matches %s by %s", sdk.version, sdk.root, lock.path, how)


def locked_runtime(version: str, cwd: Path) -> tuple[Path, Mapping[str, Mapping[str, str]]] | None:
    """(the lock, what it pins of the host runtime) when the project's lock pins SDK `version`
    and a staged runtime with it; None otherwise."""
    lock = _lock_for(version, cwd, required=False)
    if lock is None or not lock.runtime_sha256:
        return None
    return lock.path, lock.runtime_sha256


def expected_for_download(version: str, cwd: Path, required: bool) -> LockedSdk | None:
    """The lock an archive of `version` about to be installed must match, if any."""
    return _lock_for(version, cwd, required)


class ProjectLock(Record):
    """The project's lock, as the install pipeline asks it (qnnctl.sdk.gate.Lock): the nearest
    qnnctl.lock at or above `cwd`, read when asked; `required` is --locked."""

    cwd: Path
    required: bool = False

    def expected(self, version: str) -> Expected | None:
        lock = expected_for_download(version, self.cwd, self.required)
        return lock.expected() if lock is not None else None

    def components(self, version: str) -> tuple[str, ...] | None:
        path = find_lock(self.cwd)
        lock = read_lock(path) if path is not None else None
        if lock is None or not lock.components or lock.version != version:
            return None
        return parse_components(lock.components, where=f"{path} (sdk.components)")

    def check_found(self, sdk: Sdk, cache: Cache) -> None:
        check_reused(sdk, self.cwd, self.required, cache)


def project_lock(cwd: Path, required: bool) -> ProjectLock:
    """The project's lock for an install; under --locked (`required`) it must be there and read,
    before anything is read or fetched (LockError otherwise)."""
    if required:
        read_lock(require_lock(cwd))
    return ProjectLock(cwd, required)


def require_lock(cwd: Path) -> Path:
    """`install --locked`: the project's lock, or LockError (exit 1) when it has none."""
    path = find_lock(cwd)
    if path is None:
        raise LockError(f"--locked: there is no {LOCK_FILE} in {cwd} or any folder above it",
                        hint="write one with `qnnctl lock` (and commit it), or drop --locked")
    return path
