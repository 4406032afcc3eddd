"""adb: where it is, the devices it sees, and the few commands qnnctl sends through it.

adb is found from `$ADB`, then `PATH`, then `$ANDROID_HOME/platform-tools` (and the older
`$ANDROID_SDK_ROOT`). Every command names its device with `-s SERIAL`; with no serial given,
the one device adb sees is used (`$ANDROID_SERIAL` is adb's own default, and qnnctl's).

`adb shell COMMAND` runs COMMAND with the device's sh (mksh) and, since Android 7 (adb's shell
protocol), ends with its exit status; binary output comes through `adb exec-out`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NoReturn

from qnnctl.errors import QnnctlError, UsageError
from qnnctl.paths import user_path
from qnnctl.shell.render import quote_posix
from qnnctl.threads import start_daemon
from qnnctl.words import human_size, printable

log = logging.getLogger("qnnctl.device.adb")

READY = "device"
QUERY_TIMEOUT = 120.0
# The most qnnctl reads of what adb prints for one command, whatever the device says: getprop's
# answer is about 100 kB, and QAIRT 2.51's largest device library (libQnnHtpPrepare.so) 90 MB.
ANSWER_MOST = 16 << 20
FILE_MOST = 256 << 20
OUTPUT_GRACE = 5.0  # seconds to wait for the rest of what an ended adb printed
NO_SHA256SUM = "qnnctl: no sha256sum"  # what the hashing loop prints first on a device without it
PUSH_SLOWEST = 256 << 10  # bytes a second a push may take at the slowest (USB 2 does 20 MB/s and more)
ADB_HINT = ("install adb: `sudo apt-get install adb` (Debian/Ubuntu), or Android's platform-tools "
            "(https://developer.android.com/tools/releases/platform-tools); then put it on PATH, "
            "or set ADB to its path")
_PROP = re.compile(r"^\[([^\]]+)\]: \[(.*)\]$")
# adb's states (adb devices -l, second column; `no permissions (...)` is many words) and the keys of
# the fields after them (adb's transport.cpp, 2025).
_ADB_STATES = frozenset({"device", "offline", "unauthorized", "authorizing", "connecting", "bootloader",
                         "recovery", "rescue", "sideload", "host", "detached"})
_NO_PERMISSIONS = ["no", "permissions"]
_FIELDS = frozenset({"usb", "product", "model", "device", "transport_id"})
# What adb's own states mean, and what fixes each (adb devices -l, second column).
_STATES = {
    "unauthorized": ("is unauthorized: it has not accepted this computer's adb key",
                     "unlock the phone and accept the 'Allow USB debugging?' prompt (`adb kill-server` if "
                     "none shows), then run the same command again"),
    "offline": ("is offline: adb sees it but cannot talk to it",
                "reconnect the cable (or run `adb reconnect`), then run the same command again"),
    "no permissions": ("cannot be opened: no permission for its USB device",
                       "add a udev rule for it (Debian/Ubuntu: `sudo apt-get install android-sdk-platform-"
                       "tools-common`), or put yourself in the plugdev group, then reconnect it"),
    "authorizing": ("is still being authorized", "wait a moment, then run the same command again"),
    "connecting": ("is still connecting", "wait a moment, then run the same command again"),
    "detached": ("is detached: adb let go of its USB connection (`adb detach`)",
                 "attach it again with `adb attach`, then run the same command again"),
}


class AdbNotFoundError(QnnctlError):
    def __init__(self, detail: str) -> None:
        super().__init__(f"adb is not installed or not found: {detail}", hint=ADB_HINT)


class DeviceError(QnnctlError):
    """adb or the device failed: not connected, not authorized, a command that broke off."""


def find_adb(environ: Mapping[str, str]) -> str:
    """The adb program: `$ADB`, else `PATH`, else the Android SDK's platform-tools."""
    given = environ.get("ADB")
    if given:
        path = shutil.which(given, path=environ.get("PATH", os.defpath)) if os.sep not in given else given
        if path is None or not os.access(path, os.X_OK) or not os.path.isfile(path):
            raise AdbNotFoundError(f"ADB is {given}, which is not an executable file")
        return path
    on_path = shutil.which("adb", path=environ.get("PATH", os.defpath))
    if on_path is not None:
        return on_path
    looked = ["not on PATH"]
    for variable in ("ANDROID_HOME", "ANDROID_SDK_ROOT"):
        home = environ.get(variable)
        if home:
            candidate = user_path(home) / "platform-tools" / "adb"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
            looked.append(f"not in ${variable}/platform-tools ({candidate.parent})")
    if len(looked) == 1:
        looked.append("ANDROID_HOME is not set")
    raise AdbNotFoundError("ADB is not set, " + ", ".join(looked))


