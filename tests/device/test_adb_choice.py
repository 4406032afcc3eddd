"""Which device: what `adb devices -l` lists is read whole, and a device that cannot be used is
refused saying why and what to do, in whole words (a changed word is a failure here)."""

from __future__ import annotations

import os

import pytest

from qnnctl.device.adb import Adb, DeviceError, Listed
from qnnctl.errors import QnnctlError, UsageError
from tests.phones import Phones

# adb's own words for a USB device it may not open (its state, in `adb devices -l`).
NO_PERMISSIONS = ("no permissions (user in plugdev group; are your udev rules wrong?); see "
                  "[http://developer.android.com/tools/device.html]")
LIST_HINT = "`qnnctl device list` shows the devices adb sees"
REBOOT_HINT = "reboot it into Android, then run the same command again"
WAIT_HINT = "wait a moment, then run the same command again"


def test_adb_devices_is_read_with_every_field_adb_lists(phones: Phones) -> None:
    """Each device's serial (a network device's holds a colon), its state and the key:value fields
    after it, all of them. adb makes a model alphanumeric but prints a product's and a device's
    name as the phone gives it: a colon in one stays in its value."""
    phones.add("R5CT1", model="Galaxy S25", props={"ro.product.name": "qti:kalama"})
    phones.add("192.168.1.5:5555", model="Pixel 8", props={"ro.product.name": "shiba"})
    phones.add("LOCKED", state="unauthorized")
    assert Adb(os.environ).devices() == [
        Listed("R5CT1", "device", {"usb": "1-1", "product": "qti:kalama", "model": "Galaxy_S25",
                                   "device": "phone", "transport_id": "1"}),
        Listed("192.168.1.5:5555", "device", {"product": "shiba", "model": "Pixel_8", "device": "phone",
                                              "transport_id": "2"}),
        Listed("LOCKED", "unauthorized", {"usb": "1-3", "transport_id": "3"}),
    ]
    assert phones.calls() == [["devices", "-l"]]


def test_a_serial_or_a_product_name_with_spaces_is_read_whole(phones: Phones) -> None:
    """A wireless device adb found twice is listed as `adb-R5CT1-AbCdEf (2)._adb-tls-connect._tcp`,
    and a product's name as the phone gives it. Read by the places of its words, the serial's
    second word was taken for the device's state, which was then told to reboot into Android."""
    wireless = "adb-R5CT1-AbCdEf (2)._adb-tls-connect._tcp"
    phones.add(wireless, model="Galaxy S25", props={"ro.product.name": "My Phone"})
    phones.add("(no serial number)", state="unauthorized")
    assert Adb(os.environ).devices() == [
        Listed(wireless, "device", {"product": "My Phone", "model": "Galaxy_S25", "device": "phone",
                                    "transport_id": "1"}),
        Listed("(no serial number)", "unauthorized", {"usb": "1-2", "transport_id": "2"}),
    ]
    assert Adb(os.environ).device(wireless).describe() == f"{wireless} (Galaxy S25, Android 15, SoC SM8750)"


def test_a_serial_that_breaks_its_line_hides_no_device_listed_after_it(phones: Phones) -> None:
    """adb prints a serial as the phone gives it (only the fields after it lose their newlines): one
    holding a newline breaks its line in two, the first a word alone. That word is passed over, and
    the devices listed after it are still read."""
    phones.add("CUT\nR5CT1")
    phones.add("R5CT2")
    assert [(d.serial, d.state) for d in Adb(os.environ).devices()] == [("R5CT1", "device"), ("R5CT2", "device")]


def test_adb_whose_server_does_not_start_fails_with_its_words_and_the_fix(phones: Phones) -> None:
    phones.add("R5CT1")
    phones.fail_server()
    with pytest.raises(DeviceError) as caught:
        Adb(os.environ).devices()
    assert caught.value.message == ("`adb devices` failed: adb: failed to check server version: cannot connect "
                                    "to daemon")
    assert caught.value.hint == "`adb kill-server`, then run the same command again"


