"""`qnnctl device list|push|env|run` and `qnnctl doctor --device`, on the stand-in adb.

No phone is attached here: tests/standin_adb.py answers as adb and a device do, keeping each
device's file system in a folder and running shell commands for real with /bin/sh (so exit
codes and streaming are real). The SDKs are real layouts whose device libraries are small files
carrying a build id as QAIRT's do (tests/device/test_device_genuine.py runs on Qualcomm's own).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qnnctl.device import socs
from qnnctl.device.adb import AdbNotFoundError, find_adb, parse_devices, parse_props
from qnnctl.device.plan import (
    DEVICE_BASE,
    MissingDeviceFilesError,
    UnknownSocError,
    UnservableSocError,
    device_environment,
    plan_push,
    remote_command,
    render_device_env,
    resolve_soc,
)
from qnnctl.doctor.context import Context
from qnnctl.doctor.device import DEVICE_CHECKS
from qnnctl.doctor.diagnose import run_checks
from qnnctl.doctor.report import Result
from qnnctl.sdk.layout import Sdk
from tests.conftest import require_tool, run_qnnctl
from tests.phones import BUILD_2_47, BUILD_2_51, Phones, add_device_side, fake_library
from tests.sdkfactory import SdkSpec, build_sdk_tree

V2_51 = "2.51.0.260929"
V2_37 = "2.37.0.250724"
DEST = f"{DEVICE_BASE}/{V2_51}"
DSP = "/vendor/lib/rfsa/adsp;/system/lib/rfsa/adsp;/dsp"
DEVICE_IDS = ["device.connection", "device.soc", "device.libraries", "device.preinstalled",
              "device.adsp_library_path"]


def make_sdk(tmp_path: Path, version: str = V2_51, build: str | None = BUILD_2_51, device_side: bool = True,
             **side: object) -> Path:
    """An SDK root (host libraries of `build`) and, unless told otherwise, its device side."""
    root = build_sdk_tree(tmp_path / "qairt" / version, SdkSpec(version=version, build_id=build))
    if device_side:
        add_device_side(root, build, **side)  # type: ignore[arg-type]
    return root


@pytest.fixture
def sdk(tmp_path: Path) -> Path:
    return make_sdk(tmp_path)


def push(*args: str) -> subprocess.CompletedProcess[str]:
    return run_qnnctl("device", "push", *args)


def pushed(phones: Phones, serial: str, dest: str = DEST) -> dict[str, bytes]:
    folder = phones.path(serial, dest)
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.is_dir() else {}


def expected_set(sdk: Path, n: int) -> dict[str, bytes]:
    android = sdk / "lib" / "aarch64-android"
    files = {name: (android / name).read_bytes()
             for name in ("libQnnHtp.so", "libQnnSystem.so", f"libQnnHtpV{n}Stub.so", "libQnnHtpPrepare.so")}
    files[f"libQnnHtpV{n}Skel.so"] = (sdk / "lib" / f"hexagon-v{n}" / "unsigned" / f"libQnnHtpV{n}Skel.so").read_bytes()
    return dict(sorted(files.items()))


# -- the table and the planner ---------------------------------------------------------------------


def test_the_table_is_the_one_executorch_keeps_with_its_source_and_date() -> None:
    by_arch = {a.name: [s.model for s in socs.SOCS if s.arch == a.number] for a in socs.ARCHES}
    assert by_arch == {
        "V68": ["SM8350", "SA8295", "QCM6490"],
        "V69": ["SM8450", "SM8475", "SXR2230P"],
        "V73": ["SM8550", "SA8255", "SSG2115P", "SSG2125P", "SXR1230P", "QCS9100"],
        "V75": ["SM8650"],
        "V79": ["SM8750", "SXR2330P"],
        "V81": ["SM8850", "SM8845", "SA8797", "SAR2230P", "SW6100"],
    }
    for soc in socs.SOCS:
        assert "qc_schema.py" in soc.source
        assert "_soc_info_table" in soc.source
        assert soc.seen == "2026-12-01"
    assert {a.name: a.since for a in socs.ARCHES if a.since} == {"V79": (2, 30), "V81": (2, 42)}
    assert all(a.evidence and a.seen for a in socs.ARCHES)


@pytest.mark.parametrize(("reported", "model"), [
    ("SM8750", "SM8750"), ("SM8750P", "SM8750"), ("sm8650", "SM8650"), (" SM8550\n", "SM8550"),
    ("SM8650-AB", "SM8650"), ("SXR2230P", "SXR2230P"), ("SXR2330P", "SXR2330P"), ("SSG2125P", "SSG2125P"),
    ("SM1234", None), ("SDM865", None), ("", None), ("Tensor G4", None),
])
def test_soc_names_with_a_suffix_are_found(reported: str, model: str | None) -> None:
    found = socs.find_soc(reported)
    assert (found.model if found else None) == model


@pytest.mark.parametrize("soc", [pytest.param(s, id=s.model) for s in socs.SOCS])
def test_every_row_plans_its_generations_files_from_the_sdk_layout(soc: socs.Soc, sdk: Path) -> None:
    n = soc.arch
    plan = plan_push(Sdk(sdk, V2_51, "--sdk"), soc)
    assert plan.dest == DEST
    assert plan.arch_name == f"V{n}"
    assert [(str(f.source.relative_to(sdk)), f.device_path) for f in plan.files] == [
        ("lib/aarch64-android/libQnnHtp.so", f"{DEST}/libQnnHtp.so"),
        ("lib/aarch64-android/libQnnSystem.so", f"{DEST}/libQnnSystem.so"),
        (f"lib/aarch64-android/libQnnHtpV{n}Stub.so", f"{DEST}/libQnnHtpV{n}Stub.so"),
        ("lib/aarch64-android/libQnnHtpPrepare.so", f"{DEST}/libQnnHtpPrepare.so"),
        (f"lib/hexagon-v{n}/unsigned/libQnnHtpV{n}Skel.so", f"{DEST}/libQnnHtpV{n}Skel.so"),
    ]
    assert {f.build_id for f in plan.files} == {BUILD_2_51[1:]}
    assert all(f.size == f.source.stat().st_size for f in plan.files)
    assert plan.build_id == BUILD_2_51[1:]
    assert plan.environment() == {"LD_LIBRARY_PATH": DEST, "ADSP_LIBRARY_PATH": f"{DEST};{DSP}"}


def test_an_sdk_older_than_the_generation_cannot_serve_it(tmp_path: Path) -> None:
    old = make_sdk(tmp_path, V2_37, build=None, arches=(68, 69, 73, 75))
    with pytest.raises(UnservableSocError) as caught:
        plan_push(Sdk(old, V2_37, "--sdk"), resolve_soc(None, "SM8850"))
    assert "SDK 2.37.0.250724 cannot serve SM8850 (HTP V81): V81 needs QAIRT 2.42 or later" in caught.value.message
    proc = push("--sdk", str(old), "--soc", "SM8850", "--dry-run")
    assert proc.returncode == 1
    assert "cannot serve SM8850 (HTP V81): V81 needs QAIRT 2.42 or later" in proc.stderr
    assert "`qnnctl install 2.42` or later" in proc.stderr
    assert proc.stdout == ""
    # 2.37 is new enough for V79: its files are what it lacks, not the release.
    lacking = push("--sdk", str(old), "--soc", "SM8750", "--dry-run")
    assert lacking.returncode == 1
    assert "lacks what SM8750 (HTP V79) needs" in lacking.stderr
    # What it serves, it plans.
    assert push("--sdk", str(old), "--soc", "SM8650", "--dry-run").returncode == 0


def test_an_sdk_installed_without_its_device_side_names_what_is_missing(tmp_path: Path, cache_dir: Path) -> None:
    installed = build_sdk_tree(cache_dir / "sdks" / V2_51, SdkSpec(version=V2_51, build_id=BUILD_2_51))
    (installed / ".qnnctl.json").write_text(json.dumps({"schema": 1, "version": V2_51, "files": {}}))
    proc = push("--sdk", V2_51, "--soc", "SM8750P", "--dry-run")
    assert proc.returncode == 1, proc.stderr
    assert (f"SDK {V2_51} at {installed} lacks what SM8750 (HTP V79) needs: lib/aarch64-android/libQnnSystem.so, "
            "lib/aarch64-android/libQnnHtpV79Stub.so, lib/hexagon-v79/unsigned/libQnnHtpV79Skel.so") in proc.stderr
    # Installed whole: its archive has no device side, so a reinstall would not bring one.
    assert "--force" not in proc.stderr
    assert proc.stderr.endswith(
        f"qnnctl: hint: SDK {V2_51} was installed whole, so its archive has no lib/aarch64-android/ and "
        "lib/hexagon-v79/unsigned/ (`qnnctl doctor --verify` tells whether files were lost since): a reinstall "
        "would lack them too; push from an SDK whose archive holds them, a full QAIRT release: `qnnctl device "
        "push --sdk VERSION`\n"), proc.stderr
    with pytest.raises(MissingDeviceFilesError):
        plan_push(Sdk(installed, V2_51, "qnnctl cache"), resolve_soc("SM8750", None))
    # Installed in parts, without them: the install that adds them.
    (installed / ".qnnctl.json").write_text(json.dumps({"schema": 1, "version": V2_51, "files": {},
                                                        "components": ["host"], "partial": True}))
    parts = push("--sdk", V2_51, "--soc", "SM8750P", "--dry-run")
    assert parts.returncode == 1, parts.stderr
    assert parts.stderr.endswith(f"qnnctl: hint: add them: `qnnctl install {V2_51} --components "
                                 "host,android,hexagon-v79` (fetches only what is missing)\n"), parts.stderr


def test_an_sdk_that_mixes_builds_is_refused(tmp_path: Path) -> None:
    mixed = make_sdk(tmp_path, skel_build=BUILD_2_47)
    proc = push("--sdk", str(mixed), "--soc", "SM8750", "--dry-run")
    assert proc.returncode == 1
    assert "mixes builds: libQnnHtp.so is build 2.51.0.260929181845" in proc.stderr
    assert "libQnnHtpV79Skel.so is build 2.47.0.260601114230" in proc.stderr
    assert "transport CRC mismatch, error 14001" in proc.stderr


def test_without_libqnnhtpprepare_the_plan_warns_and_goes_on(tmp_path: Path) -> None:
    root = make_sdk(tmp_path, prepare=False)
    proc = push("--sdk", str(root), "--soc", "SM8650", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert [f["name"] for f in plan["files"]] == ["libQnnHtp.so", "libQnnSystem.so", "libQnnHtpV75Stub.so",
                                                  "libQnnHtpV75Skel.so"]
    assert plan["warnings"] == ["lib/aarch64-android/libQnnHtpPrepare.so is not in the SDK: the runtime warns "
                                "without it"]


def test_dry_run_with_soc_talks_to_no_device_and_prints_the_plan(sdk: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # No adb at all: a dry run with --soc must not need one.
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin")
    runner = tmp_path / "qnn_executor_runner"
    runner.write_bytes(b"#!/system/bin/sh\n")
    proc = push("--sdk", str(sdk), "--soc", "SM8750P", "--dry-run", str(runner))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    stub = sdk / "lib" / "aarch64-android" / "libQnnHtpV79Stub.so"
    assert f"{stub}\t{DEST}/libQnnHtpV79Stub.so\t{stub.stat().st_size}\t{BUILD_2_51[1:]}" in lines
    assert f"{runner}\t{DEST}/qnn_executor_runner\t17\t-" in lines
    clash = tmp_path / "libQnnHtp.so"
    clash.write_bytes(b"mine")
    refused = push("--sdk", str(sdk), "--soc", "SM8750", "--dry-run", str(clash))
    assert refused.returncode == 2
    assert "would overwrite libQnnHtp.so on the device" in refused.stderr
    assert lines[-2:] == [f"export LD_LIBRARY_PATH='{DEST}'", f"export ADSP_LIBRARY_PATH='{DEST};{DSP}'"]
    assert "plan for SM8750 (HTP V79)" in proc.stderr

    as_json = push("--sdk", str(sdk), "--soc", "SM8750", "--dry-run", "--json", "--dest", "/data/local/tmp/mine")
    data = json.loads(as_json.stdout)
    assert data["schema"] == 1
    assert data["dry_run"] is True
    assert data["serial"] is None
    assert (data["soc"], data["htp_arch"], data["dest"]) == ("SM8750", "V79", "/data/local/tmp/mine")
    assert data["sdk"] == {"version": V2_51, "root": str(sdk), "build_id": BUILD_2_51[1:]}
    assert set(data["files"][0]) == {"name", "source", "device_path", "size", "build_id", "role"}
    assert [f["role"] for f in data["files"]] == ["backend", "system", "stub", "prepare", "skel"]
    assert data["environment"] == {"LD_LIBRARY_PATH": "/data/local/tmp/mine",
                                   "ADSP_LIBRARY_PATH": f"/data/local/tmp/mine;{DSP}"}


def test_unknown_soc_is_exit_2_listing_the_known_ones(sdk: Path, phones: Phones) -> None:
    phones.add("R5CT1", soc="SM1234")
    proc = push("--sdk", str(sdk))
    assert proc.returncode == 2, proc.stderr
    assert "device R5CT1 reports 'SM1234'; the SoCs qnnctl knows: V68: SM8350, SA8295, QCM6490; V69:" in proc.stderr
    assert "V81: SM8850, SM8845, SA8797, SAR2230P, SW6100" in proc.stderr
    assert "--soc" in proc.stderr
    assert phones.pushes() == []
    # --soc names it.
    named = push("--sdk", str(sdk), "--soc", "SM8650")
    assert named.returncode == 0, named.stderr
    assert "libQnnHtpV75Skel.so" in pushed(phones, "R5CT1")
    # An unknown --soc is a usage error too.
    wrong = push("--sdk", str(sdk), "--soc", "SM9999", "--dry-run")
    assert wrong.returncode == 2
    assert "--soc 'SM9999' is not a SoC qnnctl knows" in wrong.stderr


def test_a_device_without_ro_soc_model_is_unknown(sdk: Path, phones: Phones) -> None:
    phones.add("OLD1", soc="")
    proc = push("--sdk", str(sdk))
    assert proc.returncode == 2
    assert "reports no SoC (ro.soc.model is empty)" in proc.stderr
    with pytest.raises(UnknownSocError):
        resolve_soc("", None)


# -- push ------------------------------------------------------------------------------------------


def test_push_puts_the_set_there_then_skips_what_is_the_same(sdk: Path, phones: Phones, tmp_path: Path) -> None:
    phones.add("R5CT1", soc="SM8750P")
    runner = tmp_path / "qnn_executor_runner"
    runner.write_text("#!/bin/sh\necho run\n")
    runner.chmod(0o755)
    proc = push("--sdk", str(sdk), str(runner))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{DEST}\n"
    want = {**expected_set(sdk, 79), "qnn_executor_runner": runner.read_bytes()}
    assert pushed(phones, "R5CT1") == dict(sorted(want.items()))
    assert os.access(phones.path("R5CT1", f"{DEST}/qnn_executor_runner"), os.X_OK)  # the mode came along
    assert "6 files pushed" in proc.stderr
    assert sorted(phones.pushes()) == sorted(want)

    phones.clear_calls()
    again = push("--sdk", str(sdk), str(runner), "--json")
    assert again.returncode == 0, again.stderr
    assert phones.pushes() == []
    report = json.loads(again.stdout)
    assert report["dry_run"] is False
    assert report["serial"] == "R5CT1"
    assert {f["action"] for f in report["files"]} == {"skipped"}
    assert all(len(f["sha256"]) == 64 for f in report["files"])

    # One file changed on the device: that one only is sent again.
    phones.path("R5CT1", f"{DEST}/libQnnHtpV79Stub.so").write_bytes(b"changed")
    phones.clear_calls()
    third = push("--sdk", str(sdk), str(runner))
    assert third.returncode == 0, third.stderr
    assert phones.pushes() == ["libQnnHtpV79Stub.so"]
    assert pushed(phones, "R5CT1") == dict(sorted(want.items()))


def test_names_with_backslashes_newlines_and_spaces_round_trip(sdk: Path, phones: Phones, tmp_path: Path) -> None:
    """GNU sha256sum writes `\\<digest>  /data/a\\\\b` for a name holding a backslash: read by
    name, every file of such a --dest was "missing" after it arrived."""
    phones.add("R5CT1", soc="SM8750P")
    dest = "/data/local/tmp/a\\b c\\n"
    extra = tmp_path / "run\\ner\nx y"
    extra.write_text("#!/bin/sh\necho run\n")
    proc = push("--sdk", str(sdk), "--dest", dest, str(extra))
    assert proc.returncode == 0, proc.stderr
    assert pushed(phones, "R5CT1", dest) == dict(sorted({**expected_set(sdk, 79), extra.name: extra.read_bytes()}
                                                        .items()))
    phones.clear_calls()
    again = push("--sdk", str(sdk), "--dest", dest, str(extra), "--json")
    assert again.returncode == 0, again.stderr
    assert phones.pushes() == []  # each digest was read back as the device's
    assert {f["action"] for f in json.loads(again.stdout)["files"]} == {"skipped"}
    phones.path("R5CT1", f"{dest}/{extra.name}").write_bytes(b"changed")
    assert push("--sdk", str(sdk), "--dest", dest, str(extra)).returncode == 0
    assert phones.pushes() == [extra.name]


def test_a_push_that_dies_half_way_leaves_the_set_in_place_and_resumes(tmp_path: Path, sdk: Path,
                                                                       phones: Phones) -> None:
    phones.add("R5CT1", soc="SM8750")
    first = push("--sdk", str(sdk))
    assert first.returncode == 0, first.stderr
    before = pushed(phones, "R5CT1")
    # A newer build of the same SDK version comes along; its push loses the cable on the stub.
    newer = make_sdk(tmp_path / "newer")
    for f in (newer / "lib").rglob("*.so"):
        f.write_bytes(f.read_bytes() + b"newer")
    phones.set("R5CT1", push_dies={"name": "libQnnHtpV79Stub.so", "times": 1})
    phones.clear_calls()
    died = push("--sdk", str(newer))
    assert died.returncode == 1
    assert (f"pushing {newer}/lib/aarch64-android/libQnnHtpV79Stub.so to R5CT1:{DEST}/libQnnHtpV79Stub.so"
            ".qnnctl-part failed: adb: error: failed to copy") in died.stderr
    assert "Connection reset by peer" in died.stderr
    assert died.stderr.endswith("qnnctl: hint: check the connection (`adb devices`), then run the same command "
                                "again: what is already on the device is not sent again\n"), died.stderr
    # The set that was there is whole and untouched; the half file is a part file beside it.
    assert {k: v for k, v in pushed(phones, "R5CT1").items() if not k.endswith(".qnnctl-part")} == before
    part = phones.path("R5CT1", f"{DEST}/libQnnHtpV79Stub.so.qnnctl-part")
    size = (newer / "lib" / "aarch64-android" / "libQnnHtpV79Stub.so").stat().st_size
    assert part.stat().st_size == size // 2
    assert phones.pushes() == ["libQnnHtp.so", "libQnnSystem.so", "libQnnHtpV79Stub.so"]

    phones.clear_calls()
    resumed = push("--sdk", str(newer))
    assert resumed.returncode == 0, resumed.stderr
    # What arrived whole before is not sent again.
    assert phones.pushes() == ["libQnnHtpV79Stub.so", "libQnnHtpPrepare.so", "libQnnHtpV79Skel.so"]
    assert pushed(phones, "R5CT1") == expected_set(newer, 79)


def test_what_arrives_damaged_is_caught_and_not_put_in_place(sdk: Path, phones: Phones) -> None:
    phones.add("R5CT1", soc="SM8650")
    phones.set("R5CT1", push_corrupts={"name": "libQnnHtpV75Skel.so", "times": 1})
    proc = push("--sdk", str(sdk))
    assert proc.returncode == 4, proc.stderr
    assert "what arrived on R5CT1 is not what was sent (libQnnHtpV75Skel.so: sha256" in proc.stderr
    assert "nothing was put in place" in proc.stderr
    assert pushed(phones, "R5CT1") == {name + ".qnnctl-part": data for name, data in expected_set(sdk, 75).items()
                                       if name != "libQnnHtpV75Skel.so"}
    again = push("--sdk", str(sdk))
    assert again.returncode == 0, again.stderr
    assert pushed(phones, "R5CT1") == expected_set(sdk, 75)


# -- which device ----------------------------------------------------------------------------------


def test_devices_adb_cannot_use_fail_with_adbs_reason_and_the_fix(sdk: Path, phones: Phones) -> None:
    none = push("--sdk", str(sdk))
    assert none.returncode == 1
    assert "adb sees no device" in none.stderr
    assert "USB debugging" in none.stderr

    phones.add("LOCKED", state="unauthorized")
    locked = push("--sdk", str(sdk))
    assert locked.returncode == 1
    assert "device LOCKED is unauthorized" in locked.stderr
    assert "Allow USB debugging?" in locked.stderr

    phones.add("GONE", state="offline")
    several = push("--sdk", str(sdk))
    assert several.returncode == 2
    assert "adb sees 2 devices (LOCKED (unauthorized), GONE (offline))" in several.stderr
    assert "--serial" in several.stderr
    offline = push("--sdk", str(sdk), "--serial", "GONE")
    assert offline.returncode == 1
    assert "device GONE is offline" in offline.stderr
    assert "adb reconnect" in offline.stderr
    missing = push("--sdk", str(sdk), "--serial", "NOPE")
    assert missing.returncode == 1
    assert "adb sees no device NOPE; it sees LOCKED (unauthorized), GONE (offline)" in missing.stderr

    phones.add("R5CT1", soc="SM8550")
    chosen = push("--sdk", str(sdk), "--serial", "R5CT1")
    assert chosen.returncode == 0, chosen.stderr
    assert "libQnnHtpV73Skel.so" in pushed(phones, "R5CT1")
    # ANDROID_SERIAL is adb's own default, and qnnctl's.
    phones.add("R5CT2", soc="SM8650")
    by_env = run_qnnctl("device", "push", "--sdk", str(sdk), env={**os.environ, "ANDROID_SERIAL": "R5CT2"})
    assert by_env.returncode == 0, by_env.stderr
    assert "libQnnHtpV75Skel.so" in pushed(phones, "R5CT2")


def test_adb_from_ADB_then_PATH_then_android_home(tmp_path: Path, phones: Phones) -> None:
    adb = str(phones.adb)
    home = tmp_path / "android-sdk"
    (home / "platform-tools").mkdir(parents=True)
    tools_adb = home / "platform-tools" / "adb"
    tools_adb.write_text("#!/bin/sh\n")
    tools_adb.chmod(0o755)
    bare = "/usr/bin:/bin"
    other = tmp_path / "other-adb"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    assert find_adb({"ADB": str(other), "PATH": str(phones.bin_dir), "ANDROID_HOME": str(home)}) == str(other)
    assert find_adb({"PATH": str(phones.bin_dir), "ANDROID_HOME": str(home)}) == adb
    assert find_adb({"PATH": bare, "ANDROID_HOME": str(home)}) == str(tools_adb)
    with pytest.raises(AdbNotFoundError) as given:
        find_adb({"ADB": str(tmp_path / "nothing"), "PATH": str(phones.bin_dir)})
    assert f"ADB is {tmp_path / 'nothing'}, which is not an executable file" in given.value.message
    with pytest.raises(AdbNotFoundError) as nowhere:
        find_adb({"PATH": bare, "ANDROID_HOME": str(tmp_path / "empty")})
    assert "not on PATH, not in $ANDROID_HOME/platform-tools" in nowhere.value.message
    assert "sudo apt-get install adb" in (nowhere.value.hint or "")
    assert "platform-tools" in (nowhere.value.hint or "")

    no_adb = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + bare}
    proc = run_qnnctl("device", "list", env=no_adb)
    assert proc.returncode == 1
    assert "adb is not installed or not found: ADB is not set, not on PATH, ANDROID_HOME is not set" in proc.stderr
    assert "sudo apt-get install adb" in proc.stderr
    # A push (or its plan) without --soc: a plan that needs no device is one option away.
    planned = run_qnnctl("device", "push", "--dry-run", "--sdk", str(make_sdk(tmp_path)), env=no_adb)
    assert planned.returncode == 1
    assert planned.stderr.endswith("; or see the plan without a device: `qnnctl device push --dry-run --soc SOC` "
                                   "(SM8750...)\n"), planned.stderr


def test_adb_output_is_read_as_adb_prints_it() -> None:
    text = ("* daemon not running; starting now at tcp:5037\n* daemon started successfully\n"
            "List of devices attached\n"
            "R5CT1234ABC            device usb:1-1 product:pa3qxxx model:SM_S938B device:pa3q transport_id:2\n"
            "emulator-5554          offline transport_id:1\n"
            "0123456789ABCDEF       no permissions (missing udev rules? user is in the plugdev group); see "
            "[http://developer.android.com/tools/device.html] usb:1-4 transport_id:3\n"
            "ZY22ABC                unauthorized usb:1-3 transport_id:4\n\n")
    found = parse_devices(text)
    assert [(d.serial, d.state) for d in found] == [("R5CT1234ABC", "device"), ("emulator-5554", "offline"),
                                                    ("0123456789ABCDEF", "no permissions"),
                                                    ("ZY22ABC", "unauthorized")]
    assert found[0].fields["model"] == "SM_S938B"
    assert parse_props("[ro.soc.model]: [SM8750P]\n[ro.product.model]: [SM-S938B]\n[empty]: []\n") == {
        "ro.soc.model": "SM8750P", "ro.product.model": "SM-S938B", "empty": ""}


def test_device_list_shows_each_device_with_its_soc_and_generation(phones: Phones) -> None:
    empty = run_qnnctl("device", "list")
    assert (empty.returncode, empty.stdout) == (0, "")
    assert "adb sees no device" in empty.stderr
    phones.add("R5CT1", soc="SM8750P", model="Galaxy S25")
    phones.add("PIXEL9", soc="Tensor G4", model="Pixel 9", props={"ro.soc.manufacturer": "Google"})
    phones.add("QRD8850", soc="SM8850", model="QRD")
    phones.add("LOCKED", state="unauthorized")
    phones.add("GONE", state="offline")
    proc = run_qnnctl("device", "list")
    assert proc.returncode == 0, proc.stderr
    # A header, and columns as wide as their widest cell.
    assert proc.stdout.splitlines() == [
        "serial   state         model       soc        htp",
        "R5CT1    device        Galaxy S25  SM8750     V79",
        "PIXEL9   device        Pixel 9     Tensor G4  unknown (Tensor G4)",
        "QRD8850  device        QRD         SM8850     V81",
        "LOCKED   unauthorized  -           -          unknown",
        "GONE     offline       -           -          unknown",
    ]
    data = json.loads(run_qnnctl("device", "list", "--json").stdout)
    assert data["schema"] == 1
    assert data["devices"][0] == {"serial": "R5CT1", "state": "device", "model": "Galaxy S25", "soc": "SM8750P",
                                  "soc_model": "SM8750", "htp_arch": "V79"}
    assert data["devices"][1]["htp_arch"] is None
    assert data["devices"][1]["soc"] == "Tensor G4"
    assert data["devices"][3] == {"serial": "LOCKED", "state": "unauthorized", "model": None, "soc": None,
                                  "soc_model": None, "htp_arch": None}


EVIL = "Evil\x1b]0;PWNED-TITLE\x07RED"  # sets a terminal's title when printed as it is
EVIL_SHOWN = "Evil\\x1b]0;PWNED-TITLE\\x07RED"


def test_what_a_device_says_is_shown_with_control_characters_escaped(sdk: Path, phones: Phones) -> None:
    """A device whose model, manufacturer, SoC, shell environment and file names carry terminal
    escapes, and a second one whose serial does: nothing of it reaches the terminal raw."""
    root = phones.add("R5CT1", soc="SM8750", model=EVIL,
                      env={"ADSP_LIBRARY_PATH": f"{DEST};/dsp/x\x1b[31my"})
    (root / "vendor" / "lib64" / f"libQnn{EVIL}.so").write_bytes(fake_library("libQnnHtp.so", BUILD_2_47))
    runs = [run_qnnctl("device", "list"), run_qnnctl("device", "list", "--json"),
            run_qnnctl("doctor", "--sdk", str(sdk), "--offline", "--device"),
            run_qnnctl("doctor", "--sdk", str(sdk), "--offline", "--device", "--json")]
    phones.add(f"S\x1b[2J{EVIL}", soc=f"SM8750{EVIL}", props={"ro.soc.manufacturer": EVIL})
    runs += [run_qnnctl("device", "list", "--json"), push("--sdk", str(sdk)),
             run_qnnctl("doctor", "--sdk", str(sdk), "--offline", "--device", "--json")]
    for proc in runs:
        for raw in ("\x1b", "\x07", "\\u001b", "\\u0007"):  # nor escaped by JSON alone: jq -r would print it
            assert raw not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    listed, listed_json, doctor, doctor_json, two, several, other = runs
    assert listed.stdout.splitlines()[1].split() == ["R5CT1", "device", EVIL_SHOWN, "SM8750", "V79"]
    assert json.loads(listed_json.stdout)["devices"][0]["model"] == EVIL_SHOWN
    assert f"R5CT1 ({EVIL_SHOWN}, Android 15, SoC SM8750)" in doctor.stdout
    found = {c["id"]: c for c in json.loads(doctor_json.stdout)["checks"]}
    assert found["device.connection"]["detail"].startswith(f"R5CT1 ({EVIL_SHOWN}, ")
    assert f"/vendor/lib64/libQnn{EVIL_SHOWN}.so" in found["device.preinstalled"]["detail"]
    assert f"ADSP_LIBRARY_PATH='{DEST};/dsp/x\\x1b[31my': " in found["device.adsp_library_path"]["detail"]
    assert [d["serial"] for d in json.loads(two.stdout)["devices"]] == ["R5CT1", f"S\\x1b[2J{EVIL_SHOWN}"]
    assert several.returncode == 2
    assert f"S\\x1b[2J{EVIL_SHOWN} (device)" in several.stderr
    assert other.returncode == 1


# -- env and run -----------------------------------------------------------------------------------


def test_device_env_exports_for_androids_sh(sdk: Path) -> None:
    proc = run_qnnctl("device", "env", "--sdk", str(sdk))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"export LD_LIBRARY_PATH='{DEST}'\n"
                           f"export ADSP_LIBRARY_PATH='{DEST};/vendor/lib/rfsa/adsp;/system/lib/rfsa/adsp;/dsp'\n")
    as_json = run_qnnctl("device", "env", "--dest", "/data/local/tmp/x", "--shell", "json")
    assert json.loads(as_json.stdout) == {"LD_LIBRARY_PATH": "/data/local/tmp/x",
                                          "ADSP_LIBRARY_PATH": f"/data/local/tmp/x;{DSP}"}
    # The default folder follows the selected SDK, as every command selects it.
    pinned = run_qnnctl("device", "env", V2_37)
    assert pinned.returncode == 2  # env takes no VERSION argument: --sdk does
    by_version = run_qnnctl("device", "env", "--sdk", V2_37)
    assert f"{DEVICE_BASE}/{V2_37}'" in by_version.stdout


@pytest.mark.parametrize("dest", ["/data/local/tmp/a;b", "/data/local/tmp/a:b", "relative/dir", "/data/x\ny"])
def test_a_folder_that_would_split_a_path_list_is_refused(dest: str) -> None:
    proc = run_qnnctl("device", "env", "--dest", dest)
    assert proc.returncode == 2
    assert "--dest" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("shell", ["sh", "dash", "bash", "mksh"])
def test_the_exports_and_the_run_line_mean_the_same_to_a_real_shell(shell: str, tmp_path: Path) -> None:
    """mksh is Android's sh; the others read the same POSIX quoting."""
    path = require_tool(shell)
    dest = str(tmp_path / "it's here $HOME `x`")
    text = render_device_env(device_environment(dest), "sh")
    out = subprocess.run([path, "-c", text + 'printf "%s\\n%s\\n" "$LD_LIBRARY_PATH" "$ADSP_LIBRARY_PATH"'],
                         capture_output=True, text=True, check=True).stdout
    assert out == f"{dest}\n{dest};{DSP}\n"
    # What `qnnctl device run` has the device's sh run: in the folder, with the environment,
    # every word of the command as it was given.
    os.mkdir(dest)
    words = ["sh", "-c", 'pwd; printf "%s|" "$@"; echo; echo "$ADSP_LIBRARY_PATH"', "x", "a b", "'", "$HOME", ";"]
    line = remote_command(dest, words)
    ran = subprocess.run([path, "-c", line], capture_output=True, text=True, check=True).stdout
    assert ran == f"{dest}\na b|'|$HOME|;|\n{dest};{DSP}\n"


