"""Installing an SDK: check, lock, check again, build aside, rename into place."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import unquote, urlparse

from qnnctl.cache import MANIFEST_NAME, MANIFEST_SCHEMA, Cache, fsync_dir, remove_tree, write_json_atomic
from qnnctl.errors import IntegrityError, NotInstalledError, UsageError
from qnnctl.host import require_supported_host
from qnnctl.paths import user_path
from qnnctl.sdk import (
    BY_ARGUMENT,
    BY_CALLER,
    BY_ENV,
    BY_PIN,
    BY_SHELL,
    Sdk,
    Selection,
    find_installed,
    missing_layout,
    sdk_from_root,
    select_sdk,
)
from qnnctl.urls import redact
from qnnctl.versions import (
    archive_name,
    archive_urls,
    is_full_version,
    is_version_prefix,
    matches_prefix,
    resolve_version,
    version_in,
)

if TYPE_CHECKING:
    from qnnctl.archive import Streamed

log = logging.getLogger("qnnctl.install")

LOCK_WAIT_NOTICE = 2.0  # seconds before saying that another install holds the lock


# NamedTuples rather than frozen dataclasses: a cache hit imports this module, and each
# frozen dataclass costs about a millisecond to build.
class InstallRequest(NamedTuple):
    spec: str | None = None  # VERSION (or prefix) as given
    url: str | None = None
    file: Path | None = None
    sha256: str | None = None
    force: bool = False
    locked: bool = False  # --locked: the project's qnnctl.lock must exist and pin this version
    check_lock: bool = True  # off only for `qnnctl lock`, which writes the lock anew
    # --components (qnnctl.components.parse_components): None when not asked, which reuses any
    # install of the version and installs the whole archive (or what the pin names) otherwise.
    components: tuple[str, ...] | None = None


class InstallResult(NamedTuple):
    """The SDK in use, or None when the caller manages it (empty QNN_SDK_ROOT)."""

    sdk: Sdk | None
    action: str  # "installed", "reused" or "caller"
    selection: Selection | None = None


# Installs from files share one lock: an archive's version is known only once it is extracted.
FILE_LOCK = "file"


@contextmanager
def version_lock(cache: Cache, key: str, doing: str | None = None) -> Iterator[None]:
    """One installer per version (or key) at a time, across processes; `doing` is what the
    holder does, in the notice of a wait (installing KEY unless said)."""
    from filelock import FileLock, Timeout

    cache.locks.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(cache.lock_path(key)))
    try:
        lock.acquire(timeout=LOCK_WAIT_NOTICE)
    except Timeout:
        log.info("waiting for another qnnctl to finish %s", doing or f"installing {key}")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _validate_sha256(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise UsageError(f"--sha256 {value!r} is not a sha256 digest (64 hex digits)")
    return value


def install(
    request: InstallRequest,
    cache: Cache,
    environ: Mapping[str, str],
    cwd: Path,
    terminal: bool = False,
) -> InstallResult:
    """Resolve the SDK `request` names, installing it into the cache when it is missing."""
    sha256 = _validate_sha256(request.sha256)
    if request.locked and request.check_lock:
        from qnnctl.lockfile import require_lock

        require_lock(cwd)  # before anything is read or fetched
    if request.url is not None and request.file is not None:
        raise UsageError("--url and --file cannot be used together")
    if request.url is not None:
        local = check_url(request.url, "--url")
        if local is not None:
            request = request._replace(url=None, file=local)
    if request.file is not None:
        require_supported_host()
        return _install_file(request.file, request.spec, sha256, request.force, cache,
                             (cwd, request.locked) if request.check_lock else None, request.components)

    if request.spec is None and request.url is None:
        selection = select_sdk(None, environ, cwd, cache)
        log.debug("chose %s", selection.describe())
        if selection.reason == BY_CALLER:
            return InstallResult(None, "caller", selection)
        if selection.reason == BY_SHELL and selection.root is not None:
            # The SDK this shell was set up for: the one to reuse, or to (re)install by its version
            # when it is one of qnnctl's cache; one elsewhere is never reinstalled unasked.
            selection = _shell_selection(selection, selection.root, cache, request.force)
            if selection.root is not None:
                sdk = sdk_from_root(selection.root, "qnnctl env")
                return _reused(InstallResult(sdk, "reused", selection), request, cwd)
        elif selection.reason == BY_ENV and selection.root is not None:
            if request.force:
                raise _force_with_sdk_root(selection.root, cache)
            return _reused(InstallResult(sdk_from_root(selection.root, "QNN_SDK_ROOT"), "reused", selection),
                           request, cwd)
    elif request.spec is not None:
        selection = select_sdk(request.spec, environ, cwd)
        if selection.root is not None:
            raise UsageError(
                f"{request.spec!r} is a path; install takes a VERSION",
                hint="use `qnnctl install --file ARCHIVE` for an archive on disk",
            )
    else:
        url = request.url or ""
        found = version_in(unquote(urlparse(url).path.rsplit("/", 1)[-1]))
        if found is None:
            raise UsageError(
                f"cannot tell the SDK version from {redact(url)}",
                hint="give it too: `qnnctl install VERSION --url URL`",
            )
        selection = Selection("argument", f"named by {redact(url)}", version=found)
    version = selection.version
    log.debug("chose %s", selection.describe())
    if version is None:  # pragma: no cover - every branch above that gets here sets it
        raise UsageError("no SDK version was selected")

    require_supported_host()
    components = _components_for(request, selection, cwd)
    if not request.force:
        found_sdk = find_installed(version, cache, environ)
        if found_sdk is not None and _has_components(found_sdk, components):
            if sha256 is not None:
                check_installed_sha256(found_sdk, sha256)
            return _reused(InstallResult(found_sdk, "reused", selection), request, cwd)

    mirror = environ.get("QNNCTL_MIRROR") or None
    if mirror is not None and not request.url:
        check_url(mirror, "QNNCTL_MIRROR", allow_file=False)
    urls = [request.url] if request.url else archive_urls(version, mirror)
    name = _download_name(urls[0], version)
    from qnnctl.lockfile import check_archive, expected_for_download
    from qnnctl.stores import dangling_link_error

    locked = expected_for_download(version, cwd, request.locked) if request.check_lock else None
    dangling = dangling_link_error(version, cache)
    if dangling is not None:
        log.warning("%s; installing a copy into qnnctl's cache", dangling.message)
    cache.ensure()
    with version_lock(cache, version):
        found_sdk = None if request.force else find_installed(version, cache, environ)
        if found_sdk is not None and _has_components(found_sdk, components):
            log.info("another qnnctl installed %s meanwhile", version)
            if sha256 is not None:
                check_installed_sha256(found_sdk, sha256)
            return _reused(InstallResult(found_sdk, "reused", selection), request, cwd)
        remove_stale_work(cache, version)
        from qnnctl.archive import ZipStream, work_folder
        from qnnctl.download import Downloader, PlainProgress, make_session, terminal_progress
        from qnnctl.mirror import agree, check_against_index, mirror_entry

        # A mirror's index.json, the lock and --sha256 must all agree before anything is fetched.
        indexed = mirror_entry(mirror, version) if mirror is not None and not request.url else None
        agree([("--sha256", sha256), (str(locked.path) if locked else "", locked.sha256 if locked else None),
               (f"the mirror's {indexed.url}" if indexed else "", indexed.sha256 if indexed else None)])
        # Some components: fetched by parts, or added to those of an SDK installed with fewer.
        extend = found_sdk if found_sdk is not None and found_sdk.origin == "qnnctl cache" else None
        if components is not None and (extend is not None or components != ("all",)):
            from qnnctl.partial import install_components

            sdk = install_components(version, urls, name, components, sha256, cache, request.force, terminal,
                                     extend, locked.central_directory_sha256 if locked else None)
            return InstallResult(sdk, "installed", selection)

        downloader = Downloader(
            make_session(), cache.downloads, terminal_progress if terminal else PlainProgress
        )
        log.info("downloading SDK %s from %s", version, redact(urls[0]))
        with work_folder(cache.tmp / f"{version}.{_work_id()}") as work:
            # A zip's members are extracted from the partial file while the rest arrives;
            # the archive's digest and its central directory are still checked before use.
            stream = ZipStream(work / "x")
            try:
                fetched = downloader.fetch(urls, name, sha256, sink=stream)
            except BaseException:
                stream.close(abandon=True)
                raise
            streamed = stream.close()
            with used_up(fetched.path, cache.downloads / f"{name}.json"):
                check_against_index(indexed, fetched.sha256, fetched.url)
                check_archive(locked, fetched.sha256, fetched.size, fetched.url)
                # fetched.url is redacted: the manifest keeps no password or token.
                sdk = _build(fetched.path, version, fetched.url, fetched.sha256, fetched.size, cache,
                             request.force, work, streamed)
    return InstallResult(sdk, "installed", selection)


@contextmanager
def used_up(*leftovers: Path) -> Iterator[None]:
    """A finished download and its record: removed once what they hold is installed, and when
    they prove to be no good SDK archive (never to be reused as a finished download); kept on
    any other failure, for the next run to resume from."""
    try:
        yield
    except IntegrityError:
        for leftover in leftovers:
            leftover.unlink(missing_ok=True)
        raise
    for leftover in leftovers:
        leftover.unlink(missing_ok=True)


def require_version(found: str | None, version: str, source: str) -> None:
    """The SDK a download holds must be the one asked for."""
    if found is not None and found != version:
        raise IntegrityError(
            f"{source} holds SDK {found}, not {version}",
            hint=f"check the URL or QNNCTL_MIRROR; to install {found}, run "
            f"`qnnctl install {found}` with a source that serves it",
        )


def _components_for(request: InstallRequest, selection: Selection, cwd: Path) -> tuple[str, ...] | None:
    """The components asked for: --components, else the pin's second line (for the pinned
    version), else the project's qnnctl.lock (for the version it locks); None when nobody asked."""
    if request.components is not None:
        return request.components
    if selection.reason == BY_PIN:
        from qnnctl.pin import read_pin_components
        from qnnctl.sdk import find_pin

        pin = find_pin(cwd)
        pinned = read_pin_components(pin) if pin is not None else None
        if pinned is not None:
            return pinned
    if request.check_lock:
        from qnnctl.lockfile import find_lock, read_lock

        path = find_lock(cwd)
        lock = read_lock(path) if path is not None else None
        if lock is not None and lock.components and lock.version == selection.version:
            from qnnctl.components import parse_components

            return parse_components(lock.components, where=f"{path} (sdk.components)")
    return None


