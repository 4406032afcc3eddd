"""`qnnctl lower`: run a lowering pipeline in a fresh process that starts with the SDK in place.

The dynamic loader reads LD_LIBRARY_PATH once, when a process starts, so the pipeline is
exec'd with its environment already built rather than set up from inside. Everything that
can fail (resolving and installing the SDK, choosing the interpreter, the loader decision)
happens here, before the exec, so no model has been traced when it does.

The AMD MKLDNN guard decided here reaches every Python process of the pipeline through
qnnctl's own sitecustomize (`_site/` first on PYTHONPATH, see `_site/sitecustomize.py`);
the pipeline itself is exec'd as it is. An interpreter that skips PYTHONPATH or site (-I,
-E, -S) is started through bootstrap.py instead, run by path, which guards that process.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from qnnctl.errors import QnnctlError, UsageError
from qnnctl.host.needs import glibc_shortfall
from qnnctl.host.staged import GLIBC, LOADER_GUARD, current, loader_library_path
from qnnctl.host.staged import staged_loader as find_staged
from qnnctl.records import TYPE_CHECKING, Record
from qnnctl.run.api import amd_guard_needed
from qnnctl.run.bootstrap import GUARD_VARIABLE, SITE_FOLDER
from qnnctl.run.environment import ensure_loadable, hold_runtime_to_lock, resolve_and_hold, resolve_for_dry_run
from qnnctl.run.envplan import environment_for
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.layout import Sdk
from qnnctl.sdk.select import BY_ENV
from qnnctl.shell.exports import EnvValues, apply
from qnnctl.shell.render import render

if TYPE_CHECKING:
    from typing import NoReturn

log = logging.getLogger("qnnctl.run.lower")

SCRIPT = "script"
MODULE = "module"
COMMAND = "command"

# python, python3, python3.11, python3.13t (free-threaded)
_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)*t?)?")
# Interpreter options that may stand before the bootstrap unchanged. -i (interactive), -x
# (skip the first line: it would skip the bootstrap's) and the ones that only print are not
# here: such a command runs as it is, without the bootstrap.
_PYTHON_FLAGS = frozenset("bBdEIOPqsSuvR")
_PYTHON_VALUED = frozenset("WX")
# Options with which an interpreter never imports qnnctl's sitecustomize: -I and -E ignore
# PYTHONPATH, -S imports no site at all.
_SKIPS_SITE = "IES"


class CommandNotRunError(QnnctlError):
    """The pipeline's command could not be started; exit codes as env(1) and the shells use."""

    def __init__(self, command: str, reason: str, exit_code: int) -> None:
        self.command = command
        self.exit_code = exit_code
        hint = "check the command name and PATH" if exit_code == 127 else None
        super().__init__(f"cannot run {command}: {reason}", hint=hint)


class Target(Record):
    """What to run: a script, a module, or a command, with its arguments."""

    kind: str
    name: str
    args: tuple[str, ...] = ()


class LowerOptions(Record):
    spec: str | None = None  # --sdk VERSION|PATH
    python: str | None = None  # --python PATH
    install: bool = True  # False with --no-install
    keep_mkldnn: bool = False
    dry_run: bool = False  # decide everything, download and install nothing


class LowerPlan(Record):
    """The exec to perform: the command, and the environment it starts with."""

    argv: list[str]
    changes: EnvValues  # every variable the child gets differently from the caller
    environ: dict[str, str]  # the child's whole environment
    sdk: Sdk | None  # None when the caller manages the SDK (QNN_SDK_ROOT exported but empty)
    notes: tuple[str, ...] = ()  # what a dry run left undone (an SDK to install, and from where)
    # The descriptor of the SDK's hold (qnnctl.sdk.holds), which the pipeline inherits: the SDK is
    # neither removed nor replaced while the pipeline (or a child that shares it) runs.
    hold: int | None = None


