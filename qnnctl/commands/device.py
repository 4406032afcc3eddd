"""`qnnctl device`: one coherent set of the SDK's libraries on an Android phone, and runs there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from qnnctl.commands.common import VerboseGroup, complete_installed, current_cache
from qnnctl.commands.stderr import log
from qnnctl.device.commands import SCHEMA, device_dest, list_devices, run
from qnnctl.device.commands import push as do_push
from qnnctl.device.plan import device_environment, render_device_env
from qnnctl.device.plan import render_plan as render_push_plan
from qnnctl.words import columns


@click.group(cls=VerboseGroup, short_help="The phone side: push one coherent set of QNN libraries, run there.")
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
    outcome = do_push(spec, os.environ, Path.cwd(), current_cache(), serial=serial, soc=soc, dest=dest,
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
    folder = device_dest(dest, spec, os.environ, Path.cwd(), current_cache())
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
    run(command, os.environ, Path.cwd(), current_cache(), serial=serial, dest=dest, spec=spec)