@dataclass(frozen=True)
class Listed:
    """One line of `adb devices -l`: serial, state and the key:value fields after them."""

    serial: str
    state: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.state == READY


def parse_devices(text: str) -> list[Listed]:
    """The devices in `adb devices -l` output (its daemon's start-up lines and header aside).

    adb prints each as `%-22s %s` (serial, state) and then its fields, `key:value` words, each
    key one adb writes: a serial or a product's name may hold spaces (a wireless device found
    twice is `adb-R5CT1-AbCd (2)._adb-tls-connect._tcp`), so the state is found as the first of
    adb's states after the serial, and a word without a key of adb's goes on the field before it.
    """
    found: list[Listed] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("*") or line.startswith("List of devices"):
            continue
        # A serial with a control character in it is then one that adb does not know: no loss.
        words = [printable(word) for word in line.split()]
        at = next((i for i in range(1, len(words)) if words[i] in _ADB_STATES or words[i:i + 2] == _NO_PERMISSIONS),
                  1)  # a state adb did not have when this was written: the serial's first word, then it
        if at >= len(words):
            continue
        serial = " ".join(words[:at])
        if words[at:at + 2] == _NO_PERMISSIONS:
            # `no permissions (missing udev rules? ...); see [http://...]`: a state of many words.
            found.append(Listed(serial, "no permissions"))
            continue
        fields: dict[str, str] = {}
        key = None
        for word in words[at + 1:]:
            name, colon, value = word.partition(":")
            if colon and name in _FIELDS:
                key = name
                fields[key] = value
            elif key is not None:
                fields[key] += " " + word
        found.append(Listed(serial, words[at], fields))
    return found


