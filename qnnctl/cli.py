"""The command line: parse, call one core function, map errors to exit codes.

stdout carries only what scripts consume (paths, exports, JSON); everything for people
goes to stderr through logging.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

import click
from click.shell_completion import CompletionItem, FishComplete, add_completion_class

from qnnctl import __version__
from qnnctl.device.commands import SCHEMA, device_dest, list_devices, run
from qnnctl.device.commands import push as do_push
from qnnctl.device.plan import device_environment, render_device_env
from qnnctl.device.plan import render_plan as render_push_plan
from qnnctl.doctor.diagnose import diagnose
from qnnctl.doctor.report import exit_code, render_json, render_table, render_text
from qnnctl.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    INTERRUPTED,
    NotInstalledError,
    QnnctlError,
    UsageError,
)
from qnnctl.fleet.locking import check_lock, make_lock, pinned_notes
from qnnctl.fleet.mirror import make_mirror
from qnnctl.host.runtime import RuntimeRequest, check_sources, stage_runtime
from qnnctl.install.pipeline import InstallRequest
from qnnctl.install.pipeline import install as do_install
from qnnctl.install.prune import clean_cache, mib, prune
from qnnctl.install.prune import uninstall as do_uninstall
from qnnctl.net.urls import redact_text
from qnnctl.run.environment import ensure_loadable
from qnnctl.run.envplan import plan_env
from qnnctl.run.inspect import inspect_file
from qnnctl.run.inspect import render as render_inspection
from qnnctl.run.lower import LowerOptions, exec_plan, parse_target, plan_lower, render_plan
from qnnctl.run.which import which as find
from qnnctl.sdk.cache import Cache, relative_cache_dir
from qnnctl.sdk.components import complete, parse_components
from qnnctl.sdk.holds import HeldError, wait_for_holders
from qnnctl.sdk.listing import installed_sdks, selected_here
from qnnctl.sdk.listing import render_table as render_sdk_table
from qnnctl.sdk.pin import write_pin
from qnnctl.sdk.select import find_pin, pin_conflict, select_sdk, version_pools
from qnnctl.sdk.stores import link_sdk
from qnnctl.sdk.versions import KNOWN_VERSIONS
from qnnctl.shell.detect import detect_shell
from qnnctl.shell.exports import check_cache_path
from qnnctl.shell.render import SHELLS, render
from qnnctl.words import columns, plural


class _Logger:
    """The "qnnctl" logger, set up on first use with this invocation's -v/-q (or without them,
    for what is said before the command line is parsed)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_setup_logging(), name)


log = _Logger()
# This invocation's -v/-q, until the logger is set up with them.
_pending_verbosity: dict[str, int] = {}
# This invocation's -v and -q so far, given before the command's name and after it.
_verbosity = {"verbose": 0, "quiet": 0}


def _configure_logging(verbose: int, quiet: int, more: bool = False) -> None:
    """Take this invocation's -v/-q (`more`: some more, given after a command's name)."""
    if not more:
        _verbosity.update(verbose=0, quiet=0)
    _verbosity["verbose"] += verbose
    _verbosity["quiet"] += quiet
    _pending_verbosity.update(_verbosity)
    _setup_logging()


def _setup_logging() -> logging.Logger:
    """The "qnnctl" logger, with a stderr handler for this invocation's -v/-q in place."""
    root = logging.getLogger("qnnctl")
    if not _pending_verbosity:
        return root

    class StderrFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            message = record.getMessage()
            if record.levelno >= logging.ERROR:
                return f"{_label('error')} {message}"
            if record.levelno >= logging.WARNING:
                return f"{_label('warning')} {message}"
            return f"qnnctl: {message}"

    level = logging.INFO - 10 * _pending_verbosity["verbose"] + 10 * _pending_verbosity["quiet"]
    _pending_verbosity.clear()
    if os.environ.get("QNNCTL_DEBUG"):
        level = logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(StderrFormatter())
    root.handlers[:] = [handler]
    # -v is debug and -qq errors only; more of either changes nothing more.
    root.setLevel(max(logging.DEBUG, min(level, logging.ERROR)))
    root.propagate = False
    return root


# The word of each label on stderr, in colour on a terminal (ANSI SGR): as doctor's table.
_LABEL_COLOURS = {"error": "1;31", "unexpected error": "1;31", "warning": "33", "hint": "36"}


def _colour_on_stderr() -> bool:
    """Colour only on a terminal, and never with NO_COLOR set to anything (no-color.org)."""
    return not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb" and sys.stderr.isatty()