def _has_components(sdk: Sdk, components: tuple[str, ...] | None) -> bool:
    """Whether an installed SDK holds the components asked for (any SDK, when none were)."""
    if components is None:
        return True
    from qnnctl.cache import read_manifest
    from qnnctl.components import covers, installed_components

    return covers(installed_components(read_manifest(sdk.root)), components)


def _shell_selection(selection: Selection, root: Path, cache: Cache, force: bool) -> Selection:
    """What `install` does for the SDK the shell was set up for: reuse it (a root), or (a version)
    reinstall it, or install it again once it is gone, when it is one of qnnctl's cache."""
    from qnnctl.sdk import shell_sdk_gone

    version = cache.version_at(root)
    if version is not None and (force or missing_layout(root)):
        return Selection(BY_SHELL, selection.detail, version=version)
    if missing_layout(root):
        raise shell_sdk_gone(root, cache)
    if force:
        raise UsageError(
            f"this shell was set up by `qnnctl env` for {root}, {_place(root, cache)}; --force "
            "reinstalls an SDK of qnnctl's cache by VERSION",
            hint="give the VERSION to reinstall (`qnnctl install --force VERSION`)",
        )
    return selection


def _reused(result: InstallResult, request: InstallRequest, cwd: Path) -> InstallResult:
    """An SDK found on disk, checked against --sha256 and the project's qnnctl.lock first
    (exit 4 on a mismatch)."""
    sha256 = _validate_sha256(request.sha256)
    if sha256 is not None and result.sdk is not None:
        check_installed_sha256(result.sdk, sha256)
    if request.check_lock and result.sdk is not None:
        from qnnctl.lockfile import check_reused

        check_reused(result.sdk, cwd, request.locked)
    return result


