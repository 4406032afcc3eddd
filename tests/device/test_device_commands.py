"""A device's commands that fail: a shell command, the sha256 of its files. Each is refused saying
what the device (or adb) said and what to do, in whole words (a changed word is a failure here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qnnctl.device.adb import Adb, Device, DeviceError
from tests.phones import Phones

CHECK_HINT = "check the device (`adb devices`), then run the same command again"
DIGEST = "ab" * 32


def device(serial: str) -> Device:
    return Device(Adb(os.environ), serial)


@pytest.mark.parametrize(("state", "said"), [
    ("device", "cat: /data/none: No such file or directory"),
    ("offline", "error: device offline"),  # unplugged since it was chosen: adb's words, not the device's
], ids=["command-fails", "device-offline"])
def test_a_device_command_that_fails_is_refused_with_what_was_said_and_the_fix(
        phones: Phones, state: str, said: str) -> None:
    phones.add("R5CT1")
    chosen = device("R5CT1")
    phones.set("R5CT1", state=state)
    with pytest.raises(DeviceError) as caught:
        chosen.shell("cat /data/none")  # checked unless asked not to be
    assert (caught.value.message, caught.value.hint) == (f"R5CT1: `cat /data/none` failed: {said}", CHECK_HINT)
    assert chosen.shell("cat /data/none", check=False).returncode == 1


def test_the_sha256_of_files_on_a_device_gone_offline_is_refused_saying_so(phones: Phones) -> None:
    """The loop that hashes each file ends with the status of its last `sha256sum` or `echo -`: it
    fails only when adb does. That is said as sha256sum's failure, not as a shell command's (the
    whole loop, which the user never typed)."""
    root = phones.add("R5CT1")
    (root / "data" / "local" / "tmp" / "a").write_bytes(b"a")
    chosen = device("R5CT1")
    assert chosen.sha256(["/data/local/tmp/a"]) == {
        "/data/local/tmp/a": "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"}
    phones.set("R5CT1", state="offline")
    with pytest.raises(DeviceError) as caught:
        chosen.sha256(["/data/local/tmp/a"])
    assert (caught.value.message, caught.value.hint) == ("R5CT1: sha256sum failed: error: device offline", CHECK_HINT)


@pytest.mark.parametrize(("script", "answers"), [
    ("cat >/dev/null", 1),  # says nothing for the file there: the missing one's `-` is all
    (f"cat >/dev/null; echo '{DIGEST}  -'; echo '{DIGEST}  -'", 3),  # two lines for the file there
], ids=["silent", "twice"])
def test_a_device_whose_sha256sum_answers_more_or_less_than_once_a_file_is_refused(
        tmp_path: Path, phones: Phones, script: str, answers: int) -> None:
    """Each file's answer is known only by its place among the lines (no name is read back): one
    line too few or too many would give a file another's digest, or none."""
    device_bin = tmp_path / "device-bin"
    device_bin.mkdir()
    (device_bin / "sha256sum").write_text(f"#!/bin/sh\n{script}\n")
    (device_bin / "sha256sum").chmod(0o755)
    root = phones.add("R5CT1", env={"PATH": f"{device_bin}:/usr/bin:/bin"})
    (root / "data" / "local" / "tmp" / "a").write_bytes(b"a")
    with pytest.raises(DeviceError) as caught:
        device("R5CT1").sha256(["/data/local/tmp/a", "/data/local/tmp/none"])
    assert (caught.value.message, caught.value.hint) == (
        f"R5CT1: sha256sum gave {answers} answers for 2 files",
        "check the device (`adb shell sha256sum < /system/bin/sh`), then run the same command again")


def test_a_device_without_sha256sum_is_said_so_not_read_as_missing_files(tmp_path: Path, phones: Phones) -> None:
    """Each file's `sha256sum` failing read as a file not there: every push sent everything again,
    then refused what it had sent ("sha256 missing on the device")."""
    bare = tmp_path / "device-bin"  # a PATH with neither sha256sum nor anything else
    bare.mkdir()
    root = phones.add("R5CT1", env={"PATH": str(bare)})
    (root / "data" / "local" / "tmp" / "a").write_bytes(b"a")
    with pytest.raises(DeviceError) as caught:
        device("R5CT1").sha256(["/data/local/tmp/a"])
    assert (caught.value.message, caught.value.hint) == (
        "R5CT1 has no sha256sum, with which qnnctl checks the files on a device",
        "Android's own toybox has one: check that `adb shell sha256sum < /system/bin/sh` prints a digest, "
        "and what the device's PATH holds")