def parse_target(tokens: Sequence[str]) -> Target:
    """`SCRIPT [ARGS]`, `-m MODULE [ARGS]` or `-- COMMAND [ARGS]`, as given after the options."""
    if tokens and tokens[0] == "--":
        if len(tokens) < 2:
            raise UsageError("nothing to run after `--`", hint="give a command: `qnnctl lower -- COMMAND [ARGS]...`")
        return Target(COMMAND, tokens[1], tuple(tokens[2:]))
    if tokens and tokens[0].startswith("-m"):
        if tokens[0] != "-m":
            return Target(MODULE, tokens[0][2:], tuple(tokens[1:]))
        if len(tokens) < 2:
            raise UsageError("-m needs a module name", hint="`qnnctl lower -m MODULE [ARGS]...`")
        return Target(MODULE, tokens[1], tuple(tokens[2:]))
    if not tokens:
        raise UsageError(
            "nothing to run",
            hint="give a script, a module or a command: `qnnctl lower SCRIPT.py`, "
            "`qnnctl lower -m MODULE` or `qnnctl lower -- COMMAND`",
        )
    return Target(SCRIPT, tokens[0], tuple(tokens[1:]))


def bootstrap_path() -> str:
    """bootstrap.py, which the pipeline's interpreter runs by path (it may lack qnnctl)."""
    return str(Path(__file__).resolve().with_name("bootstrap.py"))


def site_folder() -> str:
    """The folder of qnnctl's sitecustomize, which carries the guard into every Python process."""
    return str(Path(__file__).resolve().with_name(SITE_FOLDER))


def choose_python(explicit: str | None, environ: Mapping[str, str]) -> str:
    """The pipeline's interpreter: --python; else the active virtualenv's; else python3 on PATH; else ours."""
    search = environ.get("PATH", os.defpath)
    if explicit is not None:
        found = explicit if os.sep in explicit else shutil.which(explicit, path=search)
        if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
            raise UsageError(f"--python {explicit}: no such interpreter", hint="give the path of a python executable")
        return os.path.abspath(found)
    venv = environ.get("VIRTUAL_ENV")
    if venv:
        candidate = os.path.join(venv, "bin", "python")
        if os.access(candidate, os.X_OK):
            return candidate
        log.debug("VIRTUAL_ENV=%s has no bin/python; looking on PATH", venv)
    found = shutil.which("python3", path=search)
    if found:
        return os.path.abspath(found)
    return sys.executable


def python_invocation(argv: Sequence[str], bootstrap: str) -> list[str] | None:
    """`argv` rewritten to start through the bootstrap, when argv[0] is a Python interpreter.

    The interpreter's own options stay in front; `-c CODE`, `-m MODULE` and `SCRIPT` become
    the bootstrap's modes. None for anything else (another program, stdin, the REPL, options
    the bootstrap cannot stand behind): that command runs as it is.
    """
    if not argv or not _PYTHON_NAME.fullmatch(os.path.basename(argv[0])):
        return None
    options: list[str] = []
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--check-hash-based-pycs" and i + 1 < len(argv):
            options += argv[i : i + 2]
            i += 2
            continue
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-" or arg.startswith("--"):
            break
        j = 1
        while j < len(arg):
            letter = arg[j]
            if letter in "cm":
                inline = arg[j + 1 :]
                if not inline and i + 1 >= len(argv):
                    return None
                value = inline or argv[i + 1]
                rest = argv[i + 1 :] if inline else argv[i + 2 :]
                flags = [arg[:j]] if j > 1 else []
                mode = "code" if letter == "c" else "module"
                return [argv[0], *options, *flags, bootstrap, mode, value, *rest]
            if letter in _PYTHON_VALUED:
                if j + 1 == len(arg):  # the value is the next argument
                    if i + 1 >= len(argv):
                        return None
                    options += [arg, argv[i + 1]]
                    i += 1
                else:
                    options.append(arg)
                break
            if letter not in _PYTHON_FLAGS:
                return None
            j += 1
        else:
            options.append(arg)
        i += 1
    if i >= len(argv) or argv[i] == "-" or argv[i].startswith("--"):
        return None  # the REPL, stdin, or a long option we do not know
    return [argv[0], *options, bootstrap, "script", argv[i], *argv[i + 1 :]]


# -- the staged loader ------------------------------------------------------------------


class StagedLoader(Record):
    """A newer glibc's loader and the folders it should search first."""

    loader: Path
    library_path: tuple[str, ...]


