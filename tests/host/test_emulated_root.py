"""The emulated aarch64 root's build (tests/emulated.py) without the emulation: a root is taken
as made only once it is complete, whatever stops a build half-way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import emulated
from tests.conftest import REPO


@pytest.fixture(autouse=True)
def any_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The build's own logic, on a machine that could not emulate (no proot, not root)."""
    monkeypatch.setattr(emulated, "host_problem", lambda: None)


def make_complete(work: Path) -> None:
    (work / "root" / "usr" / "bin").mkdir(parents=True)
    (work / "root" / "usr" / "bin" / "python3").write_text("")


def builds(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.glob(".aarch64-root-*.build-*"))


def test_a_root_is_renamed_into_place_when_complete(tmp_path: Path) -> None:
    made = emulated.build(tmp_path, make_complete)
    assert made == emulated.root_path(tmp_path)
    assert (made / "usr" / "bin" / "python3").is_file()
    assert builds(tmp_path) == []
    # Found the next time, not made again.
    assert emulated.build(tmp_path, lambda work: pytest.fail("made again")) == made


def test_a_failed_build_leaves_no_root(tmp_path: Path) -> None:
    def half_then_fail(work: Path) -> None:
        (work / "root" / "usr").mkdir(parents=True)
        raise RuntimeError("Debian's mirror is unreachable")

    with pytest.raises(RuntimeError, match="unreachable"):
        emulated.build(tmp_path, half_then_fail)
    assert not emulated.root_path(tmp_path).exists()
    assert builds(tmp_path) == []


def test_a_killed_build_leaves_no_root_and_the_next_build_clears_it(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", """
import sys, time
from pathlib import Path
from tests import emulated
emulated.host_problem = lambda: None
def half_then_wait(work):
    (work / "root" / "usr").mkdir(parents=True)
    print("half", flush=True)
    time.sleep(120)
emulated.build(Path(sys.argv[1]), half_then_wait)
""", str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "half\n"
    finally:
        child.kill()
        child.wait()
    assert not emulated.root_path(tmp_path).exists()
    assert len(builds(tmp_path)) == 1  # what it left, under a name no reader takes for a root
    made = emulated.build(tmp_path, make_complete)
    assert (made / "usr" / "bin" / "python3").is_file()
    assert builds(tmp_path) == []
