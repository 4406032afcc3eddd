"""A stand-in for `adb`, for tests on a machine with no phone attached.

It answers the adb commands qnnctl sends, as adb and a device answer them, from a state folder
(`$QNNCTL_TEST_ADB_STATE`):

    devices.json      the devices: serial, state, system properties, shell environment, faults
    fs/<serial>/      each device's file system: device path /data/x is fs/<serial>/data/x
    calls.jsonl       every invocation's arguments, one JSON list a line

- `devices [-l]` lists them as adb does (`%-22s %s` then `usb:... model:... transport_id:N`), and
  refuses any other argument with adb's usage line;
- `"server_fails": true` in devices.json: adb's server does not start, and every command fails
  with adb's words for that and exit status 1;
- `-s SERIAL` (or $ANDROID_SERIAL) picks one; an unknown serial, none or several, an
  unauthorized or offline device fail with adb's words and exit status 1;
- `shell getprop [NAME]` answers from the device's properties (`[name]: [value]` lines);
- any other `shell COMMAND` (and `exec-out COMMAND`) runs for real with the host's /bin/sh in the
  device's file system: device paths in COMMAND (/data, /vendor, /odm, /system, /dsp, /sdcard)
  are mapped into fs/<serial>/ and mapped back in what it prints, which streams as it comes; its
  exit status is adb's (128+N for a signal, as the device's sh reports it);
- `push LOCAL REMOTE` copies the file (mode kept, folders made), printing adb's summary; the
  faults `push_dies` (half the file written, then adb's error and exit 1), `push_corrupts`
  (a flipped byte, reported as success) and `push_hangs` (half the file written, then nothing
  more for half a minute: a device that stopped answering) apply to a named file a given number
  of times.

Run as `adb` through a wrapper a test fixture writes (tests/phones.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

STATE_VARIABLE = "QNNCTL_TEST_ADB_STATE"
DEVICE_ROOTS = ("data", "vendor", "odm", "system", "dsp", "sdcard", "product")
_DEVICE_PATH = re.compile(r"(?<![\w./-])/(" + "|".join(DEVICE_ROOTS) + r")(?=[/\s'\";:)]|$)")
UNAUTHORIZED = ("error: device unauthorized.\n"
                "This adb server's $ADB_VENDOR_KEYS is not set\n"
                "Try 'adb kill-server' if that seems wrong.\n"
                "Otherwise check for a confirmation dialog on your device.\n")
SERVER_FAILS = ("* daemon not running; starting now at tcp:5037\n"
                "ADB server didn't ACK\n"
                "Full server startup log: /tmp/adb.1000.log\n"
                "Server had pid: 4242\n"
                "--- adb starting (pid 4242) ---\n"
                "* failed to start daemon\n"
                "adb: failed to check server version: cannot connect to daemon\n")


def state_dir() -> Path:
    return Path(os.environ[STATE_VARIABLE])


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((state_dir() / "devices.json").read_text())
    return data


def save(data: dict[str, Any]) -> None:
    path = state_dir() / "devices.json"
    path.with_suffix(".tmp").write_text(json.dumps(data, indent=2))
    os.replace(path.with_suffix(".tmp"), path)


def fs_root(serial: str) -> Path:
    return state_dir() / "fs" / serial


def to_host(text: str, root: Path) -> str:
    return _DEVICE_PATH.sub(lambda m: f"{root}/{m.group(1)}", text)


def fail(message: str) -> int:
    sys.stderr.write(message if message.endswith("\n") else message + "\n")
    return 1


def devices_text(devices: list[dict[str, Any]], long: bool) -> str:
    lines = ["List of devices attached"]
    for n, device in enumerate(devices, 1):
        if not long:
            lines.append(f"{device['serial']}\t{device['state']}")
            continue
        line = f"{device['serial']:<22} {device['state']}"
        # A network device (HOST:PORT, or a wireless one found by mDNS) has no USB path.
        usb = "" if ":" in device["serial"] or device["serial"].endswith("._tcp") else f" usb:1-{n}"
        if device["state"] == "device":
            props = device.get("props", {})
            model = props.get("ro.product.model", "").replace(" ", "_")
            line += (f"{usb} product:{props.get('ro.product.name', 'phone')} model:{model} "
                     f"device:{props.get('ro.product.device', 'phone')}")
        elif device["state"] == "unauthorized":
            line += usb
        lines.append(f"{line} transport_id:{n}")
    return "\n".join(lines) + "\n\n"


class Rewriter:
    """Copies a child's output to ours as it comes, with host paths of the device's file system
    turned back into device paths (holding back only what may be the start of one)."""

    def __init__(self, root: Path, out: BinaryIO) -> None:
        self.prefix = str(root).encode()
        self.out = out
        self.held = b""

    def feed(self, chunk: bytes) -> None:
        data = (self.held + chunk).replace(self.prefix, b"")
        keep = 0
        for size in range(min(len(self.prefix) - 1, len(data)), 0, -1):
            if self.prefix.startswith(data[-size:]):
                keep = size
                break
        self.held = data[len(data) - keep:] if keep else b""
        self.out.write(data[: len(data) - keep])
        self.out.flush()

    def close(self) -> None:
        self.out.write(self.held)
        self.out.flush()


def run_shell(device: dict[str, Any], command: str) -> int:
    root = fs_root(device["serial"])
    words = shlex.split(command) if command.strip() else []
    props: dict[str, str] = device.get("props", {})
    if words[:1] == ["getprop"] and len(words) <= 2:
        if len(words) == 2:
            sys.stdout.write(props.get(words[1], "") + "\n")
        else:
            sys.stdout.write("".join(f"[{k}]: [{v}]\n" for k, v in sorted(props.items())))
        return 0
    env = {"PATH": "/usr/bin:/bin", "HOME": "/", "ANDROID_ROOT": "/system", **device.get("env", {})}
    child = subprocess.Popen(["/bin/sh", "-c", to_host(command, root)], cwd=root, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stderr is not None

    def pump(source: BinaryIO, sink: BinaryIO) -> None:
        rewriter = Rewriter(root, sink)
        while True:
            chunk = os.read(source.fileno(), 65536)
            if not chunk:
                break
            rewriter.feed(chunk)
        rewriter.close()

    threads = [threading.Thread(target=pump, args=(child.stdout, sys.stdout.buffer)),
               threading.Thread(target=pump, args=(child.stderr, sys.stderr.buffer))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    code = child.wait()
    return 128 - code if code < 0 else code


def take_fault(data: dict[str, Any], device: dict[str, Any], kind: str, name: str) -> bool:
    fault = device.get(kind)
    if not fault or fault.get("name") != name or fault.get("times", 0) <= 0:
        return False
    fault["times"] -= 1
    save(data)
    return True


def push(data: dict[str, Any], device: dict[str, Any], local: str, remote: str) -> int:
    source = Path(local)
    if not source.is_file():
        return fail(f"adb: error: cannot stat '{local}': No such file or directory")
    target = Path(to_host(remote, fs_root(device["serial"])))
    if remote.endswith("/") or target.is_dir():
        target = target / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = source.read_bytes()
    name = Path(remote).name.removesuffix(".qnnctl-part")
    if take_fault(data, device, "push_dies", name):
        target.write_bytes(payload[: len(payload) // 2])
        return fail(f"adb: error: failed to copy '{local}' to '{remote}': no response: Connection reset by peer")
    if take_fault(data, device, "push_hangs", name):
        target.write_bytes(payload[: len(payload) // 2])
        time.sleep(30)
        return fail(f"adb: error: failed to copy '{local}' to '{remote}': no response")
    if take_fault(data, device, "push_corrupts", name):
        payload = bytes([payload[0] ^ 0xFF]) + payload[1:]
    target.write_bytes(payload)
    shutil.copymode(source, target)
    sys.stdout.write(f"{local}: 1 file pushed, 0 skipped. 42.0 MB/s ({len(payload)} bytes in 0.001s)\n")
    return 0


def main(argv: list[str]) -> int:
    with open(state_dir() / "calls.jsonl", "a") as log:
        log.write(json.dumps(argv) + "\n")
    data = load()
    devices: list[dict[str, Any]] = data["devices"]
    serial = None
    while argv and argv[0] == "-s":
        serial, argv = argv[1], argv[2:]
    if not argv:
        return fail("adb: usage: no command specified")
    command, args = argv[0], argv[1:]
    if data.get("server_fails"):
        return fail(SERVER_FAILS)
    if command == "devices":
        if args not in ([], ["-l"]):
            return fail("adb: usage: adb devices [-l]")
        sys.stdout.write(devices_text(devices, "-l" in args))
        return 0
    if command == "version":
        sys.stdout.write("Android Debug Bridge version 1.0.41\nVersion 35.0.2-standin\n")
        return 0
    serial = serial or os.environ.get("ANDROID_SERIAL")
    if serial is not None:
        matching = [d for d in devices if d["serial"] == serial]
        if not matching:
            return fail(f"error: device '{serial}' not found")
        device = matching[0]
    elif not devices:
        return fail("error: no devices/emulators found")
    elif len(devices) > 1:
        return fail("error: more than one device/emulator")
    else:
        device = devices[0]
    if device["state"] == "unauthorized":
        return fail(UNAUTHORIZED)
    if device["state"] != "device":
        return fail(f"error: device {device['state']}")
    if command in ("shell", "exec-out"):
        return run_shell(device, " ".join(args))
    if command == "push" and len(args) == 2:
        return push(data, device, args[0], args[1])
    return fail(f"adb: the stand-in does not answer {' '.join(argv)!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