def staged_loader(sdk: Sdk, cache: Cache) -> StagedLoader | None:
    """The staged loader to start the pipeline under, or None to use the host's own.

    A loader is due only when the SDK's libraries need a newer glibc than the host has and a
    runtime with one is staged in the cache (`qnnctl install --runtime --runtime-from GLIBC`).
    """
    shortfall = glibc_shortfall(sdk)
    if shortfall is None:
        return None
    found = find_staged(cache)
    staged = current(cache, GLIBC) if found is not None else None
    provided = staged.glibc_version if staged is not None else None
    if found is None or provided is None or provided < shortfall[0]:
        # A glibc staged for an earlier SDK may be too old for this one: it would not help.
        have = "none is staged" if provided is None else f"the staged one is {'.'.join(map(str, provided))}"
        log.warning("the SDK needs glibc %s or newer, and %s; stage one with "
                    "`qnnctl install --runtime --runtime-from GLIBC.deb|GLIBC.rpm`",
                    ".".join(map(str, shortfall[0])), have)
        return None
    loader, glibc_lib = found
    return StagedLoader(loader, tuple(loader_library_path(cache, sdk, glibc_lib)))


def script_interpreter(program: str, environ: Mapping[str, str]) -> list[str]:
    """The `#!` line of a script, as the kernel would run it; [] for anything else.

    ld.so starts ELF programs only, so a script (a console script such as torchrun, a shell
    script) is started as its interpreter with the script's path. `#!/usr/bin/env NAME` is
    resolved here: env would exec NAME on the host's loader, not the staged one.
    """
    try:
        with open(program, "rb") as handle:
            head = handle.read(256)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", "surrogateescape").strip()
    # As the kernel does: the interpreter, then the rest of the line as one argument.
    interpreter, _, argument = line.partition(" ")
    argument = argument.strip()
    if os.path.basename(interpreter) == "env" and argument and " " not in argument and not argument.startswith("-"):
        found = shutil.which(argument, path=environ.get("PATH", os.defpath))
        if found is not None:
            return [found]
    return [interpreter, argument] if argument else [interpreter]


def under_loader(
    argv: list[str], environ: dict[str, str], loader: StagedLoader | None
) -> tuple[list[str], dict[str, str]]:
    """`argv` started as `<ld.so> --library-path DIRS <program> ARGS...`, at most once.

    The guard variable is set in the child; a child that carries it (a pipeline that runs
    `qnnctl lower` again) is never wrapped a second time.
    """
    if loader is None or environ.get(LOADER_GUARD):
        return argv, environ
    # ld.so does not search PATH: the program must be a path.
    program = shutil.which(argv[0], path=environ.get("PATH", os.defpath)) if os.sep not in argv[0] else argv[0]
    if program is None:
        raise CommandNotRunError(argv[0], "not found", 127)
    program = os.path.abspath(program)
    # ld.so ignores LD_LIBRARY_PATH when --library-path is given: carry the child's along.
    search = list(loader.library_path)
    search += [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d and d not in search]
    start = [*script_interpreter(program, environ), program]
    wrapped = [str(loader.loader), "--library-path", ":".join(search), *start, *argv[1:]]
    return wrapped, {**environ, LOADER_GUARD: str(loader.loader)}


# -- planning and running --------------------------------------------------------------


def reexec_command(
    cache: Cache, sdk: Sdk | None, argv: Sequence[str], environ: Mapping[str, str]
) -> tuple[list[str], dict[str, str]] | None:
    """The command and environment that run `argv` under the staged loader.

    None when no glibc is staged, or when `environ` says this process already runs under it
    (LOADER_GUARD): a re-exec happens at most once. The same wrapping as `qnnctl lower`'s.
    """
    if environ.get(LOADER_GUARD):
        return None
    staged = find_staged(cache)
    if staged is None:
        return None
    loader, glibc_lib = staged
    wrapped = StagedLoader(loader, tuple(loader_library_path(cache, sdk, glibc_lib)))
    return under_loader(list(argv), dict(environ), wrapped)


