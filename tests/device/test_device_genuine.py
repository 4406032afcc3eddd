"""`qnnctl device` on Qualcomm's own device libraries: the aarch64 stubs, libQnnHtp.so,
libQnnSystem.so, libQnnHtpPrepare.so and the Hexagon skels (V68 to V81) of QAIRT 2.51, from the
onnxruntime-qnn 2.7.0 aarch64 wheel, placed where a QAIRT SDK keeps them (tests/genuine.py).

Without the wheel these tests skip on a workstation, saying how to fetch it, and fail in CI.
The SDK's host libraries are the tests' own, carrying the same build id.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from qnnctl.device import socs
from qnnctl.doctor.context import Context
from qnnctl.doctor.device import DEVICE_CHECKS
from qnnctl.doctor.diagnose import run_checks
from qnnctl.doctor.report import Result
from qnnctl.sdk.identity import build_id
from tests import genuine
from tests.conftest import run_qnnctl
from tests.phones import Phones
from tests.sdkfactory import EM_AARCH64, SdkSpec, build_sdk_tree
from tests.test_genuine import require

WHEEL = genuine.QAIRT_2_51_DEVICE
BUILD = WHEEL.build_id[1:]
# Not a genuine build: the 2.47 x86_64 wheel has no skels, so a 2.47 skel is made from the 2.51
# one by writing the 2.47 build id over its own (same length, nothing else changes).
OTHER_BUILD = genuine.QAIRT_2_47.build_id
DEST = f"/data/local/tmp/qnnctl/{WHEEL.qairt}"
EM_QDSP6 = 164
ONE_SOC_PER_ARCH = [pytest.param(next(s for s in socs.SOCS if s.arch == a.number), id=a.name) for a in socs.ARCHES]


@pytest.fixture
def sdk(tmp_path: Path) -> Path:
    require(genuine.wheel_path(WHEEL), WHEEL.file_name)
    root = build_sdk_tree(tmp_path / "qairt" / WHEEL.qairt, SdkSpec(version=WHEEL.qairt, build_id=WHEEL.build_id))
    return genuine.lay_out_device_files(WHEEL, root)


def machine(path: Path) -> int:
    """The ELF e_machine of a file: what processor it is for."""
    with open(path, "rb") as handle:
        head = handle.read(20)
    assert head[:4] == b"\x7fELF"
    value: int = struct.unpack_from("<H", head, 18)[0]
    return value


def device_checks(spec: str) -> dict[str, Result]:
    ctx = Context(spec=spec, environ=dict(os.environ), cwd=Path.cwd(), offline=True, device="")
    return {r.id: r for r in run_checks(ctx, DEVICE_CHECKS)}


@pytest.mark.parametrize("soc", ONE_SOC_PER_ARCH)
def test_the_genuine_layout_gives_each_generation_its_own_stub_and_skel(soc: socs.Soc, sdk: Path) -> None:
    n = soc.arch
    proc = run_qnnctl("device", "push", "--sdk", str(sdk), "--soc", soc.model, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    files = {f["name"]: f for f in plan["files"]}
    assert list(files) == ["libQnnHtp.so", "libQnnSystem.so", f"libQnnHtpV{n}Stub.so", "libQnnHtpPrepare.so",
                           f"libQnnHtpV{n}Skel.so"]
    # Qualcomm's own build id, read from each file's .rodata (libQnnSystem.so carries none).
    assert {name: f["build_id"] for name, f in files.items()} == {
        "libQnnHtp.so": BUILD, "libQnnSystem.so": None, f"libQnnHtpV{n}Stub.so": BUILD,
        "libQnnHtpPrepare.so": BUILD, f"libQnnHtpV{n}Skel.so": BUILD}
    assert plan["sdk"]["build_id"] == BUILD
    stub = Path(files[f"libQnnHtpV{n}Stub.so"]["source"])
    skel = Path(files[f"libQnnHtpV{n}Skel.so"]["source"])
    assert stub == sdk / "lib" / "aarch64-android" / f"libQnnHtpV{n}Stub.so"
    assert skel == sdk / "lib" / f"hexagon-v{n}" / "unsigned" / f"libQnnHtpV{n}Skel.so"
    # The stub is for the phone's CPU, the skel for the Hexagon DSP.
    assert machine(stub) == EM_AARCH64
    assert machine(skel) == EM_QDSP6
    assert files[f"libQnnHtpV{n}Skel.so"]["size"] == skel.stat().st_size
    assert plan["environment"]["ADSP_LIBRARY_PATH"] == f"{DEST};/vendor/lib/rfsa/adsp;/system/lib/rfsa/adsp;/dsp"


def test_push_the_genuine_set_and_doctor_reads_its_builds(sdk: Path, phones: Phones) -> None:
    root = phones.add("R5CT1", soc="SM8750P")
    proc = run_qnnctl("device", "push", "--sdk", str(sdk))
    assert proc.returncode == 0, proc.stderr
    folder = phones.path("R5CT1", DEST)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["libQnnHtp.so", "libQnnSystem.so", "libQnnHtpV79Stub.so", "libQnnHtpPrepare.so", "libQnnHtpV79Skel.so"])
    skel = sdk / "lib" / "hexagon-v79" / "unsigned" / "libQnnHtpV79Skel.so"
    assert (folder / "libQnnHtpV79Skel.so").read_bytes() == skel.read_bytes()

    # The phone's own libQnnHtp.so of another build, in /vendor/lib64.
    vendor = root / "vendor" / "lib64" / "libQnnHtp.so"
    shutil.copyfile(sdk / "lib" / "aarch64-android" / "libQnnHtp.so", vendor)
    genuine.rebuild(vendor, WHEEL.build_id, OTHER_BUILD)
    found = device_checks(str(sdk))
    assert found["device.libraries"].status == "ok", found["device.libraries"]
    assert found["device.libraries"].detail == f"5 files in R5CT1:{DEST}, all build {BUILD}, as the host SDK"
    assert found["device.preinstalled"].status == "warn"
    assert found["device.preinstalled"].detail.startswith(
        f"preinstalled /vendor/lib64/libQnnHtp.so (build {OTHER_BUILD[1:]}), not the host SDK's {BUILD}")


def test_a_2_47_skel_beside_2_51_stubs_is_refused_and_seen_on_the_device(tmp_path: Path, sdk: Path,
                                                                        phones: Phones) -> None:
    skel = sdk / "lib" / "hexagon-v79" / "unsigned" / "libQnnHtpV79Skel.so"
    genuine.rebuild(skel, WHEEL.build_id, OTHER_BUILD)
    assert build_id(skel) == OTHER_BUILD[1:]
    phones.add("R5CT1", soc="SM8750")
    proc = run_qnnctl("device", "push", "--sdk", str(sdk))
    assert proc.returncode == 1
    assert (f"mixes builds: libQnnHtp.so is build {BUILD}, libQnnHtpV79Stub.so is build {BUILD}, "
            f"libQnnHtpPrepare.so is build {BUILD}, libQnnHtpV79Skel.so is build {OTHER_BUILD[1:]}") in proc.stderr
    assert "transport CRC mismatch, error 14001" in proc.stderr
    assert phones.pushes() == []

    # The same mix put on the device by hand: doctor names it.
    folder = phones.path("R5CT1", DEST)
    folder.mkdir(parents=True)
    for rel in ("lib/aarch64-android/libQnnHtp.so", "lib/aarch64-android/libQnnSystem.so",
                "lib/aarch64-android/libQnnHtpV79Stub.so", "lib/aarch64-android/libQnnHtpPrepare.so",
                "lib/hexagon-v79/unsigned/libQnnHtpV79Skel.so"):
        shutil.copyfile(sdk / rel, folder / Path(rel).name)
    found = device_checks(str(sdk))["device.libraries"]
    assert found.status == "fail"
    assert f"libQnnHtpV79Stub.so is {BUILD}" in found.detail
    assert f"libQnnHtpV79Skel.so is {OTHER_BUILD[1:]}" in found.detail
    assert "transport setup (error 14001)" in found.detail
