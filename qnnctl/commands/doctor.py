"""`qnnctl doctor`: every reason the SDK will not load here, with the fix."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from qnnctl.commands.common import complete_installed
from qnnctl.doctor.diagnose import diagnose
from qnnctl.doctor.report import exit_code, render_json, render_table, render_text


@click.command(short_help="Check host, SDK and environment; exit 1 on a failure.")
@click.option("--sdk", "spec", metavar="PATH|VERSION", shell_complete=complete_installed,
              help="Check this SDK instead of the one qnnctl would choose.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--offline", is_flag=True, help="Skip the network check.")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option("--verify", is_flag=True, help="Re-hash the SDK's files against its manifest.")
@click.option("--device", "device", is_flag=False, flag_value="", default=None, metavar="[SERIAL]",
              help="Also check this Android device (or the only one adb sees).")
@click.option("--model", "models", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="With --device: fail when this lowered model does not load there (another HTP architecture, "
              "a QNN API newer than the device's runtime, unreadable by the SDK's library).")
@click.option("--python", "python", metavar="PY",
              help="Check the frameworks of this Python (the one `lower --python` runs) instead of qnnctl's own.")
def doctor(spec: str | None, as_json: bool, offline: bool, strict: bool, verify: bool, device: str | None,
           models: tuple[Path, ...], python: str | None) -> None:
    """Check the host, the SDK and the environment; exit 1 when a check fails."""
    results = diagnose(spec, os.environ, Path.cwd(), offline=offline, verify=verify, device=device,
                       models=models, python=python)
    # The report is what was asked for, so it goes to stdout, as a table on a terminal.
    if as_json:
        click.echo(render_json(results, strict), nl=False)
    elif sys.stdout.isatty():
        click.echo(render_table(results), nl=False)
    else:
        click.echo(render_text(results), nl=False)
    click.get_current_context().exit(exit_code(results, strict))