def plan_lower(
    target: Target,
    options: LowerOptions,
    environ: Mapping[str, str],
    cwd: Path,
    cache: Cache,
    terminal: bool = False,
) -> LowerPlan:
    """Everything decided before the exec: the SDK (installed if need be), the command, its environment."""
    if target.kind == COMMAND and options.python is not None:
        raise UsageError(
            "--python applies to SCRIPT.py and -m MODULE; after `--` the command names its own interpreter"
        )
    if target.kind == SCRIPT and not (cwd / target.name).exists():
        raise UsageError(f"no such script: {target.name}")
    notes: list[str] = []
    held: int | None = None
    if options.dry_run:
        selection, sdk, notes = resolve_for_dry_run(options.spec, environ, cwd, cache, options.install)
    else:
        selection, sdk, held = resolve_and_hold(options.spec, environ, cwd, cache, options.install, terminal)
        if sdk is not None and options.install:
            _ensure_trio(sdk, environ, cache, cwd)
        if sdk is not None:
            hold_runtime_to_lock(sdk, cache, cwd)
    changes: EnvValues = {}
    if sdk is None:
        log.info("QNN_SDK_ROOT is exported but empty: the caller manages the SDK; "
                 "the pipeline runs with the environment as it is")
    else:
        changes.update(environment_for(sdk, environ, cache, owns_root=selection.reason != BY_ENV))
        log.debug("SDK %s at %s (%s)", sdk.version, sdk.root, selection.detail)

    if target.kind == COMMAND:
        argv = [target.name, *target.args]
    else:
        python = choose_python(options.python, environ)
        argv = [python, *([] if target.kind == SCRIPT else ["-m"]), target.name, *target.args]
    argv, guard_changes = guard_plan(argv, _guard_wanted(options, environ), environ)
    changes.update(guard_changes)

    child = apply(environ, changes)
    loader = staged_loader(sdk, cache) if sdk is not None else None
    argv, child = under_loader(argv, child, loader)
    if LOADER_GUARD in child and LOADER_GUARD not in environ:
        changes[LOADER_GUARD] = child[LOADER_GUARD]
    return LowerPlan(argv=argv, changes=changes, environ=child, sdk=sdk, notes=tuple(notes),
                     hold=held)


def _ensure_trio(sdk: Sdk, environ: Mapping[str, str], cache: Cache, cwd: Path) -> None:
    """Stage libc++ and friends when the SDK needs them and the host lacks them."""
    try:
        ensure_loadable(sdk, environ, cache, cwd)
    except QnnctlError as exc:
        # The pipeline may still manage (its own LD_LIBRARY_PATH); doctor explains the rest.
        log.warning("could not stage the host runtime: %s; if the SDK fails to load, run "
                    "`qnnctl doctor`", exc.message)


def guard_plan(argv: list[str], wanted: bool, environ: Mapping[str, str]) -> tuple[list[str], EnvValues]:
    """The command, and the environment changes, that carry the AMD MKLDNN guard into `argv` or keep it out.

    Wanted: qnnctl's sitecustomize folder goes first on PYTHONPATH, where every Python
    process of the pipeline finds it. An interpreter that would skip it (-I, -E, -S) is
    started through the bootstrap instead where it can be, and either way stderr says what
    is left unguarded. Not wanted: an entry inherited from an enclosing `qnnctl lower` is
    taken out. Entries of the caller's own keep their order.
    """
    current = environ.get("PYTHONPATH")
    entries = current.split(os.pathsep) if current else []
    kept = [entry for entry in entries if not _is_site_folder(entry)]
    changes: EnvValues = {}
    add_path = wanted
    skipped = _site_skipped(argv, environ) if wanted else None
    if skipped is not None:
        started = _guard_without_site(argv, *skipped)
        add_path = started is not None or skipped[0] != "S"
        if started is not None:
            argv = started
            changes[GUARD_VARIABLE] = "1"
    value = os.pathsep.join([site_folder(), *kept] if add_path else kept)
    if value != (current or ""):
        changes["PYTHONPATH"] = value or None
    return argv, changes


def _is_site_folder(entry: str) -> bool:
    """A PYTHONPATH entry of qnnctl's sitecustomize folder: this qnnctl's, or another install's."""
    if entry == site_folder():
        return True
    parent, name = os.path.split(os.path.normpath(entry))
    return (name == SITE_FOLDER and os.path.basename(parent) == "qnnctl"
            and os.path.isfile(os.path.join(entry, "sitecustomize.py")))


def python_options(argv: Sequence[str]) -> str | None:
    """The letters of the one-letter options before what a Python command runs; None when argv[0] is no Python."""
    if not argv or not _PYTHON_NAME.fullmatch(os.path.basename(argv[0])):
        return None
    letters = ""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--check-hash-based-pycs":
            i += 2
            continue
        if not arg.startswith("-") or arg == "-" or arg.startswith("--"):
            break
        for j, letter in enumerate(arg[1:], 1):
            if letter in "cm":
                return letters
            if letter in _PYTHON_VALUED:
                if j + 1 == len(arg):
                    i += 1  # the value is the next argument
                break
            letters += letter
        i += 1
    return letters


