"""The command line: the `qnnctl` group, each command loaded when it is run, and the one error
boundary that turns exceptions into a line on stderr and an exit code.

The commands live in qnnctl.commands, one module for each command or a few related ones, each
importing what it needs at its top. This group imports a command's module only when that command
runs (or when `--help` or completion lists them all), so that `qnnctl list` does not pay for
requests, ELF parsing and the doctor's checks: the one place where the command line is lazy.
"""

from __future__ import annotations

import gc
import importlib
import os
import re
import sys
from typing import NoReturn

import click
from click.shell_completion import FishComplete, add_completion_class

from qnnctl.commands.common import QUIET_HELP, VERBOSE_HELP, VerboseGroup
from qnnctl.commands.stderr import configure_logging, say_error, tell_failure
from qnnctl.errors import EXIT_USAGE
from qnnctl.version import __version__

# Each command: the module that defines it, and its name there.
COMMANDS = {
    "install": ("qnnctl.commands.install", "install"),
    "env": ("qnnctl.commands.env", "env"),
    "doctor": ("qnnctl.commands.doctor", "doctor"),
    "lower": ("qnnctl.commands.lower", "lower"),
    "use": ("qnnctl.commands.projects", "use"),
    "lock": ("qnnctl.commands.projects", "lock"),
    "link": ("qnnctl.commands.projects", "link"),
    "mirror": ("qnnctl.commands.projects", "mirror"),
    "list": ("qnnctl.commands.env", "list_"),
    "which": ("qnnctl.commands.which", "which"),
    "uninstall": ("qnnctl.commands.housekeeping", "uninstall"),
    "cache": ("qnnctl.commands.housekeeping", "cache"),
    "inspect": ("qnnctl.commands.inspect", "inspect"),
    "device": ("qnnctl.commands.device", "device"),
}

# The main --help: the commands in groups, and examples.
_SECTIONS = (
    ("Start here", ("install", "env", "doctor", "lower")),
    ("Projects and fleets", ("use", "lock", "link", "mirror")),
    ("Housekeeping", ("list", "which", "uninstall", "cache")),
    ("Models and phones", ("inspect", "device")),
)
_EXAMPLES = """\b
Examples:
  qnnctl install                 the SDK this project needs, into qnnctl's cache
  eval "$(qnnctl env)"           set this shell up for it
  qnnctl doctor                  check the host, the SDK and this shell
  qnnctl lower export_model.py   run a lowering pipeline with the SDK in place
  qnnctl install 2.51            the newest 2.51 installed, on the mirror, or known
  qnnctl use 2.51                pin this project to the newest 2.51 (.qnn-version)

\b
Behind a firewall: export QNNCTL_MIRROR=URL (a folder `qnnctl mirror` filled),
or `qnnctl install --file ARCHIVE`. `qnnctl COMMAND --help` tells more.
"""


class _Interrupted(Exception):
    """Ctrl-C while a command ran."""


class _Group(VerboseGroup):
    """qnnctl's top group: its commands loaded from COMMANDS on first use, its --help in sections."""

    group_class = VerboseGroup  # a subgroup lists its own commands, as click does

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, name = COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(module), name), cmd_name)
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                          list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:
            # click suggests among the commands loaded so far; every command is a candidate.
            raise click.exceptions.NoSuchCommand(exc.command_name, possibilities=COMMANDS, ctx=ctx) from None

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            # Past click, which would write a blank line to stderr first (piped too): said once, below.
            raise _Interrupted from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """qnnctl's own commands in groups, the four a newcomer needs first."""
        commands = {name: cmd for name in self.list_commands(ctx)
                    if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden}
        rest = tuple(name for name in commands if not any(name in names for _, names in _SECTIONS))
        limit = formatter.width - 6 - max(map(len, commands), default=0)
        for title, names in (*_SECTIONS, ("Other commands", rest)):
            rows = [(name, commands[name].get_short_help_str(limit)) for name in names if name in commands]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, epilog=_EXAMPLES)
@click.option("-v", "--verbose", count=True, help=VERBOSE_HELP + " Also after the command.")
@click.option("-q", "--quiet", count=True, help=QUIET_HELP + " Also after the command.")
@click.version_option(__version__, "-V", "--version", prog_name="qnnctl")
def cli(verbose: int, quiet: int) -> None:
    """Find, install and use the Qualcomm AI Runtime (QNN) SDK."""
    configure_logging(verbose, quiet)


def _click_error(exc: click.ClickException) -> tuple[str, str | None]:
    """click's own errors (`No such command 'instal'.`) as qnnctl's: a message, and a hint with
    click's suggestion, the usage and where the help is."""
    message = exc.format_message().strip()
    suggestion = ""
    found = re.search(r"\s*\(?(Did you mean [^()]*?)\)?$", message)
    if found:
        message = message[:found.start()]
        suggestion = found.group(1)[0].lower() + found.group(1)[1:] + " "
    # click lists its close matches in alphabetical order; difflib ranked them, closest first.
    ranked = getattr(exc, "possibilities", None)
    if found and ranked:
        more = f" (or {', '.join(map(repr, ranked[1:]))})" if ranked[1:] else ""
        suggestion = f"did you mean {ranked[0]!r}{more}? "
    message = message.removesuffix(".")
    if message[:1].isupper() and not message[1:2].isupper():
        message = message[0].lower() + message[1:]
    ctx = getattr(exc, "ctx", None)
    if not isinstance(ctx, click.Context):
        return message, suggestion.strip() or None
    usage = ctx.get_usage().removeprefix("Usage: ")
    return message, f"{suggestion}usage: {usage}; `{ctx.command_path} --help` says more"


def _fix_fish_completion() -> None:
    """Have fish split each completion at its first comma only.

    click's fish script splits "plain,doctor<TAB>Check host, SDK and environment; ..." at every
    comma, which cuts descriptions (and file names) at their first one.
    """
    class Fish(FishComplete):
        source_template = FishComplete.source_template.replace(
            'string split "," $completion', 'string split -m 1 "," -- $completion')

    add_completion_class(Fish)


def main(argv: list[str] | None = None) -> NoReturn:
    """The entry point and the one error boundary: exceptions become a line and an exit code."""
    try:
        _run(argv)
    finally:
        # The process ends here: spare the collector its last pass over every object the
        # imports made (20-30 ms after an install); the memory goes back to the system anyway.
        gc.freeze()


def _run(argv: list[str] | None) -> NoReturn:
    if "_QNNCTL_COMPLETE" in os.environ:
        _fix_fish_completion()
    try:
        code = cli.main(args=argv, prog_name="qnnctl", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        # Bare `qnnctl` (or `qnnctl device`): the help asked for, not an error.
        click.echo(exc.ctx.get_help())
        sys.exit(0)
    except click.ClickException as exc:
        say_error(*_click_error(exc))
        sys.exit(exc.exit_code if exc.exit_code else EXIT_USAGE)
    except (click.exceptions.Abort, _Interrupted):
        sys.exit(tell_failure(KeyboardInterrupt()))
    except (Exception, KeyboardInterrupt) as exc:
        sys.exit(tell_failure(exc))
    sys.exit(code if isinstance(code, int) else 0)