def check_url(url: str, what: str, allow_file: bool = True) -> Path | None:
    """Refuse (exit 2) a URL that no download can start from; for a file: URL, its path.

    urllib parses `http://[::1/x` only to raise ValueError, and requests turns a missing host
    or an unknown scheme into a failed download (exit 3) after the lock and the cache: both
    are mistakes in what was typed, told before anything starts.
    """
    from qnnctl.urls import at_in_path, redact

    shown = redact(url)
    schemes = "https or http" + (" (or a file: URL)" if allow_file else "")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        # urlparse drops a newline or tab silently; the URL shown or logged would then break lines.
        raise UsageError(f"{what} {shown!r} holds a control character (a newline or tab)",
                         hint="remove it: a URL is one line of printable text")
    if at_in_path(url):
        raise UsageError(f"{what} {shown} holds an \"@\" after a \"/\" or \"\\\": a password with either in it is read "
                         "as a host and a path, and would be sent to that host",
                         hint="write a \"/\" in a password as %2F, a \"\\\" as %5C, and an \"@\" in a path as %40")
    try:
        parts = urlparse(url)
        parts.port  # noqa: B018 - a port that is no number raises here, not in the download
    except ValueError:
        # The parser's words would quote the bad part, which may be a misplaced password.
        raise UsageError(f"{what} {shown} is not a valid URL: its host or port cannot be read",
                         hint="check the brackets around an IPv6 address and the port number") from None
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http", *(("file",) if allow_file else ())):
        named = f"{scheme}:" if scheme else "a URL without a scheme"
        raise UsageError(f"{what} {shown}: qnnctl downloads over {schemes}, not {named}",
                         hint="an archive on disk is installed with `qnnctl install --file ARCHIVE`")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise UsageError(f"{what} {shown} names a file on another host ({parts.netloc})",
                             hint="a file: URL names a file on this machine: file:///path/to/v2.37.0.250724.zip")
        return Path(unquote(parts.path))
    if not parts.hostname:
        raise UsageError(f"{what} {shown} names no host", hint="URLs look like https://host/path/v2.37.0.250724.zip")
    return None


