"""`qnnctl which`: the library or tool a process set up for the SDK would use."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from qnnctl.commands.common import complete_installed, current_cache, say_pin_conflict
from qnnctl.errors import QnnctlError
from qnnctl.run.which import which as find


@click.command(short_help="The library or tool a process would use, as the loader or PATH finds it.")
@click.argument("name")
@click.option("--sdk", "spec", metavar="VERSION|PATH", shell_complete=complete_installed,
              help="For this SDK instead of the one qnnctl would choose.")
@click.option("--json", "as_json", is_flag=True, help="Also every folder searched, and where it came from.")
def which(name: str, spec: str | None, as_json: bool) -> None:
    """Print the absolute path of library NAME (libQnnHtp.so, libc++.so.1) or tool NAME
    (qnn-net-run) that a process set up for the SDK would use; exit 1 when nothing provides it.

    Resolved in the environment `qnnctl lower` starts a pipeline with: libraries as the dynamic
    loader finds them (LD_LIBRARY_PATH, its cache, its default folders), tools on PATH.
    """
    answer = find(name, spec, os.environ, Path.cwd(), current_cache())
    if spec is None:
        say_pin_conflict()
    if as_json:
        click.echo(json.dumps({"schema": 1, **answer.as_dict()}, indent=2))
    elif answer.path is not None:
        click.echo(answer.path)
    if answer.path is None:
        where = f"SDK {answer.sdk.version} at {answer.sdk.root}" if answer.sdk else "the environment as it is"
        searched = ("no folder on LD_LIBRARY_PATH, in the loader's cache or among its default folders holds it"
                    if answer.kind == "library" else "no folder on PATH holds it")
        error = QnnctlError(f"no {answer.kind} {name} for {where}: {searched}",
                            hint="`qnnctl which --json NAME` lists every folder searched; "
                            "`qnnctl doctor` explains what the SDK lacks")
        raise error
