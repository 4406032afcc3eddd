"""What every command shares through click: the cache of this invocation, shell completion of
versions, and the group whose commands take -v/-q (qnnctl.commands.stderr has the logger and the
labels on stderr, which need no click).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem

from qnnctl.commands.stderr import configure_logging, log
from qnnctl.sdk.cache import Cache, relative_cache_dir
from qnnctl.sdk.select import pin_conflict
from qnnctl.sdk.versions import KNOWN_VERSIONS

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
