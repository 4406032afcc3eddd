"""`qnnctl inspect`: which QAIRT built a lowered model, and whether the SDK can load it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from qnnctl.commands.common import complete_installed, current_cache
from qnnctl.errors import QnnctlError
from qnnctl.run.inspect import inspect_file
from qnnctl.run.inspect import render as render_inspection


@click.command(short_help="Which QAIRT built a lowered model, and whether the SDK can load it.")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--sdk", "spec", metavar="VERSION|PATH", shell_complete=complete_installed,
              help="Read it with this installed SDK, and say whether it loads it.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def inspect(file: Path, spec: str | None, as_json: bool) -> None:
    """Read FILE (a QNN context binary, or an ONNX model with an EPContext node): the QAIRT build
    that made it, its backend, HTP architecture and SoC, its graphs with their inputs and outputs.

    With an installed SDK (the one qnnctl selects, or --sdk), its own libQnnSystem.so reads the
    binary, and the exit code is 1 when that SDK cannot load it (a binary built by a newer QAIRT).
    """
    report = inspect_file(file, spec, os.environ, Path.cwd(), current_cache())
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo(render_inspection(report), nl=False)
    if not report.ok and report.sdk is not None:
        raise QnnctlError(report.sdk.reason,
                          hint=f"run it with a runtime of QAIRT {report.binaries[0].qairt} or newer, "
                          f"or lower the model again with SDK {report.sdk.version}")