def test_run_passes_arguments_environment_and_exit_code(sdk: Path, phones: Phones) -> None:
    phones.add("R5CT1", soc="SM8750")
    early = run_qnnctl("device", "run", "--sdk", str(sdk), "--", "true")
    assert early.returncode == 1
    assert f"R5CT1:{DEST} does not exist: nothing was pushed there" in early.stderr
    assert "`qnnctl device push --serial R5CT1` first" in early.stderr
    assert push("--sdk", str(sdk)).returncode == 0
    script = ('printf "%s|" "$@"; echo; pwd; echo "$LD_LIBRARY_PATH"; echo "$ADSP_LIBRARY_PATH"; '
              "ls libQnnHtpV79Skel.so; exit 7")
    proc = run_qnnctl("device", "run", "--sdk", str(sdk), "--", "sh", "-c", script, "runner",
                      "a b", "it's", "$HOME", "--serial", "-v")
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.splitlines() == ["a b|it's|$HOME|--serial|-v|", DEST, DEST, f"{DEST};{DSP}",
                                        "libQnnHtpV79Skel.so"]
    # Without `--`, what follows the command is its own all the same.
    bare = run_qnnctl("device", "run", "--sdk", str(sdk), "sh", "-c", "echo $0 $1", "x", "--help")
    assert (bare.returncode, bare.stdout) == (0, "x --help\n")
    # A command killed by a signal ends as the device's sh reports it: 128 + the signal.
    killed = run_qnnctl("device", "run", "--sdk", str(sdk), "--", "sh", "-c", "kill -SEGV $$")
    assert killed.returncode == 139
    nothing = run_qnnctl("device", "run", "--sdk", str(sdk))
    assert nothing.returncode == 2


