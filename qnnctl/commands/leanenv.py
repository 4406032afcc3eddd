"""`qnnctl env` answered lean: its usual case from qnnctl.run.envplan and the SDK model alone.

`eval "$(qnnctl env)"` runs in every shell's start-up file, so its usual case (an installed
SDK, chosen by the pin, the shell or the cache) is answered here without click, rich, requests,
qnnctl.net or the command table. Whatever this path does not handle (an option it does not
know, --help, -v, an error to report, a warning to give) is left to the full command line,
which answers it as if this path were not there. qnnctl.launch decides which path runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

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
