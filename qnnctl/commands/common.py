"""What every command shares: the "qnnctl" logger and its -v/-q, the labels on stderr, the cache
of this invocation, shell completion of versions, and the group whose commands take -v/-q.

stdout carries only what scripts consume (paths, exports, JSON); everything for people goes to
stderr through logging.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem

from qnnctl.sdk.cache import Cache, relative_cache_dir
from qnnctl.sdk.select import pin_conflict
from qnnctl.sdk.versions import KNOWN_VERSIONS


class _Logger:
    """The "qnnctl" logger, set up on first use with this invocation's -v/-q (or without them,
    for what is said before the command line is parsed)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_setup_logging(), name)


log = _Logger()
# This invocation's -v/-q, until the logger is set up with them.
_pending_verbosity: dict[str, int] = {}
# This invocation's -v and -q so far, given before the command's name and after it.
verbosity = {"verbose": 0, "quiet": 0}


def configure_logging(verbose: int, quiet: int, more: bool = False) -> None:
    """Take this invocation's -v/-q (`more`: some more, given after a command's name)."""
    if not more:
        verbosity.update(verbose=0, quiet=0)
    verbosity["verbose"] += verbose
    verbosity["quiet"] += quiet
    _pending_verbosity.update(verbosity)
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
                return f"{label('error')} {message}"
            if record.levelno >= logging.WARNING:
                return f"{label('warning')} {message}"
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


def label(kind: str) -> str:
    """`qnnctl: error:` and its kin, the one style of every error, warning and hint on stderr."""
    if not _colour_on_stderr():
        return f"qnnctl: {kind}:"
    return f"qnnctl: \x1b[{_LABEL_COLOURS[kind]}m{kind}:\x1b[0m"


def say_error(message: str, hint: str | None = None, kind: str = "error") -> None:
    click.echo(f"{label(kind)} {message}", err=True)
    if hint:
        click.echo(f"{label('hint')} {hint}", err=True)


# A relative QNNCTL_CACHE_DIR is said once per run, however often the cache is asked for.
_said_relative_cache: list[str] = []


def current_cache() -> Any:
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


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty() and bool(log.isEnabledFor(logging.INFO))


def complete_installed(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Installed SDK versions, for shell completion of VERSION arguments."""
    try:
        versions = current_cache().installed_versions()
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


VERBOSE_HELP = "Debug detail on stderr, and tracebacks of unexpected errors."
QUIET_HELP = "Less on stderr: warnings and errors only (-qq: errors only)."


def _more_verbosity(ctx: click.Context, param: click.Parameter, value: int) -> None:
    if value and not ctx.resilient_parsing:
        configure_logging(value if param.name == "verbose" else 0, value if param.name == "quiet" else 0,
                           more=True)


class VerboseGroup(click.Group):
    """A group whose commands take -v and -q after their name too: `qnnctl install -v`."""

    group_class: type[click.Group | type] | None = type  # subgroups (`qnnctl cache`) are of this class as well

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        for opts, help_text in ((("-v", "--verbose"), VERBOSE_HELP), (("-q", "--quiet"), QUIET_HELP)):
            cmd.params.append(click.Option(opts, count=True, expose_value=False, callback=_more_verbosity,
                                           help=help_text))
        super().add_command(cmd, name)


def say_pin_conflict(more: str = "") -> None:
    """Warn when this shell's SDK (from `qnnctl env`) is not the one the project pins."""
    conflict = pin_conflict(os.environ, Path.cwd(), current_cache())
    if conflict is not None:
        log.warning("%s; %s%s", conflict.said(), conflict.switch(), f"; {more}" if more else "")
