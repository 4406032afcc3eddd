"""Installing an SDK: check, lock, check again, build aside, rename into place.

What the SDK must match is handed down by the caller (qnnctl.sdk.gate.Vouchers, built by
qnnctl.sdk.vouchers from the project's lock and the mirror's index) with --sha256 beside it;
this module reads neither a lock nor an index itself."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from qnnctl.errors import DownloadError, IntegrityError, UsageError
from qnnctl.install.archive import extract
from qnnctl.install.commit import commit, directory_digest, download_name, identify, require_version, used_up
from qnnctl.install.door import admit_archive, admit_tree
from qnnctl.install.partial import extract_components, install_components, merged_digests, with_installed
from qnnctl.install.sources import LocalArchive, pinned_file
from qnnctl.install.stream import ZipStream
from qnnctl.net.download import Downloader, PlainProgress, make_session, terminal_progress
from qnnctl.net.urls import check_url, redact
from qnnctl.paths import user_path
from qnnctl.records import Record
from qnnctl.sdk.cache import MANIFEST_NAME, Cache, read_manifest
from qnnctl.sdk.components import covers, installed_components
from qnnctl.sdk.evidence import own_manifest
from qnnctl.sdk.gate import Expected, Index, Lock, Vouchers, agree, given_sha256, size_limit
from qnnctl.sdk.holds import exclusive, wait_for_holders
from qnnctl.sdk.hosts import require_supported_host
from qnnctl.sdk.layout import Sdk, missing_layout
from qnnctl.sdk.pin import read_pin_components
from qnnctl.sdk.select import (
    BY_ARGUMENT,
    BY_CALLER,
    BY_DEFAULT,
    BY_ENV,
    BY_PIN,
    BY_SHELL,
    Selection,
    find_installed,
    find_pin,
    named_sdk,
    select_sdk,
    shell_sdk_gone,
)
from qnnctl.sdk.stores import dangling_link_error, refuse_unsafe_cache
from qnnctl.sdk.versions import (
    archive_urls,
    is_full_version,
    parse_version,
    resolve_version,
    version_in,
)
from qnnctl.sdk.work import FILE_LOCK, remove_stale_work, version_lock, work_folder, work_id

if TYPE_CHECKING:
    from qnnctl.install.archive import Extracted, Streamed

log = logging.getLogger("qnnctl.install.pipeline")

# Records (named tuples) rather than frozen dataclasses: a cache hit imports this module, and each
# frozen dataclass costs about a millisecond to build.
class InstallRequest(Record):
    spec: str | None = None  # VERSION (or prefix) as given
    url: str | None = None
    file: Path | None = None
    sha256: str | None = None
    force: bool = False
    # --components (qnnctl.sdk.components.parse_components): None when not asked, which reuses any
    # install of the version and installs the whole archive (or what the pin names) otherwise.
    components: tuple[str, ...] | None = None


class InstallResult(Record):
    """The SDK in use, or None when the caller manages it (empty QNN_SDK_ROOT)."""

    sdk: Sdk | None
    action: str  # "installed", "reused" or "caller"
    selection: Selection | None = None


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
    vouchers: Vouchers,
    terminal: bool = False,
) -> InstallResult:
    """Resolve the SDK `request` names, installing it into the cache when it is missing; whatever
    arrives, or is found on disk, must match what `vouchers` and --sha256 expect of it."""
    sha256 = _validate_sha256(request.sha256)
    lock = vouchers.lock
    if request.url is not None and request.file is not None:
        raise UsageError("--url and --file cannot be used together")
    if request.url is not None:
        local = check_url(request.url, "--url")
        if local is not None:
            request = request._replace(url=None, file=local)
    if request.file is not None:
        require_supported_host()
        return _install_file(request.file, request.spec, sha256, request.force, cache, lock, request.components)

    if request.spec is None and request.url is None:
        selection = select_sdk(None, environ, cwd, cache, mirror=True)
        if selection.reason == BY_CALLER:
            log.debug("chose %s", selection.describe())
            return InstallResult(None, "caller", selection)
        if selection.reason == BY_SHELL and selection.root is not None:
            # The SDK this shell was set up for: the one to reuse, or to (re)install by its version
            # when it is one of qnnctl's cache (said again below, as that version); one elsewhere
            # is never reinstalled unasked.
            log.debug("chose %s", selection.describe())
            selection = _shell_selection(selection, selection.root, cache, request.force)
            if selection.root is not None:
                sdk = named_sdk(selection.root, "qnnctl env")
                return _reused(InstallResult(sdk, "reused", selection), sha256, lock, cache)
        elif selection.reason == BY_ENV and selection.root is not None:
            if request.force:
                raise _force_with_sdk_root(selection.root, cache)
            log.debug("chose %s", selection.describe())
            return _reused(InstallResult(named_sdk(selection.root, "QNN_SDK_ROOT"), "reused", selection),
                           sha256, lock, cache)
    elif request.spec is not None:
        selection = select_sdk(request.spec, environ, cwd, cache, mirror=True)
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
    require_supported_host()
    if request.spec is None and request.url is None and vouchers.mirror is not None:
        selection = as_the_mirror_holds(selection, vouchers.mirror, cache, environ)
    version = selection.version
    log.debug("chose %s", selection.describe())
    if version is None:  # pragma: no cover - every branch above that gets here sets it
        raise UsageError("no SDK version was selected")

    components = _components_for(request, selection, cwd, lock)
    if not request.force:
        found_sdk = find_installed(version, cache, environ)
        if found_sdk is not None and _has_components(found_sdk, components):
            return _reused(InstallResult(found_sdk, "reused", selection), sha256, lock, cache)
    # A version asked for that the mirror lacks is refused here, after the project's lock has been
    # read (a lock that cannot be read is refused before any request) and before anything is fetched.
    if request.spec is not None and request.url is None and vouchers.mirror is not None:
        as_the_mirror_holds(selection, vouchers.mirror, cache, environ)

    # The mirror the archive comes from is the one whose index vouches for it: one object, so the
    # two can never be different mirrors.
    mirror = vouchers.mirror.base if vouchers.mirror is not None else None
    if mirror is not None and not request.url:
        check_url(mirror, "QNNCTL_MIRROR", allow_file=False)
    urls = [request.url] if request.url else archive_urls(version, mirror)
    name = download_name(urls[0], version)
    locked = lock.expected(version) if lock is not None else None
    dangling = dangling_link_error(version, cache)
    if dangling is not None:
        log.warning("%s; installing a copy into qnnctl's cache", dangling.message)
    cache.ensure()
    refuse_unsafe_cache(cache)
    with version_lock(cache, version):
        found_sdk = None if request.force else find_installed(version, cache, environ)
        if found_sdk is not None and _has_components(found_sdk, components):
            log.debug("another qnnctl installed %s meanwhile", version)
            return _reused(InstallResult(found_sdk, "reused", selection), sha256, lock, cache)
        remove_stale_work(cache, version)
        if (cache.sdk_dir(version) / MANIFEST_NAME).is_file():
            _free_to_replace(cache, version)  # before a download that could not be installed
        # What the SDK must match: --sha256, the lock, the mirror's index.json; they must all
        # agree before anything is fetched, and what arrives passes the gate against each.
        index = None if request.url else vouchers.mirror
        indexed = index.expected(version) if index is not None else None
        expected = [e for e in (given_sha256(sha256), locked, indexed) if e is not None]
        agree(expected)
        # Some components: fetched by parts, or added to those of an SDK installed with fewer.
        extend = found_sdk if found_sdk is not None and found_sdk.origin == "qnnctl cache" else None
        if components is not None and (extend is not None or components != ("all",)):
            sdk = install_components(version, urls, name, components, expected, cache, request.force, terminal,
                                     extend, sha256)
            return InstallResult(sdk, "installed", selection)

        downloader = Downloader(
            make_session(), cache.downloads, terminal_progress if terminal else PlainProgress
        )
        log.info("downloading SDK %s from %s", version, redact(urls[0]))
        with work_folder(cache.tmp / f"{version}.{work_id()}") as work:
            # A zip's members are extracted from the partial file while the rest arrives;
            # the archive's digest and its central directory are still checked before use.
            # Once it is all there they take no more (stream.end), and the extraction takes what
            # they wrote once it has read the central directory (stream.close), which it does
            # while they finish the members in hand.
            stream = ZipStream(work / "x")
            try:
                fetched = downloader.fetch(urls, name, sha256, sink=stream, limit=size_limit(expected))
                stream.end()
                with used_up(fetched.path, cache.downloads / f"{name}.json"):
                    admit_archive(expected, fetched.url, fetched.sha256, fetched.size)
                    # fetched.url is redacted: the manifest keeps no password or token.
                    sdk = _build(fetched.path, version, fetched.url, fetched.sha256, fetched.size, cache,
                                 request.force, work, stream.close, expected)
            except BaseException:
                stream.close(abandon=True)  # none of its threads keeps writing
                raise
    return InstallResult(sdk, "installed", selection)


def _components_for(request: InstallRequest, selection: Selection, cwd: Path,
                    lock: Lock | None) -> tuple[str, ...] | None:
    """The components asked for: --components, else the pin's second line (for the pinned
    version), else the project's qnnctl.lock (for the version it locks); None when nobody asked."""
    if request.components is not None:
        return request.components
    if selection.reason == BY_PIN:
        pin = find_pin(cwd)
        pinned = read_pin_components(pin) if pin is not None else None
        if pinned is not None:
            return pinned
    if lock is not None and selection.version is not None:
        return lock.components(selection.version)
    return None


