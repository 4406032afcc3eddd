"""`qnnctl install`: an SDK installed or found on disk, made loadable here; its root on stdout."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from qnnctl.commands.common import complete_known, current_cache
from qnnctl.commands.stderr import log, stderr_is_terminal
from qnnctl.errors import EXIT_FAILED, QnnctlError
from qnnctl.install.pipeline import InstallRequest
from qnnctl.install.pipeline import install as do_install
from qnnctl.run.environment import ensure_loadable, hold_runtime_to_lock
from qnnctl.sdk.components import complete, parse_components
from qnnctl.sdk.holds import wait_for_holders
from qnnctl.sdk.layout import Sdk
from qnnctl.sdk.select import select_sdk
from qnnctl.sdk.vouchers import vouchers
from qnnctl.shell.exports import check_cache_path


def _complete_components(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    return list(complete(ctx, param, incomplete))


@click.command(short_help="Install an SDK (or find one on disk); print its root.")
@click.argument("version", required=False, shell_complete=complete_known)
@click.option("--url", metavar="URL", help="Download the archive from this URL.")
@click.option("--file", "file", type=click.Path(path_type=Path), help="Install from an archive on disk.")
@click.option("--sha256", metavar="HEX", help="Expected sha256 of the archive.")
@click.option("--force", is_flag=True, help="Reinstall even if the SDK is already installed (and, with --runtime, "
              "stage the host runtime again even if it is staged or on the host).")
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

    VERSION is a full version (2.37.0.250724, or v2.37.0.250724 as the archives are named) or a
    prefix (2.37): the newest match installed, else on QNNCTL_MIRROR, else known. Without it:
    the SDK this shell was set up for by `qnnctl env`, else a non-empty QNN_SDK_ROOT, else a
    .qnn-version pin, else the version the installed ExecuTorch expects, else the newest SDK
    already installed, else the default. An exported but empty QNN_SDK_ROOT means the caller
    manages the SDK: nothing is installed. In a project with a qnnctl.lock, the archive (or the
    SDK found on disk) must match it (exit 4). An installed SDK that a running process uses is
    never replaced (exit 1, naming the process; --wait waits for it to end).
    """
    check_cache_path(str(current_cache().root))
    parts = None
    if components is not None:
        parts = parse_components(components)
    staging = _runtime_staging(runtime_from, force, locked) if runtime or runtime_from else None
    request = InstallRequest(spec=version, url=url, file=file, sha256=sha256, force=force, components=parts)
    wait_for_holders.set(wait)
    terminal = stderr_is_terminal()
    result = do_install(request, current_cache(), os.environ, Path.cwd(), vouchers(os.environ, Path.cwd(), locked),
                        terminal=terminal)
    if staging is not None:
        staging(result.sdk)
    elif result.sdk is not None:
        _stage_missing_trio(result.sdk)
        hold_runtime_to_lock(result.sdk, current_cache(), Path.cwd())
    if result.sdk is None:
        log.info("QNN_SDK_ROOT is exported but empty: the SDK is left to the caller; nothing to install")
        return
    if result.action == "reused":
        log.info("SDK %s %s", result.sdk.version, _found_where(result.sdk.origin))
    if terminal:
        _say_next_step(result.sdk)
    click.echo(str(result.sdk.root))


def _runtime_staging(runtime_from: tuple[Path, ...], force: bool, locked: bool) -> Callable[[Sdk | None], None]:
    """`--runtime`: what can be checked before a byte of the SDK is fetched (that this host can be
    staged for, that the files given are packages qnnctl reads), then the staging for the SDK
    installed, held to what the project's lock pins of the host runtime."""
    # lazy: the staging, and the readers of Debian's and RPM's packages it brings (about 40 ms of
    # imports), which every other install would pay before its download starts
    from qnnctl.host.runtime import RuntimeRequest, lock_pins, require_stageable_host, stage_runtime
    from qnnctl.host.sources import check_sources  # lazy: as the line above

    require_stageable_host()
    sources = check_sources(runtime_from) if runtime_from else ()

    def stage(sdk: Sdk | None) -> None:
        pins = lock_pins(sdk.version, Path.cwd()) if sdk is not None else None
        if pins is None and locked:
            log.info("the lock pins no host runtime: what is staged is checked by where it comes from "
                     "(apt's signed lists, LLVM's published sha256, the files given); `qnnctl lock` pins it")
        stage_runtime(current_cache(), sdk, RuntimeRequest(sources=sources, force=force, pins=pins), os.environ)

    return stage


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
        chosen = select_sdk(None, os.environ, Path.cwd(), current_cache(), from_shell=False)
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
        ensure_loadable(sdk, os.environ, current_cache(), Path.cwd())
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