def _site_skipped(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[str, str | None] | None:
    """(the option, the #! line) when the Python that `argv` starts would skip qnnctl's sitecustomize.

    The #! line is None when argv[0] is the interpreter itself. None when the command is not
    Python at all: the guard then reaches the Python processes it starts.
    """
    letters = python_options(argv)
    shebang = None
    if letters is None:
        program = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=environ.get("PATH", os.defpath))
        interpreter = script_interpreter(program, environ) if program else []
        letters = python_options([interpreter[0], *" ".join(interpreter[1:]).split()]) if interpreter else None
        if letters is None:
            log.debug("%s is not a Python program: the AMD MKLDNN guard reaches the Python processes "
                      "it starts, through PYTHONPATH", argv[0])
            return None
        shebang = " ".join(interpreter)
    option = next((letter for letter in _SKIPS_SITE if letter in letters), None)
    return None if option is None else (option, shebang)


def _guard_without_site(argv: list[str], option: str, shebang: str | None) -> list[str] | None:
    """`argv` started through the bootstrap, for an interpreter that skips the sitecustomize.

    None when it cannot be: a #! line, or options the bootstrap cannot stand behind. Either
    way stderr says what stays unguarded. PYTHONPATH still reaches the Python processes it
    starts without the option, except under -S, where the interpreter itself would keep
    qnnctl's folder on sys.path with no sitecustomize to take it off (the bootstrap does).
    """
    skips = "ignores PYTHONPATH" if option in "IE" else "imports no site module"
    started = python_invocation(argv, bootstrap_path()) if shebang is None else None
    if started is not None:
        log.warning("`%s -%s` %s: the AMD MKLDNN guard covers this process, through qnnctl's bootstrap, "
                    "but not the Python processes it starts with -%s (its multiprocessing workers, for one)",
                    os.path.basename(argv[0]), option, skips, option)
        return started
    if shebang is None:
        log.warning("the AMD MKLDNN guard cannot reach `%s -%s ...`: it %s, and qnnctl's bootstrap "
                    "cannot stand before these options; MKLDNN stays on there (drop -%s, or pass "
                    "--keep-mkldnn if that is intended)", os.path.basename(argv[0]), option, skips, option)
    else:
        interpreter = shebang.split()[0]
        log.warning("the AMD MKLDNN guard cannot reach %s: its #! line runs `%s`, which %s; MKLDNN "
                    "stays on there (`qnnctl lower --python %s %s` runs it guarded)",
                    argv[0], shebang, skips, interpreter, argv[0])
    return None


def _guard_wanted(options: LowerOptions, environ: Mapping[str, str]) -> bool:
    if options.keep_mkldnn:
        return False
    return amd_guard_needed(environ)


def render_plan(plan: LowerPlan) -> str:
    """The plan as sh: the exports, then the command. `sh -c "$(qnnctl lower --dry-run ...)"` runs it."""
    # Every line a comment, whatever a note holds: the plan is meant for `sh -c "$(...)"`.
    notes = "".join(f"# {line}\n" for note in plan.notes for line in note.splitlines() or [""])
    return notes + render(plan.changes, "sh") + shlex.join(plan.argv) + "\n"


def exec_plan(plan: LowerPlan) -> NoReturn:
    """Replace this process with the pipeline. Returns only by raising, when it cannot start."""
    sys.stdout.flush()
    sys.stderr.flush()
    # Python ignores these two at startup, and an ignored signal stays ignored across exec:
    # give the pipeline the defaults it would have had (subprocess' restore_signals does the same).
    ignored = [getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name)]
    saved = {signum: signal.signal(signum, signal.SIG_DFL) for signum in ignored}
    if plan.hold is not None:
        os.set_inheritable(plan.hold, True)  # the hold lives as long as the pipeline's process
    try:
        os.execvpe(plan.argv[0], plan.argv, plan.environ)  # noqa: S606 - replacing this process is the point
    except OSError as exc:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        if isinstance(exc, FileNotFoundError):
            raise CommandNotRunError(plan.argv[0], "not found", 127) from exc
        raise CommandNotRunError(plan.argv[0], exc.strerror or str(exc), 126) from exc
