"""Doctor's checks of what a team shares: the project's qnnctl.lock against the selected SDK,
and the read-only stores of QNNCTL_STORES and the SDKs `qnnctl link` adopted.
"""

from __future__ import annotations

import os
from pathlib import Path

from qnnctl.doctor.context import Context, Target
from qnnctl.doctor.report import Outcome, Skip, abridged, fail, ok, warn
from qnnctl.errors import NotInstalledError
from qnnctl.sdk.lockfile import compare, read_lock, unchecked
from qnnctl.sdk.select import LOCK_FILE, changed_link_error, find_lock, select_sdk
from qnnctl.sdk.stores import (
    STORES_VARIABLE,
    all_links,
    store_dirs,
    store_problem,
    store_sdks,
    unsafe_store_sdks,
)
from qnnctl.words import plural


def check_lock(ctx: Context) -> Outcome:
    """The project's qnnctl.lock: present, matching the selected SDK, or stale."""
    path = find_lock(ctx.cwd)
    if path is None:
        raise Skip(f"no {LOCK_FILE} in {ctx.cwd} or above it",
                   hint="`qnnctl lock` pins the SDK's version and checksums for this project")
    lock = read_lock(path)
    pins = f"{path} pins SDK {lock.version} (sha256 {lock.sha256})"
    try:
        target: Target | None = ctx.target()
    except NotInstalledError:
        target = None
    if target is not None and target.sdk is None:
        raise Skip(f"{pins}; the caller manages the SDK (QNN_SDK_ROOT is exported but empty)")
    selection = target.selection if target is not None else select_sdk(ctx.spec, ctx.environ, ctx.cwd, ctx.cache())
    sdk = target.sdk if target is not None else None
    version = selection.version or (sdk.version if sdk is not None else None)
    if version is None:  # pragma: no cover - a selection names a version or a root
        raise Skip(f"{pins}; no SDK selected")
    if version != lock.version:
        return warn(f"stale: {pins}, but the selected SDK is {version} ({selection.why})",
                    hint=f"`qnnctl lock {version}` locks the selected SDK; `qnnctl use {lock.version}` selects "
                    "the locked one")
    if sdk is None:
        return ok(f"present: {pins}; not installed yet: `qnnctl install` checks the archive against it")
    problems, how = compare(lock, sdk, ctx.cache())
    if problems:
        return fail("; ".join(problems), hint=f"`qnnctl install --force {version}` reinstalls the locked archive; "
                    f"`qnnctl lock {version}` trusts the SDK in use instead")
    if how is None:
        return warn(f"present: {pins}; {unchecked(lock, sdk)}",
                    hint=f"`qnnctl lock {version}` writes the lock again with each component's digest; "
                    f"`qnnctl install --force {version}` installs a checked copy into qnnctl's cache")
    return ok(f"matching: {pins}; the SDK at {sdk.root} ({sdk.origin}) matches by {how}")


def check_stores(ctx: Context) -> Outcome:
    """The read-only stores of QNNCTL_STORES and the links of `qnnctl link`."""
    stores = store_dirs(ctx.environ)
    links = all_links(ctx.cache())
    if not stores and not links:
        raise Skip(f"no {STORES_VARIABLE} set and no SDK linked",
                   hint=f"{STORES_VARIABLE}=DIR:... shares read-only SDK folders; `qnnctl link PATH` adopts one")
    found: dict[Path, list[str]] = {}
    for stored in store_sdks(ctx.environ):
        found.setdefault(stored.store, []).append(stored.version)
    parts: list[str] = []
    problems: list[str] = []
    hints: list[str] = []
    unsafe: list[str] = []  # a failure, not a warning: what another user could change
    for store in stores:
        problem = store_problem(store)
        if problem is not None:
            unsafe.append(f"store {store} is not used: {problem.folder} {problem.why}")
            hints.append(f"{problem.fix}, or take the store out of {STORES_VARIABLE}")
        elif not os.path.isdir(store):
            problems.append(f"store {store} is not there (or is no folder you may enter)")
            hints.append(f"mount it, or take it out of {STORES_VARIABLE}")
        elif not os.access(store, os.R_OK | os.X_OK):
            problems.append(f"store {store} cannot be read")
            hints.append(f"check its permissions, or take it out of {STORES_VARIABLE}")
        else:
            versions = found.get(store, [])
            writable = os.access(store, os.W_OK)
            parts.append(f"store {store}: {plural(len(versions), 'SDK')}"
                         + (f" ({abridged(versions, 3)})" if versions else "")
                         + ("" if writable else ", read-only"))
    dangling = [link for link in links if link.dangling]
    if links:
        parts.append(f"{plural(len(links) - len(dangling), 'linked SDK')}"
                     + (f" ({abridged([f'{lk.version} at {lk.root}' for lk in links if not lk.dangling], 3)})"
                        if len(links) > len(dangling) else ""))
    for link in dangling:
        problems.append(f"SDK {link.version} is linked to {link.root}, which is gone (or is no SDK root): not used")
        hints.append(f"`qnnctl link NEWPATH` links its new place; `qnnctl uninstall {link.version}` drops the link")
    for link in links:
        changed = None if link.dangling else changed_link_error(link.version, link.root, link.build_id)
        if changed is not None:
            problems.append(changed.message)
            hints.append(changed.hint or "")
    for root, problem in unsafe_store_sdks(ctx.environ):
        unsafe.append(f"SDK folder {root} is not used: {problem.folder} {problem.why}")
        hints.append(problem.fix)
    if unsafe:
        return fail("; ".join(unsafe + problems + parts) + "; another user could put code there that runs as you",
                    "; ".join(dict.fromkeys(hints)))
    if problems:
        return warn("; ".join(problems + parts), "; ".join(dict.fromkeys(hints)))
    return ok("; ".join(parts))
