"""The writer check of an archive on disk (qnnctl.install.sources.no_other_writer), attacked by
someone who has read it: a lease broken in a program with more than one thread, a SIGIO that
belongs to the program that called qnnctl, and a writer the overlay's own inode does not count.

Each runs in a child interpreter, so that a SIGIO that ends a process ends that one, not pytest."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from qnnctl.install.sources import pinned_file

_PROLOGUE = """
import fcntl, os, signal, sys, threading, time
from pathlib import Path
from qnnctl.install.sources import pinned_file
given = Path(sys.argv[1])
given.write_bytes(os.urandom(5000))
given.chmod(0o644)
"""

# A writer of this user opening the file for writing just while the lease is held: the kernel
# breaks the lease and tells the lease's owner, the whole process (not the thread), by signal.
_BREAKER = """
real = fcntl.fcntl
def lease_then_writer(fd, command, arg=0):
    result = real(fd, command, arg)
    if command == fcntl.F_SETLEASE and arg == fcntl.F_RDLCK:
        try:
            os.close(os.open(given, os.O_WRONLY | os.O_NONBLOCK))
        except BlockingIOError:
            pass
    return result
fcntl.fcntl = lease_then_writer
"""


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    code = _PROLOGUE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code, str(tmp_path / "v2.zip")], capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.parametrize("where", ["a thread of its own", "the main thread, beside another thread",
                                   "the main thread alone"])
def test_a_broken_lease_does_not_end_a_program_with_threads(tmp_path: Path, where: str) -> None:
    """A library user's program has threads: blocking SIGIO in the one that asks for the lease
    leaves the signal to any other, whose default is to end the whole program."""
    start = {"a thread of its own": "t = threading.Thread(target=install); t.start(); t.join()",
             "the main thread, beside another thread":
                 "threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); install()",
             "the main thread alone": "install()"}[where]
    done = _run(tmp_path, _BREAKER + f"""
out = {{}}
def install():
    with pinned_file(given, Path(sys.argv[1] + ".work")) as pinned:
        out["copied"] = pinned.copied
{start}
print("copied", out.get("copied"))
""")
    assert (done.returncode, done.stdout) == (0, "copied True\n"), done


def test_the_programs_own_sigio_is_left_to_it(tmp_path: Path) -> None:
    """A program that takes SIGIO with sigwait() (it blocks the signal) and has one pending:
    asking for a lease must neither take that signal nor read it as a writer."""
    done = _run(tmp_path, """
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGIO})
os.kill(os.getpid(), signal.SIGIO)
with pinned_file(given, Path(sys.argv[1] + ".work")) as pinned:
    copied = pinned.copied
print("copied", copied, "pending", signal.SIGIO in signal.sigpending())
""")
    assert (done.returncode, done.stdout) == (0, "copied False pending True\n"), done


_UPPER_WRITER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
print("open", flush=True)
sys.stdin.readline()
os.pwrite(fd, b"written on the upper layer, past the overlay", 0)
print("written", flush=True)
sys.stdin.readline()
"""


def test_a_writer_on_an_overlays_upper_layer_gets_a_copy(tmp_path: Path) -> None:
    """An archive on overlayfs, made 0644 while a process still holds the upper layer's file
    open for writing (opened there, not through the overlay): the overlay's inode counts no
    writer, so the lease is granted, and bytes read after the hash are the writer's."""
    layers = {name: tmp_path / "overlay" / name for name in ("lower", "upper", "work", "merged")}
    for folder in layers.values():
        folder.mkdir(parents=True)
    options = f"lowerdir={layers['lower']},upperdir={layers['upper']},workdir={layers['work']}"
    mounted = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(layers["merged"])],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip("cannot mount an overlay here")
    try:
        given = layers["merged"] / "v2.zip"
        data = os.urandom(3000)
        given.write_bytes(data)
        given.chmod(0o666)
        writer = subprocess.Popen([sys.executable, "-c", _UPPER_WRITER, str(layers["upper"] / "v2.zip")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert writer.stdout is not None
            assert writer.stdin is not None
            assert writer.stdout.readline() == "open\n"
            given.chmod(0o644)
            with pinned_file(given, tmp_path / "pinned") as pinned:
                writer.stdin.write("go\n")
                writer.stdin.flush()
                assert writer.stdout.readline() == "written\n"
                later = hashlib.sha256(pinned.path.read_bytes()).hexdigest()
                assert (pinned.sha256, later) == (hashlib.sha256(data).hexdigest(), pinned.sha256)
        finally:
            writer.kill()
            writer.wait()
    finally:
        subprocess.run(["umount", "-l", str(layers["merged"])], check=False)