def _force_with_sdk_root(root: Path, cache: Cache) -> UsageError:
    """`install --force` without a VERSION while the user's QNN_SDK_ROOT chooses the SDK."""
    version = cache.version_at(root)
    if version is not None:
        # Often `export QNN_SDK_ROOT=$(qnnctl install)`: an SDK of qnnctl's own, but one that the
        # user exported, and a user's QNN_SDK_ROOT is never reinstalled unasked.
        return UsageError(
            f"QNN_SDK_ROOT names SDK {version} in qnnctl's cache ({root}); --force without a VERSION "
            "does not reinstall the SDK that QNN_SDK_ROOT names",
            hint=f"run `qnnctl install --force {version}` to reinstall it",
        )
    return UsageError(
        f"QNN_SDK_ROOT names {root}, {_place(root, cache)}; --force reinstalls an SDK of qnnctl's cache by VERSION",
        hint="give the VERSION to reinstall (`qnnctl install --force VERSION`), or unset QNN_SDK_ROOT",
    )


def _place(root: Path, cache: Cache) -> str:
    """Where a folder that is not one of the cache's SDKs is (links resolved), for a message."""
    return "inside qnnctl's cache, not one of its SDKs" if root.resolve().is_relative_to(cache.root.resolve()) \
        else "outside qnnctl's cache"


