"""`qnnctl lower`: a lowering pipeline re-run in a fresh process with the SDK in place."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from qnnctl.commands.common import complete_known, complete_pipeline, current_cache
from qnnctl.commands.stderr import log, stderr_is_terminal
from qnnctl.run.lower import LowerOptions, exec_plan, parse_target, plan_lower, render_plan
from qnnctl.shell.exports import check_cache_path


class _LowerCommand(click.Command):
    """qnnctl's options end where the pipeline begins: at SCRIPT, `-m` or `--`.

    Whatever follows belongs to the pipeline, even `--sdk`, `-v` or `--help`. The pipeline's
    words reach the PIPELINE argument after a `--` of our own, with the first `--` kept, so
    that `lower -- x.py` (a command) stays apart from `lower x.py` (a script).
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        valued = {name for param in self.get_params(ctx) if isinstance(param, click.Option)
                  and not param.is_flag and not param.count for name in param.opts}
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--" or arg == "-" or not arg.startswith("-") or arg.startswith("-m"):
                break
            if arg in valued and (i + 1 == len(args) or args[i + 1] == "--") and not ctx.resilient_parsing:
                # Else click would take our own `--` for its value, and report nothing to run.
                raise click.UsageError(f"{arg} needs a value", ctx=ctx)
            i += 2 if arg in valued else 1
        return super().parse_args(ctx, [*args[:i], "--", *args[i:]])


@click.command(cls=_LowerCommand, short_help="Run a lowering pipeline with the SDK in place.")
@click.option("--sdk", "spec", metavar="VERSION|PATH", shell_complete=complete_known,
              help="Use this SDK (installed first when missing).")
@click.option("--python", "python", metavar="PATH",
              help="The interpreter for SCRIPT.py and -m MODULE (default: the active virtualenv's, "
              "else python3 on PATH).")
@click.option("--no-install", is_flag=True, help="Exit 1 instead of installing a missing SDK.")
@click.option("--dry-run", is_flag=True, help="Print the environment changes and the command (sh); run nothing.")
@click.option("--keep-mkldnn", is_flag=True, help="Leave PyTorch's MKLDNN on, even on AMD CPUs.")
@click.argument("pipeline", nargs=-1, type=click.UNPROCESSED, shell_complete=complete_pipeline,
                metavar="SCRIPT.py|-m MODULE|-- COMMAND [ARGS]...")
def lower(spec: str | None, python: str | None, no_install: bool, dry_run: bool, keep_mkldnn: bool,
          pipeline: tuple[str, ...]) -> None:
    """Run a lowering pipeline in a fresh process that starts with the SDK in place.

    The pipeline's exit code, signals and standard streams are its own; qnnctl prints nothing
    once it starts.
    """
    if not no_install:
        check_cache_path(str(current_cache().root))
    options = LowerOptions(spec=spec, python=python, install=not no_install, keep_mkldnn=keep_mkldnn,
                           dry_run=dry_run)
    plan = plan_lower(parse_target(pipeline), options, os.environ, Path.cwd(), current_cache(),
                      terminal=stderr_is_terminal())
    if dry_run:
        # On a terminal the plan's comments show the notes already: said once.
        for note in plan.notes if not sys.stdout.isatty() else ():
            log.info("%s", note)
        click.echo(render_plan(plan), nl=False)
        return
    exec_plan(plan)