def _label(kind: str) -> str:
    """`qnnctl: error:` and its kin, the one style of every error, warning and hint on stderr."""
    if not _colour_on_stderr():
        return f"qnnctl: {kind}:"
    return f"qnnctl: \x1b[{_LABEL_COLOURS[kind]}m{kind}:\x1b[0m"


def _error(message: str, hint: str | None = None, kind: str = "error") -> None:
    click.echo(f"{_label(kind)} {message}", err=True)
    if hint:
        click.echo(f"{_label('hint')} {hint}", err=True)


def _click_error(exc: click.ClickException) -> tuple[str, str | None]:
    """click's own errors (`No such command 'instal'.`) as qnnctl's: a message, and a hint with
    click's suggestion, the usage and where the help is."""
    message = exc.format_message().strip()
    suggestion = ""
    found = re.search(r"\s*\(?(Did you mean [^()]*?)\)?$", message)
    if found:
        message = message[:found.start()]
        suggestion = found.group(1)[0].lower() + found.group(1)[1:] + " "
    message = message.removesuffix(".")
    if message[:1].isupper() and not message[1:2].isupper():
        message = message[0].lower() + message[1:]
    ctx = getattr(exc, "ctx", None)
    if not isinstance(ctx, click.Context):
        return message, suggestion.strip() or None
    usage = ctx.get_usage().removeprefix("Usage: ")
    return message, f"{suggestion}usage: {usage}; `{ctx.command_path} --help` says more"


# A relative QNNCTL_CACHE_DIR is said once per run, however often the cache is asked for.
_said_relative_cache: list[str] = []


def _cache() -> Any:
    cache = Cache.from_env(os.environ)
    configured = relative_cache_dir(os.environ)
    if configured is not None and not _said_relative_cache:
        # Taken from the current folder (a CI job's `.cache/qnnctl` is one cache per checkout),
        # so that another folder finds another cache: said, not refused.
        _said_relative_cache.append(configured)
        log.warning("QNNCTL_CACHE_DIR=%s is relative: the cache is %s, taken from the current folder; run "
                    "from another folder, qnnctl would use another cache (an absolute path avoids that)",
                    configured, cache.root)
    return cache


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty() and bool(log.isEnabledFor(logging.INFO))


