"""What a device says is read within bounds: a phone (or what answers in its place) may print
without end, or hold a "library" of any size; qnnctl reads at most what no real answer passes,
then stops it and says so, rather than filling the memory and the disk."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path

import pytest

from qnnctl.device import adb
from qnnctl.device.adb import Adb, Device, DeviceError
from qnnctl.device.plan import plan_push, resolve_soc
from qnnctl.device.push import push_plan
from qnnctl.doctor.context import Context
from qnnctl.doctor.device import DEVICE_CHECKS
from qnnctl.doctor.diagnose import run_checks
from qnnctl.sdk.layout import Sdk
from tests.conftest import run_qnnctl
from tests.device.test_device import V2_51, make_sdk
from tests.phones import BUILD_2_47, BUILD_2_51, Phones, fake_library


def device(serial: str) -> Device:
    return Device(Adb(os.environ), serial)


def test_a_device_file_past_what_qnnctl_reads_is_stopped_there(
        phones: Phones, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adb, "FILE_MOST", 1 << 20)
    root = phones.add("R5CT1")
    small = bytes(range(256)) * 4096 + b"\r\n\r"  # 1 MiB and 3 bytes: read as they are, unmangled
    (root / "data" / "small").write_bytes(small[: 1 << 20])
    assert device("R5CT1").read("/data/small") == small[: 1 << 20]
    (root / "data" / "big").write_bytes(small)
    with pytest.raises(DeviceError) as caught:
        device("R5CT1").read("/data/big")
    assert caught.value.message == ("`adb -s R5CT1 exec-out cat '/data/big'` printed more than 1.0 MiB, more than "
                                    "qnnctl reads of it: it was stopped there")
    assert caught.value.hint == ("check what the device answers to it (`adb -s R5CT1 exec-out cat '/data/big'`); "
                                 "a phone that says that much is not one qnnctl can use")


def test_a_preinstalled_library_past_what_qnnctl_reads_is_unreadable_to_doctor(
        tmp_path: Path, phones: Phones, monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor reads a phone's own libQnn* whole to find its build: one of gigabytes (a sparse file,
    a device that lies) took twice its size in memory, and as much of the disk."""
    monkeypatch.setattr(adb, "FILE_MOST", 1 << 20)
    sdk = make_sdk(tmp_path)
    root = phones.add("R5CT1", soc="SM8750")
    with open(root / "vendor" / "lib64" / "libQnnHtp.so", "wb") as big:
        big.write(fake_library("libQnnHtp.so", BUILD_2_47))
        big.truncate(4 << 20)
    ctx = Context(spec=str(sdk), environ=dict(os.environ), cwd=Path.cwd(), offline=True, device="")
    found = {r.id: r for r in run_checks(ctx, DEVICE_CHECKS)}["device.preinstalled"]
    assert found.status == "warn"
    assert found.detail.startswith("preinstalled /vendor/lib64/libQnnHtp.so (unreadable), not the host SDK's")


