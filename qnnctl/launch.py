"""The `qnnctl` command's entry point: `env` and `lower` answered lean, everything else by qnnctl.cli.

`eval "$(qnnctl env)"` runs in every shell's start-up file: its usual case is answered by
qnnctl.commands.leanenv, which imports the SDK model and the shell package alone. `qnnctl lower`
is paid for on every run of a pipeline: its usual command line is parsed by
qnnctl.commands.leanlower, without click. Anything else (another command, an `env` or `lower`
the lean paths leave) goes to the full command line; `--version` is answered here, as the full
command line would answer it.
Here start-up time decides which path a command takes, so this module imports each path only
when it is taken, and the rest of qnnctl imports at the top of each module.
"""

from __future__ import annotations

import os
import sys

from qnnctl.errors import EXIT_INTERRUPTED, INTERRUPTED
from qnnctl.version import __version__


def main() -> None:
    """`qnnctl ...`: the lean `env`, else the full command line. A Ctrl-C while either is still being
    imported (each says so itself once it runs) is said as they say it, not with a traceback."""
    try:
        _main()
    except KeyboardInterrupt:
        if sys.stderr is not None:
            sys.stderr.write(f"qnnctl: {INTERRUPTED}\n")
        sys.exit(EXIT_INTERRUPTED)


def _main() -> None:
    if sys.argv[1:] in (["--version"], ["-V"]) and sys.stdout is not None:
        # What click's version option prints, without loading click and the SDK model to say it.
        sys.stdout.write(f"qnnctl, version {__version__}\n")
        return
    if sys.argv[1:2] == ["env"]:
        # lazy: the lean `env` path, which no other command needs
        from qnnctl.commands.leanenv import lean_env

        try:
            text = lean_env(sys.argv[2:], os.environ)
            if text is not None and sys.stdout is not None:
                sys.stdout.write(text)
                sys.stdout.flush()
                return
        except (OSError, UnicodeError):
            pass  # stdout cannot take the text: the full command line says so, as it does
    if sys.argv[1:2] == ["lower"]:
        # lazy: the lean `lower` path, which no other command needs; it returns only to leave the
        # command line to the full one
        from qnnctl.commands.leanlower import lean_lower

        lean_lower(sys.argv[2:], os.environ)
    # lazy: click, rich, requests and every command, which the lean paths above never need
    from qnnctl.cli import main as full_command_line

    full_command_line()
