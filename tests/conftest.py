"""Fixtures shared by every test: an isolated cache, a clean environment, tool checks."""

from __future__ import annotations

import fcntl
import os
import pty
import random
import shutil
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from qnnctl.sdk.cache import Cache
from tests.httpserver import FaultServer
from tests.sdkfactory import VERSION, SdkSpec, build_archive

REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

NOWHERE_PROXY = "http://127.0.0.1:9"  # the discard port, which nothing here serves: refused

# Variables that would make a test depend on the machine or the developer's shell.
_SCRUB = (
    "QNN_SDK_ROOT", "QNNCTL_SDK", "QNNCTL_MIRROR", "QNN_STAGING_DIR", "LD_LIBRARY_PATH",
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
    "NO_PROXY", "no_proxy", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "QNNCTL_DEBUG",
    "VIRTUAL_ENV", "QNNCTL_FORCE_CPU_VENDOR", "QNNCTL_DISABLE_MKLDNN", "QNNCTL_STAGED_LOADER",
    "QNNCTL_LLVM_URL", "QNNCTL_LLVM_SHA256",
)


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the cache (and HOME, XDG caches) into tmp_path so the real ones are unreachable."""
    for name in _SCRUB:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    cache = tmp_path / "cache"
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(cache))
    # Nothing leaves the machine: a request to any other host goes to a proxy on a loopback port
    # that refuses it (a test of proxies sets its own), and no proxy takes a loopback request.
    for name in ("HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(name, NOWHERE_PROXY)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return cache


@pytest.fixture
def cache_dir(isolated: Path) -> Path:
    return isolated


@pytest.fixture
def cache(cache_dir: Path) -> Cache:
    """qnnctl's cache in the test's own folder (in place of pytest's fixture of that name)."""
    return Cache(cache_dir)


def require_tool(name: str) -> str:
    """The path of a tool the test needs; in CI its absence is a failure, not a skip."""
    path = shutil.which(name)
    if path is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed; .ci/run must install it")
        pytest.skip(f"{name} is not installed")
    return path


def give_default_acl(folder: Path) -> None:
    """A default ACL on `folder`, user::rwx group::r-x other::--- (as `setfacl -d -m g::rx,o::0`
    sets it): files made below it then take its mask in place of the umask. Skips the test
    where the file system keeps no ACLs."""
    import struct

    acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, 0xFFFFFFFF)
                                          for tag, perm in [(0x01, 7), (0x04, 5), (0x20, 0)])
    try:
        os.setxattr(folder, "system.posix_acl_default", acl)
    except OSError as exc:
        pytest.skip(f"this file system keeps no ACLs: {exc}")


def read_terminal(controller: int) -> bytes:
    """Everything written to a pseudo-terminal until the child closes its end, then close ours."""
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    return b"".join(chunks)


# An ignored SIGINT (nohup, a background job, some CI runners) is inherited across exec, and a
# Python started that way installs no KeyboardInterrupt handler: Ctrl-C tests would hang.
_SIGINT_DEFAULT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "os.execvp(sys.argv[1], sys.argv[1:])")


def with_default_sigint(argv: list[str]) -> list[str]:
    """`argv`, started with SIGINT at its default whatever this test run inherited: for every
    child a test sends SIGINT to. An exec in between rather than `preexec_fn`, which is not safe
    with the threads (HTTP servers) tests run."""
    return [sys.executable, "-c", _SIGINT_DEFAULT, *argv]


def run_qnnctl(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
               input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the real entry point (`python -m qnnctl`) in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "qnnctl", *args],
        env=os.environ.copy() if env is None else env,
        cwd=cwd,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_qnnctl_on_a_terminal(*args: str, timeout: float = 120) -> tuple[int, str, bytes]:
    """`qnnctl ARGS` with its stderr on a pseudo-terminal: its exit code, its stdout, and all
    it wrote to the terminal."""
    controller, terminal = pty.openpty()
    # 24 rows of 100 columns, as a terminal window has (a new pseudo-terminal has 0 of each,
    # which tqdm takes for no room and draws no bar in).
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "qnnctl", *args], stdout=subprocess.PIPE,
                            stderr=terminal, stdin=subprocess.DEVNULL)
    os.close(terminal)
    seen = bytearray()
    reader = threading.Thread(target=lambda: seen.extend(read_terminal(controller)))
    reader.start()
    out, _ = proc.communicate(timeout=timeout)
    reader.join(timeout=30)
    return proc.returncode, out.decode(), bytes(seen)


def start_qnnctl_waiting(*args: str, doing: str = f"installing {VERSION}") -> subprocess.Popen[str]:
    """`qnnctl ARGS` started while an install lock is held, once it says it waits for the holder
    to finish `doing` (its first line on stderr), with stdout and the rest of stderr still to read."""
    proc = subprocess.Popen([sys.executable, "-m", "qnnctl", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(60, proc.kill)  # a qnnctl that neither says it waits nor ends
    watchdog.start()
    try:
        assert proc.stderr is not None
        said = proc.stderr.readline()
        assert said == f"qnnctl: waiting for another qnnctl to finish {doing}\n", said
    except BaseException:
        proc.kill()
        raise
    finally:
        watchdog.cancel()
    return proc


# Incompressible, so the archive is large enough for a dropped connection to leave whole
# chunks on disk (resume tests need a partial file to resume from).
PAYLOAD = random.Random(0).randbytes(1 << 20)


@pytest.fixture
def server() -> Iterator[FaultServer]:
    """A fault-injecting HTTP server on 127.0.0.1, shut down after the test."""
    with FaultServer() as srv:
        yield srv


@pytest.fixture
def mirror(server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultServer:
    """The server holding a zip of the default test SDK, with QNNCTL_MIRROR pointing at it."""
    (tmp_path / "archives").mkdir()
    archive = build_archive(tmp_path / "archives", "zip", SdkSpec(extra_files={"docs/payload.bin": PAYLOAD}))
    server.add(f"/{VERSION}/v{VERSION}.zip", archive.read_bytes())
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    return server


@pytest.fixture
def far_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time five and a half hours ahead of UTC (a POSIX TZ string: no zone files needed)."""
    monkeypatch.setenv("TZ", "IST-5:30")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