def parse_props(text: str) -> dict[str, str]:
    """`getprop`'s `[name]: [value]` lines."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        match = _PROP.match(line.strip())
        if match:
            props[printable(match.group(1))] = printable(match.group(2))
    return props


def _text(data: bytes) -> str:
    """What adb printed, as text mode reads it: undecodable bytes replaced, newlines made \\n."""
    return data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return printable(lines[-1]) if lines else ""


def _adb_message(proc: subprocess.CompletedProcess[str]) -> str:
    """adb's own words for a failure: its first error line (stderr's, then stdout's), else its first
    line, else its exit status."""
    lines = [line.strip() for line in (proc.stderr + "\n" + proc.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("error:", "adb:"))]  # "adb: error:" among them
    return printable((errors or lines or [f"exit status {proc.returncode}"])[0])


class Adb:
    """The adb program, run with a given environment."""

    def __init__(self, environ: Mapping[str, str], path: str | None = None) -> None:
        self.environ = dict(environ)
        self.path = path or find_adb(environ)

    def run(self, args: Sequence[str], timeout: float | None = QUERY_TIMEOUT) -> subprocess.CompletedProcess[str]:
        log.debug("running %s %s", self.path, " ".join(args))
        proc = self.capture(args, timeout, ANSWER_MOST)
        return subprocess.CompletedProcess(proc.args, proc.returncode, _text(proc.stdout), _text(proc.stderr))

    def capture(self, args: Sequence[str], timeout: float | None, most: int) -> subprocess.CompletedProcess[bytes]:
        """`adb ARGS` and what it prints, at most `most` bytes of each stream: a device says what it
        likes, as fast as its cable goes, for as long as it likes (DeviceError past either)."""
        shown = f"`adb {' '.join(args)}`"
        try:
            proc = subprocess.Popen([self.path, *args], env=self.environ, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except (FileNotFoundError, PermissionError) as exc:
            raise AdbNotFoundError(f"{self.path}: {exc.strerror}") from None
        kept = (bytearray(), bytearray())
        over: list[bool] = []

        def drain(stream: IO[bytes], into: bytearray) -> Callable[[], None]:
            def read() -> None:
                while chunk := stream.read1(1 << 16):  # type: ignore[attr-defined]
                    if len(into) + len(chunk) > most:
                        over.append(True)
                        proc.kill()
                        return
                    into.extend(chunk)
            return read

        streams = [(stream, into) for stream, into in ((proc.stdout, kept[0]), (proc.stderr, kept[1]))
                   if stream is not None]
        ended = [start_daemon(drain(stream, into), "adb-output") for stream, into in streams]
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise DeviceError(f"{shown} did not answer in {timeout:.0f} s",
                              hint="check the device and its cable (`adb devices`), then run the same "
                              "command again") from None
        finally:
            proc.kill()  # no-op once it has ended
            proc.wait()
            for done, (stream, _) in zip(ended, streams, strict=True):
                # A pipe that an adb server it started holds open is not waited for.
                if done.wait(OUTPUT_GRACE):
                    stream.close()
        if over:
            raise DeviceError(f"{shown} printed more than {human_size(most)}, more than qnnctl reads of it: "
                              "it was stopped there", hint="check what the device answers to it (`adb "
                              f"{' '.join(args)}`); a phone that says that much is not one qnnctl can use")
        return subprocess.CompletedProcess(proc.args, proc.returncode, bytes(kept[0]), bytes(kept[1]))

    def devices(self) -> list[Listed]:
        proc = self.run(["devices", "-l"])
        if proc.returncode != 0:
            raise DeviceError(f"`adb devices` failed: {_adb_message(proc)}",
                              hint="`adb kill-server`, then run the same command again")
        return parse_devices(proc.stdout)

    def device(self, serial: str | None = None) -> Device:
        """The device to use: `serial` (or $ANDROID_SERIAL), else the only one adb sees; ready."""
        serial = serial or self.environ.get("ANDROID_SERIAL") or None
        listed = self.devices()
        seen = ", ".join(f"{d.serial} ({d.state})" for d in listed)
        if serial is not None:
            chosen = next((d for d in listed if d.serial == serial), None)
            if chosen is None:
                raise DeviceError(f"adb sees no device {serial}" + (f"; it sees {seen}" if listed else ""),
                                  hint="`qnnctl device list` shows the devices adb sees")
        elif not listed:
            raise DeviceError("adb sees no device",
                              hint="connect the phone by USB with USB debugging on (Settings > Developer "
                              "options), then check with `adb devices`")
        elif len(listed) > 1:
            raise UsageError(f"adb sees {len(listed)} devices ({seen}); which one is meant?",
                             hint="pass --serial SERIAL (or set ANDROID_SERIAL); `qnnctl device list` "
                             "lists them")
        else:
            chosen = listed[0]
        if not chosen.ready:
            what, fix = _STATES.get(chosen.state, (f"is in state {chosen.state!r}, not booted into Android",
                                                   "reboot it into Android, then run the same command again"))
            raise DeviceError(f"device {chosen.serial} {what}", hint=fix)
        return Device(self, chosen.serial, chosen)


class Device:
    """One ready device, by serial."""

    def __init__(self, adb: Adb, serial: str, listed: Listed | None = None) -> None:
        self.adb = adb
        self.serial = serial
        self.listed = listed
        self._props: dict[str, str] | None = None

    def _args(self, *args: str) -> list[str]:
        return ["-s", self.serial, *args]

    def shell(self, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`command` run by the device's sh; `check`: a failure is a DeviceError."""
        proc = self.adb.run(self._args("shell", command))
        if check and proc.returncode != 0:
            raise DeviceError(f"{self.serial}: `{command}` failed: {_adb_message(proc)}",
                              hint="check the device (`adb devices`), then run the same command again")
        return proc

    def props(self) -> dict[str, str]:
        """Every system property (one `getprop` for all), read once."""
        if self._props is None:
            self._props = parse_props(self.shell("getprop").stdout)
        return self._props

    @property
    def soc_model(self) -> str:
        return self.props().get("ro.soc.model", "").strip()

    @property
    def model(self) -> str:
        model = self.props().get("ro.product.model", "").strip()
        return model or (self.listed.fields.get("model", "").replace("_", " ") if self.listed else "")

    def describe(self) -> str:
        """`R5CT1234 (Galaxy S25, Android 15, SoC SM8750P)`."""
        props = self.props()
        parts = [self.model or "unknown model"]
        if props.get("ro.build.version.release"):
            parts.append(f"Android {props['ro.build.version.release']}")
        parts.append(f"SoC {self.soc_model or 'unknown'}")
        return f"{self.serial} ({', '.join(parts)})"

    def sha256(self, paths: Sequence[str]) -> dict[str, str]:
        """The sha256 of each of `paths` that exists on the device (missing ones are left out)."""
        if not paths:
            return {}
        # Each file is hashed from stdin, in the order asked: its name is never read back. GNU
        # sha256sum escapes a name holding a backslash or a newline (a backslash before the
        # line, then "\\" and "\n" in the name) and toybox may not: no one reading fits both.
        # Without sha256sum, every file would read as missing (its failure is one a missing file's).
        quoted = " ".join(quote_posix(p) for p in paths)
        proc = self.shell(f"command -v sha256sum >/dev/null || {{ echo '{NO_SHA256SUM}'; exit 127; }}; "
                          f'for f in {quoted}; do {{ sha256sum < "$f"; }} 2>/dev/null || echo -; done', check=False)
        if proc.stdout.splitlines()[:1] == [NO_SHA256SUM]:
            raise DeviceError(f"{self.serial} has no sha256sum, with which qnnctl checks the files on a device",
                              hint="Android's own toybox has one: check that `adb shell sha256sum < "
                              "/system/bin/sh` prints a digest, and what the device's PATH holds")
        if proc.returncode != 0:
            raise DeviceError(f"{self.serial}: sha256sum failed: {_adb_message(proc)}",
                              hint="check the device (`adb devices`), then run the same command again")
        answers = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
        if len(answers) != len(paths):
            raise DeviceError(f"{self.serial}: sha256sum gave {len(answers)} answers for {len(paths)} files",
                              hint="check the device (`adb shell sha256sum < /system/bin/sh`), then run the "
                              "same command again")
        return {path: digest for path, digest in zip(paths, answers, strict=True)
                if re.fullmatch(r"[0-9a-f]{64}", digest)}

    def push(self, local: Path, remote: str) -> None:
        # A large library over a slow cable takes its time, but a device that stopped answering
        # would take for ever: the time a query has, and the file at PUSH_SLOWEST.
        timeout = QUERY_TIMEOUT + local.stat().st_size / PUSH_SLOWEST
        proc = self.adb.run(self._args("push", str(local), remote), timeout=timeout)
        if proc.returncode != 0:
            raise DeviceError(
                f"pushing {local} to {self.serial}:{remote} failed: {_adb_message(proc)}",
                hint="check the connection (`adb devices`), then run the same command again: what is "
                "already on the device is not sent again",
            )
        log.debug("%s", _last_line(proc.stdout))

    def read(self, path: str) -> bytes:
        """A file's bytes, unmangled (`adb exec-out cat`), at most FILE_MOST of them."""
        proc = self.adb.capture(self._args("exec-out", "cat " + quote_posix(path)), QUERY_TIMEOUT, FILE_MOST)
        if proc.returncode != 0:
            raise DeviceError(f"cannot read {self.serial}:{path}: "
                              + (_last_line(proc.stderr.decode(errors="replace")) or f"exit {proc.returncode}"))
        return proc.stdout

    def exec_shell(self, command: str) -> NoReturn:
        """Become `adb -s SERIAL shell COMMAND`: its output streams, its exit status is ours."""
        argv = [self.adb.path, *self._args("shell", command)]
        log.debug("exec %s", " ".join(argv))
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(self.adb.path, argv, self.adb.environ)  # noqa: S606 - becoming adb is the point
