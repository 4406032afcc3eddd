"""`qnnctl use`, `lock`, `link` and `mirror`: what a project pins and a team shares."""

from __future__ import annotations

import os
from pathlib import Path

import click

from qnnctl.commands.common import complete_known, current_cache, say_pin_conflict
from qnnctl.commands.stderr import log, stderr_is_terminal
from qnnctl.errors import UsageError
from qnnctl.fleet.archives import add_archives, no_archive_kept
from qnnctl.fleet.locking import check_lock, make_lock, pinned_notes
from qnnctl.fleet.mirror import make_mirror
from qnnctl.sdk.pin import write_pin
from qnnctl.sdk.select import find_pin, version_pools
from qnnctl.sdk.stores import link_sdk


@click.command(short_help="Pin VERSION for this project (.qnn-version).")
@click.argument("version", shell_complete=complete_known)
def use(version: str) -> None:
    """Pin VERSION (a prefix names the newest match) for this project: write its full version
    into .qnn-version here, say it, and print the file's path."""
    path, pinned = write_pin(Path.cwd(), version, version_pools(current_cache(), os.environ, mirror=True))
    log.info("pinned SDK %s for this project: %s", pinned, path)
    for note in pinned_notes(pinned, os.environ, Path.cwd(), current_cache()):
        log.warning("%s", note)
    click.echo(str(path))


@click.command(short_help="Pin the SDK's checksums for this project (qnnctl.lock).")
@click.argument("version", required=False, shell_complete=complete_known)
@click.option("--check", is_flag=True, help="Exit 1 when the lock and what qnnctl resolves disagree; write nothing.")
def lock(version: str | None, check: bool) -> None:
    """Write qnnctl.lock (beside .qnn-version, else here) for VERSION or the SDK qnnctl resolves:
    its version, build id, archive sha256 and size, and where it came from; print its path.

    The values are taken on first use, from a download or the manifest of the installed SDK.
    """
    if check:
        if version is None:  # said first: it may be why the check fails
            say_pin_conflict("without this shell's SDK (as in CI), `qnnctl lock --check` checks the lock "
                              "against the pin")
        found = check_lock(version, os.environ, Path.cwd(), current_cache())
        state = "installed, matching" if found.sdk is not None else "not installed yet; install checks it"
        log.info("%s matches: SDK %s (%s)", found.lock.path, found.version, state)
        return
    written = make_lock(version, os.environ, Path.cwd(), current_cache(), terminal=stderr_is_terminal())
    log.info("trust on first use: %s%s Check them once against a copy you trust, then commit %s",
             written.trust[:1].lower(), written.trust[1:], written.path.name)
    replaced = written.replaced
    if replaced is not None and (replaced.version, replaced.sha256) != (written.lock.version, written.lock.sha256):
        log.warning("replaced the lock of SDK %s (sha256 %s) with SDK %s (sha256 %s)", replaced.version,
                    replaced.sha256, written.lock.version, written.lock.sha256)
    pin = find_pin(Path.cwd())
    if pin is None:
        log.info("no .qnn-version pins SDK %s here; `qnnctl use %s` makes it the project's choice",
                 written.lock.version, written.lock.version)
    click.echo(str(written.path))


@click.command(short_help="Fill DIR with SDK archives and an index.json, to serve as QNNCTL_MIRROR.")
@click.argument("folder", metavar="DIR", type=click.Path(path_type=Path, file_okay=False))
@click.argument("versions", nargs=-1, metavar="[VERSION]...", shell_complete=complete_known)
@click.option("--file", "files", multiple=True, metavar="ARCHIVE", type=click.Path(path_type=Path),
              help="Add this archive you have (repeat for more): its version is read from it; nothing is fetched.")
def mirror(folder: Path, versions: tuple[str, ...], files: tuple[Path, ...]) -> None:
    """Put <version>/v<version>.zip into DIR for each VERSION (default: the SDK qnnctl resolves
    here), from the cache's downloads or fetched once, or for each --file ARCHIVE, copied from
    it (checked as `install --file` checks it); record each one's sha256, size and build id in
    DIR/index.json; print each archive's path. Serve DIR with any static web server or object
    store, and point QNNCTL_MIRROR at it.

    An installed SDK is no archive: qnnctl's cache removes the archive once it is unpacked, so
    `qnnctl mirror DIR VERSION` fetches it again; `--file` adds the one you have."""
    cache = current_cache()
    if files:
        if versions:
            raise UsageError("give VERSION... or --file ARCHIVE..., not both: --file reads the version from the "
                             "archive", hint=f"`qnnctl mirror {folder} --file ARCHIVE`, then `qnnctl mirror {folder} "
                             "VERSION` for what to fetch")
        for done in add_archives(folder, files, os.environ, Path.cwd(), cache):
            click.echo(str(done.path))
        return
    for note in no_archive_kept(versions, cache, os.environ):
        log.info("%s", note)
    for done in make_mirror(folder, versions, os.environ, Path.cwd(), cache, terminal=stderr_is_terminal()):
        click.echo(str(done.path))


@click.command(short_help="Record an existing SDK folder, so that every command can select it.")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--version", "version", metavar="VERSION", help="Its version (default: what its libraries say).")
def link(path: Path, version: str | None) -> None:
    """Record the SDK folder PATH (unpacked by hand or by Qualcomm's installer) in qnnctl's
    cache; print its root. qnnctl never changes or deletes the folder: `qnnctl uninstall
    VERSION` removes only the link."""
    made, previous = link_sdk(path, version, current_cache(), os.environ)
    if previous is not None and previous.root != made.root:
        log.info("SDK %s was linked to %s; now to %s", made.version, previous.root, made.root)
    else:
        log.info("linked SDK %s: %s", made.version, made.root)
    click.echo(str(made.root))