def check_installed_sha256(sdk: Sdk, sha256: str, archive: Path | None = None) -> None:
    """An installed SDK asked for with --sha256: the archive it came from must have had it.
    `archive`: the one given with --file, which the command in the hint installs."""
    from qnnctl.cache import read_manifest

    recorded = (read_manifest(sdk.root) or {}).get("sha256")
    source = f" --file {archive}" if archive is not None else ""
    if not isinstance(recorded, str):
        raise IntegrityError(
            f"SDK {sdk.version} at {sdk.root} ({sdk.origin}) has no recorded sha256, so it cannot be "
            f"checked against {sha256}",
            hint=f"install a checked copy into qnnctl's cache: `qnnctl install {sdk.version} --force{source} "
            f"--sha256 {sha256}`",
        )
    if recorded != sha256:
        raise IntegrityError(
            f"SDK {sdk.version} is installed from an archive whose sha256 is {recorded}, not {sha256}",
            hint=f"check the --sha256 value; to replace the SDK with the archive that has it: "
            f"`qnnctl install {sdk.version} --force{source} --sha256 {sha256}`",
        )


def _download_name(url: str, version: str) -> str:
    base = unquote(urlparse(url).path.rsplit("/", 1)[-1])
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in base)
    if not safe or safe.startswith("."):
        safe = archive_name(version)
    return safe if version in safe else f"{version}-{safe}"


def _work_id() -> str:
    return os.urandom(6).hex()


def remove_stale_work(cache: Cache, key: str) -> None:
    """Folders left in tmp/ by an install of `key` that was killed; we hold its lock."""
    if not cache.tmp.is_dir():
        return
    for entry in cache.tmp.iterdir():
        if entry.name.startswith(f"{key}."):
            log.info("removing %s, left by an interrupted install", entry)
            remove_tree(entry)


def _build(
    archive: Path,
    version: str,
    source: str,
    sha256: str,
    size: int,
    cache: Cache,
    force: bool,
    work: Path,
    streamed: Streamed | None,
) -> Sdk:
    """Extract, validate, write the manifest, rename into sdks/. Caller holds the lock."""
    from qnnctl.archive import extract

    extracted = extract(archive, work / "x", streamed)
    found, build = identify(extracted.root, extracted.version, version, source)
    require_version(found, version, source)
    return _commit(extracted.root, version, source, sha256, size, extracted.files,
                   extracted.size, cache, force, work, build, _directory_digest(archive))


def _directory_digest(archive: Path) -> dict[str, object] | None:
    """The sha256 of a zip's central directory, for the manifest: what a lock made from this
    SDK pins for installs of some of its components, which cannot take the archive's."""
    from qnnctl.archive import archive_kind

    if archive_kind(archive) != "zip":
        return None
    from qnnctl.zipindex import central_directory_sha256, file_end_records, read_file_at

    return {"central_directory_sha256": central_directory_sha256(read_file_at(archive), file_end_records(archive))}


def identify(root: Path, top: str | None, wanted: str | None, source: str) -> tuple[str | None, str | None]:
    """(version, build id) of an extracted SDK, as its libraries say (see qnnctl.identity).

    The libraries' build is the SDK's identity. What the archive's top folder or `sdk.yaml`
    claims must agree with it, unless the user named the libraries' version themselves; an
    SDK whose libraries carry no build id is taken at its word, as before.
    """
    from qnnctl.identity import version_of_build
    from qnnctl.sdk import read_build_id, version_claims

    claims = {"its top folder": top} if top else {}
    yaml_version = version_claims(root, manifest={}).get("sdk.yaml")
    if yaml_version:
        claims["its sdk.yaml"] = yaml_version
    build = read_build_id(root)
    if build is None:
        return next(iter(claims.values()), None), None
    true = version_of_build(build)
    wrong = sorted({version for version in claims.values() if version != true})
    if wrong and wanted != true:
        where = " and ".join(name for name, version in claims.items() if version != true)
        raise IntegrityError(
            f"{source} says it is SDK {', '.join(wrong)} ({where}), but its libraries are build "
            f"{build}: SDK {true}",
            hint=f"check where the archive came from; to install it as what its libraries are, "
            f"name that version: `qnnctl install {true} ...`; nothing was installed",
        )
    return true, build


