"""`qnnctl inspect`: a lowered model as the SDK's own library reads it, and whether the SDK loads it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from qnnctl.commands.common import complete_installed, current_cache
from qnnctl.errors import QnnctlError
from qnnctl.run.inspect import inspect_file
from qnnctl.run.inspect import render as render_inspection
from qnnctl.words import printable


@click.command(short_help="A lowered model as the SDK's library reads it, and whether the SDK loads it.")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--sdk", "spec", metavar="VERSION|PATH", shell_complete=complete_installed,
              help="Read it with this installed SDK, and say whether it loads it.")
@click.option("--load", is_flag=True,
              help="Also load it on this host with the SDK's x86_64 backend library: `loads` only when it did.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (schema 2, docs/inspect.md).")
def inspect(file: Path, spec: str | None, load: bool, as_json: bool) -> None:
    """Read FILE (a QNN context binary, or an ONNX model with an EPContext node) with the SDK's
    own libQnnSystem.so: the QAIRT build and QNN API versions that made it, its backend, HTP
    architecture and SoC, its graphs (VTCM, spill-fill, memory sizes) and their tensors
    (type, shape, quantization).

    The exit code is 1 when the library cannot read the file (no verdict is given from text in
    it), and when the SDK's runtime cannot load it: a binary whose QNN core or backend API is
    newer than the runtime's. With --load the SDK's backend library creates a context from each
    binary on this host, as ONNX Runtime does, and that decides.
    """
    report = inspect_file(file, spec, os.environ, Path.cwd(), current_cache(), load)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo(render_inspection(report), nl=False)
    unread = next((b for b in report.binaries if b.error is not None), None)
    if unread is not None:
        raise QnnctlError(f"{printable(unread.origin)} cannot be read by the SDK's library: "
                          f"{printable(unread.error or '')}",
                          hint="it is no context binary this SDK reads (cut short, changed, or another file); "
                          "lower the model again")
    if report.sdk is not None and not report.sdk.loads:
        raise QnnctlError(report.sdk.reason,
                          hint="run it with a runtime at least as new as the SDK that lowered it, or lower the "
                          f"model again with SDK {report.sdk.version}")