def test_a_device_that_answers_past_what_qnnctl_reads_is_stopped_on_the_command_line(phones: Phones) -> None:
    """A property of 17 MiB: getprop's answer passes the 16 MiB qnnctl reads of any answer. The
    device is listed without what it would not say within them, and why is said."""
    phones.add("R5CT1", props={"ro.qnnctl.flood": "x" * (17 << 20)})
    proc = run_qnnctl("device", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [(row["serial"], row["soc"]) for row in json.loads(proc.stdout)["devices"]] == [("R5CT1", None)]
    assert proc.stderr == ("qnnctl: warning: `adb -s R5CT1 shell getprop` printed more than 16.0 MiB, more than "
                           "qnnctl reads of it: it was stopped there\n")


def test_a_push_to_a_device_that_stopped_answering_is_stopped_in_time(
        tmp_path: Path, phones: Phones, monkeypatch: pytest.MonkeyPatch) -> None:
    """A push had no timeout at all (a large library over a slow cable takes its time): a device
    that stopped answering held it for ever. It has a query's time (made short here) and its
    file's at 256 kB/s, and nothing is put in place."""
    monkeypatch.setattr(adb, "QUERY_TIMEOUT", 1.0)
    sdk = make_sdk(tmp_path)
    # The file's share of the time: a second, here.
    monkeypatch.setattr(adb, "PUSH_SLOWEST", (sdk / "lib" / "aarch64-android" / "libQnnHtp.so").stat().st_size)
    phones.add("R5CT1", soc="SM8650")
    phones.set("R5CT1", push_hangs={"name": "libQnnHtp.so", "times": 1})
    plan = plan_push(Sdk(sdk, V2_51, "--sdk"), resolve_soc("SM8650", None))
    started = time.monotonic()
    with pytest.raises(DeviceError) as caught:
        push_plan(device("R5CT1"), plan)
    assert 1.5 < time.monotonic() - started < 15
    assert re.fullmatch(r"`adb -s R5CT1 push \S+/libQnnHtp\.so \S+/libQnnHtp\.so\.qnnctl-part` did not answer in 2 s",
                        caught.value.message), caught.value.message
    folder = phones.path("R5CT1", plan.dest)
    assert sorted(p.name for p in folder.iterdir()) == ["libQnnHtp.so.qnnctl-part"]  # half of it, not in place


@pytest.mark.timeout(60)
def test_a_device_file_that_never_ends_is_stopped_in_time(phones: Phones, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device path that blocks its reader (a pipe no one writes, a device node) held `cat` and
    qnnctl for ever."""
    monkeypatch.setattr(adb, "QUERY_TIMEOUT", 1.0)
    root = phones.add("R5CT1")
    fifo = root / "data" / "pipe"
    os.mkfifo(fifo)
    started = time.monotonic()
    try:
        with pytest.raises(DeviceError) as caught:
            device("R5CT1").read("/data/pipe")
    finally:
        # The stand-in's `cat` (the phone's, on a real one) still waits on the pipe: a writer
        # that closes at once ends it, rather than leaving it behind the test.
        with contextlib.suppress(OSError):  # ENXIO: no reader is left
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert time.monotonic() - started < 15
    assert caught.value.message == "`adb -s R5CT1 exec-out cat '/data/pipe'` did not answer in 1 s"
    assert caught.value.hint == "check the device and its cable (`adb devices`), then run the same command again"


def test_doctor_reads_no_more_than_64_of_a_phones_own_libraries(tmp_path: Path, phones: Phones) -> None:
    """Each preinstalled libQnn* is read whole for its build: a phone (or what answers in its place)
    that lists thousands kept doctor reading one after the other. The first 64 are read, the rest
    counted, and doctor says they were not read."""
    sdk = make_sdk(tmp_path)
    root = phones.add("R5CT1", soc="SM8750")
    for i in range(64 + 6):  # all of the host SDK's build
        (root / "vendor" / "lib64" / f"libQnnX{i:03d}.so").write_bytes(fake_library("libQnnHtp.so", BUILD_2_51))
    phones.clear_calls()
    ctx = Context(spec=str(sdk), environ=dict(os.environ), cwd=Path.cwd(), offline=True, device="")
    found = {r.id: r for r in run_checks(ctx, DEVICE_CHECKS)}["device.preinstalled"]
    assert found.status == "warn"
    assert found.detail.startswith("preinstalled 6 more libQnn* (not read: qnnctl reads the first 64), not the host "
                                   f"SDK's {BUILD_2_51.removeprefix('v')}: they load instead"), found.detail
    read = sorted(m for c in phones.calls() for a in c for m in re.findall(r"/vendor/lib64/libQnnX\d+\.so", a))
    assert read == [f"/vendor/lib64/libQnnX{i:03d}.so" for i in range(64)]
    for i in range(64, 70):
        (root / "vendor" / "lib64" / f"libQnnX{i:03d}.so").unlink()
    found = {r.id: r for r in run_checks(ctx, DEVICE_CHECKS)}["device.preinstalled"]
    assert (found.status, found.detail) == ("ok", f"64 preinstalled libQnn* of build {BUILD_2_51.removeprefix('v')}, "
                                                  "the host SDK's")


@pytest.mark.parametrize(("stderr", "stdout", "said"), [
    ("* daemon started successfully\nerror: no devices/emulators found\n", "", "error: no devices/emulators found"),
    ("", "pushing...\nadb: error: failed to copy 'a' to '/b': No space left\n",
     "adb: error: failed to copy 'a' to '/b': No space left"),
    ("* daemon started successfully\nadb: unknown command foo\n", "", "adb: unknown command foo"),
    ("first words", "second words\n", "first words"),  # stderr's last line and stdout's first stay apart
    ("", "\n  only this  \n", "only this"),
    ("", "", "exit status 7"),
    ("error: \x1b]0;title\x07\n", "", "error: \\x1b]0;title\\x07"),
], ids=["error", "adb-error", "adb", "no-error-line", "stripped", "nothing", "escaped"])
def test_adbs_own_words_for_a_failure(stderr: str, stdout: str, said: str) -> None:
    """Its first error line (stderr's first), else its first line, else its exit status; escaped."""
    import subprocess

    proc = subprocess.CompletedProcess(["adb"], 7, stdout, stderr)
    assert adb._adb_message(proc) == said


def test_a_device_file_that_cannot_be_read_is_named_with_what_the_device_said(phones: Phones) -> None:
    phones.add("R5CT1")
    with pytest.raises(DeviceError) as caught:
        device("R5CT1").read("/data/none")
    assert caught.value.message == "cannot read R5CT1:/data/none: cat: /data/none: No such file or directory"


@pytest.mark.parametrize(("script", "said"), [
    ("exit 3", "exit 3"),  # nothing on stderr: the exit status is what there is to say
    (r"printf '\377 not UTF-8\n' >&2; exit 1", "\ufffd not UTF-8"),
], ids=["silent", "not-utf8"])
def test_a_device_file_that_cannot_be_read_is_named_with_what_there_is_to_say(
        tmp_path: Path, phones: Phones, script: str, said: str) -> None:
    """A device whose cat fails otherwise than toybox's does."""
    device_bin = tmp_path / "device-bin"
    device_bin.mkdir()
    (device_bin / "cat").write_text(f"#!/bin/sh\n{script}\n")
    (device_bin / "cat").chmod(0o755)
    phones.add("R5CT1", env={"PATH": f"{device_bin}:/usr/bin:/bin"})
    with pytest.raises(DeviceError) as caught:
        device("R5CT1").read("/data/local/tmp")
    assert caught.value.message == f"cannot read R5CT1:/data/local/tmp: {said}"


def test_a_device_that_does_not_say_its_model_or_soc_is_described_so(phones: Phones) -> None:
    phones.add("R5CT1", soc="", model="")
    assert device("R5CT1").describe() == "R5CT1 (unknown model, Android 15, SoC unknown)"
