"""Which SDK a process gets, installing it where the command may, and making the host able to load it.

One place for `lower`, `doctor` and `setup_sdk()`: choose the SDK (installing what the pin names
when the command may), make sure the host can load it (the staged libc++ trio); the variables a
process must start with are qnnctl.run.envplan's, which `qnnctl env` reads alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from qnnctl.errors import DamagedSdkError, IntegrityError, MissingComponentError, NotInstalledError
from qnnctl.host.needs import missing_host_libraries, trio_needed
from qnnctl.host.staged import staged_lib_dirs, staged_runtimes
from qnnctl.net.urls import check_url, redact
from qnnctl.run.envplan import PinGap, pin_gap
from qnnctl.sdk.cache import Cache, read_manifest
from qnnctl.sdk.components import install_command
from qnnctl.sdk.holds import hold_sdk
from qnnctl.sdk.hosts import require_supported_host
from qnnctl.sdk.layout import Sdk
from qnnctl.sdk.select import Selection, find_installed, find_lock, resolve_installed, select_sdk
from qnnctl.sdk.versions import archive_urls

log = logging.getLogger("qnnctl.run.environment")


def resolve_sdk(
    spec: str | None,
    environ: Mapping[str, str],
    cwd: Path,
    cache: Cache,
    allow_install: bool = True,
    terminal: bool = False,
) -> tuple[Selection, Sdk | None]:
    """The SDK to use, chosen the way `install` chooses it and held to the project's lock; None
    when the caller manages it. For a look at it (`which`, `inspect`); what uses it takes
    `resolve_and_hold`.

    An SDK installed without components the project's pin names is completed (`install`
    fetches what is missing), or, when it may not install, refused with the command that does.
    UnsupportedHostError (exit 5) on a host the SDK has no libraries for.
    """
    selection, sdk = _choose(spec, environ, cwd, cache, allow_install, terminal)
    if sdk is not None:
        hold_sdk_to_lock(sdk, cache, cwd)
    return selection, sdk


def resolve_and_hold(
    spec: str | None,
    environ: Mapping[str, str],
    cwd: Path,
    cache: Cache,
    allow_install: bool = True,
    terminal: bool = False,
) -> tuple[Selection, Sdk | None, int | None]:
    """`resolve_sdk` for a process that uses the SDK, with its hold (qnnctl.sdk.holds): the
    descriptor, the caller's to keep open (None when nothing is held).

    The SDK is held before it is held to the lock: an `install --force` or `uninstall` waits for
    a hold, so the folder checked is the one that stays. Checked first, a folder put in its place
    between the check and the hold would be used unchecked.
    """
    selection, sdk = _choose(spec, environ, cwd, cache, allow_install, terminal)
    if sdk is None:
        return selection, None, None
    return selection, sdk, hold_checked(sdk, cache, cwd)


def hold_checked(sdk: Sdk, cache: Cache, cwd: Path) -> int | None:
    """The SDK's hold, taken before the SDK is held to the project's lock (hold_sdk_to_lock): the
    descriptor, the caller's to close (None when nothing could be held); nothing stays held when
    the lock refuses it."""
    held = hold_sdk(sdk.root, cache)
    try:
        hold_sdk_to_lock(sdk, cache, cwd)
    except BaseException:
        if held is not None:
            os.close(held)
        raise
    return held


def _choose(spec: str | None, environ: Mapping[str, str], cwd: Path, cache: Cache, allow_install: bool,
            terminal: bool) -> tuple[Selection, Sdk | None]:
    """The SDK chosen, installed when it is missing and the command may; not yet held to the lock."""
    require_supported_host()
    selection = select_sdk(spec, environ, cwd, cache, mirror=allow_install)
    log.debug("chose %s", selection.describe())
    if selection.caller_managed:
        return selection, None
    if selection.root is not None or not allow_install:
        sdk = resolve_installed(selection, cache, environ)
        _pinned_missing(selection, sdk, cwd, refuse=True)
        return selection, sdk
    found = _reusable(selection, environ, cwd, cache)
    if found is not None:
        return selection, found
    # lazy: installing pulls in downloads, archives and the lock and index readers (requests among
    # them, a fifth of a second); `lower` with its SDK installed, as it usually is, needs none of it
    from qnnctl.install.pipeline import InstallRequest, install
    from qnnctl.sdk.vouchers import vouchers  # lazy: as the line above

    result = install(InstallRequest(spec=spec), cache, environ, cwd, vouchers(environ, cwd), terminal=terminal)
    return result.selection or selection, result.sdk


def _reusable(selection: Selection, environ: Mapping[str, str], cwd: Path, cache: Cache) -> Sdk | None:
    """The installed SDK that `install` would reuse as it is, found without loading it, when nothing
    vouches for it: no project lock to check it against, no mirror whose index may choose another
    version. None otherwise, and then `install` decides (and checks what it finds)."""
    if selection.version is None or environ.get("QNNCTL_MIRROR") or find_lock(cwd) is not None:
        return None
    require_supported_host()  # as `install` refuses an unsupported host before it looks
    sdk = find_installed(selection.version, cache, environ)
    if sdk is None or _pinned_missing(selection, sdk, cwd, refuse=False) is not None:
        return None  # missing, or without components the pin names: `install` fetches them
    return sdk


def resolve_for_dry_run(
    spec: str | None, environ: Mapping[str, str], cwd: Path, cache: Cache, allow_install: bool = True
) -> tuple[Selection, Sdk | None, list[str]]:
    """As `resolve_sdk`, but nothing is downloaded or installed: an SDK that is not installed is
    described where it would go, with notes saying what a real run would fetch and from where."""
    selection = select_sdk(spec, environ, cwd, cache, mirror=allow_install)
    log.debug("chose %s", selection.describe())
    if selection.caller_managed:
        return selection, None, []
    damaged: DamagedSdkError | None = None
    try:
        sdk = resolve_installed(selection, cache, environ)
    except NotInstalledError as exc:
        version = selection.version
        # A folder that has gone (the SDK this shell was set up for) is nothing a real run
        # could install: it stops there, and so does the dry run.
        if not allow_install or version is None:
            raise
        damaged = exc if isinstance(exc, DamagedSdkError) else None
    else:
        gap = _pinned_missing(selection, sdk, cwd, refuse=not allow_install)
        notes = [f"{gap.said(sdk.version)}: without --dry-run, qnnctl would first fetch only those "
                 f"(`{install_command(sdk.version, gap.lacking)}`)"] if gap is not None else []
        note = runtime_note(sdk, cache) if allow_install else None
        return selection, sdk, notes + ([note] if note else [])
    mirror = environ.get("QNNCTL_MIRROR") or None
    if mirror is not None:
        check_url(mirror, "QNNCTL_MIRROR", allow_file=False)  # as the real run would, before anything
    # lazy: as in resolve_sdk, the install pipeline and the index's reader only when it matters
    from qnnctl.install.pipeline import as_the_mirror_holds
    from qnnctl.sdk.vouchers import vouchers  # lazy: as the line above

    index = vouchers(environ, cwd).mirror
    if index is not None and selection.root is None:
        # What the mirror's index.json holds decides as it does for `install`: the newest it
        # holds instead of qnnctl's default, a refusal for a version it lacks.
        selection = as_the_mirror_holds(selection, index, cache, environ)
        version = selection.version or version
    root = cache.sdk_dir(version)
    source = redact(archive_urls(version, mirror)[0])
    state = (f"is damaged (missing {', '.join(damaged.missing)})" if damaged is not None
             else "is not installed")
    note = (f"SDK {version} {state} ({selection.detail}): without --dry-run, qnnctl would "
            f"first download it from {source} and install it into {root}")
    return selection, Sdk(root=root, version=version, origin="not installed yet"), [note]


def _pinned_missing(selection: Selection, sdk: Sdk, cwd: Path, refuse: bool) -> PinGap | None:
    """What the pin names that `sdk` lacks; with `refuse`, any of it is a MissingComponentError
    naming the command that adds it (for when nothing may be installed)."""
    gap = pin_gap(selection, read_manifest(sdk.root), cwd)
    if gap is not None and refuse:
        raise MissingComponentError(sdk.version, str(sdk.root), gap.lacking, f"the pin in {gap.pin}")
    return gap


def runtime_note(sdk: Sdk, cache: Cache) -> str | None:
    """What `ensure_loadable` would stage for `sdk`, in words; None when nothing."""
    wanted = trio_needed(sdk)
    lacking = missing_host_libraries(wanted, [sdk.lib_dir, *staged_lib_dirs(cache, sdk)]) if wanted else []
    if not lacking:
        return None
    return (f"the SDK's libraries need {', '.join(lacking)}, which this host lacks: without --dry-run, "
            "qnnctl would stage them first (what `qnnctl install --runtime` does)")


def ensure_loadable(sdk: Sdk, environ: Mapping[str, str], cache: Cache, cwd: Path) -> None:
    """Stage the libc++ trio when the SDK's libraries need it and the host lacks it (held to
    what the project's lock, found from `cwd`, pins of it).

    Raises what staging raised; the caller decides whether that stops it.
    """
    wanted = trio_needed(sdk)
    if not wanted or not missing_host_libraries(wanted, [sdk.lib_dir, *staged_lib_dirs(cache, sdk)]):
        return
    # lazy: staging fetches and unpacks packages (requests, the package readers); a host that has
    # the trio, or has it staged, never needs it
    from qnnctl.host.runtime import ensure_trio

    ensure_trio(cache, sdk, environ, cwd)




def hold_sdk_to_lock(sdk: Sdk, cache: Cache, cwd: Path) -> None:
    """An SDK used without `install` (named by a path or QNN_SDK_ROOT, or under --no-install) in
    a project whose lock pins its version: checked as `install` checks an SDK it finds on disk
    (IntegrityError, exit 4, when it disagrees). Nothing is read without a lock."""
    if find_lock(cwd) is None:
        return
    # lazy: the lock's reader (tomllib), for a locked project only
    from qnnctl.sdk.lockfile import check_reused

    try:
        check_reused(sdk, cwd, False, cache)
    except IntegrityError as refused:
        if sdk.origin in _NAMED_BY_PATH and cache.version_at(sdk.root) is None:
            # Reinstalling into the cache alone leads nowhere: the path still names this folder.
            refused.hint = _NAMED_BY_PATH[sdk.origin].format(root=sdk.root, version=sdk.version)
        raise


# How to use the locked SDK instead of a folder outside the cache that the lock refuses.
_NAMED_BY_PATH = {
    "QNN_SDK_ROOT": "QNN_SDK_ROOT names {root}: install the locked SDK into qnnctl's cache with "
                    "`qnnctl install {version}`, then unset QNN_SDK_ROOT (or point it there: "
                    "`export QNN_SDK_ROOT=\"$(qnnctl install {version})\"`)",
    "--sdk": "--sdk names {root}: install the locked SDK into qnnctl's cache with `qnnctl install {version}`, "
             "and name it by its version: `--sdk {version}`",
    "qnnctl env": "this shell was set up by `qnnctl env` for {root}: install the locked SDK into qnnctl's cache "
                  "with `qnnctl install {version}`, then set the shell up for it: `eval \"$(qnnctl env {version})\"`",
}


def hold_runtime_to_lock(sdk: Sdk, cache: Cache, cwd: Path) -> None:
    """In a project whose lock pins the host runtime staged beside `sdk`, what is staged now must
    be what it pins (IntegrityError, exit 4): a trio staged from elsewhere, where no lock applied,
    is not loaded here. Nothing is read without a lock and a staged runtime."""
    if find_lock(cwd) is None or not staged_runtimes(cache):
        return
    # lazy: the lock's reader and the runtime's stages, for a locked project with a staged runtime
    from qnnctl.host.runtime import hold_staged_to_lock

    hold_staged_to_lock(cache, sdk.version, cwd)
