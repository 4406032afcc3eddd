"""What `qnnctl device list|push|env|run` do, as functions of their arguments and an environment.

The CLI parses and prints; these choose the SDK (as every command does), talk to adb, and return
data. Nothing here prints.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from qnnctl.device.adb import Adb, AdbNotFoundError, Device, DeviceError
from qnnctl.device.plan import Plan, check_dest, default_dest, plan_push, remote_command, resolve_soc
from qnnctl.device.push import PushResult, push_plan
from qnnctl.device.socs import arch, find_soc
from qnnctl.errors import UsageError
from qnnctl.run.environment import hold_checked
from qnnctl.run.envplan import environment_for
from qnnctl.run.inspect import Binary, read_model
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.layout import Sdk, read_sdk_version
from qnnctl.sdk.select import resolve_installed, select_sdk
from qnnctl.shell.exports import apply
from qnnctl.shell.render import quote_posix

log = logging.getLogger("qnnctl.device")

SCHEMA = 1


def list_devices(environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every device adb sees: serial, state, model, the SoC it reports and its HTP generation."""
    adb = Adb(environ)
    rows: list[dict[str, Any]] = []
    for listed in adb.devices():
        row: dict[str, Any] = {"serial": listed.serial, "state": listed.state,
                               "model": listed.fields.get("model", "").replace("_", " ") or None,
                               "soc": None, "soc_model": None, "htp_arch": None}
        if listed.ready:
            device = Device(adb, listed.serial, listed)
            try:
                row["model"] = device.model or row["model"]
                row["soc"] = device.soc_model or None
            except DeviceError as exc:  # it went away between the two calls: say so, list the rest
                log.warning("%s", exc.message)
            soc = find_soc(row["soc"] or "")
            if soc is not None:
                row["soc_model"] = soc.model
                row["htp_arch"] = arch(soc.arch).name
        rows.append(row)
    return rows


def device_sdk(spec: str | None, environ: Mapping[str, str], cwd: Path, cache: Cache) -> Sdk:
    """The installed SDK whose files a push takes, selected as every command selects it."""
    selection = select_sdk(spec, environ, cwd, cache)
    if selection.caller_managed:
        raise UsageError("QNN_SDK_ROOT is exported but empty (the caller manages the SDK), so qnnctl does "
                         "not know which SDK's device files to use",
                         hint="name it: --sdk VERSION or --sdk PATH")
    log.debug("chose %s", selection.describe())
    return resolve_installed(selection, cache, environ)


def device_dest(dest: str | None, spec: str | None, environ: Mapping[str, str], cwd: Path, cache: Cache) -> str:
    """`--dest`, else where `qnnctl device push` puts the selected SDK's files."""
    if dest is not None:
        return check_dest(dest)
    selection = select_sdk(spec, environ, cwd, cache)
    version = selection.version
    if version is None and selection.root is not None:
        version = read_sdk_version(selection.root)
    if version is None:
        raise UsageError("cannot tell the device folder: no SDK version is selected "
                         + ("(QNN_SDK_ROOT is exported but empty)" if selection.caller_managed else ""),
                         hint="give --dest DIR, or --sdk VERSION")
    return default_dest(version)


@dataclass(frozen=True)
class PushOutcome:
    plan: Plan
    serial: str | None  # None: a dry run that talked to no device
    result: PushResult | None  # None: a dry run

    def as_dict(self) -> dict[str, Any]:
        data = self.result.as_dict() if self.result is not None else {**self.plan.as_dict(), "serial": self.serial}
        return {"schema": SCHEMA, "dry_run": self.result is None, **data}


def push(
    spec: str | None,
    environ: Mapping[str, str],
    cwd: Path,
    cache: Cache,
    *,
    serial: str | None = None,
    soc: str | None = None,
    dest: str | None = None,
    extras: Sequence[Path] = (),
    dry_run: bool = False,
) -> PushOutcome:
    """Plan the set for the device's SoC (or `soc`) and, unless a dry run, push it: from an SDK
    held for as long as it is read, and in a project with a lock, one that the lock vouches for
    (as `lower` checks the SDK it uses; exit 4 otherwise)."""
    if dest is not None:
        check_dest(dest)
    sdk = device_sdk(spec, environ, cwd, cache)
    held = hold_checked(sdk, cache, cwd)
    try:
        return _push_from(sdk, environ, cache, serial, soc, dest, extras, dry_run)
    finally:
        if held is not None:
            os.close(held)


def _push_from(sdk: Sdk, environ: Mapping[str, str], cache: Cache, serial: str | None, soc: str | None,
               dest: str | None, extras: Sequence[Path], dry_run: bool) -> PushOutcome:
    child = apply(environ, environment_for(sdk, environ, cache, owns_root=True))

    def read(path: Path) -> list[Binary]:
        return read_model(path, sdk, child)[1]

    if dry_run and soc is not None:
        # The plan needs nothing from the device: talk to none.
        plan = plan_push(sdk, resolve_soc(None, soc), dest, extras, read)
        for note in plan.warnings:
            log.warning("%s", note)
        return PushOutcome(plan, None, None)
    try:
        device = Adb(environ).device(serial)
    except AdbNotFoundError as exc:
        # A plan needs no device when the SoC is named.
        exc.hint = f"{exc.hint}; or see the plan without a device: `qnnctl device push --dry-run --soc SOC` (SM8750...)"
        raise
    reported = device.soc_model
    chosen = resolve_soc(reported, soc, where=f"device {device.serial}")
    if soc is not None and reported and chosen.model != reported:
        log.info("%s reports SoC %s; planning for --soc %s", device.serial, reported, chosen.model)
    plan = plan_push(sdk, chosen, dest, extras, read)
    for note in plan.warnings:
        log.warning("%s", note)
    if dry_run:
        return PushOutcome(plan, device.serial, None)
    log.info("pushing SDK %s's files for %s (HTP %s) to %s:%s", sdk.version, chosen.model, plan.arch_name,
             device.serial, plan.dest)
    return PushOutcome(plan, device.serial, push_plan(device, plan))


def run(argv: Sequence[str], environ: Mapping[str, str], cwd: Path, cache: Cache, *, serial: str | None = None,
        dest: str | None = None, spec: str | None = None) -> NoReturn:
    """Become `adb shell` running `argv` on the device in the pushed folder, with its environment."""
    if not argv:
        raise UsageError("nothing to run", hint="qnnctl device run -- COMMAND [ARGS]...")
    folder = device_dest(dest, spec, environ, cwd, cache)
    device = Adb(environ).device(serial)
    # Said here, with the fix; once adb runs the command, its own words are all there is.
    if device.shell(f"[ -d {quote_posix(folder)} ]", check=False).returncode != 0:
        options = f" --serial {device.serial}" + (f" --dest {quote_posix(folder)}" if dest is not None else "")
        raise DeviceError(f"{device.serial}:{folder} does not exist: nothing was pushed there",
                          hint=f"`qnnctl device push{options}` first")
    device.exec_shell(remote_command(folder, argv))
