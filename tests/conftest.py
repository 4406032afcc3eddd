"""Fixtures shared by every test: an isolated cache, a clean environment, tool checks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Variables that would make a test depend on the machine or the developer's shell.
_SCRUB = (
    "QNN_SDK_ROOT", "QNNCTL_SDK", "QNNCTL_MIRROR", "QNN_STAGING_DIR", "LD_LIBRARY_PATH",
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
    "NO_PROXY", "no_proxy", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "QNNCTL_DEBUG",
    "VIRTUAL_ENV", "QNNCTL_FORCE_CPU_VENDOR",
)


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point the cache (and HOME, XDG caches) into tmp_path so the real ones are unreachable."""
    for name in _SCRUB:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    cache = tmp_path / "cache"
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(cache))
    # No proxy may turn a loopback request into a trip outside.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    yield cache


@pytest.fixture
def cache_dir(isolated: Path) -> Path:
    return isolated


def require_tool(name: str) -> str:
    """The path of a tool the test needs; in CI its absence is a failure, not a skip."""
    path = shutil.which(name)
    if path is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed; .ci/run must install it")
        pytest.skip(f"{name} is not installed")
    return path


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