def _commit(
    root: Path,
    version: str,
    source: str,
    sha256: str | None,
    size: int,
    files: dict[str, str],
    unpacked: int,
    cache: Cache,
    force: bool,
    work: Path,
    build: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> Sdk:
    """`extra`: more for the manifest (what an install of some components records)."""
    missing = missing_layout(root)
    if missing:
        raise IntegrityError(
            f"the archive's SDK is incomplete: missing {', '.join(missing)}",
            hint="the archive may be truncated or not a QAIRT SDK for Linux; nothing was installed",
        )
    from qnnctl import __version__

    # The manifest is qnnctl's own record: a file of that name in the archive is not it.
    stray = root / MANIFEST_NAME
    if stray.is_file() and not stray.is_symlink():  # counted in what was unpacked
        unpacked -= stray.stat().st_size
    remove_tree(stray)
    files = {name: digest for name, digest in files.items() if name != MANIFEST_NAME}
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "version": version,
        "build_id": build,
        "source": source,
        "sha256": sha256,
        "size": size,
        "unpacked_size": unpacked,
        "file_count": len(files),
        "files": files,
        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "qnnctl_version": __version__,
        **(extra or {}),
    }
    # The manifest goes in last: a folder without one is never taken for an SDK.
    write_json_atomic(root / MANIFEST_NAME, manifest)
    destination = cache.sdk_dir(version)
    cache.sdks.mkdir(parents=True, exist_ok=True)
    if destination.exists() or destination.is_symlink():
        if not force and (destination / MANIFEST_NAME).is_file() and not missing_layout(destination):
            return Sdk(destination, version, "qnnctl cache")
        # A folder without a manifest, or --force: move it aside, then replace it.
        os.replace(destination, work / "old")
    os.replace(root, destination)
    fsync_dir(cache.sdks)
    log.info("installed SDK %s into %s", version, destination)
    return Sdk(destination, version, "qnnctl cache")


