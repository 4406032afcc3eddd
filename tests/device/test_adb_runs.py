"""How adb is run: with the environment qnnctl was given, none of qnnctl's own input, and what it
prints read as text the way a device prints it; an adb that cannot be started is named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qnnctl.device.adb import Adb, AdbNotFoundError, Device
from tests.conftest import REPO
from tests.phones import Phones, standin
from tests.standin_adb import STATE_VARIABLE


def test_what_a_device_prints_is_read_as_text_with_its_line_ends_made_plain(phones: Phones) -> None:
    """Older devices' `adb shell` ends lines with \\r\\n (a terminal's), some tools with \\r alone;
    bytes that are not UTF-8 are replaced, not refused."""
    phones.add("R5CT1")
    printed = Device(Adb(os.environ), "R5CT1").shell(r"printf 'one\r\ntwo\rthree \377\n'").stdout
    assert printed == "one\ntwo\nthree \ufffd\n"


def test_adb_runs_with_the_environment_qnnctl_was_given(
        tmp_path: Path, phones: Phones, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library is given an environment (`setup_sdk(environ=...)`, a test's): adb runs with it,
    not with the process's own (here the stand-in's state, as ANDROID_ADB_SERVER_PORT picks the
    server a real adb asks)."""
    phones.add("R5CT1")
    other = standin(tmp_path / "other", monkeypatch)
    other.add("OTHER1")
    monkeypatch.setenv(STATE_VARIABLE, str(phones.state))
    given = {**os.environ, STATE_VARIABLE: str(other.state)}
    assert [d.serial for d in Adb(given).devices()] == ["OTHER1"]
    assert [d.serial for d in Adb(os.environ).devices()] == ["R5CT1"]


def test_adb_reads_nothing_of_qnnctls_own_input(phones: Phones) -> None:
    """`adb shell` hands its input on to the device's command: run with qnnctl's own (a terminal, a
    script's pipe), `cat` on the device would take it, and wait for more."""
    phones.add("R5CT1")
    script = ("import os, sys\nfrom qnnctl.device.adb import Adb, Device\n"
              "sys.stdout.write(repr(Device(Adb(os.environ), 'R5CT1').shell('cat').stdout))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=env)
    assert child.stdin is not None
    assert child.stdout is not None
    child.stdin.write(b"the user's own input\n")
    child.stdin.flush()  # and left open, as a terminal is
    try:
        assert child.stdout.read() == b"''"
        assert child.wait(30) == 0
    finally:
        child.kill()
        child.wait()
        child.stdin.close()
        child.stdout.close()


def test_an_adb_that_cannot_be_started_is_named_with_why(tmp_path: Path) -> None:
    """ADB names a script whose interpreter is gone: found, executable, and not startable."""
    adb = tmp_path / "adb"
    adb.write_text("#!/nonexistent/interpreter\n")
    adb.chmod(0o755)
    with pytest.raises(AdbNotFoundError) as caught:
        Adb({"ADB": str(adb), "PATH": os.environ["PATH"]}).devices()
    assert caught.value.message == f"adb is not installed or not found: {adb}: No such file or directory"