def complete_installed(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Installed SDK versions, for shell completion of VERSION arguments."""
    try:
        versions = _cache().installed_versions()
    except Exception:  # completion must never print a traceback into the user's shell
        return []
    return [v for v in versions if v.startswith(incomplete)]


def complete_known(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Installed versions first, then every known release."""
    installed = complete_installed(ctx, param, incomplete)
    return installed + [v for v in reversed(KNOWN_VERSIONS) if v.startswith(incomplete) and v not in installed]


def complete_pipeline(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """File names for SCRIPT.py and the pipeline's own arguments; nothing for `-m MODULE`."""
    words = ctx.params.get(param.name or "") or ()
    if words and words[-1] == "-m":
        return []
    # "file" has the shell itself complete file names (bash: compopt -o default).
    return [CompletionItem(incomplete, type="file")]


def _fix_fish_completion() -> None:
    """Have fish split each completion at its first comma only.

    click's fish script splits "plain,doctor<TAB>Check host, SDK and environment; ..." at every
    comma, which cuts descriptions (and file names) at their first one.
    """
    class Fish(FishComplete):
        source_template = FishComplete.source_template.replace(
            'string split "," $completion', 'string split -m 1 "," -- $completion')

    add_completion_class(Fish)


_VERBOSE_HELP = "Debug detail on stderr, and tracebacks of unexpected errors."
_QUIET_HELP = "Less on stderr: warnings and errors only (-qq: errors only)."


def _more_verbosity(ctx: click.Context, param: click.Parameter, value: int) -> None:
    if value and not ctx.resilient_parsing:
        _configure_logging(value if param.name == "verbose" else 0, value if param.name == "quiet" else 0,
                           more=True)


class _Group(click.Group):
    """A group whose commands take -v and -q after their name too: `qnnctl install -v`."""

    group_class = type  # subgroups (`qnnctl cache`) are of this class as well

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        for opts, help_text in ((("-v", "--verbose"), _VERBOSE_HELP), (("-q", "--quiet"), _QUIET_HELP)):
            cmd.params.append(click.Option(opts, count=True, expose_value=False, callback=_more_verbosity,
                                           help=help_text))
        super().add_command(cmd, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """qnnctl's own commands in groups, the four a newcomer needs first; a subgroup's as click lists them."""
        if ctx.parent is not None:
            super().format_commands(ctx, formatter)
            return
        commands = {name: cmd for name in self.list_commands(ctx)
                    if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden}
        rest = tuple(name for name in commands if not any(name in names for _, names in _SECTIONS))
        limit = formatter.width - 6 - max(map(len, commands), default=0)
        for title, names in (*_SECTIONS, ("Other commands", rest)):
            rows = [(name, commands[name].get_short_help_str(limit)) for name in names if name in commands]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


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


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, epilog=_EXAMPLES)
@click.option("-v", "--verbose", count=True, help=_VERBOSE_HELP + " Also after the command.")
@click.option("-q", "--quiet", count=True, help=_QUIET_HELP + " Also after the command.")
@click.version_option(__version__, "-V", "--version", prog_name="qnnctl")
def cli(verbose: int, quiet: int) -> None:
    """Find, install and use the Qualcomm AI Runtime (QNN) SDK."""
    _configure_logging(verbose, quiet)


def _complete_components(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    return list(complete(ctx, param, incomplete))


@cli.command(short_help="Install an SDK (or find one on disk); print its root.")
@click.argument("version", required=False, shell_complete=complete_known)
@click.option("--url", metavar="URL", help="Download the archive from this URL.")
@click.option("--file", "file", type=click.Path(path_type=Path), help="Install from an archive on disk.")
@click.option("--sha256", metavar="HEX", help="Expected sha256 of the archive.")
@click.option("--force", is_flag=True, help="Reinstall even if the SDK is already installed.")
@click.option("--wait", is_flag=True,
              help="Wait for the processes that use the SDK to end before replacing it, rather than fail.")
@click.option("--locked", is_flag=True, help="Fail unless the project's qnnctl.lock pins this SDK.")
@click.option("--components", metavar="LIST", shell_complete=_complete_components,
              help="Only these parts of the SDK, fetched by Range requests: host, android, hexagon-vNN, "
              "docs, or all (the default). Adds to an SDK installed with fewer.")
@click.option("--runtime", is_flag=True, help="Also stage the host libraries the SDK needs and the host lacks.")
@click.option("--runtime-from", "runtime_from", multiple=True, type=click.Path(path_type=Path),
              help="Stage them from this .deb, .rpm, .tar.xz or folder (repeatable; implies --runtime).")
def install(version: str | None, url: str | None, file: Path | None, sha256: str | None, force: bool,
            wait: bool, locked: bool, components: str | None, runtime: bool, runtime_from: tuple[Path, ...]) -> None:
    """Install an SDK (or find one already on disk); print its root on stdout.

    VERSION is a full version (2.37.0.250724) or a prefix of a known release (2.37). Without
    it: the SDK this shell was set up for by `qnnctl env`, else a non-empty QNN_SDK_ROOT, else
    a .qnn-version pin, else the version the installed ExecuTorch expects, else the newest SDK
    already installed, else the default. An exported but empty QNN_SDK_ROOT means the caller
    manages the SDK: nothing is installed. In a project with a qnnctl.lock, the archive (or the
    SDK found on disk) must match it (exit 4). An installed SDK that a running process uses is
    never replaced (exit 1, naming the process; --wait waits for it to end).
    """
    check_cache_path(str(_cache().root))
    parts = None
    if components is not None:
        parts = parse_components(components)
    sources: tuple[Path, ...] = ()
    if runtime_from:
        sources = check_sources(runtime_from)  # before a byte of the SDK is fetched
    request = InstallRequest(spec=version, url=url, file=file, sha256=sha256, force=force, locked=locked,
                             components=parts)
    wait_for_holders.set(wait)
    terminal = _stderr_is_terminal()
    result = do_install(request, _cache(), os.environ, Path.cwd(), terminal=terminal)
    if runtime or runtime_from:
        stage_runtime(_cache(), result.sdk, RuntimeRequest(sources=sources), os.environ)
    elif result.sdk is not None:
        _stage_missing_trio(result.sdk)
    if result.sdk is None:
        log.info("QNN_SDK_ROOT is exported but empty: the SDK is left to the caller; nothing to install")
        return
    if result.action == "reused":
        log.info("SDK %s %s", result.sdk.version, _found_where(result.sdk.origin))
    if terminal:
        _say_next_step(result.sdk)
    click.echo(str(result.sdk.root))


def _found_where(origin: str) -> str:
    """Where `install` found an SDK it did not have to install, from its Sdk.origin."""
    if origin == "qnnctl env":
        return "is the one this shell was set up for (`qnnctl env`): nothing to install"
    if origin == "QNN_SDK_ROOT":
        return "is the one QNN_SDK_ROOT names: nothing to install"
    places = {"qnnctl cache": "in qnnctl's cache", "ExecuTorch cache": "in ExecuTorch's cache",
              "link": "as a link (`qnnctl link`)"}
    where = places.get(origin, f"in {origin}" if origin.startswith("store ") else f"({origin})")
    return f"is already installed {where}"


def _say_next_step(sdk: Any) -> None:
    """For a person at a terminal: how to use the SDK just installed (scripts read stdout only)."""
    if os.environ.get("QNN_SDK_ROOT") == str(sdk.root):
        return  # this shell is set up for it already
    try:
        # `qnnctl env` chooses afresh: name the version when it would choose another SDK.
        chosen = select_sdk(None, os.environ, Path.cwd(), _cache(), from_shell=False)
    except QnnctlError:
        chosen = None
    plain = chosen is not None and (chosen.version == sdk.version or chosen.root == sdk.root)
    env = "qnnctl env" if plain else f"qnnctl env {sdk.version}"
    log.info('next: `eval "$(%s)"` sets this shell up for SDK %s; `qnnctl doctor` then checks the setup',
             env, sdk.version)


def _stage_missing_trio(sdk: Any) -> None:
    """An SDK whose libraries need libc++ the host lacks: stage it, or fail saying how to.

    Installed or found on disk alike: an SDK that cannot load here is no success, and a CI
    step that goes on would only fail later, further from the cause.
    """
    try:
        ensure_loadable(sdk, os.environ, _cache())
    except QnnctlError as exc:
        error = QnnctlError(
            f"SDK {sdk.version} is installed at {sdk.root}, but cannot load on this host: staging the "
            f"libc++ runtime its libraries need failed: {exc.message}",
            hint=f"retry with `qnnctl install {sdk.version} --runtime`, or give the libraries with `qnnctl "
            f"install {sdk.version} --runtime --runtime-from FILE` (Debian's libc++1-14, libc++abi1-14 and "
            "libunwind-14 packages, or LLVM's release archive; QNNCTL_LLVM_URL names a copy of it); "
            "`qnnctl doctor` explains",
        )
        error.exit_code = exc.exit_code or EXIT_FAILED  # a download that failed stays exit 3
        raise error from exc


@cli.command(short_help="Print the shell exports for an installed SDK.")
@click.argument("version", required=False, shell_complete=complete_installed)
@click.option("--sdk", "sdk_path", type=click.Path(), help="Use the SDK at this path.")
@click.option("--shell", "shell", type=click.Choice(SHELLS),
              help="Output syntax (default: the shell that runs qnnctl, else $SHELL, else sh).")
@click.option("--unset", is_flag=True, help="Print what undoes qnnctl's changes.")
def env(version: str | None, sdk_path: str | None, shell: str | None, unset: bool) -> None:
    """Print the exports for an installed SDK: eval "$(qnnctl env)". Never downloads."""
    if sdk_path is not None and not sdk_path.strip():
        # Path("") is ".": taken as a path, an empty value would name the current folder.
        raise UsageError("--sdk is empty; it takes the path of an SDK root",
                         hint="give the folder that holds lib/ and bin/, e.g. --sdk /opt/qairt/2.37.0.250724")
    if version is not None and sdk_path is not None:
        raise UsageError("give either VERSION or --sdk PATH, not both")
    if unset and (version is not None or sdk_path is not None):
        raise UsageError("--unset undoes whatever qnnctl exported; it takes no VERSION or --sdk")
    spec = version
    if sdk_path is not None:
        # A bare folder name given to --sdk is still a path, never a version.
        spec = sdk_path if sdk_path.startswith(("/", "~")) else os.path.join(".", sdk_path)
    try:
        plan = plan_env(spec, os.environ, Path.cwd(), _cache(), unset=unset)
    except NotInstalledError as exc:
        conflict = pin_conflict(os.environ, Path.cwd(), _cache()) if spec is None else None
        if conflict is not None:
            exc.hint = f"{conflict.said()}; {exc.hint}" if exc.hint else conflict.said()
        raise
    for note in plan.notes:
        log.warning("%s", note)
    if plan.selection is not None and _verbosity["verbose"]:
        log.debug("chose %s", plan.selection.describe())
    if plan.selection is not None and plan.selection.caller_managed and not plan.values:
        log.info("QNN_SDK_ROOT is exported but empty: the caller manages the SDK; nothing to export")
        if shell == "json":
            # One JSON document all the same, with the final values: QNN_SDK_ROOT stays empty,
            # which is how the caller said that the SDK is theirs; nothing else changes.
            click.echo(render({"QNN_SDK_ROOT": ""}, "json"), nl=False)
        return
    text = render(plan.values, shell or detect_shell(os.environ, os.getppid()))
    click.echo(text, nl=False)


@cli.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_(as_json: bool) -> None:
    """List installed SDKs."""
    rows = installed_sdks(_cache(), os.environ)
    if as_json:
        click.echo(json.dumps({"schema": 1, "sdks": rows}, indent=2))
        return
    if not rows:
        log.info("no SDK installed; run `qnnctl install`")
        return
    selected = selected_here(_cache(), os.environ, Path.cwd())
    lines, marked = render_sdk_table(rows, selected[0] if selected is not None else None)
    for line in lines:
        click.echo(line)
    if marked and selected is not None:
        log.info("* marks the SDK used here: %s", selected[1])


@cli.command(short_help="The library or tool a process would use, as the loader or PATH finds it.")
@click.argument("name")
@click.option("--sdk", "spec", metavar="VERSION|PATH", shell_complete=complete_installed,
              help="For this SDK instead of the one qnnctl would choose.")
@click.option("--json", "as_json", is_flag=True, help="Also every folder searched, and where it came from.")
def which(name: str, spec: str | None, as_json: bool) -> None:
    """Print the absolute path of library NAME (libQnnHtp.so, libc++.so.1) or tool NAME
    (qnn-net-run) that a process set up for the SDK would use; exit 1 when nothing provides it.

    Resolved in the environment `qnnctl lower` starts a pipeline with: libraries as the dynamic
    loader finds them (LD_LIBRARY_PATH, its cache, its default folders), tools on PATH.
    """
    answer = find(name, spec, os.environ, Path.cwd(), _cache())
    if spec is None:
        _say_pin_conflict()
    if as_json:
        click.echo(json.dumps({"schema": 1, **answer.as_dict()}, indent=2))
    elif answer.path is not None:
        click.echo(answer.path)
    if answer.path is None:
        where = f"SDK {answer.sdk.version} at {answer.sdk.root}" if answer.sdk else "the environment as it is"
        searched = ("no folder on LD_LIBRARY_PATH, in the loader's cache or among its default folders holds it"
                    if answer.kind == "library" else "no folder on PATH holds it")
        error = QnnctlError(f"no {answer.kind} {name} for {where}: {searched}",
                            hint="`qnnctl which --json NAME` lists every folder searched; "
                            "`qnnctl doctor` explains what the SDK lacks")
        raise error


@cli.command(short_help="Which QAIRT built a lowered model, and whether the SDK can load it.")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--sdk", "spec", metavar="VERSION|PATH", shell_complete=complete_installed,
              help="Read it with this installed SDK, and say whether it loads it.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def inspect(file: Path, spec: str | None, as_json: bool) -> None:
    """Read FILE (a QNN context binary, or an ONNX model with an EPContext node): the QAIRT build
    that made it, its backend, HTP architecture and SoC, its graphs with their inputs and outputs.

    With an installed SDK (the one qnnctl selects, or --sdk), its own libQnnSystem.so reads the
    binary, and the exit code is 1 when that SDK cannot load it (a binary built by a newer QAIRT).
    """
    report = inspect_file(file, spec, os.environ, Path.cwd(), _cache())
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo(render_inspection(report), nl=False)
    if not report.ok and report.sdk is not None:
        raise QnnctlError(report.sdk.reason,
                          hint=f"run it with a runtime of QAIRT {report.binaries[0].qairt} or newer, "
                          f"or lower the model again with SDK {report.sdk.version}")


def _say_pin_conflict(more: str = "") -> None:
    """Warn when this shell's SDK (from `qnnctl env`) is not the one the project pins."""
    conflict = pin_conflict(os.environ, Path.cwd(), _cache())
    if conflict is not None:
        log.warning("%s; %s%s", conflict.said(), conflict.switch(), f"; {more}" if more else "")


@cli.command(short_help="Remove SDKs from qnnctl's cache (--except VERSION..., --all).")
@click.argument("versions", nargs=-1, metavar="[VERSION]...", shell_complete=complete_installed)
@click.option("--except", "keep", is_flag=True, help="Remove every SDK of qnnctl's cache but the VERSIONs given.")
@click.option("--all", "everything", is_flag=True, help="Remove every SDK of qnnctl's cache.")
@click.option("--wait", is_flag=True, help="Wait for the processes that use an SDK to end, rather than leave it.")
def uninstall(versions: tuple[str, ...], keep: bool, everything: bool, wait: bool) -> None:
    """Remove SDKs from qnnctl's cache; for a linked SDK (`qnnctl link`), only the link.

    Stores and linked folders are never changed. An SDK that a running process uses (a `qnnctl
    lower` pipeline, a Python that called setup_sdk()) is left in place, naming the process, and
    the others are removed; the exit code is then 1 (--wait: wait for it to end instead). With
    --except or --all, an SDK that a running install holds is left alone, and the space freed is
    reported.
    """
    if keep and everything:
        raise UsageError("--except and --all cannot be used together")
    if everything and versions:
        raise UsageError("--all removes every SDK of qnnctl's cache; it takes no VERSION",
                         hint="to keep some, use `qnnctl uninstall --except VERSION...`")
    if keep and not versions:
        raise UsageError("--except needs the VERSIONs to keep", hint="`qnnctl uninstall --all` removes every one")
    if not (keep or everything):
        if not versions:
            raise UsageError("give the VERSION to remove", hint="or `qnnctl uninstall --except VERSION...` / `--all`")
        held: list[HeldError] = []
        for version in versions:
            try:
                do_uninstall(version, _cache(), os.environ, wait=wait)  # says what it removed, and its size
            except HeldError as exc:
                held.append(exc)
                continue
        _left_in_place(held)
        return
    pruned = prune(versions, everything, _cache(), os.environ, wait=wait)
    for version, root in pruned.busy:
        log.warning("SDK %s (%s) is held by a running install; left alone", version, root)
    if pruned.kept:
        log.info("kept %s", ", ".join(pruned.kept))
    if pruned.removed:
        log.info("removed %s, freed %s", plural(len(pruned.removed), "SDK"), mib(pruned.freed))
    elif not pruned.held:
        log.info("no SDK of qnnctl's cache to remove; nothing freed")
    _left_in_place(pruned.held)


def _left_in_place(held: list[HeldError]) -> None:
    """SDKs an uninstall left because running processes use them: one is the error itself;
    several are each named, then summed up in the error (exit 1 either way)."""
    if len(held) == 1:
        raise held[0]
    if held:
        for error in held:
            log.warning("%s", error.message)
        versions = " ".join(error.version for error in held)
        raise QnnctlError(f"{len(held)} SDKs in use were left in place: {versions.replace(' ', ', ')}",
                          hint=f"run it again once those processes have ended, or `qnnctl uninstall --wait "
                          f"{versions}` to wait for them")


@cli.command(short_help="Record an existing SDK folder, so that every command can select it.")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--version", "version", metavar="VERSION", help="Its version (default: what its libraries say).")
def link(path: Path, version: str | None) -> None:
    """Record the SDK folder PATH (unpacked by hand or by Qualcomm's installer) in qnnctl's
    cache; print its root. qnnctl never changes or deletes the folder: `qnnctl uninstall
    VERSION` removes only the link."""
    made, previous = link_sdk(path, version, _cache(), os.environ)
    if previous is not None and previous.root != made.root:
        log.info("SDK %s was linked to %s; now to %s", made.version, previous.root, made.root)
    else:
        log.info("linked SDK %s: %s", made.version, made.root)
    click.echo(str(made.root))


@cli.command(short_help="Pin the SDK's checksums for this project (qnnctl.lock).")
@click.argument("version", required=False, shell_complete=complete_known)
@click.option("--check", is_flag=True, help="Exit 1 when the lock and what qnnctl resolves disagree; write nothing.")
def lock(version: str | None, check: bool) -> None:
    """Write qnnctl.lock (beside .qnn-version, else here) for VERSION or the SDK qnnctl resolves:
    its version, build id, archive sha256 and size, and where it came from; print its path.

    The values are taken on first use, from a download or the manifest of the installed SDK.
    """
    if check:
        if version is None:  # said first: it may be why the check fails
            _say_pin_conflict("without this shell's SDK (as in CI), `qnnctl lock --check` checks the lock "
                              "against the pin")
        found = check_lock(version, os.environ, Path.cwd(), _cache())
        state = "installed, matching" if found.sdk is not None else "not installed yet; install checks it"
        log.info("%s matches: SDK %s (%s)", found.lock.path, found.version, state)
        return
    written = make_lock(version, os.environ, Path.cwd(), _cache(), terminal=_stderr_is_terminal())
    log.info("trust on first use: %s%s Check them once against a copy you trust, then commit %s",
             written.trust[:1].lower(), written.trust[1:], written.path.name)
    replaced = written.replaced
    if replaced is not None and (replaced.version, replaced.sha256) != (written.lock.version, written.lock.sha256):
        log.warning("replaced the lock of SDK %s (sha256 %s) with SDK %s (sha256 %s)", replaced.version,
                    replaced.sha256, written.lock.version, written.lock.sha256)
    pin = find_pin(Path.cwd())
    if pin is None:
        log.info("no .qnn-version pins SDK %s here; `qnnctl use %s` makes it the project's choice",
                 written.lock.version, written.lock.version)
    click.echo(str(written.path))


@cli.command(short_help="Fill DIR with SDK archives and an index.json, to serve as QNNCTL_MIRROR.")
@click.argument("folder", metavar="DIR", type=click.Path(path_type=Path, file_okay=False))
@click.argument("versions", nargs=-1, metavar="[VERSION]...", shell_complete=complete_known)
def mirror(folder: Path, versions: tuple[str, ...]) -> None:
    """Put <version>/v<version>.zip into DIR for each VERSION (default: the SDK qnnctl resolves
    here), from the cache's downloads or fetched once, and record each one's sha256, size and
    build id in DIR/index.json; print each archive's path. Serve DIR with any static web server
    or object store, and point QNNCTL_MIRROR at it."""
    for done in make_mirror(folder, versions, os.environ, Path.cwd(), _cache(), terminal=_stderr_is_terminal()):
        click.echo(str(done.path))


@cli.command(short_help="Pin VERSION for this project (.qnn-version).")
@click.argument("version", shell_complete=complete_known)
def use(version: str) -> None:
    """Pin VERSION for this project: write .qnn-version here; print its path."""
    path, pinned = write_pin(Path.cwd(), version, version_pools(_cache(), os.environ, mirror=True))
    for note in pinned_notes(pinned, os.environ, Path.cwd(), _cache()):
        log.warning("%s", note)
    click.echo(str(path))


@cli.group()
def cache() -> None:
    """Cache housekeeping."""


@cache.command()
def clean() -> None:
    """Remove partial downloads and folders left by interrupted installs."""
    cleaned = clean_cache(_cache())
    for path in cleaned.removed:
        log.info("removed %s", path)
    for path in cleaned.busy:
        log.warning("%s is in use by a running install; left alone", path)
    if not cleaned.removed and not cleaned.busy:
        log.info("nothing to clean")


# -- doctor --------------------------------------------------------------------------------


@cli.command(short_help="Check host, SDK and environment; exit 1 on a failure.")
@click.option("--sdk", "spec", metavar="PATH|VERSION", shell_complete=complete_installed,
              help="Check this SDK instead of the one qnnctl would choose.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--offline", is_flag=True, help="Skip the network check.")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option("--verify", is_flag=True, help="Re-hash the SDK's files against its manifest.")
@click.option("--device", "device", is_flag=False, flag_value="", default=None, metavar="[SERIAL]",
              help="Also check this Android device (or the only one adb sees).")
@click.option("--model", "models", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="With --device: fail when this lowered model is newer than the device's runtime.")
def doctor(spec: str | None, as_json: bool, offline: bool, strict: bool, verify: bool, device: str | None,
           models: tuple[Path, ...]) -> None:
    """Check the host, the SDK and the environment; exit 1 when a check fails."""
    results = diagnose(spec, os.environ, Path.cwd(), offline=offline, verify=verify, device=device,
                       models=models)
    # The report is what was asked for, so it goes to stdout, as a table on a terminal.
    if as_json:
        click.echo(render_json(results, strict), nl=False)
    elif sys.stdout.isatty():
        click.echo(render_table(results), nl=False)
    else:
        click.echo(render_text(results), nl=False)
    click.get_current_context().exit(exit_code(results, strict))


# -- device --------------------------------------------------------------------------------


@cli.group(short_help="The phone side: push one coherent set of QNN libraries, run there.")
def device() -> None:
    """Put one coherent set of the SDK's QNN libraries on an Android device, and run there (adb)."""


@device.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def device_list(as_json: bool) -> None:
    """The devices adb sees: serial, state, model, SoC and HTP generation."""
    rows = list_devices(os.environ)
    if as_json:
        click.echo(json.dumps({"schema": SCHEMA, "devices": rows}, indent=2))
        return
    if not rows:
        log.info("adb sees no device")
        return
    table = [["serial", "state", "model", "soc", "htp"]]
    for row in rows:
        arch = row["htp_arch"] or ("unknown" + (f" ({row['soc']})" if row["soc"] else ""))
        soc = row["soc_model"] or row["soc"] or "-"
        table.append([row["serial"], row["state"], row["model"] or "-", soc, arch])
    for line in columns(table):
        click.echo(line)


@device.command(short_help="Push the SDK's libraries for the device's HTP generation.")
@click.option("--serial", metavar="SERIAL", help="The device (default: $ANDROID_SERIAL, else the only one).")
@click.option("--soc", metavar="SOC", help="Plan for this SoC (SM8750) instead of the one the device reports.")
@click.option("--dest", metavar="DIR", help="The device folder (default: /data/local/tmp/qnnctl/<sdk version>).")
@click.option("--sdk", "spec", metavar="VERSION|PATH", shell_complete=complete_installed,
              help="Take the files of this installed SDK.")
@click.option("--dry-run", is_flag=True, help="Print the plan and the device environment; push nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan (or what was pushed) as one JSON object.")
@click.argument("extra_files", nargs=-1, metavar="[EXTRA_FILE]...",
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
def push(serial: str | None, soc: str | None, dest: str | None, spec: str | None, dry_run: bool, as_json: bool,
         extra_files: tuple[Path, ...]) -> None:
    """Push the SDK's libraries for the device's HTP generation, and each EXTRA_FILE, to the
    device folder; print that folder. A file already there with the same sha256 is skipped,
    and every pushed file is checked on the device. With --dry-run and --soc, no device is used.
    """
    outcome = do_push(spec, os.environ, Path.cwd(), _cache(), serial=serial, soc=soc, dest=dest,
                      extras=extra_files, dry_run=dry_run)
    if as_json:
        click.echo(json.dumps(outcome.as_dict(), indent=2))
    elif dry_run:
        plan = outcome.plan
        log.info("plan for %s (HTP %s) from SDK %s: source, device path, size, build id; then the device "
                 "environment", plan.soc.model, plan.arch_name, plan.sdk.version)
        click.echo(render_push_plan(plan), nl=False)
    else:
        if outcome.result is not None:
            log.info("%s", outcome.result.summary())
        click.echo(outcome.plan.dest)


@device.command(name="env", short_help="Print the exports for the device's shell.")
@click.option("--dest", metavar="DIR", help="The device folder (default: /data/local/tmp/qnnctl/<sdk version>).")
@click.option("--sdk", "spec", metavar="VERSION|PATH", shell_complete=complete_installed,
              help="The SDK whose default folder to use.")
@click.option("--shell", "shell", type=click.Choice(("sh", "json")), default="sh", show_default=True,
              help="Output syntax: Android's sh, or JSON.")
def device_env(dest: str | None, spec: str | None, shell: str) -> None:
    """Print LD_LIBRARY_PATH and ADSP_LIBRARY_PATH (`;`-separated) for the device's shell."""
    folder = device_dest(dest, spec, os.environ, Path.cwd(), _cache())
    click.echo(render_device_env(device_environment(folder), shell), nl=False)


@device.command(name="run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
                short_help="Run a command on the device with the pushed libraries in place.")
@click.option("--serial", metavar="SERIAL", help="The device (default: $ANDROID_SERIAL, else the only one).")
@click.option("--dest", metavar="DIR", help="The device folder (default: /data/local/tmp/qnnctl/<sdk version>).")
@click.option("--sdk", "spec", metavar="VERSION|PATH", shell_complete=complete_installed,
              help="The SDK whose default folder to use.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS]...")
def device_run(serial: str | None, dest: str | None, spec: str | None, command: tuple[str, ...]) -> None:
    """Run COMMAND on the device, in the device folder, with the environment `qnnctl device env`
    prints. Its output streams as it comes, and its exit code is qnnctl's."""
    run(command, os.environ, Path.cwd(), _cache(), serial=serial, dest=dest, spec=spec)


# -- lower ---------------------------------------------------------------------------------


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


@cli.command(cls=_LowerCommand, short_help="Run a lowering pipeline with the SDK in place.")
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
        check_cache_path(str(_cache().root))
    options = LowerOptions(spec=spec, python=python, install=not no_install, keep_mkldnn=keep_mkldnn,
                           dry_run=dry_run)
    plan = plan_lower(parse_target(pipeline), options, os.environ, Path.cwd(), _cache(),
                      terminal=_stderr_is_terminal())
    if dry_run:
        for note in plan.notes:
            log.info("%s", note)
        click.echo(render_plan(plan), nl=False)
        return
    exec_plan(plan)


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
    except QnnctlError as exc:
        _error(exc.message, exc.hint)
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo(f"qnnctl: {INTERRUPTED}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        _error(*_click_error(exc))
        sys.exit(exc.exit_code if exc.exit_code else EXIT_USAGE)
    except OSError as exc:
        # The file system said no (permissions, a read-only or full disk): name the path.
        where = f" {exc.filename}" if exc.filename else ""
        _error(f"cannot use{where}: {exc.strerror or exc}", "check its permissions and free space, or point "
               "QNNCTL_CACHE_DIR at a folder you can write to")
        sys.exit(EXIT_FAILED)
    except Exception as exc:
        if os.environ.get("QNNCTL_DEBUG") or log.isEnabledFor(logging.DEBUG):
            traceback.print_exc()
        else:
            # Whatever raised it may have put a URL with a token in its message.
            _error(f"{type(exc).__name__}: {redact_text(str(exc))} (run with -v or QNNCTL_DEBUG=1 for the "
                   "traceback)", kind="unexpected error")
        sys.exit(EXIT_FAILED)
    sys.exit(code if isinstance(code, int) else 0)
