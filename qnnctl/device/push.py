"""Putting a plan on a device: skip what is already there, verify what was sent.

Each file goes to `<name>.qnnctl-part` beside its place, and only once every file has arrived
and its sha256 on the device matches the local one are they all renamed into place (one `mv`
per file, in one shell command). A push that dies half-way leaves the set that was there before
untouched and a part file behind; the next push sends again only what did not arrive whole.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qnnctl.device.adb import Device
from qnnctl.device.plan import DeviceFile, Plan
from qnnctl.errors import IntegrityError
from qnnctl.shell.render import quote_posix
from qnnctl.words import plural

log = logging.getLogger("qnnctl.device.push")

PART_SUFFIX = ".qnnctl-part"
PUSHED = "pushed"
SKIPPED = "skipped"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Sent:
    file: DeviceFile
    sha256: str
    action: str  # PUSHED or SKIPPED

    def as_dict(self) -> dict[str, Any]:
        return {**self.file.as_dict(), "sha256": self.sha256, "action": self.action}


@dataclass(frozen=True)
class PushResult:
    plan: Plan
    serial: str
    sent: tuple[Sent, ...]

    def as_dict(self) -> dict[str, Any]:
        data = self.plan.as_dict()
        data["serial"] = self.serial
        data["files"] = [s.as_dict() for s in self.sent]
        return data

    def summary(self) -> str:
        pushed = [s for s in self.sent if s.action == PUSHED]
        size = sum(s.file.size for s in pushed)
        return (f"{plural(len(pushed), 'file')} pushed ({_mb(size)}), {len(self.sent) - len(pushed)} already there, "
                f"to {self.serial}:{self.plan.dest}")


def _mb(n: int) -> str:
    if n < 1000:
        return f"{n} bytes"
    return f"{n / 1e3:.0f} kB" if n < 1_000_000 else f"{n / 1e6:.1f} MB"


def push_plan(device: Device, plan: Plan) -> PushResult:
    """Push `plan` to `device`; return what was sent and what was already there."""
    local = {f.device_path: file_sha256(f.source) for f in plan.files}
    device.shell(f"mkdir -p {quote_posix(plan.dest)}")
    parts = {f.device_path: f.device_path + PART_SUFFIX for f in plan.files}
    there = device.sha256([*local, *parts.values()])
    sent: list[Sent] = []
    to_move: list[DeviceFile] = []
    for f in plan.files:
        digest = local[f.device_path]
        if there.get(f.device_path) == digest:
            log.info("%s is already on the device (same sha256)", f.name)
            sent.append(Sent(f, digest, SKIPPED))
            continue
        if there.get(parts[f.device_path]) == digest:
            log.info("%s arrived whole in an earlier push", f.name)
        else:
            log.info("pushing %s (%s)", f.name, _mb(f.size))
            device.push(f.source, parts[f.device_path])
        to_move.append(f)
        sent.append(Sent(f, digest, PUSHED))
    if to_move:
        _verify(device, [(parts[f.device_path], local[f.device_path], f) for f in to_move])
        device.shell(" && ".join(f"mv -f {quote_posix(parts[f.device_path])} {quote_posix(f.device_path)}"
                                 for f in to_move))
    return PushResult(plan, device.serial, tuple(sent))


def _verify(device: Device, expected: list[tuple[str, str, DeviceFile]]) -> None:
    """Every part file's sha256 on the device is the local file's; the bad ones are removed."""
    found = device.sha256([path for path, _, _ in expected])
    bad = [(path, digest, f) for path, digest, f in expected if found.get(path) != digest]
    if not bad:
        return
    device.shell("rm -f " + " ".join(quote_posix(path) for path, _, _ in bad), check=False)
    shown = "; ".join(
        f"{f.name}: sha256 {found.get(path, 'missing')} on the device, {digest} here" for path, digest, f in bad)
    raise IntegrityError(
        f"what arrived on {device.serial} is not what was sent ({shown}); nothing was put in place",
        hint="run the same command again; if it fails again, check the device's free space "
        "(`adb shell df /data/local/tmp`) and the cable",
    )
