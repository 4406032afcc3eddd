"""Phones for tests: the stand-in adb (tests/standin_adb.py) first on PATH, and its devices.

    phones = standin(tmp_path, monkeypatch)
    phones.add("R5CT1", soc="SM8750P")
    phones.add("EMU2", state="unauthorized")
    phones.path("R5CT1", "/data/local/tmp/qnnctl")    # that folder, on the host

Also SDK device sides made of small files that carry a build id as QAIRT's libraries do, for
tests that need no genuine binaries (tests/genuine.py has Qualcomm's own).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.standin_adb import STATE_VARIABLE

BUILD_2_51 = "v2.51.0.260929181845"
BUILD_2_47 = "v2.47.0.260601114230"
ARCHES = (68, 69, 73, 75, 79, 81)
# Variables of the developer's own Android set-up that would reach a real phone.
ANDROID_VARIABLES = ("ADB", "ANDROID_HOME", "ANDROID_SDK_ROOT", "ANDROID_SERIAL", "ADB_VENDOR_KEYS")


class Phones:
    """The stand-in's state folder: the devices it lists and their file systems."""

    def __init__(self, state: Path, bin_dir: Path) -> None:
        self.state = state
        self.bin_dir = bin_dir
        self.adb = bin_dir / "adb"

    def _load(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state / "devices.json").read_text())
        return data

    def _save(self, data: dict[str, Any]) -> None:
        (self.state / "devices.json").write_text(json.dumps(data, indent=2))

    def add(self, serial: str, soc: str = "SM8750", state: str = "device", model: str = "Test Phone",
            props: dict[str, str] | None = None, env: dict[str, str] | None = None) -> Path:
        """A device; returns its file system's folder on the host."""
        data = self._load()
        all_props = {"ro.soc.model": soc, "ro.soc.manufacturer": "QTI", "ro.product.model": model,
                     "ro.build.version.release": "15", "ro.product.name": "phone"}
        if not soc:
            del all_props["ro.soc.model"]
        all_props.update(props or {})
        data["devices"].append({"serial": serial, "state": state, "props": all_props, "env": env or {}})
        self._save(data)
        root = self.state / "fs" / serial
        for folder in ("data/local/tmp", "vendor/lib64", "vendor/lib/rfsa/adsp", "system/lib/rfsa/adsp", "odm"):
            (root / folder).mkdir(parents=True, exist_ok=True)
        return root

    def set(self, serial: str, **changes: Any) -> None:
        """Change a device: its state, or a fault (`push_dies={"name": ..., "times": 1}`)."""
        data = self._load()
        for device in data["devices"]:
            if device["serial"] == serial:
                device.update(changes)
        self._save(data)

    def fail_server(self) -> None:
        """adb's server does not start: every adb command fails, as adb does then."""
        data = self._load()
        data["server_fails"] = True
        self._save(data)

    def path(self, serial: str, device_path: str) -> Path:
        return self.state / "fs" / serial / device_path.lstrip("/")

    def calls(self) -> list[list[str]]:
        log = self.state / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def pushes(self) -> list[str]:
        """The file name of every push so far (part suffix removed)."""
        return [Path(c[c.index("push") + 2]).name.removesuffix(".qnnctl-part") for c in self.calls() if "push" in c]

    def clear_calls(self) -> None:
        (self.state / "calls.jsonl").unlink(missing_ok=True)


def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Phones:
    """The stand-in adb, first on PATH, with no device yet and none of the developer's settings."""
    for name in ANDROID_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    state = tmp_path / "phones"
    (state / "fs").mkdir(parents=True)
    (state / "devices.json").write_text(json.dumps({"devices": []}))
    bin_dir = tmp_path / "adb-bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "adb"
    wrapper.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
                       "from tests.standin_adb import main\nsys.exit(main(sys.argv[1:]))\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv(STATE_VARIABLE, str(state))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return Phones(state, bin_dir)


def fake_library(name: str, build: str | None = BUILD_2_51) -> bytes:
    """A small stand-in for one of QAIRT's device libraries: ELF magic, its build id string."""
    body = b"\x7fELF" + b"\x00" * 60 + f"{name} ".encode()
    return body + (build.encode() + b"\x00" if build else b"") + b"\x00" * 64


def add_device_side(root: Path, build: str | None = BUILD_2_51, arches: tuple[int, ...] = ARCHES,
                    prepare: bool = True, skel_build: str | None = None) -> Path:
    """The SDK's device files at `root` (lib/aarch64-android, lib/hexagon-vNN/unsigned)."""
    android = root / "lib" / "aarch64-android"
    android.mkdir(parents=True, exist_ok=True)
    names = ["libQnnHtp.so", "libQnnSystem.so", *(f"libQnnHtpV{n}Stub.so" for n in arches)]
    if prepare:
        names.append("libQnnHtpPrepare.so")
    for name in names:
        (android / name).write_bytes(fake_library(name, build))
    for n in arches:
        hexagon = root / "lib" / f"hexagon-v{n}" / "unsigned"
        hexagon.mkdir(parents=True, exist_ok=True)
        skel = f"libQnnHtpV{n}Skel.so"
        (hexagon / skel).write_bytes(fake_library(skel, skel_build or build))
    return root
