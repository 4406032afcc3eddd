"""`qnnctl env` as the full command line answers it (qnnctl.launch answers its usual case), and
`qnnctl list`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from qnnctl.commands.common import complete_installed, current_cache
from qnnctl.commands.stderr import log, verbosity
from qnnctl.errors import NotInstalledError, UsageError
from qnnctl.run.envplan import plan_env
from qnnctl.sdk.listing import installed_sdks, selected_here
from qnnctl.sdk.listing import render_table as render_sdk_table
from qnnctl.sdk.select import pin_conflict
from qnnctl.shell.detect import detect_shell
from qnnctl.shell.render import SHELLS, render


@click.command(short_help="Print the shell exports for an installed SDK.")
@click.argument("version", required=False, shell_complete=complete_installed)
@click.option("--sdk", "sdk_path", metavar="VERSION|PATH", shell_complete=complete_installed,
              help="Use this installed SDK version, or the SDK at this path.")
@click.option("--shell", "shell", type=click.Choice(SHELLS),
              help="Output syntax (default: the shell that runs qnnctl, else $SHELL, else sh).")
@click.option("--unset", is_flag=True, help="Print what undoes qnnctl's changes.")
def env(version: str | None, sdk_path: str | None, shell: str | None, unset: bool) -> None:
    """Print the exports for an installed SDK: eval "$(qnnctl env)". Never downloads."""
    if sdk_path is not None and not sdk_path.strip():
        # Path("") is ".": taken as a path, an empty value would name the current folder.
        raise UsageError("--sdk is empty; it takes an SDK version or the path of an SDK root",
                         hint="give a version (--sdk 2.37) or the folder that holds lib/ and bin/, e.g. "
                         "--sdk /opt/qairt/2.37.0.250724")
    if version is not None and sdk_path is not None:
        raise UsageError("give either VERSION or --sdk, not both")
    if unset and (version is not None or sdk_path is not None):
        raise UsageError("--unset undoes whatever qnnctl exported; it takes no VERSION or --sdk")
    spec = version
    if sdk_path is not None:
        # A version as the other commands take it (`2.51`, `2.51.0.260929`); anything else, a
        # bare folder name too, and a version-like name of a folder here, is a path.
        if sdk_path.startswith(("/", "~")) or _is_version(sdk_path):
            spec = sdk_path
        else:
            spec = os.path.join(".", sdk_path)
    try:
        plan = plan_env(spec, os.environ, Path.cwd(), current_cache(), unset=unset)
    except NotInstalledError as exc:
        conflict = pin_conflict(os.environ, Path.cwd(), current_cache()) if spec is None else None
        if conflict is not None:
            exc.hint = f"{conflict.said()}; {exc.hint}" if exc.hint else conflict.said()
        raise
    for note in plan.notes:
        log.warning("%s", note)
    if plan.selection is not None and verbosity["verbose"]:
        log.debug("chose %s", plan.selection.describe())
    if plan.selection is not None and plan.selection.caller_managed and not plan.values:
        log.info("QNN_SDK_ROOT is exported but empty: the caller manages the SDK; nothing to export")
        if shell == "json":
            # One JSON document all the same, with the final values: QNN_SDK_ROOT stays empty,
            # which is how the caller said that the SDK is theirs; nothing else changes.
            click.echo(render({"QNN_SDK_ROOT": ""}, "json"), nl=False)
        return
    text = render(plan.values, shell or detect_shell(os.environ, os.getppid()))
    click.echo(text, nl=False)


def _is_version(text: str) -> bool:
    """`2.51`, `2.51.0.260929`: digits and dots, starting with a digit, and no folder of that name here."""
    return (bool(text) and text[0].isdigit() and all(c.isdigit() or c == "." for c in text)
            and not os.path.lexists(text))


@click.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_(as_json: bool) -> None:
    """List installed SDKs."""
    rows = installed_sdks(current_cache(), os.environ)
    if as_json:
        click.echo(json.dumps({"schema": 1, "sdks": rows}, indent=2))
        return
    if not rows:
        log.info("no SDK installed; run `qnnctl install`")
        return
    selected = selected_here(current_cache(), os.environ, Path.cwd())
    lines, marked = render_sdk_table(rows, selected[0] if selected is not None else None)
    for line in lines:
        click.echo(line)
    if marked and selected is not None:
        log.info("* marks the SDK used here: %s", selected[1])
