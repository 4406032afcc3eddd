"""What `qnnctl device push` takes from an SDK it did not install (a store, a linked folder, a
folder named by --sdk) is held to the rules every command holds such an SDK to: nothing in it
may be changeable by another user, and in a project with a lock its files are the locked ones.
The host's folders were checked; the device's folders are what lands on the phone."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest

from qnnctl.device.plan import DEVICE_BASE
from tests.conftest import run_qnnctl
from tests.phones import BUILD_2_51, Phones, add_device_side, fake_library
from tests.sdkfactory import SdkSpec, build_sdk_tree, write_zip_from_tree

V2_51 = "2.51.0.260929"
DEST = f"{DEVICE_BASE}/{V2_51}"
ANDROID = "lib/aarch64-android"
SKELS = "lib/hexagon-v79/unsigned"

_as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's takes root")


def _store_sdk(tmp_path: Path) -> tuple[Path, Path]:
    """(the store, its SDK 2.51 with a device side), every folder the user's and 0755."""
    store = tmp_path / "shared" / "store"
    root = build_sdk_tree(store / V2_51, SdkSpec(version=V2_51, build_id=BUILD_2_51))
    add_device_side(root)
    for folder in (tmp_path / "shared", store):
        folder.chmod(0o755)
    return store, root


def _nobody() -> int:
    return pwd.getpwnam("nobody").pw_uid


@_as_root
@pytest.mark.parametrize("how", ["android folder 0777", "skel folder 0775", "a stub of nobody's"])
@pytest.mark.parametrize("named", ["by --sdk PATH", "from QNNCTL_STORES"])
def test_device_files_another_user_could_change_are_not_pushed(how: str, named: str, tmp_path: Path,
                                                               phones: Phones, cache_dir: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    store, root = _store_sdk(tmp_path)
    if how == "android folder 0777":
        culprit, why = root / ANDROID, "is writable by its group and others (mode 0777)"
        culprit.chmod(0o777)
    elif how == "skel folder 0775":
        culprit, why = root / SKELS, "is writable by its group (mode 0775)"
        culprit.chmod(0o775)
    else:
        culprit, why = root / ANDROID / "libQnnHtpV79Stub.so", f"belongs to user nobody (uid {_nobody()})"
        os.chown(culprit, _nobody(), -1)
    # What the other user can now put there: a library of their own, of the same build.
    planted = culprit if culprit.is_file() else culprit / ("libQnnHtp.so" if "android" in how else
                                                           "libQnnHtpV79Skel.so")
    planted.write_bytes(fake_library(planted.name, BUILD_2_51) + b"\x00planted by another user")
    phones.add("R5CT1", soc="SM8750")
    if named == "from QNNCTL_STORES":
        monkeypatch.setenv("QNNCTL_STORES", str(store))
        spec = V2_51
    else:
        spec = str(root)
    # The host side of the SDK is sound: the SDK is selected and used on the host.
    env = run_qnnctl("env", spec, "--shell", "json")
    assert env.returncode == 0, env.stderr
    proc = run_qnnctl("device", "push", "--sdk", spec)
    assert (proc.returncode, proc.stdout) == (4, ""), proc.stderr
    assert f"{culprit} {why}" in proc.stderr, proc.stderr
    assert "nothing was pushed" in proc.stderr
    assert ("chmod go-w" if "writable" in why else "chown root") in proc.stderr
    assert phones.pushes() == []
    assert not phones.path("R5CT1", DEST).exists()
    # Not in a dry run's plan either.
    dry = run_qnnctl("device", "push", "--sdk", spec, "--dry-run", "--soc", "SM8750")
    assert (dry.returncode, dry.stdout) == (4, ""), dry.stderr


@_as_root
def test_a_store_sdks_sound_device_files_are_pushed(tmp_path: Path, phones: Phones, cache_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The check refuses only what another user could change: the same store, sound, is pushed."""
    store, root = _store_sdk(tmp_path)
    monkeypatch.setenv("QNNCTL_STORES", str(store))
    phones.add("R5CT1", soc="SM8750")
    proc = run_qnnctl("device", "push", "--sdk", V2_51)
    assert (proc.returncode, proc.stdout) == (0, f"{DEST}\n"), proc.stderr
    assert phones.path("R5CT1", f"{DEST}/libQnnHtp.so").read_bytes() == (root / ANDROID / "libQnnHtp.so").read_bytes()


def test_in_a_locked_project_the_files_pushed_are_the_locked_ones(tmp_path: Path, phones: Phones,
                                                                   cache_dir: Path) -> None:
    """The lock pins the android and hexagon components' digests; a folder whose device files
    differ (another archive's, or changed since) is refused, as `lower` refuses it."""
    tree = build_sdk_tree(tmp_path / "tree" / "qairt" / V2_51, SdkSpec(version=V2_51, build_id=BUILD_2_51))
    add_device_side(tree)
    archive = tmp_path / f"v{V2_51}.zip"
    write_zip_from_tree(tmp_path / "tree", archive)
    installed = run_qnnctl("install", "--file", str(archive))
    assert installed.returncode == 0, installed.stderr
    locked = run_qnnctl("lock", V2_51)
    assert locked.returncode == 0, locked.stderr
    # The same SDK elsewhere, one device library changed (of the same build: the plan's own
    # check of builds passes it).
    copy = tmp_path / "elsewhere" / V2_51
    shutil.copytree(installed.stdout.strip(), copy, symlinks=True)
    stub = copy / ANDROID / "libQnnHtpV79Stub.so"
    stub.write_bytes(fake_library(stub.name, BUILD_2_51) + b"\x00not the locked one")
    phones.add("R5CT1", soc="SM8750")
    # The SDK of qnnctl's cache is the locked one, and is pushed.
    good = run_qnnctl("device", "push", "--sdk", V2_51)
    assert good.returncode == 0, good.stderr
    phones.clear_calls()
    proc = run_qnnctl("device", "push", "--sdk", str(copy))
    assert (proc.returncode, proc.stdout) == (4, ""), proc.stderr
    assert f"the files of component android of SDK {V2_51} at {copy} (--sdk) have digest" in proc.stderr, proc.stderr
    assert phones.pushes() == []
    assert phones.path("R5CT1", f"{DEST}/libQnnHtpV79Stub.so").read_bytes() != stub.read_bytes()