def _has_components(sdk: Sdk, components: tuple[str, ...] | None) -> bool:
    """Whether an installed SDK holds the components asked for (any SDK, when none were)."""
    if components is None:
        return True
    return covers(installed_components(read_manifest(sdk.root)), components)


def as_the_mirror_holds(selection: Selection, index: Index, cache: Cache, environ: Mapping[str, str]) -> Selection:
    """An install behind a mirror whose index.json lacks the version chosen, which is not
    installed: qnnctl's default becomes the newest version the mirror holds (a mirror is where a
    site keeps the SDKs it means to use); a version asked for (on the command line, by a pin,
    ExecuTorch's) is refused before anything is fetched, naming what the mirror holds."""
    version = selection.version
    if version is None or find_installed(version, cache, environ) is not None:
        return selection
    listed = index.versions()
    if listed is None or version in listed:
        return selection
    held = sorted(filter(is_full_version, listed), key=parse_version)
    shown = index.where
    if selection.reason == BY_DEFAULT and held:
        log.info("the mirror's %s lists no SDK %s, qnnctl's default; installing the newest SDK it holds, %s "
                 "(`qnnctl install VERSION` installs another, `qnnctl use VERSION` pins one for this project)",
                 shown, version, held[-1])
        return Selection(BY_DEFAULT, f"the newest SDK that QNNCTL_MIRROR holds ({shown} lists no {version}, "
                         "qnnctl's default)", version=held[-1])
    newest = held[-1] if held else "VERSION"
    raise DownloadError(
        f"the mirror's {shown} lists no SDK {version} ({selection.detail}); it holds "
        f"{', '.join(held) if held else 'none'}; nothing was fetched",
        hint=f"add SDK {version} to the mirror's folder DIR (`qnnctl mirror DIR {version}`, or `qnnctl mirror DIR "
        f"--file ARCHIVE` from an archive you have), or use one it holds: `qnnctl install {newest}`"
        + (f" and pin it with `qnnctl use {newest}`" if selection.reason == BY_PIN else ""),
    )


