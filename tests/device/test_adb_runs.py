"""How adb is found and run: with the environment qnnctl was given, none of qnnctl's own input,
and what it prints read as text the way a device prints it; an adb that cannot be started is named.

Which adb: `$ADB` (a path, or a name looked up on the `PATH` qnnctl was given), else `adb` on that
`PATH`, else `$ANDROID_HOME` or `$ANDROID_SDK_ROOT`'s platform-tools; what is not an executable
file is never taken for adb, and an environment without `PATH` looks in Python's default path, not
in the process's own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from qnnctl.device import adb as adb_module
from qnnctl.device.adb import Adb, AdbNotFoundError, Device, find_adb
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


@pytest.mark.timeout(60)
def test_an_adb_that_leaves_its_server_holding_the_output_is_not_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first adb command starts adb's server, which may keep the pipes it was started with:
    adb has ended and said what it had to; what it printed is read, and the server is left alone
    once the grace for the rest has passed."""
    monkeypatch.setattr(adb_module, "OUTPUT_GRACE", 0.5)
    server = tmp_path / "server.pid"
    adb = tmp_path / "adb"
    adb.write_text("#!/bin/sh\n"
                   "printf '* daemon started successfully\\nList of devices attached\\nR5CT1 device\\n'\n"
                   f"sleep 300 & echo $! > '{server}'\n")
    adb.chmod(0o755)
    try:
        listed = Adb({"ADB": str(adb), "PATH": os.environ["PATH"]}).devices()
        assert [(d.serial, d.state) for d in listed] == [("R5CT1", "device")]
    finally:
        os.kill(int(server.read_text()), signal.SIGKILL)


def executable(path: Path, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(mode)
    return path


def not_found(environ: dict[str, str]) -> str:
    with pytest.raises(AdbNotFoundError) as caught:
        find_adb(environ)
    return caught.value.message


def test_adb_given_by_name_is_looked_up_on_the_path_qnnctl_was_given(tmp_path: Path) -> None:
    """`ADB=adb-34` (a name, as `CC=gcc-12` is): the file of that name on the given `PATH`, not a
    file of that name in the working folder, nor one on the process's own `PATH`."""
    given = executable(tmp_path / "sdk-bin" / "adb-34")
    assert os.environ.get("PATH", "").split(os.pathsep).count(str(given.parent)) == 0
    assert find_adb({"ADB": "adb-34", "PATH": f"/nonexistent{os.pathsep}{given.parent}"}) == str(given)
    assert not_found({"ADB": "adb-35", "PATH": str(given.parent)}) == (
        "adb is not installed or not found: ADB is adb-35, which is not an executable file")


def test_an_environment_without_path_looks_in_pythons_default_path_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment qnnctl was given (`setup_sdk(environ=...)`) holds no `PATH`: adb is looked
    for where a shell without one would look (`os.defpath`), never on the process's own `PATH`."""
    own = tmp_path / "own-bin"
    executable(own / "adb")
    executable(own / "adb-34")
    monkeypatch.setenv("PATH", f"{own}{os.pathsep}{os.environ['PATH']}")
    assert not_found({"ADB": "adb-34"}) == (
        "adb is not installed or not found: ADB is adb-34, which is not an executable file")
    try:
        found: str | None = find_adb({})
    except AdbNotFoundError:
        found = None  # no adb in /bin or /usr/bin here
    assert found is None or Path(found).parent in {Path(p) for p in os.defpath.split(os.pathsep)}


@pytest.mark.parametrize("kind", ["without its exec bit", "a folder"])
def test_adb_given_that_is_not_an_executable_file_is_refused(tmp_path: Path, kind: str) -> None:
    given = tmp_path / "adb"
    if kind == "a folder":
        given.mkdir(mode=0o755)  # a folder passes an X_OK check
    else:
        executable(given, 0o644)
    assert not_found({"ADB": str(given), "PATH": os.environ["PATH"]}) == (
        f"adb is not installed or not found: ADB is {given}, which is not an executable file")


def test_adb_from_android_sdk_root_when_android_home_is_not_set(tmp_path: Path) -> None:
    """`ANDROID_SDK_ROOT` is the older name of `ANDROID_HOME`; Android's own tools still read
    either, and so does qnnctl, `ANDROID_HOME` first."""
    bare = str(tmp_path / "empty-bin")
    root_adb = executable(tmp_path / "sdk-root" / "platform-tools" / "adb")
    assert find_adb({"PATH": bare, "ANDROID_SDK_ROOT": str(root_adb.parents[1])}) == str(root_adb)
    home_adb = executable(tmp_path / "home" / "platform-tools" / "adb")
    assert find_adb({"PATH": bare, "ANDROID_HOME": str(home_adb.parents[1]),
                     "ANDROID_SDK_ROOT": str(root_adb.parents[1])}) == str(home_adb)


def test_a_platform_tools_adb_that_cannot_run_is_passed_over_and_named(tmp_path: Path) -> None:
    bare = str(tmp_path / "empty-bin")
    broken = executable(tmp_path / "home" / "platform-tools" / "adb", 0o644)
    (tmp_path / "root" / "platform-tools" / "adb").mkdir(parents=True)  # a folder, not a program
    assert not_found({"PATH": bare, "ANDROID_HOME": str(broken.parents[1]),
                      "ANDROID_SDK_ROOT": str(tmp_path / "root")}) == (
        "adb is not installed or not found: ADB is not set, not on PATH, "
        f"not in $ANDROID_HOME/platform-tools ({broken.parent}), "
        f"not in $ANDROID_SDK_ROOT/platform-tools ({tmp_path / 'root' / 'platform-tools'})")
