"""`qnnctl uninstall` and `qnnctl cache clean`: what leaves qnnctl's cache."""

from __future__ import annotations

import os

import click

from qnnctl.commands.common import VerboseGroup, complete_installed, current_cache
from qnnctl.commands.stderr import log
from qnnctl.errors import QnnctlError, UsageError
from qnnctl.install.prune import clean_cache, mib, prune
from qnnctl.install.prune import uninstall as do_uninstall
from qnnctl.sdk.holds import HeldError
from qnnctl.words import plural


@click.command(short_help="Remove SDKs from qnnctl's cache (--except VERSION..., --all).")
@click.argument("versions", nargs=-1, metavar="[VERSION]...", shell_complete=complete_installed)
@click.option("--except", "keep", is_flag=True, help="Remove every SDK of qnnctl's cache but the VERSIONs given.")
@click.option("--all", "everything", is_flag=True, help="Remove every SDK of qnnctl's cache.")
@click.option("--wait", is_flag=True, help="Wait for the processes that use an SDK to end, rather than leave it.")
def uninstall(versions: tuple[str, ...], keep: bool, everything: bool, wait: bool) -> None:
    """Remove SDKs from qnnctl's cache; for a linked SDK (`qnnctl link`), only the link.

    Stores and linked folders are never changed. An SDK that a running process uses (a `qnnctl
    lower` pipeline, a Python that called setup_sdk()) is left in place, naming the process, and
    the others are removed; the exit code is then 1 (--wait: wait for it to end instead). With
    --except or --all, an SDK that a running install holds is left alone, and the space freed is
    reported.
    """
    if keep and everything:
        raise UsageError("--except and --all cannot be used together")
    if everything and versions:
        raise UsageError("--all removes every SDK of qnnctl's cache; it takes no VERSION",
                         hint="to keep some, use `qnnctl uninstall --except VERSION...`")
    if keep and not versions:
        raise UsageError("--except needs the VERSIONs to keep", hint="`qnnctl uninstall --all` removes every one")
    if not (keep or everything):
        if not versions:
            raise UsageError("give the VERSION to remove", hint="or `qnnctl uninstall --except VERSION...` / `--all`")
        held: list[HeldError] = []
        for version in versions:
            try:
                do_uninstall(version, current_cache(), os.environ, wait=wait)  # says what it removed, and its size
            except HeldError as exc:
                held.append(exc)
                continue
        _left_in_place(held)
        return
    pruned = prune(versions, everything, current_cache(), os.environ, wait=wait)
    for version, root in pruned.busy:
        log.warning("SDK %s (%s) is held by a running install; left alone", version, root)
    if pruned.kept:
        log.info("kept %s", ", ".join(pruned.kept))
    if pruned.removed:
        log.info("removed %s, freed %s", plural(len(pruned.removed), "SDK"), mib(pruned.freed))
    elif not pruned.held:
        log.info("no SDK of qnnctl's cache to remove; nothing freed")
    _left_in_place(pruned.held)


def _left_in_place(held: list[HeldError]) -> None:
    """SDKs an uninstall left because running processes use them: one is the error itself;
    several are each named, then summed up in the error (exit 1 either way)."""
    if len(held) == 1:
        raise held[0]
    if held:
        for error in held:
            log.warning("%s", error.message)
        versions = " ".join(error.version for error in held)
        raise QnnctlError(f"{len(held)} SDKs in use were left in place: {versions.replace(' ', ', ')}",
                          hint=f"run it again once those processes have ended, or `qnnctl uninstall --wait "
                          f"{versions}` to wait for them")


@click.group(cls=VerboseGroup)
def cache() -> None:
    """Cache housekeeping."""


@cache.command()
def clean() -> None:
    """Remove partial downloads and folders left by interrupted installs."""
    cleaned = clean_cache(current_cache())
    for path in cleaned.removed:
        log.info("removed %s", path)
    for path in cleaned.busy:
        log.warning("%s is in use by a running install; left alone", path)
    if not cleaned.removed and not cleaned.busy:
        log.info("nothing to clean")