def _shell_selection(selection: Selection, root: Path, cache: Cache, force: bool) -> Selection:
    """What `install` does for the SDK the shell was set up for: reuse it (a root), or (a version)
    reinstall it, or install it again once it is gone, when it is one of qnnctl's cache."""
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


def _reused(result: InstallResult, sha256: str | None, lock: Lock | None, cache: Cache) -> InstallResult:
    """An SDK found on disk, checked against --sha256 (checked as a digest already) and the
    project's lock first (exit 4 on a mismatch)."""
    if sha256 is not None and result.sdk is not None:
        check_installed_sha256(result.sdk, sha256, cache)
    if lock is not None and result.sdk is not None:
        lock.check_found(result.sdk, cache)
    return result


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


def check_installed_sha256(sdk: Sdk, sha256: str, cache: Cache, archive: Path | None = None) -> None:
    """An installed SDK asked for with --sha256: the archive it came from must have had it, as
    qnnctl recorded when it installed it (a record in any other folder vouches for nothing).
    `archive`: the one given with --file, which the command in the hint installs."""
    recorded = (own_manifest(sdk, cache) or {}).get("sha256")
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


def _free_to_replace(cache: Cache, version: str) -> None:
    """An SDK about to be replaced that a running process holds: said now (or waited for with
    --wait), not after the download; the replace checks again."""
    with exclusive(version, cache.sdk_dir(version), "replaced", wait_for_holders.get()):
        pass


def _build(
    archive: Path,
    version: str,
    source: str,
    sha256: str,
    size: int,
    cache: Cache,
    force: bool,
    work: Path,
    streamed: Callable[[], Streamed | None],
    expected: list[Expected],
) -> Sdk:
    """Extract, check what was written against `expected` (each component's digest, besides the
    archive's sha256 checked already), write the manifest, rename into sdks/. Caller holds the lock."""
    extracted = extract(archive, work / "x", streamed)
    fields = _admit_whole(expected, archive, extracted, source, sha256, size)
    found, build = identify(extracted.root, extracted.version, version, source)
    require_version(found, version, source)
    return commit(extracted.root, version, source, sha256, size, extracted.files,
                  extracted.size, cache, force, work, build, fields)


def _admit_whole(expected: list[Expected], archive: Path, extracted: Extracted, shown: str, sha256: str,
                 size: int) -> dict[str, object]:
    """An extraction of a whole archive through the door (qnnctl.install.door), against
    `expected`; what its manifest records beyond the usual: each component's digest (what a lock
    made from it pins) and its archive's central directory's sha256."""
    fields = directory_digest(archive) or {}
    directory = fields.get("central_directory_sha256")
    seen = admit_tree(expected, extracted.root, extracted.files, shown, sha256, size,
                      directory if isinstance(directory, str) else None)
    return {**fields, "component_sha256": dict(seen.components or {})}