def _install_file(
    archive: Path, spec: str | None, sha256: str | None, force: bool, cache: Cache,
    lock_check: tuple[Path, bool] | None = None, components: tuple[str, ...] | None = None,
) -> InstallResult:
    """`lock_check` is (the working folder, --locked) when the project's lock applies;
    `components` (all when None) are the only ones extracted, beside those installed already."""
    from qnnctl.archive import extract, work_folder
    from qnnctl.download import file_sha256

    archive = user_path(archive).resolve()
    if not archive.is_file():
        raise UsageError(f"{archive} is not a file", hint="give the path of a downloaded SDK archive")
    digest = file_sha256(archive)
    if sha256 is not None and digest != sha256:
        raise IntegrityError(
            f"sha256 mismatch for {archive}: expected {sha256}, got {digest}",
            hint="check the --sha256 value, or download the archive again",
        )
    wanted = resolve_version(spec) if spec else None
    if wanted is not None and not force:
        # Named and already installed: no need to read a 1-2 GB archive to find that out.
        existing = cache.sdk_dir(wanted)
        if (existing / MANIFEST_NAME).is_file() and not missing_layout(existing) and \
                _has_components(Sdk(existing, wanted, "qnnctl cache"), components):
            return _file_locked(_same_archive(InstallResult(Sdk(existing, wanted, "qnnctl cache"), "reused",
                                              Selection(BY_ARGUMENT, f"from {archive}", version=wanted)),
                                              archive, digest, sha256), lock_check)
    cache.ensure()
    with version_lock(cache, FILE_LOCK, "installing from a file"):
        remove_stale_work(cache, FILE_LOCK)
        with work_folder(cache.tmp / f"{FILE_LOCK}.{_work_id()}") as work:
            parts = None
            if components is not None and components != ("all",):
                from qnnctl.partial import extract_components

                extracted, parts = extract_components(archive, components, work / "x")
            else:
                extracted = extract(archive, work / "x")
            found, build = identify(extracted.root, extracted.version, wanted, str(archive))
            if wanted is not None and found is not None and found != wanted:
                raise IntegrityError(
                    f"{archive} holds SDK {found}, not {wanted}",
                    hint=f"run `qnnctl install --file {archive}` to install it as {found}",
                )
            version = wanted or found
            if version is None or not is_full_version(version):
                raise UsageError(
                    f"cannot tell the SDK version of {archive}",
                    hint=f"give it: `qnnctl install VERSION --file {archive}`",
                )
            selection = Selection(BY_ARGUMENT, f"from {archive}", version=version)
            if lock_check is not None:
                from qnnctl.lockfile import check_archive, expected_for_download

                check_archive(expected_for_download(version, *lock_check), digest, archive.stat().st_size,
                              str(archive))
            with version_lock(cache, version):
                existing = cache.sdk_dir(version)
                installed = (existing / MANIFEST_NAME).is_file() and not missing_layout(existing)
                old = Sdk(existing, version, "qnnctl cache") if installed else None
                if not force and old is not None and _has_components(old, components):
                    return _file_locked(_same_archive(InstallResult(old, "reused", selection), archive, digest,
                                                      sha256), lock_check)
                files, unpacked, extra = extracted.files, extracted.size, _directory_digest(archive)
                if parts is not None:
                    if not force and old is not None:
                        from qnnctl.partial import with_installed

                        parts, files, unpacked = with_installed(old, extracted, parts, str(archive))
                    extra = parts.manifest_fields()
                sdk = _commit(extracted.root, version, archive.as_uri(), digest,
                              archive.stat().st_size, files, unpacked, cache,
                              force or old is not None, work, build, extra)
    return InstallResult(sdk, "installed", selection)


def _same_archive(result: InstallResult, archive: Path, digest: str, sha256: str | None) -> InstallResult:
    """`install --file` of a version installed already: from this archive, or say so.

    With --sha256 (the file's digest, checked already) the installed SDK must come from an
    archive with that digest too (exit 4); without it, a warning says how to replace it.
    """
    from qnnctl.cache import read_manifest

    sdk = result.sdk
    recorded = (read_manifest(sdk.root) or {}).get("sha256") if sdk is not None else None
    if sdk is None or recorded == digest:
        return result
    if not isinstance(recorded, str):
        # Nothing to compare (an SDK fetched in parts, or found elsewhere): only --sha256 can ask.
        if sha256 is not None:
            check_installed_sha256(sdk, sha256, archive)
        return result
    if sha256 is not None:
        check_installed_sha256(sdk, sha256, archive)
    log.warning("SDK %s is installed already, from another archive than %s (sha256 %s, not %s); it is "
                "left as it is: `qnnctl install %s --force --file %s` replaces it", sdk.version, archive,
                recorded, digest, sdk.version, archive)
    return result


def _file_locked(result: InstallResult, lock_check: tuple[Path, bool] | None) -> InstallResult:
    """An SDK that `install --file` found installed already, checked against the project's lock."""
    if lock_check is None:
        return result
    return _reused(result, InstallRequest(locked=lock_check[1]), lock_check[0])