def test_run_streams_output_as_it_comes(sdk: Path, phones: Phones) -> None:
    import selectors

    phones.add("R5CT1", soc="SM8750")
    go = phones.path("R5CT1", "/data/local/tmp/go")
    script = "echo first; while [ ! -e /data/local/tmp/go ]; do sleep 0.05; done; echo second"
    child = subprocess.Popen([sys.executable, "-m", "qnnctl", "device", "run", "--dest", "/data/local/tmp",
                              "--", "sh", "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    try:
        # "first" arrives while the command is still running, waiting for `go`.
        with selectors.DefaultSelector() as selector:
            selector.register(child.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=60), "nothing came while the command ran"
        assert child.stdout.readline() == "first\n"
        assert child.poll() is None
        go.touch()
        assert child.stdout.readline() == "second\n"
        assert child.wait(timeout=60) == 0
    finally:
        go.touch()
        if child.poll() is None:
            child.kill()
        child.wait()


# -- doctor --device -------------------------------------------------------------------------------


def device_checks(spec: str | None, device: str = "") -> dict[str, Result]:
    ctx = Context(spec=spec, environ=dict(os.environ), cwd=Path.cwd(), offline=True, device=device)
    results = run_checks(ctx, DEVICE_CHECKS)
    assert [r.id for r in results] == DEVICE_IDS
    return {r.id: r for r in results}


def test_doctor_device_on_a_good_push_and_on_none(sdk: Path, phones: Phones) -> None:
    plain = run_qnnctl("doctor", "--sdk", str(sdk), "--json", "--offline")
    assert not [c for c in json.loads(plain.stdout)["checks"] if c["id"].startswith("device.")]
    assert phones.calls() == []  # without --device, adb is never asked

    phones.add("R5CT1", soc="SM8750P")
    assert push("--sdk", str(sdk)).returncode == 0
    proc = run_qnnctl("doctor", "--sdk", str(sdk), "--json", "--offline", "--device")
    report = json.loads(proc.stdout)
    found = {c["id"]: c for c in report["checks"]}
    assert [c["id"] for c in report["checks"]][-5:] == DEVICE_IDS
    assert {i: found[i]["status"] for i in DEVICE_IDS} == dict.fromkeys(DEVICE_IDS, "ok"), found
    assert found["device.connection"]["detail"].startswith("R5CT1 (Test Phone, Android 15, SoC SM8750P)")
    assert found["device.soc"]["detail"] == f"SM8750P is SM8750, HTP V79; SDK {V2_51} has its stub and skel"
    assert found["device.libraries"]["detail"] == (f"5 files in R5CT1:{DEST}, all build {BUILD_2_51[1:]}, "
                                                   "as the host SDK")

    phones.add("R5CT2", soc="SM8650")
    cli = run_qnnctl("doctor", "--sdk", str(sdk), "--device", "R5CT2", "--json", "--offline")
    assert cli.returncode == 1
    named = {c["id"]: c for c in json.loads(cli.stdout)["checks"]}
    assert named["device.connection"]["detail"].startswith("R5CT2 (")
    by_serial = device_checks(str(sdk), "R5CT2")
    assert by_serial["device.soc"].status == "ok"
    assert by_serial["device.libraries"].status == "fail"
    assert by_serial["device.libraries"].detail == f"nothing pushed to R5CT2:{DEST}"
    assert by_serial["device.libraries"].hint == f"`qnnctl device push --serial R5CT2 --sdk {sdk}`"


def test_doctor_device_without_a_device(sdk: Path, phones: Phones) -> None:
    proc = run_qnnctl("doctor", "--sdk", str(sdk), "--json", "--offline", "--device")
    assert proc.returncode == 1
    found = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert found["device.connection"]["status"] == "fail"
    assert found["device.connection"]["detail"] == "adb sees no device"
    assert {found[i]["status"] for i in DEVICE_IDS[1:]} == {"skip"}
    assert found["device.soc"]["detail"] == "no device to check (see device.connection)"


def test_doctor_sees_a_mixed_set_on_the_device(tmp_path: Path, sdk: Path, phones: Phones) -> None:
    phones.add("R5CT1", soc="SM8750")
    assert push("--sdk", str(sdk)).returncode == 0
    # A skel of another build was put there by hand (the transport CRC mismatch of the field).
    phones.path("R5CT1", f"{DEST}/libQnnHtpV79Skel.so").write_bytes(fake_library("libQnnHtpV79Skel.so", BUILD_2_47))
    found = device_checks(str(sdk))
    assert found["device.libraries"].status == "fail"
    assert ("mixed builds (libQnnHtp.so is 2.51.0.260929181845, libQnnSystem.so is 2.51.0.260929181845, "
            "libQnnHtpV79Stub.so is 2.51.0.260929181845, libQnnHtpPrepare.so is 2.51.0.260929181845, "
            "libQnnHtpV79Skel.so is 2.47.0.260601114230)") in found["device.libraries"].detail
    # A whole set of another build: coherent, but not the host SDK's.
    old = make_sdk(tmp_path / "old", "2.47.0.260601", BUILD_2_47)
    assert push("--sdk", str(old), "--dest", DEST).returncode == 0
    other = device_checks(str(sdk))
    assert other["device.libraries"].status == "fail"
    assert ("build 2.47.0.260601114230 (SDK 2.47.0.260601), but the host SDK is build 2.51.0.260929181845"
            in other["device.libraries"].detail)
    # One file gone.
    phones.path("R5CT1", f"{DEST}/libQnnHtpV79Stub.so").unlink()
    assert "missing libQnnHtpV79Stub.so" in device_checks(str(sdk))["device.libraries"].detail


def test_doctor_warns_of_preinstalled_libraries_of_another_build(sdk: Path, phones: Phones) -> None:
    root = phones.add("R5CT1", soc="SM8750")
    (root / "vendor" / "lib64" / "libQnnHtp.so").write_bytes(fake_library("libQnnHtp.so", BUILD_2_47))
    (root / "odm" / "lib64").mkdir(parents=True)
    (root / "odm" / "lib64" / "libQnnSystem.so").write_bytes(fake_library("libQnnSystem.so", BUILD_2_51))
    (root / "vendor" / "lib" / "rfsa" / "adsp" / "libQnnHtpV79Skel.so").write_bytes(
        fake_library("libQnnHtpV79Skel.so", BUILD_2_47))
    found = device_checks(str(sdk))["device.preinstalled"]
    assert found.status == "warn"
    assert found.detail.startswith(
        "preinstalled /vendor/lib64/libQnnHtp.so (build 2.47.0.260601114230), /vendor/lib/rfsa/adsp/"
        "libQnnHtpV79Skel.so (build 2.47.0.260601114230), not the host SDK's 2.51.0.260929181845: they load "
        "instead of the pushed ones unless the pushed folder comes first")
    assert "qnnctl device run" in (found.hint or "")
    for f in ("vendor/lib64/libQnnHtp.so", "vendor/lib/rfsa/adsp/libQnnHtpV79Skel.so"):
        (root / f).unlink()
    same = device_checks(str(sdk))["device.preinstalled"]
    assert (same.status, same.detail) == ("ok", "1 preinstalled libQnn* of build 2.51.0.260929181845, the host "
                                                "SDK's")


def test_doctor_model_needs_device(tmp_path: Path, sdk: Path) -> None:
    """The model check itself runs on genuine binaries (tests/test_genuine.py)."""
    same = tmp_path / "same.bin"
    same.write_bytes(b"\0" * 64)
    alone = run_qnnctl("doctor", "--model", str(same))
    assert alone.returncode == 2
    assert "give --device too" in alone.stderr


@pytest.mark.parametrize(("value", "status", "says"), [
    (f"{DEST};{DSP}", "ok", "4 folders, ';'-separated"),
    (f"{DEST}:/vendor/lib/rfsa/adsp", "fail", "separates folders with ':'"),
    (f"{DEST};/vendor/lib/rfsa/adsp;/nowhere", "warn", "no folder /nowhere on the device"),
    (f"/vendor/lib/rfsa/adsp;{DEST}", "warn", f"it does not start with {DEST}"),
    ("", "ok", "not set in the device's shell"),
])
def test_doctor_checks_the_devices_adsp_library_path(value: str, status: str, says: str, sdk: Path,
                                                     phones: Phones) -> None:
    root = phones.add("R5CT1", soc="SM8750", env={"ADSP_LIBRARY_PATH": value} if value else {})
    (root / "dsp").mkdir()
    (root / DEST.lstrip("/")).mkdir(parents=True)
    found = device_checks(str(sdk))["device.adsp_library_path"]
    assert found.status == status, found
    assert says in found.detail


def test_doctor_on_a_soc_it_does_not_know_or_cannot_serve(tmp_path: Path, phones: Phones) -> None:
    phones.add("PIXEL9", soc="Tensor G4", props={"ro.soc.manufacturer": "Google"})
    sdk = make_sdk(tmp_path)
    unknown = device_checks(str(sdk), "PIXEL9")
    assert unknown["device.soc"].status == "fail"
    assert ("ro.soc.model is 'Tensor G4' (made by Google: QNN's HTP backend runs on Qualcomm SoCs); the SoCs "
            "qnnctl knows: V68:") in unknown["device.soc"].detail
    assert unknown["device.libraries"].status == "skip"

    phones.add("QRD8850", soc="SM8850")
    old = make_sdk(tmp_path / "old", V2_37, build=None, arches=(68, 69, 73, 75))
    too_old = device_checks(str(old), "QRD8850")["device.soc"]
    assert too_old.status == "fail"
    assert too_old.detail == ("SM8850 is SM8850, HTP V81; SDK 2.37.0.250724 cannot serve it: V81 needs QAIRT "
                              f"2.42 or later ({socs.arch(81).evidence})")
    bare = make_sdk(tmp_path / "bare", device_side=False)
    lacking = device_checks(str(bare), "QRD8850")["device.soc"]
    assert lacking.status == "fail"
    assert "lacks what SM8850 (HTP V81) needs: lib/aarch64-android/libQnnSystem.so" in lacking.detail



# -- push, as the library does it ------------------------------------------------------------------


def _device(serial: str) -> Any:
    from qnnctl.device.adb import Adb, Device

    return Device(Adb(os.environ), serial)


def test_push_plan_sends_verifies_and_moves_into_place(sdk: Path, phones: Phones) -> None:
    from qnnctl.device.push import PUSHED, SKIPPED, file_sha256, push_plan

    phones.add("R5CT1", soc="SM8650")
    plan = plan_push(Sdk(sdk, V2_51, "--sdk"), resolve_soc("SM8650", None))
    sizes = sum(f.size for f in plan.files)
    result = push_plan(_device("R5CT1"), plan)
    assert [(s.file, s.sha256, s.action) for s in result.sent] == [
        (f, file_sha256(f.source), PUSHED) for f in plan.files]
    assert pushed(phones, "R5CT1") == expected_set(sdk, 75)  # in place, no part file left
    assert sizes == 834
    assert result.summary() == f"5 files pushed (834 bytes), 0 already there, to R5CT1:{DEST}"
    report = result.as_dict()
    assert (report["serial"], report["dest"], report["soc"]) == ("R5CT1", DEST, "SM8650")
    assert report["files"] == [{**f.as_dict(), "sha256": file_sha256(f.source), "action": "pushed"}
                               for f in plan.files]

    phones.clear_calls()
    again = push_plan(_device("R5CT1"), plan)
    assert [s.action for s in again.sent] == [SKIPPED] * 5
    assert phones.pushes() == []
    assert again.summary() == f"0 files pushed (0 bytes), 5 already there, to R5CT1:{DEST}"


def test_push_plan_takes_a_part_that_arrived_whole_and_sends_one_that_did_not(sdk: Path, phones: Phones) -> None:
    from qnnctl.device.push import PUSHED, push_plan

    phones.add("R5CT1", soc="SM8650")
    plan = plan_push(Sdk(sdk, V2_51, "--sdk"), resolve_soc("SM8650", None))
    whole, cut = plan.files[0], plan.files[1]
    for f, data in ((whole, whole.source.read_bytes()), (cut, cut.source.read_bytes()[:-1])):
        part = phones.path("R5CT1", f.device_path + ".qnnctl-part")
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(data)
    result = push_plan(_device("R5CT1"), plan)
    assert {s.action for s in result.sent} == {PUSHED}
    assert whole.name not in phones.pushes()
    assert sorted(phones.pushes()) == sorted(f.name for f in plan.files[1:])
    assert pushed(phones, "R5CT1") == expected_set(sdk, 75)


def test_push_plan_refuses_what_arrived_damaged_naming_each_file(sdk: Path, phones: Phones) -> None:
    import hashlib

    from qnnctl.device.push import push_plan
    from qnnctl.errors import IntegrityError

    phones.add("R5CT1", soc="SM8650")
    phones.set("R5CT1", push_corrupts={"name": "libQnnHtpV75Skel.so", "times": 1})
    plan = plan_push(Sdk(sdk, V2_51, "--sdk"), resolve_soc("SM8650", None))
    skel = next(f for f in plan.files if f.name == "libQnnHtpV75Skel.so")
    part = phones.path("R5CT1", skel.device_path + ".qnnctl-part")
    with pytest.raises(IntegrityError) as refused:
        push_plan(_device("R5CT1"), plan)
    assert not part.exists()  # the bad part removed, the good ones kept for the next push
    assert refused.value.exit_code == 4
    here = hashlib.sha256(skel.source.read_bytes()).hexdigest()
    assert refused.value.message.startswith("what arrived on R5CT1 is not what was sent (libQnnHtpV75Skel.so: "
                                            "sha256 ")
    assert refused.value.message.endswith(f" on the device, {here} here); nothing was put in place")
    assert refused.value.hint == ("run the same command again; if it fails again, check the device's free space "
                                  "(`adb shell df /data/local/tmp`) and the cable")
    assert pushed(phones, "R5CT1") == {name + ".qnnctl-part": data for name, data in expected_set(sdk, 75).items()
                                       if name != "libQnnHtpV75Skel.so"}


def test_push_plan_names_a_part_that_is_not_there_after_its_push(sdk: Path, phones: Phones,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from qnnctl.device.adb import Device
    from qnnctl.device.push import push_plan
    from qnnctl.errors import IntegrityError

    phones.add("R5CT1", soc="SM8650")
    plan = plan_push(Sdk(sdk, V2_51, "--sdk"), resolve_soc("SM8650", None))
    first = plan.files[0]
    real_push = Device.push

    def lost(self: Device, local: Path, remote: str) -> None:
        real_push(self, local, remote)
        if local == first.source:
            phones.path("R5CT1", remote).unlink()  # gone, as on a device that ran out of space

    monkeypatch.setattr(Device, "push", lost)
    with pytest.raises(IntegrityError) as refused:
        push_plan(_device("R5CT1"), plan)
    assert refused.value.message.startswith(f"what arrived on R5CT1 is not what was sent ({first.name}: sha256 "
                                            "missing on the device, ")
    assert refused.value.message.count(" here") == 1  # that file alone


def test_push_sizes_in_words() -> None:
    from qnnctl.device.push import _mb

    assert [_mb(n) for n in (0, 999, 1000, 1499, 1500, 999_999, 1_000_000, 1_250_000)] == [
        "0 bytes", "999 bytes", "1 kB", "1 kB", "2 kB", "1000 kB", "1.0 MB", "1.2 MB"]


def test_the_sha256_of_a_file_larger_than_a_read(tmp_path: Path) -> None:
    import hashlib

    from qnnctl.device.push import file_sha256

    big = tmp_path / "big"
    big.write_bytes(bytes(range(256)) * 8193)
    assert file_sha256(big) == hashlib.sha256(big.read_bytes()).hexdigest()


def test_push_plan_says_what_it_does_with_each_file(sdk: Path, phones: Phones,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    from qnnctl.device.push import push_plan

    phones.add("R5CT1", soc="SM8650")
    plan = plan_push(Sdk(sdk, V2_51, "--sdk"), resolve_soc("SM8650", None))
    there, part = plan.files[0], plan.files[1]
    for f, suffix in ((there, ""), (part, ".qnnctl-part")):
        placed = phones.path("R5CT1", f.device_path + suffix)
        placed.parent.mkdir(parents=True, exist_ok=True)
        placed.write_bytes(f.source.read_bytes())
    with caplog.at_level("INFO", logger="qnnctl.device.push"):
        push_plan(_device("R5CT1"), plan)
    assert caplog.messages == [
        f"{there.name} is already on the device (same sha256)",
        f"{part.name} arrived whole in an earlier push",
        *[f"pushing {f.name} ({f.size} bytes)" for f in plan.files[2:]]]


def test_a_damaged_part_that_cannot_be_removed_is_still_reported_as_damaged(sdk: Path, phones: Phones,
                                                                            tmp_path: Path) -> None:
    from qnnctl.device.push import push_plan
    from qnnctl.errors import IntegrityError

    tools = tmp_path / "device-bin"
    tools.mkdir()
    rm = tools / "rm"
    rm.write_text("#!/bin/sh\necho 'rm: Read-only file system' >&2\nexit 1\n")
    rm.chmod(0o755)
    phones.add("R5CT1", soc="SM8650")
    phones.set("R5CT1", push_corrupts={"name": "libQnnHtpV75Skel.so", "times": 1},
               env={"PATH": f"{tools}:/usr/bin:/bin"})
    plan = plan_push(Sdk(sdk, V2_51, "--sdk"), resolve_soc("SM8650", None))
    with pytest.raises(IntegrityError, match=r"^what arrived on R5CT1 is not what was sent"):
        push_plan(_device("R5CT1"), plan)
    assert phones.path("R5CT1", f"{DEST}/libQnnHtpV75Skel.so.qnnctl-part").exists()  # left, as rm failed


def test_every_damaged_part_is_named_and_removed(sdk: Path, phones: Phones, monkeypatch: pytest.MonkeyPatch) -> None:
    from qnnctl.device.adb import Device
    from qnnctl.device.push import push_plan
    from qnnctl.errors import IntegrityError

    phones.add("R5CT1", soc="SM8650")
    plan = plan_push(Sdk(sdk, V2_51, "--sdk"), resolve_soc("SM8650", None))
    damaged = {plan.files[0].source, plan.files[2].source}
    real_push = Device.push

    def damaging(self: Device, local: Path, remote: str) -> None:
        real_push(self, local, remote)
        if local in damaged:
            phones.path("R5CT1", remote).write_bytes(b"damaged")

    monkeypatch.setattr(Device, "push", damaging)
    with pytest.raises(IntegrityError) as refused:
        push_plan(_device("R5CT1"), plan)
    bad = hashlib.sha256(b"damaged").hexdigest()
    shown = "; ".join(f"{f.name}: sha256 {bad} on the device, {hashlib.sha256(f.source.read_bytes()).hexdigest()} here"
                      for f in (plan.files[0], plan.files[2]))
    assert refused.value.message == f"what arrived on R5CT1 is not what was sent ({shown}); nothing was put in place"
    assert sorted(pushed(phones, "R5CT1")) == sorted(f.name + ".qnnctl-part" for f in (plan.files[1], *plan.files[3:]))


def test_push_sizes_in_megabytes_are_rounded_from_millions_of_bytes() -> None:
    from qnnctl.device.push import _mb

    assert [_mb(n) for n in (1_050_000, 1_949_999, 12_345_678)] == ["1.1 MB", "1.9 MB", "12.3 MB"]