@pytest.mark.parametrize(("listed", "serial", "error", "message", "hint"), [
    ([], "R5CT1", DeviceError, "adb sees no device R5CT1", LIST_HINT),
    ([("LOCKED", "unauthorized"), ("R5CT2", "device")], "R5CT1", DeviceError,
     "adb sees no device R5CT1; it sees LOCKED (unauthorized), R5CT2 (device)", LIST_HINT),
    ([], None, DeviceError, "adb sees no device",
     "connect the phone by USB with USB debugging on (Settings > Developer options), then check with "
     "`adb devices`"),
    ([("R5CT1", "device"), ("GONE", "offline")], None, UsageError,
     "adb sees 2 devices (R5CT1 (device), GONE (offline)); which one is meant?",
     "pass --serial SERIAL (or set ANDROID_SERIAL); `qnnctl device list` lists them"),
], ids=["serial-none-seen", "serial-others-seen", "none", "several"])
def test_a_device_that_cannot_be_chosen_is_refused_saying_why_and_what_to_do(
        phones: Phones, listed: list[tuple[str, str]], serial: str | None, error: type[QnnctlError],
        message: str, hint: str) -> None:
    for listed_serial, state in listed:
        phones.add(listed_serial, state=state)
    with pytest.raises(QnnctlError) as caught:
        Adb(os.environ).device(serial)
    assert type(caught.value) is error
    assert (caught.value.message, caught.value.hint) == (message, hint)


@pytest.mark.parametrize(("state", "what", "hint"), [
    ("unauthorized", "is unauthorized: it has not accepted this computer's adb key",
     "unlock the phone and accept the 'Allow USB debugging?' prompt (`adb kill-server` if none shows), then "
     "run the same command again"),
    ("offline", "is offline: adb sees it but cannot talk to it",
     "reconnect the cable (or run `adb reconnect`), then run the same command again"),
    (NO_PERMISSIONS, "cannot be opened: no permission for its USB device",
     "add a udev rule for it (Debian/Ubuntu: `sudo apt-get install android-sdk-platform-tools-common`), or put "
     "yourself in the plugdev group, then reconnect it"),
    ("authorizing", "is still being authorized", WAIT_HINT),
    ("connecting", "is still connecting", WAIT_HINT),
    ("recovery", "is in state 'recovery', not booted into Android", REBOOT_HINT),
    ("sideload", "is in state 'sideload', not booted into Android", REBOOT_HINT),
    ("bootloader", "is in state 'bootloader', not booted into Android", REBOOT_HINT),
    ("detached", "is detached: adb let go of its USB connection (`adb detach`)",
     "attach it again with `adb attach`, then run the same command again"),
], ids=["unauthorized", "offline", "no-permissions", "authorizing", "connecting", "recovery", "sideload",
        "bootloader", "detached"])
def test_a_device_that_is_not_ready_is_refused_naming_its_state_and_the_fix(
        phones: Phones, state: str, what: str, hint: str) -> None:
    phones.add("R5CT1", state=state)
    for serial in ("R5CT1", None):  # named, or the only one adb sees
        with pytest.raises(DeviceError) as caught:
            Adb(os.environ).device(serial)
        assert (caught.value.message, caught.value.hint) == (f"device R5CT1 {what}", hint)


def test_the_device_chosen_keeps_what_adb_listed_of_it(phones: Phones) -> None:
    phones.add("R5CT1", model="Galaxy S25")
    phones.add("R5CT2")
    chosen = Adb(os.environ).device("R5CT1")
    assert (chosen.serial, chosen.listed) == ("R5CT1", Listed("R5CT1", "device", {
        "usb": "1-1", "product": "phone", "model": "Galaxy_S25", "device": "phone", "transport_id": "1"}))
