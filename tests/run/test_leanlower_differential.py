"""`qnnctl lower` through the lean path and through the full command line, side by side, on
command lines the lean path takes: an install on the way (piped and on a terminal), a store, a
caller-managed SDK, `--python` with `-m`, `=` forms. Each pair runs in a cache of its own, so
that both start from the same state; the caches' paths are made alike before comparing."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import read_terminal, with_default_sigint
from tests.httpserver import FaultServer
from tests.sdkfactory import VERSION, build_sdk_tree

PY = sys.executable
SHOW = "import json, os, sys; print(json.dumps([sys.argv, sorted(os.environ.items())]))"
LEAN = [PY, "-m", "qnnctl", "lower"]
FULL = [PY, "-c", "import sys; from qnnctl.cli import main; main(sys.argv[1:])", "lower"]


def _alike(text: str, caches: list[Path]) -> str:
    for cache in caches:
        text = text.replace(str(cache), "CACHE")
    return re.sub(r"\d+(\.\d+)? ?(MiB|KiB|GiB|MB|kB|B|s|MB/s|ms)\b", "N", text)


def _pair(args: list[str], tmp_path: Path, env: dict[str, str] | None = None,
          terminal: bool = False) -> list[tuple[int, str, str]]:
    outcomes = []
    caches = [tmp_path / "cache-lean", tmp_path / "cache-full"]
    for command, cache in zip((LEAN, FULL), caches):
        run_env = {**os.environ, **(env or {}), "QNNCTL_CACHE_DIR": str(cache)}
        if terminal:
            code, out, err = _on_terminal([*command, *args], run_env, tmp_path)
        else:
            done = subprocess.run([*command, *args], capture_output=True, text=True, cwd=tmp_path, env=run_env,
                                  timeout=120)
            code, out, err = done.returncode, done.stdout, done.stderr
        outcomes.append((code, _alike(out, caches), _alike(err, caches)))
    return outcomes


def _on_terminal(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=terminal, stdin=subprocess.DEVNULL, env=env,
                            cwd=cwd)
    os.close(terminal)
    seen = bytearray()
    reader = threading.Thread(target=lambda: seen.extend(read_terminal(controller)))
    reader.start()
    out, _ = proc.communicate(timeout=120)
    reader.join(timeout=30)
    # What a person reads: each line as last drawn (a bar redraws itself over \r).
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))
    lines = [part for line in text.replace("\r\n", "\n").split("\n") for part in [line.rsplit("\r", 1)[-1]]]
    return proc.returncode, out.decode(), "\n".join(lines)


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_an_install_on_the_way_reads_the_same(mirror: FaultServer, tmp_path: Path, terminal: bool) -> None:
    lean, full = _pair(["--sdk", VERSION, "--", PY, "-c", SHOW, "x"], tmp_path, terminal=terminal)
    assert lean == full


@pytest.mark.parametrize("args", [
    ["--sdk=" + VERSION, "--python=" + PY, "-m", "show", "--sdk", "-v"],
    ["--python", PY, "--sdk", VERSION, "--keep-mkldnn", "show.py", "--", "-h"],
    ["--no-install", "--sdk", VERSION, "--", PY, "-c", SHOW],
])
def test_a_store_and_the_usual_forms_read_the_same(tmp_path: Path, args: list[str]) -> None:
    store = tmp_path / "store"
    build_sdk_tree(store / VERSION)
    (tmp_path / "show.py").write_text(SHOW + "\n")
    lean, full = _pair(args, tmp_path, {"QNNCTL_STORES": str(store)})
    assert lean == full
    assert lean[0] == 0, lean


def test_a_caller_managed_sdk_reads_the_same(tmp_path: Path) -> None:
    lean, full = _pair(["--", PY, "-c", SHOW], tmp_path, {"QNN_SDK_ROOT": ""})
    assert lean == full


def test_ctrl_c_during_an_install_on_the_way_reads_the_same(mirror: FaultServer, tmp_path: Path) -> None:
    """Each is stopped once its own download has begun. Each has a mirror of its own, and starts once
    the server has stopped sending into the one before's closed connection: counted as the second's,
    those bytes stopped it early (in its imports, before it said anything); sent in the rate all
    connections share, they slowed it until its progress showed (a line more)."""
    mirror.rate = 64 << 10  # the 1 MiB archive takes about 16 s
    archive = mirror.files[f"/{VERSION}/v{VERSION}.zip"]
    caches = [tmp_path / "cache-lean", tmp_path / "cache-full"]
    outcomes = []
    for command, cache, name in zip((LEAN, FULL), caches, ("lean", "full")):
        path = f"/{name}/{VERSION}/v{VERSION}.zip"
        mirror.add(path, archive)
        proc = subprocess.Popen(with_default_sigint([*command, "--sdk", VERSION, "--", "true"]), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                env={**os.environ, "QNNCTL_CACHE_DIR": str(cache),
                                     "QNNCTL_MIRROR": f"{mirror.base}/{name}"})
        deadline = time.monotonic() + 60
        while mirror.bytes_served(path) < 128 << 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        mirror.served_for(path)  # its answer ended: the rate all connections share is the next one's alone
        outcomes.append((proc.returncode, _alike(out, caches), _alike(err, caches).replace(f"/{name}/", "/")))
    lean, full = outcomes
    assert lean == full
    assert lean[0] == 130, lean
    assert "downloading SDK" in lean[2], lean
