"""The command line: parse, call one core function, map errors to exit codes.

stdout carries only what scripts consume (paths, exports, JSON); everything for people
goes to stderr through logging.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from qnnctl import __version__
from qnnctl.errors import EXIT_FAILED, EXIT_USAGE, QnnctlError

log = logging.getLogger("qnnctl")
# The same names as qnnctl.shell.SHELLS, kept here so that parsing imports nothing more.
SHELL_CHOICES = ("bash", "zsh", "sh", "fish", "powershell", "nu", "json", "dotenv")


class _StderrFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.ERROR:
            return f"qnnctl: error: {message}"
        if record.levelno >= logging.WARNING:
            return f"qnnctl: warning: {message}"
        return f"qnnctl: {message}"


def _configure_logging(verbose: int, quiet: int) -> None:
    level = logging.INFO - 10 * verbose + 10 * quiet
    if os.environ.get("QNNCTL_DEBUG"):
        level = logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_StderrFormatter())
    root = logging.getLogger("qnnctl")
    root.handlers[:] = [handler]
    root.setLevel(max(logging.DEBUG, min(level, logging.CRITICAL)))
    root.propagate = False


def _cache() -> Any:
    from qnnctl.cache import Cache

    return Cache.from_env(os.environ)


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty() and log.isEnabledFor(logging.INFO)


def complete_installed(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Installed SDK versions, for shell completion of VERSION arguments."""
    try:
        versions = _cache().installed_versions()
    except Exception:  # completion must never print a traceback into the user's shell
        return []
    return [v for v in versions if v.startswith(incomplete)]


def complete_known(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Installed versions first, then every known release."""
    from qnnctl.versions import KNOWN_VERSIONS

    installed = complete_installed(ctx, param, incomplete)
    return installed + [v for v in reversed(KNOWN_VERSIONS) if v.startswith(incomplete) and v not in installed]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More detail on stderr (-vv for debug).")
@click.option("-q", "--quiet", count=True, help="Less on stderr (-qq for errors only).")
@click.version_option(__version__, "-V", "--version", prog_name="qnnctl")
def cli(verbose: int, quiet: int) -> None:
    """Find, install and use the Qualcomm AI Runtime (QNN) SDK."""
    _configure_logging(verbose, quiet)


@cli.command()
@click.argument("version", required=False, shell_complete=complete_known)
@click.option("--url", help="Download the archive from this URL.")
@click.option("--file", "file", type=click.Path(path_type=Path), help="Install from an archive on disk.")
@click.option("--sha256", help="Expected sha256 of the archive.")
@click.option("--force", is_flag=True, help="Reinstall even if the SDK is already installed.")
def install(version: str | None, url: str | None, file: Path | None, sha256: str | None, force: bool) -> None:
    """Install an SDK (or find one already on disk); print its root on stdout."""
    from qnnctl.install import InstallRequest
    from qnnctl.install import install as do_install

    request = InstallRequest(spec=version, url=url, file=file, sha256=sha256, force=force)
    result = do_install(request, _cache(), os.environ, Path.cwd(), terminal=_stderr_is_terminal())
    if result.sdk is None:
        log.info("QNN_SDK_ROOT is exported but empty: the SDK is left to the caller; nothing to install")
        return
    if result.action == "reused":
        log.info("SDK %s is already installed (%s)", result.sdk.version, result.sdk.origin)
    click.echo(str(result.sdk.root))


@cli.command()
@click.argument("version", required=False, shell_complete=complete_installed)
@click.option("--sdk", "sdk_path", type=click.Path(path_type=Path), help="Use the SDK at this path.")
@click.option("--shell", "shell", type=click.Choice(SHELL_CHOICES), help="Output syntax (default: from $SHELL).")
@click.option("--unset", is_flag=True, help="Print what undoes qnnctl's changes.")
def env(version: str | None, sdk_path: Path | None, shell: str | None, unset: bool) -> None:
    """Print the exports for an installed SDK: eval "$(qnnctl env)". Never downloads."""
    from qnnctl.environment import plan_env
    from qnnctl.errors import UsageError
    from qnnctl.shell import detect_shell, render

    if version is not None and sdk_path is not None:
        raise UsageError("give either VERSION or --sdk PATH, not both")
    spec = version
    if sdk_path is not None:
        # A bare folder name given to --sdk is still a path, never a version.
        spec = str(sdk_path) if os.sep in str(sdk_path) else os.path.join(".", str(sdk_path))
    plan = plan_env(spec, os.environ, Path.cwd(), _cache(), unset=unset)
    if plan.selection is not None and plan.selection.caller_managed:
        log.info("QNN_SDK_ROOT is exported but empty: the caller manages the SDK; nothing to export")
        return
    text = render(plan.values, shell or detect_shell(os.environ))
    click.echo(text, nl=False)


@cli.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_(as_json: bool) -> None:
    """List installed SDKs."""
    from qnnctl.listing import installed_sdks

    rows = installed_sdks(_cache(), os.environ)
    if as_json:
        import json

        click.echo(json.dumps({"schema": 1, "sdks": rows}, indent=2))
        return
    if not rows:
        log.info("no SDK installed; run `qnnctl install`")
        return
    width = max(len(str(r["version"])) for r in rows)
    for row in rows:
        size = f"{row['size'] / (1 << 20):.0f} MiB" if row["size"] is not None else "?"
        click.echo(f"{row['version']:<{width}}  {row['root']}  {size}  ({row['origin']})")


@cli.command()
@click.argument("version", shell_complete=complete_installed)
def uninstall(version: str) -> None:
    """Remove an SDK from qnnctl's cache."""
    from qnnctl.install import uninstall as do_uninstall

    removed = do_uninstall(version, _cache())
    log.info("removed %s", removed)


@cli.command()
@click.argument("version", shell_complete=complete_known)
def use(version: str) -> None:
    """Pin VERSION for this project: write .qnn-version here; print its path."""
    from qnnctl.pin import write_pin

    path = write_pin(Path.cwd(), version)
    click.echo(str(path))


@cli.group()
def cache() -> None:
    """Cache housekeeping."""


@cache.command()
def clean() -> None:
    """Remove partial downloads and folders left by interrupted installs."""
    from qnnctl.install import clean_cache

    cleaned = clean_cache(_cache())
    for path in cleaned.removed:
        log.info("removed %s", path)
    for path in cleaned.busy:
        log.warning("%s is in use by a running install; left alone", path)
    if not cleaned.removed and not cleaned.busy:
        log.info("nothing to clean")


# -- doctor --------------------------------------------------------------------------------


# -- lower ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> NoReturn:
    """The entry point and the one error boundary: exceptions become a line and an exit code."""
    try:
        code = cli.main(args=argv, prog_name="qnnctl", standalone_mode=False)
    except QnnctlError as exc:
        click.echo(f"qnnctl: error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"qnnctl: hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("qnnctl: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code if exc.exit_code else EXIT_USAGE)
    except KeyboardInterrupt:
        click.echo("qnnctl: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        # The reader went away (`qnnctl list | head`): not an error worth a traceback.
        sys.stderr.close()
        sys.exit(EXIT_FAILED)
    except Exception as exc:
        if os.environ.get("QNNCTL_DEBUG") or log.isEnabledFor(logging.DEBUG):
            import traceback

            traceback.print_exc()
        else:
            click.echo(
                f"qnnctl: unexpected error: {type(exc).__name__}: {exc} "
                "(run with -v or QNNCTL_DEBUG=1 for the traceback)",
                err=True,
            )
        sys.exit(EXIT_FAILED)
    sys.exit(code if isinstance(code, int) else 0)
