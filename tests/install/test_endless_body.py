"""A server that never stops sending: once the lock or the mirror's index pins the archive's
size, a body longer than that cannot be the archive, and the download stops there (exit 4)
rather than fill the disk before the gate says what it could have said after the first byte
too many."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import run_qnnctl
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import VERSION

ARCHIVE = f"/{VERSION}/v{VERSION}.zip"
ENDLESS = 256 << 20  # the server stops by itself after this; a client should long before
BLOCK = b"PK\x03\x04" + bytes(1 << 16)


@pytest.fixture
def indexed(mirror: FaultServer, tmp_path: Path) -> int:
    """The mirror serves an index.json that pins the archive (made by `qnnctl mirror`), and
    then, for the archive, an endless body; the size the index pins."""
    folder = tmp_path / "made"
    made = run_qnnctl("mirror", str(folder), VERSION)
    assert made.returncode == 0, made.stderr
    index = json.loads((folder / "index.json").read_text())
    mirror.add("/index.json", json.dumps(index).encode(), "application/json")
    mirror.fail(ARCHIVE, Fault.endless(BLOCK, ENDLESS))
    for leftover in (tmp_path / "cache" / "downloads").glob("*"):
        leftover.unlink()  # `qnnctl mirror` moved its archive out; nothing is reused
    size: int = index["versions"][VERSION]["size"]
    return size


@pytest.mark.parametrize("command", [("install", VERSION), ("mirror", "DIR", VERSION)],
                         ids=["install", "mirror"])
def test_a_body_longer_than_the_pinned_size_is_cut_off_there(command: tuple[str, ...], indexed: int,
                                                             mirror: FaultServer, tmp_path: Path,
                                                             cache_dir: Path) -> None:
    args = [str(tmp_path / "second") if word == "DIR" else word for word in command]
    proc = run_qnnctl(*args)
    assert (proc.returncode, proc.stdout) == (4, ""), proc.stderr
    said = f"is longer than {indexed} bytes, the size the mirror's {mirror.base}/index.json says"
    assert said in proc.stderr, proc.stderr
    assert "nothing was installed" in proc.stderr or "nothing was added" in proc.stderr, proc.stderr
    # Read up to the size pinned and a block or so more; the rest was never asked for (socket
    # buffers on both sides hold a few MiB).
    assert mirror.bytes_served(ARCHIVE) < 32 << 20, mirror.bytes_served(ARCHIVE)
    downloads = cache_dir / "downloads"
    assert not downloads.exists() or [p.name for p in downloads.iterdir()] == []
    assert not (cache_dir / "sdks" / VERSION).exists()
    assert os.statvfs(tmp_path).f_bavail > 0


def test_a_length_announced_past_the_pinned_size_is_refused_before_the_body(indexed: int, mirror: FaultServer,
                                                                           cache_dir: Path) -> None:
    mirror.faults[ARCHIVE].clear()
    mirror.fail(ARCHIVE, Fault.claim_length(indexed + 1))
    proc = run_qnnctl("install", VERSION)
    assert (proc.returncode, proc.stdout) == (4, ""), proc.stderr
    assert (f"is longer than {indexed} bytes, the size the mirror's {mirror.base}/index.json says (it says the file "
            f"is {indexed + 1} bytes)") in proc.stderr, proc.stderr
    assert "hint: check the server or proxy" in proc.stderr
    downloads = cache_dir / "downloads"
    assert not downloads.exists() or [p.name for p in downloads.iterdir()] == []