def _install_file(
    archive: Path, spec: str | None, sha256: str | None, force: bool, cache: Cache,
    lock: Lock | None = None, components: tuple[str, ...] | None = None,
) -> InstallResult:
    """`lock`: the project's, when it applies;
    `components` (all when None) are the only ones extracted, beside those installed already.

    The archive is opened once (qnnctl.install.sources): what is hashed, checked and extracted
    are the same bytes, whatever happens to its path meanwhile."""
    archive = user_path(archive).resolve()
    if not archive.is_file():
        raise UsageError(f"{archive} is not a file", hint="give the path of a downloaded SDK archive")
    wanted = resolve_version(spec) if spec else None
    cache.ensure()
    refuse_unsafe_cache(cache)
    with version_lock(cache, FILE_LOCK, "installing from a file"):
        remove_stale_work(cache, FILE_LOCK)
        with work_folder(cache.tmp / f"{FILE_LOCK}.{work_id()}") as work, \
                pinned_file(archive, work / "source") as local:
            digest = local.sha256
            admit_archive([e for e in (given_sha256(sha256),) if e is not None], str(archive), digest, local.size)
            if wanted is not None and not force:
                # Named and already installed: no need to extract a 1-2 GB archive to find that out.
                existing = cache.sdk_dir(wanted)
                if (existing / MANIFEST_NAME).is_file() and not missing_layout(existing) and \
                        _has_components(Sdk(existing, wanted, "qnnctl cache"), components):
                    return _reused(_same_archive(InstallResult(Sdk(existing, wanted, "qnnctl cache"), "reused",
                                                 Selection(BY_ARGUMENT, f"from {archive}", version=wanted)),
                                                 archive, digest, sha256, cache), None, lock, cache)
            return _install_pinned(local, wanted, sha256, force, cache, lock, components, work)


def _install_pinned(local: LocalArchive, wanted: str | None, sha256: str | None, force: bool, cache: Cache,
                    lock: Lock | None, components: tuple[str, ...] | None, work: Path) -> InstallResult:
    """Extract, check and commit the archive pinned as `local`; the caller holds the file lock."""
    archive, digest = local.given, local.sha256
    parts = None
    if components is not None and components != ("all",):
        extracted, parts = extract_components(local.path, components, work / "x")
    else:
        extracted = extract(local.path, work / "x")
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
    locked = lock.expected(version) if lock is not None else None
    whole = _admit_whole([e for e in (given_sha256(sha256), locked) if e is not None], local.path, extracted,
                         str(archive), digest, local.size)
    with version_lock(cache, version):
        existing = cache.sdk_dir(version)
        installed = (existing / MANIFEST_NAME).is_file() and not missing_layout(existing)
        old = Sdk(existing, version, "qnnctl cache") if installed else None
        if not force and old is not None and _has_components(old, components):
            return _reused(_same_archive(InstallResult(old, "reused", selection), archive, digest,
                                         sha256, cache), None, lock, cache)
        files, unpacked, extra = extracted.files, extracted.size, whole
        if parts is not None:
            written = extra["component_sha256"]
            if not force and old is not None:
                parts, files, unpacked = with_installed(old, extracted, parts, str(archive))
                written = merged_digests(old, written)  # type: ignore[arg-type]
            extra = {**parts.manifest_fields(), "component_sha256": written}
        sdk = commit(extracted.root, version, archive.as_uri(), digest, local.size, files, unpacked, cache,
                     force or old is not None, work, build, extra)
    return InstallResult(sdk, "installed", selection)


def _same_archive(result: InstallResult, archive: Path, digest: str, sha256: str | None,
                  cache: Cache) -> InstallResult:
    """`install --file` of a version installed already: from this archive, or say so.

    With --sha256 (the file's digest, checked already) the installed SDK must come from an
    archive with that digest too (exit 4); without it, a warning says how to replace it.
    """
    sdk = result.sdk
    recorded = (own_manifest(sdk, cache) or {}).get("sha256") if sdk is not None else None
    if sdk is None or recorded == digest:
        return result
    if not isinstance(recorded, str):
        # Nothing to compare (an SDK fetched in parts, or found elsewhere): only --sha256 can ask.
        if sha256 is not None:
            check_installed_sha256(sdk, sha256, cache, archive)
        return result
    if sha256 is not None:
        check_installed_sha256(sdk, sha256, cache, archive)
    log.warning("SDK %s is installed already, from another archive than %s (sha256 %s, not %s); it is "
                "left as it is: `qnnctl install %s --force --file %s` replaces it", sdk.version, archive,
                recorded, digest, sdk.version, archive)
    return result
