"""Which shell runs qnnctl: its parent process (through launchers such as timeout or uv), else $SHELL."""

from __future__ import annotations

import os
from collections.abc import Mapping

# Process names (as /proc shows them) of the shells whose syntax qnnctl writes. csh and tcsh
# get sh syntax, as a $SHELL naming them always has: qnnctl has none of their own.
_SHELL_NAMES = {
    "bash": "bash", "zsh": "zsh", "fish": "fish", "sh": "sh", "dash": "sh", "ash": "sh",
    "ksh": "sh", "mksh": "sh", "pdksh": "sh", "yash": "sh", "posh": "sh", "csh": "sh", "tcsh": "sh",
    "pwsh": "powershell", "powershell": "powershell", "nu": "nu", "nushell": "nu",
}


# Programs that start a command as their child and wait for it: in `eval "$(timeout 9 qnnctl
# env)"` the shell is the launcher's parent. (Launchers that exec, such as env or nice, leave
# no process of their own behind.)
_LAUNCHERS = frozenset({
    "timeout", "time", "sudo", "doas", "flock", "setsid", "strace", "ltrace",
    "uv", "uvx", "pipx", "poetry", "pdm", "hatch", "rye", "pixi", "conda", "mamba", "micromamba",
})


_MAX_HOPS = 4


def _shell_name(name: str) -> str | None:
    """One of SHELLS for a program name such as `bash`, `-zsh`, `ksh93` or `/usr/bin/fish`."""
    base = name.rstrip("/").rsplit("/", 1)[-1].lstrip("-")
    return _SHELL_NAMES.get(base) or _SHELL_NAMES.get(base.rstrip("0123456789.-"))


def _process_names(pid: int) -> list[str]:
    """The names process `pid` goes by: its `comm`, then its executable's file name."""
    names = []
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            names.append(handle.read().strip())
    except OSError:
        pass
    try:
        # A shell upgraded while it runs reads "/usr/bin/bash (deleted)".
        names.append(os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)"))
    except OSError:
        pass  # another user's process, or no /proc
    return [name for name in names if name]


def _parent_pid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            # The second field, the name, may hold spaces and parentheses: read after the last ")".
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def process_shell(pid: int) -> str | None:
    """The shell syntax for process `pid` when it is a shell, looking through launchers.

    In `eval "$(qnnctl env)"` qnnctl's parent is the subshell that runs the command
    substitution, a fork of the shell that will eval the output (or that shell itself, when it
    execs its last command), so it bears that shell's name. None when `pid` is no shell that
    can be told (a Python program, a terminal, no /proc).
    """
    for _ in range(_MAX_HOPS):
        # 0: no parent known. PID 1 is looked at: in a container it is often the shell itself
        # (`docker run IMAGE bash -c 'eval "$(qnnctl env)"'`); on a host, init is no shell.
        if pid <= 0:
            return None
        names = _process_names(pid)
        for name in names:
            shell = _shell_name(name)
            if shell is not None:
                return shell
        if not any(name.rsplit("/", 1)[-1] in _LAUNCHERS for name in names):
            return None
        pid = _parent_pid(pid)
    return None


def detect_shell(environ: Mapping[str, str], parent: int | None = None) -> str:
    """The syntax for the shell that will read the output, as one of SHELLS.

    The shell that runs qnnctl (process `parent`, when given) comes first: `$SHELL` is the
    login shell, and `bash -c 'eval "$(qnnctl env)"'` typed in fish must get bash syntax.
    Then the shell `$SHELL` names; then sh, whose syntax every POSIX shell reads.
    """
    if parent is not None:
        found = process_shell(parent)
        if found is not None:
            return found
    return _shell_name(environ.get("SHELL", "")) or "sh"