def uninstall(spec: str, cache: Cache, environ: Mapping[str, str] | None = None) -> Path:
    """Remove an SDK from qnnctl's cache (never from anywhere else); for a linked SDK, the link
    only (`qnnctl link`: the folder is left as it is). A version both in the cache and linked
    loses its cache copy, the one in use, and the link stays and is used from then on (as
    `qnnctl link` said it would be); a second uninstall drops the link. What was removed: the
    SDK's folder, else the link's record."""
    from qnnctl.stores import all_links, find_in_stores, read_link, remove_link

    spec = spec.strip()
    if not is_version_prefix(spec):
        resolve_version(spec)  # raises the standard "not an SDK version" error
    ours = cache.installed_versions()
    linked = [link.version for link in all_links(cache)]
    try:
        version = _installed_version(spec, sorted(set(ours) | set(linked), key=lambda v: tuple(map(int, v.split(".")))))
    except NotInstalledError as exc:
        stored = find_in_stores(exc.version, environ) if environ is not None and is_full_version(exc.version) else None
        if stored is not None:
            exc.message = (f"SDK {exc.version} is in the store {stored.store} ({stored.root}), which qnnctl never "
                           "changes; it is not installed in qnnctl's cache")
            exc.args = (exc.message,)
            exc.hint = "remove it from the store itself, or take the store out of QNNCTL_STORES"
        raise
    if version not in ours:
        link = remove_link(cache, version)
        if link is not None:
            log.info("removed the link of SDK %s to %s; the folder is left as it is", version, link.root)
            return link.record
    link = read_link(cache, version)
    if link is None:
        remove_link(cache, version)  # a record that cannot be read goes with the SDK: it links nothing
    with version_lock(cache, version):
        target = cache.sdk_dir(version)
        if not (target / MANIFEST_NAME).is_file():
            raise _not_installed(version)  # another qnnctl removed it meanwhile
        trash = cache.tmp / f"{version}.uninstall.{_work_id()[:8]}"
        cache.tmp.mkdir(parents=True, exist_ok=True)
        # Out of sdks/ first, so no reader ever sees a half-deleted SDK.
        os.replace(target, trash)
        remove_tree(trash)
    if link is not None:
        used = "which is gone" if link.dangling else "which is used from now on"
        log.info("SDK %s stays linked to %s, %s; `qnnctl uninstall %s` again drops the link",
                 version, link.root, used, version)
    return target


def _installed_version(spec: str, installed: list[str]) -> str:
    """The one installed version that `spec` (a version or a prefix such as 2.37) names."""
    if spec in installed:
        return spec
    matches = [v for v in installed if matches_prefix(v, spec)]
    if len(matches) > 1:
        raise UsageError(
            f"{spec} matches more than one installed SDK: {', '.join(matches)}",
            hint="give the full version",
        )
    if matches:
        return matches[0]
    try:
        wanted = resolve_version(spec)
    except UsageError:
        wanted = spec
    raise _not_installed(wanted)


def _not_installed(version: str) -> NotInstalledError:
    error = NotInstalledError(version)
    error.message = f"SDK {version} is not installed in qnnctl's cache"
    error.args = (error.message,)
    error.hint = "`qnnctl list` shows what is installed"
    return error


class Cleaned(NamedTuple):
    removed: list[Path]
    busy: list[Path]


def clean_cache(cache: Cache) -> Cleaned:
    """Remove partial downloads and interrupted work folders that nobody is using."""
    from filelock import FileLock, Timeout

    removed: list[Path] = []
    busy: list[Path] = []
    cache.locks.mkdir(parents=True, exist_ok=True)
    candidates: list[tuple[str, Path]] = []
    for entry in cache.stale_tmp():
        # Work folders are named <version>.<id> (or file.<id>): the lock is the version's.
        candidates.append((version_in(entry.name) or entry.name.split(".", 1)[0], entry))
    if cache.downloads.is_dir():
        for entry in sorted(cache.downloads.iterdir()):
            key = version_in(entry.name) or FILE_LOCK
            candidates.append((key, entry))
    for key, entry in candidates:
        lock = FileLock(str(cache.lock_path(key)))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            busy.append(entry)
            continue
        try:
            remove_tree(entry)
            removed.append(entry)
        finally:
            lock.release()
    return Cleaned(removed, busy)
