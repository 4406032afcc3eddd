"""The `qnnctl` command's entry point: `qnnctl env` answered lean, everything else by qnnctl.cli.

`eval "$(qnnctl env)"` runs in every shell's start-up file, so its usual case (an installed
SDK, chosen by the pin, the shell or the cache) is answered here from qnnctl.run.envplan and
the SDK model alone: no click, rich or requests, none of the commands. Whatever this path does
not handle (another command, an option it does not know, --help, -v, an error to report, a
warning to give) goes to the full command line, which answers it as if this path were not
there. Here start-up time decides which path a command takes; the rest of qnnctl imports
at the top of each module.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from qnnctl.errors import EXIT_INTERRUPTED, INTERRUPTED
from qnnctl.run.envplan import plan_env
from qnnctl.sdk.cache import Cache, relative_cache_dir
from qnnctl.sdk.stores import STORES_VARIABLE
from qnnctl.shell.detect import detect_shell
from qnnctl.shell.render import SHELLS, render

# What makes the full command line answer `env`: a debug trace asked for, completion, and
# shared stores, whose checks may warn (the full command line's logging says it). A relative
# cache folder is the full command line's too, for the same reason.
_FULL_CLI_WHEN_SET = ("QNNCTL_DEBUG", "_QNNCTL_COMPLETE", STORES_VARIABLE)


class _NotHere(Exception):
    """An `env` command line the lean path leaves to the full command line."""


def _env_arguments(args: list[str]) -> tuple[str | None, str | None, bool]:
    """(VERSION, --shell, --unset) of `qnnctl env ARGS`, or _NotHere for anything else."""
    version: str | None = None
    shell: str | None = None
    unset = False
    rest = iter(args)
    for arg in rest:
        if arg == "--unset":
            unset = True
        elif arg == "--shell":
            shell = next(rest, None)
            if shell is None:
                raise _NotHere
        elif arg.startswith("--shell="):
            shell = arg.partition("=")[2]
        elif not arg.startswith("-") and arg and version is None:
            version = arg
        else:
            raise _NotHere
    if (shell is not None and shell not in SHELLS) or (unset and version is not None):
        raise _NotHere
    return version, shell, unset


def lean_env(args: list[str], environ: Mapping[str, str]) -> str | None:
    """What `qnnctl env ARGS` prints, when the lean path can answer it all; None otherwise."""
    if any(environ.get(name) for name in _FULL_CLI_WHEN_SET):
        return None
    if relative_cache_dir(environ) is not None:
        return None
    try:
        version, shell, unset = _env_arguments(args)
        plan = plan_env(version, environ, Path.cwd(), Cache.from_env(environ), unset=unset)
        if plan.notes or (plan.selection is not None and plan.selection.caller_managed and not plan.values):
            return None  # something to say on stderr: the full command line's logging says it
        return render(plan.values, shell or detect_shell(environ, os.getppid()))
    except Exception:
        return None  # the full command line reports it, with its hint and exit code


def main() -> None:
    """`qnnctl ...`: the lean `env`, else the full command line."""
    if sys.argv[1:2] == ["env"]:
        try:
            text = lean_env(sys.argv[2:], os.environ)
            if text is not None and sys.stdout is not None:
                sys.stdout.write(text)
                sys.stdout.flush()
                return
        except KeyboardInterrupt:
            sys.stderr.write(f"qnnctl: {INTERRUPTED}\n")
            sys.exit(EXIT_INTERRUPTED)
        except (OSError, UnicodeError):
            pass  # stdout cannot take the text: the full command line says so, as it does
    # lazy: click, rich, requests and every command, which the lean `env` above never needs
    from qnnctl.cli import main as full_command_line

    full_command_line()
